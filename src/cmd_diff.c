/* cmd_diff.c - ckpt diff: the keys, shapes, dtypes and values of two
 * checkpoints, A the model's (reference) and B the one loaded into it,
 * reported in the words of torch's load_state_dict. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char diff_usage[] =
    "usage: ckpt diff [--atol A] [--rtol R] [--keys-only] [--normalize] [--select PATH] [--json] A B\n"
    "\n"
    "Compare two checkpoints of any format: keys missing from B and unexpected in\n"
    "B (in the words of torch's load_state_dict, A being the model and B the\n"
    "checkpoint loaded into it), shape and dtype mismatches, and the values of\n"
    "every common tensor (max absolute and relative difference, elements that\n"
    "differ, the first one).  A file with one state dict (or the one --select\n"
    "names) is compared by its keys, and its other tensors (lists, nested\n"
    "containers) by their paths when both files hold the state dict at the same\n"
    "path; any other by the path of every tensor.  Exit 0 when they are equal\n"
    "within the tolerance, 1 when they differ or when nothing was compared.\n"
    "\n"
    "  --atol A               absolute tolerance (default 0: exact)\n"
    "  --rtol R               relative tolerance, of |b| (default 0); equal when\n"
    "                         |a - b| <= A + R * |b|\n"
    "  --keys-only            compare keys, shapes and dtypes; read no data\n"
    "  --normalize            unwrap module., _orig_mod., ... of both sides' keys\n"
    "                         first (as ckpt unwrap does)\n"
    "  --select PATH          compare the state dict at PATH of each file (keys\n"
    "                         joined by '/')\n"
    "  --json                 print a JSON document (ckpt-diff(1))\n"
    "  --allow-global M.NAME  admit this global as an opaque object (repeatable)\n"
    "  --allow-unknown        admit every unknown global as an opaque object\n"
    "  --max-pickle-bytes N   refuse pickles larger than N bytes (default 1G)\n"
    "  --quiet                print nothing but errors; the exit status tells\n"
    "  --help                 this text\n";

enum { OPT_ATOL = CLI_OPT_FIRST_COMMAND_OPTION, OPT_RTOL, OPT_KEYS_ONLY, OPT_NORMALIZE, OPT_JSON,
       OPT_SELECT };

/* One tensor of one side, under the key it is compared by. */
typedef struct entry {
    char *key;              /* compared key (after --normalize) */
    char *orig;             /* the key as in the file */
    const ckpt_tensor *t;
    size_t match;           /* index on the other side, or NO_MATCH */
} entry;
#define NO_MATCH ((size_t)-1)

typedef struct side {
    const char *file;
    ckpt_file *f;
    bool by_path;           /* every tensor by its path (not one state dict) */
    ckpt_path sd_path;      /* the state dict's, when !by_path */
    const ckpt_value *sd;   /* that state dict */
    size_t rest;            /* tensors outside it compared by path */
    size_t unreached;       /* storages no listed tensor uses (opaque objects' state) */
    entry *e;
    size_t n;
    size_t *sorted;         /* indices of e by key */
} side;

/* What was found for one common key (in A's order). */
typedef struct pair {
    size_t ia, ib;
    bool size_mismatch, dtype_mismatch;
    enum { V_NONE, V_VALUES, V_BYTES, V_INCOMPARABLE } how;
    ckpt_compare_result r;
    bool equal;
} pair;

typedef struct diff {
    side s[2];
    double atol, rtol;
    bool keys_only, normalize, json, quiet;
    const char *select;
    ckpt_rename *rules;
    pair *p;
    size_t np;
    size_t missing, unexpected, size_mismatch, dtype_mismatch, equal, differ;
} diff;

/* ---- keys ---------------------------------------------------------------- */

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d) {
        cli_error("diff", NULL, "out of memory");
        exit(CLI_EXIT_IO);
    }
    return d;
}

static char *path_string(const ckpt_path *p)
{
    size_t need = ckpt_path_format(p, NULL, 0) + 1;
    char *b = malloc(need);
    if (!b) {
        cli_error("diff", NULL, "out of memory");
        exit(CLI_EXIT_IO);
    }
    ckpt_path_format(p, b, need);
    return b;
}

static char *normalized(diff *d, const char *key)
{
    char *k = ckpt_rename_apply(d->rules, key);
    if (!k) {
        cli_error("diff", NULL, "out of memory");
        exit(CLI_EXIT_IO);
    }
    return k;
}

