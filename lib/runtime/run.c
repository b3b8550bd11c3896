/* runtime/run.c - the executor: sizes every value for the batch at hand
 * (the shape pass of shape.c), uploads parameters once per backend, runs
 * the nodes in spec order and frees each intermediate value after its last
 * use. */
#include "runtime/runtime.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Batch norm folded into the convolution before it.  In eval mode a batch
 * norm is a per-channel affine map, so conv then batch norm is one conv with
 * weight w * s and bias (b - mean) * s + beta, s = gamma / sqrt(var + eps):
 * one pass over the activations fewer (the output agrees with torch's two
 * steps within float rounding).  Done when the conv's output feeds the batch
 * norm alone and is no output of the model.  FOLD[i] of such a conv is its
 * batch norm's node, FOLD[j] of the batch norm the conv's; -1 elsewhere.
 */
static void fold_plan(const ckpt_model *m, int *fold)
{
    for (size_t i = 0; i < m->nnodes; i++)
        fold[i] = -1;
    for (size_t j = 0; j < m->nnodes; j++) {
        const rt_node *bn = &m->nodes[j];
        if (bn->op != RT_BATCH_NORM || bn->ninputs != 1 || bn->param[RT_P_MEAN] < 0 ||
            bn->param[RT_P_VAR] < 0)
            continue;
        int v = bn->inputs[0], producer = -1, readers = 0;
        for (size_t k = 0; k < m->nnodes; k++) {
            if (m->nodes[k].output == v)
                producer = (int)k;
            for (int q = 0; q < m->nodes[k].ninputs; q++)
                readers += m->nodes[k].inputs[q] == v;
        }
        for (size_t o = 0; o < m->noutputs; o++)
            readers += m->outputs[o] == v ? 2 : 0;
        if (producer < 0 || m->nodes[producer].op != RT_CONV2D || readers != 1 ||
            fold[producer] >= 0 || m->nodes[producer].param[RT_P_WEIGHT] < 0)
            continue;
        /* the batch norm's channels must be the conv's (else the normal path
         * reports the mismatch) */
        const rt_shape *ws = &m->params[m->nodes[producer].param[RT_P_WEIGHT]].shape;
        int64_t c = ws->ndim ? ws->d[0] : -1;
        if (rt_shape_numel(&m->params[bn->param[RT_P_MEAN]].shape) != c ||
            rt_shape_numel(&m->params[bn->param[RT_P_VAR]].shape) != c ||
            (bn->param[RT_P_WEIGHT] >= 0 &&
             rt_shape_numel(&m->params[bn->param[RT_P_WEIGHT]].shape) != c) ||
            (bn->param[RT_P_BIAS] >= 0 && rt_shape_numel(&m->params[bn->param[RT_P_BIAS]].shape) != c))
            continue;
        fold[producer] = (int)j;
        fold[j] = producer;
    }
}

/* How many nodes read value V (a model output counts twice); *ONLY: the
 * node, when one node reads it once. */
static int readers_of(const ckpt_model *m, int v, int *only)
{
    int count = 0;
    *only = -1;
    for (size_t k = 0; k < m->nnodes; k++)
        for (int q = 0; q < m->nodes[k].ninputs; q++)
            if (m->nodes[k].inputs[q] == v) {
                count++;
                *only = (int)k;
            }
    for (size_t o = 0; o < m->noutputs; o++)
        count += m->outputs[o] == v ? 2 : 0;
    return count;
}

/*
 * A residual add and a ReLU folded into the convolution before them, on a
 * backend with conv2d_fused: the conv's output (after its folded batch
 * norm) read only by an add whose other operand already exists when the
 * conv runs, and/or then only by a relu, is computed in one pass: RES[i]
 * of conv node I is the add's other operand (-1: none), ACT[i] the
 * ckpt_act_kind that follows (CKPT_ACT_RELU or none); VIEW[k] of each node
 * so absorbed (and of a folded batch norm) is the value whose buffer its
 * output shares, -1 elsewhere.  So too a linear read only by a relu, on a
 * backend with linear_relu, and a transposed conv read only by a relu or a
 * sigmoid, on a backend with conv_transpose2d_act.  Each value is what the
 * ops one by one give.
 */
static void fuse_plan(const ckpt_model *m, const ckpt_backend *b, const rt_shape *shape,
                      const int *fold, int *res, unsigned char *act, int *view)
{
    for (size_t i = 0; i < m->nnodes; i++) {
        res[i] = -1;
        act[i] = CKPT_ACT_NONE;
        view[i] = fold[i] >= 0 && m->nodes[i].op == RT_BATCH_NORM ? m->nodes[i].inputs[0] : -1;
    }
    for (size_t i = 0; i < m->nnodes; i++) {
        int k, op = m->nodes[i].op;
        if ((op == RT_LINEAR && b->ops->linear_relu) ||
            (op == RT_CONV_TRANSPOSE2D && b->ops->conv_transpose2d_act)) {
            if (readers_of(m, m->nodes[i].output, &k) != 1)
                continue;
            int then = m->nodes[k].op;
            if (then == RT_RELU || (then == RT_SIGMOID && op == RT_CONV_TRANSPOSE2D)) {
                act[i] = then == RT_RELU ? CKPT_ACT_RELU : CKPT_ACT_SIGMOID;
                view[k] = m->nodes[i].output;
            }
        }
    }
    if (!b->ops->conv2d_fused)
        return;
    for (size_t i = 0; i < m->nnodes; i++) {
        if (m->nodes[i].op != RT_CONV2D)
            continue;
        int end = fold[i] >= 0 ? m->nodes[fold[i]].output : m->nodes[i].output, k;
        if (readers_of(m, end, &k) != 1)
            continue;
        const rt_node *n = &m->nodes[k];
        if (n->op == RT_ADD && n->ninputs == 2) {
            int other = n->inputs[0] == end ? n->inputs[1] : n->inputs[0];
            /* the other operand: a model input or made by a node before the conv */
            int made = other < (int)m->ninputs;
            for (size_t p = 0; p < i && !made; p++)
                made = m->nodes[p].output == other;
            if (other == end || !made || !rt_shape_equal(&shape[other], &shape[end]))
                continue;
            res[i] = other;
            view[k] = end;
            end = n->output;
            if (readers_of(m, end, &k) != 1)
                continue;
            n = &m->nodes[k];
        }
        if (n->op == RT_RELU) {
            act[i] = CKPT_ACT_RELU;
            view[k] = end;
        }
    }
}

