/* runtime/bind.c - strict load of a state dict into a model, reported the
 * way torch's load_state_dict(strict=True) reports it (reference/
 * doc/pth-format.md 7): Missing key(s), Unexpected key(s), then one line per
 * size mismatch, in torch's module order. */
#include "checkpoint/checkpoint.h"
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- growing string and pointer lists --------------------------------- */

typedef struct strbuf {
    char *s;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_add(strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#include <stdarg.h>
static void sb_add(strbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        if ((size_t)n >= SIZE_MAX - b->len ||
            CKPT_GROW(b->s, b->cap, b->len + (size_t)n + 1) < 0) {
            b->oom = 1;
            return;
        }
        if (b->len == 0)
            b->s[0] = '\0';
    }
}

/* Keep a malloc'd string for the report; NULL on OOM. */
static const char *keep(ckpt_model *m, char *s)
{
    if (!s)
        return NULL;
    char **n = realloc(m->report_strings, (m->nreport_strings + 1) * sizeof *n);
    if (!n) {
        free(s);
        return NULL;
    }
    m->report_strings = n;
    n[m->nreport_strings++] = s;
    return s;
}

/* ---- the module tree torch walks ------------------------------------------ */

/* Modules are the dotted prefixes of the spec's parameter keys; torch visits
 * them in pre-order, children in registration order (here: first use). */
typedef struct rt_module {
    char *prefix;      /* "" for the root, else "encoder.conv1." */
    int parent;
    const char *name;  /* last component, within prefix */
    size_t name_len;
} rt_module;

typedef struct tree {
    rt_module *mods;
    size_t count;
    int *param_module; /* module of each parameter */
} tree;

static void tree_free(tree *t)
{
    for (size_t i = 0; i < t->count; i++)
        free(t->mods[i].prefix);
    free(t->mods);
    free(t->param_module);
}

static int tree_module(tree *t, const char *key, size_t plen, int parent)
{
    for (size_t i = 0; i < t->count; i++)
        if (strlen(t->mods[i].prefix) == plen && memcmp(t->mods[i].prefix, key, plen) == 0)
            return (int)i;
    rt_module *n = realloc(t->mods, (t->count + 1) * sizeof *n);
    if (!n)
        return -1;
    t->mods = n;
    rt_module *md = &n[t->count];
    if (!(md->prefix = strndup(key, plen)))
        return -1;
    md->parent = parent;
    /* name: the component before the final dot */
    size_t start = plen ? plen - 1 : 0;
    while (start > 0 && key[start - 1] != '.')
        start--;
    md->name = md->prefix + start;
    md->name_len = plen ? plen - 1 - start : 0;
    return (int)t->count++;
}

static int tree_build(const ckpt_model *m, tree *t)
{
    memset(t, 0, sizeof *t);
    if (!(t->param_module = calloc(m->nparams ? m->nparams : 1, sizeof(int))) ||
        tree_module(t, "", 0, -1) < 0)
        return -1;
    for (size_t i = 0; i < m->nparams; i++) {
        const char *k = m->params[i].key;
        int parent = 0;
        for (const char *dot = strchr(k, '.'); dot; dot = strchr(dot + 1, '.')) {
            parent = tree_module(t, k, (size_t)(dot - k) + 1, parent);
            if (parent < 0)
                return -1;
        }
        t->param_module[i] = parent;
    }
    return 0;
}

/* Pre-order of modules: children follow their parent, in creation order. */
static void tree_preorder(const tree *t, int mod, int *out, size_t *n)
{
    out[(*n)++] = mod;
    for (size_t i = 0; i < t->count; i++)
        if (t->mods[i].parent == mod)
            tree_preorder(t, (int)i, out, n);
}

/* ---- the strict load ---------------------------------------------------- */

static const char *python_type(const ckpt_value *v)
{
    switch (ckpt_value_kind(v)) {
    case CKPT_KIND_NONE: return "<class 'NoneType'>";
    case CKPT_KIND_BOOL: return "<class 'bool'>";
    case CKPT_KIND_INT: return "<class 'int'>";
    case CKPT_KIND_FLOAT: return "<class 'float'>";
    case CKPT_KIND_STR: return "<class 'str'>";
    case CKPT_KIND_BYTES: return "<class 'bytes'>";
    case CKPT_KIND_LIST: return "<class 'list'>";
    case CKPT_KIND_TUPLE: return "<class 'tuple'>";
    case CKPT_KIND_DICT:
        return ckpt_value_dict_ordered(v) ? "<class 'collections.OrderedDict'>"
                                          : "<class 'dict'>";
    case CKPT_KIND_SET: return "<class 'set'>";
    case CKPT_KIND_FROZENSET: return "<class 'frozenset'>";
    default: return "<class 'object'>";
    }
}

static void torch_size(strbuf *b, int ndim, const int64_t *d)
{
    sb_add(b, "torch.Size([");
    for (int i = 0; i < ndim; i++)
        sb_add(b, "%s%lld", i ? ", " : "", (long long)d[i]);
    sb_add(b, "])");
}

/* The value for KEY in SD, or NULL. */
static const ckpt_value *sd_get(const ckpt_value *sd, const char *key)
{
    return ckpt_value_dict_get(sd, key);
}

static int read_param(ckpt_model *m, ckpt_file *f, const ckpt_tensor *t, rt_param *p)
{
    int64_t numel = ckpt_tensor_numel(t);
    float *host = malloc(numel ? (size_t)numel * sizeof(float) : sizeof(float));
    if (!host)
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory reading \"%s\"", p->key);
    int rc = ckpt_tensor_read_float32(f, t, host, (size_t)numel);
    if (rc) {
        free(host);
        return ckpt_model_fail(m, rc, "%s", ckpt_file_error_message(f));
    }
    p->host = host;
    p->shape.ndim = ckpt_tensor_ndim(t);
    memcpy(p->shape.d, ckpt_tensor_shape(t), sizeof(int64_t) * (size_t)p->shape.ndim);
    return CKPT_OK;
}

