/* version.c - library version and what it was built against. */
#include "core/core.h"

#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <zip.h>
#include <zlib.h>

#if CKPT_HAVE_CUDA
#include "../kernels/ckpt_cuda.h"
#endif

CKPT_API int ckpt_version_number(void)
{
    return CKPT_VERSION_NUMBER;
}

CKPT_API const char *ckpt_version_details(void)
{
    static char buf[256];
    char cuda[64] = "CUDA not built";
#if CKPT_HAVE_CUDA
    int rt = 0;
    if (ckpt_cuda_runtime_version(&rt) == 0)
        snprintf(cuda, sizeof(cuda), "CUDA runtime %d.%d", rt / 1000, (rt % 1000) / 10);
    else
        snprintf(cuda, sizeof(cuda), "CUDA runtime unavailable");
#endif
    snprintf(buf, sizeof(buf), "ckpt %d.%d.%d (libzip %s, zlib %s, PCRE2 %d.%d, cJSON %s, %s)",
             CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR, CKPT_VERSION_PATCH, zip_libzip_version(),
             zlibVersion(), PCRE2_MAJOR, PCRE2_MINOR, cJSON_Version(), cuda);
    return buf;
}