/* The folded weight and bias of conv node I (batch norm J) on the host. */
static int fold_weights(const ckpt_model *m, size_t i, int j, float **w_out, float **b_out)
{
    const rt_node *cv = &m->nodes[i], *bn = &m->nodes[j];
    const rt_param *w = &m->params[cv->param[RT_P_WEIGHT]];
    size_t n = (size_t)rt_shape_numel(&w->shape), c = (size_t)w->shape.d[0];
    size_t per = c ? n / c : 0;
    const float *bias = cv->param[RT_P_BIAS] >= 0 ? m->params[cv->param[RT_P_BIAS]].host : NULL;
    const float *gamma = bn->param[RT_P_WEIGHT] >= 0 ? m->params[bn->param[RT_P_WEIGHT]].host
                                                     : NULL;
    const float *beta = bn->param[RT_P_BIAS] >= 0 ? m->params[bn->param[RT_P_BIAS]].host : NULL;
    const float *mean = m->params[bn->param[RT_P_MEAN]].host;
    const float *var = m->params[bn->param[RT_P_VAR]].host;
    float *w2 = malloc((n ? n : 1) * sizeof *w2), *b2 = malloc((c ? c : 1) * sizeof *b2);
    if (!w2 || !b2) {
        free(w2);
        free(b2);
        return CKPT_ERR_NOMEM;
    }
    for (size_t o = 0; o < c; o++) {
        double s = (gamma ? gamma[o] : 1.0) / sqrt((double)var[o] + bn->eps);
        for (size_t k = 0; k < per; k++)
            w2[o * per + k] = (float)(w->host[o * per + k] * s);
        b2[o] = (float)(((bias ? bias[o] : 0.0) - mean[o]) * s + (beta ? beta[o] : 0.0));
    }
    *w_out = w2;
    *b_out = b2;
    return CKPT_OK;
}

/* One device buffer made from HOST[0..N) on B into *OUT. */
static int upload_one(ckpt_backend *b, const float *host, size_t n, float **out)
{
    int rc = b->ops->alloc(b, n, out);
    return rc == CKPT_OK ? b->ops->upload(b, *out, host, n) : rc;
}

/* The model's parameters on B, uploaded on first use; after them, the folded
 * weight and bias of every conv a batch norm folds into (slots nparams + 2i,
 * nparams + 2i + 1 for node i). */
static float **upload_params(ckpt_model *m, ckpt_backend *b, const int *fold)
{
    for (size_t i = 0; i < m->ndev; i++)
        if (m->dev[i].backend == b)
            return m->dev[i].params;
    if (m->ndev == RT_MAX_DEVICES) {
        ckpt_model_fail(m, CKPT_ERR_LIMIT, "a model runs on %d backends at most",
                        RT_MAX_DEVICES);
        return NULL;
    }
    struct rt_device *d = &m->dev[m->ndev];
    if (!(d->params = calloc(m->nparams + 2 * m->nnodes + 1, sizeof(float *)))) {
        ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    d->backend = b;
    b->refs++;
    /* a parameter only a folded conv or batch norm reads stays on the host:
     * the folded copies replace it */
    unsigned char *needed = calloc(m->nparams + 1, 1);
    if (!needed) {
        ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
        rt_device_release(m, d);
        return NULL;
    }
    for (size_t i = 0; i < m->nnodes; i++) {
        const rt_node *n = &m->nodes[i];
        int away = fold[i] >= 0 && (n->op == RT_CONV2D || n->op == RT_BATCH_NORM);
        for (int k = 0; k < RT_P_COUNT; k++)
            if (n->param[k] >= 0 && !away)
                needed[n->param[k]] = 1;
        for (int k = 0; k < n->nlstm; k++)
            if (n->lstm_param[k] >= 0)
                needed[n->lstm_param[k]] = 1;
    }
    for (size_t i = 0; i < m->nparams; i++) {
        if (!needed[i])
            continue;
        int rc = upload_one(b, m->params[i].host, (size_t)rt_shape_numel(&m->params[i].shape),
                            &d->params[i]);
        if (rc != CKPT_OK) {
            free(needed);
            ckpt_model_fail(m, rc, "%s: %s", b->device, b->message);
            rt_device_release(m, d);
            return NULL;
        }
    }
    free(needed);
    for (size_t i = 0; i < m->nnodes; i++) {
        if (m->nodes[i].op != RT_CONV2D || fold[i] < 0)
            continue;
        float *w2, *b2;
        int rc = fold_weights(m, i, fold[i], &w2, &b2);
        if (rc == CKPT_OK) {
            const rt_shape *ws = &m->params[m->nodes[i].param[RT_P_WEIGHT]].shape;
            rc = upload_one(b, w2, (size_t)rt_shape_numel(ws), &d->params[m->nparams + 2 * i]);
            if (rc == CKPT_OK)
                rc = upload_one(b, b2, (size_t)ws->d[0], &d->params[m->nparams + 2 * i + 1]);
            free(w2);
            free(b2);
        }
        if (rc != CKPT_OK) {
            ckpt_model_fail(m, rc, "%s: %s", b->device,
                            rc == CKPT_ERR_NOMEM ? "out of memory" : b->message);
            rt_device_release(m, d);
            return NULL;
        }
    }
    m->ndev++;
    return d->params;
}

/* A buffer shared by a value and the views (flatten, reshape, squeeze,
 * unsqueeze, dropout) made of it. */
typedef struct rt_buf {
    float *p;
    int refs;   /* live values using it */
    int borrowed; /* the caller's input, read in place: never released */
} rt_buf;

typedef struct run {
    ckpt_model *m;
    ckpt_backend *b;
    float **params;    /* the model's parameters on b */
    rt_shape *shape;   /* per value */
    int *buf;          /* per value: index into bufs, -1 when not yet made */
    int *last_use;     /* per value: index of the last node reading it */
    unsigned char *is_output;
    rt_buf *bufs;
    size_t nbufs;
    int *fold;         /* per node: fold_plan */
    int *res;          /* per node: fuse_plan */
    unsigned char *act; /* per node: fuse_plan */
    int *view;
} run;

static void drop_value(run *r, int v)
{
    if (r->buf[v] < 0)
        return;
    rt_buf *bf = &r->bufs[r->buf[v]];
    r->buf[v] = -1;
    if (--bf->refs == 0 && bf->p) {
        if (!bf->borrowed)
            r->b->ops->release(r->b, bf->p);
        bf->p = NULL;
    }
}

static int new_buffer(run *r, int v, size_t n)
{
    float *p;
    int rc = r->b->ops->alloc(r->b, n, &p);
    if (rc != CKPT_OK)
        return rc;
    r->bufs[r->nbufs].p = p;
    r->bufs[r->nbufs].refs = 1;
    r->buf[v] = (int)r->nbufs++;
    return CKPT_OK;
}

static float *val(run *r, int v)
{
    return r->bufs[r->buf[v]].p;
}

static int64_t prod(const rt_shape *s, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++)
        p *= s->d[i];
    return p;
}

