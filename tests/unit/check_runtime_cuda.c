/* check_runtime_cuda.c - every op of the CUDA backend against the CPU
 * reference, on seeded random inputs over shapes that exercise the edge
 * cases (odd sizes, non-square kernels, stride, padding, dilation,
 * output_padding, ceil-mode pooling, strided softmax, permutes, cat,
 * batch norm with and without affine, adaptive average pools, LSTM
 * steps, and the transformer ops: element-wise functions, broadcasting,
 * strided views, reductions, norms, embedding and its bad ids, batched
 * products, attention with masks, causality and grouped heads), and
 * the CUDA results bitwise equal across two runs.  The convolutions run on
 * both of the module's paths, cuDNN (when it can be loaded) and its own
 * kernels, each checked to be the one that ran; TF32 is checked to change
 * the results, within ckpt verify --tf32's tolerance.
 * Links the module (libckpt_cuda.so) and reaches the backend through its
 * table, as lib/runtime/backend_cuda.c does.
 * Exits 77 (skipped) where there is no GPU. */
#include "ckpt.h"
#include "ckpt_cuda.h"
#include "runtime/backends.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ckpt_backend *cpu, *gpu;
static int failures, cases;

/* ---- inputs ---- */

static uint64_t rng = 0x9e3779b97f4a7c15u;

/* uniform in [-1, 1) */
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *host_rand(size_t n, float scale)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "FAIL: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

/* ---- running one op on one backend ---- */

static void die(ckpt_backend *b, const char *what, int rc)
{
    fprintf(stderr, "FAIL: %s: %s: %s (%s)\n", b->device, what, b->message, ckpt_strerror(rc));
    exit(1);
}

#define MAX_IN 5

/* An op on device buffers: IN[i] (NULL where the host input was NULL),
 * OUT already holding the initial output. */
typedef int (*op_fn)(ckpt_backend *b, float *const *in, float *out, const void *args);

/* Uploads the inputs and the initial output, runs FN, downloads the output. */
static float *run(ckpt_backend *b, op_fn fn, const void *args, const float *const *hin,
                  const size_t *nin, int k, size_t nout, const float *out_init)
{
    float *din[MAX_IN] = {0}, *dout;
    int rc;
    for (int i = 0; i < k; i++) {
        if (!hin[i])
            continue;
        if ((rc = b->ops->alloc(b, nin[i], &din[i])) != CKPT_OK)
            die(b, "alloc", rc);
        if ((rc = b->ops->upload(b, din[i], hin[i], nin[i])) != CKPT_OK)
            die(b, "upload", rc);
    }
    if ((rc = b->ops->alloc(b, nout, &dout)) != CKPT_OK)
        die(b, "alloc", rc);
    if ((rc = b->ops->upload(b, dout, out_init, nout)) != CKPT_OK)
        die(b, "upload", rc);
    if ((rc = fn(b, din, dout, args)) != CKPT_OK)
        die(b, "op", rc);
    if ((rc = b->ops->synchronize(b)) != CKPT_OK)
        die(b, "synchronize", rc);
    float *h = malloc((nout ? nout : 1) * sizeof(float));
    if (!h) {
        fprintf(stderr, "FAIL: out of memory\n");
        exit(1);
    }
    if ((rc = b->ops->download(b, h, dout, nout)) != CKPT_OK)
        die(b, "download", rc);
    for (int i = 0; i < k; i++)
        if (din[i])
            b->ops->release(b, din[i]);
    b->ops->release(b, dout);
    return h;
}

/* |got - ref| <= atol + rtol * |ref| element by element (both NaN, or
 * equal infinities, count as equal); ATOL = RTOL = 0 asks for equality. */
static void check(const char *name, op_fn fn, const void *args, const float *const *hin,
                  const size_t *nin, int k, size_t nout, const float *out_init, double atol,
                  double rtol)
{
    float *init = NULL;
    if (!out_init) {
        /* a value no op produces here: an element an op forgets to write
         * shows up as a difference */
        init = calloc(nout ? nout : 1, sizeof(float));
        if (!init) {
            fprintf(stderr, "FAIL: out of memory\n");
            exit(1);
        }
        for (size_t i = 0; i < nout; i++)
            init[i] = 12345.0f;
        out_init = init;
    }
    float *ref = run(cpu, fn, args, hin, nin, k, nout, out_init);
    float *got = run(gpu, fn, args, hin, nin, k, nout, out_init);
    float *again = run(gpu, fn, args, hin, nin, k, nout, out_init);

    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < nout; i++) {
        double r = ref[i], g = got[i];
        int ok;
        if (isnan(r) || isnan(g))
            ok = isnan(r) && isnan(g);
        else if (isinf(r) || isinf(g))
            ok = r == g;
        else {
            double d = fabs(g - r);
            if (d > worst)
                worst = d;
            ok = d <= atol + rtol * fabs(r);
        }
        if (!ok && bad++ == 0)
            first = i;
    }
    int same = nout == 0 || memcmp(got, again, nout * sizeof(float)) == 0;
    cases++;
    if (bad || !same) {
        failures++;
        printf("FAIL %-44s n=%zu: %zu differ (first [%zu]: cpu %.9g cuda %.9g), max |err| %.3g%s\n",
               name, nout, bad, first, bad ? ref[first] : 0.0, bad ? got[first] : 0.0, worst,
               same ? "" : ", and two CUDA runs differ");
    } else {
        printf("ok   %-44s n=%zu, max |err| %.3g\n", name, nout, worst);
    }
    free(ref);
    free(got);
    free(again);
    free(init);
}

/* ---- linear ---- */

typedef struct {
    int64_t rows, in, out;
} linear_args;

static int op_linear(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const linear_args *a = args;
    return b->ops->linear(b, in[0], in[1], in[2], out, a->rows, a->in, a->out);
}

static void test_linear(int64_t rows, int64_t in, int64_t out, int with_bias)
{
    linear_args a = {rows, in, out};
    float scale = in > 0 ? 1.0f / sqrtf((float)in) : 1.0f;
    float *x = host_rand((size_t)(rows * in), 1.0f), *w = host_rand((size_t)(out * in), scale);
    float *bias = with_bias ? host_rand((size_t)out, 0.5f) : NULL;
    const float *hin[] = {x, w, bias};
    size_t nin[] = {(size_t)(rows * in), (size_t)(out * in), (size_t)out};
    char name[96];
    snprintf(name, sizeof name, "linear %lldx%lld -> %lld%s", (long long)rows, (long long)in,
             (long long)out, with_bias ? " +bias" : "");
    check(name, op_linear, &a, hin, nin, 3, (size_t)(rows * out), NULL, 1e-5, 1e-4);
    free(x);
    free(w);
    free(bias);
}

/* ---- conv2d / conv_transpose2d ---- */

static int op_conv2d(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    return b->ops->conv2d(b, in[0], in[1], in[2], out, args);
}

static int op_conv_transpose2d(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    return b->ops->conv_transpose2d(b, in[0], in[1], in[2], out, args);
}

static ckpt_conv_geom geom(int64_t batch, int64_t in_c, int64_t in_h, int64_t in_w,
                           int64_t out_c, int64_t k_h, int64_t k_w, int64_t s_h, int64_t s_w,
                           int64_t p_h, int64_t p_w, int64_t d_h, int64_t d_w)
{
    ckpt_conv_geom g = {batch, in_c, in_h, in_w, out_c, 0, 0, k_h, k_w, s_h, s_w, p_h, p_w,
                        d_h, d_w};
    return g;
}

/* The path the convolutions must take: cuDNN (when the module has it) or
 * the module's own kernels (im2col / col2im and SGEMM), set with the
 * backend's private CKPT_RT_NO_CUDNN flag. */
static const ckpt_cuda_module *module;
static int have_cudnn, want_cudnn;
static unsigned long long counts_before[2];

static void conv_path_start(void)
{
    module->conv_counts(gpu, &counts_before[0], &counts_before[1]);
}

/* After a case (check() runs the GPU twice): both runs took the path asked
 * for, or the case fails saying which path it took. */
static void conv_path_check(const char *name, const ckpt_conv_geom *g, int transpose)
{
    unsigned long long now[2];
    module->conv_counts(gpu, &now[0], &now[1]);
    unsigned long long by_cudnn = now[0] - counts_before[0], by_own = now[1] - counts_before[1];
    /* in strict FP32 a pointwise conv2d is a cuBLAS SGEMM, cuDNN or not */
    int pointwise = !transpose && g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 &&
                    g->stride_w == 1 && g->pad_h == 0 && g->pad_w == 0 &&
                    g->out_h == g->in_h && g->out_w == g->in_w;
    int cudnn = want_cudnn && !pointwise;
    int ok = cudnn ? by_cudnn == 2 && by_own == 0 : by_own == 2 && by_cudnn == 0;
    if (!ok) {
        failures++;
        printf("FAIL %-44s ran %llu times through cuDNN, %llu on the own kernels (wanted %s)\n",
               name, by_cudnn, by_own, cudnn ? "cuDNN" : "the own kernels");
    }
}

