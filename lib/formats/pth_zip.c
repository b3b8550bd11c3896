/* pth_zip.c - torch.save's zip layout (torch >= 1.6), read the way
 * torch reads it (reference/pth-format.md section 1). */
#include "formats/format.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SUPPORTED_VERSION 10

static int64_t find_record(ckpt_file *f, const char *name)
{
    char full[1024];
    if ((size_t)snprintf(full, sizeof(full), "%s/%s", f->cur_prefix, name) >= sizeof(full))
        return -1;
    return ckpt_zip_find(f->cur_src->zip, full);
}

static int read_small(ckpt_file *f, int64_t i, char *buf, size_t cap)
{
    uint64_t size = ckpt_zip_size(f->cur_src->zip, i);
    if (size >= cap)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "record '%s' is %llu bytes, expected a few",
                        ckpt_zip_name(f->cur_src->zip, i), (unsigned long long)size);
    CKPT_FORWARD(ckpt_zip_read(f->cur_src->zip, i, 0, buf, (size_t)size, &f->err));
    buf[size] = '\0';
    return CKPT_OK;
}

static int check_version(ckpt_file *f)
{
    int64_t i = find_record(f, ".data/version");
    if (i < 0)
        i = find_record(f, "version");
    CKPT_RETURN_IF(i < 0, &f->err, CKPT_ERR_FORMAT, "no '%s/version' record", f->cur_prefix);
    char buf[64];
    CKPT_FORWARD(read_small(f, i, buf, sizeof(buf)));
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    while (*end == '\n' || *end == '\r' || *end == ' ')
        end++;
    CKPT_RETURN_IF(end == buf || *end != '\0', &f->err, CKPT_ERR_FORMAT,
                   "record 'version' does not hold a number");
    CKPT_RETURN_IF(v < 1 || v > MAX_SUPPORTED_VERSION, &f->err, CKPT_ERR_UNSUPPORTED,
                   "file format version %llu (this reader knows 1 to %d)", v,
                   MAX_SUPPORTED_VERSION);
    return CKPT_OK;
}

static int check_byteorder(ckpt_file *f)
{
    int64_t i = find_record(f, "byteorder");
    if (i < 0)
        return CKPT_OK; /* absent means little-endian */
    char buf[16];
    CKPT_FORWARD(read_small(f, i, buf, sizeof(buf)));
    if (strcmp(buf, "little") == 0)
        return CKPT_OK;
    CKPT_RETURN_IF(strcmp(buf, "big") == 0, &f->err, CKPT_ERR_UNSUPPORTED,
                   "big-endian checkpoints are not supported");
    return ckpt_err(&f->err, CKPT_ERR_FORMAT, "unknown byte order '%s'", buf);
}

/* Every storage the pickle added to the table (from FIRST on) must have its
 * record, of its exact size. */
static int locate_storages(ckpt_file *f, size_t first)
{
    for (size_t k = first; k < f->nstorages; k++) {
        ckpt_storage *s = f->storages[k];
        char name[600];
        if ((size_t)snprintf(name, sizeof(name), "data/%s", s->src_key) >= sizeof(name))
            return ckpt_err(&f->err, CKPT_ERR_FORMAT, "storage key too long");
        int64_t i = find_record(f, name);
        CKPT_RETURN_IF(i < 0, &f->err, CKPT_ERR_FORMAT, "storage '%s' has no record '%s/%s'",
                       s->key, f->cur_prefix, name);
        uint64_t size = ckpt_zip_size(f->cur_src->zip, i);
        CKPT_RETURN_IF(size != s->nbytes, &f->err, CKPT_ERR_FORMAT,
                       "record '%s/%s' is %llu bytes but storage '%s' (%lld x %s) needs %llu",
                       f->cur_prefix, name, (unsigned long long)size, s->key, (long long)s->numel,
                       ckpt_dtype_name(s->dtype), (unsigned long long)s->nbytes);
        s->loc = CKPT_LOC_ZIP_RECORD;
        s->zip_index = i;
        s->has_crc = true;
        s->crc32 = ckpt_zip_crc(f->cur_src->zip, i);
    }
    return CKPT_OK;
}

static int pth_zip_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    (void)src; /* f->cur_src */
    CKPT_FORWARD(ckpt_zip_open(f->cur_src->path, &f->cur_src->zip, &f->err));
    int64_t n = ckpt_zip_count(f->cur_src->zip);
    CKPT_RETURN_IF(n <= 0, &f->err, CKPT_ERR_FORMAT, "zip archive has no records");

    /* prefix = the first entry's folder, as torch finds it */
    const char *first = ckpt_zip_name(f->cur_src->zip, 0);
    const char *slash = strchr(first, '/');
    CKPT_RETURN_IF(!slash || slash == first, &f->err, CKPT_ERR_FORMAT,
                   "file in archive is not in a subdirectory: %s", first);
    f->cur_prefix = ckpt_arena_strndup(&f->arena, first, (size_t)(slash - first));
    const char **records = ckpt_arena_alloc(&f->arena, (size_t)n * sizeof(char *));
    if (!f->cur_prefix || !records)
        return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
    size_t plen = (size_t)(slash - first);
    for (int64_t i = 0; i < n; i++) {
        const char *name = ckpt_zip_name(f->cur_src->zip, i);
        CKPT_RETURN_IF(strncmp(name, first, plen + 1) != 0, &f->err, CKPT_ERR_FORMAT,
                       "file in archive is not in a subdirectory %s/: %s", f->cur_prefix, name);
        records[i] = name;
    }
    if (f->cur_src == &f->main) { /* what inspect lists */
        f->prefix = f->cur_prefix;
        f->records = records;
        f->nrecords = (size_t)n;
    }

    CKPT_RETURN_IF(find_record(f, "constants.pkl") >= 0, &f->err, CKPT_ERR_UNSUPPORTED,
                   "a TorchScript archive (torch.jit.save), not a torch.save checkpoint");
    CKPT_FORWARD(check_version(f));
    CKPT_FORWARD(check_byteorder(f));

    int64_t pkl = find_record(f, "data.pkl");
    CKPT_RETURN_IF(pkl < 0, &f->err, CKPT_ERR_FORMAT, "no '%s/data.pkl' record", f->cur_prefix);
    uint8_t *buf;
    size_t len;
    CKPT_FORWARD(ckpt_zip_read_all(f->cur_src->zip, pkl, f->limits[CKPT_LIMIT_PICKLE_BYTES], &buf, &len,
                                   &f->err));
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, ckpt_zip_name(f->cur_src->zip, pkl));
    size_t nbefore = f->nstorages;
    int rc = ckpt_pickle_load(&ctx, buf, len, root, NULL, &f->err);
    free(buf);
    CKPT_FORWARD(rc);
    return locate_storages(f, nbefore);
}

static bool pth_zip_sniff(const uint8_t *head, size_t n)
{
    return n >= 4 && memcmp(head, "PK\x03\x04", 4) == 0;
}

const ckpt_format_desc ckpt_format_pth_zip = {
    .id = CKPT_FORMAT_PTH_ZIP,
    .name = "pth-zip",
    .sniff = pth_zip_sniff,
    .read = pth_zip_read,
    .write = ckpt_pth_zip_write,
};
