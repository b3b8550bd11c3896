/*
 * io.c - the bottom of libckpt: positioned reads and writes that finish
 * what they start (EINTR, short counts), kernel-side copies of file ranges,
 * CRC-32 of file ranges, and a sink that appends to a file.  Every other
 * file goes through these instead of calling pread/pwrite itself.
 */
#include "io/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define COPY_CHUNK (8u << 20) /* bytes per copy_file_range call */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CRC_CLMUL 1

/*
 * CRC-32 by carry-less multiplication (Intel's "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ", the bit-reflected constants for
 * zlib's polynomial; Chromium's zlib does the same): four 16-byte lanes
 * folded 64 bytes at a time, then Barrett reduction.  zlib 1.2's tables
 * run at 3 to 6 GB/s here, this at several times that: every tensor byte
 * ckpt checks goes through it.  CRC is the running value, inverted (zlib's
 * ~crc); N is at least 64 and a multiple of 16.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t crc,
                                                                     const uint8_t *buf,
                                                                     size_t len)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    /* four lanes into one */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64, then Barrett reduction to 32 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = poly;
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

uint32_t ckpt_crc32_update(uint32_t crc, const uint8_t *p, size_t n)
{
#ifdef CRC_CLMUL
    static int cpu = -1; /* every thread that finds it unset finds the same */
    int clmul = __atomic_load_n(&cpu, __ATOMIC_RELAXED);
    if (clmul < 0) {
        clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        __atomic_store_n(&cpu, clmul, __ATOMIC_RELAXED);
    }
    if (clmul && n >= 64) {
        size_t whole = n & ~(size_t)15;
        crc = ~crc32_clmul(~crc, p, whole);
        p += whole;
        n -= whole;
    }
#endif
    /* zlib takes uInt lengths: feed big buffers in pieces */
    while (n > (1u << 30)) {
        crc = (uint32_t)crc32(crc, p, 1u << 30);
        p += 1u << 30;
        n -= 1u << 30;
    }
    return (uint32_t)crc32(crc, p, (uInt)n);
}

const char *ckpt_file_kind(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a folder";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "of an unknown kind";
    }
}

int ckpt_open_input(int dirfd, const char *path, bool dir_ok, int *fd, struct stat *st,
                    ckpt_error *err)
{
    struct stat s0, s1;
    *fd = -1;
    /* stat first: a device is never opened (opening one may act) */
    if (fstatat(dirfd, path, &s0, 0) != 0) {
        int e = errno;
        ckpt_err(err, CKPT_ERR_IO, "cannot open: %s", strerror(e));
        errno = e; /* for callers that tell a missing file apart */
        return CKPT_ERR_IO;
    }
    bool ok = S_ISREG(s0.st_mode) || (dir_ok && S_ISDIR(s0.st_mode));
    if (!ok)
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "not a regular file (%s)",
                        ckpt_file_kind(s0.st_mode));
    /* O_NONBLOCK: a FIFO put in its place since never blocks the open */
    int f = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        int e = errno;
        ckpt_err(err, CKPT_ERR_IO, "cannot open: %s", strerror(e));
        errno = e;
        return CKPT_ERR_IO;
    }
    if (fstat(f, &s1) != 0) {
        int e = errno;
        close(f);
        return ckpt_err(err, CKPT_ERR_IO, "cannot stat: %s", strerror(e));
    }
    if (!(S_ISREG(s1.st_mode) || (dir_ok && S_ISDIR(s1.st_mode)))) {
        close(f);
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "not a regular file (%s)",
                        ckpt_file_kind(s1.st_mode));
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(f);
        return ckpt_err(err, CKPT_ERR_IO, "cannot open: %s", strerror(e));
    }
    *fd = f;
    if (st)
        *st = s1;
    return CKPT_OK;
}

/* Ask the kernel to start reading N bytes at AT: reads of scattered small
 * ranges (a zip's local headers, one per record, megabytes apart) then wait
 * for the disk together, not one after another.  Only a hint: errors are
 * ignored. */