/* A path with every string component normalized, formatted. */
static char *normalized_path(diff *d, const ckpt_path *p)
{
    ckpt_path_elem *el = calloc(p->len ? p->len : 1, sizeof(*el));
    char **owned = calloc(p->len ? p->len : 1, sizeof(*owned));
    if (!el || !owned) {
        cli_error("diff", NULL, "out of memory");
        exit(CLI_EXIT_IO);
    }
    for (size_t i = 0; i < p->len; i++) {
        el[i] = p->elems[i];
        if (!el[i].is_int)
            el[i].key = owned[i] = normalized(d, p->elems[i].key);
    }
    ckpt_path q = {p->len, el};
    char *s = path_string(&q);
    for (size_t i = 0; i < p->len; i++)
        free(owned[i]);
    free(owned);
    free(el);
    return s;
}

static void push(side *s, size_t *cap, char *orig, char *key, const ckpt_tensor *t)
{
    if (s->n == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        entry *e = realloc(s->e, *cap * sizeof(*e));
        if (!e) {
            cli_error("diff", NULL, "out of memory");
            exit(CLI_EXIT_IO);
        }
        s->e = e;
    }
    s->e[s->n++] = (entry){key, orig, t, NO_MATCH};
}

/* Pick a side's state dict: the one --select names, else the only one.
 * CLI_EXIT_BAD_INPUT when --select names none. */
static int pick(diff *d, side *s)
{
    size_t n = ckpt_file_state_dict_count(s->f);
    s->by_path = true;
    for (size_t i = 0; i < n; i++) {
        ckpt_path p;
        const ckpt_value *sd = ckpt_file_state_dict(s->f, i, &p);
        char *ps = path_string(&p);
        bool hit = d->select ? strcmp(ps, d->select) == 0 : n == 1;
        free(ps);
        if (hit) {
            s->by_path = false;
            s->sd = sd;
            s->sd_path = p;
            return CLI_EXIT_OK;
        }
    }
    if (d->select) {
        cli_error("diff", s->file, "--select '%s' names no state dict of this file (%zu state "
                  "dict%s; ckpt inspect lists them)", d->select, n, n == 1 ? "" : "s");
        return CLI_EXIT_BAD_INPUT;
    }
    return CLI_EXIT_OK;
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

static bool same_path(const ckpt_path *a, const ckpt_path *b)
{
    return a->len == b->len && under(a, b);
}

/* The tensors of one side: its state dict by key (and, with REST, every
 * tensor outside it by path), else every tensor by its path. */
static void collect(diff *d, side *s, bool rest)
{
    size_t cap = 0;
    if (!s->by_path) {
        const ckpt_value *sd = s->sd;
        for (size_t i = 0; i < ckpt_value_len(sd); i++) {
            const char *k = ckpt_value_str(ckpt_value_dict_key(sd, i), NULL);
            const ckpt_tensor *t = ckpt_value_tensor(ckpt_value_dict_value(sd, i));
            push(s, &cap, xstrdup(k), d->normalize ? normalized(d, k) : xstrdup(k), t);
        }
    }
    for (size_t i = 0; i < ckpt_file_tensor_count(s->f) && (s->by_path || rest); i++) {
        ckpt_path p;
        const ckpt_tensor *t = ckpt_file_tensor(s->f, i, &p);
        if (!s->by_path && under(&p, &s->sd_path) && p.len == s->sd_path.len + 1)
            continue; /* the state dict's own */
        push(s, &cap, path_string(&p), d->normalize ? normalized_path(d, &p) : path_string(&p), t);
        s->rest += !s->by_path;
    }
    /* storages that no listed tensor uses: inside opaque objects */
    size_t ns = ckpt_file_storage_count(s->f);
    unsigned char *used = calloc(ns ? ns : 1, 1);
    if (!used) {
        cli_error("diff", s->file, "out of memory");
        exit(CLI_EXIT_IO);
    }
    for (size_t i = 0; i < ckpt_file_tensor_count(s->f); i++) {
        const ckpt_storage *st = ckpt_tensor_storage(ckpt_file_tensor(s->f, i, NULL));
        if (st && ckpt_storage_index(st) < ns)
            used[ckpt_storage_index(st)] = 1;
    }
    for (size_t i = 0; i < ns; i++)
        s->unreached += !used[i];
    free(used);
}

static const side *sort_side; /* qsort has no user pointer */

static int by_key(const void *x, const void *y)
{
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    int c = strcmp(sort_side->e[i].key, sort_side->e[j].key);
    return c ? c : (i > j) - (i < j);
}

/* Sort a side's keys; two tensors under one key (made so by --normalize)
 * cannot be compared: CLI_EXIT_BAD_INPUT, naming both. */
static int index_side(side *s)
{
    s->sorted = malloc((s->n ? s->n : 1) * sizeof(*s->sorted));
    if (!s->sorted) {
        cli_error("diff", s->file, "out of memory");
        return CLI_EXIT_IO;
    }
    for (size_t i = 0; i < s->n; i++)
        s->sorted[i] = i;
    sort_side = s;
    qsort(s->sorted, s->n, sizeof(*s->sorted), by_key);
    for (size_t i = 1; i < s->n; i++) {
        const entry *x = &s->e[s->sorted[i - 1]], *y = &s->e[s->sorted[i]];
        if (strcmp(x->key, y->key) == 0) {
            if (strcmp(x->orig, y->orig) != 0)
                cli_error("diff", s->file, "keys '%s' and '%s' would both be compared as '%s'",
                          x->orig, y->orig, x->key);
            else
                cli_error("diff", s->file, "two tensors have the key '%s'", x->key);
            return CLI_EXIT_BAD_INPUT;
        }
    }
    return CLI_EXIT_OK;
}

/* Merge the two sorted key lists: set every entry's match. */
static void match_keys(diff *d)
{
    side *a = &d->s[0], *b = &d->s[1];
    size_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        entry *x = &a->e[a->sorted[i]], *y = &b->e[b->sorted[j]];
        int c = strcmp(x->key, y->key);
        if (c == 0) {
            x->match = b->sorted[j];
            y->match = a->sorted[i];
        }
        i += c <= 0;
        j += c >= 0;
    }
}

