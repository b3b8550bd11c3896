/* runtime/run.c - the executor: sizes every value for the batch at hand
 * (the shape pass of shape.c), uploads parameters once per backend, runs
 * the nodes in spec order and frees each intermediate value after its last
 * use. */
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The model's parameters on B, uploaded on first use. */
static float **upload_params(ckpt_model *m, ckpt_backend *b)
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
    if (!(d->params = calloc(m->nparams + 1, sizeof(float *)))) {
        ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    d->backend = b;
    b->refs++;
    for (size_t i = 0; i < m->nparams; i++) {
        size_t n = (size_t)rt_shape_numel(&m->params[i].shape);
        int rc = b->ops->alloc(b, n, &d->params[i]);
        if (rc == CKPT_OK)
            rc = b->ops->upload(b, d->params[i], m->params[i].host, n);
        if (rc != CKPT_OK) {
            ckpt_model_fail(m, rc, "%s: %s", b->device, b->message);
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
} run;

static void drop_value(run *r, int v)
{
    if (r->buf[v] < 0)
        return;
    rt_buf *bf = &r->bufs[r->buf[v]];
    r->buf[v] = -1;
    if (--bf->refs == 0 && bf->p) {
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

static int exec_node(run *r, const rt_node *n)
{
    ckpt_backend *b = r->b;
    const rt_shape *x = n->ninputs ? &r->shape[n->inputs[0]] : NULL, *y = &r->shape[n->output];
    float *w = n->param[RT_P_WEIGHT] >= 0 ? r->params[n->param[RT_P_WEIGHT]] : NULL;
    float *bias = n->param[RT_P_BIAS] >= 0 ? r->params[n->param[RT_P_BIAS]] : NULL;

    if (n->op == RT_FLATTEN || n->op == RT_RESHAPE || n->op == RT_SQUEEZE ||
        n->op == RT_UNSQUEEZE || n->op == RT_DROPOUT) {
        /* a view: same buffer, new shape */
        int bi = r->buf[n->inputs[0]];
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
        return b->ops->linear(b, xp, w, bias, yp, prod(x, 0, x->ndim - 1), x->d[x->ndim - 1],
                              y->d[y->ndim - 1]);
    case RT_CONV2D:
    case RT_CONV_TRANSPOSE2D: {
        ckpt_conv_geom g;
        rt_conv_geom(n, x, &r->m->params[n->param[RT_P_WEIGHT]].shape, y, &g);
        if (n->op == RT_CONV2D)
            return b->ops->conv2d(b, xp, w, bias, yp, &g);
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
        return b->ops->add(b, xp, val(r, n->inputs[1]), yp, count);
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
        return ckpt_backend_fail(b, CKPT_ERR_UNSUPPORTED, "op %s is not implemented",
                                 n->opname);
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

    run r = {.m = m, .b = b};
    int rc = CKPT_ERR_NOMEM;
    size_t nv = m->nvalues;
    r.shape = calloc(nv, sizeof *r.shape);
    r.buf = malloc(nv * sizeof *r.buf);
    r.last_use = malloc(nv * sizeof *r.last_use);
    r.is_output = calloc(nv, 1);
    r.bufs = calloc(nv, sizeof *r.bufs);
    if (!r.shape || !r.buf || !r.last_use || !r.is_output || !r.bufs) {
        ckpt_model_fail(m, rc, "out of memory");
        goto out;
    }
    for (size_t v = 0; v < nv; v++) {
        r.buf[v] = -1;
        r.last_use[v] = -1;
    }
    for (size_t i = 0; i < m->noutputs; i++)
        r.is_output[m->outputs[i]] = 1;
    for (size_t ni = 0; ni < m->nnodes; ni++)
        for (int k = 0; k < m->nodes[ni].ninputs; k++)
            r.last_use[m->nodes[ni].inputs[k]] = (int)ni;

    if ((rc = rt_check_inputs(m, inputs, r.shape)) != CKPT_OK)
        goto out;
    /* sizes first, so a shape error costs no device work */
    if ((rc = rt_model_shapes(m, r.shape)) != CKPT_OK)
        goto out;

    if (!(r.params = upload_params(m, b))) {
        rc = m->err_code;
        goto out;
    }
    for (size_t i = 0; i < m->ninputs; i++) {
        size_t n = (size_t)rt_shape_numel(&r.shape[i]);
        if ((rc = new_buffer(&r, (int)i, n)) != CKPT_OK ||
            (rc = b->ops->upload(b, val(&r, (int)i), inputs[i].data, n)) != CKPT_OK) {
            ckpt_model_fail(m, rc, "%s: %s", b->device, b->message);
            goto out;
        }
    }
    for (size_t ni = 0; ni < m->nnodes; ni++) {
        const rt_node *n = &m->nodes[ni];
        if ((rc = exec_node(&r, n)) != CKPT_OK) {
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
    free(r.shape);
    free(r.buf);
    free(r.last_use);
    free(r.is_output);
    free(r.bufs);
    return rc;
}
