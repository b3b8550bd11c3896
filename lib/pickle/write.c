/*
 * pickle/write.c - emit a value tree as a protocol-2 pickle the way Python's
 * pickler (and so torch.save) does: containers memoized before their items,
 * repeated strings, globals and shared objects as BINGET, items in batches
 * of 1000, tensors as torch's rebuild calls with storages as persistent ids.
 * Interpreted content uses only the opcodes of torch 1.13's weights-only
 * unpickler (doc/pth-format.md sections 3.4, 5, 8).
 */
#include "pickle/pickle.h"

#include <stdlib.h>
#include <string.h>

#define BATCH 1000

/* What is memoized: a node (by pointer; the map memo), or a string or a
 * global (by text: the maps texts[], each entry a memo_text). */
typedef struct memo_entry {
    const void *key; /* node pointer */
    uint8_t tag;     /* always 0: a node */
} memo_entry;

/* A memoized text: no copy when it outlives the writer (a value's string,
 * a literal), and no name slots in its map (issue 26: 1.7 M keys). */
typedef struct memo_text {
    const char *s;
    uint32_t len, index;
} memo_text;

typedef struct writer {
    ckpt_arena *arena; /* where memo keys are kept */
    ckpt_error *err;
    ckpt_pickle_out *out;
    ckpt_map memo[1];  /* node -> memo index */
    ckpt_map texts[2]; /* 0 strings, 1 globals: text -> position in text[] */
    memo_text *text[2];
    size_t ntext[2], text_cap[2];
    ckpt_map fetched;  /* memo index -> position in out->fetched */
    size_t fetched_cap;
    uint32_t next_index;
    int64_t *new_key; /* per input storage: output key number, or -1 */
    bool legacy;      /* pre-1.6 persistent ids: a sixth item, None */
    bool keep_keys;   /* storages keep their own keys (an in-place rewrite) */
} writer;

/* ---- output buffer ---- */

static int put(writer *w, const void *p, size_t n)
{
    ckpt_pickle_out *o = w->out;
    if (n > SIZE_MAX - o->len)
        return ckpt_err(w->err, CKPT_ERR_NOMEM, "pickle too large");
    if (CKPT_GROW(o->buf, o->cap, o->len + n) < 0)
        return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
    memcpy(o->buf + o->len, p, n);
    o->len += n;
    return CKPT_OK;
}

static int op(writer *w, uint8_t code)
{
    return put(w, &code, 1);
}

static int op_le(writer *w, uint8_t code, uint64_t v, int n)
{
    uint8_t b[9];
    b[0] = code;
    for (int i = 0; i < n; i++)
        b[1 + i] = (uint8_t)(v >> (8 * i));
    return put(w, b, (size_t)n + 1);
}

/* ---- memo ---- */

/* PROBE's memo index in *INDEX, when it was memoized. */
static bool memo_find(writer *w, const memo_entry *probe, uint32_t *index)
{
    size_t i;
    bool found = ckpt_map_get_u64(&w->memo[0], (uintptr_t)probe->key, &i);
    *index = (uint32_t)i;
    return found;
}

typedef struct text_probe {
    const writer *w;
    int t;
    const char *s;
    size_t len;
} text_probe;

static bool same_text(const void *arg, size_t val)
{
    const text_probe *p = arg;
    const memo_text *e = &p->w->text[p->t][val];
    return e->len == p->len && memcmp(e->s, p->s, p->len) == 0;
}

/* The memo index of text S of table T (0 strings, 1 globals), if memoized. */
static bool text_find(writer *w, int t, const char *s, size_t n, uint32_t *index)
{
    text_probe p = {w, t, s, n};
    size_t v;
    if (!ckpt_map_get_hashed(&w->texts[t], ckpt_fnv1a(s, n), same_text, &p, &v))
        return false;
    *index = w->text[t][v].index;
    return true;
}

static int emit_get(writer *w, uint32_t index)
{
    ckpt_pickle_out *o = w->out;
    size_t at;
    if (!ckpt_map_get_u64(&w->fetched, index, &at)) {
        if (CKPT_GROW(o->fetched, w->fetched_cap, o->nfetched + 1) < 0 ||
            ckpt_map_set_u64(&w->fetched, index, o->nfetched) < 0)
            return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
        o->fetched[o->nfetched++] = index;
    }
    return index < 256 ? op_le(w, CKPT_OP_BINGET, index, 1)
                       : op_le(w, CKPT_OP_LONG_BINGET, index, 4);
}

