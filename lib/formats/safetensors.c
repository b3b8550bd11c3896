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

/* ---- the header, read as safetensors 0.8 reads it ---------------------------------
 *
 * One pass over the JSON text, with the rules of the crate's serde reader
 * (serde_json into HashMetadata {__metadata__: Option<HashMap<String,
 * String>>, flatten HashMap<String, TensorInfo>}) and of its validate():
 * shapes and offsets are unsigned integers as written (no fraction, no
 * exponent, no minus sign, nothing past 2^64-1), strings are JSON strings
 * (no raw control character, no lone surrogate), a field of a tensor appears
 * once, unknown fields are skipped but must be JSON nested at most 127
 * deep, and the tensors, sorted by offsets, tile the data section from its
 * first byte to the file's last.  What it keeps per tensor is one small
 * record and the name, not a tree of the header: a 100 MB header is
 * millions of tensors.  Where safetensors takes the last of two equal names
 * (a tensor, a metadata key), ckpt refuses the file: other JSON readers
 * take the first, and the two readings would differ.  A NUL in a name or
 * metadata text is refused too: ckpt keeps names as C strings and would
 * cut it.
 */
#define JSON_MAX_DEPTH 127 /* serde_json refuses a 128th level of nesting */

typedef struct st_rec {
    const char *name; /* decoded, in the handle's arena */
    uint64_t begin, end;
    size_t dims;      /* index of the first dimension in st_parser.dims */
    uint8_t ndim;
    uint8_t dtype;
} st_rec;

typedef struct st_parser {
    ckpt_file *f;
    const char *s, *p, *e; /* the text: start, cursor, end */
    const char *what;      /* "header" or "__metadata__ ckpt.tied" */
    char *str;             /* the last string decoded (malloc'd, NUL-ended) */
    size_t len, cap;
    uint64_t *dims;
    size_t ndims, dims_cap;
    st_rec *recs;
    size_t nrecs, recs_cap;
} st_parser;

static int perr(st_parser *ps, const char *fmt, const char *arg)
{
    char msg[200];
    snprintf(msg, sizeof(msg), fmt, arg);
    return ckpt_err(&ps->f->err, CKPT_ERR_FORMAT, "safetensors: %s at byte %zu of the %s", msg,
                    (size_t)(ps->p - ps->s), ps->what);
}

