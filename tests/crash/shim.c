/*
 * shim.c - an LD_PRELOAD layer that stops a process at a chosen write and
 * records what it wrote, for the crash tests of in-place rewrites
 * (tests/interop/inplace_crash.py).
 *
 * It counts the calls that change one file, CRASH_FILE (by device and
 * inode, whatever descriptor or name reaches it): write, pwrite, pwrite64,
 * fsync, fdatasync, ftruncate, ftruncate64; and every rename/renameat/
 * renameat2 (an atomic replacement's switch).
 *   CRASH_AT=N     the process kills itself (SIGKILL) just before the Nth
 *                  counted call: the file is what calls 1..N-1 made of it.
 *   CRASH_COUNT=F  at exit, the number of counted calls is written to F.
 *   CRASH_LOG=F    every counted call is appended to F as it happens, for a
 *                  power-cut replay: records of 1 byte (W write, T truncate,
 *                  S fsync/fdatasync, R rename), 8-byte offset, 8-byte
 *                  length (little-endian), then LENGTH bytes for W.  What a
 *                  power cut before call N leaves is the original file with
 *                  the W and T records before the last S that precedes N.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static dev_t target_dev;
static ino_t target_ino;
static int have_target;
static long counter, crash_at;
static int log_fd = -1;
static const char *count_file;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_ftruncate)(int, off_t);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned);

static void save_count(void)
{
    if (!count_file)
        return;
    FILE *f = fopen(count_file, "w");
    if (f) {
        fprintf(f, "%ld\n", counter);
        fclose(f);
    }
}

__attribute__((constructor)) static void init(void)
{
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    real_renameat2 = dlsym(RTLD_NEXT, "renameat2");
    const char *t = getenv("CRASH_FILE");
    struct stat st;
    if (t && stat(t, &st) == 0) {
        target_dev = st.st_dev;
        target_ino = st.st_ino;
        have_target = 1;
    }
    const char *n = getenv("CRASH_AT");
    crash_at = n ? atol(n) : 0;
    count_file = getenv("CRASH_COUNT");
    const char *l = getenv("CRASH_LOG");
    if (l && *l)
        log_fd = open(l, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (count_file)
        atexit(save_count);
    /* a shell or a wrapper script passes the shim on: only ckpt counts */
    const char *only = getenv("CRASH_ONLY");
    if (only) {
        char exe[4096];
        ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        exe[k > 0 ? k : 0] = 0;
        if (!strstr(exe, only)) {
            have_target = 0;
            crash_at = 0;
            count_file = NULL;
            if (log_fd >= 0)
                close(log_fd);
            log_fd = -1;
        }
    }
}

static int is_target(int fd)
{
    struct stat st;
    return have_target && fstat(fd, &st) == 0 && st.st_dev == target_dev &&
           st.st_ino == target_ino;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void log_op(char op, uint64_t off, const void *data, uint64_t len)
{
    if (log_fd < 0)
        return;
    unsigned char h[17];
    h[0] = (unsigned char)op;
    put64(h + 1, off);
    put64(h + 9, len);
    real_write(log_fd, h, sizeof h);
    const unsigned char *p = data;
    uint64_t left = op == 'W' ? len : 0;
    while (left) {
        ssize_t k = real_write(log_fd, p, left);
        if (k <= 0)
            break;
        p += k;
        left -= (uint64_t)k;
    }
}

/* One more counted call: die here when it is the chosen one. */
static void step(void)
{
    counter++;
    if (crash_at && counter == crash_at) {
        save_count();
        kill(getpid(), SIGKILL);
    }
}

ssize_t write(int fd, const void *buf, size_t n)
{
    if (!real_write)
        init();
    if (!is_target(fd))
        return real_write(fd, buf, n);
    step();
    off_t at = lseek(fd, 0, SEEK_CUR);
    ssize_t k = real_write(fd, buf, n);
    if (k > 0)
        log_op('W', (uint64_t)at, buf, (uint64_t)k);
    return k;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at)
{
    if (!real_pwrite)
        init();
    if (!is_target(fd))
        return real_pwrite(fd, buf, n, at);
    step();
    ssize_t k = real_pwrite(fd, buf, n, at);
    if (k > 0)
        log_op('W', (uint64_t)at, buf, (uint64_t)k);
    return k;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at)
{
    return pwrite(fd, buf, n, at);
}

int fsync(int fd)
{
    if (!real_fsync)
        init();
    if (!is_target(fd))
        return real_fsync(fd);
    step();
    int r = real_fsync(fd);
    if (r == 0)
        log_op('S', 0, NULL, 0);
    return r;
}

int fdatasync(int fd)
{
    if (!real_fdatasync)
        init();
    if (!is_target(fd))
        return real_fdatasync(fd);
    step();
    int r = real_fdatasync(fd);
    if (r == 0)
        log_op('S', 0, NULL, 0);
    return r;
}

int ftruncate(int fd, off_t len)
{
    if (!real_ftruncate)
        init();
    if (!is_target(fd))
        return real_ftruncate(fd, len);
    step();
    int r = real_ftruncate(fd, len);
    if (r == 0)
        log_op('T', (uint64_t)len, NULL, 0);
    return r;
}

int ftruncate64(int fd, off_t len)
{
    return ftruncate(fd, len);
}

int rename(const char *a, const char *b)
{
    if (!real_rename)
        init();
    if (have_target)
        step();
    int r = real_rename(a, b);
    if (r == 0 && have_target)
        log_op('R', 0, NULL, 0);
    return r;
}

int renameat(int da, const char *a, int db, const char *b)
{
    if (!real_renameat)
        init();
    if (have_target)
        step();
    int r = real_renameat(da, a, db, b);
    if (r == 0 && have_target)
        log_op('R', 0, NULL, 0);
    return r;
}

int renameat2(int da, const char *a, int db, const char *b, unsigned flags)
{
    if (!real_renameat2)
        init();
    if (have_target)
        step();
    int r = real_renameat2(da, a, db, b, flags);
    if (r == 0 && have_target)
        log_op('R', 0, NULL, 0);
    return r;
}
