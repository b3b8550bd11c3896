/* check_cpu_ops.c - the CPU backend's transformer ops (runtime/cpu.c):
 * unary, binary, strided_copy, reduce, layer_norm, rms_norm, embedding,
 * matmul and attention, each on small examples worked by hand, then on
 * random data against plain double-precision loops; matmul and attention
 * on every products path (plain loops, OpenBLAS, each packed kernel this
 * CPU runs).  Every call is also made on 1, 2 and 3 threads with every
 * loop cut into one-item chunks, and twice on one backend: the same bits.
 * The errors: token ids that are not integers in [0, vocab). */
#include "unit.h"
#include "runtime/backends.h"

#include <math.h>

static const char *const PRODUCTS[] = {"plain", "openblas", "avx2", "avx512"};
#define NPRODUCTS ((int)(sizeof PRODUCTS / sizeof PRODUCTS[0]))

enum { OP_UNARY, OP_BINARY, OP_STRIDED, OP_REDUCE, OP_LAYER_NORM, OP_RMS_NORM, OP_EMBEDDING,
       OP_MATMUL, OP_ATTENTION };

/* One call of one op: the arguments of every op, each using its own */
typedef struct op_call {
    int op, kind;
    float s, eps;
    const float *a, *x, *w, *bias, *mask;
    int ndim;
    int64_t shape[CKPT_RT_MAX_DIMS], sa[CKPT_RT_MAX_DIMS], sx[CKPT_RT_MAX_DIMS], offset;
    int64_t outer, dim, inner, rows, d, n, vocab;
    int64_t batch, m, k, a_stride, x_stride;
    ckpt_attn_geom g;
    size_t ny; /* the output's floats */
} op_call;

static int call_op(ckpt_backend *b, const op_call *c, float *y)
{
    const ckpt_backend_ops *o = b->ops;
    switch (c->op) {
    case OP_UNARY:
        return o->unary(b, c->kind, c->x, y, c->ny, c->s);
    case OP_BINARY:
        return o->binary(b, c->kind, c->a, c->x, y, c->ndim, c->shape, c->sa, c->sx);
    case OP_STRIDED:
        return o->strided_copy(b, c->x, c->offset, y, c->ndim, c->shape, c->sx);
    case OP_REDUCE:
        return o->reduce(b, c->kind, c->x, y, c->outer, c->dim, c->inner);
    case OP_LAYER_NORM:
        return o->layer_norm(b, c->x, c->w, c->bias, y, c->rows, c->d, c->eps);
    case OP_RMS_NORM:
        return o->rms_norm(b, c->x, c->w, y, c->rows, c->d, c->eps);
    case OP_EMBEDDING:
        return o->embedding(b, c->x, c->w, y, c->n, c->vocab, c->d);
    case OP_MATMUL:
        return o->matmul(b, c->a, c->x, y, c->batch, c->m, c->k, c->n, c->a_stride,
                         c->x_stride);
    default:
        return o->attention(b, c->a, c->x, c->w, c->mask, y, &c->g);
    }
}

/* The CPU backend with PRODUCTS on THREADS, its loops cut into chunks of
 * GRAIN items (0: its own); NULL when this CPU cannot run that kernel. */
static ckpt_backend *open_cpu(const char *products, int threads, int64_t grain)
{
    char err[256];
    ckpt_backend *b = NULL;
    int rc = ckpt_backend_cpu_open_with(products, threads, &b, err, sizeof err);
    if (rc == CKPT_ERR_UNSUPPORTED)
        return NULL;
    ck_assert_msg(rc == 0, "%s: %s", products, err);
    ckpt_backend_cpu_set_grain(b, grain);
    return b;
}

/* A byte pattern no op writes here: an element left unwritten shows */
#define UNWRITTEN 0xa5

static float *out_buffer(size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(y);
    memset(y, UNWRITTEN, (n ? n : 1) * sizeof(float));
    return y;
}

static int unwritten(float v)
{
    float u;
    memset(&u, UNWRITTEN, sizeof u);
    return !memcmp(&u, &v, sizeof v);
}

/* C by PRODUCTS on one thread; the same call on 1, 2 and 3 threads with
 * one-item chunks, and a second time on the same backend, must give the
 * same bits.  Returns the output (NULL: this CPU cannot run PRODUCTS). */
static float *run_all(const char *products, const op_call *c)
{
    static const int CONFIGS[][2] = {{1, 0}, {2, 1}, {1, 1}, {3, 1}, {2, 0}};
    /* Under valgrind the first two: one thread, and two with one-item
     * chunks (all five took check_cpu_ops 254 s there, the two 137 s) */
    size_t nconfigs = unit_under_valgrind() ? 2 : sizeof CONFIGS / sizeof CONFIGS[0];
    float *first = NULL;
    for (size_t i = 0; i < nconfigs; i++) {
        ckpt_backend *b = open_cpu(products, CONFIGS[i][0], CONFIGS[i][1]);
        if (!b)
            return NULL;
        float *y = out_buffer(c->ny), *again = out_buffer(c->ny);
        ck_assert_msg(call_op(b, c, y) == 0, "op %d kind %d (%s): %s", c->op, c->kind, products,
                      b->message);
        ck_assert_int_eq(call_op(b, c, again), 0);
        ckpt_backend_free(b);
        for (size_t e = 0; e < c->ny; e++)
            ck_assert_msg(!unwritten(y[e]), "op %d: element %zu not written", c->op, e);
        ck_assert_msg(!memcmp(y, again, c->ny * sizeof(float)),
                      "op %d kind %d (%s): a second run differs", c->op, c->kind, products);
        free(again);
        if (!first) {
            first = y;
            continue;
        }
        ck_assert_msg(!memcmp(first, y, c->ny * sizeof(float)),
                      "op %d kind %d (%s): %d threads, grain %d: other bits than 1 thread",
                      c->op, c->kind, products, CONFIGS[i][0], CONFIGS[i][1]);
        free(y);
    }
    return first;
}

