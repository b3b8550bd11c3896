/* runtime/spec.c - reading a graph spec (doc/design.md, "Model specs") into a
 * ckpt_model.  Everything in the JSON is checked here, so the executor can
 * trust names, attributes and counts; a mistake names the node. */
#include "io/io.h"
#include "runtime/runtime.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SPEC_MAX_BYTES (16u << 20) /* specs are small: refuse anything absurd */
#define SPEC_MAX_NODES 100000

/* ---- parsing ------------------------------------------------------------ */

typedef struct parser {
    ckpt_model *m;
    const char *file;   /* for messages */
    char where[160];    /* "node 3 (linear -> \"h1\")" while parsing a node */
} parser;

static int pfail(parser *p, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static int pfail(parser *p, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->where[0])
        return ckpt_model_fail(p->m, CKPT_ERR_FORMAT, "%s: %s: %s", p->file, p->where, msg);
    return ckpt_model_fail(p->m, CKPT_ERR_FORMAT, "%s: %s", p->file, msg);
}

static int find_value(const ckpt_model *m, const char *name)
{
    for (size_t i = 0; i < m->nvalues; i++)
        if (strcmp(m->value_names[i], name) == 0)
            return (int)i;
    return -1;
}

static int add_value(parser *p, const char *name)
{
    ckpt_model *m = p->m;
    if (!name[0])
        return pfail(p, "an empty value name");
    if (find_value(m, name) >= 0)
        return pfail(p, "the value \"%s\" is defined twice", name);
    char **nv = realloc(m->value_names, (m->nvalues + 1) * sizeof *nv);
    if (!nv)
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    m->value_names = nv;
    if (!(nv[m->nvalues] = strdup(name)))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    return (int)m->nvalues++;
}

static int add_param(parser *p, const char *key)
{
    ckpt_model *m = p->m;
    if (!key[0])
        return pfail(p, "an empty parameter key");
    for (size_t i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].key, key) == 0)
            return (int)i; /* shared weights: one key, several nodes */
    rt_param *np = realloc(m->params, (m->nparams + 1) * sizeof *np);
    if (!np)
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    m->params = np;
    memset(&np[m->nparams], 0, sizeof *np);
    if (!(np[m->nparams].key = strdup(key)))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    return (int)m->nparams++;
}

/* An integer-valued JSON number in [lo, hi]. */
static int get_int(parser *p, const cJSON *j, const char *what, int64_t lo, int64_t hi,
                   int64_t *out)
{
    if (!cJSON_IsNumber(j))
        return pfail(p, "\"%s\" must be an integer", what);
    double v = j->valuedouble;
    if (!(v >= (double)lo && v <= (double)hi) || v != (double)(int64_t)v)
        return pfail(p, "\"%s\" must be an integer from %lld to %lld", what, (long long)lo,
                     (long long)hi);
    *out = (int64_t)v;
    return 0;
}

/* An int or an [h, w] pair (torch's _pair). */
static int get_pair(parser *p, const cJSON *attrs, const char *name, int64_t lo, int64_t def,
                    int64_t out[2], int *present)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, name);
    if (present)
        *present = j != NULL;
    if (!j) {
        out[0] = out[1] = def;
        return 0;
    }
    if (cJSON_IsArray(j)) {
        if (cJSON_GetArraySize(j) != 2)
            return pfail(p, "\"%s\" must be an integer or a pair [h, w]", name);
        for (int i = 0; i < 2; i++)
            if (get_int(p, cJSON_GetArrayItem(j, i), name, lo, 1 << 20, &out[i]))
                return -1;
        return 0;
    }
    if (get_int(p, j, name, lo, 1 << 20, &out[0]))
        return -1;
    out[1] = out[0];
    return 0;
}

static int get_dim(parser *p, const cJSON *attrs, const char *name, int required, int64_t def,
                   int64_t *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, name);
    if (!j) {
        if (required)
            return pfail(p, "the attribute \"%s\" is required", name);
        *out = def;
        return 0;
    }
    return get_int(p, j, name, -CKPT_MAX_DIMS, CKPT_MAX_DIMS - 1, out);
}

static int get_list(parser *p, const cJSON *attrs, const char *name, int64_t lo, int64_t hi,
                    rt_node *n)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, name);
    if (!j)
        return pfail(p, "the attribute \"%s\" is required", name);
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) < 1 ||
        cJSON_GetArraySize(j) > CKPT_MAX_DIMS)
        return pfail(p, "\"%s\" must be a list of 1 to %d integers", name, CKPT_MAX_DIMS);
    n->nlist = cJSON_GetArraySize(j);
    for (int i = 0; i < n->nlist; i++)
        if (get_int(p, cJSON_GetArrayItem(j, i), name, lo, hi, &n->list[i]))
            return -1;
    return 0;
}

/* A list of 1 to CAP positive numbers. */
static int get_numbers(parser *p, const cJSON *attrs, const char *name, double *out, int cap)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, name);
    if (!j)
        return pfail(p, "the attribute \"%s\" is required", name);
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) < 1 || cJSON_GetArraySize(j) > cap)
        return pfail(p, "\"%s\" must be a list of 1 to %d numbers", name, cap);
    int i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || e->valuedouble > 1e6)
            return pfail(p, "\"%s\" must hold positive numbers", name);
        out[i] = e->valuedouble;
    }
    return i;
}

