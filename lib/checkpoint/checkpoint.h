/*
 * checkpoint/checkpoint.h - the model of an open checkpoint: the ckpt_file
 * handle, the storage table and pickle context that format readers fill,
 * the index of tensors, state dicts and objects, storage bytes wherever
 * they are, and the selection of a state dict.  Below the formats: it never
 * names one; the format dispatcher installs in the handle how a format that
 * holds others reads and writes its parts (ckpt_parts), and on each source
 * the methods of the format that read it (ckpt_format_ops), whose state
 * lives on that source, not in the handle.
 */
#ifndef CKPT_CHECKPOINT_H
#define CKPT_CHECKPOINT_H

#include "container/container.h"
#include "pickle/pickle.h"

#define CKPT_FILE_MAGIC 0x636b7074u /* "ckpt" */

/*
 * What the layers below the formats ask of the format that read a source,
 * without naming it (libarchive's format->data and its methods): one
 * constant table per format (formats/ define them; each ckpt_format_desc
 * points at its own), installed on the source by the reading dispatcher.
 * The handle's own format is the one that read f->main: the methods that
 * take F are asked of f->main.ops and find their state in f->main.fmt_data.
 * NULL members: the format has nothing to say there.
 */
typedef struct ckpt_format_ops {
    /* Free what a source's fmt_data holds outside the handle's arena (called
     * by ckpt_file_free, also after a read that failed half-way). */
    void (*state_free)(void *fmt_data);
    /* A mapping outside the root that --select can name (DeepSpeed's
     * "module"), made on demand, its storages added to the table then:
     * *OUT stays NULL when NAME is none of them. */
    int (*select_extra)(ckpt_file *f, const char *name, ckpt_value **out);
    /* Read every record the storages take bytes from, whole, and check its
     * CRC-32 (storages made of runs inside records are read in parts, which
     * no CRC covers); errors into ERR.  Safe beside another thread reading
     * F: it opens the files itself and changes nothing in F.  CKPT_OK when
     * the read failed (nothing to check). */
    int (*check_records)(ckpt_file *f, ckpt_error *err);
    /* How a folder is laid out (a JSON object), for inspect, or NULL. */
    const char *(*layout)(const ckpt_file *f);
    /* What its state dicts are, as inspect's "source" says ("dcp"), or NULL:
     * each by what it is (a mapping, a module tree, ...). */
    const char *sd_source;
} ckpt_format_ops;

/* A file that storages' bytes live in (one, or each shard of a sharded set). */
typedef struct ckpt_source {
    int fd;
    struct ckpt_zip *zip;
    uint64_t file_size;
    char *path;
    bool big_endian; /* its values are stored big-endian (zip: byteorder "big") */
    const char *prefix; /* a torch zip: the folder all its records are in (the
                         * first one's, as torch finds it), once checked; else NULL */
    bool lazy;       /* a folder's file: opened on demand (ckpt_source_fd), and
                      * closed again when too many are open */
    const ckpt_format_ops *ops; /* the format that read it, or NULL */
    void *fmt_data;             /* that format's own state for it, or NULL */
} ckpt_source;

void ckpt_source_close(ckpt_source *src);

/* A folder checkpoint's files are opened on demand, at most this many at
 * once (a 1,000-rank folder stays under the default limit of 1,024). */
#define CKPT_OPEN_SOURCES_MAX 64

typedef struct ckpt_walk_entry {
    const ckpt_value *value;
    ckpt_path path;
    const char *module_class; /* state dicts of module trees: the root module's class */
    const char *why;          /* other_tensors: why state_dict() leaves it out */
} ckpt_walk_entry;

typedef struct ckpt_walk_list {
    ckpt_walk_entry *items;
    size_t len, cap;
} ckpt_walk_list;

/*
 * How a format that holds others (a sharded set's shards) reads and writes
 * its parts without naming their format: installed in the handle by the
 * format dispatcher (formats/read.c, formats/write.c).
 */
typedef struct ckpt_parts {
    /* Open SRC->path, sniff it, and read it into *ROOT with storages keyed
     * under f->key_prefix. */
    int (*read)(ckpt_file *f, ckpt_source *src, ckpt_value **root);
    /* Write f->root to PATH as one file: OPT->format, else PATH's name. */
    int (*write)(ckpt_file *f, const char *path, const ckpt_write_options *opt);
} ckpt_parts;

