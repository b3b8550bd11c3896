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

typedef struct ckpt_format_desc {
    ckpt_format id;
    const char *name;   /* as in DESIGN.md's JSON: "pth-zip" */
    const char *suffix; /* OUT's name ending so picks this format for writing, or NULL */
    /* Whether the first N bytes of a file (fewer for a short file) are this
     * format's; the first yes in table order wins.  NULL: known by name. */
    bool (*sniff)(const uint8_t *head, size_t n);
    /* A file whose content no format claims is this format's when its name
     * ends so (".json"), or NULL. */
    const char *name_suffix;
    /* After SNIFF said yes: whether the open file FD (SIZE bytes) is this
     * format's after all, for formats that share a container (a TorchScript
     * zip is a zip with constants.pkl); NULL: SNIFF decides. */
    bool (*claim)(int fd, uint64_t size);
    /* Whether the open folder DIRFD is this format's checkpoint (a folder
     * format: read then gets f->dir_fd set and f->main closed, and adds the
     * folder's files with ckpt_file_source_add); NULL: a one-file format. */
    bool (*claim_dir)(int dirfd);
    /* Read the open SRC (f->cur_src) into *ROOT, its storages into f's table. */
    int (*read)(ckpt_file *f, ckpt_source *src, ckpt_value **root);
    /* Write f->root to the open file OUT that will be named PATH; NULL when
     * the format is written as a set. */
    int (*write)(ckpt_file *f, int out, const char *path, const ckpt_write_options *opt);
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

/* One pickle of a tar checkpoint (formats/pth_tar.c), handed to the caller
 * to run: NAME says which ("tar:storages pickle 2", "tar:pickle"), BUF
 * holds LEN bytes from its start to its member's end.  The callback sets
 * *USED (the pickle's length) and *ROOT (its value, for the walk to read
 * the counts and storage types) and returns CKPT_OK, or an error code to
 * stop the walk there (it may leave the error text to its caller). */
typedef int (*ckpt_tar_pickle_fn)(void *user, const char *name, const uint8_t *buf, size_t len,
                                  size_t *used, ckpt_value **root);
/* Walk the pickles of the tar checkpoint FD (SIZE bytes) that torch.load
 * unpickles, in its order: the storages member (count, each storage's
 * header, skipping its data, the view list), the tensors member (count,
 * each header, skipping its binary fields), then the 'pickle' member.
 * Stops with an error where torch would fail (a missing member, a count
 * that is not an int, an unknown storage type, a key it lacks, data past
 * the member's end), after the pickles before that point were handed out. */
int ckpt_pth_tar_scan(int fd, uint64_t size, ckpt_tar_pickle_fn fn, void *user, ckpt_error *err);

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
/* Whether PATH ends in SUFFIX. */
bool ckpt_path_has_suffix(const char *path, const char *suffix);

#endif /* CKPT_FORMAT_H */