void ckpt_prefetch(int fd, uint64_t at, uint64_t n)
{
    (void)posix_fadvise(fd, (off_t)at, (off_t)n, POSIX_FADV_WILLNEED);
}

int ckpt_pread_all(int fd, void *buf, size_t n, uint64_t at)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t k = pread(fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? CKPT_ERR_IO : CKPT_ERR_FORMAT;
        p += k;
        n -= (size_t)k;
        at += (uint64_t)k;
    }
    return CKPT_OK;
}

int ckpt_crc_range_buf(int fd, uint64_t off, uint64_t len, uint8_t *buf, uint32_t *out,
                       volatile bool *cancel)
{
    uint32_t crc = 0;
    while (len) {
        if (cancel && *cancel)
            return CKPT_ERR_IO;
        size_t want = len < CKPT_IO_BUF ? (size_t)len : CKPT_IO_BUF;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? CKPT_ERR_IO : CKPT_ERR_FORMAT;
        crc = ckpt_crc32_update(crc, buf, (size_t)got);
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    *out = crc;
    return CKPT_OK;
}

int ckpt_write_all(int fd, const void *buf, size_t n, uint64_t off, ckpt_error *err)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return ckpt_err(err, CKPT_ERR_IO, "cannot write: %s", strerror(errno));
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return CKPT_OK;
}

int ckpt_fd_sink_write(void *sink, const uint8_t *p, size_t n)
{
    ckpt_fd_sink *k = sink;
    int rc = ckpt_write_all(k->fd, p, n, k->at, k->err);
    k->at += n;
    return rc;
}

int ckpt_crc_range(int fd, uint64_t off, uint64_t len, uint32_t *crc, ckpt_error *err)
{
    uint8_t *buf = malloc(CKPT_IO_BUF);
    if (!buf)
        return ckpt_oom(err);
    int rc = ckpt_crc_range_buf(fd, off, len, buf, crc, NULL);
    free(buf);
    return rc ? ckpt_err(err, rc, "cannot read the input") : CKPT_OK;
}

/* Kernel-side copy of LEN bytes; a bounded buffer where the kernel declines. */
int ckpt_copy_range(int in, uint64_t in_off, int out, uint64_t out_off, uint64_t len,
                    ckpt_error *err)
{
    bool kernel = true;
    uint8_t *buf = NULL;
    while (len) {
        size_t want = len < COPY_CHUNK ? (size_t)len : COPY_CHUNK;
        ssize_t k = -1;
        if (kernel) {
            loff_t ri = (loff_t)in_off, ro = (loff_t)out_off;
            k = copy_file_range(in, &ri, out, &ro, want, 0);
            if (k < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP ||
                          errno == EINVAL || errno == EBADF)) {
                kernel = false;
                continue;
            }
        } else {
            if (!buf && !(buf = malloc(CKPT_IO_BUF)))
                return ckpt_oom(err);
            if (want > CKPT_IO_BUF)
                want = CKPT_IO_BUF;
            k = pread(in, buf, want, (off_t)in_off);
            if (k > 0) {
                ssize_t w = 0;
                while (w < k) {
                    ssize_t x = pwrite(out, buf + w, (size_t)(k - w), (off_t)(out_off + (uint64_t)w));
                    if (x < 0 && errno == EINTR)
                        continue;
                    if (x < 0) {
                        int e = errno;
                        free(buf);
                        return ckpt_err(err, CKPT_ERR_IO, "cannot write: %s", strerror(e));
                    }
                    w += x;
                }
            } else if (k == 0) {
                free(buf);
                return ckpt_err(err, CKPT_ERR_FORMAT, "the input ends early");
            }
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int e = errno;
            free(buf);
            return ckpt_err(err, CKPT_ERR_IO, "cannot write: %s", strerror(e));
        }
        if (k == 0) {
            free(buf);
            return ckpt_err(err, CKPT_ERR_FORMAT, "the input ends early");
        }
        in_off += (uint64_t)k;
        out_off += (uint64_t)k;
        len -= (uint64_t)k;
    }
    free(buf);
    return CKPT_OK;
}
