/* cmd_inspect.c - ckpt inspect: every tensor of a checkpoint, read from the
 * container index and the pickle only (the data too with --stats). */
#include "cli.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

static const char inspect_usage[] =
    "usage: ckpt inspect [--json] [--stats] [--filter REGEX] FILE\n"
    "\n"
    "List every tensor of a PyTorch checkpoint (key, dtype, shape, stride,\n"
    "device, bytes), the state dicts and their wrapper prefixes (module., ...),\n"
    "opaque objects, and totals by dtype and device.  Only the container index\n"
    "and the pickle are read, unless --stats asks for the data.\n"
    "\n"
    "  -j, --json             print the JSON document of ckpt-inspect(1)\n"
    "  --stats                read the data: min, max, mean, std, NaN and Inf counts\n"
    "                         and CRC-32 per tensor (CRC of every record is checked)\n"
    "  --filter REGEX         show only tensors whose path matches (PCRE2)\n"
    "  --allow-global M.NAME  admit this global as an opaque object (repeatable)\n"
    "  --allow-unknown        admit every unknown global as an opaque object\n"
    "  --max-pickle-bytes N   refuse pickles larger than N bytes (default 1G)\n"
    "  --max-header-bytes N   refuse safetensors headers larger than N bytes\n"
    "                         (default 100000000, as safetensors)\n"
    "  --max-depth N          refuse values nested more than N levels (default 10000)\n"
    "  -q, --quiet            print nothing but errors on stderr\n"
    "  -h, --help             this text\n";

enum { OPT_STATS = CLI_OPT_FIRST_COMMAND_OPTION, OPT_FILTER };

typedef struct inspect {
    ckpt_file *f;
    const char *file;
    bool json, stats, quiet;
    bool default_reading; /* the torch_load verdict may use F (cli_reading_is_default) */
    pcre2_code *filter;
    pcre2_match_data *match;
    char *pathbuf;
    size_t pathcap;
    ckpt_tensor_stats *st; /* --stats: one per tensor, all read before printing */
    ckpt_tensor_stats *ost; /* --stats: one per other tensor (outside the state dict) */
} inspect;

static const char *path_text(inspect *in, const ckpt_path *p)
{
    size_t need = ckpt_path_format(p, in->pathbuf, in->pathcap) + 1;
    if (need > in->pathcap) {
        char *b = realloc(in->pathbuf, need);
        if (!b)
            return "?";
        in->pathbuf = b;
        in->pathcap = need;
        ckpt_path_format(p, in->pathbuf, in->pathcap);
    }
    return in->pathbuf;
}

static bool shown(inspect *in, const char *path)
{
    if (!in->filter)
        return true;
    return pcre2_match(in->filter, (PCRE2_SPTR)path, PCRE2_ZERO_TERMINATED, 0, 0, in->match,
                       NULL) >= 0;
}

static cJSON *json_path(const ckpt_path *p)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < p->len; i++)
        cJSON_AddItemToArray(a, p->elems[i].is_int ? cli_json_int(p->elems[i].index)
                                                   : cJSON_CreateString(p->elems[i].key));
    return a;
}

static cJSON *json_double(double v)
{
    if (isnan(v) || isinf(v))
        return cJSON_CreateNull();
    char buf[40];
    snprintf(buf, sizeof(buf), "%.17g", v);
    return cJSON_CreateRaw(buf);
}

