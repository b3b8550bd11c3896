/* weights_only.c - a model of torch.load's weights-only unpickler, for
 * "will it load?": the opcodes, globals and persistent ids it accepts, as
 * torch 2.15's torch/_weights_only_unpickler.py and torch 1.13's (Debian's
 * 1.13.1) accept them.  It runs nothing: a stack of value *types* (list,
 * dict, tuple, a global's name, a tensor, ...) is enough to tell the
 * operations torch refuses whatever the values are.  Where the answer would
 * depend on a value it does not follow (what an allowed call returns), the
 * value is OTHER and nothing is refused: the model errs on "accepted" and
 * refuses only what torch certainly refuses. */
#include "analysis/analysis.h"

#include <stdlib.h>
#include <string.h>

/* torch._weights_only_unpickler._get_allowed_globals(), dumped from each
 * installed torch (sorted, for bsearch) */
static const char *const allowed_2_15[] = { /* 144 */
    "_codecs.encode", "builtins.bytearray", "builtins.complex", "builtins.set",
    "collections.Counter", "collections.OrderedDict", "torch.BFloat16Storage",
    "torch.BFloat16Tensor", "torch.BoolStorage", "torch.BoolTensor", "torch.ByteStorage",
    "torch.ByteTensor", "torch.CharStorage", "torch.CharTensor", "torch.ComplexDoubleStorage",
    "torch.ComplexFloatStorage", "torch.DoubleStorage", "torch.DoubleTensor",
    "torch.FloatStorage", "torch.FloatTensor", "torch.HalfStorage", "torch.HalfTensor",
    "torch.IntStorage", "torch.IntTensor", "torch.LongStorage", "torch.LongTensor",
    "torch.QInt32Storage", "torch.QInt8Storage", "torch.QUInt2x4Storage",
    "torch.QUInt4x2Storage", "torch.QUInt8Storage", "torch.ShortStorage", "torch.ShortTensor",
    "torch.Size", "torch.Tensor", "torch._tensor._rebuild_from_type_v2",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor",
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_wrapper_subclass", "torch.bcomplex32", "torch.bfloat16",
    "torch.bits16", "torch.bits1x8", "torch.bits2x4", "torch.bits4x2", "torch.bits8",
    "torch.bool", "torch.complex128", "torch.complex32", "torch.complex64",
    "torch.cuda.BFloat16Storage", "torch.cuda.BFloat16Tensor", "torch.cuda.BoolStorage",
    "torch.cuda.BoolTensor", "torch.cuda.ByteStorage", "torch.cuda.ByteTensor",
    "torch.cuda.CharStorage", "torch.cuda.CharTensor", "torch.cuda.ComplexDoubleStorage",
    "torch.cuda.ComplexFloatStorage", "torch.cuda.DoubleStorage", "torch.cuda.DoubleTensor",
    "torch.cuda.FloatStorage", "torch.cuda.FloatTensor", "torch.cuda.HalfStorage",
    "torch.cuda.HalfTensor", "torch.cuda.IntStorage", "torch.cuda.IntTensor",
    "torch.cuda.LongStorage", "torch.cuda.LongTensor", "torch.cuda.ShortStorage",
    "torch.cuda.ShortTensor", "torch.cuda.sparse.BFloat16Tensor",
    "torch.cuda.sparse.ByteTensor", "torch.cuda.sparse.CharTensor",
    "torch.cuda.sparse.DoubleTensor", "torch.cuda.sparse.FloatTensor",
    "torch.cuda.sparse.HalfTensor", "torch.cuda.sparse.IntTensor",
    "torch.cuda.sparse.LongTensor", "torch.cuda.sparse.ShortTensor", "torch.device",
    "torch.float16", "torch.float32", "torch.float4_e2m1fn_x2", "torch.float64",
    "torch.float8_e4m3fn", "torch.float8_e4m3fnuz", "torch.float8_e5m2",
    "torch.float8_e5m2fnuz", "torch.float8_e8m0fnu", "torch.int1", "torch.int16", "torch.int2",
    "torch.int3", "torch.int32", "torch.int4", "torch.int5", "torch.int6", "torch.int64",
    "torch.int7", "torch.int8", "torch.nn.parameter.Parameter", "torch.per_channel_affine",
    "torch.per_channel_affine_float_qparams", "torch.per_channel_symmetric",
    "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.qint32", "torch.qint8",
    "torch.quint2x4", "torch.quint4x2", "torch.quint8", "torch.serialization._get_layout",
    "torch.sparse.BFloat16Tensor", "torch.sparse.ByteTensor", "torch.sparse.CharTensor",
    "torch.sparse.DoubleTensor", "torch.sparse.FloatTensor", "torch.sparse.HalfTensor",
    "torch.sparse.IntTensor", "torch.sparse.LongTensor", "torch.sparse.ShortTensor",
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage", "torch.uint1", "torch.uint16",
    "torch.uint2", "torch.uint3", "torch.uint32", "torch.uint4", "torch.uint5", "torch.uint6",
    "torch.uint64", "torch.uint7", "torch.uint8",
};
static const char *const allowed_1_13[] = { /* 90 */
    "collections.OrderedDict", "torch.BFloat16Storage", "torch.BFloat16Tensor",
    "torch.BoolStorage", "torch.BoolTensor", "torch.ByteStorage", "torch.ByteTensor",
    "torch.CharStorage", "torch.CharTensor", "torch.ComplexDoubleStorage",
    "torch.ComplexFloatStorage", "torch.DoubleStorage", "torch.DoubleTensor",
    "torch.FloatStorage", "torch.FloatTensor", "torch.HalfStorage", "torch.HalfTensor",
    "torch.IntStorage", "torch.IntTensor", "torch.LongStorage", "torch.LongTensor",
    "torch.QInt32Storage", "torch.QInt8Storage", "torch.QUInt2x4Storage",
    "torch.QUInt4x2Storage", "torch.QUInt8Storage", "torch.ShortStorage", "torch.ShortTensor",
    "torch.Size", "torch.Tensor", "torch._utils._rebuild_meta_tensor_no_storage",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_sparse_csr_tensor",
    "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2", "torch.complex128", "torch.complex32", "torch.complex64",
    "torch.cuda.BFloat16Storage", "torch.cuda.BFloat16Tensor", "torch.cuda.BoolStorage",
    "torch.cuda.BoolTensor", "torch.cuda.ByteStorage", "torch.cuda.ByteTensor",
    "torch.cuda.CharStorage", "torch.cuda.CharTensor", "torch.cuda.ComplexDoubleStorage",
    "torch.cuda.ComplexFloatStorage", "torch.cuda.DoubleStorage", "torch.cuda.DoubleTensor",
    "torch.cuda.FloatStorage", "torch.cuda.FloatTensor", "torch.cuda.HalfStorage",
    "torch.cuda.HalfTensor", "torch.cuda.IntStorage", "torch.cuda.IntTensor",
    "torch.cuda.LongStorage", "torch.cuda.LongTensor", "torch.cuda.ShortStorage",
    "torch.cuda.ShortTensor", "torch.cuda.sparse.BFloat16Tensor",
    "torch.cuda.sparse.ByteTensor", "torch.cuda.sparse.CharTensor",
    "torch.cuda.sparse.DoubleTensor", "torch.cuda.sparse.FloatTensor",
    "torch.cuda.sparse.HalfTensor", "torch.cuda.sparse.IntTensor",
    "torch.cuda.sparse.LongTensor", "torch.cuda.sparse.ShortTensor", "torch.float16",
    "torch.float32", "torch.float64", "torch.int16", "torch.int32", "torch.int64", "torch.int8",
    "torch.nn.parameter.Parameter", "torch.serialization._get_layout",
    "torch.sparse.BFloat16Tensor", "torch.sparse.ByteTensor", "torch.sparse.CharTensor",
    "torch.sparse.DoubleTensor", "torch.sparse.FloatTensor", "torch.sparse.HalfTensor",
    "torch.sparse.IntTensor", "torch.sparse.LongTensor", "torch.sparse.ShortTensor",
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
};

