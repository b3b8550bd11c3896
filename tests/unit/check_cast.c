/* check_cast.c - dtype casts (lib/core/element.c) on hand-computed edge
 * cases: rounding ties to even, overflow to inf, subnormals, signed zeros,
 * torch's NaN patterns and float64 -> 16-bit rounding twice through
 * float32.  tests/interop/cast_vs_torch.py compares with torch itself. */
#include "unit.h"
#include "core/core.h"

#include <math.h>

#define F64 CKPT_DTYPE_FLOAT64
#define F32 CKPT_DTYPE_FLOAT32
#define F16 CKPT_DTYPE_FLOAT16
#define BF16 CKPT_DTYPE_BFLOAT16
#define E4 CKPT_DTYPE_FLOAT8_E4M3FN
#define E5 CKPT_DTYPE_FLOAT8_E5M2

/* little-endian bytes of the low SIZE bytes of V */
static void put(uint8_t *p, size_t size, uint64_t v)
{
    for (size_t i = 0; i < size; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get(const uint8_t *p, size_t size)
{
    uint64_t v = 0;
    for (size_t i = 0; i < size; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Cast one element with bits IN; its result's bits. */
static uint64_t cast1(ckpt_dtype from, uint64_t in, ckpt_dtype to)
{
    uint8_t src[8], dst[8];
    put(src, ckpt_dtype_size(from), in);
    ckpt_cast(from, src, to, dst, 1);
    return get(dst, ckpt_dtype_size(to));
}

static const struct row {
    ckpt_dtype from, to;
    uint64_t in, want;
    const char *what;
} rows[] = {
    /* float32 -> float16 */
    {F32, F16, 0x3f800000, 0x3c00, "1.0"},
    {F32, F16, 0xbf800000, 0xbc00, "-1.0"},
    {F32, F16, 0x00000000, 0x0000, "+0"},
    {F32, F16, 0x80000000, 0x8000, "-0 keeps its sign"},
    {F32, F16, 0x477fe000, 0x7bff, "65504, the largest half"},
    {F32, F16, 0x477fefff, 0x7bff, "just under 65520 rounds down"},
    {F32, F16, 0x477ff000, 0x7c00, "65520, the tie above 65504, goes to even: inf"},
    {F32, F16, 0xc77ff000, 0xfc00, "-65520 -> -inf"},
    {F32, F16, 0x501502f9, 0x7c00, "1e10 overflows"},
    {F32, F16, 0x7f7fffff, 0x7c00, "FLT_MAX overflows"},
    {F32, F16, 0x7f800000, 0x7c00, "inf"},
    {F32, F16, 0xff800000, 0xfc00, "-inf"},
    {F32, F16, 0x3f801000, 0x3c00, "1 + 2^-11, a tie, to even (down)"},
    {F32, F16, 0x3f803000, 0x3c02, "1 + 3*2^-11, a tie, to even (up)"},
    {F32, F16, 0x3f801001, 0x3c01, "just over the tie rounds up"},
    {F32, F16, 0x3f800fff, 0x3c00, "just under the tie rounds down"},
    {F32, F16, 0x38800000, 0x0400, "2^-14, the smallest normal half"},
    {F32, F16, 0x387fc000, 0x03ff, "the largest subnormal half"},
    {F32, F16, 0x387fe000, 0x0400, "tie between the largest subnormal and 2^-14: even"},
    {F32, F16, 0x33800000, 0x0001, "2^-24, the smallest subnormal half"},
    {F32, F16, 0xb3800000, 0x8001, "-2^-24"},
    {F32, F16, 0x33000000, 0x0000, "2^-25, the tie above 0, to even: 0"},
    {F32, F16, 0xb3000000, 0x8000, "-2^-25 -> -0"},
    {F32, F16, 0x33000001, 0x0001, "just over 2^-25 rounds up"},
    {F32, F16, 0x32ffffff, 0x0000, "just under 2^-25 rounds down"},
    {F32, F16, 0x33c00000, 0x0002, "1.5 * 2^-24, a tie, to even (up)"},
    {F32, F16, 0x34200000, 0x0002, "2.5 * 2^-24, a tie, to even (down)"},
    {F32, F16, 0x00000001, 0x0000, "a float32 subnormal underflows"},
    {F32, F16, 0x7fc00000, 0x7e00, "quiet NaN"},
    {F32, F16, 0xffc00000, 0xfe00, "negative NaN keeps its sign"},
    {F32, F16, 0x7f800001, 0x7e00, "signalling NaN becomes quiet"},
    {F32, F16, 0xff812345, 0xfe09, "NaN payload: its top 9 bits kept, quiet (torch 2.x)"},
    {F32, F16, 0x7f802000, 0x7e01, "a payload that fits a half is kept"},
    {F32, F16, 0x7fbfffff, 0x7fff, "signalling NaN, every payload bit: quiet, all ones"},
    /* float32 -> bfloat16 */
    {F32, BF16, 0x3f800000, 0x3f80, "1.0"},
    {F32, BF16, 0x80000000, 0x8000, "-0"},
    {F32, BF16, 0x3f808000, 0x3f80, "a tie, to even (down)"},
    {F32, BF16, 0x3f818000, 0x3f82, "a tie, to even (up)"},
    {F32, BF16, 0x3f808001, 0x3f81, "just over the tie"},
    {F32, BF16, 0x3f807fff, 0x3f80, "just under the tie"},
    {F32, BF16, 0x7f7f7fff, 0x7f7f, "just under the top tie: the largest bfloat16"},
    {F32, BF16, 0x7f7f8000, 0x7f80, "the top tie goes to even: inf"},
    {F32, BF16, 0x7f7fffff, 0x7f80, "FLT_MAX rounds to inf"},
    {F32, BF16, 0xff7fffff, 0xff80, "-FLT_MAX rounds to -inf"},
    {F32, BF16, 0x7f800000, 0x7f80, "inf"},
    {F32, BF16, 0x00000001, 0x0000, "the smallest subnormal rounds to 0"},
    {F32, BF16, 0x00008000, 0x0000, "subnormal tie, to even (down)"},
    {F32, BF16, 0x00018000, 0x0002, "subnormal tie, to even (up)"},
    {F32, BF16, 0x007fffff, 0x0080, "the largest subnormal rounds to FLT_MIN"},
    {F32, BF16, 0x7fc00000, 0xffff, "NaN: torch's vectorised kernel gives 0xffff"},
    {F32, BF16, 0xffc00000, 0xffff, "negative NaN"},
    {F32, BF16, 0x7f800001, 0xffff, "signalling NaN"},
    {F32, BF16, 0x7fffffff, 0xffff, "a NaN whose rounding would carry into the sign"},
    /* float64 -> float32 */
    {F64, F32, 0x3ff0000000000000, 0x3f800000, "1.0"},
    {F64, F32, 0x8000000000000000, 0x80000000, "-0"},
    {F64, F32, 0x3fb999999999999a, 0x3dcccccd, "0.1"},
    {F64, F32, 0x3ff0000010000000, 0x3f800000, "1 + 2^-24, a tie, to even (down)"},
    {F64, F32, 0x3ff0000030000000, 0x3f800002, "1 + 3*2^-24, a tie, to even (up)"},
    {F64, F32, 0x3ff0000010000001, 0x3f800001, "just over the tie"},
    {F64, F32, 0x47efffffe0000000, 0x7f7fffff, "FLT_MAX"},
    {F64, F32, 0x47efffffefffffff, 0x7f7fffff, "just under the top tie"},
    {F64, F32, 0x47effffff0000000, 0x7f800000, "the top tie goes to even: inf"},
    {F64, F32, 0x7e37e43c8800759c, 0x7f800000, "1e300 overflows"},
    {F64, F32, 0xfe37e43c8800759c, 0xff800000, "-1e300 overflows"},
    {F64, F32, 0x3810000000000000, 0x00800000, "2^-126, FLT_MIN"},
    {F64, F32, 0x380fffffffffffff, 0x00800000, "just under FLT_MIN rounds up to it"},
    {F64, F32, 0x36a0000000000000, 0x00000001, "2^-149, the smallest subnormal"},
    {F64, F32, 0x3690000000000000, 0x00000000, "2^-150, the tie above 0, to even: 0"},
    {F64, F32, 0xb690000000000000, 0x80000000, "-2^-150 -> -0"},
    {F64, F32, 0x3690000000000001, 0x00000001, "just over 2^-150 rounds up"},
    {F64, F32, 0x36a8000000000000, 0x00000002, "1.5 * 2^-149, a tie, to even (up)"},
    {F64, F32, 0x36b4000000000000, 0x00000002, "2.5 * 2^-149, a tie, to even (down)"},
    {F64, F32, 0x0000000000000001, 0x00000000, "a float64 subnormal underflows"},
    {F64, F32, 0x7ff8000000000000, 0x7fc00000, "quiet NaN"},
    {F64, F32, 0x7ff0000000000001, 0x7fc00000, "signalling NaN, low payload: quiet, payload lost"},
    {F64, F32, 0xfff0000020000000, 0xffc00001, "the top 22 payload bits are kept"},
    {F64, F32, 0x7ff4000000000000, 0x7fe00000, "payload kept, quiet bit set"},
    /* float64 -> float16 / bfloat16: rounded to float32 first */
    {F64, F16, 0x3ff0020000001000, 0x3c00, "1 + 2^-11 + 2^-40: float32 tie, then even: 1.0"},
    {F64, F16, 0x3ff005ffffffe000, 0x3c02, "1 + 3*2^-11 - 2^-39: float32 tie, then even up"},
    {F64, F16, 0x3ff0020020000000, 0x3c01, "1 + 2^-11 + 2^-23 stays over the tie"},
    {F64, F16, 0x40effdffffffff80, 0x7c00, "65520 - 2^-30: float32 65520, then inf"},
    {F64, F16, 0x3e60000000000001, 0x0000, "2^-25 (1 + 2^-52): float32 2^-25, then 0"},
    {F64, F16, 0x7ff0000000000001, 0x7e00, "NaN"},
    {F64, F16, 0xfff8000000000000, 0xfe00, "negative NaN"},
    {F64, F16, 0xfff4000000000000, 0xff00, "NaN payload kept through float32"},
    {F64, BF16, 0x3ff0100000010000, 0x3f80, "1 + 2^-8 + 2^-36: float32 tie, then even: 1.0"},
    {F64, BF16, 0x3ff0100020000000, 0x3f81, "1 + 2^-8 + 2^-23 stays over the tie"},
    {F64, BF16, 0x47efefffffffffff, 0x7f80, "just under the top tie: float32 tie, then inf"},
    {F64, BF16, 0x7ff8000000000000, 0xffff, "NaN, as in torch's vectorised kernel"},
    /* widening */
    {F32, F64, 0x3f800000, 0x3ff0000000000000, "1.0"},
    {F32, F64, 0x80000000, 0x8000000000000000, "-0"},
    {F32, F64, 0xff800000, 0xfff0000000000000, "-inf"},
    {F32, F64, 0x00000001, 0x36a0000000000000, "2^-149"},
    {F32, F64, 0x807fffff, 0xb80fffffc0000000, "the largest subnormal, negative"},
    {F32, F64, 0x00400000, 0x3800000000000000, "2^-127"},
    {F32, F64, 0x7f800001, 0x7ff8000020000000, "signalling NaN: quiet, payload kept"},
    {F32, F64, 0xff812345, 0xfff82468a0000000, "negative NaN with payload"},
    {F16, F32, 0x3c00, 0x3f800000, "1.0"},
    {F16, F32, 0x8000, 0x80000000, "-0"},
    {F16, F32, 0x0001, 0x33800000, "2^-24"},
    {F16, F32, 0x03ff, 0x387fc000, "the largest subnormal half"},
    {F16, F32, 0x7bff, 0x477fe000, "65504"},
    {F16, F32, 0xfc00, 0xff800000, "-inf"},
    {F16, F32, 0x7c01, 0x7fc02000, "signalling NaN: torch quiets it"},
    {F16, F32, 0xfd23, 0xffe46000, "negative NaN with payload"},
    {F16, F64, 0x7c01, 0x7ff8040000000000, "signalling NaN"},
    {F16, F64, 0x0001, 0x3e70000000000000, "2^-24"},
    {BF16, F32, 0x7f81, 0x7f810000, "signalling NaN: torch keeps it as it is"},
    {BF16, F32, 0x0001, 0x00010000, "a subnormal"},
    {BF16, F64, 0x7f81, 0x7ff8200000000000, "signalling NaN, quiet via float32"},
    {BF16, F64, 0x0001, 0x37a0000000000000, "2^-133"},
    /* between the 16-bit types */
    {F16, BF16, 0x7bff, 0x4780, "65504 rounds to 65536"},
    {F16, BF16, 0x3c01, 0x3f80, "1 + 2^-10 rounds to 1"},
    {F16, BF16, 0x0001, 0x3380, "2^-24"},
    {F16, BF16, 0x7e00, 0x7fc0, "NaN: torch's scalar path, 0x7fc0"},
    {F16, BF16, 0xfc01, 0x7fc0, "negative NaN loses its sign"},
    {BF16, F16, 0x4780, 0x7c00, "65536 overflows"},
    {BF16, F16, 0x477f, 0x7bf8, "65280"},
    {BF16, F16, 0x3380, 0x0001, "2^-24"},
    {BF16, F16, 0x3300, 0x0000, "2^-25, a tie, to even: 0"},
    {BF16, F16, 0xb300, 0x8000, "-2^-25 -> -0"},
    {BF16, F16, 0x33c0, 0x0002, "1.5 * 2^-24, a tie, to even (up)"},
    {BF16, F16, 0xff81, 0xfe08, "negative signalling NaN: quiet, payload kept"},
    {BF16, F16, 0x7f81, 0x7e08, "signalling NaN: quiet, payload kept"},
    /* float32 -> float8_e4m3fn: torch 2.x saturates at 448, no infinity */
    {F32, E4, 0x3f800000, 0x38, "1.0"},
    {F32, E4, 0x43e00000, 0x7e, "448, the largest"},
    {F32, E4, 0x43e80000, 0x7e, "464, half way to 480: saturates"},
    {F32, E4, 0x49742400, 0x7e, "1e6 saturates"},
    {F32, E4, 0xff800000, 0xfe, "-inf saturates to -448"},
    {F32, E4, 0x7fc00000, 0x7f, "NaN"},
    {F32, E4, 0xffc00000, 0xff, "negative NaN keeps its sign"},
    {F32, E4, 0x3b000000, 0x01, "2^-9, the smallest subnormal"},
    {F32, E4, 0x3a800000, 0x00, "2^-10, a tie, to even: 0"},
    {F32, E4, 0x3b400000, 0x02, "1.5 * 2^-9, a tie, to even: 2^-8"},
    {F32, E4, 0x3f880000, 0x38, "1 + 2^-4, a tie, to even: 1"},
    {F32, E4, 0x3f980000, 0x3a, "1 + 3 * 2^-4, a tie, to even: 1.25"},
    /* float32 -> float8_e5m2: infinity from 61440 */
    {F32, E5, 0x3f800000, 0x3c, "1.0"},
    {F32, E5, 0x47600000, 0x7b, "57344, the largest"},
    {F32, E5, 0x476fffff, 0x7b, "just under 61440"},
    {F32, E5, 0x47700000, 0x7c, "61440, a tie, to even: inf"},
    {F32, E5, 0x7f800000, 0x7c, "inf"},
    {F32, E5, 0xffc00000, 0xff, "negative NaN"},
    {F32, E5, 0x37800000, 0x01, "2^-16, the smallest subnormal"},
    /* back, exactly */
    {E4, F32, 0x38, 0x3f800000, "1.0"},
    {E4, F32, 0x7e, 0x43e00000, "448"},
    {E4, F32, 0x7f, 0x7ff00000, "NaN, as c10 gives it"},
    {E4, F32, 0x01, 0x3b000000, "2^-9"},
    {E5, F32, 0x7c, 0x7f800000, "inf"},
    {E5, F32, 0x7d, 0x7fe00000, "signalling NaN: quiet"},
    {E4, BF16, 0xff, 0x7fc0, "NaN to bfloat16: torch's scalar NaN"},
    {F64, E4, 0x3ff0000000000001, 0x38, "1 + 2^-52: through float32"},
};

START_TEST(test_rows)
{
    const struct row *r = &rows[_i];
    uint64_t got = cast1(r->from, r->in, r->to);
    ck_assert_msg(got == r->want, "%s -> %s of %#llx (%s): got %#llx, want %#llx",
                  ckpt_dtype_name(r->from), ckpt_dtype_name(r->to), (unsigned long long)r->in,
                  r->what, (unsigned long long)got, (unsigned long long)r->want);
}
END_TEST

START_TEST(test_supported)
{
    ckpt_dtype fl[] = {F64, F32, F16, BF16, E4, E5};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++)
            ck_assert_int_eq(ckpt_cast_supported(fl[i], fl[j]), 1);
    ckpt_dtype other[] = {CKPT_DTYPE_UNKNOWN, CKPT_DTYPE_INT32, CKPT_DTYPE_UINT8,
                          CKPT_DTYPE_BOOL, CKPT_DTYPE_COMPLEX64, CKPT_DTYPE_FLOAT8_E4M3FNUZ,
                          CKPT_DTYPE_FLOAT8_E8M0FNU, CKPT_DTYPE_COUNT_};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        ck_assert_int_eq(ckpt_cast_supported(other[i], F32), 0);
        ck_assert_int_eq(ckpt_cast_supported(F32, other[i]), 0);
    }
    /* a pair it rejects leaves DST alone */
    uint8_t src[4] = {1, 2, 3, 4}, dst[4] = {9, 9, 9, 9};
    ckpt_cast(CKPT_DTYPE_INT32, src, F32, dst, 1);
    ck_assert_int_eq(dst[0], 9);
    ck_assert_int_eq(dst[3], 9);
}
END_TEST

/* Same dtype copies, and arrays need no alignment. */
START_TEST(test_copy_and_unaligned)
{
    uint8_t src[1 + 3 * 4], dst[1 + 3 * 8];
    uint32_t in[3] = {0x3f800000, 0x7f800001, 0x00000001};
    for (int i = 0; i < 3; i++)
        put(src + 1 + 4 * i, 4, in[i]);
    ckpt_cast(F32, src + 1, F32, dst + 1, 3);
    ck_assert_int_eq(memcmp(src + 1, dst + 1, 12), 0);
    ckpt_cast(F32, src + 1, F64, dst + 1, 3);
    ck_assert_uint_eq(get(dst + 1, 8), 0x3ff0000000000000);
    ck_assert_uint_eq(get(dst + 9, 8), 0x7ff8000020000000);
    ck_assert_uint_eq(get(dst + 17, 8), 0x36a0000000000000);
    ckpt_cast(F32, NULL, F16, NULL, 0); /* nothing to do */
}
END_TEST

/* Every float16 and bfloat16 survives a trip through the wider types;
 * NaNs come back quiet with their payload (float16) or as torch's NaN
 * (bfloat16). */
START_TEST(test_round_trips)
{
    static uint8_t a[65536 * 2], w[65536 * 8], b[65536 * 2];
    for (uint32_t i = 0; i < 65536; i++)
        put(a + 2 * i, 2, i);
    ckpt_dtype wide[] = {F32, F64};
    for (int k = 0; k < 2; k++) {
        ckpt_cast(F16, a, wide[k], w, 65536);
        ckpt_cast(wide[k], w, F16, b, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            uint64_t want = (i & 0x7fff) > 0x7c00 ? i | 0x0200 : i;
            ck_assert_uint_eq(get(b + 2 * i, 2), want);
        }
        ckpt_cast(BF16, a, wide[k], w, 65536);
        ckpt_cast(wide[k], w, BF16, b, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            uint64_t want = (i & 0x7fff) > 0x7f80 ? 0xffff : i;
            ck_assert_uint_eq(get(b + 2 * i, 2), want);
        }
    }
}
END_TEST

/* float64 -> float32 and float32 -> float64 agree with the C conversions
 * (round to nearest, the default mode) on non-NaN values. */
START_TEST(test_matches_c)
{
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        /* mostly exponents near float32's range, so rounding happens */
        uint64_t bits = i & 1 ? x : (x & 0x800fffffffffffffu) | ((uint64_t)(1023 - 160 + x % 300) << 52);
        double d;
        memcpy(&d, &bits, sizeof(d));
        if (isnan(d))
            continue;
        float f = (float)d;
        uint32_t fb;
        memcpy(&fb, &f, sizeof(fb));
        ck_assert_uint_eq(cast1(F64, bits, F32), fb);
        double back = (double)f;
        uint64_t bb;
        memcpy(&bb, &back, sizeof(bb));
        ck_assert_uint_eq(cast1(F32, fb, F64), bb);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cast");
    TCase *tc = tcase_create("cast");
    tcase_add_loop_test(tc, test_rows, 0, (int)(sizeof(rows) / sizeof(rows[0])));
    tcase_add_test(tc, test_supported);
    tcase_add_test(tc, test_copy_and_unaligned);
    tcase_add_test(tc, test_round_trips);
    tcase_add_test(tc, test_matches_c);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
