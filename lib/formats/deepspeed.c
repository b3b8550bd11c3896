/*
 * deepspeed.c - a DeepSpeed ZeRO checkpoint folder (read only), as
 * DeepSpeed's zero_to_fp32 reconstructs the full fp32 state dict from it
 * (doc/distributed-formats.md section 4).
 *
 * IN is the folder holding `latest` (the tag) or the tag folder itself
 * (global_stepN/).  Only the small pickles are read: the model-states
 * file(s) (param_shapes, buffer_names, shared_params, frozen parameters,
 * `module`) and each rank's optim file (its flat fp32 partitions: tensors
 * whose bytes stay in the file).  Every output tensor is a PIECES storage
 * made of runs of those files, so converting streams them in bounded memory:
 *   stages 1/2  a parameter is one range of the concatenation of every
 *               rank's flat partition of its group (a run per rank it spans);
 *   stage 3     a parameter is W slices of ceil(numel/W) elements, one per
 *               rank (the last ones cut at numel).
 * Buffers, frozen parameters from `module` and stage-2 frozen fragments
 * are whole records of the model-states file, upcast to float32 on read
 * (zero_to_fp32 upcasts buffers; ckpt does the same for frozen parameters).
 * Where ckpt differs from zero_to_fp32 (stage-1 frozen parameters, which it
 * drops; BF16_Optimizer files, which it refuses; bf16 frozen parameters,
 * which it leaves in bf16) a notice says so.  Nothing is ever executed:
 * DeepSpeed's classes are known data (pickle/globals.c).
 */
#include "formats/format.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* A rank's file, parsed. */
typedef struct ds_file {
    ckpt_source *src;
    const char *name;  /* inside the tag folder: "zero_pp_rank_1_mp_rank_00_optim_states.pt" */
    long rank;         /* from its name; -1 when it names none */
    ckpt_value *root;
} ds_file;

/* One flat 1-D run of a rank: where its elements are. */
typedef struct ds_run {
    ckpt_source *src;
    uint64_t at;      /* file offset of element 0 */
    int64_t numel;
    ckpt_dtype dtype;
} ds_run;

/* Reader state kept on the folder's source (f->main.fmt_data) for the
 * methods (ds_ops: --select module, --stats' record check, the layout). */
typedef struct ds_state {
    const char *tag;   /* "" when IN is the tag folder */
    int stage;         /* 1, 2, 3 */
    bool bf16_optimizer;
    long world;
    ds_file *model, *optim;
    size_t nmodel, noptim;
    ckpt_value *module; /* model file 0's `module` */
    /* private storages (not in the table) of the model file 0's pickle:
     * added to the table when --select module names them */
    ckpt_storage **mstor;
    size_t nmstor, mstor_cap;
    ckpt_storage **records; /* every record that output bytes come from */
    size_t nrecords, records_cap;
    bool module_added;
    const char *layout_json; /* ds_layout's answer */
    bool done; /* the read succeeded: the methods answer (a failed one has nothing) */
} ds_state;

/* What persistent_load needs while one file's pickle is read. */
typedef struct ds_pctx {
    ckpt_file *f;
    ds_state *st;
    ckpt_source *src;
    const char *fname;
    ckpt_zip_dir *zd;
    bool keep; /* the model file 0: keep its storages for --select module */
    ckpt_storage **made;
    size_t nmade, made_cap;
} ds_pctx;

/* ---- small helpers ------------------------------------------------------------------------ */

static int oom(ckpt_file *f)
{
    return ckpt_oom(&f->err);
}

/* The error now in F, said of FILE (the first cause kept, named). */
static int in_file(ckpt_file *f, const char *file, int rc)
{
    if (!rc)
        return rc;
    char msg[sizeof f->err.msg];
    snprintf(msg, sizeof msg, "%s", f->err.msg);
    if (strncmp(msg, file, strlen(file)) != 0)
        snprintf(f->err.msg, sizeof f->err.msg, "%.200s: %.*s", file,
                 (int)(sizeof f->err.msg - 220), msg);
    if (!f->err.code)
        f->err.code = rc;
    return rc;
}

