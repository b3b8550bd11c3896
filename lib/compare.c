/*
 * compare.c - the values of two tensors, element by element: how many differ
 * beyond a tolerance, where the first one is, and the largest absolute and
 * relative differences (ckpt diff).
 */
#include "ckpt_private.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How the elements of a dtype are compared. */
typedef enum value_class {
    VC_FLOAT,    /* converted to double exactly */
    VC_SIGNED,   /* integers: exact, through int64 */
    VC_UNSIGNED, /* uint8..uint64 and bool (0/1) */
    VC_RAW       /* complex, quantized, bits, unknown: bytes */
} value_class;

static value_class class_of(ckpt_dtype dt)
{
    switch (dt) {
    case CKPT_DTYPE_FLOAT64:
    case CKPT_DTYPE_FLOAT32:
    case CKPT_DTYPE_FLOAT16:
    case CKPT_DTYPE_BFLOAT16:
    case CKPT_DTYPE_FLOAT8_E5M2:
    case CKPT_DTYPE_FLOAT8_E4M3FN:
    case CKPT_DTYPE_FLOAT8_E5M2FNUZ:
    case CKPT_DTYPE_FLOAT8_E4M3FNUZ:
    case CKPT_DTYPE_FLOAT8_E8M0FNU:
        return VC_FLOAT;
    case CKPT_DTYPE_INT64:
    case CKPT_DTYPE_INT32:
    case CKPT_DTYPE_INT16:
    case CKPT_DTYPE_INT8:
        return VC_SIGNED;
    case CKPT_DTYPE_UINT8:
    case CKPT_DTYPE_UINT16:
    case CKPT_DTYPE_UINT32:
    case CKPT_DTYPE_UINT64:
    case CKPT_DTYPE_BOOL:
        return VC_UNSIGNED;
    default:
        return VC_RAW;
    }
}

/*
 * An 8-bit float with EBITS exponent and MBITS mantissa bits and BIAS.
 * FNUZ: no infinity, no negative zero, NaN is 0x80; FN: no infinity, NaN is
 * all ones (S.1111.111); otherwise IEEE-like (all-ones exponent: inf / NaN).
 */
static double float8_value(uint8_t v, int ebits, int mbits, int bias, int kind)
{
    enum { IEEE = 0, FN = 1, FNUZ = 2 };
    unsigned sign = v >> 7, exp = (v >> mbits) & ((1u << ebits) - 1), man = v & ((1u << mbits) - 1);
    unsigned emax = (1u << ebits) - 1;
    if (kind == FNUZ && v == 0x80)
        return NAN;
    if (kind == FN && exp == emax && man == (1u << mbits) - 1)
        return NAN;
    if (kind == IEEE && exp == emax)
        return man ? NAN : (sign ? -INFINITY : INFINITY);
    double m = exp ? 1.0 + ldexp(man, -mbits) : ldexp(man, -mbits);
    double x = ldexp(m, (exp ? (int)exp : 1) - bias);
    return sign ? -x : x;
}

bool ckpt_dtype_is_real(ckpt_dtype dt)
{
    return class_of(dt) != VC_RAW;
}

/* Convert N elements of a VC_FLOAT or integer dtype at P to double. */
bool ckpt_dtype_to_double(ckpt_dtype dt, const uint8_t *p, size_t n, double *out)
{
#define CONVERT(T, EXPR)                          \
    for (size_t i = 0; i < n; i++) {              \
        T v;                                      \
        memcpy(&v, p + i * sizeof(T), sizeof(T)); \
        out[i] = (double)(EXPR);                  \
    }                                             \
    break
    switch (dt) {
    case CKPT_DTYPE_FLOAT64: CONVERT(double, v);
    case CKPT_DTYPE_FLOAT32: CONVERT(float, v);
    case CKPT_DTYPE_FLOAT16: CONVERT(uint16_t, ckpt_half_to_float(v));
    case CKPT_DTYPE_BFLOAT16: CONVERT(uint16_t, ckpt_bfloat16_to_float(v));
    case CKPT_DTYPE_FLOAT8_E5M2: CONVERT(uint8_t, float8_value(v, 5, 2, 15, 0));
    case CKPT_DTYPE_FLOAT8_E4M3FN: CONVERT(uint8_t, float8_value(v, 4, 3, 7, 1));
    case CKPT_DTYPE_FLOAT8_E5M2FNUZ: CONVERT(uint8_t, float8_value(v, 5, 2, 16, 2));
    case CKPT_DTYPE_FLOAT8_E4M3FNUZ: CONVERT(uint8_t, float8_value(v, 4, 3, 8, 2));
    case CKPT_DTYPE_FLOAT8_E8M0FNU:
        CONVERT(uint8_t, v == 0xff ? NAN : ldexp(1.0, (int)v - 127));
    case CKPT_DTYPE_INT64: CONVERT(int64_t, v);
    case CKPT_DTYPE_INT32: CONVERT(int32_t, v);
    case CKPT_DTYPE_INT16: CONVERT(int16_t, v);
    case CKPT_DTYPE_INT8: CONVERT(int8_t, v);
    case CKPT_DTYPE_UINT8: CONVERT(uint8_t, v);
    case CKPT_DTYPE_BOOL: CONVERT(uint8_t, v != 0);
    case CKPT_DTYPE_UINT16: CONVERT(uint16_t, v);
    case CKPT_DTYPE_UINT32: CONVERT(uint32_t, v);
    case CKPT_DTYPE_UINT64: CONVERT(uint64_t, v);
    default:
        for (size_t i = 0; i < n; i++)
            out[i] = NAN;
        return false;
    }
    return true;
#undef CONVERT
}

