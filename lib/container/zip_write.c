/*
 * zip_write.c - zip records in the exact layout torch.save writes
 * (miniz via PyTorchStreamWriter, doc/pth-format.md sections 1.3-1.4):
 * stored, zeroed CRC and sizes in the local header with a data descriptor
 * after the data, an 'FB' extra field padding every record's data to a
 * multiple of 64, zip64 extras where a size or an offset needs them, and a
 * zip64 end record always.
 */
#include "container/container.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 64
#define U32_MAX_FIELD 0xFFFFFFFFu

typedef struct zentry {
    char *name;
    uint64_t offset, size;
    uint32_t crc;
} zentry;

struct ckpt_zipw {
    int fd;
    uint64_t pos;
    ckpt_error *err;
    zentry *ents;
    size_t n, cap;
    bool open_record;
    bool zip64_local; /* the current record's local header has a zip64 extra */
};

static void le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static int write_at(ckpt_zipw *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = pwrite(w->fd, b, n, (off_t)w->pos);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return ckpt_err(w->err, CKPT_ERR_IO, "cannot write: %s", strerror(errno));
        b += k;
        n -= (size_t)k;
        w->pos += (uint64_t)k;
    }
    return CKPT_OK;
}

ckpt_zipw *ckpt_zipw_new(int fd, ckpt_error *err)
{
    ckpt_zipw *w = calloc(1, sizeof(*w));
    if (!w) {
        ckpt_oom(err);
        return NULL;
    }
    w->fd = fd;
    w->err = err;
    return w;
}

void ckpt_zipw_free(ckpt_zipw *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->ents[i].name);
    free(w->ents);
    free(w);
}

int ckpt_zipw_begin(ckpt_zipw *w, const char *name, uint64_t size, uint64_t *data_at)
{
    size_t L = strlen(name);
    if (L > 0xFFFF)
        return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "record name too long");
    if (CKPT_GROW(w->ents, w->cap, w->n + 1) < 0)
        return ckpt_oom(w->err);
    zentry *e = &w->ents[w->n];
    if (!(e->name = strdup(name)))
        return ckpt_oom(w->err);
    e->offset = w->pos;
    e->size = size;
    e->crc = 0;
    w->n++;

    bool big_size = size >= U32_MAX_FIELD, big_off = w->pos >= U32_MAX_FIELD;
    w->zip64_local = big_size || big_off;
    size_t z64 = w->zip64_local ? 4 + (big_size ? 16 : 0) + (big_off ? 8 : 0) : 0;
    uint64_t start = w->pos + 30 + L + z64 + 4;
    size_t pad = (size_t)((ALIGN - start % ALIGN) % ALIGN);
    size_t extra = z64 + 4 + pad;

    uint8_t hdr[30 + 4 + 28 + ALIGN];
    le32(hdr, 0x04034b50);
    le16(hdr + 4, 0);                             /* version needed: stored */
    le16(hdr + 6, size ? 0x0808 : 0x0800);        /* UTF-8 (+ data descriptor) */
    le16(hdr + 8, 0);                             /* stored */
    le16(hdr + 10, 0);                            /* time */
    le16(hdr + 12, 0);                            /* date */
    le32(hdr + 14, 0);                            /* crc: in the descriptor */
    le32(hdr + 18, 0);
    le32(hdr + 22, 0);
    le16(hdr + 26, (uint16_t)L);
    le16(hdr + 28, (uint16_t)extra);
    CKPT_FORWARD(write_at(w, hdr, 30));
    CKPT_FORWARD(write_at(w, name, L));
    size_t k = 0;
    if (w->zip64_local) {
        le16(hdr + k, 0x0001);
        le16(hdr + k + 2, (uint16_t)(z64 - 4));
        k += 4;
        if (big_size) {
            le64(hdr + k, size);
            le64(hdr + k + 8, size);
            k += 16;
        }
        if (big_off) {
            le64(hdr + k, e->offset);
            k += 8;
        }
    }
    hdr[k] = 'F';
    hdr[k + 1] = 'B';
    le16(hdr + k + 2, (uint16_t)pad);
    k += 4;
    memset(hdr + k, 'Z', pad);
    k += pad;
    CKPT_FORWARD(write_at(w, hdr, k));
    w->open_record = true;
    *data_at = w->pos;
    return CKPT_OK;
}

int ckpt_zipw_fd(const ckpt_zipw *w)
{
    return w->fd;
}

int ckpt_zipw_write(ckpt_zipw *w, const void *p, size_t n)
{
    return write_at(w, p, n);
}

void ckpt_zipw_advance(ckpt_zipw *w, uint64_t n)
{
    w->pos += n;
}

int ckpt_zipw_end(ckpt_zipw *w, uint32_t crc)
{
    zentry *e = &w->ents[w->n - 1];
    e->crc = crc;
    w->open_record = false;
    if (w->pos - e->size < e->offset)
        return ckpt_err(w->err, CKPT_ERR_USAGE, "record '%s' ended early", e->name);
    if (e->size == 0)
        return CKPT_OK; /* torch writes no descriptor for an empty record */
    uint8_t d[24];
    le32(d, 0x08074b50);
    le32(d + 4, crc);
    if (w->zip64_local) {
        le64(d + 8, e->size);
        le64(d + 16, e->size);
        return write_at(w, d, 24);
    }
    le32(d + 8, (uint32_t)e->size);
    le32(d + 12, (uint32_t)e->size);
    return write_at(w, d, 16);
}

