/*
 * file.c - the ckpt_file handle: creation, options (limits, the allow-list
 * of globals), errors, and what it holds.  Opening is the format
 * dispatcher's (formats/read.c); the storage table is storage.c's.
 */
#include "checkpoint/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint64_t default_limits[CKPT_LIMIT_COUNT_] = {
    [CKPT_LIMIT_PICKLE_BYTES] = 1ull << 30,
    [CKPT_LIMIT_DEPTH] = 10000,
    [CKPT_LIMIT_STACK] = 16ull << 20,
    [CKPT_LIMIT_MARKS] = 100000,
    [CKPT_LIMIT_MEMO] = 16ull << 20,
    [CKPT_LIMIT_ITEMS] = 64ull << 20,
    [CKPT_LIMIT_STORAGES] = 16ull << 20,
    [CKPT_LIMIT_HEADER_BYTES] = 100000000, /* the safetensors crate's own limit */
};

bool ckpt_file_valid(const ckpt_file *f)
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
    f->dir_fd = -1;
    f->model_fd = -1;
    ckpt_arena_init(&f->arena);
    memcpy(f->limits, default_limits, sizeof(f->limits));
    return f;
}

void ckpt_source_close(ckpt_source *src)
{
    ckpt_zip_close(src->zip);
    src->zip = NULL;
    if (src->fd >= 0)
        close(src->fd);
    src->fd = -1;
}

/* A name inside the folder: relative, no "..", "." or empty component. */
static bool inside_name(const char *name)
{
    if (!name[0] || name[0] == '/' || strlen(name) > 4095)
        return false;
    for (const char *c = name; *c;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        c += n + (e ? 1 : 0);
        if (e && !*c)
            return false; /* a trailing slash names no file */
    }
    return true;
}

ckpt_source *ckpt_file_source_add(ckpt_file *f, const char *name, ckpt_error *err)
{
    if (!inside_name(name)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "file name '%.200s' leads out of the checkpoint's folder",
                 name);
        return NULL;
    }
    struct stat st;
    if (fstatat(f->dir_fd, name, &st, 0) != 0) {
        int e = errno;
        ckpt_err(err, e == ENOENT || e == ENOTDIR ? CKPT_ERR_FORMAT : CKPT_ERR_IO,
                 "'%.200s': %s", name, strerror(e));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "'%.200s' is not a regular file", name);
        return NULL;
    }
    if (CKPT_GROW(f->shards, f->shards_cap, f->nshards + 1) < 0) {
        ckpt_oom(err);
        return NULL;
    }
    ckpt_source *src = calloc(1, sizeof(*src));
    if (!src || !(src->path = ckpt_arena_strndup(&f->arena, name, strlen(name)))) {
        free(src);
        ckpt_oom(err);
        return NULL;
    }
    src->fd = -1;
    src->lazy = true;
    src->file_size = (uint64_t)st.st_size;
    f->shards[f->nshards++] = src;
    return src;
}

int ckpt_source_fd(ckpt_file *f, ckpt_source *src)
{
    if (src->fd >= 0 || !src->lazy)
        return src->fd;
    ckpt_source **slot = &f->open_lazy[f->open_lazy_next];
    if (*slot)
        ckpt_source_close(*slot); /* the oldest: a later read opens it again */
    int fd;
    struct stat st;
    ckpt_error e = {0};
    if (ckpt_open_input(f->dir_fd, src->path, false, &fd, &st, &e) != CKPT_OK) {
        ckpt_err(&f->err, e.code, "'%s': %s", src->path, e.msg);
        *slot = NULL;
        return -1;
    }
    if ((uint64_t)st.st_size != src->file_size) {
        close(fd);
        ckpt_err(&f->err, CKPT_ERR_IO, "'%s' changed while it was read", src->path);
        *slot = NULL;
        return -1;
    }
    src->fd = fd;
    *slot = src;
    f->open_lazy_next = (f->open_lazy_next + 1) % CKPT_OPEN_SOURCES_MAX;
    return fd;
}

