/*
 * dcp.c - a torch.distributed.checkpoint folder (FileSystemWriter's layout:
 * doc/distributed-formats.md sections 1 and 2), read without Python.
 *
 * The `.metadata` pickle (or, saved with use_collectives=False, every
 * `__R.metadata`, merged) is read with only the metadata dataclasses
 * admitted, as records.  It names every tensor's global shape and its
 * chunks (boxes in global coordinates), and where each chunk's item lies:
 * a complete torch.save zip at an offset of a `.distcp` file (optionally
 * one zstd frame), or a tensor in a safetensors blob.  Each tensor becomes
 * one storage of PIECES: runs of the items' data records placed where the
 * chunk's rows go in the whole, so that writers stream it and the tiling
 * check (checkpoint/storage.c) catches holes and overlaps.  Keys and
 * nesting are rebuilt from planner_data as torch's set_element does;
 * non-tensor (BYTES) items are read by the safe pickle reader like any
 * other pickle, their tensors located in their item.
 */
#include "formats/format.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define MAX_NDIM 64

/* ---- what the metadata says ------------------------------------------------- */

typedef struct chunk {
    const int64_t *off, *size;
    int rank; /* the rank whose metadata or file named it; -1 unknown */
} chunk;

/* One entry of state_dict_metadata. */
typedef struct md_item {
    const char *fqn;
    size_t fqn_len;
    bool is_bytes;
    ckpt_dtype dtype;
    int ndim;
    const int64_t *size;
    chunk *chunks;
    size_t nchunks, cap;
    const ckpt_value *path; /* planner_data's tuple, or NULL */
} md_item;

/* One entry of storage_data: (fqn, chunk offsets) -> where its item is. */
typedef struct loc {
    const char *fqn;
    size_t fqn_len;
    int ndim; /* -1: a BYTES entry (no offsets) */
    const int64_t *off;
    ckpt_source *src;
    uint64_t offset, length;
    bool zstd;
    int rank;
} loc;

typedef struct dcp {
    ckpt_file *f;
    md_item **items; /* metadata order */
    size_t nitems, items_cap;
    ckpt_map item_at; /* fqn -> index in items */
    loc **locs;
    size_t nlocs, locs_cap;
    ckpt_map loc_at; /* (fqn, chunk offsets) -> index in locs */
    /* the folder's files named so far, by name */
    ckpt_source **srcs;
    size_t nsrcs;
    const char *meta_name; /* the metadata file being read (messages) */
    int meta_rank;         /* its rank (__R.metadata), or -1 */
    uint64_t nbytes_key;   /* storages made so far (their keys) */
    uint64_t nbytes_items;
    /* safetensors blobs parsed (SAFETENSORS serialization) */
    struct st_blob *blobs;
    ckpt_arena scratch;   /* a tensor item's pickle, dropped once its runs are made */
    struct dslot *dslots; /* the rebuilt dicts' keys (set_element), as added */
    size_t nd, dslots_cap;
    ckpt_map dslot_at; /* (dict, key) -> index in dslots */
} dcp;

/* A loc looked for: loc_at's key */
typedef struct loc_key {
    const dcp *d;
    const char *fqn;
    size_t len;
    int ndim;
    const int64_t *off;
} loc_key;

static uint64_t loc_hash(const loc_key *k)
{
    uint64_t h = ckpt_fnv1a_add(CKPT_FNV1A_BASIS, k->fqn, k->len);
    h = ckpt_fnv1a_add(h, &k->ndim, sizeof k->ndim);
    for (int d = 0; d < k->ndim; d++)
        h = ckpt_fnv1a_add(h, &k->off[d], sizeof k->off[d]);
    return h;
}

static bool loc_same(const void *arg, size_t val)
{
    const loc_key *k = arg;
    const loc *l = k->d->locs[val];
    return l->fqn_len == k->len && l->ndim == k->ndim && memcmp(l->fqn, k->fqn, k->len) == 0 &&
           (k->ndim <= 0 || memcmp(l->off, k->off, (size_t)k->ndim * sizeof(int64_t)) == 0);
}

static int oom(dcp *d)
{
    return ckpt_oom(&d->f->err);
}

/* ---- reading the metadata values ------------------------------------------- */

/* The class name of an object made by a global, or "". */
static const char *obj_class(const ckpt_value *v)
{
    if (!v || v->kind != CKPT_KIND_OBJECT || !v->u.obj.callable ||
        v->u.obj.callable->kind != CKPT_KIND_GLOBAL)
        return "";
    return v->u.obj.callable->u.global.name;
}

static bool is_obj(const ckpt_value *v, const char *cls)
{
    const char *c = obj_class(v);
    size_t n = strlen(c), k = strlen(cls);
    return n >= k && strcmp(c + n - k, cls) == 0 && (n == k || c[n - k - 1] == '.');
}

/* A dataclass's field NAME from its BUILD dict, or NULL. */
static const ckpt_value *field(const ckpt_value *obj, const char *name)
{
    const ckpt_value *st = obj && obj->kind == CKPT_KIND_OBJECT ? obj->u.obj.state : NULL;
    if (st && st->kind == CKPT_KIND_TUPLE && st->u.seq.len == 2 &&
        st->u.seq.items[1]->kind == CKPT_KIND_DICT)
        st = st->u.seq.items[1]; /* (None, slots) */
    if (!st || st->kind != CKPT_KIND_DICT)
        return NULL;
    for (size_t i = 0; i < st->u.dict.keys.len; i++)
        if (ckpt_value_is_str(st->u.dict.keys.items[i], name))
            return st->u.dict.vals.items[i];
    return NULL;
}

/* A torch.Size or a tuple of ints into an arena array. */
static int int_tuple(dcp *d, const ckpt_value *v, const char *what, const char *fqn, int64_t **out,
                     int *n)
{
    if (v && v->kind == CKPT_KIND_OBJECT && is_obj(v, "torch.Size") && v->u.obj.args &&
        v->u.obj.args->u.seq.len == 1)
        v = v->u.obj.args->u.seq.items[0];
    if (!v || (v->kind != CKPT_KIND_TUPLE && v->kind != CKPT_KIND_LIST) ||
        v->u.seq.len > MAX_NDIM)
        return ckpt_err(&d->f->err, CKPT_ERR_FORMAT, "%s: '%.200s': %s is not a tuple of ints",
                        d->meta_name, fqn, what);
    *n = (int)v->u.seq.len;
    *out = ckpt_arena_alloc(&d->f->arena, (v->u.seq.len + 1) * sizeof(int64_t));
    if (!*out)
        return oom(d);
    for (size_t i = 0; i < v->u.seq.len; i++) {
        const ckpt_value *x = v->u.seq.items[i];
        if (x->kind != CKPT_KIND_INT || x->u.i.big || x->u.i.v < 0)
            return ckpt_err(&d->f->err, CKPT_ERR_FORMAT,
                            "%s: '%.200s': %s holds something other than a size", d->meta_name,
                            fqn, what);
        (*out)[i] = x->u.i.v;
    }
    return CKPT_OK;
}

static md_item *item_find(dcp *d, const char *fqn, size_t len)
{
    size_t i;
    return ckpt_map_get(&d->item_at, fqn, len, &i) ? d->items[i] : NULL;
}

static loc *loc_find(dcp *d, const char *fqn, size_t len, int ndim, const int64_t *off)
{
    loc_key k = {d, fqn, len, ndim, off};
    size_t i;
    return ckpt_map_get_hashed(&d->loc_at, loc_hash(&k), loc_same, &k, &i) ? d->locs[i] : NULL;
}

/* The rank R of a name "__R_i.distcp" or "__R.metadata"; -1 otherwise. */
static int name_rank(const char *name)
{
    const char *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    if (strncmp(b, "__", 2) != 0 || b[2] < '0' || b[2] > '9')
        return -1;
    long r = 0;
    for (b += 2; *b >= '0' && *b <= '9'; b++)
        if ((r = r * 10 + (*b - '0')) > 100000000)
            return -1;
    return (*b == '_' || *b == '.') ? (int)r : -1;
}

static ckpt_source *source(dcp *d, const char *name, size_t len)
{
    for (size_t i = d->nsrcs; i-- > 0;) /* the last one named is the likeliest */
        if (strlen(d->srcs[i]->path) == len && memcmp(d->srcs[i]->path, name, len) == 0)
            return d->srcs[i];
    return NULL;
}

/* The source of RELATIVE_PATH (a folder's file; names leading out refused). */
static ckpt_source *source_get(dcp *d, const ckpt_value *rp, const char *fqn)
{
    if (!rp || rp->kind != CKPT_KIND_STR || memchr(rp->u.s.s, 0, rp->u.s.len)) {
        ckpt_err(&d->f->err, CKPT_ERR_FORMAT, "%s: '%.200s': relative_path is not a string",
                 d->meta_name, fqn);
        return NULL;
    }
    ckpt_source *s = source(d, rp->u.s.s, rp->u.s.len);
    if (s)
        return s;
    ckpt_error e = {0};
    s = ckpt_file_source_add(d->f, rp->u.s.s, &e);
    if (!s) {
        ckpt_err(&d->f->err, e.code, "%s: '%.200s': %s", d->meta_name, fqn, e.msg);
        return NULL;
    }
    if (d->nsrcs % 64 == 0) {
        ckpt_source **p = realloc(d->srcs, (d->nsrcs + 64) * sizeof(*p));
        if (!p) {
            oom(d);
            return NULL;
        }
        d->srcs = p;
    }
    d->srcs[d->nsrcs++] = s;
    return s;
}