/* torch's Conv2d output size */
static void test_conv2d(ckpt_conv_geom g, int with_bias)
{
    g.out_h = (g.in_h + 2 * g.pad_h - g.dil_h * (g.k_h - 1) - 1) / g.stride_h + 1;
    g.out_w = (g.in_w + 2 * g.pad_w - g.dil_w * (g.k_w - 1) - 1) / g.stride_w + 1;
    size_t nx = (size_t)(g.batch * g.in_c * g.in_h * g.in_w);
    size_t nw = (size_t)(g.out_c * g.in_c * g.k_h * g.k_w);
    size_t ny = (size_t)(g.batch * g.out_c * g.out_h * g.out_w);
    float *x = host_rand(nx, 1.0f);
    float *w = host_rand(nw, 1.0f / sqrtf((float)(g.in_c * g.k_h * g.k_w)));
    float *bias = with_bias ? host_rand((size_t)g.out_c, 0.5f) : NULL;
    const float *hin[] = {x, w, bias};
    size_t nin[] = {nx, nw, (size_t)g.out_c};
    char name[96];
    snprintf(name, sizeof name,
             "conv2d %lldx%lldx%lldx%lld k%lldx%lld s%lld,%lld p%lld,%lld d%lld,%lld%s",
             (long long)g.batch, (long long)g.in_c, (long long)g.in_h, (long long)g.in_w,
             (long long)g.k_h, (long long)g.k_w, (long long)g.stride_h, (long long)g.stride_w,
             (long long)g.pad_h, (long long)g.pad_w, (long long)g.dil_h, (long long)g.dil_w,
             with_bias ? " +b" : "");
    conv_path_start();
    check(name, op_conv2d, &g, hin, nin, 3, ny, NULL, 1e-5, 1e-4);
    conv_path_check(name, &g, 0);
    free(x);
    free(w);
    free(bias);
}

/* torch's ConvTranspose2d output size, with output_padding OP */
static void test_conv_transpose2d(ckpt_conv_geom g, int64_t op_h, int64_t op_w, int with_bias)
{
    g.out_h = (g.in_h - 1) * g.stride_h - 2 * g.pad_h + g.dil_h * (g.k_h - 1) + op_h + 1;
    g.out_w = (g.in_w - 1) * g.stride_w - 2 * g.pad_w + g.dil_w * (g.k_w - 1) + op_w + 1;
    size_t nx = (size_t)(g.batch * g.in_c * g.in_h * g.in_w);
    size_t nw = (size_t)(g.in_c * g.out_c * g.k_h * g.k_w);
    size_t ny = (size_t)(g.batch * g.out_c * g.out_h * g.out_w);
    float *x = host_rand(nx, 1.0f);
    float *w = host_rand(nw, 1.0f / sqrtf((float)(g.in_c * g.k_h * g.k_w)));
    float *bias = with_bias ? host_rand((size_t)g.out_c, 0.5f) : NULL;
    const float *hin[] = {x, w, bias};
    size_t nin[] = {nx, nw, (size_t)g.out_c};
    char name[96];
    snprintf(name, sizeof name,
             "convT %lldx%lldx%lldx%lld k%lldx%lld s%lld,%lld p%lld,%lld d%lld op%lld,%lld%s",
             (long long)g.batch, (long long)g.in_c, (long long)g.in_h, (long long)g.in_w,
             (long long)g.k_h, (long long)g.k_w, (long long)g.stride_h, (long long)g.stride_w,
             (long long)g.pad_h, (long long)g.pad_w, (long long)g.dil_h, (long long)op_h,
             (long long)op_w, with_bias ? " +b" : "");
    conv_path_start();
    check(name, op_conv_transpose2d, &g, hin, nin, 3, ny, NULL, 1e-5, 1e-4);
    conv_path_check(name, &g, 1);
    free(x);
    free(w);
    free(bias);
}

/* ---- max_pool2d ---- */

static int op_max_pool2d(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    return b->ops->max_pool2d(b, in[0], out, args);
}

/* torch's pooling_output_shape */
static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, int ceil_mode)
{
    int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t out = num / s + 1; /* num >= 0 here */
    if (ceil_mode && (out - 1) * s >= in + p)
        out--;
    return out;
}

static void test_max_pool2d(int64_t planes, int64_t in_h, int64_t in_w, int64_t k_h, int64_t k_w,
                            int64_t s, int64_t p, int64_t d, int ceil_mode, int nans)
{
    ckpt_pool_geom g = {planes, in_h, in_w, pool_out(in_h, k_h, s, p, d, ceil_mode),
                        pool_out(in_w, k_w, s, p, d, ceil_mode), k_h, k_w, s, s, p, p, d, d};
    size_t nx = (size_t)(planes * in_h * in_w), ny = (size_t)(planes * g.out_h * g.out_w);
    float *x = host_rand(nx, 4.0f);
    for (int i = 0; i < nans; i++)
        x[(size_t)(i * 7919) % nx] = NAN;
    const float *hin[] = {x};
    size_t nin[] = {nx};
    char name[96];
    snprintf(name, sizeof name, "max_pool2d %lldx%lldx%lld k%lldx%lld s%lld p%lld d%lld%s%s",
             (long long)planes, (long long)in_h, (long long)in_w, (long long)k_h, (long long)k_w,
             (long long)s, (long long)p, (long long)d, ceil_mode ? " ceil" : "",
             nans ? " NaN" : "");
    check(name, op_max_pool2d, &g, hin, nin, 1, ny, NULL, 0.0, 0.0);
    free(x);
}

/* ---- relu, sigmoid, softmax ---- */

static int op_relu(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    return b->ops->relu(b, in[0], out, *(const size_t *)args);
}

static int op_sigmoid(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    return b->ops->sigmoid(b, in[0], out, *(const size_t *)args);
}

static void test_elementwise(size_t n, int sigmoid)
{
    float *x = host_rand(n, 12.0f);
    /* the special values, where there is room */
    const float special[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 100.0f, -100.0f, 88.0f,
                             -88.0f, 1e-30f, -1e-30f};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i * 3 < n; i++)
        x[i * 3] = special[i];
    const float *hin[] = {x};
    size_t nin[] = {n};
    char name[96];
    snprintf(name, sizeof name, "%s n=%zu", sigmoid ? "sigmoid" : "relu", n);
    if (sigmoid)
        check(name, op_sigmoid, &n, hin, nin, 1, n, NULL, 0.0, 1e-6);
    else
        check(name, op_relu, &n, hin, nin, 1, n, NULL, 0.0, 0.0);
    free(x);
}

typedef struct {
    int64_t outer, dim, inner;
} softmax_args;

static int op_softmax(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const softmax_args *a = args;
    return b->ops->softmax(b, in[0], out, a->outer, a->dim, a->inner);
}

/* RTOL: the sum over the axis is taken in another order on the GPU (lanes
 * of a warp), which moves it by about sqrt(dim) roundings */
static void test_softmax(int64_t outer, int64_t dim, int64_t inner, double rtol, int nans)
{
    softmax_args a = {outer, dim, inner};
    size_t n = (size_t)(outer * dim * inner);
    float *x = host_rand(n, 4.0f);
    if (nans)
        x[n / 2] = NAN; /* its whole slice becomes NaN, as in torch */
    const float *hin[] = {x};
    size_t nin[] = {n};
    char name[96];
    snprintf(name, sizeof name, "softmax [%lld, %lld, %lld]%s", (long long)outer, (long long)dim,
             (long long)inner, nans ? " NaN" : "");
    check(name, op_softmax, &a, hin, nin, 1, n, NULL, 1e-9, rtol);
    free(x);
}

/* ---- l2norm (SSD) ---- */

typedef struct {
    int64_t n, c, hw;
} l2norm_args;

static int op_l2norm(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const l2norm_args *a = args;
    return b->ops->l2norm(b, in[0], in[1], out, a->n, a->c, a->hw, 1e-10f);
}

/* both sum the squares over channels in ascending order in float32; only
 * sqrtf and the division may round differently */
