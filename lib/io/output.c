/*
 * output_file.c - atomic creation of an output file: the data goes to an
 * unnamed temporary file in the target's directory (O_TMPFILE, or a hidden
 * named one where the filesystem has no O_TMPFILE), is fsynced, and only
 * then takes the target's name.  A crash or an error leaves no partial file
 * under the target name (and, with O_TMPFILE, nothing at all).
 */
#include "io/io.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return NULL;
    char *d = strdup(dirname(copy));
    free(copy);
    return d;
}

static mode_t creation_mode(void)
{
    /* what open(..., 0666) would give: the process umask applies */
    mode_t m = umask(0);
    umask(m);
    return 0666 & ~m;
}

/* On failure the caller still calls ckpt_out_abort() to free O. */
int ckpt_out_open(ckpt_out *o, const char *path, ckpt_error *err)
{
    memset(o, 0, sizeof(*o));
    o->fd = -1;
    if (!(o->path = strdup(path)) || !(o->dir = dir_of(path)))
        return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
#ifdef O_TMPFILE
    o->fd = open(o->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
    if (o->fd >= 0)
        return CKPT_OK;
    /* filesystems without O_TMPFILE say so with one of these */
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
        return ckpt_err(err, CKPT_ERR_IO, "cannot create a file in '%s': %s", o->dir,
                        strerror(errno));
#endif
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(o->dir) + strlen(base) + 32;
    if (!(o->tmp = malloc(n)))
        return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
    snprintf(o->tmp, n, "%s/.%s.ckpt-XXXXXX", o->dir, base);
    o->fd = mkostemp(o->tmp, O_CLOEXEC);
    if (o->fd < 0) {
        int e = errno;
        free(o->tmp);
        o->tmp = NULL;
        return ckpt_err(err, CKPT_ERR_IO, "cannot create a file in '%s': %s", o->dir, strerror(e));
    }
    if (fchmod(o->fd, creation_mode()) != 0) {
        int e = errno;
        return ckpt_err(err, CKPT_ERR_IO, "cannot set the mode of '%s': %s", path, strerror(e));
    }
    return CKPT_OK;
}

int ckpt_out_commit(ckpt_out *o, ckpt_error *err)
{
    if (fsync(o->fd) != 0)
        return ckpt_err(err, CKPT_ERR_IO, "cannot write '%s': %s", o->path, strerror(errno));
    if (!o->tmp) {
        /* give the unnamed file a hidden name, then rename it over the target */
        size_t n = strlen(o->dir) + strlen(o->path) + 48;
        char proc[64];
        if (!(o->tmp = malloc(n)))
            return ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", o->fd);
        for (int attempt = 0;; attempt++) {
            const char *base = strrchr(o->path, '/');
            snprintf(o->tmp, n, "%s/.%s.ckpt-%ld-%d", o->dir, base ? base + 1 : o->path,
                     (long)getpid(), attempt);
            if (linkat(AT_FDCWD, proc, AT_FDCWD, o->tmp, AT_SYMLINK_FOLLOW) == 0)
                break;
            if (errno != EEXIST || attempt > 100) {
                int e = errno;
                free(o->tmp);
                o->tmp = NULL;
                return ckpt_err(err, CKPT_ERR_IO, "cannot create '%s': %s", o->path, strerror(e));
            }
        }
    }
    if (rename(o->tmp, o->path) != 0) {
        int e = errno;
        unlink(o->tmp);
        free(o->tmp);
        o->tmp = NULL;
        return ckpt_err(err, CKPT_ERR_IO, "cannot create '%s': %s", o->path, strerror(e));
    }
    free(o->tmp);
    o->tmp = NULL;
    /* make the new name durable too */
    int dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
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
    if (o->tmp)
        unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    free(o->dir);
    memset(o, 0, sizeof(*o));
    o->fd = -1;
}
