/*
 * checkpoint.c - the ckpt_file handle: opening (format detection), the
 * storage table shared by the format readers, and the index of tensors,
 * state dicts and opaque objects built once after parsing.
 */
#include "ckpt_private.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint64_t default_limits[CKPT_LIMIT_COUNT_] = {
    [CKPT_LIMIT_PICKLE_BYTES] = 1ull << 30,
    [CKPT_LIMIT_DEPTH] = 1000,
    [CKPT_LIMIT_STACK] = 16ull << 20,
    [CKPT_LIMIT_MARKS] = 100000,
    [CKPT_LIMIT_MEMO] = 16ull << 20,
    [CKPT_LIMIT_ITEMS] = 64ull << 20,
    [CKPT_LIMIT_STORAGES] = 16ull << 20,
};

static bool valid(const ckpt_file *f)
{
    return f && f->magic == CKPT_FILE_MAGIC;
}

CKPT_API ckpt_file *ckpt_file_new(void)
{
    ckpt_file *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->magic = CKPT_FILE_MAGIC;
    f->main.fd = -1;
    ckpt_arena_init(&f->arena);
    memcpy(f->limits, default_limits, sizeof(f->limits));
    f->prefix = "";
    return f;
}

CKPT_API void ckpt_file_free(ckpt_file *f)
{
    if (!valid(f))
        return;
    ckpt_source_close(&f->main);
    for (size_t i = 0; i < f->nshards; i++) {
        ckpt_source_close(f->shards[i]);
        free(f->shards[i]);
    }
    free(f->shards);
    for (size_t i = 0; i < f->nallowed; i++)
        free(f->allowed[i]);
    free(f->allowed);
    free(f->storages);
    free(f->storage_hash);
    free(f->tensors.items);
    free(f->state_dicts.items);
    free(f->objects.items);
    free(f->path);
    ckpt_arena_release(&f->arena);
    f->magic = 0;
    free(f);
}

CKPT_API int ckpt_file_allow_global(ckpt_file *f, const char *q)
{
    if (!valid(f))
        return CKPT_ERR_USAGE;
    if (!q || !strchr(q, '.') || q[0] == '.')
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "'%s' is not a MODULE.NAME global", q ? q : "");
    char **a = realloc(f->allowed, (f->nallowed + 1) * sizeof(*a));
    if (!a)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    f->allowed = a;
    if (!(a[f->nallowed] = strdup(q)))
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    f->nallowed++;
    return CKPT_OK;
}

CKPT_API int ckpt_file_set_allow_unknown(ckpt_file *f, int allow)
{
    if (!valid(f))
        return CKPT_ERR_USAGE;
    f->allow_unknown = allow != 0;
    return CKPT_OK;
}

CKPT_API int ckpt_file_set_limit(ckpt_file *f, ckpt_limit which, uint64_t value)
{
    if (!valid(f) || (unsigned)which >= CKPT_LIMIT_COUNT_ || value == 0)
        return CKPT_ERR_USAGE;
    f->limits[which] = value;
    return CKPT_OK;
}

CKPT_API uint64_t ckpt_file_limit(const ckpt_file *f, ckpt_limit which)
{
    if (!valid(f) || (unsigned)which >= CKPT_LIMIT_COUNT_)
        return 0;
    return f->limits[which];
}

CKPT_API int ckpt_file_error_code(const ckpt_file *f)
{
    return valid(f) ? f->err.code : CKPT_ERR_USAGE;
}

CKPT_API const char *ckpt_file_error_message(const ckpt_file *f)
{
    if (!valid(f))
        return "invalid ckpt_file handle";
    return f->err.code ? f->err.msg : "";
}

CKPT_API const char *ckpt_file_path(const ckpt_file *f) { return valid(f) ? f->path : NULL; }
CKPT_API ckpt_format ckpt_file_format(const ckpt_file *f) { return valid(f) ? f->format : CKPT_FORMAT_UNKNOWN; }
CKPT_API const char *ckpt_file_prefix(const ckpt_file *f) { return valid(f) ? f->prefix : ""; }
CKPT_API size_t ckpt_file_record_count(const ckpt_file *f) { return valid(f) ? f->nrecords : 0; }
CKPT_API const ckpt_value *ckpt_file_root(const ckpt_file *f) { return valid(f) ? f->root : NULL; }
CKPT_API size_t ckpt_file_storage_count(const ckpt_file *f) { return valid(f) ? f->nstorages : 0; }

CKPT_API const char *ckpt_file_record_name(const ckpt_file *f, size_t i)
{
    return valid(f) && i < f->nrecords ? f->records[i] : NULL;
}

CKPT_API const ckpt_storage *ckpt_file_storage(const ckpt_file *f, size_t i)
{
    return valid(f) && i < f->nstorages ? f->storages[i] : NULL;
}

