/*
 * zip.c - zip records through libzip: the central directory only at open,
 * record bytes on demand with their CRC-32 checked by us (zlib), so that a
 * flipped data byte is caught whatever libzip's own checks do.  The file is
 * the caller's open descriptor: opened once, its directory read once by us
 * (for the layout checks and data offsets libzip keeps to itself) besides
 * libzip's own parse.
 */
#include "container/container.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>
#include <zlib.h>

struct ckpt_zip {
    zip_t *za;
    int fd;             /* the caller's, borrowed (libzip reads a dup of it) */
    uint64_t file_size;
    int64_t count;
    const char **names; /* libzip-owned strings */
    uint64_t *sizes;
    uint32_t *crcs;
    uint8_t *stored; /* 1 when the record is not compressed (seekable) */
    uint64_t *offsets; /* local header offsets (central directory, at open) */
    uint64_t *csizes;  /* compressed sizes */
    uint16_t *namelens;
    uint64_t cd_off;   /* where the central directory starts */
    bool no_crcs;      /* every record with data has CRC 0: written without them */
    uint8_t *unrecorded; /* 1: this record's CRC 0 is torch's, not its data's
                          * (ckpt_zip_crc_unrecorded) */
    uint8_t *local; /* ckpt_zip_local_ok's answer, kept: 0 not asked yet, 1 yes,
                     * 2 no (each header read once, at open or at first read) */
    ckpt_map index;  /* name -> index; torch (miniz) looks names up without
                      * regard to ASCII case */
    /* The bytes from WIN_AT (WIN_LEN of them) last read for a local
     * header's signature: the next records' headers usually lie in them
     * (a state dict of small tensors: 10,000 headers in 300 reads, not
     * 10,000) */
    uint64_t win_at;
    uint32_t win_len;
    uint8_t win[2048];
};

static int zip_error_to_status(int ze)
{
    switch (ze) {
    case ZIP_ER_OPEN:
    case ZIP_ER_READ:
    case ZIP_ER_SEEK:
        return CKPT_ERR_IO;
    case ZIP_ER_MEMORY:
        return CKPT_ERR_NOMEM;
    case ZIP_ER_COMPNOTSUPP:
    case ZIP_ER_ENCRNOTSUPP:
        return CKPT_ERR_UNSUPPORTED;
    default:
        return CKPT_ERR_FORMAT;
    }
}

static int load_offsets(ckpt_zip *z, int fd, uint64_t size, ckpt_error *err);
static const char *zip_reason(int ze, zip_error_t *e);
static uint64_t rd(const uint8_t *p, int n);

static int by_offset(const void *a, const void *b, void *offsets);

/* Every record must lie in the file, before the central directory, and
 * apart from the others: overlapping records (one local header reached from
 * two directory entries, a record hidden in another's data) and declared
 * sizes far past the file (zip bombs) are refused here, before any data is
 * read or any buffer is sized from them. */
static int check_layout(ckpt_zip *z, ckpt_error *err)
{
    int rc = load_offsets(z, z->fd, z->file_size, err);
    if (rc != CKPT_OK)
        return rc;
    int64_t *order = malloc((size_t)(z->count ? z->count : 1) * sizeof *order);
    if (!order)
        return ckpt_oom(err);
    for (int64_t i = 0; i < z->count; i++) {
        uint64_t start = z->offsets[i], hdr = 30 + (uint64_t)z->namelens[i];
        if (start > z->cd_off || z->cd_off - start < hdr ||
            z->cd_off - start - hdr < z->csizes[i]) {
            free(order);
            return ckpt_err(err, CKPT_ERR_FORMAT,
                            "record '%s' declares %llu bytes, more than the file holds (a zip "
                            "bomb or a truncated file)", z->names[i],
                            (unsigned long long)z->csizes[i]);
        }
        /* deflate expands at most about 1032 to 1 */
        if (!z->stored[i] && z->sizes[i] / 1032 > z->csizes[i] + 64) {
            free(order);
            return ckpt_err(err, CKPT_ERR_FORMAT,
                            "record '%s' declares %llu bytes inflated from %llu: more than "
                            "deflate can expand (a zip bomb)", z->names[i],
                            (unsigned long long)z->sizes[i], (unsigned long long)z->csizes[i]);
        }
        order[i] = i;
    }
    qsort_r(order, (size_t)z->count, sizeof *order, by_offset, z->offsets);
    for (int64_t k = 0; k + 1 < z->count; k++) {
        int64_t a = order[k], b = order[k + 1];
        uint64_t end = z->offsets[a] + 30 + z->namelens[a] + z->csizes[a];
        if (z->offsets[b] < end) {
            rc = ckpt_err(err, CKPT_ERR_FORMAT, "records '%s' and '%s' overlap in the file",
                          z->names[a], z->names[b]);
            break;
        }
    }
    free(order);
    return rc;
}

static int by_offset(const void *a, const void *b, void *offsets)
{
    const uint64_t *off = offsets;
    uint64_t x = off[*(const int64_t *)a], y = off[*(const int64_t *)b];
    return x < y ? -1 : x > y;
}

