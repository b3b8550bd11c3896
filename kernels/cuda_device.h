/* cuda_device.h - device discovery inside the CUDA backend module
 * (cuda_device.cu), plain C.  Internal to the module: libckpt reaches these
 * through the module's table (ckpt_cuda.h).  Every call returns 0 on
 * success or a CUDA error number; nothing aborts. */
#ifndef CKPT_CUDA_DEVICE_H
#define CKPT_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

int ckpt_cuda_runtime_version(int *version);
int ckpt_cuda_device_count(int *count);
int ckpt_cuda_device_name(int device, char *buf, int cap);
const char *ckpt_cuda_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif
