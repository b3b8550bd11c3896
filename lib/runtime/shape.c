/* runtime/shape.c - the shape rule of every op, with torch's formulas, and
 * the shape pass that runs them over the graph.  The pass is used twice: at
 * bind time to know the shape each parameter must have (channel counts
 * come from the weights, the rest follows from the inputs), and at run time
 * to size every value for the batch at hand. */
#include "runtime/runtime.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t rt_shape_numel(const rt_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= s->d[i];
    return n;
}

int rt_shape_equal(const rt_shape *a, const rt_shape *b)
{
    return a->ndim == b->ndim && memcmp(a->d, b->d, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

const char *rt_shape_format(const rt_shape *s, char *buf, size_t cap)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < s->ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)s->d[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
    return buf;
}

static int fail(char *err, size_t cap, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* Sizes are kept below 2^40 so that products of a few of them cannot overflow. */
#define SIZE_MAX_ELEMS (INT64_C(1) << 40)

static int check_numel(const rt_shape *s, char *err, size_t cap)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) {
        if (s->d[i] < 0 || (s->d[i] && n > SIZE_MAX_ELEMS / s->d[i]))
            return fail(err, cap, "a value of more than 2^40 elements");
        n *= s->d[i];
    }
    return 0;
}

static int norm_dim(int64_t dim, int ndim, int64_t *out)
{
    if (dim < -ndim || dim >= ndim)
        return -1;
    *out = dim < 0 ? dim + ndim : dim;
    return 0;
}

static int conv_rule(const rt_node *n, const rt_shape *x, const rt_shape *w, rt_shape *out,
                     rt_shape *we, char *err, size_t cap)
{
    int transposed = n->op == RT_CONV_TRANSPOSE2D;
    char sb[96];
    if (x->ndim != 4)
        return fail(err, cap, "expects a 4-D [N, C, H, W] input, got %s",
                    rt_shape_format(x, sb, sizeof sb));
    /* the weight's free dimensions: output channels, and the kernel unless
     * the spec pins it */
    int64_t oc = 1, kh = n->kernel[0], kw = n->kernel[1];
    if (w && w->ndim >= 2)
        oc = w->d[transposed ? 1 : 0];
    else if (w && w->ndim == 1)
        oc = w->d[0];
    if (!n->has_kernel && w && w->ndim == 4) {
        kh = w->d[2];
        kw = w->d[3];
    }
    we->ndim = 4;
    we->d[0] = transposed ? x->d[1] : oc;
    we->d[1] = transposed ? oc : x->d[1];
    we->d[2] = kh;
    we->d[3] = kw;
    out->ndim = 4;
    out->d[0] = x->d[0];
    out->d[1] = oc;
    for (int i = 0; i < 2; i++) {
        int64_t in = x->d[2 + i], k = i ? kw : kh;
        int64_t ext = n->dilation[i] * (k - 1) + 1;
        int64_t o;
        if (transposed)
            o = (in - 1) * n->stride[i] - 2 * n->padding[i] + ext + n->output_padding[i];
        else
            o = (in + 2 * n->padding[i] - ext) / n->stride[i] + 1;
        if (in + 2 * n->padding[i] < ext && !transposed)
            o = 0;
        if (o <= 0)
            return fail(err, cap, "input %s is too small for a %lldx%lld kernel",
                        rt_shape_format(x, sb, sizeof sb), (long long)kh, (long long)kw);
        out->d[2 + i] = o;
    }
    return 0;
}

static int pool_rule(const rt_node *n, const rt_shape *x, rt_shape *out, char *err, size_t cap)
{
    char sb[96];
    if (x->ndim != 4 && x->ndim != 3)
        return fail(err, cap, "expects a 3-D or 4-D input, got %s",
                    rt_shape_format(x, sb, sizeof sb));
    *out = *x;
    for (int i = 0; i < 2; i++) {
        int64_t in = x->d[x->ndim - 2 + i];
        int64_t ext = n->dilation[i] * (n->kernel[i] - 1) + 1;
        int64_t span = in + 2 * n->padding[i] - ext;
        if (span < 0)
            return fail(err, cap, "input %s is too small for the pooling window",
                        rt_shape_format(x, sb, sizeof sb));
        int64_t o = (span + (n->ceil_mode ? n->stride[i] - 1 : 0)) / n->stride[i] + 1;
        /* torch: the last window must start inside the input or the left padding */
        if (n->ceil_mode && (o - 1) * n->stride[i] >= in + n->padding[i])
            o--;
        out->d[x->ndim - 2 + i] = o;
    }
    return 0;
}

