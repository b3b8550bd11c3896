/*
 * runtime/backend.h - the backend interface: the operations a model-runtime
 * backend provides, and the descriptor each backend registers.  It names no
 * backend: lib/runtime/backends.h and backends.c (the table) do.
 *
 * Private to libckpt: lib/runtime/ (the executor, the chooser, the CPU
 * reference) and kernels/ (the CUDA backend) include it.  Plain C, so nvcc
 * can compile the CUDA side against it.
 *
 * Every tensor is float32, C-contiguous, in a buffer the backend allocated
 * (host memory for the CPU, device memory for CUDA).  Every operation
 * returns CKPT_OK or a negative ckpt_status with a one-line message in
 * b->message; nothing prints, nothing aborts.  Operations may be queued
 * (CUDA streams): download() and synchronize() wait for them.  Output
 * buffers never alias input buffers.  A weight (W of linear, conv2d,
 * conv_transpose2d) is a buffer written by upload() only, never an op's
 * output: a backend may keep a copy of it rearranged for its kernels until
 * the buffer is uploaded to again or released (the CPU backend does).
 */
#ifndef CKPT_RUNTIME_BACKEND_H
#define CKPT_RUNTIME_BACKEND_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_RT_MAX_DIMS 8

typedef struct ckpt_backend ckpt_backend;

/* conv2d and conv_transpose2d, NCHW.  conv2d: w [out_c, in_c, k_h, k_w];
 * conv_transpose2d: w [in_c, out_c, k_h, k_w] (torch's layouts).  The
 * output sizes are computed by the executor from torch's formulas. */
typedef struct ckpt_conv_geom {
    int64_t batch;
    int64_t in_c, in_h, in_w;
    int64_t out_c, out_h, out_w;
    int64_t k_h, k_w;
    int64_t stride_h, stride_w;
    int64_t pad_h, pad_w;
    int64_t dil_h, dil_w;
} ckpt_conv_geom;

/* max_pool2d over planes of [planes = N*C, in_h, in_w]; padding counts as
 * -infinity (never chosen), as torch's does.  A window that lies wholly in
 * the padding cannot occur: the executor's output sizes follow torch's
 * ceil_mode rule that the last window starts inside the input or the left
 * padding. */
typedef struct ckpt_pool_geom {
    int64_t planes;
    int64_t in_h, in_w, out_h, out_w;
    int64_t k_h, k_w;
    int64_t stride_h, stride_w;
    int64_t pad_h, pad_w;
    int64_t dil_h, dil_w;
} ckpt_pool_geom;

/* The element-wise functions of unary(): y = f(x), S the op's number
 * where it has one (torch's spellings in the comments). */
typedef enum ckpt_unary_kind {
    CKPT_U_GELU,       /* F.gelu: x / 2 * (1 + erf(x / sqrt 2)) */
    CKPT_U_GELU_TANH,  /* F.gelu(approximate='tanh'): x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) */
    CKPT_U_SILU,       /* F.silu: x / (1 + exp(-x)) */
    CKPT_U_TANH,
    CKPT_U_COS,
    CKPT_U_SIN,
    CKPT_U_NEG,
    CKPT_U_EXP,
    CKPT_U_SQRT,
    CKPT_U_RSQRT,      /* 1 / sqrt(x) */
    CKPT_U_POW,        /* x ** s */
    CKPT_U_ADD,        /* x + s */
    CKPT_U_SUB,        /* x - s */
    CKPT_U_RSUB,       /* s - x */
    CKPT_U_MUL,        /* x * s */
    CKPT_U_DIV,        /* x / s */
    CKPT_U_COUNT
} ckpt_unary_kind;

/* The activations an op may apply to its output in the same pass
 * (conv_transpose2d_act); each gives the bits its own op gives. */
typedef enum ckpt_act_kind { CKPT_ACT_NONE, CKPT_ACT_RELU, CKPT_ACT_SIGMOID } ckpt_act_kind;

/* The operators of binary(), y = a OP x, with broadcasting. */
typedef enum ckpt_binary_kind {
    CKPT_B_ADD, CKPT_B_SUB, CKPT_B_MUL, CKPT_B_DIV, CKPT_B_COUNT
} ckpt_binary_kind;

/* The reductions of reduce(). */
typedef enum ckpt_reduce_kind { CKPT_R_SUM, CKPT_R_MEAN, CKPT_R_COUNT } ckpt_reduce_kind;

