/*
 * runtime/backends.h - the backends of libckpt, by name.  Included by
 * runtime/backends.c (the table), by each backend for its own descriptor,
 * and by the in-tree tests and benchmarks that reach a backend directly.
 * Nothing else names a backend: the chooser walks the table.
 */
#ifndef CKPT_RUNTIME_BACKENDS_H
#define CKPT_RUNTIME_BACKENDS_H

#include "runtime/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU reference (runtime/cpu.c): "cpu", with OpenBLAS when it loads. */
extern const ckpt_backend_desc ckpt_backend_cpu;
/* The CUDA backend: "cuda:N", runtime/backend_cuda.c's descriptor, which
 * loads kernels/' module (libckpt_cuda.so) at run time and forwards to it,
 * or says why it cannot. */
extern const ckpt_backend_desc ckpt_backend_cuda;

/* The CPU reference always with its plain-C loops, never OpenBLAS (for
 * tests and benchmarks: a fixed summation order). */
int ckpt_backend_cpu_plain_open(ckpt_backend **out, char *err, size_t cap);
/* The CPU backend (PLAIN: with its plain-C loops) whose own loops (im2col,
 * pooling, elementwise) run on THREADS threads, 0: as many as OpenBLAS
 * runs, else the cores (for tests: results do not depend on it). */
int ckpt_backend_cpu_open_threads(int plain, int threads, ckpt_backend **out, char *err,
                                  size_t cap);
/* The CPU backend with its products done by PRODUCTS: "auto" (NULL: the
 * default: the packed SGEMM where the CPU runs one, else OpenBLAS, else the
 * plain loops), "plain", "openblas", "avx512", "avx2" (that packed kernel;
 * CKPT_ERR_UNSUPPORTED when this CPU lacks it); THREADS as above. */
int ckpt_backend_cpu_open_with(const char *products, int threads, ckpt_backend **out, char *err,
                               size_t cap);
/* For tests, on a backend the two above opened: its loops cut into chunks
 * of ITEMS (images, rows, channels, values: each loop's own unit) and its
 * products shared between its threads however small, so that small inputs
 * take the paths that big ones take on many threads; 0: the default. */
void ckpt_backend_cpu_set_grain(ckpt_backend *b, int64_t items);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_RUNTIME_BACKENDS_H */