static void format_shape(const ckpt_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ckpt_tensor_ndim(t) && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "",
                              (long long)ckpt_tensor_shape(t)[d]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* Progress on a terminal for long --stats runs. */
static void progress(inspect *in, size_t done, size_t total, time_t start)
{
    if (in->quiet || !isatty(2) || time(NULL) - start < 1)
        return;
    fprintf(stderr, "\rckpt: inspect: reading data %zu/%zu tensors", done, total);
    if (done == total)
        fputc('\n', stderr);
}

typedef struct totals {
    unsigned long long bytes, elements;
    cJSON *by_dtype, *by_device; /* name -> bytes, built for both outputs */
} totals;

static void add_to(cJSON *obj, const char *name, unsigned long long n)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(obj, name);
    unsigned long long prev = e ? strtoull(e->valuestring, NULL, 10) : 0;
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", prev + n);
    if (e)
        cJSON_ReplaceItemInObjectCaseSensitive(obj, name, cJSON_CreateRaw(buf));
    else
        cJSON_AddItemToObject(obj, name, cJSON_CreateRaw(buf));
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

static void compute_totals(inspect *in, totals *t)
{
    ckpt_file *f = in->f;
    memset(t, 0, sizeof(*t));
    t->by_dtype = cJSON_CreateObject();
    t->by_device = cJSON_CreateObject();
    for (size_t i = 0; i < ckpt_file_storage_count(f); i++) {
        const ckpt_storage *s = ckpt_file_storage(f, i);
        if (ckpt_storage_view_of(s, NULL))
            continue; /* its bytes are its root's */
        t->bytes += ckpt_storage_nbytes(s);
        add_to(t->by_dtype, ckpt_dtype_name(ckpt_storage_dtype(s)), ckpt_storage_nbytes(s));
        add_to(t->by_device, ckpt_storage_device(s), ckpt_storage_nbytes(s));
    }
    /* elements of distinct tensors: a tied tensor listed twice counts once */
    size_t n = ckpt_file_tensor_count(f);
    const ckpt_tensor **all = malloc((n ? n : 1) * sizeof(*all));
    if (!all)
        return;
    for (size_t i = 0; i < n; i++)
        all[i] = ckpt_file_tensor(f, i, NULL);
    qsort(all, n, sizeof(*all), cmp_ptr);
    for (size_t i = 0; i < n; i++)
        if (i == 0 || all[i] != all[i - 1])
            t->elements += (unsigned long long)ckpt_tensor_numel(all[i]);
    free(all);
}

/* --stats: read every shown tensor (and so check every CRC) before anything
 * is printed, so that a corrupt file gives an error and no partial table. */
static int read_all_stats(inspect *in)
{
    ckpt_file *f = in->f;
    size_t n = ckpt_file_tensor_count(f), ns = ckpt_file_storage_count(f);
    in->st = calloc(n ? n : 1, sizeof(*in->st));
    bool *checked = calloc(ns ? ns : 1, sizeof(*checked));
    int rc = CKPT_OK;
    if (!in->st || !checked) {
        free(checked);
        cli_error("inspect", in->file, "out of memory");
        return CLI_EXIT_IO;
    }
    /* every tensor, shown or not: --stats vouches for the whole file */
    time_t start = time(NULL);
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        const ckpt_tensor *t = ckpt_file_tensor(f, i, NULL);
        rc = ckpt_tensor_stats_compute(f, t, &in->st[i]);
        if (ckpt_tensor_storage(t))
            checked[ckpt_storage_index(ckpt_tensor_storage(t))] = true;
        progress(in, i + 1, n, start);
    }
    size_t no = ckpt_file_other_tensor_count(f);
    if (no && !(in->ost = calloc(no, sizeof(*in->ost)))) {
        free(checked);
        cli_error("inspect", in->file, "out of memory");
        return CLI_EXIT_IO;
    }
    for (size_t i = 0; i < no && rc == CKPT_OK; i++) {
        const ckpt_tensor *t = ckpt_file_other_tensor(f, i, NULL, NULL);
        rc = ckpt_tensor_stats_compute(f, t, &in->ost[i]);
        if (ckpt_tensor_storage(t))
            checked[ckpt_storage_index(ckpt_tensor_storage(t))] = true;
    }
    /* storages no listed tensor uses (inside opaque objects): CRC only */
    for (size_t k = 0; k < ns && rc == CKPT_OK; k++) {
        if (checked[k])
            continue;
        const ckpt_storage *s = ckpt_file_storage(f, k);
        void *buf = malloc(ckpt_storage_nbytes(s) ? ckpt_storage_nbytes(s) : 1);
        if (!buf) {
            free(checked);
            cli_error("inspect", in->file, "out of memory");
            return CLI_EXIT_IO;
        }
        rc = ckpt_storage_read(f, s, 0, buf, ckpt_storage_nbytes(s));
        free(buf);
    }
    free(checked);
    /* a folder's storages are runs of its files' records: read each record
     * whole too, so that every CRC-32 is checked */
    if (rc == CKPT_OK)
        rc = ckpt_file_check_records(f);
    if (rc != CKPT_OK) {
        if (!in->quiet && isatty(2) && time(NULL) - start >= 1)
            fputc('\n', stderr);
        cli_error("inspect", in->file, "%s", ckpt_file_error_message(f));
        return cli_exit_for(rc);
    }
    return CLI_EXIT_OK;
}

static void json_stats(const ckpt_tensor_stats *st, cJSON *jt)
{
    if (st->valid) {
        cJSON_AddItemToObject(jt, "min", json_double(st->min));
        cJSON_AddItemToObject(jt, "max", json_double(st->max));
        cJSON_AddItemToObject(jt, "mean", json_double(st->mean));
        cJSON_AddItemToObject(jt, "std", json_double(st->std));
        cJSON_AddItemToObject(jt, "nan", cli_json_int(st->nan));
        cJSON_AddItemToObject(jt, "inf", cli_json_int(st->inf));
    }
    char crc[16];
    snprintf(crc, sizeof(crc), "%08x", st->crc32);
    cJSON_AddStringToObject(jt, "crc32", crc);
}

/* A per-channel quantizer parameter, read whole (it is one value a channel). */
static cJSON *json_channel_values(ckpt_file *f, const ckpt_tensor *t)
{
    size_t n = (size_t)ckpt_tensor_numel(t);
    double *v = malloc((n ? n : 1) * sizeof(*v));
    float *x = malloc((n ? n : 1) * sizeof(*x));
    int64_t *iv = (int64_t *)v;
    cJSON *a = NULL;
    bool ints = ckpt_tensor_dtype(t) == CKPT_DTYPE_INT64;
    if (v && x &&
        (ckpt_tensor_dtype(t) == CKPT_DTYPE_FLOAT32
             ? ckpt_tensor_read_float32(f, t, x, n)
             : ckpt_tensor_read(f, t, v, n * sizeof(*v))) == CKPT_OK) {
        a = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++)
            cJSON_AddItemToArray(a, ints ? cli_json_int(iv[i])
                                         : json_double(ckpt_tensor_dtype(t) == CKPT_DTYPE_FLOAT32
                                                           ? (double)x[i]
                                                           : v[i]));
    }
    free(v);
    free(x);
    return a ? a : cJSON_CreateNull();
}

/* "kind", and a quantized tensor's quantizer (doc/design.md, "JSON": qscheme, scale,
 * zero_point, axis; per channel the scales and zero points are lists) */
static void json_kind(inspect *in, const ckpt_tensor *t, cJSON *jt)
{
    ckpt_qparams q;
    cJSON_AddStringToObject(jt, "kind", ckpt_tensor_kind_name(ckpt_tensor_kind_of(t)));
    if (ckpt_tensor_qparams(t, &q) != CKPT_OK)
        return;
    cJSON_AddStringToObject(jt, "qscheme", q.qscheme);
    if (!q.scales) {
        cJSON_AddItemToObject(jt, "scale", json_double(q.scale));
        cJSON_AddItemToObject(jt, "zero_point", cli_json_int(q.zero_point));
        return;
    }
    cJSON_AddItemToObject(jt, "axis", cli_json_int(q.axis));
    cJSON_AddItemToObject(jt, "scale", json_channel_values(in->f, q.scales));
    cJSON_AddItemToObject(jt, "zero_point", json_channel_values(in->f, q.zero_points));
}

