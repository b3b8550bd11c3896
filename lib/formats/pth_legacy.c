/* pth_legacy.c - the pre-1.6 stream (doc/pth-format.md section 2):
 * magic, protocol version, sys_info, main pickle, sorted storage keys, then
 * per storage an int64 element count and its raw bytes.  Walked as torch's
 * _legacy_load reads it (the walk reading, ckpt scan and the torch_load
 * verdicts share), read and written. */
#include "formats/format.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* 0x1950a86a20f9469cfc6c and 1001, little-endian, as LONG1 and BININT2 carry them */
static const uint8_t magic_le[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
static const uint8_t protocol_le[2] = {0xe9, 0x03};

/* ---- the walk: torch's _legacy_load ------------------------------------------------
 *
 * magic_number = pickle.load(f), checked; protocol_version = pickle.load(f),
 * checked; sys_info = pickle.load(f); the main pickle with persistent ids;
 * the storage key list; then per key an int64 element count and the bytes.
 */
static const char *const walk_names[] = {"magic number", "protocol version", "sys_info",
                                         "data pickle", "storage keys"};

/* Whether V is the int whose little-endian bytes are LE[0..N) (positive, no
 * sign byte), as Python compares ints (a sign byte or a small int equal too). */
static bool int_is(const ckpt_value *v, const uint8_t *le, size_t n)
{
    if (!v || v->kind != CKPT_KIND_INT)
        return false;
    if (!v->u.i.big) {
        if (n > 8)
            return false;
        uint64_t want = 0;
        for (size_t i = n; i-- > 0;)
            want = want << 8 | le[i];
        return v->u.i.v >= 0 && (uint64_t)v->u.i.v == want;
    }
    if (!v->u.i.bytes)
        return false;
    size_t k = v->u.i.nbytes;
    while (k > 0 && v->u.i.bytes[k - 1] == 0)
        k--; /* a positive int's sign byte */
    return k == n && memcmp(v->u.i.bytes, le, n) == 0;
}

/* Whether V may compare equal to an int though it is none (torch.load
 * compares with !=): 1 for what a known maker of numbers or arrays made
 * (builtins.int/float/complex/bool, numpy, torch's tensor rebuilds:
 * int("0x1950...", 16) is the magic number), 2 for what an unknown callable made or an unknown
 * global (anything); 0 for a value ckpt knows is not equal (a str, a
 * Namespace...).  Tensors and storages: 1. */
static int int_unknown(const ckpt_value *v)
{
    if (!v)
        return 0;
    if (v->kind == CKPT_KIND_TENSOR || v->kind == CKPT_KIND_STORAGE)
        return 1;
    const ckpt_value *c = v->kind == CKPT_KIND_OBJECT ? v->u.obj.callable : v;
    if (v->kind != CKPT_KIND_OBJECT && v->kind != CKPT_KIND_GLOBAL)
        return 0;
    if (!c || c->kind != CKPT_KIND_GLOBAL)
        return 2; /* a call of a call's result */
    if (c->u.global.cls != CKPT_GLOBAL_INTERPRETED && c->u.global.cls != CKPT_GLOBAL_KNOWN_DATA)
        return 2;
    if (v->kind == CKPT_KIND_GLOBAL)
        return 0; /* a known class or function: not equal to an int */
    static const char *const number[] = {"builtins.int", "builtins.float", "builtins.complex",
                                         "builtins.bool"};
    const char *q = c->u.global.name;
    for (size_t i = 0; i < sizeof number / sizeof *number; i++)
        if (strcmp(q, number[i]) == 0)
            return 1;
    /* numpy's arrays and scalars; torch's tensor rebuild functions */
    return strncmp(q, "numpy.", 6) == 0 || strncmp(q, "torch._utils.", 13) == 0 ||
           strncmp(q, "torch._tensor.", 14) == 0;
}

/* Whether V is a float equal to the int LE[0..N), as Python compares them
 * (1001.0 == 1001; the magic number is no float's value). */
static bool float_is(const ckpt_value *v, const uint8_t *le, size_t n)
{
    if (!v || v->kind != CKPT_KIND_FLOAT || n > 7)
        return false;
    uint64_t want = 0;
    for (size_t i = n; i-- > 0;)
        want = want << 8 | le[i];
    return v->u.f == (double)want;
}

/* torch stops after pickle K (its value is not EXPECTED): torch's RuntimeError
 * in W->stop, the reader's CODE and message in ERR. */
static int walk_refuse(ckpt_walk *w, int k, uint64_t at, const char *expected, ckpt_error *err,
                       int code, const char *torch_msg, const char *ckpt_msg)
{
    w->stop.exception = "RuntimeError";
    snprintf(w->stop.message, sizeof w->stop.message, "%s", torch_msg);
    w->stop.pickle = k;
    w->stop.expected = expected;
    w->stop.offset = at;
    return ckpt_err(err, code, "%s", ckpt_msg);
}

static int walk_stream(ckpt_walk *w, const uint8_t *map, size_t size, ckpt_error *err)
{
    size_t pos = 0;
    ckpt_value *root = NULL;
    for (int k = 0; k < 5; k++) {
        ckpt_walk_pickle p = {.index = k, .name = walk_names[k], .offset = pos, .buf = map + pos,
                              .len = size - pos, .pid_fields = k == 3 ? 6 : 0};
        size_t used = 0;
        root = NULL;
        int rc = w->pickle(w, &p, &used, &root);
        if (rc)
            return rc;
        CKPT_RETURN_IF(used == 0 || used > p.len, err, CKPT_ERR_FORMAT,
                       "the %s pickle could not be read", walk_names[k]);
        pos += used;
        int unknown = k <= 1 && w->follow_calls ? int_unknown(root) : 0;
        if (unknown) {
            if (w->called < 0) {
                w->called = k;
                w->called_data = unknown == 1;
            }
            continue; /* torch goes on when the object compares equal */
        }
        if (k == 1 && float_is(root, protocol_le, sizeof protocol_le))
            continue; /* 1001.0 != 1001 is False: torch goes on */
        if (k == 0 && !int_is(root, magic_le, sizeof magic_le))
            return walk_refuse(w, k, pos, "the magic number of torch's legacy format", err,
                               CKPT_ERR_FORMAT, "Invalid magic number; corrupt file?",
                               "invalid magic number; not a torch.save file");
        if (k == 1 && !int_is(root, protocol_le, sizeof protocol_le)) {
            long long pv = root && root->kind == CKPT_KIND_INT && !root->u.i.big ? root->u.i.v : 0;
            char t[64], c[64];
            snprintf(t, sizeof t, "Invalid protocol version: %lld", pv);
            snprintf(c, sizeof c, "invalid protocol version: %lld", pv);
            return walk_refuse(w, k, pos, "protocol version 1001", err, CKPT_ERR_UNSUPPORTED, t, c);
        }
    }
    /* for key in deserialized_storage_keys: its count, then its bytes */
    if (!w->record || !root || (root->kind != CKPT_KIND_LIST && root->kind != CKPT_KIND_TUPLE))
        return CKPT_OK;
    for (size_t i = 0; i < root->u.seq.len; i++) {
        ckpt_walk_record r = {.key = root->u.seq.items[i], .index = i, .offset = pos,
                              .avail = size - pos, .has_count = size - pos >= 8};
        for (int b = 7; r.has_count && b >= 0; b--)
            r.count = (r.count << 8) | map[pos + (size_t)b];
        uint64_t nbytes = 0;
        int rc = w->record(w, &r, &nbytes);
        if (rc)
            return rc;
        CKPT_RETURN_IF(!r.has_count || nbytes > r.avail - 8, err, CKPT_ERR_FORMAT,
                       "truncated: storage %zu of the key list at byte %zu", i, pos);
        pos += 8 + (size_t)nbytes;
    }
    return CKPT_OK;
}

/* The stream is walked mapped: its pickles are handed out where they lie. */
static int pth_legacy_walk(ckpt_walk *w, ckpt_source *src, ckpt_error *err)
{
    memset(&w->stop, 0, sizeof w->stop);
    w->stop.pickle = -1;
    w->called = -1;
    size_t size = (size_t)src->file_size;
    void *map = NULL;
    if (size && (map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, src->fd, 0)) == MAP_FAILED)
        return ckpt_err(err, CKPT_ERR_IO, "cannot map '%s': %s", src->path ? src->path : "the file",
                        strerror(errno));
    int rc = walk_stream(w, map ? map : (const void *)"", size, err);
    if (map)
        munmap(map, size);
    return rc;
}