/* torch's broadcasting (numpy's rules, aligned on the right) of A and B into
 * OUT. */
int rt_broadcast(const rt_shape *a, const rt_shape *b, rt_shape *out)
{
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    out->ndim = nd;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return -1;
        out->d[i] = da == 1 ? db : da;
    }
    return 0;
}

/* The strides (in elements) with which a value of shape S is read over the
 * broadcast shape OUT: 0 where it is broadcast. */
void rt_broadcast_strides(const rt_shape *s, const rt_shape *out, int64_t *strides)
{
    int64_t st = 1;
    for (int i = out->ndim - 1; i >= 0; i--) {
        int is = i - (out->ndim - s->ndim);
        if (is < 0 || s->d[is] == 1) {
            strides[i] = 0;
        } else {
            strides[i] = st;
        }
        if (is >= 0)
            st *= s->d[is];
    }
}

/* torch.matmul of operands of 2 or more dimensions: [..., m, k] @ [..., k, n],
 * the batch dimensions broadcast. */
static int matmul_rule(const rt_node *n, const rt_shape *a, const rt_shape *b, rt_shape *out,
                       char *err, size_t cap)
{
    char ab[96], bb[96];
    int bmm = strcmp(n->opname, "bmm") == 0;
    if (a->ndim < 2 || b->ndim < 2 || (bmm && (a->ndim != 3 || b->ndim != 3)))
        return fail(err, cap, "expects %s, got %s and %s",
                    bmm ? "two 3-D inputs [b, m, k] and [b, k, n]"
                        : "inputs of 2 or more dimensions [..., m, k] and [..., k, n]",
                    rt_shape_format(a, ab, sizeof ab), rt_shape_format(b, bb, sizeof bb));
    rt_shape ba = *a, bbs = *b;
    ba.ndim -= 2;
    bbs.ndim -= 2;
    if (a->d[a->ndim - 1] != b->d[b->ndim - 2] || rt_broadcast(&ba, &bbs, out) ||
        (bmm && a->d[0] != b->d[0]))
        return fail(err, cap, "cannot multiply %s by %s", rt_shape_format(a, ab, sizeof ab),
                    rt_shape_format(b, bb, sizeof bb));
    out->d[out->ndim++] = a->d[a->ndim - 2];
    out->d[out->ndim++] = b->d[b->ndim - 1];
    return 0;
}

/* scaled_dot_product_attention: q [B, H, L, E] (or [B, L, E]), k [B, Hk, S,
 * E], v [B, Hk, S, Ev], mask broadcastable to [B, H, L, S]. */
static int sdpa_rule(const rt_node *n, const rt_shape *const *in, rt_shape *out, char *err,
                     size_t cap)
{
    const rt_shape *q = in[0], *k = in[1], *v = in[2];
    char qb[96], kb[96], vb[96];
    if ((q->ndim != 4 && q->ndim != 3) || k->ndim != q->ndim || v->ndim != q->ndim)
        return fail(err, cap, "expects q, k, v of 4 dimensions [batch, heads, length, dim] "
                    "(or 3), got %s, %s, %s", rt_shape_format(q, qb, sizeof qb),
                    rt_shape_format(k, kb, sizeof kb), rt_shape_format(v, vb, sizeof vb));
    int nd = q->ndim;
    int64_t hq = nd == 4 ? q->d[1] : 1, hk = nd == 4 ? k->d[1] : 1, hv = nd == 4 ? v->d[1] : 1;
    if (q->d[0] != k->d[0] || q->d[0] != v->d[0] || hk != hv ||
        q->d[nd - 1] != k->d[nd - 1] || k->d[nd - 2] != v->d[nd - 2])
        return fail(err, cap, "q %s, k %s and v %s do not fit together",
                    rt_shape_format(q, qb, sizeof qb), rt_shape_format(k, kb, sizeof kb),
                    rt_shape_format(v, vb, sizeof vb));
    if (hk != hq) {
        if (!n->gqa && hk != 1)
            return fail(err, cap, "k and v have %lld heads, q %lld (grouped-query attention "
                        "needs \"enable_gqa\": true)", (long long)hk, (long long)hq);
        if (hq % hk)
            return fail(err, cap, "q's %lld heads are not a multiple of k's and v's %lld",
                        (long long)hq, (long long)hk);
    }
    if (n->ninputs == 4) {
        /* [B, H, L, S], or [B, L, S] for 3-D q */
        const rt_shape *mk = in[3];
        rt_shape full = {.ndim = 4, .d = {q->d[0], hq, q->d[nd - 2], k->d[nd - 2]}}, bc;
        if (nd == 3) {
            full.ndim = 3;
            full.d[1] = full.d[2];
            full.d[2] = full.d[3];
        }
        if (mk->ndim > nd || rt_broadcast(mk, &full, &bc) || !rt_shape_equal(&bc, &full))
            return fail(err, cap, "the mask %s does not broadcast to %s",
                        rt_shape_format(mk, qb, sizeof qb), rt_shape_format(&full, kb, sizeof kb));
    }
    *out = *q;
    out->d[nd - 1] = v->d[nd - 1];
    return 0;
}