/* Record PROBE under the next memo index (a node memoized again: its new
 * index) and emit BINPUT / LONG_BINPUT. */
static int memoize(writer *w, const memo_entry *probe)
{
    uint32_t index = w->next_index;
    if (ckpt_map_set_u64(&w->memo[0], (uintptr_t)probe->key, index) < 0)
        return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
    w->next_index++;
    return index < 256 ? op_le(w, CKPT_OP_BINPUT, index, 1)
                       : op_le(w, CKPT_OP_LONG_BINPUT, index, 4);
}

/* Record text S (which must outlive the writer) of table T under the next
 * memo index and emit its BINPUT. */
static int text_memoize(writer *w, int t, const char *s, size_t n)
{
    text_probe p = {w, t, s, n};
    if (CKPT_GROW(w->text[t], w->text_cap[t], w->ntext[t] + 1) < 0 ||
        ckpt_map_put_hashed(&w->texts[t], ckpt_fnv1a(s, n), same_text, &p, w->ntext[t], NULL) < 0)
        return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
    w->text[t][w->ntext[t]++] = (memo_text){s, (uint32_t)n, w->next_index};
    uint32_t index = w->next_index++;
    return index < 256 ? op_le(w, CKPT_OP_BINPUT, index, 1)
                       : op_le(w, CKPT_OP_LONG_BINPUT, index, 4);
}

/* BINPUT for an object nothing else refers to (the parts of a tensor made
 * outside a pickle): the index Python's pickler would give it, no entry kept. */
static int memo_skip(writer *w)
{
    uint32_t index = w->next_index++;
    return index < 256 ? op_le(w, CKPT_OP_BINPUT, index, 1)
                       : op_le(w, CKPT_OP_LONG_BINPUT, index, 4);
}

static memo_entry node_key(const void *p)
{
    return (memo_entry){.key = p, .tag = 0};
}

/* ---- scalars and strings ---- */

static int emit_int64(writer *w, int64_t v)
{
    if (v >= 0 && v < 256)
        return op_le(w, CKPT_OP_BININT1, (uint64_t)v, 1);
    if (v >= 0 && v < 65536)
        return op_le(w, CKPT_OP_BININT2, (uint64_t)v, 2);
    if (v >= INT32_MIN && v <= INT32_MAX)
        return op_le(w, CKPT_OP_BININT, (uint64_t)(uint32_t)(int32_t)v, 4);
    /* LONG1 with the shortest two's complement encoding, as Python's encode_long */
    uint8_t b[8];
    int n = 8;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)v >> (8 * i));
    while (n > 1 && ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) ||
                     (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
        n--;
    CKPT_FORWARD(op_le(w, CKPT_OP_LONG1, (uint64_t)n, 1));
    return put(w, b, (size_t)n);
}

static int emit_int(writer *w, const ckpt_value *v)
{
    if (!v->u.i.big)
        return emit_int64(w, v->u.i.v);
    if (v->u.i.nbytes < 256)
        CKPT_FORWARD(op_le(w, CKPT_OP_LONG1, v->u.i.nbytes, 1));
    else
        CKPT_FORWARD(op_le(w, CKPT_OP_LONG4, v->u.i.nbytes, 4));
    return put(w, v->u.i.bytes, v->u.i.nbytes);
}

static int emit_float(writer *w, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof(bits));
    uint8_t b[9] = {CKPT_OP_BINFLOAT};
    for (int i = 0; i < 8; i++)
        b[1 + i] = (uint8_t)(bits >> (56 - 8 * i));
    return put(w, b, sizeof(b));
}

/* BINUNICODE, memoized by content: repeated keys and tags become BINGET.
 * STABLE: S outlives the writer (a value's text, a literal); else it is
 * copied for the memo. */
