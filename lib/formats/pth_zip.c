/* pth_zip.c - torch.save's zip layout (torch >= 1.6), walked and read the way
 * torch reads it (torch's zip reader: torch_zip.c; doc/pth-format.md
 * section 1) and written as torch.save writes it. */
#include "formats/format.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* torch.load parses .storage_alignment with int() whenever it is there */
static int check_alignment(ckpt_file *f)
{
    int64_t i = ckpt_file_record_find(f, ".storage_alignment");
    if (i < 0)
        return CKPT_OK;
    char buf[32];
    CKPT_FORWARD(ckpt_file_record_text(f, i, buf, sizeof(buf)));
    char *end;
    errno = 0;
    (void)strtoll(buf, &end, 10);
    while (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r')
        end++;
    CKPT_RETURN_IF(end == buf || *end || errno, &f->err, CKPT_ERR_FORMAT,
                   "record '.storage_alignment' does not hold a number (torch.load fails on it)");
    return CKPT_OK;
}

/* torch 2.x swaps each storage by the element size of its persistent id's
 * type, which is 1 for an untyped storage: the newer dtypes of a big-endian
 * file (uint16, ...) come out unswapped.  ckpt reads their true values. */
static int note_unswapped(ckpt_file *f, size_t first)
{
    for (size_t k = first; f->cur_src->big_endian && k < f->nstorages; k++) {
        const ckpt_storage *s = f->storages[k];
        if (strcmp(s->type_name, "UntypedStorage") == 0 && ckpt_dtype_swap_unit(s->dtype) > 1)
            return ckpt_file_notice_add(f, "big-endian %s storage '%s' (and any like it): torch "
                                           "2.15 reads it without swapping its bytes, ckpt gives "
                                           "the values the file means",
                                        ckpt_dtype_name(s->dtype), s->key) < 0
                       ? ckpt_oom(&f->err)
                       : CKPT_OK;
    }
    return CKPT_OK;
}

/* Every storage the pickle added to the table (from FIRST on) must have its
 * record, of its exact size. */
static int locate_storages(ckpt_file *f, size_t first)
{
    for (size_t k = first; k < f->nstorages; k++) {
        ckpt_storage *s = f->storages[k];
        /* PREFIX/data/KEY put together by hand: two snprintf calls a storage
         * were a tenth of opening 10,000 of them */
        const char *prefix = f->cur_src->prefix;
        size_t np = strlen(prefix), nk = strlen(s->src_key);
        char full[1024];
        if (np + nk + 7 > sizeof(full))
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage key too long");
        memcpy(full, prefix, np);
        memcpy(full + np, "/data/", 6);
        memcpy(full + np + 6, s->src_key, nk + 1);
        const char *name = full + np + 1;
        int64_t i = ckpt_zip_find(f->cur_src->zip, full);
        CKPT_RETURN_IF(i < 0, &f->err, CKPT_ERR_FORMAT, "storage '%s' has no record '%s/%s'",
                       s->key, f->cur_src->prefix, name);
        /* torch's miniz refuses to extract it ("invalid header or archive is
         * corrupted"); deferred, the first read of its bytes checks it
         * (checkpoint/tensor_data.c), so that opening reads no data pages */
        if (!f->defer_record_checks)
            CKPT_FORWARD(ckpt_zip_local_check(f->cur_src->zip, i, &f->err));
        uint64_t size = ckpt_zip_size(f->cur_src->zip, i);
        CKPT_RETURN_IF(size != s->nbytes, &f->err, CKPT_ERR_FORMAT,
                       "record '%s/%s' is %llu bytes but storage '%s' (%lld x %s) needs %llu",
                       f->cur_src->prefix, name, (unsigned long long)size, s->key, (long long)s->numel,
                       ckpt_dtype_name(s->dtype), (unsigned long long)s->nbytes);
        s->loc = CKPT_LOC_ZIP_RECORD;
        s->big_endian = f->cur_src->big_endian;
        s->zip_index = i;
        s->has_crc = ckpt_zip_has_crcs(f->cur_src->zip);
        s->crc32 = ckpt_zip_crc(f->cur_src->zip, i);
    }
    return CKPT_OK;
}

/* torch.serialization.skip_data (torch 2.4+) writes each storage record
 * through write_record_metadata: its size kept, its bytes zeros until a
 * later pass fills them in (through torch.load(mmap=True) with MAP_SHARED,
 * or at the offsets), and its CRC-32 0 in the descriptor and the central
 * directory, while data.pkl, version and the other records carry theirs
 * (doc/torch2-format.md 1.4).  torch never checks a CRC, so it loads them.
 * That is the mark: every storage record with bytes has CRC 0.  A zero CRC
 * beside computed ones among the storage records is no torch writer's: it
 * stays checked, and fails. */
static int note_skip_data(ckpt_file *f, ckpt_source *src, size_t first)
{
    if (!ckpt_zip_has_crcs(src->zip))
        return CKPT_OK; /* compute_crc32 off: every record unchecked, said already */
    size_t zero = 0;
    for (size_t k = first; k < f->nstorages; k++) {
        const ckpt_storage *s = f->storages[k];
        if (s->loc != CKPT_LOC_ZIP_RECORD || ckpt_zip_size(src->zip, s->zip_index) == 0)
            continue;
        if (ckpt_zip_crc(src->zip, s->zip_index) != 0)
            return CKPT_OK;
        zero++;
    }
    if (!zero)
        return CKPT_OK;
    for (size_t k = first; k < f->nstorages; k++) {
        ckpt_storage *s = f->storages[k];
        if (s->loc == CKPT_LOC_ZIP_RECORD) {
            ckpt_zip_crc_unrecorded(src->zip, s->zip_index);
            s->has_crc = false;
        }
    }
    char who[300] = "";
    if (src != &f->main)
        snprintf(who, sizeof(who), "'%.280s' ", src->path);
    if (ckpt_file_notice_add(f, "%s%s %zu storage record%s CRC-32 0, as "
                                "torch.serialization.skip_data writes them: their bytes, filled "
                                "in after the save or left zeros, are not checked", who,
                             zero == 1 ? "its" : "all its", zero, zero == 1 ? " has" : "s have") < 0)
        return ckpt_oom(&f->err);
    return CKPT_OK;
}

/* torch.load of a zip: its reader's checks, then data.pkl (torch_zip.c). */
static int pth_zip_walk(ckpt_walk *w, ckpt_source *src, ckpt_error *err)
{
    return ckpt_torch_zip_walk(w, src, false, err);
}

typedef struct zip_read {
    ckpt_file *f;
    ckpt_value **root;
    size_t nbefore; /* this file's storages (a shard adds to others) start here */
} zip_read;

/* The archive as the walk opened it (its checks passed), then data.pkl. */
static int read_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **out)
{
    zip_read *r = w->user;
    ckpt_file *f = r->f;
    (void)out;
    /* the walk checked every record is in the prefix: the source's, for
     * ckpt_file_record_find (and the main file's, for inspect) */
    f->cur_src->prefix = ckpt_arena_strndup(&f->arena, w->prefix, w->prefix_len);
    if (!f->cur_src->prefix)
        return ckpt_oom(&f->err);
    CKPT_FORWARD(check_alignment(f));
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, p->name);
    r->nbefore = f->nstorages;
    return ckpt_pickle_load(&ctx, p->buf, p->len, r->root, used, &f->err);
}