/* registered by a plain `import torch` in 2.15 (torch.serialization.get_safe_globals()) */
static const char *const preregistered_2_15[] = {
    "torch.distributed._mesh_layout._FlatLayout", "torch.distributed._mesh_layout._MeshLayout",
};

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

bool ckpt_wo_allowed(ckpt_wo_torch t, const char *q)
{
    const char *const *tab = t == CKPT_WO_1_13 ? allowed_1_13 : allowed_2_15;
    size_t n = t == CKPT_WO_1_13 ? sizeof allowed_1_13 / sizeof *allowed_1_13
                                 : sizeof allowed_2_15 / sizeof *allowed_2_15;
    if (bsearch(&q, tab, n, sizeof *tab, cmp_name))
        return true;
    if (t == CKPT_WO_2_15)
        for (size_t i = 0; i < sizeof preregistered_2_15 / sizeof *preregistered_2_15; i++)
            if (strcmp(q, preregistered_2_15[i]) == 0)
                return true;
    return false;
}

size_t ckpt_wo_allowed_count(ckpt_wo_torch t)
{
    return t == CKPT_WO_1_13 ? sizeof allowed_1_13 / sizeof *allowed_1_13
                             : sizeof allowed_2_15 / sizeof *allowed_2_15;
}

bool ckpt_wo_blocked(ckpt_wo_torch t, const char *module)
{
    /* _blocklisted_modules (2.15): checked before any allow-list, never admitted */
    static const char *const blocked[] = {"sys", "os", "posix", "nt"};
    if (t == CKPT_WO_1_13)
        return false;
    for (size_t i = 0; i < sizeof blocked / sizeof *blocked; i++)
        if (strcmp(module, blocked[i]) == 0)
            return true;
    return false;
}

/* ---- value types ------------------------------------------------------------ */

enum {
    V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_BYTES, V_TUPLE, V_LIST, V_DICT, V_ODICT,
    V_COUNTER, V_SET, V_TENSOR, V_PARAM, V_STORAGE, V_GLOBAL, V_OTHER
};

/* Tuples keep their items up to this length: enough for a persistent id. */
#define TUPLE_KEPT 8

typedef struct wv {
    uint8_t kind;
    uint8_t big;    /* INT: does not fit in int64 */
    uint32_t n;     /* STR: length; TUPLE: items; INT from LONG1: its byte count */
    union {
        int64_t i;             /* INT */
        const uint8_t *s;      /* STR: its UTF-8 in the pickle */
        const char *g;         /* GLOBAL: "module.name" (arena) */
        const struct wv *items; /* TUPLE of at most TUPLE_KEPT items, else NULL */
    } u;
    const uint8_t *long_bytes; /* INT from LONG1: its bytes in the pickle */
} wv;

/* what type(v) prints as, for torch's messages */
static const char *type_repr(const wv *v)
{
    static const char *const names[] = {
        "<class 'NoneType'>", "<class 'bool'>", "<class 'int'>", "<class 'float'>",
        "<class 'str'>", "<class 'bytes'>", "<class 'tuple'>", "<class 'list'>",
        "<class 'dict'>", "<class 'collections.OrderedDict'>", "<class 'collections.Counter'>",
        "<class 'set'>", "<class 'torch.Tensor'>", "<class 'torch.nn.parameter.Parameter'>",
        "<class 'torch.storage.TypedStorage'>", "<class 'type'>", "<class 'object'>"};
    return names[v->kind];
}

/* the name Python's TypeError uses ("'tuple' object does not support ...") */
static const char *py_name(const wv *v)
{
    static const char *const names[] = {"NoneType", "bool", "int", "float", "str", "bytes",
                                        "tuple", "list", "dict", "OrderedDict", "Counter",
                                        "set", "Tensor", "Parameter", "TypedStorage", "type",
                                        "object"};
    return names[v->kind];
}

/* repr(v), as far as a type walk knows it (contents are not followed) */
static void value_repr(const wv *v, char *buf, size_t cap)
{
    switch (v->kind) {
    case V_NONE: snprintf(buf, cap, "None"); break;
    case V_BOOL: snprintf(buf, cap, "%s", v->u.i ? "True" : "False"); break;
    case V_INT:
        if (v->big)
            snprintf(buf, cap, "<int>");
        else
            snprintf(buf, cap, "%lld", (long long)v->u.i);
        break;
    case V_STR: snprintf(buf, cap, "'%.*s'", (int)(v->n > 200 ? 200 : v->n), (const char *)v->u.s); break;
    case V_GLOBAL: snprintf(buf, cap, "<class '%s'>", v->u.g); break;
    case V_TUPLE: snprintf(buf, cap, v->n ? "(...)" : "()"); break;
    case V_LIST: snprintf(buf, cap, "[...]"); break;
    case V_DICT: snprintf(buf, cap, "{...}"); break;
    case V_SET: snprintf(buf, cap, "{...}"); break;
    default: snprintf(buf, cap, "<%s object>", py_name(v)); break;
    }
}

/* What calling (REDUCE) or instantiating (NEWOBJ) an allowed global gives,
 * where that decides a later check; OTHER otherwise. */
static uint8_t call_result(const char *g)
{
    static const struct { const char *name; uint8_t kind; } results[] = {
        {"collections.OrderedDict", V_ODICT}, {"collections.Counter", V_COUNTER},
        {"builtins.set", V_SET}, {"_codecs.encode", V_BYTES}, {"torch.Tensor", V_TENSOR},
        {"torch._utils._rebuild_tensor", V_TENSOR}, {"torch._utils._rebuild_tensor_v2", V_TENSOR},
        {"torch._utils._rebuild_tensor_v3", V_TENSOR}, {"torch._utils._rebuild_qtensor", V_TENSOR},
        {"torch._utils._rebuild_meta_tensor_no_storage", V_TENSOR},
        {"torch._utils._rebuild_parameter", V_PARAM},
        {"torch._utils._rebuild_parameter_with_state", V_PARAM},
        {"torch.nn.parameter.Parameter", V_PARAM},
    };
    for (size_t i = 0; i < sizeof results / sizeof *results; i++)
        if (strcmp(g, results[i].name) == 0)
            return results[i].kind;
    return V_OTHER;
}