static bool small_uint(const ckpt_value *v, uint64_t *out)
{
    if (!v || v->kind != CKPT_KIND_INT || v->u.i.v < 0)
        return false;
    if (!v->u.i.big) {
        *out = (uint64_t)v->u.i.v;
        return true;
    }
    /* LONG1 of up to 8 bytes, non-negative */
    if (v->u.i.nbytes > 9 || (v->u.i.nbytes == 9 && v->u.i.bytes[8] != 0))
        return false;
    uint64_t x = 0;
    for (size_t i = v->u.i.nbytes > 8 ? 8 : v->u.i.nbytes; i-- > 0;)
        x = (x << 8) | v->u.i.bytes[i];
    *out = x;
    return true;
}

/* One storage_data entry: MetadataIndex -> _StorageInfo. */
static int add_loc(dcp *d, const ckpt_value *key, const ckpt_value *info)
{
    ckpt_file *f = d->f;
    CKPT_RETURN_IF(!is_obj(key, "MetadataIndex") || !is_obj(info, "_StorageInfo"), &f->err,
                   CKPT_ERR_FORMAT,
                   "%s: storage_data holds a %s -> %s, not MetadataIndex -> _StorageInfo",
                   d->meta_name, ckpt_value_kind_name(key), ckpt_value_kind_name(info));
    const ckpt_value *fqn = field(key, "fqn"), *off = field(key, "offset");
    CKPT_RETURN_IF(!fqn || fqn->kind != CKPT_KIND_STR, &f->err, CKPT_ERR_FORMAT,
                   "%s: a MetadataIndex without an fqn", d->meta_name);
    const char *name = fqn->u.s.s;
    int64_t *o = NULL;
    int ndim = -1;
    if (off && off->kind != CKPT_KIND_NONE)
        CKPT_FORWARD(int_tuple(d, off, "MetadataIndex.offset", name, &o, &ndim));
    uint64_t at, len;
    CKPT_RETURN_IF(!small_uint(field(info, "offset"), &at) ||
                       !small_uint(field(info, "length"), &len),
                   &f->err, CKPT_ERR_FORMAT, "%s: '%.200s': _StorageInfo offset or length is "
                   "not a size", d->meta_name, name);
    bool zstd = false;
    const ckpt_value *tr = field(info, "transform_descriptors");
    if (tr && tr->kind != CKPT_KIND_NONE) {
        CKPT_RETURN_IF(tr->kind != CKPT_KIND_LIST && tr->kind != CKPT_KIND_TUPLE, &f->err,
                       CKPT_ERR_FORMAT, "%s: '%.200s': transform_descriptors is a %s",
                       d->meta_name, name, ckpt_value_kind_name(tr));
        for (size_t i = 0; i < tr->u.seq.len; i++) {
            const ckpt_value *t = tr->u.seq.items[i];
            CKPT_RETURN_IF(!ckpt_value_is_str(t, "stream.zstd/1") || zstd, &f->err,
                           CKPT_ERR_UNSUPPORTED, "%s: '%.200s': transform '%.100s' is not "
                           "supported (only one stream.zstd/1)", d->meta_name, name,
                           t->kind == CKPT_KIND_STR ? t->u.s.s : "?");
            zstd = true;
        }
    }
    if (loc_find(d, name, fqn->u.s.len, ndim, o))
        return CKPT_OK; /* merged metadata: the lowest rank's entry is kept */
    ckpt_source *src = source_get(d, field(info, "relative_path"), name);
    if (!src)
        return f->err.code;
    CKPT_RETURN_IF(at > src->file_size || len > src->file_size - at, &f->err, CKPT_ERR_FORMAT,
                   "%s: '%.200s': its item (bytes %llu..%llu) lies past the end of '%s' (%llu "
                   "bytes)", d->meta_name, name, (unsigned long long)at,
                   (unsigned long long)(at + len), src->path, (unsigned long long)src->file_size);
    loc *l = ckpt_arena_alloc(&f->arena, sizeof(*l));
    if (!l || CKPT_GROW(d->locs, d->locs_cap, d->nlocs + 1) < 0)
        return oom(d);
    l->fqn = name;
    l->fqn_len = fqn->u.s.len;
    l->ndim = ndim;
    l->off = o;
    l->src = src;
    l->offset = at;
    l->length = len;
    l->zstd = zstd;
    l->rank = d->meta_rank >= 0 ? d->meta_rank : name_rank(src->path);
    loc_key k = {d, name, l->fqn_len, ndim, o};
    if (ckpt_map_put_hashed(&d->loc_at, loc_hash(&k), loc_same, &k, d->nlocs, NULL) < 0)
        return oom(d);
    d->locs[d->nlocs++] = l;
    return CKPT_OK;
}

static int chunk_add(dcp *d, md_item *m, const int64_t *off, const int64_t *size, int rank)
{
    for (size_t i = 0; i < m->nchunks; i++)
        if (memcmp(m->chunks[i].off, off, (size_t)m->ndim * sizeof(int64_t)) == 0) {
            /* merged metadata: ranks that saved the same box (replicated data) */
            CKPT_RETURN_IF(memcmp(m->chunks[i].size, size, (size_t)m->ndim * sizeof(int64_t)),
                           &d->f->err, CKPT_ERR_FORMAT,
                           "%s: '%.200s': two chunks at the same offsets differ in size",
                           d->meta_name, m->fqn);
            return CKPT_OK;
        }
    if (m->nchunks == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 4;
        chunk *c = ckpt_arena_alloc(&d->f->arena, cap * sizeof(*c));
        if (!c)
            return oom(d);
        if (m->nchunks)
            memcpy(c, m->chunks, m->nchunks * sizeof(*c));
        m->chunks = c;
        m->cap = cap;
    }
    m->chunks[m->nchunks++] = (chunk){.off = off, .size = size, .rank = rank};
    return CKPT_OK;
}

/* One entry of state_dict_metadata. */
static int add_item(dcp *d, const ckpt_value *key, const ckpt_value *val)
{
    ckpt_file *f = d->f;
    CKPT_RETURN_IF(key->kind != CKPT_KIND_STR, &f->err, CKPT_ERR_FORMAT,
                   "%s: state_dict_metadata has a %s key", d->meta_name,
                   ckpt_value_kind_name(key));
    const char *fqn = key->u.s.s;
    CKPT_FORWARD(ckpt_key_check(&f->err, fqn, key->u.s.len));
    bool bytes = is_obj(val, "BytesStorageMetadata");
    CKPT_RETURN_IF(!bytes && !is_obj(val, "TensorStorageMetadata"), &f->err, CKPT_ERR_FORMAT,
                   "%s: '%.200s' is described by a %s, not Tensor- or BytesStorageMetadata",
                   d->meta_name, fqn, ckpt_value_kind_name(val));
    ckpt_dtype dt = CKPT_DTYPE_UNKNOWN;
    int64_t *size = NULL;
    int ndim = 0;
    if (!bytes) {
        const ckpt_value *props = field(val, "properties");
        const ckpt_value *st = props && props->kind == CKPT_KIND_OBJECT ? props->u.obj.state : NULL;
        const ckpt_value *dv = NULL;
        if (st && st->kind == CKPT_KIND_TUPLE && st->u.seq.len >= 1)
            dv = st->u.seq.items[0]; /* __setstate__: (dtype, layout, ...) */
        else if (props)
            dv = field(props, "dtype");
        if (dv && dv->kind == CKPT_KIND_GLOBAL)
            dt = ckpt_dtype_from_name(dv->u.global.name);
        CKPT_RETURN_IF(dt == CKPT_DTYPE_UNKNOWN || ckpt_dtype_bits(dt) % 8, &f->err,
                       CKPT_ERR_FORMAT, "%s: '%.200s': its TensorProperties name no known dtype",
                       d->meta_name, fqn);
        CKPT_FORWARD(int_tuple(d, field(val, "size"), "size", fqn, &size, &ndim));
    }
    md_item *m = item_find(d, fqn, key->u.s.len);
    if (m) {
        CKPT_RETURN_IF(m->is_bytes != bytes ||
                           (!bytes && (m->dtype != dt || m->ndim != ndim ||
                                       memcmp(m->size, size, (size_t)ndim * sizeof(*size)))),
                       &f->err, CKPT_ERR_FORMAT,
                       "%s: '%.200s' is described differently by two ranks' metadata",
                       d->meta_name, fqn);
    } else {
        m = ckpt_arena_alloc(&f->arena, sizeof(*m));
        if (!m)
            return oom(d);
        m->fqn = fqn;
        m->fqn_len = key->u.s.len;
        m->is_bytes = bytes;
        m->dtype = dt;
        m->ndim = ndim;
        m->size = size;
        if (d->nitems == d->items_cap) {
            size_t cap = d->items_cap ? d->items_cap * 2 : 256;
            md_item **p = realloc(d->items, cap * sizeof(*p));
            if (!p)
                return oom(d);
            d->items = p;
            d->items_cap = cap;
        }
        if (ckpt_map_put(&d->item_at, fqn, m->fqn_len, d->nitems, NULL) < 0)
            return oom(d);
        d->items[d->nitems++] = m;
    }
    if (bytes)
        return CKPT_OK;
    const ckpt_value *chunks = field(val, "chunks");
    CKPT_RETURN_IF(!chunks || chunks->kind != CKPT_KIND_LIST, &f->err, CKPT_ERR_FORMAT,
                   "%s: '%.200s' has no list of chunks", d->meta_name, fqn);
    for (size_t i = 0; i < chunks->u.seq.len; i++) {
        const ckpt_value *c = chunks->u.seq.items[i];
        CKPT_RETURN_IF(!is_obj(c, "ChunkStorageMetadata"), &f->err, CKPT_ERR_FORMAT,
                       "%s: '%.200s': a chunk is a %s, not ChunkStorageMetadata", d->meta_name,
                       fqn, ckpt_value_kind_name(c));
        int64_t *o, *s;
        int no, ns;
        CKPT_FORWARD(int_tuple(d, field(c, "offsets"), "a chunk's offsets", fqn, &o, &no));
        CKPT_FORWARD(int_tuple(d, field(c, "sizes"), "a chunk's sizes", fqn, &s, &ns));
        CKPT_RETURN_IF(no != ndim || ns != ndim, &f->err, CKPT_ERR_FORMAT,
                       "%s: '%.200s': a chunk has %d dimensions, the tensor %d", d->meta_name,
                       fqn, no != ndim ? no : ns, ndim);
        for (int k = 0; k < ndim; k++)
            CKPT_RETURN_IF(o[k] > m->size[k] || s[k] > m->size[k] - o[k], &f->err,
                           CKPT_ERR_FORMAT,
                           "%s: '%.200s': chunk %zu (offset %lld, size %lld in dimension %d) "
                           "lies outside the tensor's %lld", d->meta_name, fqn, i,
                           (long long)o[k], (long long)s[k], k, (long long)m->size[k]);
        CKPT_FORWARD(chunk_add(d, m, o, s, d->meta_rank));
    }
    return CKPT_OK;
}

