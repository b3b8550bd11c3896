/*
 * core/core.h - what every layer of libckpt uses: errors, the arena, overflow-
 * checked sizes, growable arrays (core/array.c), the hash map (core/map.c),
 * and element conversions between dtypes (core/element.c).
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
/* The error of a failed allocation: CKPT_ERR_NOMEM, "out of memory" (the
 * text users and tests see); returns CKPT_ERR_NOMEM. */
int ckpt_oom(ckpt_error *e);
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
/* Zeroed, 8-byte aligned; NULL when out of memory. */
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

/* ---- growable arrays (core/array.c) ----------------------------------------- */

/* The capacity that holds NEED items of SIZE bytes, grown from CAP by
 * doubling (8 at least); CAP when it already does; 0 when the bytes would
 * overflow size_t. */
size_t ckpt_grow_cap(size_t cap, size_t need, size_t size);
/* Room for NEED items in the malloc'd array *ARRAYP (a T **) of capacity
 * *CAP items of SIZE bytes: 0, or -1 when out of memory or the size
 * overflows (the array and *CAP unchanged). */
int ckpt_grow(void *arrayp, size_t *cap, size_t need, size_t size);
/* ckpt_grow for an array ARR (a T *) and its capacity CAP (a size_t):
 *     if (CKPT_GROW(list->items, list->cap, list->len + 1) < 0)
 *         return ckpt_oom(err);
 *     list->items[list->len++] = item; */
#define CKPT_GROW(arr, cap, need) ckpt_grow(&(arr), &(cap), (need), sizeof *(arr))

/* ---- hash map (core/map.c) --------------------------------------------------- */

/* FNV-1a, 64 bits: the hash of N bytes at P, or H continued over them. */
#define CKPT_FNV1A_BASIS 14695981039346656037ull
uint64_t ckpt_fnv1a(const void *p, size_t n);
uint64_t ckpt_fnv1a_add(uint64_t h, const void *p, size_t n);

/* What a map's keys are; fixed when it is made. */
typedef enum ckpt_map_keys {
    CKPT_MAP_BYTES,        /* N bytes at P, borrowed: they must outlive the map */
    CKPT_MAP_BYTES_NOCASE, /* the same, ASCII letters compared without case */
    CKPT_MAP_U64,          /* 64-bit integers (indices, pointers as uintptr_t) */
    CKPT_MAP_HASHED        /* anything: the caller hashes, and compares in SAME */
} ckpt_map_keys;

/*
 * A key -> value (size_t, below SIZE_MAX) hash map: expected O(1) get and
 * put, growth by doubling (at most half full), overflow-checked sizes.  No
 * removal, no iteration: keep the entries in an array, in the order they
 * must be shown, and map their keys to their indices.
 *     ckpt_map m;
 *     ckpt_map_init(&m, CKPT_MAP_BYTES);
 *     if (ckpt_map_put(&m, name, strlen(name), i, &first) == 1)   ... a repeat of FIRST
 *     if (ckpt_map_get(&m, name, strlen(name), &i))                ... found: I
 *     ckpt_map_release(&m);
 * put adds KEY -> VAL when KEY is absent (0) and otherwise leaves the map as
 * it is, giving KEY's value in *FOUND (when FOUND is not NULL) (1); set adds
 * or replaces (0 added, 1 replaced).  Both return -1 when out of memory (or
 * VAL is SIZE_MAX), the map unchanged.  get: true when KEY is there, its
 * value in *VAL (when VAL is not NULL).  A zeroed ckpt_map (a struct from
 * calloc) is an empty BYTES map.
 */
typedef struct ckpt_map {
    ckpt_map_keys keys;
    size_t count;                /* entries */
    size_t cap;                  /* slots: 0 or a power of two */
    struct ckpt_map_slot *slots;
    struct ckpt_map_key *names;  /* BYTES maps: the key of each slot */
} ckpt_map;

void ckpt_map_init(ckpt_map *m, ckpt_map_keys keys);
/* Frees what M holds; M is an empty map of the same keys again. */
void ckpt_map_release(ckpt_map *m);
/* Room for N entries without growing: 0, or -1 when out of memory. */
int ckpt_map_reserve(ckpt_map *m, size_t n);

bool ckpt_map_get(const ckpt_map *m, const void *key, size_t len, size_t *val);
int ckpt_map_put(ckpt_map *m, const void *key, size_t len, size_t val, size_t *found);
int ckpt_map_set(ckpt_map *m, const void *key, size_t len, size_t val);

bool ckpt_map_get_u64(const ckpt_map *m, uint64_t key, size_t *val);
int ckpt_map_put_u64(ckpt_map *m, uint64_t key, size_t val, size_t *found);
int ckpt_map_set_u64(ckpt_map *m, uint64_t key, size_t val);

/* HASHED maps: HASH is the key's (equal keys hash alike); SAME(ARG, v) says
 * whether the key looked up, which ARG describes, is the key stored with
 * value v. */
bool ckpt_map_get_hashed(const ckpt_map *m, uint64_t hash,
                         bool (*same)(const void *arg, size_t val), const void *arg,
                         size_t *val);
int ckpt_map_put_hashed(ckpt_map *m, uint64_t hash, bool (*same)(const void *arg, size_t val),
                        const void *arg, size_t val, size_t *found);

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