/* ---- a map from 64-bit keys to values (the memo; the storages met) ---------- */

typedef struct wmap {
    uint64_t *keys; /* key + 1; 0 = empty */
    wv *vals;
    size_t cap, len;
} wmap;

static uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static wv *map_find(const wmap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    for (size_t i = mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == 0)
            return NULL;
        if (m->keys[i] == key + 1)
            return &m->vals[i];
    }
}

static int map_put(wmap *m, uint64_t key, const wv *v)
{
    if ((m->len + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        wmap n = {calloc(cap, sizeof *n.keys), calloc(cap, sizeof *n.vals), cap, 0};
        if (!n.keys || !n.vals) {
            free(n.keys);
            free(n.vals);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i])
                map_put(&n, m->keys[i] - 1, &m->vals[i]);
        free(m->keys);
        free(m->vals);
        *m = n;
    }
    size_t i = mix(key) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != key + 1)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        m->len++;
    m->keys[i] = key + 1;
    m->vals[i] = *v;
    return 0;
}

/* ---- the walk ------------------------------------------------------------------ */

typedef struct walk {
    const ckpt_wo_ctx *ctx;
    ckpt_wo_result *r;
    const uint8_t *buf;
    size_t len;
    ckpt_arena arena;
    wv *stack;
    size_t sp, cap;
    size_t *marks; /* the frame bases (torch's metastack) */
    size_t nmarks, mcap;
    size_t base;   /* where the current frame starts */
    wmap memo, seen;
    size_t memo_dropped; /* BINPUTs not kept (ctx->memo_fetched): counted for the limit */
    /* Tuple items live here, released whenever nothing reachable holds any
     * (no tuple with items on the stack, none kept in the memo): a pickle of
     * 1.7 M tensors holds one batch of them, not all (issue 26). */
    ckpt_arena scratch;
    bool scratch_pinned;  /* the memo keeps a tuple with items: never released */
    size_t scratch_retry; /* release tried again once scratch holds this much */
    int oom;
    wv pid_value; /* what persistent_load gave, when not a storage (tar loader) */
    bool has_pid_value;
} walk;

static bool v13(const walk *w) { return w->ctx->torch == CKPT_WO_1_13; }

