/* pth_tar.c - the tar checkpoint of torch <= 0.1 (reference/pth-format.md,
 * "Ancient tar format"), read as torch's legacy_load reads it: members
 * 'storages' (a count, per storage a (key, location, storage type) pickle
 * then an int64 element count and the bytes; then a list of views),
 * 'tensors' (a count, per tensor a (key, storage id, tensor type) pickle then
 * ndim, sizes, strides and offset in binary) and 'pickle' (the main pickle,
 * whose persistent ids are the keys of those objects).  Read only. */
#include "formats/format.h"
#include "container/container.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* more dimensions than torch could ever have saved */
#define MAX_NDIM 1024
/* longer string keys than a pointer's digits are refused */
#define MAX_KEY 256

typedef enum ekind { E_STORAGE, E_VIEW, E_TENSOR } ekind;

/* One value of legacy_load's deserialized_objects dict. */
typedef struct entry {
    bool is_str;
    int64_t ikey;
    const char *skey;
    size_t sklen;
    ekind kind;
    ckpt_dtype dtype;
    const char *type_name; /* "FloatStorage" */
    int64_t numel;         /* STORAGE, VIEW: elements */
    uint64_t file_offset;  /* STORAGE: its first byte in the file */
    const char *loc;       /* STORAGE: the location tag */
    size_t loclen;
    struct entry *base;    /* VIEW, TENSOR: the storage (never a view) it lies in */
    int64_t base_off;      /* VIEW: first element within BASE */
    int ndim;              /* TENSOR */
    int64_t *shape, *stride, offset; /* TENSOR: OFFSET counted within BASE */
    ckpt_storage *rec;     /* reading: the storage record, once referenced */
    ckpt_value *value;     /* reading: the value, once referenced */
} entry;

typedef struct walk {
    const uint8_t *map;
    uint64_t size;
    ckpt_tar_pickle_fn load;
    void *user;
    ckpt_error *err;
    ckpt_arena *arena;
    entry **tab; /* the dict: open addressing on the key */
    size_t tabsize, count;
    ckpt_file *f; /* reading (NULL: scanning) */
    bool main;    /* the main pickle is being read */
} walk;

/* ---- deserialized_objects ------------------------------------------------ */

static uint64_t key_hash(bool is_str, int64_t ikey, const char *s, size_t n)
{
    uint64_t h = is_str ? 1469598103934665603ull : 0x9e3779b97f4a7c15ull ^ (uint64_t)ikey;
    for (size_t i = 0; is_str && i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h * 0xff51afd7ed558ccdull;
}

static entry **dict_slot(walk *w, bool is_str, int64_t ikey, const char *s, size_t n)
{
    size_t i = key_hash(is_str, ikey, s, n) & (w->tabsize - 1);
    for (;; i = (i + 1) & (w->tabsize - 1)) {
        entry *e = w->tab[i];
        if (!e || (e->is_str == is_str &&
                   (is_str ? e->sklen == n && memcmp(e->skey, s, n) == 0 : e->ikey == ikey)))
            return &w->tab[i];
    }
}

static entry *dict_get(walk *w, bool is_str, int64_t ikey, const char *s, size_t n)
{
    return w->tabsize ? *dict_slot(w, is_str, ikey, s, n) : NULL;
}

/* deserialized_objects[key] = E (a key seen before gets the new value) */
static int dict_set(walk *w, entry *e)
{
    if ((w->count + 1) * 2 > w->tabsize) {
        size_t size = w->tabsize ? w->tabsize * 2 : 64;
        entry **old = w->tab;
        size_t oldsize = w->tabsize;
        w->tab = calloc(size, sizeof(*w->tab));
        if (!w->tab) {
            w->tab = old;
            return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory");
        }
        w->tabsize = size;
        for (size_t i = 0; i < oldsize; i++)
            if (old[i])
                *dict_slot(w, old[i]->is_str, old[i]->ikey, old[i]->skey, old[i]->sklen) = old[i];
        free(old);
    }
    entry **slot = dict_slot(w, e->is_str, e->ikey, e->skey, e->sklen);
    if (!*slot)
        w->count++;
    *slot = e;
    return CKPT_OK;
}

/* A dict key as Python compares it: ints (and bools) and strings; the rest
 * (floats equal to ints, tuples, bytes) are not read. */
static int key_of(walk *w, const ckpt_value *v, const char *what, entry *e)
{
    if (v->kind == CKPT_KIND_BOOL) {
        e->ikey = v->u.b != 0;
        return CKPT_OK;
    }
    if (v->kind == CKPT_KIND_INT && !v->u.i.big) {
        e->ikey = v->u.i.v;
        return CKPT_OK;
    }
    if (v->kind == CKPT_KIND_STR && v->u.s.len <= MAX_KEY) {
        e->is_str = true;
        e->skey = v->u.s.s;
        e->sklen = v->u.s.len;
        return CKPT_OK;
    }
    return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "%s is a %s; ckpt reads int and string keys",
                    what, ckpt_kind_name((ckpt_kind)v->kind));
}