/* nn.LSTM over X [T, B, C] into Y [T, B, dirs * H], zero initial state:
 * per layer and direction, the input's gates for every step at once (one
 * linear), then the steps in order (forward) or reversed (_reverse), each
 * a linear of h and a cell update that writes its half of Y. */
static int exec_lstm(run *r, const rt_node *n, const rt_shape *x, const float *xp,
                     const rt_shape *y, float *yp)
{
    ckpt_backend *b = r->b;
    int dirs = n->bidirectional ? 2 : 1, per = rt_lstm_per_dir(n);
    int64_t T = x->d[0], B = x->d[1], H = y->d[2] / dirs, out_w = dirs * H;
    size_t ny = (size_t)(T * B * out_w);
    float *gx = NULL, *gh = NULL, *hc = NULL, *mid[2] = {NULL, NULL};
    int rc = CKPT_OK;
    if (!T || !B)
        return CKPT_OK;
    if ((rc = b->ops->alloc(b, (size_t)(T * B * 4 * H), &gx)) != CKPT_OK ||
        (rc = b->ops->alloc(b, (size_t)(B * 4 * H), &gh)) != CKPT_OK ||
        (rc = b->ops->alloc(b, (size_t)(2 * B * H), &hc)) != CKPT_OK)
        goto out;
    const float *in = xp;
    int64_t in_w = x->d[2];
    for (int64_t l = 0; l < n->num_layers; l++) {
        /* the last layer writes Y; the others one of two buffers in turn */
        float *out = yp;
        if (l + 1 < n->num_layers) {
            if (!mid[l % 2] && (rc = b->ops->alloc(b, ny, &mid[l % 2])) != CKPT_OK)
                goto out;
            out = mid[l % 2];
        }
        for (int d = 0; d < dirs; d++) {
            const int *pi = n->lstm_param + (l * dirs + d) * per;
            const float *w_ih = r->params[pi[0]], *w_hh = r->params[pi[1]];
            const float *b_ih = per == 4 ? r->params[pi[2]] : NULL;
            const float *b_hh = per == 4 ? r->params[pi[3]] : NULL;
            if ((rc = b->ops->linear(b, in, w_ih, b_ih, gx, T * B, in_w, 4 * H)) != CKPT_OK)
                goto out;
            for (int64_t s = 0; s < T; s++) {
                int64_t t = d ? T - 1 - s : s;
                if (s && (rc = b->ops->linear(b, hc, w_hh, b_hh, gh, B, H, 4 * H)) != CKPT_OK)
                    goto out;
                if ((rc = b->ops->lstm_cell(b, gx + t * B * 4 * H, s ? gh : NULL, b_hh,
                                            hc + B * H, hc, out + t * B * out_w + d * H, B, H,
                                            out_w)) != CKPT_OK)
                    goto out;
            }
        }
        in = out;
        in_w = out_w;
    }
out:
    /* the releases wait for nothing: queued work on a stream keeps its order */
    for (int i = 0; i < 2; i++)
        if (mid[i])
            b->ops->release(b, mid[i]);
    if (hc)
        b->ops->release(b, hc);
    if (gh)
        b->ops->release(b, gh);
    if (gx)
        b->ops->release(b, gx);
    return rc;
}

/* A number of the spec as float32, rounded to nearest (out of range: an
 * infinity, as torch's float32 arithmetic gives; a plain cast would be
 * undefined). */
static float to_f32(double v)
{
    const double top = 3.4028235677973366e38; /* FLT_MAX plus half its ulp */
    return v >= top ? INFINITY : v <= -top ? -INFINITY : (float)v;
}

/* A backend may lack an op (a CUDA module built before it): say which. */
static int missing(ckpt_backend *b, const rt_node *n)
{
    return ckpt_backend_fail(b, CKPT_ERR_UNSUPPORTED, "op %s is not available on %s", n->opname,
                             b->device);
}

/* The contiguous strides of S (elements) into ST. */
static void contiguous_strides(const rt_shape *s, int64_t *st)
{
    int64_t k = 1;
    for (int i = s->ndim - 1; i >= 0; i--) {
        st[i] = k;
        k *= s->d[i];
    }
}

