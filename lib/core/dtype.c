/* dtype.c - torch dtypes: names and element sizes (doc/pth-format.md 3.2). */
#include "core/core.h"

#include <string.h>

static const struct {
    const char *name;
    unsigned bits; /* a multiple of 8 but for the packed float6 types */
    bool floating;
} dtypes[CKPT_DTYPE_COUNT_] = {
    [CKPT_DTYPE_UNKNOWN] = {"unknown", 0, false},
    [CKPT_DTYPE_FLOAT64] = {"float64", 64, true},
    [CKPT_DTYPE_FLOAT32] = {"float32", 32, true},
    [CKPT_DTYPE_FLOAT16] = {"float16", 16, true},
    [CKPT_DTYPE_BFLOAT16] = {"bfloat16", 16, true},
    [CKPT_DTYPE_INT64] = {"int64", 64, false},
    [CKPT_DTYPE_INT32] = {"int32", 32, false},
    [CKPT_DTYPE_INT16] = {"int16", 16, false},
    [CKPT_DTYPE_INT8] = {"int8", 8, false},
    [CKPT_DTYPE_UINT8] = {"uint8", 8, false},
    [CKPT_DTYPE_BOOL] = {"bool", 8, false},
    [CKPT_DTYPE_COMPLEX128] = {"complex128", 128, false},
    [CKPT_DTYPE_COMPLEX64] = {"complex64", 64, false},
    [CKPT_DTYPE_COMPLEX32] = {"complex32", 32, false},
    [CKPT_DTYPE_QINT8] = {"qint8", 8, false},
    [CKPT_DTYPE_QUINT8] = {"quint8", 8, false},
    [CKPT_DTYPE_QINT32] = {"qint32", 32, false},
    [CKPT_DTYPE_QUINT4X2] = {"quint4x2", 8, false},
    [CKPT_DTYPE_QUINT2X4] = {"quint2x4", 8, false},
    [CKPT_DTYPE_FLOAT8_E5M2] = {"float8_e5m2", 8, true},
    [CKPT_DTYPE_FLOAT8_E4M3FN] = {"float8_e4m3fn", 8, true},
    [CKPT_DTYPE_FLOAT8_E5M2FNUZ] = {"float8_e5m2fnuz", 8, true},
    [CKPT_DTYPE_FLOAT8_E4M3FNUZ] = {"float8_e4m3fnuz", 8, true},
    [CKPT_DTYPE_FLOAT8_E8M0FNU] = {"float8_e8m0fnu", 8, true},
    [CKPT_DTYPE_UINT16] = {"uint16", 16, false},
    [CKPT_DTYPE_UINT32] = {"uint32", 32, false},
    [CKPT_DTYPE_UINT64] = {"uint64", 64, false},
    [CKPT_DTYPE_BITS8] = {"bits8", 8, false},
    [CKPT_DTYPE_BITS16] = {"bits16", 16, false},
    [CKPT_DTYPE_BITS1X8] = {"bits1x8", 8, false},
    [CKPT_DTYPE_BITS2X4] = {"bits2x4", 8, false},
    [CKPT_DTYPE_BITS4X2] = {"bits4x2", 8, false},
    [CKPT_DTYPE_FLOAT4_E2M1FN_X2] = {"float4_e2m1fn_x2", 8, false},
    [CKPT_DTYPE_BCOMPLEX32] = {"bcomplex32", 32, false},
    /* no torch dtype: ml_dtypes' names; raw bits to ckpt, as float4 is */
    [CKPT_DTYPE_FLOAT6_E2M3FN] = {"float6_e2m3fn", 6, false},
    [CKPT_DTYPE_FLOAT6_E3M2FN] = {"float6_e3m2fn", 6, false},
};

/* Aliases torch accepts as attribute names of the torch module. */
static const struct {
    const char *alias;
    ckpt_dtype dtype;
} aliases[] = {
    {"double", CKPT_DTYPE_FLOAT64}, {"float", CKPT_DTYPE_FLOAT32},
    {"half", CKPT_DTYPE_FLOAT16},   {"long", CKPT_DTYPE_INT64},
    {"int", CKPT_DTYPE_INT32},      {"short", CKPT_DTYPE_INT16},
    {"cdouble", CKPT_DTYPE_COMPLEX128}, {"cfloat", CKPT_DTYPE_COMPLEX64},
    {"chalf", CKPT_DTYPE_COMPLEX32},
};

CKPT_API const char *ckpt_dtype_name(ckpt_dtype d)
{
    if ((unsigned)d >= CKPT_DTYPE_COUNT_)
        return "unknown";
    return dtypes[d].name;
}

CKPT_API size_t ckpt_dtype_size(ckpt_dtype d)
{
    if ((unsigned)d >= CKPT_DTYPE_COUNT_)
        return 0;
    return dtypes[d].bits % 8 ? 0 : dtypes[d].bits / 8;
}

CKPT_API unsigned ckpt_dtype_bits(ckpt_dtype d)
{
    if ((unsigned)d >= CKPT_DTYPE_COUNT_)
        return 0;
    return dtypes[d].bits;
}

int ckpt_dtype_nbytes(ckpt_dtype d, uint64_t numel, uint64_t *nbytes)
{
    size_t es = ckpt_dtype_size(d);
    uint64_t bits;
    if (es || ckpt_dtype_bits(d) == 0) /* whole bytes: no factor of 8 to overflow on */
        return ckpt_mul_overflow(numel, es, nbytes) ? -1 : 0;
    if (ckpt_mul_overflow(numel, ckpt_dtype_bits(d), &bits))
        return -1;
    *nbytes = bits / 8;
    return bits % 8 ? 1 : 0;
}

CKPT_API int ckpt_dtype_is_floating(ckpt_dtype d)
{
    if ((unsigned)d >= CKPT_DTYPE_COUNT_)
        return 0;
    return dtypes[d].floating;
}

CKPT_API ckpt_dtype ckpt_dtype_from_name(const char *name)
{
    if (!name)
        return CKPT_DTYPE_UNKNOWN;
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (int d = 1; d < CKPT_DTYPE_COUNT_; d++)
        if (strcmp(name, dtypes[d].name) == 0)
            return (ckpt_dtype)d;
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(name, aliases[i].alias) == 0)
            return aliases[i].dtype;
    return CKPT_DTYPE_UNKNOWN;
}

size_t ckpt_dtype_swap_unit(ckpt_dtype dt)
{
    size_t bits = ckpt_dtype_bits(dt);
    bool complex = dt == CKPT_DTYPE_COMPLEX128 || dt == CKPT_DTYPE_COMPLEX64 ||
                   dt == CKPT_DTYPE_COMPLEX32 || dt == CKPT_DTYPE_BCOMPLEX32;
    if (bits % 8 || bits <= 8)
        return 1;
    return complex ? bits / 16 : bits / 8;
}

void ckpt_dtype_byteswap(ckpt_dtype dt, void *p, size_t n)
{
    size_t u = ckpt_dtype_swap_unit(dt), units = n * (ckpt_dtype_bits(dt) / 8) / (u ? u : 1);
    uint8_t *b = p;
    for (size_t i = 0; u > 1 && i < units; i++, b += u)
        for (size_t j = 0; j < u / 2; j++) {
            uint8_t t = b[j];
            b[j] = b[u - 1 - j];
            b[u - 1 - j] = t;
        }
}