static const char *key_text(const entry *e, char *buf, size_t cap)
{
    if (e->is_str)
        snprintf(buf, cap, "'%.*s'", (int)(e->sklen < 64 ? e->sklen : 64), e->skey);
    else
        snprintf(buf, cap, "%lld", (long long)e->ikey);
    return buf;
}

/* ---- the walk, shared by reading and scanning ------------------------------ */

static int pickle_at(walk *w, const char *name, const uint8_t *base, size_t len, size_t *pos,
                     ckpt_value **root)
{
    CKPT_RETURN_IF(*pos >= len, w->err, CKPT_ERR_FORMAT, "truncated: %s is missing", name);
    size_t used = 0;
    *root = NULL;
    int rc = w->load(w->user, name, base + *pos, len - *pos, &used, root);
    if (rc)
        return w->err->code ? rc
                            : ckpt_err(w->err, rc, "%s could not be read", name);
    CKPT_RETURN_IF(!*root || used == 0 || used > len - *pos, w->err, CKPT_ERR_FORMAT,
                   "%s could not be read", name);
    *pos += used;
    return CKPT_OK;
}

/* range(COUNT): an int (a negative one loops zero times) */
static int count_of(walk *w, const ckpt_value *v, const char *name, int64_t *n)
{
    if (v->kind == CKPT_KIND_BOOL) {
        *n = v->u.b != 0;
        return CKPT_OK;
    }
    CKPT_RETURN_IF(v->kind != CKPT_KIND_INT || v->u.i.big, w->err, CKPT_ERR_FORMAT,
                   "%s is a %s, not a count", name, ckpt_kind_name((ckpt_kind)v->kind));
    *n = v->u.i.v < 0 ? 0 : v->u.i.v;
    return CKPT_OK;
}

static int int_of(walk *w, const ckpt_value *v, const char *what, int64_t *out)
{
    if (v->kind == CKPT_KIND_BOOL) {
        *out = v->u.b != 0;
        return CKPT_OK;
    }
    CKPT_RETURN_IF(v->kind != CKPT_KIND_INT || v->u.i.big, w->err, CKPT_ERR_FORMAT,
                   "%s is a %s, not an int", what, ckpt_kind_name((ckpt_kind)v->kind));
    *out = v->u.i.v;
    return CKPT_OK;
}