/* ---- reading: the walk's pickles through ckpt's VM, its storages located ---------- */

typedef struct legacy_read {
    ckpt_file *f;
    ckpt_value **root;
    size_t before; /* this file's storages (a shard adds to others) start here */
} legacy_read;

static const char *const read_names[] = {"magic number", "protocol version", "sys_info", "main",
                                         "storage key list"};

static int read_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **out)
{
    legacy_read *r = w->user;
    ckpt_file *f = r->f;
    const char *what = read_names[p->index];
    char name[64];
    snprintf(name, sizeof(name), "%s pickle", what);
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, name);
    /* torch's file object: a pickle whose reading depends on its buffering
     * (a frame torch may skip the rest of) is refused */
    ctx.feed = CKPT_FEED_CHOOSE;
    if (p->len == 0)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "truncated: the %s pickle is missing", what);
    /* each pickle is bounded by the pickle-size limit, not the file size */
    size_t avail = p->len;
    uint64_t lim = f->limits[CKPT_LIMIT_PICKLE_BYTES];
    int capped = avail > lim;
    if (capped)
        avail = (size_t)lim;
    if (p->index == 3)
        r->before = f->nstorages;
    ckpt_value *v = NULL;
    int rc = ckpt_pickle_load(&ctx, p->buf, avail, &v, used, &f->err);
    if (rc && capped) {
        /* the pickle may be fine, only longer than the user allows */
        char msg[CKPT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", f->err.msg);
        ckpt_err_clear(&f->err);
        return ckpt_err(&f->err, CKPT_ERR_LIMIT, "the %s pickle does not end within the limit "
                        "of %llu bytes (--max-pickle-bytes): %s", what,
                        (unsigned long long)lim, msg);
    }
    if (rc) {
        /* the VM's offsets are within this pickle; say where it starts */
        if (p->offset) {
            size_t l = strlen(f->err.msg);
            snprintf(f->err.msg + l, sizeof(f->err.msg) - l, " (pickle starts at file byte %llu)",
                     (unsigned long long)p->offset);
        }
        return rc;
    }
    *out = v;
    if (p->index == 2) {
        /* torch reads sys_info and ignores it: ckpt reads little-endian files only */
        const ckpt_value *le = ckpt_value_dict_get(v, "little_endian");
        CKPT_RETURN_IF(v->kind != CKPT_KIND_DICT, &f->err, CKPT_ERR_FORMAT,
                       "sys_info is not a dict");
        CKPT_RETURN_IF(le && le->kind == CKPT_KIND_BOOL && !le->u.b, &f->err,
                       CKPT_ERR_UNSUPPORTED, "big-endian checkpoints are not supported");
    } else if (p->index == 3) {
        *r->root = v;
    } else if (p->index == 4) {
        CKPT_RETURN_IF(v->kind != CKPT_KIND_LIST && v->kind != CKPT_KIND_TUPLE, &f->err,
                       CKPT_ERR_FORMAT, "storage key list is a %s",
                       ckpt_kind_name((ckpt_kind)v->kind));
        CKPT_RETURN_IF(v->u.seq.len != f->nstorages - r->before, &f->err, CKPT_ERR_FORMAT,
                       "storage key list names %zu storages, the pickle %zu", (size_t)v->u.seq.len,
                       f->nstorages - r->before);
    }
    return CKPT_OK;
}