static int emit_str2(writer *w, const char *s, size_t n, bool stable)
{
    uint32_t at;
    if (text_find(w, 0, s, n, &at))
        return emit_get(w, at);
    if (n > UINT32_MAX)
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "a string of %zu bytes", n);
    CKPT_FORWARD(op_le(w, CKPT_OP_BINUNICODE, n, 4));
    CKPT_FORWARD(put(w, s, n));
    if (!stable && !(s = ckpt_arena_strndup(w->arena, s, n)))
        return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
    return text_memoize(w, 0, s, n);
}

static int emit_str(writer *w, const char *s, size_t n)
{
    return emit_str2(w, s, n, true);
}

static int emit_cstr(writer *w, const char *s)
{
    return emit_str(w, s, strlen(s));
}

/* GLOBAL 'module\nname\n', memoized by name; protocol-2 names for builtins as
 * Python's pickler writes them (fix_imports). */
static int emit_global2(writer *w, const char *mod, size_t modlen, const char *name)
{
    char q[600];
    int qn = snprintf(q, sizeof(q), "%.*s\n%s\n", (int)modlen, mod, name);
    if (qn < 0 || (size_t)qn >= sizeof(q))
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "global name too long");
    uint32_t at;
    if (text_find(w, 1, q, (size_t)qn, &at))
        return emit_get(w, at);
    /* spelled as Python 3's protocol-2 pickler spells it (fix_imports:
     * builtins.range -> __builtin__.xrange), so that it reads back as itself */
    char mod0[300];
    if (modlen >= sizeof(mod0))
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "global name too long");
    memcpy(mod0, mod, modlen);
    mod0[modlen] = '\0';
    const char *m, *name2;
    if (!ckpt_globals_py2_name(mod0, name, &m, &name2))
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED,
                        "global '%s.%s' has no protocol-2 spelling that reads back as itself",
                        mod0, name);
    name = name2;
    size_t ml = strlen(m);
    CKPT_FORWARD(op(w, CKPT_OP_GLOBAL));
    CKPT_FORWARD(put(w, m, ml));
    CKPT_FORWARD(op(w, '\n'));
    CKPT_FORWARD(put(w, name, strlen(name)));
    CKPT_FORWARD(op(w, '\n'));
    /* the memo entry must outlive this frame: keep its text in the arena */
    char *keep = ckpt_arena_strndup(w->arena, q, (size_t)qn);
    if (!keep)
        return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
    return text_memoize(w, 1, keep, (size_t)qn);
}

static int emit_global(writer *w, const ckpt_value *g)
{
    return emit_global2(w, g->u.global.name, g->u.global.modlen,
                        g->u.global.name + g->u.global.modlen + 1);
}

static int emit_value(writer *w, const ckpt_value *v);

/* ---- containers ---- */

static int emit_appends(writer *w, const ckpt_vec *items)
{
    for (size_t i = 0; i < items->len; i += BATCH) {
        size_t n = items->len - i < BATCH ? items->len - i : BATCH;
        if (n == 1) {
            CKPT_FORWARD(emit_value(w, items->items[i]));
            CKPT_FORWARD(op(w, CKPT_OP_APPEND));
            continue;
        }
        CKPT_FORWARD(op(w, CKPT_OP_MARK));
        for (size_t k = 0; k < n; k++)
            CKPT_FORWARD(emit_value(w, items->items[i + k]));
        CKPT_FORWARD(op(w, CKPT_OP_APPENDS));
    }
    return CKPT_OK;
}

static int emit_setitems(writer *w, const ckpt_vec *keys, const ckpt_vec *vals)
{
    for (size_t i = 0; i < keys->len; i += BATCH) {
        size_t n = keys->len - i < BATCH ? keys->len - i : BATCH;
        if (n == 1) {
            CKPT_FORWARD(emit_value(w, keys->items[i]));
            CKPT_FORWARD(emit_value(w, vals->items[i]));
            CKPT_FORWARD(op(w, CKPT_OP_SETITEM));
            continue;
        }
        CKPT_FORWARD(op(w, CKPT_OP_MARK));
        for (size_t k = 0; k < n; k++) {
            CKPT_FORWARD(emit_value(w, keys->items[i + k]));
            CKPT_FORWARD(emit_value(w, vals->items[i + k]));
        }
        CKPT_FORWARD(op(w, CKPT_OP_SETITEMS));
    }
    return CKPT_OK;
}

