/*
 * runtime/cpu_gemm.h - the CPU backend's own single-precision matrix
 * product, C = A B (+ epilogue), over weights packed once.
 *
 * Why not only OpenBLAS: cblas_sgemm repacks both operands on every call,
 * and a model's weights are the same every forward (ResNet-50 at batch 1
 * repacks 100 MB of them per image); its kernels are also chosen by
 * OPENBLAS_CORETYPE, which may name AVX2 kernels on a CPU with AVX-512.
 * Here a weight is packed at its first use into the micro-panels the kernel
 * reads (kept until its buffer is released), the other operand is packed
 * per call one cache block at a time, and the bias, residual add and ReLU
 * are applied as each output tile is stored.
 *
 * The blocking: K is cut into blocks of kc (fixed per kernel, not per call
 * or thread count), so every output element is the float32 sum, in
 * ascending k, of each block's fused-multiply-add chain (started from 0),
 * the blocks added in ascending order, then the bias, the residual and the
 * ReLU.  Tasks are rectangles of the output; how many, and which thread
 * takes one, changes no bit of the result.
 *
 * Private to runtime/cpu.c (and tests/unit/check_cpu_gemm.c).  Nothing here
 * allocates, prints or starts threads: cpu.c owns the buffers and the pool.
 */
#ifndef CKPT_RUNTIME_CPU_GEMM_H
#define CKPT_RUNTIME_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/backend.h" /* ckpt_conv_geom */

/* A kernel of this CPU: register tile MR x NR, blocks KC (depth), MC x NC
 * (a task's largest output rectangle). */
typedef struct cpu_gemm_kernel cpu_gemm_kernel;

/* The best kernel this CPU runs, or the one named by WANT ("avx512",
 * "avx2"; NULL or "auto": the best); NULL when the CPU has none of them (or
 * not the one asked for). */
const cpu_gemm_kernel *cpu_gemm_pick(const char *want);
/* "AVX-512", "AVX2+FMA" */
const char *cpu_gemm_name(const cpu_gemm_kernel *k);

/* Sides of the product: A is [m, k] (its rows are the output's rows), B is
 * [k, n] (its columns the output's columns). */
enum { CPU_GEMM_A = 0, CPU_GEMM_B = 1 };

/* One operand of SIDE, ROWS x K being (m, k) for A and (n, k) for B: either
 * PACKED (cpu_gemm_pack's output over all of K) or raw, element (r, p) of
 * the operand at raw[r * rs + p * cs]. */
typedef struct cpu_gemm_operand {
    const float *packed;
    const float *raw;
    int64_t rs, cs;
} cpu_gemm_operand;

/* Floats cpu_gemm_pack writes for ROWS x K of SIDE (rows rounded up to the
 * kernel's tile, zero-filled). */
size_t cpu_gemm_packed_floats(const cpu_gemm_kernel *k, int side, int64_t rows, int64_t depth);
/* Pack ROWS x DEPTH of SIDE, element (r, p) = src[r * rs + p * cs]. */
void cpu_gemm_pack(const cpu_gemm_kernel *k, int side, const float *src, int64_t rs, int64_t cs,
                   int64_t rows, int64_t depth, float *dst);

/* The output columns OW, *LO <= ow < *HI, whose input column ow * STRIDE +
 * SHIFT lies inside a row of IN_W (the others read the padding). */
static inline void cpu_conv_cols(int64_t shift, int64_t stride, int64_t in_w, int64_t out_w,
                                 int64_t *lo, int64_t *hi)
{
    int64_t l = shift >= 0 ? 0 : (-shift + stride - 1) / stride;
    int64_t h = in_w - shift <= 0 ? 0 : (in_w - shift + stride - 1) / stride;
    if (h > out_w)
        h = out_w;
    if (l > h)
        l = h;
    *lo = l;
    *hi = h;
}

/* B of conv2d for one image X ([in_c, in_h, in_w]) without im2col's
 * matrix: element (p, j), p = (ci * k_h + ki) * k_w + kj and j = oh * out_w
 * + ow, is x[ci, oh * stride_h - pad_h + ki * dil_h, ow * stride_w - pad_w
 * + kj * dil_w], 0 in the padding.  Packs panels P0 <= q < P1 (columns q *
 * NR ..) over all of the depth into DST, laid out as cpu_gemm_pack lays out
 * the whole operand: the panels of one call may be packed by several
 * threads, each its own range. */
void cpu_gemm_pack_conv(const cpu_gemm_kernel *k, const float *x, const ckpt_conv_geom *g,
                        int64_t p0, int64_t p1, float *dst);
/* Columns in one panel of B (the kernel's NR). */
int64_t cpu_gemm_panel_cols(const cpu_gemm_kernel *k);
/* Rows in one panel of A (the kernel's MR). */
int64_t cpu_gemm_panel_rows(const cpu_gemm_kernel *k);

/* c[i * ldc + j] = relu(sum_p A(i, p) B(p, j) + bias + res[i * ldr + j]),
 * each part only when given: BIAS is bias[i] (a conv's output channel) or,
 * with BIAS_COLS, bias[j] (a linear layer's output feature); RES NULL: no
 * residual; RELU 0: none.  k == 0 gives the epilogue of zeros. */
typedef struct cpu_gemm_call {
    int64_t m, n, k;
    cpu_gemm_operand a, b;
    float *c;
    int64_t ldc;
    const float *bias;
    int bias_cols;
    const float *res;
    int64_t ldr;
    int relu;
    /* set by cpu_gemm_plan; A_IN_PLACE: the tasks read the raw A in place,
     * unpacked (rows contiguous along the depth, at most two panels of
     * them: a small batch's input), so that packing it first would be a
     * copy nobody reads */
    int64_t mc, nc, tiles_m, tiles_n;
    int a_in_place;
} cpu_gemm_call;

/* Cut CALL's output into tasks for THREADS threads; returns their count. */
int64_t cpu_gemm_plan(const cpu_gemm_kernel *k, cpu_gemm_call *call, int threads);
/* Floats of scratch one running task needs. */
size_t cpu_gemm_scratch_floats(const cpu_gemm_kernel *k);
/* Run task T (0 <= T < cpu_gemm_plan's count) with SCRATCH of
 * cpu_gemm_scratch_floats floats, 64-byte aligned, not shared with a task
 * running at the same time. */
void cpu_gemm_task(const cpu_gemm_kernel *k, const cpu_gemm_call *call, int64_t t,
                   float *scratch);

/* A product of few tasks cut along its depth too, for more threads than
 * tasks: depth block B (of cpu_gemm_depth_blocks) of task T computed alone
 * into PART (ldp floats a row, the task's rectangle at its own row and
 * column), no epilogue; then cpu_gemm_combine adds the blocks in ascending
 * order and applies the epilogue: the operations cpu_gemm_task does, in
 * its order, so the same bits. */
int64_t cpu_gemm_depth_blocks(const cpu_gemm_kernel *k, const cpu_gemm_call *call);
void cpu_gemm_task_block(const cpu_gemm_kernel *k, const cpu_gemm_call *call, int64_t t,
                         int64_t blk, float *part, int64_t ldp, float *scratch);
/* Output rows I0 <= i < I1 from the NBLK blocks' parts, block b's element
 * (i, j) at parts[b * stride + i * ldp + j]. */
void cpu_gemm_combine(const cpu_gemm_call *call, const float *parts, int64_t nblk,
                      int64_t stride, int64_t ldp, int64_t i0, int64_t i1);

#endif /* CKPT_RUNTIME_CPU_GEMM_H */