static int parse_prior(parser *p, rt_node *n, const cJSON *attrs)
{
    rt_prior *pr = calloc(1, sizeof *pr);
    if (!pr)
        return ckpt_model_fail(p->m, CKPT_ERR_NOMEM, "out of memory");
    n->prior = pr;
    double fm[RT_PRIOR_MAX_MAPS];
    int k = get_numbers(p, attrs, "feature_maps", fm, RT_PRIOR_MAX_MAPS);
    if (k < 0)
        return -1;
    const cJSON *is = cJSON_GetObjectItemCaseSensitive(attrs, "image_size");
    if (!cJSON_IsNumber(is) || !(is->valuedouble > 0) || is->valuedouble > 1e6)
        return pfail(p, "\"image_size\" must be a positive number (300 for SSD300)");
    pr->nmaps = k;
    pr->image_size = is->valuedouble;
    for (int i = 0; i < k; i++) {
        if (fm[i] != (double)(int64_t)fm[i] || fm[i] > 4096)
            return pfail(p, "\"feature_maps\" must hold integers up to 4096");
        pr->feature_maps[i] = (int64_t)fm[i];
    }
    static const char *const lists[] = {"steps", "min_sizes", "max_sizes"};
    double *dst[] = {pr->steps, pr->min_sizes, pr->max_sizes};
    for (int l = 0; l < 3; l++) {
        int c = get_numbers(p, attrs, lists[l], dst[l], RT_PRIOR_MAX_MAPS);
        if (c < 0)
            return -1;
        if (c != k)
            return pfail(p, "\"%s\" has %d entries for %d feature maps", lists[l], c, k);
    }
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(attrs, "aspect_ratios");
    if (!cJSON_IsArray(ar) || cJSON_GetArraySize(ar) != k)
        return pfail(p, "\"aspect_ratios\" must be a list of %d lists, one per feature map", k);
    int i = 0;
    for (const cJSON *e = ar->child; e; e = e->next, i++) {
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) > RT_PRIOR_MAX_RATIOS)
            return pfail(p, "\"aspect_ratios\" entries must be lists of up to %d numbers",
                         RT_PRIOR_MAX_RATIOS);
        int r = 0;
        for (const cJSON *v = e->child; v; v = v->next, r++) {
            if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > 1e3)
                return pfail(p, "\"aspect_ratios\" must hold positive numbers");
            pr->ratios[i][r] = v->valuedouble;
        }
        pr->nratios[i] = r;
    }
    const cJSON *clip = cJSON_GetObjectItemCaseSensitive(attrs, "clip");
    if (clip && !cJSON_IsBool(clip))
        return pfail(p, "\"clip\" must be true or false");
    pr->clip = clip && cJSON_IsTrue(clip);
    double boxes = 0;
    for (int m = 0; m < k; m++)
        boxes += (double)pr->feature_maps[m] * (double)pr->feature_maps[m] *
                 (2.0 + 2.0 * pr->nratios[m]);
    if (boxes > (double)(1 << 24))
        return pfail(p, "%.0f default boxes is more than %d", boxes, 1 << 24);
    return 0;
}

static const struct {
    const char *name;
    rt_op op;
    int min_inputs, max_inputs; /* max 0: any number; -1: none at all */
    signed char need[RT_P_COUNT]; /* per parameter slot: 2 required, 1 optional, 0 none */
    const char *attrs;          /* the attributes it accepts, space-separated */
} OPS[] = {
    {"linear", RT_LINEAR, 1, 1, {2, 1}, ""},
    {"conv2d", RT_CONV2D, 1, 1, {2, 1}, "stride padding dilation groups kernel_size"},
    {"conv_transpose2d", RT_CONV_TRANSPOSE2D, 1, 1, {2, 1},
     "stride padding output_padding dilation groups kernel_size"},
    {"max_pool2d", RT_MAX_POOL2D, 1, 1, {0}, "kernel_size stride padding dilation ceil_mode"},
    {"relu", RT_RELU, 1, 1, {0}, ""},
    {"sigmoid", RT_SIGMOID, 1, 1, {0}, ""},
    {"softmax", RT_SOFTMAX, 1, 1, {0}, "dim"},
    {"flatten", RT_FLATTEN, 1, 1, {0}, "start_dim end_dim"},
    {"reshape", RT_RESHAPE, 1, 1, {0}, "shape"},
    {"view", RT_RESHAPE, 1, 1, {0}, "shape"},
    {"permute", RT_PERMUTE, 1, 1, {0}, "dims"},
    {"cat", RT_CAT, 1, 0, {0}, "dim"},
    {"l2norm", RT_L2NORM, 1, 1, {2, 0}, "eps"},
    {"prior_box", RT_PRIOR_BOX, 0, -1, {0},
     "image_size feature_maps steps min_sizes max_sizes aspect_ratios clip"},
    /* inference: the running statistics are required; weight and bias
     * (affine) and num_batches_tracked (loaded, never read) are optional */
    {"batch_norm", RT_BATCH_NORM, 1, 1, {1, 1, 2, 2, 1}, "eps momentum"},
    {"add", RT_ADD, 1, 2, {0}, "other"},
    {"adaptive_avg_pool2d", RT_ADAPTIVE_AVG_POOL2D, 1, 1, {0}, "output_size"},
    {"dropout", RT_DROPOUT, 1, 1, {0}, "p inplace"},
    {"squeeze", RT_SQUEEZE, 1, 1, {0}, "dim"},
    {"unsqueeze", RT_UNSQUEEZE, 1, 1, {0}, "dim"},
    /* nn.LSTM: its parameters are found by torch's names under "module" */
    {"lstm", RT_LSTM, 1, 1, {0},
     "num_layers bidirectional bias hidden_size input_size batch_first dropout proj_size"},
    /* the transformer ops; add, sub, mul, div take one input and a number
     * ("other") or two inputs, broadcast as torch does */
    {"gelu", RT_UNARY, 1, 1, {0}, "approximate"},
    {"silu", RT_UNARY, 1, 1, {0}, ""},
    {"tanh", RT_UNARY, 1, 1, {0}, ""},
    {"cos", RT_UNARY, 1, 1, {0}, ""},
    {"sin", RT_UNARY, 1, 1, {0}, ""},
    {"neg", RT_UNARY, 1, 1, {0}, ""},
    {"exp", RT_UNARY, 1, 1, {0}, ""},
    {"sqrt", RT_UNARY, 1, 1, {0}, ""},
    {"rsqrt", RT_UNARY, 1, 1, {0}, ""},
    {"pow", RT_UNARY, 1, 1, {0}, "exponent"},
    {"rsub", RT_UNARY, 1, 1, {0}, "other"},
    {"sub", RT_BINARY, 1, 2, {0}, "other"},
    {"mul", RT_BINARY, 1, 2, {0}, "other"},
    {"div", RT_BINARY, 1, 2, {0}, "other"},
    {"transpose", RT_TRANSPOSE, 1, 1, {0}, "dim0 dim1"},
    {"slice", RT_SLICE, 1, 1, {0}, "dim start end step"},
    {"select", RT_SELECT, 1, 1, {0}, "dim index"},
    {"expand", RT_EXPAND, 1, 1, {0}, "size"},
    {"contiguous", RT_IDENTITY, 1, 1, {0}, ""},
    {"clone", RT_IDENTITY, 1, 1, {0}, ""},
    {"alias", RT_IDENTITY, 1, 1, {0}, ""},
    {"mean", RT_REDUCE, 1, 1, {0}, "dim keepdim"},
    {"sum", RT_REDUCE, 1, 1, {0}, "dim keepdim"},
    {"layer_norm", RT_LAYER_NORM, 1, 1, {1, 1}, "normalized_shape eps"},
    {"rms_norm", RT_RMS_NORM, 1, 1, {1}, "normalized_shape eps"},
    {"embedding", RT_EMBEDDING, 1, 1, {2}, "padding_idx"},
    {"matmul", RT_MATMUL, 2, 2, {0}, ""},
    {"bmm", RT_MATMUL, 2, 2, {0}, ""},
    {"addmm", RT_ADDMM, 1, 1, {2, 2}, ""},
    {"scaled_dot_product_attention", RT_SDPA, 3, 4, {0}, "is_causal scale enable_gqa"},
    {"parameter", RT_PARAMETER, 0, -1, {2}, ""},
    {"constant", RT_CONSTANT, 0, -1, {0}, "shape values"},
};

