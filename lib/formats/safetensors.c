/*
 * safetensors.c - reading safetensors: an 8-byte little-endian header
 * length, a JSON header {name: {dtype, shape, data_offsets}, __metadata__},
 * then the packed data.  Everything in the header is checked against the
 * file before a byte of data is trusted.
 */
#include "formats/format.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_HEADER (100u * 1000u * 1000u) /* the safetensors crate's own limit */
#define MAX_NDIM 64

static const struct {
    const char *name;
    ckpt_dtype dtype;
} st_dtypes[] = {
    {"F64", CKPT_DTYPE_FLOAT64},   {"F32", CKPT_DTYPE_FLOAT32},
    {"F16", CKPT_DTYPE_FLOAT16},   {"BF16", CKPT_DTYPE_BFLOAT16},
    {"I64", CKPT_DTYPE_INT64},     {"I32", CKPT_DTYPE_INT32},
    {"I16", CKPT_DTYPE_INT16},     {"I8", CKPT_DTYPE_INT8},
    {"U8", CKPT_DTYPE_UINT8},      {"BOOL", CKPT_DTYPE_BOOL},
    {"U16", CKPT_DTYPE_UINT16},    {"U32", CKPT_DTYPE_UINT32},
    {"U64", CKPT_DTYPE_UINT64},    {"F8_E5M2", CKPT_DTYPE_FLOAT8_E5M2},
    {"F8_E4M3", CKPT_DTYPE_FLOAT8_E4M3FN},
};

ckpt_dtype ckpt_safetensors_dtype(const char *name)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++)
        if (strcmp(name, st_dtypes[i].name) == 0)
            return st_dtypes[i].dtype;
    return CKPT_DTYPE_UNKNOWN;
}

const char *ckpt_safetensors_dtype_name(ckpt_dtype dtype)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++)
        if (st_dtypes[i].dtype == dtype)
            return st_dtypes[i].name;
    return NULL;
}

/* A JSON number that is a whole number in [0, 2^53]. */
static bool json_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || floor(d) != d)
        return false;
    *out = (uint64_t)d;
    return true;
}

typedef struct entry {
    const char *name;
    ckpt_dtype dtype;
    int ndim;
    int64_t shape[MAX_NDIM];
    uint64_t begin, end;
} entry;

static int cmp_begin(const void *a, const void *b)
{
    const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

static int parse_entry(ckpt_file *f, const cJSON *j, entry *e, uint64_t data_len)
{
    const char *n = j->string;
    if (!cJSON_IsObject(j))
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: '%s' is not an object", n);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype"),
                *sh = cJSON_GetObjectItemCaseSensitive(j, "shape"),
                *off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s' lacks dtype, shape or data_offsets", n);
    e->name = n;
    e->dtype = ckpt_safetensors_dtype(dt->valuestring);
    if (e->dtype == CKPT_DTYPE_UNKNOWN)
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "safetensors: tensor '%s' has unknown dtype '%s'",
                        n, dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > MAX_NDIM)
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "safetensors: tensor '%s' has %d dimensions",
                        n, nd);
    e->ndim = nd;
    uint64_t numel = 1, nbytes;
    bool over = false;
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        if (!json_u64(cJSON_GetArrayItem(sh, d), &v))
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: tensor '%s' has a bad shape", n);
        e->shape[d] = (int64_t)v;
        over |= ckpt_mul_overflow(numel, v, &numel);
    }
    if (!json_u64(cJSON_GetArrayItem(off, 0), &e->begin) ||
        !json_u64(cJSON_GetArrayItem(off, 1), &e->end) || e->begin > e->end)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: tensor '%s' has bad data_offsets", n);
    if (over || ckpt_mul_overflow(numel, ckpt_dtype_size(e->dtype), &nbytes) ||
        nbytes != e->end - e->begin)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s' is %llu bytes by its offsets but its shape and "
                        "dtype need %s", n, (unsigned long long)(e->end - e->begin),
                        over ? "more than 2^64" : "a different size");
    if (e->end > data_len)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s' ends at byte %llu of a %llu-byte data section", n,
                        (unsigned long long)e->end, (unsigned long long)data_len);
    return CKPT_OK;
}

