/*
 * ckpt.h - libckpt, the PyTorch checkpoint library behind the ckpt tool.
 * The whole public API; man 3 libckpt documents it group by group.
 *
 * Reads .pth checkpoints (zip, pre-1.6 legacy and torch 0.1's tar),
 * TorchScript archives, safetensors files, sharded sets (*.index.json) and
 * the folders of torch.distributed.checkpoint and DeepSpeed ZeRO without
 * Python: the pickle inside is parsed by a safe VM that never imports or
 * calls anything.  Edits them (key renames, device remaps, dtype casts),
 * writes them as pth (zip or legacy), safetensors or sharded sets, scans
 * files for what torch.load would import and run, compares two checkpoints,
 * and runs a model spec on a checkpoint's weights (CPU or CUDA) to verify
 * them.
 *
 * Errors.  Functions that can fail return an int from enum ckpt_status:
 * CKPT_OK (0) on success, a negative code on failure.  The handle keeps the
 * code and a one-line message naming what was wrong and where; every handle
 * has the same pair of accessors: ckpt_file_error_code() /
 * ckpt_file_error_message(), and alike ckpt_model_*, ckpt_scan_*,
 * ckpt_scan_paths_*, ckpt_torch_load_*, ckpt_diff_*, ckpt_verify_* and
 * ckpt_rename_* (ckpt_backend_open() writes its message into the caller's
 * buffer).  A call
 * that opens, reads, compares, edits or writes clears the handle's error
 * first; the message is then that call's first error.  A call given a
 * NULL handle, or NULL where a pointer is required, returns CKPT_ERR_USAGE
 * and may record nothing: ckpt_strerror() names any status.  The library
 * never prints, never exits and never reads the environment.
 *
 * Ownership.
 *  (a) What ckpt_*_new returns is released by the matching ckpt_*_free;
 *      every _free accepts NULL.
 *  (b) Getters return borrowed pointers (const where the caller must not
 *      write), valid until the owning handle is freed.  Values, tensors
 *      and storages all live in an arena owned by their ckpt_file, and so
 *      do the strings of paths and keys (also the keys an edit replaced).
 *  (c) Setters copy their string arguments.
 *  (d) Bulk data goes into caller-supplied buffers with an explicit
 *      capacity.  The exceptions are malloc'd for the caller to release:
 *      ckpt_rename_apply()'s string and every ckpt_*_to_json() text
 *      (free()), and ckpt_model_run()'s outputs (ckpt_array_clear()).
 *
 * Threads.  The library's global tables are set up once, under
 * pthread_once(): different handles may be used by different threads at
 * once.  One handle (a ckpt_file with everything borrowed from it, a
 * ckpt_model, a ckpt_scan, a ckpt_backend with the models that ran on it)
 * is used by one thread at a time; calls that take it const only read it,
 * and may run at once in several threads while no call that takes it
 * non-const runs.  A ckpt_rename may be shared once its rules are added.
 * ckpt_version_details() fills a static buffer: call it from one thread.
 * ckpt_file_write() may run a helper thread of its own (CRC checks); it
 * has ended when the call returns, and callbacks are made from the
 * calling thread.
 *
 * Versions.  CKPT_VERSION_* is the release.  The shared library's version
 * follows libtool's interface rules (configure.ac, CKPT_LT_VERSION): an
 * interface added keeps the soname (current and age go up), one removed or
 * changed incompatibly changes it (age back to 0).
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CKPT_BUILDING) && defined(__GNUC__)
#define CKPT_API __attribute__((visibility("default")))
#else
#define CKPT_API
#endif

/* ---- version and status codes -------------------------------------------- */

/*
 * The release this header belongs to, and the library's own idea of it at
 * run time; the status codes every fallible call returns, and their names.
 */

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1
#define CKPT_VERSION_PATCH 0
#define CKPT_VERSION_NUMBER \
    (CKPT_VERSION_MAJOR * 10000 + CKPT_VERSION_MINOR * 100 + CKPT_VERSION_PATCH)

/* Version of the library linked at run time (CKPT_VERSION_NUMBER format). */
CKPT_API int ckpt_version_number(void);
/* "ckpt 0.1.0 (libzip 1.7.3, zlib 1.2.13, PCRE2 10.42, cJSON 1.7.15)"; the
 * CUDA backend's own line: ckpt_cuda_module_describe(). */
CKPT_API const char *ckpt_version_details(void);

typedef enum ckpt_status {
    CKPT_OK = 0,
    CKPT_EOF = 1,                /* iterator exhausted (reserved: nothing returns it yet) */
    CKPT_ERR_USAGE = -1,         /* API misuse or invalid argument */
    CKPT_ERR_FORMAT = -2,        /* malformed or corrupt input */
    CKPT_ERR_UNSAFE = -3,        /* refused: a global outside the allow-list */
    CKPT_ERR_LIMIT = -4,         /* a resource limit was hit */
    CKPT_ERR_UNSUPPORTED = -5,   /* well formed but not supported */
    CKPT_ERR_IO = -6,            /* the operating system refused */
    CKPT_ERR_NOMEM = -7,         /* out of memory */
    CKPT_ERR_DEVICE = -8         /* the GPU, its driver or a CUDA library failed */
} ckpt_status;

CKPT_API const char *ckpt_strerror(int status);

/* ---- dtypes ------------------------------------------------------------ */

/*
 * Every dtype torch saves, in torch's names.  Tensors and storages report
 * theirs; casts and the float32 reader take them.
 */

typedef enum ckpt_dtype {
    CKPT_DTYPE_UNKNOWN = 0,
    CKPT_DTYPE_FLOAT64, CKPT_DTYPE_FLOAT32, CKPT_DTYPE_FLOAT16, CKPT_DTYPE_BFLOAT16,
    CKPT_DTYPE_INT64, CKPT_DTYPE_INT32, CKPT_DTYPE_INT16, CKPT_DTYPE_INT8,
    CKPT_DTYPE_UINT8, CKPT_DTYPE_BOOL,
    CKPT_DTYPE_COMPLEX128, CKPT_DTYPE_COMPLEX64, CKPT_DTYPE_COMPLEX32,
    CKPT_DTYPE_QINT8, CKPT_DTYPE_QUINT8, CKPT_DTYPE_QINT32,
    CKPT_DTYPE_QUINT4X2, CKPT_DTYPE_QUINT2X4,
    CKPT_DTYPE_FLOAT8_E5M2, CKPT_DTYPE_FLOAT8_E4M3FN,
    CKPT_DTYPE_FLOAT8_E5M2FNUZ, CKPT_DTYPE_FLOAT8_E4M3FNUZ, CKPT_DTYPE_FLOAT8_E8M0FNU,
    CKPT_DTYPE_UINT16, CKPT_DTYPE_UINT32, CKPT_DTYPE_UINT64,
    CKPT_DTYPE_BITS8, CKPT_DTYPE_BITS16, CKPT_DTYPE_BITS1X8, CKPT_DTYPE_BITS2X4,
    CKPT_DTYPE_BITS4X2,
    CKPT_DTYPE_FLOAT4_E2M1FN_X2, /* two 4-bit floats a byte; shapes count bytes */
    CKPT_DTYPE_BCOMPLEX32,       /* two bfloat16 */
    /* safetensors F6_E2M3 / F6_E3M2 (OCP MX 6-bit floats, packed): no torch
     * dtype, so read and passed through safetensors only */
    CKPT_DTYPE_FLOAT6_E2M3FN, CKPT_DTYPE_FLOAT6_E3M2FN,
    CKPT_DTYPE_COUNT_
} ckpt_dtype;

/* torch's name without "torch." ("float32"); "unknown" out of range. */
CKPT_API const char *ckpt_dtype_name(ckpt_dtype dtype);
/* Bytes per element, 0 for CKPT_DTYPE_UNKNOWN and for the sub-byte float6
 * types (see ckpt_dtype_bits). */
CKPT_API size_t ckpt_dtype_size(ckpt_dtype dtype);
/* Bits per element: 8 * ckpt_dtype_size, 6 for the float6 types, 0 unknown. */
CKPT_API unsigned ckpt_dtype_bits(ckpt_dtype dtype);
/* Parse a torch name ("float32", "torch.float32", "half"); UNKNOWN if none. */
CKPT_API ckpt_dtype ckpt_dtype_from_name(const char *name);
/* 1 for float64/32/16, bfloat16 and the float8 types. */
CKPT_API int ckpt_dtype_is_floating(ckpt_dtype dtype);

/* ---- opening a checkpoint ---------------------------------------------- */

/*
 * A ckpt_file is made with ckpt_file_new(), configured (allow-list, limits),
 * opened once with ckpt_file_open() (a handle is not reused: make a new one
 * per file), queried, edited and written, and released with
 * ckpt_file_free(), which releases everything borrowed from it.  The format
 * is recognised by content (then by name for a shard index), whatever the
 * file is called.
 */

typedef struct ckpt_file ckpt_file;
typedef struct ckpt_value ckpt_value;
typedef struct ckpt_tensor ckpt_tensor;
typedef struct ckpt_storage ckpt_storage;

typedef enum ckpt_format {
    CKPT_FORMAT_UNKNOWN = 0,
    CKPT_FORMAT_PTH_ZIP,
    CKPT_FORMAT_PTH_LEGACY,
    CKPT_FORMAT_SAFETENSORS,
    CKPT_FORMAT_SHARDED, /* a *.index.json naming shards in any of the formats above */
    CKPT_FORMAT_TORCHSCRIPT, /* a torch.jit.save archive: read only (its state dict) */
    CKPT_FORMAT_PTH_TAR,     /* torch <= 0.1's tar checkpoint: read only */
    CKPT_FORMAT_DCP,         /* a torch.distributed.checkpoint folder: read only */
    CKPT_FORMAT_DEEPSPEED    /* a DeepSpeed ZeRO checkpoint folder: read only */
} ckpt_format;

/* "pth-zip", "pth-legacy", "safetensors", "sharded", "torchscript" as in
 * inspect's JSON (doc/design.md, "JSON"). */
CKPT_API const char *ckpt_format_name(ckpt_format format);
/* The format an output named PATH is written in when none is asked for:
 * SHARDED for NAME.index.json, SAFETENSORS for *.safetensors, else PTH_ZIP
 * (doc/design.md, "Common rules": --to, else OUT's extension, else pth-zip). */
CKPT_API ckpt_format ckpt_format_for_path(const char *path);

typedef enum ckpt_limit {
    CKPT_LIMIT_PICKLE_BYTES = 0, /* size of one pickle (default 1 GiB) */
    CKPT_LIMIT_DEPTH,            /* nesting of containers (default 10000) */
    CKPT_LIMIT_STACK,            /* pickle VM stack entries (default 16 Mi) */
    CKPT_LIMIT_MARKS,            /* open MARKs at once (default 100000) */
    CKPT_LIMIT_MEMO,             /* memo entries (default 16 Mi) */
    CKPT_LIMIT_ITEMS,            /* items in one container (default 64 Mi) */
    CKPT_LIMIT_STORAGES,         /* storages in one file (default 16 Mi) */
    CKPT_LIMIT_HEADER_BYTES,     /* a safetensors header (default 100 MB, as safetensors) */
    CKPT_LIMIT_COUNT_
} ckpt_limit;

/* A handle for one checkpoint.  Configure it, then ckpt_file_open(). */
CKPT_API ckpt_file *ckpt_file_new(void);
CKPT_API void ckpt_file_free(ckpt_file *f);

/* Admit the global MODULE.NAME (e.g. "mypkg.Config") as an opaque object. */
CKPT_API int ckpt_file_allow_global(ckpt_file *f, const char *qualified_name);
/* Admit every unknown global as an opaque object (still reported). */
CKPT_API int ckpt_file_set_allow_unknown(ckpt_file *f, int allow);
CKPT_API int ckpt_file_set_limit(ckpt_file *f, ckpt_limit which, uint64_t value);
/*
 * Check each zip record's local header when its bytes are first read
 * (ckpt_storage_read and the calls that read or map storages), not at
 * ckpt_file_open: opening a .pth of many tensors then reads its central
 * directory and pickle only, not a page near every tensor (a cold 2 GiB
 * file of 10,000 tensors: one disk read instead of 10,000).  A record torch
 * would refuse to read (no local header where the central directory says)
 * then fails at its first read, with the message ckpt_file_open gives
 * otherwise.  Off by default; set before ckpt_file_open (CKPT_ERR_USAGE
 * after).  Scans and the torch.load verdict check every header either way.
 */
