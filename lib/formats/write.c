/*
 * write.c - writing dispatch: ckpt_file_write() picks the format (OPT's, a
 * set for --shard-size or NAME.index.json, else pth-zip; OUT's name through
 * ckpt_format_for_path), makes the checks every output shares, and has one
 * file written atomically by its format's writer, once its filesystem is
 * known to have room for the tensor bytes it will hold (expected_size).  It
 * also installs f->parts.write, through which a set writes its parts by
 * their names (each part gets the same check).
 */
#include "formats/format.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

/* A folder's records' CRC-32 check (f->main.ops->check_records), run on a second
 * thread while the writer streams the storages made of runs inside them, or,
 * after a writer that computes every piece's CRC-32 itself (crcs_pieces), from
 * those: the first output is committed only once it has passed. */
struct ckpt_records_check {
    ckpt_file *f;
    pthread_t thread;
    bool joined;
    bool deferred; /* not started: run at the join, after the write */
    int rc;
    ckpt_error err;
};

static void *check_thread(void *arg)
{
    struct ckpt_records_check *c = arg;
    c->rc = c->f->main.ops->check_records(c->f, &c->err);
    return NULL;
}

/* Wait for the check (once); its error into F. */
static int check_join(ckpt_file *f)
{
    struct ckpt_records_check *c = f->checking;
    if (!c)
        return CKPT_OK;
    if (!c->joined && c->deferred) {
        f->pieces_seen = true;
        c->rc = f->main.ops->check_records(f, &c->err);
        f->pieces_seen = false;
        c->joined = true;
    } else if (!c->joined) {
        pthread_join(c->thread, NULL);
        c->joined = true;
    }
    return c->rc ? ckpt_err(&f->err, c->rc, "%s", c->err.msg) : CKPT_OK;
}

CKPT_API ckpt_format ckpt_format_for_path(const char *path)
{
    for (const ckpt_format_desc *const *d = ckpt_format_table; path && *d; d++)
        if ((*d)->suffix && ckpt_path_has_suffix(path, (*d)->suffix))
            return (*d)->id;
    /* the default: the first format in the table that is written (pth-zip;
     * TorchScript, before it, is read only) */
    for (const ckpt_format_desc *const *d = ckpt_format_table; *d; d++)
        if ((*d)->write)
            return (*d)->id;
    return CKPT_FORMAT_UNKNOWN;
}

static bool same_file(const ckpt_file *f, const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && (uint64_t)st.st_dev == f->dev && (uint64_t)st.st_ino == f->ino;
}

/* Add to *SUM the bytes that tensor V's storage puts in any output: what the
 * view needs, at most the storage (pth formats write whole storages,
 * safetensors each view), each storage counted once (SEEN by its index). */
static void count_tensor(const ckpt_file *f, const ckpt_value *v, uint64_t *seen, uint64_t *sum)
{
    if (!v || v->kind != CKPT_KIND_TENSOR || !v->u.tensor || !v->u.tensor->storage)
        return;
    const ckpt_tensor *t = v->u.tensor;
    const ckpt_storage *s = t->storage;
    if (s->index >= f->nstorages || f->storages[s->index] != s)
        return;
    uint64_t n = (uint64_t)ckpt_tensor_nbytes(t);
    if (n > s->nbytes)
        n = s->nbytes;
    if (n > seen[s->index]) {
        *sum += n - seen[s->index];
        seen[s->index] = n;
    }
}

/*
 * A lower bound of the size of the file any writer makes of f->root, for
 * the free-space check (0: unknown): the tensor bytes of the state dict a
 * tensors-only format writes (ckpt_pick_state_dict: --select, the root when
 * it holds only tensors, or the file's one state dict), which the pth
 * formats write too, since they write the whole root that holds it; when
 * there is no such state dict, those of every tensor under the root.
 * Nothing is added for pickles, headers or storage bytes outside the views:
 * only a write that cannot fit is refused before it starts (one that
 * overflows later fails there, and leaves nothing behind either).
 */
