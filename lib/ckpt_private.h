/*
 * ckpt_private.h - structures and helpers shared inside libckpt.
 * Nothing here is installed or visible to users of lib/ckpt.h.
 */
#ifndef CKPT_PRIVATE_H
#define CKPT_PRIVATE_H

#include "config.h"
#include "ckpt.h"
#include "cast_private.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

#define CKPT_FILE_MAGIC 0x636b7074u /* "ckpt" */
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

/* ---- the value tree ------------------------------------------------------ */

enum {
    CKPT_VF_ORDERED = 1 << 0,   /* DICT is an OrderedDict */
    CKPT_VF_BYTEARRAY = 1 << 1, /* BYTES came from BYTEARRAY8 */
    CKPT_VF_WALKING = 1 << 2,   /* on the walk's stack (cycle guard) */
    CKPT_VF_VISITED = 1 << 3,   /* already walked */
    CKPT_VF_EMITTING = 1 << 4   /* the writer is inside it (cycle guard) */
};

/* How an OBJECT was built, so a writer can rebuild it the same way. */
typedef enum ckpt_obj_how {
    CKPT_OBJ_REDUCE = 0,
    CKPT_OBJ_NEWOBJ,
    CKPT_OBJ_NEWOBJ_EX,
    CKPT_OBJ_INST,  /* protocol 0 INST / OBJ */
    CKPT_OBJ_OBJ
} ckpt_obj_how;

typedef struct ckpt_vec {
    ckpt_value **items;
    size_t len, cap;
} ckpt_vec;

struct ckpt_value {
    uint8_t kind;
    uint8_t flags;
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
        } dict;
        struct {
            char *name;      /* "module.name" */
            uint16_t modlen; /* the module part is name[0..modlen) */
            uint8_t cls;     /* ckpt_global_class */
        } global;
        struct {
            ckpt_value *callable; /* a GLOBAL */
            ckpt_value *args;     /* TUPLE or NULL */
            ckpt_value *kwargs;   /* NEWOBJ_EX kwargs or NULL */
            ckpt_value *state;    /* BUILD state or NULL */
            ckpt_vec listitems;   /* APPEND(S) on the object */
            ckpt_vec dictkeys, dictvals; /* SETITEM(S) on the object */
            uint8_t how;          /* ckpt_obj_how */
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
    struct ckpt_storage *storage;
    /* The call that built it, kept for writers: "_rebuild_tensor_v2", ... */
    const char *rebuild;
    ckpt_value *rebuild_args;   /* the tensor call's argument tuple */
    ckpt_value *param_args;     /* _rebuild_parameter's arguments, or NULL */
    const char *param_rebuild;
    ckpt_value *state;          /* BUILD on the tensor, or NULL */
};

/* A file that storages' bytes live in (one, or each shard of a sharded set). */
typedef struct ckpt_source {
    ckpt_format format; /* pth-zip, pth-legacy or safetensors */
    int fd;
    struct ckpt_zip *zip;
    uint64_t file_size;
    char *path;
} ckpt_source;

struct ckpt_storage {
    char *key;              /* unique in the file (shards: "shard:key") */
    const char *src_key;    /* the key as its own file names it */
    const ckpt_source *src; /* where the bytes are */
    ckpt_dtype dtype;      /* from the storage type (v3: the tensor dtype); after a cast, the new one */
    ckpt_dtype src_dtype;  /* as stored in the source */
    uint64_t src_nbytes;   /* as stored in the source */
    const char *type_name; /* "FloatStorage" as in the file */
    int64_t numel;
    uint64_t nbytes;
    char *device;
    size_t index;
    /* where the bytes are */
    int64_t zip_index;     /* pth-zip: libzip index of data/<key> */
    uint64_t file_offset;  /* pth-legacy: offset of the first data byte */
    uint32_t crc32;        /* pth-zip: CRC from the central directory */
    struct ckpt_storage *hash_next;
};

/* ---- values: constructors and helpers used by the VM and walkers ---------- */

ckpt_value *ckpt_value_new(ckpt_arena *a, ckpt_kind kind, uint64_t offset);
/* Merge repeated str/int keys the way Python's dict does (first position,
 * last value).  -1 on OOM. */
int ckpt_dict_dedupe(ckpt_arena *a, ckpt_value *dict);
/* Append to a vector; grows inside the arena.  -1 on OOM. */
int ckpt_vec_push(ckpt_arena *a, ckpt_vec *v, ckpt_value *item);
bool ckpt_value_is_str(const ckpt_value *v, const char *s);
const char *ckpt_kind_name(ckpt_kind kind);

/* ---- globals --------------------------------------------------------------- */