/* y = x[offset + sum i_d * strides[d]] over Y's shape; a 0-dim y is one
 * element. */
static int strided(run *r, const rt_node *n, const float *xp, int64_t offset, float *yp,
                   const rt_shape *y, const int64_t *strides)
{
    ckpt_backend *b = r->b;
    static const int64_t one = 1, zero = 0;
    if (!b->ops->strided_copy)
        return missing(b, n);
    if (!rt_shape_numel(y))
        return CKPT_OK;
    if (!y->ndim)
        return b->ops->strided_copy(b, xp, offset, yp, 1, &one, &zero);
    return b->ops->strided_copy(b, xp, offset, yp, y->ndim, y->d, strides);
}

/* add (broadcasting), sub, mul, div of two inputs. */
static int exec_binary(run *r, const rt_node *n, float *yp)
{
    ckpt_backend *b = r->b;
    const rt_shape *y = &r->shape[n->output];
    rt_shape ys = *y;
    int64_t as[CKPT_MAX_DIMS], xs[CKPT_MAX_DIMS];
    if (!b->ops->binary)
        return missing(b, n);
    if (!rt_shape_numel(y))
        return CKPT_OK;
    if (!ys.ndim) { /* two 0-dim values */
        ys.ndim = 1;
        ys.d[0] = 1;
    }
    rt_broadcast_strides(&r->shape[n->inputs[0]], &ys, as);
    rt_broadcast_strides(&r->shape[n->inputs[1]], &ys, xs);
    return b->ops->binary(b, n->kind, val(r, n->inputs[0]), val(r, n->inputs[1]), yp, ys.ndim,
                          ys.d, as, xs);
}

/* Whether an operand read with strides ST (in matrices) over the batch
 * dimensions [from, nb) of Y is the same matrix throughout (*ZERO) or one
 * per batch entry, laid out as Y's. */
static int batch_run(const rt_shape *y, int nb, int from, const int64_t *st, int *zero)
{
    int all_zero = 1, dense = 1;
    int64_t k = 1;
    for (int d = nb - 1; d >= from; d--) {
        if (y->d[d] != 1) {
            all_zero &= st[d] == 0;
            dense &= st[d] == k;
        }
        k *= y->d[d];
    }
    *zero = all_zero;
    return all_zero || dense;
}

/* torch.matmul, [..., m, k] @ [..., k, n], batch dimensions broadcast: the
 * innermost batch dimensions along which each operand is either one matrix
 * or one per entry go to the backend in one call, the rest in a loop. */
static int exec_matmul(run *r, const rt_node *n, const rt_shape *a, const float *ap,
                       const rt_shape *x, const float *xp, const rt_shape *y, float *yp)
{
    ckpt_backend *b = r->b;
    if (!b->ops->matmul)
        return missing(b, n);
    int nb = y->ndim - 2;
    int64_t m = a->d[a->ndim - 2], k = a->d[a->ndim - 1], nn = x->d[x->ndim - 1];
    rt_shape ab = *a, xb = *x, yb = *y;
    ab.ndim -= 2;
    xb.ndim -= 2;
    yb.ndim = nb;
    int64_t as[CKPT_MAX_DIMS], xs[CKPT_MAX_DIMS];
    rt_broadcast_strides(&ab, &yb, as);
    rt_broadcast_strides(&xb, &yb, xs);
    int split = 0, a0 = 1, x0 = 1;
    while (split < nb && !(batch_run(&yb, nb, split, as, &a0) && batch_run(&yb, nb, split, xs, &x0)))
        split++;
    if (split == nb)
        a0 = x0 = 1;
    int64_t inner = prod(&yb, split, nb), outer = prod(&yb, 0, split);
    if (!inner || !outer || !m || !nn)
        return CKPT_OK;
    for (int64_t o = 0; o < outer; o++) {
        int64_t rest = o, aoff = 0, xoff = 0;
        for (int d = split - 1; d >= 0; d--) {
            int64_t c = rest % yb.d[d];
            rest /= yb.d[d];
            aoff += c * as[d];
            xoff += c * xs[d];
        }
        int rc = b->ops->matmul(b, ap + aoff * m * k, xp + xoff * k * nn, yp + o * inner * m * nn,
                                inner, m, k, nn, a0 ? 0 : m * k, x0 ? 0 : k * nn);
        if (rc != CKPT_OK)
            return rc;
    }
    return CKPT_OK;
}

/* mean / sum: each run of adjacent reduced dimensions in one reduce(), the
 * last run first (a mean of means is the mean), into temporaries until the
 * last. */
static int exec_reduce(run *r, const rt_node *n, const rt_shape *x, const float *xp, float *yp)
{
    ckpt_backend *b = r->b;
    unsigned mask;
    if (!b->ops->reduce)
        return missing(b, n);
    rt_reduce_mask(n, x, &mask);
    int64_t count = rt_shape_numel(&r->shape[n->output]);
    if (!mask) {
        if (!count)
            return CKPT_OK;
        return b->ops->copy_rows(b, xp, count, yp, count, 1, count);
    }
    rt_shape cur = *x;
    const float *src = xp;
    float *tmp = NULL;
    int rc = CKPT_OK;
    for (int hi = x->ndim - 1; hi >= 0 && rc == CKPT_OK;) {
        if (!(mask & (1u << hi))) {
            hi--;
            continue;
        }
        int lo = hi;
        while (lo > 0 && (mask & (1u << (lo - 1))))
            lo--;
        unsigned below = lo ? mask & ((1u << lo) - 1) : 0;
        int64_t outer = prod(&cur, 0, lo), dim = prod(&cur, lo, hi + 1),
                inner = prod(&cur, hi + 1, cur.ndim);
        float *dst = yp;
        if (below && (rc = b->ops->alloc(b, (size_t)(outer * inner), &dst)) != CKPT_OK)
            break;
        if (outer && inner)
            rc = b->ops->reduce(b, n->kind, src, dst, outer, dim, inner);
        if (tmp)
            b->ops->release(b, tmp);
        tmp = dst == yp ? NULL : dst;
        src = dst;
        for (int d = lo; d <= hi; d++)
            cur.d[d] = 1;
        hi = lo - 1;
    }
    if (tmp)
        b->ops->release(b, tmp);
    return rc;
}

