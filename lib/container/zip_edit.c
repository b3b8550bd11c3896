/*
 * zip_edit.c - replacing one record of a zip in place (an in-place rewrite
 * of a checkpoint's pickle): only the new record, a new central directory
 * and its end records are written; every other record stays where it is.
 *
 * The file must be a plain zip as torch.save writes it (ckpt_zip_layout_read
 * refuses the rest, CKPT_ERR_UNSUPPORTED with the reason): its end record is
 * the last 22 bytes, with no comment; the zip64 end record and locator, when
 * there, sit right before it; the central directory ends where they begin
 * (where Python's zipfile looks for it); no other end record lies in the
 * last 64 KiB that any reader scans.
 *
 * The switch (lib/README.md, "In-place rewrites", says why each step is safe):
 *   1. append, past a 128 KiB hole, a copy of the old directory and end
 *      records, the file's new end (one O_DIRECT write where the filesystem
 *      takes it: the size grows once, with the bytes);
 *   2. write the new record into dead space or the hole, then the new
 *      directory and end records before the hole; fsync.  Every reader still
 *      finds the copy at the end: the old checkpoint;
 *   3. zero the old directory and end records where they will stay inside
 *      the file; fsync;
 *   4. ftruncate the file to the end of the new end record: the switch, one
 *      metadata operation; fsync.  Every reader finds the new end record;
 *   5. zero any zip signature in the dead bytes of the replaced record; fsync.
 * On an error in steps 1-2 the file is cut back to its old size; later, it
 * is left as it is: the old checkpoint, through the copy at its end.
 */
#include "container/container.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define U32_MAX 0xFFFFFFFFu
/* past every reader's backward scan for an end record (miniz: 64 KiB + 22
 * + one 4 KiB buffer; zipfile and libzip: 64 KiB + 22 (+ 20)) */
#define HOLE (128u << 10)
#define DIO_ALIGN 4096u

typedef struct {
    char *name;
    size_t name_len;
    uint64_t header_at, data_at, end, size;
    uint32_t crc;
    bool descriptor;       /* bit 3: a data descriptor follows the data */
    bool read;             /* data_at and end come from its local header */
    size_t cd_off, cd_len; /* its bytes in the raw directory */
} lentry;

struct ckpt_zip_layout {
    uint64_t size, cd_at, cd_size;
    uint8_t *cd;
    lentry *e;
    size_t n;
};

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}


void ckpt_zip_layout_free(ckpt_zip_layout *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->e[i].name);
    free(l->e);
    free(l->cd);
    free(l);
}

#define NOT_EDITABLE(...) ckpt_err(err, CKPT_ERR_UNSUPPORTED, __VA_ARGS__)

/* The zip64 extra of a central entry: the fields that are 0xFFFFFFFF. */
static bool z64_fields(const uint8_t *x, size_t xl, uint64_t *usize, uint64_t *csize,
                       uint64_t *off)
{
    for (size_t k = 0; k + 4 <= xl;) {
        size_t id = (size_t)le(x + k, 2), len = (size_t)le(x + k + 2, 2);
        if (k + 4 + len > xl)
            return false;
        if (id == 1) {
            const uint8_t *q = x + k + 4;
            size_t left = len;
            uint64_t *f[3] = {usize, csize, off};
            for (int j = 0; j < 3; j++) {
                if (*f[j] != U32_MAX)
                    continue;
                if (left < 8)
                    return false;
                *f[j] = le(q, 8);
                q += 8;
                left -= 8;
            }
            return true;
        }
        k += 4 + len;
    }
    return *usize != U32_MAX && *csize != U32_MAX && *off != U32_MAX;
}

/* Entry X's data offset and end, from its local header; a descriptor is
 * counted at its longest (24 bytes), so a record is never taken for
 * shorter than it is. */
static int read_local(int fd, const ckpt_zip_layout *l, lentry *x, ckpt_error *err)
{
    if (x->read)
        return CKPT_OK;
    uint8_t h[30];
    if (ckpt_pread_all(fd, h, 30, x->header_at) || le(h, 4) != SIG_LOCAL)
        return NOT_EDITABLE("entry '%s' points to no local header", x->name);
    x->data_at = x->header_at + 30 + le(h + 26, 2) + le(h + 28, 2);
    if (x->data_at + x->size > l->cd_at || x->data_at + x->size < x->data_at)
        return NOT_EDITABLE("entry '%s' runs into the central directory", x->name);
    x->end = x->data_at + x->size + (x->descriptor ? 24 : 0);
    if (x->end > l->cd_at) /* (a shorter descriptor, right before it) */
        x->end = l->cd_at;
    x->read = true;
    return CKPT_OK;
}