static int read_storage(ckpt_walk *w, const ckpt_walk_record *rec, uint64_t *nbytes)
{
    ckpt_file *f = ((legacy_read *)w->user)->f;
    const ckpt_value *kv = rec->key;
    CKPT_RETURN_IF(kv->kind != CKPT_KIND_STR, &f->err, CKPT_ERR_FORMAT,
                   "storage key list holds a %s", ckpt_kind_name((ckpt_kind)kv->kind));
    char buf[600];
    const char *key = ckpt_file_table_key(f, kv->u.s.s, buf, sizeof(buf));
    CKPT_RETURN_IF(!key, &f->err, CKPT_ERR_FORMAT, "storage key of %zu bytes is too long",
                   strlen(kv->u.s.s));
    ckpt_storage *s = ckpt_file_storage_find(f, key);
    CKPT_RETURN_IF(!s, &f->err, CKPT_ERR_FORMAT, "storage key list names unknown storage '%s'",
                   kv->u.s.s);
    CKPT_RETURN_IF(s->loc != CKPT_LOC_NONE, &f->err, CKPT_ERR_FORMAT,
                   "storage '%s' listed twice", s->key);
    CKPT_RETURN_IF(!rec->has_count, &f->err, CKPT_ERR_FORMAT,
                   "truncated: no element count for storage '%s' at byte %llu", s->key,
                   (unsigned long long)rec->offset);
    size_t es = ckpt_dtype_size(s->dtype);
    uint64_t expect = es ? s->nbytes / es : 0, at = rec->offset + 8, left = rec->avail - 8;
    CKPT_RETURN_IF(rec->count != expect, &f->err, CKPT_ERR_FORMAT,
                   "storage '%s' has wrong byte size: expected %llu elements, got %llu", s->key,
                   (unsigned long long)expect, (unsigned long long)rec->count);
    CKPT_RETURN_IF(left < s->nbytes, &f->err, CKPT_ERR_FORMAT,
                   "truncated: storage '%s' needs %llu bytes at byte %llu, the file has %llu",
                   s->key, (unsigned long long)s->nbytes, (unsigned long long)at,
                   (unsigned long long)left);
    s->loc = CKPT_LOC_FILE_RANGE;
    s->file_offset = at;
    *nbytes = s->nbytes;
    return CKPT_OK;
}

