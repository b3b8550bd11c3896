/* cmd_rename.c - ckpt rename: rename keys with sed-style PCRE2 rules. */
#include "rewrite.h"

#include <stdlib.h>

static const char usage[] =
    "usage: ckpt rename -e 's/REGEX/REPLACEMENT/[gi]' [-e ...] [--select PATH]\n"
    "                   [--map-location M] [--to FORMAT] [--dry-run]\n"
    "                   (IN OUT | --in-place FILE)\n"
    "\n"
    "Rename the keys of every model state dict of IN with sed-style rules, applied\n"
    "in order, each to the result of the one before; rewrite their _metadata to\n"
    "match and write OUT.  REGEX is PCRE2; REPLACEMENT refers to groups as \\1, $1 or ${1};\n"
    "flag g replaces every match, i ignores case; any delimiter may replace '/'.\n"
    "A rename that would make two keys equal is refused and nothing is written.\n"
    "\n"
    "  -e, --expression RULE  a rule (repeatable, at least one)\n"
    "  --select PATH          only the mapping at PATH (keys joined by '/')\n"
    "  --map-location M       remap the storages' device tags in the same write\n"
    "                         (torch's word): M is a device (all to it: cpu, cuda:0)\n"
    "                         or FROM=TO as remap's --map; repeatable, the first\n"
    "                         that matches applies\n"
    "  --to FORMAT            pth (default), pth-legacy or safetensors (also for\n"
    "                         OUT.safetensors): safetensors holds one state dict,\n"
    "                         --select's or the model's\n"
    "  --dry-run              print 'old -> new' for each key that would change\n"
    "  --in-place             FILE, or OUT that is IN: rewrite it in place (pth-zip: only the\n"
    "                         pickle and zip directory are written; else replaced atomically)\n"
    "  --force                with --in-place: edit a file that has other links\n"
    "  --verbose              say how the output was written\n"
    "  --keep-unsafe          with --allow-global M.NAME: keep that global in OUT,\n"
    "                         which torch.load(weights_only=False) would run (a\n"
    "                         warning says so); without it such a file is refused\n"
    "  --allow-global M.NAME, --allow-unknown, --max-pickle-bytes N,\n"
    "  --max-header-bytes N, --max-depth N, -q, --quiet, -h, --help\n"
    "                         as for every command (ckpt --help)\n";

typedef struct state {
    ckpt_rename *rules;
    size_t n;
} state;

static int option(void *st, int opt, const char *arg)
{
    state *s = st;
    if (opt != 'e')
        return 0;
    if (ckpt_rename_sed(s->rules, arg) != CKPT_OK) {
        cli_usage_error("rename", "-e: %s", ckpt_rename_error(s->rules));
        return -1;
    }
    s->n++;
    return 1;
}

static int run(void *st, rewrite *rw)
{
    state *s = st;
    if (!s->n)
        return cli_usage_error(rw->cmd, "needs at least one -e 's/REGEX/REPLACEMENT/' rule");
    return rewrite_keys(rw, s->rules);
}

int cmd_rename(int argc, char **argv)
{
    static const struct option options[] = {
        {"expression", required_argument, NULL, 'e'},
        REWRITE_TO_OPTION,
        {NULL, 0, NULL, 0},
    };
    state st = {.rules = ckpt_rename_new()};
    if (!st.rules) {
        cli_error("rename", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    rewrite_command c = {"rename", usage, ":e:", options, option, run, &st};
    int rc = rewrite_main(argc, argv, &c);
    ckpt_rename_free(st.rules);
    return rc;
}