/* The rank whose file FILE is, from a folder's layout (its place in
 * rank_files, or in model_files at ZeRO stage 3), else -1. */
static long layout_rank(const cJSON *layout, const char *file)
{
    const cJSON *stage = cJSON_GetObjectItemCaseSensitive(layout, "zero_stage");
    const char *lists[] = {"rank_files",
                           cJSON_IsNumber(stage) && stage->valueint == 3 ? "model_files" : NULL};
    for (int l = 0; l < 2 && file; l++) {
        long k = 0;
        const cJSON *e;
        const cJSON *list = lists[l] ? cJSON_GetObjectItemCaseSensitive(layout, lists[l]) : NULL;
        cJSON_ArrayForEach(e, list)
        {
            if (cJSON_IsString(e) && strcmp(e->valuestring, file) == 0)
                return k;
            k++;
        }
    }
    return -1;
}

/* Where a folder checkpoint's tensor comes from: its storage's runs of the
 * folder's files, each with its rank (its file's place in the layout's
 * rank_files; null for another file). */
static void json_runs(const ckpt_storage *s, const cJSON *layout, cJSON *jt)
{
    size_t n = ckpt_storage_run_count(s);
    if (!n)
        return;
    cJSON *a = cJSON_AddArrayToObject(jt, "runs");
    for (size_t i = 0; i < n; i++) {
        const char *file;
        uint64_t off, nb, at;
        if (ckpt_storage_run(s, i, &file, &off, &nb, &at) != CKPT_OK)
            break;
        cJSON *r = cJSON_CreateObject();
        if (file)
            cJSON_AddStringToObject(r, "file", file);
        else
            cJSON_AddNullToObject(r, "file");
        long rank = layout_rank(layout, file);
        if (rank >= 0)
            cJSON_AddItemToObject(r, "rank", cli_json_int(rank));
        else
            cJSON_AddNullToObject(r, "rank");
        cJSON_AddItemToObject(r, "file_offset", cli_json_int((long long)off));
        cJSON_AddItemToObject(r, "nbytes", cli_json_int((long long)nb));
        cJSON_AddItemToObject(r, "storage_offset", cli_json_int((long long)at));
        cJSON_AddItemToArray(a, r);
    }
}

/* A tensor of a folder checkpoint (DCP): the chunks it is assembled from,
 * where each lies (from the metadata; no data read). */
static void json_chunks(const ckpt_tensor *t, cJSON *jt)
{
    size_t n = ckpt_tensor_chunk_count(t);
    if (!n)
        return;
    cJSON *a = cJSON_AddArrayToObject(jt, "chunks");
    for (size_t i = 0; i < n; i++) {
        const ckpt_chunk *c = ckpt_tensor_chunk(t, i);
        cJSON *jc = cJSON_CreateObject();
        cJSON_AddItemToObject(jc, "offsets", cli_json_dims(c->offsets, c->ndim));
        cJSON_AddItemToObject(jc, "sizes", cli_json_dims(c->sizes, c->ndim));
        cJSON_AddItemToObject(jc, "rank", cli_json_int(c->rank));
        if (c->file)
            cJSON_AddStringToObject(jc, "file", c->file);
        else
            cJSON_AddNullToObject(jc, "file");
        cJSON_AddItemToObject(jc, "file_offset", cli_json_int((long long)c->file_offset));
        cJSON_AddItemToObject(jc, "length", cli_json_int((long long)c->length));
        cJSON_AddItemToArray(a, jc);
    }
}

/* A rank's local shard of a ShardedTensor / DTensor saved per rank: where it
 * lies in the whole (the tensor's shape is the shard's). */
static void json_shard(const ckpt_tensor *t, cJSON *jt)
{
    ckpt_shard_info si;
    if (ckpt_tensor_shard(t, &si) != CKPT_OK)
        return;
    cJSON *js = cJSON_AddObjectToObject(jt, "shard");
    cJSON_AddStringToObject(js, "type", si.type);
    cJSON_AddItemToObject(js, "global_shape", cli_json_dims(si.global_shape, si.ndim));
    if (si.rank >= 0)
        cJSON_AddItemToObject(js, "rank", cli_json_int(si.rank));
    else
        cJSON_AddNullToObject(js, "rank");
    cJSON *a = cJSON_AddArrayToObject(js, "chunks");
    for (size_t i = 0; i < si.nchunks; i++) {
        const ckpt_chunk *c = &si.chunks[i];
        cJSON *jc = cJSON_CreateObject();
        cJSON_AddItemToObject(jc, "offsets", cli_json_dims(c->offsets, c->ndim));
        cJSON_AddItemToObject(jc, "sizes", cli_json_dims(c->sizes, c->ndim));
        cJSON_AddItemToObject(jc, "rank", cli_json_int(c->rank));
        cJSON_AddItemToArray(a, jc);
    }
    if (si.unsupported)
        cJSON_AddStringToObject(js, "unsupported", si.unsupported);
    else
        cJSON_AddNullToObject(js, "unsupported");
}