/* The globals of a .metadata pickle: its dataclasses as records, torch.Size,
 * dtypes, layouts and pathlib's paths; nothing else, whatever the options. */
static ckpt_global_class meta_classify(void *user, const char *q)
{
    (void)user;
    if (strncmp(q, "torch.distributed.checkpoint.", 29) == 0 || strncmp(q, "pathlib.", 8) == 0)
        return ckpt_globals_builtin_class(q) == CKPT_GLOBAL_KNOWN_DATA ? CKPT_GLOBAL_KNOWN_DATA
                                                                       : CKPT_GLOBAL_REFUSED;
    if (strcmp(q, "builtins.getattr") == 0)
        return CKPT_GLOBAL_KNOWN_DATA; /* the VM admits its known (class, attribute) pairs only */
    if (strcmp(q, "torch.Size") == 0 || strcmp(q, "torch.serialization._get_layout") == 0 ||
        strcmp(q, "torch.strided") == 0)
        return CKPT_GLOBAL_INTERPRETED;
    ckpt_global_class c = ckpt_globals_builtin_class(q);
    if (c == CKPT_GLOBAL_INTERPRETED && strncmp(q, "torch.", 6) == 0 && !strchr(q + 6, '.') &&
        ckpt_dtype_from_name(q) != CKPT_DTYPE_UNKNOWN)
        return c; /* a dtype */
    if (strcmp(q, "collections.OrderedDict") == 0)
        return CKPT_GLOBAL_INTERPRETED;
    return CKPT_GLOBAL_REFUSED;
}

static ckpt_value *meta_no_pid(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    (void)user, (void)pid, (void)offset;
    ckpt_err(err, CKPT_ERR_FORMAT, "a persistent id (metadata holds no tensors)");
    return NULL;
}

/* Read metadata file NAME (rank RANK, -1 for the global one) into D. */
static int read_metadata(dcp *d, const char *name, int rank, const ckpt_value **planner)
{
    ckpt_file *f = d->f;
    d->meta_name = name;
    d->meta_rank = rank;
    ckpt_error e = {0};
    ckpt_source *src = ckpt_file_source_add(f, name, &e);
    if (!src)
        return ckpt_err(&f->err, e.code, "%s", e.msg);
    CKPT_RETURN_IF(src->file_size > f->limits[CKPT_LIMIT_PICKLE_BYTES], &f->err, CKPT_ERR_LIMIT,
                   "%s is %llu bytes, over the pickle limit of %llu", name,
                   (unsigned long long)src->file_size,
                   (unsigned long long)f->limits[CKPT_LIMIT_PICKLE_BYTES]);
    CKPT_RETURN_IF(src->file_size == 0, &f->err, CKPT_ERR_FORMAT, "%s is empty", name);
    int fd = ckpt_source_fd(f, src);
    if (fd < 0)
        return f->err.code;
    uint8_t *buf = malloc((size_t)src->file_size);
    if (!buf)
        return oom(d);
    if (ckpt_pread_all(fd, buf, (size_t)src->file_size, 0)) {
        free(buf);
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot read %s", name);
    }
    ckpt_pickle_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.name = name;
    ctx.limits = f->limits;
    ctx.classify = meta_classify;
    ctx.persistent_load = meta_no_pid;
    ctx.arena = &f->arena;
    ckpt_value *root = NULL;
    int rc = ckpt_pickle_load(&ctx, buf, (size_t)src->file_size, &root, NULL, &f->err);
    free(buf);
    const char *g = rc ? strstr(f->err.msg, "refused global '") : NULL;
    if (g) {
        /* the VM's hint names options: none admits a global here */
        char q[300];
        const char *e = strchr(g + 16, '\'');
        snprintf(q, sizeof q, "%.*s", e ? (int)(e - g - 16) : 0, g + 16);
        int code = f->err.code;
        ckpt_err_clear(&f->err);
        return ckpt_err(&f->err, code, "%s: refused global '%s': not one of the records a "
                        "torch.distributed.checkpoint metadata holds (no option admits it)",
                        name, q);
    }
    if (rc) {
        /* the VM's message may not name the file */
        if (!strstr(f->err.msg, name)) {
            char m[sizeof f->err.msg];
            snprintf(m, sizeof m, "%s", f->err.msg);
            int code = f->err.code;
            ckpt_err_clear(&f->err);
            ckpt_err(&f->err, code, "%s: %s", name, m);
        }
        return rc;
    }
    CKPT_RETURN_IF(!is_obj(root, "Metadata"), &f->err, CKPT_ERR_FORMAT,
                   "%s holds a %s, not a torch.distributed.checkpoint Metadata", name,
                   ckpt_value_kind_name(root));
    const ckpt_value *sdm = field(root, "state_dict_metadata"),
                     *sd = field(root, "storage_data"), *pd = field(root, "planner_data");
    CKPT_RETURN_IF(!sdm || sdm->kind != CKPT_KIND_DICT, &f->err, CKPT_ERR_FORMAT,
                   "%s: no state_dict_metadata dict", name);
    CKPT_RETURN_IF(!sd || sd->kind != CKPT_KIND_DICT, &f->err, CKPT_ERR_FORMAT,
                   "%s: no storage_data dict", name);
    CKPT_RETURN_IF(pd && pd->kind != CKPT_KIND_DICT && pd->kind != CKPT_KIND_NONE, &f->err,
                   CKPT_ERR_FORMAT, "%s: planner_data is a %s", name, ckpt_value_kind_name(pd));
    for (size_t i = 0; i < sdm->u.dict.keys.len; i++)
        CKPT_FORWARD(add_item(d, sdm->u.dict.keys.items[i], sdm->u.dict.vals.items[i]));
    for (size_t i = 0; i < sd->u.dict.keys.len; i++)
        CKPT_FORWARD(add_loc(d, sd->u.dict.keys.items[i], sd->u.dict.vals.items[i]));
    *planner = pd && pd->kind == CKPT_KIND_DICT ? pd : NULL;
    return CKPT_OK;
}

/* planner_data: fqn -> tuple path; merged files agree or the first wins. */
static int apply_planner(dcp *d, const ckpt_value *pd)
{
    if (!pd)
        return CKPT_OK;
    for (size_t i = 0; i < pd->u.dict.keys.len; i++) {
        const ckpt_value *k = pd->u.dict.keys.items[i], *v = pd->u.dict.vals.items[i];
        CKPT_RETURN_IF(k->kind != CKPT_KIND_STR || (v->kind != CKPT_KIND_TUPLE &&
                                                    v->kind != CKPT_KIND_LIST) ||
                           v->u.seq.len == 0,
                       &d->f->err, CKPT_ERR_FORMAT,
                       "%s: planner_data maps a %s to a %s, not a key to a path",
                       d->meta_name, ckpt_value_kind_name(k), ckpt_value_kind_name(v));
        for (size_t j = 0; j < v->u.seq.len; j++) {
            const ckpt_value *e = v->u.seq.items[j];
            CKPT_RETURN_IF(e->kind != CKPT_KIND_STR &&
                               (e->kind != CKPT_KIND_INT || e->u.i.big || e->u.i.v < 0 ||
                                e->u.i.v > 100000000),
                           &d->f->err, CKPT_ERR_FORMAT,
                           "%s: planner_data path of '%.200s' holds a %s", d->meta_name,
                           k->u.s.s, ckpt_value_kind_name(e));
        }
        md_item *m = item_find(d, k->u.s.s, k->u.s.len);
        if (m && !m->path)
            m->path = v;
    }
    return CKPT_OK;
}

/* ---- items -------------------------------------------------------------------- */

/* An item opened: its zip, in a window of its file or in memory. */
typedef struct item {
    ckpt_zip_dir *zd;
    int fd;             /* where the zip is read from (the source, or a memfd) */
    bool own_fd;
    uint64_t base, size;/* the window */
    const uint8_t *mem; /* decompressed bytes (zstd), or NULL */
    ckpt_source *src;
    bool no_crc;        /* a safetensors blob: no CRC-32 to check */
    char what[300];     /* "'__0_0.distcp' item at 1024" for messages */
} item;

static void item_close(item *it)
{
    ckpt_zip_dir_free(it->zd);
    if (it->own_fd && it->fd >= 0)
        close(it->fd);
    it->zd = NULL;
    it->fd = -1;
}

/* The one zstd frame IN[0..N) (stream.zstd/1: its size may be unstated),
 * decompressed by streaming into a buffer grown from N * 4 + 4096 bytes up
 * to MAX (*OVER when it wants more): *OUT (malloc'd) and *LEN, or false when
 * the bytes are not exactly one frame, it is cut short, or memory fails. */