struct ckpt_file {
    uint32_t magic;
    ckpt_error err;
    ckpt_arena arena;
    uint64_t limits[CKPT_LIMIT_COUNT_];
    char **allowed;        /* malloc'd user allow-list */
    size_t nallowed;
    bool allow_unknown;
    bool defer_record_checks; /* local headers checked at a record's first read */
    bool opened;

    char *path;
    ckpt_format format;
    const char *format_name; /* its descriptor's name, set with format by the dispatcher */

    ckpt_value *root;
    ckpt_value *file_root;  /* the root as read, when ckpt_file_select changed root */
    struct ckpt_storage **storages;
    size_t nstorages, storages_cap;
    ckpt_map storage_index;  /* key -> index in storages (the latest of a key) */

    ckpt_walk_list tensors, state_dicts, objects;
    /* tensors a module tree holds outside the state dict it is listed as
     * (plain attributes, non-persistent buffers): listed, never written */
    ckpt_walk_list other_tensors;

    ckpt_source main;      /* what was opened (a sharded set: its index; a folder:
                            * fd -1), read by the handle's format: main.ops are
                            * its methods, main.fmt_data its state */
    ckpt_source **shards;  /* sharded: every shard, main excluded; a folder:
                            * its files (ckpt_file_source_add) */
    size_t nshards, shards_cap;
    int dir_fd;            /* a folder checkpoint: the folder (main.fd is -1), else -1 */
    /* A Hugging Face model folder (config.json beside its weights): the
     * folder, open, and its path; f->path is then its weights file (or
     * index), read as any other; -1 and NULL otherwise. */
    int model_fd;
    char *model_dir;
    ckpt_source *open_lazy[CKPT_OPEN_SOURCES_MAX]; /* lazy sources now open */
    size_t open_lazy_next; /* the slot to reuse next (oldest first) */
    /* The read in progress, which every reader's storages follow (so not any
     * one format's): the source their bytes are in, and the prefix that
     * keeps their keys apart from other parts' in the one table (a set's
     * shard "name:", a DCP bytes item "bN/"), or NULL. */
    ckpt_source *cur_src;
    const char *key_prefix;
    ckpt_parts parts;      /* installed by the format dispatcher */
    char **notices;        /* what readers noticed but did not refuse (malloc'd) */
    size_t nnotices;
    uint64_t dev, ino;     /* to refuse writing over the input */
    uint32_t mode;     /* kept when the input is replaced */

    struct ckpt_records_check *checking; /* writing: f->main.ops->check_records,
                                          * running beside or after */
    bool pieces_seen; /* the check runs after a write that read every piece it
                       * wrote: a piece's `seen` CRC-32 is of this write */
};

