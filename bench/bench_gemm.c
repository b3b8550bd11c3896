/* bench_gemm.c - the CPU backend's packed SGEMM against OpenBLAS (issue 16).
 *
 *   bench_gemm [--runs N]
 *
 * On one thread, for the matrix products of the issue-16 models (ResNet-50's
 * convs at batch 1 as im2col products, its fc at batch 16, the CRNN's
 * 5530-class embedding): the best of N runs (5 by default) of
 *
 *   - ckpt, the weight packed beforehand (as the runtime does: once, at its
 *     first use), each kernel this CPU runs;
 *   - ckpt, both operands packed in the call (what a one-off product costs);
 *   - OpenBLAS's cblas_sgemm (it packs both operands in every call), with
 *     openblas_set_num_threads(1), whichever kernels OPENBLAS_CORETYPE or
 *     the CPU pick;
 *
 * and the machine's peak: a loop of independent fused multiply-adds of each
 * width, no loads.  Prints a Markdown table: GFLOP/s, share of the peak,
 * ratio against OpenBLAS measured in the same run, and the peak RSS of the
 * process.  Each ckpt result is checked against OpenBLAS's (within 1e-4 of
 * the largest |value|) before it is timed.
 *
 * Built by `make bench/bench_gemm` (and by `make check`, which does not run
 * it).  Not a test.
 */
#include "config.h" /* CKPT_BLAS_SONAME */
#include "runtime/cpu_gemm.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float *floats(size_t n)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    return p;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Independent FMA chains, no loads: the most a core does (FLOP/s). */
__attribute__((target("avx512f"))) static double peak_avx512(long n)
{
    __m512 a[24], c = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
    for (int i = 0; i < 24; i++)
        a[i] = _mm512_set1_ps((float)i * 1e-3f);
    double t = now();
    for (long k = 0; k < n; k++)
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++)
            a[i] = _mm512_fmadd_ps(a[i], c, b);
    t = now() - t;
    __m512 r = a[0];
    for (int i = 1; i < 24; i++)
        r = _mm512_add_ps(r, a[i]);
    volatile float sink = _mm512_reduce_add_ps(r);
    (void)sink;
    return (double)n * 24 * 16 * 2 / t;
}

__attribute__((target("avx2,fma"))) static double peak_avx2(long n)
{
    __m256 a[12], c = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_ps((float)i * 1e-3f);
    double t = now();
    for (long k = 0; k < n; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm256_fmadd_ps(a[i], c, b);
    t = now() - t;
    float o[8];
    __m256 r = a[0];
    for (int i = 1; i < 12; i++)
        r = _mm256_add_ps(r, a[i]);
    _mm256_storeu_ps(o, r);
    volatile float sink = o[0];
    (void)sink;
    return (double)n * 12 * 8 * 2 / t;
}
#endif

static double peak(const char *id)
{
#if defined(__x86_64__) && defined(__GNUC__)
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double v = strcmp(id, "avx512") == 0 ? peak_avx512(20000000) : peak_avx2(40000000);
        best = v > best ? v : best;
    }
    return best;
#else
    (void)id;
    return 0;
#endif
}

static const struct {
    const char *what;
    long m, n, k; /* C [m, n] = W [m, k] x B [k, n]; W the weight */
} SHAPES[] = {
    {"ResNet-50 layer1 3x3 conv, batch 1", 64, 3136, 576},
    {"ResNet-50 layer1 1x1 conv (64 -> 256)", 256, 3136, 64},
    {"ResNet-50 layer3 3x3 conv", 256, 196, 2304},
    {"ResNet-50 layer4 1x1 conv (512 -> 2048)", 2048, 49, 512},
    {"ResNet-50 fc, batch 16 (as W x^T)", 1000, 16, 2048},
    {"CRNN embedding, batch 32 (as W x^T)", 5530, 2080, 512},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])

/* Largest |a - b| over the largest |b|. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s ? d / s : d;
}

/* The best of RUNS products of CALL on one thread; *PACKED_W: the weight
 * comes packed (else W is packed in each run, with B). */
static double time_ckpt(const cpu_gemm_kernel *k, cpu_gemm_call *call, const float *w, long kk,
                        int runs, int packed_w, float *scratch)
{
    double best = 1e30;
    float *wp = packed_w ? NULL : floats(cpu_gemm_packed_floats(k, CPU_GEMM_A, call->m, kk));
    for (int r = 0; r < runs; r++) {
        double t = now();
        if (!packed_w) {
            cpu_gemm_pack(k, CPU_GEMM_A, w, kk, 1, call->m, kk, wp);
            call->a.packed = wp;
        }
        long tasks = cpu_gemm_plan(k, call, 1);
        for (long x = 0; x < tasks; x++)
            cpu_gemm_task(k, call, x, scratch);
        t = now() - t;
        best = t < best ? t : best;
    }
    free(wp);
    return best;
}

