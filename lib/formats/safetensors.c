/*
 * safetensors.c - reading and writing safetensors: an 8-byte little-endian header
 * length, a JSON header {name: {dtype, shape, data_offsets}, __metadata__},
 * then the packed data.  Everything in the header is checked against the
 * file before a byte of data is trusted.
 */
#include "formats/format.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
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
    /* added by safetensors 0.6+ (0.8 reads and writes them) */
    {"F8_E4M3FNUZ", CKPT_DTYPE_FLOAT8_E4M3FNUZ},
    {"F8_E5M2FNUZ", CKPT_DTYPE_FLOAT8_E5M2FNUZ},
    {"C64", CKPT_DTYPE_COMPLEX64},
    /* added by safetensors 0.6+ too.  F4's shape counts 4-bit values, torch's
     * float4_e2m1fn_x2 counts bytes (pairs of the last dimension); F6 has no
     * torch dtype.  A sub-byte tensor must end on a byte boundary. */
    {"F8_E8M0", CKPT_DTYPE_FLOAT8_E8M0FNU},
    {"F4", CKPT_DTYPE_FLOAT4_E2M1FN_X2},
    {"F6_E2M3", CKPT_DTYPE_FLOAT6_E2M3FN},
    {"F6_E3M2", CKPT_DTYPE_FLOAT6_E3M2FN},
};

/* Bits of one element of the safetensors dtype that DTYPE is read from. */
static unsigned st_bits(ckpt_dtype dtype)
{
    return dtype == CKPT_DTYPE_FLOAT4_E2M1FN_X2 ? 4 : ckpt_dtype_bits(dtype);
}

static ckpt_dtype dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++)
        if (strcmp(name, st_dtypes[i].name) == 0)
            return st_dtypes[i].dtype;
    return CKPT_DTYPE_UNKNOWN;
}

static const char *dtype_name(ckpt_dtype dtype)
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
    int64_t shape[MAX_NDIM]; /* torch's: an F4 last dimension halved */
    uint64_t numel;          /* of the storage: F4 in bytes, F6 in values */
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
    e->dtype = dtype_from_name(dt->valuestring);
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
    uint64_t bits;
    over = over || ckpt_mul_overflow(numel, st_bits(e->dtype), &bits);
    if (!over && bits % 8) /* as the safetensors crate refuses it */
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: %s tensor '%s' of %llu values does not end on a byte "
                        "boundary", dt->valuestring, n, (unsigned long long)numel);
    nbytes = bits / 8;
    if (over || nbytes != e->end - e->begin)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s' is %llu bytes by its offsets but its shape and "
                        "dtype need %s", n, (unsigned long long)(e->end - e->begin),
                        over ? "more than 2^64" : "a different size");
    e->numel = ckpt_dtype_size(e->dtype) ? nbytes / ckpt_dtype_size(e->dtype) : numel;
    if (e->dtype == CKPT_DTYPE_FLOAT4_E2M1FN_X2) {
        /* torch's shape counts pairs of the last dimension, as safetensors' own
         * torch loader maps it (refusing an odd last dimension the same way) */
        if (e->shape[nd - 1] % 2)
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "safetensors: F4 tensor '%s' has an odd last dimension (%lld): "
                            "torch's float4_e2m1fn_x2 packs it in pairs", n,
                            (long long)e->shape[nd - 1]);
        e->shape[nd - 1] /= 2;
    }
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

/* What this reader keeps on each source it read (src->ops == &st_ops): no
 * methods, and as its fmt_data the file's __metadata__ (a dict of str, in
 * the handle's arena), or NULL. */
static const ckpt_format_ops st_ops = {0};

/* __metadata__: string values only; kept on SRC for writing safetensors
 * again. */