int ckpt_zip_open(int fd, ckpt_zip **out, ckpt_error *err)
{
    int ze = 0;
    *out = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "%s", strerror(errno));
    /* libzip owns what it is given: a duplicate, read from the start */
    int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0 || lseek(dfd, 0, SEEK_SET) != 0) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        return ckpt_err(err, CKPT_ERR_IO, "%s", strerror(e));
    }
    zip_t *za = zip_fdopen(dfd, ZIP_RDONLY, &ze);
    if (!za) {
        close(dfd);
        /* a seek or read error may be libzip following an offset out of the
         * file (EFBIG): a format problem when one of the fields is wrong */
        char why[512];
        int status = zip_error_to_status(ze);
        if (status == CKPT_ERR_IO && ckpt_zip_why(fd, 0, (uint64_t)st.st_size, why, sizeof why))
            status = CKPT_ERR_FORMAT;
        else if (status == CKPT_ERR_FORMAT)
            ckpt_zip_refusal(fd, 0, (uint64_t)st.st_size, ze, why, sizeof why);
        if (status == CKPT_ERR_FORMAT)
            return ckpt_err(err, status, "not a readable zip archive: %s", why);
        zip_error_t e; /* the system's word */
        zip_error_init_with_code(&e, ze);
        int rc = ckpt_err(err, status, "cannot read the zip archive: %s", zip_error_strerror(&e));
        zip_error_fini(&e);
        return rc;
    }
    ckpt_zip *z = calloc(1, sizeof(*z));
    if (!z) {
        zip_discard(za);
        return ckpt_oom(err);
    }
    z->za = za;
    z->fd = fd;
    z->file_size = (uint64_t)st.st_size;
    z->count = zip_get_num_entries(za, 0);
    if (z->count < 0)
        z->count = 0;
    size_t n = (size_t)z->count ? (size_t)z->count : 1;
    z->names = calloc(n, sizeof(*z->names));
    z->sizes = calloc(n, sizeof(*z->sizes));
    z->crcs = calloc(n, sizeof(*z->crcs));
    z->stored = calloc(n, 1);
    z->unrecorded = calloc(n, 1);
    z->local = calloc(n, 1);
    if (!z->names || !z->sizes || !z->crcs || !z->stored || !z->unrecorded || !z->local) {
        ckpt_zip_close(z);
        return ckpt_oom(err);
    }
    for (int64_t i = 0; i < z->count; i++) {
        zip_stat_t st;
        zip_stat_init(&st);
        if (zip_stat_index(za, (zip_uint64_t)i, ZIP_FL_ENC_RAW, &st) != 0 ||
            !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE)) {
            ckpt_zip_close(z);
            return ckpt_err(err, CKPT_ERR_FORMAT, "unreadable zip directory entry %lld",
                            (long long)i);
        }
        if (st.valid & ZIP_STAT_ENCRYPTION_METHOD && st.encryption_method != ZIP_EM_NONE) {
            /* the message first: st.name belongs to the archive closed next */
            int rc = ckpt_err(err, CKPT_ERR_UNSUPPORTED, "record '%s' is encrypted", st.name);
            ckpt_zip_close(z);
            return rc;
        }
        z->names[i] = st.name;
        z->sizes[i] = st.size;
        z->crcs[i] = (st.valid & ZIP_STAT_CRC) ? st.crc : 0;
        z->stored[i] = (st.valid & ZIP_STAT_COMP_METHOD) && st.comp_method == ZIP_CM_STORE;
    }
    /* torch with compute_crc32 off writes CRC 0 for every record; a single
     * zeroed CRC among computed ones is tampering, and is still checked */
    bool any_data = false, all_zero = true;
    for (int64_t i = 0; i < z->count; i++) {
        any_data |= z->sizes[i] != 0;
        all_zero &= z->sizes[i] == 0 || z->crcs[i] == 0;
    }
    z->no_crcs = any_data && all_zero;
    ckpt_map_init(&z->index, CKPT_MAP_BYTES_NOCASE);
    if (ckpt_map_reserve(&z->index, n) < 0) {
        ckpt_zip_close(z);
        return ckpt_oom(err);
    }
    for (int64_t i = 0; i < z->count; i++) {
        int r = ckpt_map_put(&z->index, z->names[i], strlen(z->names[i]), (size_t)i, NULL);
        if (r == 1) {
            /* torch reads the first, Python's zipfile the last: a scanner
             * and a loader would see different files.  Refuse. */
            r = ckpt_err(err, CKPT_ERR_FORMAT,
                         "two records named '%s' (names are compared ignoring case)",
                         z->names[i]);
            ckpt_zip_close(z);
            return r;
        }
        if (r < 0) {
            ckpt_zip_close(z);
            return ckpt_oom(err);
        }
    }
    int rc = check_layout(z, err);
    if (rc != CKPT_OK) {
        ckpt_zip_close(z);
        return rc;
    }
    *out = z;
    return CKPT_OK;
}