/* X's data must end before NEXT (the next record's header, or the
 * directory); its descriptor, counted at its longest, may be shorter. */
static int clamp(lentry *x, uint64_t next, ckpt_error *err)
{
    if (x->data_at + x->size > next)
        return NOT_EDITABLE("entry '%s' overlaps the next one", x->name);
    if (x->end > next)
        x->end = next;
    return CKPT_OK;
}

typedef struct {
    uint64_t at;
    size_t i;
} by_at_t;

static int by_header(const void *a, const void *b)
{
    uint64_t x = ((const by_at_t *)a)->at, y = ((const by_at_t *)b)->at;
    return x < y ? -1 : x > y;
}

/*
 * Where each record ends, reading as few local headers as can be: a file of
 * thousands of records spread over many GiB would pay a disk seek for each.
 * A record followed by the next one within what torch's layout puts around
 * its data (header, name, at most 99 bytes of extra field, descriptor) is
 * taken to reach the next one; one followed by more room is read, and so is
 * every record whose local header could, with an extra field of up to 64
 * KiB, reach into that room: all room found is room no reader reads.
 */
#define TORCH_SLACK (30 + 99 + 24)
static int extents(int fd, ckpt_zip_layout *l, ckpt_error *err)
{
    by_at_t *o = malloc((l->n ? l->n : 1) * sizeof(*o));
    size_t *ix = malloc((l->n ? l->n : 1) * sizeof(*ix));
    if (!o || !ix) {
        free(o);
        free(ix);
        return ckpt_oom(err);
    }
    for (size_t i = 0; i < l->n; i++)
        o[i] = (by_at_t){l->e[i].header_at, i};
    qsort(o, l->n, sizeof(*o), by_header);
    for (size_t i = 0; i < l->n; i++)
        ix[i] = o[i].i;
    free(o);
    int rc = CKPT_OK;
    for (size_t k = 0; rc == CKPT_OK && k < l->n; k++) {
        lentry *x = &l->e[ix[k]];
        uint64_t next = k + 1 < l->n ? l->e[ix[k + 1]].header_at : l->cd_at;
        uint64_t least = x->header_at + 30 + x->name_len + x->size;
        if (least > next) {
            rc = NOT_EDITABLE("entries '%s' and '%s' overlap", x->name, l->e[ix[k + 1]].name);
            break;
        }
        if (next - least > TORCH_SLACK) {
            /* room after it: it, and whatever could reach into the room */
            rc = read_local(fd, l, x, err);
            rc = rc ? rc : clamp(x, next, err);
            for (size_t j = k; rc == CKPT_OK && j-- > 0;) {
                lentry *y = &l->e[ix[j]];
                if (y->header_at + 30 + y->name_len + 0xFFFF + y->size + 24 <= x->end)
                    continue;
                rc = read_local(fd, l, y, err);
                rc = rc ? rc : clamp(y, l->e[ix[j + 1]].header_at, err);
            }
        } else if (!x->read) {
            x->end = next;
        }
    }
    free(ix);
    return rc;
}

