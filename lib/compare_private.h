/*
 * compare_private.h - comparing the values of two tensors (lib/compare.c).
 *
 * For now a header of its own; the declarations below are written as they
 * are to appear in lib/ckpt.h (section "tensors and storages", after
 * ckpt_tensor_stats_compute), and move there unchanged.
 */
#ifndef CKPT_COMPARE_PRIVATE_H
#define CKPT_COMPARE_PRIVATE_H

#include "ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- comparing tensors ---------------------------------------------------- */

typedef struct ckpt_compare_result {
    int64_t count;          /* elements compared (numel when the shapes agree) */
    int64_t mismatched;     /* elements outside atol + rtol * |b| (NaN equals NaN) */
    int64_t first_index;    /* flat C-order index of the first mismatch, -1 if none */
    double max_abs, max_rel;/* over all elements; rel = |a-b| / |b|, 0 when both are 0 */
    double first_a, first_b;/* the values at first_index */
} ckpt_compare_result;

/*
 * Compare the elements of tensor A (of file FA) with those of B (of FB), in
 * C order, as torch.isclose(a, b) does: a pair is equal when |a - b| <=
 * ATOL + RTOL * |b|.  ATOL = RTOL = 0 asks for exact equality; -0.0
 * equals 0.0.  Tolerances must be finite and not negative (else
 * CKPT_ERR_USAGE).
 *
 * Values are compared as doubles: float16 and bfloat16 (and the float8
 * types) exactly, integers exactly up to 2^53; two integer tensors are
 * compared exactly whatever their size (their differences are reported
 * rounded to double).  NaN equals NaN; a NaN against a number is a
 * mismatch, and makes max_abs and max_rel NaN (as the max of torch's
 * (a - b).abs() would be).  An infinity equals only the infinity of the
 * same sign, whatever the tolerance.  rel = |a-b| / |b|, 0 when a equals
 * b, infinite when b is 0 or infinite and a is not equal to it.
 *
 * Complex and quantized tensors (and the bits types) are compared as raw
 * bytes, element by element: both must have the same dtype (else
 * CKPT_ERR_UNSUPPORTED), mismatched counts the elements whose bytes
 * differ, and max_abs, max_rel, first_a and first_b are NaN.  A quantized
 * tensor's scale and zero point are not compared.
 *
 * Both tensors must have the same number of elements (their shapes may
 * differ): else CKPT_ERR_USAGE with the message in FA's handle.  The data
 * is read with ckpt_tensor_read() (so CRCs are checked); a read error is
 * kept in the handle of the file that failed.  Memory: the bytes of the
 * two tensors, plus what ckpt_tensor_read() needs for one storage at a
 * time.  FA and FB may be the same handle.
 */
CKPT_API int ckpt_tensor_compare(ckpt_file *fa, const ckpt_tensor *a, ckpt_file *fb,
                                 const ckpt_tensor *b, double atol, double rtol,
                                 ckpt_compare_result *out);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_COMPARE_PRIVATE_H */
