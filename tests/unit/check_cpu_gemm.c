/* check_cpu_gemm.c - the CPU backend's packed SGEMM (runtime/cpu_gemm.c) on
 * every kernel this CPU runs: products against a double-precision sum over
 * shapes at and around the tile and block edges, each operand packed or
 * raw (and transposed); the epilogue (bias by row or by column, residual,
 * ReLU) as the same float operations after the product, NaN and -0.0
 * included; and the same bits however the output is cut into tasks. */
#include "unit.h"
#include "runtime/cpu_gemm.h"

#include <math.h>

static const char *const KERNEL_IDS[] = {"avx512", "avx2"};
#define NK ((int)(sizeof KERNEL_IDS / sizeof KERNEL_IDS[0]))

static uint32_t seed = 5;

static float rnd(void)
{
    seed = seed * 1664525u + 1013904223u;
    return (float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

static float *rnd_array(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = rnd();
    return p;
}

static float *aligned_floats(size_t n)
{
    float *p = aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) / 64 * 64);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Run CALL: every task, in the order given by REVERSE, on one scratch. */
static void run_call(const cpu_gemm_kernel *k, cpu_gemm_call *call, int threads, int reverse)
{
    float *scratch = aligned_floats(cpu_gemm_scratch_floats(k));
    int64_t tasks = cpu_gemm_plan(k, call, threads);
    for (int64_t t = 0; t < tasks; t++)
        cpu_gemm_task(k, call, reverse ? tasks - 1 - t : t, scratch);
    free(scratch);
}

/* A [m, k] row-major (or stored transposed, [k, m]), B [k, n] row-major;
 * PACK_A / PACK_B: the operand packed beforehand (as weights are). */
static float *product(const cpu_gemm_kernel *k, int64_t m, int64_t n, int64_t kk, const float *a,
                      int trans_a, const float *b, int pack_a, int pack_b, int threads,
                      int reverse, float **packs)
{
    cpu_gemm_call call = {.m = m, .n = n, .k = kk, .ldc = n};
    int64_t a_rs = trans_a ? 1 : kk, a_cs = trans_a ? m : 1;
    packs[0] = packs[1] = NULL;
    if (pack_a) {
        packs[0] = aligned_floats(cpu_gemm_packed_floats(k, CPU_GEMM_A, m, kk));
        cpu_gemm_pack(k, CPU_GEMM_A, a, a_rs, a_cs, m, kk, packs[0]);
        call.a.packed = packs[0];
    } else
        call.a = (cpu_gemm_operand){.raw = a, .rs = a_rs, .cs = a_cs};
    if (pack_b) {
        packs[1] = aligned_floats(cpu_gemm_packed_floats(k, CPU_GEMM_B, n, kk));
        cpu_gemm_pack(k, CPU_GEMM_B, b, 1, n, n, kk, packs[1]);
        call.b.packed = packs[1];
    } else
        call.b = (cpu_gemm_operand){.raw = b, .rs = 1, .cs = n};
    call.c = malloc((size_t)(m * n > 0 ? m * n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(call.c);
    for (int64_t i = 0; i < m * n; i++)
        call.c[i] = NAN; /* every element must be written */
    run_call(k, &call, threads, reverse);
    return call.c;
}

/* Shapes around the tiles (12 x 32, 6 x 16, and their thirds and halves:
 * a batch of 8 or 5 rows read in place, up to two panels of rows read in
 * place and cut into balanced tiles, a classifier's 10 columns) and the
 * depth block (256). */
static const int64_t SHAPES[][3] = {
    {1, 1, 1},     {1, 1000, 2048}, {12, 32, 256},  {13, 33, 257}, {11, 31, 255},
    {64, 49, 576}, {6, 16, 7},      {7, 17, 513},   {100, 3, 40},  {3, 100, 40},
    {97, 200, 1}, {256, 196, 1152}, {25, 70, 0},   {8, 10, 128},  {5, 20, 300},
    {4, 48, 33},   {2, 9, 17},      {9, 33, 513},   {10, 20, 260}, {16, 40, 300},
    {24, 64, 520},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

START_TEST(test_products)
{
    const cpu_gemm_kernel *k = cpu_gemm_pick(KERNEL_IDS[_i / NSHAPES]);
    if (!k)
        return; /* this CPU lacks it */
    const int64_t *s = SHAPES[_i % NSHAPES];
    int64_t m = s[0], n = s[1], kk = s[2];
    float *a = rnd_array((size_t)(m * kk)), *b = rnd_array((size_t)(kk * n));
    float *at = malloc((size_t)(m * kk > 0 ? m * kk : 1) * sizeof(float));
    ck_assert_ptr_nonnull(at);
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < kk; p++)
            at[p * m + i] = a[i * kk + p];
    float *first = NULL;
    for (int mode = 0; mode < 8; mode++) {
        int pack_a = mode & 1, pack_b = mode >> 1 & 1, trans = mode >> 2 & 1;
        float *packs[2];
        float *c = product(k, m, n, kk, trans ? at : a, trans, b, pack_a, pack_b, 1 + mode % 4,
                           mode & 1, packs);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double want = 0, mag = 0;
                for (int64_t p = 0; p < kk; p++) {
                    want += (double)a[i * kk + p] * b[p * n + j];
                    mag += fabs((double)a[i * kk + p] * b[p * n + j]);
                }
                double got = c[i * n + j];
                ck_assert_msg(fabs(got - want) <= 1e-6 * mag + 1e-30,
                              "%s %lldx%lldx%lld mode %d [%lld, %lld]: %.9g, want %.9g",
                              cpu_gemm_name(k), (long long)m, (long long)n, (long long)kk, mode,
                              (long long)i, (long long)j, got, want);
            }
        /* packed or raw, transposed or not, any cut into tasks: same bits */
        if (!first)
            first = c;
        else {
            ck_assert_msg(memcmp(first, c, (size_t)(m * n) * sizeof(float)) == 0,
                          "%s %lldx%lldx%lld: mode %d differs from mode 0", cpu_gemm_name(k),
                          (long long)m, (long long)n, (long long)kk, mode);
            free(c);
        }
        free(packs[0]);
        free(packs[1]);
    }
    free(first);
    free(a);
    free(at);
    free(b);
}
END_TEST

/* The kernels differ in width only: the same blocks, the same chains of
 * fused multiply-adds, so the same bits. */
START_TEST(test_kernels_agree)
{
    const cpu_gemm_kernel *k512 = cpu_gemm_pick("avx512"), *k2 = cpu_gemm_pick("avx2");
    if (!k512 || !k2)
        return;
    const int64_t *s = SHAPES[_i];
    int64_t m = s[0], n = s[1], kk = s[2];
    float *a = rnd_array((size_t)(m * kk)), *b = rnd_array((size_t)(kk * n)), *packs[2];
    float *c1 = product(k512, m, n, kk, a, 0, b, 1, 0, 2, 0, packs);
    free(packs[0]);
    float *c2 = product(k2, m, n, kk, a, 0, b, 0, 1, 3, 1, packs);
    free(packs[1]);
    ck_assert_msg(memcmp(c1, c2, (size_t)(m * n) * sizeof(float)) == 0,
                  "%lldx%lldx%lld: AVX-512 and AVX2 differ", (long long)m, (long long)n,
                  (long long)kk);
    free(a);
    free(b);
    free(c1);
    free(c2);
}
END_TEST

/* The epilogue is what the ops after the product would give: ((sum + bias)
 * + residual), then relu keeping NaN and -0.0, bit for bit. */
START_TEST(test_epilogue)
{
    const cpu_gemm_kernel *k = cpu_gemm_pick(KERNEL_IDS[_i]);
    if (!k)
        return;
    int64_t m = 29, n = 70, kk = 300;
    float *a = rnd_array((size_t)(m * kk)), *b = rnd_array((size_t)(kk * n));
    float *bias_r = rnd_array((size_t)m), *bias_c = rnd_array((size_t)n);
    float *res = rnd_array((size_t)(m * n));
    res[3] = NAN;
    res[5] = -INFINITY;
    float *packs[2];
    float *plain = product(k, m, n, kk, a, 0, b, 1, 0, 1, 0, packs);
    free(packs[0]);
    /* a NaN residual stays NaN through the ReLU, -inf becomes 0 */
    for (int cols = 0; cols < 2; cols++)
        for (int with_res = 0; with_res < 2; with_res++)
            for (int relu = 0; relu < 2; relu++) {
                cpu_gemm_call call = {.m = m, .n = n, .k = kk, .ldc = n,
                                      .bias = cols ? bias_c : bias_r, .bias_cols = cols,
                                      .res = with_res ? res : NULL, .ldr = n, .relu = relu};
                float *pa = aligned_floats(cpu_gemm_packed_floats(k, CPU_GEMM_A, m, kk));
                cpu_gemm_pack(k, CPU_GEMM_A, a, kk, 1, m, kk, pa);
                call.a.packed = pa;
                call.b = (cpu_gemm_operand){.raw = b, .rs = 1, .cs = n};
                call.c = malloc((size_t)(m * n) * sizeof(float));
                run_call(k, &call, 3, 1);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        float v = plain[i * n + j];
                        v = v + (cols ? bias_c[j] : bias_r[i]);
                        if (with_res)
                            v = v + res[i * n + j];
                        if (relu)
                            v = v < 0.0f ? 0.0f : v;
                        float got = call.c[i * n + j];
                        ck_assert_msg(memcmp(&got, &v, 4) == 0 || (isnan(got) && isnan(v)),
                                      "%s cols %d res %d relu %d [%lld, %lld]: %.9g, want %.9g",
                                      cpu_gemm_name(k), cols, with_res, relu, (long long)i,
                                      (long long)j, got, v);
                    }
                free(call.c);
                free(pa);
            }
    free(plain);
    free(a);
    free(b);
    free(bias_r);
    free(bias_c);
    free(res);
}
END_TEST

/* No products (k == 0): the sum is +0.0, then the bias (+0.0 + -0.0 is
 * +0.0) and the ReLU. */
START_TEST(test_empty_depth)
{
    const cpu_gemm_kernel *k = cpu_gemm_pick(KERNEL_IDS[_i]);
    if (!k)
        return;
    float bias[3] = {1.5f, -2.0f, -0.0f}, c[6];
    cpu_gemm_call call = {.m = 2, .n = 3, .k = 0, .a = {.raw = bias, .rs = 0, .cs = 1},
                          .b = {.raw = bias, .rs = 1, .cs = 3}, .c = c, .ldc = 3,
                          .bias = bias, .bias_cols = 1, .relu = 1};
    run_call(k, &call, 2, 0);
    ck_assert(c[0] == 1.5f && c[1] == 0.0f && c[2] == 0.0f && !signbit(c[2]));
    ck_assert(c[3] == 1.5f && c[4] == 0.0f && !signbit(c[4]));
}
END_TEST

/* B of a conv packed straight from the image is im2col's matrix packed,
 * bit for bit, whichever ranges of panels the threads take: strides,
 * paddings wider than the kernel's reach, dilations, rows narrower and
 * wider than a panel. */
static const ckpt_conv_geom CONVS[] = {
    /* batch, in_c, in_h, in_w, out_c, out_h, out_w, k_h, k_w, s_h, s_w, p_h, p_w, d_h, d_w */
    {1, 3, 9, 9, 1, 9, 9, 3, 3, 1, 1, 1, 1, 1, 1},
    {1, 2, 7, 7, 1, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1},
    {1, 3, 20, 45, 1, 7, 15, 7, 7, 3, 3, 3, 3, 1, 1},
    {1, 2, 6, 70, 1, 9, 71, 2, 2, 1, 1, 2, 1, 1, 1},
    {1, 1, 5, 5, 1, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2},
    {1, 4, 3, 40, 1, 3, 38, 1, 3, 1, 1, 0, 0, 1, 1},
    {1, 2, 1, 3, 1, 3, 5, 3, 3, 1, 1, 2, 2, 1, 1},
};
#define NCONVS ((int)(sizeof CONVS / sizeof CONVS[0]))

START_TEST(test_pack_conv)
{
    const cpu_gemm_kernel *k = cpu_gemm_pick(KERNEL_IDS[_i / NCONVS]);
    if (!k)
        return;
    const ckpt_conv_geom *g = &CONVS[_i % NCONVS];
    int64_t hw = g->out_h * g->out_w, depth = g->in_c * g->k_h * g->k_w;
    /* the geometry must be torch's: out = (in + 2 pad - dil (k - 1) - 1) / stride + 1 */
    ck_assert_int_eq(g->out_h,
                     (g->in_h + 2 * g->pad_h - g->dil_h * (g->k_h - 1) - 1) / g->stride_h + 1);
    ck_assert_int_eq(g->out_w,
                     (g->in_w + 2 * g->pad_w - g->dil_w * (g->k_w - 1) - 1) / g->stride_w + 1);
    float *x = rnd_array((size_t)(g->in_c * g->in_h * g->in_w));
    float *cols = malloc((size_t)(depth * hw) * sizeof(float));
    ck_assert_ptr_nonnull(cols);
    for (int64_t ci = 0; ci < g->in_c; ci++)
        for (int64_t ki = 0; ki < g->k_h; ki++)
            for (int64_t kj = 0; kj < g->k_w; kj++)
                for (int64_t oh = 0; oh < g->out_h; oh++)
                    for (int64_t ow = 0; ow < g->out_w; ow++) {
                        int64_t ih = oh * g->stride_h - g->pad_h + ki * g->dil_h;
                        int64_t iw = ow * g->stride_w - g->pad_w + kj * g->dil_w;
                        int64_t p = (ci * g->k_h + ki) * g->k_w + kj;
                        cols[p * hw + oh * g->out_w + ow] =
                            ih < 0 || ih >= g->in_h || iw < 0 || iw >= g->in_w
                                ? 0.0f
                                : x[(ci * g->in_h + ih) * g->in_w + iw];
                    }
    size_t n = cpu_gemm_packed_floats(k, CPU_GEMM_B, hw, depth);
    float *want = aligned_floats(n), *got = aligned_floats(n);
    cpu_gemm_pack(k, CPU_GEMM_B, cols, 1, hw, hw, depth, want);
    int64_t panels = (hw + cpu_gemm_panel_cols(k) - 1) / cpu_gemm_panel_cols(k);
    memset(got, 0xff, n * sizeof(float));
    for (int64_t q = panels; q > 0; q -= 2) /* two panels a call, last first */
        cpu_gemm_pack_conv(k, x, g, q >= 2 ? q - 2 : 0, q, got);
    ck_assert_msg(memcmp(want, got, n * sizeof(float)) == 0, "%s conv case %d differs",
                  cpu_gemm_name(k), _i % NCONVS);
    free(x);
    free(cols);
    free(want);
    free(got);
}
END_TEST

/* An operand stored along its depth (a linear layer's input as A, its
 * weight as B: cs == 1) packs to the same panels as the same operand
 * stored across it (rs == 1): the 8 x 8 transposes, their zero-filled rows
 * past the last and the depth's tail after the last multiple of 8. */
START_TEST(test_pack_along_depth)
{
    const cpu_gemm_kernel *k = cpu_gemm_pick(KERNEL_IDS[_i / 2]);
    if (!k)
        return;
    int side = _i % 2 ? CPU_GEMM_B : CPU_GEMM_A;
    static const int64_t ROWS[] = {1, 5, 6, 8, 12, 13, 33}, DEPTHS[] = {1, 7, 8, 9, 300};
    for (size_t r = 0; r < sizeof ROWS / sizeof ROWS[0]; r++)
        for (size_t d = 0; d < sizeof DEPTHS / sizeof DEPTHS[0]; d++) {
            int64_t rows = ROWS[r], depth = DEPTHS[d];
            float *src = rnd_array((size_t)(rows * depth));
            float *across = malloc((size_t)(rows * depth) * sizeof(float));
            ck_assert_ptr_nonnull(across);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t p = 0; p < depth; p++)
                    across[p * rows + i] = src[i * depth + p];
            size_t n = cpu_gemm_packed_floats(k, side, rows, depth);
            float *want = aligned_floats(n), *got = aligned_floats(n);
            memset(got, 0xff, n * sizeof(float)); /* NaNs: every float must be written */
            cpu_gemm_pack(k, side, across, 1, rows, rows, depth, want);
            cpu_gemm_pack(k, side, src, depth, 1, rows, depth, got);
            ck_assert_msg(memcmp(want, got, n * sizeof(float)) == 0,
                          "%s side %d: %lld rows x %lld deep packed differently",
                          cpu_gemm_name(k), side, (long long)rows, (long long)depth);
            free(src);
            free(across);
            free(want);
            free(got);
        }
}
END_TEST

START_TEST(test_pick)
{
    ck_assert_ptr_null(cpu_gemm_pick("sse9"));
    const cpu_gemm_kernel *best = cpu_gemm_pick(NULL);
    if (best)
        ck_assert_ptr_eq(best, cpu_gemm_pick("auto"));
    ck_assert_ptr_eq(cpu_gemm_pick(NULL), cpu_gemm_pick(""));
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cpu_gemm");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_products, 0, NK * NSHAPES);
    tcase_add_loop_test(tc, test_kernels_agree, 0, NSHAPES);
    tcase_add_loop_test(tc, test_epilogue, 0, NK);
    tcase_add_loop_test(tc, test_empty_depth, 0, NK);
    tcase_add_loop_test(tc, test_pack_conv, 0, NK * NCONVS);
    tcase_add_loop_test(tc, test_pack_along_depth, 0, NK * 2);
    tcase_add_test(tc, test_pick);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    for (int i = 0; i < NK; i++)
        printf("check_cpu_gemm: %s kernel: %s\n", KERNEL_IDS[i],
               cpu_gemm_pick(KERNEL_IDS[i]) ? "runs here" : "not on this CPU, skipped");
    return unit_run(suite());
}