static int pth_legacy_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    legacy_read r = {.f = f, .root = root};
    ckpt_walk w = {.pickle = read_pickle, .record = read_storage, .user = &r};
    return pth_legacy_walk(&w, src, &f->err);
}

/* A protocol-2+ pickle: PROTO 2..5 */
static bool pth_legacy_sniff(const uint8_t *head, size_t n)
{
    return n >= 2 && head[0] == CKPT_OP_PROTO && head[1] <= 5;
}

/* ---- writing: the pre-1.6 torch.save stream ------------------------------------
 *
 * Magic number, protocol version and sys_info pickles, the main pickle with
 * 6-item persistent ids, the storage keys sorted as strings, then per
 * storage an int64 element count and its raw bytes: what torch 1.13's
 * _legacy_load reads.
 */
/* pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2) and of 1001 */
static const uint8_t magic_pickle[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                       0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
static const uint8_t protocol_pickle[] = {0x80, 0x02, 0x4d, 0xe9, 0x03, 0x2e};

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} buf;

static void put(buf *b, const void *data, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_u8(buf *b, uint8_t v)
{
    put(b, &v, 1);
}

static void put_le(buf *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        put_u8(b, (uint8_t)(v >> (8 * i)));
}

static void put_str(buf *b, const char *s)
{
    put_u8(b, CKPT_OP_BINUNICODE);
    put_le(b, strlen(s), 4);
    put(b, s, strlen(s));
}

static void put_memo(buf *b, uint32_t i)
{
    if (i < 256) {
        put_u8(b, CKPT_OP_BINPUT);
        put_u8(b, (uint8_t)i);
    } else {
        put_u8(b, CKPT_OP_LONG_BINPUT);
        put_le(b, i, 4);
    }
}

/* {'protocol_version': 1001, 'little_endian': True,
 *  'type_sizes': {'short': 2, 'int': 4, 'long': 4}} as Python pickles it */
static void sys_info(buf *b)
{
    static const uint8_t tail[] = {CKPT_OP_SETITEMS, CKPT_OP_SETITEMS, CKPT_OP_STOP};
    put_u8(b, CKPT_OP_PROTO);
    put_u8(b, 2);
    put_u8(b, CKPT_OP_EMPTY_DICT);
    put_memo(b, 0);
    put_u8(b, CKPT_OP_MARK);
    put_str(b, "protocol_version");
    put_memo(b, 1);
    put_u8(b, CKPT_OP_BININT2);
    put_le(b, 1001, 2);
    put_str(b, "little_endian");
    put_memo(b, 2);
    put_u8(b, CKPT_OP_NEWTRUE);
    put_str(b, "type_sizes");
    put_memo(b, 3);
    put_u8(b, CKPT_OP_EMPTY_DICT);
    put_memo(b, 4);
    put_u8(b, CKPT_OP_MARK);
    put_str(b, "short");
    put_memo(b, 5);
    put_u8(b, CKPT_OP_BININT1);
    put_u8(b, 2);
    put_str(b, "int");
    put_memo(b, 6);
    put_u8(b, CKPT_OP_BININT1);
    put_u8(b, 4);
    put_str(b, "long");
    put_memo(b, 7);
    put_u8(b, CKPT_OP_BININT1);
    put_u8(b, 4);
    put(b, tail, sizeof(tail));
}

typedef struct keyed {
    char key[24];
    const ckpt_storage *s;
} keyed;

static int cmp_key(const void *a, const void *b)
{
    return strcmp(((const keyed *)a)->key, ((const keyed *)b)->key);
}

static int pth_legacy_write(ckpt_file *f, int out, const char *path, const ckpt_write_options *opt)
{
    /* its module objects are the archive's classes, useless without its code */
    CKPT_RETURN_IF(ckpt_root_is_torchscript(f), &f->err, CKPT_ERR_UNSUPPORTED,
                   "a TorchScript archive is not written back as a torch.save file: "
                   "'ckpt extract' writes its state dict");
    (void)path; /* the stream does not name itself */
    ckpt_pickle_out pk;
    CKPT_FORWARD(ckpt_pickle_write2(&f->arena, f->nstorages, f->root, true, &pk, &f->err));
    size_t n = pk.norder;
    keyed *keys = calloc(n ? n : 1, sizeof(*keys));
    buf b = {0};
    int rc = keys ? CKPT_OK : ckpt_oom(&f->err);
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        snprintf(keys[i].key, sizeof(keys[i].key), "%zu", i);
        keys[i].s = f->storages[pk.order[i]];
        /* torch (2.15 too) reads a legacy storage's dtype from its typed
         * storage class: the untyped storages of newer dtypes fail there */
        if (!ckpt_storage_type_name(keys[i].s->dtype))
            rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                          "pth-legacy cannot hold %s tensors: torch loads the pre-1.6 format "
                          "only for dtypes with a typed storage (torch 1.13's); write pth "
                          "or safetensors", ckpt_dtype_name(keys[i].s->dtype));
    }
    if (rc == CKPT_OK) {
        /* torch reads the data back in the order of the sorted key list */
        qsort(keys, n, sizeof(*keys), cmp_key);
        put(&b, magic_pickle, sizeof(magic_pickle));
        put(&b, protocol_pickle, sizeof(protocol_pickle));
        sys_info(&b);
        put(&b, pk.buf, pk.len);
        put_u8(&b, CKPT_OP_PROTO);
        put_u8(&b, 2);
        put_u8(&b, CKPT_OP_EMPTY_LIST);
        put_memo(&b, 0);
        if (n > 1)
            put_u8(&b, CKPT_OP_MARK);
        for (size_t i = 0; i < n; i++) {
            put_str(&b, keys[i].key);
            put_memo(&b, (uint32_t)i + 1);
        }
        if (n == 1)
            put_u8(&b, CKPT_OP_APPEND);
        else if (n > 1)
            put_u8(&b, CKPT_OP_APPENDS);
        put_u8(&b, CKPT_OP_STOP);
        if (b.oom)
            rc = ckpt_oom(&f->err);
        else
            rc = ckpt_write_all(out, b.p, b.n, 0, &f->err);
    }
    uint64_t at = b.n, done = 0, total = 0;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++)
        total += keys[i].s->nbytes;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        const ckpt_storage *s = keys[i].s;
        size_t es = ckpt_dtype_size(s->dtype);
        uint8_t count[8];
        for (int k = 0; k < 8; k++)
            count[k] = (uint8_t)((s->nbytes / (es ? es : 1)) >> (8 * k));
        rc = ckpt_write_all(out, count, 8, at, &f->err);
        at += 8;
        if (rc || !s->nbytes)
            continue;
        int in_fd;
        uint64_t in_off;
        rc = ckpt_storage_raw_range(f, s, false, &in_fd, &in_off);
        bool raw = rc == CKPT_OK;
        if (rc == CKPT_ERR_UNSUPPORTED)
            rc = CKPT_OK; /* cast or deflated: streamed */
        if (rc == CKPT_OK && raw && s->has_crc) {
            uint32_t crc;
            rc = ckpt_crc_range(in_fd, in_off, s->nbytes, &crc, &f->err);
            if (rc == CKPT_OK && crc != s->crc32)
                rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                              "record for storage '%s': CRC-32 mismatch (stored %08x, data %08x): "
                              "the input is corrupt", s->key, s->crc32, crc);
        }
        if (rc == CKPT_OK && raw) {
            rc = ckpt_copy_range(in_fd, in_off, out, at, s->nbytes, &f->err);
        } else if (rc == CKPT_OK) {
            ckpt_fd_sink sk = {.fd = out, .at = at, .err = &f->err};
            rc = ckpt_storage_stream(f, s, false, ckpt_fd_sink_write, &sk);
        }
        at += s->nbytes;
        done += s->nbytes;
        if (rc == CKPT_OK && opt && opt->progress)
            opt->progress(opt->user, done, total);
    }
    free(b.p);
    free(keys);
    ckpt_pickle_out_free(&pk);
    return rc;
}

const ckpt_format_desc ckpt_format_pth_legacy = {
    .id = CKPT_FORMAT_PTH_LEGACY,
    .name = "pth-legacy",
    .sniff = pth_legacy_sniff,
    .read = pth_legacy_read,
    .walk = pth_legacy_walk,
    .write = pth_legacy_write,
};
