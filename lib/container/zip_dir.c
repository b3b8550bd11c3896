/*
 * zip_dir.c - a zip archive's end records and central directory as each of
 * three readers sees them: torch (miniz, as caffe2's inline_container builds
 * it), Python's zipfile (3.11) and libzip.  They disagree on hostile files,
 * and a scanner that reads other bytes than torch.load does says "safe" about
 * a payload; so each reader's choice is modelled here, and every point where
 * the choices can differ is a finding.
 *
 * The rules, from the readers' sources and checked by tests/interop/zip_readers.py:
 * - torch (miniz mz_zip_reader_locate_header_sig): the last end-record
 *   signature with 22 bytes after it, searched backwards in 4 KiB chunks over
 *   about the last 64 KiB; zip64 through the locator's offset; the entry count
 *   from the end record; names sorted by a heap sort and looked up by a binary
 *   search ignoring ASCII case (which of duplicate names is found depends on
 *   both, so both are copied); records under the first entry's directory;
 *   no CRC-32 check (MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS); torch.load takes
 *   a file for a zip only when it starts with a local header.
 * - Python's zipfile: the last 22 bytes when they are an end record without a
 *   comment, else the last signature in the last 64 KiB + 22; the zip64 record
 *   just before its locator; entries walked by the directory's byte size, not
 *   its count; offsets shifted by "concat" (where the end record is, less the
 *   directory's size and offset); names cut at a NUL; the last of duplicates;
 *   a read checks the local name, overlap with the next header, and CRC-32.
 * - libzip: asked itself (zip_fdopen); which end record it chose is found by
 *   matching its entries against each candidate's directory.
 */
#include "container/container.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>
#include <zlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define U32_MAX 0xFFFFFFFFu
#define MAX_FINDINGS 64
#define NO_OFFSET UINT64_MAX

typedef struct {
    bool ok;            /* false: this reader refuses the archive (why) */
    char why[200];
    uint64_t end_at;    /* the end record it uses */
    uint64_t cd_at, cd_size;
    size_t count;
    ckpt_zip_entry *e;
    uint32_t *sorted;   /* torch: miniz's sorted index */
} view;

struct ckpt_zip_dir {
    uint64_t size;
    uint64_t base;      /* the archive's first byte in the file (a window) */
    bool starts_local;  /* torch.load's _is_zipfile */
    int64_t concat;     /* Python's zipfile offset shift */
    view v[CKPT_ZIP_READERS];
    uint64_t *ends;     /* every end-record signature readers could take */
    size_t nends;
    char *findings[MAX_FINDINGS];
    size_t nfindings;
    size_t dropped;
};

static const char *reader_name[CKPT_ZIP_READERS] = {"torch", "Python's zipfile", "libzip"};

const char *ckpt_zip_reader_name(ckpt_zip_reader r) { return reader_name[r]; }

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The window being parsed: offsets inside the archive are counted from
 * BASE of the file (a zip stored inside a larger file, as a DCP item is).
 * Set only while ckpt_zip_dir_open_at runs, on its thread. */
static _Thread_local uint64_t window_base;

static int rd(int fd, void *buf, size_t n, uint64_t at)
{
    return ckpt_pread_all(fd, buf, n, window_base + at);
}

/* Read N bytes at AT; false when the file has fewer. */
static bool get(int fd, uint64_t size, void *buf, size_t n, uint64_t at)
{
    return at <= size && size - at >= n && rd(fd, buf, n, at) == 0;
}

static void vfinding(ckpt_zip_dir *d, const char *fmt, va_list ap)
{
    if (d->nfindings == MAX_FINDINGS) {
        d->dropped++;
        return;
    }
    char buf[400];
    vsnprintf(buf, sizeof buf, fmt, ap);
    d->findings[d->nfindings] = strdup(buf);
    if (d->findings[d->nfindings])
        d->nfindings++;
}

