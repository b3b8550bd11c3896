/*
 * io/io.h - the bottom layer: positioned reads and writes, copies and CRCs of
 * file ranges, sinks, and atomic output files.  Everything above reads and
 * writes files through here.
 */
#ifndef CKPT_IO_H
#define CKPT_IO_H

#include "core/core.h"

#include <sys/stat.h>

#define CKPT_IO_BUF (1u << 20) /* the bounded buffers of copies and CRCs */

/* pread all N bytes at AT: CKPT_OK, CKPT_ERR_IO, or CKPT_ERR_FORMAT at end of file. */
int ckpt_pread_all(int fd, void *buf, size_t n, uint64_t at);
/* A hint: the kernel may start reading N bytes at AT now (posix_fadvise). */
void ckpt_prefetch(int fd, uint64_t at, uint64_t n);
/* pwrite all N bytes at OFF. */
int ckpt_write_all(int fd, const void *buf, size_t n, uint64_t off, ckpt_error *err);

/* Open PATH (relative to DIRFD; AT_FDCWD for the current folder) as an
 * input, read-only.  Anything but a regular file (or a folder, when DIR_OK)
 * is refused without being read, so that no input can block: a FIFO, a
 * socket or a device is CKPT_ERR_UNSUPPORTED, "not a regular file (a FIFO)".
 * Links are followed.  *FD and *ST (may be NULL) are set on success; an
 * error that open or stat gives is CKPT_ERR_IO, "cannot open: <why>", with
 * errno left as they set it. */
int ckpt_open_input(int dirfd, const char *path, bool dir_ok, int *fd, struct stat *st,
                    ckpt_error *err);
/* What a file of MODE is, in words: "a FIFO", "a socket", "a folder", ... */
const char *ckpt_file_kind(unsigned mode);

/* CRC-32 (zlib's) of N more bytes; start from 0. */
uint32_t ckpt_crc32_update(uint32_t crc, const uint8_t *p, size_t n);
/* CRC-32 of LEN bytes of FD at OFF through BUF (CKPT_IO_BUF bytes); stops
 * with CKPT_ERR_IO when *CANCEL becomes true.  Status only, no message:
 * safe to call from a helper thread. */
int ckpt_crc_range_buf(int fd, uint64_t off, uint64_t len, uint8_t *buf, uint32_t *out,
                       volatile bool *cancel);
/* CRC-32 of LEN bytes of FD at OFF (a bounded buffer). */
int ckpt_crc_range(int fd, uint64_t off, uint64_t len, uint32_t *crc, ckpt_error *err);
/* Kernel-side copy of LEN bytes (copy_file_range), a bounded buffer where the
 * kernel declines. */
int ckpt_copy_range(int in, uint64_t in_off, int out, uint64_t out_off, uint64_t len,
                    ckpt_error *err);

/* A byte sink: what streams of storage bytes are handed to, piece by piece. */
typedef int (*ckpt_sink_fn)(void *user, const uint8_t *p, size_t n);
/* A sink that writes each piece after the last. */
typedef struct ckpt_fd_sink {
    int fd;
    uint64_t at;
    ckpt_error *err;
} ckpt_fd_sink;
int ckpt_fd_sink_write(void *sink, const uint8_t *p, size_t n);

/* ---- atomic output files (io/output.c) ------------------------------------------ */

typedef struct ckpt_out {
    int fd;
    char *path, *dir;
    char *tmp; /* a named temporary file, when there is one */
    int slot;  /* its entry in the registry of temporaries + 1; 0: none */
    /* set before ckpt_out_commit: the replaced target's second name is not
     * removed but handed back in *deferred (malloc'd; NULL when none), for
     * the caller to remove when freeing its blocks costs nobody's time */
    char **deferred;
} ckpt_out;

/* Open a temporary file that ckpt_out_commit() will name PATH.  EXPECT is
 * the least number of bytes the file will hold (0: unknown): when PATH's
 * filesystem has less free space, CKPT_ERR_IO ("not enough free space in
 * 'DIR': N bytes needed, M available") before anything is created.  On
 * failure the caller still calls ckpt_out_abort(). */
int ckpt_out_open(ckpt_out *o, const char *path, uint64_t expect, ckpt_error *err);
/* fsync, then give the file its name (replacing an existing one). */
int ckpt_out_commit(ckpt_out *o, ckpt_error *err);
/* Close and remove whatever was written. */
void ckpt_out_abort(ckpt_out *o);

/* ---- output folders (io/output.c) ------------------------------------------------
 *
 * A folder written whole or not at all: a temporary folder beside PATH
 * (".NAME.ckpt-XXXXXX"), filled, fsynced, then renamed to PATH
 * (RENAME_NOREPLACE; over an existing PATH with RENAME_EXCHANGE, after
 * which the old one is removed).  ckpt_cleanup_temporaries() removes it
 * too. */
typedef struct ckpt_out_dir {
    int fd;          /* the temporary folder, open */
    char *path, *dir, *tmp;
    int slot;        /* its entry in the registry of temporary folders + 1; 0: none */
} ckpt_out_dir;

/* Make the temporary folder for PATH; CKPT_ERR_USAGE when PATH exists and
 * not REPLACE.  On failure the caller still calls ckpt_out_dir_abort(). */
int ckpt_out_dir_open(ckpt_out_dir *o, const char *path, bool replace, ckpt_error *err);
/* Copy NAME of folder SDIR (a file, or a folder with what it holds; links
 * followed; a FIFO or device refused unread) into O's folder, fsynced. */
int ckpt_out_dir_copy(ckpt_out_dir *o, int sdir, const char *name, ckpt_error *err);
/* fsync, then name it PATH. */
int ckpt_out_dir_commit(ckpt_out_dir *o, ckpt_error *err);
/* Remove the temporary folder and what it holds. */
void ckpt_out_dir_abort(ckpt_out_dir *o);
/* The names in folder DIRFD but "." and "..", sorted (malloc'd each). */
int ckpt_dir_names(int dirfd, char ***names, size_t *n, ckpt_error *err);

#endif /* CKPT_IO_H */
