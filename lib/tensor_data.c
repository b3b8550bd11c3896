/*
 * tensor_data.c - reading storage bytes (CRC-checked), gathering a strided
 * view into C order, and per-tensor statistics.
 */
#include "ckpt_private.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

CKPT_API int ckpt_storage_read(ckpt_file *f, const ckpt_storage *s, uint64_t offset, void *buf,
                               size_t len)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !s || (!buf && len))
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (offset > s->nbytes || len > s->nbytes - offset)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "read past the end of storage '%s'", s->key);
    if (f->format == CKPT_FORMAT_PTH_ZIP)
        return ckpt_zip_read(f->zip, s->zip_index, offset, buf, len, &f->err);
    /* legacy: raw bytes at a known file offset */
    uint8_t *p = buf;
    uint64_t at = s->file_offset + offset;
    while (len) {
        ssize_t got = pread(f->fd, p, len, (off_t)at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return ckpt_err(&f->err, CKPT_ERR_IO, "reading storage '%s': %s", s->key,
                            strerror(errno));
        if (got == 0)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage '%s' is truncated", s->key);
        p += got;
        at += (uint64_t)got;
        len -= (size_t)got;
    }
    return CKPT_OK;
}

/* Copy the view's elements in C order from the storage bytes SRC. */
static void gather(const ckpt_tensor *t, const uint8_t *src, uint8_t *dst)
{
    size_t es = ckpt_dtype_size(t->dtype);
    if (t->numel == 0)
        return;
    if (ckpt_tensor_is_contiguous(t)) {
        memcpy(dst, src + (size_t)t->offset * es, (size_t)t->numel * es);
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

CKPT_API int ckpt_tensor_read(ckpt_file *f, const ckpt_tensor *t, void *buf, size_t cap)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !t)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    size_t need = ckpt_tensor_nbytes(t);
    if (cap < need)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "buffer of %zu bytes for a %zu-byte tensor", cap,
                        need);
    const ckpt_storage *s = t->storage;
    /* Read the whole storage so that its CRC is checked. */
    uint8_t *all = malloc(s->nbytes ? (size_t)s->nbytes : 1);
    if (!all)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory for storage '%s' (%llu bytes)",
                        s->key, (unsigned long long)s->nbytes);
    int rc = ckpt_storage_read(f, s, 0, all, (size_t)s->nbytes);
    if (rc == CKPT_OK)
        gather(t, all, buf);
    free(all);
    return rc;
}

float ckpt_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

float ckpt_bfloat16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static bool element_value(ckpt_dtype dt, const uint8_t *p, double *out)
{
    switch (dt) {
    case CKPT_DTYPE_FLOAT64: { double v; memcpy(&v, p, 8); *out = v; return true; }
    case CKPT_DTYPE_FLOAT32: { float v; memcpy(&v, p, 4); *out = v; return true; }
    case CKPT_DTYPE_FLOAT16: { uint16_t v; memcpy(&v, p, 2); *out = ckpt_half_to_float(v); return true; }
    case CKPT_DTYPE_BFLOAT16: { uint16_t v; memcpy(&v, p, 2); *out = ckpt_bfloat16_to_float(v); return true; }
    case CKPT_DTYPE_INT64: { int64_t v; memcpy(&v, p, 8); *out = (double)v; return true; }
    case CKPT_DTYPE_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case CKPT_DTYPE_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case CKPT_DTYPE_INT8: *out = (int8_t)p[0]; return true;
    case CKPT_DTYPE_UINT8: *out = p[0]; return true;
    case CKPT_DTYPE_BOOL: *out = p[0] != 0; return true;
    case CKPT_DTYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case CKPT_DTYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case CKPT_DTYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); *out = (double)v; return true; }
    default: return false;
    }
}

static void neumaier_add(long double *sum, long double *comp, long double x)
{
    long double t = *sum + x;
    if (fabsl(*sum) >= fabsl(x))
        *comp += (*sum - t) + x;
    else
        *comp += (x - t) + *sum;
    *sum = t;
}

CKPT_API int ckpt_tensor_stats_compute(ckpt_file *f, const ckpt_tensor *t, ckpt_tensor_stats *st)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !t || !st)
        return CKPT_ERR_USAGE;
    memset(st, 0, sizeof(*st));
    size_t n = ckpt_tensor_nbytes(t);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory for a %zu-byte tensor", n);
    int rc = ckpt_tensor_read(f, t, buf, n);
    if (rc) {
        free(buf);
        return rc;
    }
    uLong c = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < n;) { /* crc32 takes 32-bit lengths */
        size_t chunk = n - off > (1u << 30) ? (1u << 30) : n - off;
        c = crc32(c, buf + off, (uInt)chunk);
        off += chunk;
    }
    st->crc32 = (uint32_t)c;
    size_t es = ckpt_dtype_size(t->dtype);
    double x0;
    static const uint8_t zero[16];
    if (!element_value(t->dtype, zero, &x0)) { /* complex, quantized: no order */
        st->min = st->max = st->mean = st->std = NAN;
        free(buf);
        return CKPT_OK;
    }
    st->valid = 1;
    /* Two passes in long double with compensated (Neumaier) sums: values
     * near the type's maximum neither overflow nor swallow small ones. */
    double mn = INFINITY, mx = -INFINITY;
    long double sum = 0, comp = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        double x;
        element_value(t->dtype, buf + (size_t)i * es, &x);
        if (isnan(x)) {
            st->nan++;
        } else if (isinf(x)) {
            st->inf++;
        } else {
            count++;
            mn = x < mn ? x : mn;
            mx = x > mx ? x : mx;
            neumaier_add(&sum, &comp, x);
        }
    }
    long double mean = count ? (sum + comp) / count : 0, ss = 0, ssc = 0;
    for (int64_t i = 0; i < t->numel && count > 1; i++) {
        double x;
        element_value(t->dtype, buf + (size_t)i * es, &x);
        if (isfinite(x)) {
            long double d = (long double)x - mean;
            neumaier_add(&ss, &ssc, d * d);
        }
    }
    st->min = count ? mn : NAN;
    st->max = count ? mx : NAN;
    st->mean = count ? (double)mean : NAN;
    st->std = count > 1 ? (double)sqrtl((ss + ssc) / (count - 1)) : NAN;
    free(buf);
    return CKPT_OK;
}
