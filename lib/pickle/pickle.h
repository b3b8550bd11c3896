/*
 * pickle/pickle.h - the value tree (values, tensor views, storage records),
 * the classes of globals, the safe reader VM and the protocol-2 writer.
 * Below the checkpoint: it knows storages as records that a persistent-id
 * callback hands it, never the file they came from.
 */
#ifndef CKPT_PICKLE_H
#define CKPT_PICKLE_H

#include "core/core.h"
#include "pickle/opcodes.h"

/* ---- the value tree ------------------------------------------------------ */

enum {
    CKPT_VF_ORDERED = 1 << 0,   /* DICT is an OrderedDict */
    CKPT_VF_BYTEARRAY = 1 << 1, /* BYTES came from BYTEARRAY8 */
    CKPT_VF_WALKING = 1 << 2,   /* on the walk's stack (cycle guard) */
    CKPT_VF_VISITED = 1 << 3,   /* already walked */
    CKPT_VF_EMITTING = 1 << 4,  /* the writer is inside it (cycle guard) */
    CKPT_VF_MODULE = 1 << 5,    /* an OBJECT that is an nn.Module: NEWOBJ of a class and a
                                 * BUILD of a dict with _parameters, _buffers, _modules */
    CKPT_VF_MODULE_SD = 1 << 6, /* a DICT made from a module tree, not in the file */
    CKPT_VF_TORCHSCRIPT = 1 << 7 /* a MODULE_SD of a TorchScript archive's module (its
                                  * code/ lists name the tensors; no _metadata) */
};

/* How an OBJECT was built, so a writer can rebuild it the same way. */
typedef enum ckpt_obj_how {
    CKPT_OBJ_REDUCE = 0,
    CKPT_OBJ_NEWOBJ,
    CKPT_OBJ_NEWOBJ_EX,
    CKPT_OBJ_INST,  /* protocol 0 INST / OBJ */
    CKPT_OBJ_OBJ
} ckpt_obj_how;

/* 32-bit counts (ckpt_vec_push refuses more): a value is 80 bytes, not 128 */
typedef struct ckpt_vec {
    ckpt_value **items;
    uint32_t len, cap;
} ckpt_vec;

/* APPEND(S) and SETITEM(S) on an OBJECT: apart, since most objects have none */
typedef struct ckpt_obj_items {
    ckpt_vec listitems;
    ckpt_vec dictkeys, dictvals;
} ckpt_obj_items;

struct ckpt_value {
    uint8_t kind;
    uint8_t flags;
    uint8_t how;     /* OBJECT: ckpt_obj_how (here, in the padding, not in u.obj: a value
                      * is 128 bytes, not 136; issue 26, a header of 1.7 M tensors) */
    uint32_t depth;  /* containers: levels of items below, as the VM built it (--max-depth) */
    uint64_t offset; /* byte offset of the creating opcode in its pickle */
    union {
        int b;
        struct {
            int64_t v;
            bool big;            /* does not fit in int64 */
            const uint8_t *bytes; /* LE two's complement, set for every int */
            size_t nbytes;
        } i;
        double f;
        struct {
            char *s;
            size_t len;
        } s;
        ckpt_vec seq; /* LIST, TUPLE, SET, FROZENSET */
        struct {
            ckpt_vec keys, vals;
            ckpt_value *state; /* BUILD state (OrderedDict's __dict__) */
            const char *module_class; /* MODULE_SD: the class of the module it is of, */
            const char *unknown_version; /* and one whose _version the file lacks */
        } dict;
        struct {
            char *name;      /* "module.name" */
            uint16_t modlen; /* the module part is name[0..modlen) */
            uint8_t cls;     /* ckpt_global_class */
            /* a REFUSED class is admitted only as the class of modules: every
             * time it lands on the stack (refs) a NEWOBJ takes it (modules) */
            uint32_t refs, modules;
        } global;
        struct {
            ckpt_value *callable; /* a GLOBAL */
            ckpt_value *args;     /* TUPLE or NULL */
            ckpt_value *kwargs;   /* NEWOBJ_EX kwargs or NULL */
            ckpt_value *state;    /* BUILD state or NULL */
            ckpt_obj_items *items; /* NULL until an APPEND or SETITEM: ckpt_obj_items_of() */
            struct ckpt_value *module_sd; /* MODULE: its state dict, once made */
        } obj;
        struct ckpt_tensor *tensor;
        struct {
            struct ckpt_storage *ptr;
            ckpt_dtype dtype;      /* of this reference's storage type */
            const char *type_name; /* "FloatStorage" */
        } st;
    } u;
};

