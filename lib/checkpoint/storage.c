/*
 * storage.c - the storage table that format readers fill (a map by key),
 * and the pickle context they read with: the handle's limits and allow-list,
 * torch's persistent ids turned into storage records.  Readers call here;
 * nothing here calls a reader.
 */
#include "checkpoint/checkpoint.h"

#include <stdlib.h>
#include <string.h>

ckpt_storage *ckpt_file_storage_find(ckpt_file *f, const char *key)
{
    size_t i;
    return ckpt_map_get(&f->storage_index, key, strlen(key), &i) ? f->storages[i] : NULL;
}

int ckpt_file_storage_add(ckpt_file *f, ckpt_storage *s, ckpt_error *err)
{
    if (f->nstorages >= f->limits[CKPT_LIMIT_STORAGES])
        return ckpt_err(err, CKPT_ERR_LIMIT, "more than %llu storages",
                        (unsigned long long)f->limits[CKPT_LIMIT_STORAGES]);
    /* a key added again: the later storage is the one found */
    if (CKPT_GROW(f->storages, f->storages_cap, f->nstorages + 1) < 0 ||
        ckpt_map_set(&f->storage_index, s->key, strlen(s->key), f->nstorages) < 0)
        return ckpt_oom(err);
    s->index = f->nstorages;
    f->storages[f->nstorages++] = s;
    return CKPT_OK;
}

static ckpt_global_class classify(void *user, const char *q)
{
    return ckpt_file_classify_global(user, q);
}

static struct ckpt_storage *storage_new(ckpt_file *f, const char *key, bool copy_key,
                                        ckpt_dtype dt, int64_t numel, const char *device,
                                        size_t devlen, ckpt_error *err)
{
    uint64_t nbytes;
    int r = numel < 0 ? -1 : ckpt_dtype_nbytes(dt, (uint64_t)numel, &nbytes);
    if (r) {
        ckpt_err(err, CKPT_ERR_FORMAT, r < 0 ? "storage '%s' size overflows"
                                             : "storage '%s' does not end on a byte boundary", key);
        return NULL;
    }
    ckpt_storage *s = ckpt_arena_alloc(&f->arena, sizeof(*s));
    /* "cpu", the tag of most storages, is not copied: a remap replaces the
     * pointer, never the text */
    bool cpu = devlen == 3 && memcmp(device, "cpu", 3) == 0;
    if (!s || !(s->key = copy_key ? ckpt_arena_strndup(&f->arena, key, strlen(key)) : (char *)key) ||
        !(s->device = cpu ? (char *)"cpu" : ckpt_arena_strndup(&f->arena, device, devlen))) {
        ckpt_oom(err);
        return NULL;
    }
    s->src = f->cur_src;
    s->src_key = s->key + (f->key_prefix ? strlen(f->key_prefix) : 0);
    s->dtype = s->src_dtype = dt;
    s->numel = numel;
    s->nbytes = s->src_nbytes = nbytes;
    s->zip_index = -1;
    if (ckpt_file_storage_add(f, s, err))
        return NULL;
    return s;
}

struct ckpt_storage *ckpt_file_storage_new(ckpt_file *f, const char *key, ckpt_dtype dt,
                                           int64_t numel, const char *device, size_t devlen,
                                           ckpt_error *err)
{
    return storage_new(f, key, true, dt, numel, device, devlen, err);
}

struct ckpt_storage *ckpt_file_storage_new_kept(ckpt_file *f, const char *key, ckpt_dtype dt,
                                                int64_t numel, const char *device, size_t devlen,
                                                ckpt_error *err)
{
    return storage_new(f, key, false, dt, numel, device, devlen, err);
}

static int piece_cmp(const void *a, const void *b)
{
    const ckpt_piece *x = a, *y = b;
    return x->dst_offset < y->dst_offset ? -1 : x->dst_offset > y->dst_offset;
}

int ckpt_storage_pieces_set(ckpt_file *f, ckpt_storage *s, ckpt_piece *p, size_t n,
                            const char *what, ckpt_error *err)
{
    (void)f;
    qsort(p, n, sizeof(*p), piece_cmp);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].dst_offset > at)
            return ckpt_err(err, CKPT_ERR_FORMAT, "%s: storage '%s': bytes %llu..%llu are in no piece",
                            what, s->key, (unsigned long long)at,
                            (unsigned long long)p[i].dst_offset);
        if (p[i].dst_offset < at)
            return ckpt_err(err, CKPT_ERR_FORMAT, "%s: storage '%s': bytes from %llu are in two pieces",
                            what, s->key, (unsigned long long)p[i].dst_offset);
        if (p[i].nbytes > s->src_nbytes - at)
            return ckpt_err(err, CKPT_ERR_FORMAT, "%s: storage '%s': a piece ends past its %llu bytes",
                            what, s->key, (unsigned long long)s->src_nbytes);
        if (!p[i].mem && (!p[i].src || p[i].file_offset > p[i].src->file_size ||
                          p[i].nbytes > p[i].src->file_size - p[i].file_offset))
            return ckpt_err(err, CKPT_ERR_FORMAT, "%s: storage '%s': a piece lies past the end of '%s'",
                            what, s->key, p[i].src ? p[i].src->path : "?");
        at += p[i].nbytes;
    }
    if (at != s->src_nbytes)
        return ckpt_err(err, CKPT_ERR_FORMAT, "%s: storage '%s': bytes %llu..%llu are in no piece", what,
                        s->key, (unsigned long long)at, (unsigned long long)s->src_nbytes);
    s->loc = CKPT_LOC_PIECES;
    s->pieces = p;
    s->npieces = n;
    s->src = n == 1 ? p[0].src : NULL;
    return CKPT_OK;
}

