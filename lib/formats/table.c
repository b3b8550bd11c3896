/*
 * table.c - every format ckpt reads or writes, in one place.  The order is
 * torch.load's: a zip first (TorchScript's, known by its constants.pkl,
 * as torch.load knows it, then torch.save's), then safetensors (which torch 2.x picks by
 * name), the tar of torch <= 0.1 (which torch tries before), the legacy pickle stream, and a shard index last (by its name).
 * A new format is a module exporting a descriptor and one line here.
 */
#include "formats/format.h"

#include <string.h>

const ckpt_format_desc *const ckpt_format_table[] = {
    &ckpt_format_torchscript, /* a zip with constants.pkl: before pth-zip claims the zip */
    &ckpt_format_pth_zip,
    &ckpt_format_safetensors,
    &ckpt_format_pth_tar, /* tarfile.open() accepts it: before the pickle stream */
    &ckpt_format_pth_legacy,
    &ckpt_format_sharded,
    &ckpt_format_deepspeed, /* a folder: claim_dir only */
    &ckpt_format_dcp, /* a folder (claim_dir) */
    NULL,
};

const ckpt_format_desc *ckpt_format_find(ckpt_format id)
{
    for (const ckpt_format_desc *const *d = ckpt_format_table; *d; d++)
        if ((*d)->id == id)
            return *d;
    return NULL;
}

bool ckpt_path_has_suffix(const char *path, const char *suffix)
{
    size_t n = strlen(path), k = strlen(suffix);
    return n > k && strcmp(path + n - k, suffix) == 0;
}

static const ckpt_format_desc *sniff(const uint8_t *head, size_t n, int fd, uint64_t size,
                                     const char *path, ckpt_zip **zip)
{
    for (const ckpt_format_desc *const *d = ckpt_format_table; *d; d++)
        if ((*d)->sniff && (*d)->sniff(head, n) &&
            (!(*d)->claim || (fd >= 0 && (*d)->claim(fd, size, zip && !*zip ? zip : NULL))))
            return *d;
    for (const ckpt_format_desc *const *d = ckpt_format_table; path && *d; d++)
        if ((*d)->name_suffix && ckpt_path_has_suffix(path, (*d)->name_suffix))
            return *d;
    return NULL;
}

const ckpt_format_desc *ckpt_format_sniff(const uint8_t *head, size_t n, int fd, uint64_t size,
                                          const char *path)
{
    return sniff(head, n, fd, size, path, NULL);
}

int ckpt_format_sniff_fd(int fd, uint64_t size, const char *path, uint8_t *head, size_t cap,
                         size_t *got, const ckpt_format_desc **out)
{
    return ckpt_format_sniff_fd_keep(fd, size, path, head, cap, got, out, NULL);
}

int ckpt_format_sniff_fd_keep(int fd, uint64_t size, const char *path, uint8_t *head, size_t cap,
                              size_t *got, const ckpt_format_desc **out, ckpt_zip **zip)
{
    *got = size < cap ? (size_t)size : cap;
    *out = NULL;
    if (*got && ckpt_pread_all(fd, head, *got, 0) != CKPT_OK)
        return CKPT_ERR_IO;
    if (*got)
        *out = sniff(head, *got, fd, size, path, zip);
    return CKPT_OK;
}

CKPT_API const char *ckpt_format_name(ckpt_format format)
{
    const ckpt_format_desc *d = ckpt_format_find(format);
    return d ? d->name : "unknown";
}
