/* pth_tar.c - the tar checkpoint of torch <= 0.1 (doc/pth-format.md
 * 2.1, "The ancient tar format"), walked as torch's legacy_load reads it: members
 * 'storages' (a count, per storage a (key, location, storage type) pickle
 * then an int64 element count and the bytes; then a list of views),
 * 'tensors' (a count, per tensor a (key, storage id, tensor type) pickle then
 * ndim, sizes, strides and offset in binary) and 'pickle' (the main pickle,
 * whose persistent ids are the keys of those objects).  The walk keeps
 * legacy_load's deserialized_objects as Python does (keys equal as Python
 * compares them) and says where torch 1.13 stops and why; ckpt's reader
 * (and ckpt scan) walk it strict, with ckpt's own rules and messages.  Read
 * only. */
#include "formats/format.h"
#include "container/container.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* more dimensions than torch could ever have saved (strict) */
#define MAX_NDIM 1024
/* longer string keys than a pointer's digits are refused (strict) */
#define MAX_KEY 256
/* a key's text: "i:" or "s:" and its bytes, longer ones equal to none */
#define KEY_CAP 300

typedef enum ekind { E_STORAGE = 1, E_VIEW, E_TENSOR } ekind;

/* One value of legacy_load's deserialized_objects dict. */
typedef struct entry {
    const char *key;       /* as Python compares keys (key_text): "i:12", "s:abc" */
    size_t klen;
    ekind kind;
    ckpt_dtype dtype;
    const char *type_name; /* "FloatStorage" */
    int64_t numel;         /* STORAGE, VIEW: elements */
    uint64_t file_offset;  /* STORAGE: its first byte in the file */
    const char *loc;       /* STORAGE: the location tag */
    size_t loclen;
    struct entry *base;    /* VIEW, TENSOR: the storage (never a view) it lies in */
    int64_t base_off;      /* VIEW: first element within BASE */
    int ndim;              /* TENSOR (strict) */
    int64_t *shape, *stride, offset; /* TENSOR: OFFSET counted within BASE */
    ckpt_storage *rec;     /* reading: the storage record, once referenced */
    ckpt_value *value;     /* reading: the value, once referenced */
} entry;

typedef struct tar_walk {
    ckpt_walk *w;
    ckpt_error *err;
    bool strict;
    const uint8_t *map;
    uint64_t size;
    ckpt_arena arena; /* keys, entries */
    ckpt_map dict;    /* the dict: key text -> index into ents */
    entry **ents;
    size_t nents, entcap;
} tar_walk;

/* ---- where torch stops -------------------------------------------------------- */

/* torch 1.13 stops at STAGE ("container", "value", "storage") with EXC; the
 * message goes into W->stop and ERR. */