/* The dimensions mean/sum reduces, as a mask over X's. */
int rt_reduce_mask(const rt_node *n, const rt_shape *x, unsigned *mask)
{
    *mask = 0;
    if (n->all_dims) {
        *mask = x->ndim ? (1u << x->ndim) - 1 : 0;
        return 0;
    }
    for (int i = 0; i < n->nlist; i++) {
        int64_t d;
        if (norm_dim(n->list[i], x->ndim ? x->ndim : 1, &d) || (*mask & (1u << d)))
            return -1;
        *mask |= 1u << d;
    }
    if (!x->ndim)
        *mask = 0; /* a 0-dim value: dim 0 / -1 is the value itself */
    return 0;
}

/* The rules of the transformer ops. */
static int transformer_rule(const rt_node *n, const rt_shape *const *in, const rt_shape *w,
                            rt_shape *out, rt_shape *expect, char *err, size_t cap)
{
    const rt_shape *x = n->ninputs ? in[0] : NULL;
    rt_shape *we = &expect[RT_P_WEIGHT], *be = &expect[RT_P_BIAS];
    char sb[96], ob[96];
    int64_t d;
    switch (n->op) {
    case RT_UNARY:
    case RT_IDENTITY:
        *out = *x;
        return 0;
    case RT_ADD:
    case RT_BINARY:
        if (rt_broadcast(x, in[1], out))
            return fail(err, cap, "cannot broadcast %s and %s together",
                        rt_shape_format(x, sb, sizeof sb), rt_shape_format(in[1], ob, sizeof ob));
        return 0;
    case RT_TRANSPOSE: {
        int64_t d1;
        if (norm_dim(n->dim0, x->ndim, &d) || norm_dim(n->dim1, x->ndim, &d1))
            return fail(err, cap, "dims %lld, %lld are out of range for %s", (long long)n->dim0,
                        (long long)n->dim1, rt_shape_format(x, sb, sizeof sb));
        *out = *x;
        out->d[d] = x->d[d1];
        out->d[d1] = x->d[d];
        return 0;
    }
    case RT_SLICE: {
        if (norm_dim(n->dim, x->ndim, &d))
            return fail(err, cap, "dim %lld is out of range for %s", (long long)n->dim,
                        rt_shape_format(x, sb, sizeof sb));
        int64_t st, len;
        rt_slice_bounds(n, x->d[d], &st, &len);
        *out = *x;
        out->d[d] = len;
        return 0;
    }
    case RT_SELECT: {
        if (norm_dim(n->dim, x->ndim, &d))
            return fail(err, cap, "dim %lld is out of range for %s", (long long)n->dim,
                        rt_shape_format(x, sb, sizeof sb));
        if (n->sel_index < -x->d[d] || n->sel_index >= x->d[d])
            return fail(err, cap, "index %lld is out of range for dim %lld of %s",
                        (long long)n->sel_index, (long long)n->dim, rt_shape_format(x, sb, sizeof sb));
        out->ndim = x->ndim - 1;
        for (int i = 0, j = 0; i < x->ndim; i++)
            if (i != d)
                out->d[j++] = x->d[i];
        return 0;
    }
    case RT_EXPAND: {
        int lead = n->nlist - x->ndim;
        if (lead < 0)
            return fail(err, cap, "\"size\" has %d entries for the %d-D input %s", n->nlist,
                        x->ndim, rt_shape_format(x, sb, sizeof sb));
        out->ndim = n->nlist;
        for (int i = 0; i < n->nlist; i++) {
            int64_t want = n->list[i], have = i >= lead ? x->d[i - lead] : -2;
            if (want == -1 && have == -2)
                return fail(err, cap, "\"size\" entry %d is -1 for a new dimension", i);
            if (want == -1)
                want = have;
            if (have != -2 && have != 1 && have != want)
                return fail(err, cap, "cannot expand %s: dimension %d is %lld, not 1 or %lld",
                            rt_shape_format(x, sb, sizeof sb), i - lead, (long long)have,
                            (long long)want);
            out->d[i] = want;
        }
        return 0;
    }
    case RT_REDUCE: {
        unsigned mask;
        if (rt_reduce_mask(n, x, &mask))
            return fail(err, cap, "\"dim\" does not name distinct dimensions of %s",
                        rt_shape_format(x, sb, sizeof sb));
        out->ndim = 0;
        for (int i = 0; i < x->ndim; i++) {
            if (!(mask & (1u << i)))
                out->d[out->ndim++] = x->d[i];
            else if (n->keepdim)
                out->d[out->ndim++] = 1;
        }
        return 0;
    }
    case RT_LAYER_NORM:
    case RT_RMS_NORM: {
        int ok = x->ndim >= n->nlist;
        for (int i = 0; ok && i < n->nlist; i++)
            ok = x->d[x->ndim - n->nlist + i] == n->list[i];
        if (!ok) {
            rt_shape ns = {.ndim = n->nlist};
            memcpy(ns.d, n->list, sizeof(int64_t) * (size_t)n->nlist);
            return fail(err, cap, "the input %s does not end in normalized_shape %s",
                        rt_shape_format(x, sb, sizeof sb), rt_shape_format(&ns, ob, sizeof ob));
        }
        we->ndim = be->ndim = n->nlist;
        memcpy(we->d, n->list, sizeof(int64_t) * (size_t)n->nlist);
        memcpy(be->d, n->list, sizeof(int64_t) * (size_t)n->nlist);
        *out = *x;
        return 0;
    }
    case RT_EMBEDDING:
        if (x->ndim >= CKPT_MAX_DIMS)
            return fail(err, cap, "the ids %s have %d dimensions already",
                        rt_shape_format(x, sb, sizeof sb), CKPT_MAX_DIMS);
        if (!w)
            return 1;
        if (w->ndim != 2)
            return fail(err, cap, "weight %s is not [vocabulary, dim]",
                        rt_shape_format(w, sb, sizeof sb));
        *we = *w;
        *out = *x;
        out->d[out->ndim++] = w->d[1];
        return 0;
    case RT_MATMUL:
        return matmul_rule(n, x, in[1], out, err, cap);
    case RT_ADDMM: {
        if (x->ndim < 1)
            return fail(err, cap, "expects an input of at least 1 dimension");
        int64_t of = w && w->ndim == 2 ? w->d[1] : 1;
        we->ndim = 2;
        we->d[0] = x->d[x->ndim - 1];
        we->d[1] = of;
        be->ndim = 1;
        be->d[0] = of;
        *out = *x;
        out->d[x->ndim - 1] = of;
        return 0;
    }
    case RT_SDPA:
        return sdpa_rule(n, in, out, err, cap);
    case RT_PARAMETER:
        if (!w)
            return 1;
        *we = *w;
        *out = *w;
        return 0;
    case RT_CONSTANT:
        out->ndim = n->nlist;
        memcpy(out->d, n->list, sizeof(int64_t) * (size_t)n->nlist);
        return 0;
    default:
        return fail(err, cap, "op %s has no shape rule", n->opname);
    }
}