/* What the format that read SRC keeps for it. */
static void source_state_free(ckpt_source *src)
{
    if (src->fmt_data && src->ops && src->ops->state_free)
        src->ops->state_free(src->fmt_data);
    src->fmt_data = NULL;
}

CKPT_API void ckpt_file_free(ckpt_file *f)
{
    if (!ckpt_file_valid(f))
        return;
    source_state_free(&f->main);
    ckpt_source_close(&f->main);
    for (size_t i = 0; i < f->nshards; i++) {
        source_state_free(f->shards[i]);
        ckpt_source_close(f->shards[i]);
        free(f->shards[i]);
    }
    free(f->shards);
    if (f->dir_fd >= 0)
        close(f->dir_fd);
    if (f->model_fd >= 0)
        close(f->model_fd);
    free(f->model_dir);
    for (size_t i = 0; i < f->nallowed; i++)
        free(f->allowed[i]);
    free(f->allowed);
    for (size_t i = 0; i < f->nnotices; i++)
        free(f->notices[i]);
    free(f->notices);
    free(f->storages);
    ckpt_map_release(&f->storage_index);
    free(f->tensors.items);
    free(f->state_dicts.items);
    free(f->objects.items);
    free(f->other_tensors.items);
    free(f->path);
    ckpt_arena_release(&f->arena);
    f->magic = 0;
    free(f);
}

CKPT_API int ckpt_file_allow_global(ckpt_file *f, const char *q)
{
    if (!ckpt_file_valid(f))
        return CKPT_ERR_USAGE;
    if (!q || !strchr(q, '.') || q[0] == '.')
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "'%s' is not a MODULE.NAME global", q ? q : "");
    char **a = realloc(f->allowed, (f->nallowed + 1) * sizeof(*a));
    if (!a)
        return ckpt_oom(&f->err);
    f->allowed = a;
    if (!(a[f->nallowed] = strdup(q)))
        return ckpt_oom(&f->err);
    f->nallowed++;
    return CKPT_OK;
}

CKPT_API int ckpt_file_set_allow_unknown(ckpt_file *f, int allow)
{
    if (!ckpt_file_valid(f))
        return CKPT_ERR_USAGE;
    f->allow_unknown = allow != 0;
    return CKPT_OK;
}

CKPT_API int ckpt_file_set_defer_record_checks(ckpt_file *f, int defer)
{
    if (!ckpt_file_valid(f) || f->opened)
        return CKPT_ERR_USAGE;
    f->defer_record_checks = defer != 0;
    return CKPT_OK;
}

CKPT_API int ckpt_file_set_limit(ckpt_file *f, ckpt_limit which, uint64_t value)
{
    if (!ckpt_file_valid(f) || (unsigned)which >= CKPT_LIMIT_COUNT_ || value == 0)
        return CKPT_ERR_USAGE;
    f->limits[which] = value;
    return CKPT_OK;
}

CKPT_API uint64_t ckpt_file_limit(const ckpt_file *f, ckpt_limit which)
{
    if (!ckpt_file_valid(f) || (unsigned)which >= CKPT_LIMIT_COUNT_)
        return 0;
    return f->limits[which];
}

CKPT_API int ckpt_file_error_code(const ckpt_file *f)
{
    return ckpt_file_valid(f) ? f->err.code : CKPT_ERR_USAGE;
}

CKPT_API const char *ckpt_file_error_message(const ckpt_file *f)
{
    if (!ckpt_file_valid(f))
        return "invalid ckpt_file handle";
    return f->err.code ? f->err.msg : "";
}