static void finding(ckpt_zip_dir *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void finding(ckpt_zip_dir *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfinding(d, fmt, ap);
    va_end(ap);
}

static void refuse(view *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(view *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
    v->ok = false;
}

/* A name for a message: printable ASCII, the rest as \xNN, cut at 80. */
static const char *shown(const ckpt_zip_entry *e, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < e->name_len && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)e->name[i];
        if (i == 80) {
            o += (size_t)snprintf(buf + o, cap - o, "...");
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = 0;
    return buf;
}

/* ---- end records ---------------------------------------------------------- */

/* miniz's mz_zip_reader_locate_header_sig, literally. */
static bool miniz_locate_end(int fd, uint64_t size, uint64_t *at)
{
    uint8_t buf[4096];
    if (size < 22)
        return false;
    int64_t cur = (int64_t)size - (int64_t)sizeof buf;
    if (cur < 0)
        cur = 0;
    for (;;) {
        size_t n = size - (uint64_t)cur < sizeof buf ? (size_t)(size - (uint64_t)cur) : sizeof buf;
        if (rd(fd, buf, n, (uint64_t)cur))
            return false;
        int i;
        for (i = (int)n - 4; i >= 0; --i)
            if (le(buf + i, 4) == SIG_END && size - ((uint64_t)cur + (uint64_t)i) >= 22)
                break;
        if (i >= 0) {
            *at = (uint64_t)cur + (uint64_t)i;
            return true;
        }
        if (!cur || size - (uint64_t)cur >= 65535 + 22)
            return false;
        cur = cur - (int64_t)(sizeof buf - 3);
        if (cur < 0)
            cur = 0;
    }
}

/* Python's zipfile _EndRecData: the end record's offset, or false. */
static bool py_locate_end(int fd, uint64_t size, uint64_t *at)
{
    uint8_t t[22];
    if (size < 22)
        return false;
    if (get(fd, size, t, 22, size - 22) && le(t, 4) == SIG_END && le(t + 20, 2) == 0) {
        *at = size - 22;
        return true;
    }
    uint64_t from = size > 65536 + 22 ? size - 65536 - 22 : 0;
    size_t n = (size_t)(size - from);
    uint8_t *b = malloc(n);
    if (!b || rd(fd, b, n, from)) {
        free(b);
        return false;
    }
    bool found = false;
    for (size_t i = n - 4 + 1; i-- > 0;)
        if (le(b + i, 4) == SIG_END) {
            /* the last signature, even one too near the end to be a record */
            found = n - i >= 22;
            *at = from + i;
            break;
        }
    free(b);
    return found;
}

typedef struct {
    uint64_t count, cd_size, cd_at, this_disk, cd_disk, count_disk;
    bool zip64;
    uint64_t end64_at;
} endrec;

static void end_read(const uint8_t *p, endrec *r)
{
    memset(r, 0, sizeof *r);
    r->this_disk = le(p + 4, 2);
    r->cd_disk = le(p + 6, 2);
    r->count_disk = le(p + 8, 2);
    r->count = le(p + 10, 2);
    r->cd_size = le(p + 12, 4);
    r->cd_at = le(p + 16, 4);
}

/* The zip64 end record: miniz goes where the locator points, Python's zipfile
 * to the 56 bytes just before the locator. */
static int end64(int fd, uint64_t size, uint64_t at, bool miniz, endrec *r, view *v)
{
    uint8_t loc[20], rec[56];
    if (at < 20 || !get(fd, size, loc, 20, at - 20) || le(loc, 4) != SIG_LOC64)
        return 0;
    uint64_t where;
    if (miniz) {
        if (at < 76)
            return 0;
        where = le(loc + 8, 8);
        if (where > size - 56) {
            refuse(v, "its zip64 locator points past the end of the file");
            return -1;
        }
    } else {
        if (le(loc + 4, 4) != 0 || le(loc + 16, 4) > 1) {
            refuse(v, "zipfiles that span multiple disks are not supported");
            return -1;
        }
        if (at < 76)
            return 0;
        where = at - 76;
    }
    if (!get(fd, size, rec, 56, where) || le(rec, 4) != SIG_END64)
        return 0;
    if (miniz) {
        if (le(rec + 4, 8) < 44) {
            refuse(v, "its zip64 end record is too short");
            return -1;
        }
        if (le(loc + 16, 4) != 1) {
            refuse(v, "its zip64 locator names several disks");
            return -1;
        }
        if (le(rec + 32, 8) > U32_MAX || le(rec + 24, 8) > U32_MAX || le(rec + 40, 8) > U32_MAX) {
            refuse(v, "its zip64 end record declares more than miniz handles");
            return -1;
        }
    }
    r->zip64 = true;
    r->end64_at = where;
    r->this_disk = le(rec + 16, 4);
    r->cd_disk = le(rec + 20, 4);
    r->count_disk = le(rec + 24, 8);
    r->count = le(rec + 32, 8);
    r->cd_size = le(rec + 40, 8);
    r->cd_at = le(rec + 48, 8);
    return 0;
}

/* ---- central directories -------------------------------------------------- */

/* The zip64 extra of a central entry: fields that are 0xFFFFFFFF above, in
 * order.  Returns false when a needed field is missing or the extra is bad. */
static bool zip64_extra(const uint8_t *x, size_t xl, uint64_t *usize, uint64_t *csize,
                        uint64_t *off, bool strict_usize)
{
    bool need = *usize == U32_MAX || *csize == U32_MAX || *off == U32_MAX;
    while (xl >= 4) {
        size_t id = (size_t)le(x, 2), len = (size_t)le(x + 2, 2);
        if (len + 4 > xl)
            return !need;
        if (id == 1) {
            const uint8_t *q = x + 4;
            size_t left = len;
            uint64_t *f[3] = {usize, csize, off};
            for (int k = 0; k < 3; k++) {
                bool wide = *f[k] == U32_MAX || (k == 0 && !strict_usize && *f[k] == UINT64_MAX);
                if (!wide)
                    continue;
                if (left < 8)
                    return false;
                *f[k] = le(q, 8);
                q += 8;
                left -= 8;
            }
            return true;
        }
        x += 4 + len;
        xl -= 4 + len;
    }
    return true;
}

static int entries_alloc(view *v, uint64_t n)
{
    v->e = calloc(n ? (size_t)n : 1, sizeof *v->e);
    return v->e ? CKPT_OK : CKPT_ERR_NOMEM;
}

/* What local header each entry points to: where its data starts, and whether
 * the header says what the directory does. */
static void locals(int fd, uint64_t size, view *v)
{
    /* one per record, megabytes apart: read from the disk together */
    for (size_t i = 0; i < v->count; i++)
        if (v->e[i].header_at < size)
            ckpt_prefetch(fd, window_base + v->e[i].header_at, 30 + (uint64_t)v->e[i].name_len);
    for (size_t i = 0; i < v->count; i++) {
        ckpt_zip_entry *e = &v->e[i];
        uint8_t h[30];
        e->data_at = NO_OFFSET;
        if (!get(fd, size, h, 30, e->header_at) || le(h, 4) != SIG_LOCAL)
            continue;
        e->local_name_len = (size_t)le(h + 26, 2);
        e->data_at = e->header_at + 30 + e->local_name_len + le(h + 28, 2);
        e->local_method = (uint16_t)le(h + 8, 2);
        e->local_flags = (uint16_t)le(h + 6, 2);
        e->local_crc = (uint32_t)le(h + 14, 4);
        e->local_csize = le(h + 18, 4);
        e->local_usize = le(h + 22, 4);
        e->local_name_same = false;
        if (e->local_name_len == e->name_len) {
            char *n = malloc(e->name_len ? e->name_len : 1);
            e->local_name_same = n && get(fd, size, n, e->name_len, e->header_at + 30) &&
                                 memcmp(n, e->name, e->name_len) == 0;
            free(n);
        }
    }
}

/* miniz's heap sort of names (ASCII case folded) and its binary search. */
static int name_cmp(const char *a, size_t al, const char *b, size_t bl)
{
    size_t n = al < bl ? al : bl;
    for (size_t i = 0; i < n; i++) {
        int x = (unsigned char)a[i], y = (unsigned char)b[i];
        x = x >= 'A' && x <= 'Z' ? x + 32 : x;
        y = y >= 'A' && y <= 'Z' ? y + 32 : y;
        if (x != y)
            return x - y;
    }
    return (int)al - (int)bl;
}

static bool less(const view *v, uint32_t l, uint32_t r)
{
    return name_cmp(v->e[l].name, v->e[l].name_len, v->e[r].name, v->e[r].name_len) < 0;
}

static void sift(view *v, uint32_t *ix, uint64_t root, uint64_t size)
{
    for (;;) {
        uint64_t child = (root << 1) + 1;
        if (child >= size)
            break;
        child += (child + 1 < size) && less(v, ix[child], ix[child + 1]);
        if (!less(v, ix[root], ix[child]))
            break;
        uint32_t t = ix[root];
        ix[root] = ix[child];
        ix[child] = t;
        root = child;
    }
}

static void miniz_sort(view *v)
{
    uint32_t size = (uint32_t)v->count, *ix = v->sorted;
    for (uint32_t i = 0; i < size; i++)
        ix[i] = i;
    if (size <= 1)
        return;
    for (uint32_t start = (size - 2) >> 1;; start--) {
        sift(v, ix, start, size);
        if (!start)
            break;
    }
    for (uint32_t end = size - 1; end > 0; end--) {
        uint32_t t = ix[end];
        ix[end] = ix[0];
        ix[0] = t;
        sift(v, ix, 0, end);
    }
}

static int64_t miniz_find(const view *v, const char *name)
{
    size_t nl = strlen(name);
    int64_t l = 0, h = (int64_t)v->count - 1;
    while (l <= h) {
        int64_t m = l + ((h - l) >> 1);
        uint32_t i = v->sorted[m];
        int c = name_cmp(v->e[i].name, v->e[i].name_len, name, nl);
        if (!c)
            return i;
        if (c < 0)
            l = m + 1;
        else
            h = m - 1;
    }
    return -1;
}

/* The end record at AT (and its zip64 record) into *R, for V: false when V
 * is decided there (refused with UNREADABLE, or by the zip64 record). */
static bool end_at(int fd, uint64_t size, uint64_t at, bool miniz, const char *unreadable,
                   endrec *r, view *v)
{
    uint8_t p[22];
    if (!get(fd, size, p, 22, at)) {
        refuse(v, unreadable);
        return false;
    }
    v->end_at = at;
    end_read(p, r);
    return !end64(fd, size, at, miniz, r, v);
}

/* miniz's mz_zip_reader_read_central_dir (torch's reader). */
static int read_torch(int fd, uint64_t size, view *v)
{
    v->ok = true;
    uint64_t at;
    if (!miniz_locate_end(fd, size, &at)) {
        refuse(v, "no end record");
        return CKPT_OK;
    }
    endrec r;
    if (!end_at(fd, size, at, true, "unreadable end record", &r, v))
        return CKPT_OK;
    if (r.count != r.count_disk || ((r.this_disk | r.cd_disk) && (r.this_disk != 1 || r.cd_disk != 1))) {
        refuse(v, "a multi-disk archive");
        return CKPT_OK;
    }
    if (r.cd_size < r.count * 46 || r.cd_at > size || r.cd_size > size - r.cd_at) {
        refuse(v, "its central directory is corrupt (size or offset)");
        return CKPT_OK;
    }
    v->cd_at = r.cd_at;
    v->cd_size = r.cd_size;
    uint8_t *cd = malloc(r.cd_size ? (size_t)r.cd_size : 1);
    if (!cd || entries_alloc(v, r.count) || !(v->sorted = calloc(r.count ? r.count : 1, 4))) {
        free(cd);
        return CKPT_ERR_NOMEM;
    }
    if (rd(fd, cd, (size_t)r.cd_size, r.cd_at)) {
        free(cd);
        refuse(v, "cannot read its central directory");
        return CKPT_OK;
    }
    uint64_t pos = 0;
    for (uint64_t i = 0; i < r.count; i++) {
        const uint8_t *q = cd + pos;
        if (r.cd_size - pos < 46 || le(q, 4) != SIG_CENTRAL) {
            refuse(v, "central directory entry %llu is corrupt", (unsigned long long)i);
            break;
        }
        ckpt_zip_entry *e = &v->e[i];
        size_t nl = (size_t)le(q + 28, 2), xl = (size_t)le(q + 30, 2), cl = (size_t)le(q + 32, 2);
        uint64_t total = 46 + (uint64_t)nl + xl + cl;
        e->cd_at = r.cd_at + pos;
        e->flags = (uint16_t)le(q + 8, 2);
        e->method = (uint16_t)le(q + 10, 2);
        e->crc = (uint32_t)le(q + 16, 4);
        e->csize = le(q + 20, 4);
        e->usize = le(q + 24, 4);
        e->header_at = le(q + 42, 4);
        bool wide = e->csize == U32_MAX || e->usize == U32_MAX || e->header_at == U32_MAX;
        if (total > r.cd_size - pos) {
            refuse(v, "central directory entry %llu is corrupt", (unsigned long long)i);
            break;
        }
        e->name = (char *)malloc(nl + 1);
        if (!e->name) {
            free(cd);
            return CKPT_ERR_NOMEM;
        }
        memcpy(e->name, q + 46, nl);
        e->name[nl] = 0;
        e->name_len = nl;
        v->count = (size_t)i + 1;
        if (wide && !zip64_extra(q + 46 + nl, xl, &e->usize, &e->csize, &e->header_at, true)) {
            refuse(v, "central directory entry %llu has a corrupt zip64 extra",
                   (unsigned long long)i);
            break;
        }
        if (!wide && ((le(q + 10, 4) == 0 && e->usize != e->csize) || (e->usize && !e->csize))) {
            refuse(v, "central directory entry %llu has impossible sizes", (unsigned long long)i);
            break;
        }
        uint64_t disk = le(q + 34, 2);
        if (disk == 0xFFFF || (disk != r.this_disk && disk != 1)) {
            refuse(v, "a multi-disk archive");
            break;
        }
        if (le(q + 20, 4) != U32_MAX && e->header_at + 30 + e->csize > size) {
            refuse(v, "central directory entry %llu runs past the end of the file",
                   (unsigned long long)i);
            break;
        }
        if (e->flags & 0x2000) {
            refuse(v, "an encrypted central directory");
            break;
        }
        pos += total;
    }
    free(cd);
    if (v->ok) {
        miniz_sort(v);
        locals(fd, size, v);
    }
    return CKPT_OK;
}

/* Python 3.11's zipfile _RealGetContents. */
static int read_py(int fd, uint64_t size, view *v, int64_t *concat_out)
{
    v->ok = true;
    uint64_t at;
    if (!py_locate_end(fd, size, &at)) {
        refuse(v, "File is not a zip file");
        return CKPT_OK;
    }
    endrec r;
    if (!end_at(fd, size, at, false, "File is not a zip file", &r, v))
        return CKPT_OK;
    /* offsets are taken relative to where the directory "should" end:
     * concat = at - cd_size - cd_at (less the zip64 records), in Python's
     * unbounded integers; here modulo 2^64, so an offset it makes negative
     * wraps to one past the file (unreadable, as Python's seek fails) */
    uint64_t lead = r.zip64 ? 76 : 0;
    if (r.cd_size > size || r.cd_size > at || at - r.cd_size < lead) {
        refuse(v, "Bad offset for central directory");
        return CKPT_OK;
    }
    uint64_t start = at - r.cd_size - lead, concat = start - r.cd_at;
    *concat_out = concat <= INT64_MAX ? (int64_t)concat : -(int64_t)((0 - concat) & INT64_MAX);
    v->cd_at = (uint64_t)start;
    /* fp.read(size_cd) gives what there is */
    uint64_t have = (uint64_t)start >= size ? 0 : size - (uint64_t)start;
    uint64_t n = r.cd_size < have ? r.cd_size : have;
    v->cd_size = n;
    uint8_t *cd = malloc(n ? (size_t)n : 1);
    if (!cd || entries_alloc(v, n / 46 + 1)) {
        free(cd);
        return CKPT_ERR_NOMEM;
    }
    if (rd(fd, cd, (size_t)n, (uint64_t)start)) {
        free(cd);
        refuse(v, "cannot read the central directory");
        return CKPT_OK;
    }
    uint64_t total = 0, pos = 0;
    while (total < r.cd_size) {
        if (n - pos < 46) {
            refuse(v, "Truncated central directory");
            break;
        }
        const uint8_t *q = cd + pos;
        if (le(q, 4) != SIG_CENTRAL) {
            refuse(v, "Bad magic number for central directory");
            break;
        }
        size_t nl = (size_t)le(q + 28, 2), xl = (size_t)le(q + 30, 2), cl = (size_t)le(q + 32, 2);
        /* fp.read() of a short rest gives what there is: the entry is kept */
        size_t nh = n - pos - 46 < nl ? (size_t)(n - pos - 46) : nl;
        size_t xh = n - pos - 46 - nh < xl ? (size_t)(n - pos - 46 - nh) : xl;
        if (le(q + 6, 2) > 63) {
            refuse(v, "zip file version %.1f", (double)le(q + 6, 2) / 10);
            break;
        }
        ckpt_zip_entry *e = &v->e[v->count];
        e->name = malloc(nh + 1);
        if (!e->name) {
            free(cd);
            return CKPT_ERR_NOMEM;
        }
        memcpy(e->name, q + 46, nh);
        e->name[nh] = 0;
        e->name_len = nh;
        e->cd_at = (uint64_t)start + pos;
        e->flags = (uint16_t)le(q + 8, 2);
        e->method = (uint16_t)le(q + 10, 2);
        e->crc = (uint32_t)le(q + 16, 4);
        e->csize = le(q + 20, 4);
        e->usize = le(q + 24, 4);
        e->header_at = le(q + 42, 4);
        v->count++;
        /* a UTF-8 flagged name must decode; a NUL ends the name (for lookups) */
        if (!zip64_extra(q + 46 + nh, xh, &e->usize, &e->csize, &e->header_at, false)) {
            refuse(v, "Corrupt zip64 extra field");
            break;
        }
        e->header_at += concat;
        size_t step = 46 + nl + xl + cl;
        total += step;
        pos = pos + step < n ? pos + step : n;
    }
    free(cd);
    if (v->ok)
        locals(fd, size, v);
    return CKPT_OK;
}

/* libzip's own parse; the end record it chose is the candidate whose directory
 * (by our parse) matches what libzip lists. */
static int read_libzip(int fd, uint64_t size, ckpt_zip_dir *d, view *v)
{
    v->ok = true;
    int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0), ze = 0;
    if (dfd < 0 || lseek(dfd, 0, SEEK_SET) != 0) {
        if (dfd >= 0)
            close(dfd);
        refuse(v, "cannot read the file");
        return CKPT_OK;
    }
    zip_t *za = NULL;
    if (window_base == 0) {
        za = zip_fdopen(dfd, ZIP_RDONLY, &ze);
    } else {
        /* a window: libzip reads that range of the file as the whole archive */
        FILE *fp = fdopen(dfd, "rb");
        zip_error_t zerr;
        zip_error_init(&zerr);
        zip_source_t *src = fp ? zip_source_filep_create(fp, window_base, (zip_int64_t)size, &zerr)
                               : NULL;
        if (src && !(za = zip_open_from_source(src, ZIP_RDONLY, &zerr)))
            zip_source_free(src); /* closes fp */
        else if (!src && fp)
            fclose(fp);
        ze = zip_error_code_zip(&zerr);
        zip_error_fini(&zerr);
        if (fp)
            dfd = -1; /* fp owns it now */
        if (!za && ze == 0)
            ze = ZIP_ER_NOZIP;
    }
    if (!za) {
        if (dfd >= 0)
            close(dfd);
        char why[512];
        ckpt_zip_refusal(fd, window_base, size, ze, why, sizeof why);
        refuse(v, "%s", why);
        return CKPT_OK;
    }
    zip_int64_t n = zip_get_num_entries(za, 0);
    if (n < 0)
        n = 0;
    if (entries_alloc(v, (uint64_t)n)) {
        zip_discard(za);
        return CKPT_ERR_NOMEM;
    }
    for (zip_int64_t i = 0; i < n; i++) {
        zip_stat_t st;
        zip_stat_init(&st);
        ckpt_zip_entry *e = &v->e[i];
        const char *nm = NULL;
        if (zip_stat_index(za, (zip_uint64_t)i, ZIP_FL_ENC_RAW, &st) == 0 && (st.valid & ZIP_STAT_NAME))
            nm = st.name;
        e->name_len = nm ? strlen(nm) : 0;
        e->name = malloc(e->name_len + 1);
        if (!e->name) {
            zip_discard(za);
            return CKPT_ERR_NOMEM;
        }
        memcpy(e->name, nm ? nm : "", e->name_len + 1);
        e->usize = st.size;
        e->csize = st.comp_size;
        e->crc = st.crc;
        e->method = (uint16_t)st.comp_method;
        e->header_at = NO_OFFSET;
        e->data_at = NO_OFFSET;
        e->cd_at = NO_OFFSET;
        v->count = (size_t)i + 1;
    }
    zip_discard(za);
    /* which candidate: a directory of the same names, sizes and CRCs */
    v->end_at = NO_OFFSET;
    for (size_t k = d->nends; k-- > 0;) {
        uint8_t p[22];
        endrec r;
        if (!get(fd, size, p, 22, d->ends[k]))
            continue;
        end_read(p, &r);
        view tmp = {.ok = true};
        if (end64(fd, size, d->ends[k], true, &r, &tmp) || r.count != v->count ||
            r.cd_at > size || r.cd_size > size - r.cd_at)
            continue;
        uint8_t *cd = malloc(r.cd_size ? (size_t)r.cd_size : 1);
        if (!cd)
            return CKPT_ERR_NOMEM;
        bool same = rd(fd, cd, (size_t)r.cd_size, r.cd_at) == 0;
        uint64_t pos = 0;
        uint64_t *offs = calloc(v->count + 1, sizeof *offs), *cds = calloc(v->count + 1, sizeof *cds);
        for (size_t i = 0; same && offs && cds && i < v->count; i++) {
            const uint8_t *q = cd + pos;
            if (r.cd_size - pos < 46 || le(q, 4) != SIG_CENTRAL) {
                same = false;
                break;
            }
            size_t nl = (size_t)le(q + 28, 2), xl = (size_t)le(q + 30, 2), cl = (size_t)le(q + 32, 2);
            if (r.cd_size - pos - 46 < (uint64_t)nl + xl + cl) {
                same = false;
                break;
            }
            uint64_t us = le(q + 24, 4), cs = le(q + 20, 4), off = le(q + 42, 4);
            zip64_extra(q + 46 + nl, xl, &us, &cs, &off, true);
            const ckpt_zip_entry *e = &v->e[i];
            same = nl == e->name_len && memcmp(q + 46, e->name, nl) == 0 && us == e->usize &&
                   cs == e->csize && le(q + 16, 4) == e->crc;
            offs[i] = off;
            cds[i] = r.cd_at + pos;
            pos += 46 + nl + xl + cl;
        }
        if (same && offs && cds) {
            v->end_at = d->ends[k];
            v->cd_at = r.cd_at;
            v->cd_size = r.cd_size;
            for (size_t i = 0; i < v->count; i++) {
                v->e[i].header_at = offs[i];
                v->e[i].cd_at = cds[i];
            }
        }
        free(offs);
        free(cds);
        free(cd);
        if (v->end_at != NO_OFFSET)
            break;
    }
    if (v->end_at != NO_OFFSET)
        locals(fd, size, v);
    return CKPT_OK;
}

/* ---- findings -------------------------------------------------------------- */

static bool in_data(const view *v, uint64_t at, uint64_t len)
{
    for (size_t i = 0; v->ok && i < v->count; i++) {
        const ckpt_zip_entry *e = &v->e[i];
        if (e->data_at != NO_OFFSET && at >= e->data_at && e->data_at + e->csize >= at + len &&
            e->data_at + e->csize >= e->data_at)
            return true;
    }
    return false;
}

static bool referenced(const ckpt_zip_dir *d, uint64_t at, uint64_t len)
{
    for (int r = 0; r < CKPT_ZIP_READERS; r++)
        if (in_data(&d->v[r], at, len))
            return true;
    return false;
}

static void find_ends(ckpt_zip_dir *d, int fd)
{
    uint64_t from = d->size > 65536 + 22 + 4096 ? d->size - 65536 - 22 - 4096 : 0;
    size_t n = (size_t)(d->size - from);
    uint8_t *b = malloc(n ? n : 1);
    d->ends = calloc(16, sizeof *d->ends);
    if (!b || !d->ends || rd(fd, b, n, from)) {
        free(b);
        return;
    }
    for (size_t i = 0; i + 22 <= n && d->nends < 16; i++)
        if (le(b + i, 4) == SIG_END)
            d->ends[d->nends++] = from + i;
    free(b);
}

static void who_took(const ckpt_zip_dir *d, uint64_t at, char *buf, size_t cap)
{
    int take[CKPT_ZIP_READERS], n = 0;
    for (int r = 0; r < CKPT_ZIP_READERS; r++)
        if (d->v[r].ok && d->v[r].end_at == at)
            take[n++] = r;
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < n && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", k == 0 ? "" : k == n - 1 ? " and " : ", ",
                              reader_name[take[k]]);
    if (n && o < cap)
        snprintf(buf + o, cap - o, n > 1 ? " read" : " reads");
}