/* Whether torch would fill in batch_norm parameter PI's num_batches_tracked,
 * absent from SD: BatchNorm's _load_from_state_dict adds tensor(0) when the
 * state dict's _metadata gives its module no version 2 or later (files of
 * torch < 0.4.1, and DataParallel's, whose metadata is keyed "module.bn1"). */
static int nbt_filled(const ckpt_model *m, const ckpt_value *sd, size_t pi)
{
    int is_nbt = 0;
    for (size_t i = 0; i < m->nnodes && !is_nbt; i++)
        is_nbt = m->nodes[i].op == RT_BATCH_NORM && m->nodes[i].param[RT_P_NBT] == (int)pi;
    if (!is_nbt)
        return 0;
    const char *key = m->params[pi].key, *dot = strrchr(key, '.');
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%.*s", dot ? (int)(dot - key) : 0, key);
    const ckpt_value *st = ckpt_value_state(sd);
    const ckpt_value *md = st && ckpt_value_kind(st) == CKPT_KIND_DICT
                               ? ckpt_value_dict_get(st, "_metadata") : NULL;
    const ckpt_value *mine = md && ckpt_value_kind(md) == CKPT_KIND_DICT
                                 ? ckpt_value_dict_get(md, prefix) : NULL;
    const ckpt_value *ver = mine && ckpt_value_kind(mine) == CKPT_KIND_DICT
                                ? ckpt_value_dict_get(mine, "version") : NULL;
    int64_t v = 0;
    return !(ver && ckpt_value_int(ver, &v) == CKPT_OK && v >= 2);
}

/* SRC[i]: the parameter whose tensor parameter I takes.  Its own; a tied
 * key the file lacks, its tie's; tied keys the file holds both of, the one
 * later in torch's order TORDER (NP of them), as load_state_dict copies
 * each into the one shared tensor and the last copy stays. */
