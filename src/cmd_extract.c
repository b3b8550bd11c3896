/* cmd_extract.c - ckpt extract: one state dict out of a checkpoint (a training
 * checkpoint's model, a pickled nn.Module's state_dict()) as a plain
 * weights-only file that plain torch.load accepts. */
#include "rewrite.h"

#include <string.h>

static const char usage[] =
    "usage: ckpt extract [--select PATH] [--to pth|safetensors]\n"
    "                    [--map-location M] [--dry-run] (IN OUT | --in-place FILE)\n"
    "\n"
    "Write one state dict of IN to OUT as a plain file of tensors: the one at\n"
    "--select, else the model's (IN itself when it is a state dict, else the\n"
    "first pickled nn.Module, else IN's only (model) state dict).  A pickled module\n"
    "(torch.save(model)) is read by its structure, never imported, and written\n"
    "as model.state_dict() names it, so plain torch.load (weights-only) reads\n"
    "OUT and load_state_dict(strict=True) takes it.\n"
    "\n"
    "  --select PATH   the mapping or module at PATH (keys joined by '/')\n"
    "  --to FORMAT     pth (default) or safetensors (also for OUT.safetensors)\n"
    "  --map-location M  remap the storages' device tags in the same write (torch's\n"
    "                  word): M is a device (all to it: cpu, cuda:0) or FROM=TO as\n"
    "                  remap's --map; repeatable, the first that matches applies\n"
    "  --dry-run       say which state dict; write nothing\n"
    "  --in-place      FILE, or OUT that is IN: write the state dict over it (pth-zip:\n"
    "                  edited in place; else replaced atomically)\n"
    "  --force         with --in-place: edit a file that has other links\n"
    "  --verbose       say how the output was written\n"
    "  --keep-unsafe   with --allow-global M.NAME: keep that global in OUT,\n"
    "                  which torch.load(weights_only=False) would run (a\n"
    "                  warning says so); without it such a file is refused\n"
    "  --allow-global M.NAME, --allow-unknown, --max-pickle-bytes N,\n"
    "  --max-header-bytes N, --max-depth N, -q, --quiet, -h, --help\n"
    "                  as for every command (ckpt --help)\n";

enum { OPT_TO = CLI_OPT_FIRST_COMMAND_OPTION };

typedef struct state {
    ckpt_format to;
} state;

static int option(void *st, int opt, const char *arg)
{
    state *s = st;
    if (opt != OPT_TO)
        return 0;
    return rewrite_format_option("extract", arg, false, &s->to);
}

static int run(void *st, rewrite *rw)
{
    state *s = st;
    rw->out_format = s->to ? s->to : ckpt_format_for_path(rw->out);
    if (rw->out_format == CKPT_FORMAT_SHARDED)
        return cli_usage_error(rw->cmd, "extract writes one file: pth or safetensors");
    return rewrite_extract(rw);
}

int cmd_extract(int argc, char **argv)
{
    static const struct option options[] = {
        {"to", required_argument, NULL, OPT_TO},
        {NULL, 0, NULL, 0},
    };
    state st = {0};
    rewrite_command c = {"extract", usage, ":", options, option, run, &st};
    return rewrite_main(argc, argv, &c);
}