static int bad(ckpt_file *f, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(ckpt_file *f, const char *file, const char *fmt, ...)
{
    char msg[sizeof f->err.msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: %s", file, msg);
}

static const ckpt_value *get(const ckpt_value *d, const char *key)
{
    return d && d->kind == CKPT_KIND_DICT ? ckpt_value_dict_get(d, key) : NULL;
}

static bool is_int(const ckpt_value *v, int64_t *out)
{
    if (!v || v->kind != CKPT_KIND_INT || v->u.i.big)
        return false;
    *out = v->u.i.v;
    return true;
}

static bool is_seq(const ckpt_value *v)
{
    return v && (v->kind == CKPT_KIND_LIST || v->kind == CKPT_KIND_TUPLE);
}

static ckpt_value *str_value(ckpt_file *f, const char *s, size_t n)
{
    ckpt_value *v = ckpt_value_new(&f->arena, CKPT_KIND_STR, 0);
    if (!v || !(v->u.s.s = ckpt_arena_strndup(&f->arena, s, n)))
        return NULL;
    v->u.s.len = n;
    return v;
}

/* The key STR of a dict entry as a C string, or NULL. */
static const char *key_str(const ckpt_value *k)
{
    return k && k->kind == CKPT_KIND_STR && strlen(k->u.s.s) == k->u.s.len ? k->u.s.s : NULL;
}

/* Natural order ("rank_10" after "rank_9"), as zero_to_fp32's natural_keys. */
static int natural_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0' && isdigit((unsigned char)a[1]))
                a++;
            while (*b == '0' && isdigit((unsigned char)b[1]))
                b++;
            size_t la = 0, lb = 0;
            while (isdigit((unsigned char)a[la]))
                la++;
            while (isdigit((unsigned char)b[lb]))
                lb++;
            if (la != lb)
                return la < lb ? -1 : 1;
            int c = strncmp(a, b, la);
            if (c)
                return c;
            a += la;
            b += lb;
        } else {
            if (*a != *b)
                return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    return *a ? 1 : *b ? -1 : 0;
}

static int file_cmp(const void *x, const void *y)
{
    return natural_cmp(((const ds_file *)x)->name, ((const ds_file *)y)->name);
}

/* The rank a file's name gives: the number after "zero_pp_rank_", else -1. */
static long name_rank(const char *name)
{
    const char *p = strstr(name, "zero_pp_rank_");
    if (!p)
        return -1;
    p += 13;
    if (!isdigit((unsigned char)*p))
        return -1;
    long r = 0;
    while (isdigit((unsigned char)*p) && r < 100000000)
        r = r * 10 + (*p++ - '0');
    return *p == '_' ? r : -1;
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

/* ---- the folder ---------------------------------------------------------------------------- */

/* `latest`'s tag, stripped as Python's str.strip() does (ASCII whitespace). */
static int read_latest(int dirfd, char *buf, size_t cap, bool *present)
{
    *present = false;
    struct stat st;
    if (fstatat(dirfd, "latest", &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? CKPT_OK : CKPT_ERR_IO;
    if (S_ISDIR(st.st_mode))
        return CKPT_OK; /* a folder named latest: not the tag file */
    if (S_ISLNK(st.st_mode)) {
        errno = ELOOP; /* as the O_NOFOLLOW open said before */
        return CKPT_ERR_IO;
    }
    *present = true;
    if (!S_ISREG(st.st_mode))
        return CKPT_ERR_UNSUPPORTED; /* a FIFO would block DeepSpeed too: never read */
    int fd = openat(dirfd, "latest", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return CKPT_ERR_IO;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return CKPT_ERR_UNSUPPORTED;
    }
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return CKPT_ERR_IO;
    if ((size_t)n == cap - 1)
        return CKPT_ERR_FORMAT;
    buf[n] = '\0';
    char *s = buf;
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len && isspace((unsigned char)s[len - 1]))
        len--;
    memmove(buf, s, len);
    buf[len] = '\0';
    return CKPT_OK;
}

/* Whether the open folder FD holds a *_model_states.pt and an *_optim_states.pt. */
static bool holds_rank_files(int fd)
{
    int dup = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dup < 0)
        return false;
    DIR *d = fdopendir(dup);
    if (!d) {
        close(dup);
        return false;
    }
    bool model = false, optim = false;
    struct dirent *e;
    while ((e = readdir(d)) && !(model && optim)) {
        model |= has_suffix(e->d_name, "_model_states.pt");
        optim |= has_suffix(e->d_name, "_optim_states.pt");
    }
    closedir(d);
    return model && optim;
}

static bool ds_claim_dir(int dirfd)
{
    char tag[512];
    bool present;
    if (read_latest(dirfd, tag, sizeof tag, &present) != CKPT_OK || present)
        return present; /* a `latest` file: ours, even when its tag is wrong (read says why) */
    return holds_rank_files(dirfd);
}

/* The files of the tag folder: *_model_states.pt and *_optim_states.pt,
 * each list in natural order (zero_to_fp32's glob + natural_keys). */
static int list_files(ckpt_file *f, ds_state *st, const char *where)
{
    struct stat ts;
    /* the tag folder itself, never a link out of the checkpoint's folder */
    if (st->tag[0] && fstatat(f->dir_fd, st->tag, &ts, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(ts.st_mode))
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "latest names the tag '%s', which is a "
                        "symbolic link, not a folder of the checkpoint", st->tag);
    int fd = st->tag[0] ? openat(f->dir_fd, st->tag, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                        : openat(f->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "latest names the tag '%s', which is not a "
                        "folder here: %s", st->tag, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return ckpt_err(&f->err, CKPT_ERR_IO, "cannot list '%s': %s", where, strerror(errno));
    }
    size_t mcap = 0, ocap = 0;
    int rc = CKPT_OK;
    struct dirent *e;
    while (rc == CKPT_OK && (e = readdir(d))) {
        bool m = has_suffix(e->d_name, "_model_states.pt"), o = has_suffix(e->d_name, "_optim_states.pt");
        if (!m && !o)
            continue;
        ds_file **list = m ? &st->model : &st->optim;
        size_t *n = m ? &st->nmodel : &st->noptim, *cap = m ? &mcap : &ocap;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 8;
            ds_file *p = realloc(*list, nc * sizeof(*p));
            if (!p) {
                rc = oom(f);
                break;
            }
            *list = p;
            *cap = nc;
        }
        ds_file *df = &(*list)[(*n)++];
        memset(df, 0, sizeof(*df));
        if (!(df->name = ckpt_arena_strndup(&f->arena, e->d_name, strlen(e->d_name))))
            rc = oom(f);
        df->rank = name_rank(e->d_name);
    }
    closedir(d);
    CKPT_FORWARD(rc);
    if (st->nmodel)
        qsort(st->model, st->nmodel, sizeof(*st->model), file_cmp);
    if (st->noptim)
        qsort(st->optim, st->noptim, sizeof(*st->optim), file_cmp);
    CKPT_RETURN_IF(!st->nmodel, &f->err, CKPT_ERR_FORMAT, "'%s' holds no *_model_states.pt file",
                   where);
    CKPT_RETURN_IF(!st->noptim, &f->err, CKPT_ERR_FORMAT, "'%s' holds no *_optim_states.pt file",
                   where);
    return CKPT_OK;
}

int ckpt_deepspeed_latest(int dirfd, char *buf, size_t cap, bool *present)
{
    return read_latest(dirfd, buf, cap, present);
}

/* ---- one rank file's pickle ---------------------------------------------------------------- */

static ckpt_global_class ds_classify(void *user, const char *q)
{
    return ckpt_file_classify_global(((ds_pctx *)user)->f, q);
}

/* torch.save's ('storage', type, key, location, numel): a storage of this
 * file's record data/KEY, outside the table (only output storages are in
 * it), located as one whole-record piece with its CRC. */
static ckpt_value *ds_pid(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    ds_pctx *pc = user;
    ckpt_file *f = pc->f;
    ckpt_value **a = pid->kind == CKPT_KIND_TUPLE ? pid->u.seq.items : NULL;
    if (!a || pid->u.seq.len != 5 || !ckpt_value_is_str(a[0], "storage") ||
        a[1]->kind != CKPT_KIND_GLOBAL || a[2]->kind != CKPT_KIND_STR ||
        a[3]->kind != CKPT_KIND_STR || a[4]->kind != CKPT_KIND_INT || a[4]->u.i.big ||
        a[4]->u.i.v < 0 || a[2]->u.s.len > 200) {
        ckpt_err(err, CKPT_ERR_FORMAT, "persistent id is not a ('storage', type, key, location, "
                                       "numel) tuple");
        return NULL;
    }
    const char *type_name = NULL;
    ckpt_dtype dt = ckpt_storage_type_dtype(a[1]->u.global.name, &type_name);
    if (dt == CKPT_DTYPE_UNKNOWN) {
        ckpt_err(err, CKPT_ERR_UNSUPPORTED, "storage type %s is not recognized",
                 a[1]->u.global.name);
        return NULL;
    }
    const char *key = a[2]->u.s.s;
    ckpt_storage *s = NULL;
    for (size_t i = 0; i < pc->nmade && !s; i++)
        if (strcmp(pc->made[i]->src_key, key) == 0)
            s = pc->made[i];
    uint64_t nbytes;
    if (ckpt_dtype_nbytes(dt, (uint64_t)a[4]->u.i.v, &nbytes)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage '%s' size overflows", key);
        return NULL;
    }
    if (s && (s->src_nbytes != nbytes || s->src_dtype != dt)) {
        ckpt_err(err, CKPT_ERR_FORMAT, "storage '%s' is named twice with different sizes", key);
        return NULL;
    }
    if (!s) {
        char rec[256];
        snprintf(rec, sizeof rec, "data/%s", key);
        int64_t i = ckpt_zip_dir_find(pc->zd, CKPT_ZIP_READER_TORCH, rec);
        const ckpt_zip_entry *e = i >= 0 ? ckpt_zip_dir_entry(pc->zd, CKPT_ZIP_READER_TORCH, (size_t)i) : NULL;
        if (!e) {
            ckpt_err(err, CKPT_ERR_FORMAT, "storage '%s' has no record '%s'", key, rec);
            return NULL;
        }
        if (e->method != 0) {
            ckpt_err(err, CKPT_ERR_UNSUPPORTED, "record '%s' is compressed (torch.save stores "
                                                "its records)", rec);
            return NULL;
        }
        if (e->usize != nbytes || e->csize != nbytes) {
            ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' is %llu bytes but storage '%s' (%lld x "
                     "%s) needs %llu", rec, (unsigned long long)e->usize, key,
                     (long long)a[4]->u.i.v, ckpt_dtype_name(dt), (unsigned long long)nbytes);
            return NULL;
        }
        if (e->data_at == UINT64_MAX || e->data_at > pc->src->file_size ||
            nbytes > pc->src->file_size - e->data_at) {
            ckpt_err(err, CKPT_ERR_FORMAT, "record '%s' is truncated: it ends past the file's "
                     "%llu bytes", rec, (unsigned long long)pc->src->file_size);
            return NULL;
        }
        s = ckpt_arena_alloc(&f->arena, sizeof(*s));
        ckpt_piece *p = ckpt_arena_alloc(&f->arena, sizeof(*p));
        char k[300];
        snprintf(k, sizeof k, "%s/%s", pc->fname, key);
        if (!s || !p || !(s->key = ckpt_arena_strndup(&f->arena, k, strlen(k))) ||
            !(s->device = ckpt_arena_strndup(&f->arena, a[3]->u.s.s, a[3]->u.s.len))) {
            ckpt_oom(err);
            return NULL;
        }
        s->src_key = s->key + strlen(pc->fname) + 1;
        s->dtype = s->src_dtype = dt;
        s->numel = a[4]->u.i.v;
        s->nbytes = s->src_nbytes = nbytes;
        s->type_name = type_name;
        s->zip_index = -1;
        *p = (ckpt_piece){.src = pc->src, .file_offset = e->data_at, .nbytes = nbytes,
                          .has_crc = true, .crc32 = e->crc};
        s->loc = CKPT_LOC_PIECES;
        s->pieces = p;
        s->npieces = 1;
        s->src = pc->src;
        if (pc->nmade == pc->made_cap) {
            size_t cap = pc->made_cap ? pc->made_cap * 2 : 32;
            ckpt_storage **m = realloc(pc->made, cap * sizeof(*m));
            if (!m) {
                ckpt_oom(err);
                return NULL;
            }
            pc->made = m;
            pc->made_cap = cap;
        }
        pc->made[pc->nmade++] = s;
    }
    return ckpt_file_storage_value(f, s, dt, type_name, offset, err);
}

/* Read DF (a file of the tag folder) and run its data.pkl through the VM. */
static int load_file(ckpt_file *f, ds_state *st, ds_file *df, bool keep)
{
    char path[1024];
    snprintf(path, sizeof path, "%s%s%s", st->tag, st->tag[0] ? "/" : "", df->name);
    ckpt_error e = {0};
    df->src = ckpt_file_source_add(f, path, &e);
    if (!df->src)
        return ckpt_err(&f->err, e.code, "%s", e.msg);
    int fd = ckpt_source_fd(f, df->src);
    if (fd < 0)
        return in_file(f, path, f->err.code ? f->err.code : CKPT_ERR_IO);
    ckpt_zip_dir *zd = NULL;
    int rc = ckpt_zip_dir_open_torch(fd, 0, df->src->file_size, &zd, &f->err);
    int64_t pk = rc ? -1 : ckpt_zip_dir_find(zd, CKPT_ZIP_READER_TORCH, "data.pkl");
    if (rc == CKPT_OK && pk < 0)
        rc = bad(f, path, "no data.pkl record");
    uint8_t *buf = NULL;
    size_t len = 0;
    bool crc_ok = false;
    if (rc == CKPT_OK)
        rc = ckpt_zip_dir_read(zd, fd, CKPT_ZIP_READER_TORCH, (size_t)pk,
                               f->limits[CKPT_LIMIT_PICKLE_BYTES], &buf, &len, &crc_ok, &f->err);
    if (rc == CKPT_OK && !crc_ok)
        rc = bad(f, path, "CRC-32 mismatch in its data.pkl record");
    int64_t bo = rc ? -1 : ckpt_zip_dir_find(zd, CKPT_ZIP_READER_TORCH, "byteorder");
    if (bo >= 0) { /* the runs are read in this machine's (little-endian) order */
        uint8_t *t = NULL;
        size_t tl = 0;
        bool ok = false;
        rc = ckpt_zip_dir_read(zd, fd, CKPT_ZIP_READER_TORCH, (size_t)bo, 16, &t, &tl, &ok, &f->err);
        if (rc == CKPT_OK && !(tl == 6 && memcmp(t, "little", 6) == 0))
            rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "%s: saved big-endian (byteorder "
                          "'%.*s'): not supported for a folder", path, (int)(tl < 8 ? tl : 8), t);
        free(t);
    }
    ds_pctx pc = {.f = f, .st = st, .src = df->src, .fname = path, .zd = zd, .keep = keep};
    if (rc == CKPT_OK) {
        ckpt_pickle_ctx ctx;
        ckpt_file_pickle_ctx(f, &ctx, path);
        ctx.classify = ds_classify;
        ctx.persistent_load = ds_pid;
        ctx.user = &pc;
        rc = ckpt_pickle_load(&ctx, buf, len, &df->root, NULL, &f->err);
    }
    free(buf);
    ckpt_zip_dir_free(zd);
    if (rc == CKPT_OK && keep) {
        st->mstor = pc.made;
        st->nmstor = pc.nmade;
        pc.made = NULL;
    }
    free(pc.made);
    if (rc == CKPT_OK && (!df->root || df->root->kind != CKPT_KIND_DICT))
        rc = bad(f, path, "holds a %s, not the dict DeepSpeed saves",
                 df->root ? ckpt_value_kind_name(df->root) : "nothing");
    return in_file(f, path, rc);
}