static int emit_tuple_items(writer *w, const ckpt_value *t)
{
    size_t n = t->u.seq.len;
    if (n == 0)
        return op(w, CKPT_OP_EMPTY_TUPLE);
    if (n > 3)
        CKPT_FORWARD(op(w, CKPT_OP_MARK));
    for (size_t i = 0; i < n; i++)
        CKPT_FORWARD(emit_value(w, t->u.seq.items[i]));
    if (n > 3)
        return op(w, CKPT_OP_TUPLE);
    return op(w, (uint8_t)(CKPT_OP_TUPLE1 + n - 1));
}

static int emit_tuple(writer *w, const ckpt_value *v)
{
    if (v->u.seq.len == 0)
        return op(w, CKPT_OP_EMPTY_TUPLE); /* the empty tuple is not memoized */
    /* items are emitted before the tuple exists: a tuple reached again from
     * inside itself has no pickle form without Python's POP_MARK trick */
    if (v->flags & CKPT_VF_EMITTING)
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "a tuple that contains itself");
    ((ckpt_value *)v)->flags |= CKPT_VF_EMITTING;
    int rc = emit_tuple_items(w, v);
    ((ckpt_value *)v)->flags &= (uint8_t)~CKPT_VF_EMITTING;
    CKPT_FORWARD(rc);
    memo_entry k = node_key(v);
    return memoize(w, &k);
}

/* latin-1 text of BYTES as UTF-8, for protocol 2's _codecs.encode form */
static int emit_latin1(writer *w, const ckpt_value *v)
{
    size_t n = v->u.s.len;
    char *u = malloc(n * 2 + 1);
    if (!u)
        return ckpt_err(w->err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)v->u.s.s[i];
        if (c < 0x80) {
            u[k++] = (char)c;
        } else {
            u[k++] = (char)(0xc0 | (c >> 6));
            u[k++] = (char)(0x80 | (c & 0x3f));
        }
    }
    /* a fresh string each time, like Python's str(obj, 'latin1') */
    int rc = op_le(w, CKPT_OP_BINUNICODE, k, 4);
    if (!rc)
        rc = put(w, u, k);
    free(u);
    return rc;
}

static int emit_bytes(writer *w, const ckpt_value *v)
{
    bool bytearray = v->flags & CKPT_VF_BYTEARRAY;
    CKPT_FORWARD(emit_global2(w, bytearray ? "builtins" : (v->u.s.len ? "_codecs" : "builtins"),
                              bytearray ? 8 : (v->u.s.len ? 7 : 8),
                              bytearray ? "bytearray" : (v->u.s.len ? "encode" : "bytes")));
    if (v->u.s.len == 0 && !bytearray) {
        CKPT_FORWARD(op(w, CKPT_OP_EMPTY_TUPLE));
    } else {
        CKPT_FORWARD(emit_latin1(w, v));
        CKPT_FORWARD(emit_cstr(w, bytearray ? "latin-1" : "latin1"));
        CKPT_FORWARD(op(w, CKPT_OP_TUPLE2));
    }
    CKPT_FORWARD(op(w, CKPT_OP_REDUCE));
    memo_entry k = node_key(v);
    return memoize(w, &k);
}

/* ---- storages and tensors ---- */

/* ('storage', torch.<Type>Storage, key, location, numel) BINPERSID; REF the
 * reference's node (NULL: a tensor made outside a pickle) */
