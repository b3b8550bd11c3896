/*
 * formats/format.h - the format table.  Each format module exports one
 * descriptor; formats/table.c lists them in one place, in the order
 * torch.load tries them.  Reading dispatch (formats/read.c: sniffing) and
 * writing dispatch (formats/write.c: --to or OUT's name) go through the
 * table; no format names another.  A format that holds others reads and
 * writes its parts through f->parts, which the dispatchers install.  What a
 * format keeps after its read lives on the source it read (src->fmt_data),
 * and what the layers below ask of it are its ops (checkpoint.h).
 */
#ifndef CKPT_FORMAT_H
#define CKPT_FORMAT_H

#include "checkpoint/checkpoint.h"

/* ---- walks: a container read once, as torch.load reads it ------------------
 *
 * A format's walk (ckpt_format_desc.walk) reads its container the way
 * torch.load does and hands out, in the order torch meets them, each pickle
 * torch unpickles (its bytes and where they lie) and each record it reads
 * data from.  The caller runs its own reading of each pickle: ckpt's reader
 * makes values (the format's read walks too), ckpt scan runs the VM in scan
 * mode, the torch_load verdicts run the weights-only model.  Each keeps only
 * its own judgement; no container is read by a second reader.
 *
 * Where torch stops on the container itself (a bad magic number, a missing
 * record: not inside a pickle, which is the caller's VM's to say), the walk
 * fills W->stop with torch's exception and message and returns the status
 * ckpt's reader gives there, with the reader's message in ERR.  A callback
 * returns CKPT_OK to go on, CKPT_WALK_STOP to end the walk there (its caller
 * has what it wanted: the walk returns CKPT_WALK_STOP), or an error code,
 * which the walk returns as is (the message is the callback's to leave).
 */
#define CKPT_WALK_STOP 1

/* Whose checks the walk makes where torch versions differ. */
typedef enum ckpt_walk_torch {
    CKPT_WALK_TORCH_2 = 0,   /* torch 2.x (what ckpt's reader follows) */
    CKPT_WALK_TORCH_1_13 = 1
} ckpt_walk_torch;

/* A pickle torch unpickles. */
typedef struct ckpt_walk_pickle {
    int index;             /* its place among the walk's pickles, 0 first */
    const char *name;      /* what it is to torch: "magic number", "data pickle"
                            * (legacy), the record's name (zip) */
    uint64_t offset;       /* its first byte in the file; UINT64_MAX when it is
                            * not there as is (an inflated record) */
    const uint8_t *buf;    /* its bytes, up to the end of what torch's reader
                            * may read (the file's end, the record's); LEN may
                            * be 0 where the file ends first */
    size_t len;
    unsigned pid_fields;   /* the persistent ids torch's persistent_load takes
                            * there: 6 (the legacy main pickle), 5 (a zip's
                            * data.pkl), 1 (the tar's main pickle: a tuple is
                            * its first item, else int(id) is a key of the
                            * objects loaded before, ckpt_walk_tar_kind); 0: a
                            * plain pickle.load, which refuses every one */
    bool truncated;        /* tar: the member ends past the file's end: reading
                            * past LEN is tarfile's ReadError, a TarError (torch
                            * then reads the file as a legacy stream), not EOF */
} ckpt_walk_pickle;

/* A record torch reads data from: a legacy file's storage, after its key
 * list (the caller, which made the storages, says how long each is); a tar
 * checkpoint's storage, once its bytes were skipped; an item of a DCP data
 * file (a torch.save zip, which the caller walks as one). */
typedef struct ckpt_walk_record {
    const ckpt_value *key; /* its key: legacy, the storage key list's item; tar,
                            * the storage pickle's first item */
    size_t index;          /* its place in that list, or among the storages */
    uint64_t offset;       /* its first byte in the file: legacy, its element
                            * count; tar, its data */
    uint64_t avail;        /* legacy: the bytes from OFFSET to the end of the
                            * file; tar: its data's length */
    bool has_count;        /* the int64 element count torch reads is there: */
    uint64_t count;        /* that count */
    const char *location;  /* tar: its location tag ("cpu", "cuda:0"), or NULL */
    size_t location_len;
    /* DCP: OFFSET and AVAIL are the item's bytes in the file; its zip lies at
     * FD from BASE, SIZE bytes (a memfd of the frame's decoded bytes when it
     * is compressed, open while the callback runs); LABEL names it */
    int fd;
    uint64_t base, size;
    const char *label;
} ckpt_walk_record;