static void ws(st_parser *ps)
{
    while (ps->p < ps->e && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int peek(st_parser *ps)
{
    return ps->p < ps->e ? (unsigned char)*ps->p : -1;
}

static int expect(st_parser *ps, char c)
{
    ws(ps);
    if (peek(ps) != c) {
        char want[4] = {'\'', c, '\'', 0};
        const char *shown = c == ',' ? "',' or a closing bracket" : want;
        return perr(ps, peek(ps) < 0 ? "the JSON ends where %s is expected"
                                     : "%s expected (the header is not valid JSON)", shown);
    }
    ps->p++;
    return CKPT_OK;
}

static int grow(ckpt_file *f, void **buf, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return CKPT_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *b = c <= SIZE_MAX / size ? realloc(*buf, c * size) : NULL;
    if (!b)
        return ckpt_oom(&f->err);
    *buf = b;
    *cap = c;
    return CKPT_OK;
}

static int put_byte(st_parser *ps, char c)
{
    CKPT_FORWARD(grow(ps->f, (void **)&ps->str, &ps->cap, ps->len + 2, 1));
    ps->str[ps->len++] = c;
    return CKPT_OK;
}

static int hex4(st_parser *ps, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int c = peek(ps), d = c >= '0' && c <= '9' ? c - '0'
                            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                            : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return perr(ps, "%s: a \\u escape needs four hex digits", "bad string");
        v = v * 16 + (unsigned)d;
        ps->p++;
    }
    *out = v;
    return CKPT_OK;
}

/* A JSON string into ps->str (ps->len bytes, NUL-ended); the text is
 * already known to be UTF-8. */
static int read_string(st_parser *ps)
{
    ws(ps);
    if (peek(ps) != '"')
        return perr(ps, "%s expected (the header is not valid JSON)", "a string");
    ps->p++;
    ps->len = 0;
    for (;;) {
        int c = peek(ps);
        if (c < 0)
            return perr(ps, "%s: the JSON ends inside a string", "bad string");
        ps->p++;
        if (c == '"')
            break;
        if (c < 0x20)
            return perr(ps, "%s: a raw control character in a string (JSON wants it escaped)",
                        "bad string");
        if (c != '\\') {
            CKPT_FORWARD(put_byte(ps, (char)c));
            continue;
        }
        c = peek(ps);
        ps->p++;
        const char *simple = strchr("\"\\/bfnrt", c > 0 ? c : 'x');
        if (c > 0 && c != 'u' && simple) {
            static const char to[] = "\"\\/\b\f\n\r\t";
            CKPT_FORWARD(put_byte(ps, to[simple - "\"\\/bfnrt"]));
            continue;
        }
        if (c != 'u')
            return perr(ps, "%s: an escape JSON does not have", "bad string");
        unsigned cp, lo;
        CKPT_FORWARD(hex4(ps, &cp));
        if (cp >= 0xdc00 && cp <= 0xdfff)
            return perr(ps, "%s: a lone low surrogate escape (not a character)", "bad string");
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (ps->e - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
                return perr(ps, "%s: a lone high surrogate escape (not a character)", "bad string");
            ps->p += 2;
            CKPT_FORWARD(hex4(ps, &lo));
            if (lo < 0xdc00 || lo > 0xdfff)
                return perr(ps, "%s: a lone high surrogate escape (not a character)", "bad string");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        char u[4];
        int n = 0;
        if (cp < 0x80) {
            u[n++] = (char)cp;
        } else if (cp < 0x800) {
            u[n++] = (char)(0xc0 | cp >> 6);
            u[n++] = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            u[n++] = (char)(0xe0 | cp >> 12);
            u[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            u[n++] = (char)(0x80 | (cp & 0x3f));
        } else {
            u[n++] = (char)(0xf0 | cp >> 18);
            u[n++] = (char)(0x80 | ((cp >> 12) & 0x3f));
            u[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            u[n++] = (char)(0x80 | (cp & 0x3f));
        }
        for (int i = 0; i < n; i++)
            CKPT_FORWARD(put_byte(ps, u[i]));
    }
    CKPT_FORWARD(put_byte(ps, '\0'));
    ps->len--;
    return CKPT_OK;
}

/* A JSON number's text (its grammar checked); *INTEGER when it has no
 * fraction and no exponent. */
static int scan_number(st_parser *ps, const char **start, bool *integer)
{
    *start = ps->p;
    *integer = true;
    if (peek(ps) == '-')
        ps->p++;
    if (peek(ps) == '0') {
        ps->p++;
        if (peek(ps) >= '0' && peek(ps) <= '9')
            return perr(ps, "%s: a number with a leading zero (not JSON)", "bad number");
    } else if (peek(ps) >= '1' && peek(ps) <= '9') {
        while (peek(ps) >= '0' && peek(ps) <= '9')
            ps->p++;
    } else {
        return perr(ps, "%s: not a JSON value", "bad number");
    }
    if (peek(ps) == '.') {
        *integer = false;
        ps->p++;
        if (!(peek(ps) >= '0' && peek(ps) <= '9'))
            return perr(ps, "%s: no digit after the decimal point", "bad number");
        while (peek(ps) >= '0' && peek(ps) <= '9')
            ps->p++;
    }
    if (peek(ps) == 'e' || peek(ps) == 'E') {
        *integer = false;
        ps->p++;
        if (peek(ps) == '+' || peek(ps) == '-')
            ps->p++;
        if (!(peek(ps) >= '0' && peek(ps) <= '9'))
            return perr(ps, "%s: no digit in the exponent", "bad number");
        while (peek(ps) >= '0' && peek(ps) <= '9')
            ps->p++;
    }
    return CKPT_OK;
}

/* A shape dimension or an offset: an unsigned integer as written, as
 * serde reads a usize (6.0, 6e0 and -0 are floats to it; 2^64 too). */
static int read_u64(st_parser *ps, const char *tensor, const char *field, uint64_t *out)
{
    ws(ps);
    const char *at = ps->p, *start;
    bool integer;
    if (!(peek(ps) == '-' || (peek(ps) >= '0' && peek(ps) <= '9')))
        return ckpt_err(&ps->f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s': %s holds a value that is not a number "
                        "(at byte %zu of the header)", tensor, field, (size_t)(at - ps->s));
    CKPT_FORWARD(scan_number(ps, &start, &integer));
    int len = (int)(ps->p - start < 40 ? ps->p - start : 40);
    if (*start == '-' || !integer)
        return ckpt_err(&ps->f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s': %s holds %.*s, not an unsigned integer "
                        "(safetensors reads integers as written: no sign, fraction or exponent; "
                        "at byte %zu of the header)", tensor, field, len, start,
                        (size_t)(at - ps->s));
    uint64_t v = 0;
    for (const char *c = start; c < ps->p; c++) {
        if (v > (UINT64_MAX - (uint64_t)(*c - '0')) / 10)
            return ckpt_err(&ps->f->err, CKPT_ERR_FORMAT,
                            "safetensors: tensor '%s': %s holds %.*s, over 2^64-1 (at byte %zu "
                            "of the header)", tensor, field, len, start, (size_t)(at - ps->s));
        v = v * 10 + (uint64_t)(*c - '0');
    }
    *out = v;
    return CKPT_OK;
}

static int skip_value(st_parser *ps, int depth);

static int skip_literal(st_parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->e - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return perr(ps, "%s: not a JSON value", "bad value");
    ps->p += n;
    return CKPT_OK;
}

/* Any JSON value, checked and dropped: an unknown field of a tensor, which
 * safetensors skips the same way.  DEPTH: the levels around it. */
static int skip_value(st_parser *ps, int depth)
{
    ws(ps);
    int c = peek(ps);
    if (c == '{' || c == '[') {
        if (depth + 1 > JSON_MAX_DEPTH)
            return perr(ps, "JSON nested more than %s levels deep (safetensors' limit)", "127");
        ps->p++;
        ws(ps);
        char close = c == '{' ? '}' : ']';
        if (peek(ps) == close) {
            ps->p++;
            return CKPT_OK;
        }
        for (;;) {
            if (c == '{') {
                CKPT_FORWARD(read_string(ps));
                CKPT_FORWARD(expect(ps, ':'));
            }
            CKPT_FORWARD(skip_value(ps, depth + 1));
            ws(ps);
            if (peek(ps) == close) {
                ps->p++;
                return CKPT_OK;
            }
            CKPT_FORWARD(expect(ps, ','));
            ws(ps);
            if (peek(ps) == close)
                return perr(ps, "%s (not JSON)", "a trailing comma");
        }
    }
    if (c == '"')
        return read_string(ps);
    if (c == 't')
        return skip_literal(ps, "true");
    if (c == 'f')
        return skip_literal(ps, "false");
    if (c == 'n')
        return skip_literal(ps, "null");
    const char *start;
    bool integer;
    CKPT_FORWARD(scan_number(ps, &start, &integer));
    if (!integer) { /* serde_json refuses a float it cannot hold */
        char buf[64], *big = NULL;
        size_t n = (size_t)(ps->p - start);
        char *t = n < sizeof(buf) ? buf : (big = malloc(n + 1));
        if (!t)
            return ckpt_oom(&ps->f->err);
        memcpy(t, start, n);
        t[n] = '\0';
        double d = strtod(t, NULL);
        free(big);
        if (isinf(d))
            return perr(ps, "%s: a number out of a double's range", "bad number");
    }
    return CKPT_OK;
}

static bool is_metadata(const st_parser *ps)
{
    return ps->len == 12 && memcmp(ps->str, "__metadata__", 12) == 0;
}

/* Before an object's next member (whitespace after its '{' skipped):
 * *MORE says whether one follows (its key next) or the '}' does (not
 * consumed); commas between members, none trailing, as JSON wants.
 * *FIRST: true before the first member. */
static int next_member(st_parser *ps, bool *first, bool *more)
{
    if (*first) {
        *first = false;
        *more = peek(ps) != '}';
        return CKPT_OK;
    }
    ws(ps);
    *more = peek(ps) != '}';
    if (!*more)
        return CKPT_OK;
    CKPT_FORWARD(expect(ps, ','));
    ws(ps);
    if (peek(ps) == '}')
        return perr(ps, "%s (not JSON)", "a trailing comma");
    return CKPT_OK;
}

/* The last string read, kept: in the arena, refused when it holds a NUL. */
static const char *keep_string(st_parser *ps, const char *what)
{
    if (memchr(ps->str, 0, ps->len)) {
        ckpt_err(&ps->f->err, CKPT_ERR_UNSUPPORTED,
                 "safetensors: %s with \\u0000 " CKPT_NAME_NUL, what);
        return NULL;
    }
    const char *s = ckpt_arena_strndup(&ps->f->arena, ps->str, ps->len);
    if (!s)
        ckpt_oom(&ps->f->err);
    return s;
}

static ckpt_value *str_value(ckpt_file *f, const char *s)
{
    ckpt_value *v = ckpt_value_new(&f->arena, CKPT_KIND_STR, 0);
    if (!v)
        return NULL;
    v->u.s.s = (char *)s; /* in the arena already */
    v->u.s.len = strlen(s);
    return v;
}

static int cmp_str_value(const void *a, const void *b)
{
    return strcmp((*(const ckpt_value *const *)a)->u.s.s, (*(const ckpt_value *const *)b)->u.s.s);
}

/* An object of strings (__metadata__, ckpt.tied) into a dict (in header
 * order), or null (*OUT NULL).  A key written twice is refused. */
static int read_string_map(st_parser *ps, const char *what, int depth, ckpt_value **out)
{
    *out = NULL;
    ws(ps);
    if (peek(ps) == 'n' && (size_t)(ps->e - ps->p) >= 4 && memcmp(ps->p, "null", 4) == 0) {
        ps->p += 4; /* an Option: null is no metadata */
        return CKPT_OK;
    }
    if (peek(ps) != '{')
        return ckpt_err(&ps->f->err, CKPT_ERR_FORMAT,
                        "safetensors: %s is not an object of strings (at byte %zu of the %s)",
                        what, (size_t)(ps->p - ps->s), ps->what);
    if (depth + 1 > JSON_MAX_DEPTH)
        return perr(ps, "JSON nested more than %s levels deep (safetensors' limit)", "127");
    ps->p++;
    ckpt_value *d = ckpt_value_new(&ps->f->arena, CKPT_KIND_DICT, 0);
    if (!d)
        return ckpt_oom(&ps->f->err);
    d->flags |= CKPT_VF_ORDERED;
    ws(ps);
    for (bool first = true, more;;) {
        CKPT_FORWARD(next_member(ps, &first, &more));
        if (!more)
            break;
        CKPT_FORWARD(read_string(ps));
        const char *k = keep_string(ps, "a metadata key");
        if (!k)
            return ps->f->err.code;
        CKPT_FORWARD(expect(ps, ':'));
        ws(ps);
        if (peek(ps) != '"')
            return ckpt_err(&ps->f->err, CKPT_ERR_FORMAT,
                            "safetensors: %s value '%s' is not a string (at byte %zu of the %s)",
                            what, k, (size_t)(ps->p - ps->s), ps->what);
        CKPT_FORWARD(read_string(ps));
        const char *v = keep_string(ps, "a metadata value");
        if (!v)
            return ps->f->err.code;
        ckpt_value *kv = str_value(ps->f, k), *vv = str_value(ps->f, v);
        if (!kv || !vv || ckpt_vec_push(&ps->f->arena, &d->u.dict.keys, kv) ||
            ckpt_vec_push(&ps->f->arena, &d->u.dict.vals, vv))
            return ckpt_oom(&ps->f->err);
    }
    ps->p++;
    /* keys once: sorted pointers, neighbours compared */
    size_t n = d->u.dict.keys.len;
    ckpt_value **sorted = malloc((n ? n : 1) * sizeof(*sorted));
    if (!sorted)
        return ckpt_oom(&ps->f->err);
    if (n) /* an empty object has no array yet */
        memcpy(sorted, d->u.dict.keys.items, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), cmp_str_value);
    int rc = CKPT_OK;
    for (size_t i = 1; i < n && rc == CKPT_OK; i++)
        if (strcmp(sorted[i - 1]->u.s.s, sorted[i]->u.s.s) == 0)
            rc = ckpt_err(&ps->f->err, CKPT_ERR_UNSUPPORTED,
                          "safetensors: %s key '%s' appears twice (safetensors keeps the last, "
                          "other JSON readers the first: ckpt refuses it)", what,
                          sorted[i]->u.s.s);
    free(sorted);
    if (rc == CKPT_OK)
        *out = d;
    return rc;
}

enum { F_DTYPE = 1, F_SHAPE = 2, F_OFFSETS = 4 };

/* One tensor's object {dtype, shape, data_offsets} into a record. */
static int read_tensor(st_parser *ps, const char *name)
{
    ckpt_file *f = ps->f;
    ws(ps);
    if (peek(ps) != '{')
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s' is not an object (at byte %zu of the header)",
                        name, (size_t)(ps->p - ps->s));
    ps->p++;
    if (ps->nrecs >= f->limits[CKPT_LIMIT_STORAGES])
        return ckpt_err(&f->err, CKPT_ERR_LIMIT, "safetensors: more than %llu tensors",
                        (unsigned long long)f->limits[CKPT_LIMIT_STORAGES]);
    CKPT_FORWARD(grow(f, (void **)&ps->recs, &ps->recs_cap, ps->nrecs + 1, sizeof(st_rec)));
    st_rec *r = &ps->recs[ps->nrecs];
    memset(r, 0, sizeof(*r));
    r->name = name;
    r->dims = ps->ndims;
    unsigned seen = 0;
    ws(ps);
    for (bool first = true, more;;) {
        CKPT_FORWARD(next_member(ps, &first, &more));
        if (!more)
            break;
        CKPT_FORWARD(read_string(ps));
        unsigned which = strcmp(ps->str, "dtype") == 0          ? F_DTYPE
                         : strcmp(ps->str, "shape") == 0        ? F_SHAPE
                         : strcmp(ps->str, "data_offsets") == 0 ? F_OFFSETS : 0;
        if (which && ps->len != strlen(ps->str))
            which = 0; /* "dtype\u0000": a field of its own */
        if (which & seen)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                            "safetensors: tensor '%s' has field '%s' twice", name, ps->str);
        seen |= which;
        CKPT_FORWARD(expect(ps, ':'));
        ws(ps);
        if (which == F_DTYPE) {
            if (peek(ps) != '"')
                return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                                "safetensors: tensor '%s' has a dtype that is not a string", name);
            CKPT_FORWARD(read_string(ps));
            ckpt_dtype dt = ps->len == strlen(ps->str) ? dtype_from_name(ps->str)
                                                       : CKPT_DTYPE_UNKNOWN;
            if (dt == CKPT_DTYPE_UNKNOWN) {
                char shown[40];
                snprintf(shown, sizeof(shown), "%s", ps->str);
                return ckpt_err(&f->err, CKPT_ERR_FORMAT, /* safetensors refuses it too */
                                "safetensors: tensor '%s' has unknown dtype '%s'", name, shown);
            }
            r->dtype = (uint8_t)dt;
        } else if (which == F_SHAPE || which == F_OFFSETS) {
            const char *field = which == F_SHAPE ? "shape" : "data_offsets";
            if (peek(ps) != '[')
                return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                                "safetensors: tensor '%s': %s is not an array", name, field);
            ps->p++;
            ws(ps);
            size_t n = 0;
            uint64_t off[2] = {0, 0};
            while (peek(ps) != ']') {
                if (n) {
                    CKPT_FORWARD(expect(ps, ','));
                    ws(ps);
                    if (peek(ps) == ']')
                        return perr(ps, "%s (not JSON)", "a trailing comma");
                }
                uint64_t v = 0;
                CKPT_FORWARD(read_u64(ps, name, field, &v));
                if (which == F_OFFSETS) {
                    if (n >= 2)
                        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                                        "safetensors: tensor '%s': data_offsets has more than 2 "
                                        "numbers", name);
                    off[n] = v;
                } else {
                    if (n >= MAX_NDIM)
                        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                                        "safetensors: tensor '%s' has more than %d dimensions",
                                        name, MAX_NDIM);
                    CKPT_FORWARD(grow(f, (void **)&ps->dims, &ps->dims_cap, ps->ndims + 1,
                                      sizeof(uint64_t)));
                    ps->dims[ps->ndims++] = v;
                }
                n++;
                ws(ps);
            }
            ps->p++;
            if (which == F_OFFSETS) {
                if (n != 2)
                    return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                                    "safetensors: tensor '%s': data_offsets has %zu numbers, not 2",
                                    name, n);
                r->begin = off[0];
                r->end = off[1];
            } else {
                r->ndim = (uint8_t)n;
            }
        } else {
            CKPT_FORWARD(skip_value(ps, 2)); /* the header, this tensor */
        }
    }
    ps->p++;
    if (seen != (F_DTYPE | F_SHAPE | F_OFFSETS))
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: tensor '%s' lacks %s", name,
                        !(seen & F_DTYPE) ? "dtype" : !(seen & F_SHAPE) ? "shape" : "data_offsets");
    ps->nrecs++;
    return CKPT_OK;
}

