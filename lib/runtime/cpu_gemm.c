/* runtime/cpu_gemm.c - the CPU backend's packed SGEMM (see cpu_gemm.h).
 *
 * One register-tile kernel per instruction set, made from one template:
 * MR rows of A broadcast against NR columns of B loaded as vectors, MR x NR
 * accumulators held in registers through a depth block.  Operands are read
 * from "panels": MR rows of A (or NR columns of B) stored depth-major, MR
 * (NR) floats per step of the sum, zero-filled past the last row, so the
 * kernel has no edge cases inside its loop; only partial tiles at the
 * output's edges are stored through a small buffer.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "runtime/cpu_gemm.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GEMM_X86 1
#endif

/* What a tile's store adds, at the last depth block only (pointers at the
 * tile's first row and column). */
typedef struct tile_epi {
    const float *bias_row; /* bias[i], or NULL */
    const float *bias_col; /* bias[j], or NULL */
    const float *res;      /* res[i * ldr + j], or NULL */
    int64_t ldr;
    int relu;
} tile_epi;

/* A is packed panels (LDA unused) or, in the raw tiles, rows LDA apart */
typedef void (*tile_fn)(int64_t kc, const float *a, int64_t lda, const float *b, float *c,
                        int64_t ldc, int64_t mr, int64_t nr, int acc, const tile_epi *e);

/* Row tiles in a task of MC rows at most (row_tiles) */
#define ROW_TILES_MAX 16

struct cpu_gemm_kernel {
    const char *id, *name;
    int mr, nr;
    int64_t kc, mc, nc;
    int (*usable)(void);
    /* [r][v]: the tile of (r + 1) * mr / 3 rows and v + 1 vectors of nr / 2
     * columns, over panels of MR x NR: an edge tile (a small batch's 8 rows,
     * a classifier's 10 columns) computes only the rows and vectors it
     * stores -- the same chains, so the same bits */
    tile_fn tile[3][2];
    /* the same over A's rows in place (a linear layer's input of a few
     * rows: each thread packing it took a tenth of the MNIST MLP's forward
     * at batch 8 on 2 threads) */
    tile_fn raw[3][2];
};

/* The value stored at one output element: the depth block's sum V added to
 * what C holds (ACC), then the epilogue -- the same operations in the same
 * order as the vector store below, so edge tiles round as inner ones. */
static inline float epi_one(float v, const float *cp, int acc, const tile_epi *e, int64_t i,
                            int64_t j)
{
    if (acc)
        v = *cp + v;
    if (e) {
        if (e->bias_row)
            v = v + e->bias_row[i];
        if (e->bias_col)
            v = v + e->bias_col[j];
        if (e->res)
            v = v + e->res[i * e->ldr + j];
        if (e->relu)
            v = 0.0f > v ? 0.0f : v; /* keeps NaN and -0.0, as relu does */
    }
    return v;
}

#ifdef GEMM_X86
/*
 * The kernel template.  VT: the vector type, VW its floats; NV vectors per
 * row of the tile (NR = NV * VW), MR_ rows, over panels AS rows (A) and BS
 * columns (B) wide; RAW: A read in place, row i at a + i * lda (rows past
 * MR read row 0 again, never stored); MASKED: a vector the last column
 * cuts is loaded and stored under a mask (AVX-512's are cheap: the scalar
 * epilogue of a classifier's 10 columns took a third of its product),
 * else element by element.  The loops have constant bounds and
 * are unrolled, so the accumulators stay in registers.
 */