/* run_all on the backend's default products path, which every CPU runs */
static float *run_one(const op_call *c)
{
    float *y = run_all(NULL, c);
    ck_assert_ptr_nonnull(y);
    return y;
}

static uint32_t seed = 7;

static float rnd(float lo, float hi)
{
    seed = seed * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(seed >> 8) / (float)(1u << 24);
}

static float *rnd_array(size_t n, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = rnd(lo, hi);
    return p;
}

static double *doubles(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* |got - want| <= ABS + REL |want| for each of N; NaN only for NaN, an
 * infinity only for the same one */
static void assert_near(const float *got, const double *want, size_t n, double rel, double abs,
                        const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        int ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= abs + rel * fabs(w);
        ck_assert_msg(ok, "%s [%zu]: %.9g, want %.9g", what, i, g, w);
    }
}

static void assert_floats(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i] || (isnan(got[i]) && isnan(want[i])),
                      "%s [%zu]: %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
}

/* ---- unary ---- */

static float *unary(int kind, const float *x, size_t n, float s)
{
    op_call c = {.op = OP_UNARY, .kind = kind, .x = x, .ny = n, .s = s};
    return run_one(&c);
}

START_TEST(test_unary_examples)
{
    static const struct {
        int kind;
        float s, x, want;
    } ex[] = {
        {CKPT_U_GELU, 0, 0.0f, 0.0f},        {CKPT_U_GELU, 0, 20.0f, 20.0f},
        {CKPT_U_GELU, 0, -20.0f, -0.0f},     {CKPT_U_GELU_TANH, 0, 0.0f, 0.0f},
        {CKPT_U_GELU_TANH, 0, 20.0f, 20.0f}, {CKPT_U_SILU, 0, 0.0f, 0.0f},
        {CKPT_U_SILU, 0, 100.0f, 100.0f},    {CKPT_U_TANH, 0, 0.0f, 0.0f},
        {CKPT_U_TANH, 0, 30.0f, 1.0f},       {CKPT_U_COS, 0, 0.0f, 1.0f},
        {CKPT_U_SIN, 0, 0.0f, 0.0f},         {CKPT_U_NEG, 0, 2.0f, -2.0f},
        {CKPT_U_EXP, 0, 0.0f, 1.0f},         {CKPT_U_SQRT, 0, 4.0f, 2.0f},
        {CKPT_U_RSQRT, 0, 4.0f, 0.5f},       {CKPT_U_POW, 2, 3.0f, 9.0f},
        {CKPT_U_POW, 3, 2.0f, 8.0f},         {CKPT_U_POW, 0.5f, 4.0f, 2.0f},
        {CKPT_U_POW, -0.5f, 4.0f, 0.5f},     {CKPT_U_POW, -1, 4.0f, 0.25f},
        {CKPT_U_POW, -2, 2.0f, 0.25f},       {CKPT_U_POW, 0, 5.0f, 1.0f},
        {CKPT_U_POW, 0, NAN, 1.0f},          {CKPT_U_POW, 1, 7.5f, 7.5f},
        {CKPT_U_POW, 4, 2.0f, 16.0f},        {CKPT_U_POW, 0.25f, 16.0f, 2.0f},
        {CKPT_U_POW, 1.5f, -4.0f, NAN},      {CKPT_U_ADD, 2, 1.0f, 3.0f},
        {CKPT_U_SUB, 2, 1.0f, -1.0f},        {CKPT_U_RSUB, 3, 1.0f, 2.0f},
        {CKPT_U_MUL, 3, 2.0f, 6.0f},         {CKPT_U_DIV, 4, 1.0f, 0.25f},
        /* the ends of the vectorized exp and tanh, as torch's */
        {CKPT_U_EXP, 0, -INFINITY, 0.0f},    {CKPT_U_EXP, 0, INFINITY, INFINITY},
        {CKPT_U_EXP, 0, NAN, NAN},           {CKPT_U_EXP, 0, 89.0f, INFINITY},
        {CKPT_U_EXP, 0, -105.0f, 0.0f},      {CKPT_U_EXP, 0, -100.0f, 3.783505853677006e-44f},
        {CKPT_U_TANH, 0, INFINITY, 1.0f},    {CKPT_U_TANH, 0, -INFINITY, -1.0f},
        {CKPT_U_TANH, 0, NAN, NAN},          {CKPT_U_SILU, 0, -INFINITY, NAN},
        {CKPT_U_SILU, 0, INFINITY, INFINITY}, {CKPT_U_GELU_TANH, 0, -INFINITY, NAN},
        {CKPT_U_GELU_TANH, 0, INFINITY, INFINITY},
    };
    for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
        float *y = unary(ex[i].kind, &ex[i].x, 1, ex[i].s);
        ck_assert_msg(y[0] == ex[i].want || (isnan(y[0]) && isnan(ex[i].want)),
                      "example %zu: kind %d (%g) of %g: %.9g, want %.9g", i, ex[i].kind,
                      (double)ex[i].s, (double)ex[i].x, (double)y[0], (double)ex[i].want);
        free(y);
    }
    float mz = -0.0f, *y = unary(CKPT_U_TANH, &mz, 1, 0);
    ck_assert(y[0] == 0.0f && signbit(y[0])); /* tanh(-0.0) = -0.0 */
    free(y);
}
END_TEST

/* exp over its whole range, subnormal results and overflow included */
START_TEST(test_exp_range)
{
    size_t n = 20000;
    float *x = rnd_array(n, -110.0f, 90.0f);
    double *want = doubles(n);
    for (size_t i = 0; i < n; i++)
        want[i] = exp((double)x[i]) > 3.4028234663852886e38 ? INFINITY : exp((double)x[i]);
    float *y = unary(CKPT_U_EXP, x, n, 0);
    assert_near(y, want, n, 2e-7, 1.5e-45, "exp");
    free(x);
    free(want);
    free(y);
}
END_TEST

