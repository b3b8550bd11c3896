/*
 * element.c - one element of a dtype as another: exact widening of float16,
 * bfloat16 and float8 to float / double, integers to int128, and the casts
 * (below).  Below tensor data, compare and cast: they all call here.
 *
 * Casts: converting elements between float64, float32, float16 and
 * bfloat16 so that the bits equal those of torch's .double(), .float(),
 * .half() and .bfloat16() on a contiguous CPU tensor (torch 2.x, AVX2 or
 * AVX-512 kernels; where 1.13 differs, it is said below;
 * tests/interop/cast_vs_torch.py compares them under both).
 *
 * What torch does, found by experiment:
 *  - Narrowing rounds to nearest, ties to even, including into and out of
 *    subnormals; what is too large becomes a signed infinity, what is at or
 *    below half the smallest subnormal a signed zero.
 *  - float64 -> float16 / bfloat16 rounds twice, first to float32: c10::Half
 *    and c10::BFloat16 are built from a float.  So 1 + 2^-11 + 2^-40 becomes
 *    the half 1.0 (the float32 is the tie 1 + 2^-11), not 1 + 2^-10.
 *  - NaNs to float16 keep the sign, become quiet and keep the top bits of
 *    their payload: sign | 0x7e00 | (float32 mantissa >> 13), as torch 2.x
 *    does on every path (float64 and bfloat16 go through float32 first, so
 *    0xfff4000000000000 gives 0xff00 and bfloat16 0x7f81 gives 0x7e08).
 *    torch 1.13 gave sign | 0x7e00, whatever the payload.
 *  - NaNs to bfloat16 depend on the kernel.  float32 -> bfloat16 gives 0xffff
 *    for any NaN (the AVX2 / AVX-512 kernel, used for every contiguous
 *    length); so does float64 -> bfloat16 in its vectorised body, but its
 *    scalar tail (the last n % 16 elements with AVX2, n % 32 with AVX-512,
 *    per thread's chunk) gives c10's 0x7fc0.  We give 0xffff.  (Strided
 *    tensors and ATEN_CPU_CAPABILITY=default take the scalar path: 0x7fc0.)
 *    float16 -> bfloat16 always takes c10's scalar path: 0x7fc0.
 *  - Widening to float32 / float64 is exact.  It quiets a signalling NaN
 *    (sets the top mantissa bit) and keeps the payload, except bfloat16 ->
 *    float32, a 16-bit shift that keeps the NaN as it is.  torch 2.x's
 *    float16 -> float32 does so in its vectorised blocks of 8 but gives
 *    0x7fffffff for any NaN in the last n % 8 elements of a tensor and in a
 *    0-dim one; we give the vectorised result everywhere.
 *  - float64 -> float32 NaNs keep the sign and the top 22 payload bits and
 *    become quiet (what cvtsd2ss does).
 *
 * Everything is integer arithmetic on the bit patterns, so the result does
 * not depend on the FPU's rounding mode or on flush-to-zero / denormals-are-
 * zero flags that other code in the process may have set.
 */
#include "core/core.h"

#include <math.h>

#include <pthread.h>
#include <string.h>

static int is_castable(ckpt_dtype d)
{
    return d == CKPT_DTYPE_FLOAT64 || d == CKPT_DTYPE_FLOAT32 || d == CKPT_DTYPE_FLOAT16 ||
           d == CKPT_DTYPE_BFLOAT16 || d == CKPT_DTYPE_FLOAT8_E4M3FN ||
           d == CKPT_DTYPE_FLOAT8_E5M2;
}

int ckpt_cast_supported(ckpt_dtype from, ckpt_dtype to)
{
    return is_castable(from) && is_castable(to);
}

