/*
 * format_pth_legacy_write.c - the pre-1.6 torch.save stream
 * (reference/pth-format.md section 2): magic number, protocol version and
 * sys_info pickles, the main pickle with 6-item persistent ids, the storage
 * keys sorted as strings, then per storage an int64 element count and its
 * raw bytes.  What torch 1.13's _legacy_load reads.
 */
#include "formats/format.h"

#include <stdlib.h>
#include <string.h>

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
    put_u8(b, 'X');
    put_le(b, strlen(s), 4);
    put(b, s, strlen(s));
}

static void put_memo(buf *b, uint32_t i)
{
    if (i < 256) {
        put_u8(b, 'q');
        put_u8(b, (uint8_t)i);
    } else {
        put_u8(b, 'r');
        put_le(b, i, 4);
    }
}

/* {'protocol_version': 1001, 'little_endian': True,
 *  'type_sizes': {'short': 2, 'int': 4, 'long': 4}} as Python pickles it */
static void sys_info(buf *b)
{
    static const uint8_t tail[] = {'u', 'u', '.'};
    put_u8(b, 0x80);
    put_u8(b, 2);
    put_u8(b, '}');
    put_memo(b, 0);
    put_u8(b, '(');
    put_str(b, "protocol_version");
    put_memo(b, 1);
    put_u8(b, 'M');
    put_le(b, 1001, 2);
    put_str(b, "little_endian");
    put_memo(b, 2);
    put_u8(b, 0x88);
    put_str(b, "type_sizes");
    put_memo(b, 3);
    put_u8(b, '}');
    put_memo(b, 4);
    put_u8(b, '(');
    put_str(b, "short");
    put_memo(b, 5);
    put_u8(b, 'K');
    put_u8(b, 2);
    put_str(b, "int");
    put_memo(b, 6);
    put_u8(b, 'K');
    put_u8(b, 4);
    put_str(b, "long");
    put_memo(b, 7);
    put_u8(b, 'K');
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

int ckpt_pth_legacy_write(ckpt_file *f, int out, const char *path, const ckpt_write_options *opt)
{
    (void)path; /* the stream does not name itself */
    (void)opt;  /* nothing to choose: every storage, as torch wrote them */
    ckpt_pickle_out pk;
    CKPT_FORWARD(ckpt_pickle_write2(&f->arena, f->nstorages, f->root, true, &pk, &f->err));
    size_t n = pk.norder;
    keyed *keys = calloc(n ? n : 1, sizeof(*keys));
    buf b = {0};
    int rc = keys ? CKPT_OK : ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        snprintf(keys[i].key, sizeof(keys[i].key), "%zu", i);
        keys[i].s = f->storages[pk.order[i]];
    }
    if (rc == CKPT_OK) {
        /* torch reads the data back in the order of the sorted key list */
        qsort(keys, n, sizeof(*keys), cmp_key);
        put(&b, magic_pickle, sizeof(magic_pickle));
        put(&b, protocol_pickle, sizeof(protocol_pickle));
        sys_info(&b);
        put(&b, pk.buf, pk.len);
        put_u8(&b, 0x80);
        put_u8(&b, 2);
        put_u8(&b, ']');
        put_memo(&b, 0);
        if (n > 1)
            put_u8(&b, '(');
        for (size_t i = 0; i < n; i++) {
            put_str(&b, keys[i].key);
            put_memo(&b, (uint32_t)i + 1);
        }
        if (n == 1)
            put_u8(&b, 'a');
        else if (n > 1)
            put_u8(&b, 'e');
        put_u8(&b, '.');
        if (b.oom)
            rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
        else
            rc = ckpt_write_all(out, b.p, b.n, 0, &f->err);
    }
    uint64_t at = b.n;
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
        rc = ckpt_storage_raw_range(f, s, &in_fd, &in_off);
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
            rc = ckpt_storage_stream(f, s, ckpt_fd_sink_write, &sk);
        }
        at += s->nbytes;
    }
    free(b.p);
    free(keys);
    ckpt_pickle_out_free(&pk);
    return rc;
}
