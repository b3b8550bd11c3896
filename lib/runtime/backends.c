/*
 * runtime/backends.c - every backend of the model runtime, in one place, and
 * the only file that names them.  The order is the one messages list device
 * names in ("auto, cpu, cuda or cuda:N"); "auto" tries the backends that are
 * not a fallback first, in this order, then the fallback (the CPU).  A new
 * backend is a module exporting a descriptor and one line here.
 */
#include "core/core.h"
#include "runtime/backends.h"

#include <stdio.h>

#if !CKPT_HAVE_CUDA
/* A build without CUDA still knows the name, to say why it cannot open it. */
static int cuda_absent(char *why, size_t cap)
{
    snprintf(why, cap, "this ckpt was built without CUDA");
    return 0;
}

const ckpt_backend_desc ckpt_backend_cuda = {
    .name = "cuda",
    .title = "CUDA",
    .indexed = 1,
    .fallback = 0,
    .probe = cuda_absent,
    .open = NULL,
};
#endif

const ckpt_backend_desc *const ckpt_backend_table[] = {
    &ckpt_backend_cpu,
    &ckpt_backend_cuda,
    NULL,
};

/* Usable CUDA devices: what the CUDA backend's probe says (0 without CUDA
 * in this build). */
int ckpt_cuda_device_count_usable(void)
{
    char why[256];
    return ckpt_backend_cuda.probe(why, sizeof why);
}