/* ---- little-endian loads and stores (any alignment) ---- */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define FROM_LE16(v) __builtin_bswap16(v)
#define FROM_LE32(v) __builtin_bswap32(v)
#define FROM_LE64(v) __builtin_bswap64(v)
#else
#define FROM_LE16(v) (v)
#define FROM_LE32(v) (v)
#define FROM_LE64(v) (v)
#endif

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return FROM_LE16(v);
}
static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return FROM_LE32(v);
}
static inline uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return FROM_LE64(v);
}
static inline void st16(uint8_t *p, uint16_t v)
{
    v = FROM_LE16(v);
    memcpy(p, &v, sizeof(v));
}
static inline void st32(uint8_t *p, uint32_t v)
{
    v = FROM_LE32(v);
    memcpy(p, &v, sizeof(v));
}
static inline void st64(uint8_t *p, uint64_t v)
{
    v = FROM_LE64(v);
    memcpy(p, &v, sizeof(v));
}

/* ---- single elements, as bit patterns ---- */

/* torch's bfloat16 NaNs, see the top of the file */
#define BF16_NAN_VECTOR 0xffffu
#define BF16_NAN_SCALAR 0x7fc0u

static inline uint32_t f64_to_f32(uint64_t d)
{
    uint32_t sign = (uint32_t)(d >> 32) & 0x80000000u;
    uint64_t a = d & 0x7fffffffffffffffu;
    if (a > 0x7ff0000000000000u) /* NaN */
        return sign | 0x7fc00000u | (uint32_t)((a >> 29) & 0x3fffffu);
    if (a >= 0x47effffff0000000u) /* FLT_MAX + half an ulp and up: the tie goes to even, 2^128 */
        return sign | 0x7f800000u;
    if (a >= 0x3810000000000000u) { /* 2^-126 and up: a normal float */
        /* adding just under half an ulp, plus the kept lsb, rounds to even;
         * a carry out of the mantissa correctly bumps the exponent */
        a += 0x0fffffffu + ((a >> 29) & 1);
        return sign | (uint32_t)((a >> 29) - ((uint64_t)(1023 - 127) << 23));
    }
    unsigned e = (unsigned)(a >> 52);
    if (e < 1023 - 150) /* below 2^-150, half the smallest subnormal */
        return sign;
    /* subnormal (or the smallest normal, by a carry): count in units of 2^-149 */
    uint64_t m = (a & 0xfffffffffffffu) | 0x10000000000000u;
    unsigned shift = 1075 - 149 - e; /* 30..53 */
    uint64_t q = m >> shift, rem = m & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    q += rem > half || (rem == half && (q & 1));
    return sign | (uint32_t)q;
}

static inline uint64_t f32_to_f64(uint32_t f)
{
    uint64_t sign = (uint64_t)(f & 0x80000000u) << 32;
    uint32_t e = (f >> 23) & 0xff, m = f & 0x7fffff;
    if (e == 0xff)
        return sign | 0x7ff0000000000000u | (uint64_t)m << 29 |
               (m ? 0x8000000000000u : 0); /* a NaN comes out quiet */
    if (e == 0) {
        if (m == 0)
            return sign;
        /* subnormal: shift the leading 1 up to the implicit bit */
        int k = __builtin_clz(m) - 8;
        return sign | (uint64_t)(1023 - 126 - k) << 52 | (uint64_t)((m << k) & 0x7fffff) << 29;
    }
    return sign | (uint64_t)(e + 1023 - 127) << 52 | (uint64_t)m << 29;
}