/* The spec's names of the parameter slots (torch's attribute names). */
static const char *const SLOT_NAMES[RT_P_COUNT] = {"weight", "bias", "running_mean",
                                                   "running_var", "num_batches_tracked"};

static int attr_known(const char *list, const char *name)
{
    size_t len = strlen(name);
    for (const char *s = list; *s;) {
        const char *e = strchr(s, ' ');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == len && memcmp(s, name, len) == 0)
            return 1;
        s += l + (e != NULL);
    }
    return 0;
}

static int get_bool(parser *p, const cJSON *attrs, const char *name, int def, int *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, name);
    if (j && !cJSON_IsBool(j))
        return pfail(p, "\"%s\" must be true or false", name);
    *out = j ? cJSON_IsTrue(j) : def;
    return 0;
}

/* nn.LSTM's constructor arguments; input_size and hidden_size may be left
 * out (the weights size them), the rest have torch's defaults. */
static int parse_lstm_attrs(parser *p, rt_node *n, const cJSON *attrs)
{
    const cJSON *j;
    int batch_first = 0;
    n->num_layers = 1;
    if ((j = cJSON_GetObjectItemCaseSensitive(attrs, "num_layers")) &&
        get_int(p, j, "num_layers", 1, 64, &n->num_layers))
        return -1;
    if ((j = cJSON_GetObjectItemCaseSensitive(attrs, "hidden_size")) &&
        get_int(p, j, "hidden_size", 1, 1 << 20, &n->hidden_size))
        return -1;
    int64_t unused;
    if ((j = cJSON_GetObjectItemCaseSensitive(attrs, "input_size")) &&
        get_int(p, j, "input_size", 1, 1 << 24, &unused))
        return -1;
    if ((j = cJSON_GetObjectItemCaseSensitive(attrs, "proj_size")) &&
        (get_int(p, j, "proj_size", 0, 1 << 20, &unused) || unused != 0))
        return unused ? pfail(p, "proj_size is not supported (only 0)") : -1;
    /* dropout acts between layers in training only: accepted, unused */
    if ((j = cJSON_GetObjectItemCaseSensitive(attrs, "dropout")) &&
        (!cJSON_IsNumber(j) || !(j->valuedouble >= 0 && j->valuedouble <= 1)))
        return pfail(p, "\"dropout\" must be a probability from 0 to 1");
    if (get_bool(p, attrs, "bidirectional", 0, &n->bidirectional) ||
        get_bool(p, attrs, "bias", 1, &n->has_bias) ||
        get_bool(p, attrs, "batch_first", 0, &batch_first))
        return -1;
    if (batch_first)
        return pfail(p, "batch_first is not supported: the input is [T, B, C] (permute first)");
    return 0;
}

/* lstm's parameters: "params": {"module": "rnn.0.rnn"} names the nn.LSTM;
 * the keys are torch's, "rnn.0.rnn.weight_ih_l0" and so on. */
static int parse_lstm_params(parser *p, rt_node *n, const cJSON *params)
{
    for (int k = 0; k < RT_P_COUNT; k++)
        n->param[k] = -1;
    const cJSON *mod = cJSON_GetObjectItemCaseSensitive(params, "module");
    if (!cJSON_IsObject(params) || !cJSON_IsString(mod) || cJSON_GetArraySize(params) != 1)
        return pfail(p, "lstm's \"params\" must be {\"module\": \"NAME\"}, the nn.LSTM's "
                     "state-dict prefix (\"\" when the model is the LSTM)");
    int dirs = n->bidirectional ? 2 : 1, per = rt_lstm_per_dir(n);
    n->nlstm = (int)n->num_layers * dirs * per;
    if (!(n->lstm_param = calloc((size_t)n->nlstm, sizeof(int))))
        return ckpt_model_fail(p->m, CKPT_ERR_NOMEM, "out of memory");
    static const char *const names[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    const char *pre = mod->valuestring;
    int k = 0;
    for (int64_t l = 0; l < n->num_layers; l++)
        for (int d = 0; d < dirs; d++)
            for (int i = 0; i < per; i++) {
                char key[512];
                if ((size_t)snprintf(key, sizeof key, "%s%s%s_l%lld%s", pre, pre[0] ? "." : "",
                                     names[i], (long long)l,
                                     d ? "_reverse" : "") >= sizeof key)
                    return pfail(p, "the module name is too long");
                int idx = add_param(p, key);
                if (idx < 0)
                    return -1;
                n->lstm_param[k++] = idx;
            }
    n->param[RT_P_WEIGHT] = n->lstm_param[0];
    return 0;
}

/* A finite JSON number; DEF when absent and not REQUIRED. */
static int get_number(parser *p, const cJSON *attrs, const char *name, int required, double def,
                      double *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, name);
    if (!j) {
        if (required)
            return pfail(p, "the attribute \"%s\" is required", name);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return pfail(p, "\"%s\" must be a number", name);
    *out = j->valuedouble;
    return 0;
}

/* A slice bound: an integer, or null for the default; Python's clamping
 * makes any size past the ends the same, so huge ones (torch writes
 * 2^63 - 1 for "to the end") are kept as +-2^62. */
static int get_bound(parser *p, const cJSON *attrs, const char *name, int64_t def, int64_t *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, name);
    *out = def;
    if (!j || cJSON_IsNull(j))
        return 0;
    double v = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!isfinite(v) || v != floor(v))
        return pfail(p, "\"%s\" must be an integer or null", name);
    const double big = 4611686018427387904.0; /* 2^62 */
    *out = v >= big ? INT64_C(1) << 62 : v <= -big ? -(INT64_C(1) << 62) : (int64_t)v;
    return 0;
}