/* ---- what the pickles say ------------------------------------------------------------------ */

/* A 1-D contiguous tensor T of file FILE as a run; WHAT names it. */
static int note_record(ckpt_file *f, ds_state *st, ckpt_storage *rec);

static int tensor_run(ckpt_file *f, const char *file, const char *what, const ckpt_value *v,
                      ds_run *out)
{
    if (!v || v->kind != CKPT_KIND_TENSOR || !v->u.tensor->storage)
        return bad(f, file, "%s is a %s, not a tensor", what, v ? ckpt_value_kind_name(v) : "nothing");
    const ckpt_tensor *t = v->u.tensor;
    const ckpt_storage *s = t->storage;
    if (t->kind != 0 || t->ndim != 1 || (t->numel > 1 && t->stride[0] != 1))
        return bad(f, file, "%s is not a flat 1-D tensor", what);
    if (t->offset < 0 || t->numel < 0 || t->offset > s->numel || t->numel > s->numel - t->offset)
        return bad(f, file, "%s (%lld elements from %lld) lies past its storage's %lld elements",
                   what, (long long)t->numel, (long long)t->offset, (long long)s->numel);
    if (s->loc != CKPT_LOC_PIECES || s->npieces != 1)
        return bad(f, file, "%s has no storage record", what);
    out->src = (ckpt_source *)s->pieces[0].src;
    out->at = s->pieces[0].file_offset + (uint64_t)t->offset * ckpt_dtype_size(t->dtype);
    out->numel = t->numel;
    out->dtype = t->dtype;
    return note_record(f, f->main.fmt_data, (ckpt_storage *)s);
}

/* The number of elements of SHAPE (a torch.Size or a tuple), or -1. */
static int64_t shape_numel(const ckpt_value *shape, int *ndim, int64_t *dims)
{
    if (shape && shape->kind == CKPT_KIND_OBJECT && shape->u.obj.callable &&
        shape->u.obj.callable->kind == CKPT_KIND_GLOBAL &&
        strcmp(shape->u.obj.callable->u.global.name, "torch.Size") == 0 && shape->u.obj.args &&
        shape->u.obj.args->u.seq.len == 1)
        shape = shape->u.obj.args->u.seq.items[0];
    if (!is_seq(shape) || shape->u.seq.len > 64)
        return -1;
    int64_t n = 1;
    for (size_t i = 0; i < shape->u.seq.len; i++) {
        int64_t d;
        if (!is_int(shape->u.seq.items[i], &d) || d < 0 || (d && n > INT64_MAX / 4 / d))
            return -1;
        n *= d;
        dims[i] = d;
    }
    *ndim = (int)shape->u.seq.len;
    return n;
}

/* The stage ZeroStageEnum stands for: ZeroStageEnum(n) or
 * getattr(ZeroStageEnum, 'optimizer_states'). */
static int zero_stage_of(const ckpt_value *v)
{
    if (!v || v->kind != CKPT_KIND_OBJECT || !v->u.obj.callable ||
        v->u.obj.callable->kind != CKPT_KIND_GLOBAL || !v->u.obj.args)
        return -1;
    const char *fn = v->u.obj.callable->u.global.name;
    const ckpt_vec *a = &v->u.obj.args->u.seq;
    int64_t n;
    if (strcmp(fn, "deepspeed.runtime.zero.config.ZeroStageEnum") == 0 && a->len == 1 &&
        is_int(a->items[0], &n))
        return n >= 0 && n <= 3 ? (int)n : -1;
    if (strcmp(fn, "builtins.getattr") == 0 && a->len == 2 &&
        a->items[0]->kind == CKPT_KIND_GLOBAL &&
        strcmp(a->items[0]->u.global.name, "deepspeed.runtime.zero.config.ZeroStageEnum") == 0) {
        static const char *const names[] = {"disabled", "optimizer_states", "gradients", "weights"};
        for (int i = 0; i < 4; i++)
            if (ckpt_value_is_str(a->items[1], names[i]))
                return i;
    }
    return -1;
}

/* ---- output -------------------------------------------------------------------------------- */

typedef struct ds_out {
    ckpt_file *f;
    ds_state *st;
    ckpt_value *sd;
    size_t nstorages;
    /* model-file records already made into an output storage (buffers and
     * frozen tensors of one record share it) */
    const ckpt_storage **from;
    ckpt_storage **to;
    size_t nfrom, from_cap;
} ds_out;

/* A record's private storage, once listed: its zip_index (unused by a
 * PIECES storage, -1 from ds_pid) says so, so that listing stays linear in
 * the records (a ZeRO-3 folder of many frozen parameters has one per
 * parameter and rank). */
#define NOTED (-2)

static int note_record(ckpt_file *f, ds_state *st, ckpt_storage *rec)
{
    if (rec->zip_index == NOTED)
        return CKPT_OK;
    if (st->nrecords == st->records_cap) {
        size_t cap = st->records_cap ? st->records_cap * 2 : 32;
        ckpt_storage **p = realloc(st->records, cap * sizeof(*p));
        if (!p)
            return oom(f);
        st->records = p;
        st->records_cap = cap;
    }
    st->records[st->nrecords++] = rec;
    rec->zip_index = NOTED;
    return CKPT_OK;
}

static ckpt_dtype out_dtype(ckpt_dtype src)
{
    return ckpt_dtype_is_floating(src) && ckpt_cast_supported(src, CKPT_DTYPE_FLOAT32)
               ? CKPT_DTYPE_FLOAT32
               : src;
}

