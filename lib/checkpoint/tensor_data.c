/*
 * tensor_data.c - storage bytes wherever they are (the one place that reads
 * each kind of location; CRC-checked where the container keeps one), a
 * strided view gathered into C order, and per-tensor statistics.
 */
#include "checkpoint/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* N bytes from byte FROM of piece P of S. */
static int read_stored_piece(ckpt_file *f, const ckpt_storage *s, const ckpt_piece *p,
                             uint64_t from, uint8_t *buf, size_t n)
{
    if (p->mem) {
        memcpy(buf, p->mem + from, n);
        return CKPT_OK;
    }
    int fd = ckpt_source_fd(f, p->src);
    if (fd < 0)
        return CKPT_ERR_IO;
    int rc = ckpt_pread_all(fd, buf, n, p->file_offset + from);
    if (rc == CKPT_ERR_IO)
        return ckpt_err(&f->err, CKPT_ERR_IO, "reading storage '%s' from '%s': %s", s->key,
                        p->src->path, strerror(errno));
    if (rc)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s': '%s' is truncated", s->key,
                        p->src->path);
    return CKPT_OK;
}

static int read_pieces(ckpt_file *f, const ckpt_storage *s, uint64_t offset, uint8_t *buf,
                       size_t len)
{
    /* the first piece that ends after OFFSET */
    size_t lo = 0, hi = s->npieces;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ckpt_piece *m = &s->pieces[mid];
        if (m->dst_offset + m->nbytes <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; len > 0; i++) {
        if (i >= s->npieces)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s' is truncated", s->key);
        const ckpt_piece *p = &s->pieces[i];
        uint64_t skip = offset - p->dst_offset;
        size_t n = p->nbytes - skip < len ? (size_t)(p->nbytes - skip) : len;
        CKPT_FORWARD(read_stored_piece(f, s, p, skip, buf, n));
        if (p->has_crc && skip == 0 && n == p->nbytes && ckpt_crc32_update(0, buf, n) != p->crc32)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s': CRC-32 mismatch in '%s'", s->key,
                            p->src ? p->src->path : "memory");
        buf += n;
        offset += n;
        len -= n;
    }
    return CKPT_OK;
}

/* A zip record's local header, as torch's miniz checks it before it reads
 * the record: at open, or here at the first read when the handle defers it
 * (ckpt_file_set_defer_record_checks; the answer is kept per record). */
static int zip_local_checked(ckpt_file *f, const ckpt_storage *s)
{
    return ckpt_zip_local_check(s->src->zip, s->zip_index, &f->err);
}

/* The bytes as stored, whatever their order. */
static int read_stored(ckpt_file *f, const ckpt_storage *s, uint64_t offset, void *buf, size_t len)
{
    switch (s->loc) {
    case CKPT_LOC_PIECES:
        return read_pieces(f, s, offset, buf, len);
    case CKPT_LOC_ZIP_RECORD:
        CKPT_FORWARD(zip_local_checked(f, s));
        return ckpt_zip_read(s->src->zip, s->zip_index, offset, buf, len, &f->err);
    case CKPT_LOC_FILE_RANGE: {
        int rc = ckpt_pread_all(s->src->fd, buf, len, s->file_offset + offset);
        if (rc == CKPT_ERR_IO)
            return ckpt_err(&f->err, CKPT_ERR_IO, "reading storage '%s': %s", s->key,
                            strerror(errno));
        if (rc)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s' is truncated", s->key);
        return CKPT_OK;
    }
    default:
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s' has no bytes in the file", s->key);
    }
}

/* Does reading S's values mean reversing its bytes? */
static bool swapped(const ckpt_storage *s)
{
    return s->big_endian && ckpt_dtype_swap_unit(s->src_dtype) > 1;
}