/* constant's "values": COUNT numbers, as float32; the strings "inf",
 * "-inf" and "nan" stand for what JSON cannot write (masks hold -inf). */
static int get_values(parser *p, rt_node *n, const cJSON *attrs)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(attrs, "values");
    int64_t count = 1;
    for (int i = 0; i < n->nlist; i++)
        count *= n->list[i];
    if (!j)
        return pfail(p, "the attribute \"values\" is required");
    if (!cJSON_IsArray(j))
        return pfail(p, "\"values\" must be a list of numbers");
    int64_t have = cJSON_GetArraySize(j);
    if (have != count)
        return pfail(p, "\"values\" holds %lld numbers for a shape of %lld elements",
                     (long long)have, (long long)count);
    if (!(n->values = malloc(count ? (size_t)count * sizeof(float) : sizeof(float))))
        return ckpt_model_fail(p->m, CKPT_ERR_NOMEM, "out of memory");
    int64_t i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        if (cJSON_IsNumber(e) && fabs(e->valuedouble) >= 3.4028235677973366e38)
            n->values[i] = e->valuedouble > 0 ? INFINITY : -INFINITY; /* as torch rounds */
        else if (cJSON_IsNumber(e))
            n->values[i] = isnan(e->valuedouble) ? NAN : (float)e->valuedouble;
        else if (cJSON_IsString(e) && strcmp(e->valuestring, "inf") == 0)
            n->values[i] = INFINITY;
        else if (cJSON_IsString(e) && strcmp(e->valuestring, "-inf") == 0)
            n->values[i] = -INFINITY;
        else if (cJSON_IsString(e) && strcmp(e->valuestring, "nan") == 0)
            n->values[i] = NAN;
        else
            return pfail(p, "\"values\" must hold numbers (or \"inf\", \"-inf\", \"nan\"); "
                         "entry %lld is not one", (long long)i);
    }
    return 0;
}

/* The attributes of the transformer ops (doc/design.md, "Model specs"). */
static int parse_transformer_attrs(parser *p, rt_node *n, const cJSON *attrs)
{
    static const struct {
        const char *name;
        int kind;
    } unary[] = {{"silu", CKPT_U_SILU}, {"tanh", CKPT_U_TANH}, {"cos", CKPT_U_COS},
                 {"sin", CKPT_U_SIN},   {"neg", CKPT_U_NEG},   {"exp", CKPT_U_EXP},
                 {"sqrt", CKPT_U_SQRT}, {"rsqrt", CKPT_U_RSQRT}};
    const cJSON *j;
    switch (n->op) {
    case RT_UNARY:
        if (strcmp(n->opname, "gelu") == 0) {
            j = cJSON_GetObjectItemCaseSensitive(attrs, "approximate");
            if (j && (!cJSON_IsString(j) || (strcmp(j->valuestring, "none") &&
                                             strcmp(j->valuestring, "tanh"))))
                return pfail(p, "\"approximate\" must be \"none\" or \"tanh\"");
            n->kind = j && strcmp(j->valuestring, "tanh") == 0 ? CKPT_U_GELU_TANH : CKPT_U_GELU;
            return 0;
        }
        if (strcmp(n->opname, "pow") == 0) {
            n->kind = CKPT_U_POW;
            return get_number(p, attrs, "exponent", 1, 0, &n->scalar);
        }
        if (strcmp(n->opname, "rsub") == 0) {
            n->kind = CKPT_U_RSUB;
            return get_number(p, attrs, "other", 1, 0, &n->scalar);
        }
        for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++)
            if (strcmp(n->opname, unary[i].name) == 0)
                n->kind = unary[i].kind;
        return 0;
    case RT_ADD:
    case RT_BINARY: {
        /* one input and a number: the unary form; two inputs: broadcasting */
        static const char *const names[] = {"add", "sub", "mul", "div"};
        static const int ukind[] = {CKPT_U_ADD, CKPT_U_SUB, CKPT_U_MUL, CKPT_U_DIV};
        int k = 0;
        while (strcmp(names[k], n->opname))
            k++;
        n->kind = k; /* CKPT_B_ADD .. CKPT_B_DIV, in this order */
        if (n->ninputs == 2) {
            if (cJSON_GetObjectItemCaseSensitive(attrs, "other"))
                return pfail(p, "\"other\" is for %s of one input (this one has two)",
                             n->opname);
            return 0;
        }
        if (!cJSON_GetObjectItemCaseSensitive(attrs, "other"))
            return pfail(p, "%s of one input needs the number \"other\" (x %s other)",
                         n->opname, k == 0 ? "+" : k == 1 ? "-" : k == 2 ? "*" : "/");
        n->op = RT_UNARY;
        n->kind = ukind[k];
        return get_number(p, attrs, "other", 1, 0, &n->scalar);
    }
    case RT_TRANSPOSE:
        return get_dim(p, attrs, "dim0", 1, 0, &n->dim0) ||
               get_dim(p, attrs, "dim1", 1, 0, &n->dim1);
    case RT_SLICE: {
        if (get_dim(p, attrs, "dim", 0, 0, &n->dim) || get_bound(p, attrs, "start", 0, &n->start) ||
            get_bound(p, attrs, "end", INT64_C(1) << 62, &n->end))
            return -1;
        n->step = 1;
        j = cJSON_GetObjectItemCaseSensitive(attrs, "step");
        return j && get_int(p, j, "step", 1, INT64_C(1) << 40, &n->step);
    }
    case RT_SELECT:
        if (get_dim(p, attrs, "dim", 1, 0, &n->dim))
            return -1;
        if (!(j = cJSON_GetObjectItemCaseSensitive(attrs, "index")))
            return pfail(p, "the attribute \"index\" is required");
        return get_int(p, j, "index", -(INT64_C(1) << 40), INT64_C(1) << 40, &n->sel_index);
    case RT_EXPAND:
        return get_list(p, attrs, "size", -1, INT64_C(1) << 40, n);
    case RT_REDUCE: {
        n->kind = strcmp(n->opname, "mean") == 0 ? CKPT_R_MEAN : CKPT_R_SUM;
        if (get_bool(p, attrs, "keepdim", 0, &n->keepdim))
            return -1;
        j = cJSON_GetObjectItemCaseSensitive(attrs, "dim");
        if (!j || cJSON_IsNull(j) || (cJSON_IsArray(j) && cJSON_GetArraySize(j) == 0)) {
            n->all_dims = 1; /* torch: no dim (or []) reduces every dimension */
            return 0;
        }
        if (cJSON_IsArray(j))
            return get_list(p, attrs, "dim", -CKPT_MAX_DIMS, CKPT_MAX_DIMS - 1, n);
        n->nlist = 1;
        return get_int(p, j, "dim", -CKPT_MAX_DIMS, CKPT_MAX_DIMS - 1, &n->list[0]);
    }
    case RT_LAYER_NORM:
    case RT_RMS_NORM:
        if (get_list(p, attrs, "normalized_shape", 1, INT64_C(1) << 40, n))
            return -1;
        /* torch's defaults: layer_norm 1e-5; rms_norm the float32 epsilon */
        if (get_number(p, attrs, "eps", 0,
                       n->op == RT_LAYER_NORM ? 1e-5 : 1.1920928955078125e-07, &n->eps))
            return -1;
        if (!(n->eps >= 0 && n->eps <= 1))
            return pfail(p, "\"eps\" must be a number in [0, 1]");
        return 0;
    case RT_EMBEDDING:
        /* padding_idx only shapes the gradient: accepted, no effect forward */
        j = cJSON_GetObjectItemCaseSensitive(attrs, "padding_idx");
        if (j && !cJSON_IsNull(j) && (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble)))
            return pfail(p, "\"padding_idx\" must be an integer or null");
        return 0;
    case RT_SDPA:
        if (get_bool(p, attrs, "is_causal", 0, &n->causal) ||
            get_bool(p, attrs, "enable_gqa", 0, &n->gqa))
            return -1;
        j = cJSON_GetObjectItemCaseSensitive(attrs, "scale");
        if (j && !cJSON_IsNull(j)) {
            if (get_number(p, attrs, "scale", 1, 0, &n->scalar))
                return -1;
            n->has_scalar = 1;
        }
        if (n->causal && n->ninputs == 4)
            return pfail(p, "is_causal with a mask (torch refuses both; the mask may hold "
                         "the causal triangle)");
        return 0;
    case RT_CONSTANT: {
        j = cJSON_GetObjectItemCaseSensitive(attrs, "shape");
        if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) > CKPT_MAX_DIMS)
            return pfail(p, "\"shape\" must be a list of 0 to %d sizes", CKPT_MAX_DIMS);
        n->nlist = cJSON_GetArraySize(j);
        int64_t count = 1;
        for (int i = 0; i < n->nlist; i++) {
            if (get_int(p, cJSON_GetArrayItem(j, i), "shape", 0, SPEC_MAX_BYTES, &n->list[i]))
                return -1;
            count *= n->list[i];
            if (count > SPEC_MAX_BYTES) /* more numbers than the spec's bytes can hold */
                return pfail(p, "\"shape\" has more elements than a spec can hold");
        }
        return get_values(p, n, attrs);
    }
    default:
        return 0;
    }
}