void rt_slice_bounds(const rt_node *n, int64_t size, int64_t *start, int64_t *len)
{
    /* Python's slice clamping: negatives count from the end, then both
     * bounds are clamped to [0, size] */
    int64_t s = n->start, e = n->end;
    if (s < 0)
        s += size;
    if (e < 0)
        e += size;
    s = s < 0 ? 0 : s > size ? size : s;
    e = e < 0 ? 0 : e > size ? size : e;
    *start = s;
    *len = e > s ? (e - s + n->step - 1) / n->step : 0;
}

int rt_shape_infer(const rt_node *n, const rt_shape *const *in, const rt_shape *w,
                   rt_shape *out, rt_shape *expect, char *err, size_t cap)
{
    const rt_shape *x = n->ninputs ? in[0] : NULL;
    rt_shape *we = &expect[RT_P_WEIGHT], *be = &expect[RT_P_BIAS];
    char sb[96];
    int64_t d;
    memset(expect, 0, sizeof *expect * RT_P_COUNT);
    switch (n->op) {
    case RT_LINEAR: {
        if (x->ndim < 1)
            return fail(err, cap, "expects an input of at least 1 dimension");
        int64_t of = !w ? 1 : w->ndim >= 1 ? w->d[0] : 1;
        we->ndim = 2;
        we->d[0] = of;
        we->d[1] = x->d[x->ndim - 1];
        be->ndim = 1;
        be->d[0] = of;
        *out = *x;
        out->d[x->ndim - 1] = of;
        break;
    }
    case RT_CONV2D:
    case RT_CONV_TRANSPOSE2D:
        if (conv_rule(n, x, w, out, we, err, cap))
            return -1;
        be->ndim = 1;
        be->d[0] = out->d[1];
        break;
    case RT_MAX_POOL2D:
        if (pool_rule(n, x, out, err, cap))
            return -1;
        break;
    case RT_RELU:
    case RT_SIGMOID:
        *out = *x;
        break;
    case RT_SOFTMAX:
        if (norm_dim(n->dim, x->ndim, &d))
            return fail(err, cap, "dim %lld is out of range for %s", (long long)n->dim,
                        rt_shape_format(x, sb, sizeof sb));
        *out = *x;
        break;
    case RT_FLATTEN: {
        int64_t s, e;
        if (x->ndim == 0) {
            out->ndim = 1;
            out->d[0] = 1;
            break;
        }
        if (norm_dim(n->start_dim, x->ndim, &s) || norm_dim(n->end_dim, x->ndim, &e) || s > e)
            return fail(err, cap, "start_dim %lld / end_dim %lld do not fit %s",
                        (long long)n->start_dim, (long long)n->end_dim,
                        rt_shape_format(x, sb, sizeof sb));
        out->ndim = 0;
        for (int64_t i = 0; i < x->ndim; i++) {
            if (i > s && i <= e)
                out->d[out->ndim - 1] *= x->d[i];
            else
                out->d[out->ndim++] = x->d[i];
        }
        break;
    }
    case RT_RESHAPE: {
        int64_t known = 1, infer = -1;
        out->ndim = n->nlist;
        for (int i = 0; i < n->nlist; i++) {
            int64_t v = n->list[i];
            if (v == 0) {
                if (i >= x->ndim)
                    return fail(err, cap, "shape entry %d is 0 (copy) but the input %s has "
                                "no dimension %d", i, rt_shape_format(x, sb, sizeof sb), i);
                v = x->d[i];
            }
            out->d[i] = v;
            if (v == -1)
                infer = i;
            else if (v > 0 && known > SIZE_MAX_ELEMS / v)
                return fail(err, cap, "\"shape\" is too big");
            else
                known *= v;
        }
        int64_t total = rt_shape_numel(x);
        if (infer >= 0) {
            if (known == 0 || total % known)
                return fail(err, cap, "cannot view %s as the shape asked",
                            rt_shape_format(x, sb, sizeof sb));
            out->d[infer] = total / known;
        } else if (known != total) {
            char ob[96];
            return fail(err, cap, "cannot view %s (%lld elements) as %s",
                        rt_shape_format(x, sb, sizeof sb), (long long)total,
                        rt_shape_format(out, ob, sizeof ob));
        }
        break;
    }
    case RT_PERMUTE: {
        if (n->nlist != x->ndim)
            return fail(err, cap, "\"dims\" has %d entries for the %d-D input %s", n->nlist,
                        x->ndim, rt_shape_format(x, sb, sizeof sb));
        unsigned seen = 0;
        out->ndim = x->ndim;
        for (int i = 0; i < n->nlist; i++) {
            if (norm_dim(n->list[i], x->ndim, &d) || (seen & (1u << d)))
                return fail(err, cap, "\"dims\" is not a permutation of the input's %d "
                            "dimensions", x->ndim);
            seen |= 1u << d;
            out->d[i] = x->d[d];
        }
        break;
    }
    case RT_L2NORM:
        if (x->ndim != 4)
            return fail(err, cap, "expects a 4-D [N, C, H, W] input, got %s",
                        rt_shape_format(x, sb, sizeof sb));
        we->ndim = 1;
        we->d[0] = x->d[1];
        *out = *x;
        break;
    case RT_PRIOR_BOX:
        out->ndim = 2;
        out->d[0] = rt_prior_boxes(n->prior, NULL);
        out->d[1] = 4;
        break;
    case RT_BATCH_NORM:
        /* F.batch_norm: channels are dim 1 of an input of 2 or more dims */
        if (x->ndim < 2)
            return fail(err, cap, "expects an input of 2 or more dimensions [N, C, ...], "
                        "got %s", rt_shape_format(x, sb, sizeof sb));
        for (int k = RT_P_WEIGHT; k <= RT_P_VAR; k++) {
            expect[k].ndim = 1;
            expect[k].d[0] = x->d[1];
        }
        expect[RT_P_NBT].ndim = 0; /* a 0-dim long tensor */
        *out = *x;
        break;
    case RT_ADAPTIVE_AVG_POOL2D:
        if (x->ndim != 4 && x->ndim != 3)
            return fail(err, cap, "expects a 3-D or 4-D input, got %s",
                        rt_shape_format(x, sb, sizeof sb));
        *out = *x;
        out->d[x->ndim - 2] = n->out_size[0];
        out->d[x->ndim - 1] = n->out_size[1];
        break;
    case RT_DROPOUT:
        *out = *x;
        break;
    case RT_SQUEEZE:
        if (norm_dim(n->dim, x->ndim ? x->ndim : 1, &d))
            return fail(err, cap, "dim %lld is out of range for %s", (long long)n->dim,
                        rt_shape_format(x, sb, sizeof sb));
        *out = *x;
        /* torch: a dimension of size other than 1 is left as it is */
        if (x->ndim && x->d[d] == 1) {
            out->ndim--;
            for (int i = (int)d; i < out->ndim; i++)
                out->d[i] = x->d[i + 1];
        }
        break;
    case RT_UNSQUEEZE:
        if (x->ndim >= CKPT_MAX_DIMS)
            return fail(err, cap, "the input %s has %d dimensions already",
                        rt_shape_format(x, sb, sizeof sb), CKPT_MAX_DIMS);
        if (norm_dim(n->dim, x->ndim + 1, &d))
            return fail(err, cap, "dim %lld is out of range for %s", (long long)n->dim,
                        rt_shape_format(x, sb, sizeof sb));
        out->ndim = x->ndim + 1;
        for (int i = 0, j = 0; i < out->ndim; i++)
            out->d[i] = i == d ? 1 : x->d[j++];
        break;
    case RT_LSTM: {
        /* torch's nn.LSTM, batch_first false: [T, B, C] -> [T, B, dirs * H] */
        int64_t h = n->hidden_size;
        if (x->ndim != 3)
            return fail(err, cap, "expects an input [T, B, C] (sequence first), got %s",
                        rt_shape_format(x, sb, sizeof sb));
        if (!h && w) {
            /* weight_ih_l0 is [4 * hidden_size, input_size]: it sizes the rest */
            if (w->ndim != 2 || w->d[0] % 4 || w->d[0] == 0)
                return fail(err, cap, "weight_ih_l0 %s is not [4 * hidden_size, input_size]",
                            rt_shape_format(w, sb, sizeof sb));
            h = w->d[0] / 4;
        }
        if (!h)
            return 1;
        rt_lstm_expect(n, 0, x, h, we);
        *out = *x;
        out->d[2] = (n->bidirectional ? 2 : 1) * h;
        break;
    }
    case RT_CAT:
        if (norm_dim(n->dim, x->ndim, &d))
            return fail(err, cap, "dim %lld is out of range for %s", (long long)n->dim,
                        rt_shape_format(x, sb, sizeof sb));
        *out = *x;
        for (int i = 1; i < n->ninputs; i++) {
            const rt_shape *y = in[i];
            int ok = y->ndim == x->ndim;
            for (int k = 0; ok && k < x->ndim; k++)
                ok = k == d || y->d[k] == x->d[k];
            if (!ok) {
                char yb[96];
                return fail(err, cap, "cannot concatenate %s and %s along dim %lld",
                            rt_shape_format(x, sb, sizeof sb), rt_shape_format(y, yb, sizeof yb),
                            (long long)n->dim);
            }
            out->d[d] += y->d[d];
        }
        break;
    default: {
        int r = transformer_rule(n, in, w, out, expect, err, cap);
        if (r)
            return r;
        break;
    }
    }
    if (check_numel(out, err, cap))
        return -1;
    /* batch_norm's channels come from its input, not its weight */
    return w || n->param[RT_P_WEIGHT] < 0 || n->op == RT_BATCH_NORM ||
                   n->op == RT_LAYER_NORM || n->op == RT_RMS_NORM ||
                   (n->op == RT_LSTM && n->hidden_size)
               ? 0
               : 1;
}