/* The function in double (torch's formulas) */
static double unary_ref(int kind, double x, double s)
{
    switch (kind) {
    case CKPT_U_GELU:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case CKPT_U_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case CKPT_U_SILU:
        return x / (1.0 + exp(-x));
    case CKPT_U_TANH:
        return tanh(x);
    case CKPT_U_COS:
        return cos(x);
    case CKPT_U_SIN:
        return sin(x);
    case CKPT_U_NEG:
        return -x;
    case CKPT_U_EXP:
        return exp(x);
    case CKPT_U_SQRT:
        return sqrt(x);
    case CKPT_U_RSQRT:
        return 1.0 / sqrt(x);
    case CKPT_U_POW:
        return pow(x, s);
    case CKPT_U_ADD:
        return (float)(x + s);
    case CKPT_U_SUB:
        return (float)(x - s);
    case CKPT_U_RSUB:
        return (float)(s - x);
    case CKPT_U_MUL:
        return (float)(x * s);
    default:
        return (float)(x / s);
    }
}

/* every function on 3000 values, the exponents torch special-cases and
 * others; the arithmetic ones exact (one rounding), the others within a
 * few float ulps */
START_TEST(test_unary_random)
{
    static const float POWS[] = {2, 3, -2, 0.5f, -0.5f, -1, 0, 1, 1.7f, -2.5f, 4};
    size_t n = 3000;
    for (int kind = 0; kind < CKPT_U_COUNT; kind++) {
        size_t nexp = kind == CKPT_U_POW ? sizeof POWS / sizeof POWS[0] : 1;
        for (size_t e = 0; e < nexp; e++) {
            float s = kind == CKPT_U_POW ? POWS[e] : rnd(-2.0f, 2.0f);
            int positive = kind == CKPT_U_SQRT || kind == CKPT_U_RSQRT || kind == CKPT_U_POW;
            float *x = positive ? rnd_array(n, 0.05f, 4.0f) : rnd_array(n, -6.0f, 6.0f);
            double *want = doubles(n);
            for (size_t i = 0; i < n; i++)
                want[i] = unary_ref(kind, x[i], s);
            float *y = unary(kind, x, n, s);
            char what[64];
            snprintf(what, sizeof what, "unary kind %d (s %g)", kind, (double)s);
            int exact = kind >= CKPT_U_ADD || kind == CKPT_U_NEG;
            /* GELU's erf as torch's vector kernel has it: within 1.5e-7 */
            double abs = exact ? 0.0 : kind == CKPT_U_GELU ? 1e-6 : 1e-7;
            assert_near(y, want, n, exact ? 0.0 : 2e-6, abs, what);
            free(x);
            free(want);
            free(y);
        }
    }
}
END_TEST

/* ---- binary and strided_copy ---- */

static float *binary(int kind, const float *a, const float *x, int ndim, const int64_t *shape,
                     const int64_t *sa, const int64_t *sx)
{
    op_call c = {.op = OP_BINARY, .kind = kind, .a = a, .x = x, .ndim = ndim, .ny = 1};
    for (int d = 0; d < ndim; d++) {
        c.shape[d] = shape[d];
        c.sa[d] = sa[d];
        c.sx[d] = sx[d];
        c.ny *= (size_t)shape[d];
    }
    return run_one(&c);
}

START_TEST(test_binary_examples)
{
    /* [2, 3] + [3]: x broadcast over the rows */
    float a[] = {1, 2, 3, 4, 5, 6}, x[] = {10, 20, 30};
    float *y = binary(CKPT_B_ADD, a, x, 2, (int64_t[]){2, 3}, (int64_t[]){3, 1},
                      (int64_t[]){0, 1});
    assert_floats(y, (float[]){11, 22, 33, 14, 25, 36}, 6, "add [2,3] + [3]");
    free(y);
    /* [2, 1] * [1, 3]: an outer product */
    float col[] = {2, 3}, row[] = {1, 10, 100};
    y = binary(CKPT_B_MUL, col, row, 2, (int64_t[]){2, 3}, (int64_t[]){1, 0}, (int64_t[]){0, 1});
    assert_floats(y, (float[]){2, 20, 200, 3, 30, 300}, 6, "mul [2,1] * [1,3]");
    free(y);
    /* a scalar (0-dim as [1]) minus a vector, and a vector over a transposed matrix */
    float one[] = {1};
    y = binary(CKPT_B_SUB, one, x, 1, (int64_t[]){3}, (int64_t[]){0}, (int64_t[]){1});
    assert_floats(y, (float[]){-9, -19, -29}, 3, "sub [1] - [3]");
    free(y);
    y = binary(CKPT_B_DIV, a, (float[]){1, 2}, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3},
               (int64_t[]){0, 1});
    assert_floats(y, (float[]){1, 2, 2, 2.5f, 3, 3}, 6, "div a^T / [2]");
    free(y);
}
END_TEST