/* `a, b, c = args`: a tuple or list of N */
static int unpack(walk *w, const ckpt_value *v, size_t n, const char *name)
{
    CKPT_RETURN_IF((v->kind != CKPT_KIND_TUPLE && v->kind != CKPT_KIND_LIST) ||
                       v->u.seq.len != n,
                   w->err, CKPT_ERR_FORMAT, "%s is not a sequence of %zu items", name, n);
    return CKPT_OK;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The member NAME as tar.extract() writes it: present, a file, in the file. */
static int member(walk *w, const ckpt_tar *t, const char *name, bool whole,
                  const ckpt_tar_member **out)
{
    const ckpt_tar_member *m = ckpt_tar_find(t, name);
    CKPT_RETURN_IF(!m, w->err, CKPT_ERR_FORMAT, "tar checkpoint without a '%s' member", name);
    CKPT_RETURN_IF(!m->regular, w->err, CKPT_ERR_UNSUPPORTED,
                   "tar member '%s' is not a file (type '%c')", name, m->type ? m->type : '0');
    CKPT_RETURN_IF(m->size_huge || m->size < 0, w->err, CKPT_ERR_FORMAT,
                   "tar member '%s' has an invalid size", name);
    uint64_t end = (uint64_t)m->data_offset + (uint64_t)m->size;
    CKPT_RETURN_IF(whole && end > w->size, w->err, CKPT_ERR_FORMAT,
                   "tar member '%s' (%lld bytes at byte %lld) reaches past the end of the file "
                   "(torch then reads the file as a pickle stream)",
                   name, (long long)m->size, (long long)m->data_offset);
    *out = m;
    return CKPT_OK;
}

static int read_storages(walk *w, const ckpt_tar *t)
{
    const ckpt_tar_member *m;
    CKPT_FORWARD(member(w, t, "storages", true, &m));
    const uint8_t *base = w->map + m->data_offset;
    size_t len = (size_t)m->size, pos = 0;
    char name[64];
    ckpt_value *v;
    int64_t n;
    CKPT_FORWARD(pickle_at(w, "tar:storages count", base, len, &pos, &v));
    CKPT_FORWARD(count_of(w, v, "the storage count", &n));
    for (int64_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "tar:storages pickle %lld", (long long)i + 1);
        CKPT_FORWARD(pickle_at(w, name, base, len, &pos, &v));
        CKPT_FORWARD(unpack(w, v, 3, name));
        ckpt_value **a = v->u.seq.items;
        entry *e = ckpt_arena_alloc(w->arena, sizeof(*e));
        CKPT_RETURN_IF(!e, w->err, CKPT_ERR_NOMEM, "out of memory");
        memset(e, 0, sizeof(*e));
        e->kind = E_STORAGE;
        CKPT_FORWARD(key_of(w, a[0], "a storage key", e));
        char kt[80];
        CKPT_RETURN_IF(a[1]->kind != CKPT_KIND_STR || a[1]->u.s.len == 0 || a[1]->u.s.len > 64,
                       w->err, CKPT_ERR_FORMAT, "storage %s has no valid location tag",
                       key_text(e, kt, sizeof kt));
        e->loc = a[1]->u.s.s;
        e->loclen = a[1]->u.s.len;
        /* storage_type.dtype: one of torch's typed storage classes */
        e->dtype = a[2]->kind == CKPT_KIND_GLOBAL
                       ? ckpt_storage_type_dtype(a[2]->u.global.name, &e->type_name)
                       : CKPT_DTYPE_UNKNOWN;
        CKPT_RETURN_IF(e->dtype == CKPT_DTYPE_UNKNOWN || !e->type_name ||
                           strcmp(e->type_name, "UntypedStorage") == 0,
                       w->err, CKPT_ERR_UNSUPPORTED, "storage %s: storage type %s is not recognized",
                       key_text(e, kt, sizeof kt),
                       a[2]->kind == CKPT_KIND_GLOBAL ? a[2]->u.global.name : "(not a class)");
        CKPT_RETURN_IF(len - pos < 8, w->err, CKPT_ERR_FORMAT,
                       "truncated: no element count for storage %s", key_text(e, kt, sizeof kt));
        uint64_t count = le(base + pos, 8), nbytes;
        pos += 8;
        CKPT_RETURN_IF(count > INT64_MAX || ckpt_dtype_nbytes(e->dtype, count, &nbytes) ||
                           nbytes > len - pos,
                       w->err, CKPT_ERR_FORMAT,
                       "storage %s: %lld elements do not fit in the member's %zu bytes left",
                       key_text(e, kt, sizeof kt), (long long)count, len - pos);
        e->numel = (int64_t)count;
        e->file_offset = (uint64_t)m->data_offset + pos;
        pos += (size_t)nbytes;
        CKPT_FORWARD(dict_set(w, e));
    }
    CKPT_FORWARD(pickle_at(w, "tar:storages views", base, len, &pos, &v));
    CKPT_RETURN_IF(v->kind != CKPT_KIND_LIST && v->kind != CKPT_KIND_TUPLE, w->err,
                   CKPT_ERR_FORMAT, "the storage view list is a %s",
                   ckpt_kind_name((ckpt_kind)v->kind));
    for (size_t i = 0; i < v->u.seq.len; i++) {
        snprintf(name, sizeof name, "storage view %zu", i + 1);
        const ckpt_value *vi = v->u.seq.items[i];
        CKPT_FORWARD(unpack(w, vi, 4, name));
        ckpt_value **a = vi->u.seq.items;
        entry *e = ckpt_arena_alloc(w->arena, sizeof(*e)), rk = {0};
        CKPT_RETURN_IF(!e, w->err, CKPT_ERR_NOMEM, "out of memory");
        memset(e, 0, sizeof(*e));
        e->kind = E_VIEW;
        CKPT_FORWARD(key_of(w, a[0], "a view's key", e));
        CKPT_FORWARD(key_of(w, a[1], "a view's root key", &rk));
        char kt[80];
        entry *root = dict_get(w, rk.is_str, rk.ikey, rk.skey, rk.sklen);
        CKPT_RETURN_IF(!root || root->kind == E_TENSOR, w->err, CKPT_ERR_FORMAT,
                       "%s: its root %s is no storage", name, key_text(&rk, kt, sizeof kt));
        int64_t off, numel;
        CKPT_FORWARD(int_of(w, a[2], "a view's offset", &off));
        CKPT_FORWARD(int_of(w, a[3], "a view's size", &numel));
        /* torch slices the root as Python slices (clamping, negative offsets
         * from the end); ckpt reads views that lie inside it */
        CKPT_RETURN_IF(off < 0 || numel < 0 || off > root->numel || numel > root->numel - off,
                       w->err, CKPT_ERR_FORMAT,
                       "%s: elements [%lld, +%lld) outside its root's %lld (torch clamps the "
                       "slice; ckpt reads views inside their root)", name,
                       (long long)off, (long long)numel, (long long)root->numel);
        e->base = root->kind == E_VIEW ? root->base : root;
        e->base_off = (root->kind == E_VIEW ? root->base_off : 0) + off;
        e->numel = numel;
        e->dtype = root->dtype;
        e->type_name = root->type_name;
        CKPT_FORWARD(dict_set(w, e));
    }
    return CKPT_OK;
}