static int emit_storage_id(writer *w, const ckpt_storage *s, const char *ref_type,
                           ckpt_dtype ref_dtype, const ckpt_value *ref)
{
    int64_t *nk = &w->new_key[s->index];
    if (*nk < 0) {
        ckpt_pickle_out *o = w->out;
        *nk = (int64_t)o->norder;
        o->order[o->norder++] = s->index;
    }
    char key[32];
    snprintf(key, sizeof(key), "%lld", (long long)*nk);
    const char *kp = w->keep_keys && s->src_key ? s->src_key : key;
    /* a cast storage takes its new type; otherwise the reference's own */
    bool cast = s->dtype != s->src_dtype;
    const char *type = cast ? s->type_name : ref_type;
    bool untyped = strcmp(type, "UntypedStorage") == 0; /* its size counts bytes */
    size_t es = untyped ? 1 : ckpt_dtype_size(cast ? s->dtype : ref_dtype);
    CKPT_FORWARD(op(w, CKPT_OP_MARK));
    CKPT_FORWARD(emit_cstr(w, "storage"));
    /* torch 2.x writes (and its weights-only loader admits) the untyped
     * storage of v3 tensors as torch.storage.UntypedStorage */
    if (strcmp(type, "UntypedStorage") == 0)
        CKPT_FORWARD(emit_global2(w, "torch.storage", 13, type));
    else
        CKPT_FORWARD(emit_global2(w, "torch", 5, type));
    CKPT_FORWARD(emit_str2(w, kp, strlen(kp), kp != key)); /* KEY is this frame's */
    CKPT_FORWARD(emit_cstr(w, s->device));
    CKPT_FORWARD(emit_int64(w, (int64_t)(s->nbytes / (es ? es : 1))));
    if (w->legacy)
        CKPT_FORWARD(op(w, CKPT_OP_NONE)); /* view_metadata, always None */
    CKPT_FORWARD(op(w, CKPT_OP_TUPLE));
    if (ref) {
        memo_entry k = node_key(ref); /* the id tuple, as Python memoizes it */
        CKPT_FORWARD(memoize(w, &k));
    } else {
        CKPT_FORWARD(memo_skip(w));
    }
    return op(w, CKPT_OP_BINPERSID);
}

static int emit_storage(writer *w, const ckpt_value *ref)
{
    return emit_storage_id(w, ref->u.st.ptr, ref->u.st.type_name, ref->u.st.dtype, ref);
}

/* A shape or stride tuple of a tensor made outside a pickle, memoized as
 * Python's pickler memoizes a fresh tuple. */
static int emit_dims(writer *w, int n, const int64_t *d)
{
    if (n == 0)
        return op(w, CKPT_OP_EMPTY_TUPLE);
    if (n > 3)
        CKPT_FORWARD(op(w, CKPT_OP_MARK));
    for (int i = 0; i < n; i++)
        CKPT_FORWARD(emit_int64(w, d[i]));
    CKPT_FORWARD(op(w, n > 3 ? CKPT_OP_TUPLE : (uint8_t)(CKPT_OP_TUPLE1 + n - 1)));
    return memo_skip(w);
}

/* The first six arguments of a tensor made outside a pickle (rebuild_args
 * NULL), as torch.save writes them: storage, offset, size, stride,
 * requires_grad False, an empty OrderedDict of hooks.  The same bytes the
 * tuple ckpt_tensor_value_new once built gave, none of it in the memo maps. */
static int emit_plain_items(writer *w, const ckpt_tensor *t)
{
    bool v3 = strcmp(t->rebuild, "_rebuild_tensor_v3") == 0;
    ckpt_dtype made = (ckpt_dtype)t->made_dtype;
    CKPT_FORWARD(emit_storage_id(w, t->storage, v3 ? "UntypedStorage" : ckpt_storage_type_name(made),
                                 v3 ? CKPT_DTYPE_UINT8 : made, NULL));
    CKPT_FORWARD(emit_int64(w, t->offset));
    CKPT_FORWARD(emit_dims(w, t->ndim, t->shape));
    CKPT_FORWARD(emit_dims(w, t->ndim, t->stride));
    CKPT_FORWARD(op(w, CKPT_OP_NEWFALSE));
    CKPT_FORWARD(emit_global2(w, "collections", 11, "OrderedDict"));
    CKPT_FORWARD(op(w, CKPT_OP_EMPTY_TUPLE));
    CKPT_FORWARD(op(w, CKPT_OP_REDUCE));
    return memo_skip(w);
}

/* Its whole argument tuple: the six, v3's dtype, memoized. */
static int emit_plain_args(writer *w, const ckpt_tensor *t)
{
    CKPT_FORWARD(op(w, CKPT_OP_MARK));
    CKPT_FORWARD(emit_plain_items(w, t));
    if (strcmp(t->rebuild, "_rebuild_tensor_v3") == 0)
        CKPT_FORWARD(emit_global2(w, "torch", 5, ckpt_dtype_name((ckpt_dtype)t->made_dtype)));
    CKPT_FORWARD(op(w, CKPT_OP_TUPLE));
    return memo_skip(w);
}