int main(int argc, char **argv)
{
    int runs = 5;
    if (argc == 3 && strcmp(argv[1], "--runs") == 0 && atoi(argv[2]) > 0)
        runs = atoi(argv[2]);
    else if (argc != 1) {
        fprintf(stderr, "usage: bench_gemm [--runs N]\n");
        return 2;
    }
    sgemm_fn sgemm = NULL;
    const char *blas_name = "no OpenBLAS";
    void *blas = NULL;
#ifdef CKPT_BLAS_SONAME
    blas = dlopen(CKPT_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!blas)
        blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (blas) {
        sgemm = (sgemm_fn)(uintptr_t)dlsym(blas, "cblas_sgemm");
        void (*set_threads)(int) = (void (*)(int))(uintptr_t)dlsym(blas, "openblas_set_num_threads");
        char *(*core)(void) = (char *(*)(void))(uintptr_t)dlsym(blas, "openblas_get_corename");
        if (set_threads)
            set_threads(1);
        if (core)
            blas_name = core();
    }
    const char *ids[] = {"avx512", "avx2"};
    double peaks[2] = {0, 0};
    for (int q = 0; q < 2; q++)
        if (cpu_gemm_pick(ids[q]))
            peaks[q] = peak(ids[q]);
    printf("One thread. Peak (independent FMAs, no loads): AVX-512 %.1f GFLOP/s, AVX2 %.1f "
           "GFLOP/s. OpenBLAS kernels: %s.\n\n",
           peaks[0] / 1e9, peaks[1] / 1e9, blas_name);
    printf("| product | m x n x k | OpenBLAS cblas_sgemm | ckpt kernel | ckpt, weight packed "
           "once | ckpt, both packed per call | packed-once / OpenBLAS time |\n");
    printf("|---|---|---:|---|---:|---:|---:|\n");
    for (size_t s = 0; s < NSHAPES; s++) {
        long m = SHAPES[s].m, n = SHAPES[s].n, kk = SHAPES[s].k;
        double flop = 2.0 * (double)m * (double)n * (double)kk;
        float *w = floats((size_t)(m * kk)), *b = floats((size_t)(kk * n));
        float *c1 = floats((size_t)(m * n)), *c2 = floats((size_t)(m * n));
        unsigned seed = 7;
        for (long i = 0; i < m * kk; i++)
            w[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
        for (long i = 0; i < kk * n; i++)
            b[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
        double tb = 0;
        if (sgemm) {
            tb = 1e30;
            for (int r = 0; r < runs; r++) {
                double t = now();
                sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, (int)m, (int)n, (int)kk, 1.0f, w, (int)kk,
                      b, (int)n, 0.0f, c1, (int)n);
                t = now() - t;
                tb = t < tb ? t : tb;
            }
        }
        for (int q = 0; q < 2; q++) {
            const cpu_gemm_kernel *k = cpu_gemm_pick(ids[q]);
            if (!k)
                continue;
            float *wp = floats(cpu_gemm_packed_floats(k, CPU_GEMM_A, m, kk));
            float *scratch = floats(cpu_gemm_scratch_floats(k));
            cpu_gemm_pack(k, CPU_GEMM_A, w, kk, 1, m, kk, wp);
            cpu_gemm_call call = {.m = m, .n = n, .k = kk, .a = {.packed = wp},
                                  .b = {.raw = b, .rs = 1, .cs = n}, .c = c2, .ldc = n};
            double t1 = time_ckpt(k, &call, w, kk, runs, 1, scratch);
            if (sgemm && rel_diff(c2, c1, (size_t)(m * n)) > 1e-4) {
                fprintf(stderr, "bench_gemm: %s differs from OpenBLAS on %s\n",
                        cpu_gemm_name(k), SHAPES[s].what);
                return 1;
            }
            double t2 = time_ckpt(k, &call, w, kk, runs, 0, scratch);
            char blas_cell[64] = "-", ratio[32] = "-";
            if (sgemm) {
                snprintf(blas_cell, sizeof blas_cell, "%.2f ms, %.1f GFLOP/s", tb * 1e3,
                         flop / tb / 1e9);
                snprintf(ratio, sizeof ratio, "%.2f", t1 / tb);
            }
            printf("| %s | %ld x %ld x %ld | %s | %s | %.2f ms, %.1f GFLOP/s (%.0f%% of peak) | "
                   "%.2f ms, %.1f GFLOP/s | %s |\n",
                   SHAPES[s].what, m, n, kk, q == 0 || !cpu_gemm_pick(ids[0]) ? blas_cell : "",
                   cpu_gemm_name(k), t1 * 1e3, flop / t1 / 1e9,
                   peaks[q] ? 100.0 * flop / t1 / peaks[q] : 0.0, t2 * 1e3, flop / t2 / 1e9,
                   ratio);
            free(wp);
            free(scratch);
        }
        free(w);
        free(b);
        free(c1);
        free(c2);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("\nPeak RSS of the process: %ld MiB.\n", ru.ru_maxrss / 1024);
    if (blas)
        dlclose(blas);
    return 0;
}