static void end_findings(ckpt_zip_dir *d)
{
    size_t live = 0;
    for (size_t k = 0; k < d->nends; k++)
        if (!referenced(d, d->ends[k], 4))
            d->ends[live++] = d->ends[k];
    d->nends = live;
    if (live < 2)
        return;
    char list[200] = "", who[100];
    size_t o = 0;
    for (size_t k = 0; k < live && o < sizeof list; k++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%llu", k ? ", " : "",
                              (unsigned long long)d->ends[k]);
    char takes[400] = "";
    o = 0;
    for (size_t k = 0; k < live && o < sizeof takes; k++) {
        who_took(d, d->ends[k], who, sizeof who);
        if (who[0])
            o += (size_t)snprintf(takes + o, sizeof takes - o, "%s%s the one at %llu",
                                  o ? "; " : "", who, (unsigned long long)d->ends[k]);
    }
    finding(d, "%zu end-of-central-directory records (at bytes %s): %s", live, list,
            takes[0] ? takes : "no reader takes any");
}

/* An end record hidden in the comment of an earlier one. */
static void comment_findings(ckpt_zip_dir *d, int fd)
{
    for (size_t k = 0; k < d->nends; k++) {
        uint8_t p[22];
        if (!get(fd, d->size, p, 22, d->ends[k]))
            continue;
        uint64_t from = d->ends[k] + 22, to = from + le(p + 20, 2);
        for (size_t j = k + 1; j < d->nends; j++)
            if (d->ends[j] >= from && d->ends[j] < to)
                finding(d, "the end record at byte %llu lies inside the comment of the one at "
                        "byte %llu", (unsigned long long)d->ends[j],
                        (unsigned long long)d->ends[k]);
    }
}