const char *ckpt_file_table_key(const ckpt_file *f, const char *key, char *buf, size_t cap)
{
    if (!f->key_prefix)
        return key;
    int n = snprintf(buf, cap, "%s%s", f->key_prefix, key);
    return n < 0 || (size_t)n >= cap ? NULL : buf;
}


/*
 * ('storage', torch.<X>Storage, key, location, numel)          pth-zip
 * ('storage', torch.<X>Storage, key, location, numel, None)    pth-legacy
 */
static ckpt_value *persistent_load(void *user, ckpt_value *pid, uint64_t offset,
                                      ckpt_error *err)
{
    ckpt_file *f = user;
    if (pid->kind != CKPT_KIND_TUPLE || pid->u.seq.len < 1) {
        ckpt_err(err, CKPT_ERR_FORMAT, "persistent id is a %s, not a tuple",
                 ckpt_kind_name((ckpt_kind)pid->kind));
        return NULL;
    }
    ckpt_value **a = pid->u.seq.items;
    size_t n = pid->u.seq.len;
    if (ckpt_value_is_str(a[0], "module")) {
        /* the legacy format's first use of a module class: (tag, class, source
         * file, source text); the class is what NEWOBJ instantiates */
        if (n != 4 || a[1]->kind != CKPT_KIND_GLOBAL) {
            ckpt_err(err, CKPT_ERR_FORMAT,
                     "persistent id is not a ('module', class, file, source) tuple");
            return NULL;
        }
        return a[1];
    }
    if (!ckpt_value_is_str(a[0], "storage") || (n != 5 && n != 6)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "persistent id is not a ('storage', type, key, "
                                       "location, numel) tuple");
        return NULL;
    }
    if (n == 6 && a[5]->kind != CKPT_KIND_NONE) {
        ckpt_err(err, CKPT_ERR_UNSUPPORTED, "legacy storage views (view_metadata) are not supported");
        return NULL;
    }
    const char *type_name = NULL;
    ckpt_dtype dt = a[1]->kind == CKPT_KIND_GLOBAL
                        ? ckpt_storage_type_dtype(a[1]->u.global.name, &type_name)
                        : CKPT_DTYPE_UNKNOWN;
    if (dt == CKPT_DTYPE_UNKNOWN) {
        ckpt_err(err, CKPT_ERR_UNSUPPORTED, "storage type %s is not recognized",
                 a[1]->kind == CKPT_KIND_GLOBAL ? a[1]->u.global.name : "(not a global)");
        return NULL;
    }
    char keybuf[32];
    const char *key;
    char prefixed[600];
    if (a[2]->kind == CKPT_KIND_STR) {
        key = a[2]->u.s.s;
        if (ckpt_key_check(err, key, a[2]->u.s.len)) /* "0\0x" is not record "0" */
            return NULL;
    } else if (a[2]->kind == CKPT_KIND_INT && !a[2]->u.i.big) {
        snprintf(keybuf, sizeof(keybuf), "%lld", (long long)a[2]->u.i.v);
        key = keybuf;
    } else {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage key is a %s", ckpt_kind_name((ckpt_kind)a[2]->kind));
        return NULL;
    }
    const char *table_key = ckpt_file_table_key(f, key, prefixed, sizeof(prefixed));
    if (!table_key) {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage key of %zu bytes is too long", strlen(key));
        return NULL;
    }
    key = table_key;
    if (a[3]->kind != CKPT_KIND_STR || a[3]->u.s.len == 0 || a[3]->u.s.len > 64) {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage '%s' has no valid location tag", key);
        return NULL;
    }
    int64_t numel;
    if (a[4]->kind != CKPT_KIND_INT || a[4]->u.i.big || (numel = a[4]->u.i.v) < 0) {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage '%s' has an invalid element count", key);
        return NULL;
    }
    uint64_t nbytes;
    if (ckpt_mul_overflow((uint64_t)numel, ckpt_dtype_size(dt), &nbytes)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage '%s' size overflows", key);
        return NULL;
    }
    ckpt_storage *s = ckpt_file_storage_find(f, key);
    if (s) {
        if (s->nbytes != nbytes || strcmp(s->device, a[3]->u.s.s) != 0) {
            ckpt_err(err, CKPT_ERR_FORMAT,
                     "storage '%s' is named twice with different sizes or locations", key);
            return NULL;
        }
    } else {
        s = ckpt_file_storage_new(f, key, dt, numel, a[3]->u.s.s, a[3]->u.s.len, err);
        if (!s)
            return NULL;
        s->type_name = type_name;
    }
    return ckpt_file_storage_value(f, s, dt, type_name, offset, err);
}

ckpt_value *ckpt_file_storage_value(ckpt_file *f, struct ckpt_storage *s, ckpt_dtype dt,
                                    const char *type_name, uint64_t offset, ckpt_error *err)
{
    ckpt_value *v = ckpt_value_new(&f->arena, CKPT_KIND_STORAGE, offset);
    if (!v) {
        ckpt_oom(err);
        return NULL;
    }
    v->u.st.ptr = s;
    v->u.st.dtype = dt;
    v->u.st.type_name = type_name;
    return v;
}

void ckpt_file_pickle_ctx(ckpt_file *f, ckpt_pickle_ctx *ctx, const char *name)
{
    memset(ctx, 0, sizeof(*ctx));
    ctx->name = name;
    ctx->limits = f->limits;
    ctx->classify = classify;
    ctx->persistent_load = persistent_load;
    ctx->user = f;
    ctx->arena = &f->arena;
}