static int refuse(tar_walk *t, const char *stage, const char *exc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(tar_walk *t, const char *stage, const char *exc, const char *fmt, ...)
{
    ckpt_walk_stop *st = &t->w->stop;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
    st->exception = exc;
    st->stage = stage;
    return ckpt_err(t->err, CKPT_ERR_FORMAT, "%s", st->message);
}

/* A value the walk does not follow (the result of a call): said, not guessed. */
static int unknown(tar_walk *t, const char *what)
{
    return refuse(t, "value", "unknown", "not modelled: %s is the result of a call", what);
}

/* A TarError: torch.load reads the file as a legacy stream instead. */
static int fall_back(tar_walk *t, const char *why)
{
    t->w->stop.fallback = true;
    return ckpt_err(t->err, CKPT_ERR_FORMAT, "%s", why);
}

static const char *py_type(const ckpt_value *x)
{
    static const char *const names[] = {"NoneType", "bool", "int", "float", "str", "bytes",
                                        "list", "tuple", "dict", "set", "frozenset", "type",
                                        "object", "Tensor", "TypedStorage"};
    return x->kind < sizeof names / sizeof *names ? names[x->kind] : "object";
}

/* ---- deserialized_objects ------------------------------------------------------ */

/* The decimal of a little-endian two's complement int. */
static void big_decimal(const uint8_t *le, size_t n, char *out, size_t cap)
{
    uint8_t *mag = malloc(n ? n : 1);
    if (!mag || n == 0 || cap < 3) {
        free(mag);
        snprintf(out, cap, "0");
        return;
    }
    bool neg = le[n - 1] & 0x80;
    unsigned carry = 1;
    for (size_t i = 0; i < n; i++) { /* big-endian magnitude */
        unsigned b = neg ? (uint8_t)~le[i] + carry : le[i];
        carry = neg ? b >> 8 : 0;
        mag[n - 1 - i] = (uint8_t)b;
    }
    size_t o = 0;
    char *d = out + 1;
    for (;;) { /* divide by 10 until zero; digits come out reversed */
        unsigned rem = 0;
        bool nz = false;
        for (size_t i = 0; i < n; i++) {
            unsigned cur = rem << 8 | mag[i];
            mag[i] = (uint8_t)(cur / 10);
            rem = cur % 10;
            nz |= mag[i] != 0;
        }
        if (o + 3 < cap)
            d[o++] = (char)('0' + rem);
        if (!nz)
            break;
    }
    free(mag);
    for (size_t i = 0; i < o / 2; i++) {
        char c = d[i];
        d[i] = d[o - 1 - i];
        d[o - 1 - i] = c;
    }
    d[o] = 0;
    if (neg)
        out[0] = '-';
    else
        memmove(out, d, o + 1);
}

/* A dict key as Python hashes and compares it, as text: "i:12" (ints, bools
 * and integral floats are equal), "s:..." (str), "b:..." (bytes), "n"; a key
 * that equals nothing else here (a tuple, a class) gets a unique text; an
 * unhashable one stops torch. */
static int key_text(tar_walk *t, const ckpt_value *x, char *buf, size_t *len)
{
    switch (x->kind) {
    case CKPT_KIND_BOOL:
        *len = (size_t)snprintf(buf, KEY_CAP, "i:%d", x->u.b != 0);
        return CKPT_OK;
    case CKPT_KIND_INT:
        if (x->u.i.big) {
            memcpy(buf, "i:", 2);
            big_decimal(x->u.i.bytes, x->u.i.nbytes, buf + 2, KEY_CAP - 2);
            *len = strlen(buf);
        } else {
            *len = (size_t)snprintf(buf, KEY_CAP, "i:%lld", (long long)x->u.i.v);
        }
        return CKPT_OK;
    case CKPT_KIND_FLOAT:
        if (x->u.f == (double)(int64_t)x->u.f && x->u.f > -9.2e18 && x->u.f < 9.2e18)
            *len = (size_t)snprintf(buf, KEY_CAP, "i:%lld", (long long)x->u.f);
        else
            *len = (size_t)snprintf(buf, KEY_CAP, "f:%a", x->u.f);
        return CKPT_OK;
    case CKPT_KIND_STR:
    case CKPT_KIND_BYTES:
        if (x->u.s.len + 3 > KEY_CAP) { /* too long to be any key torch wrote: equal to none */
            *len = (size_t)snprintf(buf, KEY_CAP, "o:%p", (const void *)x);
            return CKPT_OK;
        }
        buf[0] = x->kind == CKPT_KIND_STR ? 's' : 'b';
        buf[1] = ':';
        memcpy(buf + 2, x->u.s.s, x->u.s.len);
        *len = x->u.s.len + 2;
        return CKPT_OK;
    case CKPT_KIND_NONE:
        *len = (size_t)snprintf(buf, KEY_CAP, "n");
        return CKPT_OK;
    case CKPT_KIND_LIST:
    case CKPT_KIND_DICT:
    case CKPT_KIND_SET:
        return refuse(t, "value", "TypeError", "unhashable type: '%s'", py_type(x));
    default:
        *len = (size_t)snprintf(buf, KEY_CAP, "o:%p", (const void *)x);
        return CKPT_OK;
    }
}

/* Strict: ckpt reads int and string keys only (WHAT names the key). */
static int key_strict(tar_walk *t, const ckpt_value *v, const char *what)
{
    if (v->kind == CKPT_KIND_BOOL || (v->kind == CKPT_KIND_INT && !v->u.i.big) ||
        (v->kind == CKPT_KIND_STR && v->u.s.len <= MAX_KEY))
        return CKPT_OK;
    return ckpt_err(t->err, CKPT_ERR_UNSUPPORTED, "%s is a %s; ckpt reads int and string keys",
                    what, ckpt_kind_name((ckpt_kind)v->kind));
}

/* A key as ckpt's messages show it: 12, 'abc'. */
static const char *key_shown(const char *k, size_t n, char *buf, size_t cap)
{
    if (k[0] == 's')
        snprintf(buf, cap, "'%.*s'", (int)(n - 2 < 64 ? n - 2 : 64), k + 2);
    else
        snprintf(buf, cap, "%.*s", (int)(n - 2), k + 2);
    return buf;
}

/* deserialized_objects[K]: the entry, or NULL */
static entry *dict_get(tar_walk *t, const char *k, size_t n)
{
    size_t i;
    return ckpt_map_get(&t->dict, k, n, &i) ? t->ents[i] : NULL;
}

/* deserialized_objects[K] = E (a key seen before gets the new value) */
static int dict_set(tar_walk *t, const char *k, size_t n, entry *e)
{
    char *c = ckpt_arena_alloc(&t->arena, n + 1);
    if (!c || CKPT_GROW(t->ents, t->entcap, t->nents + 1) < 0)
        return ckpt_oom(t->err);
    memcpy(c, k, n);
    c[n] = 0;
    e->key = c;
    e->klen = n;
    size_t at;
    int r = ckpt_map_put(&t->dict, c, n, t->nents, &at); /* C lives in the arena */
    if (r < 0)
        return ckpt_oom(t->err);
    if (r == 1)
        t->ents[at] = e;
    else
        t->ents[t->nents++] = e;
    return CKPT_OK;
}

static entry *entry_new(tar_walk *t, ekind kind)
{
    entry *e = ckpt_arena_alloc(&t->arena, sizeof(*e));
    if (!e) {
        ckpt_oom(t->err);
        return NULL;
    }
    memset(e, 0, sizeof(*e));
    e->kind = kind;
    return e;
}

/* str(KeyError(key)): the key's repr */
static int key_error(tar_walk *t, const ckpt_value *x, const char *k, size_t n)
{
    if (x->kind == CKPT_KIND_STR || x->kind == CKPT_KIND_BYTES)
        return refuse(t, "storage", "KeyError", "%s'%.*s'", x->kind == CKPT_KIND_BYTES ? "b" : "",
                      (int)(x->u.s.len > 200 ? 200 : x->u.s.len), x->u.s.s);
    if (x->kind == CKPT_KIND_NONE)
        return refuse(t, "storage", "KeyError", "None");
    if (x->kind == CKPT_KIND_BOOL)
        return refuse(t, "storage", "KeyError", "%s", x->u.b ? "True" : "False");
    return refuse(t, "storage", "KeyError", "%.*s", (int)(n > 2 ? n - 2 : n),
                  k[0] == 'i' ? k + 2 : k);
}

int ckpt_walk_tar_kind(const ckpt_walk *w, const char *decimal)
{
    tar_walk *t = w->priv;
    char k[KEY_CAP + 8];
    size_t n = (size_t)snprintf(k, sizeof k, "i:%s", decimal);
    entry *e = t ? dict_get(t, k, n < sizeof k ? n : sizeof k - 1) : NULL;
    return !e ? 0 : e->kind == E_TENSOR ? 2 : 1;
}

/* ---- the walk -------------------------------------------------------------------- */

/* Go on while EXPR is CKPT_OK: an error, or a callback's CKPT_WALK_STOP, ends the walk. */
#define WALK_ON(expr)          \
    do {                       \
        int rc_on_ = (expr);   \
        if (rc_on_ != CKPT_OK) \
            return rc_on_;     \
    } while (0)

/* pickle_module.load(f) at *POS of BASE[0..LEN) (the member MEMBER_SIZE bytes
 * long, LEN of them in the file): the caller's value of it. */
static int pickle_at(tar_walk *t, const char *name, const uint8_t *base, size_t len, size_t *pos,
                     bool main, uint64_t member_size, ckpt_value **root)
{
    CKPT_RETURN_IF(t->strict && *pos >= len, t->err, CKPT_ERR_FORMAT, "truncated: %s is missing",
                   name);
    ckpt_walk_pickle p = {.name = name, .offset = (uint64_t)(base + *pos - t->map),
                          .buf = base + *pos, .len = len - *pos, .pid_fields = main ? 1 : 0,
                          .truncated = main && member_size > len};
    size_t used = 0;
    *root = NULL;
    int rc = t->w->pickle(t->w, &p, &used, root);
    if (rc == CKPT_WALK_STOP || (rc && (!t->strict || t->err->code)))
        return rc;
    if (rc)
        return ckpt_err(t->err, rc, "%s could not be read", name);
    /* the walk reads on after a member's pickles: their values and lengths */
    CKPT_RETURN_IF(used > len - *pos || (!main && (!*root || used == 0)), t->err,
                   CKPT_ERR_FORMAT, "%s could not be read", name);
    *pos += used;
    return CKPT_OK;
}

/* range(X): *N loops (a negative count none; torch loops a big one until the
 * data ends, strict refuses it).  WHAT names the count in ckpt's message. */
static int count_of(tar_walk *t, const ckpt_value *x, const char *what, int64_t *n)
{
    if (x->kind == CKPT_KIND_BOOL || (x->kind == CKPT_KIND_INT && !x->u.i.big)) {
        *n = x->kind == CKPT_KIND_BOOL ? x->u.b != 0 : x->u.i.v < 0 ? 0 : x->u.i.v;
        return CKPT_OK;
    }
    CKPT_RETURN_IF(t->strict, t->err, CKPT_ERR_FORMAT, "%s is a %s, not a count", what,
                   ckpt_kind_name((ckpt_kind)x->kind));
    if (x->kind == CKPT_KIND_INT) {
        *n = x->u.i.nbytes && (x->u.i.bytes[x->u.i.nbytes - 1] & 0x80) ? 0 : INT64_MAX;
        return CKPT_OK;
    }
    if (x->kind == CKPT_KIND_OBJECT || x->kind == CKPT_KIND_TENSOR)
        return unknown(t, "a count");
    return refuse(t, "value", "TypeError", "'%s' object cannot be interpreted as an integer",
                  py_type(x));
}

/* `a, b, ... = x` for N names: its items (NAME in ckpt's message) */
static int unpack(tar_walk *t, const ckpt_value *x, size_t n, const char *name,
                  ckpt_value ***items)
{
    *items = x->kind == CKPT_KIND_TUPLE || x->kind == CKPT_KIND_LIST ? x->u.seq.items : NULL;
    if (t->strict) {
        CKPT_RETURN_IF(!*items || x->u.seq.len != n, t->err, CKPT_ERR_FORMAT,
                       "%s is not a sequence of %zu items", name, n);
        return CKPT_OK;
    }
    size_t got;
    switch (x->kind) {
    case CKPT_KIND_TUPLE:
    case CKPT_KIND_LIST:
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
        got = x->u.seq.len;
        break;
    case CKPT_KIND_DICT:
        got = x->u.dict.keys.len;
        break;
    case CKPT_KIND_STR:
        got = 0;
        for (size_t i = 0; i < x->u.s.len; i++)
            got += ((uint8_t)x->u.s.s[i] & 0xc0) != 0x80; /* code points */
        break;
    case CKPT_KIND_BYTES:
        got = x->u.s.len;
        break;
    case CKPT_KIND_OBJECT:
    case CKPT_KIND_TENSOR:
        return unknown(t, "a value unpacked");
    default:
        return refuse(t, "value", "TypeError", "cannot unpack non-iterable %s object",
                      py_type(x));
    }
    if (got < n)
        return refuse(t, "value", "ValueError",
                      "not enough values to unpack (expected %zu, got %zu)", n, got);
    if (got > n)
        return refuse(t, "value", "ValueError", "too many values to unpack (expected %zu)", n);
    if (!*items) /* the items of a set, dict, str or bytes: not followed */
        return unknown(t, "the items of a set, dict, str or bytes unpacked");
    return CKPT_OK;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The member NAME: tar.extract(NAME) then open() (EXTRACT), else
 * tar.extractfile(NAME); *BASE and *LEN its bytes in the file. */
static int member(tar_walk *t, const ckpt_tar *tar, const char *name, bool extract,
                  const ckpt_tar_member **out, const uint8_t **base, size_t *len)
{
    const ckpt_tar_member *m = ckpt_tar_find(tar, name);
    bool strict = t->strict;
    if (!m)
        return strict ? ckpt_err(t->err, CKPT_ERR_FORMAT, "tar checkpoint without a '%s' member",
                                 name)
                      : refuse(t, "container", "KeyError", "\"filename '%s' not found\"", name);
    if (!m->regular) {
        if (strict)
            return ckpt_err(t->err, CKPT_ERR_UNSUPPORTED, "tar member '%s' is not a file (type "
                            "'%c')", name, m->type ? m->type : '0');
        if (m->type == '1' || m->type == '2') /* tarfile looks the link's target up */
            return refuse(t, "container", "KeyError", "\"linkname of '%s' not found\" (a link: "
                          "tarfile extracts its target, which the model does not follow)", name);
        if (!extract) /* extractfile() gives None */
            return refuse(t, "container", "AttributeError",
                          "'NoneType' object has no attribute 'readline'");
        if (m->type == '5')
            return refuse(t, "container", "IsADirectoryError",
                          "[Errno 21] Is a directory: '%s'", name);
        return refuse(t, "container", "OSError", "member '%s' is a device or a FIFO (type "
                      "'%c'): extract() makes a node, not a file", name, m->type);
    }
    if (m->size_huge || m->size < 0)
        return strict ? ckpt_err(t->err, CKPT_ERR_FORMAT, "tar member '%s' has an invalid size",
                                 name)
                      : fall_back(t, "a tar member of an invalid size");
    uint64_t avail = (uint64_t)m->data_offset >= t->size ? 0 : t->size - (uint64_t)m->data_offset;
    if (extract && (uint64_t)m->size > avail) /* copying it ends early: ReadError, a TarError */
        return strict ? ckpt_err(t->err, CKPT_ERR_FORMAT, "tar member '%s' (%lld bytes at byte "
                                 "%lld) reaches past the end of the file (torch then reads the "
                                 "file as a pickle stream)", name, (long long)m->size,
                                 (long long)m->data_offset)
                      : fall_back(t, "a tar member past the end of the file");
    /* extractfile() reads the member as the unpickler asks: a truncated
     * one fails only where the pickle reaches past the file */
    *len = (size_t)((uint64_t)m->size < avail ? (uint64_t)m->size : avail);
    *base = t->map + (*len ? m->data_offset : 0);
    *out = m;
    return CKPT_OK;
}

/* restore_location(storage, LOC), torch 1.13's default */
static int location(tar_walk *t, const ckpt_value *loc)
{
    if (loc->kind != CKPT_KIND_STR) /* 'cpu' == loc is false; _cuda_deserialize calls loc.startswith */
        return refuse(t, "storage", "AttributeError", "'%s' object has no attribute 'startswith'",
                      py_type(loc));
    const char *s = loc->u.s.s;
    size_t n = loc->u.s.len;
    if ((n == 3 && memcmp(s, "cpu", 3) == 0) || (n == 4 && memcmp(s, "meta", 4) == 0) ||
        (n >= 4 && memcmp(s, "cuda", 4) == 0) || (n >= 3 && memcmp(s, "mps", 3) == 0))
        return CKPT_OK;
    return refuse(t, "storage", "RuntimeError", "don't know how to restore data location of "
                  "torch.storage.UntypedStorage (tagged with %.*s)", (int)(n > 200 ? 200 : n), s);
}

static int walk_storages(tar_walk *t, const ckpt_tar *tar)
{
    const ckpt_tar_member *m;
    const uint8_t *base;
    size_t len, pos = 0;
    WALK_ON(member(t, tar, "storages", true, &m, &base, &len));
    char name[64], key[KEY_CAP], kt[80];
    size_t kl;
    ckpt_value *v, **a;
    int64_t n;
    WALK_ON(pickle_at(t, "tar:storages count", base, len, &pos, false, 0, &v));
    WALK_ON(count_of(t, v, "the storage count", &n));
    for (int64_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "tar:storages pickle %lld", (long long)i + 1);
        WALK_ON(pickle_at(t, name, base, len, &pos, false, 0, &v));
        WALK_ON(unpack(t, v, 3, name, &a));
        entry *e = entry_new(t, E_STORAGE);
        if (!e)
            return CKPT_ERR_NOMEM;
        if (t->strict) { /* ckpt's order: the key, its location, then its type */
            WALK_ON(key_strict(t, a[0], "a storage key"));
            WALK_ON(key_text(t, a[0], key, &kl));
            key_shown(key, kl, kt, sizeof kt);
            CKPT_RETURN_IF(a[1]->kind != CKPT_KIND_STR || a[1]->u.s.len == 0 ||
                               a[1]->u.s.len > 64,
                           t->err, CKPT_ERR_FORMAT, "storage %s has no valid location tag", kt);
        }
        /* storage_type.dtype: one of torch's typed storage classes */
        e->dtype = a[2]->kind == CKPT_KIND_GLOBAL
                       ? ckpt_storage_type_dtype(a[2]->u.global.name, &e->type_name)
                       : CKPT_DTYPE_UNKNOWN;
        if (e->dtype == CKPT_DTYPE_UNKNOWN || !e->type_name ||
            strcmp(e->type_name, "UntypedStorage") == 0) {
            if (t->strict)
                return ckpt_err(t->err, CKPT_ERR_UNSUPPORTED,
                                "storage %s: storage type %s is not recognized", kt,
                                a[2]->kind == CKPT_KIND_GLOBAL ? a[2]->u.global.name
                                                               : "(not a class)");
            if (a[2]->kind == CKPT_KIND_GLOBAL)
                return refuse(t, "value", "AttributeError", "type object '%s' has no attribute "
                              "'dtype'", strrchr(a[2]->u.global.name, '.') + 1);
            if (a[2]->kind == CKPT_KIND_OBJECT || a[2]->kind == CKPT_KIND_TENSOR)
                return unknown(t, "a storage type");
            return refuse(t, "value", "AttributeError", "'%s' object has no attribute 'dtype'",
                          py_type(a[2]));
        }
        /* UntypedStorage._new_with_file(f, element_size): an int64 count, its bytes */
        if (len - pos < 8)
            return t->strict ? ckpt_err(t->err, CKPT_ERR_FORMAT,
                                        "truncated: no element count for storage %s", kt)
                             : refuse(t, "storage", "RuntimeError", "unexpected EOF, expected "
                                      "%zu more bytes. The file might be corrupted.",
                                      8 - (len - pos));
        uint64_t count = le(base + pos, 8), nbytes;
        pos += 8;
        bool over = count > INT64_MAX || ckpt_dtype_nbytes(e->dtype, count, &nbytes) ||
                    nbytes > INT64_MAX;
        if (t->strict)
            CKPT_RETURN_IF(over || nbytes > len - pos, t->err, CKPT_ERR_FORMAT,
                           "storage %s: %lld elements do not fit in the member's %zu bytes left",
                           kt, (long long)count, len - pos);
        if (over)
            return refuse(t, "storage", "RuntimeError", "numel: integer multiplication overflow");
        if (nbytes > len - pos)
            return refuse(t, "storage", "RuntimeError", "unexpected EOF, expected %llu more "
                          "bytes. The file might be corrupted.",
                          (unsigned long long)(nbytes - (len - pos)));
        e->numel = (int64_t)count;
        e->file_offset = (uint64_t)m->data_offset + pos;
        e->loc = a[1]->kind == CKPT_KIND_STR ? a[1]->u.s.s : NULL;
        e->loclen = a[1]->kind == CKPT_KIND_STR ? a[1]->u.s.len : 0;
        pos += (size_t)nbytes;
        if (!t->strict) /* torch's order: its location, then the key */
            WALK_ON(location(t, a[1]));
        if (t->w->record) {
            ckpt_walk_record r = {.key = a[0], .index = (size_t)i, .offset = e->file_offset,
                                  .avail = nbytes, .has_count = true, .count = count,
                                  .location = e->loc, .location_len = e->loclen};
            uint64_t ignored;
            WALK_ON(t->w->record(t->w, &r, &ignored));
        }
        if (!t->strict)
            WALK_ON(key_text(t, a[0], key, &kl));
        WALK_ON(dict_set(t, key, kl, e));
    }
    WALK_ON(pickle_at(t, "tar:storages views", base, len, &pos, false, 0, &v));
    if (v->kind != CKPT_KIND_LIST && v->kind != CKPT_KIND_TUPLE) {
        CKPT_RETURN_IF(t->strict, t->err, CKPT_ERR_FORMAT, "the storage view list is a %s",
                       ckpt_kind_name((ckpt_kind)v->kind));
        if (v->kind == CKPT_KIND_OBJECT || v->kind == CKPT_KIND_TENSOR)
            return unknown(t, "the storage view list");
        if (v->kind == CKPT_KIND_DICT ? v->u.dict.keys.len
            : v->kind == CKPT_KIND_SET || v->kind == CKPT_KIND_FROZENSET ? v->u.seq.len
            : v->kind == CKPT_KIND_STR || v->kind == CKPT_KIND_BYTES ? v->u.s.len : 1) {
            if (v->kind == CKPT_KIND_STR || v->kind == CKPT_KIND_BYTES ||
                v->kind == CKPT_KIND_DICT || v->kind == CKPT_KIND_SET ||
                v->kind == CKPT_KIND_FROZENSET)
                return unknown(t, "the items of the storage view list");
            return refuse(t, "value", "TypeError", "'%s' object is not iterable", py_type(v));
        }
        return CKPT_OK; /* an empty one loops zero times */
    }
    for (size_t i = 0; i < v->u.seq.len; i++) {
        snprintf(name, sizeof name, "storage view %zu", i + 1);
        WALK_ON(unpack(t, v->u.seq.items[i], 4, name, &a));
        char rkey[KEY_CAP], rkt[80];
        size_t rkl;
        if (t->strict) {
            WALK_ON(key_strict(t, a[0], "a view's key"));
            WALK_ON(key_strict(t, a[1], "a view's root key"));
        }
        WALK_ON(key_text(t, a[1], rkey, &rkl));
        entry *root = dict_get(t, rkey, rkl);
        if (t->strict)
            CKPT_RETURN_IF(!root || root->kind == E_TENSOR, t->err, CKPT_ERR_FORMAT,
                           "%s: its root %s is no storage", name,
                           key_shown(rkey, rkl, rkt, sizeof rkt));
        if (!root)
            return key_error(t, a[1], rkey, rkl);
        /* offset * element_size, then a slice: ints (and bools) */
        int64_t off = 0, numel = 0;
        for (int k = 2; k < 4; k++) {
            const ckpt_value *x = a[k];
            if (x->kind == CKPT_KIND_BOOL || (x->kind == CKPT_KIND_INT && !x->u.i.big)) {
                *(k == 2 ? &off : &numel) = x->kind == CKPT_KIND_BOOL ? x->u.b != 0 : x->u.i.v;
                continue;
            }
            CKPT_RETURN_IF(t->strict, t->err, CKPT_ERR_FORMAT, "%s is a %s, not an int",
                           k == 2 ? "a view's offset" : "a view's size",
                           ckpt_kind_name((ckpt_kind)x->kind));
            if (x->kind == CKPT_KIND_INT)
                continue; /* a big one: sliced as Python slices (clamped) */
            if (x->kind == CKPT_KIND_OBJECT || x->kind == CKPT_KIND_TENSOR)
                return unknown(t, "a view's offset or size");
            return refuse(t, "value", "TypeError", "slice indices must be integers or None or "
                          "have an __index__ method");
        }
        /* torch slices the root as Python slices (clamping, negative offsets
         * from the end); ckpt reads views that lie inside it */
        if (t->strict)
            CKPT_RETURN_IF(off < 0 || numel < 0 || off > root->numel || numel > root->numel - off,
                           t->err, CKPT_ERR_FORMAT,
                           "%s: elements [%lld, +%lld) outside its root's %lld (torch clamps the "
                           "slice; ckpt reads views inside their root)", name,
                           (long long)off, (long long)numel, (long long)root->numel);
        entry *e = entry_new(t, E_VIEW);
        if (!e)
            return CKPT_ERR_NOMEM;
        e->base = root->kind == E_VIEW ? root->base : root;
        e->base_off = (root->kind == E_VIEW ? root->base_off : 0) + off;
        e->numel = numel;
        e->dtype = root->dtype;
        e->type_name = root->type_name;
        WALK_ON(key_text(t, a[0], key, &kl));
        WALK_ON(dict_set(t, key, kl, e));
    }
    return CKPT_OK;
}

/* A tensor's binary header at BASE[*POS..LEN) as torch 1.13 unpacks it (its
 * struct.error or set_()'s RuntimeError where it fails). */
static int header_torch(tar_walk *t, const uint8_t *base, size_t len, size_t *pos)
{
    /* ndim (<i), 4 bytes skipped, sizes and strides (<{ndim}q), offset (<q) */
    if (len - *pos < 4)
        return refuse(t, "value", "error", "unpack requires a buffer of 4 bytes");
    int32_t ndim = (int32_t)(uint32_t)le(base + *pos, 4);
    *pos += len - *pos < 8 ? len - *pos : 8;
    if (ndim < 0)
        return refuse(t, "value", "error", "bad char in struct format");
    int64_t dims[2][64] = {{0}};
    for (int k = 0; k < 2; k++) {
        uint64_t need = 8 * (uint64_t)ndim;
        if (need > len - *pos)
            return refuse(t, "value", "error", "unpack requires a buffer of %llu bytes",
                          (unsigned long long)need);
        for (int32_t d = 0; d < ndim && d < 64; d++)
            dims[k][d] = (int64_t)le(base + *pos + 8 * (size_t)d, 8);
        *pos += (size_t)need;
    }
    if (len - *pos < 8)
        return refuse(t, "value", "error", "unpack requires a buffer of 8 bytes");
    int64_t off = (int64_t)le(base + *pos, 8);
    *pos += 8;
    /* set_(storage, offset, size, stride): it grows a too small storage */
    bool neg_stride = false;
    for (int32_t d = 0; d < ndim && d < 64; d++) {
        if (dims[0][d] < 0)
            return refuse(t, "value", "RuntimeError", "numel: integer multiplication overflow");
        neg_stride |= dims[1][d] < 0 && dims[0][d] > 1;
    }
    if (off < 0)
        return refuse(t, "value", "RuntimeError", "Tensor: invalid storage offset %lld",
                      (long long)off);
    if (neg_stride) {
        char sz[512] = "", st[512] = "";
        for (int32_t d = 0; d < ndim && d < 16; d++) {
            size_t a = strlen(sz), b = strlen(st);
            snprintf(sz + a, sizeof sz - a, "%s%lld", d ? ", " : "", (long long)dims[0][d]);
            snprintf(st + b, sizeof st - b, "%s%lld", d ? ", " : "", (long long)dims[1][d]);
        }
        return refuse(t, "value", "RuntimeError", "Storage size calculation overflowed with "
                      "sizes=[%s%s] and strides=[%s%s]", sz, ndim > 16 ? ", ..." : "", st,
                      ndim > 16 ? ", ..." : "");
    }
    return CKPT_OK;
}

/* The same header as ckpt reads it into E (its storage S): every element of
 * the tensor inside S, where torch would grow S with unset bytes. */
static int header_strict(tar_walk *t, const uint8_t *base, size_t len, size_t *pos, entry *e,
                         const entry *s, const char *kt)
{
    CKPT_RETURN_IF(len - *pos < 8, t->err, CKPT_ERR_FORMAT,
                   "truncated: no dimensions for tensor %s", kt);
    int32_t ndim = (int32_t)(uint32_t)le(base + *pos, 4);
    *pos += 8; /* ndim, then 4 bytes of the 8 older torch wrote */
    CKPT_RETURN_IF(ndim < 0 || ndim > MAX_NDIM, t->err, CKPT_ERR_FORMAT,
                   "tensor %s has %d dimensions", kt, (int)ndim);
    size_t need = 16 * (size_t)ndim + 8;
    CKPT_RETURN_IF(len - *pos < need, t->err, CKPT_ERR_FORMAT,
                   "truncated: tensor %s needs %zu bytes of sizes and strides, the member "
                   "has %zu", kt, need, len - *pos);
    e->ndim = ndim;
    e->shape = ckpt_arena_alloc(&t->arena, ((size_t)ndim + 1) * sizeof(int64_t));
    e->stride = ckpt_arena_alloc(&t->arena, ((size_t)ndim + 1) * sizeof(int64_t));
    if (!e->shape || !e->stride)
        return ckpt_oom(t->err);
    const uint8_t *h = base + *pos;
    int64_t offset = (int64_t)le(h + 16 * (size_t)ndim, 8);
    uint64_t last = 0; /* the highest element offset reached */
    bool empty = false, bad = offset < 0;
    for (int d = 0; d < ndim; d++) {
        e->shape[d] = (int64_t)le(h + 8 * (size_t)d, 8);
        e->stride[d] = (int64_t)le(h + 8 * ((size_t)ndim + (size_t)d), 8);
        if (e->shape[d] < 0 || e->stride[d] < 0)
            bad = true;
        else if (e->shape[d] == 0)
            empty = true;
        else {
            uint64_t r;
            if (ckpt_mul_overflow((uint64_t)e->shape[d] - 1, (uint64_t)e->stride[d], &r) ||
                r > INT64_MAX - last)
                bad = true;
            else
                last += r;
        }
    }
    *pos += need;
    CKPT_RETURN_IF(bad, t->err, CKPT_ERR_FORMAT,
                   "tensor %s has a negative or overflowing size, stride or offset", kt);
    uint64_t numel = 1;
    for (int d = 0; d < ndim && !empty; d++)
        CKPT_RETURN_IF(ckpt_mul_overflow(numel, (uint64_t)e->shape[d], &numel) ||
                           numel > INT64_MAX,
                       t->err, CKPT_ERR_FORMAT, "tensor %s: its size overflows", kt);
    CKPT_RETURN_IF(!empty && ((uint64_t)offset > (uint64_t)s->numel ||
                              last >= (uint64_t)(s->numel - offset)),
                   t->err, CKPT_ERR_FORMAT,
                   "tensor %s reaches past its storage of %lld elements (torch would grow "
                   "the storage with unset bytes)", kt, (long long)s->numel);
    e->offset = offset + (s->kind == E_VIEW ? s->base_off : 0);
    return CKPT_OK;
}

static int walk_tensors(tar_walk *t, const ckpt_tar *tar)
{
    const ckpt_tar_member *m;
    const uint8_t *base;
    size_t len, pos = 0;
    WALK_ON(member(t, tar, "tensors", true, &m, &base, &len));
    char name[64], key[KEY_CAP], kt[80], skey[KEY_CAP], skt[40];
    size_t kl, skl;
    ckpt_value *v, **a;
    int64_t n;
    WALK_ON(pickle_at(t, "tar:tensors count", base, len, &pos, false, 0, &v));
    WALK_ON(count_of(t, v, "the tensor count", &n));
    for (int64_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "tar:tensors pickle %lld", (long long)i + 1);
        WALK_ON(pickle_at(t, name, base, len, &pos, false, 0, &v));
        WALK_ON(unpack(t, v, 3, name, &a));
        if (t->strict) {
            WALK_ON(key_strict(t, a[0], "a tensor key"));
            WALK_ON(key_strict(t, a[1], "a tensor's storage id"));
            WALK_ON(key_text(t, a[0], key, &kl));
            key_shown(key, kl, kt, sizeof kt);
        }
        WALK_ON(key_text(t, a[1], skey, &skl));
        entry *s = dict_get(t, skey, skl);
        if (t->strict) {
            key_shown(skey, skl, skt, sizeof skt);
            CKPT_RETURN_IF(!s, t->err, CKPT_ERR_FORMAT,
                           "tensor %s: storage id %s names no storage", kt, skt);
            CKPT_RETURN_IF(s->kind == E_TENSOR, t->err, CKPT_ERR_FORMAT,
                           "tensor %s: storage id %s names a tensor", kt, skt);
        }
        if (!s)
            return key_error(t, a[1], skey, skl);
        if (s->kind == E_TENSOR) /* storage._storage of a tensor: a method, set_ refuses it */
            return refuse(t, "storage", "TypeError", "set_() received an invalid combination of "
                          "arguments - got (builtin_function_or_method, int, tuple, tuple)");
        entry *e = entry_new(t, E_TENSOR);
        if (!e)
            return CKPT_ERR_NOMEM;
        if (t->strict)
            WALK_ON(header_strict(t, base, len, &pos, e, s, kt));
        else
            WALK_ON(header_torch(t, base, len, &pos));
        e->base = s->kind == E_VIEW ? s->base : s;
        e->dtype = s->dtype;
        e->type_name = s->type_name;
        if (!t->strict)
            WALK_ON(key_text(t, a[0], key, &kl));
        WALK_ON(dict_set(t, key, kl, e));
    }
    return CKPT_OK;
}