static void local_findings(ckpt_zip_dir *d, const view *v)
{
    char nb[400];
    for (size_t i = 0; i < v->count; i++) {
        const ckpt_zip_entry *e = &v->e[i];
        if (e->data_at == NO_OFFSET) {
            finding(d, "entry '%s' points to no local header (byte %llu)", shown(e, nb, sizeof nb),
                    (unsigned long long)e->header_at);
            continue;
        }
        if (!e->local_name_same)
            finding(d, "entry '%s': its local header at byte %llu holds another name",
                    shown(e, nb, sizeof nb), (unsigned long long)e->header_at);
        if (e->local_method != e->method)
            finding(d, "entry '%s': compression method %u in the central directory, %u in its "
                    "local header", shown(e, nb, sizeof nb), e->method, e->local_method);
        if ((e->local_flags ^ e->flags) & 0x0809)
            finding(d, "entry '%s': flags %#x in the central directory, %#x in its local header",
                    shown(e, nb, sizeof nb), e->flags, e->local_flags);
        /* without a data descriptor the local header carries CRC and sizes too */
        if (!(e->local_flags & 8) && e->local_csize != U32_MAX && e->local_usize != U32_MAX &&
            (e->local_crc != e->crc || e->local_csize != e->csize || e->local_usize != e->usize))
            finding(d, "entry '%s': CRC-32 or sizes in its local header (%08x, %llu, %llu) differ "
                    "from the central directory's (%08x, %llu, %llu)", shown(e, nb, sizeof nb),
                    e->local_crc, (unsigned long long)e->local_csize,
                    (unsigned long long)e->local_usize, e->crc, (unsigned long long)e->csize,
                    (unsigned long long)e->usize);
    }
}

