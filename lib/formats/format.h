/*
 * formats/format.h - the format table.  Each format module exports one
 * descriptor; formats/table.c lists them in one place, in the order
 * torch.load tries them.  Reading dispatch (formats/read.c: sniffing) and
 * writing dispatch (formats/write.c: --to or OUT's name) go through the
 * table; no format names another.  A format that holds others reads and
 * writes its parts through f->parts, which the dispatchers install.
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
    /* Read the open SRC (f->cur_src) into *ROOT, its storages into f's table. */
    int (*read)(ckpt_file *f, ckpt_source *src, ckpt_value **root);
    /* Write f->root to the open file OUT that will be named PATH; NULL when
     * the format is written as a set. */
    int (*write)(ckpt_file *f, int out, const char *path, const ckpt_write_options *opt);
    /* Write f->root as PATH and the files it names, all or nothing; NULL
     * for one-file formats. */
    int (*write_set)(ckpt_file *f, const char *path, const ckpt_write_options *opt);
} ckpt_format_desc;

extern const ckpt_format_desc ckpt_format_pth_zip, ckpt_format_pth_legacy,
    ckpt_format_safetensors, ckpt_format_sharded, ckpt_format_torchscript;

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