static void bind_sources(const ckpt_model *m, const int *torder, size_t np, size_t *src)
{
    for (size_t i = 0; i < m->nparams; i++)
        src[i] = i;
    /* of each tie's group, named by the key the others are tied to: the
     * last of its keys in torch's order, tied-in ones (absent) aside */
    for (size_t k = 0; k < np; k++) {
        size_t j = (size_t)torder[k];
        const rt_param *p = &m->params[j];
        if (!p->tied_in)
            src[p->tie ? (size_t)(p->tie - 1) : j] = j;
    }
    for (size_t i = 0; i < m->nparams; i++)
        if (m->params[i].tie)
            src[i] = src[m->params[i].tie - 1];
}

static void unbind(ckpt_model *m)
{
    rt_model_release_device(m);
    for (size_t i = 0; i < m->nparams; i++) {
        free(m->params[i].host);
        m->params[i].host = NULL;
    }
    m->bound = 0;
}

int ckpt_model_bind(ckpt_model *m, ckpt_file *f, const ckpt_value *sd, ckpt_load_report *report)
{
    if (!m || !f || !sd || !m->nnodes)
        return CKPT_ERR_USAGE;
    unbind(m);
    rt_model_clear_report(m);
    m->err_code = CKPT_OK;
    m->err[0] = '\0';
    if (report)
        memset(report, 0, sizeof *report);
    if (ckpt_value_kind(sd) != CKPT_KIND_DICT)
        return ckpt_model_fail(m, CKPT_ERR_USAGE,
                               "Expected state_dict to be dict-like, got %s.", python_type(sd));

    size_t nkeys = ckpt_value_len(sd);
    tree t;
    int *order = NULL, *torder = NULL;
    rt_shape *vshape = NULL, *expect = NULL, *given = NULL;
    const rt_shape **pgiven = NULL;
    unsigned char *vknown = NULL, *reported = NULL, *filled = NULL;
    size_t *src = NULL;
    strbuf msg = {0}, lines = {0};
    int rc = CKPT_ERR_NOMEM;
    size_t nmiss = 0, nunexp = 0, nmis = 0, nbad = 0;

    if (tree_build(m, &t) ||
        !(order = calloc(t.count, sizeof(int))) ||
        !(torder = calloc(m->nparams + 1, sizeof(int))) ||
        !(m->missing = calloc(m->nparams + 1, sizeof(char *))) ||
        !(m->unexpected = calloc(nkeys + 1, sizeof(char *))) ||
        !(m->bad_dtype = calloc(m->nparams + 1, sizeof(char *))) ||
        !(m->mismatches = calloc(m->nparams + 1, sizeof(ckpt_size_mismatch))) ||
        !(reported = calloc(m->nparams + 1, 1)) ||
        !(vshape = calloc(m->nvalues, sizeof *vshape)) ||
        !(vknown = calloc(m->nvalues, 1)) ||
        !(expect = calloc(m->nparams + 1, sizeof *expect)) ||
        !(given = calloc(m->nparams + 1, sizeof *given)) ||
        !(pgiven = calloc(m->nparams + 1, sizeof *pgiven)) ||
        !(filled = calloc(m->nparams + 1, 1)) ||
        !(src = calloc(m->nparams + 1, sizeof *src)))
        goto out;

    /* torch's order: modules in pre-order, each module's own parameters */
    size_t nmods = 0, np = 0;
    tree_preorder(&t, 0, order, &nmods);
    for (size_t k = 0; k < nmods; k++)
        for (size_t i = 0; i < m->nparams; i++)
            if (t.param_module[i] == order[k])
                torder[np++] = (int)i;

    /* a tied key the file lacks takes the tensor of the key it is tied to,
     * as from_pretrained ties it back after loading (spec "tied") */
    for (size_t i = 0; i < m->nparams; i++)
        m->params[i].tied_in = m->params[i].tie && !sd_get(sd, m->params[i].key) &&
                               sd_get(sd, m->params[m->params[i].tie - 1].key);
    for (size_t k = 0; k < np; k++) {
        const char *key = m->params[torder[k]].key;
        if (!sd_get(sd, key) && !m->params[torder[k]].tied_in &&
            !(filled[torder[k]] = (unsigned char)nbt_filled(m, sd, (size_t)torder[k])))
            m->missing[nmiss++] = key;
    }
    for (size_t k = 0; k < nmods; k++) {
        const rt_module *md = &t.mods[order[k]];
        size_t plen = strlen(md->prefix);
        for (size_t i = 0; i < nkeys; i++) {
            const ckpt_value *kv = ckpt_value_dict_key(sd, i);
            char num[32];
            const char *key;
            if (ckpt_value_kind(kv) == CKPT_KIND_STR) {
                key = ckpt_value_str(kv, NULL);
            } else {
                /* torch would fail on a non-str key; report it at the root */
                if (order[k] != 0)
                    continue;
                int64_t iv = 0;
                ckpt_value_int(kv, &iv);
                snprintf(num, sizeof num, "%lld", (long long)iv);
                if (!(key = keep(m, strdup(num))))
                    goto out;
                m->unexpected[nunexp++] = key;
                continue;
            }
            if (strncmp(key, md->prefix, plen) != 0)
                continue;
            const char *rest = key + plen;
            size_t flen = strcspn(rest, ".");
            int known = 0;
            for (size_t c = 0; c < t.count && !known; c++)
                known = t.mods[c].parent == order[k] && t.mods[c].name_len == flen &&
                        memcmp(t.mods[c].name, rest, flen) == 0;
            for (size_t i2 = 0; i2 < m->nparams && !known; i2++)
                known = t.param_module[i2] == order[k] &&
                        strlen(m->params[i2].key) == plen + flen &&
                        memcmp(m->params[i2].key + plen, rest, flen) == 0;
            if (!known)
                m->unexpected[nunexp++] = key;
        }
    }

    bind_sources(m, torder, np, src);

    /* shapes: the shape pass with a batch of 1 and the checkpoint's
     * parameter shapes; compare each parameter with what the graph implies */
    char shape_err[320] = "";
    for (size_t i = 0; i < m->ninputs; i++) {
        vshape[i] = m->input_shapes[i];
        for (int d = 0; d < vshape[i].ndim; d++)
            if (vshape[i].d[d] == -1)
                vshape[i].d[d] = 1;
        vknown[i] = 1;
    }
    for (size_t i = 0; i < m->nparams; i++) {
        const ckpt_value *v = sd_get(sd, m->params[src[i]].key);
        const ckpt_tensor *ten = v ? ckpt_value_tensor(v) : NULL;
        if (filled[i]) { /* torch's tensor(0): 0-dim */
            given[i].ndim = 0;
            pgiven[i] = &given[i];
        }
        if (!ten)
            continue;
        given[i].ndim = ckpt_tensor_ndim(ten);
        memcpy(given[i].d, ckpt_tensor_shape(ten), sizeof(int64_t) * (size_t)given[i].ndim);
        pgiven[i] = &given[i];
    }
    int st = rt_graph_shapes(m, pgiven, vshape, vknown, expect, reported, shape_err,
                             sizeof shape_err);
    if (st == CKPT_ERR_NOMEM)
        goto out;

    /* per-key messages in torch's order */
    for (size_t k = 0; k < np; k++) {
        int pi = torder[k];
        const char *key = m->params[pi].key;
        const ckpt_value *v = sd_get(sd, key);
        if (!v)
            continue;
        const ckpt_tensor *ten = ckpt_value_tensor(v);
        if (!ten) {
            sb_add(&lines, "\n\tWhile copying the parameter named \"%s\", expected torch.Tensor "
                   "or Tensor-like object from checkpoint but received %s", key, python_type(v));
            m->bad_dtype[nbad++] = key;
            continue;
        }
        if (!ckpt_dtype_is_real(ckpt_tensor_dtype(ten))) { /* copy_ takes any real dtype */
            sb_add(&lines, "\n\tWhile copying the parameter named \"%s\", a %s tensor cannot be "
                   "copied into a float32 parameter.", key, ckpt_dtype_name(ckpt_tensor_dtype(ten)));
            m->bad_dtype[nbad++] = key;
            continue;
        }
        if (!reported[pi])
            continue; /* downstream of a missing weight: the graph cannot say */
        rt_shape got;
        got.ndim = ckpt_tensor_ndim(ten);
        memcpy(got.d, ckpt_tensor_shape(ten), sizeof(int64_t) * (size_t)got.ndim);
        if (rt_shape_equal(&got, &expect[pi]))
            continue;
        ckpt_size_mismatch *mm = &m->mismatches[nmis++];
        mm->key = key;
        mm->ckpt_ndim = got.ndim;
        memcpy(mm->ckpt_shape, got.d, sizeof got.d);
        mm->model_ndim = expect[pi].ndim;
        memcpy(mm->model_shape, expect[pi].d, sizeof got.d);
        sb_add(&lines, "\n\tsize mismatch for %s: copying a param with shape ", key);
        torch_size(&lines, got.ndim, got.d);
        sb_add(&lines, " from checkpoint, the shape in current model is ");
        torch_size(&lines, expect[pi].ndim, expect[pi].d);
        sb_add(&lines, ".");
    }
    if (shape_err[0] && !nmiss && !nmis && !nbad)
        sb_add(&lines, "\n\tthe checkpoint's shapes do not fit the graph: %s", shape_err);

    int ok = !nmiss && !nunexp && !nmis && !nbad && !shape_err[0];
    if (!ok) {
        sb_add(&msg, "Error(s) in loading state_dict for %s:", ckpt_model_class(m));
        if (nmiss) {
            sb_add(&msg, "\n\tMissing key(s) in state_dict: ");
            for (size_t i = 0; i < nmiss; i++)
                sb_add(&msg, "%s\"%s\"", i ? ", " : "", m->missing[i]);
            sb_add(&msg, ". ");
        }
        if (nunexp) {
            sb_add(&msg, "\n\tUnexpected key(s) in state_dict: ");
            for (size_t i = 0; i < nunexp; i++)
                sb_add(&msg, "%s\"%s\"", i ? ", " : "", m->unexpected[i]);
            sb_add(&msg, ". ");
        }
        if (lines.len)
            sb_add(&msg, "%s", lines.s);
    } else {
        sb_add(&msg, "%s", "");
    }
    if (msg.oom || lines.oom)
        goto out;
    m->message = msg.s;
    msg.s = NULL;

    if (ok) {
        for (size_t i = 0; i < m->nparams; i++) {
            if (filled[i]) {
                if (!(m->params[i].host = calloc(1, sizeof(float)))) {
                    unbind(m);
                    goto out;
                }
                m->params[i].shape.ndim = 0;
                continue;
            }
            const ckpt_tensor *ten =
                ckpt_value_tensor(sd_get(sd, m->params[src[i]].key));
            if ((rc = read_param(m, f, ten, &m->params[i])) != CKPT_OK) {
                unbind(m);
                goto out;
            }
        }
        m->bound = 1;
    }
    if (report) {
        report->ok = ok;
        report->missing_count = nmiss;
        report->missing = m->missing;
        report->unexpected_count = nunexp;
        report->unexpected = m->unexpected;
        report->mismatch_count = nmis;
        report->mismatches = m->mismatches;
        report->bad_dtype_count = nbad;
        report->bad_dtype = m->bad_dtype;
        report->message = m->message;
    }
    rc = CKPT_OK;
out:
    if (rc == CKPT_ERR_NOMEM && !m->err_code)
        ckpt_model_fail(m, rc, "out of memory");
    tree_free(&t);
    free(order);
    free(torder);
    free(vshape);
    free(vknown);
    free(reported);
    free(expect);
    free(given);
    free(pgiven);
    free(filled);
    free(src);
    free(msg.s);
    free(lines.s);
    return rc;
}