/* The whole header: {name: tensor, ..., "__metadata__": {...}}. */
static int read_header(st_parser *ps, ckpt_value **md)
{
    *md = NULL;
    bool have_md = false;
    ws(ps);
    if (peek(ps) != '{')
        return perr(ps, peek(ps) < 0 ? "%s: the header is empty"
                                     : "%s: the header is not a JSON object",
                    "no object");
    ps->p++;
    ws(ps);
    for (bool first = true, more;;) {
        CKPT_FORWARD(next_member(ps, &first, &more));
        if (!more)
            break;
        CKPT_FORWARD(read_string(ps));
        if (is_metadata(ps)) {
            if (have_md)
                return ckpt_err(&ps->f->err, CKPT_ERR_FORMAT,
                                "safetensors: two __metadata__ entries");
            have_md = true;
            CKPT_FORWARD(expect(ps, ':'));
            CKPT_FORWARD(read_string_map(ps, "__metadata__", 1, md));
            continue;
        }
        const char *name = keep_string(ps, "a tensor name");
        if (!name)
            return ps->f->err.code;
        CKPT_FORWARD(expect(ps, ':'));
        CKPT_FORWARD(read_tensor(ps, name));
    }
    ps->p++;
    ws(ps);
    if (ps->p != ps->e)
        return perr(ps, "%s: bytes after the header's JSON object other than spaces",
                    "trailing characters");
    return CKPT_OK;
}

