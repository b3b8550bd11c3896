/*
 * safetensors_write.c - write one state dict as safetensors: the
 * 8-byte header length, the JSON header (padded with spaces to a multiple
 * of 8, __metadata__ {"format": "pt"}), then each tensor's elements packed
 * in C order.  Views are gathered, casts applied, tied tensors written once
 * (the other names go to __metadata__ "ckpt.tied").
 */
#include "formats/format.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct st_entry {
    const char *name;
    const ckpt_tensor *t;
    uint64_t begin, end;
    long alias_of; /* index of the entry holding the bytes, or -1 */
} st_entry;

static bool is_scalar(const ckpt_value *v)
{
    return v->kind == CKPT_KIND_INT || v->kind == CKPT_KIND_FLOAT || v->kind == CKPT_KIND_STR ||
           v->kind == CKPT_KIND_BOOL;
}

static cJSON *json_u64(uint64_t v)
{
    char b[32];
    snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(b);
}

/* The bytes of T in C order and its output dtype: a slice of its storage
 * when it is contiguous, else gathered.  *OWN is what to free. */
static int tensor_out_bytes(ckpt_file *f, const ckpt_tensor *t, const uint8_t **bytes, uint8_t **own,
                            uint8_t **own2)
{
    *own = *own2 = NULL;
    uint8_t *all;
    CKPT_FORWARD(ckpt_storage_load(f, t->storage, &all));
    *own = all;
    ckpt_tensor view = *t;
    view.dtype = t->storage->dtype; /* after a cast, the storage's new type */
    size_t es = ckpt_dtype_size(view.dtype);
    if (ckpt_tensor_is_contiguous(&view)) {
        *bytes = all + (view.numel ? (size_t)view.offset * es : 0);
        return CKPT_OK;
    }
    size_t n = (size_t)view.numel * es;
    uint8_t *g = malloc(n ? n : 1);
    if (!g)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    *own2 = g;
    ckpt_tensor_gather(&view, all, g);
    *bytes = g;
    return CKPT_OK;
}

typedef struct crc_job {
    int fd;
    uint64_t off, len;
    uint32_t crc;
    int rc;
} crc_job;

static void *crc_main(void *arg)
{
    crc_job *j = arg;
    ckpt_error e = {0};
    j->rc = ckpt_crc_range(j->fd, j->off, j->len, &j->crc, &e);
    return NULL;
}

/* A whole, uncast, uncompressed storage goes straight from file to file. */
static int copy_whole(ckpt_file *f, const ckpt_tensor *t, int out, uint64_t at, bool *done)
{
    const ckpt_storage *s = t->storage;
    *done = false;
    int in_fd;
    uint64_t in_off;
    if (t->offset != 0 || !ckpt_tensor_is_contiguous(t) || ckpt_tensor_nbytes(t) != s->nbytes ||
        s->nbytes == 0)
        return CKPT_OK;
    int r = ckpt_storage_raw_range(f, s, &in_fd, &in_off);
    if (r == CKPT_ERR_UNSUPPORTED)
        return CKPT_OK; /* cast or deflated: the buffered path decodes it */
    CKPT_FORWARD(r);
    if (s->has_crc) {
        /* the input's CRC, checked on the other core while the kernel copies */
        crc_job job = {.fd = in_fd, .off = in_off, .len = s->nbytes};
        pthread_t th;
        bool threaded = pthread_create(&th, NULL, crc_main, &job) == 0;
        int rc = ckpt_copy_range(in_fd, in_off, out, at, s->nbytes, &f->err);
        if (threaded)
            pthread_join(th, NULL);
        else
            crc_main(&job);
        CKPT_FORWARD(rc);
        if (job.rc)
            return ckpt_err(&f->err, job.rc, "cannot read storage '%s' of the input", s->key);
        if (job.crc != s->crc32)
            return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                            "record for storage '%s': CRC-32 mismatch (stored %08x, data %08x): "
                            "the input is corrupt", s->key, s->crc32, job.crc);
    } else {
        CKPT_FORWARD(ckpt_copy_range(in_fd, in_off, out, at, s->nbytes, &f->err));
    }
    /* start writing back now, so that the final fsync has little left */
    if (s->nbytes >= (1u << 20))
        sync_file_range(out, (off64_t)at, (off64_t)s->nbytes, SYNC_FILE_RANGE_WRITE);
    *done = true;
    return CKPT_OK;
}

