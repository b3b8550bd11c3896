/* version.c - library version and what it was built against. */
#include "core/core.h"

#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <zip.h>
#include <zlib.h>

CKPT_API int ckpt_version_number(void)
{
    return CKPT_VERSION_NUMBER;
}

CKPT_API const char *ckpt_version_details(void)
{
    static char buf[256];
    /* no CUDA here: the CUDA runtime is the module's, loaded by lib/runtime
     * (ckpt_cuda_module_describe) */
    snprintf(buf, sizeof(buf), "ckpt %d.%d.%d (libzip %s, zlib %s, PCRE2 %d.%d, cJSON %s)",
             CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR, CKPT_VERSION_PATCH, zip_libzip_version(),
             zlibVersion(), PCRE2_MAJOR, PCRE2_MINOR, cJSON_Version());
    return buf;
}
