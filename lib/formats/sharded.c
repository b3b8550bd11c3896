/*
 * sharded.c - a sharded checkpoint: an index (Hugging Face style
 * *.index.json, {"weight_map": {tensor: shard file}}) and the shards beside
 * it, each a pth-zip, pth-legacy or safetensors file.  The shards' tensors
 * become one state dict, in the order of the shards.
 */
#include "formats/format.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The names of the index's weight_map, in its order, each found by the
 * map beside them (name -> index here). */
typedef struct listed {
    const char *name;
    int shard;  /* index into the shard list */
    bool seen;
} listed;

typedef struct listing {
    listed *names;
    ckpt_map at;
} listing;

/* The index's entry of a shard's key, or NULL: the key's every byte
 * compared (a pickled name may hold a NUL, which no index name does) */
static listed *listed_as(const listing *l, const ckpt_value *key)
{
    size_t i;
    return ckpt_map_get(&l->at, key->u.s.s, key->u.s.len, &i) ? &l->names[i] : NULL;
}

/* Shard names are plain file names beside the index: no paths, no "..". */
static bool safe_shard_name(const char *n)
{
    return n[0] && n[0] != '.' && !strchr(n, '/') && !strchr(n, '\\') && strlen(n) < 256;
}

static int open_shard(ckpt_file *f, const char *dir, const char *name, ckpt_source **out)
{
    ckpt_source *src = calloc(1, sizeof(*src));
    if (!src)
        return ckpt_oom(&f->err);
    src->fd = -1;
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = ckpt_arena_alloc(&f->arena, n);
    if (!path) {
        free(src);
        return ckpt_oom(&f->err);
    }
    snprintf(path, n, "%s/%s", dir, name);
    src->path = path;
    *out = src; /* owned by the caller from here, even on failure */
    struct stat st;
    ckpt_error oe = {0};
    if (ckpt_open_input(AT_FDCWD, path, false, &src->fd, &st, &oe) != CKPT_OK) {
        /* a shard the index names but that is not there: the set is broken;
         * a FIFO or device in its place is refused, never read */
        int e = errno;
        return ckpt_err(&f->err, oe.code == CKPT_ERR_IO && e == ENOENT ? CKPT_ERR_FORMAT : oe.code,
                        "shard '%s' named by the index: %s%s", name,
                        oe.code == CKPT_ERR_IO ? strerror(e) : oe.msg,
                        oe.code == CKPT_ERR_IO && e == EMFILE
                            ? " (every shard stays open while the set is read: raise the "
                              "limit on open files, ulimit -n)"
                            : "");
    }
    src->file_size = (uint64_t)st.st_size;
    return CKPT_OK;
}

/* Whether a JSON string in TEXT holds \u0000, which cJSON would decode
 * into a NUL that ends the name early: "a.safetensors\u0000x" read as
 * "a.safetensors", where Python's open() refuses the name. */
static bool has_nul_escape(const uint8_t *text, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '"')
            in_str = !in_str;
        else if (in_str && text[i] == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 5 < len && memcmp(text + i + 2, "0000", 4) == 0)
                return true;
            i++; /* the escaped character: an escaped quote does not end the string */
        }
    }
    return false;
}

/* The views (ckpt_tensor_view_hash -> index in SD) of the tensors SD holds
 * under a name the index puts in shard K: where a tied name finds its
 * tensor (one lookup a name, not a scan). */
static int listed_views(const listing *l, const ckpt_value *sd, int k, ckpt_map *m)
{
    for (size_t j = 0; j < sd->u.dict.keys.len; j++) {
        const ckpt_value *key = sd->u.dict.keys.items[j], *w = sd->u.dict.vals.items[j];
        if (key->kind != CKPT_KIND_STR || w->kind != CKPT_KIND_TENSOR)
            continue;
        const listed *s = listed_as(l, key);
        size_t first;
        if (s && s->shard == k &&
            ckpt_map_put_u64(m, ckpt_tensor_view_hash(w->u.tensor), j, &first) < 0)
            return -1;
    }
    return 0;
}

static int by_shard_name(const void *a, const void *b, void *names)
{
    const char **n = names;
    return strcmp(n[*(const size_t *)a], n[*(const size_t *)b]);
}

static int parse_index(ckpt_file *f, const uint8_t *text, size_t len, ckpt_value **root_out)
{
    if (has_nul_escape(text, len))
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "shard index: a name holds a NUL character (\\u0000): ckpt refuses it "
                        "rather than cut the name there (Python cannot open such a file)");
    cJSON *idx = cJSON_ParseWithLength((const char *)text, len);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(idx);
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "not a shard index: no \"weight_map\" object (a *.index.json)");
    }
    size_t n = (size_t)cJSON_GetArraySize(map), nlisted = 0;
    listing table = {.names = calloc(n ? n : 1, sizeof(listed))};
    ckpt_map_init(&table.at, CKPT_MAP_BYTES);
    const char **shards = calloc(n ? n : 1, sizeof(*shards));
    char *dir = strdup(f->path);
    ckpt_value *root = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
    int rc = (!table.names || !shards || !dir || !root || ckpt_map_reserve(&table.at, n) < 0)
                 ? ckpt_oom(&f->err)
                 : CKPT_OK;
    size_t nshards = 0;
    ckpt_map shard_at; /* shard name -> its index in shards: n log n, not n x shards */
    ckpt_map_init(&shard_at, CKPT_MAP_BYTES);
    ckpt_map extra; /* the tied names taken beside the index's (once each) */
    ckpt_map_init(&extra, CKPT_MAP_BYTES);
    const cJSON *e;
    cJSON_ArrayForEach(e, map)
    {
        if (rc)
            break;
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "shard index: '%s' maps to %s, not a file name beside the index",
                          e->string, cJSON_IsString(e) ? e->valuestring : "a non-string");
            break;
        }
        size_t twice;
        int put = ckpt_map_put(&table.at, e->string, strlen(e->string), nlisted, &twice);
        if (put != 0) {
            rc = put < 0 ? ckpt_oom(&f->err)
                         : ckpt_err(&f->err, CKPT_ERR_FORMAT, "shard index: '%s' appears twice",
                                    e->string);
            break;
        }
        listed *s = &table.names[nlisted++];
        size_t k = nshards;
        if (ckpt_map_put(&shard_at, e->valuestring, strlen(e->valuestring), nshards, &k) < 0) {
            rc = ckpt_oom(&f->err);
            break;
        }
        if (k == nshards)
            shards[nshards++] = e->valuestring;
        s->name = e->string;
        s->shard = (int)k;
    }
    if (rc == CKPT_OK) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            strcpy(dir, ".");
        root->flags |= CKPT_VF_ORDERED;
        f->shards = calloc(nshards ? nshards : 1, sizeof(*f->shards));
        if (!f->shards)
            rc = ckpt_oom(&f->err);
    }
    size_t found = 0;
    /* the shards in the order of their names (save_pretrained's -0000k-of-
     * count up), not of the first name each holds in the weight_map, which
     * transformers sorts by tensor name: the set reads in the order it was
     * written */
    size_t *order = rc == CKPT_OK ? calloc(nshards ? nshards : 1, sizeof(*order)) : NULL;
    if (rc == CKPT_OK && !order)
        rc = ckpt_oom(&f->err);
    for (size_t k = 0; order && k < nshards; k++)
        order[k] = k;
    if (order)
        qsort_r(order, nshards, sizeof(*order), by_shard_name, shards);
    for (size_t r = 0; r < nshards && rc == CKPT_OK; r++) {
        size_t k = order[r];
        ckpt_source *src = NULL;
        rc = open_shard(f, dir, shards[k], &src);
        if (src)
            f->shards[f->nshards++] = src;
        if (rc)
            break;
        char prefix[300];
        snprintf(prefix, sizeof(prefix), "%s:", shards[k]);
        f->key_prefix = ckpt_arena_strndup(&f->arena, prefix, strlen(prefix));
        ckpt_value *sd = NULL;
        rc = f->parts.read(f, src, &sd); /* its format is the dispatcher's business */
        f->key_prefix = NULL;
        if (rc) {
            /* name the shard: the reader's message is about its insides */
            char inner[CKPT_ERRMSG_MAX];
            memcpy(inner, f->err.msg, sizeof(inner));
            snprintf(f->err.msg, sizeof(f->err.msg), "shard '%.100s': %.380s", shards[k], inner);
            break;
        }
        if (sd->kind != CKPT_KIND_DICT) {
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "shard '%s' holds a %s, not a state dict",
                          shards[k], ckpt_value_kind_name(sd));
            break;
        }
        ckpt_map views;
        bool views_made = false;
        ckpt_map_init(&views, CKPT_MAP_U64);
        for (size_t i = 0; i < sd->u.dict.keys.len && rc == CKPT_OK; i++) {
            ckpt_value *key = sd->u.dict.keys.items[i];
            if (key->kind != CKPT_KIND_STR)
                continue;
            listed *s = listed_as(&table, key);
            if (!s) {
                /* a name the index lists nowhere: taken when it is a tied
                 * name of a tensor the index puts here (a safetensors shard
                 * keeps it in its __metadata__; transformers' index lists
                 * only the name stored), once */
                const ckpt_value *v = sd->u.dict.vals.items[i];
                size_t j, first;
                if (!views_made) {
                    views_made = true;
                    if (listed_views(&table, sd, (int)k, &views) < 0) {
                        rc = ckpt_oom(&f->err);
                        break;
                    }
                }
                if (v->kind != CKPT_KIND_TENSOR ||
                    !v->u.tensor->storage || /* (meta: no data to share) */
                    !ckpt_map_get_u64(&views, ckpt_tensor_view_hash(v->u.tensor), &j) ||
                    !ckpt_tensor_same_view(v->u.tensor, sd->u.dict.vals.items[j]->u.tensor))
                    continue;
                int put = ckpt_map_put(&extra, key->u.s.s, key->u.s.len, 0, &first);
                if (put < 0)
                    rc = ckpt_oom(&f->err);
                if (put != 0)
                    continue;
            } else if (s->shard != (int)k || s->seen) {
                continue; /* the index decides where each tensor lives */
            } else {
                s->seen = true;
                found++;
            }
            if (ckpt_vec_push(&f->arena, &root->u.dict.keys, key) ||
                ckpt_vec_push(&f->arena, &root->u.dict.vals, sd->u.dict.vals.items[i]))
                rc = ckpt_oom(&f->err);
        }
        ckpt_map_release(&views);
    }
    if (rc == CKPT_OK && found != n) {
        /* the first the index lists */
        for (size_t i = 0; i < nlisted; i++)
            if (!table.names[i].seen) {
                rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "shard index names '%s' in '%s', which lacks it",
                              table.names[i].name, shards[table.names[i].shard]);
                break;
            }
    }
    if (rc == CKPT_OK)
        *root_out = root;
    ckpt_map_release(&shard_at);
    ckpt_map_release(&extra);
    free(order);
    ckpt_map_release(&table.at);
    free(table.names);
    free(shards);
    free(dir);
    cJSON_Delete(idx);
    return rc;
}

