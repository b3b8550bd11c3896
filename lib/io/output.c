/*
 * output.c - atomic creation of an output file (doc/design.md, "Common rules").
 *
 * The data goes to a temporary file in the target's directory: an unnamed
 * one (O_TMPFILE), or a hidden named one, ".NAME.ckpt-XXXXXX", where the
 * filesystem has no O_TMPFILE.  It is fsynced and only then takes the
 * target's name (an unnamed file is first linked under a hidden name, then
 * renamed), so the target is the old file or the complete new one, never a
 * part.  A target that exists is given a second name (NAME's temporary
 * name + "-old") before the rename and loses it once the new file is
 * durable: its blocks are freed outside the commit that fsync waits for.  An error leaves nothing behind: ckpt_out_abort() closes and removes
 * the temporary file.
 *
 * Free space: ckpt_out_open() is told the least number of bytes the
 * file will hold and refuses (CKPT_ERR_IO) before creating anything when
 * the target's filesystem has less free space (statvfs of the directory;
 * the blocks reserved for root count as free when running as root, so that
 * only a write that cannot fit is refused).
 *
 * Signals: the library installs no handler and never exits.  It keeps a
 * fixed registry of the temporary files that have a name while they exist
 * (the named fallback from creation to commit; an O_TMPFILE file only for
 * the instant between linkat and rename), and ckpt_cleanup_temporaries()
 * (ckpt.h), which only reads that registry and calls unlink(), is safe to
 * call from the program's own handler of SIGINT, SIGTERM, SIGHUP before it
 * dies of the signal (the ckpt command does, in src/main.c).  Creating or
 * removing a name and recording it in the registry happen with every
 * signal blocked in the calling thread, so a handler running on that
 * thread sees every name that exists.  An unnamed file needs nothing: the
 * kernel frees it when the process dies.
 *
 * CKPT_NO_O_TMPFILE: when this environment variable is set and not empty,
 * O_TMPFILE is not tried and the named fallback is used.  It exists for the
 * test suite only (tests/cli/output.sh), to exercise the fallback on
 * filesystems that have O_TMPFILE.
 */
#include "io/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the registry of named temporary files ----------------------------------- */

/* More than the files a process writes at once (a set writes one part at a
 * time); when every slot is taken a file is still written, and removed on
 * an error, but not by ckpt_cleanup_temporaries(). */
#define TEMP_SLOTS 16

/* Targets from this size on are linked aside while they are replaced
 * (ckpt_out_commit): below it, freeing their blocks takes a few milliseconds. */
#define ASIDE_MIN (64 << 20)

enum { SLOT_FREE, SLOT_FILLING, SLOT_LIVE };

static atomic_int temp_state[TEMP_SLOTS];
static char temp_name[TEMP_SLOTS][PATH_MAX];

/* Record PATH; its slot + 1, or 0 (registry full, or PATH too long to exist). */
static int temp_register(const char *path)
{
    size_t n = strlen(path);
    if (n >= PATH_MAX)
        return 0;
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int expected = SLOT_FREE;
        if (atomic_compare_exchange_strong(&temp_state[i], &expected, SLOT_FILLING)) {
            memcpy(temp_name[i], path, n + 1);
            atomic_store(&temp_state[i], SLOT_LIVE);
            return i + 1;
        }
    }
    return 0;
}

static void temp_release(int *slot)
{
    if (*slot > 0)
        atomic_store(&temp_state[*slot - 1], SLOT_FREE);
    *slot = 0;
}

/* Temporary folders (ckpt_out_dir) while they exist; a folder's files are
 * removed with it.  A process writes one folder at a time. */
#define DIR_SLOTS 4
/* How deep a temporary folder is removed: a model folder's own subfolders
 * are few levels deep (ckpt_out_dir_copy refuses deeper ones). */
#define TREE_DEPTH 16

static atomic_int dir_state[DIR_SLOTS];
static char dir_name[DIR_SLOTS][PATH_MAX];

