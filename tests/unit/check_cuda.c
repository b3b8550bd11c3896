/* check_cuda.c - the CUDA backend module (libckpt_cuda.so) as libckpt's
 * loader sees it: its one table, whose ABI and struct sizes match this
 * build's, then the CUDA runtime's version, cuDNN as the module finds it
 * (its version and file, or why none: printed), and the devices.
 * Links the module itself.  Exits 77 (skipped) where there is no GPU, as on
 * build machines. */
#include "ckpt_cuda.h"
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    const ckpt_cuda_module *m = &ckpt_cuda_module_entry;
    if (m->abi != CKPT_CUDA_MODULE_ABI || m->size != sizeof *m ||
        m->backend_size != sizeof(ckpt_backend) || m->ops_size != sizeof(ckpt_backend_ops) ||
        m->desc_size != sizeof(ckpt_backend_desc)) {
        fprintf(stderr, "FAIL: the module's table (ABI %u, sizes %u %u %u %u) is not this "
                "build's (ABI %d)\n", m->abi, m->size, m->backend_size, m->ops_size,
                m->desc_size, CKPT_CUDA_MODULE_ABI);
        return 1;
    }
    if (strcmp(m->version, PACKAGE_VERSION) != 0 || strcmp(m->backend->name, "cuda") != 0 ||
        !m->backend->indexed || m->backend->fallback || !m->backend->open) {
        fprintf(stderr, "FAIL: module of ckpt %s, backend \"%s\"\n", m->version,
                m->backend->name);
        return 1;
    }
    printf("module ABI %u, ckpt %s\n", m->abi, m->version);
    int version = 0, count = -1;
    int rc = m->runtime_version(&version);
    if (rc != 0 || version < 1000) {
        fprintf(stderr, "FAIL: cudaRuntimeGetVersion: status %d, version %d\n", rc, version);
        return 1;
    }
    printf("CUDA runtime %d.%d\n", version / 1000, (version % 1000) / 10);
    /* cuDNN needs no GPU to be found: either a version and the file, or
     * why not (CKPT_CUDNN=off, CKPT_CUDNN naming no library, none found) */
    char cudnn[512];
    int cv = m->cudnn_describe(cudnn, sizeof cudnn);
    printf("%s\n", cudnn);
    const char *off = getenv("CKPT_CUDNN");
    int want_off = off && (!strcmp(off, "0") || !strcmp(off, "off"));
    if (cv > 0 ? (want_off || strncmp(cudnn, "cuDNN 9.", 8) || !strstr(cudnn, "libcudnn"))
               : strncmp(cudnn, "no cuDNN: ", 10) != 0) {
        fprintf(stderr, "FAIL: cuDNN version %d, described as \"%s\"\n", cv, cudnn);
        return 1;
    }
    if (want_off && !strstr(cudnn, "CKPT_CUDNN=")) {
        fprintf(stderr, "FAIL: CKPT_CUDNN=%s, and cuDNN is described as \"%s\"\n", off, cudnn);
        return 1;
    }
    rc = m->device_count(&count);
    if (rc != 0) {
        /* no driver at all is reported as a status by some runtimes: skip */
        printf("no usable CUDA driver (%s): skipped\n", m->strerror(rc));
        return 77;
    }
    if (count == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    for (int d = 0; d < count; d++) {
        char name[256] = "";
        rc = m->device_name(d, name, sizeof(name));
        if (rc != 0 || !name[0]) {
            fprintf(stderr, "FAIL: device %d: %s\n", d, m->strerror(rc));
            return 1;
        }
        printf("device %d: %s\n", d, name);
    }
    return 0;
}