static int read_tensors(walk *w, const ckpt_tar *t)
{
    const ckpt_tar_member *m;
    CKPT_FORWARD(member(w, t, "tensors", true, &m));
    const uint8_t *base = w->map + m->data_offset;
    size_t len = (size_t)m->size, pos = 0;
    char name[64], kt[80];
    ckpt_value *v;
    int64_t n;
    CKPT_FORWARD(pickle_at(w, "tar:tensors count", base, len, &pos, &v));
    CKPT_FORWARD(count_of(w, v, "the tensor count", &n));
    for (int64_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "tar:tensors pickle %lld", (long long)i + 1);
        CKPT_FORWARD(pickle_at(w, name, base, len, &pos, &v));
        CKPT_FORWARD(unpack(w, v, 3, name));
        ckpt_value **a = v->u.seq.items;
        entry *e = ckpt_arena_alloc(w->arena, sizeof(*e)), sk = {0};
        CKPT_RETURN_IF(!e, w->err, CKPT_ERR_NOMEM, "out of memory");
        memset(e, 0, sizeof(*e));
        e->kind = E_TENSOR;
        CKPT_FORWARD(key_of(w, a[0], "a tensor key", e));
        CKPT_FORWARD(key_of(w, a[1], "a tensor's storage id", &sk));
        entry *s = dict_get(w, sk.is_str, sk.ikey, sk.skey, sk.sklen);
        CKPT_RETURN_IF(!s, w->err, CKPT_ERR_FORMAT, "tensor %s: storage id %s names no storage",
                       key_text(e, kt, sizeof kt), key_text(&sk, kt + 40, 40));
        CKPT_RETURN_IF(s->kind == E_TENSOR, w->err, CKPT_ERR_FORMAT,
                       "tensor %s: storage id %s names a tensor", key_text(e, kt, sizeof kt),
                       key_text(&sk, kt + 40, 40));
        CKPT_RETURN_IF(len - pos < 8, w->err, CKPT_ERR_FORMAT,
                       "truncated: no dimensions for tensor %s", key_text(e, kt, sizeof kt));
        int32_t ndim = (int32_t)(uint32_t)le(base + pos, 4);
        pos += 8; /* ndim, then 4 bytes of the 8 older torch wrote */
        CKPT_RETURN_IF(ndim < 0 || ndim > MAX_NDIM, w->err, CKPT_ERR_FORMAT,
                       "tensor %s has %d dimensions", key_text(e, kt, sizeof kt), (int)ndim);
        size_t need = 16 * (size_t)ndim + 8;
        CKPT_RETURN_IF(len - pos < need, w->err, CKPT_ERR_FORMAT,
                       "truncated: tensor %s needs %zu bytes of sizes and strides, the member "
                       "has %zu", key_text(e, kt, sizeof kt), need, len - pos);
        e->ndim = ndim;
        e->shape = ckpt_arena_alloc(w->arena, ((size_t)ndim + 1) * sizeof(int64_t));
        e->stride = ckpt_arena_alloc(w->arena, ((size_t)ndim + 1) * sizeof(int64_t));
        CKPT_RETURN_IF(!e->shape || !e->stride, w->err, CKPT_ERR_NOMEM, "out of memory");
        /* set_(storage, offset, size, stride) on the storage: every element
         * inside it (torch would grow a too small one) */
        int64_t offset = (int64_t)le(base + pos + 16 * (size_t)ndim, 8);
        uint64_t last = 0; /* the highest element offset reached */
        bool empty = false, bad = offset < 0;
        for (int d = 0; d < ndim; d++) {
            e->shape[d] = (int64_t)le(base + pos + 8 * (size_t)d, 8);
            e->stride[d] = (int64_t)le(base + pos + 8 * ((size_t)ndim + (size_t)d), 8);
            if (e->shape[d] < 0 || e->stride[d] < 0)
                bad = true;
            else if (e->shape[d] == 0)
                empty = true;
            else {
                uint64_t r;
                if (ckpt_mul_overflow((uint64_t)e->shape[d] - 1, (uint64_t)e->stride[d], &r) ||
                    r > INT64_MAX - last)
                    bad = true;
                else
                    last += r;
            }
        }
        pos += need;
        CKPT_RETURN_IF(bad, w->err, CKPT_ERR_FORMAT,
                       "tensor %s has a negative or overflowing size, stride or offset",
                       key_text(e, kt, sizeof kt));
        uint64_t numel = 1;
        for (int d = 0; d < ndim && !empty; d++)
            CKPT_RETURN_IF(ckpt_mul_overflow(numel, (uint64_t)e->shape[d], &numel) ||
                               numel > INT64_MAX,
                           w->err, CKPT_ERR_FORMAT, "tensor %s: its size overflows",
                           key_text(e, kt, sizeof kt));
        CKPT_RETURN_IF(!empty && ((uint64_t)offset > (uint64_t)s->numel ||
                                  last >= (uint64_t)(s->numel - offset)),
                       w->err, CKPT_ERR_FORMAT,
                       "tensor %s reaches past its storage of %lld elements (torch would grow "
                       "the storage with unset bytes)",
                       key_text(e, kt, sizeof kt), (long long)s->numel);
        e->base = s->kind == E_VIEW ? s->base : s;
        e->offset = offset + (s->kind == E_VIEW ? s->base_off : 0);
        e->dtype = s->dtype;
        e->type_name = s->type_name;
        CKPT_FORWARD(dict_set(w, e));
    }
    return CKPT_OK;
}