static int pth_zip_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    zip_read r = {.f = f, .root = root};
    ckpt_walk w = {.pickle = read_pickle, .user = &r, .strict = true, .keep = true,
                   .pickle_limit = f->limits[CKPT_LIMIT_PICKLE_BYTES]};
    CKPT_FORWARD(pth_zip_walk(&w, src, &f->err));
    if (!ckpt_zip_has_crcs(src->zip)) {
        /* a shard is named; the file itself is in every message already */
        char who[300] = "";
        if (src != &f->main)
            snprintf(who, sizeof(who), "'%.280s' ", src->path);
        if (ckpt_file_notice_add(f, "%swritten without CRC-32s (torch's compute_crc32 off): "
                                    "its bytes are not checked", who) < 0)
            return ckpt_oom(&f->err);
    }
    if (!f->defer_record_checks)
        ckpt_zip_prefetch_locals(f->cur_src->zip);
    CKPT_FORWARD(locate_storages(f, r.nbefore));
    CKPT_FORWARD(note_skip_data(f, src, r.nbefore));
    return note_unswapped(f, r.nbefore);
}

/* ---- every reader's reading (ckpt scan) ---------------------------------------- */

/* torch finds records case-insensitively (miniz), so "DATA.PKL" loads too */
static bool ends_with_nocase(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcasecmp(s + a - b, suffix) == 0;
}

/* Whether two readers' entries hold the same bytes (each record is handed
 * out once, whoever reads it). */
static bool same_record(const ckpt_zip_entry *a, const ckpt_zip_entry *b)
{
    return a->data_at == b->data_at && a->csize == b->csize && a->method == b->method;
}