/* scaled_dot_product_attention: q [batch, heads, q_len, head_dim], k
 * [batch, kv_heads, kv_len, head_dim], v [batch, kv_heads, kv_len, v_dim]
 * -> y [batch, heads, q_len, v_dim].  Query head h reads key-value head
 * h / (heads / kv_heads) (grouped-query attention; heads is a multiple of
 * kv_heads).  MASK, when given, is added to the scores: its element for
 * (n, h, i, j) is mask[n * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]]
 * (a stride 0 where torch broadcasts it).  CAUSAL: query i sees keys
 * j <= i only (torch's is_causal, the top-left triangle). */
typedef struct ckpt_attn_geom {
    int64_t batch, heads, kv_heads;
    int64_t q_len, kv_len, head_dim, v_dim;
    double scale;              /* the scores are (q . k) * scale */
    int causal;
    int64_t mask_strides[4];   /* ms above; unused without a mask */
} ckpt_attn_geom;

typedef struct ckpt_backend_ops {
    void (*destroy)(ckpt_backend *b);

    /* Buffers of N floats (N may be 0: any pointer, released as usual). */
    int (*alloc)(ckpt_backend *b, size_t n, float **out);
    void (*release)(ckpt_backend *b, float *p);
    /* host SRC -> backend DST, backend SRC -> host DST; N floats. */
    int (*upload)(ckpt_backend *b, float *dst, const float *src, size_t n);
    int (*download)(ckpt_backend *b, float *dst, const float *src, size_t n);

    /* y[r, o] = sum_i x[r, i] * w[o, i] (+ bias[o]); w is [out, in] as in
     * nn.Linear; BIAS may be NULL. */
    int (*linear)(ckpt_backend *b, const float *x, const float *w, const float *bias,
                  float *y, int64_t rows, int64_t in, int64_t out);
    /* BIAS [out_c] may be NULL. */
    int (*conv2d)(ckpt_backend *b, const float *x, const float *w, const float *bias,
                  float *y, const ckpt_conv_geom *g);
    int (*conv_transpose2d)(ckpt_backend *b, const float *x, const float *w,
                            const float *bias, float *y, const ckpt_conv_geom *g);
    int (*max_pool2d)(ckpt_backend *b, const float *x, float *y, const ckpt_pool_geom *g);
    /* SSD's L2Norm over the channels of NCHW x (C channels, HW pixels per
     * plane): y[n, c, p] = w[c] * x[n, c, p] / (sqrt(sum_c x[n, c, p]^2) + eps). */
    int (*l2norm)(ckpt_backend *b, const float *x, const float *w, float *y, int64_t n,
                  int64_t c, int64_t hw, float eps);
    /* Elementwise over N floats. */
    int (*relu)(ckpt_backend *b, const float *x, float *y, size_t n);
    int (*sigmoid)(ckpt_backend *b, const float *x, float *y, size_t n);
    /* Softmax over the middle axis of x viewed as [outer, dim, inner]
     * (max subtracted first, as torch does). */
    int (*softmax)(ckpt_backend *b, const float *x, float *y, int64_t outer, int64_t dim,
                   int64_t inner);
    /* y = x.permute(perm).contiguous(); SHAPE is x's (NDIM <= CKPT_RT_MAX_DIMS). */
    int (*permute)(ckpt_backend *b, const float *x, float *y, int ndim, const int64_t *shape,
                   const int *perm);
    /* ROWS rows of LEN floats: y[r * y_stride + j] = x[r * x_stride + j]
     * (cat is made of these). */
    int (*copy_rows)(ckpt_backend *b, const float *x, int64_t x_stride, float *y,
                     int64_t y_stride, int64_t rows, int64_t len);
    /* Inference batch norm over x viewed as [outer, c, inner] (NCHW: N, C,
     * H*W): y = (x - mean[c]) / sqrt(var[c] + eps) * w[c] + bias[c], as
     * torch computes it: scale = w / sqrt(var + eps) and shift = bias - mean
     * * scale per channel (float32), then y = x * scale + shift.  W and BIAS
     * may be NULL (affine=False: 1 and 0). */
    int (*batch_norm)(ckpt_backend *b, const float *x, const float *mean, const float *var,
                      const float *w, const float *bias, float *y, int64_t outer, int64_t c,
                      int64_t inner, float eps);
    /* y = a + b over N floats. */
    int (*add)(ckpt_backend *b, const float *a, const float *x, float *y, size_t n);
    /* adaptive_avg_pool2d over G's planes: output cell (i, j) averages input
     * rows floor(i * in_h / out_h) .. ceil((i + 1) * in_h / out_h) - 1 and
     * the columns likewise (torch's bins); the kernel, stride, padding and
     * dilation of G are unused. */
    int (*adaptive_avg_pool2d)(ckpt_backend *b, const float *x, float *y,
                               const ckpt_pool_geom *g);
    /* One time step of an LSTM layer, torch's gate order (i, f, g, o) in
     * rows of 4 * HIDDEN: gates = gx + gh, where GX [batch, 4H] is x W_ih^T
     * + b_ih and GH [batch, 4H] is h W_hh^T + b_hh; at the first step (h and
     * c zero) GH is NULL and BIAS_HH [4H] (NULL: none) stands for it.  Then
     * c = sigmoid(f) * c + sigmoid(i) * tanh(g) (c taken as 0 at the first
     * step) and h = sigmoid(o) * tanh(c), written to C and H ([batch, H])
     * and to Y: y[r * y_stride + j] = h[r, j]. */
    int (*lstm_cell)(ckpt_backend *b, const float *gx, const float *gh, const float *bias_hh,
                     float *c, float *h, float *y, int64_t batch, int64_t hidden,
                     int64_t y_stride);
    /* Wait for queued work; report any error it met. */
    int (*synchronize)(ckpt_backend *b);
    /* Optional (NULL: the executor runs the three ops one by one): conv2d,
     * then y = y + res (RES, of y's shape, NULL: none), then y = relu(y)
     * when RELU -- the values conv2d, add and relu give, in one pass over y.
     * The executor uses it for a conv (its batch norm folded in) whose
     * output only a residual add and/or a ReLU read. */
    int (*conv2d_fused)(ckpt_backend *b, const float *x, const float *w, const float *bias,
                        const float *res, int relu, float *y, const ckpt_conv_geom *g);

    /* ---- the transformer ops (ABI 2) ---- */
    /* y[i] = f(x[i]) over N floats; KIND a ckpt_unary_kind, S its number. */
    int (*unary)(ckpt_backend *b, int kind, const float *x, float *y, size_t n, float s);
    /* y = a OP x (KIND a ckpt_binary_kind) over y's SHAPE (NDIM dims, y
     * contiguous): the element of index (i0 .. in) reads a[sum i_d *
     * a_strides[d]] and x[sum i_d * x_strides[d]], strides in elements, 0
     * where the operand is broadcast. */
    int (*binary)(ckpt_backend *b, int kind, const float *a, const float *x, float *y,
                  int ndim, const int64_t *shape, const int64_t *a_strides,
                  const int64_t *x_strides);
    /* y (contiguous, SHAPE, NDIM dims) [i0 .. in] = x[offset + sum i_d *
     * strides[d]]: expand (stride 0), slice and select (an offset and
     * strides), transpose; strides in elements, never negative. */
    int (*strided_copy)(ckpt_backend *b, const float *x, int64_t offset, float *y, int ndim,
                        const int64_t *shape, const int64_t *strides);
    /* The sum or mean (KIND a ckpt_reduce_kind) over the middle axis of x
     * viewed as [outer, dim, inner] -> y [outer, inner]. */
    int (*reduce)(ckpt_backend *b, int kind, const float *x, float *y, int64_t outer,
                  int64_t dim, int64_t inner);
    /* Over each of ROWS rows of D floats: y = (x - mean) / sqrt(var + eps)
     * * w + bias, var the biased variance (F.layer_norm); W and BIAS may be
     * NULL (1 and 0). */
    int (*layer_norm)(ckpt_backend *b, const float *x, const float *w, const float *bias,
                      float *y, int64_t rows, int64_t d, float eps);
    /* Over each of ROWS rows of D floats: y = x / sqrt(mean(x^2) + eps) * w
     * (F.rms_norm); W may be NULL (1). */
    int (*rms_norm)(ckpt_backend *b, const float *x, const float *w, float *y, int64_t rows,
                    int64_t d, float eps);
    /* y[i, :] = w[ids[i], :] for N ids, w [vocab, d] (F.embedding).  The
     * ids are float32 holding integers (the runtime carries integer inputs
     * so); one that is not an integer in [0, vocab) is CKPT_ERR_USAGE,
     * "token id X is out of range for an embedding of VOCAB rows" (a queued
     * backend may report it at synchronize()). */
    int (*embedding)(ckpt_backend *b, const float *ids, const float *w, float *y, int64_t n,
                     int64_t vocab, int64_t d);
    /* BATCH products y[t] = a[t] @ x[t] (torch.matmul, bmm): a[t] [m, k] at
     * a + t * a_stride, x[t] [k, n] at x + t * x_stride (a stride 0: the
     * same matrix for every t), y[t] [m, n] at y + t * m * n.  Either of A
     * and X may be a weight. */
    int (*matmul)(ckpt_backend *b, const float *a, const float *x, float *y, int64_t batch,
                  int64_t m, int64_t k, int64_t n, int64_t a_stride, int64_t x_stride);
    /* F.scaled_dot_product_attention (ckpt_attn_geom above); MASK may be
     * NULL.  A query row whose every key is masked out gives what torch's
     * CPU kernel gives (see the CPU backend). */
    int (*attention)(ckpt_backend *b, const float *q, const float *k, const float *v,
                     const float *mask, float *y, const ckpt_attn_geom *g);

    /* ---- options (ABI 3) ---- */
    /* Optional (NULL: the backend has none, and every flag changes nothing
     * on it, as TF32 on the CPU): sets FLAGS, CKPT_BACKEND_* of ckpt.h and
     * CKPT_RT_* below, replacing the ones set before, and updates the
     * description.  An unknown flag is CKPT_ERR_USAGE. */
    int (*set_flags)(ckpt_backend *b, unsigned flags);

    /* ---- inputs in place (ABI 4) ---- */
    /* Optional (NULL: the executor uploads a model's inputs): HOST's N
     * floats as the operations may read them without a copy, for the
     * length of one model run (host memory is the CPU's own); NULL: upload
     * them.  The executor never writes through it, nor releases it. */
    const float *(*borrow)(ckpt_backend *b, const float *host, size_t n);
    /* Optional (NULL: the executor runs linear, then relu): y = relu(x
     * w^T + bias), linear's arguments -- the values the two ops give, in
     * one pass over y.  Used for a linear whose output only a relu reads
     * (an MLP's hidden layer). */
    int (*linear_relu)(ckpt_backend *b, const float *x, const float *w, const float *bias,
                       float *y, int64_t rows, int64_t in, int64_t out);
    /* Optional (NULL: the executor runs conv_transpose2d, then the
     * activation): conv_transpose2d, then ACT (a ckpt_act_kind) of each
     * value -- what the two ops give, in the pass that adds the bias.  Used
     * for a transposed conv whose output only a relu or a sigmoid reads (a
     * decoder's layers, its last). */
    int (*conv_transpose2d_act)(ckpt_backend *b, const float *x, const float *w,
                                const float *bias, int act, float *y, const ckpt_conv_geom *g);
} ckpt_backend_ops;

