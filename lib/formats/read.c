/*
 * read.c - reading dispatch: ckpt_file_open() sniffs a file through the
 * format table, in torch.load's order, and hands it to its format's reader.
 * It also installs f->parts.read, through which a format that holds others
 * (a sharded set) reads its parts without naming their format, and puts on
 * each source read the ops of the format that reads it.
 */
#include "formats/format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Read SRC, an open file, as format D into *ROOT. */
static int read_as(ckpt_file *f, const ckpt_format_desc *d, ckpt_source *src, ckpt_value **root)
{
    ckpt_source *prev = f->cur_src;
    f->cur_src = src;
    src->ops = d->ops; /* before the read: a read that fails still frees its state */
    int rc = d->read(f, src, root);
    f->cur_src = prev;
    return rc;
}

/* The names of the formats known by their content: "a, b or c". */
static void content_formats(char *buf, size_t cap)
{
    size_t n = 0, k = 0, len = 0;
    for (const ckpt_format_desc *const *d = ckpt_format_table; *d; d++)
        n += (*d)->sniff && !(*d)->claim ? 1 : 0; /* a claimed kind of a container: named once */
    buf[0] = '\0';
    for (const ckpt_format_desc *const *d = ckpt_format_table; *d && len < cap; d++) {
        if (!(*d)->sniff || (*d)->claim)
            continue; /* known by its name alone, or a kind of another's container */
        k++;
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", k == 1 ? "" : k == n ? " or " : ", ",
                                (*d)->name);
    }
}

/* The zip handle sniffing left in SRC stays for D's reading only when D
 * reads a zip. */
static void keep_zip_for(ckpt_source *src, const ckpt_format_desc *d)
{
    if (src->zip && (!d || (d->id != CKPT_FORMAT_PTH_ZIP && d->id != CKPT_FORMAT_TORCHSCRIPT))) {
        ckpt_zip_close(src->zip);
        src->zip = NULL;
    }
}

/* f->parts.read: a part named by a set, known by its content alone. */
static int read_part(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    uint8_t head[16];
    size_t got;
    const ckpt_format_desc *d;
    int rc = ckpt_format_sniff_fd_keep(src->fd, src->file_size, NULL, head, sizeof(head), &got,
                                       &d, &src->zip);
    keep_zip_for(src, d);
    if (!d) {
        char names[200];
        content_formats(names, sizeof(names));
        return ckpt_err(&f->err, rc ? rc : CKPT_ERR_FORMAT, "not a %s file", names);
    }
    return read_as(f, d, src, root);
}

/* A folder: the first folder format in the table that claims it. */
static int open_dir(ckpt_file *f, int fd, const struct stat *st)
{
    f->dir_fd = fd;
    f->dev = st->st_dev;
    f->ino = st->st_ino;
    f->mode = st->st_mode;
    const ckpt_format_desc *d = NULL;
    for (const ckpt_format_desc *const *p = ckpt_format_table; *p && !d; p++)
        if ((*p)->claim_dir && (*p)->claim_dir(fd))
            d = *p;
    if (!d) {
        char names[200] = "";
        size_t len = 0;
        for (const ckpt_format_desc *const *p = ckpt_format_table; *p; p++)
            if ((*p)->claim_dir && len < sizeof(names))
                len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s",
                                        len ? " or " : "", (*p)->name);
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "a directory, but not a %s checkpoint folder",
                        len ? names : "known");
    }
    f->format = d->id;
    f->format_name = d->name;
    int rc = read_as(f, d, &f->main, &f->root);
    if (rc == CKPT_OK)
        rc = ckpt_file_index(f);
    return rc;
}

/* The weights transformers' from_pretrained loads from a local folder, in
 * the order it looks for them (modeling_utils._get_resolved_checkpoint_files,
 * 4.57 and 5.24 alike), each taken when it is a file (os.path.isfile). */
static const char *const model_weights[] = {
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "pytorch_model.bin.index.json", NULL,
};

static bool is_file_at(int dirfd, const char *name)
{
    struct stat st;
    return fstatat(dirfd, name, &st, 0) == 0 && S_ISREG(st.st_mode);
}

const char *ckpt_model_folder_weights(int dirfd)
{
    if (!is_file_at(dirfd, "config.json"))
        return NULL;
    for (const char *const *w = model_weights; *w; w++)
        if (is_file_at(dirfd, *w))
            return *w;
    return NULL;
}

static bool digits5(const char *s)
{
    for (int i = 0; i < 5; i++)
        if (s[i] < '0' || s[i] > '9')
            return false; /* (a NUL ends the loop before the string does) */
    return true;
}