/* [4, 5, 6, 7] from a transposed A and an X broadcast over dims 0 and 2 */
START_TEST(test_binary_random)
{
    int64_t shape[] = {4, 5, 6, 7}, n = 4 * 5 * 6 * 7;
    int64_t sa[] = {1, 4, 20, 120}; /* A stored as [7, 6, 5, 4] */
    int64_t sx[] = {0, 7, 0, 1};    /* X [1, 5, 1, 7] */
    float *a = rnd_array((size_t)n, -2, 2), *x = rnd_array(35, 0.5f, 2);
    for (int kind = 0; kind < CKPT_B_COUNT; kind++) {
        float *y = binary(kind, a, x, 4, shape, sa, sx);
        double *want = doubles((size_t)n);
        int64_t e = 0;
        for (int64_t i0 = 0; i0 < 4; i0++)
            for (int64_t i1 = 0; i1 < 5; i1++)
                for (int64_t i2 = 0; i2 < 6; i2++)
                    for (int64_t i3 = 0; i3 < 7; i3++) {
                        double av = a[i0 + 4 * i1 + 20 * i2 + 120 * i3], xv = x[7 * i1 + i3];
                        double r = kind == CKPT_B_ADD   ? av + xv
                                   : kind == CKPT_B_SUB ? av - xv
                                   : kind == CKPT_B_MUL ? av * xv
                                                        : av / xv;
                        want[e++] = (float)r;
                    }
        assert_near(y, want, (size_t)n, 0, 0, "binary [4,5,6,7]");
        free(want);
        free(y);
    }
    /* a plain [1000] + [1000] and a [3, 1000] + [1000] */
    float *big = rnd_array(3000, -1, 1);
    float *y = binary(CKPT_B_ADD, big, x, 2, (int64_t[]){3, 1000}, (int64_t[]){1000, 1},
                      (int64_t[]){0, 0});
    for (int i = 0; i < 3000; i++)
        ck_assert(y[i] == big[i] + x[0]);
    free(y);
    y = binary(CKPT_B_MUL, big, big + 1000, 2, (int64_t[]){3, 1000}, (int64_t[]){1000, 1},
               (int64_t[]){0, 1});
    for (int i = 0; i < 3000; i++)
        ck_assert(y[i] == big[i] * big[1000 + i % 1000]);
    free(y);
    free(big);
    free(a);
    free(x);
}
END_TEST

static float *strided(const float *x, int64_t offset, int ndim, const int64_t *shape,
                      const int64_t *strides)
{
    op_call c = {.op = OP_STRIDED, .x = x, .offset = offset, .ndim = ndim, .ny = 1};
    for (int d = 0; d < ndim; d++) {
        c.shape[d] = shape[d];
        c.sx[d] = strides[d];
        c.ny *= (size_t)shape[d];
    }
    return run_one(&c);
}

START_TEST(test_strided_copy)
{
    float x[20];
    for (int i = 0; i < 20; i++)
        x[i] = (float)i;
    /* transpose of [2, 3] */
    float *y = strided(x, 0, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3});
    assert_floats(y, (float[]){0, 3, 1, 4, 2, 5}, 6, "transpose");
    free(y);
    /* x [4, 5] [1:3, 1::2] */
    y = strided(x, 6, 2, (int64_t[]){2, 2}, (int64_t[]){5, 2});
    assert_floats(y, (float[]){6, 8, 11, 13}, 4, "slice");
    free(y);
    /* select x[:, 2] of [4, 5], then an expand of [3] to [2, 3] */
    y = strided(x, 2, 1, (int64_t[]){4}, (int64_t[]){5});
    assert_floats(y, (float[]){2, 7, 12, 17}, 4, "select");
    free(y);
    y = strided(x, 0, 2, (int64_t[]){2, 3}, (int64_t[]){0, 1});
    assert_floats(y, (float[]){0, 1, 2, 0, 1, 2}, 6, "expand");
    free(y);
    /* random: a permuted, sliced, broadcast view of [6, 7, 8, 9] */
    float *src = rnd_array(6 * 7 * 8 * 9, -1, 1);
    int64_t shape[] = {3, 5, 9, 4, 2}, st[] = {2 * 504, 72, 1, 2 * 9, 0};
    int64_t off = 504 + 72 + 9;
    y = strided(src, off, 5, shape, st);
    size_t e = 0;
    for (int64_t i0 = 0; i0 < 3; i0++)
        for (int64_t i1 = 0; i1 < 5; i1++)
            for (int64_t i2 = 0; i2 < 9; i2++)
                for (int64_t i3 = 0; i3 < 4; i3++)
                    for (int64_t i4 = 0; i4 < 2; i4++, e++)
                        ck_assert(y[e] == src[off + i0 * st[0] + i1 * st[1] + i2 + i3 * st[3]]);
    free(y);
    free(src);
}
END_TEST

/* ---- reduce ---- */

static float *reduce(int kind, const float *x, int64_t outer, int64_t dim, int64_t inner)
{
    op_call c = {.op = OP_REDUCE, .kind = kind, .x = x, .outer = outer, .dim = dim,
                 .inner = inner, .ny = (size_t)(outer * inner)};
    return run_one(&c);
}

START_TEST(test_reduce)
{
    float x[] = {1, 2, 3, 4};
    float *y = reduce(CKPT_R_SUM, x, 1, 2, 2);
    assert_floats(y, (float[]){4, 6}, 2, "sum over dim 0");
    free(y);
    y = reduce(CKPT_R_MEAN, x, 1, 2, 2);
    assert_floats(y, (float[]){2, 3}, 2, "mean over dim 0");
    free(y);
    y = reduce(CKPT_R_SUM, x, 2, 2, 1);
    assert_floats(y, (float[]){3, 7}, 2, "sum over dim 1");
    free(y);
    /* 2^24 + 1 + 1: a float running sum loses both ones */
    float big[] = {16777216.0f, 1, 1};
    y = reduce(CKPT_R_SUM, big, 1, 3, 1);
    ck_assert(y[0] == 16777218.0f);
    free(y);
    static const int64_t SHAPES[][3] = {{3, 50, 300}, {7, 1000, 1}, {2, 1, 5}, {4, 33, 257}};
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        int64_t o = SHAPES[si][0], d = SHAPES[si][1], in = SHAPES[si][2];
        float *xs = rnd_array((size_t)(o * d * in), -1, 1);
        for (int kind = 0; kind < CKPT_R_COUNT; kind++) {
            double *want = doubles((size_t)(o * in));
            for (int64_t a = 0; a < o; a++)
                for (int64_t i = 0; i < in; i++) {
                    double s = 0;
                    for (int64_t k = 0; k < d; k++)
                        s += xs[(a * d + k) * in + i];
                    want[a * in + i] = kind == CKPT_R_MEAN ? s / (double)d : s;
                }
            y = reduce(kind, xs, o, d, in);
            assert_near(y, want, (size_t)(o * in), 1e-7, 1e-9, "reduce");
            free(y);
            free(want);
        }
        free(xs);
    }
}
END_TEST