static int walk_all(tar_walk *t, int fd)
{
    ckpt_tar *tar = NULL;
    bool fb = false;
    ckpt_error e = {0};
    int rc = ckpt_tar_open(fd, t->size, &tar, &fb, &e);
    if (rc != CKPT_OK) {
        *t->err = e;
        if (!t->strict && rc != CKPT_ERR_NOMEM) {
            if (fb)
                t->w->stop.fallback = true;
            else /* not a TarError: it reaches the caller as whatever tarfile raised */
                refuse(t, "container", "unknown", "tarfile fails: %s", e.msg);
        }
        return rc;
    }
    rc = walk_storages(t, tar);
    if (rc == CKPT_OK)
        rc = walk_tensors(t, tar);
    const ckpt_tar_member *m = NULL;
    const uint8_t *base = NULL;
    size_t len = 0, pos = 0;
    if (rc == CKPT_OK)
        rc = member(t, tar, "pickle", false, &m, &base, &len);
    if (rc == CKPT_OK) {
        ckpt_value *root;
        rc = pickle_at(t, "tar:pickle", base, len, &pos, true, (uint64_t)m->size, &root);
    }
    ckpt_tar_close(tar);
    return rc;
}

static int pth_tar_walk(ckpt_walk *w, ckpt_source *src, ckpt_error *err)
{
    memset(&w->stop, 0, sizeof w->stop);
    w->stop.pickle = -1;
    CKPT_RETURN_IF(src->file_size == 0, err, CKPT_ERR_FORMAT, "empty file");
    void *map = mmap(NULL, (size_t)src->file_size, PROT_READ, MAP_PRIVATE, src->fd, 0);
    CKPT_RETURN_IF(map == MAP_FAILED, err, CKPT_ERR_IO, "cannot map the file: %s",
                   strerror(errno));
    tar_walk t = {.w = w, .err = err, .strict = w->strict, .map = map, .size = src->file_size};
    ckpt_arena_init(&t.arena);
    w->priv = &t;
    int rc = walk_all(&t, src->fd);
    w->priv = NULL;
    ckpt_map_release(&t.dict);
    free(t.ents);
    ckpt_arena_release(&t.arena);
    munmap(map, (size_t)src->file_size);
    return rc;
}