static ckpt_value *str_value(ckpt_file *f, const char *s)
{
    ckpt_value *v = ckpt_value_new(&f->arena, CKPT_KIND_STR, 0);
    if (!v || !(v->u.s.s = ckpt_arena_strndup(&f->arena, s, strlen(s))))
        return NULL;
    v->u.s.len = strlen(s);
    return v;
}

/* __metadata__: string values only; kept for writing safetensors again. */
static int read_metadata(ckpt_file *f, const cJSON *md)
{
    if (!cJSON_IsObject(md))
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: __metadata__ is not an object");
    ckpt_value *d = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
    if (!d)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, md)
    {
        if (!cJSON_IsString(e))
            return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                            "safetensors: __metadata__ value '%s' is not a string", e->string);
        ckpt_value *k = str_value(f, e->string), *v = str_value(f, e->valuestring);
        if (!k || !v || ckpt_vec_push(&f->arena, &d->u.dict.keys, k) ||
            ckpt_vec_push(&f->arena, &d->u.dict.vals, v))
            return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    }
    if (!f->st_metadata)
        f->st_metadata = d;
    return CKPT_OK;
}

/* Names written once for several tied ones: "ckpt.tied" = {"alias": "name"}. */
static int restore_tied(ckpt_file *f, ckpt_value *root, const cJSON *md)
{
    const cJSON *tied = cJSON_GetObjectItemCaseSensitive(md, "ckpt.tied");
    if (!cJSON_IsString(tied))
        return CKPT_OK;
    cJSON *map = cJSON_Parse(tied->valuestring);
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(map);
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: __metadata__ ckpt.tied is not a JSON object");
    }
    int rc = CKPT_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, map)
    {
        const ckpt_value *target = cJSON_IsString(e) ? ckpt_value_dict_get(root, e->valuestring) : NULL;
        if (!target || target->kind != CKPT_KIND_TENSOR || ckpt_value_dict_get(root, e->string)) {
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "safetensors: ckpt.tied names '%s' for a tensor that is not there",
                          e->string);
            break;
        }
        ckpt_value *k = str_value(f, e->string);
        /* the same tensor object, as torch had it before saving */
        if (!k || ckpt_vec_push(&f->arena, &root->u.dict.keys, k) ||
            ckpt_vec_push(&f->arena, &root->u.dict.vals, (ckpt_value *)target)) {
            rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
            break;
        }
    }
    cJSON_Delete(map);
    return rc;
}