/* ---- layer_norm and rms_norm ---- */

static float *norm(int op, const float *x, const float *w, const float *bias, int64_t rows,
                   int64_t d, float eps)
{
    op_call c = {.op = op, .x = x, .w = w, .bias = bias, .rows = rows, .d = d, .eps = eps,
                 .ny = (size_t)(rows * d)};
    return run_one(&c);
}

START_TEST(test_norms_examples)
{
    /* mean 2, variance 2/3: -sqrt(3/2), 0, sqrt(3/2) */
    float x[] = {1, 2, 3};
    float *y = norm(OP_LAYER_NORM, x, NULL, NULL, 1, 3, 0.0f);
    double r = sqrt(1.5);
    assert_near(y, (double[]){-r, 0, r}, 3, 1e-7, 1e-7, "layer_norm [1, 2, 3]");
    free(y);
    y = norm(OP_LAYER_NORM, x, (float[]){1, 2, 3}, (float[]){0, 1, 0}, 1, 3, 0.0f);
    assert_near(y, (double[]){-r, 1, 3 * r}, 3, 1e-7, 1e-7, "layer_norm, affine");
    free(y);
    /* a constant row: (x - mean) = 0, whatever eps */
    y = norm(OP_LAYER_NORM, (float[]){5, 5, 5, 5}, NULL, NULL, 1, 4, 1e-5f);
    assert_floats(y, (float[]){0, 0, 0, 0}, 4, "layer_norm of a constant row");
    free(y);
    /* mean of squares 12.5 */
    y = norm(OP_RMS_NORM, (float[]){3, 4}, NULL, NULL, 1, 2, 0.0f);
    assert_near(y, (double[]){3 / sqrt(12.5), 4 / sqrt(12.5)}, 2, 1e-7, 0, "rms_norm [3, 4]");
    free(y);
    y = norm(OP_RMS_NORM, (float[]){3, 4}, (float[]){2, -1}, NULL, 1, 2, 0.0f);
    assert_near(y, (double[]){6 / sqrt(12.5), -4 / sqrt(12.5)}, 2, 1e-7, 0, "rms_norm, w");
    free(y);
}
END_TEST

START_TEST(test_norms_random)
{
    int64_t rows = 37, d = 100;
    float *x = rnd_array((size_t)(rows * d), -3, 3);
    /* a row far from 0: a float variance E[x^2] - E[x]^2 would cancel */
    for (int64_t i = 0; i < d; i++)
        x[5 * d + i] = 1000.0f + rnd(-0.01f, 0.01f);
    float *w = rnd_array((size_t)d, -2, 2), *bias = rnd_array((size_t)d, -1, 1);
    double *want = doubles((size_t)(rows * d));
    for (int mode = 0; mode < 4; mode++) {
        const float *wm = mode & 1 ? w : NULL, *bm = mode & 2 ? bias : NULL;
        float eps = 1e-5f;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * d;
            double mean = 0, var = 0;
            for (int64_t i = 0; i < d; i++)
                mean += xr[i];
            mean /= (double)d;
            for (int64_t i = 0; i < d; i++)
                var += (xr[i] - mean) * (xr[i] - mean);
            var /= (double)d;
            for (int64_t i = 0; i < d; i++)
                want[r * d + i] =
                    (xr[i] - mean) / sqrt(var + eps) * (wm ? wm[i] : 1) + (bm ? bm[i] : 0);
        }
        float *y = norm(OP_LAYER_NORM, x, wm, bm, rows, d, eps);
        assert_near(y, want, (size_t)(rows * d), 1e-6, 1e-6, "layer_norm");
        free(y);
        if (mode & 2)
            continue; /* rms_norm has no bias */
        eps = 1.1920928955078125e-07f;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * d;
            double ms = 0;
            for (int64_t i = 0; i < d; i++)
                ms += (double)xr[i] * xr[i];
            ms /= (double)d;
            for (int64_t i = 0; i < d; i++)
                want[r * d + i] = xr[i] / sqrt(ms + eps) * (wm ? wm[i] : 1);
        }
        y = norm(OP_RMS_NORM, x, wm, NULL, rows, d, eps);
        assert_near(y, want, (size_t)(rows * d), 1e-6, 1e-7, "rms_norm");
        free(y);
    }
    free(want);
    free(x);
    free(w);
    free(bias);
}
END_TEST

/* ---- embedding ---- */

START_TEST(test_embedding)
{
    float w[] = {0, 1, 2, 3, 4, 5}; /* [3, 2] */
    float ids[] = {2, 0, 2};
    op_call c = {.op = OP_EMBEDDING, .x = ids, .w = w, .n = 3, .vocab = 3, .d = 2, .ny = 6};
    float *y = run_one(&c);
    assert_floats(y, (float[]){4, 5, 0, 1, 4, 5}, 6, "embedding");
    free(y);
    /* random: 500 ids of a [50, 33] table */
    float *table = rnd_array(50 * 33, -1, 1), many[500];
    for (int i = 0; i < 500; i++)
        many[i] = (float)(int)rnd(0, 50);
    many[0] = 0;
    many[1] = 49;
    c = (op_call){.op = OP_EMBEDDING, .x = many, .w = table, .n = 500, .vocab = 50, .d = 33,
                  .ny = 500 * 33};
    y = run_one(&c);
    for (int i = 0; i < 500; i++)
        ck_assert(!memcmp(y + i * 33, table + (int)many[i] * 33, 33 * sizeof(float)));
    free(y);
    free(table);
}
END_TEST

