/* runtime_backend.c - choosing and opening a backend ("auto", "cpu",
 * "cuda:N"), and the small helpers every backend shares. */
#include "core/core.h"
#include "runtime/backend.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CKPT_HAVE_CUDA
#include "../kernels/ckpt_cuda.h"
#endif

int ckpt_backend_fail(ckpt_backend *b, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->message, sizeof b->message, fmt, ap);
    va_end(ap);
    return status;
}

int64_t ckpt_array_numel(const ckpt_array *a)
{
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        n *= a->shape[i];
    return n;
}

void ckpt_array_clear(ckpt_array *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

int ckpt_cuda_device_count_usable(void)
{
#if CKPT_HAVE_CUDA
    int n = 0;
    if (ckpt_cuda_device_count(&n) != 0)
        return 0;
    return n;
#else
    return 0;
#endif
}

static int parse_cuda_index(const char *device, int *index)
{
    if (strcmp(device, "cuda") == 0) {
        *index = 0;
        return 0;
    }
    if (strncmp(device, "cuda:", 5) != 0 || !device[5])
        return -1;
    char *end;
    errno = 0;
    long v = strtol(device + 5, &end, 10);
    if (*end || errno || v < 0 || v > 1023 || device[5] == '+' || device[5] == ' ')
        return -1;
    *index = (int)v;
    return 0;
}

static int backend_open(const char *device, ckpt_backend **out, char *err, size_t cap)
{
    if (strcmp(device, "cpu") == 0)
        return ckpt_backend_cpu_open(out, err, cap);

    if (strcmp(device, "auto") == 0) {
#if CKPT_HAVE_CUDA
        if (ckpt_cuda_device_count_usable() > 0) {
            char why[256];
            int rc = ckpt_backend_cuda_open(0, out, why, sizeof why);
            if (rc == CKPT_OK)
                return rc;
            rc = ckpt_backend_cpu_open(out, err, cap);
            if (rc == CKPT_OK)
                snprintf(err, cap, "CUDA could not be used (%s)", why);
            return rc;
        }
        int rc = ckpt_backend_cpu_open(out, err, cap);
        if (rc == CKPT_OK)
            snprintf(err, cap, "no GPU found");
        return rc;
#else
        int rc = ckpt_backend_cpu_open(out, err, cap);
        if (rc == CKPT_OK)
            snprintf(err, cap, "this ckpt was built without CUDA");
        return rc;
#endif
    }

    int index;
    if (parse_cuda_index(device, &index) != 0) {
        snprintf(err, cap, "unknown device \"%s\" (use auto, cpu, cuda or cuda:N)", device);
        return CKPT_ERR_USAGE;
    }
#if CKPT_HAVE_CUDA
    return ckpt_backend_cuda_open(index, out, err, cap);
#else
    snprintf(err, cap, "%s: this ckpt was built without CUDA (configure --with-cuda)", device);
    return CKPT_ERR_DEVICE;
#endif
}

int ckpt_backend_open(const char *device, ckpt_backend **out, char *err, size_t cap)
{
    char dummy[8];
    if (!err || !cap) {
        err = dummy;
        cap = sizeof dummy;
    }
    err[0] = '\0';
    if (!out || !device) {
        snprintf(err, cap, "no device named");
        return CKPT_ERR_USAGE;
    }
    *out = NULL;
    int rc = backend_open(device, out, err, cap);
    if (rc == CKPT_OK)
        (*out)->refs = 1;
    return rc;
}

/* Models that hold parameters on a backend keep it alive, so the order in
 * which a caller frees models and backends does not matter. */
void ckpt_backend_free(ckpt_backend *b)
{
    if (b && --b->refs <= 0)
        b->ops->destroy(b);
}

const char *ckpt_backend_device(const ckpt_backend *b)
{
    return b->device;
}

const char *ckpt_backend_description(const ckpt_backend *b)
{
    return b->description;
}