static bool zstd_frame(const uint8_t *in, size_t n, uint64_t max, uint8_t **out, size_t *len,
                       bool *over)
{
    size_t size = n * 4 + 4096, have = 0;
    uint8_t *buf = NULL;
    ZSTD_DStream *zs = ZSTD_createDStream();
    ZSTD_inBuffer ib = {in, n, 0};
    size_t r = zs ? ZSTD_initDStream(zs) : 1;
    *over = false;
    while (zs && !ZSTD_isError(r) && (ib.pos < ib.size || r != 0)) {
        if (!buf || have == size) {
            size = buf ? size * 2 : size;
            if (size > max) {
                *over = true;
                break;
            }
            uint8_t *nb = realloc(buf, size);
            if (!nb)
                break;
            buf = nb;
        }
        ZSTD_outBuffer ob = {buf, size, have};
        r = ZSTD_decompressStream(zs, &ob, &ib);
        have = ob.pos;
        if (!ZSTD_isError(r) && r != 0 && ib.pos == ib.size && have < size)
            break; /* cut short: it wants input there is not */
    }
    bool ok = zs && !ZSTD_isError(r) && r == 0 && ib.pos == ib.size;
    ZSTD_freeDStream(zs);
    if (!ok) {
        free(buf);
        return false;
    }
    *out = buf;
    *len = have;
    return true;
}

/* A memfd holding BUF[0..N): the zip readers read descriptors.  -1 on failure. */
static int memfd_of(const uint8_t *buf, size_t n)
{
    int mfd = memfd_create("ckpt-dcp-item", MFD_CLOEXEC);
    for (size_t at = 0; mfd >= 0 && at < n;) {
        ssize_t w = write(mfd, buf + at, n - at);
        if (w <= 0) {
            close(mfd);
            return -1;
        }
        at += (size_t)w;
    }
    return mfd;
}

/* Decompress the zstd frame of L's bytes (at most CAP) into the arena: the
 * item's bytes, held as long as the checkpoint is open (mem pieces). */
static int unzstd(dcp *d, const loc *l, int fd, uint64_t cap, uint8_t **out, size_t *len,
                  const char *what)
{
    ckpt_file *f = d->f;
    CKPT_RETURN_IF(l->length > cap, &f->err, CKPT_ERR_LIMIT,
                   "%s: a compressed item of %llu bytes", what, (unsigned long long)l->length);
    uint8_t *in = malloc(l->length ? (size_t)l->length : 1);
    if (!in)
        return oom(d);
    if (ckpt_pread_all(fd, in, (size_t)l->length, l->offset)) {
        free(in);
        return ckpt_err(&f->err, CKPT_ERR_IO, "%s: cannot read", what);
    }
    uint8_t *buf = NULL;
    size_t have = 0;
    bool over;
    bool ok = zstd_frame(in, (size_t)l->length, cap + 4096, &buf, &have, &over);
    free(in);
    uint8_t *kept = ok ? ckpt_arena_alloc(&f->arena, have ? have : 1) : NULL;
    if (kept)
        memcpy(kept, buf, have);
    free(buf);
    CKPT_RETURN_IF(!ok, &f->err, over ? CKPT_ERR_LIMIT : CKPT_ERR_FORMAT,
                   "%s: its stream.zstd/1 bytes are not one zstd frame, are cut short, or "
                   "decompress to more than %llu bytes", what, (unsigned long long)cap);
    if (!kept)
        return oom(d);
    *out = kept;
    *len = have;
    return CKPT_OK;
}

/* Open L's item as a zip; CAP bounds what a compressed one may inflate to. */
static int item_open(dcp *d, const loc *l, uint64_t cap, item *it)
{
    ckpt_file *f = d->f;
    memset(it, 0, sizeof *it);
    it->fd = -1;
    it->src = l->src;
    snprintf(it->what, sizeof it->what, "'%s' item '%.150s' (from byte %llu)", l->src->path,
             l->fqn, (unsigned long long)l->offset);
    int fd = ckpt_source_fd(f, l->src);
    if (fd < 0)
        return f->err.code;
    if (l->zstd) {
        uint8_t *buf = NULL;
        size_t n = 0;
        CKPT_FORWARD(unzstd(d, l, fd, cap, &buf, &n, it->what));
        /* the zip reader reads descriptors: a memfd holds the bytes for it */
        int mfd = memfd_of(buf, n);
        if (mfd < 0)
            return ckpt_err(&f->err, CKPT_ERR_IO, "memfd: %s", strerror(errno));
        it->fd = mfd;
        it->own_fd = true;
        it->mem = buf;
        it->base = 0;
        it->size = n;
    } else {
        it->fd = fd;
        it->base = l->offset;
        it->size = l->length;
    }
    ckpt_error e = {0};
    int rc = ckpt_zip_dir_open_torch(it->fd, it->base, it->size, &it->zd, &e);
    if (rc == CKPT_OK && !ckpt_zip_dir_reads(it->zd, CKPT_ZIP_READER_TORCH))
        rc = ckpt_err(&e, CKPT_ERR_FORMAT, "%s", ckpt_zip_dir_refusal(it->zd, CKPT_ZIP_READER_TORCH));
    if (rc) {
        item_close(it);
        return ckpt_err(&f->err, rc, "%s: not a torch.save zip: %s", it->what, e.msg);
    }
    return CKPT_OK;
}

/* Record NAME ("data.pkl", "data/0") of the item: its entry, or NULL + error. */
static const ckpt_zip_entry *item_record(dcp *d, item *it, const char *name)
{
    int64_t i = ckpt_zip_dir_find(it->zd, CKPT_ZIP_READER_TORCH, name);
    const ckpt_zip_entry *e = i < 0 ? NULL : ckpt_zip_dir_entry(it->zd, CKPT_ZIP_READER_TORCH,
                                                                (size_t)i);
    if (!e) {
        ckpt_err(&d->f->err, CKPT_ERR_FORMAT, "%s: no record '%s'", it->what, name);
        return NULL;
    }
    if (e->method != 0 || e->data_at == UINT64_MAX || e->data_at > it->size ||
        e->usize > it->size - e->data_at || e->csize != e->usize) {
        ckpt_err(&d->f->err, CKPT_ERR_FORMAT, "%s: record '%s' is compressed, truncated or "
                 "lies outside the item", it->what, name);
        return NULL;
    }
    return e;
}

static int item_pickle(dcp *d, item *it, ckpt_pickle_ctx *ctx, ckpt_value **root)
{
    ckpt_file *f = d->f;
    int64_t i = ckpt_zip_dir_find(it->zd, CKPT_ZIP_READER_TORCH, "data.pkl");
    CKPT_RETURN_IF(i < 0, &f->err, CKPT_ERR_FORMAT, "%s: no data.pkl record", it->what);
    uint8_t *buf;
    size_t len;
    bool crc_ok;
    ckpt_error e = {0};
    int rc = ckpt_zip_dir_read(it->zd, it->fd, CKPT_ZIP_READER_TORCH, (size_t)i,
                               f->limits[CKPT_LIMIT_PICKLE_BYTES], &buf, &len, &crc_ok, &e);
    if (rc == CKPT_OK && !crc_ok)
        rc = ckpt_err(&e, CKPT_ERR_FORMAT, "data.pkl: CRC-32 mismatch");
    if (rc) {
        free(buf);
        return ckpt_err(&f->err, rc, "%s: %s", it->what, e.msg);
    }
    char name[sizeof it->what + 16];
    snprintf(name, sizeof name, "%s data.pkl", it->what);
    ctx->name = name;
    rc = ckpt_pickle_load(ctx, buf, len, root, NULL, &f->err);
    free(buf);
    if (rc && !strstr(f->err.msg, it->src->path)) {
        char m[sizeof f->err.msg];
        snprintf(m, sizeof m, "%s", f->err.msg);
        int code = f->err.code;
        ckpt_err_clear(&f->err);
        ckpt_err(&f->err, code, "%s: %s", it->what, m);
    }
    return rc;
}

/* A piece of record E of the item: NBYTES from byte FROM of it. */
static ckpt_piece record_piece(const item *it, const ckpt_zip_entry *e, uint64_t from,
                               uint64_t nbytes, uint64_t dst)
{
    ckpt_piece p = {.nbytes = nbytes, .dst_offset = dst};
    if (it->mem)
        p.mem = it->mem + e->data_at + from;
    else {
        p.src = it->src;
        p.file_offset = it->base + e->data_at + from;
    }
    if (!it->no_crc && from == 0 && nbytes == e->usize) {
        p.has_crc = true;
        p.crc32 = e->crc;
    }
    return p;
}

/* ---- tensors from chunks ---------------------------------------------------- */

typedef struct pieces {
    ckpt_piece *p;
    size_t n, cap;
} pieces;

static int piece_push(dcp *d, pieces *ps, ckpt_piece p)
{
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 16;
        ckpt_piece *q = realloc(ps->p, cap * sizeof(*q));
        if (!q)
            return oom(d);
        ps->p = q;
        ps->cap = cap;
    }
    ps->p[ps->n++] = p;
    return CKPT_OK;
}

/* An item's tensor: its storage is a record we only locate, not a table entry. */
static ckpt_value *item_pid(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    dcp *d = user;
    ckpt_value **a = pid->kind == CKPT_KIND_TUPLE ? pid->u.seq.items : NULL;
    const char *type_name = NULL;
    ckpt_dtype dt = CKPT_DTYPE_UNKNOWN;
    if (a && pid->u.seq.len == 5 && ckpt_value_is_str(a[0], "storage") &&
        a[1]->kind == CKPT_KIND_GLOBAL)
        dt = ckpt_storage_type_dtype(a[1]->u.global.name, &type_name);
    if (dt == CKPT_DTYPE_UNKNOWN || a[2]->kind != CKPT_KIND_STR || a[4]->kind != CKPT_KIND_INT ||
        a[4]->u.i.big || a[4]->u.i.v < 0 || a[2]->u.s.len > 32) {
        ckpt_err(err, CKPT_ERR_FORMAT, "a persistent id that is not ('storage', type, key, "
                                       "location, numel)");
        return NULL;
    }
    ckpt_storage *s = ckpt_arena_alloc(&d->scratch, sizeof(*s));
    ckpt_value *v = ckpt_value_new(&d->scratch, CKPT_KIND_STORAGE, offset);
    uint64_t nbytes;
    if (!s || !v || !(s->key = ckpt_arena_strndup(&d->scratch, a[2]->u.s.s, a[2]->u.s.len))) {
        ckpt_oom(err);
        return NULL;
    }
    if (ckpt_mul_overflow((uint64_t)a[4]->u.i.v, ckpt_dtype_size(dt), &nbytes)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage size overflows");
        return NULL;
    }
    s->src_key = s->key;
    s->dtype = s->src_dtype = dt;
    s->numel = a[4]->u.i.v;
    s->nbytes = s->src_nbytes = nbytes;
    s->type_name = type_name;
    s->device = "cpu";
    v->u.st.ptr = s;
    v->u.st.dtype = dt;
    v->u.st.type_name = type_name;
    return v;
}