static int parse_attrs(parser *p, rt_node *n, const cJSON *attrs, const char *accepted)
{
    if (attrs && !cJSON_IsObject(attrs))
        return pfail(p, "\"attrs\" must be an object");
    for (const cJSON *a = attrs ? attrs->child : NULL; a; a = a->next)
        if (!attr_known(accepted, a->string)) {
            if (!accepted[0])
                return pfail(p, "%s takes no attribute (\"%s\" given)", n->opname, a->string);
            return pfail(p, "unknown attribute \"%s\" for %s (it takes: %s)", a->string,
                         n->opname, accepted);
        }
    static const cJSON empty;
    if (!attrs)
        attrs = &empty;

    switch (n->op) {
    case RT_CONV2D:
    case RT_CONV_TRANSPOSE2D: {
        int64_t groups = 1;
        if (get_pair(p, attrs, "stride", 1, 1, n->stride, NULL) ||
            get_pair(p, attrs, "padding", 0, 0, n->padding, NULL) ||
            get_pair(p, attrs, "dilation", 1, 1, n->dilation, NULL) ||
            get_pair(p, attrs, "kernel_size", 1, 1, n->kernel, &n->has_kernel))
            return -1;
        if (n->op == RT_CONV_TRANSPOSE2D &&
            get_pair(p, attrs, "output_padding", 0, 0, n->output_padding, NULL))
            return -1;
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(attrs, "groups");
        if (g && get_int(p, g, "groups", 1, 1 << 20, &groups))
            return -1;
        if (groups != 1)
            return pfail(p, "groups = %lld is not supported (only 1)", (long long)groups);
        if (n->op == RT_CONV_TRANSPOSE2D)
            for (int i = 0; i < 2; i++)
                if (n->output_padding[i] >= n->stride[i] &&
                    n->output_padding[i] >= n->dilation[i])
                    return pfail(p, "output_padding must be smaller than stride or dilation");
        return 0;
    }
    case RT_MAX_POOL2D: {
        int has_stride;
        if (get_pair(p, attrs, "kernel_size", 1, 1, n->kernel, &n->has_kernel))
            return -1;
        if (!n->has_kernel)
            return pfail(p, "the attribute \"kernel_size\" is required");
        if (get_pair(p, attrs, "stride", 1, 1, n->stride, &has_stride) ||
            get_pair(p, attrs, "padding", 0, 0, n->padding, NULL) ||
            get_pair(p, attrs, "dilation", 1, 1, n->dilation, NULL))
            return -1;
        if (!has_stride)
            memcpy(n->stride, n->kernel, sizeof n->stride);
        for (int i = 0; i < 2; i++)
            if (n->padding[i] * 2 > n->kernel[i])
                return pfail(p, "padding should be at most half of kernel_size");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(attrs, "ceil_mode");
        if (c && !cJSON_IsBool(c))
            return pfail(p, "\"ceil_mode\" must be true or false");
        n->ceil_mode = c && cJSON_IsTrue(c);
        return 0;
    }
    case RT_SOFTMAX:
        return get_dim(p, attrs, "dim", 1, 0, &n->dim);
    case RT_CAT:
        return get_dim(p, attrs, "dim", 0, 0, &n->dim);
    case RT_FLATTEN:
        return get_dim(p, attrs, "start_dim", 0, 1, &n->start_dim) ||
               get_dim(p, attrs, "end_dim", 0, -1, &n->end_dim);
    case RT_RESHAPE: {
        if (get_list(p, attrs, "shape", -1, INT64_C(1) << 40, n))
            return -1;
        int infer = 0;
        for (int i = 0; i < n->nlist; i++)
            infer += n->list[i] == -1;
        if (infer > 1)
            return pfail(p, "\"shape\" may hold one -1 at most");
        return 0;
    }
    case RT_PERMUTE:
        return get_list(p, attrs, "dims", -CKPT_MAX_DIMS, CKPT_MAX_DIMS - 1, n);
    case RT_L2NORM: {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(attrs, "eps");
        n->eps = 1e-10; /* ssd.pytorch's L2Norm */
        if (e && (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || e->valuedouble > 1))
            return pfail(p, "\"eps\" must be a number in (0, 1]");
        if (e)
            n->eps = e->valuedouble;
        return 0;
    }
    case RT_BATCH_NORM: {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(attrs, "eps");
        const cJSON *mo = cJSON_GetObjectItemCaseSensitive(attrs, "momentum");
        n->eps = 1e-5; /* nn.BatchNorm2d's default */
        if (e && (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || e->valuedouble > 1))
            return pfail(p, "\"eps\" must be a number in (0, 1]");
        if (e)
            n->eps = e->valuedouble;
        /* momentum only updates the statistics in training: accepted, unused */
        if (mo && !cJSON_IsNumber(mo) && !cJSON_IsNull(mo))
            return pfail(p, "\"momentum\" must be a number or null");
        return 0;
    }
    case RT_ADAPTIVE_AVG_POOL2D:
        if (!cJSON_GetObjectItemCaseSensitive(attrs, "output_size"))
            return pfail(p, "the attribute \"output_size\" is required");
        return get_pair(p, attrs, "output_size", 1, 1, n->out_size, NULL);
    case RT_DROPOUT: {
        /* identity at inference (eval mode): p is checked as torch does */
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(attrs, "p");
        const cJSON *ip = cJSON_GetObjectItemCaseSensitive(attrs, "inplace");
        if (pr && (!cJSON_IsNumber(pr) || !(pr->valuedouble >= 0 && pr->valuedouble <= 1)))
            return pfail(p, "\"p\" must be a probability from 0 to 1");
        if (ip && !cJSON_IsBool(ip))
            return pfail(p, "\"inplace\" must be true or false");
        return 0;
    }
    case RT_SQUEEZE:
    case RT_UNSQUEEZE:
        return get_dim(p, attrs, "dim", 1, 0, &n->dim);
    case RT_PRIOR_BOX:
        return parse_prior(p, n, attrs);
    case RT_LSTM:
        return parse_lstm_attrs(p, n, attrs);
    default:
        return parse_transformer_attrs(p, n, attrs);
    }
}