int ckpt_zip_layout_read(int fd, ckpt_zip_layout **out, ckpt_error *err)
{
    *out = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "%s", strerror(errno));
    uint64_t size = (uint64_t)st.st_size;
    uint8_t t[98];
    if (size < 22 || ckpt_pread_all(fd, t + 76, 22, size - 22) || le(t + 76, 4) != SIG_END)
        return NOT_EDITABLE("its end record is not its last 22 bytes");
    const uint8_t *e = t + 76;
    if (le(e + 20, 2) != 0)
        return NOT_EDITABLE("its end record has a comment");
    if (le(e + 4, 2) || le(e + 6, 2) || le(e + 8, 2) != le(e + 10, 2))
        return NOT_EDITABLE("a multi-disk archive");
    uint64_t count = le(e + 10, 2), cd_size = le(e + 12, 4), cd_at = le(e + 16, 4);
    uint64_t tail = size - 22;
    if (size >= 98 && ckpt_pread_all(fd, t, 76, size - 98) == 0 && le(t + 56, 4) == SIG_LOC64) {
        if (le(t, 4) != SIG_END64 || le(t + 4, 8) != 44 || le(t + 64, 8) != size - 98)
            return NOT_EDITABLE("its zip64 end record is not right before its locator");
        if (le(t + 16, 4) || le(t + 20, 4) || le(t + 24, 8) != le(t + 32, 8) ||
            le(t + 60, 4) || le(t + 72, 4) != 1)
            return NOT_EDITABLE("a multi-disk archive");
        count = le(t + 32, 8);
        cd_size = le(t + 40, 8);
        cd_at = le(t + 48, 8);
        tail = size - 98;
    } else if (count == 0xFFFF || cd_size == U32_MAX || cd_at == U32_MAX) {
        return NOT_EDITABLE("its end record needs a zip64 record it lacks");
    }
    if (cd_at > tail || cd_size != tail - cd_at)
        return NOT_EDITABLE("its central directory does not end where its end records begin");
    if (cd_size > (1u << 30) || count > cd_size / 46)
        return NOT_EDITABLE("its central directory is implausible (%llu entries, %llu bytes)",
                            (unsigned long long)count, (unsigned long long)cd_size);
    /* a second end record that a reader's backward scan could take */
    uint64_t from = size > 65536 + 22 + 4096 + 98 ? size - 65536 - 22 - 4096 - 98 : 0;
    size_t wn = (size_t)(size - 22 - from);
    uint8_t *w = malloc(wn + 4);
    if (!w)
        return ckpt_oom(err);
    if (ckpt_pread_all(fd, w, wn, from)) {
        free(w);
        return ckpt_err(err, CKPT_ERR_IO, "cannot read the end of the file");
    }
    for (size_t i = 0; i + 4 <= wn; i++)
        if (le(w + i, 4) == SIG_END) {
            free(w);
            return NOT_EDITABLE("it holds a second end record, at byte %llu",
                                (unsigned long long)(from + i));
        }
    free(w);

    ckpt_zip_layout *l = calloc(1, sizeof(*l));
    if (!l || !(l->cd = malloc(cd_size ? (size_t)cd_size : 1)) ||
        !(l->e = calloc(count ? (size_t)count : 1, sizeof(*l->e)))) {
        ckpt_zip_layout_free(l);
        return ckpt_oom(err);
    }
    l->size = size;
    l->cd_at = cd_at;
    l->cd_size = cd_size;
    int rc = CKPT_OK;
    if (ckpt_pread_all(fd, l->cd, (size_t)cd_size, cd_at))
        rc = ckpt_err(err, CKPT_ERR_IO, "cannot read the central directory");
    uint64_t pos = 0;
    for (uint64_t i = 0; rc == CKPT_OK && i < count; i++) {
        const uint8_t *q = l->cd + pos;
        if (cd_size - pos < 46 || le(q, 4) != SIG_CENTRAL) {
            rc = NOT_EDITABLE("central directory entry %llu is corrupt", (unsigned long long)i);
            break;
        }
        size_t nl = (size_t)le(q + 28, 2), xl = (size_t)le(q + 30, 2), cl = (size_t)le(q + 32, 2);
        if (cd_size - pos - 46 < (uint64_t)nl + xl + cl) {
            rc = NOT_EDITABLE("central directory entry %llu is corrupt", (unsigned long long)i);
            break;
        }
        lentry *x = &l->e[l->n];
        uint64_t usize = le(q + 24, 4), csize = le(q + 20, 4), off = le(q + 42, 4);
        if (!z64_fields(q + 46 + nl, xl, &usize, &csize, &off)) {
            rc = NOT_EDITABLE("central directory entry %llu has a corrupt zip64 extra",
                              (unsigned long long)i);
            break;
        }
        if (!(x->name = malloc(nl + 1))) {
            rc = ckpt_oom(err);
            break;
        }
        l->n++;
        memcpy(x->name, q + 46, nl);
        x->name[nl] = 0;
        x->name_len = nl;
        x->header_at = off;
        x->size = csize;
        x->crc = (uint32_t)le(q + 16, 4);
        x->cd_off = (size_t)pos;
        x->cd_len = 46 + nl + xl + cl;
        x->descriptor = (le(q + 8, 2) & 8) != 0;
        if (off + 30 + nl + csize > cd_at || off + 30 + nl + csize < off) {
            rc = NOT_EDITABLE("entry '%s' runs into the central directory", x->name);
            break;
        }
        pos += x->cd_len;
    }
    if (rc == CKPT_OK && pos != cd_size)
        rc = NOT_EDITABLE("its central directory holds more than its end record counts");
    if (rc == CKPT_OK)
        rc = extents(fd, l, err);
    if (rc != CKPT_OK) {
        ckpt_zip_layout_free(l);
        return rc;
    }
    *out = l;
    return CKPT_OK;
}