static int walk_all(walk *w, int fd, ckpt_value **root)
{
    ckpt_tar *t;
    CKPT_FORWARD(ckpt_tar_open(fd, w->size, &t, NULL, w->err));
    int rc = read_storages(w, t);
    if (rc == CKPT_OK)
        rc = read_tensors(w, t);
    const ckpt_tar_member *m = NULL;
    if (rc == CKPT_OK)
        rc = member(w, t, "pickle", false, &m);
    if (rc == CKPT_OK) {
        /* extractfile() reads the member as the unpickler asks: a truncated
         * one fails only where the pickle reaches past the file */
        uint64_t avail = (uint64_t)m->data_offset >= w->size ? 0 : w->size - (uint64_t)m->data_offset;
        size_t len = (size_t)((uint64_t)m->size < avail ? (uint64_t)m->size : avail), pos = 0;
        w->main = true;
        rc = pickle_at(w, "tar:pickle", w->map + (len ? m->data_offset : 0), len, &pos, root);
    }
    ckpt_tar_close(t);
    free(w->tab);
    return rc;
}

static int map_file(int fd, uint64_t size, const uint8_t **map, ckpt_error *err)
{
    CKPT_RETURN_IF(size == 0, err, CKPT_ERR_FORMAT, "empty file");
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    CKPT_RETURN_IF(p == MAP_FAILED, err, CKPT_ERR_IO, "cannot map the file: %s", strerror(errno));
    *map = p;
    return CKPT_OK;
}