struct ckpt_tensor {
    ckpt_dtype dtype;
    int ndim;
    int64_t *shape;
    int64_t *stride;
    int64_t offset;
    int64_t numel;
    bool requires_grad;
    bool parameter;
    uint8_t kind;               /* ckpt_tensor_kind (beside the bools: 176 bytes, not 184) */
    uint8_t made_dtype;         /* REBUILD_ARGS NULL: the dtype it was made with (the writer's
                                 * storage reference names it, as torch.save would have) */
    struct ckpt_storage *storage;
    /* The call that built it, kept for writers: "_rebuild_tensor_v2", ... */
    const char *rebuild;
    /* the tensor call's argument tuple; NULL for a tensor made outside a
     * pickle (ckpt_tensor_value_new), whose tuple the writer makes from the
     * fields above: ten values a tensor fewer (issue 26: 1.7 M tensors) */
    ckpt_value *rebuild_args;
    ckpt_value *param_args;     /* _rebuild_parameter's arguments, or NULL */
    const char *param_rebuild;
    ckpt_value *state;          /* BUILD on the tensor, or NULL */
    /* _rebuild_from_type_v2(rebuild, torch.Tensor, rebuild_args, state):
     * the whole argument tuple, written back around the inner call */
    ckpt_value *type_args;
    const char *device;         /* NULL: the storage's (or meta's) tag */
    ckpt_qparams *q;            /* QUANTIZED (apart: 40 bytes a tensor less for the others) */
    const struct ckpt_tensor *values; /* SPARSE_*: the values part */
    /* a rank's local shard of a ShardedTensor / DTensor (rebuild_sharded):
     * the fields above are the local tensor's, written as a plain tensor */
    const ckpt_shard_info *shard;
};

struct ckpt_source; /* checkpoint/checkpoint.h */

/* Where a storage's bytes are.  They are read in one place
 * (checkpoint/tensor_data.c: ckpt_storage_read, _stream, _raw_range); a new
 * kind of input (chunks placed at offsets of the whole, a decompressed or
 * byte-swapped stream) adds a kind here and a case there. */
typedef enum ckpt_loc_kind {
    CKPT_LOC_NONE = 0,   /* not located (a reader fills it in) */
    CKPT_LOC_ZIP_RECORD, /* record zip_index of src->zip (stored or deflated) */
    CKPT_LOC_FILE_RANGE, /* nbytes raw at file_offset of src->fd */
    CKPT_LOC_PIECES      /* the concatenation of pieces[0..npieces) (ckpt_piece) */
} ckpt_loc_kind;

/* One run of a PIECES storage's bytes: NBYTES at DST_OFFSET of the storage,
 * read from FILE_OFFSET of SRC (opened on demand: ckpt_source_fd), or from
 * MEM when the reader holds them (a decompressed item).  HAS_CRC: the piece
 * is a whole container record whose CRC-32 is CRC32, checked whenever the
 * piece is read whole. */
typedef struct ckpt_piece {
    struct ckpt_source *src;
    const uint8_t *mem;
    uint64_t file_offset;
    uint64_t nbytes;
    uint64_t dst_offset;
    bool has_crc;
    uint32_t crc32;
    /* the CRC-32 of its bytes as a write read them (ckpt_storage_pieces_crc),
     * for the folder's records check that follows that write */
    bool seen;
    uint32_t seen_crc;
} ckpt_piece;