CKPT_API int ckpt_file_set_defer_record_checks(ckpt_file *f, int defer);
CKPT_API uint64_t ckpt_file_limit(const ckpt_file *f, ckpt_limit which);

/*
 * Open and parse PATH: reads the container index and the pickle, never the
 * tensor data.  On failure the handle holds the error; free it as usual.
 */
CKPT_API int ckpt_file_open(ckpt_file *f, const char *path);

CKPT_API int ckpt_file_error_code(const ckpt_file *f);
CKPT_API const char *ckpt_file_error_message(const ckpt_file *f);

/*
 * What reading the file noticed without refusing it, one line each (no
 * file name at the start, no newline), for the user to see: e.g. a zip
 * written without CRC-32s, whose bytes cannot be checked.  Valid as long as
 * the handle; NULL past the count.
 */
CKPT_API size_t ckpt_file_notice_count(const ckpt_file *f);
CKPT_API const char *ckpt_file_notice(const ckpt_file *f, size_t i);

/* The file read: a Hugging Face model folder's weights file or index, when
 * the folder was opened (ckpt_file_model_folder). */
CKPT_API const char *ckpt_file_path(const ckpt_file *f);
/* The Hugging Face model folder that was opened (config.json beside
 * model.safetensors, model.safetensors.index.json, pytorch_model.bin or
 * pytorch_model.bin.index.json, the first there in from_pretrained's
 * order), or NULL when the input was not one. */
CKPT_API const char *ckpt_file_model_folder(const ckpt_file *f);
/* 1 when PATH is such a folder (what ckpt_file_open would read as one). */
CKPT_API int ckpt_path_is_model_folder(const char *path);
CKPT_API ckpt_format ckpt_file_format(const ckpt_file *f);
/* Archive prefix of a pth-zip ("sd" for records "sd/data.pkl"); "" otherwise. */
CKPT_API const char *ckpt_file_prefix(const ckpt_file *f);
/* Names of the zip records in archive order (pth-zip only). */
CKPT_API size_t ckpt_file_record_count(const ckpt_file *f);
CKPT_API const char *ckpt_file_record_name(const ckpt_file *f, size_t i);

/* The unpickled object. */
CKPT_API const ckpt_value *ckpt_file_root(const ckpt_file *f);

/* Storages in order of first reference in the pickle. */
CKPT_API size_t ckpt_file_storage_count(const ckpt_file *f);
CKPT_API const ckpt_storage *ckpt_file_storage(const ckpt_file *f, size_t i);

/* ---- the value tree ------------------------------------------------------ */

/*
 * The unpickled object as a tree of values (ckpt_file_root()): dicts,
 * lists, tuples, strings, numbers, tensors, and the globals and objects it
 * names, kept opaque.  These getters accept NULL and a value of another
 * kind: they then return NULL, 0 or CKPT_KIND_NONE (ckpt_value_int():
 * CKPT_ERR_USAGE).
 */

typedef enum ckpt_kind {
    CKPT_KIND_NONE = 0,
    CKPT_KIND_BOOL,
    CKPT_KIND_INT,      /* ckpt_value_int(); big ints: ckpt_value_bigint() */
    CKPT_KIND_FLOAT,
    CKPT_KIND_STR,      /* UTF-8 */
    CKPT_KIND_BYTES,
    CKPT_KIND_LIST,
    CKPT_KIND_TUPLE,
    CKPT_KIND_DICT,     /* dict or collections.OrderedDict */
    CKPT_KIND_SET,
    CKPT_KIND_FROZENSET,
    CKPT_KIND_GLOBAL,   /* a reference to MODULE.NAME (a class, dtype, function) */
    CKPT_KIND_OBJECT,   /* an object built by a call we did not interpret: opaque */
    CKPT_KIND_TENSOR,
    CKPT_KIND_STORAGE   /* a bare storage (a persistent id outside a tensor) */
} ckpt_kind;

CKPT_API ckpt_kind ckpt_value_kind(const ckpt_value *v);
/* "dict", "OrderedDict", "list", "tensor", ... for messages. */
CKPT_API const char *ckpt_value_kind_name(const ckpt_value *v);

CKPT_API int ckpt_value_bool(const ckpt_value *v);
/* CKPT_OK, or CKPT_ERR_LIMIT when the int does not fit in 64 bits. */
CKPT_API int ckpt_value_int(const ckpt_value *v, int64_t *out);
/* Little-endian two's complement bytes of an INT that does not fit in 64
 * bits (borrowed); NULL for the others, which ckpt_value_int() returns. */
CKPT_API const uint8_t *ckpt_value_bigint(const ckpt_value *v, size_t *len);
CKPT_API double ckpt_value_float(const ckpt_value *v);
/* STR (UTF-8) and BYTES content; *len gets the byte length. NUL-terminated. */
CKPT_API const char *ckpt_value_str(const ckpt_value *v, size_t *len);

/* Items of LIST, TUPLE, SET, FROZENSET; entries of DICT. */
CKPT_API size_t ckpt_value_len(const ckpt_value *v);
CKPT_API const ckpt_value *ckpt_value_item(const ckpt_value *v, size_t i);
CKPT_API const ckpt_value *ckpt_value_dict_key(const ckpt_value *v, size_t i);
CKPT_API const ckpt_value *ckpt_value_dict_value(const ckpt_value *v, size_t i);
/* DICT lookup by string key; NULL when absent. */
CKPT_API const ckpt_value *ckpt_value_dict_get(const ckpt_value *v, const char *key);
/* Dict V's items from FROM on, in one call for a binding that would make
 * four a key (the Python package listing 10,000 keys): each string key's
 * bytes back to back into BUF (CAP bytes), its length into LENS and its
 * value's tensor (ckpt_value_tensor: NULL when not one) into TENSORS, at
 * most MAX_ITEMS items.  Returns how many were filled: fewer than asked at
 * the dict's end, a key that is not a string, or BUF full. */
CKPT_API size_t ckpt_value_dict_tensor_items(const ckpt_value *v, size_t from, char *buf,
                                            size_t cap, size_t *lens,
                                            const ckpt_tensor **tensors, size_t max_items);
/* 1 when a DICT is a collections.OrderedDict. */
CKPT_API int ckpt_value_dict_ordered(const ckpt_value *v);
/* State set by pickle BUILD (an OrderedDict's _metadata lives here); or NULL. */
CKPT_API const ckpt_value *ckpt_value_state(const ckpt_value *v);

/* GLOBAL: "module.name"; OBJECT: the class or function that built it. */
CKPT_API const char *ckpt_value_global(const ckpt_value *v);
/* OBJECT: arguments of the call (a TUPLE) or NULL. */
CKPT_API const ckpt_value *ckpt_value_object_args(const ckpt_value *v);
/* Where the value was created: byte offset in the pickle stream. */
CKPT_API uint64_t ckpt_value_offset(const ckpt_value *v);

CKPT_API const ckpt_tensor *ckpt_value_tensor(const ckpt_value *v);
CKPT_API const ckpt_storage *ckpt_value_storage(const ckpt_value *v);

/* ---- tensors and storages ---------------------------------------------- */

/*
 * A tensor is a view (dtype, shape, stride, offset) of a storage, as in
 * torch; tied tensors share one storage.  These getters read what the
 * pickle says and never the data; they take non-NULL pointers.
 */

CKPT_API ckpt_dtype ckpt_tensor_dtype(const ckpt_tensor *t);
CKPT_API int ckpt_tensor_ndim(const ckpt_tensor *t);
CKPT_API const int64_t *ckpt_tensor_shape(const ckpt_tensor *t);
CKPT_API const int64_t *ckpt_tensor_stride(const ckpt_tensor *t);
/* Offset into the storage, in elements of the tensor's dtype. */
CKPT_API int64_t ckpt_tensor_offset(const ckpt_tensor *t);
CKPT_API int64_t ckpt_tensor_numel(const ckpt_tensor *t);
/* Bytes of the tensor's own elements (numel * element size). */
CKPT_API size_t ckpt_tensor_nbytes(const ckpt_tensor *t);
CKPT_API int ckpt_tensor_requires_grad(const ckpt_tensor *t);
/* 1 when saved as an nn.Parameter (state_dict(keep_vars=True), modules). */
CKPT_API int ckpt_tensor_is_parameter(const ckpt_tensor *t);
CKPT_API int ckpt_tensor_is_contiguous(const ckpt_tensor *t);
/* The storage the elements are in; NULL for a tensor without one of its
 * own (sparse: its parts are tensors of the tree; meta: no data at all). */
CKPT_API const ckpt_storage *ckpt_tensor_storage(const ckpt_tensor *t);

/*
 * Tensor kinds besides the plain strided one.  Quantized tensors have a
 * storage of integer elements (dtype qint8, quint8, qint32, quint4x2,
 * quint2x4) and quantizer parameters; sparse tensors are built from
 * tensors of their own (indices, values), which ckpt keeps as they were;
 * meta tensors have a dtype and a shape and no data.  Rewrites keep every
 * kind exactly as saved.
 */
typedef enum ckpt_tensor_kind {
    CKPT_TENSOR_DENSE = 0,
    CKPT_TENSOR_QUANTIZED,
    CKPT_TENSOR_SPARSE_COO,
    CKPT_TENSOR_SPARSE_CSR,
    CKPT_TENSOR_SPARSE_CSC,
    CKPT_TENSOR_SPARSE_BSR,
    CKPT_TENSOR_SPARSE_BSC,
    CKPT_TENSOR_META
} ckpt_tensor_kind;

CKPT_API ckpt_tensor_kind ckpt_tensor_kind_of(const ckpt_tensor *t);
/* "dense", "quantized", "sparse_coo", ..., "meta". */
CKPT_API const char *ckpt_tensor_kind_name(ckpt_tensor_kind kind);
/* Where torch would put it: the storage's location tag ("cuda:1"), the
 * values' for a sparse tensor, "meta" for a meta tensor. */
CKPT_API const char *ckpt_tensor_device(const ckpt_tensor *t);

/* A quantized tensor's quantizer, as torch.save wrote it. */
typedef struct ckpt_qparams {
    const char *qscheme;  /* "per_tensor_affine", "per_channel_affine", ... */
    double scale;         /* per-tensor schemes */
    int64_t zero_point;
    int axis;             /* per-channel schemes: the channel dimension, */
    const ckpt_tensor *scales;      /* one scale per channel (float64 or float32) */
    const ckpt_tensor *zero_points; /* and zero point (int64, or float32) */
} ckpt_qparams;

/* Fill OUT for a quantized tensor; CKPT_ERR_USAGE for any other kind. */
CKPT_API int ckpt_tensor_qparams(const ckpt_tensor *t, ckpt_qparams *out);

/* A sparse tensor's parts as saved: the data tuple of torch's
 * _rebuild_sparse_tensor, (indices, values, size[, is_coalesced]) for COO and
 * (compressed indices, plain indices, values, size) for the compressed
 * layouts, whose tensors are values of the tree (ckpt_value_tensor); NULL
 * for any other kind.  What a reader needs to build the tensor itself. */
CKPT_API const ckpt_value *ckpt_tensor_sparse_data(const ckpt_tensor *t);

/* A tensor a folder checkpoint assembles from parts (a DCP tensor's chunks):
 * where each part lies, as the checkpoint's metadata says (nothing read). */
typedef struct ckpt_chunk {
    int ndim;
    const int64_t *offsets, *sizes; /* its box, in the whole tensor's coordinates */
    int rank;                       /* the rank that saved it; -1 unknown */
    const char *file;               /* its file in the folder; NULL: none (an empty chunk) */
    uint64_t file_offset, length;   /* its item's bytes in that file */
} ckpt_chunk;

/* How many parts T was assembled from (0: a tensor stored whole), and part I. */
CKPT_API size_t ckpt_tensor_chunk_count(const ckpt_tensor *t);
CKPT_API const ckpt_chunk *ckpt_tensor_chunk(const ckpt_tensor *t, size_t i);