int rt_lstm_per_dir(const rt_node *n)
{
    return n->has_bias ? 4 : 2;
}

void rt_lstm_expect(const rt_node *n, int k, const rt_shape *x, int64_t h, rt_shape *out)
{
    int per = rt_lstm_per_dir(n), dirs = n->bidirectional ? 2 : 1;
    int64_t layer = k / (per * dirs);
    memset(out, 0, sizeof *out);
    switch (k % per) {
    case 0: /* weight_ih: layer 0 reads the input, the others the last layer's output */
        out->ndim = 2;
        out->d[0] = 4 * h;
        out->d[1] = layer ? dirs * h : x->d[2];
        break;
    case 1: /* weight_hh */
        out->ndim = 2;
        out->d[0] = 4 * h;
        out->d[1] = h;
        break;
    default: /* bias_ih, bias_hh */
        out->ndim = 1;
        out->d[0] = 4 * h;
        break;
    }
}

/* Check lstm node N's parameters against what its input and hidden size
 * imply (the executor), or record those shapes in EXPECT/FIXED (the strict
 * load).  Returns 0, or -1 with the reason in WHY. */
static int lstm_params(const ckpt_model *m, const rt_node *n, const rt_shape *const *param,
                       const rt_shape *x, const rt_shape *y, rt_shape *expect,
                       unsigned char *fixed, char *why, size_t cap)
{
    int64_t h = y->d[2] / (n->bidirectional ? 2 : 1);
    for (int k = 0; k < n->nlstm; k++) {
        int pi = n->lstm_param[k];
        rt_shape e;
        rt_lstm_expect(n, k, x, h, &e);
        if (expect) {
            if (!fixed[pi]) {
                fixed[pi] = 1;
                expect[pi] = e;
            }
            continue;
        }
        const rt_shape *given = param ? param[pi] : &m->params[pi].shape;
        if (given && !rt_shape_equal(given, &e)) {
            char b1[96], b2[96];
            snprintf(why, cap, "%s %s does not fit the input (expects %s)", m->params[pi].key,
                     rt_shape_format(given, b1, sizeof b1), rt_shape_format(&e, b2, sizeof b2));
            return -1;
        }
    }
    return 0;
}