/* A new output storage of NUMEL elements of SRC_DT, read as float32 when
 * floating (zero_to_fp32's .float()). */
static ckpt_storage *out_storage(ds_out *o, ckpt_dtype src_dt, int64_t numel)
{
    char key[32];
    snprintf(key, sizeof key, "%zu", o->nstorages++);
    ckpt_dtype dt = out_dtype(src_dt);
    ckpt_storage *s = ckpt_file_storage_new(o->f, key, dt, numel, "cpu", 3, &o->f->err);
    if (!s)
        return NULL;
    s->src_dtype = src_dt;
    s->src_nbytes = (uint64_t)numel * ckpt_dtype_size(src_dt);
    s->type_name = ckpt_storage_type_name(dt);
    if (!s->type_name)
        s->type_name = "UntypedStorage";
    return s;
}

static int add_entry(ds_out *o, const char *name, ckpt_value *t)
{
    ckpt_value *k = str_value(o->f, name, strlen(name));
    if (!k || ckpt_vec_push(&o->f->arena, &o->sd->u.dict.keys, k) ||
        ckpt_vec_push(&o->f->arena, &o->sd->u.dict.vals, t))
        return oom(o->f);
    return CKPT_OK;
}

static int add_tensor(ds_out *o, const char *name, ckpt_storage *s, int ndim, const int64_t *shape,
                      const int64_t *stride_in, int64_t offset)
{
    int64_t stride[65];
    if (stride_in) {
        memcpy(stride, stride_in, (size_t)ndim * sizeof(int64_t));
    } else {
        int64_t acc = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            stride[d] = acc;
            acc *= shape[d] ? shape[d] : 1;
        }
    }
    ckpt_value *t = ckpt_tensor_value_new(&o->f->arena, s, s->dtype, ndim, shape, stride, offset);
    return t ? add_entry(o, name, t) : oom(o->f);
}

/* NAME from tensor V of the model file FILE: its whole record as an output
 * storage (shared by every tensor of that record), the view kept. */
static int add_from_record(ds_out *o, const char *file, const char *name, const ckpt_value *v)
{
    ckpt_file *f = o->f;
    if (!v || v->kind != CKPT_KIND_TENSOR || !v->u.tensor->storage || v->u.tensor->kind != 0)
        return bad(f, file, "module entry '%s' is a %s, not a tensor", name,
                   v ? ckpt_value_kind_name(v) : "nothing");
    const ckpt_tensor *t = v->u.tensor;
    const ckpt_storage *rec = t->storage;
    if (rec->loc != CKPT_LOC_PIECES || rec->npieces != 1)
        return bad(f, file, "'%s' has no storage record", name);
    ckpt_storage *s = NULL;
    for (size_t i = 0; i < o->nfrom && !s; i++)
        if (o->from[i] == rec)
            s = o->to[i];
    if (!s) {
        if (!(s = out_storage(o, rec->src_dtype, rec->numel)))
            return f->err.code;
        ckpt_piece *p = ckpt_arena_alloc(&f->arena, sizeof(*p));
        if (!p)
            return oom(f);
        *p = rec->pieces[0];
        CKPT_FORWARD(ckpt_storage_pieces_set(f, s, p, 1, file, &f->err));
        CKPT_FORWARD(note_record(f, o->st, (ckpt_storage *)rec));
        if (o->nfrom == o->from_cap) {
            size_t cap = o->from_cap ? o->from_cap * 2 : 16;
            const ckpt_storage **a = realloc(o->from, cap * sizeof(*a));
            ckpt_storage **b = a ? realloc(o->to, cap * sizeof(*b)) : NULL;
            if (a)
                o->from = a;
            if (!b)
                return oom(f);
            o->to = b;
            o->from_cap = cap;
        }
        o->from[o->nfrom] = rec;
        o->to[o->nfrom++] = s;
    }
    /* the view must lie inside the record (the VM checked its arithmetic) */
    int64_t last = t->offset;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0)
            last = -1;
    for (int d = 0; d < t->ndim && last >= 0; d++)
        last += (t->shape[d] - 1) * t->stride[d];
    if (t->offset < 0 || (last >= 0 && last >= rec->numel))
        return bad(f, file, "'%s' lies past its storage's %lld elements", name, (long long)rec->numel);
    return add_tensor(o, name, s, t->ndim, t->shape, t->stride, t->offset);
}

/* Pieces of NUMEL elements taken from the runs R[0..N) as if concatenated,
 * from element FROM on, appended to P (at DST elements of the output). */
static int take_runs(ckpt_file *f, const ds_run *r, size_t n, int64_t from, int64_t numel,
                     int64_t dst, ckpt_piece **p, size_t *np, size_t *cap)
{
    int64_t base = 0;
    for (size_t i = 0; i < n && numel > 0; base += r[i].numel, i++) {
        if (from >= base + r[i].numel)
            continue;
        int64_t skip = from - base, take = r[i].numel - skip;
        if (take > numel)
            take = numel;
        size_t es = ckpt_dtype_size(r[i].dtype);
        if (*np == *cap) {
            size_t c = *cap ? *cap * 2 : 8;
            ckpt_piece *q = realloc(*p, c * sizeof(*q));
            if (!q)
                return oom(f);
            *p = q;
            *cap = c;
        }
        (*p)[(*np)++] = (ckpt_piece){.src = r[i].src, .file_offset = r[i].at + (uint64_t)skip * es,
                                     .nbytes = (uint64_t)take * es, .dst_offset = (uint64_t)dst * es};
        from += take;
        dst += take;
        numel -= take;
    }
    return numel > 0 ? ckpt_err(&f->err, CKPT_ERR_FORMAT, "runs too short") : CKPT_OK;
}

/* A storage of the pieces P[0..N) (malloc'd; copied into the arena). */
static ckpt_storage *pieces_storage(ds_out *o, ckpt_dtype dt, int64_t numel, ckpt_piece *p, size_t n,
                                    const char *what)
{
    ckpt_storage *s = out_storage(o, dt, numel);
    ckpt_piece *q = s ? ckpt_arena_alloc(&o->f->arena, (n ? n : 1) * sizeof(*q)) : NULL;
    if (s && !q) {
        oom(o->f);
        return NULL;
    }
    if (!s)
        return NULL;
    memcpy(q, p, n * sizeof(*q));
    if (ckpt_storage_pieces_set(o->f, s, q, n, what, &o->f->err))
        return NULL;
    return s;
}

static int rank_groups_in(ckpt_file *f, ds_state *st, const char *key, size_t *ngroups,
                          ds_run **runs);

/* The runs of each rank's flat fp32 groups: RUNS[r * G + g] (malloc'd;
 * NULL on an error). */
static int rank_groups(ckpt_file *f, ds_state *st, const char *key, size_t *ngroups, ds_run **runs)
{
    int rc = rank_groups_in(f, st, key, ngroups, runs);
    if (rc) {
        free(*runs);
        *runs = NULL;
    }
    return rc;
}

static int rank_groups_in(ckpt_file *f, ds_state *st, const char *key, size_t *ngroups,
                          ds_run **runs)
{
    size_t G = 0;
    *runs = NULL;
    for (size_t r = 0; r < st->noptim; r++) {
        const char *file = st->optim[r].src->path;
        const ckpt_value *osd = get(st->optim[r].root, "optimizer_state_dict");
        const ckpt_value *groups = get(osd, key);
        if (!is_seq(groups))
            return bad(f, file, "optimizer_state_dict has no '%s' list", key);
        if (r == 0) {
            G = groups->u.seq.len;
            if (!G)
                return bad(f, file, "'%s' is empty", key);
            if (!(*runs = calloc(st->noptim * G, sizeof(**runs))))
                return oom(f);
        } else if (groups->u.seq.len != G) {
            return bad(f, file, "'%s' has %zu groups, rank 0 has %zu", key, (size_t)groups->u.seq.len, G);
        }
        for (size_t g = 0; g < G; g++) {
            char what[128];
            snprintf(what, sizeof what, "%s[%zu]", key, g);
            CKPT_FORWARD(tensor_run(f, file, what, groups->u.seq.items[g], &(*runs)[r * G + g]));
            if ((*runs)[r * G + g].dtype != (*runs)[0].dtype)
                return bad(f, file, "%s is %s, rank 0's flat groups %s", what,
                           ckpt_dtype_name((*runs)[r * G + g].dtype), ckpt_dtype_name((*runs)[0].dtype));
        }
    }
    *ngroups = G;
    return CKPT_OK;
}

