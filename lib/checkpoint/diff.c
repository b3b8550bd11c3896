/*
 * diff.c - two checkpoints compared as ckpt diff compares them: which
 * tensors pair up (a state dict by key, the others by path, the folder
 * policy), --normalize, each pair compared by compare.c, and the JSON
 * document of ckpt-diff(1).  A is the model's checkpoint, B the one loaded
 * into it: the words are torch's load_state_dict's.
 */
#include "checkpoint/checkpoint.h"

#include "core/json.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define NO_MATCH ((size_t)-1)
#define MAX_DIMS 64 /* what the readers accept */

/* One tensor of one side, under the key it is compared by. */
typedef struct entry {
    char *key;      /* compared key (normalized) */
    char *orig;     /* the key as in the file */
    const ckpt_tensor *t;
    size_t match;   /* index on the other side, or NO_MATCH */
} entry;

typedef struct keyref {
    const char *key;
    size_t i;
} keyref;

typedef struct side {
    ckpt_diff_side pub;
    ckpt_file *f;
    const ckpt_value *sd; /* the state dict compared by key, when !pub.by_path */
    char *sd_text;
    entry *e;
    size_t n, cap;
    keyref *sorted;       /* the keys of e, sorted */
} side;

typedef struct pair {
    ckpt_diff_pair pub;
    bool exact[2];        /* text[i] is an exact integer */
    char text[2][40];
    int64_t *coords;
} pair;

struct ckpt_diff {
    double atol, rtol;
    bool keys_only, normalize;
    char *select;
    ckpt_diff_progress_fn progress;
    void *progress_user;

    bool done; /* the last run succeeded: the results below are whole */
    side s[2];
    pair *p;
    size_t np;
    const char **missing, **unexpected;
    ckpt_diff_summary sum;
    char reason[300];

    int err_code, err_side;
    char err_msg[2048]; /* keys can be long: room for two and a file's message */
};