/* A rank's local shard of a sharded tensor that each rank saved with
 * torch.save (FSDP1 SHARDED_STATE_DICT's ShardedTensor, FSDP2's DTensor):
 * the tensor read is that local shard; this says where it lies in the whole. */
typedef struct ckpt_shard_info {
    const char *type;             /* "ShardedTensor" or "DTensor" */
    int ndim;                     /* of the whole tensor */
    const int64_t *global_shape;
    size_t nchunks;               /* 1; 0: this rank holds no shard (ShardedTensor) */
    const ckpt_chunk *chunks;     /* the shard's box (offsets, sizes, rank; file NULL) */
    int rank;                     /* the rank that saved it; -1 unknown */
    /* non-NULL: the box is not known (chunks 0), and why: "placement not
     * supported: _StridedShard" */
    const char *unsupported;
} ckpt_shard_info;

/* Fill OUT for a rank's local shard; CKPT_ERR_USAGE for any other tensor. */
CKPT_API int ckpt_tensor_shard(const ckpt_tensor *t, ckpt_shard_info *out);

CKPT_API const char *ckpt_storage_key(const ckpt_storage *s);
CKPT_API ckpt_dtype ckpt_storage_dtype(const ckpt_storage *s);
CKPT_API int64_t ckpt_storage_numel(const ckpt_storage *s);
CKPT_API size_t ckpt_storage_nbytes(const ckpt_storage *s);
/* Location tag as saved: "cpu", "cuda:0", ... */
CKPT_API const char *ckpt_storage_device(const ckpt_storage *s);
/* Index in ckpt_file_storage(). */
CKPT_API size_t ckpt_storage_index(const ckpt_storage *s);
/* A PyTorch 0.3 storage view (a legacy file's view_metadata): the storage
 * whose elements from *OFFSET on it is, its bytes theirs.  NULL otherwise. */
CKPT_API const ckpt_storage *ckpt_storage_view_of(const ckpt_storage *s, int64_t *offset);

/* ---- reading tensor data --------------------------------------------------- */

/*
 * The data, read on demand into the caller's buffer, every zip record's
 * CRC-32 checked when read whole.  These take the ckpt_file non-const: the
 * error lands in its handle.
 */

/*
 * Read LEN bytes of storage S starting at byte OFFSET into BUF.  Reading a
 * whole record (offset 0, len = nbytes) also verifies its CRC-32 (zip).
 */
CKPT_API int ckpt_storage_read(ckpt_file *f, const ckpt_storage *s,
                               uint64_t offset, void *buf, size_t len);

/*
 * Copy the tensor's elements, in C-contiguous order, into BUF (capacity CAP,
 * at least ckpt_tensor_nbytes()).  Reads (and CRC-checks) the storage.
 */
CKPT_API int ckpt_tensor_read(ckpt_file *f, const ckpt_tensor *t, void *buf, size_t cap);

/*
 * The tensor's elements as float32, in C order, into BUF (COUNT floats, at
 * least its numel): any real dtype, rounded to nearest as torch's copy_ into
 * a float32 tensor does (float16, bfloat16 and float8 exactly).  Complex,
 * quantized and bits tensors are CKPT_ERR_UNSUPPORTED.
 */
CKPT_API int ckpt_tensor_read_float32(ckpt_file *f, const ckpt_tensor *t, float *buf,
                                      size_t count);

/* ---- statistics ------------------------------------------------------------ */

/* What `ckpt inspect --stats` shows for one tensor. */
typedef struct ckpt_tensor_stats {
    int valid;          /* 0 when the dtype has no ordering (complex, quantized) */
    double min, max;    /* over finite elements; NaN when there are none */
    double mean, std;   /* over finite elements; std is unbiased (N-1) */
    int64_t nan, inf;   /* counts */
    uint32_t crc32;     /* zlib CRC-32 of the C-contiguous little-endian bytes */
} ckpt_tensor_stats;

/* Read the tensor's data and summarise it (float16/bfloat16 converted exactly). */
CKPT_API int ckpt_tensor_stats_compute(ckpt_file *f, const ckpt_tensor *t,
                                       ckpt_tensor_stats *out);

/* ---- comparing tensors ---------------------------------------------------- */

