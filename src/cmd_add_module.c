/* cmd_add_module.c - ckpt add-module: single-GPU keys to DataParallel/DDP keys. */
#include "rewrite.h"

static const char usage[] =
    "usage: ckpt add-module [--prefix P] [--select PATH] [--map-location M] [--to FORMAT]\n"
    "                       [--dry-run] (IN OUT | --in-place FILE)\n"
    "\n"
    "Add the prefix P (default 'module.') once in front of every key of every\n"
    "state dict of IN, rewrite their _metadata as DataParallel's would be, and\n"
    "write OUT: single-GPU weights that load into a model wrapped in\n"
    "nn.DataParallel or DistributedDataParallel.  Everything else is kept.\n"
    "\n"
    "  --prefix P      the prefix to add (default 'module.')\n"
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

int cmd_add_module(int argc, char **argv)
{
    return rewrite_prefix_main(argc, argv, "add-module", usage, ckpt_rename_add_prefix);
}