size_t ckpt_zipw_central(uint8_t *h, size_t cap, const char *name, uint64_t offset,
                         uint64_t size, uint32_t crc)
{
    size_t L = strlen(name);
    bool big_size = size >= U32_MAX_FIELD, big_off = offset >= U32_MAX_FIELD;
    size_t z64 = (big_size || big_off) ? 4 + (big_size ? 16 : 0) + (big_off ? 8 : 0) : 0;
    if (L > 0xFFFF || cap < 46 + L + z64)
        return 0;
    le32(h, 0x02014b50);
    le16(h + 4, 0);  /* made by */
    le16(h + 6, 0);  /* needed */
    le16(h + 8, size ? 0x0808 : 0x0800);
    le16(h + 10, 0); /* stored */
    le16(h + 12, 0);
    le16(h + 14, 0);
    le32(h + 16, crc);
    le32(h + 20, big_size ? U32_MAX_FIELD : (uint32_t)size);
    le32(h + 24, big_size ? U32_MAX_FIELD : (uint32_t)size);
    le16(h + 28, (uint16_t)L);
    le16(h + 30, (uint16_t)z64);
    le16(h + 32, 0); /* comment */
    le16(h + 34, 0); /* disk */
    le16(h + 36, 0); /* internal attributes */
    le32(h + 38, 0); /* external attributes */
    le32(h + 42, big_off ? U32_MAX_FIELD : (uint32_t)offset);
    memcpy(h + 46, name, L);
    if (z64) {
        uint8_t *x = h + 46 + L;
        size_t k = 0;
        le16(x + k, 0x0001);
        le16(x + k + 2, (uint16_t)(z64 - 4));
        k += 4;
        if (big_size) {
            le64(x + k, size);
            le64(x + k + 8, size);
            k += 16;
        }
        if (big_off)
            le64(x + k, offset);
    }
    return 46 + L + z64;
}

void ckpt_zipw_ends(uint8_t r[CKPT_ZIPW_ENDS], uint64_t count, uint64_t cd_start, uint64_t cd_size)
{
    uint64_t eocd64 = cd_start + cd_size;
    le32(r, 0x06064b50);
    le64(r + 4, 44);
    le16(r + 12, 0x031E);
    le16(r + 14, 0x002D);
    le32(r + 16, 0);
    le32(r + 20, 0);
    le64(r + 24, count);
    le64(r + 32, count);
    le64(r + 40, cd_size);
    le64(r + 48, cd_start);
    le32(r + 56, 0x07064b50);
    le32(r + 60, 0);
    le64(r + 64, eocd64);
    le32(r + 72, 1);
    uint8_t *c = r + 76;
    le32(c, 0x06054b50);
    le16(c + 4, 0);
    le16(c + 6, 0);
    le16(c + 8, (uint16_t)(count < 0xFFFF ? count : 0xFFFF));
    le16(c + 10, (uint16_t)(count < 0xFFFF ? count : 0xFFFF));
    le32(c + 12, cd_size < U32_MAX_FIELD ? (uint32_t)cd_size : U32_MAX_FIELD);
    le32(c + 16, cd_start < U32_MAX_FIELD ? (uint32_t)cd_start : U32_MAX_FIELD);
    le16(c + 20, 0);
}

uint64_t ckpt_zipw_span(size_t name_len, uint64_t size, uint64_t at)
{
    bool big_size = size >= U32_MAX_FIELD, big_off = at >= U32_MAX_FIELD;
    bool z = big_size || big_off;
    size_t z64 = z ? 4 + (big_size ? 16 : 0) + (big_off ? 8 : 0) : 0;
    uint64_t start = at + 30 + name_len + z64 + 4;
    uint64_t pad = (ALIGN - start % ALIGN) % ALIGN;
    return start + pad - at + size + (size ? (z ? 24 : 16) : 0);
}

void ckpt_zipw_seek(ckpt_zipw *w, uint64_t pos)
{
    w->pos = pos;
}

int ckpt_zipw_finish(ckpt_zipw *w)
{
    uint64_t cd_start = w->pos;
    for (size_t i = 0; i < w->n; i++) {
        zentry *e = &w->ents[i];
        uint8_t h[46 + 28 + 0xFFFF];
        size_t n = ckpt_zipw_central(h, sizeof(h), e->name, e->offset, e->size, e->crc);
        if (!n)
            return ckpt_err(w->err, CKPT_ERR_UNSUPPORTED, "record name too long");
        CKPT_FORWARD(write_at(w, h, n));
    }
    uint8_t r[CKPT_ZIPW_ENDS];
    ckpt_zipw_ends(r, w->n, cd_start, w->pos - cd_start);
    return write_at(w, r, sizeof(r));
}

size_t ckpt_zipw_count(const ckpt_zipw *w) { return w->n; }
const char *ckpt_zipw_name(const ckpt_zipw *w, size_t i) { return w->ents[i].name; }
uint32_t ckpt_zipw_crc(const ckpt_zipw *w, size_t i) { return w->ents[i].crc; }
