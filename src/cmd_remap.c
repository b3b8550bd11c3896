/* cmd_remap.c - ckpt remap: rewrite the device tags of storages. */
#include "rewrite.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ckpt remap (--to DEVICE | --map FROM=TO [--map ...]) [--dry-run]\n"
    "                  (IN OUT | --in-place FILE)\n"
    "\n"
    "Rewrite the location tag saved with each storage of IN (cuda:1 -> cpu) and\n"
    "write OUT, so that it loads without map_location on a machine without that\n"
    "device.  Tensor data is copied untouched.\n"
    "\n"
    "  --to DEVICE     every storage to DEVICE (cpu, cuda, cuda:0, mps, ...)\n"
    "  --map FROM=TO   storages tagged FROM to TO; FROM is a tag (cuda:1), a device\n"
    "                  type (cuda: cuda and every cuda:N) or '*'; repeatable, the\n"
    "                  first rule that matches a storage applies\n"
    "  --dry-run       print 'old -> new (N storages)'; write nothing\n"
    "  --in-place      FILE, or OUT that is IN: rewrite it in place (pth-zip: only the\n"
    "                  pickle and zip directory are written; else replaced atomically)\n"
    "  --force         with --in-place: edit a file that has other links\n"
    "  --verbose       say how the output was written\n"
    "  --keep-unsafe   with --allow-global M.NAME: keep that global in OUT,\n"
    "                  which torch.load(weights_only=False) would run (a\n"
    "                  warning says so); without it such a file is refused\n"
    "  --allow-global M.NAME, --allow-unknown, --max-pickle-bytes N,\n"
    "  --max-header-bytes N, --max-depth N, -q, --quiet, -h, --help\n"
    "                  as for every command (ckpt --help)\n";

enum { OPT_TO = CLI_OPT_FIRST_COMMAND_OPTION, OPT_MAP };

typedef struct state {
    const char **from, **to;
    char **owned; /* FROM parts split off --map arguments */
    size_t n;
    bool to_all, mapped;
} state;

static int add(state *s, const char *from, const char *to, char *owned)
{
    const char **f = realloc(s->from, (s->n + 1) * sizeof(*f));
    if (f)
        s->from = f;
    const char **t = realloc(s->to, (s->n + 1) * sizeof(*t));
    if (t)
        s->to = t;
    char **o = realloc(s->owned, (s->n + 1) * sizeof(*o));
    if (o)
        s->owned = o;
    if (!f || !t || !o) {
        free(owned);
        cli_error("remap", NULL, "out of memory");
        return -1;
    }
    s->from[s->n] = from;
    s->to[s->n] = to;
    s->owned[s->n] = owned;
    s->n++;
    return 1;
}

static int option(void *st, int opt, const char *arg)
{
    state *s = st;
    if (opt == OPT_TO) {
        if (!ckpt_device_valid(arg)) {
            cli_usage_error("remap", "--to: '%s' is not a device (cpu, cuda, cuda:0, ...)", arg);
            return -1;
        }
        s->to_all = true;
        return add(s, "*", arg, NULL);
    }
    if (opt == OPT_MAP) {
        const char *eq = strchr(arg, '=');
        char *from = eq ? strndup(arg, (size_t)(eq - arg)) : NULL;
        if (!eq || !from || !(strcmp(from, "*") == 0 || ckpt_device_valid(from)) ||
            !ckpt_device_valid(eq + 1)) {
            free(from);
            cli_usage_error("remap", "--map needs FROM=TO with device tags (cuda:1=cpu), got '%s'",
                            arg);
            return -1;
        }
        s->mapped = true;
        return add(s, from, eq + 1, from);
    }
    return 0;
}

static int run(void *st, rewrite *rw)
{
    state *s = st;
    if (rw->nmap) /* the key rewrites' option; remap spells it --to and --map */
        return cli_usage_error(rw->cmd, "--map-location is for the other rewrites: use --to "
                                        "DEVICE or --map FROM=TO");
    if (s->to_all && s->mapped)
        return cli_usage_error(rw->cmd, "--to and --map do not go together");
    if (s->to_all && s->n > 1)
        return cli_usage_error(rw->cmd, "--to is given more than once");
    if (!s->n)
        return cli_usage_error(rw->cmd, "needs --to DEVICE or --map FROM=TO");
    if (rw->select)
        return cli_usage_error(rw->cmd, "--select does not apply: storages belong to the file");

    for (size_t i = 0; i < s->n; i++)
        if (!ckpt_device_known(s->to[i]) && !rw->common.quiet)
            cli_error(rw->cmd, NULL, "note: torch knows no device type '%.*s' without a plug-in",
                      (int)strcspn(s->to[i], ":"), s->to[i]);
    return rewrite_devices(rw, s->from, s->to, s->n);
}

int cmd_remap(int argc, char **argv)
{
    static const struct option options[] = {
        {"to", required_argument, NULL, OPT_TO},
        {"map", required_argument, NULL, OPT_MAP},
        {NULL, 0, NULL, 0},
    };
    state st = {0};
    rewrite_command c = {"remap", usage, ":", options, option, run, &st};
    int rc = rewrite_main(argc, argv, &c);
    for (size_t i = 0; i < st.n; i++)
        free(st.owned[i]);
    free(st.owned);
    free(st.from);
    free(st.to);
    return rc;
}
