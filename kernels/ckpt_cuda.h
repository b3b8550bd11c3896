/* ckpt_cuda.h - CUDA device discovery (cuda_device.cu), plain C.  Every
 * call returns 0 on success or a CUDA error number; nothing aborts. */
#ifndef CKPT_CUDA_H
#define CKPT_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cudaRuntimeGetVersion (e.g. 13000 for 13.0). */
int ckpt_cuda_runtime_version(int *version);
/* Number of usable devices; 0 (and status 0) when there is no GPU or driver. */
int ckpt_cuda_device_count(int *count);
/* Name of device N into BUF. */
int ckpt_cuda_device_name(int device, char *buf, int cap);
/* Human-readable text for a status returned above. */
const char *ckpt_cuda_strerror(int status);

/* The runtime's CUDA backend (backend_cuda.cu) is reached through its
 * descriptor, ckpt_backend_cuda (lib/runtime/backends.h). */

#ifdef __cplusplus
}
#endif

#endif