/* ids that are not integers in [0, vocab): refused, the output untouched */
START_TEST(test_embedding_bad_ids)
{
    static const struct {
        float id;
        const char *message;
    } bad[] = {
        {-1.0f, "token id -1 is out of range for an embedding of 3 rows"},
        {3.0f, "token id 3 is out of range for an embedding of 3 rows"},
        {1.5f, "token id 1.5 is out of range for an embedding of 3 rows"},
        {NAN, "token id nan is out of range for an embedding of 3 rows"},
        {INFINITY, "token id inf is out of range for an embedding of 3 rows"},
        {16777216.0f, "token id 16777216 is out of range for an embedding of 3 rows"},
    };
    float w[6] = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int threads = 1; threads <= 2; threads++) {
            ckpt_backend *b = open_cpu(NULL, threads, 1);
            ck_assert_ptr_nonnull(b);
            float ids[] = {0, 1, bad[i].id, 2};
            float *y = out_buffer(8);
            ck_assert_int_eq(b->ops->embedding(b, ids, w, y, 4, 3, 2), CKPT_ERR_USAGE);
            ck_assert_str_eq(b->message, bad[i].message);
            for (int e = 0; e < 8; e++)
                ck_assert(unwritten(y[e]));
            free(y);
            ckpt_backend_free(b);
        }
}
END_TEST

/* ---- matmul ---- */

START_TEST(test_matmul_example)
{
    const char *products = PRODUCTS[_i];
    float a[] = {1, 2, 3, 4}, x[] = {5, 6, 7, 8};
    op_call c = {.op = OP_MATMUL, .a = a, .x = x, .batch = 1, .m = 2, .k = 2, .n = 2, .ny = 4};
    float *y = run_all(products, &c);
    if (!y)
        return; /* this CPU lacks that kernel */
    assert_floats(y, (float[]){19, 22, 43, 50}, 4, products);
    free(y);
    /* the same X for two products, then the same A */
    float a2[] = {1, 2, 3, 4, 0, 1, 1, 0};
    c = (op_call){.op = OP_MATMUL, .a = a2, .x = x, .batch = 2, .m = 2, .k = 2, .n = 2,
                  .a_stride = 4, .x_stride = 0, .ny = 8};
    y = run_all(products, &c);
    assert_floats(y, (float[]){19, 22, 43, 50, 7, 8, 5, 6}, 8, products);
    free(y);
    c = (op_call){.op = OP_MATMUL, .a = x, .x = a2, .batch = 2, .m = 2, .k = 2, .n = 2,
                  .a_stride = 0, .x_stride = 4, .ny = 8};
    y = run_all(products, &c);
    assert_floats(y, (float[]){23, 34, 31, 46, 6, 5, 8, 7}, 8, products);
    free(y);
    /* no depth: zeros */
    c = (op_call){.op = OP_MATMUL, .a = a, .x = x, .batch = 2, .m = 2, .k = 0, .n = 3, .ny = 12};
    y = run_all(products, &c);
    for (int i = 0; i < 12; i++)
        ck_assert(y[i] == 0.0f);
    free(y);
}
END_TEST

/* batch, m, k, n, and whether A / X is the same for every product */
static const int64_t MATMULS[][6] = {
    {3, 5, 7, 9, 0, 0},   {4, 20, 33, 17, 0, 1}, {4, 20, 33, 17, 1, 0}, {1, 70, 300, 50, 0, 0},
    {6, 13, 64, 40, 0, 0}, {2, 1, 129, 1, 0, 0}, {2, 100, 48, 130, 0, 0},
    {1, 4, 600, 8, 0, 0}, /* one task cut along its depth (packed SGEMM) */
};
#define NMATMULS ((int)(sizeof MATMULS / sizeof MATMULS[0]))

START_TEST(test_matmul_random)
{
    const char *products = PRODUCTS[_i / NMATMULS];
    const int64_t *s = MATMULS[_i % NMATMULS];
    int64_t batch = s[0], m = s[1], k = s[2], n = s[3];
    int64_t as = s[4] ? 0 : m * k, xs = s[5] ? 0 : k * n;
    float *a = rnd_array((size_t)((s[4] ? 1 : batch) * m * k), -1, 1);
    float *x = rnd_array((size_t)((s[5] ? 1 : batch) * k * n), -1, 1);
    op_call c = {.op = OP_MATMUL, .a = a, .x = x, .batch = batch, .m = m, .k = k, .n = n,
                 .a_stride = as, .x_stride = xs, .ny = (size_t)(batch * m * n)};
    float *y = run_all(products, &c);
    if (y) {
        for (int64_t t = 0; t < batch; t++)
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double want = 0, mag = 0;
                    for (int64_t p = 0; p < k; p++) {
                        double v = (double)a[t * as + i * k + p] * x[t * xs + p * n + j];
                        want += v;
                        mag += fabs(v);
                    }
                    double got = y[(t * m + i) * n + j];
                    ck_assert_msg(fabs(got - want) <= 1e-6 * mag + 1e-30,
                                  "%s matmul %d [%lld, %lld, %lld]: %.9g, want %.9g", products,
                                  _i % NMATMULS, (long long)t, (long long)i, (long long)j, got,
                                  want);
                }
        free(y);
    }
    free(a);
    free(x);
}
END_TEST

/* An operand in a buffer written by upload() (a parameter) is packed once
 * and kept: the same bits as the same values in a buffer of its own, and
 * new values once the buffer is uploaded to again. */