size_t ckpt_zip_layout_count(const ckpt_zip_layout *l) { return l->n; }
const char *ckpt_zip_layout_name(const ckpt_zip_layout *l, size_t i) { return l->e[i].name; }
uint64_t ckpt_zip_layout_size(const ckpt_zip_layout *l, size_t i) { return l->e[i].size; }
uint32_t ckpt_zip_layout_crc(const ckpt_zip_layout *l, size_t i) { return l->e[i].crc; }
uint64_t ckpt_zip_layout_file_size(const ckpt_zip_layout *l) { return l->size; }

/* ---- free space ------------------------------------------------------------- */

typedef struct {
    uint64_t at, end;
} span;

static int by_at(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* The live spans of L's records (entry SKIP's replaced by REPL when SKIP < n),
 * sorted, into *OUT (n spans). */
static int live_spans(const ckpt_zip_layout *l, size_t skip, span repl, span **out)
{
    span *s = malloc((l->n + 1) * sizeof(*s));
    if (!s)
        return CKPT_ERR_NOMEM;
    for (size_t i = 0; i < l->n; i++)
        s[i] = i == skip ? repl : (span){l->e[i].header_at, l->e[i].end};
    qsort(s, l->n, sizeof(*s), by_at);
    *out = s;
    return CKPT_OK;
}

/* Bytes of [0, END) that no span covers. */
static uint64_t uncovered(const span *s, size_t n, uint64_t end)
{
    uint64_t covered = 0, reach = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t a = s[i].at > reach ? s[i].at : reach, b = s[i].end < end ? s[i].end : end;
        if (b > a)
            covered += b - a;
        if (s[i].end > reach)
            reach = s[i].end;
    }
    return end - covered;
}

uint64_t ckpt_zip_layout_dead(const ckpt_zip_layout *l)
{
    span *s;
    if (live_spans(l, SIZE_MAX, (span){0, 0}, &s))
        return 0;
    uint64_t d = uncovered(s, l->n, l->cd_at);
    free(s);
    return d;
}

/* ---- the replacement -------------------------------------------------------- */

static int pwrite_all(int fd, const void *p, size_t n, uint64_t at, ckpt_error *err)
{
    return ckpt_write_all(fd, p, n, at, err);
}

static int sync_fd(int fd, ckpt_error *err)
{
    if (fsync(fd) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot make the file durable (fsync): %s",
                        strerror(errno));
    return CKPT_OK;
}

/* Write BUF (N bytes) ending at END, where the file ends once it is written:
 * with O_DIRECT where the filesystem takes it, as one aligned write, so that
 * the size grows once, together with the bytes (a killed process cannot
 * leave half of it; after a power cut the size is never durable before the
 * bytes); zeros fill the aligned block before BUF.  A buffered write
 * otherwise.  *DIRECT says which. */
static int write_end_block(int fd, const uint8_t *buf, size_t n, uint64_t end, bool *direct,
                           ckpt_error *err)
{
    *direct = false;
    uint64_t start = (end - n) / DIO_ALIGN * DIO_ALIGN;
    int fl = fcntl(fd, F_GETFL);
    if (end % DIO_ALIGN == 0 && fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0) {
        size_t len = (size_t)(end - start);
        void *a = NULL;
        if (posix_memalign(&a, DIO_ALIGN, len) == 0) {
            memset(a, 0, len - n);
            memcpy((uint8_t *)a + (len - n), buf, n);
            ssize_t k;
            do
                k = pwrite(fd, a, len, (off_t)start);
            while (k < 0 && errno == EINTR);
            free(a);
            fcntl(fd, F_SETFL, fl);
            if (k == (ssize_t)len) {
                *direct = true;
                return CKPT_OK;
            }
            if (k > 0) /* a short direct write: finish it buffered */
                return pwrite_all(fd, buf, n, end - n, err);
        } else {
            fcntl(fd, F_SETFL, fl);
        }
    }
    return pwrite_all(fd, buf, n, end - n, err);
}