/* ---- reading into the checkpoint model --------------------------------------- */

typedef struct tar_read {
    ckpt_file *f;
    ckpt_walk *w;
    ckpt_value **root;
    bool main; /* the main pickle is being read */
} tar_read;

/* The tensors member names its tensor classes (torch.FloatTensor), which
 * torch 1.13 and 2.x still import and ignore: data there, refused elsewhere. */
static ckpt_global_class classify(void *user, const char *q)
{
    tar_read *r = user;
    if (!r->main && ckpt_tensor_type_known(q))
        return CKPT_GLOBAL_KNOWN_DATA;
    return ckpt_file_classify_global(r->f, q);
}

static ckpt_storage *record_of(tar_read *r, entry *e, uint64_t offset_bytes, int64_t numel)
{
    if (e->rec)
        return e->rec;
    char kb[MAX_KEY + 1], pre[MAX_KEY + 64];
    snprintf(kb, sizeof kb, "%.*s", (int)(e->klen - 2), e->key + 2);
    const char *key = ckpt_file_table_key(r->f, kb, pre, sizeof pre);
    if (!key) {
        ckpt_err(&r->f->err, CKPT_ERR_FORMAT, "storage key '%s' is too long", kb);
        return NULL;
    }
    if (ckpt_file_storage_find(r->f, key)) {
        /* an int key and a string key of the same digits */
        ckpt_err(&r->f->err, CKPT_ERR_UNSUPPORTED, "two storages are named '%s'", kb);
        return NULL;
    }
    const entry *b = e->kind == E_VIEW ? e->base : e;
    ckpt_storage *s = ckpt_file_storage_new(r->f, key, e->dtype, numel, b->loc, b->loclen,
                                            &r->f->err);
    if (!s)
        return NULL;
    s->type_name = e->type_name;
    s->loc = CKPT_LOC_FILE_RANGE;
    s->file_offset = b->file_offset + offset_bytes;
    e->rec = s;
    return s;
}