/*
 * A tensor whose storage was cast to or from one of the dtypes newer than
 * 1.13 (an untyped storage, sized in bytes, and _rebuild_tensor_v3 with the
 * dtype; the others have a typed storage and _rebuild_tensor_v2): its call
 * as torch 2.x would save it in the new dtype (TYPE, if any, between the
 * function and its arguments).  1 when written, 0 when the tensor keeps its
 * own call.
 */
static int emit_recast(writer *w, const ckpt_tensor *t, const ckpt_value *type)
{
    const ckpt_storage *s = t->storage;
    const ckpt_value *args = t->rebuild_args;
    bool v2 = strcmp(t->rebuild, "_rebuild_tensor_v2") == 0,
         v3 = strcmp(t->rebuild, "_rebuild_tensor_v3") == 0;
    if (!s)
        return 0;
    bool to_v3 = ckpt_storage_type_name(s->dtype) == NULL;
    /* v2 -> v2 keeps its call: the typed storage names the new dtype */
    if (s->dtype == s->src_dtype || !(v2 || v3) || (!to_v3 && !v3) ||
        (args && (args->kind != CKPT_KIND_TUPLE || args->u.seq.len < (v3 ? 7u : 6u))))
        return 0;
    CKPT_FORWARD(emit_global2(w, "torch._utils", 12,
                              to_v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2"));
    if (type)
        CKPT_FORWARD(emit_value(w, type));
    CKPT_FORWARD(op(w, CKPT_OP_MARK));
    if (!args)
        CKPT_FORWARD(emit_plain_items(w, t));
    for (size_t i = 0; args && i < 6; i++) /* storage, offset, size, stride, requires_grad, hooks */
        CKPT_FORWARD(emit_value(w, args->u.seq.items[i]));
    if (to_v3)
        CKPT_FORWARD(emit_global2(w, "torch", 5, ckpt_dtype_name(s->dtype)));
    for (size_t i = v3 ? 7 : 6; args && i < args->u.seq.len; i++) /* metadata */
        CKPT_FORWARD(emit_value(w, args->u.seq.items[i]));
    CKPT_FORWARD(op(w, CKPT_OP_TUPLE));
    return 1;
}

static int emit_tensor(writer *w, const ckpt_value *v)
{
    const ckpt_tensor *t = v->u.tensor;
    int recast = 0;
    if (ckpt_dtype_bits(t->dtype) % 8) /* safetensors' F6_*: torch.load could not name it */
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED,
                        "a %s tensor cannot be written to a torch file: torch has no such dtype "
                        "(safetensors output keeps it)", ckpt_dtype_name(t->dtype));
    if (t->param_rebuild) {
        CKPT_FORWARD(emit_global2(w, "torch._utils", 12, t->param_rebuild));
        CKPT_FORWARD(emit_value(w, t->param_args));
    } else {
        /* _rebuild_from_type_v2(inner call, torch.Tensor, inner args, state) */
        const ckpt_value *ta = t->type_args;
        if (ta) {
            CKPT_FORWARD(emit_global2(w, "torch._tensor", 13, "_rebuild_from_type_v2"));
            CKPT_FORWARD(op(w, CKPT_OP_MARK));
        }
        if ((recast = emit_recast(w, t, ta ? ta->u.seq.items[1] : NULL)) < 0)
            return recast;
        if (!recast) {
            CKPT_FORWARD(emit_global2(w, "torch._utils", 12, t->rebuild));
            if (ta)
                CKPT_FORWARD(emit_value(w, ta->u.seq.items[1]));
            CKPT_FORWARD(t->rebuild_args ? emit_value(w, t->rebuild_args) : emit_plain_args(w, t));
        }
        if (ta) {
            CKPT_FORWARD(emit_value(w, ta->u.seq.items[3]));
            CKPT_FORWARD(op(w, CKPT_OP_TUPLE));
        }
    }
    CKPT_FORWARD(op(w, CKPT_OP_REDUCE));
    memo_entry k = node_key(v);
    CKPT_FORWARD(memoize(w, &k));
    if (t->state) {
        CKPT_FORWARD(emit_value(w, t->state));
        CKPT_FORWARD(op(w, CKPT_OP_BUILD));
    }
    return CKPT_OK;
}

/* ---- objects ---- */

static int emit_object(writer *w, const ckpt_value *v)
{
    const ckpt_value *cls = v->u.obj.callable;
    switch (v->how) {
    case CKPT_OBJ_NEWOBJ:
        CKPT_FORWARD(emit_global(w, cls));
        CKPT_FORWARD(emit_value(w, v->u.obj.args));
        CKPT_FORWARD(op(w, CKPT_OP_NEWOBJ));
        break;
    case CKPT_OBJ_NEWOBJ_EX: /* a protocol-4 opcode; the input needed it too */
        CKPT_FORWARD(emit_global(w, cls));
        CKPT_FORWARD(emit_value(w, v->u.obj.args));
        CKPT_FORWARD(emit_value(w, v->u.obj.kwargs));
        CKPT_FORWARD(op(w, CKPT_OP_NEWOBJ_EX));
        break;
    case CKPT_OBJ_INST:
    case CKPT_OBJ_OBJ: /* protocol 0/1 forms, rebuilt as OBJ */
        CKPT_FORWARD(op(w, CKPT_OP_MARK));
        CKPT_FORWARD(emit_global(w, cls));
        for (size_t i = 0; v->u.obj.args && i < v->u.obj.args->u.seq.len; i++)
            CKPT_FORWARD(emit_value(w, v->u.obj.args->u.seq.items[i]));
        CKPT_FORWARD(op(w, CKPT_OP_OBJ));
        break;
    default:
        CKPT_FORWARD(emit_global(w, cls));
        CKPT_FORWARD(emit_value(w, v->u.obj.args));
        CKPT_FORWARD(op(w, CKPT_OP_REDUCE));
        break;
    }
    memo_entry k = node_key(v);
    CKPT_FORWARD(memoize(w, &k));
    const ckpt_obj_items *it = ckpt_obj_items_of(v);
    CKPT_FORWARD(emit_appends(w, &it->listitems));
    CKPT_FORWARD(emit_setitems(w, &it->dictkeys, &it->dictvals));
    if (v->u.obj.state) {
        CKPT_FORWARD(emit_value(w, v->u.obj.state));
        CKPT_FORWARD(op(w, CKPT_OP_BUILD));
    }
    return CKPT_OK;
}

static int emit_value(writer *w, const ckpt_value *v)
{
    switch (v->kind) {
    case CKPT_KIND_NONE:
        return op(w, CKPT_OP_NONE);
    case CKPT_KIND_BOOL:
        return op(w, v->u.b ? CKPT_OP_NEWTRUE : CKPT_OP_NEWFALSE);
    case CKPT_KIND_INT:
        return emit_int(w, v);
    case CKPT_KIND_FLOAT:
        return emit_float(w, v->u.f);
    case CKPT_KIND_STR:
        return emit_str(w, v->u.s.s, v->u.s.len);
    case CKPT_KIND_GLOBAL:
        return emit_global(w, v);
    case CKPT_KIND_STORAGE:
        return emit_storage(w, v);
    default:
        break;
    }
    /* shared objects: the second reference is a BINGET */
    memo_entry k = node_key(v);
    uint32_t at;
    if (memo_find(w, &k, &at))
        return emit_get(w, at);
    switch (v->kind) {
    case CKPT_KIND_BYTES:
        return emit_bytes(w, v);
    case CKPT_KIND_TUPLE:
        return emit_tuple(w, v);
    case CKPT_KIND_LIST:
        CKPT_FORWARD(op(w, CKPT_OP_EMPTY_LIST));
        CKPT_FORWARD(memoize(w, &k));
        return emit_appends(w, &v->u.seq);
    case CKPT_KIND_DICT:
        if (v->flags & CKPT_VF_ORDERED) {
            CKPT_FORWARD(emit_global2(w, "collections", 11, "OrderedDict"));
            CKPT_FORWARD(op(w, CKPT_OP_EMPTY_TUPLE));
            CKPT_FORWARD(op(w, CKPT_OP_REDUCE));
        } else {
            CKPT_FORWARD(op(w, CKPT_OP_EMPTY_DICT));
        }
        CKPT_FORWARD(memoize(w, &k));
        CKPT_FORWARD(emit_setitems(w, &v->u.dict.keys, &v->u.dict.vals));
        if (v->u.dict.state) {
            CKPT_FORWARD(emit_value(w, v->u.dict.state));
            CKPT_FORWARD(op(w, CKPT_OP_BUILD));
        }
        return CKPT_OK;
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET: {
        /* protocol 2: builtins.set([items]) via REDUCE */
        bool frozen = v->kind == CKPT_KIND_FROZENSET;
        CKPT_FORWARD(emit_global2(w, "builtins", 8, frozen ? "frozenset" : "set"));
        CKPT_FORWARD(op(w, CKPT_OP_EMPTY_LIST));
        CKPT_FORWARD(emit_appends(w, &v->u.seq));
        CKPT_FORWARD(op(w, CKPT_OP_TUPLE1));
        CKPT_FORWARD(op(w, CKPT_OP_REDUCE));
        return memoize(w, &k);
    }
    case CKPT_KIND_OBJECT:
        return emit_object(w, v);
    case CKPT_KIND_TENSOR:
        return emit_tensor(w, v);
    default:
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "cannot write a %s",
                        ckpt_kind_name((ckpt_kind)v->kind));
    }
}

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int ckpt_pickle_write(ckpt_arena *a, size_t nstorages, const ckpt_value *root,
                      ckpt_pickle_out *out, ckpt_error *err)
{
    return ckpt_pickle_write2(a, nstorages, root, false, out, err);
}