static inline uint16_t f32_to_f16(uint32_t f)
{
    uint16_t sign = (uint16_t)((f >> 16) & 0x8000);
    uint32_t a = f & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, the payload's top 9 bits kept (torch 2.x) */
        return sign | 0x7e00 | (uint16_t)((a & 0x7fffffu) >> 13);
    if (a >= 0x477ff000u) /* 65520 (half way from 65504 to 2^16) and up: the tie goes to even, 2^16 */
        return sign | 0x7c00;
    /*
     * Both the normal and the subnormal result, then a select: weights mix
     * the two at random, and a branch between them mispredicts often enough
     * to cost a third of the speed.
     * Normal (2^-14 and up): round as in f64_to_f32.
     */
    uint32_t normal = ((a + 0xfffu + ((a >> 13) & 1)) >> 13) - ((127 - 15) << 10);
    /*
     * Subnormal (or the smallest normal, by a carry): count in units of
     * 2^-24, rounding to even.  A shift of 25 leaves 0: below 2^-25 (half
     * the smallest subnormal) everything underflows, float32 subnormals too.
     */
    uint32_t e = a >> 23;
    uint32_t shift = 150 - 24 - (e < 112 ? e : 112); /* 14.. */
    shift = shift < 25 ? shift : 25;
    uint32_t m = (a & 0x7fffff) | 0x800000;
    uint32_t sub = (m + (1u << (shift - 1)) - 1 + ((m >> shift) & 1)) >> shift;
    uint32_t use_sub = 0u - (uint32_t)(a < 0x38800000u);
    return sign | (uint16_t)((normal & ~use_sub) | (sub & use_sub));
}

/* NAN is what a NaN becomes: BF16_NAN_VECTOR or BF16_NAN_SCALAR */
static inline uint16_t f32_to_bf16(uint32_t f, uint16_t nan)
{
    if ((f & 0x7fffffffu) > 0x7f800000u)
        return nan;
    /* round to even on the low 16 bits; overflow carries into inf, and the
     * largest non-NaN sum (-inf: 0xff800000 + 0x8000) cannot wrap */
    return (uint16_t)((f + 0x7fffu + ((f >> 16) & 1)) >> 16);
}

/*
 * float16 -> float32 through a table of all 65536 results, made once from
 * ckpt_half_to_float(): a call per element, with its loop for subnormals,
 * streamed weights at under 400 MB/s.
 */
static uint32_t half_table[65536];
static pthread_once_t half_table_once = PTHREAD_ONCE_INIT;

static void half_table_fill(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float v = ckpt_half_to_float((uint16_t)h);
        uint32_t f;
        memcpy(&f, &v, sizeof(f));
        if ((f & 0x7fffffffu) > 0x7f800000u)
            f |= 0x400000u; /* torch's conversion quiets signalling NaNs */
        half_table[h] = f;
    }
}

static inline uint32_t f16_to_f32(uint16_t h)
{
    return half_table[h];
}

/* Not ckpt_bfloat16_to_float(): a float return value travels on the x87
 * stack on i386, which quiets signalling NaNs, and torch keeps them. */
static inline uint32_t bf16_to_f32(uint16_t b)
{
    return (uint32_t)b << 16;
}

/*
 * float8, as c10's Float8_e4m3fn / Float8_e5m2 convert from and to float
 * (torch 2.x): the plain element-wise cast, not a scaled quantization.
 * Rounding to nearest even, subnormals included.  e4m3fn has no infinity:
 * torch 2.x saturates, so everything past its largest, 448, infinities
 * included, becomes +-448 (0x7e), and NaNs its NaN 0x7f (with the sign).
 * e5m2: 61440 (half way past 57344) and up becomes infinity, NaNs its NaN
 * 0x7f (with the sign).  float64 rounds to float32 first.  Back to float32
 * exactly; an e5m2 NaN comes out quiet (as float16's), and a float8 NaN
 * cast to bfloat16 is torch's scalar 0x7fc0.
 */

/*
 * A float32 magnitude A below the smallest normal of a format whose
 * subnormals are multiples of 2^-UNIT: the count of them, rounded to even.
 * Branch-free, as in f32_to_f16: small weights are common, and a branch on
 * their size mispredicts.  A shift of 25 leaves 0: below half the smallest
 * subnormal everything underflows, float32 subnormals too.
 */
static inline uint32_t round_subnormal(uint32_t a, uint32_t unit)
{
    int32_t e = (int32_t)(a >> 23);
    int32_t sh = 150 - (int32_t)unit - (e ? e : 1);
    /* 1 at least: for a normal A (whose result the caller drops) too */
    uint32_t shift = sh < 1 ? 1u : sh > 25 ? 25u : (uint32_t)sh;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    return (m + (1u << (shift - 1)) - 1 + ((m >> shift) & 1)) >> shift;
}

