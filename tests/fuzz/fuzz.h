/* fuzz.h - shared by the fuzz targets: the libFuzzer entry point, and a
 * file made from the input for the entry points that read paths. */
#ifndef CKPT_FUZZ_H
#define CKPT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Write DATA to a fresh file under $TMPDIR (or /tmp) with SUFFIX; the path
 * is malloc'd; NULL when it cannot be made. */
static inline char *fuzz_file(const uint8_t *data, size_t size, const char *suffix)
{
    const char *dir = getenv("TMPDIR");
    char *path = malloc(4096);
    if (!path)
        return NULL;
    snprintf(path, 4096, "%s/ckpt-fuzz-XXXXXX%s", dir && *dir ? dir : "/tmp", suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    if (fd < 0) {
        free(path);
        return NULL;
    }
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    close(fd);
    return path;
}

static inline void fuzz_file_done(char *path)
{
    if (path) {
        unlink(path);
        free(path);
    }
}

#endif