int ckpt_pickle_write2(ckpt_arena *a, size_t nstorages, const ckpt_value *root, bool legacy,
                       ckpt_pickle_out *out, ckpt_error *err)
{
    return ckpt_pickle_write3(a, nstorages, root, legacy ? CKPT_PICKLE_LEGACY : 0, out, err);
}

int ckpt_pickle_write3(ckpt_arena *a, size_t nstorages, const ckpt_value *root, unsigned flags,
                       ckpt_pickle_out *out, ckpt_error *err)
{
    memset(out, 0, sizeof(*out));
    writer w = {.arena = a,
                .err = err,
                .out = out,
                .legacy = (flags & CKPT_PICKLE_LEGACY) != 0,
                .keep_keys = (flags & CKPT_PICKLE_KEEP_KEYS) != 0};
    ckpt_map_init(&w.memo[0], CKPT_MAP_U64);
    ckpt_map_init(&w.texts[0], CKPT_MAP_HASHED);
    ckpt_map_init(&w.texts[1], CKPT_MAP_HASHED);
    ckpt_map_init(&w.fetched, CKPT_MAP_U64);
    size_t ns = nstorages;
    w.new_key = malloc((ns ? ns : 1) * sizeof(*w.new_key));
    out->order = malloc((ns ? ns : 1) * sizeof(*out->order));
    int rc = CKPT_OK;
    if (!w.new_key || !out->order) {
        rc = ckpt_err(err, CKPT_ERR_NOMEM, "out of memory writing the pickle");
    } else {
        for (size_t i = 0; i < ns; i++)
            w.new_key[i] = -1;
        rc = op_le(&w, CKPT_OP_PROTO, 2, 1);
        if (!rc)
            rc = emit_value(&w, root);
        if (!rc)
            rc = op(&w, CKPT_OP_STOP);
    }
    free(w.new_key);
    ckpt_map_release(&w.memo[0]);
    for (int t = 0; t < 2; t++) {
        ckpt_map_release(&w.texts[t]);
        free(w.text[t]);
    }
    ckpt_map_release(&w.fetched);
    if (!rc && out->nfetched)
        qsort(out->fetched, out->nfetched, sizeof *out->fetched, u32_cmp);
    if (rc)
        ckpt_pickle_out_free(out);
    return rc;
}

void ckpt_pickle_out_free(ckpt_pickle_out *out)
{
    free(out->fetched);
    free(out->buf);
    free(out->order);
    memset(out, 0, sizeof(*out));
}
