/*
 * format_pth_zip_write.c - write a checkpoint as torch.save's zip does.
 *
 * The pickle is built in memory (it is small); storage bytes go from the
 * input file to the output with copy_file_range where the kernel allows (a
 * bounded buffer otherwise), while a second thread reads the same input
 * ranges and computes their CRC-32: the CRC the output needs, and a check
 * of the input's own.  Memory stays bounded whatever the checkpoint size.
 */
#include "ckpt_private.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define COPY_CHUNK (8u << 20)  /* bytes per copy_file_range call */
#define BUF_SIZE (1u << 20)    /* the bounded buffers */

/* One storage to copy: where its bytes are in the input. */
typedef struct job {
    const ckpt_storage *s;
    int fd;            /* the source file (shards differ) */
    bool raw;          /* bytes at in_off in the input file, uncompressed */
    uint64_t in_off;
    uint32_t crc;      /* computed by the CRC thread (raw jobs) */
    int status;
} job;

typedef struct crc_pool {
    job *jobs;
    size_t n, done;
    bool cancel;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} crc_pool;

static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n)
{
    return (uint32_t)crc32(crc, p, (uInt)n);
}

static int crc_of_range(int fd, uint64_t off, uint64_t len, uint8_t *buf, uint32_t *out,
                        volatile bool *cancel)
{
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    while (len) {
        if (cancel && *cancel)
            return CKPT_ERR_IO;
        size_t want = len < BUF_SIZE ? (size_t)len : BUF_SIZE;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? CKPT_ERR_IO : CKPT_ERR_FORMAT;
        crc = crc_update(crc, buf, (size_t)got);
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    *out = crc;
    return CKPT_OK;
}

static void *crc_thread(void *arg)
{
    crc_pool *p = arg;
    uint8_t *buf = malloc(BUF_SIZE);
    for (size_t i = 0; i < p->n; i++) {
        job *j = &p->jobs[i];
        int st = CKPT_OK;
        uint32_t crc = 0;
        if (!buf)
            st = CKPT_ERR_NOMEM;
        else if (j->raw)
            st = crc_of_range(j->fd, j->in_off, j->s->nbytes, buf, &crc, &p->cancel);
        pthread_mutex_lock(&p->mu);
        j->crc = crc;
        j->status = st;
        p->done = i + 1;
        pthread_cond_broadcast(&p->cv);
        bool stop = p->cancel;
        pthread_mutex_unlock(&p->mu);
        if (stop)
            break;
    }
    free(buf);
    return NULL;
}

static void crc_wait(crc_pool *p, size_t i)
{
    pthread_mutex_lock(&p->mu);
    while (p->done <= i)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int ckpt_write_all(int fd, const void *buf, size_t n, uint64_t off, ckpt_error *err)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return ckpt_err(err, CKPT_ERR_IO, "cannot write: %s", strerror(errno));
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return CKPT_OK;
}

int ckpt_fd_sink_write(void *sink, const uint8_t *p, size_t n)
{
    ckpt_fd_sink *k = sink;
    int rc = ckpt_write_all(k->fd, p, n, k->at, k->err);
    k->at += n;
    return rc;
}

int ckpt_crc_range(int fd, uint64_t off, uint64_t len, uint32_t *crc, ckpt_error *err)
{
    uint8_t *buf = malloc(BUF_SIZE);
    if (!buf)
        return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
    int rc = crc_of_range(fd, off, len, buf, crc, NULL);
    free(buf);
    return rc ? ckpt_err(err, rc, "cannot read the input") : CKPT_OK;
}

/* Kernel-side copy of LEN bytes; a bounded buffer where the kernel declines. */
int ckpt_copy_range(int in, uint64_t in_off, int out, uint64_t out_off, uint64_t len,
                    ckpt_error *err)
{
    bool kernel = true;
    uint8_t *buf = NULL;
    while (len) {
        size_t want = len < COPY_CHUNK ? (size_t)len : COPY_CHUNK;
        ssize_t k = -1;
        if (kernel) {
            loff_t ri = (loff_t)in_off, ro = (loff_t)out_off;
            k = copy_file_range(in, &ri, out, &ro, want, 0);
            if (k < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP ||
                          errno == EINVAL || errno == EBADF)) {
                kernel = false;
                continue;
            }
        } else {
            if (!buf && !(buf = malloc(BUF_SIZE)))
                return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
            if (want > BUF_SIZE)
                want = BUF_SIZE;
            k = pread(in, buf, want, (off_t)in_off);
            if (k > 0) {
                ssize_t w = 0;
                while (w < k) {
                    ssize_t x = pwrite(out, buf + w, (size_t)(k - w), (off_t)(out_off + (uint64_t)w));
                    if (x < 0 && errno == EINTR)
                        continue;
                    if (x < 0) {
                        int e = errno;
                        free(buf);
                        return ckpt_err(err, CKPT_ERR_IO, "cannot write: %s", strerror(e));
                    }
                    w += x;
                }
            } else if (k == 0) {
                free(buf);
                return ckpt_err(err, CKPT_ERR_FORMAT, "the input ends early");
            }
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int e = errno;
            free(buf);
            return ckpt_err(err, CKPT_ERR_IO, "cannot write: %s", strerror(e));
        }
        if (k == 0) {
            free(buf);
            return ckpt_err(err, CKPT_ERR_FORMAT, "the input ends early");
        }
        in_off += (uint64_t)k;
        out_off += (uint64_t)k;
        len -= (uint64_t)k;
    }
    free(buf);
    return CKPT_OK;
}