static int fail(ckpt_diff *d, int which, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(ckpt_diff *d, int which, int code, const char *fmt, ...)
{
    va_list ap;
    d->err_code = code;
    d->err_side = which;
    va_start(ap, fmt);
    vsnprintf(d->err_msg, sizeof(d->err_msg), fmt, ap);
    va_end(ap);
    return code;
}

static int oom(ckpt_diff *d)
{
    return fail(d, -1, CKPT_ERR_NOMEM, "out of memory");
}

/* ---- the handle ---------------------------------------------------------- */

static void clear_results(ckpt_diff *d)
{
    for (int k = 0; k < 2; k++) {
        side *s = &d->s[k];
        for (size_t i = 0; i < s->n; i++) {
            free(s->e[i].key);
            free(s->e[i].orig);
        }
        free(s->e);
        free(s->sorted);
        free(s->sd_text);
        memset(s, 0, sizeof(*s));
    }
    for (size_t i = 0; i < d->np; i++)
        free(d->p[i].coords);
    free(d->p);
    free(d->missing);
    free(d->unexpected);
    d->p = NULL;
    d->np = 0;
    d->missing = d->unexpected = NULL;
    memset(&d->sum, 0, sizeof(d->sum));
    d->done = false;
}

CKPT_API ckpt_diff *ckpt_diff_new(void)
{
    return calloc(1, sizeof(ckpt_diff));
}

CKPT_API void ckpt_diff_free(ckpt_diff *d)
{
    if (!d)
        return;
    clear_results(d);
    free(d->select);
    free(d);
}

CKPT_API int ckpt_diff_set_tolerance(ckpt_diff *d, double atol, double rtol)
{
    if (!d || !(atol >= 0) || !(rtol >= 0) || isinf(atol) || isinf(rtol))
        return CKPT_ERR_USAGE;
    d->atol = atol == 0 ? 0.0 : atol; /* -0 is 0 */
    d->rtol = rtol == 0 ? 0.0 : rtol;
    return CKPT_OK;
}

CKPT_API int ckpt_diff_set_keys_only(ckpt_diff *d, int keys_only)
{
    if (!d)
        return CKPT_ERR_USAGE;
    d->keys_only = keys_only != 0;
    return CKPT_OK;
}

CKPT_API int ckpt_diff_set_normalize(ckpt_diff *d, int normalize)
{
    if (!d)
        return CKPT_ERR_USAGE;
    d->normalize = normalize != 0;
    return CKPT_OK;
}

CKPT_API int ckpt_diff_set_select(ckpt_diff *d, const char *path)
{
    if (!d)
        return CKPT_ERR_USAGE;
    char *s = path ? strdup(path) : NULL;
    if (path && !s)
        return CKPT_ERR_NOMEM;
    free(d->select);
    d->select = s;
    return CKPT_OK;
}

CKPT_API int ckpt_diff_set_progress(ckpt_diff *d, ckpt_diff_progress_fn fn, void *user)
{
    if (!d)
        return CKPT_ERR_USAGE;
    d->progress = fn;
    d->progress_user = user;
    return CKPT_OK;
}

CKPT_API int ckpt_diff_error_code(const ckpt_diff *d)
{
    return d ? d->err_code : CKPT_ERR_USAGE;
}

CKPT_API const char *ckpt_diff_error_message(const ckpt_diff *d)
{
    return d ? d->err_msg : "";
}

CKPT_API int ckpt_diff_error_side(const ckpt_diff *d)
{
    return d && d->err_code != CKPT_OK ? d->err_side : -1;
}

/* ---- pairing ------------------------------------------------------------- */

static char *path_text(const ckpt_path *p)
{
    size_t need = ckpt_path_format(p, NULL, 0) + 1;
    char *b = malloc(need);
    if (b)
        ckpt_path_format(p, b, need);
    return b;
}

/* A path with every string component normalized, formatted. */
static char *unwrapped_path(const ckpt_path *p)
{
    ckpt_path_elem *el = calloc(p->len ? p->len : 1, sizeof(*el));
    char **owned = calloc(p->len ? p->len : 1, sizeof(*owned));
    char *s = NULL;
    bool ok = el && owned;
    for (size_t i = 0; ok && i < p->len; i++) {
        el[i] = p->elems[i];
        if (!el[i].is_int)
            ok = (el[i].key = owned[i] = ckpt_key_unwrap(p->elems[i].key)) != NULL;
    }
    if (ok) {
        ckpt_path q = {p->len, el};
        s = path_text(&q);
    }
    for (size_t i = 0; owned && i < p->len; i++)
        free(owned[i]);
    free(owned);
    free(el);
    return s;
}

/* Add a tensor under ORIG (as in the file) and KEY (compared), both
 * malloc'd by the caller; NULL ones (out of memory) are -1. */
static int push(side *s, char *orig, char *key, const ckpt_tensor *t)
{
    if (orig && key && s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        entry *e = realloc(s->e, cap * sizeof(*e));
        if (e) {
            s->e = e;
            s->cap = cap;
        }
    }
    if (!orig || !key || s->n == s->cap) {
        free(orig);
        free(key);
        return -1;
    }
    s->e[s->n++] = (entry){key, orig, t, NO_MATCH};
    return 0;
}

/* Pick a side's state dict: the one the selection names, else the only one. */
static int pick(ckpt_diff *d, int which)
{
    side *s = &d->s[which];
    size_t n = ckpt_file_state_dict_count(s->f);
    s->pub.state_dicts = n;
    s->pub.by_path = 1;
    for (size_t i = 0; i < n; i++) {
        ckpt_path p;
        const ckpt_value *sd = ckpt_file_state_dict(s->f, i, &p);
        char *ps = path_text(&p);
        if (!ps)
            return oom(d);
        if (d->select ? strcmp(ps, d->select) == 0 : n == 1) {
            s->pub.by_path = 0;
            s->pub.state_dict = p;
            s->sd = sd;
            s->sd_text = ps;
            return CKPT_OK;
        }
        free(ps);
    }
    if (d->select)
        return fail(d, which, CKPT_ERR_FORMAT,
                    "--select '%s' names no state dict of this file (%zu state dict%s; ckpt "
                    "inspect lists them)", d->select, n, n == 1 ? "" : "s");
    return CKPT_OK;
}

static bool under(const ckpt_path *p, const ckpt_path *prefix)
{
    if (p->len < prefix->len)
        return false;
    for (size_t i = 0; i < prefix->len; i++) {
        const ckpt_path_elem *x = &p->elems[i], *y = &prefix->elems[i];
        if (x->is_int != y->is_int || (x->is_int ? x->index != y->index : strcmp(x->key, y->key)))
            return false;
    }
    return true;
}

/* The tensors of one side: its state dict by key (and, with REST, every
 * tensor outside it by path), else every tensor by its path; and the
 * storages no listed tensor uses (inside opaque objects). */
static int collect(ckpt_diff *d, side *s, bool rest)
{
    if (!s->pub.by_path) {
        for (size_t i = 0; i < ckpt_value_len(s->sd); i++) {
            const char *k = ckpt_value_str(ckpt_value_dict_key(s->sd, i), NULL);
            const ckpt_tensor *t = ckpt_value_tensor(ckpt_value_dict_value(s->sd, i));
            if (push(s, strdup(k), d->normalize ? ckpt_key_unwrap(k) : strdup(k), t) < 0)
                return oom(d);
        }
    }
    size_t nt = ckpt_file_tensor_count(s->f);
    for (size_t i = 0; i < nt && (s->pub.by_path || rest); i++) {
        ckpt_path p;
        const ckpt_tensor *t = ckpt_file_tensor(s->f, i, &p);
        if (!s->pub.by_path && under(&p, &s->pub.state_dict) && p.len == s->pub.state_dict.len + 1)
            continue; /* the state dict's own */
        if (push(s, path_text(&p), d->normalize ? unwrapped_path(&p) : path_text(&p), t) < 0)
            return oom(d);
        s->pub.others += !s->pub.by_path;
    }
    s->pub.tensors = s->n;
    size_t ns = ckpt_file_storage_count(s->f);
    unsigned char *used = calloc(ns ? ns : 1, 1);
    if (!used)
        return oom(d);
    for (size_t i = 0; i < nt; i++) {
        const ckpt_storage *st = ckpt_tensor_storage(ckpt_file_tensor(s->f, i, NULL));
        if (st && ckpt_storage_index(st) < ns)
            used[ckpt_storage_index(st)] = 1;
    }
    for (size_t i = 0; i < ns; i++)
        s->pub.unreached += !used[i];
    free(used);
    return CKPT_OK;
}

static int by_key(const void *x, const void *y)
{
    const keyref *a = x, *b = y;
    int c = strcmp(a->key, b->key);
    return c ? c : (a->i > b->i) - (a->i < b->i);
}

/* Sort a side's keys; two tensors under one key (made so by normalisation)
 * cannot be compared. */
static int index_side(ckpt_diff *d, int which)
{
    side *s = &d->s[which];
    if (!(s->sorted = malloc((s->n ? s->n : 1) * sizeof(*s->sorted))))
        return oom(d);
    for (size_t i = 0; i < s->n; i++)
        s->sorted[i] = (keyref){s->e[i].key, i};
    qsort(s->sorted, s->n, sizeof(*s->sorted), by_key);
    for (size_t i = 1; i < s->n; i++) {
        const entry *x = &s->e[s->sorted[i - 1].i], *y = &s->e[s->sorted[i].i];
        if (strcmp(x->key, y->key) != 0)
            continue;
        if (strcmp(x->orig, y->orig) != 0)
            return fail(d, which, CKPT_ERR_UNSUPPORTED,
                        "keys '%s' and '%s' would both be compared as '%s'", x->orig, y->orig,
                        x->key);
        return fail(d, which, CKPT_ERR_UNSUPPORTED, "two tensors have the key '%s'", x->key);
    }
    return CKPT_OK;
}

/* Merge the two sorted key lists: set every entry's match. */
static void match_keys(ckpt_diff *d)
{
    side *a = &d->s[0], *b = &d->s[1];
    size_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        int c = strcmp(a->sorted[i].key, b->sorted[j].key);
        if (c == 0) {
            a->e[a->sorted[i].i].match = b->sorted[j].i;
            b->e[b->sorted[j].i].match = a->sorted[i].i;
        }
        i += c <= 0;
        j += c >= 0;
    }
}