CKPT_API int ckpt_storage_read(ckpt_file *f, const ckpt_storage *s, uint64_t offset, void *buf,
                               size_t len)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !s || (!buf && len))
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (offset > s->src_nbytes || len > s->src_nbytes - offset)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "read past the end of storage '%s'", s->key);
    size_t es = ckpt_dtype_bits(s->src_dtype) / 8;
    if (swapped(s) && (offset % es || len % es))
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "big-endian storage '%s' is read in whole %zu-byte elements", s->key, es);
    CKPT_FORWARD(read_stored(f, s, offset, buf, len));
    if (swapped(s))
        ckpt_dtype_byteswap(s->src_dtype, buf, len / es);
    return CKPT_OK;
}

int ckpt_storage_raw_range(ckpt_file *f, const ckpt_storage *s, bool as_stored, int *fd,
                           uint64_t *offset)
{
    if (s->dtype != s->src_dtype || (!as_stored && swapped(s)))
        return CKPT_ERR_UNSUPPORTED; /* cast or swapped: decoded on the way */
    if (s->loc == CKPT_LOC_PIECES)
        return CKPT_ERR_UNSUPPORTED; /* streamed: a folder's files open and close on demand,
                                      * so no descriptor outlives the read */
    *fd = s->src->fd;
    switch (s->loc) {
    case CKPT_LOC_FILE_RANGE:
        *offset = s->file_offset;
        return CKPT_OK;
    case CKPT_LOC_ZIP_RECORD: {
        CKPT_FORWARD(zip_local_checked(f, s));
        ckpt_error e = {0}; /* a deflated record is no error, just not raw */
        int rc = ckpt_zip_data_offset(s->src->zip, s->zip_index, offset, &e);
        if (rc != CKPT_OK && rc != CKPT_ERR_UNSUPPORTED)
            ckpt_err(&f->err, rc, "%s", e.msg);
        return rc;
    }
    default:
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s' has no bytes in the file", s->key);
    }
}

CKPT_API int ckpt_storage_file_range(ckpt_file *f, const ckpt_storage *s, const char **file,
                                    uint64_t *offset)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !s || !file || !offset)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (s->dtype != s->src_dtype || swapped(s))
        return CKPT_ERR_UNSUPPORTED;
    if (s->loc == CKPT_LOC_PIECES) { /* one piece of one file, whole: a range too */
        const ckpt_piece *p = s->npieces == 1 ? &s->pieces[0] : NULL;
        if (!p || p->mem || !p->src || !p->src->path || p->dst_offset != 0 ||
            p->nbytes != s->src_nbytes)
            return CKPT_ERR_UNSUPPORTED;
        *file = p->src->path;
        *offset = p->file_offset;
        return CKPT_OK;
    }
    if (s->loc != CKPT_LOC_FILE_RANGE && s->loc != CKPT_LOC_ZIP_RECORD)
        return CKPT_ERR_UNSUPPORTED; /* bytes held in memory, or none */
    if (!s->src || !s->src->path)
        return CKPT_ERR_UNSUPPORTED;
    int fd;
    int rc = ckpt_storage_raw_range(f, s, false, &fd, offset);
    if (rc != CKPT_OK)
        return rc;
    *file = s->src->path;
    return CKPT_OK;
}

int ckpt_storage_copy_pieces(ckpt_file *f, const ckpt_storage *s, int out, uint64_t out_off)
{
    if (s->loc != CKPT_LOC_PIECES || s->dtype != s->src_dtype || swapped(s))
        return CKPT_ERR_UNSUPPORTED;
    for (size_t i = 0; i < s->npieces; i++) {
        const ckpt_piece *p = &s->pieces[i];
        if (p->mem) {
            CKPT_FORWARD(ckpt_write_all(out, p->mem, (size_t)p->nbytes, out_off + p->dst_offset,
                                        &f->err));
            continue;
        }
        int fd = ckpt_source_fd(f, p->src);
        if (fd < 0)
            return CKPT_ERR_IO;
        CKPT_FORWARD(ckpt_copy_range(fd, p->file_offset, out, out_off + p->dst_offset, p->nbytes,
                                     &f->err));
    }
    return CKPT_OK;
}