#define GEMM_TILE(NAME, TARGET, VT, VW, MR_, NV, AS, BS, RAW, LOADU, STOREU, SET1, FMADD, ADD,    \
                  MAX, ZERO, MASKED, MLOAD, MSTORE)                                              \
    __attribute__((target(TARGET))) static void NAME(int64_t kc, const float *a, int64_t lda,     \
                                                     const float *b, float *c, int64_t ldc,      \
                                                     int64_t mr, int64_t nr, int acc,            \
                                                     const tile_epi *e)                          \
    {                                                                                            \
        VT r[MR_][NV];                                                                           \
        const float *ar[MR_];                                                                    \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR_; i++) ar[i] =                           \
            RAW ? a + (i < mr ? i : 0) * lda : a;                                                \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR_; i++)                                   \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) r[i][v] = ZERO();               \
        for (int64_t p = 0; p < kc; p++) {                                                       \
            VT bv[NV];                                                                           \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) bv[v] = LOADU(b + v * VW);      \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR_; i++)                               \
            {                                                                                    \
                VT av = SET1(RAW ? ar[i][p] : a[i]);                                             \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) r[i][v] =                   \
                    FMADD(av, bv[v], r[i][v]);                                                   \
            }                                                                                    \
            a += RAW ? 0 : AS; /* the panels' widths: MR_ and NV * VW may be less */            \
            b += BS;                                                                             \
        }                                                                                        \
        /* rows past MR and vectors past NR (edge tiles) are not stored; a    \
         * vector NR cuts goes through the scalar epilogue: the same sums */  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR_; i++)                                   \
        {                                                                                        \
            if (i >= mr)                                                                         \
                break;                                                                           \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                 \
            {                                                                                    \
                float *cp = c + i * ldc + v * VW;                                                \
                VT x = r[i][v];                                                                  \
                int part = (v + 1) * VW > nr; /* the vector NR cuts */                           \
                if (part && !MASKED) {                                                           \
                    float t[VW];                                                                 \
                    STOREU(t, x);                                                                \
                    for (int64_t q = 0; q < nr - v * VW; q++)                                    \
                        cp[q] = epi_one(t[q], cp + q, acc, e, i, v * VW + q);                    \
                    break;                                                                       \
                }                                                                                \
                /* (all lanes, or NR's first under a mask: loads past it do not \
                 * fault, stores past it do not happen) */                     \
                unsigned lanes = part ? (1u << (nr - v * VW)) - 1 : ~0u;                         \
                if (acc)                                                                         \
                    x = ADD(MLOAD(cp, lanes), x);                                                \
                if (e) {                                                                         \
                    if (e->bias_row)                                                             \
                        x = ADD(x, SET1(e->bias_row[i]));                                        \
                    if (e->bias_col)                                                             \
                        x = ADD(x, MLOAD(e->bias_col + v * VW, lanes));                          \
                    if (e->res)                                                                  \
                        x = ADD(x, MLOAD(e->res + i * e->ldr + v * VW, lanes));                  \
                    if (e->relu)                                                                 \
                        x = MAX(ZERO(), x); /* 0 > x ? 0 : x: NaN and -0.0 kept */               \
                }                                                                                \
                MSTORE(cp, lanes, x);                                                            \
                if (part)                                                                        \
                    break;                                                                       \
            }                                                                                    \
        }                                                                                        \
    }

#define MLOAD512(p, k) _mm512_maskz_loadu_ps((__mmask16)(k), p)
#define MSTORE512(p, k, x) _mm512_mask_storeu_ps(p, (__mmask16)(k), x)
#define MLOAD256(p, k) ((void)(k), _mm256_loadu_ps(p)) /* (whole vectors only: MASKED is 0) */
#define MSTORE256(p, k, x) ((void)(k), _mm256_storeu_ps(p, x))
#define TILE_AVX512(NAME, MR_, NV, RAW)                                                           \
    GEMM_TILE(NAME, "avx512f", __m512, 16, MR_, NV, 12, 32, RAW, _mm512_loadu_ps,                \
              _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps,   \
              _mm512_setzero_ps, 1, MLOAD512, MSTORE512)
#define TILE_AVX2(NAME, MR_, NV, RAW)                                                             \
    GEMM_TILE(NAME, "avx2,fma", __m256, 8, MR_, NV, 6, 16, RAW, _mm256_loadu_ps,                 \
              _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps,   \
              _mm256_setzero_ps, 0, MLOAD256, MSTORE256)
