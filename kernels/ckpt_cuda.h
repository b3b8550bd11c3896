/* ckpt_cuda.h - the CUDA side of libckpt, plain C.  Every call returns 0 on
 * success or a CUDA error number; nothing aborts. */
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

struct ckpt_backend;
/* The runtime's CUDA backend (backend_cuda.cu, ops in lib/runtime_backend.h)
 * on device DEVICE.  Unlike the calls above it returns a ckpt_status:
 * CKPT_ERR_DEVICE, with the reason in ERR (CAP bytes), when there is no
 * GPU, no driver or no loadable cuBLAS.  Release with ops->destroy. */
int ckpt_backend_cuda_open(int device, struct ckpt_backend **out, char *err, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