static bool contiguous(const ckpt_tensor *t)
{
    int64_t want = 1;
    for (int k = t->ndim; k-- > 0;) {
        if (t->shape[k] != 1 && t->stride[k] != want)
            return false;
        want *= t->shape[k];
    }
    return true;
}

/* The runs that put a box of a contiguous source into the contiguous whole:
 * one per row of the dimensions before the last one the box does not span. */
static int box_runs(dcp *d, const md_item *m, const chunk *c, size_t es,
                    int (*emit)(dcp *, void *, uint64_t src_el, uint64_t dst_el, uint64_t n),
                    void *user)
{
    int nd = m->ndim;
    int64_t numel = 1;
    for (int k = 0; k < nd; k++)
        numel *= c->size[k];
    (void)es;
    if (numel == 0)
        return CKPT_OK;
    int k0 = nd - 1; /* the run spans dimensions k0.. */
    while (k0 > 0 && c->size[k0] == m->size[k0])
        k0--;
    uint64_t run = 1, gstride[MAX_NDIM];
    for (int k = nd; k-- > 0;) {
        gstride[k] = k == nd - 1 ? 1 : gstride[k + 1] * (uint64_t)m->size[k + 1];
        if (k >= k0)
            run *= (uint64_t)c->size[k];
    }
    if (nd == 0)
        return emit(d, user, 0, 0, 1);
    int64_t idx[MAX_NDIM] = {0};
    uint64_t src = 0;
    for (;;) {
        uint64_t dst = 0;
        for (int k = 0; k < nd; k++)
            dst += (uint64_t)(c->off[k] + (k < k0 ? idx[k] : 0)) * gstride[k];
        CKPT_FORWARD(emit(d, user, src, dst, run));
        src += run;
        int k = k0 - 1;
        while (k >= 0 && ++idx[k] == c->size[k])
            idx[k--] = 0;
        if (k < 0)
            break;
    }
    return CKPT_OK;
}

typedef struct emit_ctx {
    pieces *ps;
    const item *it;
    const ckpt_zip_entry *e; /* the record, or NULL for MEM */
    const uint8_t *mem;
    uint64_t from; /* the tensor's first byte in the record */
    size_t es;
} emit_ctx;

static int emit_piece(dcp *d, void *user, uint64_t src_el, uint64_t dst_el, uint64_t n)
{
    emit_ctx *c = user;
    ckpt_piece p;
    if (c->e) {
        p = record_piece(c->it, c->e, c->from + src_el * c->es, n * c->es, dst_el * c->es);
    } else {
        p = (ckpt_piece){.mem = c->mem + src_el * c->es, .nbytes = n * c->es,
                         .dst_offset = dst_el * c->es};
    }
    return piece_push(d, c->ps, p);
}

/* ---- the SAFETENSORS serialization: one blob per rank file ------------------ */

typedef struct st_blob {
    ckpt_source *src;
    uint64_t at, data_at, data_len;
    cJSON *header;
    struct st_blob *next;
} st_blob;

static int st_blob_get(dcp *d, const loc *l, st_blob **out)
{
    for (st_blob *b = d->blobs; b; b = b->next)
        if (b->src == l->src && b->at == l->offset) {
            *out = b;
            return CKPT_OK;
        }
    ckpt_file *f = d->f;
    int fd = ckpt_source_fd(f, l->src);
    if (fd < 0)
        return f->err.code;
    uint8_t h8[8];
    uint64_t hl = 0;
    CKPT_RETURN_IF(l->src->file_size - l->offset < 8 || ckpt_pread_all(fd, h8, 8, l->offset),
                   &f->err, CKPT_ERR_FORMAT, "'%s' at byte %llu: neither a zip nor a safetensors "
                   "blob", l->src->path, (unsigned long long)l->offset);
    for (int k = 8; k-- > 0;)
        hl = (hl << 8) | h8[k];
    CKPT_RETURN_IF(hl > 100000000 || hl > l->src->file_size - l->offset - 8, &f->err,
                   CKPT_ERR_FORMAT, "'%s' at byte %llu: neither a zip nor a safetensors blob "
                   "(header length %llu)", l->src->path, (unsigned long long)l->offset,
                   (unsigned long long)hl);
    char *js = malloc((size_t)hl + 1);
    if (!js)
        return oom(d);
    if (ckpt_pread_all(fd, js, (size_t)hl, l->offset + 8)) {
        free(js);
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot read '%s'", l->src->path);
    }
    js[hl] = 0;
    cJSON *j = cJSON_ParseWithLength(js, (size_t)hl);
    free(js);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "'%s' at byte %llu: its safetensors header "
                        "is not a JSON object", l->src->path, (unsigned long long)l->offset);
    }
    st_blob *b = calloc(1, sizeof *b);
    if (!b) {
        cJSON_Delete(j);
        return oom(d);
    }
    b->src = l->src;
    b->at = l->offset;
    b->data_at = l->offset + 8 + hl;
    b->data_len = l->src->file_size - b->data_at;
    b->header = j;
    b->next = d->blobs;
    d->blobs = b;
    *out = b;
    return CKPT_OK;
}

static const struct {
    const char *name;
    ckpt_dtype dt;
} st_names[] = {
    {"F64", CKPT_DTYPE_FLOAT64}, {"F32", CKPT_DTYPE_FLOAT32}, {"F16", CKPT_DTYPE_FLOAT16},
    {"BF16", CKPT_DTYPE_BFLOAT16}, {"I64", CKPT_DTYPE_INT64}, {"I32", CKPT_DTYPE_INT32},
    {"I16", CKPT_DTYPE_INT16}, {"I8", CKPT_DTYPE_INT8}, {"U8", CKPT_DTYPE_UINT8},
    {"BOOL", CKPT_DTYPE_BOOL}, {"U16", CKPT_DTYPE_UINT16}, {"U32", CKPT_DTYPE_UINT32},
    {"U64", CKPT_DTYPE_UINT64}, {"F8_E5M2", CKPT_DTYPE_FLOAT8_E5M2},
    {"F8_E4M3", CKPT_DTYPE_FLOAT8_E4M3FN}, {"C64", CKPT_DTYPE_COMPLEX64},
};

/* The chunk C of M from the safetensors blob at L: its tensor by fqn. */
static int st_chunk(dcp *d, const md_item *m, const chunk *c, const loc *l, pieces *ps)
{
    ckpt_file *f = d->f;
    st_blob *b = NULL;
    CKPT_FORWARD(st_blob_get(d, l, &b));
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(b->header, m->fqn);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype"),
                *sh = cJSON_GetObjectItemCaseSensitive(t, "shape"),
                *of = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    CKPT_RETURN_IF(!cJSON_IsString(dt) || !cJSON_IsArray(sh) || cJSON_GetArraySize(of) != 2,
                   &f->err, CKPT_ERR_FORMAT, "'%s': safetensors blob at byte %llu has no "
                   "tensor '%.200s'", l->src->path, (unsigned long long)b->at, m->fqn);
    ckpt_dtype sdt = CKPT_DTYPE_UNKNOWN;
    for (size_t i = 0; i < sizeof st_names / sizeof st_names[0]; i++)
        if (strcmp(dt->valuestring, st_names[i].name) == 0)
            sdt = st_names[i].dt;
    CKPT_RETURN_IF(sdt != m->dtype, &f->err, CKPT_ERR_FORMAT,
                   "'%s': tensor '%.200s' is %s in its safetensors blob, %s in the metadata",
                   l->src->path, m->fqn, dt->valuestring, ckpt_dtype_name(m->dtype));
    CKPT_RETURN_IF(cJSON_GetArraySize(sh) != m->ndim, &f->err, CKPT_ERR_FORMAT,
                   "'%s': tensor '%.200s' has another rank than its chunk", l->src->path, m->fqn);
    for (int k = 0; k < m->ndim; k++) {
        const cJSON *x = cJSON_GetArrayItem(sh, k);
        CKPT_RETURN_IF(!cJSON_IsNumber(x) || x->valuedouble != (double)c->size[k], &f->err,
                       CKPT_ERR_FORMAT, "'%s': tensor '%.200s' has another shape than its chunk",
                       l->src->path, m->fqn);
    }
    double a = cJSON_GetArrayItem(of, 0)->valuedouble, z = cJSON_GetArrayItem(of, 1)->valuedouble;
    uint64_t numel = 1;
    for (int k = 0; k < m->ndim; k++)
        numel *= (uint64_t)c->size[k];
    uint64_t es = ckpt_dtype_size(m->dtype);
    CKPT_RETURN_IF(!(a >= 0 && z >= a && z <= (double)b->data_len) ||
                       (uint64_t)(z - a) != numel * es,
                   &f->err, CKPT_ERR_FORMAT, "'%s': tensor '%.200s': its data offsets lie outside "
                   "the blob or do not hold its shape", l->src->path, m->fqn);
    item it = {.src = l->src, .base = b->data_at + (uint64_t)a, .size = (uint64_t)(z - a),
               .no_crc = true};
    ckpt_zip_entry e = {.usize = it.size, .data_at = 0};
    emit_ctx ec = {.ps = ps, .it = &it, .e = &e, .es = es};
    return box_runs(d, m, c, es, emit_piece, &ec);
}