/* Classify without the user's allow-list: INTERPRETED, KNOWN_DATA or REFUSED. */
ckpt_global_class ckpt_globals_builtin_class(const char *qualified_name);
/* Globals that run commands or code: never admitted, whatever the options. */
bool ckpt_globals_dangerous(const char *qualified_name);
/* Python 2 module names as pickle's fix_imports maps them ("__builtin__"). */
const char *ckpt_globals_py3_module(const char *module);
/* "FloatStorage" (with or without "torch." / "torch.cuda.") -> dtype. */
ckpt_dtype ckpt_storage_type_dtype(const char *qualified_name, const char **short_name);

/* UTF-8 as Python's decoder with 'surrogatepass' accepts it. */
bool ckpt_utf8_valid(const uint8_t *s, size_t n);

/* A tensor value as torch.save would pickle it: _rebuild_tensor_v2 (or _v3
 * for dtypes without a typed storage) over STORAGE. */
ckpt_value *ckpt_tensor_value_new(ckpt_file *f, struct ckpt_storage *storage, ckpt_dtype dtype,
                                  int ndim, const int64_t *shape, const int64_t *stride,
                                  int64_t offset);
/* "FloatStorage" for float32...; NULL for dtypes saved as UntypedStorage. */
const char *ckpt_storage_type_name(ckpt_dtype dtype);

/* ---- the pickle VM ---------------------------------------------------------- */

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
    /* ckpt scan: every global the pickle names (ON_GLOBAL) and every call or
     * BUILD that uses one (ON_USE) is reported, with the opcode and its
     * offset; unknown and dangerous globals are then kept as opaque objects
     * instead of failing, and torch's rebuild functions are not interpreted
     * (nothing is ever imported or called either way). */
    void (*on_global)(void *user, const char *qualified_name, ckpt_global_class cls, int opcode,
                      uint64_t offset);
    void (*on_use)(void *user, const char *qualified_name, int opcode, uint64_t offset);
} ckpt_pickle_ctx;

/*
 * Run the VM over BUF[0..LEN) until STOP.  *CONSUMED gets the bytes used
 * (a legacy file is several pickles back to back).
 */
int ckpt_pickle_load(ckpt_pickle_ctx *ctx, const uint8_t *buf, size_t len,
                     ckpt_value **out, size_t *consumed, ckpt_error *err);

/* ---- the pickle writer ------------------------------------------------------ */

typedef struct ckpt_pickle_out {
    uint8_t *buf;
    size_t len, cap;
    size_t *order;  /* input storage indices in output key order ("0", "1", ...) */
    size_t norder;
} ckpt_pickle_out;

/* Protocol-2 pickle of ROOT; storages are renumbered in first-reference order. */
int ckpt_pickle_write(ckpt_file *f, const ckpt_value *root, ckpt_pickle_out *out,
                      ckpt_error *err);
/* LEGACY: persistent ids as the pre-1.6 format writes them. */
int ckpt_pickle_write2(ckpt_file *f, const ckpt_value *root, bool legacy, ckpt_pickle_out *out,
                       ckpt_error *err);
void ckpt_pickle_out_free(ckpt_pickle_out *out);

/* ---- containers -------------------------------------------------------------- */

typedef struct ckpt_zip ckpt_zip;

int ckpt_zip_open(const char *path, ckpt_zip **out, ckpt_error *err);
void ckpt_zip_close(ckpt_zip *z);
int64_t ckpt_zip_count(const ckpt_zip *z);
const char *ckpt_zip_name(const ckpt_zip *z, int64_t i);
/* Case-insensitive lookup as torch's miniz does; -1 when absent. */
int64_t ckpt_zip_find(const ckpt_zip *z, const char *name);
uint64_t ckpt_zip_size(const ckpt_zip *z, int64_t i);
uint32_t ckpt_zip_crc(const ckpt_zip *z, int64_t i);
/* Read a whole record into a fresh malloc'd buffer (at most MAX bytes),
 * verifying its CRC-32. */
int ckpt_zip_read_all(ckpt_zip *z, int64_t i, uint64_t max, uint8_t **out,
                      size_t *len, ckpt_error *err);
/* Read [offset, offset+len) of a record.  When the range is the whole record
 * the CRC-32 is verified too. */
int ckpt_zip_read(ckpt_zip *z, int64_t i, uint64_t offset, void *buf, size_t len,
                  ckpt_error *err);

/* Read record I start to end, handing each chunk to SINK; the CRC-32 is
 * checked at the end (bounded memory, one pass even when deflated). */
int ckpt_zip_stream(ckpt_zip *z, int64_t i, int (*sink)(void *user, const uint8_t *p, size_t n),
                    void *user, ckpt_error *err);

/* File offset of a stored record's first data byte (from the central
 * directory and the local header); CKPT_ERR_UNSUPPORTED when compressed. */
int ckpt_zip_data_offset(ckpt_zip *z, int fd, uint64_t file_size, int64_t i, uint64_t *offset,
                         ckpt_error *err);