static int read_metadata(ckpt_file *f, ckpt_source *src, const cJSON *md)
{
    if (!cJSON_IsObject(md))
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: __metadata__ is not an object");
    ckpt_value *d = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
    if (!d)
        return ckpt_oom(&f->err);
    const cJSON *e;
    cJSON_ArrayForEach(e, md)
    {
        if (!cJSON_IsString(e))
            return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                            "safetensors: __metadata__ value '%s' is not a string", e->string);
        ckpt_value *k = str_value(f, e->string), *v = str_value(f, e->valuestring);
        if (!k || !v || ckpt_vec_push(&f->arena, &d->u.dict.keys, k) ||
            ckpt_vec_push(&f->arena, &d->u.dict.vals, v))
            return ckpt_oom(&f->err);
    }
    src->fmt_data = d;
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
            rc = ckpt_oom(&f->err);
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
        return ckpt_oom(&f->err);
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
    /* cJSON ends a string at \u0000: a name (or metadata text) with a NUL
     * would be cut silently, so the header is refused instead */
    for (size_t i = 0; i + 1 < (size_t)n; i++)
        if (text[i] == '\\' && text[++i] == 'u' && (size_t)n - i > 4 &&
            memcmp(text + i + 1, "0000", 4) == 0) {
            rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                          "safetensors: a string of the header (\\u0000 at byte %zu of it) "
                          CKPT_NAME_NUL, i - 1);
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
        rc = ckpt_oom(&f->err);
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
            if ((rc = read_metadata(f, src, j)))
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
        ckpt_storage *s = ckpt_file_storage_new(f, key, e->dtype, (int64_t)e->numel, "cpu", 3, &f->err);
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
            rc = ckpt_oom(&f->err);
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

/* ---- writing: one state dict as safetensors -------------------------------------
 *
 * The 8-byte header length, the JSON header (padded with spaces to a
 * multiple of 8, __metadata__ {"format": "pt"}), then each tensor's elements
 * packed in C order.  Views are gathered, casts applied, tied tensors
 * written once (the other names go to __metadata__ "ckpt.tied").
 */
typedef struct st_entry {
    const char *name;
    const ckpt_tensor *t;
    uint64_t begin, end;
    long alias_of; /* index of the entry holding the bytes, or -1 */
} st_entry;

/* The __metadata__ of the input's first safetensors file that has one (a
 * set's shards in the order they were read), or NULL. */
static const ckpt_value *input_metadata(const ckpt_file *f)
{
    if (f->main.ops == &st_ops && f->main.fmt_data)
        return f->main.fmt_data;
    for (size_t i = 0; i < f->nshards; i++)
        if (f->shards[i]->ops == &st_ops && f->shards[i]->fmt_data)
            return f->shards[i]->fmt_data;
    return NULL;
}

static bool is_scalar(const ckpt_value *v)
{
    return v->kind == CKPT_KIND_INT || v->kind == CKPT_KIND_FLOAT || v->kind == CKPT_KIND_STR ||
           v->kind == CKPT_KIND_BOOL;
}

static cJSON *json_raw_u64(uint64_t v)
{
    char b[32];
    snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(b);
}

/* The bytes of T in C order and its output dtype: a slice of its storage
 * when it is contiguous, else gathered.  *OWN is what to free. */
static int tensor_out_bytes(ckpt_file *f, const ckpt_tensor *t, const uint8_t **bytes, uint8_t **own,
                            uint8_t **own2)
{
    *own = *own2 = NULL;
    uint8_t *all;
    CKPT_FORWARD(ckpt_storage_load(f, t->storage, &all));
    *own = all;
    ckpt_tensor view = *t;
    view.dtype = t->storage->dtype; /* after a cast, the storage's new type */
    size_t es = ckpt_dtype_size(view.dtype);
    if (ckpt_tensor_is_contiguous(&view)) {
        *bytes = all + (view.numel ? (size_t)view.offset * es : 0);
        return CKPT_OK;
    }
    size_t n = (size_t)view.numel * es;
    uint8_t *g = malloc(n ? n : 1);
    if (!g)
        return ckpt_oom(&f->err);
    *own2 = g;
    ckpt_tensor_gather(&view, all, g);
    *bytes = g;
    return CKPT_OK;
}

typedef struct crc_job {
    int fd;
    uint64_t off, len;
    uint32_t crc;
    int rc;
} crc_job;