START_TEST(test_matmul_uploaded)
{
    const char *products = PRODUCTS[_i / 2];
    ckpt_backend *b = open_cpu(products, 2, _i % 2);
    if (!b)
        return; /* this CPU lacks that kernel */
    int64_t batch = 3, m = 40, k = 300, n = 50;
    float *a = rnd_array((size_t)(batch * m * k), -1, 1), *x = rnd_array((size_t)(k * n), -1, 1);
    float *x2 = rnd_array((size_t)(k * n), -1, 1), *w;
    size_t ny = (size_t)(batch * k * m);
    float *want = out_buffer(ny), *got = out_buffer(ny);
    ck_assert_int_eq(b->ops->alloc(b, (size_t)(k * n), &w), 0);
    for (int round = 0; round < 2; round++) {
        const float *xv = round ? x2 : x;
        ck_assert_int_eq(b->ops->upload(b, w, xv, (size_t)(k * n)), 0);
        /* the weight as X [k, n] of every product (GPT-2's Conv1D) */
        ck_assert_int_eq(b->ops->matmul(b, a, xv, want, batch, m, k, n, m * k, 0), 0);
        ck_assert_int_eq(b->ops->matmul(b, a, w, got, batch, m, k, n, m * k, 0), 0);
        ck_assert_msg(!memcmp(want, got, (size_t)(batch * m * n) * sizeof(float)),
                      "%s round %d: the weight as X", products, round);
        /* and as A [k, n] of every product, X [n, m] each */
        ck_assert_int_eq(b->ops->matmul(b, xv, a, want, batch, k, n, m, 0, n * m), 0);
        ck_assert_int_eq(b->ops->matmul(b, w, a, got, batch, k, n, m, 0, n * m), 0);
        ck_assert_msg(!memcmp(want, got, ny * sizeof(float)), "%s round %d: the weight as A",
                      products, round);
    }
    b->ops->release(b, w);
    ckpt_backend_free(b);
    free(a);
    free(x);
    free(x2);
    free(want);
    free(got);
}
END_TEST

/* ---- attention ---- */

static float *attention(const char *products, const float *q, const float *k, const float *v,
                        const float *mask, const ckpt_attn_geom *g)
{
    op_call c = {.op = OP_ATTENTION, .a = q, .x = k, .w = v, .mask = mask, .g = *g,
                 .ny = (size_t)(g->batch * g->heads * g->q_len * g->v_dim)};
    return run_all(products, &c);
}

/* torch's math, in double: softmax(q k^T * scale + mask, causal) v; a row
 * with every key masked gives zeros */
static double *attention_ref(const float *q, const float *k, const float *v, const float *mask,
                             const ckpt_attn_geom *g)
{
    int64_t L = g->q_len, S = g->kv_len, E = g->head_dim, D = g->v_dim;
    double *y = doubles((size_t)(g->batch * g->heads * L * D)), *p = doubles((size_t)S);
    for (int64_t n = 0; n < g->batch; n++)
        for (int64_t h = 0; h < g->heads; h++) {
            int64_t kh = n * g->kv_heads + h / (g->heads / g->kv_heads);
            for (int64_t i = 0; i < L; i++) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < S; j++) {
                    const float *qi = q + ((n * g->heads + h) * L + i) * E;
                    const float *kj = k + (kh * S + j) * E;
                    double s = 0;
                    for (int64_t e = 0; e < E; e++)
                        s += (double)qi[e] * kj[e];
                    s *= g->scale;
                    if (mask)
                        s += mask[n * g->mask_strides[0] + h * g->mask_strides[1] +
                                  i * g->mask_strides[2] + j * g->mask_strides[3]];
                    if (g->causal && j > i)
                        s = -INFINITY;
                    p[j] = s;
                    mx = s > mx ? s : mx;
                }
                double sum = 0;
                for (int64_t j = 0; j < S; j++)
                    sum += (p[j] = mx == -INFINITY ? 0 : exp(p[j] - mx));
                double *yr = y + ((n * g->heads + h) * L + i) * D;
                for (int64_t j = 0; j < S && mx > -INFINITY; j++)
                    for (int64_t c = 0; c < D; c++)
                        yr[c] += p[j] / sum * v[(kh * S + j) * D + c];
            }
        }
    free(p);
    return y;
}

START_TEST(test_attention_examples)
{
    const char *products = PRODUCTS[_i];
    /* one key: the output is its value, whatever the query */
    ckpt_attn_geom g = {.batch = 1, .heads = 1, .kv_heads = 1, .q_len = 2, .kv_len = 1,
                        .head_dim = 2, .v_dim = 3, .scale = 0.5};
    float q[] = {1, -2, 3, 4}, k[] = {0.5f, 7}, v[] = {1, 2, 3};
    float *y = attention(products, q, k, v, NULL, &g);
    if (!y)
        return; /* this CPU lacks that kernel */
    assert_floats(y, (float[]){1, 2, 3, 1, 2, 3}, 6, "one key");
    free(y);
    /* a zero query: equal scores, the mean of the values; causal: row 0
     * sees key 0 only, row 1 both */
    float q0[4] = {0}, k2[] = {1, 2, 3, 4}, v2[] = {2, 4, 6, 8};
    g = (ckpt_attn_geom){.batch = 1, .heads = 1, .kv_heads = 1, .q_len = 2, .kv_len = 2,
                         .head_dim = 2, .v_dim = 2, .scale = 1.0};
    y = attention(products, q0, k2, v2, NULL, &g);
    assert_floats(y, (float[]){4, 6, 4, 6}, 4, "equal scores");
    free(y);
    g.causal = 1;
    y = attention(products, q0, k2, v2, NULL, &g);
    assert_floats(y, (float[]){2, 4, 4, 6}, 4, "causal");
    free(y);
    /* a mask [2, 2] broadcast: row 0 masks key 1, row 1 masks both (zeros) */
    g.causal = 0;
    g.mask_strides[2] = 2;
    g.mask_strides[3] = 1;
    float mask[] = {0, -INFINITY, -INFINITY, -INFINITY};
    y = attention(products, q0, k2, v2, mask, &g);
    assert_floats(y, (float[]){2, 4, 0, 0}, 4, "masked");
    free(y);
    /* grouped-query: 4 query heads on 2 key-value heads of one key each,
     * head h reading value h / 2 */
    float q4[8] = {0}, k4[] = {1, 1, 1, 1}, v4[] = {10, 20};
    g = (ckpt_attn_geom){.batch = 1, .heads = 4, .kv_heads = 2, .q_len = 1, .kv_len = 1,
                         .head_dim = 2, .v_dim = 1, .scale = 1.0};
    y = attention(products, q4, k4, v4, NULL, &g);
    assert_floats(y, (float[]){10, 10, 20, 20}, 4, "grouped-query heads");
    free(y);
}
END_TEST

