/*
 * runtime/model.c - the model object: its lifetime (new, clear, free), its
 * error and the strict load's report it keeps, the parameters it holds on
 * backends, and the accessors of ckpt.h.  The spec reader (spec.c), the
 * strict load (bind.c), the shape pass (shape.c) and the executor (run.c)
 * call it; it calls none of them.
 */
#include "runtime/runtime.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ckpt_model_fail(ckpt_model *m, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    m->err_code = code;
    return code;
}

const char *rt_node_label(const ckpt_model *m, const rt_node *n, char *buf, size_t cap)
{
    snprintf(buf, cap, "node %zu (%s -> \"%s\")", n->index, n->opname,
             n->output >= 0 ? m->value_names[n->output] : "?");
    return buf;
}

ckpt_model *ckpt_model_new(void)
{
    return calloc(1, sizeof(ckpt_model));
}

void rt_model_clear_report(ckpt_model *m)
{
    for (size_t i = 0; i < m->nreport_strings; i++)
        free(m->report_strings[i]);
    free(m->report_strings);
    free(m->missing);
    free(m->unexpected);
    free(m->bad_dtype);
    free(m->mismatches);
    free(m->message);
    m->report_strings = NULL;
    m->nreport_strings = 0;
    m->missing = m->unexpected = m->bad_dtype = NULL;
    m->mismatches = NULL;
    m->message = NULL;
}

void rt_device_release(ckpt_model *m, struct rt_device *d)
{
    /* the parameters, then the folded conv weights and biases (run.c) */
    for (size_t i = 0; d->params && i < m->nparams + 2 * m->nnodes; i++)
        if (d->params[i])
            d->backend->ops->release(d->backend, d->params[i]);
    free(d->params);
    ckpt_backend_free(d->backend); /* the reference run.c's upload took */
    d->params = NULL;
    d->backend = NULL;
}

void rt_model_release_device(ckpt_model *m)
{
    for (size_t i = 0; i < m->ndev; i++)
        rt_device_release(m, &m->dev[i]);
    m->ndev = 0;
    free(m->plan);
    m->plan = NULL;
}

void rt_model_clear(ckpt_model *m)
{
    rt_model_release_device(m);
    rt_model_clear_report(m);
    free(m->path);
    free(m->name);
    free(m->klass);
    free(m->description);
    free(m->input_shapes);
    free(m->input_int);
    free(m->input_high);
    for (size_t i = 0; i < m->nvalues; i++)
        free(m->value_names[i]);
    free(m->value_names);
    for (size_t i = 0; i < m->nnodes; i++) {
        free(m->nodes[i].inputs);
        if (m->nodes[i].prior)
            free(m->nodes[i].prior->boxes);
        free(m->nodes[i].prior);
        free(m->nodes[i].lstm_param);
        free(m->nodes[i].values);
    }
    free(m->nodes);
    free(m->outputs);
    for (size_t i = 0; i < m->nparams; i++) {
        free(m->params[i].key);
        free(m->params[i].host);
    }
    free(m->params);
    memset(m, 0, sizeof *m);
}

void ckpt_model_free(ckpt_model *m)
{
    if (!m)
        return;
    rt_model_clear(m);
    free(m);
}

int ckpt_model_error_code(const ckpt_model *m) { return m->err_code; }
const char *ckpt_model_error_message(const ckpt_model *m) { return m->err; }
const char *ckpt_model_name(const ckpt_model *m) { return m->name ? m->name : ""; }
const char *ckpt_model_class(const ckpt_model *m) { return m->klass ? m->klass : "Model"; }
size_t ckpt_model_input_count(const ckpt_model *m) { return m->ninputs; }
const char *ckpt_model_input_name(const ckpt_model *m, size_t i)
{
    return i < m->ninputs ? m->value_names[i] : NULL;
}
int ckpt_model_input_shape(const ckpt_model *m, size_t i, int64_t *shape)
{
    if (i >= m->ninputs)
        return -1;
    memcpy(shape, m->input_shapes[i].d, sizeof(int64_t) * (size_t)m->input_shapes[i].ndim);
    return m->input_shapes[i].ndim;
}
int64_t rt_input_high(const ckpt_model *m, size_t i)
{
    if (i >= m->ninputs || !m->input_int)
        return 0;
    if (m->input_high[i])
        return m->input_high[i];
    /* the ids reach the embedding as they are or through ops that only
     * move them (a view, a slice, a transpose) */
    unsigned char *ids = calloc(m->nvalues ? m->nvalues : 1, 1);
    int64_t high = 0;
    if (!ids)
        return 0;
    ids[i] = 1;
    for (size_t k = 0; k < m->nnodes && !high; k++) {
        const rt_node *n = &m->nodes[k];
        if (!n->ninputs || !ids[n->inputs[0]])
            continue;
        switch (n->op) {
        case RT_EMBEDDING: {
            const rt_shape *w = &m->params[n->param[RT_P_WEIGHT]].shape;
            high = m->bound && w->ndim == 2 ? w->d[0] : 0;
            break;
        }
        case RT_RESHAPE: case RT_FLATTEN: case RT_SQUEEZE: case RT_UNSQUEEZE:
        case RT_IDENTITY: case RT_DROPOUT: case RT_PERMUTE: case RT_TRANSPOSE:
        case RT_SLICE: case RT_SELECT: case RT_EXPAND:
            ids[n->output] = 1;
            break;
        default:
            break;
        }
    }
    free(ids);
    return high;
}
size_t ckpt_model_output_count(const ckpt_model *m) { return m->noutputs; }
const char *ckpt_model_output_name(const ckpt_model *m, size_t i)
{
    return i < m->noutputs ? m->value_names[m->outputs[i]] : NULL;
}
size_t ckpt_model_param_count(const ckpt_model *m) { return m->nparams; }
const char *ckpt_model_param_key(const ckpt_model *m, size_t i)
{
    return i < m->nparams ? m->params[i].key : NULL;
}
const char *ckpt_model_param_tie(const ckpt_model *m, size_t i)
{
    return i < m->nparams && m->params[i].tie ? m->params[m->params[i].tie - 1].key : NULL;
}
int ckpt_model_param_tied_in(const ckpt_model *m, size_t i)
{
    return i < m->nparams && m->bound && m->params[i].tied_in;
}

int64_t ckpt_model_input_id_limit(const ckpt_model *m, size_t i)
{
    if (!m || i >= m->ninputs || !m->input_int || !m->input_int[i])
        return -1;
    return rt_input_high(m, i);
}