static int parse_params(parser *p, rt_node *n, const cJSON *params, const signed char *need)
{
    for (int k = 0; k < RT_P_COUNT; k++)
        n->param[k] = -1;
    if (params && !cJSON_IsObject(params))
        return pfail(p, "\"params\" must be an object such as {\"weight\": \"fc.weight\"}");
    for (const cJSON *e = params ? params->child : NULL; e; e = e->next) {
        int slot = 0;
        while (slot < RT_P_COUNT && (!need[slot] || strcmp(e->string, SLOT_NAMES[slot])))
            slot++;
        if (slot == RT_P_COUNT)
            return pfail(p, "%s takes no parameter \"%s\"", n->opname, e->string);
        if (!cJSON_IsString(e))
            return pfail(p, "parameter \"%s\" must name a state-dict key", e->string);
        if (n->param[slot] >= 0)
            return pfail(p, "parameter \"%s\" is given twice", e->string);
        n->param[slot] = -2; /* named; the key is added below, in slot order */
    }
    for (int slot = 0; slot < RT_P_COUNT; slot++) {
        if (n->param[slot] == -1) {
            if (need[slot] == 2)
                return pfail(p, "the parameter \"%s\" is required", SLOT_NAMES[slot]);
            continue;
        }
        /* torch's state-dict order within a module is the slot order */
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(params, SLOT_NAMES[slot]);
        int idx = add_param(p, e->valuestring);
        if (idx < 0)
            return -1;
        n->param[slot] = idx;
    }
    return 0;
}

