/*
 * write.c - writing dispatch: ckpt_file_write() picks the format (OPT's, a
 * set for --shard-size or NAME.index.json, else pth-zip; OUT's name through
 * ckpt_format_for_path), makes the checks every output shares, and has one
 * file written atomically by its format's writer.  It also installs
 * f->parts.write, through which a set writes its parts by their names.
 */
#include "formats/format.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

CKPT_API ckpt_format ckpt_format_for_path(const char *path)
{
    for (const ckpt_format_desc *const *d = ckpt_format_table; path && *d; d++)
        if ((*d)->suffix && ckpt_path_has_suffix(path, (*d)->suffix))
            return (*d)->id;
    return ckpt_format_table[0]->id; /* the table starts with the default */
}

static bool same_file(const ckpt_file *f, const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && (uint64_t)st.st_dev == f->dev && (uint64_t)st.st_ino == f->ino;
}

/* One file of format D at PATH: a temporary file renamed when complete. */
static int write_one(ckpt_file *f, const ckpt_format_desc *d, const char *path,
                     const ckpt_write_options *opt)
{
    if (!d->write)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "%s is not written as one file", d->name);
    bool in_place = same_file(f, path);
    ckpt_out out;
    int rc = ckpt_out_open(&out, path, &f->err);
    if (rc != CKPT_OK) {
        ckpt_out_abort(&out); /* frees what a failed open allocated */
        return rc;
    }
    /* replacing the input keeps its permissions, as sed -i does */
    if (in_place && fchmod(out.fd, (mode_t)(f->mode & 07777)) != 0)
        rc = ckpt_err(&f->err, CKPT_ERR_IO, "cannot set the mode of '%s': %s", path,
                      strerror(errno));
    if (rc == CKPT_OK)
        rc = d->write(f, out.fd, path, opt);
    if (rc == CKPT_OK)
        rc = ckpt_out_commit(&out, &f->err);
    if (rc != CKPT_OK)
        ckpt_out_abort(&out);
    return rc;
}

/* f->parts.write: a part of a set, in OPT's format or as its name says. */
static int write_part(ckpt_file *f, const char *path, const ckpt_write_options *opt)
{
    ckpt_format id = opt && opt->format ? opt->format : ckpt_format_for_path(path);
    const ckpt_format_desc *d = ckpt_format_find(id);
    if (!d)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "no format %d to write", (int)id);
    return write_one(f, d, path, opt);
}

CKPT_API int ckpt_file_write(ckpt_file *f, const char *path, const ckpt_write_options *opt)
{
    if (!ckpt_file_valid(f) || !path || !f->root)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (strcmp(path, "-") == 0)
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "refusing to write a binary checkpoint to standard output");
    if (!(opt && (opt->flags & CKPT_WRITE_IN_PLACE)) && same_file(f, path))
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "'%s' is the input file; use --in-place to replace it", path);
    f->parts.write = write_part;

    /* a set when named so or asked for (shards of a size); else OPT's format */
    ckpt_format id = opt && opt->format ? opt->format : ckpt_format_table[0]->id;
    const ckpt_format_desc *d = ckpt_format_find(ckpt_format_for_path(path));
    if (!d || !d->write_set) {
        d = ckpt_format_find(id);
        for (const ckpt_format_desc *const *s = ckpt_format_table; opt && opt->shard_size && *s; s++)
            if ((*s)->write_set)
                d = *s;
    }
    if (!d || (!d->write && !d->write_set))
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "cannot write the format %s",
                        ckpt_format_name(id));
    return d->write_set ? d->write_set(f, path, opt) : write_one(f, d, path, opt);
}