static int cmp_offsets(const void *a, const void *b)
{
    const st_rec *x = *(const st_rec *const *)a, *y = *(const st_rec *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int cmp_rec_name(const void *a, const void *b)
{
    return strcmp((*(const st_rec *const *)a)->name, (*(const st_rec *const *)b)->name);
}

/* A record's dtype and shape against its byte range; its shape in torch's
 * terms into SHAPE, its storage's numel into *NUMEL. */
static int check_size(ckpt_file *f, const st_parser *ps, const st_rec *r, int64_t *shape,
                      uint64_t *numel_out)
{
    ckpt_dtype dt = (ckpt_dtype)r->dtype;
    const uint64_t *d = ps->dims + r->dims;
    uint64_t numel = 1, bits;
    bool over = false;
    for (int i = 0; i < r->ndim; i++) {
        over |= ckpt_mul_overflow(numel, d[i], &numel) || d[i] > INT64_MAX;
        shape[i] = (int64_t)d[i];
    }
    over = over || ckpt_mul_overflow(numel, st_bits(dt), &bits);
    if (!over && bits % 8) /* as the safetensors crate refuses it */
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: %s tensor '%s' of %llu values does not end on a byte "
                        "boundary", dtype_name(dt), r->name, (unsigned long long)numel);
    uint64_t nbytes = bits / 8;
    if (over || nbytes != r->end - r->begin)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: tensor '%s' is %llu bytes by its offsets but its shape and "
                        "dtype need %s", r->name, (unsigned long long)(r->end - r->begin),
                        over ? "more than 2^64" : "a different size");
    *numel_out = ckpt_dtype_size(dt) ? nbytes / ckpt_dtype_size(dt) : numel;
    if (dt == CKPT_DTYPE_FLOAT4_E2M1FN_X2) {
        /* torch's shape counts pairs of the last dimension, as safetensors' own
         * torch loader maps it (refusing an odd last dimension the same way) */
        if (r->ndim == 0 || shape[r->ndim - 1] % 2)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, /* as safetensors' torch loader */
                            "safetensors: F4 tensor '%s' has an odd last dimension (%lld): "
                            "torch's float4_e2m1fn_x2 packs it in pairs", r->name,
                            r->ndim ? (long long)shape[r->ndim - 1] : 1LL);
        shape[r->ndim - 1] /= 2;
    }
    return CKPT_OK;
}

/* The records against the data section, as validate() does: sorted by
 * offsets, each begins where the one before ends (the first at 0), and the
 * last ends at the end of the file.  A name written twice is checked as
 * safetensors reads it (the last entry kept), so that a file it refuses is
 * refused the same way (CKPT_ERR_FORMAT); one it would read is refused as
 * ckpt's own rule (CKPT_ERR_UNSUPPORTED: what safetensors reads and ckpt
 * does not). */