/* scaled_dot_product_attention (ckpt_attn_geom). */
static int exec_sdpa(run *r, const rt_node *n, float *yp)
{
    ckpt_backend *b = r->b;
    const rt_shape *q = &r->shape[n->inputs[0]], *k = &r->shape[n->inputs[1]],
                   *v = &r->shape[n->inputs[2]];
    if (!b->ops->attention)
        return missing(b, n);
    int nd = q->ndim;
    ckpt_attn_geom g;
    memset(&g, 0, sizeof g);
    g.batch = q->d[0];
    g.heads = nd == 4 ? q->d[1] : 1;
    g.kv_heads = nd == 4 ? k->d[1] : 1;
    g.q_len = q->d[nd - 2];
    g.kv_len = k->d[nd - 2];
    g.head_dim = q->d[nd - 1];
    g.v_dim = v->d[nd - 1];
    /* torch's default: 1 / sqrt(E), in double */
    g.scale = n->has_scalar ? n->scalar : 1.0 / sqrt((double)g.head_dim);
    g.causal = n->causal;
    const float *mask = NULL;
    if (n->ninputs == 4) {
        rt_shape full = {.ndim = 4, .d = {g.batch, g.heads, g.q_len, g.kv_len}};
        if (nd == 3) { /* [B, L, S]: one head */
            rt_shape f3 = {.ndim = 3, .d = {g.batch, g.q_len, g.kv_len}};
            int64_t s3[3];
            rt_broadcast_strides(&r->shape[n->inputs[3]], &f3, s3);
            g.mask_strides[0] = s3[0];
            g.mask_strides[1] = 0;
            g.mask_strides[2] = s3[1];
            g.mask_strides[3] = s3[2];
        } else {
            rt_broadcast_strides(&r->shape[n->inputs[3]], &full, g.mask_strides);
        }
        mask = val(r, n->inputs[3]);
    }
    if (!rt_shape_numel(&r->shape[n->output]))
        return CKPT_OK;
    return b->ops->attention(b, val(r, n->inputs[0]), val(r, n->inputs[1]),
                             val(r, n->inputs[2]), mask, yp, &g);
}

/* The transformer ops (doc/design.md, "Model specs"). */
static int exec_transformer(run *r, const rt_node *n, float *yp)
{
    ckpt_backend *b = r->b;
    const rt_shape *x = n->ninputs ? &r->shape[n->inputs[0]] : NULL, *y = &r->shape[n->output];
    const float *xp = n->ninputs ? val(r, n->inputs[0]) : NULL;
    float *w = n->param[RT_P_WEIGHT] >= 0 ? r->params[n->param[RT_P_WEIGHT]] : NULL;
    float *bias = n->param[RT_P_BIAS] >= 0 ? r->params[n->param[RT_P_BIAS]] : NULL;
    const rt_shape *ws = n->param[RT_P_WEIGHT] >= 0 ? &r->m->params[n->param[RT_P_WEIGHT]].shape
                                                    : NULL;
    int64_t count = rt_shape_numel(y), st[CKPT_MAX_DIMS], d;
    switch (n->op) {
    case RT_UNARY:
        if (!b->ops->unary)
            return missing(b, n);
        return count ? b->ops->unary(b, n->kind, xp, yp, (size_t)count, to_f32(n->scalar))
                     : CKPT_OK;
    case RT_BINARY:
        return exec_binary(r, n, yp);
    case RT_TRANSPOSE: {
        int perm[CKPT_MAX_DIMS];
        int64_t d0 = n->dim0 < 0 ? n->dim0 + x->ndim : n->dim0;
        int64_t d1 = n->dim1 < 0 ? n->dim1 + x->ndim : n->dim1;
        for (int i = 0; i < x->ndim; i++)
            perm[i] = i == d0 ? (int)d1 : i == d1 ? (int)d0 : i;
        if (!count)
            return CKPT_OK;
        return b->ops->permute(b, xp, yp, x->ndim, x->d, perm);
    }
    case RT_SLICE: {
        int64_t start, len;
        d = n->dim < 0 ? n->dim + x->ndim : n->dim;
        rt_slice_bounds(n, x->d[d], &start, &len);
        contiguous_strides(x, st);
        int64_t off = start * st[d];
        st[d] *= n->step;
        return strided(r, n, xp, off, yp, y, st);
    }
    case RT_SELECT: {
        int64_t xs[CKPT_MAX_DIMS];
        d = n->dim < 0 ? n->dim + x->ndim : n->dim;
        contiguous_strides(x, xs);
        int64_t idx = n->sel_index < 0 ? n->sel_index + x->d[d] : n->sel_index;
        for (int i = 0, j = 0; i < x->ndim; i++)
            if (i != d)
                st[j++] = xs[i];
        return strided(r, n, xp, idx * xs[d], yp, y, st);
    }
    case RT_EXPAND:
        rt_broadcast_strides(x, y, st);
        return strided(r, n, xp, 0, yp, y, st);
    case RT_REDUCE:
        return exec_reduce(r, n, x, xp, yp);
    case RT_LAYER_NORM:
    case RT_RMS_NORM: {
        int64_t dn = 1;
        for (int i = 0; i < n->nlist; i++)
            dn *= n->list[i];
        if (n->op == RT_LAYER_NORM ? !b->ops->layer_norm : !b->ops->rms_norm)
            return missing(b, n);
        if (!count)
            return CKPT_OK;
        if (n->op == RT_LAYER_NORM)
            return b->ops->layer_norm(b, xp, w, bias, yp, count / dn, dn, (float)n->eps);
        return b->ops->rms_norm(b, xp, w, yp, count / dn, dn, (float)n->eps);
    }
    case RT_EMBEDDING:
        if (!b->ops->embedding)
            return missing(b, n);
        return count ? b->ops->embedding(b, xp, w, yp, rt_shape_numel(x), ws->d[0], ws->d[1])
                     : CKPT_OK;
    case RT_MATMUL:
        return exec_matmul(r, n, x, xp, &r->shape[n->inputs[1]], val(r, n->inputs[1]), y, yp);
    case RT_ADDMM: {
        /* GPT-2's Conv1D: x @ W[in, out], then + bias along the last dim */
        if (!b->ops->matmul || !b->ops->binary)
            return missing(b, n);
        int64_t rows = prod(x, 0, x->ndim - 1), in = x->d[x->ndim - 1], out = ws->d[1];
        float *tmp;
        if (!count)
            return CKPT_OK;
        int rc = b->ops->alloc(b, (size_t)count, &tmp);
        if (rc != CKPT_OK)
            return rc;
        rc = b->ops->matmul(b, xp, w, tmp, 1, rows, in, out, 0, 0);
        if (rc == CKPT_OK) {
            int64_t shape[2] = {rows, out}, ts[2] = {out, 1}, bs[2] = {0, 1};
            rc = b->ops->binary(b, CKPT_B_ADD, tmp, bias, yp, 2, shape, ts, bs);
        }
        b->ops->release(b, tmp);
        return rc;
    }
    case RT_SDPA:
        return exec_sdpa(r, n, yp);
    case RT_PARAMETER:
        return count ? b->ops->copy_rows(b, w, count, yp, count, 1, count) : CKPT_OK;
    case RT_CONSTANT:
        return count ? b->ops->upload(b, yp, n->values, (size_t)count) : CKPT_OK;
    default:
        return ckpt_backend_fail(b, CKPT_ERR_UNSUPPORTED, "op %s is not implemented",
                                 n->opname);
    }
}