CKPT_API const char *ckpt_format_name(ckpt_format format)
{
    switch (format) {
    case CKPT_FORMAT_PTH_ZIP: return "pth-zip";
    case CKPT_FORMAT_PTH_LEGACY: return "pth-legacy";
    case CKPT_FORMAT_SAFETENSORS: return "safetensors";
    case CKPT_FORMAT_SHARDED: return "sharded";
    default: return "unknown";
    }
}

/* ---- globals and persistent ids ------------------------------------------------- */

CKPT_API ckpt_global_class ckpt_file_classify_global(const ckpt_file *f, const char *q)
{
    ckpt_global_class c = ckpt_globals_builtin_class(q);
    if (c != CKPT_GLOBAL_REFUSED || !valid(f) || ckpt_globals_dangerous(q))
        return c;
    for (size_t i = 0; i < f->nallowed; i++)
        if (strcmp(f->allowed[i], q) == 0)
            return CKPT_GLOBAL_ALLOWED;
    return f->allow_unknown ? CKPT_GLOBAL_ALLOWED : CKPT_GLOBAL_REFUSED;
}

ckpt_global_class ckpt_file_classify_cb(void *user, const char *q)
{
    return ckpt_file_classify_global(user, q);
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

ckpt_storage *ckpt_file_storage_find(ckpt_file *f, const char *key)
{
    if (!f->storage_hash_size)
        return NULL;
    ckpt_storage *s = f->storage_hash[hash_str(key) & (f->storage_hash_size - 1)];
    while (s && strcmp(s->key, key) != 0)
        s = s->hash_next;
    return s;
}

int ckpt_file_storage_add(ckpt_file *f, ckpt_storage *s, ckpt_error *err)
{
    if (f->nstorages >= f->limits[CKPT_LIMIT_STORAGES])
        return ckpt_err(err, CKPT_ERR_LIMIT, "more than %llu storages",
                        (unsigned long long)f->limits[CKPT_LIMIT_STORAGES]);
    if (f->nstorages == f->storages_cap) {
        size_t cap = f->storages_cap ? f->storages_cap * 2 : 64;
        ckpt_storage **a = realloc(f->storages, cap * sizeof(*a));
        if (!a)
            return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
        f->storages = a;
        f->storages_cap = cap;
    }
    if ((f->nstorages + 1) * 2 > f->storage_hash_size) {
        size_t size = f->storage_hash_size ? f->storage_hash_size * 2 : 128;
        ckpt_storage **h = calloc(size, sizeof(*h));
        if (!h)
            return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < f->nstorages; i++) {
            ckpt_storage *t = f->storages[i];
            size_t b = hash_str(t->key) & (size - 1);
            t->hash_next = h[b];
            h[b] = t;
        }
        free(f->storage_hash);
        f->storage_hash = h;
        f->storage_hash_size = size;
    }
    s->index = f->nstorages;
    f->storages[f->nstorages++] = s;
    size_t b = hash_str(s->key) & (f->storage_hash_size - 1);
    s->hash_next = f->storage_hash[b];
    f->storage_hash[b] = s;
    return CKPT_OK;
}

/*
 * ('storage', torch.<X>Storage, key, location, numel)          pth-zip
 * ('storage', torch.<X>Storage, key, location, numel, None)    pth-legacy
 */
ckpt_value *ckpt_file_persistent_load(void *user, ckpt_value *pid, uint64_t offset,
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
        ckpt_err(err, CKPT_ERR_UNSUPPORTED,
                 "the file pickles a whole nn.Module with its source; only state dicts and "
                 "plain data can be read safely");
        return NULL;
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
        s = ckpt_arena_alloc(&f->arena, sizeof(*s));
        if (!s || !(s->key = ckpt_arena_strndup(&f->arena, key, strlen(key))) ||
            !(s->device = ckpt_arena_strndup(&f->arena, a[3]->u.s.s, a[3]->u.s.len))) {
            ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
            return NULL;
        }
        s->src = f->cur_src;
        s->src_key = s->key + (f->key_prefix ? strlen(f->key_prefix) : 0);
        s->dtype = dt;
        s->type_name = type_name;
        s->numel = numel;
        s->nbytes = s->src_nbytes = nbytes;
        s->src_dtype = dt;
        s->zip_index = -1;
        if (ckpt_file_storage_add(f, s, err))
            return NULL;
    }
    ckpt_value *v = ckpt_value_new(&f->arena, CKPT_KIND_STORAGE, offset);
    if (!v) {
        ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
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
    ctx->classify = ckpt_file_classify_cb;
    ctx->persistent_load = ckpt_file_persistent_load;
    ctx->user = f;
    ctx->arena = &f->arena;
}

/* ---- open ------------------------------------------------------------------------- */

void ckpt_source_close(ckpt_source *src)
{
    ckpt_zip_close(src->zip);
    src->zip = NULL;
    if (src->fd >= 0)
        close(src->fd);
    src->fd = -1;
}