/* C ? X : Y without a branch (the compiler keeps one for ?: here) */
static inline uint32_t pick(bool c, uint32_t x, uint32_t y)
{
    uint32_t m = 0u - (uint32_t)c;
    return (x & m) | (y & ~m);
}

static inline uint8_t f32_to_e4m3fn(uint32_t f)
{
    uint32_t sign = f & 0x80000000u, a = f ^ sign;
    uint32_t normal = (a - ((uint32_t)(127 - 7) << 23) + 0x7ffffu + ((a >> 20) & 1)) >> 20;
    uint32_t r = pick(a < 0x3c800000u, round_subnormal(a, 9), normal); /* below 2^-6 */
    r = pick(a > 0x43e00000u, 0x7eu, r); /* past 448, infinities too: torch 2.x saturates */
    r = pick(a > 0x7f800000u, 0x7fu, r); /* NaN */
    return (uint8_t)(r | (sign >> 24));
}

static inline uint8_t f32_to_e5m2(uint32_t f)
{
    uint32_t sign = f & 0x80000000u, a = f ^ sign;
    uint32_t normal = (a - ((uint32_t)(127 - 15) << 23) + 0xfffffu + ((a >> 21) & 1)) >> 21;
    uint32_t r = pick(a < 0x38800000u, round_subnormal(a, 16), normal); /* below 2^-14 */
    r = pick(a >= 0x47800000u, 0x7cu, r); /* 2^16 and up: infinity */
    r = pick(a > 0x7f800000u, 0x7fu, r);  /* NaN */
    return (uint8_t)(r | (sign >> 24));
}

/* exact, as c10's fp8e4m3fn_to_fp32_value: NaN 0x7f is 0x7ff00000 */
static inline uint32_t e4m3fn_to_f32(uint8_t b)
{
    uint32_t w = (uint32_t)b << 24, sign = w & 0x80000000u, nonsign = w & 0x7fffffffu;
    if (!nonsign)
        return sign;
    uint32_t shift = (uint32_t)__builtin_clz(nonsign);
    shift = shift > 4 ? shift - 4 : 0;
    uint32_t inf_nan = (uint32_t)((int32_t)(nonsign + 0x01000000u) >> 8) & 0x7f800000u;
    return sign | ((((nonsign << shift) >> 4) + ((0x78 - shift) << 23)) | inf_nan);
}


/* ---- arrays ---- */

#define PAIR(from, to) ((from) * CKPT_DTYPE_COUNT_ + (to))

/* for each element: load with LD (IN bytes), convert with EXPR of x, store with ST (OUT bytes) */
#define CAST_LOOP(IN, LD, OUT, ST, EXPR)             \
    for (size_t i = 0; i < n; i++) {                 \
        __typeof__(LD(s)) x = LD(s + i * (IN));      \
        ST(d + i * (OUT), EXPR);                     \
    }                                                \
    break

/* Casts with a float8 side: each element through float32, as c10 does;
 * a block at a time, so that each loop is a tight one. */