/* int(saved_id) for the ids Python's int() takes; false for the rest */
static bool id_int(const ckpt_value *v, int64_t *out)
{
    if (v->kind == CKPT_KIND_BOOL) {
        *out = v->u.b != 0;
        return true;
    }
    if (v->kind == CKPT_KIND_INT)
        return !v->u.i.big && (*out = v->u.i.v, true);
    if (v->kind == CKPT_KIND_FLOAT)
        return isfinite(v->u.f) && fabs(v->u.f) < 9.2e18 && (*out = (int64_t)v->u.f, true);
    if (v->kind != CKPT_KIND_STR && v->kind != CKPT_KIND_BYTES)
        return false;
    const char *s = v->u.s.s;
    size_t n = v->u.s.len, i = 0;
    while (n && (s[n - 1] == ' ' || (s[n - 1] >= '\t' && s[n - 1] <= '\r')))
        n--;
    while (i < n && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r')))
        i++;
    bool neg = i < n && s[i] == '-';
    if (i < n && (s[i] == '-' || s[i] == '+'))
        i++;
    if (i >= n)
        return false;
    uint64_t x = 0;
    for (;;) {
        if (s[i] < '0' || s[i] > '9' || x > (UINT64_MAX - 9) / 10)
            return false;
        x = x * 10 + (uint64_t)(s[i] - '0');
        if (++i == n)
            break;
        if (s[i] == '_' && ++i == n)
            return false;
    }
    if (x > (uint64_t)INT64_MAX)
        return false;
    *out = neg ? -(int64_t)x : (int64_t)x;
    return true;
}

static ckpt_value *persistent_load(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    tar_read *r = user;
    if (!r->main) {
        ckpt_err(err, CKPT_ERR_FORMAT, "a persistent id outside the main pickle");
        return NULL;
    }
    if (pid->kind == CKPT_KIND_TUPLE) {
        /* (module class, source file, source): the class */
        if (pid->u.seq.len == 0) {
            ckpt_err(err, CKPT_ERR_FORMAT, "an empty persistent id tuple");
            return NULL;
        }
        return pid->u.seq.items[0];
    }
    int64_t k;
    if (!id_int(pid, &k)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "persistent id (a %s) is not a key",
                 ckpt_kind_name((ckpt_kind)pid->kind));
        return NULL;
    }
    char kt[32];
    size_t kl = (size_t)snprintf(kt, sizeof kt, "i:%lld", (long long)k);
    entry *e = dict_get(r->w->priv, kt, kl);
    if (!e) {
        ckpt_err(err, CKPT_ERR_FORMAT, "persistent id %lld names no storage or tensor",
                 (long long)k);
        return NULL;
    }
    if (e->value)
        return e->value; /* the same object each time, as torch's dict gives it */
    ckpt_value *v;
    if (e->kind == E_TENSOR) {
        ckpt_storage *s = record_of(r, e->base, 0, e->base->numel);
        v = s ? ckpt_tensor_value_new(&r->f->arena, s, e->dtype, e->ndim, e->shape, e->stride,
                                      e->offset)
              : NULL;
    } else {
        ckpt_storage *s = record_of(r, e, (uint64_t)e->base_off * ckpt_dtype_size(e->dtype),
                                    e->numel);
        v = s ? ckpt_value_new(&r->f->arena, CKPT_KIND_STORAGE, offset) : NULL;
        if (v) {
            v->u.st.ptr = s;
            v->u.st.dtype = e->dtype;
            v->u.st.type_name = e->type_name;
        }
    }
    if (!v && !err->code)
        ckpt_oom(err);
    return e->value = v;
}

