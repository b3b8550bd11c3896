/* runtime/runtime.h - the model runtime's internals, shared by model.c (the
 * model object), spec.c (parse), shape.c (shape rules and the shape pass),
 * bind.c (strict load), run.c (executor), replicas.c (DataParallel) and
 * verify.c (ckpt verify's engine).  Calls go one way, never back: replicas
 * -> run -> shape -> model -> backend.c (the backend object,
 * runtime/backend.h); spec -> model; bind -> shape, model; verify -> bind,
 * run, replicas through ckpt.h. */
#ifndef CKPT_RUNTIME_PRIVATE_H
#define CKPT_RUNTIME_PRIVATE_H

#include "ckpt.h"
#include "runtime/backend.h"

typedef enum rt_op {
    RT_LINEAR, RT_CONV2D, RT_CONV_TRANSPOSE2D, RT_MAX_POOL2D, RT_RELU, RT_SIGMOID,
    RT_SOFTMAX, RT_FLATTEN, RT_RESHAPE, RT_PERMUTE, RT_CAT, RT_L2NORM, RT_PRIOR_BOX,
    RT_BATCH_NORM, RT_ADD, RT_ADAPTIVE_AVG_POOL2D, RT_DROPOUT, RT_SQUEEZE, RT_UNSQUEEZE,
    RT_LSTM,
    /* the transformer ops (doc/design.md, "Model specs") */
    RT_UNARY,        /* kind: a ckpt_unary_kind, scalar its number */
    RT_BINARY,       /* sub, mul, div of two inputs, broadcasting (add is RT_ADD) */
    RT_TRANSPOSE, RT_SLICE, RT_SELECT, RT_EXPAND,
    RT_IDENTITY,     /* contiguous, clone, alias: a view */
    RT_REDUCE,       /* mean, sum; kind a ckpt_reduce_kind */
    RT_LAYER_NORM, RT_RMS_NORM, RT_EMBEDDING,
    RT_MATMUL,       /* matmul, bmm */
    RT_ADDMM,        /* GPT-2's Conv1D: x @ W[in, out] + bias */
    RT_SDPA,         /* scaled_dot_product_attention */
    RT_PARAMETER,    /* a parameter (or buffer) used as a value */
    RT_CONSTANT      /* values computed when the spec was made */
} rt_op;

#define RT_PRIOR_MAX_MAPS 16
#define RT_PRIOR_MAX_RATIOS 8

/* SSD's default boxes (ssd.pytorch's PriorBox), computed in double as
 * Python does, then rounded to float32. */
typedef struct rt_prior {
    int nmaps;
    double image_size;
    int64_t feature_maps[RT_PRIOR_MAX_MAPS];
    double steps[RT_PRIOR_MAX_MAPS], min_sizes[RT_PRIOR_MAX_MAPS], max_sizes[RT_PRIOR_MAX_MAPS];
    int nratios[RT_PRIOR_MAX_MAPS];
    double ratios[RT_PRIOR_MAX_MAPS][RT_PRIOR_MAX_RATIOS];
    int clip;
    float *boxes;   /* [count, 4], computed on first use and kept */
} rt_prior;

/* Parameter slots of a node, in torch's state-dict order (BatchNorm's
 * weight, bias, running_mean, running_var, num_batches_tracked). */
enum { RT_P_WEIGHT, RT_P_BIAS, RT_P_MEAN, RT_P_VAR, RT_P_NBT, RT_P_COUNT };

#define RT_MAX_DEVICES 16

typedef struct rt_shape {
    int ndim;
    int64_t d[CKPT_MAX_DIMS];
} rt_shape;