void ckpt_zip_close(ckpt_zip *z)
{
    if (!z)
        return;
    free(z->csizes);
    free(z->namelens);
    if (z->za)
        zip_discard(z->za);
    free(z->names);
    free(z->sizes);
    free(z->crcs);
    free(z->stored);
    free(z->unrecorded);
    free(z->local);
    ckpt_map_release(&z->index);
    free(z->offsets);
    free(z);
}

int64_t ckpt_zip_count(const ckpt_zip *z) { return z->count; }
const char *ckpt_zip_name(const ckpt_zip *z, int64_t i) { return z->names[i]; }
uint64_t ckpt_zip_size(const ckpt_zip *z, int64_t i) { return z->sizes[i]; }
uint32_t ckpt_zip_crc(const ckpt_zip *z, int64_t i) { return z->crcs[i]; }
bool ckpt_zip_has_crcs(const ckpt_zip *z) { return !z->no_crcs; }
void ckpt_zip_crc_unrecorded(ckpt_zip *z, int64_t i) { z->unrecorded[i] = 1; }
bool ckpt_zip_crc_checked(const ckpt_zip *z, int64_t i) { return !z->no_crcs && !z->unrecorded[i]; }

int64_t ckpt_zip_find(const ckpt_zip *z, const char *name)
{
    size_t i;
    return ckpt_map_get(&z->index, name, strlen(name), &i) ? (int64_t)i : -1;
}

static int read_error(ckpt_zip *z, zip_file_t *zf, int64_t i, ckpt_error *err)
{
    zip_error_t *e = zf ? zip_file_get_error(zf) : zip_get_error(z->za);
    int ze = zip_error_code_zip(e);
    if (ze == ZIP_ER_CRC)
        return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s': CRC-32 mismatch (corrupt data)",
                        z->names[i]);
    zip_stat_t st;
    if (ze == ZIP_ER_COMPNOTSUPP && zip_stat_index(z->za, (zip_uint64_t)i, 0, &st) == 0 &&
        (st.valid & ZIP_STAT_COMP_METHOD))
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "record '%s': compression method %u (ckpt "
                        "reads stored (0) and deflate (8))", z->names[i],
                        (unsigned)st.comp_method);
    /* libzip's INVAL here is a local header whose lengths lead out of the
     * file: say which */
    uint8_t h[30];
    uint64_t at = z->offsets[i];
    if (zip_error_to_status(ze) == CKPT_ERR_FORMAT && at < z->cd_off && z->cd_off - at >= 30 &&
        ckpt_pread_all(z->fd, h, 30, at) == CKPT_OK && rd(h, 4) == 0x04034b50) {
        uint64_t data = at + 30 + rd(h + 26, 2) + rd(h + 28, 2);
        if (data > z->cd_off || z->cd_off - data < z->csizes[i])
            return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s': its local header's name and "
                            "extra field lengths (%u and %u bytes) put its %llu bytes of data at "
                            "byte %llu, past the central directory (byte %llu)", z->names[i],
                            (unsigned)rd(h + 26, 2), (unsigned)rd(h + 28, 2),
                            (unsigned long long)z->csizes[i], (unsigned long long)data,
                            (unsigned long long)z->cd_off);
    }
    if (ze == ZIP_ER_INCONS || ze == ZIP_ER_NOENT)
        return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s': its local header disagrees with "
                        "its central directory entry%s", z->names[i],
                        ze == ZIP_ER_NOENT ? " (a zip64 extra field is missing)" : "");
    return ckpt_err(err, zip_error_to_status(ze), "record '%s': %s", z->names[i],
                    zip_error_to_status(ze) == CKPT_ERR_FORMAT ? zip_reason(ze, e)
                                                               : zip_error_strerror(e));
}

/*
 * Stream [offset, offset+len) of record I into BUF.  The CRC is computed over
 * everything read from the start; when the read covers the whole record it
 * must equal the central directory's.
 */