/* Where and why torch stops on the container. */
typedef struct ckpt_walk_stop {
    const char *exception; /* torch's exception type ("RuntimeError"); NULL:
                            * torch does not stop on the container */
    char message[512];     /* its text, before torch.load wraps it */
    int pickle;            /* legacy: the pickle whose value it refuses, or -1 */
    const char *expected;  /* legacy: what that value should have been */
    uint64_t offset;       /* where its reading stopped (after that pickle) */
    const char *stage;     /* tar: "container" (a member), "value" (a value a
                            * pickle made), "storage" (a storage, a key) */
    bool torchscript;      /* zip: torch.load hands the archive to torch.jit.load */
    bool fallback;         /* tar: a TarError, on which torch.load reads the file
                            * as a legacy stream instead (no exception) */
} ckpt_walk_stop;

typedef struct ckpt_walk ckpt_walk;
struct ckpt_walk {
    /* the caller's */
    ckpt_walk_torch torch;
    /* P's value: *USED gets the pickle's length (at most P->len), *ROOT its
     * value where the walk needs it (the legacy magic number, protocol
     * version and storage key list, a tar member's pickles; NULL is a value
     * torch refuses there). */
    int (*pickle)(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root);
    /* R's data: *SIZE gets its length in bytes after the count (at most
     * R->avail - 8; legacy: NULL ends the walk after its last pickle). */
    int (*record)(ckpt_walk *w, const ckpt_walk_record *r, uint64_t *size);
    /* zip readings: where the zip readers could read different bytes (one
     * sentence each), handed out before any pickle; may be NULL */
    void (*finding)(ckpt_walk *w, const char *text);
    void *user;
    /* ckpt's reader (and ckpt scan's tar reading): ckpt's rules where they
     * differ from torch's (a version record that is not a bare number, an
     * archive folder named "", a tar's keys, views and tensor headers), with
     * its messages (W->stop never holds ckpt's own refusals) */
    bool strict;
    /* zip walks: leave the archive open in SRC->zip (a reader reads the
     * storages' records from it); else it is closed when the walk ends */
    bool keep;
    /* the bytes a pickle torch reads from a record may have (the pickle
     * limit, --max-pickle-bytes: CKPT_ERR_LIMIT past it; a DCP item's zstd
     * frame may decode to 4 times that); 0: no limit */
    uint64_t pickle_limit;
    /* legacy: a magic number or protocol version that a call made which may
     * compare equal to an int (a number's maker, numpy, torch, an unknown
     * callable or global: torch compares what the pickle returns, which ckpt
     * cannot know) is taken as passing torch's check, and W->called says so;
     * else it fails as any other wrong value (ckpt scan follows, a reader
     * refuses) */
    bool follow_calls;
    /* the walk's */
    int called;            /* legacy, FOLLOW_CALLS: the first such pickle
                            * (0 magic number, 1 protocol version), or -1 */
    bool called_data;      /* its maker is known data (builtins.int, numpy...):
                            * nothing else there makes the file unsafe */
    ckpt_walk_stop stop;
    struct ckpt_zip *zip;  /* zip walks: the archive, while the callbacks run */
    const char *prefix;    /* its folder: PREFIX_LEN bytes (not NUL-terminated) */
    size_t prefix_len;
    bool opened;           /* zip readings: some reader takes the file for a zip */
    void *priv;            /* the walk's own state, for its lookups */
};

/* During a zip walk: the record NAME ("data/0") of the archive's folder,
 * found as torch's getRecord finds it (case-blind); its index, its size in
 * *SIZE (may be NULL); -1 when absent. */
int64_t ckpt_walk_zip_find(const ckpt_walk *w, const char *name, uint64_t *size);
/* Whether miniz would extract record I of the walk's archive: its local
 * header starts with its signature (torch refuses the record otherwise). */
bool ckpt_walk_zip_local_ok(const ckpt_walk *w, int64_t i);
/* During a tar walk's main pickle: what int(saved_id) = DECIMAL names among
 * the objects loaded before: 0 nothing (KeyError), 1 a storage, 2 a tensor. */
int ckpt_walk_tar_kind(const ckpt_walk *w, const char *decimal);
/* torch's zip reader (formats/torch_zip.c, shared by the zip formats): the
 * walk of SRC as torch.load opens it (JIT: as torch.jit.load does, for the
 * torchscript reader: no TorchScript stop, versions named so). */