/* batch, heads, kv_heads, q_len, kv_len, head_dim, v_dim, causal, mask */
static const int64_t ATTNS[][9] = {
    {2, 4, 2, 70, 75, 16, 12, 0, 0}, {2, 4, 2, 70, 75, 16, 12, 1, 0},
    {2, 4, 2, 70, 75, 16, 12, 0, 1}, {1, 3, 3, 130, 130, 32, 32, 1, 1},
    {1, 2, 1, 9, 4, 8, 5, 1, 0},     {2, 2, 2, 3, 140, 8, 8, 0, 1},
};
#define NATTNS ((int)(sizeof ATTNS / sizeof ATTNS[0]))

START_TEST(test_attention_random)
{
    const char *products = PRODUCTS[_i / NATTNS];
    const int64_t *s = ATTNS[_i % NATTNS];
    ckpt_attn_geom g = {.batch = s[0], .heads = s[1], .kv_heads = s[2], .q_len = s[3],
                        .kv_len = s[4], .head_dim = s[5], .v_dim = s[6], .causal = (int)s[7],
                        .scale = 1.0 / sqrt((double)s[5]) * 1.3};
    size_t nq = (size_t)(g.batch * g.heads * g.q_len * g.head_dim);
    size_t nk = (size_t)(g.batch * g.kv_heads * g.kv_len * g.head_dim);
    size_t nv = (size_t)(g.batch * g.kv_heads * g.kv_len * g.v_dim);
    float *q = rnd_array(nq, -2, 2), *k = rnd_array(nk, -2, 2), *v = rnd_array(nv, -1, 1);
    float *mask = NULL;
    if (s[8]) {
        /* [batch, 1, q_len, kv_len], broadcast over the heads: random values,
         * some keys at -inf, row 1 wholly masked */
        size_t nm = (size_t)(g.batch * g.q_len * g.kv_len);
        mask = rnd_array(nm, -3, 1);
        for (size_t i = 0; i < nm; i += 7)
            mask[i] = -INFINITY;
        for (int64_t j = 0; j < g.kv_len; j++)
            mask[g.kv_len + j] = -INFINITY;
        g.mask_strides[0] = g.q_len * g.kv_len;
        g.mask_strides[2] = g.kv_len;
        g.mask_strides[3] = 1;
    }
    float *y = attention(products, q, k, v, mask, &g);
    if (y) {
        double *want = attention_ref(q, k, v, mask, &g);
        size_t ny = (size_t)(g.batch * g.heads * g.q_len * g.v_dim);
        char what[96];
        snprintf(what, sizeof what, "%s attention %d", products, _i % NATTNS);
        /* the runtime's tolerance against torch: 1e-5 of the scale (|v| <= 1) */
        assert_near(y, want, ny, 1e-5, 1e-5, what);
        if (mask)
            for (int64_t h = 0; h < g.heads; h++)
                for (int64_t c = 0; c < g.v_dim; c++)
                    ck_assert(y[(h * g.q_len + 1) * g.v_dim + c] == 0.0f);
        free(want);
        free(y);
    }
    free(q);
    free(k);
    free(v);
    free(mask);
}
END_TEST

START_TEST(test_attention_bad_heads)
{
    ckpt_backend *b = open_cpu(NULL, 1, 0);
    ck_assert_ptr_nonnull(b);
    ckpt_attn_geom g = {.batch = 1, .heads = 3, .kv_heads = 2, .q_len = 1, .kv_len = 1,
                        .head_dim = 1, .v_dim = 1, .scale = 1.0};
    float one[3] = {1, 1, 1}, y[3];
    ck_assert_int_eq(b->ops->attention(b, one, one, one, NULL, y, &g), CKPT_ERR_USAGE);
    ck_assert_str_eq(b->message, "3 query heads cannot share 2 key-value heads");
    ckpt_backend_free(b);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_unary_examples);
    tcase_add_test(tc, test_unary_random);
    tcase_add_test(tc, test_exp_range);
    tcase_add_test(tc, test_binary_examples);
    tcase_add_test(tc, test_binary_random);
    tcase_add_test(tc, test_strided_copy);
    tcase_add_test(tc, test_reduce);
    tcase_add_test(tc, test_norms_examples);
    tcase_add_test(tc, test_norms_random);
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_embedding_bad_ids);
    tcase_add_loop_test(tc, test_matmul_example, 0, NPRODUCTS);
    tcase_add_loop_test(tc, test_matmul_random, 0, NPRODUCTS * NMATMULS);
    tcase_add_loop_test(tc, test_matmul_uploaded, 0, NPRODUCTS * 2);
    tcase_add_loop_test(tc, test_attention_examples, 0, NPRODUCTS);
    tcase_add_loop_test(tc, test_attention_random, 0, NPRODUCTS * NATTNS);
    tcase_add_test(tc, test_attention_bad_heads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