int ckpt_zip_read(ckpt_zip *z, int64_t i, uint64_t offset, void *buf, size_t len,
                  ckpt_error *err)
{
    if (i < 0 || i >= z->count)
        return ckpt_err(err, CKPT_ERR_USAGE, "no zip record %lld", (long long)i);
    uint64_t size = z->sizes[i];
    if (offset > size || len > size - offset)
        return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' is %llu bytes, read of %zu at %llu",
                        z->names[i], (unsigned long long)size, len, (unsigned long long)offset);
    if (len == 0 && size != 0)
        return CKPT_OK;
    /* A stored record's raw bytes are its data: reading them "compressed"
     * skips libzip's own CRC pass, since we compute the CRC here anyway. */
    zip_file_t *zf = zip_fopen_index(z->za, (zip_uint64_t)i, z->stored[i] ? ZIP_FL_COMPRESSED : 0);
    if (!zf)
        return read_error(z, NULL, i, err);
    int rc = CKPT_OK;
    bool whole = offset == 0 && len == size;
    uLong crc = crc32(0L, Z_NULL, 0);
    /* skip to offset; stored records seek, deflated ones are read through */
    if (offset && z->stored[i]) {
        if (zip_fseek(zf, (zip_int64_t)offset, SEEK_SET) != 0) {
            rc = read_error(z, zf, i, err);
            goto done;
        }
    } else if (offset) {
        uint8_t tmp[65536];
        uint64_t left = offset;
        while (left) {
            zip_int64_t got = zip_fread(zf, tmp, left < sizeof(tmp) ? left : sizeof(tmp));
            if (got <= 0) {
                rc = got < 0 ? read_error(z, zf, i, err)
                             : ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' is truncated",
                                        z->names[i]);
                goto done;
            }
            left -= (uint64_t)got;
        }
    }
    uint8_t *p = buf;
    size_t left = len;
    while (left) {
        zip_int64_t got = zip_fread(zf, p, left);
        if (got <= 0) {
            rc = got < 0 ? read_error(z, zf, i, err)
                         : ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' is truncated", z->names[i]);
            goto done;
        }
        if (whole)
            crc = crc32(crc, p, (uInt)got);
        p += got;
        left -= (size_t)got;
    }
    if (whole && !z->stored[i]) {
        /* a deflate stream must end where the directory says the record does */
        uint8_t extra;
        if (zip_fread(zf, &extra, 1) > 0) {
            rc = ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' inflates past its declared %llu "
                          "bytes", z->names[i], (unsigned long long)size);
            goto done;
        }
    }
    if (whole && ckpt_zip_crc_checked(z, i) && (uint32_t)crc != z->crcs[i])
        rc = ckpt_err(err, CKPT_ERR_FORMAT,
                      "record '%s': CRC-32 mismatch (stored %08x, data %08x): the file is corrupt",
                      z->names[i], z->crcs[i], (uint32_t)crc);
done:
    zip_fclose(zf);
    return rc;
}

int ckpt_zip_read_all(ckpt_zip *z, int64_t i, uint64_t max, uint8_t **out, size_t *len,
                      ckpt_error *err)
{
    *out = NULL;
    *len = 0;
    uint64_t size = z->sizes[i];
    if (size > max)
        return ckpt_err(err, CKPT_ERR_LIMIT,
                        "record '%s' is %llu bytes, over the limit of %llu (--max-pickle-bytes)",
                        z->names[i], (unsigned long long)size, (unsigned long long)max);
    uint8_t *buf = malloc(size ? (size_t)size : 1);
    if (!buf)
        return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory reading '%s'", z->names[i]);
    int rc = ckpt_zip_read(z, i, 0, buf, (size_t)size, err);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = (size_t)size;
    return CKPT_OK;
}

#define U32_MAX 0xFFFFFFFFu

/* ---- where a stored record's bytes are, for copying them unread ---------- */