static void cast_float8(ckpt_dtype from, const uint8_t *s, ckpt_dtype to, uint8_t *d, size_t n)
{
    uint32_t f[1024];
    size_t es = ckpt_dtype_size(from), eo = ckpt_dtype_size(to);
    for (size_t at = 0; at < n; at += 1024) {
        size_t k = n - at < 1024 ? n - at : 1024;
        const uint8_t *p = s + at * es;
        uint8_t *q = d + at * eo;
        switch (from) {
        case CKPT_DTYPE_FLOAT64:
            for (size_t i = 0; i < k; i++)
                f[i] = f64_to_f32(ld64(p + 8 * i));
            break;
        case CKPT_DTYPE_FLOAT32:
            for (size_t i = 0; i < k; i++)
                f[i] = ld32(p + 4 * i);
            break;
        case CKPT_DTYPE_FLOAT16:
            for (size_t i = 0; i < k; i++)
                f[i] = f16_to_f32(ld16(p + 2 * i));
            break;
        case CKPT_DTYPE_BFLOAT16:
            for (size_t i = 0; i < k; i++)
                f[i] = bf16_to_f32(ld16(p + 2 * i));
            break;
        case CKPT_DTYPE_FLOAT8_E4M3FN:
            for (size_t i = 0; i < k; i++)
                f[i] = e4m3fn_to_f32(p[i]);
            break;
        default: /* e5m2: a float16's top byte */
            for (size_t i = 0; i < k; i++)
                f[i] = f16_to_f32((uint16_t)(p[i] << 8));
            break;
        }
        switch (to) {
        case CKPT_DTYPE_FLOAT64:
            for (size_t i = 0; i < k; i++)
                st64(q + 8 * i, f32_to_f64(f[i]));
            break;
        case CKPT_DTYPE_FLOAT32:
            for (size_t i = 0; i < k; i++)
                st32(q + 4 * i, f[i]);
            break;
        case CKPT_DTYPE_FLOAT16:
            for (size_t i = 0; i < k; i++)
                st16(q + 2 * i, f32_to_f16(f[i]));
            break;
        case CKPT_DTYPE_BFLOAT16:
            for (size_t i = 0; i < k; i++)
                st16(q + 2 * i, f32_to_bf16(f[i], BF16_NAN_SCALAR));
            break;
        case CKPT_DTYPE_FLOAT8_E4M3FN:
            for (size_t i = 0; i < k; i++)
                q[i] = f32_to_e4m3fn(f[i]);
            break;
        default:
            for (size_t i = 0; i < k; i++)
                q[i] = f32_to_e5m2(f[i]);
            break;
        }
    }
}

void ckpt_cast(ckpt_dtype from, const void *src, ckpt_dtype to, void *dst, size_t n)
{
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (!ckpt_cast_supported(from, to))
        return;
    if (from == to) {
        if (n)
            memcpy(dst, src, n * ckpt_dtype_size(from));
        return;
    }
    if (from == CKPT_DTYPE_FLOAT16 || from == CKPT_DTYPE_FLOAT8_E5M2)
        pthread_once(&half_table_once, half_table_fill);
    if (from == CKPT_DTYPE_FLOAT8_E4M3FN || from == CKPT_DTYPE_FLOAT8_E5M2 ||
        to == CKPT_DTYPE_FLOAT8_E4M3FN || to == CKPT_DTYPE_FLOAT8_E5M2) {
        cast_float8(from, s, to, d, n);
        return;
    }
    switch (PAIR(from, to)) {
    case PAIR(CKPT_DTYPE_FLOAT64, CKPT_DTYPE_FLOAT32):
        CAST_LOOP(8, ld64, 4, st32, f64_to_f32(x));
    case PAIR(CKPT_DTYPE_FLOAT64, CKPT_DTYPE_FLOAT16):
        CAST_LOOP(8, ld64, 2, st16, f32_to_f16(f64_to_f32(x)));
    case PAIR(CKPT_DTYPE_FLOAT64, CKPT_DTYPE_BFLOAT16):
        CAST_LOOP(8, ld64, 2, st16, f32_to_bf16(f64_to_f32(x), BF16_NAN_VECTOR));
    case PAIR(CKPT_DTYPE_FLOAT32, CKPT_DTYPE_FLOAT64):
        CAST_LOOP(4, ld32, 8, st64, f32_to_f64(x));
    case PAIR(CKPT_DTYPE_FLOAT32, CKPT_DTYPE_FLOAT16):
        CAST_LOOP(4, ld32, 2, st16, f32_to_f16(x));
    case PAIR(CKPT_DTYPE_FLOAT32, CKPT_DTYPE_BFLOAT16):
        CAST_LOOP(4, ld32, 2, st16, f32_to_bf16(x, BF16_NAN_VECTOR));
    case PAIR(CKPT_DTYPE_FLOAT16, CKPT_DTYPE_FLOAT64):
        CAST_LOOP(2, ld16, 8, st64, f32_to_f64(f16_to_f32(x)));
    case PAIR(CKPT_DTYPE_FLOAT16, CKPT_DTYPE_FLOAT32):
        CAST_LOOP(2, ld16, 4, st32, f16_to_f32(x));
    case PAIR(CKPT_DTYPE_FLOAT16, CKPT_DTYPE_BFLOAT16):
        CAST_LOOP(2, ld16, 2, st16, f32_to_bf16(f16_to_f32(x), BF16_NAN_SCALAR));
    case PAIR(CKPT_DTYPE_BFLOAT16, CKPT_DTYPE_FLOAT64):
        CAST_LOOP(2, ld16, 8, st64, f32_to_f64(bf16_to_f32(x)));
    case PAIR(CKPT_DTYPE_BFLOAT16, CKPT_DTYPE_FLOAT32):
        CAST_LOOP(2, ld16, 4, st32, bf16_to_f32(x));
    case PAIR(CKPT_DTYPE_BFLOAT16, CKPT_DTYPE_FLOAT16):
        CAST_LOOP(2, ld16, 2, st16, f32_to_f16(bf16_to_f32(x)));
    default:
        break;
    }
}