static void *crc_main(void *arg)
{
    crc_job *j = arg;
    ckpt_error e = {0};
    j->rc = ckpt_crc_range(j->fd, j->off, j->len, &j->crc, &e);
    return NULL;
}

/* A whole, uncast, uncompressed storage goes straight from file to file. */
static int copy_whole(ckpt_file *f, const ckpt_tensor *t, int out, uint64_t at, bool *done)
{
    const ckpt_storage *s = t->storage;
    *done = false;
    int in_fd;
    uint64_t in_off;
    if (t->offset != 0 || !ckpt_tensor_is_contiguous(t) || ckpt_tensor_nbytes(t) != s->nbytes ||
        s->nbytes == 0)
        return CKPT_OK;
    int r = ckpt_storage_raw_range(f, s, false, &in_fd, &in_off);
    if (r == CKPT_ERR_UNSUPPORTED)
        return CKPT_OK; /* cast or deflated: the buffered path decodes it */
    CKPT_FORWARD(r);
    if (s->has_crc) {
        /* the input's CRC, checked on the other core while the kernel copies */
        crc_job job = {.fd = in_fd, .off = in_off, .len = s->nbytes};
        pthread_t th;
        bool threaded = pthread_create(&th, NULL, crc_main, &job) == 0;
        int rc = ckpt_copy_range(in_fd, in_off, out, at, s->nbytes, &f->err);
        if (threaded)
            pthread_join(th, NULL);
        else
            crc_main(&job);
        CKPT_FORWARD(rc);
        if (job.rc)
            return ckpt_err(&f->err, job.rc, "cannot read storage '%s' of the input", s->key);
        if (job.crc != s->crc32)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                            "record for storage '%s': CRC-32 mismatch (stored %08x, data %08x): "
                            "the input is corrupt", s->key, s->crc32, job.crc);
    } else {
        CKPT_FORWARD(ckpt_copy_range(in_fd, in_off, out, at, s->nbytes, &f->err));
    }
    /* start writing back now, so that the final fsync has little left */
    if (s->nbytes >= (1u << 20))
        sync_file_range(out, (off64_t)at, (off64_t)s->nbytes, SYNC_FILE_RANGE_WRITE);
    *done = true;
    return CKPT_OK;
}

/* The bytes of entry E at BASE + its offset: copied by the kernel when they
 * are a whole raw storage, streamed when a whole storage to decode, else
 * gathered from the storage in memory. */
static int write_entry(ckpt_file *f, const st_entry *e, int out, uint64_t base)
{
    bool done;
    CKPT_FORWARD(copy_whole(f, e->t, out, base + e->begin, &done));
    if (done)
        return CKPT_OK;
    const ckpt_tensor *t = e->t;
    if (t->offset == 0 && ckpt_tensor_is_contiguous(t) &&
        (uint64_t)(e->end - e->begin) == t->storage->nbytes) {
        /* the whole storage, cast or inflated on the way: bounded memory */
        ckpt_fd_sink sk = {.fd = out, .at = base + e->begin, .err = &f->err};
        return ckpt_storage_stream(f, t->storage, false, ckpt_fd_sink_write, &sk);
    }
    const uint8_t *bytes = NULL;
    uint8_t *own, *own2;
    int rc = tensor_out_bytes(f, t, &bytes, &own, &own2);
    if (rc == CKPT_OK)
        rc = ckpt_write_all(out, bytes, (size_t)(e->end - e->begin), base + e->begin, &f->err);
    free(own);
    free(own2);
    return rc;
}

/* Write f's state dict to OUT; or, with IN_BASE (where the input's data
 * section starts), only make the header that describes the input's own
 * data where it is (*HEADER, malloc'd, not padded): for a rewrite in place,
 * which needs every tensor to be a whole, uncast storage of the input. */