static uint64_t rd(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* libzip keeps local header offsets to itself: read them from the central
 * directory once (libzip has already validated the archive's structure). */
static int load_offsets(ckpt_zip *z, int fd, uint64_t size, ckpt_error *err)
{
    uint8_t tail[65557];
    size_t tn = size < sizeof(tail) ? (size_t)size : sizeof(tail);
    if (ckpt_pread_all(fd, tail, tn, size - tn))
        return ckpt_err(err, CKPT_ERR_IO, "cannot read the zip directory");
    size_t e = tn >= 22 ? tn - 22 : 0;
    while (e > 0 && rd(tail + e, 4) != 0x06054b50)
        e--;
    if (rd(tail + e, 4) != 0x06054b50)
        return ckpt_err(err, CKPT_ERR_FORMAT, "no zip end record");
    uint64_t count = rd(tail + e + 10, 2), cd_size = rd(tail + e + 12, 4),
             cd_off = rd(tail + e + 16, 4);
    uint64_t eocd_at = size - tn + e;
    if (eocd_at >= 20) {
        uint8_t loc[20], rec[56];
        if (!ckpt_pread_all(fd, loc, 20, eocd_at - 20) && rd(loc, 4) == 0x07064b50 &&
            !ckpt_pread_all(fd, rec, 56, rd(loc + 8, 8)) && rd(rec, 4) == 0x06064b50) {
            count = rd(rec + 32, 8);
            cd_size = rd(rec + 40, 8);
            cd_off = rd(rec + 48, 8);
        }
    }
    if ((int64_t)count != z->count || cd_off > size || cd_size > size - cd_off)
        return ckpt_err(err, CKPT_ERR_FORMAT, "zip central directory disagrees with itself");
    uint8_t *cd = malloc(cd_size ? (size_t)cd_size : 1);
    z->offsets = calloc((size_t)count + 1, sizeof(*z->offsets));
    z->csizes = calloc((size_t)count + 1, sizeof(*z->csizes));
    z->namelens = calloc((size_t)count + 1, sizeof(*z->namelens));
    z->cd_off = cd_off;
    if (!cd || !z->offsets || !z->csizes || !z->namelens) {
        free(cd);
        return ckpt_oom(err);
    }
    int rc = ckpt_pread_all(fd, cd, (size_t)cd_size, cd_off) ? CKPT_ERR_IO : CKPT_OK;
    size_t p = 0;
    for (uint64_t i = 0; i < count && rc == CKPT_OK; i++) {
        if (cd_size - p < 46 || rd(cd + p, 4) != 0x02014b50) {
            rc = CKPT_ERR_FORMAT;
            break;
        }
        size_t nl = (size_t)rd(cd + p + 28, 2), xl = (size_t)rd(cd + p + 30, 2),
               cl = (size_t)rd(cd + p + 32, 2);
        if (cd_size - p - 46 < nl + xl + cl) {
            rc = CKPT_ERR_FORMAT;
            break;
        }
        uint64_t usize = rd(cd + p + 24, 4), csize = rd(cd + p + 20, 4), off = rd(cd + p + 42, 4);
        /* zip64 extra: the fields that are 0xFFFFFFFF above, in this order */
        const uint8_t *x = cd + p + 46 + nl, *xe = x + xl;
        while (xe - x >= 4) {
            size_t id = (size_t)rd(x, 2), len = (size_t)rd(x + 2, 2);
            if ((size_t)(xe - x - 4) < len)
                break;
            if (id == 0x0001) {
                const uint8_t *q = x + 4, *qe = q + len;
                if (usize == U32_MAX && qe - q >= 8) {
                    usize = rd(q, 8);
                    q += 8;
                }
                if (csize == U32_MAX && qe - q >= 8) {
                    csize = rd(q, 8);
                    q += 8;
                }
                if (off == U32_MAX && qe - q >= 8)
                    off = rd(q, 8);
            }
            x += 4 + len;
        }
        z->offsets[i] = off;
        z->csizes[i] = csize;
        z->namelens[i] = (uint16_t)nl;
        p += 46 + nl + xl + cl;
    }
    free(cd);
    if (rc)
        return ckpt_err(err, rc, "unreadable zip central directory");
    return CKPT_OK;
}

/* ---- why an archive is refused, in words --------------------------------- */

/* Read N bytes at AT of the SIZE bytes from BASE; false when they are not all there. */
static bool why_read(int fd, uint64_t base, uint64_t size, void *buf, size_t n, uint64_t at)
{
    return at <= size && size - at >= n && ckpt_pread_all(fd, buf, n, base + at) == CKPT_OK;
}

/* The fields a central directory entry defers to its zip64 extra field
 * (0xFFFFFFFF, 0xFFFF for the disk), in the order the field holds them. */
static const char *const z64_field[] = {"uncompressed size", "compressed size",
                                        "local header offset", "disk number"};

/* Whether the N bytes at S are UTF-8 as libzip checks a name or comment whose
 * flags say UTF-8 (lead bytes and their continuation bytes). */
static bool utf8_ok(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t more = s[i] < 0x80 ? 0 : (s[i] & 0xE0) == 0xC0 ? 1 : (s[i] & 0xF0) == 0xE0 ? 2
                    : (s[i] & 0xF8) == 0xF0 ? 3 : 4;
        if (more == 4 || n - i - 1 < more)
            return false;
        for (size_t k = 1; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        i += more + 1;
    }
    return true;
}

/* Check central directory entry K (the LEN bytes at E, its name quoted in
 * messages) against the zip64 rules and the layout: its local header before
 * the central directory at CD_OFF, where it says. */
static bool why_entry(int fd, uint64_t base, uint64_t size, const uint8_t *e, size_t len,
                      uint64_t k, uint64_t cd_off, char *why, size_t cap)
{
    int nl = (int)rd(e + 28, 2);
    const char *name = (const char *)e + 46;
    uint64_t v[4] = {rd(e + 24, 4), rd(e + 20, 4), rd(e + 42, 4), rd(e + 34, 2)};
    bool deferred[4] = {v[0] == U32_MAX, v[1] == U32_MAX, v[2] == U32_MAX, v[3] == 0xFFFF};
    size_t cl = (size_t)rd(e + 32, 2);
    if ((rd(e + 8, 2) & 0x0800) &&
        (!utf8_ok(e + 46, (size_t)nl) || !utf8_ok(e + len - cl, cl))) {
        snprintf(why, cap, "record '%.*s' (central directory entry %llu): its %s is not UTF-8, "
                 "and its flags (bit 11) say it is", nl > 200 ? 200 : nl, name,
                 (unsigned long long)k, utf8_ok(e + 46, (size_t)nl) ? "comment" : "name");
        return true;
    }
    size_t need = 0;
    for (int i = 0; i < 4; i++)
        need += deferred[i] ? (i == 3 ? 4 : 8) : 0;
    const uint8_t *x = e + 46 + nl, *xe = e + len - cl, *z64 = NULL;
    size_t z64_len = 0;
    while (xe - x >= 4) {
        size_t id = (size_t)rd(x, 2), l = (size_t)rd(x + 2, 2);
        if ((size_t)(xe - x - 4) < l) {
            snprintf(why, cap, "record '%.*s' (central directory entry %llu): its extra field "
                     "0x%04zx says %zu bytes, more than the %zu left of its extra fields",
                     nl > 200 ? 200 : nl, name, (unsigned long long)k, id, l,
                     (size_t)(xe - x - 4));
            return true;
        }
        if (id == 0x0001 && !z64) {
            z64 = x + 4;
            z64_len = l;
        }
        x += 4 + l;
    }
    if (need && !z64) {
        int i = 0;
        while (!deferred[i])
            i++;
        snprintf(why, cap, "record '%.*s' (central directory entry %llu): its %s is 0x%s, "
                 "which says a zip64 extra field holds it, and it has no zip64 extra field",
                 nl > 200 ? 200 : nl, name, (unsigned long long)k, z64_field[i],
                 i == 3 ? "FFFF" : "FFFFFFFF");
        return true;
    }
    if (need > z64_len) {
        char list[96] = "";
        for (int i = 0; i < 4; i++)
            if (deferred[i])
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         list[0] ? ", " : "", z64_field[i]);
        snprintf(why, cap, "record '%.*s' (central directory entry %llu): its zip64 extra "
                 "field holds %zu bytes, %zu too few for the fields it defers there (%s)",
                 nl > 200 ? 200 : nl, name, (unsigned long long)k, z64_len, need - z64_len,
                 list);
        return true;
    }
    for (int i = 0; i < 3; i++)
        if (deferred[i]) {
            v[i] = rd(z64, 8);
            z64 += 8;
        }
    uint8_t h[30];
    if (v[2] >= cd_off || cd_off - v[2] < 30) {
        snprintf(why, cap, "record '%.*s' (central directory entry %llu): its local header "
                 "offset %llu is not before the central directory (byte %llu)",
                 nl > 200 ? 200 : nl, name, (unsigned long long)k, (unsigned long long)v[2],
                 (unsigned long long)cd_off);
        return true;
    }
    if (!why_read(fd, base, size, h, 30, v[2]) || rd(h, 4) != 0x04034b50) {
        snprintf(why, cap, "record '%.*s' (central directory entry %llu): no local header at "
                 "byte %llu, its local header offset", nl > 200 ? 200 : nl, name,
                 (unsigned long long)k, (unsigned long long)v[2]);
        return true;
    }
    uint64_t data = v[2] + 30 + rd(h + 26, 2) + rd(h + 28, 2);
    if (data > cd_off || cd_off - data < v[1]) {
        snprintf(why, cap, "record '%.*s' (central directory entry %llu): its compressed size "
                 "%llu runs past the central directory (byte %llu)", nl > 200 ? 200 : nl,
                 name, (unsigned long long)k, (unsigned long long)v[1],
                 (unsigned long long)cd_off);
        return true;
    }
    return false;
}

bool ckpt_zip_why(int fd, uint64_t base, uint64_t size, char *why, size_t cap)
{
    uint8_t tail[65557];
    size_t tn = size < sizeof tail ? (size_t)size : sizeof tail;
    if (size < 22) {
        snprintf(why, cap, "%llu bytes, too short for a zip end record (22 bytes)",
                 (unsigned long long)size);
        return true;
    }
    if (!why_read(fd, base, size, tail, tn, size - tn))
        return false;
    /* the end record: the last signature whose comment ends in the file */
    size_t e = tn - 22 + 1;
    while (e-- > 0)
        if (rd(tail + e, 4) == 0x06054b50 && e + 22 + rd(tail + e + 20, 2) <= tn)
            break;
    if (e == (size_t)-1) {
        snprintf(why, cap, "no end of central directory record (not a zip archive, or cut "
                 "short)");
        return true;
    }
    const uint8_t *r = tail + e;
    uint64_t eocd_at = size - tn + e, limit = eocd_at;
    /* records on this disk, in all, the central directory's size and offset,
     * the disk numbers */
    uint64_t ndisk = rd(r + 8, 2), n = rd(r + 10, 2), cd_size = rd(r + 12, 4),
             cd_off = rd(r + 16, 4), disk = rd(r + 4, 2), cd_disk = rd(r + 6, 2);
    const char *deferred = n == 0xFFFF || ndisk == 0xFFFF ? "record count"
                           : cd_size == U32_MAX ? "central directory size"
                           : cd_off == U32_MAX ? "central directory offset"
                           : disk == 0xFFFF || cd_disk == 0xFFFF ? "disk number" : NULL;
    uint8_t loc[20], r64[56];
    bool has_loc = eocd_at >= 20 && why_read(fd, base, size, loc, 20, eocd_at - 20) &&
                   rd(loc, 4) == 0x07064b50;
    const char *end = "end record";
    if (!has_loc && deferred) {
        snprintf(why, cap, "the end record's %s is 0x%s, which defers it to a zip64 end "
                 "record, and no zip64 end record locator precedes the end record",
                 deferred, strcmp(deferred, "central directory size") &&
                 strcmp(deferred, "central directory offset") ? "FFFF" : "FFFFFFFF");
        return true;
    }
    if (has_loc) {
        uint64_t at = rd(loc + 8, 8);
        if (at >= size) {
            snprintf(why, cap, "the zip64 end record locator points to byte %llu, past the "
                     "end of the file (%llu bytes)", (unsigned long long)at,
                     (unsigned long long)size);
            return true;
        }
        if (at > eocd_at - 20 || eocd_at - 20 - at < 56) {
            snprintf(why, cap, "the zip64 end record locator points to byte %llu, where no "
                     "zip64 end record fits before the locator (byte %llu)",
                     (unsigned long long)at, (unsigned long long)(eocd_at - 20));
            return true;
        }
        if (!why_read(fd, base, size, r64, 56, at) || rd(r64, 4) != 0x06064b50) {
            snprintf(why, cap, "no zip64 end record at byte %llu, where the zip64 end record "
                     "locator points", (unsigned long long)at);
            return true;
        }
        uint64_t v64[4] = {rd(r64 + 24, 8), rd(r64 + 32, 8), rd(r64 + 40, 8), rd(r64 + 48, 8)};
        uint64_t v32[4] = {ndisk, n, cd_size, cd_off}, all[4] = {0xFFFF, 0xFFFF, U32_MAX, U32_MAX};
        static const char *const what[4] = {"records on this disk", "records in all",
                                            "central directory size", "central directory offset"};
        for (int i = 0; i < 4; i++)
            if (v32[i] != all[i] && v32[i] != v64[i]) {
                snprintf(why, cap, "the end record's %s (%llu) and the zip64 end record's "
                         "(%llu) disagree", what[i], (unsigned long long)v32[i],
                         (unsigned long long)v64[i]);
                return true;
            }
        ndisk = v64[0], n = v64[1], cd_size = v64[2], cd_off = v64[3];
        limit = at;
        end = "zip64 end record";
    }
    if (ndisk != n) {
        snprintf(why, cap, "the %s counts %llu records on this disk and %llu in all (an archive "
                 "split over several disks)", end, (unsigned long long)ndisk,
                 (unsigned long long)n);
        return true;
    }
    if (cd_off > limit || limit - cd_off < cd_size) {
        snprintf(why, cap, "the %s's central directory (%llu bytes at byte %llu) runs past "
                 "the %s (byte %llu)", end, (unsigned long long)cd_size,
                 (unsigned long long)cd_off, end, (unsigned long long)limit);
        return true;
    }
    uint8_t *cd = malloc(cd_size ? (size_t)cd_size : 1);
    if (!cd || !why_read(fd, base, size, cd, (size_t)cd_size, cd_off)) {
        free(cd);
        return false;
    }
    bool found = false;
    size_t p = 0;
    uint64_t k = 0;
    for (; k < n && !found; k++) {
        if (cd_size - p < 46 || rd(cd + p, 4) != 0x02014b50) {
            if (cd_size - p < 46)
                snprintf(why, cap, "the %s counts %llu records; its central directory holds "
                         "%llu", end, (unsigned long long)n, (unsigned long long)k);
            else
                snprintf(why, cap, "central directory entry %llu (byte %llu) has no entry "
                         "signature", (unsigned long long)k, (unsigned long long)(cd_off + p));
            found = true;
            break;
        }
        size_t len = 46 + (size_t)rd(cd + p + 28, 2) + (size_t)rd(cd + p + 30, 2) +
                     (size_t)rd(cd + p + 32, 2);
        if (cd_size - p < len) {
            snprintf(why, cap, "central directory entry %llu: its name, extra fields and "
                     "comment run past the central directory", (unsigned long long)k);
            found = true;
            break;
        }
        found = why_entry(fd, base, size, cd + p, len, k, cd_off, why, cap);
        p += len;
    }
    if (!found && p != cd_size) {
        snprintf(why, cap, "the %s's central directory is %llu bytes, and its %llu records "
                 "end after %llu", end, (unsigned long long)cd_size, (unsigned long long)n,
                 (unsigned long long)p);
        found = true;
    }
    free(cd);
    return found;
}

/* libzip's error code in words: libzip's own strings are its codes' ("No
 * such file" for a zip64 field that is missing), not what is wrong with the
 * file. */
static const char *zip_reason(int ze, zip_error_t *e)
{
    switch (ze) {
    case ZIP_ER_NOZIP: return "no end of central directory record (not a zip archive)";
    case ZIP_ER_INCONS:
        return "its end record, central directory and local headers disagree";
    case ZIP_ER_NOENT: return "a zip64 extra field that its headers refer to is missing";
    case ZIP_ER_MULTIDISK: return "it says it spans several disks";
    case ZIP_ER_COMPNOTSUPP: return "a compression method other than stored and deflate";
    case ZIP_ER_ENCRNOTSUPP: return "an encrypted record";
    case ZIP_ER_INVAL: return "a header libzip cannot use (a length or offset out of range)";
    default: return zip_error_strerror(e);
    }
}

void ckpt_zip_refusal(int fd, uint64_t base, uint64_t size, int ze, char *why, size_t cap)
{
    if (ze != ZIP_ER_MEMORY && ckpt_zip_why(fd, base, size, why, cap))
        return;
    zip_error_t e;
    zip_error_init_with_code(&e, ze);
    snprintf(why, cap, "%s", zip_reason(ze, &e));
    zip_error_fini(&e);
}

int ckpt_zip_data_offset(ckpt_zip *z, int64_t i, uint64_t *offset, ckpt_error *err)
{
    int fd = z->fd;
    uint64_t file_size = z->file_size;
    if (!z->stored[i])
        return CKPT_ERR_UNSUPPORTED;
    /* z->offsets were read by check_layout() when the archive was opened */
    uint8_t h[30];
    uint64_t at = z->offsets[i];
    if (at > file_size || file_size - at < 30 || ckpt_pread_all(fd, h, 30, at) ||
        rd(h, 4) != 0x04034b50)
        return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s': bad local header", z->names[i]);
    uint64_t data = at + 30 + rd(h + 26, 2) + rd(h + 28, 2);
    if (data > file_size || file_size - data < z->sizes[i])
        return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' runs past the end of the file",
                        z->names[i]);
    *offset = data;
    return CKPT_OK;
}