/* Stages 1 and 2: each group's parameters in order along the
 * concatenation of every rank's partition, alignment paddings skipped. */
static int trainable_12(ds_out *o, const ckpt_value *shapes, const char *mfile)
{
    ckpt_file *f = o->f;
    ds_state *st = o->st;
    const char *ofile = st->optim[0].src->path;
    size_t G;
    ds_run *runs;
    CKPT_FORWARD(rank_groups(f, st, "single_partition_of_fp32_groups", &G, &runs));
    int rc = CKPT_OK;
    if (shapes->u.seq.len != G)
        rc = bad(f, mfile, "param_shapes has %zu groups, the optim files %zu", (size_t)shapes->u.seq.len, G);
    const ckpt_value *pads = get(get(st->optim[0].root, "optimizer_state_dict"), "param_alignment_paddings");
    if (pads && pads->kind == CKPT_KIND_NONE)
        pads = NULL;
    if (rc == CKPT_OK && pads && (!is_seq(pads) || pads->u.seq.len != G))
        rc = bad(f, ofile, "param_alignment_paddings is not a list of %zu groups", G);
    ds_run *grp = calloc(st->noptim ? st->noptim : 1, sizeof(*grp));
    ckpt_piece *p = NULL;
    size_t np = 0, cap = 0;
    if (!grp)
        rc = oom(f);
    for (size_t g = 0; g < G && rc == CKPT_OK; g++) {
        const ckpt_value *sh = shapes->u.seq.items[g];
        if (!sh || sh->kind != CKPT_KIND_DICT) {
            rc = bad(f, mfile, "param_shapes[%zu] is not a dict", g);
            break;
        }
        const ckpt_value *gp = pads ? pads->u.seq.items[g] : NULL;
        if (gp && (!is_seq(gp) || gp->u.seq.len != sh->u.dict.keys.len)) {
            rc = bad(f, ofile, "param_alignment_paddings[%zu] does not hold one padding per "
                     "parameter (%zu)", g, (size_t)sh->u.dict.keys.len);
            break;
        }
        int64_t avail = 0;
        for (size_t r = 0; r < st->noptim; r++) {
            grp[r] = runs[r * G + g];
            avail += grp[r].numel;
        }
        int64_t off = 0;
        for (size_t i = 0; i < sh->u.dict.keys.len && rc == CKPT_OK; i++) {
            const char *name = key_str(sh->u.dict.keys.items[i]);
            int ndim;
            int64_t dims[64], pad = 0;
            int64_t n = shape_numel(sh->u.dict.vals.items[i], &ndim, dims);
            if (!name || n < 0) {
                rc = bad(f, mfile, "param_shapes[%zu] entry %zu is not a name and a size", g, i);
                break;
            }
            if (gp && (!is_int(gp->u.seq.items[i], &pad) || pad < 0 || pad > INT64_MAX / 4)) {
                rc = bad(f, ofile, "param_alignment_paddings[%zu][%zu] is not a count", g, i);
                break;
            }
            if (off > avail || n > avail - off) {
                rc = bad(f, ofile, "the flat fp32 partitions of group %zu hold %lld elements; "
                         "parameter '%s' (%lld) needs them up to %lld", g, (long long)avail, name,
                         (long long)n, (long long)(off + n));
                break;
            }
            np = 0;
            rc = take_runs(f, grp, st->noptim, off, n, 0, &p, &np, &cap);
            ckpt_storage *s = rc ? NULL : pieces_storage(o, grp[0].dtype, n, p, np, ofile);
            if (rc == CKPT_OK && !s)
                rc = f->err.code;
            if (rc == CKPT_OK)
                rc = add_tensor(o, name, s, ndim, dims, NULL, 0);
            off += n + pad;
        }
        /* zero_to_fp32's check: both counts aligned to 2 * W agree */
        int64_t al = 2 * st->world;
        if (rc == CKPT_OK && (off + al - 1) / al != (avail + al - 1) / al)
            rc = bad(f, ofile, "group %zu: the parameters take %lld elements of the %lld in the "
                     "flat partitions (aligned to %lld): they do not match", g, (long long)off,
                     (long long)avail, (long long)al);
    }
    free(p);
    free(grp);
    free(runs);
    return rc;
}

/* Stage 3: each parameter is ceil(numel / W) elements of every rank's
 * concatenated flat groups, the ranks' slices joined and cut at numel. */
static int trainable_3(ds_out *o, const ckpt_value *shapes, const char *mfile)
{
    ckpt_file *f = o->f;
    ds_state *st = o->st;
    const char *ofile = st->optim[0].src->path;
    size_t G;
    ds_run *runs;
    CKPT_FORWARD(rank_groups(f, st, "fp32_flat_groups", &G, &runs));
    int rc = CKPT_OK;
    int64_t total = 0;
    for (size_t g = 0; g < G; g++)
        total += runs[g].numel;
    for (size_t r = 1; r < st->noptim && rc == CKPT_OK; r++) {
        int64_t t = 0;
        for (size_t g = 0; g < G; g++)
            t += runs[r * G + g].numel;
        if (t != total)
            rc = bad(f, st->optim[r].src->path, "its flat fp32 groups hold %lld elements, rank "
                     "0's %lld", (long long)t, (long long)total);
    }
    int64_t W = st->world, off = 0;
    ckpt_piece *p = NULL;
    size_t np = 0, cap = 0;
    for (size_t g = 0; g < shapes->u.seq.len && rc == CKPT_OK; g++) {
        const ckpt_value *sh = shapes->u.seq.items[g];
        if (!sh || sh->kind != CKPT_KIND_DICT) {
            rc = bad(f, mfile, "param_shapes[%zu] is not a dict", g);
            break;
        }
        for (size_t i = 0; i < sh->u.dict.keys.len && rc == CKPT_OK; i++) {
            const char *name = key_str(sh->u.dict.keys.items[i]);
            int ndim;
            int64_t dims[64];
            int64_t n = shape_numel(sh->u.dict.vals.items[i], &ndim, dims);
            if (!name || n < 0) {
                rc = bad(f, mfile, "param_shapes[%zu] entry %zu is not a name and a size", g, i);
                break;
            }
            int64_t part = (n + W - 1) / W;
            if (off > total || part > total - off) {
                rc = bad(f, ofile, "the flat fp32 groups hold %lld elements per rank; parameter "
                         "'%s' (%lld, %lld per rank) needs them up to %lld", (long long)total,
                         name, (long long)n, (long long)part, (long long)(off + part));
                break;
            }
            np = 0;
            int64_t left = n;
            for (int64_t r = 0; r < W && left > 0 && rc == CKPT_OK; r++) {
                int64_t take = left < part ? left : part;
                rc = take_runs(f, runs + r * (int64_t)G, G, off, take, n - left, &p, &np, &cap);
                left -= take;
            }
            ckpt_storage *s = rc ? NULL : pieces_storage(o, runs[0].dtype, n, p, np, ofile);
            if (rc == CKPT_OK && !s)
                rc = f->err.code;
            if (rc == CKPT_OK)
                rc = add_tensor(o, name, s, ndim, dims, NULL, 0);
            off += part;
        }
    }
    if (rc == CKPT_OK && off != total)
        rc = bad(f, ofile, "the parameters take %lld elements of each rank's %lld in the flat "
                 "fp32 groups: they do not match", (long long)off, (long long)total);
    free(p);
    free(runs);
    return rc;
}

/* Whether NAME is a key of dict D (strings). */
static bool has_key(const ckpt_value *d, const char *name)
{
    return d && d->kind == CKPT_KIND_DICT && ckpt_value_dict_get(d, name);
}

static bool in_param_shapes(const ckpt_value *shapes, const char *name)
{
    for (size_t g = 0; g < shapes->u.seq.len; g++)
        if (has_key(shapes->u.seq.items[g], name))
            return true;
    return false;
}

static bool in_str_list(const ckpt_value *l, const char *name)
{
    for (size_t i = 0; is_seq(l) && i < l->u.seq.len; i++)
        if (ckpt_value_is_str(l->u.seq.items[i], name))
            return true;
    return false;
}