/* Chunk C of M: its item read (a torch.save zip of one tensor), checked
 * against the chunk, and its runs added to PS. */
static int tensor_chunk(dcp *d, const md_item *m, const chunk *c, pieces *ps, chunk *info)
{
    ckpt_file *f = d->f;
    loc *l = loc_find(d, m->fqn, m->fqn_len, m->ndim, c->off);
    uint64_t numel = 1;
    for (int k = 0; k < m->ndim; k++)
        numel *= (uint64_t)c->size[k];
    if (!l) {
        CKPT_RETURN_IF(numel != 0, &f->err, CKPT_ERR_FORMAT,
                       "%s: tensor '%.200s': no storage entry for a chunk", d->meta_name, m->fqn);
        return CKPT_OK; /* an empty chunk that was not written */
    }
    info->rank = l->rank;
    size_t es = ckpt_dtype_size(m->dtype);
    uint8_t head[4] = {0};
    int fd = ckpt_source_fd(f, l->src);
    if (fd < 0)
        return f->err.code;
    if (!l->zstd && l->length >= 4 && ckpt_pread_all(fd, head, 4, l->offset))
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot read '%s'", l->src->path);
    if (!l->zstd && memcmp(head, "PK\x03\x04", 4) != 0) {
        /* the SAFETENSORS serialization */
        if (ckpt_file_notice_add(f, "saved with serialization_format=SAFETENSORS: torch's "
                                    "dcp_to_torch_save cannot read it (UnpicklingError), ckpt "
                                    "reads its tensors by key") < 0)
            return oom(d);
        return st_chunk(d, m, c, l, ps);
    }
    item it;
    CKPT_FORWARD(item_open(d, l, numel * es + (16u << 20), &it));
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, it.what);
    ctx.persistent_load = item_pid;
    ctx.user = d;
    ctx.arena = &d->scratch;
    ckpt_value *root = NULL;
    int rc = item_pickle(d, &it, &ctx, &root);
    const ckpt_tensor *t = rc == CKPT_OK && root && root->kind == CKPT_KIND_TENSOR
                               ? root->u.tensor : NULL;
    if (rc == CKPT_OK && (!t || t->kind != CKPT_TENSOR_DENSE || !t->storage))
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: holds a %s, not a dense tensor", it.what,
                      root ? ckpt_value_kind_name(root) : "nothing");
    if (rc == CKPT_OK && (t->dtype != m->dtype || t->ndim != m->ndim ||
                          (m->ndim && memcmp(t->shape, c->size, (size_t)m->ndim * 8))))
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: its tensor (%s, %d dimensions) is not the "
                      "chunk the metadata names (%s)", it.what, ckpt_dtype_name(t->dtype),
                      t->ndim, ckpt_dtype_name(m->dtype));
    const ckpt_zip_entry *e = NULL;
    if (rc == CKPT_OK) {
        char rec[64];
        snprintf(rec, sizeof rec, "data/%s", t->storage->src_key);
        if (!(e = item_record(d, &it, rec)))
            rc = f->err.code;
        else if (e->usize != t->storage->nbytes)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: record '%s' is %llu bytes, its storage "
                          "%llu", it.what, rec, (unsigned long long)e->usize,
                          (unsigned long long)t->storage->nbytes);
    }
    if (rc == CKPT_OK && numel > 0) {
        if (contiguous(t)) {
            emit_ctx ec = {.ps = ps, .it = &it, .e = e, .from = (uint64_t)t->offset * es,
                           .es = es};
            rc = box_runs(d, m, c, es, emit_piece, &ec);
        } else {
            /* strided (a transposed tensor): gathered in memory, bounded by the item */
            uint8_t *raw = malloc(e->usize ? (size_t)e->usize : 1);
            uint8_t *dense = ckpt_arena_alloc(&f->arena, (size_t)(numel * es));
            if (!raw || !dense)
                rc = oom(d);
            else if (it.mem)
                memcpy(raw, it.mem + e->data_at, (size_t)e->usize);
            else if (ckpt_pread_all(it.fd, raw, (size_t)e->usize, it.base + e->data_at))
                rc = ckpt_err(&f->err, CKPT_ERR_IO, "%s: cannot read", it.what);
            if (rc == CKPT_OK &&
                ckpt_crc32_update(0, raw, (size_t)e->usize) != e->crc)
                rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: CRC-32 mismatch in its data",
                              it.what);
            if (rc == CKPT_OK) {
                ckpt_tensor_gather(t, raw, dense);
                emit_ctx ec = {.ps = ps, .mem = dense, .es = es};
                rc = box_runs(d, m, c, es, emit_piece, &ec);
            }
            free(raw);
        }
    }
    item_close(&it);
    ckpt_arena_release(&d->scratch);
    ckpt_arena_init(&d->scratch);
    return rc;
}

/* Tensor M: a storage of the pieces of all its chunks. */
static int make_tensor(dcp *d, md_item *m, ckpt_value **out)
{
    ckpt_file *f = d->f;
    uint64_t numel = 1;
    for (int k = 0; k < m->ndim; k++)
        CKPT_RETURN_IF(ckpt_mul_overflow(numel, (uint64_t)m->size[k], &numel) ||
                           numel > (uint64_t)INT64_MAX / 16,
                       &f->err, CKPT_ERR_FORMAT, "tensor '%.200s': its size overflows", m->fqn);
    char key[32];
    snprintf(key, sizeof key, "%llu", (unsigned long long)d->nbytes_key++);
    ckpt_storage *s = ckpt_file_storage_new(f, key, m->dtype, (int64_t)numel, "cpu", 3, &f->err);
    if (!s)
        return f->err.code;
    s->type_name = ckpt_storage_type_name(m->dtype);
    if (!s->type_name)
        s->type_name = "UntypedStorage";
    pieces ps = {0};
    ckpt_chunk *info = ckpt_arena_alloc(&f->arena, (m->nchunks + 1) * sizeof(*info));
    if (!info)
        return oom(d);
    int rc = CKPT_OK;
    for (size_t i = 0; i < m->nchunks && rc == CKPT_OK; i++) {
        chunk c = m->chunks[i];
        rc = tensor_chunk(d, m, &m->chunks[i], &ps, &c);
        loc *l = loc_find(d, m->fqn, m->fqn_len, m->ndim, c.off);
        info[i] = (ckpt_chunk){.ndim = m->ndim, .offsets = c.off, .sizes = c.size,
                               .rank = l ? l->rank : c.rank, .file = l ? l->src->path : NULL,
                               .file_offset = l ? l->offset : 0, .length = l ? l->length : 0};
    }
    if (rc == CKPT_OK) {
        ckpt_piece *p = ckpt_arena_alloc(&f->arena, (ps.n + 1) * sizeof(*p));
        if (!p)
            rc = oom(d);
        else {
            if (ps.n)
                memcpy(p, ps.p, ps.n * sizeof(*p));
            char what[300];
            snprintf(what, sizeof what, "tensor '%.200s'", m->fqn);
            rc = ckpt_storage_pieces_set(f, s, p, ps.n, what, &f->err);
            if (rc && !strstr(f->err.msg, "overlap")) {
                /* say what it means for chunks */
                char msg[sizeof f->err.msg];
                snprintf(msg, sizeof msg, "%s", f->err.msg);
                ckpt_err_clear(&f->err);
                rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s (its chunks overlap or leave a hole)",
                              msg);
            }
        }
    }
    free(ps.p);
    if (rc)
        return rc;
    s->chunks = info;
    s->nchunks = m->nchunks;
    int64_t stride[MAX_NDIM + 1];
    for (int k = m->ndim; k-- > 0;)
        stride[k] = k == m->ndim - 1 ? 1 : stride[k + 1] * m->size[k + 1];
    *out = ckpt_tensor_value_new(&f->arena, s, m->dtype, m->ndim, m->size, stride, 0);
    return *out ? CKPT_OK : oom(d);
}

/* BYTES item M: its value, read by the safe pickle reader; its tensors'
 * storages located in the item. */
static int make_bytes(dcp *d, md_item *m, ckpt_value **out)
{
    ckpt_file *f = d->f;
    loc *l = loc_find(d, m->fqn, m->fqn_len, -1, NULL);
    CKPT_RETURN_IF(!l, &f->err, CKPT_ERR_FORMAT, "%s: '%.200s' has no storage entry",
                   d->meta_name, m->fqn);
    item it;
    CKPT_FORWARD(item_open(d, l, f->limits[CKPT_LIMIT_PICKLE_BYTES], &it));
    char prefix[40];
    snprintf(prefix, sizeof prefix, "b%llu/", (unsigned long long)d->nbytes_items++);
    const char *old = f->key_prefix;
    f->key_prefix = prefix;
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, it.what);
    size_t before = f->nstorages;
    int rc = item_pickle(d, &it, &ctx, out);
    f->key_prefix = old;
    for (size_t k = before; rc == CKPT_OK && k < f->nstorages; k++) {
        ckpt_storage *s = f->storages[k];
        char rec[64];
        snprintf(rec, sizeof rec, "data/%.40s", s->src_key);
        const ckpt_zip_entry *e = item_record(d, &it, rec);
        if (!e) {
            rc = f->err.code;
            break;
        }
        if (e->usize != s->src_nbytes) {
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: record '%s' is %llu bytes, its "
                          "storage %llu", it.what, rec, (unsigned long long)e->usize,
                          (unsigned long long)s->src_nbytes);
            break;
        }
        ckpt_piece *p = ckpt_arena_alloc(&f->arena, sizeof(*p));
        if (!p) {
            rc = oom(d);
            break;
        }
        *p = record_piece(&it, e, 0, e->usize, 0);
        rc = ckpt_storage_pieces_set(f, s, p, e->usize ? 1 : 0, it.what, &f->err);
    }
    item_close(&it);
    return rc;
}