static int by_start(const void *a, const void *b)
{
    const ckpt_zip_entry *x = *(ckpt_zip_entry *const *)a, *y = *(ckpt_zip_entry *const *)b;
    return x->header_at < y->header_at ? -1 : x->header_at > y->header_at;
}

static uint64_t end_of(const ckpt_zip_entry *e)
{
    uint64_t end = e->data_at + e->csize;
    return end < e->data_at ? UINT64_MAX : end;
}

static int overlap_findings(ckpt_zip_dir *d, const view *v)
{
    char na[200], nb[200];
    const ckpt_zip_entry **s = malloc((v->count ? v->count : 1) * sizeof *s);
    if (!s)
        return CKPT_ERR_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < v->count; i++)
        if (v->e[i].data_at != NO_OFFSET)
            s[n++] = &v->e[i];
    qsort(s, n, sizeof *s, by_start);
    const ckpt_zip_entry *far = NULL; /* the entry reaching furthest so far */
    for (size_t k = 0; k < n; k++) {
        if (far && s[k]->header_at < end_of(far))
            finding(d, "entries '%s' and '%s' overlap (bytes %llu to %llu)",
                    shown(far, na, sizeof na), shown(s[k], nb, sizeof nb),
                    (unsigned long long)s[k]->header_at,
                    (unsigned long long)(end_of(far) < end_of(s[k]) ? end_of(far) : end_of(s[k])));
        if (end_of(s[k]) > v->cd_at && s[k]->header_at < v->cd_at + v->cd_size)
            finding(d, "entry '%s' overlaps the central directory", shown(s[k], na, sizeof na));
        if (!far || end_of(s[k]) > end_of(far))
            far = s[k];
    }
    free(s);
    return CKPT_OK;
}

