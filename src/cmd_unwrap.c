/* cmd_unwrap.c - ckpt unwrap: remove every known wrapper component from keys. */
#include "rewrite.h"

static const char usage[] =
    "usage: ckpt unwrap [--select PATH] [--map-location M] [--to FORMAT] [--dry-run]\n"
    "                   (IN OUT | --in-place FILE)\n"
    "\n"
    "Remove every wrapper component from the keys of every model state dict of IN,\n"
    "wherever it stands in a key: module. (DataParallel, DistributedDataParallel),\n"
    "_orig_mod. (torch.compile), _fsdp_wrapped_module. (FSDP), _forward_module.\n"
    "(Lightning Fabric), _checkpoint_wrapped_module. (activation checkpointing);\n"
    "rewrite their _metadata to match and write OUT.  Everything else is kept.\n"
    "\n"
    "  --select PATH   only the mapping at PATH (keys joined by '/')\n"
    "  --map-location M  remap the storages' device tags in the same write (torch's\n"
    "                  word): M is a device (all to it: cpu, cuda:0) or FROM=TO as\n"
    "                  remap's --map; repeatable, the first that matches applies\n"
    "  --to FORMAT     pth (default), pth-legacy or safetensors (also for OUT.safetensors):\n"
    "                  safetensors holds one state dict, --select's or the model's\n"
    "  --dry-run       print 'old -> new' for each key that would change; write nothing\n"
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

static int run(void *st, rewrite *rw)
{
    (void)st;
    ckpt_rename *r = ckpt_rename_new();
    if (!r || ckpt_rename_unwrap(r) != CKPT_OK) {
        ckpt_rename_free(r);
        cli_error(rw->cmd, NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    int rc = rewrite_keys(rw, r);
    ckpt_rename_free(r);
    return rc;
}

int cmd_unwrap(int argc, char **argv)
{
    static const struct option options[] = {REWRITE_TO_OPTION, {NULL, 0, NULL, 0}};
    rewrite_command c = {"unwrap", usage, ":", options, NULL, run, NULL};
    return rewrite_main(argc, argv, &c);
}