int ckpt_pth_tar_scan(int fd, uint64_t size, ckpt_tar_pickle_fn fn, void *user, ckpt_error *err)
{
    const uint8_t *map;
    CKPT_FORWARD(map_file(fd, size, &map, err));
    ckpt_arena arena;
    ckpt_arena_init(&arena);
    walk w = {.map = map, .size = size, .load = fn, .user = user, .err = err, .arena = &arena};
    ckpt_value *root;
    int rc = walk_all(&w, fd, &root);
    ckpt_arena_release(&arena);
    munmap((void *)map, (size_t)size);
    return rc;
}

/* ---- reading into the checkpoint model --------------------------------------- */

/* The tensors member names its tensor classes (torch.FloatTensor), which
 * torch 1.13 and 2.x still import and ignore: data there, refused elsewhere. */
static ckpt_global_class classify(void *user, const char *q)
{
    walk *w = user;
    if (!w->main && ckpt_tensor_type_known(q))
        return CKPT_GLOBAL_KNOWN_DATA;
    return ckpt_file_classify_global(w->f, q);
}

static ckpt_storage *record_of(walk *w, entry *e, uint64_t offset_bytes, int64_t numel)
{
    if (e->rec)
        return e->rec;
    char kb[MAX_KEY + 1], pre[MAX_KEY + 64];
    if (e->is_str)
        snprintf(kb, sizeof kb, "%.*s", (int)e->sklen, e->skey);
    else
        snprintf(kb, sizeof kb, "%lld", (long long)e->ikey);
    const char *key = ckpt_file_table_key(w->f, kb, pre, sizeof pre);
    if (!key) {
        ckpt_err(w->err, CKPT_ERR_FORMAT, "storage key '%s' is too long", kb);
        return NULL;
    }
    if (ckpt_file_storage_find(w->f, key)) {
        /* an int key and a string key of the same digits */
        ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "two storages are named '%s'", kb);
        return NULL;
    }
    const entry *b = e->kind == E_VIEW ? e->base : e;
    ckpt_storage *s = ckpt_file_storage_new(w->f, key, e->dtype, numel, b->loc, b->loclen, w->err);
    if (!s)
        return NULL;
    s->type_name = e->type_name;
    s->loc = CKPT_LOC_FILE_RANGE;
    s->file_offset = b->file_offset + offset_bytes;
    e->rec = s;
    return s;
}