/* ---- exact conversions to float, double and int128 ---------------------------- */

float ckpt_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

float ckpt_bfloat16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

ckpt_element_class ckpt_element_class_of(ckpt_dtype dt)
{
    switch (dt) {
    case CKPT_DTYPE_FLOAT64:
    case CKPT_DTYPE_FLOAT32:
    case CKPT_DTYPE_FLOAT16:
    case CKPT_DTYPE_BFLOAT16:
    case CKPT_DTYPE_FLOAT8_E5M2:
    case CKPT_DTYPE_FLOAT8_E4M3FN:
    case CKPT_DTYPE_FLOAT8_E5M2FNUZ:
    case CKPT_DTYPE_FLOAT8_E4M3FNUZ:
    case CKPT_DTYPE_FLOAT8_E8M0FNU:
        return CKPT_ELEM_FLOAT;
    case CKPT_DTYPE_INT64:
    case CKPT_DTYPE_INT32:
    case CKPT_DTYPE_INT16:
    case CKPT_DTYPE_INT8:
        return CKPT_ELEM_SIGNED;
    case CKPT_DTYPE_UINT8:
    case CKPT_DTYPE_UINT16:
    case CKPT_DTYPE_UINT32:
    case CKPT_DTYPE_UINT64:
    case CKPT_DTYPE_BOOL:
        return CKPT_ELEM_UNSIGNED;
    default:
        return CKPT_ELEM_RAW;
    }
}

/*
 * An 8-bit float with EBITS exponent and MBITS mantissa bits and BIAS.
 * FNUZ: no infinity, no negative zero, NaN is 0x80; FN: no infinity, NaN is
 * all ones (S.1111.111); otherwise IEEE-like (all-ones exponent: inf / NaN).
 */
static double float8_value(uint8_t v, int ebits, int mbits, int bias, int kind)
{
    enum { IEEE = 0, FN = 1, FNUZ = 2 };
    unsigned sign = v >> 7, exp = (v >> mbits) & ((1u << ebits) - 1), man = v & ((1u << mbits) - 1);
    unsigned emax = (1u << ebits) - 1;
    if (kind == FNUZ && v == 0x80)
        return NAN;
    if (kind == FN && exp == emax && man == (1u << mbits) - 1)
        return NAN;
    if (kind == IEEE && exp == emax)
        return man ? NAN : (sign ? -INFINITY : INFINITY);
    double m = exp ? 1.0 + ldexp(man, -mbits) : ldexp(man, -mbits);
    double x = ldexp(m, (exp ? (int)exp : 1) - bias);
    return sign ? -x : x;
}

bool ckpt_dtype_is_real(ckpt_dtype dt)
{
    return ckpt_element_class_of(dt) != CKPT_ELEM_RAW;
}