/* "local shard [0:4, 0:5] of global [7, 5], rank 0" */
static void print_shard(const ckpt_tensor *t, const char *sep)
{
    ckpt_shard_info si;
    if (ckpt_tensor_shard(t, &si) != CKPT_OK)
        return;
    if (si.unsupported) {
        cli_printf("%s%s", sep, si.unsupported);
        sep = ", ";
    } else if (!si.nchunks) {
        cli_printf("%sno local shard", sep);
    } else {
        cli_printf("%slocal shard [", sep);
        for (int d = 0; d < si.ndim; d++)
            cli_printf("%s%lld:%lld", d ? ", " : "", (long long)si.chunks->offsets[d],
                       (long long)(si.chunks->offsets[d] + si.chunks->sizes[d]));
        cli_printf("]");
    }
    cli_printf("%sof global [", si.unsupported ? ", " : " ");
    for (int d = 0; d < si.ndim; d++)
        cli_printf("%s%lld", d ? ", " : "", (long long)si.global_shape[d]);
    cli_printf("]");
    if (si.rank >= 0)
        cli_printf(", rank %d", si.rank);
}

/* One element of a long array, as cJSON_Print prints it inside the
 * document (two levels down: two more tabs after each newline; no string
 * holds a raw newline), after ", " unless it is the first. */
static int json_element(cJSON *e, bool first)
{
    char *t = cJSON_Print(e);
    cJSON_Delete(e);
    size_t nl = 0, len = t ? strlen(t) : 0;
    for (size_t i = 0; i < len; i++)
        nl += t[i] == '\n';
    char *out = t ? malloc(len + 2 * nl + 3) : NULL;
    if (!out) {
        free(t);
        return CLI_EXIT_IO;
    }
    char *o = out;
    if (!first) {
        *o++ = ',';
        *o++ = ' ';
    }
    for (size_t i = 0; i < len; i++) {
        *o++ = t[i];
        if (t[i] == '\n') {
            *o++ = '\t';
            *o++ = '\t';
        }
    }
    *o = '\0';
    cli_json_write(out);
    free(out);
    free(t);
    return CLI_EXIT_OK;
}

/* What every tensor's object says, after its path: dtype to nbytes. */
static void json_tensor_fields(const ckpt_tensor *t, cJSON *jt)
{
    const ckpt_storage *s = ckpt_tensor_storage(t);
    cJSON_AddStringToObject(jt, "dtype", ckpt_dtype_name(ckpt_tensor_dtype(t)));
    cJSON_AddItemToObject(jt, "shape", cli_json_dims(ckpt_tensor_shape(t), ckpt_tensor_ndim(t)));
    cJSON_AddItemToObject(jt, "stride", cli_json_dims(ckpt_tensor_stride(t), ckpt_tensor_ndim(t)));
    cJSON_AddItemToObject(jt, "offset", cli_json_int(ckpt_tensor_offset(t)));
    cJSON_AddStringToObject(jt, "device", ckpt_tensor_device(t));
    if (s)
        cJSON_AddStringToObject(jt, "storage", ckpt_storage_key(s));
    else
        cJSON_AddNullToObject(jt, "storage");
    cJSON_AddItemToObject(jt, "nbytes", cli_json_int((long long)ckpt_tensor_nbytes(t)));
}

/* "tensors": one object at a time, so that 1.7 M tensors never stand as a
 * cJSON tree (issue 26: 6 GiB) */
static int json_tensors(inspect *in, const cJSON *layout)
{
    ckpt_file *f = in->f;
    size_t n = ckpt_file_tensor_count(f);
    bool first = true;
    cli_json_write("[");
    for (size_t i = 0; i < n; i++) {
        ckpt_path p;
        const ckpt_tensor *t = ckpt_file_tensor(f, i, &p);
        if (!shown(in, path_text(in, &p)))
            continue;
        const ckpt_storage *s = ckpt_tensor_storage(t);
        cJSON *jt = cJSON_CreateObject();
        cJSON_AddItemToObject(jt, "path", json_path(&p));
        json_tensor_fields(t, jt);
        json_kind(in, t, jt);
        cJSON_AddBoolToObject(jt, "parameter", ckpt_tensor_is_parameter(t));
        cJSON_AddBoolToObject(jt, "requires_grad", ckpt_tensor_requires_grad(t));
        if (s && layout)
            json_runs(s, layout, jt);
        json_chunks(t, jt);
        json_shard(t, jt);
        if (in->stats)
            json_stats(&in->st[i], jt);
        if (json_element(jt, first) != CLI_EXIT_OK) {
            cli_error("inspect", in->file, "out of memory");
            return CLI_EXIT_IO;
        }
        first = false;
    }
    cli_json_write("]");
    return CLI_EXIT_OK;
}

static int json_storages(inspect *in)
{
    ckpt_file *f = in->f;
    cli_json_write("[");
    for (size_t i = 0; i < ckpt_file_storage_count(f); i++) {
        const ckpt_storage *s = ckpt_file_storage(f, i);
        cJSON *js = cJSON_CreateObject();
        cJSON_AddStringToObject(js, "key", ckpt_storage_key(s));
        cJSON_AddStringToObject(js, "dtype", ckpt_dtype_name(ckpt_storage_dtype(s)));
        cJSON_AddItemToObject(js, "numel", cli_json_int(ckpt_storage_numel(s)));
        cJSON_AddStringToObject(js, "device", ckpt_storage_device(s));
        cJSON_AddItemToObject(js, "nbytes", cli_json_int((long long)ckpt_storage_nbytes(s)));
        int64_t voff;
        const ckpt_storage *root = ckpt_storage_view_of(s, &voff);
        if (root) {
            cJSON *jv = cJSON_AddObjectToObject(js, "view_of");
            cJSON_AddStringToObject(jv, "key", ckpt_storage_key(root));
            cJSON_AddItemToObject(jv, "offset", cli_json_int(voff));
        }
        if (json_element(js, i == 0) != CLI_EXIT_OK) {
            cli_error("inspect", in->file, "out of memory");
            return CLI_EXIT_IO;
        }
    }
    cli_json_write("]");
    return CLI_EXIT_OK;
}

static int print_json(inspect *in)
{
    ckpt_file *f = in->f;
    int rc = CLI_EXIT_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "file", in->file);
    cJSON_AddStringToObject(root, "format", ckpt_format_name(ckpt_file_format(f)));
    cJSON_AddItemToObject(root, "torch_load", cli_torch_load_json(in->file, in->default_reading ? f : NULL));
    if (ckpt_file_format(f) == CKPT_FORMAT_PTH_ZIP ||
        ckpt_file_format(f) == CKPT_FORMAT_TORCHSCRIPT) {
        cJSON *rec = cJSON_AddArrayToObject(root, "records");
        for (size_t i = 0; i < ckpt_file_record_count(f); i++)
            cJSON_AddItemToArray(rec, cJSON_CreateString(ckpt_file_record_name(f, i)));
        uint64_t dead;
        if (ckpt_file_dead_bytes(f, &dead) == CKPT_OK) /* left by in-place rewrites */
            cJSON_AddItemToObject(root, "dead_bytes", cli_json_int((long long)dead));
    }
    cJSON *layout = ckpt_file_layout(f) ? cJSON_Parse(ckpt_file_layout(f)) : NULL;
    if (layout)
        cJSON_AddItemToObject(root, "layout", layout);
    if (ckpt_file_notice_count(f)) {
        cJSON *notes = cJSON_AddArrayToObject(root, "notices");
        for (size_t i = 0; i < ckpt_file_notice_count(f); i++)
            cJSON_AddItemToArray(notes, cJSON_CreateString(ckpt_file_notice(f, i)));
    }
    /* the two long arrays are printed element by element where these marks
     * stand (a control byte: escaped in every string, so found only here) */
    cJSON_AddItemToObject(root, "tensors", cJSON_CreateRaw("\x01"));
    cJSON *others = cJSON_AddArrayToObject(root, "other_tensors");
    for (size_t i = 0; i < ckpt_file_other_tensor_count(f); i++) {
        ckpt_path p;
        const char *why;
        const ckpt_tensor *t = ckpt_file_other_tensor(f, i, &p, &why);
        if (!shown(in, path_text(in, &p)))
            continue;
        cJSON *jt = cJSON_CreateObject();
        cJSON_AddItemToObject(jt, "path", json_path(&p));
        cJSON_AddStringToObject(jt, "why", why);
        json_tensor_fields(t, jt);
        cJSON_AddStringToObject(jt, "kind", ckpt_tensor_kind_name(ckpt_tensor_kind_of(t)));
        cJSON_AddBoolToObject(jt, "parameter", ckpt_tensor_is_parameter(t));
        cJSON_AddBoolToObject(jt, "requires_grad", ckpt_tensor_requires_grad(t));
        if (in->stats)
            json_stats(&in->ost[i], jt);
        cJSON_AddItemToArray(others, jt);
    }
    cJSON_AddItemToObject(root, "storages", cJSON_CreateRaw("\x02"));
    cJSON *sds = cJSON_AddArrayToObject(root, "state_dicts");
    for (size_t i = 0; i < ckpt_file_state_dict_count(f); i++) {
        ckpt_path p;
        const ckpt_value *sd = ckpt_file_state_dict(f, i, &p);
        cJSON *js = cJSON_CreateObject();
        cJSON_AddItemToObject(js, "path", json_path(&p));
        cJSON_AddItemToObject(js, "tensors", cli_json_int((long long)ckpt_value_len(sd)));
        cJSON_AddStringToObject(js, "source", ckpt_file_state_dict_source(f, i));
        if (ckpt_file_state_dict_class(f, i))
            cJSON_AddStringToObject(js, "class", ckpt_file_state_dict_class(f, i));
        cJSON_AddBoolToObject(js, "model", ckpt_file_state_dict_is_model(f, i));
        const char *w[16];
        size_t nw = ckpt_state_dict_wrappers(sd, w, 16);
        cJSON *jw = cJSON_AddArrayToObject(js, "wrappers");
        for (size_t k = 0; k < nw && k < 16; k++)
            cJSON_AddItemToArray(jw, cJSON_CreateString(w[k]));
        cJSON_AddItemToArray(sds, js);
    }
    cJSON *objs = cJSON_AddArrayToObject(root, "objects");
    for (size_t i = 0; i < ckpt_file_object_count(f); i++) {
        ckpt_path p;
        const ckpt_value *o = ckpt_file_object(f, i, &p);
        cJSON *jo = cJSON_CreateObject();
        cJSON_AddItemToObject(jo, "path", json_path(&p));
        cJSON_AddStringToObject(jo, "global", ckpt_value_global(o));
        cJSON_AddItemToArray(objs, jo);
    }
    totals t;
    compute_totals(in, &t);
    cJSON *sum = cJSON_AddObjectToObject(root, "summary");
    cJSON_AddItemToObject(sum, "tensors", cli_json_int((long long)ckpt_file_tensor_count(f)));
    cJSON_AddItemToObject(sum, "parameters", cli_json_int((long long)t.elements));
    cJSON_AddItemToObject(sum, "bytes", cli_json_int((long long)t.bytes));
    cJSON_AddItemToObject(sum, "by_dtype", t.by_dtype);
    cJSON_AddItemToObject(sum, "by_device", t.by_device);

    char *text = cJSON_Print(root);
    char *at_t = text ? strchr(text, '\x01') : NULL, *at_s = at_t ? strchr(at_t, '\x02') : NULL;
    if (!at_s) {
        cli_error("inspect", in->file, "out of memory");
        rc = CLI_EXIT_IO;
    } else {
        *at_t = *at_s = '\0';
        cli_json_write(text);
        if ((rc = json_tensors(in, layout)) == CLI_EXIT_OK) {
            cli_json_write(at_t + 1);
            rc = json_storages(in);
        }
        if (rc == CLI_EXIT_OK)
            cli_json_puts(at_s + 1);
    }
    free(text);
    cJSON_Delete(root);
    return rc;
}