/* A compressed record: inflate it through libzip in one pass (which also
 * checks its CRC) and write it stored. */
typedef struct sink_ctx {
    ckpt_zipw *w;
    uint32_t crc;
} sink_ctx;

static int sink_write(void *user, const uint8_t *p, size_t n)
{
    sink_ctx *c = user;
    c->crc = crc_update(c->crc, p, n);
    return ckpt_zipw_write(c->w, p, n);
}

static int copy_through_libzip(ckpt_file *f, const ckpt_storage *s, ckpt_zipw *w, uint32_t *crc)
{
    sink_ctx c = {.w = w, .crc = (uint32_t)crc32(0L, Z_NULL, 0)};
    int rc = ckpt_zip_stream(s->src->zip, s->zip_index, sink_write, &c, &f->err);
    *crc = c.crc;
    return rc;
}

/* torch names the archive folder after the file: base name, last extension off */
static char *archive_prefix(const char *path)
{
    const char *base = path;
    for (const char *p = path; *p; p++)
        if (*p == '/' || *p == '\\')
            base = p + 1;
    size_t n = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot)
        n = (size_t)(dot - base);
    bool ascii = n > 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)base[i] >= 0x80)
            ascii = false; /* Python writes such names through a stream: "archive" */
    return ascii ? strndup(base, n) : strdup("archive");
}

static int write_small(ckpt_zipw *w, const char *name, const void *data, size_t n)
{
    uint64_t at;
    CKPT_FORWARD(ckpt_zipw_begin(w, name, n, &at));
    CKPT_FORWARD(ckpt_zipw_write(w, data, n));
    return ckpt_zipw_end(w, crc_update((uint32_t)crc32(0L, Z_NULL, 0), data, n));
}

static int same_file(ckpt_file *f, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    return (uint64_t)st.st_dev == f->dev && (uint64_t)st.st_ino == f->ino;
}

static int write_records(ckpt_file *f, ckpt_zipw *w, const char *prefix, const ckpt_pickle_out *pk,
                         const ckpt_write_options *opt)
{
    char name[1200];
    ckpt_error *err = &f->err;
    snprintf(name, sizeof(name), "%s/data.pkl", prefix);
    CKPT_FORWARD(write_small(w, name, pk->buf, pk->len));
    snprintf(name, sizeof(name), "%s/byteorder", prefix);
    CKPT_FORWARD(write_small(w, name, "little", 6));

    size_t n = pk->norder;
    job *jobs = calloc(n ? n : 1, sizeof(*jobs));
    if (!jobs)
        return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
    uint64_t total = 0, done = 0;
    int rc = CKPT_OK;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        const ckpt_storage *s = f->storages[pk->order[i]];
        jobs[i].s = s;
        jobs[i].fd = s->src->fd;
        total += s->nbytes;
        if (s->src_dtype != s->dtype) {
            jobs[i].raw = false; /* cast: through a buffer */
        } else if (s->src->format != CKPT_FORMAT_PTH_ZIP) {
            jobs[i].raw = true;
            jobs[i].in_off = s->file_offset;
        } else {
            int r = ckpt_zip_data_offset(s->src->zip, s->src->fd, s->src->file_size, s->zip_index,
                                         &jobs[i].in_off, err);
            if (r == CKPT_OK)
                jobs[i].raw = true;
            else if (r != CKPT_ERR_UNSUPPORTED)
                rc = r;
        }
    }
    crc_pool pool = {.jobs = jobs, .n = n};
    pthread_t th;
    bool threaded = false;
    if (rc == CKPT_OK && n) {
        pthread_mutex_init(&pool.mu, NULL);
        pthread_cond_init(&pool.cv, NULL);
        threaded = pthread_create(&th, NULL, crc_thread, &pool) == 0;
    }
    uint8_t *inline_buf = NULL;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        job *j = &jobs[i];
        const ckpt_storage *s = j->s;
        uint64_t at;
        uint32_t crc = 0;
        snprintf(name, sizeof(name), "%s/data/%zu", prefix, i);
        rc = ckpt_zipw_begin(w, name, s->nbytes, &at);
        if (rc)
            break;
        if (j->raw) {
            rc = ckpt_copy_range(j->fd, j->in_off, ckpt_zipw_fd(w), at, s->nbytes, err);
            if (rc)
                break;
            ckpt_zipw_advance(w, s->nbytes);
            if (threaded) {
                crc_wait(&pool, i);
            } else {
                if (!inline_buf && !(inline_buf = malloc(BUF_SIZE))) {
                    rc = ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
                    break;
                }
                j->status = crc_of_range(j->fd, j->in_off, s->nbytes, inline_buf, &j->crc, NULL);
            }
            if (j->status) {
                rc = ckpt_err(err, j->status, "cannot read storage '%s' of the input", s->key);
                break;
            }
            crc = j->crc;
            if (s->src->format == CKPT_FORMAT_PTH_ZIP && crc != s->crc32) {
                rc = ckpt_err(err, CKPT_ERR_FORMAT,
                              "record for storage '%s': CRC-32 mismatch (stored %08x, data %08x): "
                              "the input is corrupt", s->key, s->crc32, crc);
                break;
            }
        } else if (s->src_dtype != s->dtype) {
            sink_ctx c = {.w = w, .crc = (uint32_t)crc32(0L, Z_NULL, 0)};
            rc = ckpt_storage_stream(f, s, sink_write, &c);
            crc = c.crc;
            if (rc)
                break;
        } else {
            rc = copy_through_libzip(f, s, w, &crc);
            if (rc)
                break;
        }
        rc = ckpt_zipw_end(w, crc);
        /* start writing back what is copied so far, so that the fsync that
         * makes OUT durable has little left to wait for */
        if (rc == CKPT_OK && s->nbytes >= (1u << 20))
            sync_file_range(ckpt_zipw_fd(w), (off64_t)at, (off64_t)s->nbytes,
                            SYNC_FILE_RANGE_WRITE);
        done += s->nbytes;
        if (opt && opt->progress)
            opt->progress(opt->user, done, total);
    }
    if (threaded) {
        pthread_mutex_lock(&pool.mu);
        pool.cancel = true;
        pthread_mutex_unlock(&pool.mu);
        pthread_join(th, NULL);
    }
    if (n) {
        pthread_mutex_destroy(&pool.mu);
        pthread_cond_destroy(&pool.cv);
    }
    free(inline_buf);
    free(jobs);
    CKPT_FORWARD(rc);
    snprintf(name, sizeof(name), "%s/version", prefix);
    CKPT_FORWARD(write_small(w, name, "3\n", 2));
    return ckpt_zipw_finish(w);
}