static int check_layout(ckpt_file *f, st_parser *ps, uint64_t data_len)
{
    size_t n = ps->nrecs, kept = 0;
    st_rec **sorted = malloc((n ? n : 1) * sizeof(*sorted));
    if (!sorted)
        return ckpt_oom(&f->err);
    for (size_t i = 0; i < n; i++)
        sorted[i] = &ps->recs[i];
    /* names once: among equal ones the last in the header (the highest
     * record) is the one safetensors keeps */
    qsort(sorted, n, sizeof(*sorted), cmp_rec_name);
    const st_rec *dup = NULL;
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        st_rec *last = sorted[i];
        while (j + 1 < n && strcmp(sorted[j + 1]->name, sorted[i]->name) == 0)
            if (sorted[++j] > last)
                last = sorted[j];
        if (j > i && !dup)
            dup = last;
        sorted[kept++] = last;
        i = j;
    }
    qsort(sorted, kept, sizeof(*sorted), cmp_offsets);
    int rc = CKPT_OK;
    uint64_t at = 0;
    for (size_t i = 0; i < kept && rc == CKPT_OK; i++) {
        const st_rec *r = sorted[i];
        if (r->end < r->begin)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "safetensors: tensor '%s' ends (byte %llu) before it begins (%llu)",
                          r->name, (unsigned long long)r->end, (unsigned long long)r->begin);
        else if (r->begin > at)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "safetensors: bytes %llu-%llu of the data section belong to no tensor "
                          "(a hole before '%s'; safetensors wants the tensors back to back)",
                          (unsigned long long)at, (unsigned long long)r->begin, r->name);
        else if (r->begin < at)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "safetensors: tensor '%s' (bytes %llu-%llu) overlaps the one before it, "
                          "which ends at %llu", r->name, (unsigned long long)r->begin,
                          (unsigned long long)r->end, (unsigned long long)at);
        else if (r->end > data_len)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "safetensors: tensor '%s' ends at byte %llu of a %llu-byte data section",
                          r->name, (unsigned long long)r->end, (unsigned long long)data_len);
        at = r->end;
    }
    if (rc == CKPT_OK && at != data_len)
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                      "safetensors: %llu byte%s after the last tensor's data (safetensors wants "
                      "the tensors to cover the data section to the end of the file)",
                      (unsigned long long)(data_len - at), data_len - at == 1 ? "" : "s");
    if (rc != CKPT_OK && dup) {
        /* said with the cause: the layout is the one safetensors sees */
        char was[sizeof(f->err.msg)];
        snprintf(was, sizeof(was), "%s", f->err.msg + strlen("safetensors: "));
        ckpt_err_clear(&f->err); /* the first error is kept: this one replaces it */
        rc = ckpt_err(&f->err, rc,
                      "safetensors: tensor '%s' appears twice; read as safetensors reads it (the "
                      "last kept): %s", dup->name, was);
    } else if (dup) {
        rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                      "safetensors: tensor '%s' appears twice (safetensors keeps the last, other "
                      "JSON readers the first: ckpt refuses it)", dup->name);
    }
    free(sorted);
    return rc;
}

/* What this reader keeps on each source it read (src->ops == &st_ops): no
 * methods, and as its fmt_data the file's __metadata__ (a dict of str, in
 * the handle's arena), or NULL. */
static const ckpt_format_ops st_ops = {0};

/* Names written once for several tied ones: "ckpt.tied" = {"alias": "name"},
 * a JSON text in a metadata value, read by the same rules. */
static int restore_tied(ckpt_file *f, ckpt_value *root, const ckpt_value *md)
{
    const ckpt_value *tied = md ? ckpt_value_dict_get(md, "ckpt.tied") : NULL;
    if (!tied)
        return CKPT_OK;
    st_parser ps = {.f = f, .s = tied->u.s.s, .p = tied->u.s.s,
                    .e = tied->u.s.s + tied->u.s.len, .what = "__metadata__ ckpt.tied"};
    ckpt_value *map = NULL;
    int rc = read_string_map(&ps, "ckpt.tied", 0, &map);
    ws(&ps);
    if (rc == CKPT_OK && (!map || ps.p != ps.e))
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                      "safetensors: __metadata__ ckpt.tied is not a JSON object");
    free(ps.str);
    for (size_t i = 0; rc == CKPT_OK && i < map->u.dict.keys.len; i++) {
        const char *alias = map->u.dict.keys.items[i]->u.s.s;
        const ckpt_value *target = ckpt_value_dict_get(root, map->u.dict.vals.items[i]->u.s.s);
        if (!target || target->kind != CKPT_KIND_TENSOR || ckpt_value_dict_get(root, alias))
            return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                            "safetensors: ckpt.tied names '%s' for a tensor that is not there",
                            alias);
        /* the same tensor object, as torch had it before saving */
        if (ckpt_vec_push(&f->arena, &root->u.dict.keys, map->u.dict.keys.items[i]) ||
            ckpt_vec_push(&f->arena, &root->u.dict.vals, (ckpt_value *)target))
            return ckpt_oom(&f->err);
    }
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
    uint64_t limit = f->limits[CKPT_LIMIT_HEADER_BYTES];
    if (n > limit) /* checked first, as the safetensors crate does */
        return ckpt_err(&f->err, CKPT_ERR_LIMIT,
                        "safetensors: header of %llu bytes is over the limit of %llu "
                        "(--max-header-bytes)", (unsigned long long)n, (unsigned long long)limit);
    if (n > src->file_size - 8)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "safetensors: header length %llu goes past the end of the %llu-byte file",
                        (unsigned long long)n, (unsigned long long)src->file_size);
    if (n > SIZE_MAX - 1)
        return ckpt_oom(&f->err);
    char *text = malloc((size_t)n + 1);
    if (!text)
        return ckpt_oom(&f->err);
    int rc = ckpt_pread_all(src->fd, text, (size_t)n, 8);
    st_parser ps = {.f = f, .s = text, .p = text, .e = text + n, .what = "header"};
    ckpt_value *md = NULL, *root = NULL;
    if (rc) {
        rc = ckpt_err(&f->err, rc, "safetensors: cannot read the header");
        goto out;
    }
    if (!ckpt_utf8_valid((const uint8_t *)text, (size_t)n)) {
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "safetensors: header is not valid UTF-8 text");
        goto out;
    }
    if ((rc = read_header(&ps, &md)))
        goto out;
    free(text); /* the records and names are all that is kept */
    text = NULL;
    free(ps.str);
    ps.str = NULL;
    uint64_t data_start = 8 + n, data_len = src->file_size - data_start;
    if ((rc = check_layout(f, &ps, data_len)))
        goto out;
    src->fmt_data = md;
    root = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0);
    if (!root) {
        rc = ckpt_oom(&f->err);
        goto out;
    }
    root->flags |= CKPT_VF_ORDERED;
    if (ps.nrecs && (ckpt_vec_reserve(&f->arena, &root->u.dict.keys, ps.nrecs) ||
                     ckpt_vec_reserve(&f->arena, &root->u.dict.vals, ps.nrecs))) {
        rc = ckpt_oom(&f->err); /* sized once: 1.7 M names leave no doubled arrays behind */
        goto out;
    }
    size_t plen = f->key_prefix ? strlen(f->key_prefix) : 0;
    char *key = NULL;
    size_t key_cap = 0;
    for (size_t i = 0; i < ps.nrecs && rc == CKPT_OK; i++) {
        const st_rec *r = &ps.recs[i];
        int64_t shape[MAX_NDIM + 1], stride[MAX_NDIM + 1];
        uint64_t numel = 0;
        if ((rc = check_size(f, &ps, r, shape, &numel)))
            break;
        size_t nl = strlen(r->name);
        if ((rc = grow(f, (void **)&key, &key_cap, plen + nl + 1, 1)))
            break;
        memcpy(key, f->key_prefix ? f->key_prefix : "", plen);
        memcpy(key + plen, r->name, nl + 1);
        ckpt_dtype dt = (ckpt_dtype)r->dtype;
        /* the storage's key is the tensor's name (in the arena) unless a shard's prefix is added */
        ckpt_storage *s =
            plen ? ckpt_file_storage_new(f, key, dt, (int64_t)numel, "cpu", 3, &f->err)
                 : ckpt_file_storage_new_kept(f, r->name, dt, (int64_t)numel, "cpu", 3, &f->err);
        if (!s) {
            rc = f->err.code;
            break;
        }
        s->type_name = ckpt_storage_type_name(dt);
        s->loc = CKPT_LOC_FILE_RANGE;
        s->file_offset = data_start + r->begin;
        int64_t acc = 1;
        for (int d = r->ndim - 1; d >= 0; d--) {
            stride[d] = acc;
            acc *= shape[d] ? shape[d] : 1;
        }
        ckpt_value *t = ckpt_tensor_value_new(&f->arena, s, dt, r->ndim, shape, stride, 0);
        ckpt_value *k = str_value(f, r->name);
        if (!t || !k || ckpt_vec_push(&f->arena, &root->u.dict.keys, k) ||
            ckpt_vec_push(&f->arena, &root->u.dict.vals, t))
            rc = ckpt_oom(&f->err);
    }
    free(key);
    if (rc == CKPT_OK)
        rc = restore_tied(f, root, md);
    if (rc == CKPT_OK)
        *root_out = root;