/* ---- the shape pass --------------------------------------------------------- */

int rt_graph_shapes(const ckpt_model *m, const rt_shape *const *param, rt_shape *shape,
                    unsigned char *known, rt_shape *expect, unsigned char *fixed, char *err,
                    size_t cap)
{
    for (size_t ni = 0; ni < m->nnodes; ni++) {
        const rt_node *n = &m->nodes[ni];
        const rt_shape *one[1], **ins = one;
        if (n->ninputs > 1 && !(ins = calloc((size_t)n->ninputs, sizeof *ins)))
            return CKPT_ERR_NOMEM;
        int sized = 1;
        for (int k = 0; k < n->ninputs; k++) {
            ins[k] = &shape[n->inputs[k]];
            if (known)
                sized &= known[n->inputs[k]];
        }
        if (!sized) {
            if (ins != one)
                free(ins);
            continue; /* downstream of a missing weight */
        }
        int wi = n->param[RT_P_WEIGHT];
        const rt_shape *w = wi < 0 ? NULL : param ? param[wi] : &m->params[wi].shape;
        rt_shape pe[RT_P_COUNT];
        char why[256];
        int s = rt_shape_infer(n, ins, w, &shape[n->output], pe, why, sizeof why);
        if (ins != one)
            free(ins);
        if (n->op == RT_LSTM && s == 0 && !known &&
            lstm_params(m, n, param, &shape[n->inputs[0]], &shape[n->output], NULL, NULL, why,
                        sizeof why))
            s = -1;
        /* the executor: every bound parameter must fit what its input implies */
        for (int k = 0; k < RT_P_COUNT && !known && s == 0 && n->op != RT_LSTM; k++) {
            int pi = n->param[k];
            const rt_shape *given = pi < 0 ? NULL : param ? param[pi] : &m->params[pi].shape;
            if (given && !rt_shape_equal(given, &pe[k])) {
                char b1[96], b2[96];
                snprintf(why, sizeof why, "%s %s does not fit the input (expects %s)",
                         k == RT_P_WEIGHT ? "weight" : m->params[pi].key,
                         rt_shape_format(given, b1, sizeof b1),
                         rt_shape_format(&pe[k], b2, sizeof b2));
                s = -1;
            }
        }
        if (!known && s > 0) {
            snprintf(why, sizeof why, "its weight is missing");
            s = -1;
        }
        if (s < 0) {
            char lb[160];
            snprintf(err, cap, "%s: %s", rt_node_label(m, n, lb, sizeof lb), why);
            return CKPT_ERR_USAGE;
        }
        if (known)
            known[n->output] = s == 0;
        /* with the weight missing the graph cannot say what the other
         * parameters should be */
        if (n->op == RT_LSTM && s == 0 && expect)
            lstm_params(m, n, param, &shape[n->inputs[0]], &shape[n->output], expect, fixed,
                        why, sizeof why);
        for (int k = 0; k < RT_P_COUNT && s == 0 && expect && n->op != RT_LSTM; k++)
            if (n->param[k] >= 0 && !fixed[n->param[k]]) {
                fixed[n->param[k]] = 1;
                expect[n->param[k]] = pe[k];
            }
    }
    return CKPT_OK;
}