#define MAP_STEP (4u << 20) /* bytes mapped at a time: the peak RSS it adds */

/*
 * CRC-32 of LEN bytes of FD at OFF, read where they lie in the page cache
 * (a mapping, MAP_STEP bytes at a time) rather than copied into BUF first:
 * the writer's kernel copy of the same bytes is the only other pass over
 * them.  A range past the file's end (it shrank since it was opened) is a
 * truncated file, never a SIGBUS; where a mapping fails, the bytes are read
 * through BUF.  Stops with CKPT_ERR_IO when *CANCEL becomes true.
 */
static int crc_mapped(int fd, uint64_t off, uint64_t len, uint8_t *buf, uint32_t *out,
                      volatile bool *cancel)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return CKPT_ERR_IO;
    if (off > (uint64_t)st.st_size || len > (uint64_t)st.st_size - off)
        return CKPT_ERR_FORMAT;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint32_t crc = 0;
    for (uint64_t done = 0; done < len;) {
        if (cancel && *cancel)
            return CKPT_ERR_IO;
        uint64_t at = off + done, head = at % page;
        size_t n = len - done < MAP_STEP ? (size_t)(len - done) : MAP_STEP;
        uint8_t *map = mmap(NULL, n + head, PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                            (off_t)(at - head));
        if (map == MAP_FAILED) {
            uint32_t rest;
            int rc = ckpt_crc_range_buf(fd, at, len - done, buf, &rest, cancel);
            if (rc == CKPT_OK)
                *out = (uint32_t)crc32_combine(crc, rest, (z_off_t)(len - done));
            return rc;
        }
        crc = ckpt_crc32_update(crc, map + head, n);
        munmap(map, n + head);
        done += n;
    }
    *out = crc;
    return CKPT_OK;
}

int ckpt_storage_pieces_crc(const ckpt_file *f, const ckpt_storage *s, uint8_t *buf,
                            uint32_t *crc, size_t *bad, volatile bool *cancel)
{
    /* descriptors of its own, never the handle's cache of open sources (the
     * main thread opens and closes those meanwhile) */
    const ckpt_source *open_src = NULL;
    int fd = -1, rc = CKPT_OK;
    uint32_t all = 0;
    for (size_t i = 0; i < s->npieces && rc == CKPT_OK; i++) {
        const ckpt_piece *p = &s->pieces[i];
        uint32_t c = 0;
        if (p->mem) {
            c = ckpt_crc32_update(0, p->mem, (size_t)p->nbytes);
        } else {
            if (p->src != open_src) {
                if (fd >= 0 && open_src->lazy)
                    close(fd);
                open_src = p->src;
                ckpt_error oe = {0};
                fd = p->src->lazy ? -1 : p->src->fd;
                if (p->src->lazy && ckpt_open_input(f->dir_fd, p->src->path, false, &fd, NULL,
                                                    &oe) != CKPT_OK)
                    fd = -1; /* a FIFO put in its place: refused, never read */
                if (fd < 0) {
                    open_src = NULL;
                    rc = CKPT_ERR_IO;
                    break;
                }
            }
            rc = crc_mapped(fd, p->file_offset, p->nbytes, buf, &c, cancel);
            if (rc == CKPT_OK) {
                /* kept for the records check after the write (write.c), which
                 * combines these instead of reading the bytes a second time;
                 * no other thread reads them before this one is joined */
                ((ckpt_piece *)p)->seen_crc = c;
                ((ckpt_piece *)p)->seen = true;
            }
        }
        if (rc == CKPT_OK && p->has_crc && c != p->crc32) {
            *bad = i;
            rc = CKPT_ERR_FORMAT;
        }
        all = (uint32_t)crc32_combine(all, c, (z_off_t)p->nbytes);
    }
    if (fd >= 0 && open_src && open_src->lazy)
        close(fd);
    *crc = all;
    return rc;
}