/* Convert N elements of an integer dtype at P to 128-bit integers. */
static void to_int(ckpt_dtype dt, const uint8_t *p, size_t n, __int128 *out)
{
#define CONVERT(T, EXPR)                          \
    for (size_t i = 0; i < n; i++) {              \
        T v;                                      \
        memcpy(&v, p + i * sizeof(T), sizeof(T)); \
        out[i] = (__int128)(EXPR);                \
    }                                             \
    break
    switch (dt) {
    case CKPT_DTYPE_INT64: CONVERT(int64_t, v);
    case CKPT_DTYPE_INT32: CONVERT(int32_t, v);
    case CKPT_DTYPE_INT16: CONVERT(int16_t, v);
    case CKPT_DTYPE_INT8: CONVERT(int8_t, v);
    case CKPT_DTYPE_UINT8: CONVERT(uint8_t, v);
    case CKPT_DTYPE_BOOL: CONVERT(uint8_t, v != 0);
    case CKPT_DTYPE_UINT16: CONVERT(uint16_t, v);
    case CKPT_DTYPE_UINT32: CONVERT(uint32_t, v);
    case CKPT_DTYPE_UINT64: CONVERT(uint64_t, v);
    default:
        memset(out, 0, n * sizeof(*out));
        break;
    }
#undef CONVERT
}

/* The tensor's elements in C order into BUF (N bytes).  A tensor that is
 * its whole storage is read straight into BUF (its CRC checked as well);
 * any other through ckpt_tensor_read, which needs the storage in memory
 * too. */
static int read_elements(ckpt_file *f, const ckpt_tensor *t, void *buf, size_t n)
{
    const ckpt_storage *s = ckpt_tensor_storage(t);
    if (n && ckpt_tensor_is_contiguous(t) && ckpt_tensor_offset(t) == 0 &&
        ckpt_storage_nbytes(s) == n)
        return ckpt_storage_read(f, s, 0, buf, n);
    return ckpt_tensor_read(f, t, buf, n);
}

#define BLOCK 2048

typedef struct cmp_state {
    double atol, rtol;
    ckpt_compare_result *r;
} cmp_state;

static void mismatch_at(cmp_state *s, int64_t i, double a, double b)
{
    if (s->r->mismatched++ == 0) {
        s->r->first_index = i;
        s->r->first_a = a;
        s->r->first_b = b;
    }
}

static void note_diff(cmp_state *s, double d, double rel)
{
    if (d > s->r->max_abs)
        s->r->max_abs = d;
    if (rel > s->r->max_rel)
        s->r->max_rel = rel;
}

/* Elements I0.. I0+N of two blocks of doubles. */
static void compare_doubles(cmp_state *s, int64_t i0, const double *a, const double *b, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        double x = a[k], y = b[k];
        if (x == y) /* also -0.0 == 0.0 and inf == inf */
            continue;
        if (isnan(x) || isnan(y)) {
            if (!(isnan(x) && isnan(y))) { /* as torch's |a - b|.max(): NaN */
                s->r->max_abs = s->r->max_rel = NAN;
                mismatch_at(s, i0 + (int64_t)k, x, y);
            }
            continue;
        }
        double d = fabs(x - y);
        double rel = y == 0 || isinf(y) ? INFINITY : d / fabs(y);
        note_diff(s, d, rel);
        /* an infinity equals only itself; x != y here */
        if (isinf(x) || isinf(y) || !(d <= s->atol + s->rtol * fabs(y)))
            mismatch_at(s, i0 + (int64_t)k, x, y);
    }
}