bool ckpt_model_folder_weight_name(const char *name)
{
    for (const char *const *w = model_weights; *w; w++)
        if (strcmp(name, *w) == 0)
            return true;
    /* shards as save_pretrained names them: model-00001-of-00002.safetensors,
     * pytorch_model-00001-of-00002.bin */
    const char *rest = strncmp(name, "model-", 6) == 0           ? name + 6
                       : strncmp(name, "pytorch_model-", 14) == 0 ? name + 14
                                                                   : NULL;
    return rest && digits5(rest) && strncmp(rest + 5, "-of-", 4) == 0 && digits5(rest + 9) &&
           strcmp(rest + 14, rest == name + 6 ? ".safetensors" : ".bin") == 0;
}

CKPT_API int ckpt_path_is_model_folder(const char *path)
{
    int fd = path ? open(path, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC) : -1;
    if (fd < 0)
        return 0;
    int yes = ckpt_model_folder_weights(fd) != NULL;
    close(fd);
    return yes;
}

/* A zip that is also a valid safetensors file (its first 8 bytes a header
 * length, '{' after them): safetensors, and torch 2.x for a *.safetensors
 * name, read other tensors than torch.load under any other name.  Said in a
 * notice of F, which holds the zip reading. */
static int note_safetensors_too(ckpt_file *f, const char *path)
{
    ckpt_file *g = ckpt_file_new();
    if (!g)
        return ckpt_oom(&f->err);
    int rc = ckpt_file_open_as(g, path, &ckpt_format_safetensors);
    size_t n = rc == CKPT_OK ? ckpt_file_tensor_count(g) : 0;
    ckpt_file_free(g);
    if (rc != CKPT_OK)
        return CKPT_OK; /* not safetensors: one reading */
    return ckpt_file_notice_add(f, "also a valid safetensors file (%zu tensor%s): safetensors, "
                                   "transformers and torch.load of a *.safetensors name read "
                                   "those; this is the zip's reading, which torch.load gives "
                                   "under any other name (ckpt scan calls the file ambiguous)",
                                n, n == 1 ? "" : "s") < 0
               ? ckpt_oom(&f->err)
               : CKPT_OK;
}

/* ckpt_file_open, as format AS when not NULL (whatever the content says). */
static int open_file(ckpt_file *f, const char *path, const ckpt_format_desc *as)
{
    if (!ckpt_file_valid(f) || !path)
        return CKPT_ERR_USAGE;
    if (f->opened)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "handle already used; make a new one");
    f->opened = true;
    ckpt_err_clear(&f->err);
    if (!(f->path = strdup(path)))
        return ckpt_oom(&f->err);
    f->main.path = f->path;
    f->cur_src = &f->main;
    f->parts.read = read_part;

    int fd;
    struct stat st;
    /* a FIFO, socket or device is refused, never read: no input blocks */
    CKPT_FORWARD(ckpt_open_input(AT_FDCWD, path, true, &fd, &st, &f->err));
    const char *weights = S_ISDIR(st.st_mode) && !as ? ckpt_model_folder_weights(fd) : NULL;
    if (S_ISDIR(st.st_mode) && !weights)
        return open_dir(f, fd, &st);
    if (weights) {
        /* a Hugging Face model folder: its weights are the input, read as
         * any file (an index as a sharded set) */
        f->model_fd = fd;
        f->model_dir = f->path;
        size_t n = strlen(path) + strlen(weights) + 2;
        if (!(f->path = malloc(n)))
            return ckpt_oom(&f->err);
        snprintf(f->path, n, "%s%s%s", path, path[strlen(path) - 1] == '/' ? "" : "/", weights);
        f->main.path = f->path;
        path = f->path;
        CKPT_FORWARD(ckpt_open_input(f->model_fd, weights, false, &fd, &st, &f->err));
    }
    f->main.fd = fd;
    f->main.file_size = (uint64_t)st.st_size;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->mode = st.st_mode;
    uint8_t head[512];
    size_t got;
    const ckpt_format_desc *d;
    int rc = ckpt_format_sniff_fd_keep(fd, f->main.file_size, path, head, sizeof(head), &got, &d,
                                       &f->main.zip);
    if (rc)
        return ckpt_err(&f->err, rc, "cannot read: %s", strerror(errno));
    if (as && got)
        d = as;
    keep_zip_for(&f->main, d);
    if (got == 0) {
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "empty file");
    } else if (!d) {
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                      "not a PyTorch checkpoint (not a zip archive, a tar, a legacy pickle stream, "
                      "safetensors or a shard index)");
    } else {
        f->format = d->id;
        f->format_name = d->name;
        rc = read_as(f, d, &f->main, &f->root);
    }
    if (rc == CKPT_OK)
        rc = ckpt_file_index(f);
    if (rc == CKPT_OK && !as && (d->id == CKPT_FORMAT_PTH_ZIP || d->id == CKPT_FORMAT_TORCHSCRIPT) &&
        ckpt_format_safetensors.sniff(head, got))
        rc = note_safetensors_too(f, path);
    return rc;
}

CKPT_API int ckpt_file_open(ckpt_file *f, const char *path)
{
    return open_file(f, path, NULL);
}

int ckpt_file_open_as(ckpt_file *f, const char *path, const ckpt_format_desc *as)
{
    return open_file(f, path, as);
}