/* Copy the view's elements in C order from the storage bytes SRC. */
void ckpt_tensor_gather(const ckpt_tensor *t, const uint8_t *src, uint8_t *dst)
{
    size_t es = ckpt_dtype_size(t->dtype);
    if (t->numel == 0)
        return;
    if (ckpt_tensor_is_contiguous(t)) {
        /* (a packed float6 tensor is always whole at offset 0: es is 0) */
        memcpy(dst, src + (size_t)t->offset * es, ckpt_tensor_nbytes(t));
        return;
    }
    int64_t idx[64] = {0};
    int nd = t->ndim;
    /* innermost dimension as a run */
    int64_t inner = t->shape[nd - 1], istride = t->stride[nd - 1];
    int64_t outer = t->numel / inner;
    for (int64_t o = 0; o < outer; o++) {
        int64_t base = t->offset;
        for (int d = 0; d < nd - 1; d++)
            base += idx[d] * t->stride[d];
        if (istride == 1) {
            memcpy(dst, src + (size_t)base * es, (size_t)inner * es);
            dst += (size_t)inner * es;
        } else {
            for (int64_t k = 0; k < inner; k++) {
                memcpy(dst, src + (size_t)(base + k * istride) * es, es);
                dst += es;
            }
        }
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
}

/*
 * The tensor's bytes in C order: the whole storage is read (so its CRC is
 * checked); a contiguous tensor is then a slice of it, a strided one is
 * gathered into a second buffer.  *OWN1 / *OWN2 are what to free.
 */
static int tensor_bytes(ckpt_file *f, const ckpt_tensor *t, const uint8_t **bytes, uint8_t **own1,
                        uint8_t **own2)
{
    const ckpt_storage *s = t->storage;
    *own1 = *own2 = NULL;
    if (!s)
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                        "a %s tensor has no elements of its own to read",
                        ckpt_tensor_kind_name((ckpt_tensor_kind)t->kind));
    uint8_t *all;
    CKPT_FORWARD(ckpt_storage_load(f, s, &all));
    *own1 = all;
    size_t es = ckpt_dtype_size(t->dtype);
    if (ckpt_tensor_is_contiguous(t)) {
        *bytes = all + (t->numel ? (size_t)t->offset * es : 0);
        return CKPT_OK;
    }
    if (es == 0) /* packed float6 has no element to gather; its reader makes none strided */
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "a strided %s view cannot be read",
                        ckpt_dtype_name(t->dtype));
    size_t n = ckpt_tensor_nbytes(t);
    uint8_t *g = malloc(n ? n : 1);
    if (!g)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory for a %zu-byte tensor", n);
    *own2 = g;
    ckpt_tensor_gather(t, all, g);
    *bytes = g;
    return CKPT_OK;
}

CKPT_API int ckpt_tensor_read(ckpt_file *f, const ckpt_tensor *t, void *buf, size_t cap)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !t)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    size_t need = ckpt_tensor_nbytes(t);
    if (cap < need)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "buffer of %zu bytes for a %zu-byte tensor", cap,
                        need);
    const uint8_t *bytes;
    uint8_t *own1, *own2;
    int rc = tensor_bytes(f, t, &bytes, &own1, &own2);
    if (rc == CKPT_OK && need)
        memcpy(buf, bytes, need);
    free(own1);
    free(own2);
    return rc;
}

CKPT_API int ckpt_tensor_read_float32(ckpt_file *f, const ckpt_tensor *t, float *buf,
                                      size_t count)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !t || !buf)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    int64_t numel = ckpt_tensor_numel(t);
    if ((uint64_t)numel > count)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "buffer of %zu floats for %lld elements", count,
                        (long long)numel);
    ckpt_dtype dt = ckpt_tensor_dtype(t);
    if (!ckpt_dtype_is_real(dt))
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "a %s tensor has no float32 value",
                        ckpt_dtype_name(dt));
    const uint8_t *bytes;
    uint8_t *own1, *own2;
    int rc = tensor_bytes(f, t, &bytes, &own1, &own2);
    if (rc == CKPT_OK) {
        size_t es = ckpt_dtype_size(dt);
        double blk[1024];
        if (dt == CKPT_DTYPE_FLOAT32 && numel)
            memcpy(buf, bytes, (size_t)numel * sizeof(float));
        else
            for (int64_t i = 0; i < numel; i += 1024) {
                size_t n = (size_t)(numel - i < 1024 ? numel - i : 1024);
                ckpt_dtype_to_double(dt, bytes + (size_t)i * es, n, blk);
                for (size_t k = 0; k < n; k++)
                    buf[i + (int64_t)k] = (float)blk[k]; /* nearest, as copy_ rounds */
            }
    }
    free(own1);
    free(own2);
    return rc;
}