/* ---- the values at the first mismatch ------------------------------------ */

/* The flat C-order index I of T as indices per dimension; -1 where only the
 * flat index has a meaning. */
static int unravel(const ckpt_tensor *t, int64_t i, int64_t *idx)
{
    int n = ckpt_tensor_ndim(t);
    ckpt_dtype dt = ckpt_tensor_dtype(t);
    /* sparse tensors count over their saved parts, packed ones over bytes */
    if (n > MAX_DIMS || ckpt_tensor_kind_of(t) == CKPT_TENSOR_SPARSE_COO ||
        ckpt_tensor_kind_of(t) > CKPT_TENSOR_QUANTIZED || dt == CKPT_DTYPE_QUINT4X2 ||
        dt == CKPT_DTYPE_QUINT2X4)
        return -1;
    for (int k = n - 1; k >= 0; k--) {
        int64_t dim = ckpt_tensor_shape(t)[k];
        idx[k] = dim ? i % dim : 0;
        i = dim ? i / dim : 0;
    }
    return n;
}

/*
 * The element at flat index I of an integer or bool tensor, exactly (a
 * double rounds integers beyond 2^53): "-3", "18446744073709551615",
 * "True".  Read from the storage (already checked by the comparison).
 * false for other dtypes or when it cannot be read.
 */