struct ckpt_storage {
    char *key;              /* unique in the file (shards: "shard:key") */
    const char *src_key;    /* the key as its own file names it */
    const struct ckpt_source *src; /* the file the bytes are in */
    ckpt_dtype dtype;      /* from the storage type (v3: the tensor dtype); after a cast, the new one */
    ckpt_dtype src_dtype;  /* as stored in the source */
    uint64_t src_nbytes;   /* as stored in the source */
    const char *type_name; /* "FloatStorage" as in the file */
    int64_t numel;
    uint64_t nbytes;
    char *device;
    size_t index;
    /* where the bytes are */
    ckpt_loc_kind loc;
    int64_t zip_index;     /* ZIP_RECORD: libzip index of data/<key> */
    uint64_t file_offset;  /* FILE_RANGE: offset of the first data byte */
    const ckpt_piece *pieces; /* PIECES: sorted by dst_offset, tiling the bytes */
    size_t npieces;
    const ckpt_chunk *chunks; /* a folder's tensor: the parts it was assembled from */
    size_t nchunks;
    bool big_endian;       /* stored big-endian (a zip's byteorder record): read
                            * in this machine's order, copied as stored */
    bool has_crc;          /* the container records a CRC-32 of the bytes: */
    uint32_t crc32;        /* checked whenever they are read whole */
    /* a PyTorch 0.3 storage view (legacy view_metadata): nbytes at
     * VIEW_OFFSET bytes into VIEW_ROOT, located once the root is */
    struct ckpt_storage *view_root;
    uint64_t view_offset;
};

/* ---- values: constructors and helpers used by the VM and walkers ---------- */

ckpt_value *ckpt_value_new(ckpt_arena *a, ckpt_kind kind, uint64_t offset);
/* An OBJECT's APPEND/SETITEM items; empty ones when it has none. */
const ckpt_obj_items *ckpt_obj_items_of(const ckpt_value *obj);
/* Append to a vector; grows inside the arena.  -1 on OOM. */
int ckpt_vec_push(ckpt_arena *a, ckpt_vec *v, ckpt_value *item);
/* Room for N items in all (no doubling left behind when the count is known).  -1 on OOM. */
int ckpt_vec_reserve(ckpt_arena *a, ckpt_vec *v, size_t n);
bool ckpt_value_is_str(const ckpt_value *v, const char *s);
const char *ckpt_kind_name(ckpt_kind kind);

/* ---- globals --------------------------------------------------------------- */

/* Classify without the user's allow-list: INTERPRETED, KNOWN_DATA or REFUSED. */
ckpt_global_class ckpt_globals_builtin_class(const char *qualified_name);
/* Whether getattr(CLS, ATTR) is data (an enum member: DCP's
 * _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, DeepSpeed's
 * ZeroStageEnum.optimizer_states); builtins.getattr is otherwise never
 * admitted, and admitted only for these, with CLS known data. */
bool ckpt_globals_getattr_known(const char *cls, const char *attr);
/* Globals that run commands or code: never admitted, whatever the options. */
bool ckpt_globals_dangerous(const char *qualified_name);
/* Python 2 names as pickle's fix_imports maps them in a protocol < 3 stream
 * (_compat_pickle's NAME_MAPPING, else IMPORT_MAPPING: __builtin__.xrange ->
 * builtins.range); true when renamed.  The results are static or the input. */
bool ckpt_globals_py3_name(const char *mod, const char *name, const char **mod3,
                           const char **name3);
/* The spelling a protocol-2 stream gives MOD.NAME so that it reads back as
 * that name (builtins.range -> __builtin__.xrange, as Python's pickler
 * writes it); false when no spelling does. */
bool ckpt_globals_py2_name(const char *mod, const char *name, const char **mod2,
                           const char **name2);
/* "FloatStorage" (with or without "torch." / "torch.cuda.") -> dtype. */
ckpt_dtype ckpt_storage_type_dtype(const char *qualified_name, const char **short_name);
/* Whether Q is one of torch <= 0.1's tensor classes (torch.FloatTensor,
 * torch.cuda.LongTensor: a storage type's name with Tensor), which a tar
 * checkpoint's tensors member names and torch imports and ignores. */
bool ckpt_tensor_type_known(const char *q);

/* UTF-8 as Python's decoder with 'surrogatepass' accepts it. */
bool ckpt_utf8_valid(const uint8_t *s, size_t n);