/* Zero every zip signature ("PK" 1 2, 3 4, 5 6, 6 6, 6 7, 7 8) in [AT, AT+LEN),
 * the data of a dead record: they must not look like a directory or an end
 * record to a scan. */
static int scrub(int fd, uint64_t at, uint64_t len, bool *wrote, ckpt_error *err)
{
    uint8_t *b = malloc(len ? (size_t)len : 1);
    if (!b)
        return ckpt_oom(err);
    if (ckpt_pread_all(fd, b, (size_t)len, at)) {
        free(b);
        return ckpt_err(err, CKPT_ERR_IO, "cannot read the replaced record");
    }
    static const uint8_t zero[4];
    int rc = CKPT_OK;
    for (size_t i = 0; rc == CKPT_OK && i + 4 <= len; i++)
        if (b[i] == 'P' && b[i + 1] == 'K' && b[i + 2] <= 7 && b[i + 3] <= 8 &&
            b[i + 2] >= 1) {
            uint32_t sig = (uint32_t)le(b + i, 4);
            if (sig == SIG_CENTRAL || sig == SIG_LOCAL || sig == SIG_END || sig == SIG_END64 ||
                sig == SIG_LOC64 || sig == 0x08074b50u) {
                rc = pwrite_all(fd, zero, 4, at + i, err);
                *wrote = true;
            }
        }
    free(b);
    return rc;
}