static void duplicate_findings(ckpt_zip_dir *d, const view *v)
{
    char na[200], nb[200];
    for (size_t k = 0; k + 1 < v->count; k++) {
        uint32_t a = v->sorted[k], b = v->sorted[k + 1];
        const ckpt_zip_entry *x = &v->e[a], *y = &v->e[b];
        if (name_cmp(x->name, x->name_len, y->name, y->name_len))
            continue;
        bool exact = x->name_len == y->name_len && memcmp(x->name, y->name, x->name_len) == 0;
        if (exact)
            finding(d, "two entries named '%s' (central directory entries %u and %u)",
                    shown(x, na, sizeof na), a < b ? a : b, a < b ? b : a);
        else
            finding(d, "entries '%s' and '%s' differ only in case: torch takes them for one name",
                    shown(x, na, sizeof na), shown(y, nb, sizeof nb));
    }
}

static bool same_view(const view *a, const view *b)
{
    if (a->count != b->count)
        return false;
    for (size_t i = 0; i < a->count; i++) {
        const ckpt_zip_entry *x = &a->e[i], *y = &b->e[i];
        if (x->name_len != y->name_len || memcmp(x->name, y->name, x->name_len) ||
            x->data_at != y->data_at || x->csize != y->csize || x->usize != y->usize ||
            x->method != y->method)
            return false;
    }
    return true;
}

/* A span of signature positions: [from, to). */
typedef struct {
    uint64_t from, to;
} span;

static int by_from(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->from < y->from ? -1 : x->from > y->from;
}

/* The first central-directory signature that no reader uses: outside every
 * reader's central directory and not wholly inside a record's data (which
 * are the rules of `referenced`).  Only the bytes between those are read:
 * a signature inside a data record is no finding, so the data records (most
 * of a checkpoint) are skipped, and a scan costs its headers, not its size. */
static int stray_central(ckpt_zip_dir *d, int fd)
{
    if (d->size < 4)
        return CKPT_OK;
    size_t cap = 0;
    for (int r = 0; r < CKPT_ZIP_READERS; r++)
        if (d->v[r].ok)
            cap += d->v[r].count + 1;
    span *k = malloc((cap ? cap : 1) * sizeof *k);
    if (!k)
        return CKPT_ERR_NOMEM;
    size_t n = 0;
    for (int r = 0; r < CKPT_ZIP_READERS; r++) {
        const view *v = &d->v[r];
        if (!v->ok)
            continue;
        if (v->cd_size)
            k[n++] = (span){v->cd_at, v->cd_at + v->cd_size};
        for (size_t i = 0; i < v->count; i++) {
            const ckpt_zip_entry *e = &v->e[i];
            /* a signature at P is inside the data when P + 4 <= its end */
            if (e->data_at != NO_OFFSET && e->data_at + e->csize >= e->data_at && e->csize >= 4)
                k[n++] = (span){e->data_at, e->data_at + e->csize - 3};
        }
    }
    qsort(k, n, sizeof *k, by_from);
    static const uint8_t sig[4] = {0x50, 0x4b, 0x01, 0x02}; /* SIG_CENTRAL */
    uint8_t buf[65536];
    uint64_t last = d->size - 3; /* positions with 4 bytes after them */
    uint64_t at = 0;             /* the first position not yet known or searched */
    for (size_t j = 0; j <= n && at < last; j++) {
        uint64_t gap_end = j < n && k[j].from < last ? k[j].from : last;
        while (at < gap_end) {
            uint64_t want = gap_end - at + 3;
            size_t len = want < sizeof buf ? (size_t)want : sizeof buf;
            if (rd(fd, buf, len, at)) {
                free(k);
                return CKPT_OK;
            }
            const uint8_t *q = memmem(buf, len, sig, 4);
            if (q && at + (uint64_t)(q - buf) < gap_end) {
                finding(d, "a central directory entry at byte %llu that no reader uses",
                        (unsigned long long)(at + (uint64_t)(q - buf)));
                free(k);
                return CKPT_OK;
            }
            at += len - 3;
        }
        if (j < n && k[j].to > at)
            at = k[j].to;
    }
    free(k);
    return CKPT_OK;
}

