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
#include <unistd.h>
#include <zlib.h>

#define COPY_CHUNK (8u << 20) /* bytes per copy_file_range call */

uint32_t ckpt_crc32_update(uint32_t crc, const uint8_t *p, size_t n)
{
    /* zlib takes uInt lengths: feed big buffers in pieces */
    while (n > (1u << 30)) {
        crc = (uint32_t)crc32(crc, p, 1u << 30);
        p += 1u << 30;
        n -= 1u << 30;
    }
    return (uint32_t)crc32(crc, p, (uInt)n);
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
        return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
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
                return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
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