static int st_write(ckpt_file *f, int out, const ckpt_write_options *opt, const uint64_t *in_base,
                    char **header)
{
    const ckpt_value *sd = NULL;
    CKPT_FORWARD(ckpt_pick_state_dict(f, opt ? opt->select : NULL, &sd));
    CKPT_FORWARD(ckpt_dict_names_unique(&f->err, sd)); /* a header names each once */
    size_t n = sd->u.dict.keys.len;
    char bad[300] = "";
    size_t nbad = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_value *k = sd->u.dict.keys.items[i], *v = sd->u.dict.vals.items[i];
        if (k->kind == CKPT_KIND_STR && strcmp(k->u.s.s, "__metadata__") == 0)
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "a tensor named '__metadata__' cannot be written to safetensors, "
                            "where that name is the header's metadata; rename it first");
        if (k->kind == CKPT_KIND_STR && v->kind == CKPT_KIND_TENSOR &&
            v->u.tensor->kind != CKPT_TENSOR_DENSE)
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "safetensors has no %s tensors ('%s')",
                            ckpt_tensor_kind_name((ckpt_tensor_kind)v->u.tensor->kind),
                            k->u.s.s);
        if (k->kind != CKPT_KIND_STR || v->kind != CKPT_KIND_TENSOR) {
            if (nbad++ < 5)
                snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad), "%s'%s'", nbad > 1 ? ", " : "",
                         k->kind == CKPT_KIND_STR ? k->u.s.s : "(a non-string key)");
        }
    }
    if (nbad)
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                        "safetensors holds tensors only: %zu entr%s of the mapping %s not (%s%s)",
                        nbad, nbad == 1 ? "y" : "ies", nbad == 1 ? "is" : "are", bad,
                        nbad > 5 ? ", ..." : "");
    bool dedupe = !(opt && (opt->flags & CKPT_WRITE_NO_DEDUPE));
    st_entry *e = calloc(n ? n : 1, sizeof(*e));
    const ckpt_tensor **views = calloc(n ? n : 1, sizeof(*views));
    long *first = calloc(n ? n : 1, sizeof(*first));
    int trc = e && views && first ? CKPT_OK : ckpt_oom(&f->err);
    for (size_t i = 0; i < n && trc == CKPT_OK; i++) {
        views[i] = sd->u.dict.vals.items[i]->u.tensor;
        first[i] = -1;
    }
    if (trc == CKPT_OK && dedupe)
        trc = ckpt_tensors_tied(f, views, n, first);
    for (size_t i = 0; i < n && trc == CKPT_OK; i++)
        e[i].alias_of = first[i];
    free(views);
    free(first);
    if (trc != CKPT_OK) {
        free(e);
        return trc;
    }
    cJSON *hdr = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(hdr, "__metadata__"),
          *tied = cJSON_CreateObject();
    cJSON_AddStringToObject(md, "format", "pt");
    /* what a training checkpoint keeps beside the state dict, as text */
    const ckpt_value *top = f->file_root ? f->file_root : f->root;
    if (sd != top && top->kind == CKPT_KIND_DICT)
        for (size_t i = 0; i < top->u.dict.keys.len; i++) {
            const ckpt_value *k = top->u.dict.keys.items[i], *v = top->u.dict.vals.items[i];
            char text[64];
            if (k->kind != CKPT_KIND_STR || !is_scalar(v) || strcmp(k->u.s.s, "format") == 0)
                continue;
            if (v->kind == CKPT_KIND_STR) {
                cJSON_AddStringToObject(md, k->u.s.s, v->u.s.s);
                continue;
            }
            if (v->kind == CKPT_KIND_INT && v->u.i.big)
                continue;
            if (v->kind == CKPT_KIND_INT)
                snprintf(text, sizeof(text), "%lld", (long long)v->u.i.v);
            else if (v->kind == CKPT_KIND_FLOAT)
                snprintf(text, sizeof(text), "%.17g", v->u.f);
            else
                snprintf(text, sizeof(text), "%s", v->u.b ? "True" : "False");
            cJSON_AddStringToObject(md, k->u.s.s, text);
        }
    const ckpt_value *in_md = input_metadata(f);
    if (in_md) /* a safetensors input's own metadata carries over */
        for (size_t i = 0; i < in_md->u.dict.keys.len; i++) {
            const char *k = in_md->u.dict.keys.items[i]->u.s.s;
            if (strcmp(k, "format") && strcmp(k, "ckpt.tied") && !cJSON_GetObjectItem(md, k))
                cJSON_AddStringToObject(md, k, in_md->u.dict.vals.items[i]->u.s.s);
        }
    uint64_t at = 0;
    size_t ntied = 0;
    for (size_t i = 0; i < n; i++) {
        e[i].name = sd->u.dict.keys.items[i]->u.s.s;
        e[i].t = sd->u.dict.vals.items[i]->u.tensor;
        if (e[i].alias_of >= 0) {
            cJSON_AddStringToObject(tied, e[i].name, e[e[i].alias_of].name);
            ntied++;
            continue;
        }
        const ckpt_tensor *t = e[i].t;
        ckpt_dtype dt = t->storage->dtype;
        const char *name = dtype_name(dt);
        if (!name) {
            int r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "safetensors has no dtype for %s ('%s')",
                             ckpt_dtype_name(dt), e[i].name);
            cJSON_Delete(hdr);
            cJSON_Delete(tied);
            free(e);
            return r;
        }
        uint64_t nb;
        int r = ckpt_dtype_nbytes(dt, (uint64_t)t->numel, &nb);
        bool f4 = dt == CKPT_DTYPE_FLOAT4_E2M1FN_X2;
        if (r || (f4 && t->ndim == 0)) {
            /* a 0-dim float4 pair has no F4 shape: safetensors refuses it too */
            r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                         r ? "'%s' (%s) is not whole bytes" :
                             "'%s' is a 0-dim %s tensor, which safetensors' F4 cannot shape",
                         e[i].name, ckpt_dtype_name(dt));
            cJSON_Delete(hdr);
            cJSON_Delete(tied);
            free(e);
            return r;
        }
        e[i].begin = at;
        e[i].end = at + nb;
        at += nb;
        if (in_base) {
            const ckpt_storage *st = t->storage;
            if (st->src != &f->main || st->loc != CKPT_LOC_FILE_RANGE || st->dtype != st->src_dtype ||
                t->offset != 0 || !ckpt_tensor_is_contiguous(t) || nb != st->nbytes ||
                st->file_offset < *in_base) {
                /* the message names e[i], so it is made before E is freed */
                r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                             "'%s' is not a whole tensor of the file, as it was", e[i].name);
                cJSON_Delete(hdr);
                cJSON_Delete(tied);
                free(e);
                return r;
            }
            e[i].begin = st->file_offset - *in_base;
            e[i].end = e[i].begin + nb;
        }
        cJSON *je = cJSON_AddObjectToObject(hdr, e[i].name);
        cJSON_AddStringToObject(je, "dtype", name);
        cJSON *sh = cJSON_AddArrayToObject(je, "shape");
        for (int d = 0; d < t->ndim; d++) /* F4 counts 4-bit values, torch pairs */
            cJSON_AddItemToArray(sh, json_raw_u64((uint64_t)t->shape[d] *
                                                  (f4 && d == t->ndim - 1 ? 2 : 1)));
        cJSON *off = cJSON_AddArrayToObject(je, "data_offsets");
        cJSON_AddItemToArray(off, json_raw_u64(e[i].begin));
        cJSON_AddItemToArray(off, json_raw_u64(e[i].end));
    }
    if (ntied) {
        char *t = cJSON_PrintUnformatted(tied);
        if (t)
            cJSON_AddStringToObject(md, "ckpt.tied", t);
        free(t);
    }
    cJSON_Delete(tied);
    char *text = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    if (!text) {
        free(e);
        return ckpt_oom(&f->err);
    }
    if (in_base) {
        free(e);
        *header = text;
        return CKPT_OK;
    }
    size_t hn = strlen(text), padded = (hn + 7) & ~(size_t)7; /* data starts 8-aligned */
    uint8_t *head = malloc(8 + padded);
    int rc = head ? CKPT_OK : ckpt_oom(&f->err);
    if (rc == CKPT_OK) {
        for (int i = 0; i < 8; i++)
            head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        memcpy(head + 8, text, hn);
        memset(head + 8 + hn, ' ', padded - hn);
        rc = ckpt_write_all(out, head, 8 + padded, 0, &f->err);
    }
    free(head);
    free(text);
    uint64_t base = 8 + padded, done = 0;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        if (e[i].alias_of >= 0 || e[i].end == e[i].begin)
            continue;
        rc = write_entry(f, &e[i], out, base);
        done += e[i].end - e[i].begin;
        if (rc == CKPT_OK && opt && opt->progress)
            opt->progress(opt->user, done, at);
    }
    free(e);
    return rc;
}