static int exec_node(run *r, size_t ni)
{
    ckpt_backend *b = r->b;
    const rt_node *n = &r->m->nodes[ni];
    const rt_shape *x = n->ninputs ? &r->shape[n->inputs[0]] : NULL, *y = &r->shape[n->output];
    float *w = n->param[RT_P_WEIGHT] >= 0 ? r->params[n->param[RT_P_WEIGHT]] : NULL;
    float *bias = n->param[RT_P_BIAS] >= 0 ? r->params[n->param[RT_P_BIAS]] : NULL;
    int folded = r->fold[ni] >= 0;

    if (folded && n->op == RT_CONV2D) {
        w = r->params[r->m->nparams + 2 * ni];
        bias = r->params[r->m->nparams + 2 * ni + 1];
    }
    if (n->op == RT_FLATTEN || n->op == RT_RESHAPE || n->op == RT_SQUEEZE ||
        n->op == RT_UNSQUEEZE || n->op == RT_DROPOUT || n->op == RT_IDENTITY ||
        r->view[ni] >= 0) {
        /* a view: same buffer, new shape (a folded batch norm, a fused add
         * or relu: the conv did it) */
        int bi = r->buf[r->view[ni] >= 0 ? r->view[ni] : n->inputs[0]];
        r->buf[n->output] = bi;
        r->bufs[bi].refs++;
        return CKPT_OK;
    }
    int rc = new_buffer(r, n->output, (size_t)rt_shape_numel(y));
    if (rc != CKPT_OK)
        return rc;
    const float *xp = n->ninputs ? val(r, n->inputs[0]) : NULL;
    float *yp = val(r, n->output);
    size_t count = (size_t)rt_shape_numel(y);

    switch (n->op) {
    case RT_LINEAR:
        return (r->act[ni] ? b->ops->linear_relu : b->ops->linear)(
            b, xp, w, bias, yp, prod(x, 0, x->ndim - 1), x->d[x->ndim - 1], y->d[y->ndim - 1]);
    case RT_CONV2D:
    case RT_CONV_TRANSPOSE2D: {
        ckpt_conv_geom g;
        rt_conv_geom(n, x, &r->m->params[n->param[RT_P_WEIGHT]].shape, y, &g);
        if (n->op == RT_CONV2D && (r->res[ni] >= 0 || r->act[ni]))
            return b->ops->conv2d_fused(b, xp, w, bias,
                                        r->res[ni] >= 0 ? val(r, r->res[ni]) : NULL,
                                        r->act[ni] == CKPT_ACT_RELU, yp, &g);
        if (n->op == RT_CONV2D)
            return b->ops->conv2d(b, xp, w, bias, yp, &g);
        if (r->act[ni])
            return b->ops->conv_transpose2d_act(b, xp, w, bias, r->act[ni], yp, &g);
        return b->ops->conv_transpose2d(b, xp, w, bias, yp, &g);
    }
    case RT_MAX_POOL2D: {
        ckpt_pool_geom g;
        rt_pool_geom(n, x, y, &g);
        return b->ops->max_pool2d(b, xp, yp, &g);
    }
    case RT_BATCH_NORM:
        return b->ops->batch_norm(b, xp, r->params[n->param[RT_P_MEAN]],
                                  r->params[n->param[RT_P_VAR]], w, bias, yp, x->d[0], x->d[1],
                                  prod(x, 2, x->ndim), (float)n->eps);
    case RT_ADD:
        /* the residual add of two values of one shape, else broadcasting */
        if (rt_shape_equal(x, y) && rt_shape_equal(&r->shape[n->inputs[1]], y))
            return b->ops->add(b, xp, val(r, n->inputs[1]), yp, count);
        return exec_binary(r, n, yp);
    case RT_ADAPTIVE_AVG_POOL2D: {
        ckpt_pool_geom g;
        rt_pool_geom(n, x, y, &g);
        return b->ops->adaptive_avg_pool2d(b, xp, yp, &g);
    }
    case RT_LSTM:
        return exec_lstm(r, n, x, xp, y, yp);
    case RT_L2NORM:
        return b->ops->l2norm(b, xp, w, yp, x->d[0], x->d[1], x->d[2] * x->d[3], (float)n->eps);
    case RT_PRIOR_BOX: {
        /* a constant of the graph: made once on the host, in double as
         * Python does, and copied in on every run */
        rt_prior *pr = n->prior;
        if (!pr->boxes) {
            if (!(pr->boxes = malloc(count * sizeof(float) + sizeof(float))))
                return ckpt_backend_fail(b, CKPT_ERR_NOMEM, "out of memory");
            rt_prior_boxes(pr, pr->boxes);
        }
        return b->ops->upload(b, yp, pr->boxes, count);
    }
    case RT_RELU:
        return b->ops->relu(b, xp, yp, count);
    case RT_SIGMOID:
        return b->ops->sigmoid(b, xp, yp, count);
    case RT_SOFTMAX: {
        int d = (int)(n->dim < 0 ? n->dim + x->ndim : n->dim);
        return b->ops->softmax(b, xp, yp, prod(x, 0, d), x->d[d], prod(x, d + 1, x->ndim));
    }
    case RT_PERMUTE: {
        int perm[CKPT_MAX_DIMS];
        for (int i = 0; i < n->nlist; i++)
            perm[i] = (int)(n->list[i] < 0 ? n->list[i] + x->ndim : n->list[i]);
        return b->ops->permute(b, xp, yp, x->ndim, x->d, perm);
    }
    case RT_CAT: {
        int d = (int)(n->dim < 0 ? n->dim + x->ndim : n->dim);
        int64_t outer = prod(y, 0, d), inner = prod(y, d + 1, y->ndim), at = 0;
        for (int k = 0; k < n->ninputs; k++) {
            const rt_shape *xs = &r->shape[n->inputs[k]];
            int64_t len = xs->d[d] * inner;
            if (len && outer) {
                rc = b->ops->copy_rows(b, val(r, n->inputs[k]), len, yp + at, y->d[d] * inner,
                                       outer, len);
                if (rc != CKPT_OK)
                    return rc;
            }
            at += len;
        }
        return CKPT_OK;
    }
    default:
        return exec_transformer(r, n, yp);
    }
}