/* ---- nesting: torch's set_element -------------------------------------------- */

/* The index of every key the rebuilt dicts hold: (dict, key) -> position,
 * so that 100,000 keys of one dict are not searched one by one. */
typedef struct dslot {
    const ckpt_value *dict, *key;
    size_t at;
} dslot;

/* A (dict, key) looked for: dslot_at's key */
typedef struct dslot_key {
    const dcp *d;
    const ckpt_value *dict, *key;
} dslot_key;

static uint64_t dslot_hash(const dslot_key *k)
{
    uint64_t h = ckpt_fnv1a_add(CKPT_FNV1A_BASIS, &k->dict, sizeof k->dict);
    return ckpt_fnv1a_add(h, k->key->u.s.s, k->key->u.s.len);
}

static bool dslot_same(const void *arg, size_t val)
{
    const dslot_key *k = arg;
    const dslot *e = &k->d->dslots[val];
    return e->dict == k->dict && e->key->u.s.len == k->key->u.s.len &&
           memcmp(e->key->u.s.s, k->key->u.s.s, k->key->u.s.len) == 0;
}

static int dict_index_add(dcp *d, const ckpt_value *dict, const ckpt_value *key, size_t at)
{
    dslot_key k = {d, dict, key};
    if (CKPT_GROW(d->dslots, d->dslots_cap, d->nd + 1) < 0 ||
        ckpt_map_put_hashed(&d->dslot_at, dslot_hash(&k), dslot_same, &k, d->nd, NULL) < 0)
        return oom(d);
    d->dslots[d->nd++] = (dslot){dict, key, at};
    return CKPT_OK;
}

static int dict_get(dcp *d, const ckpt_value *dict, const ckpt_value *key)
{
    dslot_key k = {d, dict, key};
    size_t i;
    return ckpt_map_get_hashed(&d->dslot_at, dslot_hash(&k), dslot_same, &k, &i)
               ? (int)d->dslots[i].at
               : -1;
}

static int set_element(dcp *d, ckpt_value *root, const ckpt_value *path, ckpt_value *value,
                       const char *fqn)
{
    ckpt_file *f = d->f;
    ckpt_value *cur = root;
    size_t n = path->u.seq.len;
    for (size_t i = 0; i < n; i++) {
        const ckpt_value *key = path->u.seq.items[i];
        bool last = i + 1 == n;
        ckpt_value *next_default = NULL;
        if (!last) {
            const ckpt_value *nk = path->u.seq.items[i + 1];
            next_default = ckpt_value_new(&f->arena, nk->kind == CKPT_KIND_STR ? CKPT_KIND_DICT
                                                                               : CKPT_KIND_LIST, 0);
            if (!next_default)
                return oom(d);
        }
        ckpt_value *want = last ? value : next_default;
        if (cur->kind == CKPT_KIND_DICT) {
            CKPT_RETURN_IF(key->kind != CKPT_KIND_STR, &f->err, CKPT_ERR_FORMAT,
                           "planner_data path of '%.200s' indexes a dict with an int", fqn);
            int at = dict_get(d, cur, key);
            if (at < 0) {
                CKPT_FORWARD(dict_index_add(d, cur, key, cur->u.dict.keys.len));
                if (ckpt_vec_push(&f->arena, &cur->u.dict.keys, (ckpt_value *)key) ||
                    ckpt_vec_push(&f->arena, &cur->u.dict.vals, want))
                    return oom(d);
                cur = want;
            } else if (last) {
                cur->u.dict.vals.items[at] = value; /* a later entry of the same key */
            } else {
                cur = cur->u.dict.vals.items[at];
            }
        } else if (cur->kind == CKPT_KIND_LIST) {
            CKPT_RETURN_IF(key->kind != CKPT_KIND_INT, &f->err, CKPT_ERR_FORMAT,
                           "planner_data path of '%.200s' indexes a list with a str", fqn);
            size_t ix = (size_t)key->u.i.v;
            /* a list torch recursed into has an entry per element: an index
             * past every entry of the metadata is no list it saved */
            CKPT_RETURN_IF(ix >= d->nitems, &f->err, CKPT_ERR_FORMAT,
                           "planner_data path of '%.200s' has list index %zu, past the %zu "
                           "entries of the metadata", fqn, ix, d->nitems);
            while (cur->u.seq.len <= ix) {
                ckpt_value *none = ckpt_value_new(&f->arena, CKPT_KIND_NONE, 0);
                if (!none || ckpt_vec_push(&f->arena, &cur->u.seq, none))
                    return oom(d);
            }
            if (last || cur->u.seq.items[ix]->kind == CKPT_KIND_NONE)
                cur->u.seq.items[ix] = want;
            cur = cur->u.seq.items[ix];
        } else {
            return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                            "planner_data path of '%.200s' goes through a %s", fqn,
                            ckpt_value_kind_name(cur));
        }
    }
    return CKPT_OK;
}

/* ---- the folder ------------------------------------------------------------------ */

static int rank_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The ranks R of the folder's __R.metadata files, sorted; *N of them. */
static int rank_metadata(int dirfd, int **ranks, size_t *n, bool *distcp)
{
    *ranks = NULL;
    *n = 0;
    if (distcp)
        *distcp = false;
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0)
            close(fd);
        return CKPT_ERR_IO;
    }
    size_t cap = 0;
    struct dirent *de;
    int rc = CKPT_OK;
    while ((de = readdir(dir))) {
        size_t len = strlen(de->d_name);
        if (distcp && len > 7 && strcmp(de->d_name + len - 7, ".distcp") == 0)
            *distcp = true;
        int r = name_rank(de->d_name);
        char want[40];
        if (r < 0 || (snprintf(want, sizeof want, "__%d.metadata", r), strcmp(want, de->d_name)))
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            int *p = realloc(*ranks, cap * sizeof(*p));
            if (!p) {
                rc = CKPT_ERR_NOMEM;
                break;
            }
            *ranks = p;
        }
        (*ranks)[(*n)++] = r;
    }
    closedir(dir);
    if (*n)
        qsort(*ranks, *n, sizeof(int), rank_cmp);
    return rc;
}

/* ---- a data file alone: its items back to back -------------------------------- */

/* Where the zip starting at AT of MAP (N bytes) ends: just after the first
 * end record whose central directory ends right before it, counted from AT
 * (a signature inside tensor data does not fit so).  0 when none. */
static size_t zip_end(const uint8_t *map, size_t n, size_t at)
{
    for (size_t p = at; p + 22 <= n;) {
        const uint8_t *e = memmem(map + p, n - p, "PK\x05\x06", 4);
        if (!e)
            return 0;
        size_t q = (size_t)(e - map);
        if (q + 22 > n)
            return 0;
        uint64_t cd_size = (uint64_t)e[12] | (uint64_t)e[13] << 8 | (uint64_t)e[14] << 16 |
                           (uint64_t)e[15] << 24;
        uint64_t cd_at = (uint64_t)e[16] | (uint64_t)e[17] << 8 | (uint64_t)e[18] << 16 |
                         (uint64_t)e[19] << 24;
        size_t comment = (size_t)e[20] | (size_t)e[21] << 8;
        bool zip64 = cd_at == 0xFFFFFFFFu || cd_size == 0xFFFFFFFFu;
        /* torch writes a zip64 end record (56 bytes) and locator (20) before it */
        bool z64 = q - at >= 76 && memcmp(map + q - 20, "PK\x06\x07", 4) == 0;
        if ((zip64 || cd_at + cd_size == q - at || (z64 && cd_at + cd_size + 76 == q - at)) &&
            q + 22 + comment <= n)
            return q + 22 + comment;
        p = q + 1;
    }
    return 0;
}

static int items_walk(ckpt_walk *w, int fd, const uint8_t *map, size_t n, ckpt_error *err)
{
    int rc = CKPT_OK;
    uint64_t ignored;
    for (size_t at = 0; at < n && rc == CKPT_OK;) {
        char label[64];
        snprintf(label, sizeof label, "item at byte %zu", at);
        ckpt_walk_record r = {.index = at, .offset = at, .fd = fd, .base = at, .label = label};
        if (n - at >= 4 && memcmp(map + at, "PK\x03\x04", 4) == 0) {
            size_t end = zip_end(map, n, at);
            if (!end)
                return ckpt_err(err, CKPT_ERR_FORMAT, "%s: a zip without its end record", label);
            r.avail = r.size = end - at;
            rc = w->record(w, &r, &ignored);
            at = end;
        } else if (n - at >= 4 && memcmp(map + at, "\x28\xb5\x2f\xfd", 4) == 0) {
            /* stream.zstd/1: one frame holding the item's zip (its size may be
             * unstated: decompressed by streaming, up to 4x the pickle limit) */
            size_t fl = ZSTD_findFrameCompressedSize(map + at, n - at);
            if (ZSTD_isError(fl))
                return ckpt_err(err, CKPT_ERR_FORMAT, "%s: a corrupt zstd frame", label);
            uint64_t cap = (w->pickle_limit ? w->pickle_limit : UINT64_MAX / 8) * 4;
            uint8_t *buf = NULL;
            size_t have = 0;
            bool over;
            int mfd = -1;
            if (zstd_frame(map + at, fl, cap, &buf, &have, &over))
                mfd = memfd_of(buf, have);
            free(buf);
            if (mfd < 0)
                return ckpt_err(err, CKPT_ERR_FORMAT, "%s: its zstd frame does not decompress "
                                "(corrupt, cut short, or over %llu bytes)", label,
                                (unsigned long long)cap);
            r.avail = fl;
            r.fd = mfd;
            r.base = 0;
            r.size = have;
            rc = w->record(w, &r, &ignored);
            close(mfd);
            at += fl;
        } else if (n - at >= 9 && map[at + 8] == '{') {
            /* the SAFETENSORS serialization: one blob to the end, no pickle */
            uint64_t hl = 0;
            for (int k = 8; k-- > 0;)
                hl = (hl << 8) | map[at + k];
            CKPT_RETURN_IF(hl > n - at - 8, err, CKPT_ERR_FORMAT, "%s: a safetensors header "
                           "past the end of the file", label);
            break;
        } else {
            return ckpt_err(err, CKPT_ERR_FORMAT, "%s: neither a torch.save zip, a zstd frame "
                            "nor a safetensors blob", label);
        }
    }
    return rc;
}