CKPT_API const char *ckpt_file_path(const ckpt_file *f) { return ckpt_file_valid(f) ? f->path : NULL; }
CKPT_API const char *ckpt_file_model_folder(const ckpt_file *f)
{
    return ckpt_file_valid(f) ? f->model_dir : NULL;
}
CKPT_API ckpt_format ckpt_file_format(const ckpt_file *f) { return ckpt_file_valid(f) ? f->format : CKPT_FORMAT_UNKNOWN; }
/* The records are the main file's when it is a torch zip (its prefix set):
 * what inspect lists. */
CKPT_API const char *ckpt_file_prefix(const ckpt_file *f)
{
    return ckpt_file_valid(f) && f->main.prefix ? f->main.prefix : "";
}
CKPT_API size_t ckpt_file_record_count(const ckpt_file *f)
{
    return ckpt_file_valid(f) && f->main.prefix ? (size_t)ckpt_zip_count(f->main.zip) : 0;
}
CKPT_API const ckpt_value *ckpt_file_root(const ckpt_file *f) { return ckpt_file_valid(f) ? f->root : NULL; }
CKPT_API size_t ckpt_file_storage_count(const ckpt_file *f) { return ckpt_file_valid(f) ? f->nstorages : 0; }

CKPT_API const char *ckpt_file_record_name(const ckpt_file *f, size_t i)
{
    return i < ckpt_file_record_count(f) ? ckpt_zip_name(f->main.zip, (int64_t)i) : NULL;
}

CKPT_API const ckpt_storage *ckpt_file_storage(const ckpt_file *f, size_t i)
{
    return ckpt_file_valid(f) && i < f->nstorages ? f->storages[i] : NULL;
}

/* ---- globals and persistent ids ------------------------------------------------- */

CKPT_API ckpt_global_class ckpt_file_classify_global(const ckpt_file *f, const char *q)
{
    ckpt_global_class c = ckpt_globals_builtin_class(q);
    if (c != CKPT_GLOBAL_REFUSED || !ckpt_file_valid(f) || ckpt_globals_dangerous(q))
        return c;
    for (size_t i = 0; i < f->nallowed; i++)
        if (strcmp(f->allowed[i], q) == 0)
            return CKPT_GLOBAL_ALLOWED;
    return f->allow_unknown ? CKPT_GLOBAL_ALLOWED : CKPT_GLOBAL_REFUSED;
}

int ckpt_file_notice_add(ckpt_file *f, const char *fmt, ...)
{
    char buf[CKPT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < f->nnotices; i++)
        if (strcmp(f->notices[i], buf) == 0)
            return 0;
    char **a = realloc(f->notices, (f->nnotices + 1) * sizeof(*a));
    if (!a)
        return -1;
    f->notices = a;
    if (!(a[f->nnotices] = strdup(buf)))
        return -1;
    f->nnotices++;
    return 0;
}

CKPT_API size_t ckpt_file_notice_count(const ckpt_file *f)
{
    return ckpt_file_valid(f) ? f->nnotices : 0;
}

CKPT_API const char *ckpt_file_notice(const ckpt_file *f, size_t i)
{
    return ckpt_file_valid(f) && i < f->nnotices ? f->notices[i] : NULL;
}

int64_t ckpt_file_record_find(ckpt_file *f, const char *name)
{
    char full[1024];
    if ((size_t)snprintf(full, sizeof(full), "%s/%s", f->cur_src->prefix, name) >= sizeof(full))
        return -1;
    return ckpt_zip_find(f->cur_src->zip, full);
}

int ckpt_file_record_text(ckpt_file *f, int64_t i, char *buf, size_t cap)
{
    uint64_t size = ckpt_zip_size(f->cur_src->zip, i);
    if (size >= cap)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "record '%s' is %llu bytes, expected a few",
                        ckpt_zip_name(f->cur_src->zip, i), (unsigned long long)size);
    CKPT_FORWARD(ckpt_zip_read(f->cur_src->zip, i, 0, buf, (size_t)size, &f->err));
    buf[size] = '\0';
    return CKPT_OK;
}