typedef struct rt_node {
    rt_op op;
    const char *opname;          /* as written in the spec */
    size_t index;                /* position in "nodes", for messages */
    int ninputs;
    int *inputs;                 /* value ids */
    int output;                  /* value id */
    int param[RT_P_COUNT];       /* model parameter index, or -1 */
    /* attributes (torch's names and defaults) */
    int64_t stride[2], padding[2], dilation[2], output_padding[2], kernel[2];
    int has_kernel, ceil_mode;
    int64_t dim, start_dim, end_dim;
    int nlist;                   /* reshape "shape" / permute "dims" / expand "size" /
                                  * mean, sum "dim" / the norms' "normalized_shape" /
                                  * constant "shape" */
    int64_t list[CKPT_MAX_DIMS];
    double eps;                  /* l2norm, batch_norm, layer_norm, rms_norm */
    int kind;                    /* unary, binary, reduce: the backend's kind */
    double scalar;               /* unary's number; sdpa's scale when has_scalar */
    int has_scalar;
    int64_t dim0, dim1;          /* transpose */
    int64_t start, end, step;    /* slice (end clamped later, as Python does) */
    int64_t sel_index;           /* select */
    int keepdim, all_dims;       /* mean, sum (all_dims: no "dim" given) */
    int causal, gqa;             /* scaled_dot_product_attention */
    float *values;               /* constant: its values (owned), numel of list */
    int64_t out_size[2];         /* adaptive_avg_pool2d */
    rt_prior *prior;             /* prior_box (owned) */
    /* lstm: nn.LSTM's attributes, and its parameters found by torch's names
     * under the spec's "module" prefix, in torch's order: per layer, per
     * direction (forward, then _reverse), weight_ih, weight_hh, then
     * bias_ih, bias_hh when it has biases.  param[RT_P_WEIGHT] is
     * weight_ih_l0 too: it sizes the hidden state when the spec does not. */
    int64_t num_layers, hidden_size;
    int bidirectional, has_bias;
    int nlstm;
    int *lstm_param;             /* nlstm model parameter indexes (owned) */
} rt_node;

typedef struct rt_param {
    char *key;
    rt_shape shape;              /* as bound */
    float *host;                 /* float32 copy, NULL until bound */
    int tie;                     /* 1 + the parameter this key is tied to ("tied"), 0: none */
    int tied_in;                 /* the last bind took it from its tie: the file lacks it */
} rt_param;

struct ckpt_model {
    int err_code;
    char err[512];
    char *path, *name, *klass, *description;

    size_t ninputs;
    rt_shape *input_shapes;      /* -1 marks the batch dimension */
    unsigned char *input_int;    /* "dtype" int64/int32: integers carried as float32 */
    int64_t *input_high;         /* "high" of an integer input, 0 when not given */
    size_t nvalues;              /* inputs are values 0..ninputs-1 */
    char **value_names;
    size_t nnodes;
    rt_node *nodes;
    size_t noutputs;
    int *outputs;                /* value ids */
    size_t nparams;
    rt_param *params;

    /* binding */
    int bound;
    char **report_strings;       /* owned strings the last report points to */
    size_t nreport_strings;
    const char **missing, **unexpected, **bad_dtype;
    ckpt_size_mismatch *mismatches;
    char *message;

    /* parameters uploaded to backends (one per GPU for DataParallel's replay) */
    struct rt_device {
        ckpt_backend *backend;
        float **params;
    } dev[RT_MAX_DEVICES];
    size_t ndev;
    /* run.c's plan of the last run (shapes, fusions, lifetimes), kept for
     * the next run with the same input shapes: one allocation, free()d
     * with the devices */
    void *plan;
};

/* ---- model.c: the model object ------------------------------------------ */