/* ---- values ---------------------------------------------------------------- */

static bool same_shape(const ckpt_tensor *a, const ckpt_tensor *b)
{
    int n = ckpt_tensor_ndim(a);
    return n == ckpt_tensor_ndim(b) &&
           (n == 0 || memcmp(ckpt_tensor_shape(a), ckpt_tensor_shape(b), (size_t)n * sizeof(int64_t)) == 0);
}

/* Dtypes whose elements are numbers (compared as values, across dtypes). */
static bool numeric(ckpt_dtype dt)
{
    switch (dt) {
    case CKPT_DTYPE_INT64: case CKPT_DTYPE_INT32: case CKPT_DTYPE_INT16: case CKPT_DTYPE_INT8:
    case CKPT_DTYPE_UINT8: case CKPT_DTYPE_UINT16: case CKPT_DTYPE_UINT32: case CKPT_DTYPE_UINT64:
    case CKPT_DTYPE_BOOL:
        return true;
    default:
        return ckpt_dtype_is_floating(dt);
    }
}

static void progress(diff *d, size_t done, size_t total, time_t start)
{
    if (d->quiet || !isatty(2) || time(NULL) - start < 1)
        return;
    fprintf(stderr, "\rckpt: diff: comparing values %zu/%zu tensors", done, total);
    if (done == total)
        fputc('\n', stderr);
}