static int findings(ckpt_zip_dir *d, int fd)
{
    const view *t = &d->v[CKPT_ZIP_READER_TORCH];
    find_ends(d, fd);
    end_findings(d);
    comment_findings(d, fd);
    if (t->ok && !d->starts_local)
        finding(d, "the file does not start with a local header: torch.load does not read it "
                   "as a zip (it unpickles it from byte 0)");
    if (d->v[CKPT_ZIP_READER_PYZIPFILE].ok && d->concat)
        finding(d, "Python's zipfile moves every offset by %lld bytes (its end record is not "
                   "where the central directory ends)", (long long)d->concat);
    for (int r = 0; r < CKPT_ZIP_READERS; r++)
        if (!d->v[r].ok)
            for (int o = 0; o < CKPT_ZIP_READERS; o++)
                if (d->v[o].ok) {
                    finding(d, "%s reads the archive, %s refuses it (%s)", reader_name[o],
                            reader_name[r], d->v[r].why);
                    break;
                }
    if (!t->ok)
        return CKPT_OK;
    local_findings(d, t);
    duplicate_findings(d, t);
    CKPT_FORWARD(overlap_findings(d, t));
    /* the other readers, where they see something else than torch */
    for (int r = 1; r < CKPT_ZIP_READERS; r++) {
        const view *v = &d->v[r];
        if (!v->ok || same_view(t, v) || (r == CKPT_ZIP_READER_LIBZIP && v->end_at == NO_OFFSET))
            continue;
        if (v->cd_at != t->cd_at)
            finding(d, "%s reads the central directory at byte %llu, torch the one at byte %llu",
                    reader_name[r], (unsigned long long)v->cd_at, (unsigned long long)t->cd_at);
        else if (v->count != t->count)
            finding(d, "%s sees %zu entries, torch %zu", reader_name[r], v->count, t->count);
        else
            finding(d, "%s and torch see different entries in the same central directory",
                    reader_name[r]);
    }
    return stray_central(d, fd);
}

/* ---- the interface ---------------------------------------------------------- */

static int open_window(int fd, uint64_t size, bool torch_only, ckpt_zip_dir **out,
                       ckpt_error *err);

int ckpt_zip_dir_open(int fd, uint64_t size, ckpt_zip_dir **out, ckpt_error *err)
{
    return ckpt_zip_dir_open_at(fd, 0, size, out, err);
}

static int open_at(int fd, uint64_t base, uint64_t size, bool torch_only, ckpt_zip_dir **out,
                   ckpt_error *err)
{
    window_base = base;
    int rc = open_window(fd, size, torch_only, out, err);
    if (*out)
        (*out)->base = base;
    window_base = 0;
    return rc;
}

int ckpt_zip_dir_open_at(int fd, uint64_t base, uint64_t size, ckpt_zip_dir **out,
                         ckpt_error *err)
{
    return open_at(fd, base, size, false, out, err);
}

int ckpt_zip_dir_open_torch(int fd, uint64_t base, uint64_t size, ckpt_zip_dir **out,
                            ckpt_error *err)
{
    return open_at(fd, base, size, true, out, err);
}

static int open_window(int fd, uint64_t size, bool torch_only, ckpt_zip_dir **out,
                       ckpt_error *err)
{
    *out = NULL;
    ckpt_zip_dir *d = calloc(1, sizeof *d);
    if (!d)
        return ckpt_oom(err);
    d->size = size;
    uint8_t h[4];
    d->starts_local = get(fd, size, h, 4, 0) && le(h, 4) == SIG_LOCAL;
    int rc = read_torch(fd, size, &d->v[CKPT_ZIP_READER_TORCH]);
    if (torch_only) {
        /* the other readers never see it: refused, with no findings */
        for (int r = CKPT_ZIP_READER_PYZIPFILE; r < CKPT_ZIP_READERS; r++)
            snprintf(d->v[r].why, sizeof d->v[r].why, "not read (torch's reading only)");
    } else if (!rc)
        rc = read_py(fd, size, &d->v[CKPT_ZIP_READER_PYZIPFILE], &d->concat);
    if (!rc && !torch_only) {
        find_ends(d, fd); /* read_libzip matches against them */
        rc = read_libzip(fd, size, d, &d->v[CKPT_ZIP_READER_LIBZIP]);
        free(d->ends);
        d->ends = NULL;
        d->nends = 0;
    }
    if (!rc && !torch_only)
        rc = findings(d, fd);
    if (rc) {
        ckpt_zip_dir_free(d);
        return ckpt_err(err, rc, "out of memory");
    }
    if (!d->v[0].ok && !d->v[1].ok && !d->v[2].ok) {
        rc = ckpt_err(err, CKPT_ERR_FORMAT, "not a zip archive (torch: %s)", d->v[0].why);
        ckpt_zip_dir_free(d);
        return rc;
    }
    *out = d;
    return CKPT_OK;
}

void ckpt_zip_dir_free(ckpt_zip_dir *d)
{
    if (!d)
        return;
    for (int r = 0; r < CKPT_ZIP_READERS; r++) {
        for (size_t i = 0; i < d->v[r].count; i++)
            free(d->v[r].e[i].name);
        free(d->v[r].e);
        free(d->v[r].sorted);
    }
    for (size_t i = 0; i < d->nfindings; i++)
        free(d->findings[i]);
    free(d->ends);
    free(d);
}

bool ckpt_zip_dir_reads(const ckpt_zip_dir *d, ckpt_zip_reader r) { return d->v[r].ok; }
const char *ckpt_zip_dir_refusal(const ckpt_zip_dir *d, ckpt_zip_reader r)
{
    return d->v[r].ok ? NULL : d->v[r].why;
}
bool ckpt_zip_dir_torch_sniffs(const ckpt_zip_dir *d) { return d->starts_local; }
uint64_t ckpt_zip_dir_end_at(const ckpt_zip_dir *d, ckpt_zip_reader r) { return d->v[r].end_at; }
size_t ckpt_zip_dir_count(const ckpt_zip_dir *d, ckpt_zip_reader r)
{
    return d->v[r].ok ? d->v[r].count : 0;
}
const ckpt_zip_entry *ckpt_zip_dir_entry(const ckpt_zip_dir *d, ckpt_zip_reader r, size_t i)
{
    return d->v[r].ok && i < d->v[r].count ? &d->v[r].e[i] : NULL;
}
size_t ckpt_zip_dir_finding_count(const ckpt_zip_dir *d) { return d->nfindings; }
const char *ckpt_zip_dir_finding(const ckpt_zip_dir *d, size_t i)
{
    return i < d->nfindings ? d->findings[i] : NULL;
}