static void test_l2norm(int64_t n, int64_t c, int64_t h, int64_t w)
{
    l2norm_args a = {n, c, h * w};
    size_t nx = (size_t)(n * c * h * w);
    float *x = host_rand(nx, 3.0f);
    float *wt = host_rand((size_t)c, 20.0f);
    const float *hin[] = {x, wt};
    size_t nin[] = {nx, (size_t)c};
    char name[96];
    snprintf(name, sizeof name, "l2norm [%lld, %lld, %lld, %lld]", (long long)n, (long long)c,
             (long long)h, (long long)w);
    check(name, op_l2norm, &a, hin, nin, 2, nx, NULL, 1e-6, 1e-6);
    free(x);
    free(wt);
}

/* ---- lstm_cell (CRNN) ---- */

typedef struct {
    int64_t batch, hidden, y_stride, y_off;
    int bias;
} lstm_args;

/* Two steps, as the executor runs them: the first from the zero state (GH
 * NULL, BIAS_HH standing for it), the second reading the first's c, into
 * rows [2, batch, y_stride] of OUT at column Y_OFF (a direction's half). */
static int op_lstm_cell(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const lstm_args *a = args;
    int64_t g = a->batch * 4 * a->hidden;
    int rc = b->ops->lstm_cell(b, in[0], NULL, a->bias ? in[2] : NULL, in[3], in[4],
                               out + a->y_off, a->batch, a->hidden, a->y_stride);
    if (rc != CKPT_OK)
        return rc;
    return b->ops->lstm_cell(b, in[0] + g, in[1], NULL, in[3], in[4],
                             out + a->batch * a->y_stride + a->y_off, a->batch, a->hidden,
                             a->y_stride);
}

/* expf and tanhf on both sides: within a few ulps */
static void test_lstm_cell(int64_t batch, int64_t hidden, int64_t y_stride, int64_t y_off,
                           int bias)
{
    lstm_args a = {batch, hidden, y_stride, y_off, bias};
    size_t ng = (size_t)(batch * 4 * hidden), nh = (size_t)(batch * hidden);
    size_t ny = (size_t)(2 * batch * y_stride);
    float *gx = host_rand(2 * ng, 3.0f), *gh = host_rand(ng, 2.0f);
    float *bhh = host_rand((size_t)(4 * hidden), 1.0f), *c = host_rand(nh, 5.0f);
    float *h = host_rand(nh, 5.0f);
    const float *hin[] = {gx, gh, bhh, c, h};
    size_t nin[] = {2 * ng, ng, (size_t)(4 * hidden), nh, nh};
    char name[96];
    snprintf(name, sizeof name, "lstm_cell x2 [%lld, 4*%lld] into stride %lld +%lld%s",
             (long long)batch, (long long)hidden, (long long)y_stride, (long long)y_off,
             bias ? "" : " no bias");
    check(name, op_lstm_cell, &a, hin, nin, 5, ny, NULL, 1e-6, 1e-5);
    free(gx);
    free(gh);
    free(bhh);
    free(c);
    free(h);
}

/* ---- batch_norm, add, adaptive_avg_pool2d (ResNet) ---- */

typedef struct {
    int64_t outer, c, inner;
    int affine;
    float eps;
} bn_args;

static int op_batch_norm(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const bn_args *a = args;
    return b->ops->batch_norm(b, in[0], in[1], in[2], a->affine ? in[3] : NULL,
                              a->affine ? in[4] : NULL, out, a->outer, a->c, a->inner, a->eps);
}

/* the same float32 scale and shift per channel, then x * scale + shift
 * without FMA on both: bit for bit but for sqrtf's rounding, which both
 * take from IEEE (correctly rounded) */
static void test_batch_norm(int64_t outer, int64_t c, int64_t inner, int affine, float eps)
{
    bn_args a = {outer, c, inner, affine, eps};
    size_t nx = (size_t)(outer * c * inner);
    float *x = host_rand(nx, 3.0f), *mean = host_rand((size_t)c, 1.0f);
    float *var = host_rand((size_t)c, 1.0f), *w = host_rand((size_t)c, 2.0f);
    float *bias = host_rand((size_t)c, 1.0f);
    for (int64_t i = 0; i < c; i++)
        var[i] = fabsf(var[i]) + 0.01f;
    const float *hin[] = {x, mean, var, w, bias};
    size_t nin[] = {nx, (size_t)c, (size_t)c, (size_t)c, (size_t)c};
    char name[96];
    snprintf(name, sizeof name, "batch_norm [%lld, %lld, %lld]%s eps %g", (long long)outer,
             (long long)c, (long long)inner, affine ? "" : " no affine", (double)eps);
    check(name, op_batch_norm, &a, hin, nin, 5, nx, NULL, 1e-6, 1e-6);
    free(bias);
    free(x);
    free(mean);
    free(var);
    free(w);
}

static int op_add(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    return b->ops->add(b, in[0], in[1], out, *(const size_t *)args);
}

static void test_add(size_t n)
{
    float *x = host_rand(n, 5.0f), *y = host_rand(n, 5.0f);
    if (n > 3) {
        x[0] = NAN;
        x[1] = INFINITY;
        y[1] = -INFINITY; /* inf - inf = NaN on both */
        x[2] = -0.0f;
        y[2] = -0.0f;
    }
    const float *hin[] = {x, y};
    size_t nin[] = {n, n};
    char name[64];
    snprintf(name, sizeof name, "add n=%zu", n);
    check(name, op_add, &n, hin, nin, 2, n, NULL, 0.0, 0.0);
    free(x);
    free(y);
}

static int op_adaptive_avg_pool2d(ckpt_backend *b, float *const *in, float *out,
                                  const void *args)
{
    return b->ops->adaptive_avg_pool2d(b, in[0], out, args);
}

/* both sum each bin row by row in float32, then divide: equal bits */
static void test_adaptive_avg_pool2d(int64_t planes, int64_t h, int64_t w, int64_t oh,
                                     int64_t ow)
{
    ckpt_pool_geom g = {0};
    g.planes = planes;
    g.in_h = h;
    g.in_w = w;
    g.out_h = oh;
    g.out_w = ow;
    size_t nx = (size_t)(planes * h * w), ny = (size_t)(planes * oh * ow);
    float *x = host_rand(nx, 3.0f);
    const float *hin[] = {x};
    size_t nin[] = {nx};
    char name[96];
    snprintf(name, sizeof name, "adaptive_avg_pool2d %lld x [%lld, %lld] -> [%lld, %lld]",
             (long long)planes, (long long)h, (long long)w, (long long)oh, (long long)ow);
    check(name, op_adaptive_avg_pool2d, &g, hin, nin, 1, ny, NULL, 0.0, 0.0);
    free(x);
}

/* ---- permute, copy_rows ---- */

typedef struct {
    int ndim;
    int64_t shape[CKPT_RT_MAX_DIMS];
    int perm[CKPT_RT_MAX_DIMS];
} permute_args;

static int op_permute(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const permute_args *a = args;
    return b->ops->permute(b, in[0], out, a->ndim, a->shape, a->perm);
}

static void test_permute(int ndim, const int64_t *shape, const int *perm)
{
    permute_args a = {ndim, {0}, {0}};
    size_t n = 1;
    char name[96] = "permute [", *p = name + strlen(name);
    for (int i = 0; i < ndim; i++) {
        a.shape[i] = shape[i];
        a.perm[i] = perm[i];
        n *= (size_t)shape[i];
        p += snprintf(p, (size_t)(name + sizeof name - p), "%s%lld", i ? "," : "",
                      (long long)shape[i]);
    }
    p += snprintf(p, (size_t)(name + sizeof name - p), "] (");
    for (int i = 0; i < ndim; i++)
        p += snprintf(p, (size_t)(name + sizeof name - p), "%s%d", i ? "," : "", perm[i]);
    snprintf(p, (size_t)(name + sizeof name - p), ")");
    float *x = host_rand(n, 1.0f);
    const float *hin[] = {x};
    size_t nin[] = {n};
    check(name, op_permute, &a, hin, nin, 1, n, NULL, 0.0, 0.0);
    free(x);
}

typedef struct {
    int64_t x_stride, y_stride, rows, len, y_offset;
} rows_args;

static int op_copy_rows(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const rows_args *a = args;
    return b->ops->copy_rows(b, in[0], a->x_stride, out + a->y_offset, a->y_stride, a->rows,
                             a->len);
}

