/* ckpt_cuda.h - the CUDA backend module, libckpt_cuda.so (kernels/, built
 * with nvcc), as libckpt's runtime sees it: one exported table, loaded with
 * dlopen by lib/runtime/backend_cuda.c when a CUDA device is asked for, so
 * that libckpt and the ckpt binary never need libcudart (one build serves
 * CPU-only and GPU machines; doc/design.md, "The CUDA backend module").
 *
 * The table is versioned: the loader refuses a module whose ABI number or
 * whose struct sizes differ from its own, since the two share
 * lib/runtime/backend.h's structs (the backend object, its operations and
 * descriptor).  Plain C, so nvcc and the C compiler read the same. */
#ifndef CKPT_CUDA_H
#define CKPT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Raise it whenever this table or lib/runtime/backend.h changes in a way
 * the sizes below do not show (an operation's arguments, an order). */
#define CKPT_CUDA_MODULE_ABI 4

/* The module's one exported symbol: a ckpt_cuda_module. */
#define CKPT_CUDA_MODULE_SYMBOL "ckpt_cuda_module_entry"
/* Its file name, looked for by lib/runtime/backend_cuda.c. */
#define CKPT_CUDA_MODULE_FILE "libckpt_cuda.so"

typedef struct ckpt_cuda_module {
    uint32_t abi;           /* CKPT_CUDA_MODULE_ABI when built */
    uint32_t size;          /* sizeof(ckpt_cuda_module) */
    uint32_t backend_size;  /* sizeof(ckpt_backend) */
    uint32_t ops_size;      /* sizeof(ckpt_backend_ops) */
    uint32_t desc_size;     /* sizeof(ckpt_backend_desc) */
    const char *version;    /* the ckpt release it was built from ("0.1.0") */
    /* Every call returns 0 on success or a CUDA error number; nothing
     * aborts. */
    /* cudaRuntimeGetVersion (e.g. 13000 for 13.0). */
    int (*runtime_version)(int *version);
    /* Number of usable devices; 0 (and status 0) when there is no GPU or
     * driver. */
    int (*device_count)(int *count);
    /* Name of device N into BUF. */
    int (*device_name)(int device, char *buf, int cap);
    /* Human-readable text for a status returned above. */
    const char *(*strerror)(int status);
    /* The backend itself ("cuda", indexed): probe and open as the chooser
     * (lib/runtime/choose.c) calls them. */
    const ckpt_backend_desc *backend;
    /* The convolutions (conv2d, conv_transpose2d) backend B, one of this
     * module's, has run through cuDNN and through the module's own kernels
     * (ABI 3; tests/unit/check_runtime_cuda shows which path ran). */
    int (*conv_counts)(const ckpt_backend *b, unsigned long long *cudnn,
                       unsigned long long *own);
    /* cuDNN as this process finds it, loading it if not yet (ABI 3): its
     * version (91300 for 9.13.0) with "cuDNN 9.13.0 (FILE)" in BUF, or 0
     * with "no cuDNN: WHY" (the convolutions then run on the module's own
     * kernels).  Needs no GPU. */
    int (*cudnn_describe)(char *buf, size_t cap);
} ckpt_cuda_module;

/* The module's export (every other symbol of it is hidden).  Named here
 * for the module and for the tests that link it; libckpt never links it. */
extern __attribute__((visibility("default"))) const ckpt_cuda_module ckpt_cuda_module_entry;

#ifdef __cplusplus
}
#endif

#endif