static const char *wrapper_note(const char *w)
{
    if (strcmp(w, "module.") == 0)
        return "DataParallel / DistributedDataParallel";
    if (strcmp(w, "_orig_mod.") == 0)
        return "torch.compile";
    if (strcmp(w, "_fsdp_wrapped_module.") == 0)
        return "FSDP";
    if (strcmp(w, "_forward_module.") == 0)
        return "Lightning Fabric";
    if (strcmp(w, "_checkpoint_wrapped_module.") == 0)
        return "activation checkpointing";
    return "wrapper";
}

/* "by dtype: float32 397.5 KiB, int64 8 B" from a name -> bytes object */
static void print_breakdown(const char *label, const cJSON *by)
{
    char b[32];
    const char *sep = " ";
    const cJSON *e;
    cli_printf("%s", label);
    if (!cJSON_GetArraySize(by))
        cli_printf(" (none)");
    cJSON_ArrayForEach(e, by)
    {
        cli_printf("%s%s %s", sep, e->string,
                   cli_human_bytes(strtoull(e->valuestring, NULL, 10), b, sizeof(b)));
        sep = ", ";
    }
    cli_printf("\n");
}

/* A folder checkpoint's layout in one line. */
static void print_layout(ckpt_file *f)
{
    cJSON *l = ckpt_file_layout(f) ? cJSON_Parse(ckpt_file_layout(f)) : NULL;
    const cJSON *stage = cJSON_GetObjectItemCaseSensitive(l, "zero_stage");
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(l, "optimizer");
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(l, "tag");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(l, "world_size");
    if (cJSON_IsNumber(stage) && cJSON_IsString(opt) && cJSON_IsString(tag) && cJSON_IsNumber(ws))
        cli_printf("DeepSpeed ZeRO stage %d (%s), tag '%s', %d ranks: %s\n", stage->valueint,
                   opt->valuestring, tag->valuestring, ws->valueint,
                   stage->valueint == 3 ? "each parameter is a slice of every rank's flat fp32 groups"
                                    : "each parameter is a range of the ranks' flat fp32 "
                                      "partitions, joined");
    cJSON_Delete(l);
}

/* A table row's columns, KEY to SIZE, and with --stats (ST) the statistics. */
static void print_row(const ckpt_tensor *x, const char *k, int wkey, int wdt, int wshape,
                      int wdev, const ckpt_tensor_stats *st)
{
    char b1[32], b2[64];
    format_shape(x, b2, sizeof(b2));
    cli_printf("%-*s  %-*s  %-*s  %-*s  %10s", wkey, k, wdt, ckpt_dtype_name(ckpt_tensor_dtype(x)),
               wshape, b2, wdev, ckpt_tensor_device(x),
               cli_human_bytes(ckpt_tensor_nbytes(x), b1, sizeof(b1)));
    if (st && st->valid)
        cli_printf("  %12.5g %12.5g %12.5g %12.5g %5lld %5lld", st->min, st->max, st->mean,
                   st->std, (long long)st->nan, (long long)st->inf);
    else if (st)
        cli_printf("  %12s %12s %12s %12s %5s %5s", "-", "-", "-", "-", "-", "-");
}

/* The tensors a pickled model holds outside its state dict: listed after
 * it, never among its keys (no command writes them). */
static void print_others(inspect *in)
{
    ckpt_file *f = in->f;
    size_t n = ckpt_file_other_tensor_count(f), wkey = 3, wshape = 5, wdev = 6, wdt = 5, nshown = 0;
    char b2[64];
    for (size_t i = 0; i < n; i++) {
        ckpt_path p;
        const ckpt_tensor *x = ckpt_file_other_tensor(f, i, &p, NULL);
        const char *k = path_text(in, &p);
        if (!shown(in, k))
            continue;
        nshown++;
        size_t l = strlen(cli_text(k));
        wkey = l > wkey ? l : wkey;
        format_shape(x, b2, sizeof(b2));
        wshape = strlen(b2) > wshape ? strlen(b2) : wshape;
        l = strlen(ckpt_tensor_device(x));
        wdev = l > wdev ? l : wdev;
        l = strlen(ckpt_dtype_name(ckpt_tensor_dtype(x)));
        wdt = l > wdt ? l : wdt;
    }
    if (!nshown)
        return;
    if (wkey > 60)
        wkey = 60;
    cli_printf("\nother tensors (not in the state dict; listed, never written): %zu\n", nshown);
    cli_printf("%-*s  %-*s  %-*s  %-*s  %10s", (int)wkey, "KEY", (int)wdt, "DTYPE", (int)wshape,
               "SHAPE", (int)wdev, "DEVICE", "SIZE");
    if (in->stats)
        cli_printf("  %12s %12s %12s %12s %5s %5s", "MIN", "MAX", "MEAN", "STD", "NAN", "INF");
    cli_printf("  NOTE\n");
    for (size_t i = 0; i < n; i++) {
        ckpt_path p;
        const char *why;
        const ckpt_tensor *x = ckpt_file_other_tensor(f, i, &p, &why);
        const char *k = path_text(in, &p);
        if (!shown(in, k))
            continue;
        print_row(x, k, (int)wkey, (int)wdt, (int)wshape, (int)wdev,
                  in->stats ? &in->ost[i] : NULL);
        cli_printf("  %s%s\n", why, ckpt_tensor_is_parameter(x) ? ", parameter" : "");
    }
}