/* Y (NY floats, preset to a pattern) gets ROWS rows of LEN from X */
static void test_copy_rows(int64_t rows, int64_t len, int64_t x_stride, int64_t y_stride,
                           int64_t y_offset)
{
    rows_args a = {x_stride, y_stride, rows, len, y_offset};
    size_t nx = (size_t)((rows - 1) * x_stride + len);
    size_t ny = (size_t)(y_offset + (rows - 1) * y_stride + len + 3);
    float *x = host_rand(nx, 1.0f), *y0 = host_rand(ny, 1.0f);
    const float *hin[] = {x};
    size_t nin[] = {nx};
    char name[96];
    snprintf(name, sizeof name, "copy_rows %lld x %lld, strides %lld -> %lld (+%lld)",
             (long long)rows, (long long)len, (long long)x_stride, (long long)y_stride,
             (long long)y_offset);
    check(name, op_copy_rows, &a, hin, nin, 1, ny, y0, 0.0, 0.0);
    free(x);
    free(y0);
}

typedef struct {
    int64_t n, c1, c2, hw;
} cat_args;

/* torch.cat([a, b], dim=1) of [n, c1, hw] and [n, c2, hw], as the executor
 * builds it from copy_rows */
static int op_cat(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const cat_args *a = args;
    int64_t row = (a->c1 + a->c2) * a->hw;
    int rc = b->ops->copy_rows(b, in[0], a->c1 * a->hw, out, row, a->n, a->c1 * a->hw);
    if (rc == CKPT_OK)
        rc = b->ops->copy_rows(b, in[1], a->c2 * a->hw, out + a->c1 * a->hw, row, a->n,
                               a->c2 * a->hw);
    return rc;
}

static void test_cat(int64_t n, int64_t c1, int64_t c2, int64_t hw)
{
    cat_args a = {n, c1, c2, hw};
    size_t na = (size_t)(n * c1 * hw), nb = (size_t)(n * c2 * hw);
    float *xa = host_rand(na, 1.0f), *xb = host_rand(nb, 1.0f);
    const float *hin[] = {xa, xb};
    size_t nin[] = {na, nb};
    char name[96];
    snprintf(name, sizeof name, "cat dim 1 [%lld,%lld,%lld] + [%lld,%lld,%lld]", (long long)n,
             (long long)c1, (long long)hw, (long long)n, (long long)c2, (long long)hw);
    check(name, op_cat, &a, hin, nin, 2, na + nb, NULL, 0.0, 0.0);
    free(xa);
    free(xb);
}

/* ---- the transformer ops (ABI 2) ---- */

typedef struct {
    int kind;
    size_t n;
    float s;
} unary_args;

static int op_unary(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const unary_args *a = args;
    return b->ops->unary(b, a->kind, in[0], out, a->n, a->s);
}

static const char *const unary_names[CKPT_U_COUNT] = {
    "gelu", "gelu_tanh", "silu", "tanh", "cos", "sin", "neg", "exp", "sqrt", "rsqrt",
    "pow", "add", "sub", "rsub", "mul", "div"};

/* The libm functions (erff, expf, tanhf, sinf, cosf) of CUDA and glibc
 * differ by an ulp or two, and near a zero of the result by an absolute
 * 1e-7 or so; the arithmetic ones, sqrt and the divisions are IEEE's on
 * both: equal bits. */
static void test_unary(int kind, size_t n, float s)
{
    unary_args a = {kind, n, s};
    float *x = host_rand(n, 12.0f);
    const float special[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 100.0f, -100.0f, 88.0f,
                             -88.0f, 1e-30f, -1e-30f, 1.0f, 2.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i * 3 < n; i++)
        x[i * 3] = special[i];
    const float *hin[] = {x};
    size_t nin[] = {n};
    int exact = kind == CKPT_U_NEG || kind == CKPT_U_SQRT || kind == CKPT_U_RSQRT ||
                kind >= CKPT_U_ADD ||
                (kind == CKPT_U_POW && (s == 0.0f || s == 1.0f || s == 2.0f || s == -1.0f ||
                                        s == 0.5f || s == -0.5f));
    char name[96];
    snprintf(name, sizeof name, "unary %s %g n=%zu", unary_names[kind], (double)s, n);
    check(name, op_unary, &a, hin, nin, 1, n, NULL, exact ? 0.0 : 1e-6, exact ? 0.0 : 2e-6);
    free(x);
}

/* Contiguous strides of an operand of shape OSHAPE (ONDIM dims) read by an
 * output of NDIM dims, aligned on the right: 0 where it is broadcast. */
static void bcast_strides(int ndim, int ondim, const int64_t *oshape, int64_t *strides,
                          size_t *numel)
{
    int64_t st = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        int ok = k - (ndim - ondim);
        if (ok < 0) {
            strides[k] = 0;
            continue;
        }
        strides[k] = oshape[ok] == 1 ? 0 : st;
        st *= oshape[ok];
    }
    *numel = (size_t)st;
}

typedef struct {
    int kind, ndim;
    int64_t shape[CKPT_RT_MAX_DIMS], as[CKPT_RT_MAX_DIMS], xs[CKPT_RT_MAX_DIMS];
} binary_args;

static int op_binary(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const binary_args *a = args;
    return b->ops->binary(b, a->kind, in[0], in[1], out, a->ndim, a->shape, a->as, a->xs);
}

/* y [SHAPE] = a [ASHAPE] OP x [XSHAPE], torch's broadcasting: IEEE
 * arithmetic on both, equal bits */
static void test_binary(int kind, int ndim, const int64_t *shape, int andim,
                        const int64_t *ashape, int xndim, const int64_t *xshape)
{
    binary_args a = {kind, ndim, {0}, {0}, {0}};
    size_t ny = 1, na, nx;
    for (int k = 0; k < ndim; k++) {
        a.shape[k] = shape[k];
        ny *= (size_t)shape[k];
    }
    bcast_strides(ndim, andim, ashape, a.as, &na);
    bcast_strides(ndim, xndim, xshape, a.xs, &nx);
    float *ha = host_rand(na, 3.0f), *hx = host_rand(nx, 3.0f);
    if (na > 2 && nx > 2) {
        ha[0] = NAN;
        ha[1] = INFINITY;
        hx[1] = -INFINITY;
    }
    const float *hin[] = {ha, hx};
    size_t nin[] = {na, nx};
    static const char *const ops[] = {"add", "sub", "mul", "div"};
    char name[96], *p = name + snprintf(name, sizeof name, "binary %s [", ops[kind]);
    for (int k = 0; k < ndim; k++)
        p += snprintf(p, (size_t)(name + sizeof name - p), "%s%lld", k ? "," : "",
                      (long long)shape[k]);
    snprintf(p, (size_t)(name + sizeof name - p), "] from %zu and %zu", na, nx);
    check(name, op_binary, &a, hin, nin, 2, ny, NULL, 0.0, 0.0);
    free(ha);
    free(hx);
}

typedef struct {
    int64_t offset;
    int ndim;
    int64_t shape[CKPT_RT_MAX_DIMS], strides[CKPT_RT_MAX_DIMS];
} strided_args;

static int op_strided_copy(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const strided_args *a = args;
    return b->ops->strided_copy(b, in[0], a->offset, out, a->ndim, a->shape, a->strides);
}

/* a view of x (OFFSET, SHAPE, STRIDES) made contiguous: a copy, equal bits */
static void test_strided_copy(const char *what, int64_t offset, int ndim, const int64_t *shape,
                              const int64_t *strides)
{
    strided_args a = {offset, ndim, {0}, {0}};
    size_t ny = 1, nx = (size_t)offset + 1;
    for (int k = 0; k < ndim; k++) {
        a.shape[k] = shape[k];
        a.strides[k] = strides[k];
        ny *= (size_t)shape[k];
        nx += (size_t)((shape[k] - 1) * strides[k]);
    }
    float *x = host_rand(nx, 1.0f);
    const float *hin[] = {x};
    size_t nin[] = {nx};
    char name[96];
    snprintf(name, sizeof name, "strided_copy %s", what);
    check(name, op_strided_copy, &a, hin, nin, 1, ny, NULL, 0.0, 0.0);
    free(x);
}

typedef struct {
    int kind;
    int64_t outer, dim, inner;
} reduce_args;

static int op_reduce(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const reduce_args *a = args;
    return b->ops->reduce(b, a->kind, in[0], out, a->outer, a->dim, a->inner);
}

/* double sums on both, in another order for rows (lanes of a warp): the
 * float results agree but for a rare last-bit rounding */
static void test_reduce(int kind, int64_t outer, int64_t dim, int64_t inner)
{
    reduce_args a = {kind, outer, dim, inner};
    size_t nx = (size_t)(outer * dim * inner), ny = (size_t)(outer * inner);
    float *x = host_rand(nx, 4.0f);
    const float *hin[] = {x};
    size_t nin[] = {nx};
    char name[96];
    snprintf(name, sizeof name, "reduce %s [%lld, %lld, %lld]", kind == CKPT_R_SUM ? "sum" : "mean",
             (long long)outer, (long long)dim, (long long)inner);
    check(name, op_reduce, &a, hin, nin, 1, ny, NULL, 1e-6, 1e-6);
    free(x);
}