static uint64_t expected_size(ckpt_file *f, const ckpt_write_options *opt)
{
    /* (an empty root: nothing to count, and the index may be another root's) */
    if (f->nstorages == 0 || (f->root->kind == CKPT_KIND_DICT && f->root->u.dict.keys.len == 0))
        return 0;
    uint64_t *seen = calloc(f->nstorages, sizeof(*seen));
    if (!seen)
        return 0;
    uint64_t sum = 0;
    const ckpt_value *sd = NULL;
    ckpt_error saved = f->err; /* a failed pick is no error here */
    int rc = ckpt_pick_state_dict(f, opt ? opt->select : NULL, &sd);
    f->err = saved;
    if (rc == CKPT_OK && sd && sd->kind == CKPT_KIND_DICT)
        for (size_t i = 0; i < sd->u.dict.vals.len; i++)
            count_tensor(f, sd->u.dict.vals.items[i], seen, &sum);
    else
        for (size_t i = 0; i < f->tensors.len; i++)
            count_tensor(f, f->tensors.items[i].value, seen, &sum);
    free(seen);
    return sum;
}

/*
 * A new file that shares the input's extents (FICLONE: btrfs, xfs with
 * reflink, ...) and is then edited in place by the format: no data is
 * copied.  *DONE says whether it was; where the filesystem cannot, or the
 * format cannot edit this rewrite in place, nothing is left in OUT and the
 * caller writes it whole.  CKPT_NO_CLONE (the benchmarks' switch) skips it.
 */
static int write_clone(ckpt_file *f, const ckpt_format_desc *d, int out, const char *path,
                       const ckpt_write_options *opt, bool *done)
{
    ckpt_write_result *res = opt ? opt->result : NULL;
    *done = false;
    const char *no = getenv("CKPT_NO_CLONE");
    if (!d->write_in_place || f->main.fd < 0 || f->nshards || (no && *no))
        return CKPT_OK;
#ifdef FICLONE
    if (ioctl(out, FICLONE, f->main.fd) != 0) {
        if (res)
            snprintf(res->why, sizeof(res->why), "the filesystem shares no extents with the "
                     "input (FICLONE: %s)", strerror(errno));
        return CKPT_OK;
    }
    int rc = d->write_in_place(f, out, path, opt, res);
    if (rc == CKPT_OK) {
        *done = true;
        if (res)
            res->method = CKPT_WROTE_CLONE;
        return CKPT_OK;
    }
    if (rc != CKPT_ERR_UNSUPPORTED)
        return rc;
    ckpt_err_clear(&f->err);
    if (ftruncate(out, 0) != 0)
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot write: %s", strerror(errno));
    return CKPT_OK;
#else
    (void)out;
    (void)path;
    if (res)
        snprintf(res->why, sizeof(res->why), "no FICLONE on this system");
    return CKPT_OK;
#endif
}

/* One file of format D at PATH: a temporary file renamed when complete. */
static int write_one(ckpt_file *f, const ckpt_format_desc *d, const char *path,
                     const ckpt_write_options *opt)
{
    if (!d->write)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "%s is not written as one file", d->name);
    bool in_place = same_file(f, path);
    ckpt_out out;
    int rc = ckpt_out_open(&out, path, expected_size(f, opt), &f->err);
    if (rc != CKPT_OK) {
        ckpt_out_abort(&out); /* frees what a failed open allocated */
        return rc;
    }
    /* replacing the input keeps its permissions, as sed -i does */
    if (in_place && fchmod(out.fd, (mode_t)(f->mode & 07777)) != 0)
        rc = ckpt_err(&f->err, CKPT_ERR_IO, "cannot set the mode of '%s': %s", path,
                      strerror(errno));
    bool done = false;
    if (rc == CKPT_OK && !in_place)
        rc = write_clone(f, d, out.fd, path, opt, &done);
    if (rc == CKPT_OK && !done)
        rc = d->write(f, out.fd, path, opt);
    char *deferred = NULL;
    ckpt_write_result *res = opt ? opt->result : NULL;
    if (res && (opt->flags & CKPT_WRITE_DEFER_FREE))
        out.deferred = &deferred;
    if (rc == CKPT_OK)
        rc = check_join(f); /* a corrupt input leaves no OUT */
    if (rc == CKPT_OK)
        rc = ckpt_out_commit(&out, &f->err);
    if (deferred) {
        if (strlen(deferred) < sizeof(res->replaced))
            memcpy(res->replaced, deferred, strlen(deferred) + 1);
        else
            unlink(deferred);
        free(deferred);
    }
    if (rc != CKPT_OK)
        ckpt_out_abort(&out);
    return rc;
}