/* Frozen parameters (zero_to_fp32's position: after buffers). */
static int frozen(ds_out *o, const ckpt_value *m0, const ckpt_value *shapes, const char *mfile,
                  size_t *nfrozen, bool *low)
{
    ckpt_file *f = o->f;
    ds_state *st = o->st;
    *nfrozen = 0;
    *low = false;
    if (st->stage == 1 || st->bf16_optimizer) {
        /* not recorded: every module entry that is no buffer, no trainable
         * parameter and no tied alias */
        const ckpt_value *bufs = get(m0, "buffer_names"), *shared = get(m0, "shared_params");
        const ckpt_value *mod = st->module;
        for (size_t i = 0; i < mod->u.dict.keys.len; i++) {
            const char *name = key_str(mod->u.dict.keys.items[i]);
            if (!name)
                return bad(f, mfile, "module has a key that is not a string");
            if (in_str_list(bufs, name) || in_param_shapes(shapes, name) || has_key(shared, name))
                continue;
            const ckpt_value *v = mod->u.dict.vals.items[i];
            *low |= v->kind == CKPT_KIND_TENSOR && v->u.tensor->dtype != CKPT_DTYPE_FLOAT32 &&
                    ckpt_dtype_is_floating(v->u.tensor->dtype);
            CKPT_FORWARD(add_from_record(o, mfile, name, v));
            (*nfrozen)++;
        }
        return CKPT_OK;
    }
    const ckpt_value *fshapes = get(m0, "frozen_param_shapes");
    if (!fshapes || fshapes->kind == CKPT_KIND_NONE)
        return CKPT_OK;
    if (fshapes->kind != CKPT_KIND_DICT)
        return bad(f, mfile, "frozen_param_shapes is not a dict");
    ckpt_piece *p = NULL;
    size_t np = 0, cap = 0;
    int rc = CKPT_OK;
    for (size_t i = 0; i < fshapes->u.dict.keys.len && rc == CKPT_OK; i++) {
        const char *name = key_str(fshapes->u.dict.keys.items[i]);
        int ndim;
        int64_t dims[64];
        int64_t n = shape_numel(fshapes->u.dict.vals.items[i], &ndim, dims);
        if (!name || n < 0) {
            rc = bad(f, mfile, "frozen_param_shapes entry %zu is not a name and a size", i);
            break;
        }
        if (st->stage == 2) {
            const ckpt_value *frag = get(get(m0, "frozen_param_fragments"), name);
            if (!frag || frag->kind != CKPT_KIND_TENSOR) {
                rc = bad(f, mfile, "frozen_param_fragments has no tensor '%s'", name);
                break;
            }
            if (frag->u.tensor->numel != n) {
                rc = bad(f, mfile, "frozen parameter '%s' holds %lld elements, its shape %lld",
                         name, (long long)frag->u.tensor->numel, (long long)n);
                break;
            }
            *low |= frag->u.tensor->dtype != CKPT_DTYPE_FLOAT32;
            rc = add_from_record(o, mfile, name, frag);
        } else {
            /* stage 3: every rank's 1-D fragment, joined, cut at numel */
            np = 0;
            int64_t got = 0;
            ckpt_dtype dt = CKPT_DTYPE_UNKNOWN;
            for (size_t r = 0; r < st->nmodel && rc == CKPT_OK && got < n; r++) {
                const ckpt_value *frag = get(get(st->model[r].root, "frozen_param_fragments"), name);
                ds_run run;
                char what[300];
                snprintf(what, sizeof what, "frozen_param_fragments['%.200s']", name);
                rc = tensor_run(f, st->model[r].src->path, what, frag, &run);
                if (rc)
                    break;
                if (dt == CKPT_DTYPE_UNKNOWN)
                    dt = run.dtype;
                if (run.dtype != dt) {
                    rc = bad(f, st->model[r].src->path, "%s is %s, rank 0's %s", what,
                             ckpt_dtype_name(run.dtype), ckpt_dtype_name(dt));
                    break;
                }
                int64_t take = run.numel < n - got ? run.numel : n - got;
                rc = take_runs(f, &run, 1, 0, take, got, &p, &np, &cap);
                got += take;
            }
            if (rc == CKPT_OK && got < n)
                rc = bad(f, mfile, "the ranks' fragments of frozen parameter '%s' hold %lld of its "
                         "%lld elements", name, (long long)got, (long long)n);
            if (rc)
                break;
            *low |= dt != CKPT_DTYPE_FLOAT32;
            ckpt_storage *s = pieces_storage(o, dt, n, p, np, mfile);
            rc = s ? add_tensor(o, name, s, ndim, dims, NULL, 0) : f->err.code;
        }
        (*nfrozen)++;
    }
    free(p);
    return rc;
}

/* ---- --select module ---------------------------------------------------------------------- */

static int ds_select_extra(ckpt_file *f, const char *name, ckpt_value **out)
{
    ds_state *st = f->main.fmt_data;
    *out = NULL;
    if (!st || !st->done || strcmp(name, "module") != 0)
        return CKPT_OK;
    const char *mfile = st->model[0].src->path;
    if (st->stage == 3)
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                        "--select module: at ZeRO stage 3, %s's module holds only empty "
                        "placeholders (0 elements) for the parameters; the weights are the "
                        "optim files' fp32 partitions (convert without --select)", mfile);
    if (!st->module_added) {
        for (size_t i = 0; i < st->nmstor; i++)
            CKPT_FORWARD(ckpt_file_storage_add(f, st->mstor[i], &f->err));
        st->module_added = true;
    }
    *out = st->module;
    return CKPT_OK;
}

/* ---- --stats: every record the output reads, whole, CRC-checked ---------------------------- */

/* A run of a record whose CRC-32 the write computed (a piece it copied). */
typedef struct seen_run {
    const ckpt_source *src;
    uint64_t at, n;
    uint32_t crc;
} seen_run;