CKPT_API int ckpt_file_write(ckpt_file *f, const char *path, const ckpt_write_options *opt)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !path || !f->root)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (strcmp(path, "-") == 0)
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "refusing to write a binary checkpoint to standard output");
    if (!(opt && (opt->flags & CKPT_WRITE_IN_PLACE)) && same_file(f, path))
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "'%s' is the input file; use --in-place to replace it", path);

    size_t plen = strlen(path);
    if ((opt && opt->shard_size) || (plen > 11 && strcmp(path + plen - 11, ".index.json") == 0))
        return ckpt_sharded_write(f, path, opt);
    return ckpt_file_write_one(f, path, opt);
}

int ckpt_file_write_one(ckpt_file *f, const char *path, const ckpt_write_options *opt)
{
    bool in_place = same_file(f, path);
    char *prefix = archive_prefix(path);
    ckpt_out out;
    int rc = prefix ? ckpt_out_open(&out, path, &f->err)
                    : ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    if (rc != CKPT_OK && prefix)
        ckpt_out_abort(&out); /* frees what a failed open allocated */
    if (rc == CKPT_OK) {
        /* replacing the input keeps its permissions, as sed -i does */
        if (in_place && fchmod(out.fd, (mode_t)(f->mode & 07777)) != 0)
            rc = ckpt_err(&f->err, CKPT_ERR_IO, "cannot set the mode of '%s': %s", path,
                          strerror(errno));
        ckpt_format fmt = opt ? opt->format : CKPT_FORMAT_UNKNOWN;
        if (rc == CKPT_OK && fmt == CKPT_FORMAT_SAFETENSORS) {
            rc = ckpt_safetensors_write(f, out.fd, opt);
        } else if (rc == CKPT_OK && fmt == CKPT_FORMAT_PTH_LEGACY) {
            rc = ckpt_pth_legacy_write(f, out.fd, opt);
        } else if (rc == CKPT_OK) {
            ckpt_pickle_out pk;
            rc = ckpt_pickle_write(f, f->root, &pk, &f->err);
            ckpt_zipw *w = rc ? NULL : ckpt_zipw_new(out.fd, &f->err);
            if (rc == CKPT_OK)
                rc = w ? write_records(f, w, prefix, &pk, opt) : CKPT_ERR_NOMEM;
            ckpt_zipw_free(w);
            ckpt_pickle_out_free(&pk);
        }
        if (rc == CKPT_OK)
            rc = ckpt_out_commit(&out, &f->err);
        if (rc != CKPT_OK)
            ckpt_out_abort(&out);
    }
    free(prefix);
    return rc;
}