static int readings(ckpt_walk *w, int fd, uint64_t base, ckpt_zip_dir *d, const char *label,
                    ckpt_error *err)
{
    for (size_t i = 0; i < ckpt_zip_dir_finding_count(d); i++)
        if (w->finding)
            w->finding(w, ckpt_zip_dir_finding(d, i));
    int rc = CKPT_OK;
    bool found = false;
    ckpt_error first = {0};
    /* torch 2.x with compute_crc32 off writes CRC 0 for every record: no
     * corruption, as ckpt's zip reader takes it */
    bool no_crcs = false;
    for (size_t i = 0; i < ckpt_zip_dir_count(d, CKPT_ZIP_READER_TORCH); i++) {
        const ckpt_zip_entry *e = ckpt_zip_dir_entry(d, CKPT_ZIP_READER_TORCH, i);
        if (e && e->usize) {
            if (e->crc != 0) {
                no_crcs = false;
                break;
            }
            no_crcs = true;
        }
    }
    size_t total = 0;
    for (int r = 0; r < CKPT_ZIP_READERS; r++)
        total += ckpt_zip_dir_count(d, (ckpt_zip_reader)r);
    const ckpt_zip_entry **done = malloc((total ? total : 1) * sizeof *done);
    if (!done)
        return ckpt_oom(err);
    size_t ndone = 0;
    for (int r = 0; r < CKPT_ZIP_READERS; r++) {
        if (!ckpt_zip_dir_reads(d, (ckpt_zip_reader)r)) {
            if (r == CKPT_ZIP_READER_TORCH && rc == CKPT_OK) {
                rc = ckpt_err(err, CKPT_ERR_FORMAT, "torch's zip reader refuses it: %s",
                              ckpt_zip_dir_refusal(d, (ckpt_zip_reader)r));
                first = *err;
            }
            continue;
        }
        /* every record, even after one fails: a payload may sit in a later one */
        for (size_t i = 0; i < ckpt_zip_dir_count(d, (ckpt_zip_reader)r); i++) {
            const ckpt_zip_entry *e = ckpt_zip_dir_entry(d, (ckpt_zip_reader)r, i);
            if (!e || !e->name || !ends_with_nocase(e->name, ".pkl"))
                continue;
            found = true;
            bool seen = false;
            for (size_t k = 0; k < ndone && !seen; k++)
                seen = same_record(done[k], e);
            if (seen)
                continue;
            done[ndone++] = e;
            char name[CKPT_ERRMSG_MAX];
            const char *in = label ? label : "", *sep = label ? ": " : "";
            if (r == CKPT_ZIP_READER_TORCH)
                snprintf(name, sizeof name, "%s%s%s", in, sep, e->name);
            else
                snprintf(name, sizeof name, "%s%s%s (as %s reads it)", in, sep, e->name,
                         ckpt_zip_reader_name((ckpt_zip_reader)r));
            uint8_t *buf = NULL;
            size_t len = 0;
            bool crc_ok = true;
            ckpt_error rerr = {0};
            int rr = ckpt_zip_dir_read(d, fd, (ckpt_zip_reader)r, i,
                                       w->pickle_limit ? w->pickle_limit : UINT64_MAX, &buf,
                                       &len, &crc_ok, &rerr);
            int sr = CKPT_OK;
            if (buf && len) {
                /* in the file as is only when stored (entries count from BASE) */
                uint64_t at = e->method == 0 && e->data_at != UINT64_MAX ? base + e->data_at
                                                                          : UINT64_MAX;
                ckpt_walk_pickle p = {.index = (int)ndone - 1, .name = name, .offset = at,
                                      .buf = buf, .len = len, .pid_fields = 5};
                size_t used = 0;
                ckpt_value *root = NULL;
                sr = w->pickle(w, &p, &used, &root);
            }
            free(buf);
            if (no_crcs)
                crc_ok = true;
            if (rr == CKPT_OK && !crc_ok && r != CKPT_ZIP_READER_TORCH)
                continue; /* that reader refuses the record: it unpickles nothing */
            if (rr == CKPT_ERR_LIMIT) {
                char msg[CKPT_ERRMSG_MAX];
                snprintf(msg, sizeof msg, "%s", rerr.msg);
                ckpt_err_clear(&rerr);
                ckpt_err(&rerr, rr, "%s (--max-pickle-bytes)", msg);
            }
            if (rr == CKPT_OK && !crc_ok)
                rr = ckpt_err(&rerr, CKPT_ERR_FORMAT, "%s: CRC-32 mismatch (torch does not "
                              "check it: the globals listed are those it would meet)", e->name);
            if (rr != CKPT_OK && rc == CKPT_OK) {
                rc = rr;
                first = rerr;
            } else if (sr != CKPT_OK && rc == CKPT_OK) {
                rc = sr;
                first = *err;
            }
            ckpt_err_clear(err);
        }
    }
    free(done);
    if (rc != CKPT_OK)
        *err = first;
    if (rc == CKPT_OK && !found)
        rc = ckpt_err(err, CKPT_ERR_FORMAT, "a zip archive without a .pkl record");
    return rc;
}