int ckpt_zip_local_check(ckpt_zip *z, int64_t i, ckpt_error *err)
{
    if (ckpt_zip_local_ok(z, i))
        return CKPT_OK;
    return ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' has no local header where the central "
                    "directory says (torch refuses to read it: invalid header or archive is "
                    "corrupted)", z->names[i]);
}

void ckpt_zip_prefetch_locals(ckpt_zip *z)
{
    /* headers megabytes apart: one hint each, so that a cold disk serves
     * them together instead of one read after another; a header that
     * shares the previous one's page needs no hint of its own */
    uint64_t last = UINT64_MAX;
    for (int64_t i = 0; i < z->count; i++) {
        uint64_t page = z->offsets[i] / 4096;
        if (page != last && z->offsets[i] < z->file_size)
            ckpt_prefetch(z->fd, z->offsets[i], 30 + (uint64_t)z->namelens[i]);
        last = page;
    }
}

bool ckpt_zip_local_ok(ckpt_zip *z, int64_t i)
{
    if (z->local[i])
        return z->local[i] == 1;
    uint64_t at = z->offsets[i];
    if (at > z->file_size || z->file_size - at < 30) {
        z->local[i] = 2;
        return false;
    }
    if (z->win_len < 4 || at < z->win_at || at - z->win_at > z->win_len - 4) {
        uint64_t n = z->file_size - at < sizeof z->win ? z->file_size - at : sizeof z->win;
        z->win_len = 0;
        if (ckpt_pread_all(z->fd, z->win, (size_t)n, at))
            return false; /* unread: not an answer to keep */
        z->win_at = at;
        z->win_len = (uint32_t)n;
    }
    z->local[i] = rd(z->win + (at - z->win_at), 4) == 0x04034b50 ? 1 : 2;
    return z->local[i] == 1;
}

