/*
 * compare.c - the values of two tensors, element by element: how many differ
 * beyond a tolerance, where the first one is, and the largest absolute and
 * relative differences (ckpt diff).
 */
#include "checkpoint/checkpoint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The tensor's elements in C order into BUF (N bytes).  A tensor that is
 * its whole storage is read straight into BUF (its CRC checked as well);
 * any other through ckpt_tensor_read, which needs the storage in memory
 * too. */
static int read_elements(ckpt_file *f, const ckpt_tensor *t, void *buf, size_t n)
{
    const ckpt_storage *s = ckpt_tensor_storage(t);
    if (n && ckpt_tensor_is_contiguous(t) && ckpt_tensor_offset(t) == 0 &&
        ckpt_storage_nbytes(s) == n && s->dtype == s->src_dtype) /* (a cast is read whole) */
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

static int compare_values(ckpt_file *fa, const ckpt_tensor *a, ckpt_file *fb,
                          const ckpt_tensor *b, double atol, double rtol,
                          ckpt_compare_result *out);

/* Add the result of one part of a tensor to the whole's. */
static void add_part(ckpt_compare_result *all, const ckpt_compare_result *p)
{
    if (p->mismatched && !all->mismatched) {
        all->first_index = all->count + p->first_index;
        all->first_a = p->first_a;
        all->first_b = p->first_b;
    }
    all->mismatched += p->mismatched;
    all->count += p->count;
    if (isnan(p->max_abs) || p->max_abs > all->max_abs)
        all->max_abs = p->max_abs;
    if (isnan(p->max_rel) || p->max_rel > all->max_rel)
        all->max_rel = p->max_rel;
}

static int compare_part(ckpt_file *fa, const ckpt_tensor *a, ckpt_file *fb, const ckpt_tensor *b,
                        double atol, double rtol, ckpt_compare_result *all)
{
    ckpt_compare_result r;
    memset(&r, 0, sizeof(r));
    CKPT_FORWARD(compare_values(fa, a, fb, b, atol, rtol, &r));
    add_part(all, &r);
    return CKPT_OK;
}

/* The tensors of a sparse tensor's data, in the order saved: indices, values. */
static size_t sparse_parts(const ckpt_tensor *t, const ckpt_tensor **parts)
{
    const ckpt_value *d = t->rebuild_args->u.seq.items[1];
    size_t n = 0;
    for (size_t i = 0; i < d->u.seq.len && n < 3; i++)
        if (d->u.seq.items[i]->kind == CKPT_KIND_TENSOR)
            parts[n++] = d->u.seq.items[i]->u.tensor;
    return n;
}

/*
 * Tensors of other kinds: sparse ones part by part (indices exactly, the
 * values with the tolerances), quantized ones by their integers and then
 * their quantizers (a different scale or zero point makes every element
 * differ), meta ones by dtype and shape alone.
 */
static int compare_kinds(ckpt_file *fa, const ckpt_tensor *a, ckpt_file *fb, const ckpt_tensor *b,
                         double atol, double rtol, ckpt_compare_result *out)
{
    if (a->kind != b->kind || a->ndim != b->ndim ||
        (a->ndim && memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t))))
        return ckpt_err(&fa->err, CKPT_ERR_UNSUPPORTED,
                        "cannot compare a %s tensor with a %s one of another shape",
                        ckpt_tensor_kind_name((ckpt_tensor_kind)a->kind),
                        ckpt_tensor_kind_name((ckpt_tensor_kind)b->kind));
    if (a->kind == CKPT_TENSOR_META)
        return CKPT_OK;
    if (a->kind != CKPT_TENSOR_QUANTIZED) {
        const ckpt_tensor *pa[3], *pb[3];
        size_t n = sparse_parts(a, pa);
        if (n != sparse_parts(b, pb))
            return ckpt_err(&fa->err, CKPT_ERR_FORMAT, "sparse tensors of different parts");
        for (size_t i = 0; i < n; i++) {
            bool values = i + 1 == n;
            CKPT_FORWARD(compare_part(fa, pa[i], fb, pb[i], values ? atol : 0, values ? rtol : 0,
                                      out));
        }
        return CKPT_OK;
    }
    CKPT_FORWARD(compare_values(fa, a, fb, b, 0, 0, out));
    static const ckpt_qparams none = {.qscheme = ""};
    const ckpt_qparams *qa = a->q ? a->q : &none, *qb = b->q ? b->q : &none;
    ckpt_compare_result q;
    memset(&q, 0, sizeof(q));
    bool differ = strcmp(qa->qscheme, qb->qscheme) != 0 || !qa->scales != !qb->scales;
    if (!differ && !qa->scales)
        differ = qa->scale != qb->scale || qa->zero_point != qb->zero_point;
    else if (!differ) {
        differ = qa->axis != qb->axis;
        if (!differ)
            CKPT_FORWARD(compare_part(fa, qa->scales, fb, qb->scales, 0, 0, &q));
        if (!differ && !q.mismatched)
            CKPT_FORWARD(compare_part(fa, qa->zero_points, fb, qb->zero_points, 0, 0, &q));
        differ = differ || q.mismatched;
    }
    if (differ && out->count) { /* the same integers mean other values */
        out->mismatched = out->count;
        out->first_index = 0;
        out->max_abs = out->max_rel = NAN;
    }
    return CKPT_OK;
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
    if (a->kind != CKPT_TENSOR_DENSE || b->kind != CKPT_TENSOR_DENSE)
        return compare_kinds(fa, a, fb, b, atol, rtol, out);
    return compare_values(fa, a, fb, b, atol, rtol, out);
}