/* Record where and why torch stops; returns 1 so callers can `return stop(...)`. */
static int stop(walk *w, ckpt_wo_stop kind, int op, uint64_t at, const char *exc,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int stop(walk *w, ckpt_wo_stop kind, int op, uint64_t at, const char *exc,
                const char *fmt, ...)
{
    ckpt_wo_result *r = w->r;
    r->stop = kind;
    r->opcode = op;
    r->offset = at;
    r->exception = exc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return 1;
}

/* the unpickler's own refusals: UnpicklingError in 2.15, RuntimeError in 1.13 */
static const char *wo_exc(const walk *w) { return v13(w) ? "RuntimeError" : "UnpicklingError"; }

static int push(walk *w, wv v)
{
    if (w->sp == w->cap) {
        if (w->cap >= w->ctx->limits[CKPT_LIMIT_STACK])
            return -1;
        size_t cap = w->cap ? w->cap * 2 : 256;
        wv *n = realloc(w->stack, cap * sizeof *n);
        if (!n)
            return w->oom = -1;
        w->stack = n;
        w->cap = cap;
    }
    w->stack[w->sp++] = v;
    return 0;
}

static wv mk(uint8_t kind) { return (wv){.kind = kind}; }

/* The GLOBAL's "module\nname\n" at P, mapped as 2.15 maps Python 2 names;
 * NULL (and *BAD) when the lines or their UTF-8 are broken. */
static const char *read_global(walk *w, size_t *p, int *bad, size_t *mlen_out)
{
    const uint8_t *b = w->buf;
    size_t at = *p;
    /* readline()[:-1]: without a newline the last byte is cut instead */
    const uint8_t *nl1 = memchr(b + at, '\n', w->len - at);
    size_t mlen = nl1 ? (size_t)(nl1 - (b + at)) : w->len - at ? w->len - at - 1 : 0;
    size_t nat = nl1 ? at + mlen + 1 : w->len;
    const uint8_t *nl2 = nat < w->len ? memchr(b + nat, '\n', w->len - nat) : NULL;
    size_t nlen = nl2 ? (size_t)(nl2 - (b + nat)) : w->len - nat ? w->len - nat - 1 : 0;
    *p = nl2 ? nat + nlen + 1 : w->len;
    (void)bad;
    if (!ckpt_utf8_valid(b + at, mlen) || !ckpt_utf8_valid(b + nat, nlen)) {
        *bad = 2;
        return NULL;
    }
    const char *mod = ckpt_arena_strndup(&w->arena, (const char *)b + at, mlen);
    const char *name = ckpt_arena_strndup(&w->arena, (const char *)b + nat, nlen);
    if (!mod || !name) {
        w->oom = -1;
        return NULL;
    }
    if (!v13(w)) {
        /* torch._utils.NAME_MAPPING, then IMPORT_MAPPING (2.15 only) */
        static const char *const names[][4] = {
            {"__builtin__", "xrange", "builtins", "range"},
            {"__builtin__", "reduce", "functools", "reduce"},
            {"__builtin__", "intern", "sys", "intern"},
            {"__builtin__", "unichr", "builtins", "chr"},
            {"__builtin__", "unicode", "builtins", "str"},
            {"__builtin__", "long", "builtins", "int"},
            {"itertools", "izip", "builtins", "zip"},
            {"itertools", "imap", "builtins", "map"},
            {"itertools", "ifilter", "builtins", "filter"},
            {"itertools", "ifilterfalse", "itertools", "filterfalse"},
            {"itertools", "izip_longest", "itertools", "zip_longest"},
            {"UserDict", "IterableUserDict", "collections", "UserDict"},
            {"UserList", "UserList", "collections", "UserList"},
            {"UserString", "UserString", "collections", "UserString"},
            {"__builtin__", "basestring", "builtins", "str"},
            {"exceptions", "StandardError", "builtins", "Exception"},
            {"UserDict", "UserDict", "collections", "UserDict"},
        };
        static const char *const mods[][2] = {
            {"__builtin__", "builtins"}, {"copy_reg", "copyreg"}, {"Queue", "queue"},
            {"repr", "reprlib"}, {"_abcoll", "collections.abc"}, {"UserDict", "collections"},
            {"UserList", "collections"}, {"UserString", "collections"}, {"whichdb", "dbm"},
            {"StringIO", "io"}, {"cStringIO", "io"},
        };
        int mapped = 0;
        for (size_t i = 0; i < sizeof names / sizeof *names && !mapped; i++)
            if (strcmp(mod, names[i][0]) == 0 && strcmp(name, names[i][1]) == 0) {
                mod = names[i][2];
                name = names[i][3];
                mapped = 1;
            }
        for (size_t i = 0; i < sizeof mods / sizeof *mods && !mapped; i++)
            if (strcmp(mod, mods[i][0]) == 0) {
                mod = mods[i][1];
                mapped = 1;
            }
    }
    size_t ml = strlen(mod), nl = strlen(name);
    char *q = ckpt_arena_alloc(&w->arena, ml + nl + 2);
    if (!q) {
        w->oom = -1;
        return NULL;
    }
    memcpy(q, mod, ml);
    q[ml] = '.';
    memcpy(q + ml + 1, name, nl + 1);
    *mlen_out = ml;
    return q;
}

/* GLOBAL Q: 0 when admitted, 1 when torch stops at it. */
static int check_global(walk *w, const char *q, size_t mlen, uint64_t at)
{
    char mod[256];
    snprintf(mod, sizeof mod, "%.*s", (int)(mlen < 255 ? mlen : 255), q);
    ckpt_wo_result *r = w->r;
    if (ckpt_wo_blocked(w->ctx->torch, mod)) {
        snprintf(r->global, sizeof r->global, "%s", q);
        r->blocked = true;
        return stop(w, CKPT_WO_GLOBAL, CKPT_OP_GLOBAL, at, "UnpicklingError",
                    "Trying to load unsupported GLOBAL %s whose module %s is blocked.", q, mod);
    }
    if (ckpt_wo_allowed(w->ctx->torch, q))
        return 0;
    snprintf(r->global, sizeof r->global, "%s", q);
    if (v13(w))
        return stop(w, CKPT_WO_GLOBAL, CKPT_OP_GLOBAL, at, "RuntimeError", "Unsupported class %s",
                    q);
    static const char *const dtensor[] = {
        "torch.distributed.device_mesh.DeviceMesh",
        "torch.distributed.tensor._dtensor_spec.DTensorSpec",
        "torch.distributed.tensor._dtensor_spec.TensorMeta", "torch.distributed.tensor.DTensor",
        "torch.distributed.tensor.placement_types.Partial",
        "torch.distributed.tensor.placement_types.Replicate",
        "torch.distributed.tensor.placement_types.Shard"};
    for (size_t i = 0; i < sizeof dtensor / sizeof *dtensor; i++)
        if (strcmp(q, dtensor[i]) == 0)
            return stop(w, CKPT_WO_GLOBAL, CKPT_OP_GLOBAL, at, "UnpicklingError",
                        "``torch.distributed.tensor`` must be imported to load DTensors");
    /* torch prints builtins.X as X */
    const char *shown = strncmp(q, "builtins.", 9) == 0 ? q + 9 : q;
    return stop(w, CKPT_WO_GLOBAL, CKPT_OP_GLOBAL, at, "UnpicklingError",
                "Unsupported global: GLOBAL %s was not an allowed global by default. Please use "
                "`torch.serialization.add_safe_globals([%s])` or the "
                "`torch.serialization.safe_globals([%s])` context manager to allowlist this "
                "global if you trust this class/function.",
                shown, shown, shown);
}

static int is_str(const wv *v, const char *s)
{
    return v->kind == V_STR && v->n == strlen(s) && memcmp(v->u.s, s, v->n) == 0;
}

/* Python's int(S) for a str: the canonical decimal into OUT, or false with
 * the ValueError text in OUT. */
static bool py_int(const uint8_t *s, size_t n, char *out, size_t cap)
{
    const uint8_t *e = s + n;
    while (s < e && (*s == ' ' || (*s >= 9 && *s <= 13) || (*s >= 0x1c && *s <= 0x1f)))
        s++;
    while (e > s && (e[-1] == ' ' || (e[-1] >= 9 && e[-1] <= 13) || (e[-1] >= 0x1c && e[-1] <= 0x1f)))
        e--;
    bool neg = s < e && *s == '-';
    const uint8_t *d = s < e && (*s == '-' || *s == '+') ? s + 1 : s;
    size_t nd = 0, o = 0;
    bool ok = d < e;
    for (const uint8_t *c = d; ok && c < e; c++) {
        if (*c == '_')
            ok = c > d && c + 1 < e && c[-1] != '_' && c[1] != '_';
        else if (*c >= '0' && *c <= '9')
            nd++;
        else
            ok = false;
    }
    if (!ok) {
        snprintf(out, cap, "invalid literal for int() with base 10: '%.*s'",
                 (int)(n > 200 ? 200 : n), (const char *)s);
        return false;
    }
    if (nd > 4300) {
        snprintf(out, cap, "Exceeds the limit (4300 digits) for integer string conversion: "
                 "value has %zu digits; use sys.set_int_max_str_digits() to increase the limit",
                 nd);
        return false;
    }
    if (neg)
        out[o++] = '-';
    for (const uint8_t *c = d; c < e && o + 1 < cap; c++)
        if (*c != '_' && !(*c == '0' && o == (size_t)neg && c + 1 < e))
            out[o++] = (char)*c;
    out[o] = 0;
    if (strcmp(out, "-0") == 0)
        strcpy(out, "0");
    return true;
}

/* 1.13's tar loader: the unpickler lets a non-tuple, non-int id through to
 * legacy_load's persistent_load, which returns
 * deserialized_objects[int(saved_id)] (a tuple: its first item, after
 * _check_container_source(*saved_id) when all(saved_id[1:])).  -1: not
 * decided here. */
static int tar_pid(walk *w, const wv *pid, uint64_t at)
{
    char key[4400];
    switch (pid->kind) {
    case V_INT:
        return -1; /* the unpickler refuses it (its check is inverted) */
    case V_TUPLE: {
        const wv *it = pid->u.items;
        if (pid->n > 0 && !it)
            return 0; /* longer than kept: not known here */
        if (pid->n > 0 && ( it[0].kind == V_OTHER || !is_str(&it[0], "storage")))
            return -1;
        bool all = true; /* all(saved_id[1:]), where the items are known */
        for (uint32_t i = 1; i < pid->n; i++) {
            const wv *x = &it[i];
            if (x->kind == V_NONE || ((x->kind == V_BOOL || x->kind == V_INT) && !x->big &&
                                      x->u.i == 0) ||
                ((x->kind == V_STR || x->kind == V_TUPLE) && x->n == 0))
                all = false;
            else if (x->kind != V_BOOL && x->kind != V_INT && x->kind != V_STR &&
                     x->kind != V_TUPLE && x->kind != V_GLOBAL && x->kind != V_TENSOR &&
                     x->kind != V_STORAGE)
                return 0; /* truth not known: let it by */
        }
        if (all && pid->n < 3) {
            static const char *const missing[] = {
                "3 required positional arguments: 'container_type', 'source_file', and "
                "'original_source'",
                "2 required positional arguments: 'source_file' and 'original_source'",
                "1 required positional argument: 'original_source'"};
            return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "TypeError",
                        "_check_container_source() missing %s", missing[pid->n]);
        }
        if (all && pid->n > 3)
            return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "TypeError",
                        "_check_container_source() takes 3 positional arguments but %u were "
                        "given", pid->n);
        if (pid->n > 0) {
            w->pid_value = it[0];
            w->has_pid_value = true;
        }
        return 0;
    }
    case V_BOOL:
        snprintf(key, sizeof key, "%d", pid->u.i != 0);
        break;
    case V_STR:
        if (!py_int(pid->u.s, pid->n, key, sizeof key))
            return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "ValueError", "%s", key);
        break;
    case V_NONE: case V_LIST: case V_DICT: case V_ODICT: case V_COUNTER: case V_SET:
    case V_GLOBAL:
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "TypeError",
                    "int() argument must be a string, a bytes-like object or a real number, "
                    "not '%s'", pid->kind == V_GLOBAL ? "type" : py_name(pid));
    default:
        return 0; /* a float, bytes, an object: its int() is not known here */
    }
    int found = w->ctx->tar_key(w->ctx->user, key);
    if (!found)
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "KeyError", "%s", key);
    w->pid_value = mk(found == 2 ? V_TENSOR : V_STORAGE);
    w->has_pid_value = true;
    return 0;
}