bool ckpt_file_valid(const ckpt_file *f);
/* Record a notice for the user (the same text once); -1 when out of memory. */
int ckpt_file_notice_add(ckpt_file *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The zip record PREFIX/NAME of the source being read (f->cur_src and its
 * prefix), or -1. */
int64_t ckpt_file_record_find(ckpt_file *f, const char *name);
/* Small record I (version, byteorder) as text into BUF, NUL-terminated;
 * a record of CAP bytes or more is malformed. */
int ckpt_file_record_text(ckpt_file *f, int64_t i, char *buf, size_t cap);

/* ---- folder checkpoints (checkpoint/file.c) ------------------------------------ */

/* A file of the folder f->dir_fd, NAME relative to it ("global_step2/x.pt"):
 * a lazy source (not opened yet) owned by F, its size taken now.  NAME may
 * not be absolute nor have a ".." or empty component (a checkpoint's
 * metadata must not lead out of its folder); a missing or non-regular file
 * is CKPT_ERR_FORMAT naming it. */
ckpt_source *ckpt_file_source_add(ckpt_file *f, const char *name, ckpt_error *err);
/* SRC's descriptor, opening a lazy source (and closing the one opened
 * longest ago when CKPT_OPEN_SOURCES_MAX are open); -1 + f->err on failure. */
int ckpt_source_fd(ckpt_file *f, ckpt_source *src);

/* ---- the storage table and the pickle context (checkpoint/storage.c) --------- */

/* Add S to the storage table (index, hash). */
int ckpt_file_storage_add(ckpt_file *f, struct ckpt_storage *s, ckpt_error *err);
/* Make S a PIECES storage of the N pieces P (in F's arena or otherwise
 * living as long as F): sorted here by dst_offset, then checked to tile
 * S's src_nbytes exactly (a gap or an overlap is CKPT_ERR_FORMAT naming S
 * and the bytes; WHAT names the source of the pieces in that message). */
int ckpt_storage_pieces_set(ckpt_file *f, struct ckpt_storage *s, ckpt_piece *p, size_t n,
                            const char *what, ckpt_error *err);
/* The storage with KEY, or NULL. */
struct ckpt_storage *ckpt_file_storage_find(ckpt_file *f, const char *key);
/* KEY as the storage table holds it: KEY itself, or (in a shard, since every
 * shard numbers its storages from "0") the prefixed key written into BUF;
 * NULL when that does not fit in CAP bytes. */
const char *ckpt_file_table_key(const ckpt_file *f, const char *key, char *buf, size_t cap);
/* A new storage record KEY (already a table key) of NUMEL elements of DT on
 * DEVICE, its bytes in f->cur_src, added to the table; NULL + err on failure. */
struct ckpt_storage *ckpt_file_storage_new(ckpt_file *f, const char *key, ckpt_dtype dt,
                                           int64_t numel, const char *device, size_t devlen,
                                           ckpt_error *err);
/* The same for a KEY already in F's arena, kept as it is (not copied). */
struct ckpt_storage *ckpt_file_storage_new_kept(ckpt_file *f, const char *key, ckpt_dtype dt,
                                                int64_t numel, const char *device, size_t devlen,
                                                ckpt_error *err);
/* The pickle value (at OFFSET) of storage S of DT, persistent_load's
 * result; NULL + err when out of memory. */
ckpt_value *ckpt_file_storage_value(ckpt_file *f, struct ckpt_storage *s, ckpt_dtype dt,
                                    const char *type_name, uint64_t offset, ckpt_error *err);
/* A reading context for a pickle of F named NAME: F's limits and allow-list,
 * torch's persistent ids turned into storages of F's table. */
void ckpt_file_pickle_ctx(ckpt_file *f, ckpt_pickle_ctx *ctx, const char *name);

/* ---- the index (checkpoint/index.c) ---------------------------------------- */

/* After parsing: index tensors, state dicts and objects (and check depth). */
int ckpt_file_index(ckpt_file *f);
/* The state dict torch's model.state_dict() gives for the nn.Module object
 * MODULE (CKPT_VF_MODULE), made once and kept on it: its tensors under their
 * state-dict names, _metadata with the versions torch.nn's classes have.
 * NULL with an error in F (cycles, depth, memory). */
ckpt_value *ckpt_module_state_dict(ckpt_file *f, ckpt_value *module);
/* A new, empty state dict of MODULE (an OBJECT) for a reader that names its
 * tensors by a rule of its own (TorchScript's code/ lists): flagged as made
 * from a module tree, so that extract takes it and key rewrites refuse it.
 * NULL with an error in F. */
ckpt_value *ckpt_module_sd_new(ckpt_file *f, const ckpt_value *module);
/* Add TENSOR to SD as PREFIX NAME, as state_dict() holds it (detached),
 * listed as a Parameter when PARAMETER (the module's parameters), with the
 * requires_grad it was saved with. */
int ckpt_module_sd_add(ckpt_file *f, ckpt_value *sd, const char *prefix, const char *name,
                       const ckpt_value *tensor, bool parameter);
/* Whether F's root is a TorchScript archive's module (not extracted yet):
 * what the torch.save writers refuse to write. */
bool ckpt_root_is_torchscript(const ckpt_file *f);
/* 1 for a state dict made from a module tree. */
bool ckpt_value_is_module_sd(const ckpt_value *v);
/* Index again after f->root changed from OLD_ROOT. */
int ckpt_file_reindex(ckpt_file *f, ckpt_value *old_root);
/* Merge repeated str/int keys the way Python's dict does (first position,
 * last value).  -1 on OOM. */
int ckpt_dict_dedupe(ckpt_arena *a, ckpt_value *dict);
/* A name of LEN bytes at S with a NUL inside: CKPT_ERR_UNSUPPORTED naming
 * it (with CKPT_NAME_NUL in the message).  Names are C strings from the
 * model of a checkpoint up (paths, state-dict keys, writers): such a name
 * would be cut, so the file is refused, though torch and safetensors read
 * it.  CKPT_OK otherwise (torch_load's safetensors verdict counts any
 * CKPT_ERR_UNSUPPORTED as what the loader reads and ckpt refuses). */
#define CKPT_NAME_NUL "contains NUL (a name is kept whole or refused, never cut)"
int ckpt_key_check(ckpt_error *err, const char *s, size_t len);
/* A writer's last check: no two str keys of dict D the same name (as C
 * strings); CKPT_ERR_FORMAT naming it, else CKPT_OK. */
int ckpt_dict_names_unique(ckpt_error *err, const ckpt_value *d);
/* KEY without the wrapper components (module., _orig_mod., ...: the list
 * ckpt_state_dict_wrappers knows) standing at its start or after a '.':
 * what `ckpt unwrap`, diff's --normalize and verify's hint make of a key.  Malloc'd; NULL on OOM. */
char *ckpt_key_unwrap(const char *key);

/* ---- storage bytes (checkpoint/tensor_data.c) -------------------------------- */

/* Where S's bytes lie raw in a file, ready to be copied unread: CKPT_OK with
 * *FD and *OFFSET; CKPT_ERR_UNSUPPORTED when they must be decoded first
 * (deflated, cast, or big-endian unless AS_STORED: a writer that keeps the
 * file's byte order copies those too); other errors for a broken container. */
int ckpt_storage_raw_range(ckpt_file *f, const ckpt_storage *s, bool as_stored, int *fd,
                           uint64_t *offset);
/* Storage S's values as the output needs them (cast when S was cast, in this
 * machine's byte order), CRC-checked against the source where it has a
 * CRC: into a malloc'd *BUF of S->nbytes. */
int ckpt_storage_load(ckpt_file *f, const ckpt_storage *s, uint8_t **buf);
/* The same bytes handed to SINK in pieces (bounded memory, cast on the way,
 * the source's CRC checked at the end); AS_STORED keeps a big-endian
 * storage's bytes as they are (no cast then). */
int ckpt_storage_stream(ckpt_file *f, const ckpt_storage *s, bool as_stored, ckpt_sink_fn sink,
                        void *user);
/* A PIECES storage S written raw at OUT_OFF of OUT, each file piece copied
 * by the kernel (copy_file_range), memory pieces written: CRC-32s are not
 * checked here (ckpt_storage_pieces_crc does, in parallel).
 * CKPT_ERR_UNSUPPORTED when S is no PIECES storage or needs a cast or swap. */
int ckpt_storage_copy_pieces(ckpt_file *f, const ckpt_storage *s, int out, uint64_t out_off);
/* CRC-32 of S's bytes (*CRC), read through BUF (CKPT_IO_BUF bytes) with
 * descriptors of its own: safe in a helper thread while the main thread
 * reads F.  Each whole-record piece is checked against its CRC-32:
 * CKPT_ERR_FORMAT with *BAD its index.  Status only, no message; stops with
 * CKPT_ERR_IO when *CANCEL becomes true. */
int ckpt_storage_pieces_crc(const ckpt_file *f, const ckpt_storage *s, uint8_t *buf,
                            uint32_t *crc, size_t *bad, volatile bool *cancel);
/* Copy the view's elements in C order from its storage's bytes SRC. */
void ckpt_tensor_gather(const ckpt_tensor *t, const uint8_t *src, uint8_t *dst);

/* ---- choosing what to write (checkpoint/select.c) ----------------------------- */

/* A model state dict (doc/design.md, "State dicts"): not inside an optimizer's
 * state dict (a mapping with `state` and `param_groups`), nor under
 * Lightning's callbacks, loops, lr_schedulers, optimizer_states or
 * best_k_models.  What key rewrites touch without --select. */
bool ckpt_state_dict_is_model(const ckpt_file *f, const ckpt_path *path);

/* The mapping at SELECT ("a/b/0"); errors name what is missing. */
int ckpt_file_find_mapping(ckpt_file *f, const char *select, ckpt_value **out, ckpt_path *path);
/* The mapping a tensors-only format writes: SELECT, the root when it is all
 * tensors, or the one ckpt_file_pick_state_dict takes (an error naming the
 * candidates when there are several). */
int ckpt_pick_state_dict(ckpt_file *f, const char *select, const ckpt_value **out);
/* Two names for one thing: the same storage, offset, shape, stride, dtype. */
bool ckpt_tensor_same_view(const ckpt_tensor *a, const ckpt_tensor *b);
/* A hash of what ckpt_tensor_same_view compares: equal views hash alike. */
uint64_t ckpt_tensor_view_hash(const ckpt_tensor *t);
/* Tied tensors among the N views T: FIRST[i] is the first j < i with the
 * same view, else -1 (a hash by view: linear in N). */
int ckpt_tensors_tied(ckpt_file *f, const ckpt_tensor *const *t, size_t n, long *first);

#endif /* CKPT_CHECKPOINT_H */