int ckpt_zip_stream(ckpt_zip *z, int64_t i, int (*sink)(void *user, const uint8_t *p, size_t n),
                    void *user, ckpt_error *err)
{
    zip_file_t *zf = zip_fopen_index(z->za, (zip_uint64_t)i, z->stored[i] ? ZIP_FL_COMPRESSED : 0);
    if (!zf)
        return read_error(z, NULL, i, err);
    uint8_t *buf = malloc(1u << 20);
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t total = 0;
    int rc = buf ? CKPT_OK : ckpt_oom(err);
    while (rc == CKPT_OK) {
        zip_int64_t got = zip_fread(zf, buf, 1u << 20);
        if (got < 0) {
            rc = read_error(z, zf, i, err);
            break;
        }
        if (got == 0)
            break;
        if ((uint64_t)got > z->sizes[i] - total) {
            rc = ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' inflates past its declared %llu "
                          "bytes", z->names[i], (unsigned long long)z->sizes[i]);
            break;
        }
        crc = crc32(crc, buf, (uInt)got);
        total += (uint64_t)got;
        rc = sink(user, buf, (size_t)got);
    }
    if (rc == CKPT_OK && total != z->sizes[i])
        rc = ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' is truncated", z->names[i]);
    if (rc == CKPT_OK && ckpt_zip_crc_checked(z, i) && (uint32_t)crc != z->crcs[i])
        rc = ckpt_err(err, CKPT_ERR_FORMAT,
                      "record '%s': CRC-32 mismatch (stored %08x, data %08x): the file is corrupt",
                      z->names[i], z->crcs[i], (uint32_t)crc);
    free(buf);
    zip_fclose(zf);
    return rc;
}