/* Record data/KEY exists but miniz will not extract it (no local header),
 * as torch's get_storage_from_record fails on it. */
static int bad_local(walk *w, uint64_t at, const char *key)
{
    return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "RuntimeError",
                "PytorchStreamReader failed reading file data/%s: invalid header or archive is "
                "corrupted%s", key, v13(w) ? "" : ". This is an internal miniz error. If you are "
                "seeing this error, there is a high likelihood that your checkpoint file is "
                "corrupted. This can happen if the checkpoint was not saved properly, was "
                "transferred incorrectly, or the file was modified after saving.");
}

/* BINPERSID on PID: the unpickler's checks, then the loader's persistent_load
 * (ctx->pid_fields: 5 in a zip, 6 in a legacy file, 0: the plain unpickler). */
static int check_pid(walk *w, const wv *pid, uint64_t at)
{
    char rep[256];
    if (pid->kind == V_OTHER)
        return 0;
    if (v13(w) && w->ctx->tar_key) {
        int rc = tar_pid(w, pid, at);
        if (rc >= 0)
            return rc;
    }
    if (pid->kind == V_INT && !v13(w) && w->ctx->pid_fields) /* the unpickler lets ints by */
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "AssertionError",
                    "saved_id must be a tuple, got int");
    if (pid->kind != V_TUPLE) {
        if (v13(w) && pid->kind != V_INT) /* 1.13's check lets these through to the loader */
            return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "AssertionError", "%s",
                        "persistent id is not a tuple");
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, wo_exc(w),
                    "persistent_load id must be tuple or int, but got %s", type_repr(pid));
    }
    const wv *it = pid->u.items;
    if (pid->n > 0 && it && it[0].kind != V_OTHER && !is_str(&it[0], "storage")) {
        if (v13(w)) {
            value_repr(&it[0], rep, sizeof rep);
            return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "RuntimeError",
                        "Only persistent_load of storage is allowed, but got %s", rep);
        }
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "UnpicklingError",
                    "Only persistent_load of storage is allowed, but got %s", type_repr(&it[0]));
    }
    size_t want = w->ctx->pid_fields;
    if (want == 0)
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "UnpicklingError",
                    "unsupported persistent id encountered");
    if (pid->n == 0)
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "IndexError",
                    "tuple index out of range");
    if (pid->n != want) {
        if (pid->n < want)
            return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "ValueError",
                        "not enough values to unpack (expected %zu, got %u)", want - 1,
                        pid->n - 1);
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "ValueError",
                    "too many values to unpack (expected %zu)", want - 1);
    }
    const wv *type = &it[1], *key = &it[2], *loc = &it[3], *numel = &it[4];
    uint64_t elsize = 0;
    if (type->kind == V_GLOBAL) {
        if (strcmp(type->u.g, "torch.storage.TypedStorage") == 0)
            return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "AttributeError",
                        "type object 'TypedStorage' has no usable 'dtype'");
        ckpt_dtype dt = ckpt_storage_type_dtype(type->u.g, NULL);
        if (dt != CKPT_DTYPE_UNKNOWN)
            elsize = ckpt_dtype_size(dt);
    } else if (type->kind != V_OTHER) {
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "AttributeError",
                    "'%s' object has no attribute 'dtype'", py_name(type));
    }
    if (loc->kind == V_STR && w->ctx->on_location) {
        char l[64];
        snprintf(l, sizeof l, "%.*s", (int)(loc->n < 63 ? loc->n : 63), (const char *)loc->u.s);
        w->ctx->on_location(w->ctx->user, l);
    }
    /* the record data/<key>: it must exist; 2.15 wants exactly numel * elsize
     * bytes the first time a key is loaded with a storage type */
    char k[128];
    if (key->kind == V_STR && key->n < sizeof k)
        snprintf(k, sizeof k, "%.*s", (int)key->n, (const char *)key->u.s);
    else if (key->kind == V_INT && !key->big)
        snprintf(k, sizeof k, "%lld", (long long)key->u.i);
    else
        return 0;
    /* get_storage_from_record takes the size as a C++ size_t */
    if (numel->kind == V_INT && (numel->big || numel->u.i < 0))
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "TypeError",
                    "get_storage_from_record(): incompatible function arguments");
    if (!w->ctx->record)
        return 0;
    uint64_t size;
    int there = w->ctx->record(w->ctx->user, k, &size);
    if (!there)
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "RuntimeError",
                    "PytorchStreamReader failed locating file data/%s: file not found", k);
    if (!w->ctx->check_size || !elsize || numel->kind != V_INT || numel->big || numel->u.i < 0)
        return there == 2 ? bad_local(w, at, k) : 0;
    uint64_t h = 1469598103934665603ULL; /* FNV-1a of key and type */
    for (const char *s = k; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    for (const char *s = type->u.g; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    if (map_find(&w->seen, h))
        return 0;
    wv none = mk(V_NONE);
    if (map_put(&w->seen, h, &none) < 0)
        return w->oom = -1;
    uint64_t nbytes;
    if (ckpt_mul_overflow((uint64_t)numel->u.i, elsize, &nbytes)) /* Python's int grows */
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "TypeError",
                    "get_storage_from_record(): incompatible function arguments");
    if (nbytes != size)
        return stop(w, CKPT_WO_STORAGE, CKPT_OP_BINPERSID, at, "RuntimeError",
                    "record size (%llu bytes) does not match expected size (%llu bytes = %llu "
                    "elements * 1 bytes/element) for dtype Byte",
                    (unsigned long long)size, (unsigned long long)nbytes,
                    (unsigned long long)nbytes);
    return there == 2 ? bad_local(w, at, k) : 0;
}