static int by_place(const void *a, const void *b)
{
    const seen_run *x = a, *y = b;
    if (x->src != y->src)
        return (uintptr_t)x->src < (uintptr_t)y->src ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* CRC-32 of N bytes of SRC at AT, read (the main thread's descriptors). */
static int crc_read(ckpt_file *f, const ckpt_source *src, uint64_t at, uint64_t n, uint8_t *buf,
                    uint32_t *crc)
{
    int fd = ckpt_source_fd(f, (ckpt_source *)src);
    if (fd < 0)
        return CKPT_ERR_IO;
    return ckpt_crc_range_buf(fd, at, n, buf, crc, NULL);
}

/* After a write that computed the CRC-32 of every piece it copied
 * (f->pieces_seen): each record's CRC-32 combined from those of the runs
 * inside it, in file order, and of the bytes between them, which alone are
 * read (the padding of a rank's flat group, a record no output took).  The
 * same verdict as reading every record whole, for a tenth of the reading. */
static int check_from_pieces(ckpt_file *f, ds_state *st, uint8_t *buf, ckpt_error *err)
{
    size_t n = 0;
    for (size_t i = 0; i < f->nstorages; i++)
        if (f->storages[i]->loc == CKPT_LOC_PIECES)
            n += f->storages[i]->npieces;
    seen_run *runs = malloc((n ? n : 1) * sizeof *runs);
    if (!runs)
        return ckpt_oom(err);
    n = 0;
    for (size_t i = 0; i < f->nstorages; i++) {
        const ckpt_storage *s = f->storages[i];
        for (size_t k = 0; s->loc == CKPT_LOC_PIECES && k < s->npieces; k++) {
            const ckpt_piece *p = &s->pieces[k];
            if (!p->mem && p->src && p->seen && p->nbytes)
                runs[n++] = (seen_run){p->src, p->file_offset, p->nbytes, p->seen_crc};
        }
    }
    qsort(runs, n, sizeof *runs, by_place);
    int rc = CKPT_OK;
    for (size_t i = 0; i < st->nrecords && rc == CKPT_OK; i++) {
        const ckpt_storage *r = st->records[i];
        const ckpt_piece *whole = &r->pieces[0];
        uint64_t pos = whole->file_offset, end = pos + whole->nbytes;
        uint32_t crc = 0, c;
        /* the first run of this file that ends past the record's start */
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            seen_run key = {whole->src, pos, 0, 0};
            if (by_place(&runs[mid], &key) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        while (lo > 0 && runs[lo - 1].src == whole->src && runs[lo - 1].at + runs[lo - 1].n > pos)
            lo--;
        for (size_t k = lo; k < n && rc == CKPT_OK && runs[k].src == whole->src &&
                            runs[k].at < end && pos < end; k++) {
            const seen_run *q = &runs[k];
            uint64_t q_end = q->at + q->n;
            if (q_end <= pos || q_end > end)
                continue; /* covered already, or not wholly inside: read below */
            if (q->at > pos) { /* the bytes before it */
                rc = crc_read(f, whole->src, pos, q->at - pos, buf, &c);
                crc = (uint32_t)crc32_combine(crc, c, (z_off_t)(q->at - pos));
                pos = q->at;
            }
            if (rc == CKPT_OK && q->at == pos) {
                crc = (uint32_t)crc32_combine(crc, q->crc, (z_off_t)q->n);
                pos = q_end;
            }
            /* (a run that starts inside one already counted: its rest is read
             * with the next gap) */
        }
        if (rc == CKPT_OK && pos < end) {
            rc = crc_read(f, whole->src, pos, end - pos, buf, &c);
            crc = (uint32_t)crc32_combine(crc, c, (z_off_t)(end - pos));
        }
        if (rc == CKPT_OK && crc != whole->crc32)
            rc = ckpt_err(err, CKPT_ERR_FORMAT, "%s: CRC-32 mismatch in record data/%s",
                          whole->src->path, r->src_key);
        else if (rc != CKPT_OK) /* (as the whole read says it) */
            rc = ckpt_err(err, CKPT_ERR_IO, "%s: cannot read record data/%s", whole->src->path,
                          r->src_key);
    }
    free(runs);
    return rc;
}

static int ds_check_records(ckpt_file *f, ckpt_error *err)
{
    ds_state *st = f->main.fmt_data;
    if (!st || !st->done)
        return CKPT_OK;
    uint8_t *buf = malloc(CKPT_IO_BUF);
    if (buf && f->pieces_seen) {
        int rc = check_from_pieces(f, st, buf, err);
        free(buf);
        return rc;
    }
    if (!buf)
        return ckpt_oom(err);
    int rc = CKPT_OK;
    for (size_t i = 0; i < st->nrecords && rc == CKPT_OK; i++) {
        /* each a storage of one piece, the whole record with its CRC-32 */
        const ckpt_storage *r = st->records[i];
        const char *path = r->pieces[0].src->path;
        uint32_t crc;
        size_t bad = SIZE_MAX;
        int c = ckpt_storage_pieces_crc(f, r, buf, &crc, &bad, NULL);
        if (c != CKPT_OK && bad == 0)
            rc = ckpt_err(err, CKPT_ERR_FORMAT, "%s: CRC-32 mismatch in record data/%s", path,
                          r->src_key);
        else if (c != CKPT_OK)
            rc = ckpt_err(err, CKPT_ERR_IO, "%s: cannot read record data/%s", path, r->src_key);
    }
    free(buf);
    return rc;
}

/* ---- the layout, for inspect --------------------------------------------------------------- */

/* S as a JSON string (quoted, escaped) at *N of BUF (CAP bytes). */
static void json_str(char *buf, size_t cap, size_t *n, const char *s)
{
    *n += (size_t)snprintf(buf + *n, *n < cap ? cap - *n : 0, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            *n += (size_t)snprintf(buf + *n, *n < cap ? cap - *n : 0, "\\%c", *c);
        else if (*c < 0x20)
            *n += (size_t)snprintf(buf + *n, *n < cap ? cap - *n : 0, "\\u%04x", *c);
        else
            *n += (size_t)snprintf(buf + *n, *n < cap ? cap - *n : 0, "%c", *c);
    }
    *n += (size_t)snprintf(buf + *n, *n < cap ? cap - *n : 0, "\"");
}

static int layout(ckpt_file *f, ds_state *st, size_t nbuf, size_t nfrozen, size_t ntrain, size_t nalias)
{
    size_t cap = 512 + strlen(st->tag) * 6;
    for (size_t i = 0; i < st->nmodel; i++)
        cap += strlen(st->model[i].src->path) * 6 + 4;
    for (size_t i = 0; i < st->noptim; i++)
        cap += strlen(st->optim[i].src->path) * 6 + 4;
    size_t n = 0;
    char *s = ckpt_arena_alloc(&f->arena, cap);
    if (!s)
        return oom(f);
#define PUT(...) n += (size_t)snprintf(s + n, n < cap ? cap - n : 0, __VA_ARGS__)
    PUT("{\"format\": \"deepspeed\", \"tag\": ");
    json_str(s, cap, &n, st->tag);
    PUT(", \"zero_stage\": %d, \"optimizer\": \"%s\", \"world_size\": %ld, \"model_files\": [",
        st->stage, st->bf16_optimizer ? "BF16_Optimizer" : "DeepSpeedZeroOptimizer", st->world);
    for (size_t i = 0; i < st->nmodel; i++) {
        PUT("%s", i ? ", " : "");
        json_str(s, cap, &n, st->model[i].src->path);
    }
    PUT("], \"rank_files\": [");
    for (size_t i = 0; i < st->noptim; i++) {
        PUT("%s", i ? ", " : "");
        json_str(s, cap, &n, st->optim[i].src->path);
    }
    PUT("], \"buffers\": %zu, \"frozen\": %zu, \"trainable\": %zu, \"tied\": %zu}", nbuf, nfrozen,
        ntrain, nalias);
#undef PUT
    if (n >= cap)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "file names too long for the layout");
    st->layout_json = s;
    return CKPT_OK;
}

static const char *ds_layout(const ckpt_file *f)
{
    const ds_state *st = f->main.fmt_data;
    return st ? st->layout_json : NULL;
}

/* ---- read ---------------------------------------------------------------------------------- */

static int check_tag(ckpt_file *f, const char *tag)
{
    bool ok = tag[0] && strcmp(tag, ".") != 0 && strcmp(tag, "..") != 0 && !strchr(tag, '/');
    for (const char *c = tag; ok && *c; c++)
        ok = (unsigned char)*c >= 0x20;
    return ok ? CKPT_OK
              : ckpt_err(&f->err, CKPT_ERR_FORMAT, "latest: the tag '%.100s' is not a folder "
                         "name inside the checkpoint folder", tag);
}

/* The optim files: one per rank 0..W-1 by name, W from partition_count. */
static int check_ranks(ckpt_file *f, ds_state *st, const char *where)
{
    const char *ofile = st->optim[0].src->path;
    const ckpt_value *osd = get(st->optim[0].root, "optimizer_state_dict");
    if (!osd || osd->kind != CKPT_KIND_DICT)
        return bad(f, ofile, "no optimizer_state_dict dict: not a DeepSpeed optim file");
    const ckpt_value *pc = get(osd, "partition_count");
    int64_t w = -1, x;
    if (is_int(pc, &x))
        w = x;
    for (size_t i = 0; is_seq(pc) && i < pc->u.seq.len; i++) {
        if (!is_int(pc->u.seq.items[i], &x) || x < 1)
            return bad(f, ofile, "partition_count[%zu] is not a positive int", i);
        w = x > w ? x : w; /* zero_to_fp32 takes the largest */
    }
    if (w < 1 || w > 1000000)
        return bad(f, ofile, "partition_count is not a positive rank count");
    st->world = (long)w;
    bool *seen = calloc((size_t)w, 1);
    if (!seen)
        return oom(f);
    for (size_t i = 0; i < st->noptim; i++)
        if (st->optim[i].rank >= 0 && st->optim[i].rank < w)
            seen[st->optim[i].rank] = true;
    long missing = -1;
    for (long r = 0; r < w && missing < 0; r++)
        if (!seen[r])
            missing = r;
    free(seen);
    if (missing >= 0 || (size_t)w != st->noptim) {
        /* the missing file's name: rank 0's with its rank replaced */
        char name[600] = "";
        const char *n0 = st->optim[0].name, *p = strstr(n0, "zero_pp_rank_");
        if (missing >= 0 && p) {
            const char *q = p + 13;
            while (isdigit((unsigned char)*q))
                q++;
            snprintf(name, sizeof name, "%.*szero_pp_rank_%ld%s", (int)(p - n0), n0, missing, q);
        }
        if (name[0])
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: partition_count says %lld ranks but "
                            "'%s%s%s' is missing (%zu optim files)", where, (long long)w,
                            st->tag, st->tag[0] ? "/" : "", name, st->noptim);
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: partition_count says %lld ranks but there "
                        "are %zu optim files", where, (long long)w, st->noptim);
    }
    /* a file per rank, in rank order */
    for (size_t i = 0; i < st->noptim; i++)
        if (st->optim[i].rank != (long)i)
            return bad(f, st->optim[i].src->path, "rank files are not one per rank 0..%lld",
                       (long long)w - 1);
    return CKPT_OK;
}