/* Remove NAME in DIRFD, a file or a folder DEPTH levels deep, links not
 * followed.  Async-signal-safe (openat, getdents64, unlinkat): a signal
 * handler removes a temporary folder with it. */
static void rm_tree_at(int dirfd, const char *name, int depth)
{
    if (unlinkat(dirfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM) || depth <= 0) {
        if (depth <= 0)
            unlinkat(dirfd, name, AT_REMOVEDIR);
        return;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    /* entries removed while listing may hide others: list again until empty */
    for (int pass = 0; pass < 8; pass++) {
        char buf[4096] __attribute__((aligned(8)));
        long n;
        bool any = false;
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0)
            for (long off = 0; off < n;) {
                struct dirent_64 {
                    uint64_t ino;
                    int64_t off;
                    unsigned short reclen;
                    unsigned char type;
                    char name[];
                } *d = (struct dirent_64 *)(void *)(buf + off);
                if (strcmp(d->name, ".") != 0 && strcmp(d->name, "..") != 0) {
                    rm_tree_at(fd, d->name, depth - 1);
                    any = true;
                }
                off += d->reclen;
            }
        if (!any || lseek(fd, 0, SEEK_SET) != 0)
            break;
    }
    close(fd);
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

CKPT_API void ckpt_cleanup_temporaries(void)
{
    /* async-signal-safe: lock-free atomic loads, unlink() and rm_tree_at() */
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (atomic_load(&temp_state[i]) == SLOT_LIVE)
            unlink(temp_name[i]);
    for (int i = 0; i < DIR_SLOTS; i++)
        if (atomic_load(&dir_state[i]) == SLOT_LIVE)
            rm_tree_at(AT_FDCWD, dir_name[i], TREE_DEPTH);
}

/* Block every signal in this thread (restored by unblock_signals): a name
 * is created or removed and its registry entry changed as one step. */
static void block_signals(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

static void unblock_signals(const sigset_t *old)
{
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* ---- output files ----------------------------------------------------------------- */

static char *dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return NULL;
    char *d = strdup(dirname(copy));
    free(copy);
    return d;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static mode_t creation_mode(void)
{
    /* what open(..., 0666) would give: the process umask applies */
    mode_t m = umask(0);
    umask(m);
    return 0666 & ~m;
}

/* Refuse when the filesystem of O->dir cannot hold EXPECT more bytes. */
static int check_space(const ckpt_out *o, uint64_t expect, ckpt_error *err)
{
    struct statvfs sv;
    if (expect == 0 || statvfs(o->dir, &sv) != 0)
        return CKPT_OK; /* unknown: creating the file reports what is wrong */
    uint64_t unit = sv.f_frsize ? sv.f_frsize : sv.f_bsize;
    uint64_t blocks = geteuid() == 0 ? sv.f_bfree : sv.f_bavail;
    if (unit == 0 || blocks > UINT64_MAX / unit)
        return CKPT_OK;
    uint64_t avail = blocks * unit;
    if (expect <= avail)
        return CKPT_OK;
    return ckpt_err(err, CKPT_ERR_IO,
                    "not enough free space in '%s': %llu bytes needed, %llu available", o->dir,
                    (unsigned long long)expect, (unsigned long long)avail);
}

/* On failure the caller still calls ckpt_out_abort() to free O. */
int ckpt_out_open(ckpt_out *o, const char *path, uint64_t expect, ckpt_error *err)
{
    memset(o, 0, sizeof(*o)); /* (deferred: NULL) */
    o->fd = -1;
    if (!(o->path = strdup(path)) || !(o->dir = dir_of(path)))
        return ckpt_oom(err);
    CKPT_FORWARD(check_space(o, expect, err));
#ifdef O_TMPFILE
    const char *no_tmpfile = getenv("CKPT_NO_O_TMPFILE"); /* tests only (see above) */
    if (!no_tmpfile || !*no_tmpfile) {
        o->fd = open(o->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
        if (o->fd >= 0)
            return CKPT_OK;
        /* filesystems without O_TMPFILE say so with one of these */
        if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
            return ckpt_err(err, CKPT_ERR_IO, "cannot create a file in '%s': %s", o->dir,
                            strerror(errno));
    }
#endif
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(o->dir) + strlen(base) + 32;
    if (!(o->tmp = malloc(n)))
        return ckpt_oom(err);
    snprintf(o->tmp, n, "%s/.%s.ckpt-XXXXXX", o->dir, base);
    sigset_t old;
    block_signals(&old);
    o->fd = mkostemp(o->tmp, O_CLOEXEC);
    int e = errno;
    if (o->fd >= 0)
        o->slot = temp_register(o->tmp);
    unblock_signals(&old);
    if (o->fd < 0) {
        free(o->tmp);
        o->tmp = NULL;
        return ckpt_err(err, CKPT_ERR_IO, "cannot create a file in '%s': %s", o->dir, strerror(e));
    }
    if (fchmod(o->fd, creation_mode()) != 0) {
        e = errno;
        return ckpt_err(err, CKPT_ERR_IO, "cannot set the mode of '%s': %s", path, strerror(e));
    }
    return CKPT_OK;
}

int ckpt_out_commit(ckpt_out *o, ckpt_error *err)
{
    if (fsync(o->fd) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot write '%s': %s", o->path, strerror(errno));
    sigset_t old;
    block_signals(&old);
    if (!o->tmp) {
        /* give the unnamed file a hidden name, then rename it over the target */
        size_t n = strlen(o->dir) + strlen(o->path) + 48;
        char proc[64];
        if (!(o->tmp = malloc(n))) {
            unblock_signals(&old);
            return ckpt_oom(err);
        }
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", o->fd);
        for (int attempt = 0;; attempt++) {
            const char *base = strrchr(o->path, '/');
            snprintf(o->tmp, n, "%s/.%s.ckpt-%ld-%d", o->dir, base ? base + 1 : o->path,
                     (long)getpid(), attempt);
            if (linkat(AT_FDCWD, proc, AT_FDCWD, o->tmp, AT_SYMLINK_FOLLOW) == 0) {
                o->slot = temp_register(o->tmp);
                break;
            }
            if (errno != EEXIST || attempt > 100) {
                int e = errno;
                free(o->tmp);
                o->tmp = NULL;
                unblock_signals(&old);
                return ckpt_err(err, CKPT_ERR_IO, "cannot create '%s': %s", o->path, strerror(e));
            }
        }
    }
    /* An existing target keeps a second name until the new file is durable
     * (below): the rename then drops no last link, so freeing its blocks
     * (and, on a filesystem mounted with discard, discarding them) is not
     * part of the commit that the directory's fsync waits for.  It is
     * freed after, when that name goes. */
    char *aside = NULL;
    int aside_slot = 0;
    struct stat ost;
    if (lstat(o->path, &ost) == 0 && S_ISREG(ost.st_mode) && ost.st_nlink == 1 &&
        ost.st_size >= ASIDE_MIN && (aside = malloc(strlen(o->tmp) + 16))) {
        snprintf(aside, strlen(o->tmp) + 16, "%s-old", o->tmp);
        if (link(o->path, aside) == 0) {
            aside_slot = temp_register(aside);
        } else {
            free(aside);
            aside = NULL;
        }
    }
    if (rename(o->tmp, o->path) != 0) {
        int e = errno;
        unlink(o->tmp);
        temp_release(&o->slot);
        if (aside)
            unlink(aside);
        temp_release(&aside_slot);
        unblock_signals(&old);
        free(aside);
        free(o->tmp);
        o->tmp = NULL;
        return ckpt_err(err, CKPT_ERR_IO, "cannot create '%s': %s", o->path, strerror(e));
    }
    temp_release(&o->slot);
    unblock_signals(&old);
    free(o->tmp);
    o->tmp = NULL;
    /* make the new name durable too */
    int dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    if (aside && o->deferred) {
        temp_release(&aside_slot);
        *o->deferred = aside;
    } else if (aside) {
        block_signals(&old);
        unlink(aside);
        temp_release(&aside_slot);
        unblock_signals(&old);
        free(aside);
    }
    close(o->fd);
    o->fd = -1;
    free(o->path);
    free(o->dir);
    o->path = o->dir = NULL;
    return CKPT_OK;
}

void ckpt_out_abort(ckpt_out *o)
{
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp) {
        sigset_t old;
        block_signals(&old);
        unlink(o->tmp);
        temp_release(&o->slot);
        unblock_signals(&old);
    }
    free(o->tmp);
    free(o->path);
    free(o->dir);
    memset(o, 0, sizeof(*o));
    o->fd = -1;
}

/* ---- output folders ------------------------------------------------------------------ */

int ckpt_out_dir_open(ckpt_out_dir *o, const char *path, bool replace, ckpt_error *err)
{
    memset(o, 0, sizeof(*o));
    o->fd = -1;
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--; /* "OUT/" names OUT */
    if (!(o->path = strndup(path, len)) || !(o->dir = dir_of(o->path)))
        return ckpt_oom(err);
    struct stat st;
    if (lstat(o->path, &st) == 0 && !replace)
        return ckpt_err(err, CKPT_ERR_USAGE, "'%s' exists (%s): a model folder is written "
                        "as a new folder; remove it, or pass --force to replace it whole",
                        o->path, ckpt_file_kind(st.st_mode));
    const char *base = strrchr(o->path, '/');
    base = base ? base + 1 : o->path;
    size_t n = strlen(o->dir) + strlen(base) + 32;
    if (!(o->tmp = malloc(n)))
        return ckpt_oom(err);
    snprintf(o->tmp, n, "%s/.%s.ckpt-XXXXXX", o->dir, base);
    sigset_t old;
    block_signals(&old);
    bool made = mkdtemp(o->tmp) != NULL;
    int e = errno;
    for (int i = 0; made && n < PATH_MAX && i < DIR_SLOTS; i++) {
        int expected = SLOT_FREE;
        if (atomic_compare_exchange_strong(&dir_state[i], &expected, SLOT_FILLING)) {
            memcpy(dir_name[i], o->tmp, strlen(o->tmp) + 1);
            atomic_store(&dir_state[i], SLOT_LIVE);
            o->slot = i + 1;
            break;
        }
    }
    unblock_signals(&old);
    if (!made) {
        free(o->tmp);
        o->tmp = NULL;
        return ckpt_err(err, CKPT_ERR_IO, "cannot create a folder in '%s': %s", o->dir,
                        strerror(e));
    }
    /* mkdtemp makes it 0700: a folder as mkdir(path, 0777) would make it */
    mode_t mask = umask(0);
    umask(mask);
    o->fd = open(o->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (o->fd < 0 || fchmod(o->fd, 0777 & ~mask) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot open '%s': %s", o->tmp, strerror(errno));
    return CKPT_OK;
}

/* Copy the regular file SFD (ST) as NAME into DFD. */
static int copy_file(int sfd, const struct stat *st, int dfd, const char *name, ckpt_error *err)
{
    int out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, creation_mode());
    if (out < 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot create '%s': %s", name, strerror(errno));
    int rc = ckpt_copy_range(sfd, 0, out, 0, (uint64_t)st->st_size, err);
    if (rc == CKPT_OK && fsync(out) != 0)
        rc = ckpt_err(err, CKPT_ERR_IO, "cannot write '%s': %s", name, strerror(errno));
    close(out);
    return rc;
}

static int copy_tree(int sdir, const char *name, int ddir, int depth, ckpt_error *err)
{
    int fd;
    struct stat st;
    CKPT_FORWARD(ckpt_open_input(sdir, name, true, &fd, &st, err));
    if (!S_ISDIR(st.st_mode)) {
        int rc = copy_file(fd, &st, ddir, name, err);
        close(fd);
        return rc;
    }
    if (depth <= 0) {
        close(fd);
        return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "'%s': folders nested more than %d deep",
                        name, TREE_DEPTH - 1);
    }
    int rc = CKPT_OK, out = -1;
    if (mkdirat(ddir, name, 0777) != 0 ||
        (out = openat(ddir, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = ckpt_err(err, CKPT_ERR_IO, "cannot create '%s': %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    char **names = NULL;
    size_t n = 0;
    rc = ckpt_dir_names(fd, &names, &n, err);
    for (size_t i = 0; rc == CKPT_OK && i < n; i++)
        rc = copy_tree(fd, names[i], out, depth - 1, err);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (rc == CKPT_OK && fsync(out) != 0)
        rc = ckpt_err(err, CKPT_ERR_IO, "cannot write '%s': %s", name, strerror(errno));
    close(out);
    close(fd);
    return rc;
}

int ckpt_out_dir_copy(ckpt_out_dir *o, int sdir, const char *name, ckpt_error *err)
{
    return copy_tree(sdir, name, o->fd, TREE_DEPTH - 1, err);
}

int ckpt_dir_names(int dirfd, char ***out, size_t *count, ckpt_error *err)
{
    *out = NULL;
    *count = 0;
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return ckpt_err(err, CKPT_ERR_IO, "cannot list a folder: %s", strerror(errno));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = CKPT_OK;
    struct dirent *e;
    while (rc == CKPT_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char **g = realloc(names, nc * sizeof(*g));
            if (!g) {
                rc = ckpt_oom(err);
                break;
            }
            names = g;
            cap = nc;
        }
        if (!(names[n] = strdup(e->d_name)))
            rc = ckpt_oom(err);
        else
            n++;
    }
    closedir(d);
    if (rc == CKPT_OK && n)
        qsort(names, n, sizeof(*names), cmp_names);
    if (rc != CKPT_OK) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
        return rc;
    }
    *out = names;
    *count = n;
    return CKPT_OK;
}

int ckpt_out_dir_commit(ckpt_out_dir *o, ckpt_error *err)
{
    if (fsync(o->fd) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot write '%s': %s", o->path, strerror(errno));
    close(o->fd);
    o->fd = -1;
    struct stat st;
    bool exists = lstat(o->path, &st) == 0;
    sigset_t old;
    block_signals(&old);
    /* NOREPLACE: a folder made at OUT since the check is not replaced
     * (rename() would put the new one over an empty folder silently);
     * EXCHANGE: OUT is the old folder or the new one at every instant */
    int r = renameat2(AT_FDCWD, o->tmp, AT_FDCWD, o->path,
                      exists ? RENAME_EXCHANGE : RENAME_NOREPLACE);
    int e = errno;
    unblock_signals(&old);
    if (r != 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot create '%s': %s", o->path, strerror(e));
    /* what the temporary name holds now is the replaced OUT (or nothing):
     * removed while still registered, so that a signal removes it too */
    if (exists)
        rm_tree_at(AT_FDCWD, o->tmp, TREE_DEPTH);
    block_signals(&old);
    if (o->slot)
        atomic_store(&dir_state[o->slot - 1], SLOT_FREE);
    o->slot = 0;
    unblock_signals(&old);
    int dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(o->tmp);
    o->tmp = NULL;
    ckpt_out_dir_abort(o);
    return CKPT_OK;
}

void ckpt_out_dir_abort(ckpt_out_dir *o)
{
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp) {
        rm_tree_at(AT_FDCWD, o->tmp, TREE_DEPTH);
        sigset_t old;
        block_signals(&old);
        if (o->slot)
            atomic_store(&dir_state[o->slot - 1], SLOT_FREE);
        unblock_signals(&old);
    }
    free(o->tmp);
    free(o->path);
    free(o->dir);
    memset(o, 0, sizeof(*o));
    o->fd = -1;
}