static int compare_values(ckpt_file *fa, const ckpt_tensor *a, ckpt_file *fb,
                          const ckpt_tensor *b, double atol, double rtol,
                          ckpt_compare_result *out)
{
    out->first_index = -1;
    out->first_a = out->first_b = NAN;
    int64_t numel = ckpt_tensor_numel(a);
    if (numel != ckpt_tensor_numel(b))
        return ckpt_err(&fa->err, CKPT_ERR_USAGE,
                        "cannot compare a tensor of %lld elements with one of %lld",
                        (long long)numel, (long long)ckpt_tensor_numel(b));
    ckpt_dtype da = ckpt_tensor_dtype(a), db = ckpt_tensor_dtype(b);
    ckpt_element_class ca = ckpt_element_class_of(da), cb = ckpt_element_class_of(db);
    bool raw = ca == CKPT_ELEM_RAW || cb == CKPT_ELEM_RAW;
    if (raw && da != db)
        return ckpt_err(&fa->err, CKPT_ERR_UNSUPPORTED,
                        "cannot compare the values of %s and %s tensors", ckpt_dtype_name(da),
                        ckpt_dtype_name(db));
    size_t esa = ckpt_dtype_size(da), esb = ckpt_dtype_size(db);
    unsigned bits = ckpt_dtype_bits(da); /* packed float6: 6-bit fields, compared as such */
    if (raw && esa == 0 && (bits == 0 || bits > 8))
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
    if (raw && esa == 0) {
        /* value i is bits [i*bits, (i+1)*bits) counted from each byte's low bit
         * (safetensors names no order; any fixed one finds the same mismatches) */
        out->max_abs = out->max_rel = NAN;
        for (int64_t i = 0; i < numel; i++) {
            uint64_t at = (uint64_t)i * bits;
            unsigned x = 0, y = 0;
            for (unsigned k = 0; k < bits; k++, at++) {
                x |= (unsigned)((pa[at / 8] >> (at % 8)) & 1u) << k;
                y |= (unsigned)((pb[at / 8] >> (at % 8)) & 1u) << k;
            }
            if (x != y && out->mismatched++ == 0)
                out->first_index = i;
        }
        goto out;
    }
    if (raw) {
        /* packed quantized values are compared a byte at a time */
        int64_t n = (int64_t)(na / esa);
        out->count = n;
        out->max_abs = out->max_rel = NAN;
        for (int64_t i = 0; i < n; i++)
            if (memcmp(pa + (size_t)i * esa, pb + (size_t)i * esa, esa) != 0 &&
                out->mismatched++ == 0)
                out->first_index = i;
        goto out;
    }
    /* the same bytes are the same values (NaN payloads included) */
    if (da == db && na == nb && memcmp(pa, pb, na) == 0)
        goto out;

    cmp_state s = {atol, rtol, out};
    bool ints = ca != CKPT_ELEM_FLOAT && cb != CKPT_ELEM_FLOAT;
    size_t elem = ints ? sizeof(__int128) : sizeof(double);
    blk_a = malloc(BLOCK * elem);
    blk_b = malloc(BLOCK * elem);
    if (!blk_a || !blk_b) {
        rc = ckpt_oom(&fa->err);
        goto out;
    }
    for (int64_t i = 0; i < numel; i += BLOCK) {
        size_t n = (size_t)(numel - i < BLOCK ? numel - i : BLOCK);
        if (ints) {
            ckpt_dtype_to_int128(da, pa + (size_t)i * esa, n, blk_a);
            ckpt_dtype_to_int128(db, pb + (size_t)i * esb, n, blk_b);
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