/* DCP's walk of one data file (a .distcp) without its metadata: the items
 * torch.save wrote back to back, each handed out as a zip (a zstd frame's
 * decoded into a memfd), to the end or to a safetensors blob. */
static int dcp_walk(ckpt_walk *w, ckpt_source *src, ckpt_error *err)
{
    memset(&w->stop, 0, sizeof w->stop);
    w->stop.pickle = -1;
    size_t n = (size_t)src->file_size;
    if (n == 0)
        return CKPT_OK; /* a rank with nothing to save writes an empty file */
    void *map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, src->fd, 0);
    CKPT_RETURN_IF(map == MAP_FAILED, err, CKPT_ERR_IO, "%s", strerror(errno));
    int rc = items_walk(w, src->fd, map, n, err);
    munmap(map, n);
    return rc;
}

static bool dcp_claim_dir(int dirfd)
{
    if (faccessat(dirfd, ".metadata", F_OK, 0) == 0)
        return true;
    int *ranks = NULL;
    size_t n = 0;
    bool distcp = false;
    if (rank_metadata(dirfd, &ranks, &n, &distcp))
        return false;
    free(ranks);
    return n > 0 || distcp;
}

static void dcp_free(dcp *d)
{
    free(d->items);
    ckpt_map_release(&d->item_at);
    free(d->locs);
    ckpt_map_release(&d->loc_at);
    free(d->srcs);
    free(d->dslots);
    ckpt_map_release(&d->dslot_at);
    ckpt_arena_release(&d->scratch);
    for (st_blob *b = d->blobs, *nx; b; b = nx) {
        nx = b->next;
        cJSON_Delete(b->header);
        free(b);
    }
}

static int dcp_read_all(dcp *d, ckpt_value **root)
{
    ckpt_file *f = d->f;
    const ckpt_value *planner = NULL;
    if (faccessat(f->dir_fd, ".metadata", F_OK, 0) == 0) {
        CKPT_FORWARD(read_metadata(d, ".metadata", -1, &planner));
        CKPT_FORWARD(apply_planner(d, planner));
    } else {
        /* use_collectives=False: every rank's own metadata, merged (torch's
         * reader takes __0.metadata alone, leaving the others' chunks unset) */
        int *ranks;
        size_t n;
        CKPT_RETURN_IF(rank_metadata(f->dir_fd, &ranks, &n, NULL), &f->err, CKPT_ERR_IO,
                       "cannot list the folder");
        if (n == 0) {
            free(ranks);
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "no .metadata nor __R.metadata file "
                            "(a torch.distributed.checkpoint folder whose save did not finish?)");
        }
        for (size_t i = 0; i < n; i++)
            if (ranks[i] != (int)i) {
                int r = (int)i;
                free(ranks);
                return ckpt_err(&f->err, CKPT_ERR_FORMAT, "'__%d.metadata' is missing (the "
                                "folder has the metadata of higher ranks)", r);
            }
        int rc = CKPT_OK;
        for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
            char name[40];
            snprintf(name, sizeof name, "__%d.metadata", ranks[i]);
            char *nm = ckpt_arena_strndup(&f->arena, name, strlen(name));
            rc = nm ? read_metadata(d, nm, ranks[i], &planner) : oom(d);
            if (rc == CKPT_OK)
                rc = apply_planner(d, planner);
        }
        free(ranks);
        CKPT_FORWARD(rc);
        if (n > 1 && ckpt_file_notice_add(f, "saved with use_collectives=False: the %zu ranks' "
                                             "metadata merged (torch's dcp_to_torch_save reads "
                                             "__0.metadata only and leaves the other ranks' "
                                             "chunks uninitialised)", n) < 0)
            return oom(d);
        d->meta_name = "the ranks' metadata";
    }
    ckpt_value *top = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
    if (!top)
        return oom(d);
    for (size_t i = 0; i < d->nitems; i++) {
        md_item *m = d->items[i];
        ckpt_value *v = NULL;
        CKPT_FORWARD(m->is_bytes ? make_bytes(d, m, &v) : make_tensor(d, m, &v));
        const ckpt_value *path = m->path;
        if (!path) {
            ckpt_value *k = ckpt_value_new(&f->arena, CKPT_KIND_STR, 0);
            ckpt_value *t = ckpt_value_new(&f->arena, CKPT_KIND_TUPLE, 0);
            if (!k || !t || !(k->u.s.s = ckpt_arena_strndup(&f->arena, m->fqn, m->fqn_len)) ||
                ckpt_vec_push(&f->arena, &t->u.seq, k))
                return oom(d);
            k->u.s.len = m->fqn_len;
            path = t;
        }
        CKPT_FORWARD(set_element(d, top, path, v, m->fqn));
    }
    *root = top;
    return CKPT_OK;
}

static int dcp_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    (void)src;
    dcp d = {.f = f, .meta_rank = -1, .meta_name = ".metadata"};
    ckpt_map_init(&d.item_at, CKPT_MAP_BYTES);
    ckpt_map_init(&d.loc_at, CKPT_MAP_HASHED);
    ckpt_map_init(&d.dslot_at, CKPT_MAP_HASHED);
    ckpt_arena_init(&d.scratch);
    int rc = dcp_read_all(&d, root);
    dcp_free(&d);
    return rc;
}

/* ---- the files a metadata names (ckpt scan's folder walk) -------------------- */

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ckpt_dcp_named_files(int dirfd, const char *meta, const uint64_t *limits, char ***names,
                         size_t *n, ckpt_error *err)
{
    *names = NULL;
    *n = 0;
    int fd;
    struct stat st;
    CKPT_FORWARD(ckpt_open_input(dirfd, meta, false, &fd, &st, err));
    uint64_t size = (uint64_t)st.st_size;
    if (size == 0 || size > limits[CKPT_LIMIT_PICKLE_BYTES]) {
        close(fd);
        return ckpt_err(err, size ? CKPT_ERR_LIMIT : CKPT_ERR_FORMAT, "%s: %llu bytes", meta,
                        (unsigned long long)size);
    }
    uint8_t *buf = malloc((size_t)size);
    int rc = buf ? ckpt_pread_all(fd, buf, (size_t)size, 0) : CKPT_ERR_NOMEM;
    close(fd);
    ckpt_arena arena;
    ckpt_arena_init(&arena);
    ckpt_value *root = NULL;
    if (rc == CKPT_OK) {
        ckpt_pickle_ctx ctx;
        memset(&ctx, 0, sizeof ctx);
        ctx.name = meta;
        ctx.limits = limits;
        ctx.classify = meta_classify; /* the reader's own rules: what it cannot read, scan judges */
        ctx.persistent_load = meta_no_pid;
        ctx.arena = &arena;
        rc = ckpt_pickle_load(&ctx, buf, (size_t)size, &root, NULL, err);
    } else {
        ckpt_err(err, rc, "%s: cannot be read", meta);
    }
    free(buf);
    const ckpt_value *sd = rc == CKPT_OK && is_obj(root, "Metadata") ? field(root, "storage_data")
                                                                     : NULL;
    if (rc == CKPT_OK && (!sd || sd->kind != CKPT_KIND_DICT))
        rc = ckpt_err(err, CKPT_ERR_FORMAT, "%s: no storage_data dict", meta);
    /* every relative_path, once: what FileSystemReader opens, as path / relative_path */
    size_t cap = 0;
    for (size_t i = 0; rc == CKPT_OK && sd && i < sd->u.dict.vals.len; i++) {
        const ckpt_value *rp = field(sd->u.dict.vals.items[i], "relative_path");
        if (!rp || rp->kind != CKPT_KIND_STR || memchr(rp->u.s.s, 0, rp->u.s.len))
            continue; /* DCP's reader fails on it: opens nothing */
        if (*n && strcmp((*names)[*n - 1], rp->u.s.s) == 0)
            continue; /* a file's items are listed together */
        if (*n == cap) {
            size_t c = cap ? cap * 2 : 16;
            char **q = realloc(*names, c * sizeof *q);
            if (!q) {
                rc = ckpt_oom(err);
                break;
            }
            *names = q;
            cap = c;
        }
        if (!((*names)[*n] = strdup(rp->u.s.s))) {
            rc = ckpt_oom(err);
            break;
        }
        (*n)++;
    }
    ckpt_arena_release(&arena);
    if (rc == CKPT_OK && *n > 1) {
        qsort(*names, *n, sizeof **names, str_cmp);
        size_t k = 1;
        for (size_t i = 1; i < *n; i++) {
            if (strcmp((*names)[i], (*names)[k - 1]) == 0)
                free((*names)[i]);
            else
                (*names)[k++] = (*names)[i];
        }
        *n = k;
    }
    if (rc != CKPT_OK) {
        for (size_t i = 0; i < *n; i++)
            free((*names)[i]);
        free(*names);
        *names = NULL;
        *n = 0;
    }
    return rc;
}

static const ckpt_format_ops dcp_ops = {
    .sd_source = "dcp", /* flattened keys, nested again by planner_data */
};

const ckpt_format_desc ckpt_format_dcp = {
    .id = CKPT_FORMAT_DCP,
    .name = "dcp",
    .claim_dir = dcp_claim_dir,
    .read = dcp_read,
    .ops = &dcp_ops,
    .walk = dcp_walk,
};