/* A tensor value as torch.save would pickle it: _rebuild_tensor_v2 (or _v3
 * for dtypes without a typed storage) over STORAGE.  Its argument tuple is
 * not built (rebuild_args NULL): the writer writes it from the fields. */
ckpt_value *ckpt_tensor_value_new(ckpt_arena *a, struct ckpt_storage *storage, ckpt_dtype dtype,
                                  int ndim, const int64_t *shape, const int64_t *stride,
                                  int64_t offset);
/* "FloatStorage" for float32...; NULL for dtypes saved as UntypedStorage. */
const char *ckpt_storage_type_name(ckpt_dtype dtype);

/* ---- the pickle VM ---------------------------------------------------------- */

/* How the bytes reach the unpickler; CPython's C unpickler reads them
 * differently after a FRAME (Modules/_pickle.c, _Unpickler_ReadImpl):
 * it reads the whole frame into its buffer; a later read of n bytes that
 * needs more than the buffer has left DROPS those bytes and reads n fresh
 * bytes from the file position, which is after the frame (readline too:
 * a line not ended inside the buffer is read whole from the file).
 * - FILE: the bytes are read contiguously, as the C unpickler reads a
 *   buffer (pickle.loads) or a real file whose frames it peeks.
 * - BYTESIO: drop-and-refill, as it reads an io.BytesIO, which is how
 *   torch.load feeds a zip's data.pkl.
 * A real file (torch's legacy loader: a BufferedReader whose buffer is the
 * file system's st_blksize, 4 KiB to megabytes) is read both ways, frame by
 * frame: a FRAME that lies in the buffer's rest changes nothing; one under
 * 128 KiB (PREFETCH) that fits what peek() returns (the buffer's rest, or a
 * whole buffer) is peeked, and read on contiguously (FILE); any other is
 * read with read() and is dropped at its end (BYTESIO).  Which it is
 * depends on the buffer's size and boundaries, which ckpt cannot know, so
 * a file is read with CHOOSE.  A pickle.load after STOP starts where the
 * last one left the file: after STOP (peeked) or at the frame's end (read).
 * - CHOOSE: a real file as it is, its buffer's size and boundaries unknown:
 *   each point where FILE and BYTESIO differ (a read crossing a frame's end,
 *   or STOP inside a frame, with bytes of the frame left) goes the way bit
 *   NDIVERGE of DROPS says (1: read whole, the rest dropped; bits past 63:
 *   peeked).  A caller walks every choice (ckpt scan); a reader, which
 *   cannot know which is torch's, refuses a pickle that has such a point.
 * BINBYTES/SHORT_BINBYTES/BINBYTES8/BYTEARRAY8 data is read with readinto,
 * which takes the buffer's rest first: contiguous in every feed. */
typedef enum ckpt_pickle_feed {
    CKPT_FEED_FILE = 0,
    CKPT_FEED_BYTESIO = 1,
    CKPT_FEED_CHOOSE = 2
} ckpt_pickle_feed;