/* Convert N elements of a CKPT_ELEM_FLOAT or integer dtype at P to double. */
bool ckpt_dtype_to_double(ckpt_dtype dt, const uint8_t *p, size_t n, double *out)
{
#define CONVERT(T, EXPR)                          \
    for (size_t i = 0; i < n; i++) {              \
        T v;                                      \
        memcpy(&v, p + i * sizeof(T), sizeof(T)); \
        out[i] = (double)(EXPR);                  \
    }                                             \
    break
    switch (dt) {
    case CKPT_DTYPE_FLOAT64: CONVERT(double, v);
    case CKPT_DTYPE_FLOAT32: CONVERT(float, v);
    case CKPT_DTYPE_FLOAT16: CONVERT(uint16_t, ckpt_half_to_float(v));
    case CKPT_DTYPE_BFLOAT16: CONVERT(uint16_t, ckpt_bfloat16_to_float(v));
    case CKPT_DTYPE_FLOAT8_E5M2: CONVERT(uint8_t, float8_value(v, 5, 2, 15, 0));
    case CKPT_DTYPE_FLOAT8_E4M3FN: CONVERT(uint8_t, float8_value(v, 4, 3, 7, 1));
    case CKPT_DTYPE_FLOAT8_E5M2FNUZ: CONVERT(uint8_t, float8_value(v, 5, 2, 16, 2));
    case CKPT_DTYPE_FLOAT8_E4M3FNUZ: CONVERT(uint8_t, float8_value(v, 4, 3, 8, 2));
    case CKPT_DTYPE_FLOAT8_E8M0FNU:
        CONVERT(uint8_t, v == 0xff ? NAN : ldexp(1.0, (int)v - 127));
    case CKPT_DTYPE_INT64: CONVERT(int64_t, v);
    case CKPT_DTYPE_INT32: CONVERT(int32_t, v);
    case CKPT_DTYPE_INT16: CONVERT(int16_t, v);
    case CKPT_DTYPE_INT8: CONVERT(int8_t, v);
    case CKPT_DTYPE_UINT8: CONVERT(uint8_t, v);
    case CKPT_DTYPE_BOOL: CONVERT(uint8_t, v != 0);
    case CKPT_DTYPE_UINT16: CONVERT(uint16_t, v);
    case CKPT_DTYPE_UINT32: CONVERT(uint32_t, v);
    case CKPT_DTYPE_UINT64: CONVERT(uint64_t, v);
    default:
        for (size_t i = 0; i < n; i++)
            out[i] = NAN;
        return false;
    }
    return true;
#undef CONVERT
}

/* Convert N elements of an integer dtype at P to 128-bit integers. */
void ckpt_dtype_to_int128(ckpt_dtype dt, const uint8_t *p, size_t n, __int128 *out)
{
#define CONVERT(T, EXPR)                          \
    for (size_t i = 0; i < n; i++) {              \
        T v;                                      \
        memcpy(&v, p + i * sizeof(T), sizeof(T)); \
        out[i] = (__int128)(EXPR);                \
    }                                             \
    break
    switch (dt) {
    case CKPT_DTYPE_INT64: CONVERT(int64_t, v);
    case CKPT_DTYPE_INT32: CONVERT(int32_t, v);
    case CKPT_DTYPE_INT16: CONVERT(int16_t, v);
    case CKPT_DTYPE_INT8: CONVERT(int8_t, v);
    case CKPT_DTYPE_UINT8: CONVERT(uint8_t, v);
    case CKPT_DTYPE_BOOL: CONVERT(uint8_t, v != 0);
    case CKPT_DTYPE_UINT16: CONVERT(uint16_t, v);
    case CKPT_DTYPE_UINT32: CONVERT(uint32_t, v);
    case CKPT_DTYPE_UINT64: CONVERT(uint64_t, v);
    default:
        memset(out, 0, n * sizeof(*out));
        break;
    }
#undef CONVERT
}