static int print_text(inspect *in)
{
    ckpt_file *f = in->f;
    char b1[32], b2[64];
    size_t n = ckpt_file_tensor_count(f);
    totals t;
    compute_totals(in, &t);
    cJSON *layout = ckpt_file_layout(f) ? cJSON_Parse(ckpt_file_layout(f)) : NULL;

    cli_printf("%s: %s, %zu tensors in %zu storages, %s\n", in->file,
               ckpt_format_name(ckpt_file_format(f)), n, ckpt_file_storage_count(f),
               cli_human_bytes(t.bytes, b1, sizeof(b1)));
    if (ckpt_file_format(f) == CKPT_FORMAT_PTH_ZIP ||
        ckpt_file_format(f) == CKPT_FORMAT_TORCHSCRIPT) {
        cli_printf("archive prefix '%s', %zu records\n",
                   ckpt_file_prefix(f), ckpt_file_record_count(f));
        uint64_t dead;
        if (ckpt_file_dead_bytes(f, &dead) == CKPT_OK && dead)
            cli_printf("dead bytes: %s (no record holds them: left by in-place rewrites)\n",
                       cli_human_bytes(dead, b1, sizeof(b1)));
    }
    cli_torch_load_print(in->file, in->default_reading ? f : NULL, "");
    print_layout(f);

    for (size_t i = 0; i < ckpt_file_state_dict_count(f); i++) {
        ckpt_path p;
        const ckpt_value *sd = ckpt_file_state_dict(f, i, &p);
        const char *where = p.len ? path_text(in, &p) : "(root)";
        const char *cls = ckpt_file_state_dict_class(f, i);
        cli_printf("state dict %s: %zu tensor%s", where, ckpt_value_len(sd),
                   ckpt_value_len(sd) == 1 ? "" : "s");
        if (cls && strcmp(ckpt_file_state_dict_source(f, i), "torchscript") == 0)
            cli_printf(", TorchScript module %s (named as torch.jit.load(f).state_dict(): "
                       "non-persistent buffers included; ckpt extract writes it)", cls);
        else if (cls) /* torch.load would import it; ckpt reads its structure */
            cli_printf(", module tree of %s (a pickled nn.Module; ckpt extract writes its "
                       "state dict)", cls);
        const char *w[16];
        size_t nw = ckpt_state_dict_wrappers(sd, w, 16);
        for (size_t k = 0; k < nw && k < 16; k++)
            cli_printf("%s %s (%s)", k ? "," : ", wrapper prefix", w[k], wrapper_note(w[k]));
        if (!ckpt_file_state_dict_is_model(f, i))
            cli_printf(" (not a model's: rewritten only when --select names it)");
        cli_printf("\n");
    }

    /* column widths */
    size_t wkey = 3, wshape = 5, wdev = 6, wdt = 5;
    for (size_t i = 0; i < n; i++) {
        ckpt_path p;
        const ckpt_tensor *x = ckpt_file_tensor(f, i, &p);
        const char *k = path_text(in, &p);
        if (!shown(in, k))
            continue;
        size_t l = strlen(cli_text(k)); /* as printed */
        wkey = l > wkey ? l : wkey;
        format_shape(x, b2, sizeof(b2));
        wshape = strlen(b2) > wshape ? strlen(b2) : wshape;
        l = strlen(ckpt_tensor_device(x));
        wdev = l > wdev ? l : wdev;
        l = strlen(ckpt_dtype_name(ckpt_tensor_dtype(x)));
        wdt = l > wdt ? l : wdt;
    }
    if (wkey > 60)
        wkey = 60;
    cli_printf("\n%-*s  %-*s  %-*s  %-*s  %10s", (int)wkey, "KEY", (int)wdt, "DTYPE", (int)wshape,
               "SHAPE", (int)wdev, "DEVICE", "SIZE");
    if (in->stats)
        cli_printf("  %12s %12s %12s %12s %5s %5s", "MIN", "MAX", "MEAN", "STD", "NAN", "INF");
    cli_printf("  NOTE\n");

    /* storages used by more than one listed tensor */
    size_t ns = ckpt_file_storage_count(f);
    unsigned *uses = calloc(ns ? ns : 1, sizeof(*uses));
    for (size_t i = 0; i < n && uses; i++) {
        const ckpt_storage *s = ckpt_tensor_storage(ckpt_file_tensor(f, i, NULL));
        if (s)
            uses[ckpt_storage_index(s)]++;
    }

    size_t nshown = 0;
    for (size_t i = 0; i < n; i++) {
        ckpt_path p;
        const ckpt_tensor *x = ckpt_file_tensor(f, i, &p);
        const char *k = path_text(in, &p);
        if (!shown(in, k))
            continue;
        nshown++;
        const ckpt_storage *s = ckpt_tensor_storage(x);
        print_row(x, k, (int)wkey, (int)wdt, (int)wshape, (int)wdev,
                  in->stats ? &in->st[i] : NULL);
        const char *sep = "  ";
        if (ckpt_tensor_is_parameter(x)) {
            cli_printf("%sparameter", sep);
            sep = ", ";
        }
        ckpt_qparams q;
        if (ckpt_tensor_kind_of(x) != CKPT_TENSOR_DENSE) {
            cli_printf("%s%s", sep, ckpt_tensor_kind_name(ckpt_tensor_kind_of(x)));
            sep = ", ";
        }
        if (ckpt_tensor_qparams(x, &q) == CKPT_OK) {
            if (q.scales)
                cli_printf(" %s axis %d", q.qscheme, q.axis);
            else
                cli_printf(" %s scale %.9g zero point %lld", q.qscheme, q.scale,
                           (long long)q.zero_point);
        }
        if (ckpt_tensor_shard(x, &(ckpt_shard_info){0}) == CKPT_OK) {
            print_shard(x, sep);
            sep = ", ";
        }
        if (ckpt_tensor_chunk_count(x) > 1) { /* a DCP tensor: its chunks' ranks */
            int lo = -1, hi = -1;
            for (size_t c = 0; c < ckpt_tensor_chunk_count(x); c++) {
                int r = ckpt_tensor_chunk(x, c)->rank;
                lo = lo < 0 || (r >= 0 && r < lo) ? r : lo;
                hi = r > hi ? r : hi;
            }
            cli_printf("%s%zu chunks", sep, ckpt_tensor_chunk_count(x));
            if (lo >= 0)
                cli_printf(lo == hi ? " (rank %d)" : " (ranks %d-%d)", lo, hi);
            sep = ", ";
        } else if (layout && s && ckpt_storage_run_count(s) > 1) { /* a folder's: its ranks */
            long lo = -1, hi = -1;
            for (size_t k = 0; k < ckpt_storage_run_count(s); k++) {
                const char *file;
                uint64_t off, nb, at;
                long r = ckpt_storage_run(s, k, &file, &off, &nb, &at) == CKPT_OK
                             ? layout_rank(layout, file) : -1;
                lo = r >= 0 && (lo < 0 || r < lo) ? r : lo;
                hi = r > hi ? r : hi;
            }
            cli_printf("%s%zu runs", sep, ckpt_storage_run_count(s));
            if (lo >= 0)
                cli_printf(lo == hi ? " (rank %ld)" : " (ranks %ld-%ld)", lo, hi);
            sep = ", ";
        }
        if (s && uses && uses[ckpt_storage_index(s)] > 1) {
            cli_printf("%sshares storage %s", sep, ckpt_storage_key(s));
            sep = ", ";
        }
        if (ckpt_tensor_offset(x)) {
            cli_printf("%soffset %lld", sep, (long long)ckpt_tensor_offset(x));
            sep = ", ";
        }
        if (s && !ckpt_tensor_is_contiguous(x))
            cli_printf("%snon-contiguous", sep);
        cli_printf("\n");
    }
    free(uses);
    cJSON_Delete(layout);
    if (in->filter)
        cli_printf("(%zu of %zu tensors match the filter)\n", nshown, n);
    print_others(in);

    if (ckpt_file_object_count(f)) {
        cli_printf("\nobjects kept opaque:\n");
        for (size_t i = 0; i < ckpt_file_object_count(f); i++) {
            ckpt_path p;
            const ckpt_value *o = ckpt_file_object(f, i, &p);
            cli_printf("  %-30s %s\n", p.len ? path_text(in, &p) : "(root)", ckpt_value_global(o));
        }
    }
    cli_printf("\ntotal: %zu tensors, %llu elements, %s\n", n, t.elements,
               cli_human_bytes(t.bytes, b1, sizeof(b1)));
    print_breakdown("by dtype:", t.by_dtype);
    print_breakdown("by device:", t.by_device);
    cJSON_Delete(t.by_dtype);
    cJSON_Delete(t.by_device);
    return CLI_EXIT_OK;
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, CLI_OPT_JSON},
        {"stats", no_argument, NULL, OPT_STATS},
        {"filter", required_argument, NULL, OPT_FILTER},
        CLI_COMMON_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    inspect in = {0};
    cli_common common = {0};
    const char *filter = NULL;
    int rc = CLI_EXIT_OK, opt;

    opterr = 0; /* our own one-line messages */
    while ((opt = getopt_long(argc, argv, CLI_SHORT_OPTIONS_JSON, longopts, NULL)) != -1) {
        int c = cli_common_option("inspect", opt, optarg, &common);
        if (c < 0) {
            rc = CLI_EXIT_USAGE;
            goto out;
        }
        if (c > 0)
            continue;
        switch (opt) {
        case CLI_OPT_JSON: in.json = true; cli_json_on(); break;
        case OPT_STATS: in.stats = true; break;
        case OPT_FILTER: filter = optarg; break;
        case CLI_OPT_HELP:
            fputs(inspect_usage, stdout);
            goto out;
        default:
            rc = cli_bad_option("inspect", opt, argv);
            goto out;
        }
    }
    if (argc - optind != 1) {
        rc = cli_usage_error("inspect", argc - optind ? "expects exactly one FILE"
                                                       : "no FILE given");
        goto out;
    }
    in.file = argv[optind];
    in.quiet = common.quiet;
    in.default_reading = cli_reading_is_default(&common);
    if (filter) {
        int err;
        PCRE2_SIZE at;
        in.filter = pcre2_compile((PCRE2_SPTR)filter, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &at,
                                  NULL);
        if (!in.filter) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            rc = cli_usage_error("inspect", "--filter '%s': %s at offset %zu", filter,
                                 (char *)msg, (size_t)at);
            goto out;
        }
        in.match = pcre2_match_data_create_from_pattern(in.filter, NULL);
    }
    rc = cli_open("inspect", in.file, &common, &in.f);
    if (rc != CLI_EXIT_OK)
        goto out;
    /* --stats reads and verifies everything first; --quiet then prints nothing */
    if (in.stats && (rc = read_all_stats(&in)) != CLI_EXIT_OK)
        goto out;
    if (common.quiet)
        goto out;
    rc = in.json ? print_json(&in) : print_text(&in);
    if (rc == CLI_EXIT_OK && (fflush(stdout) != 0 || ferror(stdout))) {
        cli_error("inspect", NULL, "cannot write output");
        rc = CLI_EXIT_IO;
    }
out:
    ckpt_file_free(in.f);
    pcre2_match_data_free(in.match);
    pcre2_code_free(in.filter);
    free(in.pathbuf);
    free(in.st);
    free(in.ost);
    cli_common_free(&common);
    return rc;
}