static bool exact_int(ckpt_file *f, const ckpt_tensor *t, int64_t i, char *buf, size_t cap)
{
    ckpt_dtype dt = ckpt_tensor_dtype(t);
    ckpt_element_class c = ckpt_element_class_of(dt);
    size_t es = ckpt_dtype_size(dt);
    if ((c != CKPT_ELEM_SIGNED && c != CKPT_ELEM_UNSIGNED) || es > 8 || i < 0)
        return false;
    int64_t idx[MAX_DIMS], at = ckpt_tensor_offset(t);
    int n = unravel(t, i, idx);
    if (n < 0)
        return false;
    for (int k = 0; k < n; k++)
        at += idx[k] * ckpt_tensor_stride(t)[k];
    uint8_t b[8] = {0};
    if (ckpt_storage_read(f, ckpt_tensor_storage(t), (uint64_t)at * es, b, es) != CKPT_OK)
        return false;
    uint64_t u = 0;
    for (size_t k = 0; k < es; k++) /* little-endian, as torch writes */
        u |= (uint64_t)b[k] << (8 * k);
    switch (dt) {
    case CKPT_DTYPE_BOOL: snprintf(buf, cap, "%s", u ? "True" : "False"); break;
    case CKPT_DTYPE_INT64: snprintf(buf, cap, "%lld", (long long)(int64_t)u); break;
    case CKPT_DTYPE_INT32: snprintf(buf, cap, "%d", (int)(int32_t)(uint32_t)u); break;
    case CKPT_DTYPE_INT16: snprintf(buf, cap, "%d", (int)(int16_t)(uint16_t)u); break;
    case CKPT_DTYPE_INT8: snprintf(buf, cap, "%d", (int)(int8_t)(uint8_t)u); break;
    default: snprintf(buf, cap, "%llu", (unsigned long long)u); break;
    }
    return true;
}

/* The shortest text that reads back as V in dtype DT ("0.1", not
 * "0.10000000149011612" for a float32). */