const char *ckpt_file_table_key(const ckpt_file *f, const char *key, char *buf, size_t cap)
{
    if (!f->key_prefix)
        return key;
    int n = snprintf(buf, cap, "%s%s", f->key_prefix, key);
    return n < 0 || (size_t)n >= cap ? NULL : buf;
}

ckpt_format ckpt_sniff_format(const uint8_t *head, size_t n, uint64_t file_size)
{
    if (n >= 4 && memcmp(head, "PK\x03\x04", 4) == 0)
        return CKPT_FORMAT_PTH_ZIP;
    (void)file_size;
    /* safetensors: u64 header length, then JSON; the reader checks the length */
    /* (a torch legacy file never has '{' there: its magic pickle does not) */
    if (n >= 9 && head[8] == '{')
        return CKPT_FORMAT_SAFETENSORS;
    if (n >= 2 && head[0] == 0x80 && head[1] <= 5)
        return CKPT_FORMAT_PTH_LEGACY;
    return CKPT_FORMAT_UNKNOWN;
}

/* Read SRC (an open file of a known format) into *ROOT. */
int ckpt_source_load(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    ckpt_source *prev = f->cur_src;
    f->cur_src = src;
    int rc;
    switch (src->format) {
    case CKPT_FORMAT_PTH_ZIP:
        rc = ckpt_pth_zip_open(f, root);
        break;
    case CKPT_FORMAT_SAFETENSORS:
        rc = ckpt_safetensors_open(f, root);
        break;
    case CKPT_FORMAT_PTH_LEGACY: {
        void *map = mmap(NULL, (size_t)src->file_size, PROT_READ, MAP_PRIVATE, src->fd, 0);
        if (map == MAP_FAILED) {
            rc = ckpt_err(&f->err, CKPT_ERR_IO, "cannot map '%s': %s", src->path, strerror(errno));
            break;
        }
        rc = ckpt_pth_legacy_open(f, map, (size_t)src->file_size, root);
        munmap(map, (size_t)src->file_size);
        break;
    }
    default:
        rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "'%s': unknown format", src->path);
    }
    f->cur_src = prev;
    return rc;
}

/* A shard index: read its text and hand it to the sharded reader. */
static int open_index(ckpt_file *f)
{
    uint64_t size = f->main.file_size;
    if (size > (64u << 20))
        return ckpt_err(&f->err, CKPT_ERR_LIMIT, "shard index of %llu bytes is over 64 MiB",
                        (unsigned long long)size);
    uint8_t *text = malloc((size_t)size + 1);
    if (!text)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    ssize_t got = pread(f->main.fd, text, (size_t)size, 0);
    int rc = got == (ssize_t)size ? ckpt_sharded_open(f, text, (size_t)size)
                                  : ckpt_err(&f->err, CKPT_ERR_IO, "cannot read the shard index");
    free(text);
    return rc;
}

CKPT_API int ckpt_file_open(ckpt_file *f, const char *path)
{
    if (!valid(f) || !path)
        return CKPT_ERR_USAGE;
    if (f->opened)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "handle already used; make a new one");
    f->opened = true;
    ckpt_err_clear(&f->err);
    if (!(f->path = strdup(path)))
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    f->main.path = f->path;
    f->cur_src = &f->main;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot stat: %s", strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return ckpt_err(&f->err, CKPT_ERR_IO, "is a directory");
    }
    f->main.file_size = (uint64_t)st.st_size;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->mode = st.st_mode;
    uint8_t head[512];
    ssize_t got = pread(fd, head, sizeof(head), 0);
    if (got < 0) {
        int e = errno;
        close(fd);
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot read: %s", strerror(e));
    }
    int rc;
    f->main.fd = fd;
    ckpt_format fmt = ckpt_sniff_format(head, (size_t)got, f->main.file_size);
    size_t plen = strlen(path);
    bool json = plen > 5 && strcmp(path + plen - 5, ".json") == 0;
    if (got == 0) {
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "empty file");
    } else if (fmt == CKPT_FORMAT_UNKNOWN && json) {
        f->format = CKPT_FORMAT_SHARDED;
        rc = open_index(f);
    } else if (got >= 262 && memcmp(head + 257, "ustar", 5) == 0) {
        rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                      "the tar checkpoint format of torch before 0.4 is not supported");
    } else if (fmt == CKPT_FORMAT_UNKNOWN) {
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                      "not a PyTorch checkpoint (not a zip archive, a legacy pickle stream, "
                      "safetensors or a shard index)");
    } else {
        f->format = f->main.format = fmt;
        rc = ckpt_source_load(f, &f->main, &f->root);
    }
    if (rc == CKPT_OK)
        rc = ckpt_file_index(f);
    return rc;
}
