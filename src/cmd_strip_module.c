/* cmd_strip_module.c - ckpt strip-module: DataParallel/DDP keys to single-GPU keys. */
#include "rewrite.h"

static const char usage[] =
    "usage: ckpt strip-module [--prefix P] [--select PATH] [--map-location M] [--to FORMAT]\n"
    "                         [--dry-run] (IN OUT | --in-place FILE)\n"
    "\n"
    "Remove the prefix P (default 'module.', as DataParallel and\n"
    "DistributedDataParallel add it) from the keys of every model state dict of IN,\n"
    "as many times as it repeats, rewrite their _metadata to match, and write\n"
    "OUT: a checkpoint that loads into the unwrapped model.  Everything else in\n"
    "the file is kept; tensor data is copied, not loaded.\n"
    "\n"
    "  --prefix P      the prefix to remove (default 'module.')\n"
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

int cmd_strip_module(int argc, char **argv)
{
    return rewrite_prefix_main(argc, argv, "strip-module", usage, ckpt_rename_strip_prefix);
}