/* ckpt diff's engine: two tensors' elements, as torch.isclose sees them. */

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
 * is read as ckpt_tensor_read() reads it (every record's CRC checked); a
 * read error is kept in the handle of the file that failed.  Memory: the
 * bytes of the two tensors, plus, while a view that is not its whole
 * storage is read, that storage.  FA and FB may be the same handle.
 */
CKPT_API int ckpt_tensor_compare(ckpt_file *fa, const ckpt_tensor *a, ckpt_file *fb,
                                 const ckpt_tensor *b, double atol, double rtol,
                                 ckpt_compare_result *out);

/* ---- walking: tensors, state dicts, objects, by path -------------------- */

/*
 * Listings made when the file is opened (and again by ckpt_file_select()),
 * each entry with its path from the root.  ckpt_file_rename_keys() changes
 * keys in the value tree, not these paths: they still name the keys as
 * they were (walk ckpt_file_root() for the new ones).
 */

/* One step of a path from the root: a dict key or a list/tuple index. */
typedef struct ckpt_path_elem {
    int is_int;          /* 1: an int dict key or a list/tuple index */
    int64_t index;
    const char *key;     /* string key (borrowed) when !is_int */
} ckpt_path_elem;

typedef struct ckpt_path {
    size_t len;
    const ckpt_path_elem *elems;
} ckpt_path;

/* Every tensor reachable from the root, in pickle order, with its path. */
CKPT_API size_t ckpt_file_tensor_count(const ckpt_file *f);
CKPT_API const ckpt_tensor *ckpt_file_tensor(const ckpt_file *f, size_t i, ckpt_path *path);
/* Tensors a pickled module tree holds outside the state dict it is listed
 * as (plain tensor attributes, tensors in attribute lists and dicts,
 * non-persistent buffers), each once, in pickle order: PATH is the
 * module's path, then the attribute names that reach the tensor from it,
 * joined with '.' ("anchors", "0.stride", "extra.0"); *WHY is "attribute"
 * or "non-persistent buffer".  Listed only: no command writes them. */
CKPT_API size_t ckpt_file_other_tensor_count(const ckpt_file *f);
CKPT_API const ckpt_tensor *ckpt_file_other_tensor(const ckpt_file *f, size_t i, ckpt_path *path,
                                                   const char **why);

/*
 * State dicts: every mapping with at least one entry whose keys are all
 * strings and whose values are all tensors (the root for a plain state dict).
 */
CKPT_API size_t ckpt_file_state_dict_count(const ckpt_file *f);
CKPT_API const ckpt_value *ckpt_file_state_dict(const ckpt_file *f, size_t i, ckpt_path *path);
/*
 * Where state dict I comes from: "mapping" (a dict in the file),
 * "module-tree": a pickled nn.Module (torch.save(model)), read by its
 * structure without importing anything and seen as the dict
 * model.state_dict() gives (names, order, _metadata), or "torchscript": the
 * module of a torch.jit.save archive, named as torch.jit.load(f).state_dict()
 * names it (its code/ files' __parameters__ and __buffers__ lists; nothing
 * compiled or run), or "deepspeed": the full fp32 state dict a DeepSpeed
 * ZeRO folder reconstructs (as zero_to_fp32 does).  NULL out of range.
 */
CKPT_API const char *ckpt_file_state_dict_source(const ckpt_file *f, size_t i);
/* How a folder checkpoint is laid out, as a JSON object (DeepSpeed: tag,
 * zero_stage, optimizer, world_size, model_files, rank_files: one per rank
 * in rank order, and counts of buffers, frozen, trainable and tied
 * tensors); NULL for a one-file checkpoint. */
CKPT_API const char *ckpt_file_layout(const ckpt_file *f);
/* Storage S's bytes as runs of the checkpoint's files (a folder's storages
 * gather them from several): how many, and run I: the file (relative to the
 * folder; NULL for bytes held in memory), its offset there, its length, and
 * where it lands in the storage (as stored, before any cast).  A storage of
 * any other kind has 0 runs. */
CKPT_API size_t ckpt_storage_run_count(const ckpt_storage *s);
CKPT_API int ckpt_storage_run(const ckpt_storage *s, size_t i, const char **file,
                              uint64_t *file_offset, uint64_t *nbytes, uint64_t *storage_offset);
/* Where storage S's bytes lie as one range of one file, readable as they
 * are (uncompressed, in this machine's byte order, not cast): that file's
 * path (as opened; a folder checkpoint's file relative to the folder, as
 * ckpt_storage_run names it) and the offset, for a
 * caller that maps the file instead of reading it (the Python binding's
 * zero-copy views); nothing is read or checked (no CRC-32).
 * CKPT_ERR_UNSUPPORTED when they are not such a range (a compressed record,
 * big-endian bytes, a cast, pieces of several files, bytes in memory). */
CKPT_API int ckpt_storage_file_range(ckpt_file *f, const ckpt_storage *s, const char **file,
                                     uint64_t *offset);
/* Read whole, and check the CRC-32 of, every record a folder checkpoint's
 * storages take bytes from (what inspect --stats adds to reading every
 * tensor, since a tensor made of parts of records is read by parts that no
 * CRC covers).  CKPT_OK at once for other checkpoints. */
CKPT_API int ckpt_file_check_records(ckpt_file *f);
/* The class of a module tree's root module ("mymods.Net", "__torch__.Net" in
 * a TorchScript archive); NULL for a mapping. */
CKPT_API const char *ckpt_file_state_dict_class(const ckpt_file *f, size_t i);
/* 1 when state dict I is a model's: not inside an optimizer's state dict
 * (a mapping holding `state` and `param_groups`: its per-parameter state),
 * nor under Lightning's callbacks, loops, lr_schedulers, optimizer_states
 * or best_k_models.  Key rewrites without a selection touch these only. */
CKPT_API int ckpt_file_state_dict_is_model(const ckpt_file *f, size_t i);

/*
 * The state dict a file is taken for when one is written alone and nothing
 * names it (ckpt_file_extract without a selection; a safetensors or sharded
 * write of a training checkpoint): the root when it is a state dict, else
 * the first module tree, else the file's only state dict, else its only
 * model state dict (ckpt_file_state_dict_is_model).  *INDEX is its index
 * for ckpt_file_state_dict().  CKPT_ERR_USAGE when that leaves several,
 * the message naming the candidates (the models' state dicts, else all of
 * them) and --select; CKPT_ERR_UNSUPPORTED when the file has none.
 */
CKPT_API int ckpt_file_pick_state_dict(ckpt_file *f, size_t *index);

/* Opaque objects and globals (known data and admitted unknowns), with paths. */
CKPT_API size_t ckpt_file_object_count(const ckpt_file *f);
CKPT_API const ckpt_value *ckpt_file_object(const ckpt_file *f, size_t i, ckpt_path *path);

/* Format a path as "a/b/0" into BUF; returns the length it needs. */
CKPT_API size_t ckpt_path_format(const ckpt_path *path, char *buf, size_t cap);

/*
 * Wrapper prefixes found in a state dict's keys: the chain every key starts
 * with ("module.", "module." for DDP twice), then known wrapper components
 * ("_orig_mod.", "_fsdp_wrapped_module.", ...) seen elsewhere in keys.
 * Returns the count; fills up to CAP borrowed strings into OUT.
 */
CKPT_API size_t ckpt_state_dict_wrappers(const ckpt_value *sd, const char **out, size_t cap);

/* Class of a global "module.name" under the file's allow-list. */
typedef enum ckpt_global_class {
    CKPT_GLOBAL_INTERPRETED = 0, /* what state dicts are made of */
    CKPT_GLOBAL_KNOWN_DATA,      /* plain-data classes kept opaque */
    CKPT_GLOBAL_ALLOWED,         /* unknown, admitted by the user */
    CKPT_GLOBAL_REFUSED          /* unknown: opening fails */
} ckpt_global_class;

CKPT_API ckpt_global_class ckpt_file_classify_global(const ckpt_file *f, const char *qualified_name);

/* ---- diff: two checkpoints compared, as ckpt diff compares them --------- */

/*
 * ckpt diff's engine.  A is the model's checkpoint (the reference), B the
 * one loaded into it; the words are torch's load_state_dict's: keys of A
 * without a counterpart in B are "missing", keys of B without one in A
 * "unexpected".  Which tensors are paired: a file with one state dict (or
 * the one ckpt_diff_set_select() names) is compared by its keys, and the
 * tensors outside it by their paths when both files hold their state dict
 * at the same path; any other file by the path of every tensor.  Both
 * sides go by path when either is a DCP folder and only one of them holds
 * a single state dict (a DCP folder drops empty dicts and makes int keys
 * str, so it sees state dicts the .pth it came from lacks).  Each common
 * key is compared with ckpt_tensor_compare() (numbers across numeric
 * dtypes, complex and quantized as bytes).  The files are opened by the
 * caller and must stay open while the results are read: tensors, paths
 * and file names are borrowed from them.  A run reads both files (one
 * thread at a time on each, as for any reading call).
 */
typedef struct ckpt_diff ckpt_diff;

/* How a pair's values were compared. */
typedef enum ckpt_diff_compared {
    CKPT_DIFF_NOT_COMPARED = 0, /* a size mismatch, or keys only */
    CKPT_DIFF_VALUES,           /* as numbers (across numeric dtypes) */
    CKPT_DIFF_BYTES,            /* element by element as bytes (complex, quantized) */
    CKPT_DIFF_INCOMPARABLE      /* dtypes whose values cannot be compared: not equal */
} ckpt_diff_compared;

/* One side of a diff: what of its file was compared. */
typedef struct ckpt_diff_side {
    const char *file;       /* ckpt_file_path() */
    ckpt_format format;
    size_t state_dicts;     /* the file's state dicts (ckpt_file_state_dict_count) */
    int by_path;            /* 1: every tensor compared by its path, no state dict chosen */
    ckpt_path state_dict;   /* else the state dict compared by key (len 0: the root) */
    const char *state_dict_text; /* that path as "a/b" ("" for the root); NULL when by_path */
    size_t tensors;         /* tensors compared (by key and by path) */
    size_t others;          /* of them, those outside the state dict, by path */
    size_t unreached;       /* storages no listed tensor uses (inside opaque objects):
                             * not compared */
} ckpt_diff_side;

/* One key both sides hold, as compared. */
typedef struct ckpt_diff_pair {
    const char *key;            /* the key compared (normalized with ckpt_diff_set_normalize) */
    const char *a_key, *b_key;  /* the keys as in each file; paths joined by '/' */
    const ckpt_tensor *a, *b;
    int equal;                  /* same shape and values within tolerance (a dtype
                                 * mismatch alone is no difference) */
    int size_mismatch;          /* shapes differ: values not compared, not equal */
    int dtype_mismatch;
    ckpt_diff_compared compared_as;
    /* VALUES or BYTES: ckpt_tensor_compare()'s result (max_abs and max_rel
     * NaN for BYTES); first_index is the first element outside the tolerance */
    ckpt_compare_result r;
    /* first_index as an index per dimension: first_ndim of them in
     * first_coords; -1 when only the flat index has a meaning (sparse
     * tensors count over their saved parts, packed dtypes over bytes) */
    int first_ndim;
    const int64_t *first_coords;
    /* VALUES with a mismatch: the values at first_index as ckpt diff prints
     * them: exact for integer dtypes ("-9223372036854775808", "True"), else
     * the shortest decimal that reads back as the same value of the
     * tensor's dtype ("0.1", "nan", "-inf"); NULL otherwise */
    const char *first_a_text, *first_b_text;
} ckpt_diff_pair;

typedef struct ckpt_diff_summary {
    size_t compared, equal, differ; /* pairs (every common key) */
    size_t missing, unexpected;
    size_t size_mismatch, dtype_mismatch;
    /* without normalisation: how many missing keys unwrapping both sides'
     * keys would pair with unexpected ones (0 when none are both) */
    size_t normalize_would_match;
    int all_equal;              /* something compared, all equal, none missing or unexpected */
    /* why a diff that found no difference is still not equal (nothing was
     * compared), or NULL */
    const char *reason;
} ckpt_diff_summary;

/* DONE of TOTAL pairs compared: called with DONE = 0 before the first
 * pair's values are read, then after each pair (not with keys only). */
typedef void (*ckpt_diff_progress_fn)(void *user, size_t done, size_t total);

CKPT_API ckpt_diff *ckpt_diff_new(void);
CKPT_API void ckpt_diff_free(ckpt_diff *d);
/* Equal when |a - b| <= ATOL + RTOL * |b| (default 0, 0: exact); both
 * finite and not negative, else CKPT_ERR_USAGE.  Unused with keys only. */
CKPT_API int ckpt_diff_set_tolerance(ckpt_diff *d, double atol, double rtol);
/* Compare keys, shapes and dtypes only: read no data. */
CKPT_API int ckpt_diff_set_keys_only(ckpt_diff *d, int keys_only);
/* Unwrap module., _orig_mod., ... of both sides' keys (and of every
 * component of a path) first, as ckpt_rename_unwrap() does. */
CKPT_API int ckpt_diff_set_normalize(ckpt_diff *d, int normalize);
/* Compare the state dict at PATH ("a/b", as ckpt_path_format() writes it)
 * of each file; NULL: the only one, if a file has one. */
CKPT_API int ckpt_diff_set_select(ckpt_diff *d, const char *path);
CKPT_API int ckpt_diff_set_progress(ckpt_diff *d, ckpt_diff_progress_fn fn, void *user);
/*
 * Compare A with B (both opened with ckpt_file_open()), replacing the
 * results of an earlier run.  CKPT_OK when the comparison ran, whatever it
 * found.  Errors: a selection that names no state dict of a file
 * (CKPT_ERR_FORMAT), two keys of one file compared as one
 * (CKPT_ERR_UNSUPPORTED), a tensor that cannot be read (the file's status:
 * the message then starts with the key as in that file); the message is in
 * ckpt_diff_error_message(), and ckpt_diff_error_side() says which file it
 * concerns.
 */
CKPT_API int ckpt_diff_run(ckpt_diff *d, ckpt_file *a, ckpt_file *b);
CKPT_API int ckpt_diff_error_code(const ckpt_diff *d);
CKPT_API const char *ckpt_diff_error_message(const ckpt_diff *d);
/* 0: the error concerns A, 1: B, -1: neither (out of memory). */
CKPT_API int ckpt_diff_error_side(const ckpt_diff *d);
/* The results of the last successful run (NULL, 0 before one). */
CKPT_API const ckpt_diff_side *ckpt_diff_side_of(const ckpt_diff *d, int which);
CKPT_API const ckpt_diff_summary *ckpt_diff_summary_of(const ckpt_diff *d);
/* Every common key, in A's order. */
CKPT_API size_t ckpt_diff_pair_count(const ckpt_diff *d);
CKPT_API const ckpt_diff_pair *ckpt_diff_pair_at(const ckpt_diff *d, size_t i);
/* Missing keys in A's order, unexpected ones in B's (summary's counts). */
CKPT_API const char *ckpt_diff_missing_at(const ckpt_diff *d, size_t i);
CKPT_API const char *ckpt_diff_unexpected_at(const ckpt_diff *d, size_t i);
/* The document ckpt diff --json prints (ckpt-diff(1)), malloc'd (free());
 * NULL out of memory or before a successful run. */
CKPT_API char *ckpt_diff_to_json(const ckpt_diff *d);

/* ---- editing: key renames and device remaps ------------------------------- */

/*
 * Edits change the opened checkpoint in memory, never the file it came
 * from; ckpt_file_write() then writes the result.  An edit refused (a bad
 * rule or tag, two keys made equal) changes nothing; with CKPT_EDIT_DRY_RUN
 * an edit only reports what it would do.  Edits combine: select, rename,
 * remap and cast one handle, then write it once.
 */

/*
 * A list of key rename rules, applied in order to every key.  Rules copy
 * their arguments.  Errors in a rule (a bad regular expression) are
 * returned as CKPT_ERR_USAGE with the text in ckpt_rename_error().
 */
typedef struct ckpt_rename ckpt_rename;

CKPT_API ckpt_rename *ckpt_rename_new(void);
CKPT_API void ckpt_rename_free(ckpt_rename *r);
/* Remove PREFIX from the start of a key as many times as it repeats. */
CKPT_API int ckpt_rename_strip_prefix(ckpt_rename *r, const char *prefix);
/* Put PREFIX in front of every key. */
CKPT_API int ckpt_rename_add_prefix(ckpt_rename *r, const char *prefix);
/* Remove the wrapper components module., _orig_mod., _fsdp_wrapped_module.,
 * _forward_module., _checkpoint_wrapped_module. wherever they stand. */
CKPT_API int ckpt_rename_unwrap(ckpt_rename *r);
/* A sed-style rule 's/REGEX/REPLACEMENT/[gi]' (any delimiter; PCRE2; groups
 * as \1, $1 or ${1}). */
CKPT_API int ckpt_rename_sed(ckpt_rename *r, const char *expr);
CKPT_API const char *ckpt_rename_error(const ckpt_rename *r);
/* The last rule's status (CKPT_OK, CKPT_ERR_USAGE, CKPT_ERR_NOMEM) and its
 * message ("" when none): the error pair every handle has. */
CKPT_API int ckpt_rename_error_code(const ckpt_rename *r);
CKPT_API const char *ckpt_rename_error_message(const ckpt_rename *r);

/* Apply RULES to the key KEY; returns a malloc'd string (NULL on OOM). */
CKPT_API char *ckpt_rename_apply(const ckpt_rename *r, const char *key);

enum {
    CKPT_EDIT_DRY_RUN = 1 << 0 /* report what would change, change nothing */
};

/* What an edit reports, through optional callbacks. */
typedef struct ckpt_edit_report {
    /* a key of the state dict at SD that changes */
    void (*key)(void *user, const ckpt_path *sd, const char *old_key, const char *new_key);
    /* a state dict visited: how many of its keys changed */
    void (*state_dict)(void *user, const ckpt_path *sd, size_t changed, size_t keys);
    /* storages whose location tag changes from OLD to NEW */
    void (*device)(void *user, const char *old_tag, const char *new_tag, size_t storages);
    void *user;
} ckpt_edit_report;

/*
 * Rename the keys of the mapping at SELECT (keys joined by '/'), or of every
 * state dict when SELECT is NULL, and their _metadata with them (the way
 * torch's consume_prefix_in_state_dict_if_present does, order kept).  A
 * rename that would make two keys of one mapping equal is refused with
 * CKPT_ERR_FORMAT naming both, and nothing changes.
 */
CKPT_API int ckpt_file_rename_keys(ckpt_file *f, const ckpt_rename *r, const char *select,
                                   unsigned flags, const ckpt_edit_report *report);

/*
 * Rewrite storage location tags: the first rule whose FROM matches a tag
 * gives its new tag.  FROM is exact ("cuda:1"), a device type ("cuda"
 * matches "cuda" and "cuda:N") or "*".
 */
CKPT_API int ckpt_file_remap_devices(ckpt_file *f, const char *const *from, const char *const *to,
                                     size_t nrules, unsigned flags,
                                     const ckpt_edit_report *report);

/*
 * Cast every floating storage (float64, float32, float16, bfloat16) to TO
 * when the file is written, rounding as torch's .half() / .bfloat16() /
 * .float() do; integer, bool and other storages keep their type.  The
 * report's device callback gets "float32 -> float16 (N storages)".
 */
CKPT_API int ckpt_file_cast(ckpt_file *f, ckpt_dtype to, unsigned flags,
                            const ckpt_edit_report *report);

/* Make the mapping at SELECT (keys joined by '/') the whole checkpoint: a
 * write then holds only it (a state dict taken out of a training checkpoint). */
CKPT_API int ckpt_file_select(ckpt_file *f, const char *select);

/*
 * Make one state dict the whole checkpoint, for a weights-only file: the one
 * at SELECT, or (SELECT NULL) the model's: the root when it is a state dict,
 * else the first module tree, else the file's only state dict or only model
 * state dict (ckpt_file_state_dict_is_model); an error naming them when
 * that leaves several.
 */
CKPT_API int ckpt_file_extract(ckpt_file *f, const char *select);

/*
 * Before a rewrite writes F as FORMAT (0: pth-zip): what the write would
 * carry that torch.load(weights_only=False) imports and runs (doc/safety.md
 * 9): a global outside the interpreted and known-data classes (one
 * admitted by ckpt_file_allow_global or ckpt_file_set_allow_unknown, a module
 * tree's class), anywhere in what is written (safetensors and sharded sets
 * hold plain tensors: nothing).  Refused with CKPT_ERR_UNSAFE, naming the
 * first one, where it sits and `ckpt extract` (which writes the weights
 * only), unless KEEP is set and each one was named with
 * ckpt_file_allow_global (never a global that is never admitted): then
 * CKPT_OK, and KEPT (when not NULL) is called once per global kept, each
 * making the output unsafe to load.
 */
CKPT_API int ckpt_file_check_globals(ckpt_file *f, ckpt_format format, int keep,
                                     void (*kept)(void *user, const char *global), void *user);

/* 1 when TAG is spelled like a torch location tag: "cpu", "cuda", "cuda:1" */
CKPT_API int ckpt_device_valid(const char *tag);
/* 1 when TAG's device type is one torch restores without a plug-in */
CKPT_API int ckpt_device_known(const char *tag);
/*
 * The CUDA devices torch would find here: the driver's count (libcuda.so.1,
 * dlopen'ed and asked once), 0 without a driver; the environment variable
 * CKPT_CUDA_DEVICES=N, meant for tests, sets it instead.
 */
CKPT_API int ckpt_cuda_driver_device_count(void);
/* 1 when plain torch.load could put a storage tagged TAG on this machine:
 * cpu and meta always, cuda:N when the driver has more than N devices, any
 * other type (mps, xpu, ...) never (mps is macOS's; the others need a
 * build or plug-in that ckpt cannot see). */
CKPT_API int ckpt_device_present(const char *tag);
/*
 * The remap that makes storages tagged TAGS (", "-separated) load here, as
 * ckpt's options spell it, into BUF: " ALL cpu" when every tag is cpu or
 * absent here (as map_location='cpu' does), else " EACH TAG=TO" for each
 * absent tag, TO being cuda:0 for a cuda tag where this machine has one,
 * else cpu.  ALL and EACH are the options ("--to" and "--map" for remap,
 * "--map-location" for the other rewrites).  1 when something is absent,
 * else 0 and BUF "".
 */
CKPT_API int ckpt_device_remap_here(const char *tags, const char *all, const char *each,
                                    char *buf, size_t cap);

/* ---- writing -------------------------------------------------------------- */

/*
 * One call writes the checkpoint, edits included, in one of the formats
 * (ckpt_format): pth-zip by default, pth-legacy, safetensors (a mapping of
 * tensors only: the root or OPT->select), or a sharded set (PATH named
 * NAME.index.json, or OPT->shard_size).  ckpt_format_for_path() gives the
 * format an output's name asks for, as ckpt convert picks it.
 */

enum {
    CKPT_WRITE_IN_PLACE = 1 << 0, /* allow PATH to be the file that was opened */
    CKPT_WRITE_NO_DEDUPE = 1 << 1, /* safetensors: write tied tensors once per name */
    CKPT_WRITE_FORCE = 1 << 2,     /* in place: edit a file that has other hard links or is
                                      reached through a symbolic link (refused otherwise) */
    CKPT_WRITE_DEFER_FREE = 1 << 3, /* with a result: a replaced PATH is left under a hidden
                                      name (result->replaced) for the caller to remove */
    /* the input is a model folder (ckpt_file_model_folder): PATH is written as
     * one too, as transformers' save_pretrained lays it out: the weights in
     * OPT->format (0: safetensors) as model.safetensors or pytorch_model.bin,
     * in shards of OPT->shard_size (0: transformers' 50GB) with their index
     * when they are more than one, and every other file of the input folder
     * copied (its other weight files of those names left out).  PATH must
     * not exist unless CKPT_WRITE_FORCE, which replaces it whole; it is
     * written as a temporary folder beside it, renamed at the end. */
    CKPT_WRITE_MODEL_FOLDER = 1 << 4
};

/* How ckpt_file_write wrote PATH (ckpt_write_options.result). */
typedef enum ckpt_write_method {
    CKPT_WROTE_NEW = 0,  /* a new file, streamed, then renamed over PATH */
    CKPT_WROTE_IN_PLACE, /* the input itself, edited in place: only what changed was written */
    CKPT_WROTE_CLONE     /* a new file sharing the input's extents (FICLONE), then edited */
} ckpt_write_method;

typedef struct ckpt_write_result {
    ckpt_write_method method;
    uint64_t bytes_written; /* in place: the bytes written (pickle, directory, the
                               temporary copy of the old directory) */
    uint64_t dead_bytes;    /* in place: bytes left that no record holds */
    uint64_t offset;        /* in place: where the new pickle record went */
    uint64_t old_size, new_size; /* in place: the file's size before and after */
    int direct;             /* in place: 1 when the file's new end was written with O_DIRECT */
    char why[256];          /* in place asked for but not done: why ("" otherwise) */
    char replaced[4096];    /* CKPT_WRITE_DEFER_FREE: the hidden name the replaced file
                               still has (its last), "" when none: removing it frees its
                               blocks, which takes about 0.3 s per GiB on ext4 */
} ckpt_write_result;

typedef struct ckpt_write_options {
    unsigned flags;
    ckpt_format format;  /* CKPT_FORMAT_UNKNOWN (0): pth-zip; or PTH_LEGACY, SAFETENSORS */
    const char *select;  /* safetensors: the mapping to write (keys joined by '/') */
    uint64_t shard_size; /* > 0: write PATH (NAME.index.json) and shards of at most this
                            many bytes (a bigger tensor has a shard to itself); a PATH
                            ending in .index.json without it keeps the input's shards */
    /* Called now and then with bytes of storage data copied so far (every format). */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *user;
    ckpt_write_result *result; /* when not NULL: how PATH was written (filled on success) */
} ckpt_write_options;

/*
 * Write the checkpoint, with any edits made to it, to PATH in OPT->format:
 * pth-zip when that is 0 (or OPT is NULL), whatever PATH is called, except
 * that a PATH named NAME.index.json is always written as a sharded set
 * (its shards in the format their names say).  pth-zip is torch's layout:
 * protocol-2 pickle, stored records aligned to 64 bytes, zip64 where
 * needed, storages renumbered "0".. in pickle order.  Storage bytes are
 * copied from the input (CRC-checked on the way), never held whole in
 * memory.  Atomic: PATH appears complete or not at all.  CKPT_ERR_IO
 * before anything is written when PATH's filesystem has less free space
 * than the tensor data to write.  Refuses "-" and the input file itself
 * unless CKPT_WRITE_IN_PLACE.  OPT may be NULL.
 */
CKPT_API int ckpt_file_write(ckpt_file *f, const char *path, const ckpt_write_options *opt);
/*
 * In place (CKPT_WRITE_IN_PLACE and PATH the input): the file is locked
 * (flock, exclusive; another writer holding it: CKPT_ERR_IO at once); one
 * with other hard links or reached through a symbolic link is refused
 * (CKPT_ERR_UNSUPPORTED) unless CKPT_WRITE_FORCE, since an edit in place
 * changes every name of it (a Hugging Face cache blob is shared by
 * content).  A pth-zip rewrite that only changes the pickle (key rewrites,
 * remap) writes a new pickle record and directory and moves no tensor
 * byte (CKPT_WROTE_IN_PLACE); at every instant the file is the old
 * checkpoint or the new one to torch.load and Python's zipfile.  Dead
 * bytes are reused and bounded: when they would pass max(64 MiB, 5% of
 * the file), the file is rewritten whole instead, compact.  Any other
 * rewrite writes a new file renamed over the input (CKPT_WROTE_NEW,
 * result->why says why).
 */

/* Bytes of a pth-zip file that no record holds (left by in-place
 * rewrites); CKPT_ERR_UNSUPPORTED for other formats or layouts. */
CKPT_API int ckpt_file_dead_bytes(ckpt_file *f, uint64_t *out);

/*
 * Remove the temporary files of writes in progress that have a name in a
 * directory (where the filesystem has no O_TMPFILE, a write goes to a
 * hidden ".NAME.ckpt-XXXXXX" until it is complete).  Async-signal-safe: it
 * only reads a fixed table and calls unlink(), for a program's handler of
 * SIGINT, SIGTERM or SIGHUP to call before the program dies of the signal.
 * The library installs no signal handler itself.  Meant to be followed by
 * the program's end (_exit() or the signal re-raised): a write still going
 * on then fails.
 */
CKPT_API void ckpt_cleanup_temporaries(void);

/* ---- the model runtime: graph specs, backends, strict load, forward -------- */

/*
 * A model is a graph spec (doc/design.md, "Model specs"; the JSON files in models/): named
 * inputs, an ordered list of nodes, named outputs.  ckpt_model_bind() loads
 * a state dict into it the way torch's strict load_state_dict() does, and
 * ckpt_model_run() runs the forward pass on a backend: the CPU reference or
 * CUDA.  Tensors handed in and out are float32, C-contiguous, on the host.
 */
typedef struct ckpt_model ckpt_model;
typedef struct ckpt_backend ckpt_backend;

#define CKPT_MAX_DIMS 8

/* A float32 tensor on the host.  DATA is malloc'd when ckpt_model_run()
 * fills it; release it with ckpt_array_clear(). */
typedef struct ckpt_array {
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    float *data;
} ckpt_array;

CKPT_API int64_t ckpt_array_numel(const ckpt_array *a);
CKPT_API void ckpt_array_clear(ckpt_array *a);

/*
 * Open a backend: "cpu", "cuda" (= "cuda:0"), "cuda:N", or "auto" (CUDA
 * when a GPU, the CUDA backend module and its CUDA runtime are present,
 * else the CPU).  On failure
 * returns a negative status (CKPT_ERR_DEVICE when CUDA cannot be used,
 * CKPT_ERR_USAGE for a bad name) and writes a message into ERR (CAP bytes).
 */
CKPT_API int ckpt_backend_open(const char *device, ckpt_backend **out, char *err, size_t cap);
/*
 * ckpt_backend_open() with FLAGS (0: as ckpt_backend_open):
 * CKPT_BACKEND_TF32 lets the backend use TF32 (a 10-bit mantissa) for its
 * matrix products and convolutions, as torch's
 * torch.backends.cuda.matmul.allow_tf32 = True and its default
 * torch.backends.cudnn.allow_tf32 = True do: the CUDA backend on GPUs with
 * tensor cores; it changes nothing on the CPU.  Without it every backend
 * computes in strict FP32.  An unknown flag is CKPT_ERR_USAGE.
 */
#define CKPT_BACKEND_TF32 1u
CKPT_API int ckpt_backend_open_flags(const char *device, unsigned flags, ckpt_backend **out,
                                     char *err, size_t cap);
/* The flags that change B's arithmetic: CKPT_BACKEND_TF32 when it was
 * asked for and B can use it (not the CPU). */
CKPT_API unsigned ckpt_backend_flags(const ckpt_backend *b);
CKPT_API void ckpt_backend_free(ckpt_backend *b);
/* "cpu" or "cuda:N". */
CKPT_API const char *ckpt_backend_device(const ckpt_backend *b);
/* One line: "cpu (OpenBLAS 0.3.21)", "cuda:0 (NVIDIA H100 80GB HBM3, CUDA runtime
 * 13.0, cuBLAS 13.1.0, cuDNN 9.13.0, TF32 off)" (or "no cuDNN: WHY": the
 * convolutions on ckpt's own kernels). */
CKPT_API const char *ckpt_backend_description(const ckpt_backend *b);
/* Usable CUDA devices: 0 without a GPU, a driver, the CUDA backend module
 * (libckpt_cuda.so, loaded at run time) or the CUDA runtime it needs. */
CKPT_API int ckpt_cuda_device_count_usable(void);
/*
 * The CUDA backend module as this process finds it (loading it if not yet
 * loaded; $CKPT_CUDA_MODULE, then beside libckpt, then the install folder).
 * Returns the usable GPUs, with "MODULE, CUDA runtime 13.0, 2 GPUs" in BUF
 * (CAP bytes); or 0, with why CUDA cannot be used in BUF: the module not
 * found (and where it was looked for), the CUDA runtime it needs missing
 * (the loader's message), a module of another build (ABI), or "no GPU
 * found (MODULE, CUDA runtime 13.0)".
 */
CKPT_API int ckpt_cuda_module_describe(char *buf, size_t cap);

CKPT_API ckpt_model *ckpt_model_new(void);
CKPT_API void ckpt_model_free(ckpt_model *m);
/* Parse the spec at PATH / in JSON (LEN bytes; NAME is used in messages).
 * A spec error is CKPT_ERR_FORMAT naming the node and what is wrong. */
CKPT_API int ckpt_model_load(ckpt_model *m, const char *path);
CKPT_API int ckpt_model_parse(ckpt_model *m, const char *json, size_t len, const char *name);
CKPT_API int ckpt_model_error_code(const ckpt_model *m);
CKPT_API const char *ckpt_model_error_message(const ckpt_model *m);

/* The spec's "name" and "class" (torch's class name, for load messages). */
CKPT_API const char *ckpt_model_name(const ckpt_model *m);
CKPT_API const char *ckpt_model_class(const ckpt_model *m);
CKPT_API size_t ckpt_model_input_count(const ckpt_model *m);
CKPT_API const char *ckpt_model_input_name(const ckpt_model *m, size_t i);
/* Declared shape of input I; -1 marks the batch dimension.  Returns ndim. */
CKPT_API int ckpt_model_input_shape(const ckpt_model *m, size_t i, int64_t *shape);
/* Input I as integer ids (the spec's "dtype" int64 or int32; the runtime
 * carries them as float32 holding the integers): the bound its ids stay
 * below (the spec's "high", else the rows of the embedding that reads them,
 * known once weights are bound), 0 while unknown; -1 for a float input or
 * no such input. */
CKPT_API int64_t ckpt_model_input_id_limit(const ckpt_model *m, size_t i);
CKPT_API size_t ckpt_model_output_count(const ckpt_model *m);
CKPT_API const char *ckpt_model_output_name(const ckpt_model *m, size_t i);
/* Parameter keys in the order the spec first uses them. */
CKPT_API size_t ckpt_model_param_count(const ckpt_model *m);
CKPT_API const char *ckpt_model_param_key(const ckpt_model *m, size_t i);
/* The key parameter I is tied to (the spec's "tied": one tensor in the
 * model under two keys), or NULL. */
CKPT_API const char *ckpt_model_param_tie(const ckpt_model *m, size_t i);
/* 1 when the bound state dict lacks tied key I and the bind took the
 * tensor of the key it is tied to, as from_pretrained ties it back. */
CKPT_API int ckpt_model_param_tied_in(const ckpt_model *m, size_t i);

/* One size mismatch of a strict load. */
typedef struct ckpt_size_mismatch {
    const char *key;
    int ckpt_ndim, model_ndim;
    int64_t ckpt_shape[CKPT_MAX_DIMS], model_shape[CKPT_MAX_DIMS];
} ckpt_size_mismatch;

/* What a strict load found; strings are borrowed from the model and stay
 * valid until the next bind or ckpt_model_free(). */
typedef struct ckpt_load_report {
    int ok;                       /* 1: every key matched, shapes and dtypes fit */
    size_t missing_count;         /* spec keys the state dict lacks (torch's order) */
    const char *const *missing;
    size_t unexpected_count;      /* state-dict keys the spec lacks (torch's order) */
    const char *const *unexpected;
    size_t mismatch_count;
    const ckpt_size_mismatch *mismatches;
    size_t bad_dtype_count;       /* keys whose tensors are not floating point */
    const char *const *bad_dtype;
    /* torch's message, "Error(s) in loading state_dict for CLASS:\n\t...", or "" */
    const char *message;
} ckpt_load_report;

/*
 * Strict load: the mapping SD (a dict value of F, usually a state dict)
 * must hold exactly the spec's parameter keys, each a floating-point
 * tensor of the shape the graph implies (channel counts come from the
 * weights; the others follow from the inputs' declared shapes).  On a
 * match the values are read (every record's CRC checked), converted to
 * float32 as load_state_dict's copy_ does, and kept by the model.
 * Returns CKPT_OK when the check ran (see REPORT->ok), or an error: a read
 * error is kept in F's handle and repeated in the model's.  A model's
 * previous binding is dropped first.
 */
CKPT_API int ckpt_model_bind(ckpt_model *m, ckpt_file *f, const ckpt_value *sd,
                             ckpt_load_report *report);

/*
 * Forward pass of a bound model on backend B.  INPUTS holds one array per
 * spec input, in spec order, each of the declared shape with any batch
 * size.  OUTPUTS (ckpt_model_output_count() entries) are filled with
 * malloc'd host arrays.  Parameters are uploaded to B on first use and
 * kept there until the model is freed or rebound.  Errors (shape, device)
 * are in the model's handle.
 */
CKPT_API int ckpt_model_run(ckpt_model *m, ckpt_backend *b, const ckpt_array *inputs,
                            ckpt_array *outputs);

/*
 * Which dimension of each output follows the batch: the graph's shapes are
 * worked out for INPUTS' batch size and for one more, and DIMS[i] gets the
 * first dimension of output I that changes, or -1 when none does (an output
 * without a batch dimension, such as SSD's priors).  No data is read.
 */
CKPT_API int ckpt_model_batch_dims(ckpt_model *m, const ckpt_array *inputs, int *dims);

/*
 * DataParallel's forward, replayed.  Every input is split along dim 0 as
 * scatter does (torch.chunk: chunks of ceil(B / REPLICAS) rows, the last
 * one smaller, so fewer chunks than REPLICAS when B is small); chunk i runs
 * on BACKENDS[i % NB] (one per GPU, or the same backend in turn); each
 * output is then concatenated along dim 0 as gather does.  *USED gets the
 * number of chunks that ran.  An output whose replicas' shapes differ
 * outside dim 0 cannot be gathered (torch's gather raises): it is left
 * empty (ndim 0, data NULL) and the others are still filled.
 */
CKPT_API int ckpt_model_run_replicas(ckpt_model *m, ckpt_backend *const *backends, size_t nb,
                                     int replicas, const ckpt_array *inputs,
                                     ckpt_array *outputs, int *used);

/* ---- verify: a checkpoint in its model, run and compared (ckpt verify) ---- */

/*
 * ckpt verify's engine (ckpt-verify(1)).  A ckpt_verify borrows a model
 * (a loaded spec) and a checkpoint the caller opened; it chooses the state
 * dict by its fit to the spec, loads it strictly (ckpt_model_bind), and when
 * the keys differ by a wrapper prefix says so with the ckpt command that
 * fixes the file.  ckpt_verify_run() then runs the model on a reference's
 * input (or a fixed random batch) and compares every output with the
 * reference's, with a second checkpoint's, and with DataParallel's replay.
 * The models and files must outlive the handle (it keeps pointers into
 * them); ckpt_verify_to_json() is `ckpt verify --json`'s document.
 */
typedef struct ckpt_verify ckpt_verify;

/*
 * One output against a reference output.  The relative error is on the
 * output's scale: max_rel = max_abs / max_abs_reference (not the largest
 * ratio of two elements; ckpt_tensor_compare's max_rel is that).
 */
typedef struct ckpt_output_check {
    int shape_ok;             /* the shapes agree (nothing below is set when not) */
    int pass;                 /* shape_ok, and every element within the tolerance */
    int64_t count;            /* elements compared */
    int64_t mismatched;       /* elements out of the tolerance */
    double max_abs;           /* max |ours - ref|; NaN when a NaN met a number */
    double max_rel;           /* max_abs / max_abs_reference; 0 when max_abs is 0,
                                 inf when the reference is all 0 */
    double max_abs_reference; /* the largest finite |ref| */
    double atol, rtol;        /* the tolerance applied (atol after scaling) */
} ckpt_output_check;

#define CKPT_ATOL_SCALED 1u   /* ATOL is a fraction of the largest finite |ref| */

/*
 * Compare OURS with REF as torch.isclose(ours, ref, rtol, atol,
 * equal_nan=True): an element passes when |ours - ref| <= atol + rtol * |ref|;
 * NaN equals NaN, an infinity only the same infinity, and either against
 * anything else fails whatever the tolerance.  FLAGS: 0 or CKPT_ATOL_SCALED.
 */
CKPT_API int ckpt_array_compare(const ckpt_array *ours, const ckpt_array *ref, double atol,
                                double rtol, unsigned flags, ckpt_output_check *out);

/* The two checkpoints of a verify: the one verified and, optionally, the
 * one its outputs are compared against (`--against`). */
typedef enum ckpt_verify_side {
    CKPT_VERIFY_CHECKPOINT = 0,
    CKPT_VERIFY_AGAINST = 1
} ckpt_verify_side;

/* Why a state dict was chosen. */
typedef enum ckpt_state_dict_reason {
    CKPT_STATE_DICT_SELECTED = 0, /* named by ckpt_verify_set_select() */
    CKPT_STATE_DICT_ROOT,         /* the file holds no state dict: its root mapping */
    CKPT_STATE_DICT_BEST_FIT,     /* the one with the most spec keys (the first on a tie) */
    CKPT_STATE_DICT_FIRST         /* no state dict has a spec key: the first one */
} ckpt_state_dict_reason;

typedef struct ckpt_state_dict_choice {
    const ckpt_value *state_dict; /* the mapping loaded (borrowed from the file) */
    const char *path;        /* "the root", or its keys joined by '/' ("model_state_dict") */
    ckpt_state_dict_reason reason;
    size_t spec_keys;        /* its keys that are spec keys, alone or after a prefix */
    size_t candidates;       /* the file's state dicts (ckpt_file_state_dict_count) */
} ckpt_state_dict_choice;

/* One output of the model after ckpt_verify_run(). */
typedef struct ckpt_verify_output {
    const char *name;                /* the spec's name of it */
    const ckpt_array *value;         /* the verified checkpoint's output */
    /* with a reference (else NULL and zeros) */
    const ckpt_array *reference;     /* PyTorch's output */
    ckpt_output_check vs_reference;  /* VALUE against it */
    int has_accuracy;                /* the reference has labels, and VALUE is [B, C]
                                        class scores for them */
    int64_t labels, correct, reference_correct; /* top-1 hits of VALUE and of REFERENCE */
    /* with a checkpoint compared against (else NULL and zeros) */
    const ckpt_array *against;       /* its output */
    ckpt_output_check vs_against;    /* AGAINST against VALUE (VALUE plays the reference) */
    /* with the DataParallel replay (ckpt_verify_set_replicas) */
    int batch_dim;                   /* the dimension that follows the batch; -1: none */
    const ckpt_array *gathered;      /* what gather returns; NULL when it cannot concatenate */
    ckpt_output_check vs_single;     /* GATHERED against VALUE; pass: it comes back */
    const char *replica_reason;      /* why it does not come back, with the fix; NULL */
} ckpt_verify_output;

/* The DataParallel replay after ckpt_verify_run(). */
typedef struct ckpt_verify_replicas {
    int requested;                   /* the N asked for */
    int used;                        /* chunks the batch was split into (torch.chunk) */
    int64_t batch;                   /* the batch split */
    size_t device_count;             /* N GPUs, one chunk each, or 1: in turn on it */
    const char *const *devices;      /* their names: "cpu", "cuda:0", ... */
} ckpt_verify_replicas;

CKPT_API ckpt_verify *ckpt_verify_new(void);
CKPT_API void ckpt_verify_free(ckpt_verify *v);
CKPT_API int ckpt_verify_error_code(const ckpt_verify *v);
CKPT_API const char *ckpt_verify_error_message(const ckpt_verify *v);
/* The path of the file the error is about (a checkpoint, the reference), or
 * NULL when it is about none (the device, memory). */
CKPT_API const char *ckpt_verify_error_path(const ckpt_verify *v);

/* Options; set them before the load.  SELECT: the verified checkpoint's
 * state dict by path (keys joined by '/'), NULL to choose by fit.  DEVICE:
 * as ckpt_backend_open() takes it ("auto" by default).  ATOL is absolute
 * when set; without, 1e-5 times each output's largest finite |ref| (0 for
 * the checkpoint compared against).  RTOL: 1e-5 on the CPU, 1e-4 on CUDA
 * (0 against).  REPLICAS: replay DataParallel over N (1 to 64; 0: no). */
CKPT_API int ckpt_verify_set_select(ckpt_verify *v, const char *select);
CKPT_API int ckpt_verify_set_device(ckpt_verify *v, const char *device);
CKPT_API int ckpt_verify_set_atol(ckpt_verify *v, double atol);
CKPT_API int ckpt_verify_set_rtol(ckpt_verify *v, double rtol);
CKPT_API int ckpt_verify_set_replicas(ckpt_verify *v, int replicas);
/* TF32 (`--tf32`): the backend opened with CKPT_BACKEND_TF32, and the
 * default tolerance widened to TF32's: rtol 1e-2 and atol 1e-3 times each
 * output's largest finite |ref| (an explicit atol/rtol still wins).  On the
 * CPU it changes nothing but the tolerance (ckpt_verify_tf32_note says so). */
CKPT_API int ckpt_verify_set_tf32(ckpt_verify *v, int on);
/* After ckpt_verify_run: 1 when TF32 was asked for; the note: "" when the
 * backend used it or it was not asked for, else why it changed nothing
 * ("the CPU backend computes in FP32 whatever --tf32 says"). */
CKPT_API int ckpt_verify_tf32(const ckpt_verify *v);
CKPT_API const char *ckpt_verify_tf32_note(const ckpt_verify *v);

/*
 * The state dict of F to load into M, without loading it: the mapping the
 * select option names; else the root, when F holds no state dict but its
 * root is a mapping; else, among F's state dicts, the one with the most keys
 * that are spec keys, alone or after a prefix (so a training checkpoint's
 * model_state_dict is found, wrapped or not), the first when none has one.
 * F is not changed.  A select that names no mapping, and a file that holds
 * no mapping at all, are errors (CKPT_ERR_FORMAT).
 */
CKPT_API int ckpt_verify_choose(ckpt_verify *v, ckpt_model *m, ckpt_file *f);
/*
 * Choose as above, then load strictly (ckpt_model_bind into M).  A load
 * that fails is no error: the report says why (ckpt_verify_load_report),
 * with the hint and fix when the keys differ by a wrapper prefix.  Errors
 * are reading the file or the state dict (the file's status).
 */
CKPT_API int ckpt_verify_load(ckpt_verify *v, ckpt_model *m, ckpt_file *f);
/* The checkpoint compared against (after ckpt_verify_load): chosen by fit
 * (the select option is the verified checkpoint's alone) and loaded into
 * M, a second model of the same spec (a model holds one state dict). */
CKPT_API int ckpt_verify_load_against(ckpt_verify *v, ckpt_model *m, ckpt_file *f);
/*
 * Run, when the loads succeeded (else nothing runs and CKPT_OK): open the
 * device, take the inputs from REFERENCE ('input', or 'input.NAME' per
 * input) or, when it is NULL, a fixed pseudo-random batch in [0, 1) (4, or
 * 2N with N replicas, in the batch dimension), run both checkpoints, compare
 * each output with REFERENCE's 'output.NAME' (with the top-1 accuracy when
 * it has int64 'labels'), replay DataParallel, and compare the outputs of
 * the checkpoint compared against.  A REFERENCE that lacks a tensor or does
 * not fit the model is CKPT_ERR_FORMAT; too small a batch to split over the
 * replicas is CKPT_ERR_USAGE.  REFERENCE must outlive the handle.
 */
CKPT_API int ckpt_verify_run(ckpt_verify *v, ckpt_file *reference);

/* The choice and the strict load of SIDE, or NULL before them. */
CKPT_API const ckpt_state_dict_choice *ckpt_verify_choice(const ckpt_verify *v,
                                                          ckpt_verify_side side);
CKPT_API const ckpt_load_report *ckpt_verify_load_report(const ckpt_verify *v,
                                                         ckpt_verify_side side);
/* When the load failed by a wrapper prefix: what is wrong ("every key
 * carries the "module." prefix of DataParallel/...") and the command that
 * fixes the file ("ckpt strip-module IN IN_stripped.pth"); else NULL. */
CKPT_API const char *ckpt_verify_hint(const ckpt_verify *v);
CKPT_API const char *ckpt_verify_fix(const ckpt_verify *v);
/* 1 when the model ran (the loads succeeded and ckpt_verify_run returned CKPT_OK). */
CKPT_API int ckpt_verify_ran(const ckpt_verify *v);
/* The backend it ran on, and with "auto" why not a GPU ("no GPU found"; "" else). */
CKPT_API const ckpt_backend *ckpt_verify_backend(const ckpt_verify *v);
CKPT_API const char *ckpt_verify_device_note(const ckpt_verify *v);
/* Input I as run, and where the inputs came from: "reference" or
 * "random (seed fixed, batch 4)". */
CKPT_API const ckpt_array *ckpt_verify_input(const ckpt_verify *v, size_t i);
CKPT_API const char *ckpt_verify_input_from(const ckpt_verify *v);
/* The outputs (the spec's, in order; 0 when nothing ran). */
CKPT_API size_t ckpt_verify_output_count(const ckpt_verify *v);
CKPT_API const ckpt_verify_output *ckpt_verify_output_at(const ckpt_verify *v, size_t i);
/* The DataParallel replay, or NULL without one. */
CKPT_API const ckpt_verify_replicas *ckpt_verify_replica_info(const ckpt_verify *v);
/* 1 when every load succeeded and every check passed: ckpt verify's exit 0. */
CKPT_API int ckpt_verify_passed(const ckpt_verify *v);
/* `ckpt verify --json`'s document (malloc'd, for free()); NULL when out of
 * memory or before a successful ckpt_verify_load(). */
CKPT_API char *ckpt_verify_to_json(const ckpt_verify *v);
/*
 * `ckpt verify --junit FILE`'s report (ckpt-verify(1)): JUnit XML, one
 * testsuite (properties: the checkpoint, SPEC as given, the state dict, the
 * device, the result) with a testcase for each strict load and for each
 * output compared (with the reference, the checkpoint compared against,
 * the DataParallel replay), a failure element with the error and the
 * tolerance where one fails.  Names are escaped; what XML cannot hold (C0
 * controls, bytes that are not UTF-8) is written \xHH.  malloc'd, for
 * free(); NULL when out of memory or before a ckpt_verify_load().
 */
CKPT_API char *ckpt_verify_to_junit(const ckpt_verify *v, const char *spec);
/* That report written to PATH atomically (complete or not at all); the
 * error, with PATH, in ckpt_verify_error_*(). */
CKPT_API int ckpt_verify_write_junit(ckpt_verify *v, const char *path, const char *spec);

/* ---- scanning: what a file's pickles would import, without running them ---- */

/*
 * ckpt scan's engine.  Every pickle of a file (each .pkl record of a zip,
 * the five pickles of a legacy checkpoint, every pickle of a plain pickle
 * file) is run through the reading VM in scanning mode: nothing is imported
 * or called, STACK_GLOBAL's operands are resolved through the memo as when
 * reading, and every global named (GLOBAL, STACK_GLOBAL, INST) is listed
 * once per pickle, with the first call (REDUCE, NEWOBJ, NEWOBJ_EX, INST,
 * OBJ) or BUILD that uses it.  A safetensors file has no pickle: its header
 * is validated as when reading.
 */
typedef struct ckpt_scan ckpt_scan;

enum { CKPT_SCAN_CALLED = 1 << 0, CKPT_SCAN_BUILT = 1 << 1 };

typedef struct ckpt_scan_hit {
    const char *global;      /* "module.name" (Python 2 module names mapped as pickle does) */
    const char *pickle;      /* the pickle it is in: "archive/data.pkl", "pickle 4 (...)" */
    uint64_t offset;         /* of the first opcode naming it, in that pickle */
    const char *opcode;      /* that opcode: "GLOBAL", "STACK_GLOBAL", "INST" */
    ckpt_global_class cls;   /* INTERPRETED, KNOWN_DATA, or REFUSED (unknown) */
    int dangerous;           /* unknown and known to run commands or code */
    unsigned uses;           /* CKPT_SCAN_CALLED | CKPT_SCAN_BUILT */
    const char *used_by;     /* the first opcode that used it, or NULL */
    uint64_t use_offset;
    size_t count;            /* times it is named in that pickle */
    /* added with readings: */
    const char *reading;     /* the reading it was found in (ckpt_scan_reading.reader) */
    const char *computed_by; /* a name computed at run time: the global whose call made it
                              * (the name is then shown as "<by(...)>.name"); else NULL */
    uint64_t file_offset;    /* OFFSET's byte in the file: where the pickle starts in it
                              * plus OFFSET; UINT64_MAX where the pickle is not in the
                              * file as is (a compressed record, a zstd frame's item) */
} ckpt_scan_hit;

/*
 * A reading: one way some torch.load reads the file (whatever its name).
 * torch 2.x sends a path ending in .safetensors to safetensors; otherwise a
 * zip (PK at byte 0) goes to its zip reader, a file that is a tar to the
 * torch <= 0.1 tar loader, and anything else to the legacy loader, which
 * unpickles from byte 0.  A file is scanned as every reading that applies,
 * and the worst verdict wins.
 */
typedef struct ckpt_scan_reading {
    const char *reader;   /* "zip", "tar", "pickle", "safetensors" */
    const char *who;      /* who reads the file this way, for the user */
    int primary;          /* the reading its format gets (what inspect reads) */
    int code;             /* CKPT_OK, or why this reading stops (torch stops there too) */
    const char *error;    /* that message, or NULL */
    size_t pickles;       /* pickles scanned in it */
    int unsafe;           /* it names a global neither interpreted nor known data */
} ckpt_scan_reading;

CKPT_API ckpt_scan *ckpt_scan_new(void);
CKPT_API void ckpt_scan_free(ckpt_scan *s);
/* Limits as for ckpt_file_set_limit (the size of one pickle above all). */
CKPT_API int ckpt_scan_set_limit(ckpt_scan *s, ckpt_limit which, uint64_t value);
/*
 * Scan PATH.  The hits found are kept even when it fails (a pickle that is
 * malformed after its dangerous part still shows that part); the error is
 * in ckpt_scan_error_code() / ckpt_scan_error_message().
 */
CKPT_API int ckpt_scan_file(ckpt_scan *s, const char *path);
/*
 * Scan PATH as a torch.distributed.checkpoint data file (`*.distcp`): the
 * items back to back, each a torch.save zip (or a zstd frame of one, or the
 * SAFETENSORS serialization's blob, which has no pickle), each zip's pickles
 * named "item at byte N: archive/data.pkl".  An empty file has no items.
 */
CKPT_API int ckpt_scan_items(ckpt_scan *s, const char *path);
CKPT_API int ckpt_scan_error_code(const ckpt_scan *s);
CKPT_API const char *ckpt_scan_error_message(const ckpt_scan *s);
/* PTH_ZIP, PTH_LEGACY, SAFETENSORS, or UNKNOWN with ckpt_scan_is_pickle(). */
CKPT_API ckpt_format ckpt_scan_format(const ckpt_scan *s);
CKPT_API int ckpt_scan_is_pickle(const ckpt_scan *s);
CKPT_API size_t ckpt_scan_pickle_count(const ckpt_scan *s);
CKPT_API const char *ckpt_scan_pickle_name(const ckpt_scan *s, size_t i);
CKPT_API size_t ckpt_scan_hit_count(const ckpt_scan *s);
CKPT_API const ckpt_scan_hit *ckpt_scan_hit_at(const ckpt_scan *s, size_t i);
/* 1 when a global is neither interpreted nor known data. */
CKPT_API int ckpt_scan_unsafe(const ckpt_scan *s);
/* The readings made, in torch.load's order of trying them. */
CKPT_API size_t ckpt_scan_reading_count(const ckpt_scan *s);
CKPT_API const ckpt_scan_reading *ckpt_scan_reading_at(const ckpt_scan *s, size_t i);
/*
 * Where readers of the file would see different content (two zip end
 * records, a FRAME that CPython's unpickler reads otherwise, ...): one
 * sentence each.  Any makes the file "ambiguous": unsafe to call safe.
 */
CKPT_API size_t ckpt_scan_ambiguity_count(const ckpt_scan *s);
CKPT_API const char *ckpt_scan_ambiguity_at(const ckpt_scan *s, size_t i);
/*
 * Code a loader compiles and runs besides the pickles: a TorchScript archive
 * (a constants.pkl record, torch.load's own test), which torch.load hands to
 * torch.jit.load whatever its classes are named.  One sentence each, with
 * the advice (ckpt extract writes the weights only); any makes the file
 * unsafe (ckpt_scan_unsafe).
 */
CKPT_API size_t ckpt_scan_code_count(const ckpt_scan *s);
CKPT_API const char *ckpt_scan_code_at(const ckpt_scan *s, size_t i);

/* ---- will it load? torch.load's weights-only check, modelled -------------- */

/*
 * Whether a plain weights-only torch.load(f) accepts a file, told without
 * Python: torch's weights-only unpickler (opcodes, allow-list, blocked
 * modules, persistent ids, what REDUCE/NEWOBJ/BUILD/APPEND/SETITEM may act
 * on) and the container checks torch.load makes around it, modelled for two
 * versions.  Nothing is run.  Where torch's answer depends on values the
 * model does not follow, it says "accepted": a refusal is one torch
 * certainly makes (ckpt-inspect(1) lists the limits).
 */
typedef enum ckpt_torch {
    CKPT_TORCH_2_6 = 0,  /* "2.6+": plain torch.load(f), modelled on torch 2.15.0 */
    CKPT_TORCH_1_13 = 1, /* "1.13": torch.load(f, weights_only=True), Debian's 1.13.1 */
    CKPT_TORCH_COUNT_
} ckpt_torch;

typedef struct ckpt_torch_verdict {
    const char *version;     /* "2.6+" or "1.13" */
    const char *model;       /* the torch modelled: "torch 2.15.0" */
    int accepted;
    const char *via;         /* "weights-only unpickler", "safetensors", "torch.jit.load" */
    /* when refused, the first thing torch stops at: */
    const char *stop;        /* "global", "opcode", "value", "storage" or "container" */
    const char *global;      /* the global ("module.name"), or NULL */
    int opcode;              /* the opcode's byte, or -1 (a container check, end of data) */
    const char *opcode_name; /* "GLOBAL", "SHORT_BINUNICODE", ...; NULL with opcode -1 */
    const char *pickle;      /* "archive/data.pkl", "pickle 4 (data pickle)"; NULL: container */
    uint64_t offset;         /* of that opcode in that pickle */
    const char *exception;   /* the Python exception torch.load raises: "UnpicklingError" */
    const char *message;     /* its text, as that version prints it (ANSI escapes included) */
    const char *reason;      /* the unpickler's or loader's own words, before torch wraps them */
    const char *fix;         /* what to do (a ckpt command, add_safe_globals), or NULL */
    const char *note;        /* NULL, or what else it needs (a CUDA device for cuda: tags) */
    /* accepted by the model, but ckpt's reader finds the values malformed
     * (a view past its storage, a negative size): torch's rebuild functions,
     * whose value checks are not modelled, then most likely refuse it too.
     * ckpt's message, or NULL. */
    const char *malformed;
    /* the location tags of the storages it read, ", "-separated in order of
     * first appearance ("cpu", "cuda:0, cuda:1"); "" when none */
    const char *devices;
    /* those this machine lacks (ckpt_device_present()), so that plain
     * torch.load fails here even when accepted ("Attempting to deserialize
     * object on a CUDA device"); "" when none.  The note says why, and the
     * fix (also for an accepted file then) remaps them. */
    const char *missing_here;
} ckpt_torch_verdict;

typedef struct ckpt_torch_load ckpt_torch_load;

CKPT_API ckpt_torch_load *ckpt_torch_load_new(void);
CKPT_API void ckpt_torch_load_free(ckpt_torch_load *t);
/*
 * Model torch.load(PATH) for every version.  CKPT_OK when a verdict was
 * reached (accepted or not); an error when the file cannot be read at all
 * (not a zip libzip opens, an I/O error): ckpt_torch_load_error_message().
 */
CKPT_API int ckpt_torch_load_check(ckpt_torch_load *t, const char *path);
/*
 * Let the next checks use F, PATH as the caller already read it with
 * ckpt_file_open and no option changed (no allow-list, default limits),
 * instead of reading the file again: one model in memory, not three (a
 * 100 MB safetensors header).  F must outlive the checks; NULL stops it.
 */
CKPT_API int ckpt_torch_load_use_file(ckpt_torch_load *t, const ckpt_file *f);
/* The verdict for WHICH after a successful check, else NULL; valid until the next check. */
CKPT_API const ckpt_torch_verdict *ckpt_torch_load_verdict(const ckpt_torch_load *t,
                                                           ckpt_torch which);
CKPT_API int ckpt_torch_load_error_code(const ckpt_torch_load *t);
CKPT_API const char *ckpt_torch_load_error_message(const ckpt_torch_load *t);
/*
 * The "torch_load" object of ckpt scan's and ckpt inspect's JSON after a
 * check: one member per version ("2.6+", "1.13"), each verdict's fields, or
 * {"error": message} when the check failed.  malloc'd, for free(); NULL
 * when out of memory.
 */
CKPT_API char *ckpt_torch_load_to_json(const ckpt_torch_load *t);

/* ---- scanning paths: files, folders and DCP data files, as ckpt scan does ---- */

/*
 * ckpt scan PATH...'s engine.  Each path added is scanned in turn: a file
 * with ckpt_scan_file(), a folder (DCP, DeepSpeed, a Hugging Face snapshot,
 * any folder) by its loaders' rules: every file under it, in strcmp() order
 * of their paths "FOLDER/sub/name", scanned as torch.load would read it
 * whatever its name or first bytes; links to files followed (as the hub,
 * DCP and DeepSpeed follow them), links to folders only inside the folder
 * or as DeepSpeed's tag.  A `*.distcp` file, and any file a DCP `.metadata`
 * names, is scanned item by item with ckpt_scan_items().  A file is
 * skipped (listed, with the reason) only when CPython's unpickler would
 * stop in it before importing anything (text, JSON, DeepSpeed's `latest`).
 * A name the folder's metadata gives that leads out of it is an unsafe,
 * unread entry; a FIFO, socket or device is refused unread.  Every file
 * gets an entry with its scan, its verdict and its exit status; the run's
 * status is 1 when any entry is unsafe or ambiguous, else the worst; a
 * folder with nothing scanned is 3.
 */
typedef struct ckpt_scan_paths ckpt_scan_paths;

/* A file's or a run's status, as ckpt scan exits with it; the worst wins. */
enum {
    CKPT_SCAN_EXIT_SAFE = 0,       /* only interpreted and known-data globals */
    CKPT_SCAN_EXIT_UNSAFE = 1,     /* anything else, or readers that would see different content */
    CKPT_SCAN_EXIT_UNREADABLE = 3, /* not readable as any of the formats, nothing unsafe found first */
    CKPT_SCAN_EXIT_IO = 4          /* cannot be opened (a folder: listed), or out of memory */
};

typedef enum ckpt_scan_entry_kind {
    CKPT_SCAN_ENTRY_FILE = 0, /* scanned: scan holds what was found */
    CKPT_SCAN_ENTRY_SKIPPED,  /* a folder's file torch.load would stop in before it
                               * imports anything (text, JSON, empty): reason says why */
    CKPT_SCAN_ENTRY_FOLDER,   /* a folder that could not be listed, or that holds no
                               * checkpoint (its files found before that point follow it) */
    CKPT_SCAN_ENTRY_REFUSED   /* a path under a folder that is not read: not a regular
                               * file (a FIFO: exit 3), a dangling link (4), a name the
                               * folder's metadata gives that leads out of it (unsafe: 1) */
} ckpt_scan_entry_kind;

typedef struct ckpt_scan_entry {
    const char *path;       /* as added, or "FOLDER/sub/name" for a folder's file */
    ckpt_scan_entry_kind kind;
    const ckpt_scan *scan;  /* FILE: its scan (hits, readings, ...); else NULL */
    /* FILE, unless a DCP data file, when ckpt_scan_paths_set_torch_load()
     * is on: the torch.load verdicts (or the check's error); else NULL */
    const ckpt_torch_load *torch_load;
    const char *format;     /* FILE: "pth-zip", ..., "pickle" (a plain pickle file) or "unknown" */
    int code;               /* FILE: the scan's status; FOLDER: CKPT_ERR_IO; SKIPPED: CKPT_OK */
    const char *error;      /* the message of that status, or NULL */
    const char *verdict;    /* FILE: "safe", "unsafe", "ambiguous" or "error"; FOLDER,
                             * REFUSED: "unsafe" or "error"; SKIPPED: NULL */
    int exit;               /* CKPT_SCAN_EXIT_*; SKIPPED: CKPT_SCAN_EXIT_SAFE */
    const char *reason;     /* SKIPPED, FOLDER, REFUSED: why, in words; FILE: NULL */
} ckpt_scan_entry;

CKPT_API ckpt_scan_paths *ckpt_scan_paths_new(void);
CKPT_API void ckpt_scan_paths_free(ckpt_scan_paths *p);
/* Limits for every scan, as for ckpt_scan_set_limit (not for the torch.load check). */
CKPT_API int ckpt_scan_paths_set_limit(ckpt_scan_paths *p, ckpt_limit which, uint64_t value);
/* Whether each file also gets ckpt_torch_load's verdicts (default 1: they
 * are part of the JSON document; 0 saves that second reading of it). */
CKPT_API int ckpt_scan_paths_set_torch_load(ckpt_scan_paths *p, int on);
/* Add PATH (copied) to the paths to scan, after those added before. */
CKPT_API int ckpt_scan_paths_add(ckpt_scan_paths *p, const char *path);
/*
 * Scan every path added, in order, into entries (those of an earlier run
 * are dropped).  CKPT_OK when every path was scanned, whatever was found:
 * the files' findings and errors are in their entries.  An error only when
 * the run stops (out of memory), with its message in the handle; the
 * entries made before stay.
 */
CKPT_API int ckpt_scan_paths_run(ckpt_scan_paths *p);
CKPT_API int ckpt_scan_paths_error_code(const ckpt_scan_paths *p);
CKPT_API const char *ckpt_scan_paths_error_message(const ckpt_scan_paths *p);
CKPT_API size_t ckpt_scan_paths_count(const ckpt_scan_paths *p);
/* Entry I, in the order ckpt scan prints them; NULL past the count. */
CKPT_API const ckpt_scan_entry *ckpt_scan_paths_entry(const ckpt_scan_paths *p, size_t i);
/* The run's CKPT_SCAN_EXIT_* status: UNSAFE when any entry is unsafe or
 * ambiguous, else the worst of its entries' (IO when it stopped); the rule
 * of doc/design.md, "Exit status and messages". */
CKPT_API int ckpt_scan_paths_exit(const ckpt_scan_paths *p);
/* Entry E's outcome, as ckpt scan counts them: "unsafe", "ambiguous",
 * "unreadable" (exit 3), "not_read" (exit 4: cannot be opened), "safe" or
 * "skipped". */
CKPT_API const char *ckpt_scan_entry_outcome(const ckpt_scan_entry *e);
/*
 * The document ckpt scan --json prints (ckpt-scan(1)): {"files": [one
 * object per FILE entry], "skipped": [...], "exit": the run's status,
 * "summary": {"files": N, the count of each outcome}, and when the status
 * is 3 or 4 "error": {"exit", "command": "scan", "file", "message"}, the
 * first entry that failed with it}.  malloc'd, for free(); NULL when out of
 * memory.
 */
CKPT_API char *ckpt_scan_paths_to_json(const ckpt_scan_paths *p);
/*
 * The SARIF 2.1.0 log ckpt scan --format sarif prints (ckpt-scan(1)), for
 * code-scanning systems: one run, its tool ckpt with a rule per kind of
 * finding; one result per global neither interpreted nor known data (level
 * error), per TorchScript archive (error), per ambiguity (warning) and per
 * name a folder's metadata gives outside it (error), each located at the
 * entry's path (a relative URI as given, or a file: URI) with the byte in
 * the file where it is known, and the pickle and the offset in it in the
 * message and the properties; a file that cannot be read or was skipped is
 * a tool execution notification, and the invocation's executionSuccessful
 * is false when any file could not be read.  malloc'd, for free(); NULL
 * when out of memory.
 */
CKPT_API char *ckpt_scan_paths_to_sarif(const ckpt_scan_paths *p);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_H */