static int ds_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    ds_state *st = ckpt_arena_alloc(&f->arena, sizeof(*st));
    if (!st)
        return oom(f);
    memset(st, 0, sizeof(*st));
    src->fmt_data = st; /* f->main: the folder */
    char tag[512];
    bool present;
    int rc = read_latest(f->dir_fd, tag, sizeof tag, &present);
    if (rc == CKPT_ERR_FORMAT)
        return ckpt_err(&f->err, rc, "latest: not a tag (%zu bytes or more)", sizeof tag - 1);
    if (rc == CKPT_ERR_UNSUPPORTED)
        return ckpt_err(&f->err, rc, "'latest' is not a regular file");
    if (rc)
        return ckpt_err(&f->err, rc, "cannot read 'latest': %s", strerror(errno));
    if (present)
        CKPT_FORWARD(check_tag(f, tag));
    else
        tag[0] = '\0';
    if (!(st->tag = ckpt_arena_strndup(&f->arena, tag, strlen(tag))))
        return oom(f);
    const char *where = tag[0] ? st->tag : ".";
    rc = list_files(f, st, where);
    /* every optim file, then the model files (their kind depends on the stage) */
    for (size_t i = 0; rc == CKPT_OK && i < st->noptim; i++)
        rc = load_file(f, st, &st->optim[i], false);
    if (rc == CKPT_OK)
        rc = check_ranks(f, st, where);
    const ckpt_value *osd0 = rc ? NULL : get(st->optim[0].root, "optimizer_state_dict");
    if (rc == CKPT_OK) {
        const ckpt_value *zs = get(osd0, "zero_stage");
        if (!zs) {
            /* BF16_Optimizer (bf16 with ZeRO-1) records no stage */
            st->bf16_optimizer = true;
            st->stage = 1;
            if (!get(osd0, "single_partition_of_fp32_groups"))
                rc = bad(f, st->optim[0].src->path, "no zero_stage and no fp32 partitions: not "
                         "a ZeRO optim file");
        } else if ((st->stage = zero_stage_of(zs)) < 1) {
            rc = bad(f, st->optim[0].src->path, "zero_stage is not ZeRO stage 1, 2 or 3");
        }
    }
    for (size_t i = 1; rc == CKPT_OK && i < st->noptim; i++) {
        const ckpt_value *zs = get(get(st->optim[i].root, "optimizer_state_dict"), "zero_stage");
        if ((zs ? zero_stage_of(zs) : 1) != st->stage || (!zs) != st->bf16_optimizer)
            rc = bad(f, st->optim[i].src->path, "its ZeRO stage differs from rank 0's");
    }
    /* model files: stage 3 one per rank (zero_pp_rank_R_...), else mp_rank_00 */
    if (rc == CKPT_OK) {
        size_t keep = 0;
        for (size_t i = 0; i < st->nmodel; i++)
            if ((st->stage == 3) == (st->model[i].rank >= 0))
                st->model[keep++] = st->model[i];
        st->nmodel = keep;
        if (!keep)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: no %s file", where,
                          st->stage == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt"
                                         : "mp_rank_00_model_states.pt");
        if (rc == CKPT_OK && st->stage == 3) {
            for (size_t i = 0; i < keep && rc == CKPT_OK; i++)
                if (st->model[i].rank != (long)i)
                    rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: the model-states file of rank "
                                  "%zu is missing", where, i);
            if (rc == CKPT_OK && keep != (size_t)st->world)
                rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "%s: %zu model-states files for %ld "
                              "ranks", where, keep, st->world);
        }
        if (rc == CKPT_OK && st->stage < 3 && keep > 1)
            rc = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "%s: %zu mp_rank model-states files: "
                          "tensor parallelism is not supported", where, keep);
    }
    for (size_t i = 0; rc == CKPT_OK && i < st->nmodel; i++)
        rc = load_file(f, st, &st->model[i], i == 0);
    CKPT_FORWARD(rc);

    const ckpt_value *m0 = st->model[0].root;
    const char *mfile = st->model[0].src->path;
    const ckpt_value *bufs = get(m0, "buffer_names"), *shapes = get(m0, "param_shapes");
    const ckpt_value *shared = get(m0, "shared_params");
    st->module = (ckpt_value *)get(m0, "module");
    if (!is_seq(bufs))
        return bad(f, mfile, "no buffer_names list: not a model-states file");
    if (!is_seq(shapes))
        return bad(f, mfile, "no param_shapes list");
    if (!st->module || st->module->kind != CKPT_KIND_DICT)
        return bad(f, mfile, "no module dict");
    if (shared && shared->kind != CKPT_KIND_DICT && shared->kind != CKPT_KIND_NONE)
        return bad(f, mfile, "shared_params is not a dict");

    ds_out o = {.f = f, .st = st};
    if (!(o.sd = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0)))
        return oom(f);
    o.sd->flags |= CKPT_VF_ORDERED;
    /* buffers: module's entries named in buffer_names, in module order */
    size_t nbuf = 0, nfrozen = 0, ntrain, nalias = 0;
    bool low = false;
    for (size_t i = 0; rc == CKPT_OK && i < st->module->u.dict.keys.len; i++) {
        const char *name = key_str(st->module->u.dict.keys.items[i]);
        if (name && in_str_list(bufs, name)) {
            rc = add_from_record(&o, mfile, name, st->module->u.dict.vals.items[i]);
            nbuf++;
        }
    }
    if (rc == CKPT_OK)
        rc = frozen(&o, m0, shapes, mfile, &nfrozen, &low);
    size_t before = o.sd->u.dict.keys.len;
    if (rc == CKPT_OK)
        rc = st->stage == 3 ? trainable_3(&o, shapes, mfile) : trainable_12(&o, shapes, mfile);
    ntrain = o.sd->u.dict.keys.len - before;
    /* tied parameters: the alias names its target's tensor */
    for (size_t i = 0; rc == CKPT_OK && shared && shared->kind == CKPT_KIND_DICT &&
                       i < shared->u.dict.keys.len; i++) {
        const char *alias = key_str(shared->u.dict.keys.items[i]);
        const ckpt_value *target = shared->u.dict.vals.items[i];
        if (!alias || target->kind != CKPT_KIND_STR) {
            rc = bad(f, mfile, "shared_params entry %zu is not a pair of names", i);
            break;
        }
        const ckpt_value *t = ckpt_value_dict_get(o.sd, target->u.s.s);
        if (!t)
            continue; /* zero_to_fp32 skips an alias of a name it has not made */
        const ckpt_tensor *tt = t->u.tensor;
        rc = add_tensor(&o, alias, tt->storage, tt->ndim, tt->shape, tt->stride, tt->offset);
        nalias++;
    }
    free(o.from);
    free(o.to);
    CKPT_FORWARD(rc);
    if (ckpt_dict_dedupe(&f->arena, o.sd))
        return oom(f);

    /* where ckpt and zero_to_fp32 part ways */
    if (st->bf16_optimizer &&
        ckpt_file_notice_add(f, "a BF16_Optimizer checkpoint (bf16 with ZeRO stage 1, no "
                                "zero_stage recorded): zero_to_fp32 refuses it ('not a zero "
                                "checkpoint'); ckpt reads it as stage 1") < 0)
        return oom(f);
    if (st->stage == 1 && nfrozen &&
        ckpt_file_notice_add(f, "%zu frozen parameter%s: ZeRO stage 1 does not record them and "
                                "zero_to_fp32 drops them; ckpt takes them from %s's module%s",
                             nfrozen, nfrozen == 1 ? "" : "s", mfile,
                             low ? " (upcast to float32)" : "") < 0)
        return oom(f);
    if (st->stage > 1 && low &&
        ckpt_file_notice_add(f, "frozen parameters are stored in 16 bits: zero_to_fp32 leaves "
                                "them so, ckpt gives them as float32 like every other tensor") < 0)
        return oom(f);
    CKPT_FORWARD(layout(f, st, nbuf, nfrozen, ntrain, nalias));
    st->done = true;
    *root = o.sd;
    return CKPT_OK;
}

/* ds_ops.state_free: ST's arrays (ST itself is in the handle's arena). */
static void ds_state_free(void *fmt_data)
{
    ds_state *st = fmt_data;
    free(st->model);
    free(st->optim);
    free(st->mstor);
    free(st->records);
}

static const ckpt_format_ops ds_ops = {
    .state_free = ds_state_free,
    .select_extra = ds_select_extra,
    .check_records = ds_check_records,
    .layout = ds_layout,
    .sd_source = "deepspeed",
};

const ckpt_format_desc ckpt_format_deepspeed = {
    .id = CKPT_FORMAT_DEEPSPEED,
    .name = "deepspeed",
    .claim_dir = ds_claim_dir,
    .read = ds_read,
    .ops = &ds_ops,
};
