/*
 * runtime/backends.c - every backend of the model runtime, in one place, and
 * the only file that names them.  The order is the one messages list device
 * names in ("auto, cpu, cuda or cuda:N"); "auto" tries the backends that are
 * not a fallback first, in this order, then the fallback (the CPU).  A new
 * backend is a module exporting a descriptor and one line here.  CUDA's
 * descriptor (runtime/backend_cuda.c) is in every build: it loads the
 * CUDA module at run time, or says why it cannot.
 */
#include "core/core.h"
#include "runtime/backends.h"


const ckpt_backend_desc *const ckpt_backend_table[] = {
    &ckpt_backend_cpu,
    &ckpt_backend_cuda,
    NULL,
};

/* Usable CUDA devices: what the CUDA backend's probe says (0 without a
 * driver, the CUDA module or the CUDA runtime). */
int ckpt_cuda_device_count_usable(void)
{
    char why[256];
    return ckpt_backend_cuda.probe(why, sizeof why);
}