out:
    free(text);
    free(ps.str);
    free(ps.dims);
    free(ps.recs);
    return rc;
}

/* u64 header length, then JSON; the reader checks the length.  (A torch
 * legacy file never has '{' there: its magic pickle does not.)  JSON
 * whitespace may come first: safetensors reads such a header. */
static bool safetensors_sniff(const uint8_t *head, size_t n)
{
    size_t i = 8;
    while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r'))
        i++;
    return i < n && head[i] == '{';
}

/* ---- writing: one state dict as safetensors -------------------------------------
 *
 * The 8-byte header length, the JSON header (__metadata__ {"format": "pt"},
 * then the tensors in the state dict's order), padded with spaces so that
 * the data section starts on a 64-byte boundary, then each tensor's
 * elements packed in C order.  Views are gathered, casts applied, tied
 * tensors written once (the other names go to __metadata__ "ckpt.tied").
 *
 * The data is laid out for alignment, not in the header's order: torch's
 * CPU kernels read a tensor mapped in place (safetensors' safe_open,
 * transformers) and some give other last bits when its address is not
 * 64-byte aligned (a batch-1 Linear's gemv).  The format allows no holes,
 * so the order does it (st_layout); every reader sorts by offsets.
 */
#define ST_ALIGN 64u

typedef struct st_entry {
    const char *name;
    const ckpt_tensor *t;
    uint64_t begin, end;
    long alias_of; /* index of the entry holding the bytes, or -1 */
    unsigned es;   /* its natural alignment: the element size (1 for sub-byte) */
} st_entry;

/* By offset in the data section. */
static int cmp_begin(const void *a, const void *b, void *ctx)
{
    const st_entry *e = ctx;
    uint64_t x = e[*(const size_t *)a].begin, y = e[*(const size_t *)b].begin;
    return (x > y) - (x < y);
}