static int parse_node(parser *p, const cJSON *jn, size_t index)
{
    ckpt_model *m = p->m;
    rt_node *n = &m->nodes[index];
    memset(n, 0, sizeof *n);
    n->index = index;
    n->output = -1;
    snprintf(p->where, sizeof p->where, "node %zu", index);
    if (!cJSON_IsObject(jn))
        return pfail(p, "must be an object");

    const cJSON *op = cJSON_GetObjectItemCaseSensitive(jn, "op");
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(jn, "output");
    if (!cJSON_IsString(op))
        return pfail(p, "\"op\" must be a string");
    if (cJSON_IsString(out))
        snprintf(p->where, sizeof p->where, "node %zu (%.40s -> \"%.60s\")", index,
                 op->valuestring, out->valuestring);
    size_t k;
    for (k = 0; k < sizeof OPS / sizeof OPS[0]; k++)
        if (strcmp(OPS[k].name, op->valuestring) == 0)
            break;
    if (k == sizeof OPS / sizeof OPS[0])
        return pfail(p, "unknown op \"%s\"", op->valuestring);
    n->op = OPS[k].op;
    n->opname = OPS[k].name;
    if (!cJSON_IsString(out))
        return pfail(p, "\"output\" must be a string");

    for (const cJSON *e = jn->child; e; e = e->next)
        if (strcmp(e->string, "op") && strcmp(e->string, "inputs") &&
            strcmp(e->string, "output") && strcmp(e->string, "attrs") &&
            strcmp(e->string, "params") && strcmp(e->string, "comment"))
            return pfail(p, "unknown member \"%s\"", e->string);

    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(jn, "inputs");
    if (!cJSON_IsArray(ins))
        return pfail(p, "\"inputs\" must be a list of value names");
    int count = cJSON_GetArraySize(ins);
    if (OPS[k].max_inputs < 0 && count)
        return pfail(p, "%s takes no input (\"inputs\": [])", n->opname);
    if (count < OPS[k].min_inputs || (OPS[k].max_inputs > 0 && count > OPS[k].max_inputs) ||
        count > 4096)
    {
        if (OPS[k].max_inputs > OPS[k].min_inputs)
            return pfail(p, "%s takes %d to %d inputs, not %d", n->opname, OPS[k].min_inputs,
                         OPS[k].max_inputs, count);
        return pfail(p, "%s takes %d input%s, not %d", n->opname, OPS[k].min_inputs,
                     OPS[k].min_inputs != OPS[k].max_inputs ? " or more"
                     : OPS[k].min_inputs == 1                ? ""
                                                             : "s",
                     count);
    }
    if (!(n->inputs = calloc(count ? (size_t)count : 1, sizeof(int))))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    n->ninputs = count;
    for (int i = 0; i < count; i++) {
        const cJSON *in = cJSON_GetArrayItem(ins, i);
        if (!cJSON_IsString(in))
            return pfail(p, "\"inputs\" must be a list of value names");
        n->inputs[i] = find_value(m, in->valuestring);
        if (n->inputs[i] < 0)
            return pfail(p, "input \"%s\" is not defined by an input or an earlier node",
                         in->valuestring);
    }
    if (parse_attrs(p, n, cJSON_GetObjectItemCaseSensitive(jn, "attrs"), OPS[k].attrs) ||
        (n->op == RT_LSTM
             ? parse_lstm_params(p, n, cJSON_GetObjectItemCaseSensitive(jn, "params"))
             : parse_params(p, n, cJSON_GetObjectItemCaseSensitive(jn, "params"),
                            OPS[k].need)))
        return -1;
    if ((n->output = add_value(p, out->valuestring)) < 0)
        return -1;
    return 0;
}

static int parse_inputs(parser *p, const cJSON *ins)
{
    ckpt_model *m = p->m;
    if (!cJSON_IsArray(ins) || cJSON_GetArraySize(ins) < 1 || cJSON_GetArraySize(ins) > 64)
        return pfail(p, "\"inputs\" must be a list of 1 to 64 {\"name\", \"shape\"} objects");
    m->ninputs = (size_t)cJSON_GetArraySize(ins);
    if (!(m->input_shapes = calloc(m->ninputs, sizeof *m->input_shapes)) ||
        !(m->input_int = calloc(m->ninputs, 1)) ||
        !(m->input_high = calloc(m->ninputs, sizeof *m->input_high)))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->ninputs; i++) {
        const cJSON *in = cJSON_GetArrayItem(ins, (int)i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(in, "name");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(in, "shape");
        snprintf(p->where, sizeof p->where, "input %zu", i);
        if (!cJSON_IsString(name))
            return pfail(p, "\"name\" must be a string");
        snprintf(p->where, sizeof p->where, "input \"%.60s\"", name->valuestring);
        if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) < 1 ||
            cJSON_GetArraySize(shape) > CKPT_MAX_DIMS)
            return pfail(p, "\"shape\" must be a list of 1 to %d sizes", CKPT_MAX_DIMS);
        rt_shape *s = &m->input_shapes[i];
        s->ndim = cJSON_GetArraySize(shape);
        int batch = 0;
        for (int d = 0; d < s->ndim; d++) {
            if (get_int(p, cJSON_GetArrayItem(shape, d), "shape", -1, INT64_C(1) << 31, &s->d[d]))
                return -1;
            if (s->d[d] == 0)
                return pfail(p, "a size of 0 in \"shape\"");
            batch += s->d[d] == -1;
        }
        if (batch > 1)
            return pfail(p, "\"shape\" may mark one batch dimension (-1) only");
        /* token ids: integers the runtime carries as float32, exactly below 2^24 */
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(in, "dtype");
        const cJSON *high = cJSON_GetObjectItemCaseSensitive(in, "high");
        if (dt && (!cJSON_IsString(dt) || (strcmp(dt->valuestring, "float32") &&
                                           strcmp(dt->valuestring, "int64") &&
                                           strcmp(dt->valuestring, "int32"))))
            return pfail(p, "\"dtype\" must be \"float32\", \"int64\" or \"int32\"");
        m->input_int[i] = dt && strcmp(dt->valuestring, "float32") != 0;
        if (high && !m->input_int[i])
            return pfail(p, "\"high\" is for an integer input (\"dtype\": \"int64\")");
        if (high && get_int(p, high, "high", 1, RT_MAX_ID, &m->input_high[i]))
            return -1;
        if (add_value(p, name->valuestring) < 0)
            return -1;
    }
    p->where[0] = '\0';
    return 0;
}

static int param_index(const ckpt_model *m, const char *key)
{
    for (size_t i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].key, key) == 0)
            return (int)i;
    return -1;
}

/* "tied": {"lm_head.weight": "transformer.wte.weight"}: keys of one tensor
 * in the model (torch's tied weights), which a file may hold once (the
 * second key left out, as save_pretrained does).  Both must be parameters
 * of the graph; a key tied to a key that is itself tied is refused, which
 * rules out cycles and chains (ckpt-spec ties every later key to the first). */