#define BLOCK 1024

/* Compensated (Neumaier) summation in long double: the fallback for values
 * near the double maximum, where a double sum would overflow. */
static void neumaier(long double *sum, long double *comp, long double x)
{
    long double t = *sum + x;
    if (fabsl(*sum) >= fabsl(x))
        *comp += (*sum - t) + x;
    else
        *comp += (x - t) + *sum;
    *sum = t;
}

static void moments_wide(ckpt_dtype dt, const uint8_t *p, int64_t numel, int64_t count,
                         double *mean_out, double *std_out)
{
    size_t es = ckpt_dtype_size(dt);
    double blk[BLOCK];
    long double sum = 0, comp = 0, ss = 0, ssc = 0;
    for (int pass = 0; pass < 2; pass++) {
        long double mean = (sum + comp) / count;
        for (int64_t i = 0; i < numel; i += BLOCK) {
            size_t n = (size_t)(numel - i < BLOCK ? numel - i : BLOCK);
            ckpt_dtype_to_double(dt, p + (size_t)i * es, n, blk);
            for (size_t k = 0; k < n; k++) {
                if (!isfinite(blk[k]))
                    continue;
                if (pass == 0) {
                    neumaier(&sum, &comp, blk[k]);
                } else {
                    long double d = (long double)blk[k] - mean;
                    neumaier(&ss, &ssc, d * d);
                }
            }
        }
    }
    *mean_out = (double)((sum + comp) / count);
    *std_out = count > 1 ? (double)sqrtl((ss + ssc) / (count - 1)) : NAN;
}

CKPT_API int ckpt_tensor_stats_compute(ckpt_file *f, const ckpt_tensor *t, ckpt_tensor_stats *st)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !t || !st)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    memset(st, 0, sizeof(*st));
    st->min = st->max = st->mean = st->std = NAN;
    if (!t->storage)
        return CKPT_OK; /* sparse, meta: nothing of its own (sparse parts are storages) */
    const uint8_t *buf;
    uint8_t *own1, *own2;
    int rc = tensor_bytes(f, t, &buf, &own1, &own2);
    if (rc) {
        free(own1);
        free(own2);
        return rc;
    }
    size_t n = ckpt_tensor_nbytes(t);
    st->crc32 = ckpt_crc32_update(0, buf, n);
    st->min = st->max = st->mean = st->std = NAN;
    if (!ckpt_dtype_is_real(t->dtype)) {
        free(own1); /* complex, quantized: no order */
        free(own2);
        return CKPT_OK;
    }
    st->valid = 1;
    /* Pass 1: counts, extremes and the sum; pass 2: squared deviations.
     * Four partial sums in double keep the loops fast and accurate. */
    size_t es = ckpt_dtype_size(t->dtype);
    double blk[BLOCK], mn = INFINITY, mx = -INFINITY, sum[4] = {0}, ss[4] = {0};
    int64_t count = 0;
    for (int64_t i = 0; i < t->numel; i += BLOCK) {
        size_t k = (size_t)(t->numel - i < BLOCK ? t->numel - i : BLOCK);
        ckpt_dtype_to_double(t->dtype, buf + (size_t)i * es, k, blk);
        for (size_t j = 0; j < k; j++) {
            double x = blk[j];
            if (isfinite(x)) {
                count++;
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
                sum[j & 3] += x;
            } else if (isnan(x)) {
                st->nan++;
            } else {
                st->inf++;
            }
        }
    }
    if (count) {
        st->min = mn;
        st->max = mx;
        double total = (sum[0] + sum[1]) + (sum[2] + sum[3]), mean = total / (double)count;
        for (int64_t i = 0; i < t->numel && count > 1 && isfinite(total); i += BLOCK) {
            size_t k = (size_t)(t->numel - i < BLOCK ? t->numel - i : BLOCK);
            ckpt_dtype_to_double(t->dtype, buf + (size_t)i * es, k, blk);
            for (size_t j = 0; j < k; j++) {
                double d = blk[j] - mean;
                if (isfinite(blk[j]))
                    ss[j & 3] += d * d;
            }
        }
        double sst = (ss[0] + ss[1]) + (ss[2] + ss[3]);
        st->mean = mean;
        st->std = count > 1 ? sqrt(sst / (double)(count - 1)) : NAN;
        if (!isfinite(total) || !isfinite(sst)) /* near the double maximum */
            moments_wide(t->dtype, buf, t->numel, count, &st->mean, &st->std);
    }
    free(own1);
    free(own2);
    return CKPT_OK;
}

