/*
 * sharded_write.c - write a state dict as shards plus a Hugging Face
 * style index: NAME.EXT.index.json {"metadata": {"total_size"}, "weight_map"}
 * and NAME-00001-of-0000N.EXT, each written as its name says (f->parts.write).
 * Shards hold at most shard_size bytes, or follow the input's own shards.
 */
#include "formats/format.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int same_src_index(const ckpt_source *const *srcs, size_t n, const ckpt_source *s)
{
    for (size_t i = 0; i < n; i++)
        if (srcs[i] == s)
            return (int)i;
    return -1;
}

int ckpt_sharded_write(ckpt_file *f, const char *path, const ckpt_write_options *opt)
{
    size_t plen = strlen(path);
    if (plen <= 11 || strcmp(path + plen - 11, ".index.json") != 0)
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "a sharded checkpoint is written as NAME.index.json (NAME.safetensors."
                        "index.json for safetensors shards), not '%s'", path);
    const ckpt_value *sd;
    CKPT_FORWARD(ckpt_pick_state_dict(f, opt ? opt->select : NULL, &sd));
    size_t n = sd->u.dict.keys.len;
    for (size_t i = 0; i < n; i++)
        if (sd->u.dict.keys.items[i]->kind != CKPT_KIND_STR ||
            sd->u.dict.vals.items[i]->kind != CKPT_KIND_TENSOR)
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "a sharded checkpoint holds tensors only; name a state dict with --select");

    /* NAME.EXT from PATH: the shards' stem, extension and format */
    char *base = strndup(path, plen - 11);
    int *shard_of = calloc(n ? n : 1, sizeof(*shard_of));
    const ckpt_source **srcs = calloc(n ? n : 1, sizeof(*srcs));
    const ckpt_tensor **views = calloc(n ? n : 1, sizeof(*views));
    long *tied = calloc(n ? n : 1, sizeof(*tied));
    int trc = base && shard_of && srcs && views && tied
                  ? CKPT_OK : ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && trc == CKPT_OK; i++)
        views[i] = sd->u.dict.vals.items[i]->u.tensor;
    if (trc == CKPT_OK)
        trc = ckpt_tensors_tied(f, views, n, tied);
    free(views);
    if (trc != CKPT_OK) {
        free(base);
        free(shard_of);
        free(srcs);
        free(tied);
        return trc;
    }
    const char *slash = strrchr(base, '/');
    char *dot = strrchr(slash ? slash + 1 : base, '.');
    const char *ext = dot ? dot : ".bin";
    char *extcopy = strdup(ext);
    if (dot)
        *dot = '\0';

    /* assign tensors to shards in order */
    uint64_t limit = opt ? opt->shard_size : 0, fill = 0, total = 0;
    int nshards = 0;
    size_t nsrcs = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = sd->u.dict.vals.items[i]->u.tensor;
        uint64_t bytes = (uint64_t)t->numel * ckpt_dtype_size(t->storage->dtype);
        /* a tied tensor stays in its first name's shard, where it is written once */
        if (tied[i] >= 0) {
            shard_of[i] = shard_of[tied[i]];
            continue;
        }
        total += bytes;
        if (limit) {
            if (nshards == 0 || (fill && fill + bytes > limit)) {
                nshards++;
                fill = 0;
            }
            fill += bytes;
            shard_of[i] = nshards - 1;
        } else { /* the input's shards */
            int k = same_src_index(srcs, nsrcs, t->storage->src);
            if (k < 0) {
                srcs[nsrcs] = t->storage->src;
                k = (int)nsrcs++;
            }
            shard_of[i] = k;
            nshards = (int)nsrcs;
        }
    }
    if (nshards == 0)
        nshards = 1;

    char **names = calloc((size_t)nshards, sizeof(*names));
    cJSON *idx = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(idx, "metadata"),
          *map = cJSON_AddObjectToObject(idx, "weight_map");
    char num[32];
    snprintf(num, sizeof(num), "%llu", (unsigned long long)total);
    cJSON_AddItemToObject(md, "total_size", cJSON_CreateRaw(num));
    int rc = names && extcopy ? CKPT_OK : ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    int written = 0;
    ckpt_value *saved_root = f->root;
    for (int k = 0; k < nshards && rc == CKPT_OK; k++) {
        size_t need = strlen(base) + strlen(extcopy) + 32;
        names[k] = malloc(need);
        if (!names[k]) {
            rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(names[k], need, "%s-%05d-of-%05d%s", base, k + 1, nshards, extcopy);
        /* the shard's tensors, as a state dict of their own */
        ckpt_value *part = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
        if (!part) {
            rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
            break;
        }
        part->flags |= CKPT_VF_ORDERED;
        const char *shard_base = strrchr(names[k], '/');
        shard_base = shard_base ? shard_base + 1 : names[k];
        for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
            if (shard_of[i] != k)
                continue;
            if (ckpt_vec_push(&f->arena, &part->u.dict.keys, sd->u.dict.keys.items[i]) ||
                ckpt_vec_push(&f->arena, &part->u.dict.vals, sd->u.dict.vals.items[i]))
                rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
            else
                cJSON_AddStringToObject(map, sd->u.dict.keys.items[i]->u.s.s, shard_base);
        }
        if (rc)
            break;
        ckpt_write_options one = opt ? *opt : (ckpt_write_options){0};
        one.format = CKPT_FORMAT_UNKNOWN; /* as the shard's name says */
        one.select = NULL;
        one.shard_size = 0;
        f->root = part;
        rc = f->parts.write(f, names[k], &one);
        f->root = saved_root;
        if (rc == CKPT_OK)
            written++;
    }
    if (rc == CKPT_OK) {
        char *text = cJSON_Print(idx);
        ckpt_out out;
        if (!text) {
            rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
        } else if ((rc = ckpt_out_open(&out, path, &f->err)) != CKPT_OK) {
            ckpt_out_abort(&out);
        } else {
            size_t len = strlen(text);
            rc = ckpt_write_all(out.fd, text, len, 0, &f->err);
            if (rc == CKPT_OK)
                rc = ckpt_write_all(out.fd, "\n", 1, len, &f->err);
            if (rc == CKPT_OK)
                rc = ckpt_out_commit(&out, &f->err);
            if (rc != CKPT_OK)
                ckpt_out_abort(&out);
        }
        free(text);
    }
    if (rc != CKPT_OK) /* no index, and none of its shards */
        for (int k = 0; k < written; k++)
            unlink(names[k]);
    for (int k = 0; names && k < nshards; k++)
        free(names[k]);
    free(names);
    cJSON_Delete(idx);
    free(base);
    free(extcopy);
    free(shard_of);
    free(srcs);
    free(tied);
    return rc;
}