typedef struct ckpt_pickle_ctx {
    const char *name;                 /* for messages: "archive/data.pkl" */
    const uint64_t *limits;           /* CKPT_LIMIT_COUNT_ values */
    /* Classify "module.name"; may return ALLOWED for user-admitted ones. */
    ckpt_global_class (*classify)(void *user, const char *qualified_name);
    /* Turn a persistent id into a value (a STORAGE); NULL + error to fail. */
    ckpt_value *(*persistent_load)(void *user, ckpt_value *pid, uint64_t offset,
                                   ckpt_error *err);
    void *user;
    ckpt_arena *arena;
    /* ckpt scan (SCAN set): every global the pickle names (ON_GLOBAL) and every call or
     * BUILD that uses one (ON_USE) is reported, with the opcode and its
     * offset; unknown and dangerous globals are then kept as opaque objects
     * instead of failing, and torch's rebuild functions are not interpreted
     * (nothing is ever imported or called either way). */
    void (*on_global)(void *user, const char *qualified_name, ckpt_global_class cls, int opcode,
                      uint64_t offset);
    void (*on_use)(void *user, const char *qualified_name, int opcode, uint64_t offset);
    /* Scanning: a name computed at run time - STACK_GLOBAL whose module or name
     * is the result of a call (_codecs.encode('bf', 'rot13') -> 'os'), or a
     * getattr-like global called on a call's result.  SHOWN_NAME is what it
     * can be shown as ("<_codecs.encode(...)>.system"), MADE_BY the global
     * whose call made the operand ("_codecs.encode").  The VM then goes on
     * with an opaque value (the reader refuses the file instead).  Optional:
     * NULL reports nothing. */
    void (*on_computed)(void *user, const char *shown_name, const char *made_by, int opcode,
                        uint64_t offset);
    /* Scanning, at STOP: every use of builtins.getattr in the pickle was
     * getattr(<class>, <member>) of a pair ckpt_globals_getattr_known admits
     * (SHOWN: the first, "builtins.getattr(cls, 'member')"), so that it is
     * known data there, not a way to run code.  Optional. */
    void (*on_getattr_data)(void *user, const char *shown);
    bool scan;
    ckpt_pickle_feed feed; /* in: how the bytes are read (FILE by default) */
    /* out: a read crossed the end of a FRAME's buffer while bytes of it were
     * left, the one case where FILE and BYTESIO read different bytes; set by
     * either feed, never cleared by the VM */
    bool frame_crossed;
    /* out: STOP came with bytes of a FRAME's buffer left after it: the file
     * position, and so the next pickle of a stream, depends on the feed */
    bool frame_stop;
    /* CHOOSE: the choice at each point where the feeds differ (see above) */
    uint64_t drops;
    /* in/out: such points met so far (a stream's pickles carry it on) */
    uint64_t ndiverge;
} ckpt_pickle_ctx;

/*
 * Run the VM over BUF[0..LEN) until STOP, reading as CTX->feed says.
 * *CONSUMED gets where the file position ends (also on error): after STOP
 * for FILE; for BYTESIO, where the C unpickler leaves a BytesIO, which is
 * the end of the last frame read when STOP lies inside it (a legacy file is
 * several pickles back to back: the next one starts there); for CHOOSE,
 * either, as the choice at that STOP says.  Reading (not SCAN) with CHOOSE,
 * a pickle with a point where the feeds differ is refused (CKPT_ERR_FORMAT).
 * Scanning, the VM stops exactly where the C unpickler does (an error or
 * STOP), with every object a call makes taken as a stand-in that accepts
 * any arguments, state, items and keys (it cannot know what the real
 * callable does); only resource limits stop it earlier.
 */
int ckpt_pickle_load(ckpt_pickle_ctx *ctx, const uint8_t *buf, size_t len,
                     ckpt_value **out, size_t *consumed, ckpt_error *err);

/* ---- the pickle writer ------------------------------------------------------ */

typedef struct ckpt_pickle_out {
    uint8_t *buf;
    size_t len, cap;
    size_t *order;  /* input storage indices in output key order ("0", "1", ...) */
    size_t norder;
    uint32_t *fetched; /* the memo indices a BINGET reads, sorted, each once (ckpt_wo_ctx) */
    size_t nfetched;
} ckpt_pickle_out;

/* Protocol-2 pickle of ROOT; storages are renumbered in first-reference order. */
int ckpt_pickle_write(ckpt_arena *a, size_t nstorages, const ckpt_value *root,
                      ckpt_pickle_out *out, ckpt_error *err);
/* LEGACY: persistent ids as the pre-1.6 format writes them. */
int ckpt_pickle_write2(ckpt_arena *a, size_t nstorages, const ckpt_value *root, bool legacy,
                       ckpt_pickle_out *out, ckpt_error *err);
enum {
    CKPT_PICKLE_LEGACY = 1 << 0,   /* as ckpt_pickle_write2's LEGACY */
    CKPT_PICKLE_KEEP_KEYS = 1 << 1 /* each storage keeps its src_key (an in-place rewrite,
                                    * whose records keep their names); order as ever */
};
int ckpt_pickle_write3(ckpt_arena *a, size_t nstorages, const ckpt_value *root, unsigned flags,
                       ckpt_pickle_out *out, ckpt_error *err);
void ckpt_pickle_out_free(ckpt_pickle_out *out);

#endif /* CKPT_PICKLE_H */
