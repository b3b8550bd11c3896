/* machine.c - the devices torch would find on this machine, for the
 * torch_load verdict's missing_here and the fixes ckpt proposes.  The CUDA
 * driver is asked at run time (libcuda.so.1 through dlopen: cuInit, then
 * cuDeviceGetCount), as torch.cuda.device_count() asks it, so no CUDA is
 * needed to build ckpt and a machine without the driver simply has none. */
#include "core/core.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int probe_cuda(void)
{
    /* for tests: the verdict is then the same on a GPU machine as on a CPU one */
    const char *forced = getenv("CKPT_CUDA_DEVICES");
    if (forced && *forced) {
        char *end;
        long n = strtol(forced, &end, 10);
        if (!*end && n >= 0 && n < 65536)
            return (int)n;
    }
    /* never dlclose'd: the driver keeps threads once initialised */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return 0;
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int n = 0;
    if (!init || !count || init(0) != 0 || count(&n) != 0 || n < 0)
        return 0;
    return n;
}

CKPT_API int ckpt_cuda_driver_device_count(void)
{
    /* asked once: cuInit costs tens of milliseconds */
    static int cached = -1;
    int n = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    if (n < 0) {
        n = probe_cuda();
        __atomic_store_n(&cached, n, __ATOMIC_RELEASE);
    }
    return n;
}

CKPT_API int ckpt_device_present(const char *tag)
{
    if (!tag)
        return 0;
    size_t type = strcspn(tag, ":");
    /* meta storages hold no data: torch makes them anywhere */
    if ((type == 3 && strncmp(tag, "cpu", 3) == 0) || (type == 4 && strncmp(tag, "meta", 4) == 0))
        return 1;
    if (type == 4 && strncmp(tag, "cuda", 4) == 0) {
        long index = 0;
        if (tag[4] == ':') {
            char *end;
            index = strtol(tag + 5, &end, 10);
            if (end == tag + 5 || *end || index < 0)
                return 0;
        } else if (tag[4]) {
            return 0;
        }
        return index < ckpt_cuda_driver_device_count();
    }
    /* mps is macOS's alone; other types need a build or plug-in that ckpt
     * cannot see from here: absent, so the advice errs towards the CPU */
    return 0;
}

/* The next tag of a ", "-separated list into TAG; 0 at its end. */
static int next_tag(const char **p, char *tag, size_t cap)
{
    while (**p == ',' || **p == ' ')
        (*p)++;
    if (!**p)
        return 0;
    size_t n = strcspn(*p, ",");
    snprintf(tag, cap, "%.*s", (int)(n < cap - 1 ? n : cap - 1), *p);
    *p += n;
    return 1;
}

CKPT_API int ckpt_device_remap_here(const char *tags, const char *all, const char *each,
                                    char *buf, size_t cap)
{
    char tag[64];
    int only = 1, missing = 0;
    if (!cap)
        return 0;
    buf[0] = '\0';
    for (const char *p = tags ? tags : ""; next_tag(&p, tag, sizeof tag);) {
        int here = ckpt_device_present(tag);
        missing |= !here;
        only &= strcmp(tag, "cpu") == 0 || !here;
    }
    if (!missing)
        return 0;
    if (only) { /* as map_location='cpu' */
        snprintf(buf, cap, " %s cpu", all);
        return 1;
    }
    for (const char *p = tags; next_tag(&p, tag, sizeof tag);) {
        char seen[72];
        snprintf(seen, sizeof seen, " %s=", tag);
        if (ckpt_device_present(tag) || strstr(buf, seen))
            continue;
        int gpu = strncmp(tag, "cuda", 4) == 0 && ckpt_device_present("cuda:0");
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, " %s %s=%s", each, tag, gpu ? "cuda:0" : "cpu");
    }
    return 1;
}