int ckpt_zip_replace(int fd, ckpt_zip_layout *l, size_t k, const uint8_t *data, size_t len,
                     uint64_t dead_max, ckpt_zip_replace_result *res, ckpt_error *err)
{
    memset(res, 0, sizeof(*res));
    if (k >= l->n)
        return ckpt_err(err, CKPT_ERR_USAGE, "no record %zu", k);
    lentry *K = &l->e[k];
    CKPT_FORWARD(read_local(fd, l, K, err)); /* its data, scrubbed once it is dead */
    uint32_t crc = ckpt_crc32_update(0, data, len);
    uint64_t eof = l->size;

    /* the gaps: dead bytes between live records (the replaced one is live
     * until the switch), and from the last record to the directory */
    span *s;
    if (live_spans(l, SIZE_MAX, (span){0, 0}, &s))
        return ckpt_oom(err);
    span *gaps = malloc((l->n + 2) * sizeof(*gaps));
    size_t ng = 0;
    uint64_t reach = 0, last_end = 0;
    for (size_t i = 0; gaps && i <= l->n; i++) {
        uint64_t at = i < l->n ? s[i].at : l->cd_at;
        if (at > reach)
            gaps[ng++] = (span){reach, at};
        if (i < l->n && s[i].end > reach)
            reach = s[i].end;
    }
    last_end = reach;
    free(s);
    if (!gaps)
        return ckpt_oom(err);

    /* where the record goes (P) and the directory after it (C): the place
     * that leaves the shortest file; a gap before the directory, else the
     * end */
    uint64_t cd_len = l->cd_size - K->cd_len + 46 + K->name_len + 28;
    uint64_t best_p = 0, best_c = 0, best_eof = UINT64_MAX;
    for (size_t g = 0; g <= ng; g++) {
        uint64_t p = g < ng ? gaps[g].at : eof;
        uint64_t rec = ckpt_zipw_span(K->name_len, len, p);
        if (g < ng && p + rec > gaps[g].end)
            continue;
        /* the directory: after every live byte, the new record's included */
        uint64_t c = last_end > p + rec ? last_end : p + rec;
        if (c + cd_len + CKPT_ZIPW_ENDS > l->cd_at && c < eof)
            c = eof;
        if (g == ng)
            c = p + rec;
        uint64_t e = c + cd_len + CKPT_ZIPW_ENDS;
        if (e < best_eof) {
            best_eof = e;
            best_p = p;
            best_c = c;
        }
    }
    free(gaps);

    /* the new directory: the old one's bytes, entry K's replaced */
    uint64_t p = best_p, c = best_c;
    uint64_t rec = ckpt_zipw_span(K->name_len, len, p);
    uint8_t *cd = malloc((size_t)cd_len + CKPT_ZIPW_ENDS);
    if (!cd)
        return ckpt_oom(err);
    memcpy(cd, l->cd, K->cd_off);
    size_t kn = ckpt_zipw_central(cd + K->cd_off, 46 + K->name_len + 28, K->name, p, len, crc);
    memcpy(cd + K->cd_off + kn, l->cd + K->cd_off + K->cd_len, l->cd_size - K->cd_off - K->cd_len);
    cd_len = l->cd_size - K->cd_len + kn;
    ckpt_zipw_ends(cd + cd_len, l->n, c, cd_len);
    uint64_t new_eof = c + cd_len + CKPT_ZIPW_ENDS;

    /* the bound on dead bytes, checked before anything is written */
    span *ns;
    if (live_spans(l, k, (span){p, p + rec}, &ns)) {
        free(cd);
        return ckpt_oom(err);
    }
    uint64_t dead = uncovered(ns, l->n, c);
    free(ns);
    res->offset = p;
    res->old_size = eof;
    res->new_size = new_eof;
    res->dead = dead;
    if (dead > dead_max) {
        free(cd);
        res->over_bound = true;
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED,
                        "%llu dead bytes would be over the bound of %llu",
                        (unsigned long long)dead, (unsigned long long)dead_max);
    }

    /* the copy of the old directory, the file's end until the switch */
    size_t copy_len = (size_t)l->cd_size + CKPT_ZIPW_ENDS;
    uint8_t *copy = malloc(copy_len);
    if (!copy) {
        free(cd);
        return ckpt_oom(err);
    }
    uint64_t top = new_eof > eof ? new_eof : eof;
    uint64_t copy_end = (top + HOLE + copy_len + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN;
    uint64_t copy_at = copy_end - copy_len;
    memcpy(copy, l->cd, (size_t)l->cd_size);
    ckpt_zipw_ends(copy + l->cd_size, l->n, copy_at, l->cd_size);

    int rc = write_end_block(fd, copy, copy_len, copy_end, &res->direct, err); /* step 1 */
    free(copy);
    res->written += copy_len;
    if (rc == CKPT_OK) { /* step 2: the record, then the directory */
        ckpt_zipw *w = ckpt_zipw_new(fd, err);
        uint64_t at;
        rc = w ? CKPT_OK : CKPT_ERR_NOMEM;
        if (rc == CKPT_OK) {
            ckpt_zipw_seek(w, p);
            rc = ckpt_zipw_begin(w, K->name, len, &at);
        }
        if (rc == CKPT_OK)
            rc = ckpt_zipw_write(w, data, len);
        if (rc == CKPT_OK)
            rc = ckpt_zipw_end(w, crc);
        ckpt_zipw_free(w);
        res->written += rec;
    }
    if (rc == CKPT_OK)
        rc = pwrite_all(fd, cd, (size_t)(cd_len + CKPT_ZIPW_ENDS), c, err);
    res->written += cd_len + CKPT_ZIPW_ENDS;
    free(cd);
    if (rc == CKPT_OK)
        rc = sync_fd(fd, err);
    if (rc != CKPT_OK) {
        /* nothing before the old size was changed but dead bytes: cut back */
        if (ftruncate(fd, (off_t)eof) == 0)
            fsync(fd);
        return rc;
    }
    /* from here on the old directory may be gone: the copy at the end is
     * the old checkpoint until the switch, and the file is left so on an
     * error (longer, but the old checkpoint to every reader) */
    if (new_eof > l->cd_at) { /* step 3 */
        uint64_t n = eof - l->cd_at;
        uint8_t *z = calloc(1, (size_t)n);
        rc = z ? pwrite_all(fd, z, (size_t)n, l->cd_at, err)
               : ckpt_oom(err);
        free(z);
        if (rc == CKPT_OK)
            rc = sync_fd(fd, err);
        res->written += n;
        CKPT_FORWARD(rc);
    }
    if (ftruncate(fd, (off_t)new_eof) != 0) /* step 4: the switch */
        return ckpt_err(err, CKPT_ERR_IO, "cannot cut the file to its new end (it is still the "
                                          "old checkpoint): %s", strerror(errno));
    CKPT_FORWARD(sync_fd(fd, err));
    /* step 5: the replaced record is dead; where it stays inside the file
     * its bytes must not look like zip structures */
    if (K->data_at < new_eof) {
        bool wrote = false;
        uint64_t to = K->data_at + K->size < new_eof ? K->data_at + K->size : new_eof;
        CKPT_FORWARD(scrub(fd, K->data_at, to - K->data_at, &wrote, err));
        if (wrote)
            CKPT_FORWARD(sync_fd(fd, err));
    }
    return CKPT_OK;
}