/* torch.load's _is_torchscript_zip over torch's reading of D: the folder is
 * the first name's up to its '/' (PyTorchStreamReader). */
static bool torch_sees_constants(const ckpt_zip_dir *d)
{
    if (!ckpt_zip_dir_reads(d, CKPT_ZIP_READER_TORCH) || !ckpt_zip_dir_torch_sniffs(d))
        return false;
    size_t n = ckpt_zip_dir_count(d, CKPT_ZIP_READER_TORCH);
    const ckpt_zip_entry *first = n ? ckpt_zip_dir_entry(d, CKPT_ZIP_READER_TORCH, 0) : NULL;
    const char *slash = first && first->name ? strchr(first->name, '/') : NULL;
    for (size_t i = 0; slash && i < n; i++) {
        const ckpt_zip_entry *e = ckpt_zip_dir_entry(d, CKPT_ZIP_READER_TORCH, i);
        if (e && e->name && ckpt_torch_zip_is_constants(e->name, (size_t)(slash - first->name)))
            return true;
    }
    return false;
}

int ckpt_pth_zip_readings(ckpt_walk *w, int fd, uint64_t base, uint64_t size, const char *label,
                          bool torch_only, ckpt_error *err)
{
    memset(&w->stop, 0, sizeof w->stop);
    w->stop.pickle = -1;
    w->opened = false;
    ckpt_zip_dir *d;
    CKPT_FORWARD(torch_only ? ckpt_zip_dir_open_torch(fd, base, size, &d, err)
                            : ckpt_zip_dir_open_at(fd, base, size, &d, err));
    w->opened = true;
    w->stop.torchscript = torch_sees_constants(d);
    int rc = readings(w, fd, base, d, label, err);
    ckpt_zip_dir_free(d);
    return rc;
}

static bool pth_zip_sniff(const uint8_t *head, size_t n)
{
    return n >= 4 && memcmp(head, "PK\x03\x04", 4) == 0;
}

/* ---- writing: as torch.save's zip does ------------------------------------------
 *
 * The pickle is built in memory (it is small); storage bytes go from the
 * input file to the output with copy_file_range where the kernel allows (a
 * bounded buffer otherwise), while a second thread reads the same input
 * ranges and computes their CRC-32: the CRC the output needs, and a check
 * of the input's own.  Memory stays bounded whatever the checkpoint size.
 */
/* One storage to copy: where its bytes are in the input. */
typedef struct job {
    const ckpt_storage *s;
    int fd;            /* the source file (shards differ) */
    bool raw;          /* bytes at in_off in the input file, uncompressed */
    bool pieces;       /* a PIECES storage copied piece by piece (a folder's chunks) */
    size_t bad_piece;  /* pieces: the one whose CRC-32 differs */
    uint64_t in_off;
    uint32_t crc;      /* computed by the CRC thread (raw jobs) */
    int status;
} job;

typedef struct crc_pool {
    const ckpt_file *f;
    job *jobs;
    size_t n, done;
    bool cancel;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} crc_pool;