static int safetensors_write(ckpt_file *f, int out, const char *path,
                             const ckpt_write_options *opt)
{
    (void)path; /* the format does not name itself */
    return st_write(f, out, opt, NULL, NULL);
}

/* ---- in place: the header rewritten where it is --------------------------------
 *
 * A key rewrite changes the header only.  When the new header fits in the
 * old one's length (padded with spaces, as the format allows) it can be
 * written over it, the data left where it is.  But a header is overwritten,
 * not switched: a write cut short leaves it half old, half new, and the
 * file unreadable.  So it is done only when the bytes that change lie in
 * one 512-byte sector, the first: a disk writes a sector whole or not at
 * all (however the kernel writes the page back, the other sectors of it
 * are written with the bytes they had), and a killed process has made a
 * write within one page whole or not at all.  A longer header takes a copy
 * (the ordinary atomic rewrite), and the reason says so.
 */
#define SECTOR 512u

static int safetensors_write_in_place(ckpt_file *f, int fd, const char *path,
                                      const ckpt_write_options *opt, ckpt_write_result *res)
{
    (void)path;
    ckpt_error *err = &f->err;
    uint8_t h8[8];
    if (f->format != CKPT_FORMAT_SAFETENSORS || f->nshards || f->main.fd < 0)
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "the input is not one safetensors file");
    if (ckpt_pread_all(fd, h8, 8, 0) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot read its header");
    uint64_t old_len = 0;
    for (int i = 7; i >= 0; i--)
        old_len = (old_len << 8) | h8[i];
    uint64_t base = 8 + old_len;
    char *text = NULL;
    int rc = st_write(f, fd, opt, &base, &text);
    size_t hn = rc == CKPT_OK ? strlen(text) : 0;
    if (rc == CKPT_OK && hn > old_len)
        rc = ckpt_err(err, CKPT_ERR_UNSUPPORTED,
                      "the new header (%zu bytes) does not fit in the old one (%llu bytes): a "
                      "copy is needed", hn, (unsigned long long)old_len);
    else if (rc == CKPT_OK && base > SECTOR)
        rc = ckpt_err(err, CKPT_ERR_UNSUPPORTED,
                      "its header (%llu bytes) spans more than one 512-byte sector, which a "
                      "crash could leave half written: a copy is needed",
                      (unsigned long long)old_len);
    char *b = rc == CKPT_OK ? malloc((size_t)old_len ? (size_t)old_len : 1) : NULL;
    if (rc == CKPT_OK && !b)
        rc = ckpt_oom(err);
    if (rc == CKPT_OK) {
        memcpy(b, text, hn);
        memset(b + hn, ' ', (size_t)(old_len - hn));
        rc = ckpt_write_all(fd, b, (size_t)old_len, 8, err);
        if (rc == CKPT_OK && fsync(fd) != 0)
            rc = ckpt_err(err, CKPT_ERR_IO, "cannot make the header durable: %s", strerror(errno));
        if (res && rc == CKPT_OK) {
            res->bytes_written = old_len;
            res->old_size = res->new_size = f->main.file_size;
        }
    }
    free(b);
    free(text);
    if (rc == CKPT_ERR_UNSUPPORTED && res)
        snprintf(res->why, sizeof(res->why), "%.250s", err->msg);
    return rc;
}

const ckpt_format_desc ckpt_format_safetensors = {
    .id = CKPT_FORMAT_SAFETENSORS,
    .name = "safetensors",
    .suffix = ".safetensors",
    .sniff = safetensors_sniff,
    .read = safetensors_read,
    .write = safetensors_write,
    .write_in_place = safetensors_write_in_place,
    .ops = &st_ops,
};