int rt_model_shapes(ckpt_model *m, rt_shape *shape)
{
    char err[sizeof m->err];
    int rc = rt_graph_shapes(m, NULL, shape, NULL, NULL, NULL, err, sizeof err);
    if (rc == CKPT_ERR_NOMEM)
        return ckpt_model_fail(m, rc, "out of memory");
    if (rc != CKPT_OK)
        return ckpt_model_fail(m, rc, "%s", err);
    return CKPT_OK;
}

int rt_check_inputs(ckpt_model *m, const ckpt_array *inputs, rt_shape *shape)
{
    for (size_t i = 0; i < m->ninputs; i++) {
        const rt_shape *want = &m->input_shapes[i];
        const ckpt_array *a = &inputs[i];
        int ok = a->ndim == want->ndim && a->data;
        for (int d = 0; ok && d < a->ndim; d++)
            ok = want->d[d] == -1 ? a->shape[d] >= 1 && a->shape[d] <= (INT64_C(1) << 31)
                                  : a->shape[d] == want->d[d];
        if (!ok) {
            char wb[128];
            rt_shape got = {.ndim = a->ndim > 0 && a->ndim <= CKPT_MAX_DIMS ? a->ndim : 0};
            memcpy(got.d, a->shape, sizeof(int64_t) * (size_t)got.ndim);
            char gb[128];
            rt_shape_format(want, wb, sizeof wb);
            return ckpt_model_fail(m, CKPT_ERR_USAGE,
                                   "input \"%s\" has shape %s; the model takes %s "
                                   "(-1: any batch size)",
                                   m->value_names[i], rt_shape_format(&got, gb, sizeof gb), wb);
        }
        shape[i].ndim = a->ndim;
        memcpy(shape[i].d, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    }
    return CKPT_OK;
}

/* What a run works out before any node -- every value's shape, the fused
 * and folded nodes, each value's last reader -- and the per-run arrays:
 * one allocation on the model, made again only when the input shapes or
 * the backend's operations differ from the last run's (for the MNIST MLP
 * at batch 8 the shape pass and nine allocations were a twentieth of a
 * forward). */
typedef struct rt_plan {
    const ckpt_backend_ops *ops; /* NULL: not made */
    rt_shape *shape;
    int *last_use, *fold, *res, *view, *buf;
    unsigned char *is_output, *act;
    rt_buf *bufs;
} rt_plan;

_Static_assert(_Alignof(rt_plan) >= _Alignof(rt_shape) && _Alignof(rt_shape) >= _Alignof(rt_buf) &&
                   _Alignof(rt_buf) >= _Alignof(int),
               "plan_new lays its arrays out widest first");

static rt_plan *plan_new(const ckpt_model *m)
{
    size_t nv = m->nvalues, nn = m->nnodes ? m->nnodes : 1;
    size_t bytes = sizeof(rt_plan) + nv * (sizeof(rt_shape) + sizeof(rt_buf) + 2 * sizeof(int)) +
                   nn * 3 * sizeof(int) + nv + nn;
    rt_plan *p = calloc(1, bytes);
    if (!p)
        return NULL;
    /* widest alignment first, after a header whose size is a multiple of
     * a pointer's: no padding is needed */
    char *at = (char *)(p + 1);
    p->shape = (rt_shape *)(void *)at;
    at += nv * sizeof(rt_shape);
    p->bufs = (rt_buf *)(void *)at;
    at += nv * sizeof(rt_buf);
    p->last_use = (int *)(void *)at;
    p->buf = p->last_use + nv;
    p->fold = p->buf + nv;
    p->res = p->fold + nn;
    p->view = p->res + nn;
    p->is_output = (unsigned char *)(p->view + nn);
    p->act = p->is_output + nv;
    return p;
}

/* The model's plan for INPUTS on B (checked: an input of the wrong shape
 * is the model's error). */
static int plan_for(ckpt_model *m, ckpt_backend *b, const ckpt_array *inputs, rt_plan **out)
{
    rt_plan *p = m->plan;
    if (!p && !(m->plan = p = plan_new(m)))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    int same = p->ops == b->ops;
    for (size_t i = 0; same && i < m->ninputs; i++) {
        same = inputs[i].ndim == p->shape[i].ndim && inputs[i].data;
        for (int d = 0; same && d < inputs[i].ndim; d++)
            same = inputs[i].shape[d] == p->shape[i].d[d];
    }
    *out = p;
    if (same)
        return CKPT_OK;
    p->ops = NULL;
    size_t nv = m->nvalues;
    memset(p->shape, 0, nv * sizeof *p->shape);
    int rc = rt_check_inputs(m, inputs, p->shape);
    /* sizes first, so a shape error costs no device work */
    if (rc != CKPT_OK || (rc = rt_model_shapes(m, p->shape)) != CKPT_OK)
        return rc;
    for (size_t v = 0; v < nv; v++) {
        p->last_use[v] = -1;
        p->is_output[v] = 0;
    }
    for (size_t i = 0; i < m->noutputs; i++)
        p->is_output[m->outputs[i]] = 1;
    for (size_t ni = 0; ni < m->nnodes; ni++)
        for (int k = 0; k < m->nodes[ni].ninputs; k++)
            p->last_use[m->nodes[ni].inputs[k]] = (int)ni;
    fold_plan(m, p->fold);
    fuse_plan(m, b, p->shape, p->fold, p->res, p->act, p->view);
    p->ops = b->ops;
    return CKPT_OK;
}

int ckpt_model_run(ckpt_model *m, ckpt_backend *b, const ckpt_array *inputs, ckpt_array *outputs)
{
    if (!m || !b || !inputs || !outputs)
        return CKPT_ERR_USAGE;
    for (size_t i = 0; i < m->noutputs; i++)
        memset(&outputs[i], 0, sizeof outputs[i]);
    if (!m->bound)
        return ckpt_model_fail(m, CKPT_ERR_USAGE, "the model has no weights bound");
    m->err_code = CKPT_OK;
    m->err[0] = '\0';

    rt_plan *p = NULL;
    int rc = plan_for(m, b, inputs, &p);
    if (rc != CKPT_OK)
        return rc;
    size_t nv = m->nvalues;
    run r = {.m = m, .b = b, .shape = p->shape, .buf = p->buf, .last_use = p->last_use,
             .is_output = p->is_output, .bufs = p->bufs, .fold = p->fold, .res = p->res,
             .act = p->act, .view = p->view};
    for (size_t v = 0; v < nv; v++)
        r.buf[v] = -1;
    memset(r.bufs, 0, nv * sizeof *r.bufs);
    if (!(r.params = upload_params(m, b, r.fold))) {
        rc = m->err_code;
        goto out;
    }
    for (size_t i = 0; i < m->ninputs; i++) {
        size_t n = (size_t)rt_shape_numel(&r.shape[i]);
        const float *in = b->ops->borrow ? b->ops->borrow(b, inputs[i].data, n) : NULL;
        if (in) { /* read in place: no node writes a value it did not make */
            r.bufs[r.nbufs] = (rt_buf){.p = (float *)in, .refs = 1, .borrowed = 1};
            r.buf[i] = (int)r.nbufs++;
            continue;
        }
        if ((rc = new_buffer(&r, (int)i, n)) != CKPT_OK ||
            (rc = b->ops->upload(b, val(&r, (int)i), inputs[i].data, n)) != CKPT_OK) {
            ckpt_model_fail(m, rc, "%s: %s", b->device, b->message);
            goto out;
        }
    }
    for (size_t ni = 0; ni < m->nnodes; ni++) {
        const rt_node *n = &m->nodes[ni];
        if ((rc = exec_node(&r, ni)) != CKPT_OK) {
            char lb[160];
            ckpt_model_fail(m, rc, "%s: %s: %s", b->device, rt_node_label(m, n, lb, sizeof lb),
                            b->message);
            goto out;
        }
        for (int k = 0; k < n->ninputs; k++) {
            int v = n->inputs[k];
            if (r.last_use[v] == (int)ni && !r.is_output[v])
                drop_value(&r, v);
        }
        if (r.last_use[n->output] < 0 && !r.is_output[n->output])
            drop_value(&r, n->output);
    }
    for (size_t i = 0; i < m->noutputs; i++) {
        int v = m->outputs[i];
        ckpt_array *o = &outputs[i];
        size_t n = (size_t)rt_shape_numel(&r.shape[v]);
        o->ndim = r.shape[v].ndim;
        memcpy(o->shape, r.shape[v].d, sizeof(int64_t) * (size_t)o->ndim);
        if (!(o->data = malloc(n ? n * sizeof(float) : sizeof(float)))) {
            rc = ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = b->ops->download(b, o->data, val(&r, v), n)) != CKPT_OK) {
            ckpt_model_fail(m, rc, "%s: %s", b->device, b->message);
            goto out;
        }
    }
    rc = CKPT_OK;
out:
    if (r.buf)
        for (size_t v = 0; v < nv; v++)
            drop_value(&r, (int)v);
    if (rc != CKPT_OK)
        for (size_t i = 0; i < m->noutputs; i++)
            ckpt_array_clear(&outputs[i]);
    return rc;
}