static void value_text(double v, ckpt_dtype dt, char *buf, size_t cap)
{
    if (isnan(v) || isinf(v)) {
        snprintf(buf, cap, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    bool wide = dt == CKPT_DTYPE_FLOAT64 || !ckpt_dtype_is_floating(dt);
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (wide ? back == v : (float)back == (float)v)
            break;
    }
}

/* Where a pair's first mismatch is, and its values as text. */
static int describe_first(ckpt_diff *d, pair *p)
{
    ckpt_diff_pair *q = &p->pub;
    q->first_ndim = -1;
    if (q->compared_as != CKPT_DIFF_VALUES && q->compared_as != CKPT_DIFF_BYTES)
        return CKPT_OK;
    if (q->r.first_index < 0)
        return CKPT_OK;
    int64_t idx[MAX_DIMS];
    int n = unravel(q->a, q->r.first_index, idx);
    if (n > 0) {
        if (!(p->coords = malloc((size_t)n * sizeof(*p->coords))))
            return oom(d);
        memcpy(p->coords, idx, (size_t)n * sizeof(*p->coords));
    }
    q->first_ndim = n;
    q->first_coords = p->coords;
    if (q->compared_as != CKPT_DIFF_VALUES)
        return CKPT_OK;
    const ckpt_tensor *t[2] = {q->a, q->b};
    double v[2] = {q->r.first_a, q->r.first_b};
    for (int k = 0; k < 2; k++) {
        p->exact[k] = exact_int(d->s[k].f, t[k], q->r.first_index, p->text[k], sizeof(p->text[k]));
        if (!p->exact[k])
            value_text(v[k], ckpt_tensor_dtype(t[k]), p->text[k], sizeof(p->text[k]));
    }
    q->first_a_text = p->text[0];
    q->first_b_text = p->text[1];
    return CKPT_OK;
}

/* ---- comparing ----------------------------------------------------------- */

static bool same_shape(const ckpt_tensor *a, const ckpt_tensor *b)
{
    int n = ckpt_tensor_ndim(a);
    return n == ckpt_tensor_ndim(b) &&
           (n == 0 ||
            memcmp(ckpt_tensor_shape(a), ckpt_tensor_shape(b), (size_t)n * sizeof(int64_t)) == 0);
}

/* Compare one pair: shapes, dtypes, then values as numbers when both
 * dtypes are numbers (core's "real" dtypes), as bytes when they are the
 * same other dtype. */
static int compare_pair(ckpt_diff *d, pair *p)
{
    side *a = &d->s[0], *b = &d->s[1];
    ckpt_diff_pair *q = &p->pub;
    ckpt_dtype da = ckpt_tensor_dtype(q->a), db = ckpt_tensor_dtype(q->b);
    q->size_mismatch = !same_shape(q->a, q->b);
    q->dtype_mismatch = da != db;
    q->equal = !q->size_mismatch;
    q->first_ndim = -1;
    if (q->size_mismatch || d->keys_only) {
        q->compared_as = CKPT_DIFF_NOT_COMPARED;
    } else if (da != db && !(ckpt_dtype_is_real(da) && ckpt_dtype_is_real(db))) {
        q->compared_as = CKPT_DIFF_INCOMPARABLE;
        q->equal = 0;
    } else {
        q->compared_as = ckpt_dtype_is_real(da) ? CKPT_DIFF_VALUES : CKPT_DIFF_BYTES;
        int rc = ckpt_tensor_compare(a->f, q->a, b->f, q->b, d->atol, d->rtol, &q->r);
        if (rc != CKPT_OK) {
            int in_b = ckpt_file_error_code(b->f) != CKPT_OK;
            const char *msg = ckpt_file_error_message(in_b ? b->f : a->f);
            return fail(d, in_b, rc, "%s: %s", in_b ? q->b_key : q->a_key,
                        msg[0] ? msg : ckpt_strerror(rc));
        }
        q->equal = q->r.mismatched == 0;
        CKPT_FORWARD(describe_first(d, p));
    }
    d->sum.size_mismatch += q->size_mismatch;
    d->sum.dtype_mismatch += q->dtype_mismatch;
    d->sum.equal += q->equal != 0;
    d->sum.differ += !q->equal;
    return CKPT_OK;
}

static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* How many missing keys unwrapping would match with unexpected ones. */
static int normalize_would_match(ckpt_diff *d)
{
    side *a = &d->s[0], *b = &d->s[1];
    char **ub = calloc(d->sum.unexpected ? d->sum.unexpected : 1, sizeof(*ub));
    size_t nub = 0;
    bool ok = ub != NULL;
    for (size_t j = 0; ok && j < b->n; j++)
        if (b->e[j].match == NO_MATCH)
            ok = (ub[nub++] = ckpt_key_unwrap(b->e[j].key)) != NULL;
    if (ok)
        qsort(ub, nub, sizeof(*ub), cmp_str);
    for (size_t i = 0; ok && i < a->n; i++) {
        if (a->e[i].match != NO_MATCH)
            continue;
        char *ka = ckpt_key_unwrap(a->e[i].key);
        ok = ka != NULL;
        d->sum.normalize_would_match += ok && bsearch(&ka, ub, nub, sizeof(*ub), cmp_str);
        free(ka);
    }
    for (size_t j = 0; j < nub; j++)
        free(ub[j]);
    free(ub);
    return ok ? CKPT_OK : oom(d);
}

/* The pairs (every common key, in A's order), the keys of either side
 * alone, then every pair compared. */
static int compare_all(ckpt_diff *d)
{
    side *a = &d->s[0], *b = &d->s[1];
    d->p = calloc(a->n ? a->n : 1, sizeof(*d->p));
    d->missing = calloc(a->n ? a->n : 1, sizeof(*d->missing));
    d->unexpected = calloc(b->n ? b->n : 1, sizeof(*d->unexpected));
    if (!d->p || !d->missing || !d->unexpected)
        return oom(d);
    for (size_t i = 0; i < a->n; i++) {
        const entry *ea = &a->e[i];
        if (ea->match == NO_MATCH) {
            d->missing[d->sum.missing++] = ea->key;
            continue;
        }
        const entry *eb = &b->e[ea->match];
        d->p[d->np++].pub = (ckpt_diff_pair){.key = ea->key, .a_key = ea->orig,
                                             .b_key = eb->orig, .a = ea->t, .b = eb->t,
                                             .first_ndim = -1};
    }
    for (size_t j = 0; j < b->n; j++)
        if (b->e[j].match == NO_MATCH)
            d->unexpected[d->sum.unexpected++] = b->e[j].key;
    d->sum.compared = d->np;

    bool report = d->progress && !d->keys_only && d->np;
    if (report)
        d->progress(d->progress_user, 0, d->np);
    for (size_t k = 0; k < d->np; k++) {
        CKPT_FORWARD(compare_pair(d, &d->p[k]));
        if (report)
            d->progress(d->progress_user, k + 1, d->np);
    }
    if (!d->normalize && d->sum.missing && d->sum.unexpected)
        CKPT_FORWARD(normalize_would_match(d));

    d->sum.all_equal = d->np && !d->sum.missing && !d->sum.unexpected && !d->sum.differ;
    if (!d->np && !d->sum.missing && !d->sum.unexpected) { /* nothing compared */
        int n = snprintf(d->reason, sizeof(d->reason), "nothing compared: no tensor of A has a "
                         "counterpart in B (A: %zu tensors, B: %zu)", a->n, b->n);
        if (n >= 0 && (size_t)n < sizeof(d->reason) && (a->pub.unreached || b->pub.unreached))
            snprintf(d->reason + n, sizeof(d->reason) - (size_t)n,
                     "; storages inside opaque objects, which diff does not reach: %zu in A, "
                     "%zu in B", a->pub.unreached, b->pub.unreached);
        d->sum.reason = d->reason;
    }
    return CKPT_OK;
}

CKPT_API int ckpt_diff_run(ckpt_diff *d, ckpt_file *a, ckpt_file *b)
{
    if (!d || !a || !b)
        return CKPT_ERR_USAGE;
    clear_results(d);
    d->err_code = CKPT_OK;
    d->err_side = -1;
    d->err_msg[0] = '\0';
    ckpt_file *f[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        d->s[i].f = f[i];
        d->s[i].pub.file = ckpt_file_path(f[i]);
        d->s[i].pub.format = ckpt_file_format(f[i]);
    }
    for (int i = 0; i < 2; i++)
        CKPT_FORWARD(pick(d, i));
    /* one side has many state dicts, the other one: where both hold the same
     * tree (a DCP folder drops empty dicts and makes int keys str, so it sees
     * state dicts the .pth it came from lacks), compare every tensor by path */
    side *sa = &d->s[0], *sb = &d->s[1];
    if (!d->select && sa->pub.by_path != sb->pub.by_path && sa->pub.state_dicts &&
        sb->pub.state_dicts &&
        (sa->pub.format == CKPT_FORMAT_DCP || sb->pub.format == CKPT_FORMAT_DCP))
        sa->pub.by_path = sb->pub.by_path = 1;
    for (int i = 0; i < 2; i++)
        if (d->s[i].pub.by_path) {
            d->s[i].pub.state_dict = (ckpt_path){0, NULL};
            d->s[i].sd = NULL;
        } else {
            d->s[i].pub.state_dict_text = d->s[i].sd_text;
        }
    /* the tensors beside the state dicts, by path, when both files hold
     * their state dict at the same place (the same kind of file) */
    bool rest = !sa->pub.by_path && !sb->pub.by_path &&
                sa->pub.state_dict.len == sb->pub.state_dict.len &&
                under(&sa->pub.state_dict, &sb->pub.state_dict);
    for (int i = 0; i < 2; i++) {
        CKPT_FORWARD(collect(d, &d->s[i], rest));
        CKPT_FORWARD(index_side(d, i));
    }
    match_keys(d);
    CKPT_FORWARD(compare_all(d));
    d->done = true;
    return CKPT_OK;
}

/* ---- results ------------------------------------------------------------- */

CKPT_API const ckpt_diff_side *ckpt_diff_side_of(const ckpt_diff *d, int which)
{
    return d && d->done && (which == 0 || which == 1) ? &d->s[which].pub : NULL;
}

CKPT_API const ckpt_diff_summary *ckpt_diff_summary_of(const ckpt_diff *d)
{
    return d && d->done ? &d->sum : NULL;
}

CKPT_API size_t ckpt_diff_pair_count(const ckpt_diff *d)
{
    return d && d->done ? d->np : 0;
}

CKPT_API const ckpt_diff_pair *ckpt_diff_pair_at(const ckpt_diff *d, size_t i)
{
    return d && d->done && i < d->np ? &d->p[i].pub : NULL;
}

CKPT_API const char *ckpt_diff_missing_at(const ckpt_diff *d, size_t i)
{
    return d && d->done && i < d->sum.missing ? d->missing[i] : NULL;
}

CKPT_API const char *ckpt_diff_unexpected_at(const ckpt_diff *d, size_t i)
{
    return d && d->done && i < d->sum.unexpected ? d->unexpected[i] : NULL;
}

/* ---- JSON (ckpt-diff(1)) --------------------------------------------------- */

/* Integers exact, doubles to the last bit (core/json.h). */
static cJSON *json_double(double v) { return ckpt_json_real(v, 17, true); }

static cJSON *json_shape(const ckpt_tensor *t)
{
    return ckpt_json_dims(ckpt_tensor_shape(t), ckpt_tensor_ndim(t));
}

static cJSON *json_source(const side *s)
{
    if (s->pub.by_path)
        return cJSON_CreateNull();
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < s->pub.state_dict.len; i++) {
        const ckpt_path_elem *e = &s->pub.state_dict.elems[i];
        cJSON_AddItemToArray(a, e->is_int ? ckpt_json_int(e->index) : cJSON_CreateString(e->key));
    }
    return a;
}