/* The same for two integer blocks: exact differences. */
static void compare_ints(cmp_state *s, int64_t i0, const __int128 *a, const __int128 *b,
                         size_t n)
{
    bool exact = s->atol == 0 && s->rtol == 0;
    for (size_t k = 0; k < n; k++) {
        if (a[k] == b[k])
            continue;
        __int128 dd = a[k] - b[k];
        if (dd < 0)
            dd = -dd;
        __int128 ab = b[k] < 0 ? -b[k] : b[k];
        double d = (double)dd;
        double rel = ab == 0 ? INFINITY : (double)((long double)dd / (long double)ab);
        note_diff(s, d, rel);
        if (exact || !((long double)dd <= (long double)s->atol + (long double)s->rtol * (long double)ab))
            mismatch_at(s, i0 + (int64_t)k, (double)a[k], (double)b[k]);
    }
}

CKPT_API int ckpt_tensor_compare(ckpt_file *fa, const ckpt_tensor *a, ckpt_file *fb,
                                 const ckpt_tensor *b, double atol, double rtol,
                                 ckpt_compare_result *out)
{
    if (!fa || fa->magic != CKPT_FILE_MAGIC || !fb || fb->magic != CKPT_FILE_MAGIC || !a || !b ||
        !out)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&fa->err);
    ckpt_err_clear(&fb->err);
    memset(out, 0, sizeof(*out));
    out->first_index = -1;
    out->first_a = out->first_b = NAN;
    if (!(atol >= 0) || !(rtol >= 0) || isinf(atol) || isinf(rtol))
        return ckpt_err(&fa->err, CKPT_ERR_USAGE,
                        "tolerances must be finite and not negative (atol %g, rtol %g)", atol,
                        rtol);
    int64_t numel = ckpt_tensor_numel(a);
    if (numel != ckpt_tensor_numel(b))
        return ckpt_err(&fa->err, CKPT_ERR_USAGE,
                        "cannot compare a tensor of %lld elements with one of %lld",
                        (long long)numel, (long long)ckpt_tensor_numel(b));
    ckpt_dtype da = ckpt_tensor_dtype(a), db = ckpt_tensor_dtype(b);
    value_class ca = class_of(da), cb = class_of(db);
    bool raw = ca == VC_RAW || cb == VC_RAW;
    if (raw && da != db)
        return ckpt_err(&fa->err, CKPT_ERR_UNSUPPORTED,
                        "cannot compare the values of %s and %s tensors", ckpt_dtype_name(da),
                        ckpt_dtype_name(db));
    size_t esa = ckpt_dtype_size(da), esb = ckpt_dtype_size(db);
    if (raw && esa == 0)
        return ckpt_err(&fa->err, CKPT_ERR_UNSUPPORTED, "cannot compare the values of %s tensors",
                        ckpt_dtype_name(da));

    size_t na = ckpt_tensor_nbytes(a), nb = ckpt_tensor_nbytes(b);
    uint8_t *pa = malloc(na ? na : 1), *pb = malloc(nb ? nb : 1);
    void *blk_a = NULL, *blk_b = NULL;
    int rc = CKPT_OK;
    if (!pa || !pb) {
        rc = ckpt_err(&fa->err, CKPT_ERR_NOMEM, "out of memory for two tensors of %zu and %zu bytes",
                      na, nb);
        goto out;
    }
    if ((rc = read_elements(fa, a, pa, na)) != CKPT_OK)
        goto out;
    if ((rc = read_elements(fb, b, pb, nb)) != CKPT_OK)
        goto out;

    out->count = numel;
    if (raw) {
        out->max_abs = out->max_rel = NAN;
        for (int64_t i = 0; i < numel; i++)
            if (memcmp(pa + (size_t)i * esa, pb + (size_t)i * esa, esa) != 0 &&
                out->mismatched++ == 0)
                out->first_index = i;
        goto out;
    }
    /* the same bytes are the same values (NaN payloads included) */
    if (da == db && na == nb && memcmp(pa, pb, na) == 0)
        goto out;

    cmp_state s = {atol, rtol, out};
    bool ints = ca != VC_FLOAT && cb != VC_FLOAT;
    size_t elem = ints ? sizeof(__int128) : sizeof(double);
    blk_a = malloc(BLOCK * elem);
    blk_b = malloc(BLOCK * elem);
    if (!blk_a || !blk_b) {
        rc = ckpt_err(&fa->err, CKPT_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < numel; i += BLOCK) {
        size_t n = (size_t)(numel - i < BLOCK ? numel - i : BLOCK);
        if (ints) {
            to_int(da, pa + (size_t)i * esa, n, blk_a);
            to_int(db, pb + (size_t)i * esb, n, blk_b);
            compare_ints(&s, i, blk_a, blk_b, n);
        } else {
            ckpt_dtype_to_double(da, pa + (size_t)i * esa, n, blk_a);
            ckpt_dtype_to_double(db, pb + (size_t)i * esb, n, blk_b);
            compare_doubles(&s, i, blk_a, blk_b, n);
        }
    }
out:
    free(pa);
    free(pb);
    free(blk_a);
    free(blk_b);
    return rc;
}
