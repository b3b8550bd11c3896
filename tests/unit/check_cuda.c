/* check_cuda.c - the CUDA runtime that libckpt links: version and devices.
 * Exits 77 (skipped) where there is no GPU, as on build machines. */
#include "ckpt_cuda.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    int version = 0, count = -1;
    int rc = ckpt_cuda_runtime_version(&version);
    if (rc != 0 || version < 1000) {
        fprintf(stderr, "FAIL: cudaRuntimeGetVersion: status %d, version %d\n", rc, version);
        return 1;
    }
    printf("CUDA runtime %d.%d\n", version / 1000, (version % 1000) / 10);
    rc = ckpt_cuda_device_count(&count);
    if (rc != 0) {
        /* no driver at all is reported as a status by some runtimes: skip */
        printf("no usable CUDA driver (%s): skipped\n", ckpt_cuda_strerror(rc));
        return 77;
    }
    if (count == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    for (int d = 0; d < count; d++) {
        char name[256] = "";
        rc = ckpt_cuda_device_name(d, name, sizeof(name));
        if (rc != 0 || !name[0]) {
            fprintf(stderr, "FAIL: device %d: %s\n", d, ckpt_cuda_strerror(rc));
            return 1;
        }
        printf("device %d: %s\n", d, name);
    }
    return 0;
}