int ckpt_torch_zip_walk(ckpt_walk *w, ckpt_source *src, bool jit, ckpt_error *err);
/* torch.load's _is_torchscript_zip for one NAME of an archive whose folder
 * is PREFIX_LEN bytes: "<folder>/constants.pkl" exactly (case matters). */
bool ckpt_torch_zip_is_constants(const char *name, size_t prefix_len);

typedef struct ckpt_format_desc {
    ckpt_format id;
    const char *name;   /* as in inspect's JSON (doc/design.md): "pth-zip" */
    const char *suffix; /* OUT's name ending so picks this format for writing, or NULL */
    /* Whether the first N bytes of a file (fewer for a short file) are this
     * format's; the first yes in table order wins.  NULL: known by name. */
    bool (*sniff)(const uint8_t *head, size_t n);
    /* A file whose content no format claims is this format's when its name
     * ends so (".json"), or NULL. */
    const char *name_suffix;
    /* After SNIFF said yes: whether the open file FD (SIZE bytes) is this
     * format's after all, for formats that share a container (a TorchScript
     * zip is a zip with constants.pkl); NULL: SNIFF decides.  ZIP non-NULL:
     * a claim that opened FD as a zip leaves its handle there, yes or no, so
     * that the zip formats' reading takes it instead of opening the file
     * again (libzip converts every entry's DOS time with mktime, which stats
     * /etc/localtime each time when TZ is unset: a second open of a zip of
     * 10,000 records cost about a quarter of ckpt_file_open). */
    bool (*claim)(int fd, uint64_t size, ckpt_zip **zip);
    /* Whether the open folder DIRFD is this format's checkpoint (a folder
     * format: read then gets f->dir_fd set and f->main closed, and adds the
     * folder's files with ckpt_file_source_add); NULL: a one-file format. */
    bool (*claim_dir)(int dirfd);
    /* Read the open SRC (f->cur_src) into *ROOT, its storages into f's table. */
    int (*read)(ckpt_file *f, ckpt_source *src, ckpt_value **root);
    /* Walk the open SRC (its fd and file_size) as torch.load reads it,
     * handing each pickle and record to W's callbacks (above); a folder
     * format walks one of its data files (DCP: a .distcp's items, back to
     * back).  NULL for formats whose readings are not walked. */
    int (*walk)(ckpt_walk *w, ckpt_source *src, ckpt_error *err);
    /* Write f->root to the open file OUT that will be named PATH; NULL when
     * the format is written as a set. */
    int (*write)(ckpt_file *f, int out, const char *path, const ckpt_write_options *opt);
    /* Whether WRITE computes the CRC-32 of the file pieces of every PIECES
     * storage it writes (ckpt_storage_pieces_crc, which keeps each in the
     * piece): a folder's records check then runs after it, from those,
     * rather than beside it reading every byte again. */
    bool crcs_pieces;
    /* Rewrite the input itself, open read-write and locked as FD (PATH),
     * writing only what changes, so that it is the old checkpoint or the
     * new one at every instant; CKPT_ERR_UNSUPPORTED with RES->why when
     * this rewrite cannot be made so (the caller writes a new file
     * instead).  NULL: never. */
    int (*write_in_place)(ckpt_file *f, int fd, const char *path, const ckpt_write_options *opt,
                          ckpt_write_result *res);
    /* Write f->root as PATH and the files it names, all or nothing; NULL
     * for one-file formats. */
    int (*write_set)(ckpt_file *f, const char *path, const ckpt_write_options *opt);
    /* What the layers below ask of a source this format read (its state's
     * free, --select's extra names, ...), installed on the source by the
     * dispatcher; NULL: nothing. */
    const ckpt_format_ops *ops;
} ckpt_format_desc;

extern const ckpt_format_desc ckpt_format_pth_zip, ckpt_format_pth_legacy,
    ckpt_format_safetensors, ckpt_format_sharded, ckpt_format_torchscript, ckpt_format_pth_tar,
    ckpt_format_dcp, ckpt_format_deepspeed;

/* ckpt_file_open of PATH as format AS, whatever its first bytes say (ckpt
 * scan's reading of a zip that is also safetensors). */
int ckpt_file_open_as(ckpt_file *f, const char *path, const ckpt_format_desc *as);