/* The first mismatch's value K (0: a, 1: b): exact for integers (true or
 * false for bool), else a double. */
static cJSON *json_first(const pair *p, int k)
{
    if (!p->exact[k])
        return json_double(k ? p->pub.r.first_b : p->pub.r.first_a);
    const char *s = p->text[k];
    return cJSON_CreateRaw(strcmp(s, "True") == 0 ? "true" : strcmp(s, "False") == 0 ? "false" : s);
}

static cJSON *json_pair(const ckpt_diff *d, const pair *p)
{
    const ckpt_diff_pair *q = &p->pub;
    const ckpt_compare_result *r = &q->r;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", q->key);
    if (d->normalize) {
        cJSON_AddStringToObject(o, "a_key", q->a_key);
        cJSON_AddStringToObject(o, "b_key", q->b_key);
    }
    cJSON_AddBoolToObject(o, "equal", q->equal);
    bool values = q->compared_as == CKPT_DIFF_VALUES;
    bool any = values || q->compared_as == CKPT_DIFF_BYTES;
    if (any)
        cJSON_AddStringToObject(o, "compared_as", values ? "values" : "bytes");
    else
        cJSON_AddNullToObject(o, "compared_as");
    cJSON_AddItemToObject(o, "count", any ? ckpt_json_int(r->count) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "mismatched", any ? ckpt_json_int(r->mismatched) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "max_abs", values ? json_double(r->max_abs) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "max_rel", values ? json_double(r->max_rel) : cJSON_CreateNull());
    bool first = any && r->first_index >= 0;
    cJSON *at = first ? cJSON_CreateArray() : cJSON_CreateNull();
    if (first && q->first_ndim < 0) /* no coordinates: the flat index alone */
        cJSON_AddItemToArray(at, ckpt_json_int(r->first_index));
    for (int k = 0; first && k < q->first_ndim; k++)
        cJSON_AddItemToArray(at, ckpt_json_int(q->first_coords[k]));
    cJSON_AddItemToObject(o, "first_index", at);
    cJSON_AddItemToObject(o, "first_a", first && values ? json_first(p, 0) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "first_b", first && values ? json_first(p, 1) : cJSON_CreateNull());
    return o;
}

