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
    ckpt_map index;  /* name -> index; torch (miniz) looks names up without
                      * regard to ASCII case */
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
        zip_error_t e;
        zip_error_init_with_code(&e, ze);
        int rc = ckpt_err(err, zip_error_to_status(ze), "not a readable zip archive: %s",
                          zip_error_strerror(&e));
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
    if (!z->names || !z->sizes || !z->crcs || !z->stored || !z->unrecorded) {
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
    return ckpt_err(err, zip_error_to_status(ze), "record '%s': %s", z->names[i],
                    zip_error_strerror(e));
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

bool ckpt_zip_local_ok(const ckpt_zip *z, int64_t i)
{
    uint8_t h[4];
    uint64_t at = z->offsets[i];
    return at <= z->file_size && z->file_size - at >= 30 && !ckpt_pread_all(z->fd, h, 4, at) &&
           rd(h, 4) == 0x04034b50;
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