/* pth-zip's readings (formats/pth_zip.c), for ckpt scan: the zip at FD,
 * SIZE bytes from BASE, as every zip reader reads it (torch's miniz, Python's
 * zipfile, libzip: container/zip_dir.c): the points where they disagree to
 * W->finding, then each .pkl record (any case) that any reader reads, once
 * per distinct bytes, to W->pickle, named "LABEL: NAME" (LABEL may be NULL)
 * with " (as READER reads it)" for the readers other than torch's.  Every
 * record is handed out even after one fails (a payload may sit in a later
 * one); the first error is returned (a callback's message is the one it
 * leaves in ERR), a CRC-32 mismatch as torch's error only (the others refuse
 * that record).  W->opened says whether any reader took it for a zip;
 * W->stop.torchscript whether torch's reading holds <folder>/constants.pkl
 * (torch.load hands such an archive to torch.jit.load).  TORCH_ONLY: torch's
 * reading alone, no findings (a DCP item: torch.load reads its bytes, no
 * other zip reader ever sees them). */
int ckpt_pth_zip_readings(ckpt_walk *w, int fd, uint64_t base, uint64_t size, const char *label,
                          bool torch_only, ckpt_error *err);

/* The table (formats/table.c), NULL-terminated, in torch.load's order. */
extern const ckpt_format_desc *const ckpt_format_table[];
/* The descriptor of ID, or NULL. */
const ckpt_format_desc *ckpt_format_find(ckpt_format id);
/* The format of a file from its first bytes (and FD, SIZE for a format's
 * claim; FD -1: none asked), else from PATH's name (NULL: by content
 * alone); NULL when none. */
const ckpt_format_desc *ckpt_format_sniff(const uint8_t *head, size_t n, int fd, uint64_t size,
                                          const char *path);
/* Read the first bytes of FD (SIZE bytes long) into HEAD (CAP bytes; *GOT
 * of them) and sniff them and PATH into *OUT (NULL: no format's, or an
 * empty file).  CKPT_ERR_IO when they cannot be read. */
int ckpt_format_sniff_fd(int fd, uint64_t size, const char *path, uint8_t *head, size_t cap,
                         size_t *got, const ckpt_format_desc **out);
/* The same, keeping in *ZIP (when it was NULL) the zip handle a claim opened
 * on FD, for ckpt_torch_zip_walk to take: the caller closes it when no
 * reader does (ckpt_file's sources close theirs when freed). */
int ckpt_format_sniff_fd_keep(int fd, uint64_t size, const char *path, uint8_t *head, size_t cap,
                              size_t *got, const ckpt_format_desc **out, ckpt_zip **zip);
/* The files DCP metadata file META (".metadata", "__R.metadata") of folder
 * DIRFD names: storage_data's relative_path values, each once (malloc'd,
 * sorted), as written (FileSystemReader opens the folder / each, so that
 * an absolute one or one through ".." lies outside it).  An error when
 * META cannot be read as DCP metadata (ckpt scan judges the file itself). */
int ckpt_dcp_named_files(int dirfd, const char *meta, const uint64_t *limits, char ***names,
                         size_t *n, ckpt_error *err);
/* DeepSpeed's `latest` in folder DIRFD: its tag, stripped as str.strip()
 * does, into BUF (CAP bytes); *PRESENT false when there is no such file. */
int ckpt_deepspeed_latest(int dirfd, char *buf, size_t cap, bool *present);

/* A Hugging Face model folder (formats/read.c): the weights file of folder
 * DIRFD that from_pretrained loads (model.safetensors, its index,
 * pytorch_model.bin, its index: the first that is a file) when config.json
 * is there too, else NULL. */
const char *ckpt_model_folder_weights(int dirfd);
/* Whether NAME is one of those four names or a shard save_pretrained names
 * (model-00001-of-00002.safetensors, pytorch_model-00001-of-00002.bin). */
bool ckpt_model_folder_weight_name(const char *name);

/* A set writer's flag (ckpt_write_options.flags, beside the public ones):
 * a set that fits in one shard is written as NAME.EXT alone, without an
 * index, as save_pretrained does. */
#define CKPT_WRITE_SET_ONE_PLAIN (1u << 30)

/* Whether PATH ends in SUFFIX. */
bool ckpt_path_has_suffix(const char *path, const char *suffix);

#endif /* CKPT_FORMAT_H */