static void *crc_thread(void *arg)
{
    crc_pool *p = arg;
    uint8_t *buf = malloc(CKPT_IO_BUF);
    for (size_t i = 0; i < p->n; i++) {
        job *j = &p->jobs[i];
        int st = CKPT_OK;
        uint32_t crc = 0;
        if (!buf)
            st = CKPT_ERR_NOMEM;
        else if (j->raw)
            st = ckpt_crc_range_buf(j->fd, j->in_off, j->s->nbytes, buf, &crc, &p->cancel);
        else if (j->pieces)
            st = ckpt_storage_pieces_crc(p->f, j->s, buf, &crc, &j->bad_piece, &p->cancel);
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

/*
 * Writeback started beside the copy: the writer posts each big record's
 * range and goes on copying, while this thread asks the kernel to start
 * writing it out (sync_file_range, which allocates the blocks and queues
 * the I/O, milliseconds per record that the copy need not wait for), so
 * that the fsync that makes OUT durable has little left to wait for.
 */
typedef struct flusher {
    int fd;
    uint64_t ranges[64][2]; /* a ring of (offset, length) not started yet */
    size_t head, tail;      /* tail - head ranges are waiting */
    bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} flusher;

static void *flush_thread(void *arg)
{
    flusher *fl = arg;
    pthread_mutex_lock(&fl->mu);
    for (;;) {
        while (fl->head == fl->tail && !fl->stop)
            pthread_cond_wait(&fl->cv, &fl->mu);
        if (fl->head == fl->tail)
            break;
        uint64_t at = fl->ranges[fl->head % 64][0], n = fl->ranges[fl->head % 64][1];
        fl->head++;
        pthread_cond_broadcast(&fl->cv); /* a slot is free */
        pthread_mutex_unlock(&fl->mu);
        sync_file_range(fl->fd, (off64_t)at, (off64_t)n, SYNC_FILE_RANGE_WRITE);
        pthread_mutex_lock(&fl->mu);
    }
    pthread_mutex_unlock(&fl->mu);
    return NULL;
}

/* Post a range to FL's thread (waiting for a slot when 64 are queued);
 * without the thread, start its writeback here. */
static void flush_post(flusher *fl, bool threaded, uint64_t at, uint64_t n)
{
    if (!threaded) {
        sync_file_range(fl->fd, (off64_t)at, (off64_t)n, SYNC_FILE_RANGE_WRITE);
        return;
    }
    pthread_mutex_lock(&fl->mu);
    while (fl->tail - fl->head == 64)
        pthread_cond_wait(&fl->cv, &fl->mu);
    fl->ranges[fl->tail % 64][0] = at;
    fl->ranges[fl->tail % 64][1] = n;
    fl->tail++;
    pthread_cond_signal(&fl->cv);
    pthread_mutex_unlock(&fl->mu);
}

/* Storage bytes that are not raw in a file (cast, deflated) are streamed
 * into the record: ckpt_storage_stream checks the input's CRC. */
typedef struct sink_ctx {
    ckpt_zipw *w;
    uint32_t crc;
} sink_ctx;

static int sink_write(void *user, const uint8_t *p, size_t n)
{
    sink_ctx *c = user;
    c->crc = ckpt_crc32_update(c->crc, p, n);
    return ckpt_zipw_write(c->w, p, n);
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
    return ckpt_zipw_end(w, ckpt_crc32_update(0, data, n));
}

static int write_records(ckpt_file *f, ckpt_zipw *w, const char *prefix, const ckpt_pickle_out *pk,
                         const ckpt_write_options *opt)
{
    char name[1200];
    ckpt_error *err = &f->err;
    snprintf(name, sizeof(name), "%s/data.pkl", prefix);
    CKPT_FORWARD(write_small(w, name, pk->buf, pk->len));
    /* torch 2.x's records: the promise of its own layout (data/0, 1, ... in
     * first-reference order, back to back, aligned as miniz aligns them:
     * container/zip_write.c), which lets it compute offsets for mmap */
    snprintf(name, sizeof(name), "%s/.format_version", prefix);
    CKPT_FORWARD(write_small(w, name, "1", 1));
    snprintf(name, sizeof(name), "%s/.storage_alignment", prefix);
    CKPT_FORWARD(write_small(w, name, "64", 2));
    /* a big-endian input keeps its bytes and its byte order, unless a cast or
     * a little-endian storage beside them makes the output little-endian */
    size_t n = pk->norder;
    bool big = n > 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_storage *s = f->storages[pk->order[i]];
        big = big && s->big_endian && s->dtype == s->src_dtype;
    }
    snprintf(name, sizeof(name), "%s/byteorder", prefix);
    CKPT_FORWARD(write_small(w, name, big ? "big" : "little", big ? 3 : 6));

    job *jobs = calloc(n ? n : 1, sizeof(*jobs));
    if (!jobs)
        return ckpt_oom(err);
    uint64_t total = 0, done = 0;
    int rc = CKPT_OK;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        const ckpt_storage *s = f->storages[pk->order[i]];
        jobs[i].s = s;
        total += s->nbytes;
        /* raw bytes are copied by the kernel; the rest (cast, deflated) streamed */
        int r = ckpt_storage_raw_range(f, s, big, &jobs[i].fd, &jobs[i].in_off);
        if (r == CKPT_OK)
            jobs[i].raw = true;
        else if (r != CKPT_ERR_UNSUPPORTED)
            rc = r;
        else if (s->loc == CKPT_LOC_PIECES && s->dtype == s->src_dtype && !s->big_endian)
            jobs[i].pieces = true; /* copied by the kernel, CRC-checked beside */
    }
    crc_pool pool = {.f = f, .jobs = jobs, .n = n};
    pthread_t th;
    bool threaded = false;
    if (n) {
        pthread_mutex_init(&pool.mu, NULL);
        pthread_cond_init(&pool.cv, NULL);
        threaded = rc == CKPT_OK && pthread_create(&th, NULL, crc_thread, &pool) == 0;
    }
    flusher fl = {.fd = ckpt_zipw_fd(w)};
    pthread_t fth;
    bool flushing = false;
    if (n) {
        pthread_mutex_init(&fl.mu, NULL);
        pthread_cond_init(&fl.cv, NULL);
        flushing = rc == CKPT_OK && pthread_create(&fth, NULL, flush_thread, &fl) == 0;
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
        if (j->raw || (j->pieces && threaded)) {
            rc = j->raw ? ckpt_copy_range(j->fd, j->in_off, ckpt_zipw_fd(w), at, s->nbytes, err)
                        : ckpt_storage_copy_pieces(f, s, ckpt_zipw_fd(w), at);
            if (rc)
                break;
            ckpt_zipw_advance(w, s->nbytes);
            if (threaded) {
                crc_wait(&pool, i);
            } else {
                if (!inline_buf && !(inline_buf = malloc(CKPT_IO_BUF))) {
                    rc = ckpt_oom(err);
                    break;
                }
                j->status = ckpt_crc_range_buf(j->fd, j->in_off, s->nbytes, inline_buf, &j->crc, NULL);
            }
            if (j->pieces && j->status == CKPT_ERR_FORMAT) {
                const ckpt_piece *bp = &s->pieces[j->bad_piece];
                rc = ckpt_err(err, CKPT_ERR_FORMAT, "storage '%s': CRC-32 mismatch in '%s' "
                              "(bytes %llu..%llu): the input is corrupt", s->key,
                              bp->src ? bp->src->path : "memory",
                              (unsigned long long)bp->file_offset,
                              (unsigned long long)(bp->file_offset + bp->nbytes));
                break;
            }
            if (j->status) {
                rc = ckpt_err(err, j->status, "cannot read storage '%s' of the input", s->key);
                break;
            }
            crc = j->crc;
            if (s->has_crc && crc != s->crc32) {
                rc = ckpt_err(err, CKPT_ERR_FORMAT,
                              "record for storage '%s': CRC-32 mismatch (stored %08x, data %08x): "
                              "the input is corrupt", s->key, s->crc32, crc);
                break;
            }
        } else {
            sink_ctx c = {.w = w, .crc = 0};
            rc = ckpt_storage_stream(f, s, big, sink_write, &c);
            crc = c.crc;
            if (rc)
                break;
        }
        rc = ckpt_zipw_end(w, crc);
        if (rc == CKPT_OK && s->nbytes >= (1u << 20))
            flush_post(&fl, flushing, at, s->nbytes);
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
    if (flushing) {
        pthread_mutex_lock(&fl.mu);
        fl.stop = true; /* (what is queued is still started) */
        pthread_cond_signal(&fl.cv);
        pthread_mutex_unlock(&fl.mu);
        pthread_join(fth, NULL);
    }
    if (n) {
        pthread_mutex_destroy(&pool.mu);
        pthread_cond_destroy(&pool.cv);
        pthread_mutex_destroy(&fl.mu);
        pthread_cond_destroy(&fl.cv);
    }
    free(inline_buf);
    free(jobs);
    CKPT_FORWARD(rc);
    snprintf(name, sizeof(name), "%s/version", prefix);
    CKPT_FORWARD(write_small(w, name, "3\n", 2));
    /* 40 digits, as torch writes: a hash of the record names, then one of
     * their CRC-32s (torch only logs it; ours are FNV-1a, not its hashes) */
    uint64_t h1 = CKPT_FNV1A_BASIS, h2 = CKPT_FNV1A_BASIS;
    for (size_t i = 0; i < ckpt_zipw_count(w); i++) {
        const char *rn = ckpt_zipw_name(w, i);
        const char *c = strchr(rn, '/') ? strchr(rn, '/') + 1 : rn;
        h1 = ckpt_fnv1a_add(h1, c, strlen(c));
        uint32_t crc = ckpt_zipw_crc(w, i);
        const uint8_t le[4] = {(uint8_t)crc, (uint8_t)(crc >> 8), (uint8_t)(crc >> 16),
                               (uint8_t)(crc >> 24)};
        h2 = ckpt_fnv1a_add(h2, le, sizeof le);
    }
    char id[48];
    snprintf(id, sizeof(id), "%020llu%020llu", (unsigned long long)(h1 % 10000000000000000000u),
             (unsigned long long)(h2 % 10000000000000000000u));
    snprintf(name, sizeof(name), "%s/.data/serialization_id", prefix);
    CKPT_FORWARD(write_small(w, name, id, 40));
    return ckpt_zipw_finish(w);
}

static int pth_zip_write(ckpt_file *f, int out, const char *path, const ckpt_write_options *opt)
{
    /* its module objects are the archive's classes, useless without its code */
    CKPT_RETURN_IF(ckpt_root_is_torchscript(f), &f->err, CKPT_ERR_UNSUPPORTED,
                   "a TorchScript archive is not written back as a torch.save file: "
                   "'ckpt extract' writes its state dict");
    char *prefix = archive_prefix(path);
    if (!prefix)
        return ckpt_oom(&f->err);
    ckpt_pickle_out pk;
    int rc = ckpt_pickle_write(&f->arena, f->nstorages, f->root, &pk, &f->err);
    ckpt_zipw *w = rc ? NULL : ckpt_zipw_new(out, &f->err);
    if (rc == CKPT_OK)
        rc = w ? write_records(f, w, prefix, &pk, opt) : CKPT_ERR_NOMEM;
    ckpt_zipw_free(w);
    ckpt_pickle_out_free(&pk);
    free(prefix);
    return rc;
}

/* ---- in place: a new pickle record and directory, no storage moved -------------
 *
 * Only a rewrite of the pickle qualifies: every storage it references is a
 * record of this very file, of its own dtype and size, and keeps its key
 * (so its record keeps its name, its place and its 64-byte alignment, and
 * torch's mmap=True still maps it).  Anything else (a cast, a storage from
 * elsewhere, a zip laid out otherwise, a record that another writer left
 * off a 64-byte boundary) is CKPT_ERR_UNSUPPORTED with the reason in
 * RES->why: the caller then writes a new file instead.  So is a
 * rewrite after which the dead bytes of earlier rewrites would pass the
 * bound (pth_zip_dead_max): the new file it writes instead is compact.
 */
#define DEAD_FLOOR (64ull << 20)

/* The bound on dead bytes in a file of SIZE bytes: max(64 MiB, 5%).
 * CKPT_INPLACE_DEAD_MAX (bytes) replaces it, for the test suite only. */
static uint64_t pth_zip_dead_max(uint64_t size)
{
    const char *t = getenv("CKPT_INPLACE_DEAD_MAX");
    if (t && *t)
        return strtoull(t, NULL, 10);
    return size / 20 > DEAD_FLOOR ? size / 20 : DEAD_FLOOR;
}

static int not_here(ckpt_write_result *res, ckpt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int not_here(ckpt_write_result *res, ckpt_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (res)
        vsnprintf(res->why, sizeof(res->why), fmt, ap);
    va_end(ap);
    ckpt_err_clear(err); /* the reason replaces the cause */
    return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "%s", res ? res->why : "not in place");
}

static int pth_zip_write_in_place(ckpt_file *f, int fd, const char *path,
                                  const ckpt_write_options *opt, ckpt_write_result *res)
{
    (void)path;
    (void)opt;
    ckpt_error *err = &f->err;
    if (f->format != CKPT_FORMAT_PTH_ZIP || f->nshards || !f->main.zip || !f->main.prefix)
        return not_here(res, err, "the input is not one pth-zip file");
    if (ckpt_root_is_torchscript(f))
        return not_here(res, err, "a TorchScript archive");
    for (size_t i = 0; i < f->nstorages; i++) {
        const ckpt_storage *s = f->storages[i];
        if (s->src != &f->main || s->loc != CKPT_LOC_ZIP_RECORD || s->dtype != s->src_dtype ||
            s->nbytes != s->src_nbytes || !s->src_key)
            return not_here(res, err, "storage '%s' changes its bytes or is not a record of the file",
                            s->key);
    }
    ckpt_zip_layout *l;
    int rc = ckpt_zip_layout_read(fd, &l, err);
    if (rc == CKPT_ERR_UNSUPPORTED) {
        char why[CKPT_ERRMSG_MAX];
        snprintf(why, sizeof(why), "%s", err->msg);
        return not_here(res, err, "its zip layout: %s", why);
    }
    CKPT_FORWARD(rc);
    /* the file locked now must be the file that was read */
    size_t n = ckpt_zip_layout_count(l), pkl = SIZE_MAX;
    char want[1100];
    snprintf(want, sizeof(want), "%s/data.pkl", f->main.prefix);
    bool same = n == (size_t)ckpt_zip_count(f->main.zip);
    for (size_t i = 0; same && i < n; i++) {
        const char *name = ckpt_zip_name(f->main.zip, (int64_t)i);
        same = strcmp(ckpt_zip_layout_name(l, i), name) == 0 &&
               ckpt_zip_layout_crc(l, i) == ckpt_zip_crc(f->main.zip, (int64_t)i) &&
               ckpt_zip_layout_size(l, i) == ckpt_zip_size(f->main.zip, (int64_t)i);
        if (same && strcmp(name, want) == 0)
            pkl = pkl == SIZE_MAX ? i : SIZE_MAX - 1;
    }
    if (!same) {
        ckpt_zip_layout_free(l);
        return ckpt_err(err, CKPT_ERR_IO, "the file changed since it was read (another program "
                                          "wrote it); nothing was written");
    }
    if (pkl >= n) {
        ckpt_zip_layout_free(l);
        return not_here(res, err, "no single record '%s'", want);
    }
    /* what every new file guarantees, an edit keeps (another writer's zip
     * may not have it) */
    for (size_t i = 0; i < f->nstorages; i++) {
        const ckpt_storage *s = f->storages[i];
        int in_fd;
        uint64_t at = 0;
        rc = ckpt_storage_raw_range(f, s, true, &in_fd, &at);
        if (rc == CKPT_OK && at % 64)
            rc = not_here(res, err, "the record of storage '%s' starts at byte %llu, not on a "
                                    "64-byte boundary: a new file aligns it",
                          s->key, (unsigned long long)at);
        else if (rc == CKPT_ERR_UNSUPPORTED)
            rc = not_here(res, err, "the record of storage '%s' is compressed", s->key);
        if (rc != CKPT_OK) {
            ckpt_zip_layout_free(l);
            return rc;
        }
    }
    ckpt_pickle_out pk;
    rc = ckpt_pickle_write3(&f->arena, f->nstorages, f->root, CKPT_PICKLE_KEEP_KEYS, &pk, err);
    if (rc == CKPT_OK) {
        ckpt_zip_replace_result r;
        uint64_t size = ckpt_zip_layout_file_size(l);
        rc = ckpt_zip_replace(fd, l, pkl, pk.buf, pk.len, pth_zip_dead_max(size), &r, err);
        if (res) {
            res->bytes_written = r.written;
            res->dead_bytes = r.dead;
            res->offset = r.offset;
            res->old_size = r.old_size;
            res->new_size = r.new_size;
            res->direct = r.direct;
        }
        if (rc == CKPT_ERR_UNSUPPORTED && r.over_bound)
            not_here(res, err, "compacting: %llu dead bytes would be over the bound of %llu "
                               "(max(64 MiB, 5%% of the file))",
                     (unsigned long long)r.dead, (unsigned long long)pth_zip_dead_max(size));
        ckpt_pickle_out_free(&pk);
    }
    ckpt_zip_layout_free(l);
    return rc;
}

CKPT_API int ckpt_file_dead_bytes(ckpt_file *f, uint64_t *out)
{
    *out = 0;
    if (!ckpt_file_valid(f) || f->format != CKPT_FORMAT_PTH_ZIP || f->main.fd < 0)
        return CKPT_ERR_UNSUPPORTED;
    ckpt_zip_layout *l;
    ckpt_error e = {0};
    int rc = ckpt_zip_layout_read(f->main.fd, &l, &e);
    if (rc != CKPT_OK)
        return rc;
    *out = ckpt_zip_layout_dead(l);
    ckpt_zip_layout_free(l);
    return CKPT_OK;
}

const ckpt_format_desc ckpt_format_pth_zip = {
    .id = CKPT_FORMAT_PTH_ZIP,
    .name = "pth-zip",
    .sniff = pth_zip_sniff,
    .read = pth_zip_read,
    .walk = pth_zip_walk,
    .write = pth_zip_write,
    .crcs_pieces = true,
    .write_in_place = pth_zip_write_in_place,
};
