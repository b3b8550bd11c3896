/*
 * cast_private.h - converting tensor elements between the floating dtypes,
 * with the bits torch's CPU kernels give (lib/cast.c).
 */
#ifndef CKPT_CAST_PRIVATE_H
#define CKPT_CAST_PRIVATE_H

#include "ckpt.h"

#include <stddef.h>

/* 1 when FROM -> TO is a cast this module does: both of float64, float32, float16, bfloat16 */
int ckpt_cast_supported(ckpt_dtype from, ckpt_dtype to);

/*
 * Convert N elements (little-endian bytes) from FROM at SRC to TO at DST;
 * SRC and DST don't overlap.  FROM == TO copies.  Does nothing for a pair
 * ckpt_cast_supported() rejects.  No alignment is needed.
 */
void ckpt_cast(ckpt_dtype from, const void *src, ckpt_dtype to, void *dst, size_t n);

#endif /* CKPT_CAST_PRIVATE_H */