/* Larger elements first, then larger tensors, then the header's order. */
static int cmp_es_size(const void *a, const void *b, void *ctx)
{
    const st_entry *e = ctx;
    const st_entry *x = &e[*(const size_t *)a], *y = &e[*(const size_t *)b];
    uint64_t nx = x->end - x->begin, ny = y->end - y->begin;
    if (x->es != y->es)
        return x->es > y->es ? -1 : 1;
    if (nx != ny)
        return nx > ny ? -1 : 1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* The fewest residues (at most ST_ALIGN) whose sum is 0 modulo ST_ALIGN,
 * taking at most COUNT[r] of residue r, into GROUP; false when there are
 * none.  A 0/1 knapsack over the copies, keeping every row to trace the
 * choice back: at most 63 x 64 copies of 64 states. */
static bool st_zero_group(const size_t count[ST_ALIGN], unsigned group[ST_ALIGN], uint8_t *rows,
                          uint8_t *item)
{
    size_t m = 0;
    for (unsigned r = 1; r < ST_ALIGN; r++)
        for (size_t k = 0; k < count[r] && k < ST_ALIGN; k++)
            item[m++] = (uint8_t)r;
    /* rows[j][s]: the fewest of items 0..j (at least one) summing to s */
    for (size_t j = 0; j < m; j++) {
        uint8_t *cur = rows + j * ST_ALIGN;
        const uint8_t *prev = j ? cur - ST_ALIGN : NULL;
        unsigned r = item[j];
        for (unsigned s = 0; s < ST_ALIGN; s++) {
            unsigned best = prev ? prev[s] : 255;
            unsigned via = prev ? prev[(s + ST_ALIGN - r) % ST_ALIGN] : 255;
            if (s == r)
                best = 1;
            else if (via != 255 && via + 1 < best)
                best = via + 1;
            cur[s] = (uint8_t)best;
        }
    }
    memset(group, 0, ST_ALIGN * sizeof(*group));
    if (!m || rows[(m - 1) * ST_ALIGN] == 255)
        return false;
    unsigned s = 0; /* the sum still to make, from items 0..j */
    for (size_t j = m; j-- > 0;) {
        const uint8_t *cur = rows + j * ST_ALIGN, *prev = j ? cur - ST_ALIGN : NULL;
        if (prev && cur[s] == prev[s])
            continue; /* item j is not needed */
        group[item[j]]++;
        if (cur[s] == 1)
            break; /* item j alone makes s */
        s = (s + ST_ALIGN - item[j]) % ST_ALIGN;
    }
    return true;
}

/* The order of a run of entries that starts on a boundary: larger elements
 * first keeps every tensor at a multiple of its element size; the tensor
 * that starts the run (the aligned one) is then the largest that can,
 * with the others after it in that order. */
static void st_order_run(st_entry *e, size_t *run, size_t len)
{
    if (len < 2)
        return;
    qsort_r(run, len, sizeof(*run), cmp_es_size, e);
    size_t lead = 0;
    for (size_t j = 1; j < len; j++) {
        uint64_t size = e[run[j]].end - e[run[j]].begin, off = size;
        if (size <= e[run[lead]].end - e[run[lead]].begin)
            continue;
        bool fits = true;
        for (size_t k = 0; k < len && fits; k++)
            if (k != j) {
                fits = off % e[run[k]].es == 0;
                off += e[run[k]].end - e[run[k]].begin;
            }
        if (fits)
            lead = j;
    }
    size_t x = run[lead];
    memmove(run + 1, run, lead * sizeof(*run));
    run[0] = x;
}

/*
 * The data's order (ORDER, the entries that hold bytes) and offsets, for
 * as many aligned starts as can be: first every tensor whose size is a
 * multiple of 64 bytes (each then starts on a boundary), then groups whose
 * sizes sum to a multiple of 64 (each group's first tensor starts on one;
 * the smallest groups first, which gives the most of them), then the rest.
 * Within a group and in the rest, larger elements come first, so that every
 * tensor starts at a multiple of its element size; among equal ones the
 * largest tensor first, which is the one that starts aligned.
 */
static int st_layout(ckpt_file *f, st_entry *e, size_t n, size_t *order, size_t *nout)
{
    size_t count[ST_ALIGN] = {0}, start[ST_ALIGN + 1] = {0}, m = 0;
    for (size_t i = 0; i < n; i++)
        if (e[i].alias_of < 0)
            count[(e[i].end - e[i].begin) % ST_ALIGN]++;
    for (unsigned r = 0; r < ST_ALIGN; r++)
        start[r + 1] = start[r] + count[r];
    /* by residue, each class in header order: the multiples of 64 already
     * in place at the front */
    size_t next[ST_ALIGN];
    memcpy(next, start, sizeof(next));
    for (size_t i = 0; i < n; i++)
        if (e[i].alias_of < 0)
            order[next[(e[i].end - e[i].begin) % ST_ALIGN]++] = i;
    *nout = start[ST_ALIGN];
    size_t *rest = malloc((*nout ? *nout : 1) * sizeof(*rest));
    size_t copies = (size_t)(ST_ALIGN - 1) * ST_ALIGN; /* st_zero_group's items, at most */
    uint8_t *rows = malloc(copies * ST_ALIGN), *item = malloc(copies);
    if (!rest || !rows || !item) {
        free(rest);
        free(rows);
        free(item);
        return ckpt_oom(&f->err);
    }
    memcpy(rest, order, *nout * sizeof(*rest));
    memcpy(next, start, sizeof(next)); /* the next unplaced entry of each class */
    m = count[0];
    count[0] = 0;
    unsigned group[ST_ALIGN];
    while (st_zero_group(count, group, rows, item)) {
        /* the same group as often as its classes allow: at most 63 searches */
        size_t times = SIZE_MAX;
        for (unsigned r = 1; r < ST_ALIGN; r++)
            if (group[r] && count[r] / group[r] < times)
                times = count[r] / group[r];
        for (size_t t = 0; t < times; t++) {
            size_t g0 = m;
            for (unsigned r = 1; r < ST_ALIGN; r++)
                for (unsigned k = 0; k < group[r]; k++)
                    order[m++] = rest[next[r]++];
            st_order_run(e, order + g0, m - g0);
        }
        for (unsigned r = 1; r < ST_ALIGN; r++)
            count[r] -= group[r] * times;
    }
    size_t g0 = m;
    for (unsigned r = 1; r < ST_ALIGN; r++)
        while (next[r] < start[r + 1])
            order[m++] = rest[next[r]++];
    st_order_run(e, order + g0, m - g0);
    free(rest);
    free(rows);
    free(item);
    uint64_t at = 0;
    for (size_t k = 0; k < m; k++) {
        st_entry *x = &e[order[k]];
        uint64_t nb = x->end - x->begin;
        x->begin = at;
        x->end = at + nb;
        at += nb;
    }
    return CKPT_OK;
}

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

/* The dtype T is written as: the storage's after a cast, else T's own (an
 * untyped storage of torch 2.x may be viewed as several dtypes: its own
 * dtype is only its first tensor's). */
static ckpt_dtype st_out_dtype(const ckpt_tensor *t)
{
    const ckpt_storage *s = t->storage;
    return s->dtype != s->src_dtype ? s->dtype : t->dtype;
}

/* The header's text, grown as it is written. */
typedef struct st_text {
    char *buf;
    size_t len, cap;
} st_text;

static int st_text_add(st_text *h, const char *s, size_t n)
{
    if (n > SIZE_MAX - h->len || CKPT_GROW(h->buf, h->cap, h->len + n) < 0)
        return CKPT_ERR_NOMEM;
    memcpy(h->buf + h->len, s, n);
    h->len += n;
    return CKPT_OK;
}

/* S as a JSON string, escaped as cJSON escapes it (the same header bytes as
 * before: '"', '\\' and C0 controls; everything else as it is). */
static int st_text_str(st_text *h, const char *s)
{
    CKPT_FORWARD(st_text_add(h, "\"", 1));
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        const char *short_form = *p == '"' ? "\\\"" : *p == '\\' ? "\\\\" : *p == '\b' ? "\\b"
                               : *p == '\f' ? "\\f" : *p == '\n' ? "\\n" : *p == '\r' ? "\\r"
                               : *p == '\t' ? "\\t" : NULL;
        if (short_form) {
            CKPT_FORWARD(st_text_add(h, short_form, 2));
        } else if (*p < 32) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            CKPT_FORWARD(st_text_add(h, esc, 6));
        } else {
            CKPT_FORWARD(st_text_add(h, (const char *)p, 1));
        }
    }
    return st_text_add(h, "\"", 1);
}

static int st_text_u64(st_text *h, uint64_t v)
{
    char b[24];
    int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return st_text_add(h, b, (size_t)n);
}