typedef struct {
    int rms, with_w, with_b;
    int64_t rows, d;
    float eps;
} norm_args;

static int op_norm(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const norm_args *a = args;
    if (a->rms)
        return b->ops->rms_norm(b, in[0], a->with_w ? in[1] : NULL, out, a->rows, a->d, a->eps);
    return b->ops->layer_norm(b, in[0], a->with_w ? in[1] : NULL, a->with_b ? in[2] : NULL, out,
                              a->rows, a->d, a->eps);
}

/* statistics summed in double on both (another order), y in double rounded
 * once: within an ulp or so */
static void test_norm(int rms, int64_t rows, int64_t d, int with_w, int with_b, float eps)
{
    norm_args a = {rms, with_w, with_b, rows, d, eps};
    size_t nx = (size_t)(rows * d);
    float *x = host_rand(nx, 2.0f), *w = host_rand((size_t)d, 2.0f);
    float *bias = host_rand((size_t)d, 1.0f);
    for (size_t i = 0; i < nx; i++)
        x[i] += 3.0f; /* a mean far from 0: the variance's cancellation shows */
    const float *hin[] = {x, with_w ? w : NULL, with_b ? bias : NULL};
    size_t nin[] = {nx, (size_t)d, (size_t)d};
    char name[96];
    snprintf(name, sizeof name, "%s [%lld, %lld]%s%s eps %g", rms ? "rms_norm" : "layer_norm",
             (long long)rows, (long long)d, with_w ? " w" : "", with_b ? " b" : "", (double)eps);
    check(name, op_norm, &a, hin, nin, 3, nx, NULL, 1e-6, 1e-6);
    free(x);
    free(w);
    free(bias);
}

typedef struct {
    int64_t n, vocab, d;
} embedding_args;

static int op_embedding(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const embedding_args *a = args;
    return b->ops->embedding(b, in[0], in[1], out, a->n, a->vocab, a->d);
}