/* set_flags' private flags (above CKPT_BACKEND_*'s): the convolutions on
 * the backend's own kernels, not a vendor library's (CUDA: no cuDNN), so
 * that tests run both paths in one process. */
#define CKPT_RT_NO_CUDNN 0x10000u

struct ckpt_backend {
    const ckpt_backend_ops *ops;
    char device[32];        /* "cpu", "cuda:0" */
    char description[192];  /* "cpu (OpenBLAS 0.3.21, 2 threads)", "cuda:0 (NVIDIA H100 ...)" */
    char message[256];      /* the last error */
    void *impl;             /* the backend's own state */
    int refs;               /* the opener's, plus one per model holding parameters here */
    unsigned flags;         /* CKPT_BACKEND_* in effect (ckpt_backend_open_flags) */
};

/*
 * A backend as the chooser (runtime/choose.c) sees it.  Each backend exports
 * one; runtime/backends.c lists them in one table.  A device is named NAME
 * or, for an indexed backend, NAME:N (NAME alone being NAME:0).
 */
typedef struct ckpt_backend_desc {
    const char *name;   /* the device type: "cpu", "cuda" */
    const char *title;  /* in messages: "CUDA could not be used (...)" */
    int indexed;        /* devices are NAME:N; else NAME alone */
    int fallback;       /* "auto" takes it only when no other backend runs */
    /* Devices usable now; 0, with the reason in WHY (CAP bytes), when none
     * ("no GPU found", "this ckpt was built without CUDA"). */
    int (*probe)(char *why, size_t cap);
    /* Open device INDEX: CKPT_OK, or a negative ckpt_status with a message
     * in ERR (CAP bytes).  NULL: not in this build (probe says so; configure
     * --with-NAME adds it).  Release with ops->destroy / ckpt_backend_free. */
    int (*open)(int index, ckpt_backend **out, char *err, size_t cap);
} ckpt_backend_desc;

/* The table (runtime/backends.c), NULL-terminated, in the order the device
 * names are listed in messages. */
extern const ckpt_backend_desc *const ckpt_backend_table[];

/* printf into b->message; returns STATUS.  Inline, so that a backend below
 * lib/ (kernels/) calls nothing of lib/ to report an error. */
static inline int ckpt_backend_fail(ckpt_backend *b, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline int ckpt_backend_fail(ckpt_backend *b, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->message, sizeof b->message, fmt, ap);
    va_end(ap);
    return status;
}

#ifdef __cplusplus
}
#endif

#endif /* CKPT_RUNTIME_BACKEND_H */