int64_t ckpt_zip_dir_find(const ckpt_zip_dir *d, ckpt_zip_reader r, const char *record)
{
    const view *v = &d->v[r];
    if (!v->ok || !v->count)
        return -1;
    /* torch's archive name: the first entry's directory */
    const ckpt_zip_entry *first = &v->e[0];
    const char *slash = memchr(first->name, '/', first->name_len);
    if (!slash)
        return -1;
    size_t pl = (size_t)(slash - first->name) + 1, rl = strlen(record);
    char *full = malloc(pl + rl + 1);
    if (!full)
        return -1;
    memcpy(full, first->name, pl);
    memcpy(full + pl, record, rl + 1);
    int64_t found = -1;
    if (r == CKPT_ZIP_READER_TORCH) {
        found = miniz_find(v, full);
    } else {
        /* zipfile: the last of equal names (cut at a NUL); libzip: the first */
        for (size_t i = 0; i < v->count; i++) {
            const ckpt_zip_entry *e = &v->e[i];
            size_t el = strnlen(e->name, e->name_len);
            if (r == CKPT_ZIP_READER_LIBZIP && el != e->name_len)
                continue;
            if (el == pl + rl && memcmp(e->name, full, el) == 0) {
                found = (int64_t)i;
                if (r == CKPT_ZIP_READER_LIBZIP)
                    break;
            }
        }
    }
    free(full);
    return found;
}

/* Inflate raw deflate IN into OUT (CAP bytes); *got the bytes made. */
static int inflate_all(const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *got,
                       bool *past)
{
    z_stream s;
    memset(&s, 0, sizeof s);
    if (inflateInit2(&s, -15) != Z_OK)
        return Z_MEM_ERROR;
    s.next_in = (Bytef *)in;
    s.avail_in = (uInt)n;
    s.next_out = out;
    s.avail_out = (uInt)cap;
    int zr = inflate(&s, Z_FINISH);
    *got = cap - s.avail_out;
    *past = false;
    if (zr == Z_BUF_ERROR && s.avail_out == 0 && s.avail_in) {
        uint8_t one;
        s.next_out = &one;
        s.avail_out = 1;
        *past = inflate(&s, Z_FINISH) != Z_DATA_ERROR && s.avail_out == 0;
    }
    inflateEnd(&s);
    return zr;
}

int ckpt_zip_dir_read(const ckpt_zip_dir *d, int fd, ckpt_zip_reader r, size_t i, uint64_t cap,
                      uint8_t **out, size_t *len, bool *crc_ok, ckpt_error *err)
{
    *out = NULL;
    *len = 0;
    *crc_ok = false;
    const ckpt_zip_entry *e = ckpt_zip_dir_entry(d, r, i);
    char nb[400];
    if (!e)
        return ckpt_err(err, CKPT_ERR_USAGE, "%s sees no zip entry %zu", reader_name[r], i);
    shown(e, nb, sizeof nb);
    if (e->data_at == NO_OFFSET)
        return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s': no local header at byte %llu", nb,
                        (unsigned long long)e->header_at);
    if (e->flags & 0x61)
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "record '%s' is encrypted", nb);
    if (e->method != 0 && e->method != 8)
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "record '%s': compression method %u", nb,
                        e->method);
    if (r == CKPT_ZIP_READER_PYZIPFILE && !e->local_name_same)
        return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s': its local header names another "
                        "record (Python's zipfile refuses it)", nb);
    if (e->usize > cap)
        return ckpt_err(err, CKPT_ERR_LIMIT, "record '%s' is %llu bytes, over the limit of %llu",
                        nb, (unsigned long long)e->usize, (unsigned long long)cap);
    /* torch reads nothing for an entry of no compressed bytes */
    if (e->csize == 0 || e->usize == 0) {
        *out = malloc(1);
        *crc_ok = e->crc == 0;
        return *out ? CKPT_OK : ckpt_oom(err);
    }
    uint64_t want = e->method == 0 && r == CKPT_ZIP_READER_TORCH ? e->usize : e->csize;
    uint64_t avail = e->data_at >= d->size ? 0 : d->size - e->data_at;
    uint64_t have = want < avail ? want : avail;
    uint8_t *raw = malloc(have ? (size_t)have : 1);
    uint8_t *buf = e->method == 0 ? raw : malloc((size_t)e->usize);
    if (!raw || !buf) {
        free(raw);
        if (buf != raw)
            free(buf);
        return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory reading '%s'", nb);
    }
    if (ckpt_pread_all(fd, raw, (size_t)have, d->base + e->data_at)) {
        free(raw);
        if (buf != raw)
            free(buf);
        return ckpt_err(err, CKPT_ERR_IO, "cannot read record '%s'", nb);
    }
    int rc = CKPT_OK;
    size_t got = (size_t)have;
    if (e->method == 8) {
        bool past = false;
        int zr = inflate_all(raw, (size_t)have, buf, (size_t)e->usize, &got, &past);
        free(raw);
        if (zr != Z_STREAM_END)
            rc = ckpt_err(err, CKPT_ERR_FORMAT, past ? "record '%s' inflates past its declared "
                          "%llu bytes" : "record '%s': its deflate stream is corrupt or cut "
                          "short (%llu bytes declared)", nb, (unsigned long long)e->usize);
        else if (got != e->usize)
            rc = ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' inflates to %zu bytes, not the "
                          "declared %llu", nb, got, (unsigned long long)e->usize);
    } else if (have < want) {
        rc = ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' is truncated: %llu of %llu bytes", nb,
                      (unsigned long long)have, (unsigned long long)want);
    } else if (got > e->usize) {
        got = (size_t)e->usize; /* zipfile reads compressed bytes, keeps the declared size */
    }
    if (rc == CKPT_OK && r == CKPT_ZIP_READER_PYZIPFILE) {
        /* zipfile's overlap check: the data may not reach the next header */
        uint64_t next = d->v[r].cd_at;
        for (size_t k = 0; k < d->v[r].count; k++)
            if (d->v[r].e[k].header_at > e->header_at && d->v[r].e[k].header_at < next)
                next = d->v[r].e[k].header_at;
        if (e->data_at + e->csize > next)
            rc = ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' overlaps the next one (Python's "
                          "zipfile refuses it)", nb);
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t o = 0; o < got; o += 1u << 30)
        crc = crc32(crc, buf + o, (uInt)(got - o < (1u << 30) ? got - o : 1u << 30));
    *crc_ok = (uint32_t)crc == e->crc && got == e->usize;
    *out = buf;
    *len = got;
    return rc;
}