static int sharded_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    uint64_t size = src->file_size;
    if (size > (64u << 20))
        return ckpt_err(&f->err, CKPT_ERR_LIMIT, "shard index of %llu bytes is over 64 MiB",
                        (unsigned long long)size);
    uint8_t *text = malloc((size_t)size + 1);
    if (!text)
        return ckpt_oom(&f->err);
    int rc = ckpt_pread_all(src->fd, text, (size_t)size, 0)
                 ? ckpt_err(&f->err, CKPT_ERR_IO, "cannot read the shard index")
                 : parse_index(f, text, (size_t)size, root);
    free(text);
    return rc;
}

/* Known by its name (NAME.index.json): its JSON has no signature. */

/* ---- the index as transformers writes it ------------------------------------------
 *
 * save_pretrained: json.dumps(index, indent=2, sort_keys=True) + "\n" of
 * {"metadata": {"total_parameters", "total_size"}, "weight_map"}: keys
 * sorted (by code point: strcmp on UTF-8), every non-ASCII character
 * \uXXXX (ensure_ascii). */
typedef struct index_text {
    char *p;
    size_t len, cap;
    bool failed;
} index_text;

static void put(index_text *t, const char *s, size_t n)
{
    if (t->failed)
        return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (t->len + n + 1 > cap)
            cap *= 2;
        char *g = realloc(t->p, cap);
        if (!g) {
            t->failed = true;
            return;
        }
        t->p = g;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

static void put_s(index_text *t, const char *s)
{
    put(t, s, strlen(s));
}

/* S as Python's json.dumps writes a str (ensure_ascii) */
static void put_json_string(index_text *t, const char *s)
{
    put(t, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        char e[16];
        unsigned cp = *p;
        size_t len = 1;
        if (cp >= 0xc0 && cp < 0xf8) { /* a UTF-8 sequence (names are valid UTF-8: str keys) */
            len = cp < 0xe0 ? 2 : cp < 0xf0 ? 3 : 4;
            cp &= len == 2 ? 0x1f : len == 3 ? 0x0f : 0x07;
            for (size_t k = 1; k < len; k++) {
                if ((p[k] & 0xc0) != 0x80) {
                    len = 1;
                    cp = 0xfffd;
                    break;
                }
                cp = (cp << 6) | (p[k] & 0x3f);
            }
        } else if (cp >= 0x80) {
            cp = 0xfffd;
        }
        p += len;
        if (cp == '"' || cp == '\\') {
            e[0] = '\\';
            e[1] = (char)cp;
            put(t, e, 2);
        } else if (cp == '\n' || cp == '\r' || cp == '\t' || cp == '\b' || cp == '\f') {
            put_s(t, cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : cp == '\t' ? "\\t"
                     : cp == '\b' ? "\\b" : "\\f");
        } else if (cp < 0x20 || (cp >= 0x7f && cp < 0x10000)) {
            snprintf(e, sizeof(e), "\\u%04x", cp);
            put_s(t, e);
        } else if (cp >= 0x10000) { /* a surrogate pair */
            cp -= 0x10000;
            snprintf(e, sizeof(e), "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            put_s(t, e);
        } else {
            e[0] = (char)cp;
            put(t, e, 1);
        }
    }
    put(t, "\"", 1);
}

static int by_name(const void *a, const void *b, void *sd)
{
    const ckpt_value *d = sd;
    return strcmp(d->u.dict.keys.items[*(const size_t *)a]->u.s.s,
                  d->u.dict.keys.items[*(const size_t *)b]->u.s.s);
}

static void write_index(index_text *t, const ckpt_value *sd, size_t *listed, size_t nlisted,
                        const int *shard_of, char **names, uint64_t total, uint64_t params)
{
    qsort_r(listed, nlisted, sizeof(*listed), by_name, (void *)sd);
    char num[160];
    snprintf(num, sizeof(num), "{\n  \"metadata\": {\n    \"total_parameters\": %llu,\n"
             "    \"total_size\": %llu\n  },\n  \"weight_map\": {",
             (unsigned long long)params, (unsigned long long)total);
    put_s(t, num);
    for (size_t j = 0; j < nlisted; j++) {
        size_t i = listed[j];
        const char *shard = strrchr(names[shard_of[i]], '/');
        put_s(t, j ? ",\n    " : "\n    ");
        put_json_string(t, sd->u.dict.keys.items[i]->u.s.s);
        put_s(t, ": ");
        put_json_string(t, shard ? shard + 1 : names[shard_of[i]]);
    }
    put_s(t, nlisted ? "\n  }\n}\n" : "}\n}\n");
    if (t->failed) {
        free(t->p);
        t->p = NULL;
    }
}

/* ---- writing: shards plus a Hugging Face style index ----------------------------
 *
 * NAME.EXT.index.json {"metadata": {"total_size"}, "weight_map"} and
 * NAME-00001-of-0000N.EXT, each written as its name says (f->parts.write).
 * Shards hold at most shard_size bytes, or follow the input's own shards.
 */
static int sharded_write(ckpt_file *f, const char *path, const ckpt_write_options *opt)
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
        else if (sd->u.dict.vals.items[i]->u.tensor->kind != CKPT_TENSOR_DENSE)
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "sharded output holds plain tensors only, not %s ones ('%s')",
                            ckpt_tensor_kind_name(
                                (ckpt_tensor_kind)sd->u.dict.vals.items[i]->u.tensor->kind),
                            sd->u.dict.keys.items[i]->u.s.s);

    /* NAME.EXT from PATH: the shards' stem, extension and format */
    char *base = strndup(path, plen - 11);
    int *shard_of = calloc(n ? n : 1, sizeof(*shard_of));
    const ckpt_source **srcs = calloc(n ? n : 1, sizeof(*srcs));
    const ckpt_tensor **views = calloc(n ? n : 1, sizeof(*views));
    long *tied = calloc(n ? n : 1, sizeof(*tied));
    int trc = base && shard_of && srcs && views && tied
                  ? CKPT_OK : ckpt_oom(&f->err);
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

    /* assign tensors to shards in order: a new shard when the next tensor
     * would pass the limit (a tensor over it has a shard of its own), as
     * huggingface_hub's split does (save_pretrained's), except that the
     * shards keep the tensors' order (the hub numbers a tensor over the
     * limit before the shard being filled), so that the set reads back in
     * its order */
    uint64_t limit = opt ? opt->shard_size : 0, fill = 0, total = 0, params = 0;
    int nshards = 0;
    size_t nsrcs = 0;
    ckpt_map src_at; /* an input shard -> its output shard (linear, not n x shards) */
    ckpt_map_init(&src_at, CKPT_MAP_U64);
    for (size_t i = 0; i < n && trc == CKPT_OK; i++) {
        const ckpt_tensor *t = sd->u.dict.vals.items[i]->u.tensor;
        uint64_t bytes = ckpt_tensor_nbytes(t); /* float6 counts 6 bits an element */
        /* a tied tensor stays in its first name's shard, where it is written once */
        if (tied[i] >= 0)
            continue;
        if (limit) {
            if (nshards == 0 || fill + bytes > limit) {
                nshards++;
                fill = 0;
            }
            fill += bytes;
            shard_of[i] = nshards - 1;
        } else { /* the input's shards */
            size_t k = nsrcs;
            if (ckpt_map_put_u64(&src_at, (uint64_t)(uintptr_t)t->storage->src, nsrcs, &k) < 0) {
                trc = ckpt_oom(&f->err);
                break;
            }
            if (k == nsrcs)
                srcs[nsrcs++] = t->storage->src;
            shard_of[i] = (int)k;
            nshards = (int)nsrcs;
        }
    }
    ckpt_map_release(&src_at);
    for (size_t i = 0; i < n; i++)
        if (tied[i] >= 0) {
            shard_of[i] = shard_of[tied[i]];
        } else {
            total += ckpt_tensor_nbytes(sd->u.dict.vals.items[i]->u.tensor);
            params += (uint64_t)ckpt_tensor_numel(sd->u.dict.vals.items[i]->u.tensor);
        }
    if (nshards == 0)
        nshards = 1;
    /* the tensors of each shard, in order: by_shard[first[k] .. first[k + 1]) */
    size_t *first = trc == CKPT_OK ? calloc((size_t)nshards + 1, sizeof(*first)) : NULL;
    size_t *by_shard = first ? calloc(n ? n : 1, sizeof(*by_shard)) : NULL;
    if (trc == CKPT_OK && !by_shard)
        trc = ckpt_oom(&f->err);
    if (trc == CKPT_OK) {
        for (size_t i = 0; i < n; i++)
            first[shard_of[i] + 1]++;
        for (int k = 0; k < nshards; k++)
            first[k + 1] += first[k];
        size_t *next = calloc((size_t)nshards ? (size_t)nshards : 1, sizeof(*next));
        if (!next) {
            trc = ckpt_oom(&f->err);
        } else {
            memcpy(next, first, (size_t)nshards * sizeof(*next));
            for (size_t i = 0; i < n; i++)
                by_shard[next[shard_of[i]]++] = i;
            free(next);
        }
    }
    if (trc != CKPT_OK) {
        free(first);
        free(by_shard);
        free(base);
        free(extcopy);
        free(shard_of);
        free(srcs);
        free(tied);
        return trc;
    }

    char **names = calloc((size_t)nshards, sizeof(*names));
    /* the names the index lists: safetensors shards hold a tied tensor under
     * its first name only (the others in their __metadata__), and the index
     * lists what they hold, as transformers' does */
    bool st_shards = strcmp(extcopy ? extcopy : "", ".safetensors") == 0 &&
                     !(opt && (opt->flags & CKPT_WRITE_NO_DEDUPE));
    bool plain = nshards == 1 && opt && (opt->flags & CKPT_WRITE_SET_ONE_PLAIN);
    size_t *listed = calloc(n ? n : 1, sizeof(*listed)), nlisted = 0;
    int rc = names && extcopy && listed ? CKPT_OK : ckpt_oom(&f->err);
    int written = 0;
    ckpt_value *saved_root = f->root;
    for (int k = 0; k < nshards && rc == CKPT_OK; k++) {
        size_t need = strlen(base) + strlen(extcopy) + 32;
        names[k] = malloc(need);
        if (!names[k]) {
            rc = ckpt_oom(&f->err);
            break;
        }
        if (plain) /* save_pretrained's model.safetensors, pytorch_model.bin */
            snprintf(names[k], need, "%s%s", base, extcopy);
        else
            snprintf(names[k], need, "%s-%05d-of-%05d%s", base, k + 1, nshards, extcopy);
        /* the shard's tensors, as a state dict of their own */
        ckpt_value *part = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
        if (!part) {
            rc = ckpt_oom(&f->err);
            break;
        }
        part->flags |= CKPT_VF_ORDERED;
        for (size_t j = first[k]; j < first[k + 1] && rc == CKPT_OK; j++) {
            size_t i = by_shard[j];
            if (ckpt_vec_push(&f->arena, &part->u.dict.keys, sd->u.dict.keys.items[i]) ||
                ckpt_vec_push(&f->arena, &part->u.dict.vals, sd->u.dict.vals.items[i]))
                rc = ckpt_oom(&f->err);
            else if (!(st_shards && tied[i] >= 0))
                listed[nlisted++] = i;
        }
        if (rc)
            break;
        ckpt_write_options one = opt ? *opt : (ckpt_write_options){0};
        /* as the shard's name says (pth-legacy, which no name says, as asked) */
        one.format = opt && opt->format == CKPT_FORMAT_PTH_LEGACY ? CKPT_FORMAT_PTH_LEGACY
                                                                  : CKPT_FORMAT_UNKNOWN;
        one.select = NULL;
        one.shard_size = 0;
        f->root = part;
        rc = f->parts.write(f, names[k], &one);
        f->root = saved_root;
        if (rc == CKPT_OK)
            written++;
    }
    if (rc == CKPT_OK && !plain) {
        index_text t = {0};
        write_index(&t, sd, listed, nlisted, shard_of, names, total, params);
        ckpt_out out;
        if (!t.p) {
            rc = ckpt_oom(&f->err);
        } else if ((rc = ckpt_out_open(&out, path, t.len, &f->err)) != CKPT_OK) {
            ckpt_out_abort(&out);
        } else {
            rc = ckpt_write_all(out.fd, t.p, t.len, 0, &f->err);
            if (rc == CKPT_OK)
                rc = ckpt_out_commit(&out, &f->err);
            if (rc != CKPT_OK)
                ckpt_out_abort(&out);
        }
        free(t.p);
    }
    free(listed);
    if (rc != CKPT_OK) /* no index, and none of its shards */
        for (int k = 0; k < written; k++)
            unlink(names[k]);
    for (int k = 0; names && k < nshards; k++)
        free(names[k]);
    free(names);
    free(base);
    free(extcopy);
    free(shard_of);
    free(srcs);
    free(tied);
    free(first);
    free(by_shard);
    return rc;
}

const ckpt_format_desc ckpt_format_sharded = {
    .id = CKPT_FORMAT_SHARDED,
    .name = "sharded",
    .suffix = ".index.json",
    .name_suffix = ".json",
    .read = sharded_read,
    .write_set = sharded_write,
};