static int parse_tied(parser *p, const cJSON *tied)
{
    ckpt_model *m = p->m;
    if (!tied)
        return 0;
    if (!cJSON_IsObject(tied))
        return pfail(p, "\"tied\" must be an object of key: the key it is tied to");
    for (const cJSON *e = tied->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return pfail(p, "\"tied\": \"%s\" must name a key (a string)", e->string);
        int a = param_index(m, e->string), b = param_index(m, e->valuestring);
        if (a < 0)
            return pfail(p, "\"tied\": \"%s\" is not a parameter of the graph", e->string);
        if (b < 0)
            return pfail(p, "\"tied\": \"%s\" is tied to \"%s\", not a parameter of the "
                         "graph", e->string, e->valuestring);
        if (a == b)
            return pfail(p, "\"tied\": \"%s\" is tied to itself", e->string);
        if (m->params[a].tie)
            return pfail(p, "\"tied\": \"%s\" is tied twice", e->string);
        m->params[a].tie = b + 1;
    }
    for (size_t i = 0; i < m->nparams; i++) {
        int b = m->params[i].tie - 1;
        if (b < 0 || !m->params[b].tie)
            continue;
        if (m->params[b].tie - 1 == (int)i)
            return pfail(p, "\"tied\": \"%s\" and \"%s\" are tied to each other (a cycle)",
                         m->params[i].key, m->params[b].key);
        return pfail(p, "\"tied\": \"%s\" is tied to \"%s\", itself tied to \"%s\" (tie "
                     "each key to the one that stays)", m->params[i].key, m->params[b].key,
                     m->params[m->params[b].tie - 1].key);
    }
    return 0;
}

static int parse_spec(parser *p, const cJSON *root)
{
    ckpt_model *m = p->m;
    if (!cJSON_IsObject(root))
        return pfail(p, "a model spec must be a JSON object");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    const cJSON *klass = cJSON_GetObjectItemCaseSensitive(root, "class");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(root, "description");
    if (!cJSON_IsString(name) || !name->valuestring[0])
        return pfail(p, "\"name\" must be a non-empty string");
    if ((klass && !cJSON_IsString(klass)) || (desc && !cJSON_IsString(desc)))
        return pfail(p, "\"class\" and \"description\" must be strings");
    if (!(m->name = strdup(name->valuestring)) ||
        !(m->klass = strdup(klass ? klass->valuestring : "Model")) ||
        !(m->description = strdup(desc ? desc->valuestring : "")))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");

    if (parse_inputs(p, cJSON_GetObjectItemCaseSensitive(root, "inputs")))
        return -1;

    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(root, "nodes");
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) < 1 ||
        cJSON_GetArraySize(nodes) > SPEC_MAX_NODES)
        return pfail(p, "\"nodes\" must be a list of 1 to %d nodes", SPEC_MAX_NODES);
    m->nnodes = (size_t)cJSON_GetArraySize(nodes);
    if (!(m->nodes = calloc(m->nnodes, sizeof *m->nodes)))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    size_t i = 0;
    for (const cJSON *jn = nodes->child; jn; jn = jn->next, i++)
        if (parse_node(p, jn, i))
            return -1;
    p->where[0] = '\0';

    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(root, "outputs");
    if (!cJSON_IsArray(outs) || cJSON_GetArraySize(outs) < 1 || cJSON_GetArraySize(outs) > 64)
        return pfail(p, "\"outputs\" must be a list of 1 to 64 value names");
    m->noutputs = (size_t)cJSON_GetArraySize(outs);
    if (!(m->outputs = calloc(m->noutputs, sizeof(int))))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    i = 0;
    for (const cJSON *o = outs->child; o; o = o->next, i++) {
        if (!cJSON_IsString(o))
            return pfail(p, "\"outputs\" must be a list of value names");
        if ((m->outputs[i] = find_value(m, o->valuestring)) < 0)
            return pfail(p, "output \"%s\" is not a value of the graph", o->valuestring);
        for (size_t j = 0; j < i; j++)
            if (m->outputs[j] == m->outputs[i])
                return pfail(p, "output \"%s\" is listed twice", o->valuestring);
    }
    if (parse_tied(p, cJSON_GetObjectItemCaseSensitive(root, "tied")))
        return -1;
    for (const cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "name") && strcmp(e->string, "class") &&
            strcmp(e->string, "description") && strcmp(e->string, "inputs") &&
            strcmp(e->string, "nodes") && strcmp(e->string, "outputs") &&
            strcmp(e->string, "tied") && strcmp(e->string, "comment"))
            return pfail(p, "unknown member \"%s\"", e->string);
    return 0;
}

int ckpt_model_parse(ckpt_model *m, const char *json, size_t len, const char *name)
{
    if (!m || (!json && len))
        return CKPT_ERR_USAGE;
    rt_model_clear(m);
    parser p = {.m = m, .file = name ? name : "<spec>"};
    if (!(m->path = strdup(p.file)))
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    p.file = m->path;
    if (len > SPEC_MAX_BYTES)
        return pfail(&p, "a model spec of %zu bytes is too big", len);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json ? json : "", len, &end, 0);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return pfail(&p, "not valid JSON (near byte %zu)", at);
    }
    int rc = parse_spec(&p, root);
    cJSON_Delete(root);
    if (rc) {
        int code = m->err_code;
        char msg[sizeof m->err];
        memcpy(msg, m->err, sizeof msg);
        rt_model_clear(m);
        m->err_code = code;
        memcpy(m->err, msg, sizeof msg);
        return code;
    }
    m->err_code = CKPT_OK;
    m->err[0] = '\0';
    return CKPT_OK;
}

int ckpt_model_load(ckpt_model *m, const char *path)
{
    if (!m || !path)
        return CKPT_ERR_USAGE;
    int fd;
    struct stat st;
    ckpt_error oe = {0};
    if (ckpt_open_input(AT_FDCWD, path, false, &fd, &st, &oe) != CKPT_OK)
        return ckpt_model_fail(m, oe.code, "%s: %s", path, /* a FIFO: never read */
                               oe.code == CKPT_ERR_IO ? strerror(errno) : oe.msg);
    if ((uint64_t)st.st_size > SPEC_MAX_BYTES) {
        close(fd);
        return ckpt_model_fail(m, CKPT_ERR_FORMAT, "%s: a model spec of %lld bytes is too big",
                               path, (long long)st.st_size);
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return ckpt_model_fail(m, CKPT_ERR_NOMEM, "out of memory");
    }
    int bad = ckpt_pread_all(fd, buf, len, 0);
    close(fd);
    if (bad) {
        free(buf);
        return ckpt_model_fail(m, CKPT_ERR_IO, "%s: could not read the whole file", path);
    }
    int rc = ckpt_model_parse(m, buf, len, path);
    free(buf);
    return rc;
}