/*
 * In place: PATH is the input.  It is refused when it has other names (a
 * symbolic link to it, other hard links) unless CKPT_WRITE_FORCE: an edit
 * in place changes it under every name.  It is locked (flock, exclusive,
 * not waiting) against another ckpt rewriting it at the same time; the
 * format's in-place writer then writes only what changes, or says why it
 * cannot, and a new file is renamed over it as before.
 */
static int write_in_place(ckpt_file *f, const ckpt_format_desc *d, const char *path,
                          const ckpt_write_options *opt)
{
    ckpt_write_result *res = opt ? opt->result : NULL;
    bool force = opt && (opt->flags & CKPT_WRITE_FORCE);
    struct stat ls, st;
    if (!force && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode))
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                        "a symbolic link: editing in place would change the file it points to "
                        "under every name (a Hugging Face cache shares one file between "
                        "snapshots); write a new file (IN OUT), or pass --force");
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS || errno == ETXTBSY)) {
        /* a file one may not write may still be replaced, as before */
        if (res)
            snprintf(res->why, sizeof(res->why), "it cannot be opened for writing (%s)",
                     strerror(errno));
        return write_one(f, d, path, opt);
    }
    if (fd < 0)
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot open for writing: %s", strerror(errno));
    int rc = CKPT_OK;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != f->dev || (uint64_t)st.st_ino != f->ino)
        rc = ckpt_err(&f->err, CKPT_ERR_IO, "the file was replaced since it was read; nothing "
                                            "was written");
    else if (!force && st.st_nlink > 1)
        rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                      "it has %llu hard links: editing in place would change it under every "
                      "name; write a new file (IN OUT), or pass --force",
                      (unsigned long long)st.st_nlink);
    else if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        rc = ckpt_err(&f->err, CKPT_ERR_IO,
                      errno == EWOULDBLOCK ? "another program is rewriting it (it holds its "
                                             "lock); nothing was written"
                                           : "cannot lock it: %s",
                      strerror(errno));
    if (rc == CKPT_OK) {
        rc = CKPT_ERR_UNSUPPORTED;
        if (d->write_in_place)
            rc = d->write_in_place(f, fd, path, opt, res);
        else if (res)
            snprintf(res->why, sizeof(res->why), "%s files are not edited in place", d->name);
        if (rc == CKPT_OK && res)
            res->method = CKPT_WROTE_IN_PLACE;
        if (rc == CKPT_ERR_UNSUPPORTED) {
            /* a new file, renamed over this one (the lock is held meanwhile) */
            ckpt_err_clear(&f->err);
            rc = write_one(f, d, path, opt);
        }
    }
    close(fd);
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

/* transformers' save_pretrained default max_shard_size, "50GB" (5.x) */
#define MODEL_SHARD_SIZE 50000000000ull

/* Whether NAME is one of the input's weight files: the file read (a weights
 * file or an index), its shards. */
