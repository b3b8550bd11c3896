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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A folder's records' CRC-32 check (f->check_records), run on a second
 * thread while the writer streams the storages made of runs inside them:
 * the first output is committed only once it has passed. */
struct ckpt_records_check {
    ckpt_file *f;
    pthread_t thread;
    bool joined;
    int rc;
    ckpt_error err;
};

static void *check_thread(void *arg)
{
    struct ckpt_records_check *c = arg;
    c->rc = c->f->check_records(c->f, &c->err);
    return NULL;
}

/* Wait for the check (once); its error into F. */
static int check_join(ckpt_file *f)
{
    struct ckpt_records_check *c = f->checking;
    if (!c)
        return CKPT_OK;
    if (!c->joined) {
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
    if (rc == CKPT_OK)
        rc = d->write(f, out.fd, path, opt);
    if (rc == CKPT_OK)
        rc = check_join(f); /* a corrupt input leaves no OUT */
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
     * covers whole: their CRC-32s are checked beside the writing */
    struct ckpt_records_check check = {.f = f, .joined = true};
    if (f->check_records && !f->checking) {
        if (pthread_create(&check.thread, NULL, check_thread, &check) != 0)
            check.rc = f->check_records(f, &check.err); /* no thread: first */
        else
            check.joined = false;
        f->checking = &check;
    }
    int rc = d->write_set ? d->write_set(f, path, opt) : write_one(f, d, path, opt);
    if (f->checking == &check) {
        int crc = check_join(f); /* (a write that failed first keeps its error) */
        rc = rc ? rc : crc;
        f->checking = NULL;
    }
    return rc;
}