CKPT_API char *ckpt_diff_to_json(const ckpt_diff *d)
{
    if (!d || !d->done)
        return NULL;
    const side *a = &d->s[0], *b = &d->s[1];
    const ckpt_diff_summary *s = &d->sum;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "a", a->pub.file);
    cJSON_AddStringToObject(root, "b", b->pub.file);
    cJSON_AddStringToObject(root, "a_format", a->f->format_name ? a->f->format_name : "unknown");
    cJSON_AddStringToObject(root, "b_format", b->f->format_name ? b->f->format_name : "unknown");
    cJSON_AddItemToObject(root, "a_state_dict", json_source(a));
    cJSON_AddItemToObject(root, "b_state_dict", json_source(b));
    cJSON_AddItemToObject(root, "atol", json_double(d->atol));
    cJSON_AddItemToObject(root, "rtol", json_double(d->rtol));
    cJSON_AddBoolToObject(root, "keys_only", d->keys_only);
    cJSON_AddBoolToObject(root, "normalize", d->normalize);
    cJSON_AddBoolToObject(root, "equal", s->all_equal);
    if (s->reason)
        cJSON_AddStringToObject(root, "reason", s->reason);
    else
        cJSON_AddNullToObject(root, "reason");
    cJSON *missing = cJSON_AddArrayToObject(root, "missing");
    for (size_t i = 0; i < s->missing; i++)
        cJSON_AddItemToArray(missing, cJSON_CreateString(d->missing[i]));
    cJSON *unexpected = cJSON_AddArrayToObject(root, "unexpected");
    for (size_t j = 0; j < s->unexpected; j++)
        cJSON_AddItemToArray(unexpected, cJSON_CreateString(d->unexpected[j]));
    cJSON *sm = cJSON_AddArrayToObject(root, "size_mismatch");
    cJSON *dm = cJSON_AddArrayToObject(root, "dtype_mismatch");
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    for (size_t k = 0; k < d->np; k++) {
        const ckpt_diff_pair *q = &d->p[k].pub;
        if (q->size_mismatch) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "key", q->key);
            cJSON_AddItemToObject(o, "a_shape", json_shape(q->a));
            cJSON_AddItemToObject(o, "b_shape", json_shape(q->b));
            cJSON_AddItemToArray(sm, o);
        }
        if (q->dtype_mismatch) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "key", q->key);
            cJSON_AddStringToObject(o, "a_dtype", ckpt_dtype_name(ckpt_tensor_dtype(q->a)));
            cJSON_AddStringToObject(o, "b_dtype", ckpt_dtype_name(ckpt_tensor_dtype(q->b)));
            cJSON_AddItemToArray(dm, o);
        }
        cJSON_AddItemToArray(tensors, json_pair(d, &d->p[k]));
    }
    cJSON *sum = cJSON_AddObjectToObject(root, "summary");
    cJSON_AddItemToObject(sum, "compared", ckpt_json_int((long long)s->compared));
    cJSON_AddItemToObject(sum, "equal", ckpt_json_int((long long)s->equal));
    cJSON_AddItemToObject(sum, "differ", ckpt_json_int((long long)s->differ));
    cJSON_AddItemToObject(sum, "missing", ckpt_json_int((long long)s->missing));
    cJSON_AddItemToObject(sum, "unexpected", ckpt_json_int((long long)s->unexpected));
    cJSON_AddItemToObject(sum, "size_mismatch", ckpt_json_int((long long)s->size_mismatch));
    cJSON_AddItemToObject(sum, "dtype_mismatch", ckpt_json_int((long long)s->dtype_mismatch));
    cJSON_AddItemToObject(sum, "a_unreached_storages", ckpt_json_int((long long)a->pub.unreached));
    cJSON_AddItemToObject(sum, "b_unreached_storages", ckpt_json_int((long long)b->pub.unreached));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}