/* int(saved_id) for the ids Python's int() takes; false for the rest */
static bool id_int(const ckpt_value *v, int64_t *out)
{
    if (v->kind == CKPT_KIND_BOOL) {
        *out = v->u.b != 0;
        return true;
    }
    if (v->kind == CKPT_KIND_INT)
        return !v->u.i.big && (*out = v->u.i.v, true);
    if (v->kind == CKPT_KIND_FLOAT)
        return isfinite(v->u.f) && fabs(v->u.f) < 9.2e18 && (*out = (int64_t)v->u.f, true);
    if (v->kind != CKPT_KIND_STR && v->kind != CKPT_KIND_BYTES)
        return false;
    const char *s = v->u.s.s;
    size_t n = v->u.s.len, i = 0;
    while (n && (s[n - 1] == ' ' || (s[n - 1] >= '\t' && s[n - 1] <= '\r')))
        n--;
    while (i < n && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r')))
        i++;
    bool neg = i < n && s[i] == '-';
    if (i < n && (s[i] == '-' || s[i] == '+'))
        i++;
    if (i >= n)
        return false;
    uint64_t x = 0;
    for (;;) {
        if (s[i] < '0' || s[i] > '9' || x > (UINT64_MAX - 9) / 10)
            return false;
        x = x * 10 + (uint64_t)(s[i] - '0');
        if (++i == n)
            break;
        if (s[i] == '_' && ++i == n)
            return false;
    }
    if (x > (uint64_t)INT64_MAX)
        return false;
    *out = neg ? -(int64_t)x : (int64_t)x;
    return true;
}

static ckpt_value *persistent_load(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    walk *w = user;
    if (!w->main) {
        ckpt_err(err, CKPT_ERR_FORMAT, "a persistent id outside the main pickle");
        return NULL;
    }
    if (pid->kind == CKPT_KIND_TUPLE) {
        /* (module class, source file, source): the class */
        if (pid->u.seq.len == 0) {
            ckpt_err(err, CKPT_ERR_FORMAT, "an empty persistent id tuple");
            return NULL;
        }
        return pid->u.seq.items[0];
    }
    int64_t k;
    if (!id_int(pid, &k)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "persistent id (a %s) is not a key",
                 ckpt_kind_name((ckpt_kind)pid->kind));
        return NULL;
    }
    entry *e = dict_get(w, false, k, NULL, 0);
    if (!e) {
        ckpt_err(err, CKPT_ERR_FORMAT, "persistent id %lld names no storage or tensor",
                 (long long)k);
        return NULL;
    }
    if (e->value)
        return e->value; /* the same object each time, as torch's dict gives it */
    ckpt_value *v;
    if (e->kind == E_TENSOR) {
        ckpt_storage *s = record_of(w, e->base, 0, e->base->numel);
        v = s ? ckpt_tensor_value_new(&w->f->arena, s, e->dtype, e->ndim, e->shape, e->stride,
                                      e->offset)
              : NULL;
    } else {
        ckpt_storage *s = record_of(w, e, (uint64_t)e->base_off * ckpt_dtype_size(e->dtype),
                                    e->numel);
        v = s ? ckpt_value_new(&w->f->arena, CKPT_KIND_STORAGE, offset) : NULL;
        if (v) {
            v->u.st.ptr = s;
            v->u.st.dtype = e->dtype;
            v->u.st.type_name = e->type_name;
        }
    }
    if (!v && !err->code)
        ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
    return e->value = v;
}

static int load_pickle(void *user, const char *name, const uint8_t *buf, size_t len,
                       size_t *used, ckpt_value **root)
{
    walk *w = user;
    ckpt_file *f = w->f;
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, name);
    ctx.classify = classify;
    ctx.persistent_load = persistent_load;
    ctx.user = w;
    uint64_t lim = f->limits[CKPT_LIMIT_PICKLE_BYTES];
    bool capped = len > lim;
    int rc = ckpt_pickle_load(&ctx, buf, capped ? (size_t)lim : len, root, used, &f->err);
    if (rc && capped) {
        char msg[CKPT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", f->err.msg);
        ckpt_err_clear(&f->err);
        rc = ckpt_err(&f->err, CKPT_ERR_LIMIT, "%s does not end within the limit of %llu bytes "
                      "(--max-pickle-bytes): %s", name, (unsigned long long)lim, msg);
    }
    return rc;
}

static int pth_tar_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    const uint8_t *map;
    CKPT_FORWARD(map_file(src->fd, src->file_size, &map, &f->err));
    walk w = {.map = map, .size = src->file_size, .load = load_pickle, .err = &f->err,
              .arena = &f->arena, .f = f};
    w.user = &w;
    int rc = walk_all(&w, src->fd, root);
    munmap((void *)map, (size_t)src->file_size);
    return rc;
}

static bool pth_tar_sniff(const uint8_t *head, size_t n)
{
    return ckpt_tar_head_ok(head, n);
}

const ckpt_format_desc ckpt_format_pth_tar = {
    .id = CKPT_FORMAT_PTH_TAR,
    .name = "pth-tar",
    .sniff = pth_tar_sniff,
    .claim = ckpt_tar_probe,
    .read = pth_tar_read,
};