/* The writer of torch's zip layout (container_zip_write.c). */
typedef struct ckpt_zipw ckpt_zipw;
ckpt_zipw *ckpt_zipw_new(int fd, ckpt_error *err);
void ckpt_zipw_free(ckpt_zipw *w);
/* Start record NAME of SIZE bytes: local header + FB padding; *data_at gets the
 * file offset where its data goes (a multiple of 64). */
int ckpt_zipw_begin(ckpt_zipw *w, const char *name, uint64_t size, uint64_t *data_at);
/* The file descriptor written to. */
int ckpt_zipw_fd(const ckpt_zipw *w);
/* Append data of the current record (pwrite at the cursor). */
int ckpt_zipw_write(ckpt_zipw *w, const void *p, size_t n);
/* Account for N data bytes placed at the cursor by someone else (copy_file_range). */
void ckpt_zipw_advance(ckpt_zipw *w, uint64_t n);
/* End the current record: its data descriptor. */
int ckpt_zipw_end(ckpt_zipw *w, uint32_t crc);
/* Central directory and end records. */
int ckpt_zipw_finish(ckpt_zipw *w);

/* ---- moving storage bytes (format_pth_zip_write.c) --------------------------------- */

/* Kernel-side copy of LEN bytes (copy_file_range), a bounded buffer where the
 * kernel declines. */
int ckpt_copy_range(int in, uint64_t in_off, int out, uint64_t out_off, uint64_t len,
                    ckpt_error *err);
/* Storage S's bytes as the output needs them (cast when S was cast), CRC-checked
 * against the source where it has a CRC: into a malloc'd *BUF of S->nbytes. */
int ckpt_storage_load(ckpt_file *f, const ckpt_storage *s, uint8_t **buf);
/* The same bytes handed to SINK in pieces (bounded memory, cast on the way,
 * the source's CRC checked at the end). */
int ckpt_storage_stream(ckpt_file *f, const ckpt_storage *s,
                        int (*sink)(void *user, const uint8_t *p, size_t n), void *user);

/* pwrite all N bytes at OFF. */
int ckpt_write_all(int fd, const void *buf, size_t n, uint64_t off, ckpt_error *err);
/* pread all N bytes at AT: CKPT_OK, CKPT_ERR_IO, or CKPT_ERR_FORMAT at end of file. */
int ckpt_pread_all(int fd, void *buf, size_t n, uint64_t at);
/* A sink for ckpt_storage_stream that writes each piece after the last. */
typedef struct ckpt_fd_sink {
    int fd;
    uint64_t at;
    ckpt_error *err;
} ckpt_fd_sink;
int ckpt_fd_sink_write(void *sink, const uint8_t *p, size_t n);
/* CRC-32 of LEN bytes of FD at OFF (a bounded buffer). */
int ckpt_crc_range(int fd, uint64_t off, uint64_t len, uint32_t *crc, ckpt_error *err);
/* Two names for one thing: the same storage, offset, shape, stride, dtype. */
bool ckpt_tensor_same_view(const ckpt_tensor *a, const ckpt_tensor *b);
/* Copy the view's elements in C order from its storage's bytes SRC. */
void ckpt_tensor_gather(const ckpt_tensor *t, const uint8_t *src, uint8_t *dst);
/* The mapping at SELECT ("a/b/0"); errors name what is missing. */
int ckpt_file_find_mapping(ckpt_file *f, const char *select, ckpt_value **out, ckpt_path *path);
/* One file (not a sharded set), atomically, checks done. */
int ckpt_file_write_one(ckpt_file *f, const char *path, const ckpt_write_options *opt);
/* PATH.index.json and its shards. */
int ckpt_sharded_write(ckpt_file *f, const char *path, const ckpt_write_options *opt);
/* The mapping a tensors-only format writes: SELECT, the root when it is all
 * tensors, or the file's one state dict. */
int ckpt_pick_state_dict(ckpt_file *f, const char *select, const ckpt_value **out);
/* Format bodies of ckpt_file_write, writing to the open OUT. */
int ckpt_safetensors_write(ckpt_file *f, int out, const ckpt_write_options *opt);
int ckpt_pth_legacy_write(ckpt_file *f, int out, const ckpt_write_options *opt);

/* ---- atomic output (output_file.c) ------------------------------------------------ */

typedef struct ckpt_out {
    int fd;
    char *path, *dir;
    char *tmp; /* a named temporary file, when there is one */
} ckpt_out;

int ckpt_out_open(ckpt_out *o, const char *path, ckpt_error *err);
/* fsync, then give the file its name (replacing an existing one). */
int ckpt_out_commit(ckpt_out *o, ckpt_error *err);
/* Close and remove whatever was written. */
void ckpt_out_abort(ckpt_out *o);

/* ---- the file handle ------------------------------------------------------------ */

