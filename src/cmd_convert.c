/* cmd_convert.c - ckpt convert: between pth-zip, pth-legacy and safetensors,
 * optionally casting floating tensors. */
#include "rewrite.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ckpt convert [--to pth|pth-legacy|safetensors]\n"
    "                    [--dtype float16|bfloat16|float32|float8_e4m3fn|float8_e5m2]\n"
    "                    [--select PATH] [--map-location M] [--no-dedupe]\n"
    "                    [--shard-size SIZE] [--in-place] [--force] IN OUT\n"
    "\n"
    "Write IN (pth-zip, pth-legacy, safetensors, or a sharded *.index.json) to OUT\n"
    "in another format, without Python and without running its pickle.  The\n"
    "format is --to, else .safetensors for an OUT ending so, else pth-zip.\n"
    "IN may be a Hugging Face model folder (config.json beside its weights): an\n"
    "OUT not named as a file (.safetensors, .json, .pth, .pt, .bin, .ckpt) is then\n"
    "written as a folder, as save_pretrained writes one (safetensors unless --to,\n"
    "every other file copied); it must not exist (--force replaces it whole).\n"
    "\n"
    "  --to FORMAT     pth (torch >= 1.6 zip), pth-legacy (pre-1.6), safetensors\n"
    "  --dtype T       cast floating tensors (float64/32/16, bfloat16, float8_e4m3fn,\n"
    "                  float8_e5m2) to T, bit for bit as torch 2.x's .to(T) does;\n"
    "                  integers and bool untouched\n"
    "  --select PATH   write only the mapping at PATH (keys joined by '/'), e.g.\n"
    "                  model_state_dict of a training checkpoint; without it,\n"
    "                  safetensors (tensors only) gets the model's state dict, as\n"
    "                  extract takes it, and a file of several models needs it\n"
    "  --no-dedupe     safetensors: write tied tensors once per name (by default once,\n"
    "                  with the other names in __metadata__ \"ckpt.tied\")\n"
    "  --shard-size SIZE  write OUT (NAME.index.json, or NAME.safetensors.index.json)\n"
    "                  and shards NAME-00001-of-0000K.EXT of at most SIZE bytes (K M G T:\n"
    "                  powers of 1024, KB MB GB TB: of 1000 as transformers' 5GB, KiB..TiB);\n"
    "                  an OUT ending in .index.json without it keeps IN's shards\n"
    "  --force         a model folder's OUT: replace an existing one whole\n"
    "  --map-location M  remap the storages' device tags in the same write (torch's\n"
    "                  word): M is a device (all to it: cpu, cuda:0) or FROM=TO as\n"
    "                  remap's --map; repeatable, the first that matches applies\n"
    "  --dry-run       say what would be cast; write nothing\n"
    "  --in-place      allow OUT to be IN (replaced atomically)\n"
    "  --verbose       say how the output was written\n"
    "  --keep-unsafe   with --allow-global M.NAME: keep that global in OUT,\n"
    "                  which torch.load(weights_only=False) would run (a\n"
    "                  warning says so); without it such a file is refused\n"
    "  --allow-global M.NAME, --allow-unknown, --max-pickle-bytes N,\n"
    "  --max-header-bytes N, --max-depth N, -q, --quiet, -h, --help\n"
    "                  as for every command (ckpt --help)\n";

enum { OPT_TO = CLI_OPT_FIRST_COMMAND_OPTION, OPT_DTYPE, OPT_NO_DEDUPE, OPT_SHARD_SIZE };

typedef struct state {
    ckpt_format to;
    ckpt_dtype dtype;
    bool no_dedupe;
    uint64_t shard_size;
} state;

static int option(void *st, int opt, const char *arg)
{
    state *s = st;
    switch (opt) {
    case OPT_TO:
        return rewrite_format_option("convert", arg, true, &s->to);
    case OPT_DTYPE:
        s->dtype = ckpt_dtype_from_name(arg);
        if (s->dtype != CKPT_DTYPE_FLOAT16 && s->dtype != CKPT_DTYPE_BFLOAT16 &&
            s->dtype != CKPT_DTYPE_FLOAT32 && s->dtype != CKPT_DTYPE_FLOAT64 &&
            s->dtype != CKPT_DTYPE_FLOAT8_E4M3FN && s->dtype != CKPT_DTYPE_FLOAT8_E5M2) {
            cli_usage_error("convert", "--dtype: '%s' is not float16, bfloat16, float32, float64, "
                            "float8_e4m3fn or float8_e5m2", arg);
            return -1;
        }
        return 1;
    case OPT_NO_DEDUPE:
        s->no_dedupe = true;
        return 1;
    case OPT_SHARD_SIZE: {
        unsigned long long v;
        if (cli_size_arg("convert", "--shard-size", arg, &v) < 0)
            return -1;
        s->shard_size = v;
        return 1;
    }
    default:
        return 0;
    }
}

/* Whether OUT is a model folder: IN is one, and OUT's name is not a file's
 * (.safetensors, .json, .pth, .pt, .bin, .ckpt: one file of IN's weights). */
static bool names_folder(const rewrite *rw)
{
    static const char *const files[] = {".safetensors", ".json", ".pth", ".pt", ".bin", ".ckpt"};
    if (!ckpt_path_is_model_folder(rw->in))
        return false;
    size_t n = strlen(rw->out);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        if (n > strlen(files[i]) && strcmp(rw->out + n - strlen(files[i]), files[i]) == 0)
            return false;
    return true;
}

static int run(void *st, rewrite *rw)
{
    state *s = st;
    ckpt_format to = s->to, by_name = ckpt_format_for_path(rw->out);
    bool index = by_name == CKPT_FORMAT_SHARDED;
    if (names_folder(rw)) { /* a model folder to a model folder (safetensors unless --to) */
        rw->out_format = s->to ? s->to : CKPT_FORMAT_SAFETENSORS;
        rw->shard_size = s->shard_size;
        rw->write_flags = CKPT_WRITE_MODEL_FOLDER | (s->no_dedupe ? CKPT_WRITE_NO_DEDUPE : 0);
        return rewrite_convert(rw, s->dtype);
    }
    if (s->shard_size && !index)
        return cli_usage_error(rw->cmd, "--shard-size writes NAME.index.json and its shards; "
                                        "OUT must end in .index.json");
    if (index)
        to = CKPT_FORMAT_SHARDED; /* the shards' format comes from NAME's extension */
    else if (!to)
        to = by_name;
    rw->out_format = to;
    rw->shard_size = s->shard_size;
    rw->write_flags = s->no_dedupe ? CKPT_WRITE_NO_DEDUPE : 0;
    return rewrite_convert(rw, s->dtype);
}

int cmd_convert(int argc, char **argv)
{
    static const struct option options[] = {
        {"to", required_argument, NULL, OPT_TO},
        {"dtype", required_argument, NULL, OPT_DTYPE},
        {"no-dedupe", no_argument, NULL, OPT_NO_DEDUPE},
        {"shard-size", required_argument, NULL, OPT_SHARD_SIZE},
        {NULL, 0, NULL, 0},
    };
    state st = {0};
    rewrite_command c = {"convert", usage, ":", options, option, run, &st};
    return rewrite_main(argc, argv, &c);
}