/* Set the model's error; returns CODE. */
int ckpt_model_fail(ckpt_model *m, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* "node 3 (linear -> h1)" into BUF. */
const char *rt_node_label(const ckpt_model *m, const rt_node *n, char *buf, size_t cap);

/* Free everything the model holds and zero it (an empty model again). */
void rt_model_clear(ckpt_model *m);

/* Free what the last strict load's report points to. */
void rt_model_clear_report(ckpt_model *m);

/* Drop the parameters uploaded to one backend (D, one of m->dev) and the
 * reference to it; all of them (before a rebind or free). */
void rt_device_release(ckpt_model *m, struct rt_device *d);
void rt_model_release_device(ckpt_model *m);

/* Integer inputs hold ids below this (float32 carries them exactly below
 * 2^24). */
#define RT_MAX_ID (INT64_C(1) << 24)

/* Random ids for integer input I are drawn from [0, high): its "high", else
 * the vocabulary of the first embedding reading it, directly or through ops
 * that only move values (the bound weight's rows); 0 when neither says. */
int64_t rt_input_high(const ckpt_model *m, size_t i);

/* ---- shape.c: shape rules -------------------------------------------------- */

/*
 * The shape rule of node N.  IN holds its inputs' shapes; W the weight's
 * shape as given (NULL when the node has none or it is missing).  Writes
 * the output shape and, for each parameter slot, the shape the model
 * expects in EXPECT[RT_P_COUNT] (channel counts taken from W where the
 * graph leaves them free; the other slots follow from them, so they play
 * no part as given).  Returns 0, 1 when the output cannot be known (a
 * missing weight that sizes it), or -1 with a message in ERR when the
 * inputs do not fit the node.
 */
int rt_shape_infer(const rt_node *n, const rt_shape *const *in, const rt_shape *w,
                   rt_shape *out, rt_shape *expect, char *err, size_t cap);

/*
 * The shape pass: every node's rule in spec order.  SHAPE (nvalues entries)
 * holds the inputs' shapes and gets every node's output shape.  PARAM[i] is
 * parameter i's shape as given (NULL: missing); PARAM NULL: the model's
 * bound parameters.
 *   KNOWN NULL (the executor): every value must be sized, and a weight must
 *     fit what its input implies.
 *   KNOWN (nvalues entries, the caller marks the inputs; the strict load):
 *     a missing weight leaves its node's output unknown, and a node with
 *     an unknown input is skipped (its output stays unknown).  EXPECT[i]
 *     gets the shape the graph implies for parameter i, and FIXED[i] is
 *     set, the first time a node whose output is known uses it (EXPECT and
 *     FIXED may both be NULL).
 * Returns CKPT_OK, CKPT_ERR_NOMEM, or CKPT_ERR_USAGE with "node 3 (...):
 * why" in ERR (CAP bytes) for the first node the shapes do not fit.
 */
int rt_graph_shapes(const ckpt_model *m, const rt_shape *const *param, rt_shape *shape,
                    unsigned char *known, rt_shape *expect, unsigned char *fixed, char *err,
                    size_t cap);

int64_t rt_shape_numel(const rt_shape *s);
int rt_shape_equal(const rt_shape *a, const rt_shape *b);
/* "[2, 3]" */
const char *rt_shape_format(const rt_shape *s, char *buf, size_t cap);

/* torch's broadcasting of A and B into OUT: 0, or -1 when they do not
 * broadcast; the strides (elements, 0 where broadcast) with which a value of
 * shape S is read over OUT. */
int rt_broadcast(const rt_shape *a, const rt_shape *b, rt_shape *out);
void rt_broadcast_strides(const rt_shape *s, const rt_shape *out, int64_t *strides);
/* slice node N over a dimension of SIZE: its first index and length. */
void rt_slice_bounds(const rt_node *n, int64_t size, int64_t *start, int64_t *len);
/* The dimensions of X mean/sum node N reduces, as a bit mask; -1 when its
 * "dim" does not fit X. */
int rt_reduce_mask(const rt_node *n, const rt_shape *x, unsigned *mask);

/* Geometry of conv / pool nodes for the backend, from an input shape. */
void rt_conv_geom(const rt_node *n, const rt_shape *x, const rt_shape *w, const rt_shape *y,
                  ckpt_conv_geom *g);
void rt_pool_geom(const rt_node *n, const rt_shape *x, const rt_shape *y, ckpt_pool_geom *g);

/* The shape lstm node N expects of its parameter K (an index into
 * N->lstm_param) for an input X and hidden size H. */
void rt_lstm_expect(const rt_node *n, int k, const rt_shape *x, int64_t h, rt_shape *out);
/* Parameters per (layer, direction) of lstm node N: 4 with biases, else 2. */
int rt_lstm_per_dir(const rt_node *n);

/* Number of boxes prior_box makes; fills BOXES ([count, 4]) when not NULL. */
int64_t rt_prior_boxes(const rt_prior *p, float *boxes);

/* ---- run.c: the executor ------------------------------------------------- */

/* Check INPUTS against the spec's inputs and copy their shapes into
 * SHAPE[0 .. ninputs); then size every value (SHAPE has nvalues entries;
 * the shape pass with the bound parameters).  Errors (CKPT_ERR_USAGE) are
 * in the model's handle. */
int rt_check_inputs(ckpt_model *m, const ckpt_array *inputs, rt_shape *shape);
int rt_model_shapes(ckpt_model *m, rt_shape *shape);

/* ---- verify (verify.c), for its JUnit report (verify_junit.c) ---- */

/* SIDE's file path once its state dict was loaded (or its load failed:
 * the report says so), else NULL. */
const char *rt_verify_loaded(const ckpt_verify *v, ckpt_verify_side side);
/* Keep CODE and MSG as V's error about PATH (borrowed), unless one is kept. */
int rt_verify_fail(ckpt_verify *v, int code, const char *path, const char *msg);

#endif