int ckpt_storage_load(ckpt_file *f, const ckpt_storage *s, uint8_t **out)
{
    *out = NULL;
    uint8_t *raw = malloc(s->src_nbytes ? (size_t)s->src_nbytes : 1);
    if (!raw)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory for storage '%s' (%llu bytes)",
                        s->key, (unsigned long long)s->src_nbytes);
    int rc = ckpt_storage_read(f, s, 0, raw, (size_t)s->src_nbytes);
    if (rc) {
        free(raw);
        return rc;
    }
    if (s->src_dtype == s->dtype) {
        *out = raw;
        return CKPT_OK;
    }
    uint8_t *cast = malloc(s->nbytes ? (size_t)s->nbytes : 1);
    if (!cast) {
        free(raw);
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory for storage '%s'", s->key);
    }
    ckpt_cast(s->src_dtype, raw, s->dtype, cast, (size_t)s->numel);
    free(raw);
    *out = cast;
    return CKPT_OK;
}

/* ---- streaming a storage, cast on the way, in bounded memory ---- */

#define STREAM_CHUNK (1u << 20) /* source bytes per step, a multiple of every element size */

typedef struct stream_ctx {
    ckpt_file *f;
    const ckpt_storage *s;
    int (*sink)(void *user, const uint8_t *p, size_t n);
    void *user;
    bool swap;         /* big-endian values to this machine's order first */
    uint8_t *cast_buf;
    uint8_t *swap_buf;
    uint8_t carry[16]; /* a partial element between two chunks */
    size_t ncarry;
} stream_ctx;

/* WHOLE elements at P: swapped and cast as needed, then to the sink. */
static int stream_elements(stream_ctx *c, const uint8_t *p, size_t whole)
{
    const ckpt_storage *s = c->s;
    if (c->swap) {
        memcpy(c->swap_buf, p, whole * ckpt_dtype_size(s->src_dtype));
        ckpt_dtype_byteswap(s->src_dtype, c->swap_buf, whole);
        p = c->swap_buf;
    }
    if (s->src_dtype == s->dtype)
        return c->sink(c->user, p, whole * ckpt_dtype_size(s->dtype));
    ckpt_cast(s->src_dtype, p, s->dtype, c->cast_buf, whole);
    return c->sink(c->user, c->cast_buf, whole * ckpt_dtype_size(s->dtype));
}