static bool input_weights(const ckpt_file *f, const char *name)
{
    const char *b = strrchr(f->path, '/');
    if (strcmp(b ? b + 1 : f->path, name) == 0)
        return true;
    for (size_t i = 0; i < f->nshards; i++) {
        b = strrchr(f->shards[i]->path, '/');
        if (strcmp(b ? b + 1 : f->shards[i]->path, name) == 0)
            return true;
    }
    return false;
}

/*
 * CKPT_WRITE_MODEL_FOLDER: PATH as a Hugging Face model folder, as
 * save_pretrained writes one: the weights (a set through the sharded
 * writer, one file when one shard holds them), then every other file of
 * the input folder, in a temporary folder renamed to PATH at the end.
 */
static int write_model_folder(ckpt_file *f, const char *path, const ckpt_write_options *opt)
{
    if (f->model_fd < 0)
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "only a model folder (config.json beside its weights) is written as a "
                        "folder");
    ckpt_format fmt = opt->format ? opt->format : CKPT_FORMAT_SAFETENSORS;
    if (fmt != CKPT_FORMAT_SAFETENSORS && fmt != CKPT_FORMAT_PTH_ZIP &&
        fmt != CKPT_FORMAT_PTH_LEGACY)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "a model folder's weights are safetensors or pth, "
                        "not %s", ckpt_format_name(fmt));
    if (opt->flags & CKPT_WRITE_IN_PLACE)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "a model folder is written as a new folder, "
                        "never in place");
    struct stat a, b;
    if (stat(path, &a) == 0 && fstat(f->model_fd, &b) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino)
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "'%s' is the input folder; write a new one",
                        path);
    const ckpt_format_desc *set = ckpt_format_find(CKPT_FORMAT_SHARDED);
    ckpt_out_dir od;
    int rc = ckpt_out_dir_open(&od, path, (opt->flags & CKPT_WRITE_FORCE) != 0, &f->err);
    const char *index = fmt == CKPT_FORMAT_SAFETENSORS ? "model.safetensors.index.json"
                                                       : "pytorch_model.bin.index.json";
    size_t n = (od.tmp ? strlen(od.tmp) : 0) + strlen(index) + 2;
    char *ipath = rc == CKPT_OK ? malloc(n) : NULL;
    if (rc == CKPT_OK && !ipath)
        rc = ckpt_oom(&f->err);
    if (rc == CKPT_OK) {
        snprintf(ipath, n, "%s/%s", od.tmp, index);
        ckpt_write_options w = *opt;
        w.flags = (opt->flags & ~(CKPT_WRITE_MODEL_FOLDER | CKPT_WRITE_FORCE)) |
                  CKPT_WRITE_SET_ONE_PLAIN;
        w.format = fmt;
        w.shard_size = opt->shard_size ? opt->shard_size : MODEL_SHARD_SIZE;
        w.result = NULL;
        rc = set->write_set(f, ipath, &w);
    }
    free(ipath);
    char **names = NULL;
    size_t count = 0;
    if (rc == CKPT_OK)
        rc = ckpt_dir_names(f->model_fd, &names, &count, &f->err);
    struct stat tmp_st, st;
    if (rc == CKPT_OK && fstat(od.fd, &tmp_st) != 0)
        rc = ckpt_err(&f->err, CKPT_ERR_IO, "cannot stat '%s': %s", od.tmp, strerror(errno));
    for (size_t i = 0; rc == CKPT_OK && i < count; i++) {
        if (ckpt_model_folder_weight_name(names[i]) || input_weights(f, names[i]))
            continue; /* the weights written above replace them */
        if (fstatat(f->model_fd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            st.st_dev == tmp_st.st_dev && st.st_ino == tmp_st.st_ino)
            continue; /* OUT's temporary folder, when OUT is inside IN */
        rc = ckpt_out_dir_copy(&od, f->model_fd, names[i], &f->err);
        if (rc != CKPT_OK) {
            char inner[CKPT_ERRMSG_MAX];
            memcpy(inner, f->err.msg, sizeof(inner));
            snprintf(f->err.msg, sizeof(f->err.msg), "copying '%.200s': %.280s", names[i], inner);
        }
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    if (rc == CKPT_OK)
        rc = ckpt_out_dir_commit(&od, &f->err);
    if (rc != CKPT_OK)
        ckpt_out_dir_abort(&od); /* nothing of it is left */
    return rc;
}

CKPT_API int ckpt_file_write(ckpt_file *f, const char *path, const ckpt_write_options *opt)
{
    if (!ckpt_file_valid(f) || !path || !f->root)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (opt && opt->result) {
        memset(opt->result, 0, sizeof(*opt->result));
        opt->result->method = CKPT_WROTE_NEW;
    }
    if (strcmp(path, "-") == 0)
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "refusing to write a binary checkpoint to standard output");
    if (!(opt && (opt->flags & CKPT_WRITE_IN_PLACE)) && same_file(f, path))
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "'%s' is the input file; use --in-place to replace it", path);
    /* never a file with a name twice, whatever made the tree (issue 26) */
    for (size_t i = 0; i < f->state_dicts.len; i++)
        CKPT_FORWARD(ckpt_dict_names_unique(&f->err, f->state_dicts.items[i].value));
    f->parts.write = write_part;

    /* a set when named so or asked for (shards of a size); else OPT's format */
    ckpt_format id = opt && opt->format ? opt->format : ckpt_format_for_path(NULL);
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
    /* a folder's storages are runs inside its records, which no read
     * covers whole: their CRC-32s are checked beside the writing, or after it */
    struct ckpt_records_check check = {.f = f, .joined = true};
    if (f->main.ops && f->main.ops->check_records && !f->checking) {
        /* one file of a writer that checksums the pieces it copies: the check
         * follows it and reads only what no piece covers (each byte once in
         * all, where beside the writer each was read twice) */
        bool after = d->crcs_pieces && d->write && !d->write_set &&
                     !(opt && (opt->flags & CKPT_WRITE_MODEL_FOLDER));
        for (size_t i = 0; after && i < f->nstorages; i++) {
            ckpt_storage *s = f->storages[i];
            for (size_t k = 0; s->loc == CKPT_LOC_PIECES && k < s->npieces; k++)
                ((ckpt_piece *)&s->pieces[k])->seen = false; /* (the arena's, writable) */
        }
        if (after) {
            check.joined = false;
            check.deferred = true;
        } else if (pthread_create(&check.thread, NULL, check_thread, &check) != 0) {
            check.rc = f->main.ops->check_records(f, &check.err); /* no thread: first */
        } else {
            check.joined = false;
        }
        f->checking = &check;
    }
    int rc;
    if (opt && (opt->flags & CKPT_WRITE_MODEL_FOLDER)) {
        rc = write_model_folder(f, path, opt);
    } else if (d->write_set) {
        rc = d->write_set(f, path, opt);
    } else if (opt && (opt->flags & CKPT_WRITE_IN_PLACE) && same_file(f, path) &&
               d->write_in_place && d->id == f->format) {
        /* an edit in place keeps the format: a conversion replaces the file */
        rc = write_in_place(f, d, path, opt);
    } else {
        if (opt && opt->result && (opt->flags & CKPT_WRITE_IN_PLACE) && same_file(f, path))
            snprintf(opt->result->why, sizeof(opt->result->why),
                     d->id != f->format ? "written as %s, it was %s: a conversion writes a new file"
                                        : "%s files are not edited in place",
                     d->name, ckpt_format_name(f->format));
        rc = write_one(f, d, path, opt);
    }
    if (f->checking == &check) {
        if (rc && check.deferred)
            check.joined = true; /* the write failed first: no check to wait for */
        int crc = check_join(f); /* (a write that failed first keeps its error) */
        rc = rc ? rc : crc;
        f->checking = NULL;
    }
    return rc;
}
