// cuda_device.cu - device discovery for the CUDA backend.  No GPU or no
// driver is not an error here: it is a count of zero.
#include "cuda_device.h"

#include <cuda_runtime_api.h>
#include <string.h>

extern "C" int ckpt_cuda_runtime_version(int *version)
{
    return (int)cudaRuntimeGetVersion(version);
}

extern "C" int ckpt_cuda_device_count(int *count)
{
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        *count = 0;
        cudaGetLastError(); // clear the sticky error
        return 0;
    }
    return (int)e;
}

extern "C" int ckpt_cuda_device_name(int device, char *buf, int cap)
{
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return (int)e;
    if (cap > 0) {
        strncpy(buf, prop.name, (size_t)cap - 1);
        buf[cap - 1] = '\0';
    }
    return 0;
}

extern "C" const char *ckpt_cuda_strerror(int status)
{
    return cudaGetErrorString((cudaError_t)status);
}