static int safetensors_read(ckpt_file *f, ckpt_source *src, ckpt_value **root_out)
{
    uint8_t lenbuf[8];
    if (src->file_size < 8 || ckpt_pread_all(src->fd, lenbuf, 8, 0))
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: file too short for a header");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | lenbuf[i];
    if (n > MAX_HEADER) /* checked first, as the safetensors crate does */
        return ckpt_err(&f->err, CKPT_ERR_LIMIT,
                        "safetensors: header of %llu bytes is over the format's limit of %u",
                        (unsigned long long)n, MAX_HEADER);
    if (n > src->file_size - 8)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: header length %llu goes past the end of the %llu-byte file",
                        (unsigned long long)n, (unsigned long long)src->file_size);
    char *text = malloc((size_t)n + 1);
    if (!text)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    int rc = ckpt_pread_all(src->fd, text, (size_t)n, 8);
    text[n] = '\0';
    cJSON *hdr = NULL;
    entry *entries = NULL, **sorted = NULL;
    if (rc) {
        rc = ckpt_err(&f->err, rc, "safetensors: cannot read the header");
        goto out;
    }
    if (!ckpt_utf8_valid((const uint8_t *)text, (size_t)n) || memchr(text, 0, (size_t)n)) {
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: header is not valid UTF-8 text");
        goto out;
    }
    const char *end = NULL;
    hdr = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
    while (hdr && end && (size_t)(end - text) < n && (*end == ' ' || *end == '\n' || *end == '\r' ||
                                                     *end == '\t'))
        end++;
    if (!cJSON_IsObject(hdr) || !end || (size_t)(end - text) != n) {
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: header is not one JSON object");
        goto out;
    }
    uint64_t data_start = 8 + n, data_len = src->file_size - data_start;
    size_t count = (size_t)cJSON_GetArraySize(hdr);
    if (count > f->limits[CKPT_LIMIT_STORAGES]) {
        rc = ckpt_err(&f->err, CKPT_ERR_LIMIT, "safetensors: more than %llu tensors",
                      (unsigned long long)f->limits[CKPT_LIMIT_STORAGES]);
        goto out;
    }
    entries = calloc(count ? count : 1, sizeof(*entries));
    sorted = calloc(count ? count : 1, sizeof(*sorted));
    ckpt_value *root = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
    if (!entries || !sorted || !root) {
        rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
        goto out;
    }
    root->flags |= CKPT_VF_ORDERED;
    size_t ne = 0;
    const cJSON *md = NULL, *j;
    cJSON_ArrayForEach(j, hdr)
    {
        if (strcmp(j->string, "__metadata__") == 0) {
            if (md) {
                rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: two __metadata__ entries");
                goto out;
            }
            md = j;
            if ((rc = read_metadata(f, j)))
                goto out;
            continue;
        }
        if ((rc = parse_entry(f, j, &entries[ne], data_len)))
            goto out;
        sorted[ne] = &entries[ne];
        ne++;
    }
    /* byte ranges may not overlap (empty tensors take none) */
    qsort(sorted, ne, sizeof(*sorted), cmp_begin);
    for (size_t i = 1; i < ne; i++) {
        const entry *a = sorted[i - 1], *b = sorted[i];
        if (a->end > b->begin && a->begin != a->end && b->begin != b->end) {
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "safetensors: tensors '%s' and '%s' overlap (bytes %llu-%llu and %llu-%llu)",
                          a->name, b->name, (unsigned long long)a->begin, (unsigned long long)a->end,
                          (unsigned long long)b->begin, (unsigned long long)b->end);
            goto out;
        }
    }
    /* names appear once: sort a copy by name and look at neighbours */
    qsort(sorted, ne, sizeof(*sorted), cmp_name);
    for (size_t i = 1; i < ne; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: tensor '%s' appears twice",
                          sorted[i]->name);
            goto out;
        }
    for (size_t i = 0; i < ne; i++) {
        const entry *e = &entries[i];
        char key[1024];
        if ((size_t)snprintf(key, sizeof(key), "%s%s", f->key_prefix ? f->key_prefix : "", e->name) >=
            sizeof(key)) {
            rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "safetensors: tensor name too long");
            goto out;
        }
        int64_t numel = (int64_t)((e->end - e->begin) / ckpt_dtype_size(e->dtype));
        ckpt_storage *s = ckpt_file_storage_new(f, key, e->dtype, numel, "cpu", 3, &f->err);
        if (!s) {
            rc = f->err.code;
            goto out;
        }
        s->type_name = ckpt_storage_type_name(e->dtype);
        s->loc = CKPT_LOC_FILE_RANGE;
        s->file_offset = data_start + e->begin;
        int64_t stride[MAX_NDIM];
        int64_t acc = 1;
        for (int d = e->ndim - 1; d >= 0; d--) {
            stride[d] = acc;
            acc *= e->shape[d] ? e->shape[d] : 1;
        }
        ckpt_value *t = ckpt_tensor_value_new(&f->arena, s, e->dtype, e->ndim, e->shape, stride, 0);
        ckpt_value *k = str_value(f, e->name);
        if (!t || !k || ckpt_vec_push(&f->arena, &root->u.dict.keys, k) ||
            ckpt_vec_push(&f->arena, &root->u.dict.vals, t)) {
            rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    if (md)
        rc = restore_tied(f, root, md);
    if (rc == CKPT_OK)
        *root_out = root;
out:
    cJSON_Delete(hdr);
    free(text);
    free(entries);
    free(sorted);
    return rc;
}

/* u64 header length, then JSON; the reader checks the length.  (A torch
 * legacy file never has '{' there: its magic pickle does not.) */
static bool safetensors_sniff(const uint8_t *head, size_t n)
{
    return n >= 9 && head[8] == '{';
}

const ckpt_format_desc ckpt_format_safetensors = {
    .id = CKPT_FORMAT_SAFETENSORS,
    .name = "safetensors",
    .suffix = ".safetensors",
    .sniff = safetensors_sniff,
    .read = safetensors_read,
    .write = ckpt_safetensors_write,
};