static int stream_emit(stream_ctx *c, const uint8_t *p, size_t n)
{
    const ckpt_storage *s = c->s;
    if (s->src_dtype == s->dtype && !c->swap)
        return c->sink(c->user, p, n);
    size_t es = ckpt_dtype_size(s->src_dtype);
    int rc = CKPT_OK;
    /* complete an element split across chunks (deflated records come in any sizes) */
    while (c->ncarry && n && rc == CKPT_OK) {
        c->carry[c->ncarry++] = *p++;
        n--;
        if (c->ncarry == es) {
            rc = stream_elements(c, c->carry, 1);
            c->ncarry = 0;
        }
    }
    size_t whole = n / es;
    for (size_t done = 0, step = STREAM_CHUNK / es; rc == CKPT_OK && done < whole; done += step)
        rc = stream_elements(c, p + done * es, whole - done < step ? whole - done : step);
    size_t rest = n - whole * es;
    memcpy(c->carry, p + whole * es, rest);
    c->ncarry = rest;
    return rc;
}

static int stream_zip_sink(void *user, const uint8_t *p, size_t n)
{
    return stream_emit(user, p, n);
}

int ckpt_storage_stream(ckpt_file *f, const ckpt_storage *s, bool as_stored, ckpt_sink_fn sink,
                        void *user)
{
    stream_ctx c = {.f = f, .s = s, .sink = sink, .user = user, .swap = !as_stored && swapped(s)};
    size_t es = ckpt_dtype_size(s->src_dtype), eo = ckpt_dtype_size(s->dtype);
    if (as_stored && s->src_dtype != s->dtype)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "storage '%s': a cast is never as stored", s->key);
    c.cast_buf = malloc(STREAM_CHUNK / (es ? es : 1) * (eo ? eo : 1) + 16);
    c.swap_buf = c.swap ? malloc(STREAM_CHUNK + 16) : NULL;
    if (!c.cast_buf || (c.swap && !c.swap_buf)) {
        free(c.cast_buf);
        free(c.swap_buf);
        return ckpt_oom(&f->err);
    }
    int rc = CKPT_OK;
    if (s->loc == CKPT_LOC_ZIP_RECORD) {
        /* one pass through libzip, which inflates if needed; the CRC is checked at the end */
        rc = zip_local_checked(f, s);
        if (rc == CKPT_OK)
            rc = ckpt_zip_stream(s->src->zip, s->zip_index, stream_zip_sink, &c, &f->err);
    } else if (s->loc == CKPT_LOC_PIECES) {
        /* piece by piece, each whole-record piece's CRC-32 checked as it
         * streams by (a piece is larger than a step) */
        uint8_t *buf = malloc(STREAM_CHUNK);
        if (!buf)
            rc = ckpt_oom(&f->err);
        for (size_t i = 0; buf && i < s->npieces && rc == CKPT_OK; i++) {
            const ckpt_piece *p = &s->pieces[i];
            uint32_t crc = 0;
            for (uint64_t done = 0; done < p->nbytes && rc == CKPT_OK;) {
                /* steps stay whole elements: pieces start and end on elements */
                size_t n = p->nbytes - done < STREAM_CHUNK ? (size_t)(p->nbytes - done)
                                                           : STREAM_CHUNK;
                rc = read_stored_piece(f, s, p, done, buf, n);
                if (rc == CKPT_OK && p->has_crc)
                    crc = ckpt_crc32_update(crc, buf, n);
                if (rc == CKPT_OK)
                    rc = stream_emit(&c, buf, n);
                done += n;
            }
            if (rc == CKPT_OK && p->has_crc && crc != p->crc32)
                rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s': CRC-32 mismatch in '%s'",
                              s->key, p->src ? p->src->path : "memory");
        }
        free(buf);
    } else {
        uint8_t *buf = malloc(STREAM_CHUNK);
        if (!buf)
            rc = ckpt_oom(&f->err);
        for (uint64_t off = 0; buf && off < s->src_nbytes && rc == CKPT_OK;) {
            size_t n = s->src_nbytes - off < STREAM_CHUNK ? (size_t)(s->src_nbytes - off) : STREAM_CHUNK;
            rc = read_stored(f, s, off, buf, n);
            if (rc == CKPT_OK)
                rc = stream_emit(&c, buf, n);
            off += n;
        }
        free(buf);
    }
    free(c.cast_buf);
    free(c.swap_buf);
    return rc;
}