/* Compare every common key, in A's order. */
static int compare_all(diff *d)
{
    side *a = &d->s[0], *b = &d->s[1];
    d->p = calloc(a->n ? a->n : 1, sizeof(*d->p));
    if (!d->p) {
        cli_error("diff", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    for (size_t i = 0; i < a->n; i++) {
        if (a->e[i].match == NO_MATCH) {
            d->missing++;
            continue;
        }
        pair *p = &d->p[d->np++];
        p->ia = i;
        p->ib = a->e[i].match;
    }
    for (size_t j = 0; j < b->n; j++)
        d->unexpected += b->e[j].match == NO_MATCH;

    time_t start = time(NULL);
    bool shown = false;
    for (size_t k = 0; k < d->np; k++) {
        pair *p = &d->p[k];
        const ckpt_tensor *ta = a->e[p->ia].t, *tb = b->e[p->ib].t;
        ckpt_dtype da = ckpt_tensor_dtype(ta), db = ckpt_tensor_dtype(tb);
        p->size_mismatch = !same_shape(ta, tb);
        p->dtype_mismatch = da != db;
        d->size_mismatch += p->size_mismatch;
        d->dtype_mismatch += p->dtype_mismatch;
        p->equal = !p->size_mismatch;
        if (p->size_mismatch || d->keys_only) {
            p->how = V_NONE;
        } else if (da != db && !(numeric(da) && numeric(db))) {
            p->how = V_INCOMPARABLE;
            p->equal = false;
        } else {
            p->how = numeric(da) ? V_VALUES : V_BYTES;
            int rc = ckpt_tensor_compare(a->f, ta, b->f, tb, d->atol, d->rtol, &p->r);
            if (rc != CKPT_OK) {
                if (shown)
                    fputc('\n', stderr);
                bool in_b = ckpt_file_error_code(b->f) != CKPT_OK;
                ckpt_file *f = in_b ? b->f : a->f;
                cli_error("diff", in_b ? b->file : a->file, "%s: %s",
                          in_b ? b->e[p->ib].orig : a->e[p->ia].orig,
                          ckpt_file_error_message(f)[0] ? ckpt_file_error_message(f)
                                                        : ckpt_strerror(rc));
                return cli_exit_for(rc);
            }
            p->equal = p->r.mismatched == 0;
        }
        if (p->equal)
            d->equal++;
        else
            d->differ++;
        if (!d->keys_only) {
            progress(d, k + 1, d->np, start);
            shown = shown || (!d->quiet && isatty(2) && time(NULL) - start >= 1);
        }
    }
    return CLI_EXIT_OK;
}

static bool all_equal(const diff *d)
{
    return d->np && !d->missing && !d->unexpected && !d->differ;
}

/* Why a diff that found no difference still is not "equal", else NULL. */
static const char *not_equal_reason(const diff *d, char *buf, size_t cap)
{
    if (d->np || d->missing || d->unexpected)
        return NULL; /* compared, or different already */
    const side *a = &d->s[0], *b = &d->s[1];
    int n = snprintf(buf, cap, "nothing compared: no tensor of A has a counterpart in B "
                     "(A: %zu tensors, B: %zu)", a->n, b->n);
    if (n >= 0 && (size_t)n < cap && (a->unreached || b->unreached))
        snprintf(buf + n, cap - (size_t)n, "; storages inside opaque objects, which diff does not "
                 "reach: %zu in A, %zu in B", a->unreached, b->unreached);
    return buf;
}

/* ---- text output --------------------------------------------------------------- */

/* The shortest text that reads back as V in dtype DT ("0.1", not
 * "0.10000000149011612" for a float32). */
static const char *value_text(double v, ckpt_dtype dt, char *buf, size_t cap)
{
    if (isnan(v))
        return "nan";
    if (isinf(v))
        return v < 0 ? "-inf" : "inf";
    bool wide = dt == CKPT_DTYPE_FLOAT64 || !ckpt_dtype_is_floating(dt);
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (wide ? back == v : (float)back == (float)v)
            break;
    }
    return buf;
}

#define MAX_DIMS 64 /* what the readers accept */

/* The flat C-order index I of T as indices per dimension (N of them);
 * -1 for a tensor of more than MAX_DIMS dimensions. */
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
 * NULL for other dtypes or when it cannot be read.
 */
static const char *exact_int(ckpt_file *f, const ckpt_tensor *t, int64_t i, bool json, char *buf,
                             size_t cap)
{
    ckpt_dtype dt = ckpt_tensor_dtype(t);
    size_t es = ckpt_dtype_size(dt);
    if (!numeric(dt) || ckpt_dtype_is_floating(dt) || es > 8 || i < 0)
        return NULL;
    int64_t idx[MAX_DIMS], at = ckpt_tensor_offset(t);
    int n = unravel(t, i, idx);
    if (n < 0)
        return NULL;
    for (int k = 0; k < n; k++)
        at += idx[k] * ckpt_tensor_stride(t)[k];
    uint8_t b[8] = {0};
    if (ckpt_storage_read(f, ckpt_tensor_storage(t), (uint64_t)at * es, b, es) != CKPT_OK)
        return NULL;
    uint64_t u = 0;
    for (size_t k = 0; k < es; k++) /* little-endian, as torch writes */
        u |= (uint64_t)b[k] << (8 * k);
    switch (dt) {
    case CKPT_DTYPE_BOOL:
        snprintf(buf, cap, "%s", json ? (u ? "true" : "false") : (u ? "True" : "False"));
        break;
    case CKPT_DTYPE_INT64: snprintf(buf, cap, "%lld", (long long)(int64_t)u); break;
    case CKPT_DTYPE_INT32: snprintf(buf, cap, "%d", (int)(int32_t)(uint32_t)u); break;
    case CKPT_DTYPE_INT16: snprintf(buf, cap, "%d", (int)(int16_t)(uint16_t)u); break;
    case CKPT_DTYPE_INT8: snprintf(buf, cap, "%d", (int)(int8_t)(uint8_t)u); break;
    default: snprintf(buf, cap, "%llu", (unsigned long long)u); break;
    }
    return buf;
}

static void print_shape(FILE *out, const ckpt_tensor *t)
{
    fputc('[', out);
    for (int i = 0; i < ckpt_tensor_ndim(t); i++)
        fprintf(out, "%s%lld", i ? ", " : "", (long long)ckpt_tensor_shape(t)[i]);
    fputc(']', out);
}

/* The flat C-order index I as "[i, j, k]" over the shape of T. */
static void print_index(FILE *out, const ckpt_tensor *t, int64_t i)
{
    int64_t idx[MAX_DIMS];
    int n = unravel(t, i, idx);
    if (n < 0) {
        fprintf(out, "flat index %lld", (long long)i);
        return;
    }
    fputc('[', out);
    for (int k = 0; k < n; k++)
        fprintf(out, "%s%lld", k ? ", " : "", (long long)idx[k]);
    fputc(']', out);
}

/* torch's message list: the keys in quotes, comma-separated, then ". " */
static void print_key_list(const char *what, const side *s)
{
    const char *sep = "";
    printf("%s key(s) in state_dict: ", what);
    for (size_t i = 0; i < s->n; i++)
        if (s->e[i].match == NO_MATCH) {
            printf("%s\"%s\"", sep, s->e[i].key);
            sep = ", ";
        }
    printf(". \n");
}

static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* How many missing keys --normalize would match with unexpected ones. */
static size_t normalize_would_match(diff *d)
{
    side *a = &d->s[0], *b = &d->s[1];
    ckpt_rename *r = ckpt_rename_new();
    char **ub = calloc(b->n ? b->n : 1, sizeof(*ub));
    size_t nub = 0, count = 0;
    if (!r || !ub || ckpt_rename_unwrap(r) != CKPT_OK)
        goto out;
    for (size_t j = 0; j < b->n; j++)
        if (b->e[j].match == NO_MATCH && (ub[nub] = ckpt_rename_apply(r, b->e[j].key)))
            nub++;
    qsort(ub, nub, sizeof(*ub), cmp_str);
    for (size_t i = 0; i < a->n; i++) {
        if (a->e[i].match != NO_MATCH)
            continue;
        char *ka = ckpt_rename_apply(r, a->e[i].key);
        count += ka && bsearch(&ka, ub, nub, sizeof(*ub), cmp_str);
        free(ka);
    }
out:
    for (size_t j = 0; j < nub; j++)
        free(ub[j]);
    free(ub);
    ckpt_rename_free(r);
    return count;
}

static void print_source(const char *label, const side *s)
{
    printf("%s: %s: ", label, s->file);
    if (s->by_path) {
        printf("%zu state dict%s: every tensor by its path (%zu tensors)\n",
               ckpt_file_state_dict_count(s->f), ckpt_file_state_dict_count(s->f) == 1 ? "" : "s",
               s->n);
    } else {
        char *p = path_string(&s->sd_path);
        printf("state dict %s (%zu tensors)", s->sd_path.len ? p : "(root)", s->n - s->rest);
        if (s->rest)
            printf(", and %zu other tensor%s by path", s->rest, s->rest == 1 ? "" : "s");
        printf("\n");
        free(p);
    }
}

static void print_values(const diff *d, const pair *p)
{
    const side *a = &d->s[0], *b = &d->s[1];
    const entry *ea = &a->e[p->ia], *eb = &b->e[p->ib];
    const ckpt_compare_result *r = &p->r;
    char v1[40], v2[40];
    if (p->how == V_INCOMPARABLE) {
        printf("%s: values not compared: %s in A, %s in B\n", ea->key,
               ckpt_dtype_name(ckpt_tensor_dtype(ea->t)), ckpt_dtype_name(ckpt_tensor_dtype(eb->t)));
        return;
    }
    if (p->how == V_BYTES) {
        if (!r->mismatched)
            return;
        printf("%s: %lld of %lld elements differ (compared as bytes), first at ", ea->key,
               (long long)r->mismatched, (long long)r->count);
        print_index(stdout, ea->t, r->first_index);
        printf("\n");
        return;
    }
    if (p->how != V_VALUES || (!r->mismatched && r->max_abs == 0))
        return;
    printf("%s: max abs %.3g, max rel %.3g, ", ea->key, r->max_abs, r->max_rel);
    if (!r->mismatched) {
        printf("all %lld elements within tolerance\n", (long long)r->count);
        return;
    }
    printf("%lld of %lld elements differ, first at ", (long long)r->mismatched,
           (long long)r->count);
    print_index(stdout, ea->t, r->first_index);
    const char *ta = exact_int(a->f, ea->t, r->first_index, false, v1, sizeof(v1));
    const char *tb = exact_int(b->f, eb->t, r->first_index, false, v2, sizeof(v2));
    printf(" (%s vs %s)\n", ta ? ta : value_text(r->first_a, ckpt_tensor_dtype(ea->t), v1, sizeof(v1)),
           tb ? tb : value_text(r->first_b, ckpt_tensor_dtype(eb->t), v2, sizeof(v2)));
}

static void print_text(diff *d)
{
    const side *a = &d->s[0], *b = &d->s[1];
    if (a->by_path || b->by_path || a->sd_path.len || b->sd_path.len) {
        print_source("A", a);
        print_source("B", b);
    }
    /* torch's order: missing, unexpected, then size mismatches */
    if (d->missing)
        print_key_list("Missing", a);
    if (d->unexpected)
        print_key_list("Unexpected", b);
    for (size_t k = 0; k < d->np; k++) {
        const pair *p = &d->p[k];
        if (!p->size_mismatch)
            continue;
        printf("size mismatch for %s: copying a param with shape torch.Size(", a->e[p->ia].key);
        print_shape(stdout, b->e[p->ib].t);
        printf(") from checkpoint, the shape in current model is torch.Size(");
        print_shape(stdout, a->e[p->ia].t);
        printf(").\n");
    }
    for (size_t k = 0; k < d->np; k++) {
        const pair *p = &d->p[k];
        if (p->dtype_mismatch)
            printf("dtype mismatch for %s: %s in A, %s in B\n", a->e[p->ia].key,
                   ckpt_dtype_name(ckpt_tensor_dtype(a->e[p->ia].t)),
                   ckpt_dtype_name(ckpt_tensor_dtype(b->e[p->ib].t)));
        print_values(d, p);
    }
    size_t hint = !d->normalize && d->missing && d->unexpected ? normalize_would_match(d) : 0;
    if (hint)
        printf("(--normalize would match %zu missing key%s with unexpected ones)\n", hint,
               hint == 1 ? "" : "s");
    printf("%zu tensor%s compared%s: %zu equal, %zu differ", d->np, d->np == 1 ? "" : "s",
           d->keys_only ? " (keys, shapes and dtypes only)" : "", d->equal, d->differ);
    if (d->size_mismatch)
        printf(" (%zu size mismatch%s)", d->size_mismatch, d->size_mismatch == 1 ? "" : "es");
    printf("; %zu missing, %zu unexpected\n", d->missing, d->unexpected);
    if (a->unreached || b->unreached)
        printf("not compared: storages inside opaque objects (%zu in A, %zu in B)\n",
               a->unreached, b->unreached);
    char why[300];
    if (not_equal_reason(d, why, sizeof(why)))
        printf("not equal: %s\n", why);
}

/* ---- JSON output --------------------------------------------------------------- */

/* A double; not-finite ones as the strings "nan", "inf", "-inf". */
static cJSON *json_double(double v)
{
    if (isnan(v))
        return cJSON_CreateString("nan");
    if (isinf(v))
        return cJSON_CreateString(v < 0 ? "-inf" : "inf");
    char buf[40];
    snprintf(buf, sizeof(buf), "%.17g", v);
    if (!strpbrk(buf, ".eEn"))
        strcat(buf, ".0");
    return cJSON_CreateRaw(buf);
}

/* An element: exact for integers (true/false for bool), else a double. */
static cJSON *json_value(ckpt_file *f, const ckpt_tensor *t, int64_t i, double v)
{
    char buf[40];
    const char *s = exact_int(f, t, i, true, buf, sizeof(buf));
    return s ? cJSON_CreateRaw(s) : json_double(v);
}

static cJSON *json_shape(const ckpt_tensor *t)
{
    return cli_json_dims(ckpt_tensor_shape(t), ckpt_tensor_ndim(t));
}

static cJSON *json_index(const ckpt_tensor *t, int64_t i)
{
    int64_t idx[MAX_DIMS];
    int n = unravel(t, i, idx);
    cJSON *a = cJSON_CreateArray();
    if (n < 0) { /* no coordinates: the flat index alone */
        cJSON_AddItemToArray(a, cli_json_int(i));
        n = 0;
    }
    for (int k = 0; k < n; k++)
        cJSON_AddItemToArray(a, cli_json_int(idx[k]));
    return a;
}

static cJSON *json_source(const side *s)
{
    if (s->by_path)
        return cJSON_CreateNull();
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < s->sd_path.len; i++) {
        const ckpt_path_elem *e = &s->sd_path.elems[i];
        cJSON_AddItemToArray(a, e->is_int ? cli_json_int(e->index) : cJSON_CreateString(e->key));
    }
    return a;
}