/* ,"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]} */
static int st_text_entry(st_text *h, const st_entry *x)
{
    const ckpt_tensor *t = x->t;
    ckpt_dtype dt = st_out_dtype(t);
    bool f4 = dt == CKPT_DTYPE_FLOAT4_E2M1FN_X2;
    CKPT_FORWARD(st_text_add(h, ",", 1));
    CKPT_FORWARD(st_text_str(h, x->name));
    CKPT_FORWARD(st_text_add(h, ":{\"dtype\":", 10));
    CKPT_FORWARD(st_text_str(h, dtype_name(dt)));
    CKPT_FORWARD(st_text_add(h, ",\"shape\":[", 10));
    for (int d = 0; d < t->ndim; d++) { /* F4 counts 4-bit values, torch pairs */
        if (d)
            CKPT_FORWARD(st_text_add(h, ",", 1));
        CKPT_FORWARD(st_text_u64(h, (uint64_t)t->shape[d] * (f4 && d == t->ndim - 1 ? 2 : 1)));
    }
    CKPT_FORWARD(st_text_add(h, "],\"data_offsets\":[", 18));
    CKPT_FORWARD(st_text_u64(h, x->begin));
    CKPT_FORWARD(st_text_add(h, ",", 1));
    CKPT_FORWARD(st_text_u64(h, x->end));
    return st_text_add(h, "]}", 2);
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
    view.dtype = st_out_dtype(t); /* after a cast, the storage's new type */
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
    size_t ntied = 0, ndata = 0;
    int r = CKPT_OK;
    for (size_t i = 0; i < n && r == CKPT_OK; i++) {
        e[i].name = sd->u.dict.keys.items[i]->u.s.s;
        e[i].t = sd->u.dict.vals.items[i]->u.tensor;
        if (e[i].alias_of >= 0)
            continue;
        const ckpt_tensor *t = e[i].t;
        ckpt_dtype dt = st_out_dtype(t);
        uint64_t nb = 0;
        if (!dtype_name(dt)) {
            r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "safetensors has no dtype for %s ('%s')",
                         ckpt_dtype_name(dt), e[i].name);
        } else if ((r = ckpt_dtype_nbytes(dt, (uint64_t)t->numel, &nb)) != 0 ||
                   (dt == CKPT_DTYPE_FLOAT4_E2M1FN_X2 && t->ndim == 0)) {
            /* a 0-dim float4 pair has no F4 shape: safetensors refuses it too */
            r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                         r ? "'%s' (%s) is not whole bytes" :
                             "'%s' is a 0-dim %s tensor, which safetensors' F4 cannot shape",
                         e[i].name, ckpt_dtype_name(dt));
        }
        size_t es = ckpt_dtype_size(dt);
        e[i].es = es && es <= ST_ALIGN && ST_ALIGN % es == 0 ? (unsigned)es : 1;
        e[i].begin = 0;
        e[i].end = nb;
        at += nb;
        ndata++;
        if (r == CKPT_OK && in_base) {
            const ckpt_storage *st = t->storage;
            if (st->src != &f->main || st->loc != CKPT_LOC_FILE_RANGE || st->dtype != st->src_dtype ||
                t->offset != 0 || !ckpt_tensor_is_contiguous(t) || nb != st->nbytes ||
                st->file_offset < *in_base)
                r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                             "'%s' is not a whole tensor of the file, as it was", e[i].name);
            e[i].begin = st->file_offset - *in_base;
            e[i].end = e[i].begin + nb;
        }
    }
    /* the data's order: chosen for alignment, or the input's where it is */
    size_t *order = r == CKPT_OK ? malloc((ndata ? ndata : 1) * sizeof(*order)) : NULL;
    if (r == CKPT_OK && !order)
        r = ckpt_oom(&f->err);
    if (r == CKPT_OK && !in_base) {
        r = st_layout(f, e, n, order, &ndata);
    } else if (r == CKPT_OK) {
        /* the new header must describe the data section whole, as the
         * reader checks it: not a part of it (a shard), nor bytes twice */
        ndata = 0;
        for (size_t i = 0; i < n; i++)
            if (e[i].alias_of < 0)
                order[ndata++] = i;
        qsort_r(order, ndata, sizeof(*order), cmp_begin, e);
        uint64_t end = 0;
        for (size_t k = 0; k < ndata && r == CKPT_OK; k++) {
            if (e[order[k]].begin != end)
                r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                             "the tensors written do not cover the file's data as they were "
                             "('%s' at byte %llu of its data section)", e[order[k]].name,
                             (unsigned long long)e[order[k]].begin);
            end = e[order[k]].end;
        }
        if (r == CKPT_OK && end != f->main.file_size - *in_base)
            r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                         "the tensors written do not cover the file's data as they were "
                         "(%llu of its %llu bytes)", (unsigned long long)end,
                         (unsigned long long)(f->main.file_size - *in_base));
    }
    if (r != CKPT_OK) { /* a message naming e[i] is made before E is freed */
        cJSON_Delete(hdr);
        cJSON_Delete(tied);
        free(order);
        free(e);
        return r;
    }
    for (size_t i = 0; i < n; i++)
        if (e[i].alias_of >= 0) {
            cJSON_AddStringToObject(tied, e[i].name, e[e[i].alias_of].name);
            ntied++;
        }
    if (ntied) {
        char *t = cJSON_PrintUnformatted(tied);
        if (t)
            cJSON_AddStringToObject(md, "ckpt.tied", t);
        free(t);
    }
    cJSON_Delete(tied);
    /* "__metadata__" by cJSON, the tensors written straight after it: a
     * cJSON tree of 1.7 M entries is gigabytes (issue 26) */
    char *meta = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    st_text h = {0};
    int hrc = meta ? CKPT_OK : CKPT_ERR_NOMEM;
    if (meta) {
        hrc = st_text_add(&h, meta, strlen(meta) - 1); /* without its closing brace */
        for (size_t i = 0; i < n && hrc == CKPT_OK; i++)
            if (e[i].alias_of < 0)
                hrc = st_text_entry(&h, &e[i]);
        if (hrc == CKPT_OK)
            hrc = st_text_add(&h, "}", 2); /* and the NUL */
    }
    free(meta);
    char *text = h.buf;
    if (hrc != CKPT_OK) {
        free(text);
        free(order);
        free(e);
        return ckpt_oom(&f->err);
    }
    if (in_base) {
        free(order);
        free(e);
        *header = text;
        return CKPT_OK;
    }
    /* spaces to the boundary: a multiple of 8 bytes, as the format wants,
     * and 8 + padded a multiple of ST_ALIGN */
    size_t hn = strlen(text), padded = hn + (2 * ST_ALIGN - 8 - hn % ST_ALIGN) % ST_ALIGN;
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
    for (size_t k = 0; k < ndata && rc == CKPT_OK; k++) { /* in the file's order */
        const st_entry *x = &e[order[k]];
        if (x->end == x->begin)
            continue;
        rc = write_entry(f, x, out, base);
        done += x->end - x->begin;
        if (rc == CKPT_OK && opt && opt->progress)
            opt->progress(opt->user, done, at);
    }
    free(order);
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
 * (the ordinary atomic rewrite), and the reason says so.  So does a file
 * whose data section does not start on a 64-byte boundary (another
 * writer's): the copy is laid out as every new file is.  The same edit
 * serves a clone of the input (write.c), so a clone is aligned too.
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
    int rc = CKPT_OK;
    if (base % ST_ALIGN) /* what a new file guarantees, an edit keeps */
        rc = ckpt_err(err, CKPT_ERR_UNSUPPORTED,
                      "its data section starts at byte %llu, not on a 64-byte boundary: a "
                      "copy aligns it", (unsigned long long)base);
    else
        rc = st_write(f, fd, opt, &base, &text);
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