int64_t rt_prior_boxes(const rt_prior *p, float *boxes)
{
    /* ssd.pytorch's PriorBox.forward: per feature map, per cell (row i,
     * column j), the square box of min_size, the one of sqrt(min * max),
     * then two boxes per aspect ratio */
    int64_t count = 0;
    for (int k = 0; k < p->nmaps; k++) {
        double fk = p->image_size / p->steps[k];
        double sk = p->min_sizes[k] / p->image_size;
        double skp = sqrt(sk * (p->max_sizes[k] / p->image_size));
        for (int64_t i = 0; i < p->feature_maps[k]; i++)
            for (int64_t j = 0; j < p->feature_maps[k]; j++) {
                double cx = ((double)j + 0.5) / fk, cy = ((double)i + 0.5) / fk;
                double box[2 + 2 * RT_PRIOR_MAX_RATIOS][2];
                int nb = 0;
                box[nb][0] = sk, box[nb++][1] = sk;
                box[nb][0] = skp, box[nb++][1] = skp;
                for (int r = 0; r < p->nratios[k]; r++) {
                    double q = sqrt(p->ratios[k][r]);
                    box[nb][0] = sk * q, box[nb++][1] = sk / q;
                    box[nb][0] = sk / q, box[nb++][1] = sk * q;
                }
                for (int b = 0; b < nb; b++, count++) {
                    if (!boxes)
                        continue;
                    double v[4] = {cx, cy, box[b][0], box[b][1]};
                    for (int c = 0; c < 4; c++) {
                        float f = (float)v[c]; /* torch.Tensor(list) rounds to float32 */
                        if (p->clip) /* clamp_(max=1, min=0), on the float32 values */
                            f = f > 1.0f ? 1.0f : f < 0.0f ? 0.0f : f;
                        boxes[count * 4 + c] = f;
                    }
                }
            }
    }
    return count;
}