static int print_json(diff *d)
{
    const side *a = &d->s[0], *b = &d->s[1];
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "a", a->file);
    cJSON_AddStringToObject(root, "b", b->file);
    cJSON_AddStringToObject(root, "a_format", ckpt_format_name(ckpt_file_format(a->f)));
    cJSON_AddStringToObject(root, "b_format", ckpt_format_name(ckpt_file_format(b->f)));
    cJSON_AddItemToObject(root, "a_state_dict", json_source(a));
    cJSON_AddItemToObject(root, "b_state_dict", json_source(b));
    cJSON_AddItemToObject(root, "atol", json_double(d->atol));
    cJSON_AddItemToObject(root, "rtol", json_double(d->rtol));
    cJSON_AddBoolToObject(root, "keys_only", d->keys_only);
    cJSON_AddBoolToObject(root, "normalize", d->normalize);
    cJSON_AddBoolToObject(root, "equal", all_equal(d));
    char why[300];
    const char *reason = not_equal_reason(d, why, sizeof(why));
    if (reason)
        cJSON_AddStringToObject(root, "reason", reason);
    else
        cJSON_AddNullToObject(root, "reason");

    cJSON *missing = cJSON_AddArrayToObject(root, "missing");
    for (size_t i = 0; i < a->n; i++)
        if (a->e[i].match == NO_MATCH)
            cJSON_AddItemToArray(missing, cJSON_CreateString(a->e[i].key));
    cJSON *unexpected = cJSON_AddArrayToObject(root, "unexpected");
    for (size_t j = 0; j < b->n; j++)
        if (b->e[j].match == NO_MATCH)
            cJSON_AddItemToArray(unexpected, cJSON_CreateString(b->e[j].key));
    cJSON *sm = cJSON_AddArrayToObject(root, "size_mismatch");
    cJSON *dm = cJSON_AddArrayToObject(root, "dtype_mismatch");
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    for (size_t k = 0; k < d->np; k++) {
        const pair *p = &d->p[k];
        const entry *ea = &a->e[p->ia], *eb = &b->e[p->ib];
        if (p->size_mismatch) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "key", ea->key);
            cJSON_AddItemToObject(o, "a_shape", json_shape(ea->t));
            cJSON_AddItemToObject(o, "b_shape", json_shape(eb->t));
            cJSON_AddItemToArray(sm, o);
        }
        if (p->dtype_mismatch) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "key", ea->key);
            cJSON_AddStringToObject(o, "a_dtype", ckpt_dtype_name(ckpt_tensor_dtype(ea->t)));
            cJSON_AddStringToObject(o, "b_dtype", ckpt_dtype_name(ckpt_tensor_dtype(eb->t)));
            cJSON_AddItemToArray(dm, o);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "key", ea->key);
        if (d->normalize) {
            cJSON_AddStringToObject(o, "a_key", ea->orig);
            cJSON_AddStringToObject(o, "b_key", eb->orig);
        }
        cJSON_AddBoolToObject(o, "equal", p->equal);
        static const char *const how[] = {NULL, "values", "bytes", NULL};
        if (how[p->how])
            cJSON_AddStringToObject(o, "compared_as", how[p->how]);
        else
            cJSON_AddNullToObject(o, "compared_as");
        const ckpt_compare_result *r = &p->r;
        bool values = p->how == V_VALUES, any = values || p->how == V_BYTES;
        cJSON_AddItemToObject(o, "count", any ? cli_json_int(r->count) : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "mismatched", any ? cli_json_int(r->mismatched) : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "max_abs", values ? json_double(r->max_abs) : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "max_rel", values ? json_double(r->max_rel) : cJSON_CreateNull());
        bool first = any && r->first_index >= 0;
        cJSON_AddItemToObject(o, "first_index",
                              first ? json_index(ea->t, r->first_index) : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "first_a",
                              first && values ? json_value(a->f, ea->t, r->first_index, r->first_a)
                                              : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "first_b",
                              first && values ? json_value(b->f, eb->t, r->first_index, r->first_b)
                                              : cJSON_CreateNull());
        cJSON_AddItemToArray(tensors, o);
    }
    cJSON *sum = cJSON_AddObjectToObject(root, "summary");
    cJSON_AddItemToObject(sum, "compared", cli_json_int((long long)d->np));
    cJSON_AddItemToObject(sum, "equal", cli_json_int((long long)d->equal));
    cJSON_AddItemToObject(sum, "differ", cli_json_int((long long)d->differ));
    cJSON_AddItemToObject(sum, "missing", cli_json_int((long long)d->missing));
    cJSON_AddItemToObject(sum, "unexpected", cli_json_int((long long)d->unexpected));
    cJSON_AddItemToObject(sum, "size_mismatch", cli_json_int((long long)d->size_mismatch));
    cJSON_AddItemToObject(sum, "dtype_mismatch", cli_json_int((long long)d->dtype_mismatch));
    cJSON_AddItemToObject(sum, "a_unreached_storages", cli_json_int((long long)a->unreached));
    cJSON_AddItemToObject(sum, "b_unreached_storages", cli_json_int((long long)b->unreached));

    int rc = CLI_EXIT_OK;
    char *text = cJSON_Print(root);
    if (!text) {
        cli_error("diff", NULL, "out of memory");
        rc = CLI_EXIT_IO;
    } else {
        puts(text);
        free(text);
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- the command ------------------------------------------------------------------ */

static int tolerance(const char *name, const char *arg, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end || errno == ERANGE || !isfinite(v) || v < 0) {
        cli_usage_error("diff", "--%s needs a number >= 0, got '%s'", name, arg);
        return -1;
    }
    *out = v == 0 ? 0.0 : v; /* -0 is 0 */
    return 0;
}

