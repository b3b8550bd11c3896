/* runtime/replicas.c - torch.nn.DataParallel's scatter / gather replayed on
 * one or several backends, and the analysis that says why an output does
 * not survive it (no batch dimension, or a batch dimension that is not
 * first). */
#include "runtime/runtime.h"

#include <stdlib.h>
#include <string.h>

int ckpt_model_batch_dims(ckpt_model *m, const ckpt_array *inputs, int *dims)
{
    if (!m || !inputs || !dims)
        return CKPT_ERR_USAGE;
    if (!m->bound)
        return ckpt_model_fail(m, CKPT_ERR_USAGE, "the model has no weights bound");
    rt_shape *a = calloc(m->nvalues, sizeof *a), *b = calloc(m->nvalues, sizeof *b);
    int rc = CKPT_ERR_NOMEM;
    if (!a || !b) {
        ckpt_model_fail(m, rc, "out of memory");
        goto out;
    }
    if ((rc = rt_check_inputs(m, inputs, a)) != CKPT_OK)
        goto out;
    memcpy(b, a, m->ninputs * sizeof *a);
    /* one more in each input's batch dimension (the spec's -1) */
    for (size_t i = 0; i < m->ninputs; i++)
        for (int d = 0; d < m->input_shapes[i].ndim; d++)
            if (m->input_shapes[i].d[d] == -1)
                b[i].d[d]++;
    if ((rc = rt_model_shapes(m, a)) != CKPT_OK || (rc = rt_model_shapes(m, b)) != CKPT_OK)
        goto out;
    for (size_t o = 0; o < m->noutputs; o++) {
        const rt_shape *x = &a[m->outputs[o]], *y = &b[m->outputs[o]];
        dims[o] = -1;
        for (int d = 0; d < x->ndim && d < y->ndim && dims[o] < 0; d++)
            if (x->d[d] != y->d[d])
                dims[o] = d;
    }
out:
    free(a);
    free(b);
    return rc;
}

int ckpt_model_run_replicas(ckpt_model *m, ckpt_backend *const *backends, size_t nb,
                            int replicas, const ckpt_array *inputs, ckpt_array *outputs,
                            int *used)
{
    if (!m || !backends || !nb || replicas < 1 || !inputs || !outputs)
        return CKPT_ERR_USAGE;
    for (size_t o = 0; o < m->noutputs; o++)
        memset(&outputs[o], 0, sizeof outputs[o]);
    if (used)
        *used = 0;
    int64_t batch = -1;
    for (size_t i = 0; i < m->ninputs; i++) {
        if (inputs[i].ndim < 1 || (batch >= 0 && inputs[i].shape[0] != batch))
            return ckpt_model_fail(m, CKPT_ERR_USAGE,
                                   "DataParallel scatters every input along dim 0: the inputs "
                                   "need one size there");
        batch = inputs[i].shape[0];
    }
    if (batch < 1)
        return ckpt_model_fail(m, CKPT_ERR_USAGE, "an empty batch cannot be scattered");
    /* torch.chunk's sizes */
    int64_t chunk = (batch + replicas - 1) / replicas;
    int count = (int)((batch + chunk - 1) / chunk);

    ckpt_array *parts = calloc((size_t)count * m->noutputs, sizeof *parts);
    ckpt_array *slice = calloc(m->ninputs, sizeof *slice);
    int rc = CKPT_ERR_NOMEM;
    if (!parts || !slice) {
        ckpt_model_fail(m, rc, "out of memory");
        goto out;
    }
    for (int r = 0; r < count; r++) {
        int64_t start = (int64_t)r * chunk, rows = batch - start < chunk ? batch - start : chunk;
        for (size_t i = 0; i < m->ninputs; i++) {
            slice[i] = inputs[i];
            slice[i].shape[0] = rows;
            int64_t row = 1;
            for (int d = 1; d < inputs[i].ndim; d++)
                row *= inputs[i].shape[d];
            slice[i].data = inputs[i].data + start * row; /* contiguous: a view */
        }
        rc = ckpt_model_run(m, backends[(size_t)r % nb], slice, parts + (size_t)r * m->noutputs);
        if (rc != CKPT_OK)
            goto out;
    }
    /* gather: concatenate along dim 0 where the shapes allow it */
    for (size_t o = 0; o < m->noutputs; o++) {
        const ckpt_array *first = &parts[o];
        int ok = first->ndim >= 1;
        int64_t rows = 0, row = 1;
        for (int d = 1; d < first->ndim; d++)
            row *= first->shape[d];
        for (int r = 0; r < count && ok; r++) {
            const ckpt_array *p = &parts[(size_t)r * m->noutputs + o];
            ok = p->ndim == first->ndim &&
                 memcmp(p->shape + 1, first->shape + 1,
                        sizeof(int64_t) * (size_t)(first->ndim - 1)) == 0;
            rows += p->shape[0];
        }
        if (!ok)
            continue; /* torch's gather would raise: left empty */
        ckpt_array *g = &outputs[o];
        g->ndim = first->ndim;
        memcpy(g->shape, first->shape, sizeof g->shape);
        g->shape[0] = rows;
        if (!(g->data = malloc((size_t)(rows * row > 0 ? rows * row : 1) * sizeof(float)))) {
            rc = ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
            goto out;
        }
        float *at = g->data;
        for (int r = 0; r < count; r++) {
            const ckpt_array *p = &parts[(size_t)r * m->noutputs + o];
            size_t n = (size_t)(p->shape[0] * row);
            if (n)
                memcpy(at, p->data, n * sizeof(float));
            at += n;
        }
    }
    if (used)
        *used = count;
    rc = CKPT_OK;
out:
    if (parts)
        for (size_t k = 0; k < (size_t)count * m->noutputs; k++)
            ckpt_array_clear(&parts[k]);
    free(parts);
    free(slice);
    if (rc != CKPT_OK)
        for (size_t o = 0; o < m->noutputs; o++)
            ckpt_array_clear(&outputs[o]);
    return rc;
}