/* rows copied: equal bits; the ids include the first and the last row */
static void test_embedding(int64_t n, int64_t vocab, int64_t d)
{
    embedding_args a = {n, vocab, d};
    float *ids = malloc((size_t)n * sizeof(float)), *w = host_rand((size_t)(vocab * d), 1.0f);
    if (!ids) {
        fprintf(stderr, "FAIL: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        ids[i] = (float)((int64_t)((frand() + 1.0f) / 2.0f * (float)vocab) % vocab);
    ids[0] = 0.0f;
    ids[n - 1] = (float)(vocab - 1);
    const float *hin[] = {ids, w};
    size_t nin[] = {(size_t)n, (size_t)(vocab * d)};
    char name[96];
    snprintf(name, sizeof name, "embedding %lld ids of [%lld, %lld]", (long long)n,
             (long long)vocab, (long long)d);
    check(name, op_embedding, &a, hin, nin, 2, (size_t)(n * d), NULL, 0.0, 0.0);
    free(ids);
    free(w);
}

/* Bad ids (BAD at position POS, and more after it): the CPU backend refuses
 * at the call, CUDA's at synchronize, with the same message (the first bad
 * id's); then the CUDA backend serves on (a good embedding is checked). */
static void test_embedding_bad(int64_t pos, float bad, float later)
{
    const int64_t n = 12, vocab = 50, d = 8;
    float ids[12], *w = host_rand((size_t)(vocab * d), 1.0f);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (float)(i * 3 % vocab);
    ids[pos] = bad;
    ids[n - 1] = later;
    char want[256] = "", got[256] = "";
    int rc_cpu = CKPT_OK, rc_gpu = CKPT_OK;
    for (int side = 0; side < 2; side++) {
        ckpt_backend *b = side ? gpu : cpu;
        float *di, *dw, *dy;
        int rc;
        if ((rc = b->ops->alloc(b, (size_t)n, &di)) != CKPT_OK ||
            (rc = b->ops->alloc(b, (size_t)(vocab * d), &dw)) != CKPT_OK ||
            (rc = b->ops->alloc(b, (size_t)(n * d), &dy)) != CKPT_OK)
            die(b, "alloc", rc);
        if ((rc = b->ops->upload(b, di, ids, (size_t)n)) != CKPT_OK ||
            (rc = b->ops->upload(b, dw, w, (size_t)(vocab * d))) != CKPT_OK)
            die(b, "upload", rc);
        b->message[0] = '\0';
        rc = b->ops->embedding(b, di, dw, dy, n, vocab, d);
        if (rc == CKPT_OK)
            rc = b->ops->synchronize(b);
        *(side ? &rc_gpu : &rc_cpu) = rc;
        snprintf(side ? got : want, sizeof got, "%s", b->message);
        b->ops->release(b, di);
        b->ops->release(b, dw);
        b->ops->release(b, dy);
    }
    cases++;
    if (rc_cpu != CKPT_ERR_USAGE || rc_gpu != CKPT_ERR_USAGE || strcmp(want, got) != 0) {
        failures++;
        printf("FAIL embedding with token id %g at %lld: cpu %d '%s', cuda %d '%s'\n",
               (double)bad, (long long)pos, rc_cpu, want, rc_gpu, got);
    } else {
        printf("ok   embedding with token id %g at %lld: '%s'\n", (double)bad, (long long)pos,
               got);
    }
    free(w);
    test_embedding(5, vocab, d); /* the record was cleared: no error now */
}

typedef struct {
    int64_t batch, m, k, n, a_stride, x_stride;
} matmul_args;

static int op_matmul(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    const matmul_args *a = args;
    return b->ops->matmul(b, in[0], in[1], out, a->batch, a->m, a->k, a->n, a->a_stride,
                          a->x_stride);
}

/* A_BCAST / X_BCAST: that operand is one matrix for the whole batch
 * (stride 0); tolerance as linear's */
static void test_matmul(int64_t batch, int64_t m, int64_t k, int64_t n, int a_bcast,
                        int x_bcast)
{
    matmul_args a = {batch, m, k, n, a_bcast ? 0 : m * k, x_bcast ? 0 : k * n};
    size_t na = (size_t)((a_bcast ? 1 : batch) * m * k);
    size_t nx = (size_t)((x_bcast ? 1 : batch) * k * n);
    float *ha = host_rand(na, 1.0f), *hx = host_rand(nx, k > 0 ? 1.0f / sqrtf((float)k) : 1.0f);
    const float *hin[] = {ha, hx};
    size_t nin[] = {na, nx};
    char name[96];
    snprintf(name, sizeof name, "matmul %lld x [%lld, %lld] @ [%lld, %lld]%s%s",
             (long long)batch, (long long)m, (long long)k, (long long)k, (long long)n,
             a_bcast ? " a shared" : "", x_bcast ? " x shared" : "");
    check(name, op_matmul, &a, hin, nin, 2, (size_t)(batch * m * n), NULL, 1e-5, 1e-4);
    free(ha);
    free(hx);
}

static int op_attention(ckpt_backend *b, float *const *in, float *out, const void *args)
{
    return b->ops->attention(b, in[0], in[1], in[2], in[3], out, args);
}

/* MASK: 0 none, 1 [batch, 1, q_len, kv_len] (shared by the heads), 2
 * [q_len, kv_len] (shared by all); DEAD: a query row whose every key the
 * mask removes (-inf), which gives zeros on both.  Tolerance as linear's:
 * two products and a float softmax, in other orders. */
static void test_attention(int64_t batch, int64_t heads, int64_t kv_heads, int64_t q_len,
                           int64_t kv_len, int64_t head_dim, int64_t v_dim, int causal,
                           int mask, int dead)
{
    ckpt_attn_geom g = {batch, heads, kv_heads, q_len, kv_len, head_dim, v_dim,
                        head_dim > 0 ? 1.0 / sqrt((double)head_dim) : 1.0, causal, {0}};
    size_t nq = (size_t)(batch * heads * q_len * head_dim);
    size_t nk = (size_t)(batch * kv_heads * kv_len * head_dim);
    size_t nv = (size_t)(batch * kv_heads * kv_len * v_dim);
    size_t nm = 0;
    if (mask == 1) {
        nm = (size_t)(batch * q_len * kv_len);
        g.mask_strides[0] = q_len * kv_len;
        g.mask_strides[2] = kv_len;
        g.mask_strides[3] = 1;
    } else if (mask == 2) {
        nm = (size_t)(q_len * kv_len);
        g.mask_strides[2] = kv_len;
        g.mask_strides[3] = 1;
    }
    float *q = host_rand(nq, 1.0f), *k = host_rand(nk, 1.0f), *v = host_rand(nv, 1.0f);
    float *m = mask ? host_rand(nm, 2.0f) : NULL;
    if (m) {
        for (size_t i = 0; i < nm; i += 5)
            m[i] = -INFINITY; /* a bool mask's False */
        if (dead)
            for (int64_t j = 0; j < kv_len; j++)
                m[(size_t)((q_len / 2) * kv_len + j)] = -INFINITY;
    }
    const float *hin[] = {q, k, v, m};
    size_t nin[] = {nq, nk, nv, nm};
    char name[96];
    snprintf(name, sizeof name, "attention %lldx%lld/%lld [%lld, %lld] e%lld,%lld%s%s%s",
             (long long)batch, (long long)heads, (long long)kv_heads, (long long)q_len,
             (long long)kv_len, (long long)head_dim, (long long)v_dim,
             causal ? " causal" : "", mask == 1 ? " mask[b]" : mask == 2 ? " mask" : "",
             dead ? " dead row" : "");
    check(name, op_attention, &g, hin, nin, 4, (size_t)(batch * heads * q_len * v_dim), NULL,
          1e-5, 1e-4);
    free(q);
    free(k);
    free(v);
    free(m);
}

/* Every transformer op against the CPU backend's; 0 when the CPU backend
 * lacks one (nothing to compare with: a failure) */
static int transformer_ops_present(void)
{
    const struct {
        const char *name;
        int cpu, gpu;
    } ops[] = {
        {"unary", !!cpu->ops->unary, !!gpu->ops->unary},
        {"binary", !!cpu->ops->binary, !!gpu->ops->binary},
        {"strided_copy", !!cpu->ops->strided_copy, !!gpu->ops->strided_copy},
        {"reduce", !!cpu->ops->reduce, !!gpu->ops->reduce},
        {"layer_norm", !!cpu->ops->layer_norm, !!gpu->ops->layer_norm},
        {"rms_norm", !!cpu->ops->rms_norm, !!gpu->ops->rms_norm},
        {"embedding", !!cpu->ops->embedding, !!gpu->ops->embedding},
        {"matmul", !!cpu->ops->matmul, !!gpu->ops->matmul},
        {"attention", !!cpu->ops->attention, !!gpu->ops->attention},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (!ops[i].cpu || !ops[i].gpu) {
            cases++;
            failures++;
            ok = 0;
            printf("FAIL %s: missing from the %s backend\n", ops[i].name,
                   ops[i].cpu ? "CUDA" : "CPU");
        }
    }
    return ok;
}

static void test_transformer_ops(void)
{
    if (!transformer_ops_present())
        return;
    for (int kind = 0; kind < CKPT_U_COUNT; kind++) {
        float s = kind == CKPT_U_POW ? 2.5f : 1.75f;
        test_unary(kind, 1000, s);
        test_unary(kind, 100003, s);
    }
    test_unary(CKPT_U_DIV, 1000, 0.0f); /* division by zero: inf and NaN */
    {
        const float exps[] = {0.0f, 1.0f, 2.0f, 3.0f, -2.0f, 0.5f, -0.5f, -1.0f, -1.5f};
        for (size_t i = 0; i < sizeof exps / sizeof exps[0]; i++)
            test_unary(CKPT_U_POW, 1000, exps[i]);
    }
    test_unary(CKPT_U_GELU, 1, 0.0f);

    {
        const int64_t y1[] = {2, 3, 4}, a1[] = {2, 3, 4}, x1[] = {3, 1};
        for (int kind = 0; kind < CKPT_B_COUNT; kind++)
            test_binary(kind, 3, y1, 3, a1, 2, x1);
        const int64_t y2[] = {4, 5}, x2[] = {5};
        test_binary(CKPT_B_ADD, 2, y2, 2, y2, 1, x2); /* a bias row */
        const int64_t y3[] = {2, 4, 3}, a3[] = {2, 1, 3}, x3[] = {1, 4, 3};
        test_binary(CKPT_B_MUL, 3, y3, 3, a3, 3, x3); /* both broadcast */
        const int64_t y4[] = {100003}, s4[] = {1};
        test_binary(CKPT_B_DIV, 1, y4, 1, y4, 1, y4);
        test_binary(CKPT_B_SUB, 1, y4, 1, s4, 1, y4); /* a scalar tensor minus x */
        /* rotary embedding: q [b, h, l, e] * cos [l, e] */
        const int64_t y5[] = {2, 4, 16, 8}, x5[] = {16, 8};
        test_binary(CKPT_B_MUL, 4, y5, 4, y5, 2, x5);
        const int64_t y6[] = {2, 1, 3, 2, 2, 1, 3, 2}, a6[] = {2, 1, 3, 1, 2, 1, 3, 2},
                      x6[] = {3, 2, 1, 1, 3, 1};
        test_binary(CKPT_B_ADD, 8, y6, 8, a6, 6, x6);
        const int64_t y7[] = {3, 0, 2};
        test_binary(CKPT_B_ADD, 3, y7, 3, y7, 3, y7); /* empty */
    }

    {
        /* x [3, 4, 5].transpose(1, 2) */
        const int64_t s1[] = {3, 5, 4}, t1[] = {20, 1, 5};
        test_strided_copy("transpose [3,4,5] (1,2)", 0, 3, s1, t1);
        /* x [10, 8][2:9:3, 1:7:2] */
        const int64_t s2[] = {3, 3}, t2[] = {24, 2};
        test_strided_copy("slice [10,8][2:9:3, 1:7:2]", 17, 2, s2, t2);
        /* x [6, 7, 5][:, 3] */
        const int64_t s3[] = {6, 5}, t3[] = {35, 1};
        test_strided_copy("select [6,7,5][:, 3]", 15, 2, s3, t3);
        /* x [1, 4].expand(3, 4), and [2, 1, 3].expand(5, 2, 4, 3) */
        const int64_t s4[] = {3, 4}, t4[] = {0, 1};
        test_strided_copy("expand [1,4] -> [3,4]", 0, 2, s4, t4);
        const int64_t s5[] = {5, 2, 4, 3}, t5[] = {0, 3, 0, 1};
        test_strided_copy("expand [2,1,3] -> [5,2,4,3]", 0, 4, s5, t5);
        /* a contiguous run: a slice of whole rows */
        const int64_t s6[] = {4, 7}, t6[] = {7, 1};
        test_strided_copy("slice [9,7][3:7]", 21, 2, s6, t6);
        /* k.transpose(-2, -1) of [2, 3, 16, 8] */
        const int64_t s7[] = {2, 3, 8, 16}, t7[] = {384, 128, 1, 8};
        test_strided_copy("transpose [2,3,16,8] (2,3)", 0, 4, s7, t7);
        const int64_t s8[] = {2, 1, 3, 2, 2, 1, 3, 2}, t8[] = {1, 7, 2, 11, 29, 3, 60, 200};
        test_strided_copy("8 dims", 5, 8, s8, t8);
        const int64_t s9[] = {1000, 3}, t9[] = {3, 1000};
        test_strided_copy("[3,1000].t()", 0, 2, s9, t9);
    }

    test_reduce(CKPT_R_SUM, 4, 10, 1);
    test_reduce(CKPT_R_MEAN, 4, 10, 1);
    test_reduce(CKPT_R_MEAN, 3, 37, 5);
    test_reduce(CKPT_R_SUM, 2, 1000, 1);
    test_reduce(CKPT_R_MEAN, 1, 4096, 1);
    test_reduce(CKPT_R_SUM, 2, 3, 1000);
    test_reduce(CKPT_R_MEAN, 5, 0, 3); /* the mean of nothing: NaN */
    test_reduce(CKPT_R_SUM, 5, 0, 3);  /* its sum: 0 */
    test_reduce(CKPT_R_MEAN, 1, 1, 7);

    test_norm(0, 4, 768, 1, 1, 1e-5f); /* GPT-2's ln_1 */
    test_norm(0, 3, 1, 1, 1, 1e-5f);   /* one element: y = bias */
    test_norm(0, 2, 1000, 0, 0, 1e-5f);
    test_norm(0, 5, 37, 1, 0, 1e-12f); /* BERT's eps */
    test_norm(0, 3, 37, 0, 1, 1e-6f);
    test_norm(0, 1, 4097, 1, 1, 1e-5f);
    test_norm(0, 70000, 3, 1, 1, 1e-5f); /* more rows than blocks */
    test_norm(1, 4, 768, 1, 0, 1e-6f);  /* Llama's RMSNorm */
    test_norm(1, 3, 1, 1, 0, 1.1920928955078125e-07f);
    test_norm(1, 2, 1000, 0, 0, 1.1920928955078125e-07f);
    test_norm(1, 1, 4097, 1, 0, 1e-5f);

    test_embedding(37, 50, 16);
    test_embedding(128, 1000, 768);
    test_embedding(7, 3, 1);
    test_embedding_bad(5, 50.0f, -1.0f);     /* == vocab, and a negative one after */
    test_embedding_bad(0, -1.0f, 50.0f);
    test_embedding_bad(3, 2.5f, 60.0f);      /* not an integer */
    test_embedding_bad(7, NAN, 3.0f);
    test_embedding_bad(2, 16777216.0f, 1.0f); /* 2^24 */

    test_matmul(1, 3, 17, 5, 0, 0);
    test_matmul(4, 7, 33, 10, 0, 0);
    test_matmul(4, 7, 33, 10, 1, 0);  /* a broadcast over the batch */
    test_matmul(6, 5, 8, 9, 0, 1);    /* x @ W: one product of the stacked rows */
    test_matmul(1, 5, 8, 9, 0, 1);
    test_matmul(3, 4, 0, 5, 0, 0);    /* empty reduction: zeros */
    test_matmul(24, 128, 64, 128, 0, 0); /* scores of 2 x 12 heads */
    test_matmul(2, 128, 768, 2304, 0, 1); /* GPT-2's c_attn (addmm) */

    /*             b  h kvh  L    S   e  ev causal mask dead */
    test_attention(2, 4, 4, 7, 7, 16, 16, 0, 0, 0);
    test_attention(2, 4, 4, 33, 33, 16, 16, 1, 0, 0);
    test_attention(2, 8, 2, 5, 9, 8, 12, 1, 0, 0);   /* GQA, q_len < kv_len */
    test_attention(2, 4, 4, 6, 10, 8, 8, 0, 1, 1);   /* a mask per sample, a dead row */
    test_attention(1, 6, 3, 12, 12, 16, 16, 1, 2, 0); /* GQA, causal and a mask */
    test_attention(1, 2, 1, 10, 4, 8, 8, 1, 0, 0);   /* q_len > kv_len */
    test_attention(1, 12, 12, 128, 128, 64, 64, 1, 0, 0); /* GPT-2 small */
    test_attention(2, 32, 8, 64, 64, 64, 64, 1, 0, 0);    /* Llama's GQA */
    test_attention(1, 2, 2, 3, 0, 8, 8, 0, 0, 0);         /* no key: zeros */
    test_attention(1, 1, 1, 1, 1, 1, 1, 0, 0, 0);
}

static void set_flags(unsigned flags)
{
    int rc = gpu->ops->set_flags(gpu, flags);
    if (rc != CKPT_OK)
        die(gpu, "set_flags", rc);
}

static void conv_cases(void)
{
    /*          batch in_c  h   w  out_c kh kw sh sw ph pw dh dw */
    test_conv2d(geom(2, 3, 11, 11, 5, 3, 3, 1, 1, 1, 1, 1, 1), 1);
    test_conv2d(geom(1, 4, 9, 13, 6, 3, 5, 2, 2, 1, 2, 1, 1), 0);  /* non-square, stride 2 */
    test_conv2d(geom(3, 2, 15, 15, 4, 3, 3, 1, 1, 2, 2, 2, 2), 1); /* dilation 2 */
    test_conv2d(geom(2, 8, 7, 5, 3, 1, 1, 1, 1, 0, 0, 1, 1), 1);   /* 1x1: no im2col */
    test_conv2d(geom(1, 8, 7, 5, 3, 1, 1, 1, 1, 0, 0, 1, 1), 0);
    test_conv2d(geom(1, 5, 7, 7, 4, 2, 2, 2, 2, 0, 0, 1, 1), 1);   /* odd size, k2 s2 */
    test_conv2d(geom(2, 16, 38, 38, 24, 3, 3, 1, 1, 1, 1, 1, 1), 1);
    test_conv2d(geom(2, 6, 19, 19, 10, 3, 3, 1, 1, 6, 6, 6, 6), 1); /* SSD's fc6 */
    test_conv2d(geom(1, 3, 10, 12, 2, 1, 1, 2, 2, 0, 0, 1, 1), 1); /* 1x1 stride 2 */
    test_conv2d(geom(2, 3, 64, 64, 16, 7, 7, 2, 2, 3, 3, 1, 1), 0); /* ResNet's stem */
    test_conv2d(geom(8, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1), 1); /* batch 8: a workspace */

    /*                    batch in_c h  w  out_c kh kw sh sw ph pw dh dw   op */
    test_conv_transpose2d(geom(2, 3, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1), 1, 1, 1);
    test_conv_transpose2d(geom(1, 5, 4, 7, 2, 2, 3, 2, 1, 0, 1, 1, 1), 1, 0, 0);
    test_conv_transpose2d(geom(2, 4, 6, 6, 3, 3, 3, 1, 1, 2, 2, 2, 2), 0, 0, 1);
    test_conv_transpose2d(geom(3, 8, 7, 7, 4, 2, 2, 2, 2, 0, 0, 1, 1), 0, 0, 1);
    test_conv_transpose2d(geom(1, 16, 7, 7, 1, 4, 4, 2, 2, 1, 1, 1, 1), 0, 0, 1);
    test_conv_transpose2d(geom(2, 6, 5, 3, 5, 3, 2, 3, 2, 1, 0, 2, 1), 2, 1, 1);
}

/* ---- TF32 ---- */

/* TF32 (CKPT_BACKEND_TF32) against strict FP32 and the CPU: the products
 * round their inputs to a 10-bit mantissa, so the results must differ from
 * strict FP32's and stay within ckpt verify --tf32's default tolerance
 * (rtol 1e-2, atol 1e-3 x the largest |ref|); and TF32 runs are bitwise
 * repeatable too. */
static void tf32_case(const char *name, op_fn fn, const void *args, const float *const *hin,
                      const size_t *nin, int k, size_t nout)
{
    float *init = calloc(nout, sizeof(float));
    if (!init) {
        fprintf(stderr, "FAIL: out of memory\n");
        exit(1);
    }
    float *ref = run(cpu, fn, args, hin, nin, k, nout, init);
    float *strict = run(gpu, fn, args, hin, nin, k, nout, init);
    set_flags(CKPT_BACKEND_TF32);
    int described = strstr(gpu->description, "TF32 on") != NULL;
    float *tf = run(gpu, fn, args, hin, nin, k, nout, init);
    float *again = run(gpu, fn, args, hin, nin, k, nout, init);
    set_flags(0);
    double maxref = 0, err_tf = 0, err_strict = 0;
    size_t differ = 0, bad = 0;
    for (size_t i = 0; i < nout; i++)
        if (fabs(ref[i]) > maxref)
            maxref = fabs(ref[i]);
    for (size_t i = 0; i < nout; i++) {
        double d = fabs((double)tf[i] - ref[i]), ds = fabs((double)strict[i] - ref[i]);
        err_tf = d > err_tf ? d : err_tf;
        err_strict = ds > err_strict ? ds : err_strict;
        differ += tf[i] != strict[i];
        bad += !(d <= 1e-3 * maxref + 1e-2 * fabs(ref[i]));
    }
    int same = memcmp(tf, again, nout * sizeof(float)) == 0;
    cases++;
    if (!described || bad || !differ || !same) {
        failures++;
        printf("FAIL %-44s n=%zu: %zu out of TF32's tolerance, %zu differ from strict FP32%s%s "
               "(max |err| TF32 %.3g, FP32 %.3g)\n", name, nout, bad, differ,
               same ? "" : ", two TF32 runs differ",
               described ? "" : ", the description does not say TF32 on", err_tf, err_strict);
    } else {
        printf("ok   %-44s n=%zu, %zu differ from FP32, max |err| TF32 %.3g, FP32 %.3g\n",
               name, nout, differ, err_tf, err_strict);
    }
    free(init);
    free(ref);
    free(strict);
    free(tf);
    free(again);
}

static void test_tf32(void)
{
    linear_args la = {64, 1024, 256};
    float *x = host_rand(64 * 1024, 1.0f), *w = host_rand(256 * 1024, 1.0f / 32.0f);
    const float *lin[] = {x, w, NULL};
    size_t nl[] = {64 * 1024, 256 * 1024, 0};
    tf32_case("TF32 linear 64x1024 -> 256", op_linear, &la, lin, nl, 3, 64 * 256);
    free(x);
    free(w);

    ckpt_conv_geom g = geom(2, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1);
    g.out_h = 28, g.out_w = 28;
    size_t nx = 2 * 64 * 28 * 28, nw = 64 * 64 * 9, ny = 2 * 64 * 28 * 28;
    float *cx = host_rand(nx, 1.0f), *cw = host_rand(nw, 1.0f / 24.0f);
    const float *cin[] = {cx, cw, NULL};
    size_t nc[] = {nx, nw, 0};
    tf32_case(have_cudnn ? "TF32 conv2d 2x64x28x28 k3 (cuDNN)" : "TF32 conv2d 2x64x28x28 k3",
              op_conv2d, &g, cin, nc, 3, ny);
    free(cx);
    free(cw);
}

/* ---- the backend itself ---- */

static void test_backend_basics(void)
{
    cases++;
    float *p = NULL, *q = NULL;
    int rc = gpu->ops->alloc(gpu, 0, &p);
    if (rc != CKPT_OK || !p)
        die(gpu, "alloc of 0 floats", rc);
    rc = gpu->ops->alloc(gpu, 0, &q);
    if (rc != CKPT_OK || !q || q == p)
        die(gpu, "second alloc of 0 floats", rc);
    gpu->ops->release(gpu, p);
    gpu->ops->release(gpu, q);
    rc = gpu->ops->linear(gpu, NULL, NULL, NULL, NULL, -1, 2, 3);
    if (rc != CKPT_ERR_USAGE || !gpu->message[0]) {
        printf("FAIL linear with a negative size: status %d, message '%s'\n", rc, gpu->message);
        failures++;
        return;
    }
    if (strncmp(gpu->device, "cuda:", 5) != 0 || strncmp(gpu->description, gpu->device, 5)) {
        printf("FAIL device '%s', description '%s'\n", gpu->device, gpu->description);
        failures++;
        return;
    }
    printf("ok   backend basics (alloc 0, usage error, names)\n");
}

int main(void)
{
    int count = 0;
    const ckpt_cuda_module *m = &ckpt_cuda_module_entry;
    int rc = m->device_count(&count);
    if (rc != 0 || count == 0) {
        printf("no usable GPU: skipped\n");
        return 77;
    }
    char err[256];
    if ((rc = ckpt_backend_cpu.open(0, &cpu, err, sizeof err)) != CKPT_OK) {
        fprintf(stderr, "FAIL: cpu backend: %s\n", err);
        return 1;
    }
    if ((rc = m->backend->open(0, &gpu, err, sizeof err)) != CKPT_OK) {
        fprintf(stderr, "FAIL: cuda backend: %s\n", err);
        return 1;
    }
    printf("reference: %s\nunder test: %s\n", cpu->description, gpu->description);
    module = m;
    char cudnn[512];
    int loaded = m->cudnn_describe(cudnn, sizeof cudnn) > 0;
    have_cudnn = strstr(gpu->description, ", cuDNN ") != NULL;
    printf("cuDNN: %s\n", cudnn);
    if (loaded != have_cudnn) { /* loaded, and the backend could not use it */
        fprintf(stderr, "FAIL: %s, and the backend says '%s'\n", cudnn, gpu->description);
        return 1;
    }

    test_backend_basics();

    test_linear(1, 1, 1, 1);
    test_linear(3, 17, 5, 1);
    test_linear(7, 33, 10, 0);
    test_linear(64, 784, 128, 1);
    test_linear(5, 0, 4, 1); /* empty reduction: y = bias */

    /* the convolutions on both paths: cuDNN's and the module's own */
    if (have_cudnn) {
        printf("-- convolutions through cuDNN\n");
        want_cudnn = 1;
        conv_cases();
    } else {
        printf("-- no cuDNN: the convolutions through cuDNN are not run here\n");
    }
    set_flags(CKPT_RT_NO_CUDNN);
    printf("-- convolutions on the own kernels (%s)\n", gpu->description);
    want_cudnn = 0;
    conv_cases();
    set_flags(0);
    test_tf32();

    /*              planes h   w  kh kw s  p  d  ceil nans */
    test_max_pool2d(6, 8, 8, 2, 2, 2, 0, 1, 0, 0);
    test_max_pool2d(5, 9, 11, 2, 2, 2, 0, 1, 1, 0);   /* ceil: a partial last window */
    test_max_pool2d(4, 10, 10, 3, 3, 2, 1, 1, 1, 0);  /* ceil with padding */
    test_max_pool2d(3, 75, 75, 2, 2, 2, 0, 1, 1, 0);  /* SSD's pool3 */
    test_max_pool2d(3, 19, 19, 3, 3, 1, 1, 1, 0, 0);  /* SSD's pool5 */
    test_max_pool2d(2, 12, 10, 3, 2, 1, 1, 2, 0, 0);  /* dilation 2 */
    test_max_pool2d(4, 13, 13, 3, 3, 2, 1, 1, 1, 5);  /* NaN propagates */

    test_elementwise(1, 0);
    test_elementwise(1000, 0);
    test_elementwise(100003, 0);
    test_elementwise(1, 1);
    test_elementwise(1000, 1);
    test_elementwise(100003, 1);

    test_softmax(4, 10, 1, 1e-6, 0);
    test_softmax(3, 37, 5, 1e-6, 0);  /* inner > 1 */
    test_softmax(2 * 8732, 21, 1, 1e-6, 0); /* SSD's conf */
    test_softmax(2, 21, 97, 1e-6, 0);
    test_softmax(3, 100, 1, 1e-6, 1);
    test_softmax(2, 1000, 1, 4e-6, 0);
    test_softmax(1, 1, 7, 1e-6, 0);
    test_l2norm(2, 512, 38, 38); /* SSD's conv4_3 */
    test_l2norm(1, 1, 5, 7);
    test_l2norm(3, 64, 1, 1);

    test_batch_norm(2, 64, 56 * 56, 1, 1e-5f); /* ResNet's bn1 after the stem */
    test_batch_norm(3, 5, 7, 0, 1e-3f);
    test_batch_norm(4, 6, 1, 1, 1e-5f);        /* BatchNorm1d on [N, C] */
    test_batch_norm(1, 2048, 49, 1, 1e-5f);
    test_lstm_cell(32, 256, 512, 0, 1);   /* the CRNN's forward direction */
    test_lstm_cell(32, 256, 512, 256, 1); /* its _reverse half */
    test_lstm_cell(3, 7, 7, 0, 0);
    test_lstm_cell(1, 1, 2, 1, 1);
    test_add(1);
    test_add(1000);
    test_add(2 * 256 * 56 * 56);
    test_adaptive_avg_pool2d(2 * 2048, 7, 7, 1, 1); /* ResNet50's avgpool */
    test_adaptive_avg_pool2d(6, 7, 5, 3, 2);          /* unequal, overlapping bins */
    test_adaptive_avg_pool2d(4, 3, 2, 5, 4);          /* more bins than inputs */
    test_adaptive_avg_pool2d(3, 4, 4, 4, 4);

    {
        const int64_t s1[] = {2, 3, 5, 7};
        const int p1[] = {0, 2, 3, 1}; /* NCHW -> NHWC, as SSD's heads */
        test_permute(4, s1, p1);
        const int p2[] = {3, 1, 0, 2};
        test_permute(4, s1, p2);
        const int p3[] = {0, 2, 1, 3}; /* middle dims swapped */
        test_permute(4, s1, p3);
        const int64_t s4[] = {2, 1, 3, 4};
        const int p4[] = {0, 2, 3, 1}; /* a size-1 dim moved: a plain copy */
        test_permute(4, s4, p4);
        const int64_t s5[] = {33, 17};
        const int p5[] = {1, 0};
        test_permute(2, s5, p5);
        const int64_t s6[] = {4, 5, 6};
        const int p6[] = {0, 1, 2};
        test_permute(3, s6, p6);
        const int64_t s7[] = {2, 1, 3, 2, 2, 1, 3, 2};
        const int p7[] = {7, 6, 5, 4, 3, 2, 1, 0};
        test_permute(8, s7, p7);
        const int64_t s8[] = {9};
        const int p8[] = {0};
        test_permute(1, s8, p8);
    }

    test_copy_rows(5, 7, 10, 13, 0);
    test_copy_rows(5, 7, 7, 7, 2);
    test_copy_rows(1, 9, 9, 20, 4);
    test_copy_rows(64, 300, 301, 900, 300);
    test_cat(2, 3, 5, 19 * 19);
    test_cat(3, 1, 2, 7);

    test_transformer_ops();

    cpu->ops->destroy(cpu);
    gpu->ops->destroy(gpu);
    printf("%d of %d cases failed\n", failures, cases);
    return failures ? 1 : 0;
}