static void side_free(side *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->e[i].key);
        free(s->e[i].orig);
    }
    free(s->e);
    free(s->sorted);
    ckpt_file_free(s->f);
}

int cmd_diff(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"atol", required_argument, NULL, OPT_ATOL},
        {"rtol", required_argument, NULL, OPT_RTOL},
        {"keys-only", no_argument, NULL, OPT_KEYS_ONLY},
        {"normalize", no_argument, NULL, OPT_NORMALIZE},
        {"json", no_argument, NULL, OPT_JSON},
        {"select", required_argument, NULL, OPT_SELECT},
        CLI_COMMON_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    diff d = {0};
    cli_common common = {0};
    int rc = CLI_EXIT_OK, opt;

    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        int c = cli_common_option("diff", opt, optarg, &common);
        if (c < 0) {
            rc = CLI_EXIT_USAGE;
            goto out;
        }
        if (c > 0)
            continue;
        switch (opt) {
        case OPT_ATOL:
            if (tolerance("atol", optarg, &d.atol) < 0) {
                rc = CLI_EXIT_USAGE;
                goto out;
            }
            break;
        case OPT_RTOL:
            if (tolerance("rtol", optarg, &d.rtol) < 0) {
                rc = CLI_EXIT_USAGE;
                goto out;
            }
            break;
        case OPT_KEYS_ONLY: d.keys_only = true; break;
        case OPT_NORMALIZE: d.normalize = true; break;
        case OPT_JSON: d.json = true; break;
        case OPT_SELECT: d.select = optarg; break;
        case CLI_OPT_HELP:
            fputs(diff_usage, stdout);
            goto out;
        default:
            rc = cli_bad_option("diff", opt, argv);
            goto out;
        }
    }
    if (argc - optind != 2) {
        rc = cli_usage_error("diff", argc - optind < 2 ? "needs two files, A and B"
                                                       : "expects exactly two files, A and B");
        goto out;
    }
    if ((d.keys_only && (d.atol || d.rtol))) {
        rc = cli_usage_error("diff", "--keys-only compares no values: --atol and --rtol do not apply");
        goto out;
    }
    d.quiet = common.quiet;
    d.s[0].file = argv[optind];
    d.s[1].file = argv[optind + 1];
    if (d.normalize) {
        d.rules = ckpt_rename_new();
        if (!d.rules || ckpt_rename_unwrap(d.rules) != CKPT_OK) {
            cli_error("diff", NULL, "out of memory");
            rc = CLI_EXIT_IO;
            goto out;
        }
    }
    for (int i = 0; i < 2; i++)
        if ((rc = cli_open("diff", d.s[i].file, &common, &d.s[i].f)) != CLI_EXIT_OK)
            goto out;
    for (int i = 0; i < 2; i++)
        if ((rc = pick(&d, &d.s[i])) != CLI_EXIT_OK)
            goto out;
    /* one side has many state dicts, the other one: where both hold the same
     * tree (a DCP folder drops empty dicts and makes int keys str, so it sees
     * state dicts the .pth it came from lacks), compare every tensor by path */
    if (!d.select && d.s[0].by_path != d.s[1].by_path && ckpt_file_state_dict_count(d.s[0].f) &&
        ckpt_file_state_dict_count(d.s[1].f) &&
        (ckpt_file_format(d.s[0].f) == CKPT_FORMAT_DCP ||
         ckpt_file_format(d.s[1].f) == CKPT_FORMAT_DCP))
        d.s[0].by_path = d.s[1].by_path = true;
    /* the tensors beside the state dicts, by path, when both files hold
     * their state dict at the same place (the same kind of file) */
    bool rest = !d.s[0].by_path && !d.s[1].by_path && same_path(&d.s[0].sd_path, &d.s[1].sd_path);
    for (int i = 0; i < 2; i++) {
        collect(&d, &d.s[i], rest);
        if ((rc = index_side(&d.s[i])) != CLI_EXIT_OK)
            goto out;
    }
    match_keys(&d);
    if ((rc = compare_all(&d)) != CLI_EXIT_OK)
        goto out;
    if (!d.quiet) {
        if (d.json)
            rc = print_json(&d);
        else
            print_text(&d);
        if (rc == CLI_EXIT_OK && (fflush(stdout) != 0 || ferror(stdout))) {
            cli_error("diff", NULL, "cannot write output");
            rc = CLI_EXIT_IO;
        }
    }
    if (rc == CLI_EXIT_OK && !all_equal(&d))
        rc = CLI_EXIT_DIFFERENT;
out:
    side_free(&d.s[0]);
    side_free(&d.s[1]);
    free(d.p);
    ckpt_rename_free(d.rules);
    cli_common_free(&common);
    return rc;
}