/* every size of tile, on panels and in place */
#define TILES(ISA, R1, R2, R3)                                                                    \
    ISA(tile_##ISA##_##R1##x1, R1, 1, 0) ISA(tile_##ISA##_##R1##x2, R1, 2, 0)                  \
    ISA(tile_##ISA##_##R2##x1, R2, 1, 0) ISA(tile_##ISA##_##R2##x2, R2, 2, 0)                  \
    ISA(tile_##ISA##_##R3##x1, R3, 1, 0) ISA(tile_##ISA##_##R3##x2, R3, 2, 0)                  \
    ISA(raw_##ISA##_##R1##x1, R1, 1, 1) ISA(raw_##ISA##_##R1##x2, R1, 2, 1)                    \
    ISA(raw_##ISA##_##R2##x1, R2, 1, 1) ISA(raw_##ISA##_##R2##x2, R2, 2, 1)                    \
    ISA(raw_##ISA##_##R3##x1, R3, 1, 1) ISA(raw_##ISA##_##R3##x2, R3, 2, 1)
TILES(TILE_AVX512, 4, 8, 12)
TILES(TILE_AVX2, 2, 4, 6)
#define TILE_TABLE(P, ISA, R1, R2, R3)                                                            \
    {{P##_##ISA##_##R1##x1, P##_##ISA##_##R1##x2},                                              \
     {P##_##ISA##_##R2##x1, P##_##ISA##_##R2##x2},                                              \
     {P##_##ISA##_##R3##x1, P##_##ISA##_##R3##x2}}

/* __builtin_cpu_supports checks the OS saves the registers too (XGETBV);
 * under valgrind, which runs no AVX-512, the CPU it shows has none. */
static int has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

static int has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Depth blocks of 256: an A panel (12 KB) stays in L1 while B's panels
 * (32 KB each, MC x KC and KC x NC blocks in L2) stream past it. */
#define GEMM_MC 96
#define MR_AVX512 12
#define MR_AVX2 6 /* the smallest MR: the most row tiles in MC */
_Static_assert(MR_AVX2 <= MR_AVX512 && GEMM_MC / MR_AVX2 <= ROW_TILES_MAX,
               "a task's row tiles (MC / MR) fit row_tiles");
static const cpu_gemm_kernel KERNELS[] = {
    {"avx512", "AVX-512", MR_AVX512, 32, 256, GEMM_MC, 256, has_avx512,
     TILE_TABLE(tile, TILE_AVX512, 4, 8, 12), TILE_TABLE(raw, TILE_AVX512, 4, 8, 12)},
    {"avx2", "AVX2+FMA", MR_AVX2, 16, 256, GEMM_MC, 256, has_avx2,
     TILE_TABLE(tile, TILE_AVX2, 2, 4, 6), TILE_TABLE(raw, TILE_AVX2, 2, 4, 6)},
};
#define NKERNELS (sizeof KERNELS / sizeof KERNELS[0])
#endif

const cpu_gemm_kernel *cpu_gemm_pick(const char *want)
{
#ifdef GEMM_X86
    int any = !want || !*want || !strcmp(want, "auto");
    for (size_t i = 0; i < NKERNELS; i++)
        if ((any || !strcmp(want, KERNELS[i].id)) && KERNELS[i].usable())
            return &KERNELS[i];
#else
    (void)want;
#endif
    return NULL;
}

const char *cpu_gemm_name(const cpu_gemm_kernel *k)
{
    return k->name;
}

static int64_t round_up(int64_t v, int64_t t)
{
    return (v + t - 1) / t * t;
}

size_t cpu_gemm_packed_floats(const cpu_gemm_kernel *k, int side, int64_t rows, int64_t depth)
{
    int64_t t = side == CPU_GEMM_A ? k->mr : k->nr;
    size_t n = (size_t)(round_up(rows, t) * depth);
    return n ? n : 1;
}

#ifdef GEMM_X86
/* The first LANES (1..8) floats of V at O.  (Not vmaskmovps: microcoded on
 * AMD's cores, it took most of the packing's time.) */
__attribute__((target("avx2"))) static inline void store_lanes(float *o, __m256 v8, int64_t lanes)
{
    if (lanes == 8) {
        _mm256_storeu_ps(o, v8);
        return;
    }
    __m128 v = _mm256_castps256_ps128(v8);
    if (lanes >= 4) {
        _mm_storeu_ps(o, v);
        v = _mm256_extractf128_ps(v8, 1);
        o += 4;
        lanes -= 4;
    }
    if (lanes >= 2) {
        _mm_storel_pi((__m64 *)o, v);
        v = _mm_movehl_ps(v, v);
        o += 2;
        lanes -= 2;
    }
    if (lanes)
        _mm_store_ss(o, v);
}

/* One panel of W <= T rows, each contiguous along the depth (cs == 1: a
 * linear layer's input as A, its weight as B), for steps 0 <= p < DEPTH8
 * (a multiple of 8): 8 x 8 blocks transposed in registers.  The scalar loop
 * stores one float at a time, strided by T: for a small batch's linear
 * layer that packing took a sixth of the forward, on the calling thread. */
__attribute__((target("avx2"))) static void pack_rows_avx2(const float *s, int64_t rs, int64_t w,
                                                           int64_t t, int64_t depth8, float *d)
{
    for (int64_t i0 = 0; i0 < t; i0 += 8) {
        int64_t lanes = t - i0 < 8 ? t - i0 : 8;
        if (i0 >= w) { /* the panel's padding (a batch of 8 in 12 rows): zeros */
            for (int64_t p = 0; p < depth8; p++)
                store_lanes(d + p * t + i0, _mm256_setzero_ps(), lanes);
            continue;
        }
        for (int64_t p = 0; p < depth8; p += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i0 + i < w ? _mm256_loadu_ps(s + (i0 + i) * rs + p) : _mm256_setzero_ps();
            /* the usual 8 x 8 transpose: unpack, shuffle, permute lanes */
            __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
            __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
            __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
            __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
            __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xee);
            __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xee);
            __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xee);
            __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xee);
            __m256 c[8] = {
                _mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
                _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
                _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
                _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
            for (int j = 0; j < 8; j++) /* step p + j: rows i0.. */
                store_lanes(d + (p + j) * t + i0, c[j], lanes);
        }
    }
}
#endif

/* Panel q (rows q*t ..) at dst + q * depth * t, step p's T floats at
 * + p * t: the layout the kernel reads. */
void cpu_gemm_pack(const cpu_gemm_kernel *k, int side, const float *src, int64_t rs, int64_t cs,
                   int64_t rows, int64_t depth, float *dst)
{
    int64_t t = side == CPU_GEMM_A ? k->mr : k->nr;
#ifdef GEMM_X86
    int transpose = cs == 1 && rs != 1 && depth >= 8 && has_avx2();
#endif
    for (int64_t r0 = 0; r0 < rows; r0 += t) {
        int64_t w = rows - r0 < t ? rows - r0 : t;
        const float *s = src + r0 * rs;
        float *d = dst + r0 * depth;
#ifdef GEMM_X86
        if (transpose) { /* steps 0..depth8 transposed, the rest below */
            int64_t depth8 = depth / 8 * 8;
            pack_rows_avx2(s, rs, w, t, depth8, d);
            for (int64_t p = depth8; p < depth; p++) {
                for (int64_t i = 0; i < w; i++)
                    d[p * t + i] = s[i * rs + p];
                for (int64_t i = w; i < t; i++)
                    d[p * t + i] = 0.0f;
            }
            continue;
        }
#endif
        if (rs == 1 && w == t && t == 32) /* rows side by side: T floats per step */
            for (int64_t p = 0; p < depth; p++)
                memcpy(d + p * 32, s + p * cs, 32 * sizeof(float)); /* inlined: constant */
        else if (rs == 1 && w == t && t == 16)
            for (int64_t p = 0; p < depth; p++)
                memcpy(d + p * 16, s + p * cs, 16 * sizeof(float));
        else if (rs == 1 && w == t)
            for (int64_t p = 0; p < depth; p++)
                memcpy(d + p * t, s + p * cs, (size_t)t * sizeof(float));
        else
            for (int64_t p = 0; p < depth; p++) {
                for (int64_t i = 0; i < w; i++)
                    d[p * t + i] = s[i * rs + p * cs];
                for (int64_t i = w; i < t; i++)
                    d[p * t + i] = 0.0f;
            }
    }
}

int64_t cpu_gemm_panel_cols(const cpu_gemm_kernel *k)
{
    return k->nr;
}

int64_t cpu_gemm_panel_rows(const cpu_gemm_kernel *k)
{
    return k->mr;
}

/* A panel's columns are runs of one output row each: (oh, ow, length, and
 * where in the panel), the same for every step of the depth. */
typedef struct conv_run {
    int64_t oh, ow, len, at;
} conv_run;

void cpu_gemm_pack_conv(const cpu_gemm_kernel *k, const float *x, const ckpt_conv_geom *g,
                        int64_t p0, int64_t p1, float *dst)
{
    int64_t nr = k->nr, hw = g->out_h * g->out_w, depth = g->in_c * g->k_h * g->k_w;
    conv_run runs[64]; /* NR <= 64 columns: at most NR runs */
    for (int64_t q = p0; q < p1; q++) {
        int64_t j0 = q * nr, w = hw - j0 < nr ? hw - j0 : nr, nruns = 0;
        for (int64_t at = 0; at < w;) {
            int64_t j = j0 + at, ow = j % g->out_w, len = g->out_w - ow;
            if (len > w - at)
                len = w - at;
            runs[nruns++] = (conv_run){.oh = j / g->out_w, .ow = ow, .len = len, .at = at};
            at += len;
        }
        float *d = dst + q * depth * nr;
        for (int64_t ci = 0; ci < g->in_c; ci++) {
            const float *plane = x + ci * g->in_h * g->in_w;
            for (int64_t ki = 0; ki < g->k_h; ki++)
                for (int64_t kj = 0; kj < g->k_w; kj++, d += nr) {
                    int64_t shift = kj * g->dil_w - g->pad_w, lo, hi;
                    cpu_conv_cols(shift, g->stride_w, g->in_w, g->out_w, &lo, &hi);
                    for (int64_t r = 0; r < nruns; r++) {
                        const conv_run *u = &runs[r];
                        float *restrict o = d + u->at; /* o[0]: column u->ow */
                        int64_t ih = u->oh * g->stride_h - g->pad_h + ki * g->dil_h;
                        int64_t a = u->ow, b = u->ow + u->len;
                        if (ih < 0 || ih >= g->in_h) {
                            for (int64_t t = 0; t < u->len; t++)
                                o[t] = 0.0f;
                            continue;
                        }
                        /* columns a..l and h..b in the padding, l..h read */
                        int64_t l = lo < a ? a : lo > b ? b : lo, h = hi > b ? b : hi < l ? l : hi;
                        const float *restrict row = plane + ih * g->in_w;
                        for (int64_t ow = a; ow < l; ow++)
                            o[ow - a] = 0.0f;
                        if (g->stride_w == 1)
                            for (int64_t ow = l; ow < h; ow++)
                                o[ow - a] = row[ow + shift];
                        else
                            for (int64_t ow = l; ow < h; ow++)
                                o[ow - a] = row[ow * g->stride_w + shift];
                        for (int64_t ow = h; ow < b; ow++)
                            o[ow - a] = 0.0f;
                    }
                    for (int64_t jj = w; jj < nr; jj++)
                        d[jj] = 0.0f;
                }
        }
    }
}

/* Tasks: rectangles of at most MC x NC (multiples of the tile); shrunk
 * until each thread has a few to take: along the raw operand's side first
 * when the other is packed (a weight), so that a thread reads its own part
 * of the input -- the MNIST MLP at batch 256 cut by columns had each core
 * read all of the other's packed A -- else columns first. */
int64_t cpu_gemm_plan(const cpu_gemm_kernel *k, cpu_gemm_call *c, int threads)
{
    int64_t mc = round_up(c->m, k->mr), nc = round_up(c->n, k->nr);
    if (mc > k->mc)
        mc = k->mc;
    if (nc > k->nc)
        nc = k->nc;
    int64_t want = threads > 1 ? 3 * (int64_t)threads : 1;
    /* (the plan's first choice: a small A read in place is cut by columns) */
    c->a_in_place = !c->a.packed && c->a.cs == 1 && c->m <= 2 * (int64_t)k->mr;
    int rows_first = c->b.packed && !c->a.packed && !c->a_in_place;
    for (;;) {
        int64_t tm = (c->m + mc - 1) / mc, tn = (c->n + nc - 1) / nc;
        if (tm * tn >= want)
            break;
        if (rows_first && mc > k->mr)
            mc = round_up(mc / 2, k->mr);
        else if (nc > k->nr)
            nc = round_up(nc / 2, k->nr);
        else if (mc > k->mr)
            mc = round_up(mc / 2, k->mr);
        else
            break;
    }
    c->mc = mc;
    c->nc = nc;
    c->tiles_m = c->m > 0 ? (c->m + mc - 1) / mc : 0;
    c->tiles_n = c->n > 0 ? (c->n + nc - 1) / nc : 0;
    /* as many tasks a thread: more row parts (smaller: span() keeps them
     * within MC) up to one tile each -- ResNet-50's 1 x 1 convs at 14 x 14
     * had 11 tasks, 6 on one thread and 5 on the other */
    int64_t rt = (c->m + k->mr - 1) / k->mr;
    if (threads > 1 && c->tiles_n > 0)
        for (int64_t tm = c->tiles_m; tm <= rt; tm++)
            if (tm * c->tiles_n % threads == 0) {
                c->tiles_m = tm;
                break;
            }
    return c->tiles_m * c->tiles_n;
}

size_t cpu_gemm_scratch_floats(const cpu_gemm_kernel *k)
{
    return (size_t)(k->mc * k->kc + k->kc * k->nc);
}

/* Rows R0.. (RLEN) and depth P0.. (KL) of operand O of SIDE, as panels:
 * in the packed operand (over all DEPTH), or packed into BUF now; *STEP
 * floats from one panel to the next. */
static const float *block(const cpu_gemm_kernel *k, int side, const cpu_gemm_operand *o,
                          int64_t r0, int64_t rlen, int64_t p0, int64_t kl, int64_t depth,
                          float *buf, int64_t *step)
{
    int64_t t = side == CPU_GEMM_A ? k->mr : k->nr;
    if (o->packed) {
        *step = depth * t;
        return o->packed + r0 * depth + p0 * t;
    }
    cpu_gemm_pack(k, side, o->raw + r0 * o->rs + p0 * o->cs, o->rs, o->cs, rlen, kl, buf);
    *step = kl * t;
    return buf;
}

/* Part IDX of PARTS of LEN rows (columns) cut at multiples of UNIT (the
 * tile), the parts' tiles differing by one at most: *AT, *N.  (Cut into
 * MC-row blocks, a batch of 256 gave one thread 144 rows and the other
 * 112.)  Each part has at most as many tiles as MC (NC) holds: PARTS is
 * ceil(LEN / MC), and ceil(ceil(LEN / UNIT) / (MC / UNIT)) is the same. */
static void span(int64_t len, int64_t parts, int64_t idx, int64_t unit, int64_t *at, int64_t *n)
{
    int64_t tiles = (len + unit - 1) / unit;
    int64_t lo = tiles * idx / parts * unit, hi = tiles * (idx + 1) / parts * unit;
    *at = lo;
    *n = (hi < len ? hi : len) - lo;
}

/* Rows I0.. (ILEN) and depth P0.. (KL) of CALL's A for the tiles: in place
 * (CALL's a_in_place: row r at r * *LDA floats) or as block() gives it
 * (panels *STEP floats apart) */
static const float *a_block(const cpu_gemm_kernel *k, const cpu_gemm_call *c, int64_t i0,
                            int64_t ilen, int64_t p0, int64_t kl, float *buf, int64_t *step,
                            int64_t *lda)
{
    *lda = c->a.rs;
    if (c->a_in_place) {
        *step = 0;
        return c->a.raw + i0 * c->a.rs + p0;
    }
    return block(k, CPU_GEMM_A, &c->a, i0, ilen, p0, kl, c->k, buf, step);
}

/* A task's row tiles, worked out once a task (their divisions, made per
 * tile call, were a twentieth of the MNIST MLP's forward at batch 8): A
 * packed, one a panel of MR; read in place, as many, their rows balanced
 * at a third of MR (a batch of 8 on AVX2: 4 + 4, not 6 + 2, whose 2-row
 * tile has too few chains to keep the FMA units busy: it took two thirds
 * of the 6-row tile's time).  TF[t][v]: the tile of the fewest rows that
 * holds row tile T's, for NR columns, v = NR > the kernel's NR / 2. */
typedef struct row_tiles {
    int64_t n;
    int64_t at[ROW_TILES_MAX], rows[ROW_TILES_MAX];
    tile_fn const *tf[ROW_TILES_MAX];
} row_tiles;

static void row_tiles_plan(const cpu_gemm_kernel *k, int raw, int64_t ilen, row_tiles *rt)
{
    int64_t n = (ilen + k->mr - 1) / k->mr, third = k->mr / 3;
    rt->n = n; /* (a task has at most MC rows: cpu_gemm_plan, span()) */
    for (int64_t t = 0; t < n; t++) {
        if (raw)
            span(ilen, n, t, third, &rt->at[t], &rt->rows[t]);
        else {
            rt->at[t] = t * k->mr;
            rt->rows[t] = ilen - rt->at[t] < k->mr ? ilen - rt->at[t] : k->mr;
        }
        int64_t r = (rt->rows[t] + third - 1) / third - 1;
        rt->tf[t] = raw ? k->raw[r] : k->tile[r];
    }
}

/* One depth block (KL) of a task's tiles: row tiles RT over A at AP (a_block's
 * STEP and LDA), columns J0.. (JLEN) over B's panels at BP (B_STEP floats
 * apart), element (i, j) stored at OUT[i * LDO + j], added to what it holds
 * when ACC; EPI, when given, placed at each tile's rows and columns. */
static void block_tiles(const cpu_gemm_kernel *k, const cpu_gemm_call *c, const row_tiles *rt,
                        const float *ap, int64_t a_step, int64_t lda, const float *bp,
                        int64_t b_step, int64_t kl, int64_t i0, int64_t j0, int64_t jlen,
                        float *out, int64_t ldo, int acc, tile_epi *epi)
{
    for (int64_t t = 0; t < rt->n; t++) {
        int64_t i = i0 + rt->at[t], mr = rt->rows[t];
        const float *at = c->a_in_place ? ap + rt->at[t] * lda : ap + t * a_step;
        const float *bq = bp;
        for (int64_t jj = 0; jj < jlen; jj += k->nr, bq += b_step) {
            int64_t j = j0 + jj, nr = jlen - jj < k->nr ? jlen - jj : k->nr;
            if (epi) {
                epi->bias_row = c->bias && !c->bias_cols ? c->bias + i : NULL;
                epi->bias_col = c->bias && c->bias_cols ? c->bias + j : NULL;
                epi->res = c->res ? c->res + i * c->ldr + j : NULL;
            }
            rt->tf[t][nr > k->nr / 2](kl, at, lda, bq, out + i * ldo + j, ldo, mr, nr, acc, epi);
        }
    }
}

/* Task T's rectangle of the output: rows *I0.. (*ILEN), columns *J0..
 * (*JLEN) */
static void task_rect(const cpu_gemm_kernel *k, const cpu_gemm_call *c, int64_t t, int64_t *i0,
                      int64_t *ilen, int64_t *j0, int64_t *jlen)
{
    /* (A read in place: rows cut anywhere, 4 + 4 rather than 6 + 2) */
    span(c->m, c->tiles_m, t % c->tiles_m, c->a_in_place ? k->mr / 3 : k->mr, i0, ilen);
    span(c->n, c->tiles_n, t / c->tiles_m, k->nr, j0, jlen);
}

void cpu_gemm_task(const cpu_gemm_kernel *k, const cpu_gemm_call *c, int64_t t, float *scratch)
{
    int64_t i0, ilen, j0, jlen;
    task_rect(k, c, t, &i0, &ilen, &j0, &jlen);
    float *abuf = scratch, *bbuf = scratch + k->mc * k->kc;
    tile_epi epi = {.ldr = c->ldr, .relu = c->relu};
    if (c->k == 0) { /* no products: the epilogue of zeros */
        for (int64_t i = i0; i < i0 + ilen; i++)
            for (int64_t j = j0; j < j0 + jlen; j++) {
                epi.bias_row = c->bias && !c->bias_cols ? c->bias : NULL;
                epi.bias_col = c->bias && c->bias_cols ? c->bias : NULL;
                epi.res = c->res;
                c->c[i * c->ldc + j] = epi_one(0.0f, NULL, 0, &epi, i, j);
            }
        return;
    }
    row_tiles rt;
    row_tiles_plan(k, c->a_in_place, ilen, &rt);
    for (int64_t p0 = 0; p0 < c->k; p0 += k->kc) {
        int64_t kl = c->k - p0 < k->kc ? c->k - p0 : k->kc;
        int64_t a_step, b_step, lda; /* floats from one panel to the next */
        const float *ap = a_block(k, c, i0, ilen, p0, kl, abuf, &a_step, &lda);
        const float *bp = block(k, CPU_GEMM_B, &c->b, j0, jlen, p0, kl, c->k, bbuf, &b_step);
        block_tiles(k, c, &rt, ap, a_step, lda, bp, b_step, kl, i0, j0, jlen, c->c, c->ldc,
                    p0 > 0, p0 + kl >= c->k ? &epi : NULL);
    }
}

int64_t cpu_gemm_depth_blocks(const cpu_gemm_kernel *k, const cpu_gemm_call *c)
{
    return (c->k + k->kc - 1) / k->kc;
}

void cpu_gemm_task_block(const cpu_gemm_kernel *k, const cpu_gemm_call *c, int64_t t,
                         int64_t blk, float *part, int64_t ldp, float *scratch)
{
    int64_t i0, ilen, j0, jlen;
    task_rect(k, c, t, &i0, &ilen, &j0, &jlen);
    float *abuf = scratch, *bbuf = scratch + k->mc * k->kc;
    int64_t p0 = blk * k->kc, kl = c->k - p0 < k->kc ? c->k - p0 : k->kc;
    int64_t a_step, b_step, lda;
    const float *ap = a_block(k, c, i0, ilen, p0, kl, abuf, &a_step, &lda);
    const float *bp = block(k, CPU_GEMM_B, &c->b, j0, jlen, p0, kl, c->k, bbuf, &b_step);
    /* the block's chains from 0, stored as cpu_gemm_task stores its first */
    row_tiles rt;
    row_tiles_plan(k, c->a_in_place, ilen, &rt);
    block_tiles(k, c, &rt, ap, a_step, lda, bp, b_step, kl, i0, j0, jlen, part, ldp, 0, NULL);
}

void cpu_gemm_combine(const cpu_gemm_call *c, const float *parts, int64_t nblk, int64_t stride,
                      int64_t ldp, int64_t i0, int64_t i1)
{
    tile_epi epi = {.bias_row = c->bias && !c->bias_cols ? c->bias : NULL,
                    .bias_col = c->bias && c->bias_cols ? c->bias : NULL,
                    .res = c->res, .ldr = c->ldr, .relu = c->relu};
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < c->n; j++) {
            float *cp = c->c + i * c->ldc + j;
            /* blocks before the last: C = P0, then C + P1, ... as stored */
            float v = parts[i * ldp + j];
            for (int64_t b = 1; b + 1 < nblk; b++)
                v = v + parts[b * stride + i * ldp + j];
            float last = parts[(nblk - 1) * stride + i * ldp + j];
            if (nblk > 1) {
                *cp = v;
                *cp = epi_one(last, cp, 1, &epi, i, j);
            } else
                *cp = epi_one(v, cp, 0, &epi, i, j);
        }
}