typedef struct ckpt_walk_entry {
    const ckpt_value *value;
    ckpt_path path;
} ckpt_walk_entry;

typedef struct ckpt_walk_list {
    ckpt_walk_entry *items;
    size_t len, cap;
} ckpt_walk_list;

struct ckpt_file {
    uint32_t magic;
    ckpt_error err;
    ckpt_arena arena;
    uint64_t limits[CKPT_LIMIT_COUNT_];
    char **allowed;        /* malloc'd user allow-list */
    size_t nallowed;
    bool allow_unknown;
    bool opened;

    char *path;
    ckpt_format format;
    const char *prefix;     /* the main file's archive prefix */
    const char *cur_prefix; /* the prefix of the zip being read */
    const char **records;
    size_t nrecords;

    ckpt_value *root;
    ckpt_value *file_root;  /* the root as read, when ckpt_file_select changed root */
    struct ckpt_storage **storages;
    size_t nstorages, storages_cap;
    struct ckpt_storage **storage_hash;
    size_t storage_hash_size;

    ckpt_walk_list tensors, state_dicts, objects;

    ckpt_source main;      /* the file opened (the first shard of a sharded set) */
    ckpt_source **shards;  /* sharded: every shard, main excluded */
    size_t nshards;
    ckpt_source *cur_src;  /* the source whose pickle is being read */
    const char *key_prefix;/* sharded: prefix making storage keys unique */
    ckpt_value *st_metadata; /* safetensors __metadata__ (a dict of str), or NULL */
    uint64_t dev, ino;     /* to refuse writing over the input */
    uint32_t mode;     /* kept when the input is replaced */
};

void ckpt_source_close(ckpt_source *src);

/* Format readers fill f->root, f->storages and their data locations. */
int ckpt_pth_zip_open(ckpt_file *f, ckpt_value **root);
int ckpt_pth_legacy_open(ckpt_file *f, const uint8_t *map, size_t size, ckpt_value **root);
/* safetensors dtype names ("F32") and back; UNKNOWN / NULL if none. */
ckpt_dtype ckpt_safetensors_dtype(const char *name);
const char *ckpt_safetensors_dtype_name(ckpt_dtype dtype);
/* safetensors at f->cur_src: an OrderedDict of tensors into *ROOT. */
int ckpt_safetensors_open(ckpt_file *f, ckpt_value **root);
/* a *.index.json at f->path naming shards. */
int ckpt_sharded_open(ckpt_file *f, const uint8_t *text, size_t len);
/* the type of a file from its first bytes: zip, legacy pickle or safetensors */
ckpt_format ckpt_sniff_format(const uint8_t *head, size_t n, uint64_t file_size);
/* Open SRC->path (format sniffed) and read its content into *ROOT with
 * storages keyed under f->key_prefix. */
int ckpt_source_load(ckpt_file *f, ckpt_source *src, ckpt_value **root);

/* Shared by the format readers: the torch persistent id -> STORAGE value. */
ckpt_value *ckpt_file_persistent_load(void *user, ckpt_value *pid, uint64_t offset,
                                      ckpt_error *err);
ckpt_global_class ckpt_file_classify_cb(void *user, const char *qualified_name);
void ckpt_file_pickle_ctx(ckpt_file *f, ckpt_pickle_ctx *ctx, const char *name);

/* Add S to the storage table (index, hash). */
int ckpt_file_storage_add(ckpt_file *f, struct ckpt_storage *s, ckpt_error *err);
/* KEY as the storage table holds it: KEY itself, or (in a shard, since every
 * shard numbers its storages from "0") the prefixed key written into BUF;
 * NULL when that does not fit in CAP bytes. */
const char *ckpt_file_table_key(const ckpt_file *f, const char *key, char *buf, size_t cap);

/* The storage with KEY, or NULL. */
struct ckpt_storage *ckpt_file_storage_find(ckpt_file *f, const char *key);

/* After parsing: index tensors, state dicts and objects (and check depth). */
int ckpt_file_index(ckpt_file *f);
/* Index again after f->root changed from OLD_ROOT. */
int ckpt_file_reindex(ckpt_file *f, ckpt_value *old_root);

/* N elements of DT at P as doubles (float16, bfloat16, float8 exactly);
 * false (and NaNs) for dtypes without an order: complex, quantized, bits. */
bool ckpt_dtype_to_double(ckpt_dtype dt, const uint8_t *p, size_t n, double *out);
/* 1 for the dtypes ckpt_dtype_to_double() converts: floating and integer. */
bool ckpt_dtype_is_real(ckpt_dtype dt);

/* Convert IEEE half / bfloat16 bits to float exactly. */
float ckpt_half_to_float(uint16_t h);
float ckpt_bfloat16_to_float(uint16_t b);

#endif /* CKPT_PRIVATE_H */