int ckpt_safetensors_write(ckpt_file *f, int out, const char *path,
                           const ckpt_write_options *opt)
{
    (void)path; /* the format does not name itself */
    const ckpt_value *sd = NULL;
    CKPT_FORWARD(ckpt_pick_state_dict(f, opt ? opt->select : NULL, &sd));
    size_t n = sd->u.dict.keys.len;
    char bad[300] = "";
    size_t nbad = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_value *k = sd->u.dict.keys.items[i], *v = sd->u.dict.vals.items[i];
        if (k->kind == CKPT_KIND_STR && strcmp(k->u.s.s, "__metadata__") == 0)
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "a tensor named '__metadata__' cannot be written to safetensors, "
                            "where that name is the header's metadata; rename it first");
        if (k->kind != CKPT_KIND_STR || v->kind != CKPT_KIND_TENSOR) {
            if (nbad++ < 5)
                snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad), "%s'%s'", nbad > 1 ? ", " : "",
                         k->kind == CKPT_KIND_STR ? k->u.s.s : "(a non-string key)");
        }
    }
    if (nbad)
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                        "safetensors holds tensors only: %zu entr%s of the mapping %s not (%s%s)",
                        nbad, nbad == 1 ? "y" : "ies", nbad == 1 ? "is" : "are", bad,
                        nbad > 5 ? ", ..." : "");
    bool dedupe = !(opt && (opt->flags & CKPT_WRITE_NO_DEDUPE));
    st_entry *e = calloc(n ? n : 1, sizeof(*e));
    const ckpt_tensor **views = calloc(n ? n : 1, sizeof(*views));
    long *first = calloc(n ? n : 1, sizeof(*first));
    int trc = e && views && first ? CKPT_OK : ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && trc == CKPT_OK; i++) {
        views[i] = sd->u.dict.vals.items[i]->u.tensor;
        first[i] = -1;
    }
    if (trc == CKPT_OK && dedupe)
        trc = ckpt_tensors_tied(f, views, n, first);
    for (size_t i = 0; i < n && trc == CKPT_OK; i++)
        e[i].alias_of = first[i];
    free(views);
    free(first);
    if (trc != CKPT_OK) {
        free(e);
        return trc;
    }
    cJSON *hdr = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(hdr, "__metadata__"),
          *tied = cJSON_CreateObject();
    cJSON_AddStringToObject(md, "format", "pt");
    /* what a training checkpoint keeps beside the state dict, as text */
    const ckpt_value *top = f->file_root ? f->file_root : f->root;
    if (sd != top && top->kind == CKPT_KIND_DICT)
        for (size_t i = 0; i < top->u.dict.keys.len; i++) {
            const ckpt_value *k = top->u.dict.keys.items[i], *v = top->u.dict.vals.items[i];
            char text[64];
            if (k->kind != CKPT_KIND_STR || !is_scalar(v) || strcmp(k->u.s.s, "format") == 0)
                continue;
            if (v->kind == CKPT_KIND_STR) {
                cJSON_AddStringToObject(md, k->u.s.s, v->u.s.s);
                continue;
            }
            if (v->kind == CKPT_KIND_INT && v->u.i.big)
                continue;
            if (v->kind == CKPT_KIND_INT)
                snprintf(text, sizeof(text), "%lld", (long long)v->u.i.v);
            else if (v->kind == CKPT_KIND_FLOAT)
                snprintf(text, sizeof(text), "%.17g", v->u.f);
            else
                snprintf(text, sizeof(text), "%s", v->u.b ? "True" : "False");
            cJSON_AddStringToObject(md, k->u.s.s, text);
        }
    if (f->st_metadata) /* a safetensors input's own metadata carries over */
        for (size_t i = 0; i < f->st_metadata->u.dict.keys.len; i++) {
            const char *k = f->st_metadata->u.dict.keys.items[i]->u.s.s;
            if (strcmp(k, "format") && strcmp(k, "ckpt.tied") && !cJSON_GetObjectItem(md, k))
                cJSON_AddStringToObject(md, k, f->st_metadata->u.dict.vals.items[i]->u.s.s);
        }
    uint64_t at = 0;
    size_t ntied = 0;
    for (size_t i = 0; i < n; i++) {
        e[i].name = sd->u.dict.keys.items[i]->u.s.s;
        e[i].t = sd->u.dict.vals.items[i]->u.tensor;
        if (e[i].alias_of >= 0) {
            cJSON_AddStringToObject(tied, e[i].name, e[e[i].alias_of].name);
            ntied++;
            continue;
        }
        const ckpt_tensor *t = e[i].t;
        ckpt_dtype dt = t->storage->dtype;
        const char *name = ckpt_safetensors_dtype_name(dt);
        if (!name) {
            int r = ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED, "safetensors has no dtype for %s ('%s')",
                             ckpt_dtype_name(dt), e[i].name);
            cJSON_Delete(hdr);
            cJSON_Delete(tied);
            free(e);
            return r;
        }
        uint64_t nb = (uint64_t)t->numel * ckpt_dtype_size(dt);
        e[i].begin = at;
        e[i].end = at + nb;
        at += nb;
        cJSON *je = cJSON_AddObjectToObject(hdr, e[i].name);
        cJSON_AddStringToObject(je, "dtype", name);
        cJSON *sh = cJSON_AddArrayToObject(je, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(sh, json_u64((uint64_t)t->shape[d]));
        cJSON *off = cJSON_AddArrayToObject(je, "data_offsets");
        cJSON_AddItemToArray(off, json_u64(e[i].begin));
        cJSON_AddItemToArray(off, json_u64(e[i].end));
    }
    if (ntied) {
        char *t = cJSON_PrintUnformatted(tied);
        if (t)
            cJSON_AddStringToObject(md, "ckpt.tied", t);
        free(t);
    }
    cJSON_Delete(tied);
    char *text = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    if (!text) {
        free(e);
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    }
    size_t hn = strlen(text), padded = (hn + 7) & ~(size_t)7; /* data starts 8-aligned */
    uint8_t *head = malloc(8 + padded);
    int rc = head ? CKPT_OK : ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    if (rc == CKPT_OK) {
        for (int i = 0; i < 8; i++)
            head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        memcpy(head + 8, text, hn);
        memset(head + 8 + hn, ' ', padded - hn);
        rc = ckpt_write_all(out, head, 8 + padded, 0, &f->err);
    }
    free(head);
    free(text);
    uint64_t base = 8 + padded;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        if (e[i].alias_of >= 0 || e[i].end == e[i].begin)
            continue;
        bool done;
        rc = copy_whole(f, e[i].t, out, base + e[i].begin, &done);
        if (rc || done)
            continue;
        const ckpt_tensor *t = e[i].t;
        if (t->offset == 0 && ckpt_tensor_is_contiguous(t) &&
            (uint64_t)t->numel * ckpt_dtype_size(t->storage->dtype) == t->storage->nbytes) {
            /* the whole storage, cast or inflated on the way: bounded memory */
            ckpt_fd_sink sk = {.fd = out, .at = base + e[i].begin, .err = &f->err};
            rc = ckpt_storage_stream(f, t->storage, ckpt_fd_sink_write, &sk);
            continue;
        }
        const uint8_t *bytes = NULL;
        uint8_t *own, *own2;
        rc = tensor_out_bytes(f, e[i].t, &bytes, &own, &own2);
        if (rc == CKPT_OK)
            rc = ckpt_write_all(out, bytes, (size_t)(e[i].end - e[i].begin), base + e[i].begin,
                                &f->err);
        free(own);
        free(own2);
    }
    free(e);
    return rc;
}