/* After the first stop: the globals further on that this torch refuses too,
 * read the way get_globals_in_pkl reads them (arguments skipped, no stack). */
static void tail_scan(walk *w, size_t p)
{
    static const signed char argbytes[256] = {
        [CKPT_OP_BININT] = 4, [CKPT_OP_BININT1] = 1, [CKPT_OP_BININT2] = 2,
        [CKPT_OP_BINFLOAT] = 8, [CKPT_OP_BINGET] = 1, [CKPT_OP_LONG_BINGET] = 4,
        [CKPT_OP_BINPUT] = 1, [CKPT_OP_LONG_BINPUT] = 4,
    };
    static const uint8_t noarg[] = {
        CKPT_OP_NEWOBJ, CKPT_OP_REDUCE, CKPT_OP_BUILD, CKPT_OP_APPEND, CKPT_OP_APPENDS,
        CKPT_OP_SETITEM, CKPT_OP_SETITEMS, CKPT_OP_MARK, CKPT_OP_TUPLE, CKPT_OP_TUPLE1,
        CKPT_OP_TUPLE2, CKPT_OP_TUPLE3, CKPT_OP_NONE, CKPT_OP_NEWTRUE, CKPT_OP_NEWFALSE,
        CKPT_OP_EMPTY_TUPLE, CKPT_OP_EMPTY_LIST, CKPT_OP_EMPTY_DICT, CKPT_OP_EMPTY_SET,
        CKPT_OP_BINPERSID,
    };
    while (p < w->len && w->ctx->on_refused) {
        uint8_t op = w->buf[p++];
        if (op == CKPT_OP_GLOBAL) {
            int bad = 0;
            size_t mlen;
            const char *q = read_global(w, &p, &bad, &mlen);
            if (!q)
                return;
            char mod[256];
            snprintf(mod, sizeof mod, "%.*s", (int)(mlen < 255 ? mlen : 255), q);
            bool blocked = ckpt_wo_blocked(w->ctx->torch, mod);
            if (blocked || !ckpt_wo_allowed(w->ctx->torch, q))
                w->ctx->on_refused(w->ctx->user, q, blocked);
        } else if (op == CKPT_OP_BINUNICODE || op == CKPT_OP_SHORT_BINSTRING ||
                   op == CKPT_OP_LONG1) {
            size_t n;
            if (op == CKPT_OP_BINUNICODE) {
                if (w->len - p < 4)
                    return;
                n = (size_t)w->buf[p] | (size_t)w->buf[p + 1] << 8 | (size_t)w->buf[p + 2] << 16 |
                    (size_t)w->buf[p + 3] << 24;
                p += 4;
            } else {
                if (p >= w->len)
                    return;
                n = w->buf[p++];
            }
            if (w->len - p < n)
                return;
            p += n;
        } else if (op == CKPT_OP_PROTO) {
            p++;
        } else if (argbytes[op] || memchr(noarg, op, sizeof noarg)) {
            if (op == CKPT_OP_BINFLOAT && v13(w))
                return;
            p += (size_t)argbytes[op];
        } else {
            return; /* STOP, or an opcode it does not know */
        }
    }
}

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Pop the current frame into a tuple value (torch's pop_mark + tuple()). */
static int pop_mark(walk *w, size_t *count)
{
    if (w->nmarks == 0)
        return -1;
    *count = w->sp - w->base;
    w->sp = w->base;
    w->base = --w->nmarks ? w->marks[w->nmarks - 1] : 0;
    return 0;
}

static int make_tuple(walk *w, size_t first, size_t n, wv *out)
{
    *out = mk(V_TUPLE);
    out->n = (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n);
    if (n <= TUPLE_KEPT && n) {
        /* the reader's budget (pickle/read.c): the pickle and what it makes
         * within max(--max-pickle-bytes, 1 GiB), so that 10^8 nested TUPLE1s stop */
        uint64_t cap = w->ctx->limits[CKPT_LIMIT_PICKLE_BYTES];
        cap = cap < (1ull << 30) ? 1ull << 30 : cap;
        if (w->len > cap || w->arena.used_total + w->scratch.used_total > cap - w->len)
            return -1;
        wv *items = ckpt_arena_alloc(&w->scratch, n * sizeof *items);
        if (!items)
            return w->oom = -1;
        memcpy(items, &w->stack[first], n * sizeof *items);
        out->u.items = items;
    }
    return 0;
}

/* After a SETITEM(S) or APPEND(S): drop every tuple's items when nothing
 * reachable holds one.  Tried when scratch has grown past a threshold that
 * doubles after each failed try, so the stack is scanned O(log) times. */
static void scratch_release(walk *w)
{
    if (w->scratch_pinned || w->has_pid_value || w->scratch.used_total < w->scratch_retry)
        return;
    for (size_t i = 0; i < w->sp; i++)
        if (w->stack[i].kind == V_TUPLE && w->stack[i].u.items) {
            w->scratch_retry = w->scratch.used_total * 2;
            return;
        }
    ckpt_arena_release(&w->scratch);
    ckpt_arena_init(&w->scratch);
    w->scratch_retry = 1u << 20;
}

static bool memo_wanted(const walk *w, uint32_t idx)
{
    const uint32_t *k = w->ctx->memo_fetched;
    if (!k)
        return true;
    size_t lo = 0, hi = w->ctx->nmemo_fetched;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (k[mid] == idx)
            return true;
        if (k[mid] < idx)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* The walk proper: 0 when it reached STOP (r->stop stays OK), 1 when torch
 * stops earlier, -1 on out of memory or a limit. */
static int run(walk *w)
{
    const uint8_t *b = w->buf;
    size_t p = 0;
    bool has_binfloat = !v13(w);
    char rep[256];
#define NEED(k) ((size_t)(w->sp - w->base) >= (size_t)(k))
#define UNDERFLOW() stop(w, CKPT_WO_OPCODE, op, at, "IndexError", "pop from empty list")
#define TRUNC(n)                                                                        \
    do {                                                                                \
        if (w->len - p < (size_t)(n))                                                   \
            return stop(w, CKPT_WO_OPCODE, op, at, "EOFError",                          \
                        "the pickle data was truncated (in %s)", ckpt_pickle_op_name(op)); \
    } while (0)
    for (;;) {
        if (p >= w->len)
            return stop(w, CKPT_WO_OPCODE, -1, p, "EOFError", "the pickle ends before STOP");
        uint64_t at = p;
        uint8_t op = b[p++];
        wv v = mk(V_OTHER);
        switch (op) {
        case CKPT_OP_GLOBAL: {
            int bad = 0;
            size_t mlen = 0;
            const char *q = read_global(w, &p, &bad, &mlen);
            if (!q) {
                if (w->oom)
                    return -1;
                return stop(w, CKPT_WO_OPCODE, op, at, bad == 2 ? "UnicodeDecodeError" : "EOFError",
                            bad == 2 ? "the GLOBAL's name is not UTF-8"
                                     : "the pickle data was truncated (in GLOBAL)");
            }
            if (check_global(w, q, mlen, at)) {
                tail_scan(w, p);
                return 1;
            }
            v = mk(V_GLOBAL);
            v.u.g = q;
            break;
        }
        case CKPT_OP_REDUCE: case CKPT_OP_NEWOBJ: {
            if (!NEED(2))
                return UNDERFLOW();
            w->sp--; /* the arguments */
            wv *f = &w->stack[w->sp - 1];
            if (f->kind == V_OTHER)
                continue;
            if (op == CKPT_OP_REDUCE) {
                if (f->kind != V_GLOBAL) {
                    value_repr(f, rep, sizeof rep);
                    stop(w, CKPT_WO_VALUE, op, at, wo_exc(w),
                         "Trying to call reduce for unrecognized function %s", rep);
                    tail_scan(w, p);
                    return 1;
                }
                *f = mk(call_result(f->u.g));
                continue;
            }
            /* NEWOBJ: 2.15 any allowed class, 1.13 only Parameter */
            if (f->kind != V_GLOBAL ||
                (v13(w) && strcmp(f->u.g, "torch.nn.parameter.Parameter") != 0)) {
                value_repr(f, rep, sizeof rep);
                if (v13(w))
                    stop(w, CKPT_WO_VALUE, op, at, "RuntimeError",
                         "Trying to instantiate unsupported class %s", rep);
                else
                    stop(w, CKPT_WO_VALUE, op, at, "UnpicklingError",
                         "Can only create new object for nn.Parameter or classes allowlisted via "
                         "`add_safe_globals` but got %s", rep);
                tail_scan(w, p);
                return 1;
            }
            *f = mk(call_result(f->u.g));
            continue;
        }
        case CKPT_OP_BUILD: {
            if (!NEED(2))
                return UNDERFLOW();
            w->sp--;
            const wv *inst = &w->stack[w->sp - 1];
            uint8_t k = inst->kind;
            bool ok = k == V_TENSOR || k == V_PARAM || k == V_ODICT || k == V_OTHER ||
                      (!v13(w) && (k == V_COUNTER || k == V_SET || k == V_STORAGE));
            if (!ok) {
                if (v13(w))
                    stop(w, CKPT_WO_VALUE, op, at, "RuntimeError",
                         "Can only build Tensor, parameter or dict objects, but got %s",
                         type_repr(inst));
                else
                    stop(w, CKPT_WO_VALUE, op, at, "UnpicklingError",
                         "Can only build Tensor, Parameter, OrderedDict or types allowlisted via "
                         "`add_safe_globals`, but got %s", type_repr(inst));
                tail_scan(w, p);
                return 1;
            }
            continue;
        }
        case CKPT_OP_APPEND: case CKPT_OP_APPENDS: {
            if (op == CKPT_OP_APPEND && !NEED(2))
                return UNDERFLOW();
            size_t n;
            if (op == CKPT_OP_APPEND)
                w->sp--;
            else if (pop_mark(w, &n) < 0)
                return UNDERFLOW();
            if (!NEED(1))
                return stop(w, CKPT_WO_OPCODE, op, at, "IndexError", "list index out of range");
            const wv *l = &w->stack[w->sp - 1];
            if (l->kind != V_LIST && l->kind != V_OTHER) {
                stop(w, CKPT_WO_VALUE, op, at, wo_exc(w), "Can only %s lists, but got %s",
                     op == CKPT_OP_APPEND ? "append to" : "extend", type_repr(l));
                tail_scan(w, p);
                return 1;
            }
            scratch_release(w);
            continue;
        }
        case CKPT_OP_SETITEM: case CKPT_OP_SETITEMS: {
            size_t n = 2;
            if (op == CKPT_OP_SETITEM) {
                if (!NEED(3))
                    return UNDERFLOW();
                w->sp -= 2;
            } else if (pop_mark(w, &n) < 0) {
                return UNDERFLOW();
            }
            if (!NEED(1))
                return stop(w, CKPT_WO_OPCODE, op, at, "IndexError", "list index out of range");
            const wv *d = &w->stack[w->sp - 1];
            uint8_t k = d->kind;
            if (!v13(w) && k != V_DICT && k != V_ODICT && k != V_COUNTER && k != V_OTHER) {
                stop(w, CKPT_WO_VALUE, op, at, "UnpicklingError",
                     "Can only %s for dict, collections.OrderedDict, collections.Counter, but got %s",
                     op == CKPT_OP_SETITEM ? "SETITEM" : "SETITEMS", type_repr(d));
                tail_scan(w, p);
                return 1;
            }
            /* 1.13 does not check: only what has no item assignment at all fails */
            if (v13(w) && n > 0 &&
                (k <= V_TUPLE || k == V_SET || k == V_GLOBAL)) {
                stop(w, CKPT_WO_VALUE, op, at, "TypeError",
                     "'%s' object does not support item assignment", py_name(d));
                tail_scan(w, p);
                return 1;
            }
            if (n % 2)
                return stop(w, CKPT_WO_OPCODE, op, at, "IndexError", "list index out of range");
            if (v13(w) && k == V_LIST) { /* a list takes int keys only; their range is not followed */
                for (size_t i = 0; i < n; i += 2)
                    if (w->stack[w->sp + i].kind == V_STR) {
                        stop(w, CKPT_WO_VALUE, op, at, "TypeError",
                             "list indices must be integers or slices, not str");
                        tail_scan(w, p);
                        return 1;
                    }
            }
            scratch_release(w);
            continue;
        }
        case CKPT_OP_MARK:
            if (w->nmarks == w->mcap) {
                if (w->mcap >= w->ctx->limits[CKPT_LIMIT_MARKS])
                    return -1;
                size_t cap = w->mcap ? w->mcap * 2 : 64;
                size_t *n = realloc(w->marks, cap * sizeof *n);
                if (!n)
                    return w->oom = -1;
                w->marks = n;
                w->mcap = cap;
            }
            w->marks[w->nmarks++] = w->base = w->sp;
            continue;
        case CKPT_OP_TUPLE: {
            size_t n;
            if (pop_mark(w, &n) < 0)
                return UNDERFLOW();
            if (make_tuple(w, w->sp, n, &v) < 0)
                return -1;
            break;
        }
        case CKPT_OP_TUPLE1: case CKPT_OP_TUPLE2: case CKPT_OP_TUPLE3: {
            size_t n = (size_t)(op - CKPT_OP_TUPLE1 + 1);
            if (!NEED(n))
                return stop(w, CKPT_WO_OPCODE, op, at, "IndexError", "list index out of range");
            w->sp -= n;
            if (make_tuple(w, w->sp, n, &v) < 0)
                return -1;
            break;
        }
        case CKPT_OP_NONE: v = mk(V_NONE); break;
        case CKPT_OP_NEWTRUE: case CKPT_OP_NEWFALSE:
            v = mk(V_BOOL);
            v.u.i = op == CKPT_OP_NEWTRUE;
            break;
        case CKPT_OP_EMPTY_TUPLE: v = mk(V_TUPLE); break;
        case CKPT_OP_EMPTY_LIST: v = mk(V_LIST); break;
        case CKPT_OP_EMPTY_DICT: v = mk(V_DICT); break;
        case CKPT_OP_EMPTY_SET: v = mk(V_SET); break;
        case CKPT_OP_BININT:
            TRUNC(4); v = mk(V_INT); v.u.i = (int32_t)rd_u32(b + p); p += 4; break;
        case CKPT_OP_BININT1: TRUNC(1); v = mk(V_INT); v.u.i = b[p]; p += 1; break;
        case CKPT_OP_BININT2:
            TRUNC(2); v = mk(V_INT); v.u.i = b[p] | b[p + 1] << 8; p += 2; break;
        case CKPT_OP_BINFLOAT:
            if (!has_binfloat)
                goto unsupported;
            TRUNC(8);
            v = mk(V_FLOAT);
            for (int k = 0; k < 8; k++) /* its bits, big-endian: the legacy protocol check */
                v.u.i = (int64_t)((uint64_t)v.u.i << 8 | b[p + k]);
            p += 8;
            break;
        case CKPT_OP_BINUNICODE: case CKPT_OP_SHORT_BINSTRING: {
            size_t n;
            if (op == CKPT_OP_BINUNICODE) {
                TRUNC(4);
                n = rd_u32(b + p);
                p += 4;
            } else {
                TRUNC(1);
                n = b[p++];
            }
            TRUNC(n);
            /* BINUNICODE: 'surrogatepass'; SHORT_BINSTRING: encoding='utf-8' (torch.load's) */
            if (!ckpt_utf8_valid(b + p, n))
                return stop(w, CKPT_WO_OPCODE, op, at, "UnicodeDecodeError",
                            "'utf-8' codec can't decode the string at byte %llu",
                            (unsigned long long)at);
            v = mk(V_STR);
            v.u.s = b + p;
            v.n = (uint32_t)n;
            p += n;
            break;
        }
        case CKPT_OP_LONG1: {
            TRUNC(1);
            size_t n = b[p++];
            TRUNC(n);
            v = mk(V_INT);
            v.long_bytes = b + p;
            v.n = (uint32_t)n;
            if (n <= 8) {
                uint64_t u = 0;
                for (size_t i = 0; i < n; i++)
                    u |= (uint64_t)b[p + i] << (8 * i);
                if (n && n < 8 && (b[p + n - 1] & 0x80))
                    u |= ~0ULL << (8 * n); /* sign-extend */
                v.u.i = (int64_t)u;
            } else {
                v.big = 1;
            }
            p += n;
            break;
        }
        case CKPT_OP_BINPERSID: {
            if (!NEED(1))
                return UNDERFLOW();
            wv pid = w->stack[--w->sp];
            w->has_pid_value = false;
            if (check_pid(w, &pid, at)) {
                if (w->oom)
                    return -1;
                tail_scan(w, p);
                return 1;
            }
            v = w->has_pid_value ? w->pid_value : mk(V_STORAGE);
            break;
        }
        case CKPT_OP_BINGET: case CKPT_OP_LONG_BINGET: {
            TRUNC(op == CKPT_OP_BINGET ? 1 : 4);
            uint32_t idx = op == CKPT_OP_BINGET ? b[p] : rd_u32(b + p);
            p += op == CKPT_OP_BINGET ? 1 : 4;
            wv *m = map_find(&w->memo, idx);
            if (!m)
                return stop(w, CKPT_WO_OPCODE, op, at, "KeyError", "%u", idx);
            v = *m;
            break;
        }
        case CKPT_OP_BINPUT: case CKPT_OP_LONG_BINPUT: {
            TRUNC(op == CKPT_OP_BINPUT ? 1 : 4);
            uint32_t idx = op == CKPT_OP_BINPUT ? b[p] : rd_u32(b + p);
            p += op == CKPT_OP_BINPUT ? 1 : 4;
            if (!NEED(1))
                return stop(w, CKPT_WO_OPCODE, op, at, "IndexError", "list index out of range");
            if (!map_find(&w->memo, idx) &&
                w->memo.len + w->memo_dropped >= w->ctx->limits[CKPT_LIMIT_MEMO])
                return -1;
            if (!memo_wanted(w, idx)) {
                w->memo_dropped++;
                continue;
            }
            if (w->stack[w->sp - 1].kind == V_TUPLE && w->stack[w->sp - 1].u.items)
                w->scratch_pinned = true;
            if (map_put(&w->memo, idx, &w->stack[w->sp - 1]) < 0)
                return w->oom = -1;
            continue;
        }
        case CKPT_OP_PROTO: TRUNC(1); p++; continue;
        case CKPT_OP_STOP:
            if (!NEED(1))
                return UNDERFLOW();
            w->r->top_kind = w->stack[w->sp - 1].kind == V_INT     ? 1
                             : w->stack[w->sp - 1].kind == V_FLOAT ? 2
                                                                   : 0;
            w->r->top_int = w->stack[w->sp - 1].u.i;
            w->r->top_long = w->stack[w->sp - 1].long_bytes;
            w->r->top_long_len = w->stack[w->sp - 1].long_bytes ? w->stack[w->sp - 1].n : 0;
            w->r->consumed = p;
            return 0;
        default:
        unsupported:
            return stop(w, CKPT_WO_OPCODE, op, at, wo_exc(w), "Unsupported operand %d", op);
        }
        if (push(w, v) < 0)
            return -1;
    }
#undef NEED
#undef UNDERFLOW
#undef TRUNC
}

int ckpt_wo_walk(const ckpt_wo_ctx *ctx, const uint8_t *buf, size_t len, ckpt_wo_result *r,
                 ckpt_error *err)
{
    memset(r, 0, sizeof *r);
    r->opcode = -1;
    walk w = {.ctx = ctx, .r = r, .buf = buf, .len = len, .scratch_retry = 1u << 20};
    ckpt_arena_init(&w.arena);
    ckpt_arena_init(&w.scratch);
    int rc = run(&w);
    ckpt_arena_release(&w.arena);
    ckpt_arena_release(&w.scratch);
    free(w.stack);
    free(w.marks);
    free(w.memo.keys);
    free(w.memo.vals);
    free(w.seen.keys);
    free(w.seen.vals);
    if (rc < 0) {
        memset(r, 0, sizeof *r);
        if (w.oom)
            return ckpt_oom(err);
        return ckpt_err(err, CKPT_ERR_LIMIT, "a pickle exceeds the limits on its stack, "
                        "MARKs, memo or memory (--max-pickle-bytes)");
    }
    return CKPT_OK;
}
