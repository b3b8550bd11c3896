/*
 * core/core.h - what every layer of libckpt uses: errors, the arena, overflow-
 * checked sizes, and element conversions between dtypes (core/element.c).
 * Nothing here is installed or visible to users of lib/ckpt.h.
 */
#ifndef CKPT_CORE_H
#define CKPT_CORE_H

#include "config.h"
#include "ckpt.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CKPT_ERRMSG_MAX 512

/* ---- errors -------------------------------------------------------------- */

typedef struct ckpt_error {
    int code;
    char msg[CKPT_ERRMSG_MAX];
} ckpt_error;

/* Set the error once: the first (innermost) cause wins.  Returns CODE. */
int ckpt_err(ckpt_error *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ckpt_err_clear(ckpt_error *e);

#define CKPT_RETURN_IF(cond, e, code, ...)        \
    do {                                          \
        if (cond)                                 \
            return ckpt_err((e), (code), __VA_ARGS__); \
    } while (0)

#define CKPT_FORWARD(expr)        \
    do {                          \
        int rc_fwd_ = (expr);     \
        if (rc_fwd_ < 0)          \
            return rc_fwd_;       \
    } while (0)

/* ---- arena: every object of a parsed file lives here --------------------- */

typedef struct ckpt_arena_block ckpt_arena_block;
typedef struct ckpt_arena {
    ckpt_arena_block *head;
    size_t used_total;
} ckpt_arena;

void ckpt_arena_init(ckpt_arena *a);
void ckpt_arena_release(ckpt_arena *a);
/* Zeroed, 16-byte aligned; NULL when out of memory. */
void *ckpt_arena_alloc(ckpt_arena *a, size_t n);
char *ckpt_arena_strndup(ckpt_arena *a, const char *s, size_t n);

/* Overflow-checked size arithmetic. */
static inline bool ckpt_mul_overflow(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}
static inline bool ckpt_add_overflow(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}

/* ---- element conversions (core/element.c) ----------------------------------- */

/* How the elements of a dtype are compared. */
typedef enum ckpt_element_class {
    CKPT_ELEM_FLOAT,    /* converted to double exactly */
    CKPT_ELEM_SIGNED,   /* integers: exact, through int64 */
    CKPT_ELEM_UNSIGNED, /* uint8..uint64 and bool (0/1) */
    CKPT_ELEM_RAW       /* complex, quantized, bits, unknown: bytes */
} ckpt_element_class;

ckpt_element_class ckpt_element_class_of(ckpt_dtype dt);

/* Convert IEEE half / bfloat16 bits to float exactly. */
float ckpt_half_to_float(uint16_t h);
float ckpt_bfloat16_to_float(uint16_t b);
/* N elements of DT at P as doubles (float16, bfloat16, float8 exactly);
 * false (and NaNs) for dtypes without an order: complex, quantized, bits. */
bool ckpt_dtype_to_double(ckpt_dtype dt, const uint8_t *p, size_t n, double *out);
/* 1 for the dtypes ckpt_dtype_to_double() converts: floating and integer. */
bool ckpt_dtype_is_real(ckpt_dtype dt);
/* N elements of an integer dtype at P as 128-bit integers (zeros otherwise). */
void ckpt_dtype_to_int128(ckpt_dtype dt, const uint8_t *p, size_t n, __int128 *out);

/* The bytes of NUMEL elements of D in *NBYTES: 0, -1 when the bit count
 * overflows 64 bits, 1 when it is not whole bytes (packed float6). */
int ckpt_dtype_nbytes(ckpt_dtype d, uint64_t numel, uint64_t *nbytes);

/* Reverse the byte order of N elements of DT at P in place (a big-endian
 * file's values to this machine's order, or back): each half of a complex
 * value on its own, as torch's byteswap; nothing for 1-byte and packed types. */
void ckpt_dtype_byteswap(ckpt_dtype dt, void *p, size_t n);
/* The size of the units ckpt_dtype_byteswap() reverses (1: none). */
size_t ckpt_dtype_swap_unit(ckpt_dtype dt);

/* 1 when FROM -> TO is a cast this module does: both of float64, float32, float16,
 * bfloat16, float8_e4m3fn, float8_e5m2 */
int ckpt_cast_supported(ckpt_dtype from, ckpt_dtype to);

/*
 * Convert N elements (little-endian bytes) from FROM at SRC to TO at DST;
 * SRC and DST don't overlap.  FROM == TO copies.  Does nothing for a pair
 * ckpt_cast_supported() rejects.  No alignment is needed.
 */
void ckpt_cast(ckpt_dtype from, const void *src, ckpt_dtype to, void *dst, size_t n);

#endif /* CKPT_CORE_H */