static int load_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    tar_read *r = w->user;
    ckpt_file *f = r->f;
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, p->name);
    r->main = p->pid_fields != 0;
    ctx.classify = classify;
    ctx.persistent_load = persistent_load;
    ctx.user = r;
    uint64_t lim = f->limits[CKPT_LIMIT_PICKLE_BYTES];
    bool capped = p->len > lim;
    int rc = ckpt_pickle_load(&ctx, p->buf, capped ? (size_t)lim : p->len, root, used, &f->err);
    if (rc && capped) {
        char msg[CKPT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", f->err.msg);
        ckpt_err_clear(&f->err);
        rc = ckpt_err(&f->err, CKPT_ERR_LIMIT, "%s does not end within the limit of %llu bytes "
                      "(--max-pickle-bytes): %s", p->name, (unsigned long long)lim, msg);
    }
    if (rc == CKPT_OK && r->main)
        *r->root = *root;
    return rc;
}

static int pth_tar_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    tar_read r = {.f = f, .root = root};
    ckpt_walk w = {.pickle = load_pickle, .user = &r, .strict = true};
    r.w = &w;
    return pth_tar_walk(&w, src, &f->err);
}

static bool pth_tar_sniff(const uint8_t *head, size_t n)
{
    return ckpt_tar_head_ok(head, n);
}

static bool tar_claim(int fd, uint64_t size, ckpt_zip **zip)
{
    (void)zip;
    return ckpt_tar_probe(fd, size);
}

const ckpt_format_desc ckpt_format_pth_tar = {
    .id = CKPT_FORMAT_PTH_TAR,
    .name = "pth-tar",
    .sniff = pth_tar_sniff,
    .claim = tar_claim,
    .read = pth_tar_read,
    .walk = pth_tar_walk,
};