void rt_conv_geom(const rt_node *n, const rt_shape *x, const rt_shape *w, const rt_shape *y,
                  ckpt_conv_geom *g)
{
    memset(g, 0, sizeof *g);
    g->batch = x->d[0];
    g->in_c = x->d[1];
    g->in_h = x->d[2];
    g->in_w = x->d[3];
    g->out_c = y->d[1];
    g->out_h = y->d[2];
    g->out_w = y->d[3];
    g->k_h = w->d[2];
    g->k_w = w->d[3];
    g->stride_h = n->stride[0];
    g->stride_w = n->stride[1];
    g->pad_h = n->padding[0];
    g->pad_w = n->padding[1];
    g->dil_h = n->dilation[0];
    g->dil_w = n->dilation[1];
}

void rt_pool_geom(const rt_node *n, const rt_shape *x, const rt_shape *y, ckpt_pool_geom *g)
{
    memset(g, 0, sizeof *g);
    g->planes = 1;
    for (int i = 0; i < x->ndim - 2; i++)
        g->planes *= x->d[i];
    g->in_h = x->d[x->ndim - 2];
    g->in_w = x->d[x->ndim - 1];
    g->out_h = y->d[y->ndim - 2];
    g->out_w = y->d[y->ndim - 1];
    g->k_h = n->kernel[0];
    g->k_w = n->kernel[1];
    g->stride_h = n->stride[0];
    g->stride_w = n->stride[1];
    g->pad_h = n->padding[0];
    g->pad_w = n->padding[1];
    g->dil_h = n->dilation[0];
    g->dil_w = n->dilation[1];
}
