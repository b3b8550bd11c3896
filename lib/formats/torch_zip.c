/*
 * torch_zip.c - torch's zip reader (caffe2's PyTorchStreamReader) as
 * torch.load and torch.jit.load both open an archive, then torch.load's own
 * records: the walk of pth-zip, and the reading of torchscript, which shares
 * the reader (a format helper: both zip formats use it, it uses neither).
 *
 * PyTorchStreamReader: the archive's folder is its first name up to the
 * first '/'; the version record (.data/version first), parsed by stoull,
 * must be 1 to 10; every name must lie in the folder.  torch.load then hands
 * an archive with constants.pkl to torch.jit.load, reads byteorder (torch
 * 2.x: "little" or "big"), and unpickles data.pkl, whose persistent ids
 * name the records data/KEY.  Every record torch reads is extracted by
 * miniz, which refuses one whose local header lacks its signature ("invalid
 * header or archive is corrupted"): torch 2.15 reads version and
 * .data/serialization_id (opening), .format_version, byteorder,
 * .storage_alignment, data.pkl; torch 1.13 version and data.pkl.
 */
#include "formats/format.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ZIP_VERSION 10 /* torch's kMaxSupportedFileFormatVersion */
#define SMALL_RECORD 64    /* version and byteorder are read whole up to this */

/* torch stops: EXC and TORCH_MSG in W->stop; the reader's CODE and message
 * (CKPT_FMT, or torch's text when NULL) in ERR. */
static int refuse(ckpt_walk *w, ckpt_error *err, int code, const char *exc, const char *torch_msg,
                  const char *ckpt_fmt, ...) __attribute__((format(printf, 6, 7)));
static int refuse(ckpt_walk *w, ckpt_error *err, int code, const char *exc, const char *torch_msg,
                  const char *ckpt_fmt, ...)
{
    w->stop.exception = exc;
    snprintf(w->stop.message, sizeof w->stop.message, "%s", torch_msg);
    if (!ckpt_fmt)
        return ckpt_err(err, code, "%s", torch_msg);
    char msg[CKPT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, ckpt_fmt);
    vsnprintf(msg, sizeof msg, ckpt_fmt, ap);
    va_end(ap);
    return ckpt_err(err, code, "%s", msg);
}

/* torch 2.15 adds this to every miniz error */
static const char MINIZ_2_15[] = ". This is an internal miniz error. If you are seeing this error, "
    "there is a high likelihood that your checkpoint file is corrupted. This can happen if the "
    "checkpoint was not saved properly, was transferred incorrectly, or the file was modified "
    "after saving.";

/* Record I (SHORT: its name in the folder), as miniz extracts it for torch:
 * its local header must start with the signature. */
static int check_local(ckpt_walk *w, int64_t i, const char *short_name, ckpt_error *err)
{
    if (ckpt_zip_local_ok(w->zip, i))
        return CKPT_OK;
    char msg[600];
    snprintf(msg, sizeof msg, "PytorchStreamReader failed reading file %s: invalid header or "
             "archive is corrupted%s", short_name,
             w->torch == CKPT_WALK_TORCH_2 ? MINIZ_2_15 : "");
    return refuse(w, err, CKPT_ERR_FORMAT, "RuntimeError", msg, "record '%s' has no local "
                  "header where the central directory says (torch refuses to read it: invalid "
                  "header or archive is corrupted)", ckpt_zip_name(w->zip, i));
}

/* Record NAME of the folder, when there, checked as torch 2.15 reads it. */
static int check_local_named(ckpt_walk *w, const char *name, ckpt_error *err)
{
    int64_t i = ckpt_walk_zip_find(w, name, NULL);
    return i < 0 ? CKPT_OK : check_local(w, i, name, err);
}

bool ckpt_walk_zip_local_ok(const ckpt_walk *w, int64_t i)
{
    return w->zip && i >= 0 && i < ckpt_zip_count(w->zip) && ckpt_zip_local_ok(w->zip, i);
}

bool ckpt_torch_zip_is_constants(const char *name, size_t prefix_len)
{
    /* get_all_records: miniz copies each name into 512 bytes (cut at 511),
     * Python compares what follows the folder exactly, case included */
    size_t n = strnlen(name, 511);
    return n == prefix_len + 14 && memcmp(name + prefix_len, "/constants.pkl", 14) == 0;
}

int64_t ckpt_walk_zip_find(const ckpt_walk *w, const char *name, uint64_t *size)
{
    if (!w->zip || !w->prefix)
        return -1;
    size_t n = w->prefix_len + strlen(name) + 2;
    char *full = malloc(n);
    if (!full)
        return -1;
    snprintf(full, n, "%.*s/%s", (int)w->prefix_len, w->prefix, name);
    int64_t i = ckpt_zip_find(w->zip, full);
    free(full);
    if (i >= 0 && size)
        *size = ckpt_zip_size(w->zip, i);
    return i;
}

/* Small record I as text into BUF (SMALL_RECORD + 1 bytes), NUL-terminated,
 * as torch reads it whole.  A strict walk refuses one of SMALL_RECORD bytes
 * or more, and one that cannot be read; else *OK says whether it was read. */
static int small_record(ckpt_walk *w, int64_t i, char *buf, bool *ok, ckpt_error *err)
{
    uint64_t size = ckpt_zip_size(w->zip, i);
    CKPT_RETURN_IF(w->strict && size >= SMALL_RECORD, err, CKPT_ERR_FORMAT,
                   "record '%s' is %llu bytes, expected a few", ckpt_zip_name(w->zip, i),
                   (unsigned long long)size);
    uint8_t *data;
    size_t len;
    ckpt_error e = {0};
    *ok = ckpt_zip_read_all(w->zip, i, SMALL_RECORD, &data, &len, &e) == CKPT_OK;
    if (!*ok) {
        if (w->strict) {
            *err = e;
            return e.code;
        }
        buf[0] = '\0';
        return CKPT_OK;
    }
    memcpy(buf, data, len);
    buf[len] = '\0';
    free(data);
    return CKPT_OK;
}

/* The version record: torch's stoull, 1 to 10; a strict walk wants a bare
 * number (WHAT names the archive in its message). */
static int check_version(ckpt_walk *w, const char *what, ckpt_error *err)
{
    int64_t i = ckpt_walk_zip_find(w, ".data/version", NULL);
    if (i < 0)
        i = ckpt_walk_zip_find(w, "version", NULL);
    if (i < 0)
        return refuse(w, err, CKPT_ERR_FORMAT, "RuntimeError",
                      "Expected hasRecord(\"version\") to be true", "no '%.*s/version' record",
                      (int)w->prefix_len, w->prefix);
    CKPT_FORWARD(check_local(w, i, ckpt_zip_name(w->zip, i) + w->prefix_len + 1, err));
    char buf[SMALL_RECORD + 1];
    bool read;
    CKPT_FORWARD(small_record(w, i, buf, &read, err));
    char *end;
    if (w->strict) {
        unsigned long long v = strtoull(buf, &end, 10);
        while (*end == '\n' || *end == '\r' || *end == ' ')
            end++;
        CKPT_RETURN_IF(end == buf || *end != '\0', err, CKPT_ERR_FORMAT,
                       "record 'version' does not hold a number");
        CKPT_RETURN_IF(v < 1 || v > MAX_ZIP_VERSION, err, CKPT_ERR_UNSUPPORTED,
                       "%s version %llu (this reader knows 1 to %d)", what, v, MAX_ZIP_VERSION);
    }
    unsigned long long version = read ? strtoull(buf, &end, 10) : 0;
    bool parsed = read && end != buf && !strchr(buf, '-');
    if (parsed && version >= 1 && version <= MAX_ZIP_VERSION)
        return CKPT_OK;
    char msg[200];
    snprintf(msg, sizeof msg, "Attempted to read a PyTorch file with version %llu, but the %s "
             "supported version for reading is %d", version, version < 1 ? "minimum" : "maximum",
             version < 1 ? 1 : MAX_ZIP_VERSION);
    return refuse(w, err, CKPT_ERR_UNSUPPORTED, "RuntimeError", msg, NULL);
}

/* byteorder, which torch 2.x reads: "big" sets SRC->big_endian; anything but
 * "little" or "big" fails there. */
static int check_byteorder(ckpt_walk *w, ckpt_source *src, ckpt_error *err)
{
    if (w->torch != CKPT_WALK_TORCH_2)
        return CKPT_OK; /* torch 1.13 never read it */
    int64_t i = ckpt_walk_zip_find(w, "byteorder", NULL);
    if (i < 0)
        return CKPT_OK; /* absent means little-endian */
    CKPT_FORWARD(check_local(w, i, "byteorder", err));
    char buf[SMALL_RECORD + 1];
    bool read;
    CKPT_FORWARD(small_record(w, i, buf, &read, err));
    if (!read || strcmp(buf, "little") == 0)
        return CKPT_OK;
    if (strcmp(buf, "big") == 0) {
        src->big_endian = true;
        return CKPT_OK;
    }
    char msg[SMALL_RECORD + 32], shown[SMALL_RECORD + 1];
    snprintf(msg, sizeof msg, "Unknown endianness type: %s", buf);
    snprintf(shown, sizeof shown, "%s", buf);
    for (char *c = shown; *c; c++)
        if (*c < 0x20 || *c >= 0x7f)
            *c = '?';
    return refuse(w, err, CKPT_ERR_FORMAT, "ValueError", msg,
                  "unknown byte order '%s' (torch.load fails on it: 'little' or 'big')", shown);
}

int ckpt_torch_zip_walk(ckpt_walk *w, ckpt_source *src, bool jit, ckpt_error *err)
{
    memset(&w->stop, 0, sizeof w->stop);
    w->stop.pickle = -1;
    w->zip = NULL;
    w->prefix = NULL;
    w->prefix_len = 0;
    if (!src->zip) /* else the one sniffing opened (ckpt_format_sniff_fd_keep) */
        CKPT_FORWARD(ckpt_zip_open(src->fd, &src->zip, err));
    w->zip = src->zip;
    int rc = CKPT_OK;
    int64_t n = ckpt_zip_count(w->zip);
    const char *first = n > 0 ? ckpt_zip_name(w->zip, 0) : NULL;
    const char *slash = first ? strchr(first, '/') : NULL;
    char msg[CKPT_ERRMSG_MAX];
    if (!first) {
        rc = refuse(w, err, CKPT_ERR_FORMAT, "RuntimeError", "PytorchStreamReader failed reading "
                    "zip archive: the archive has no records", "zip archive has no records");
        goto out;
    }
    if (!slash || (w->strict && slash == first)) { /* ckpt wants a folder with a name */
        snprintf(msg, sizeof msg, "file in archive is not in a subdirectory: %s", first);
        rc = refuse(w, err, CKPT_ERR_FORMAT, "RuntimeError", msg, NULL);
        if (slash)
            w->stop.exception = NULL;
        goto out;
    }
    w->prefix = first;
    w->prefix_len = (size_t)(slash - first);
    if ((rc = check_version(w, jit ? "TorchScript archive" : "file format", err)) != CKPT_OK)
        goto out;
    for (int64_t i = 0; i < n; i++) {
        const char *name = ckpt_zip_name(w->zip, i);
        if (!name || strncmp(name, first, w->prefix_len + 1) != 0) {
            snprintf(msg, sizeof msg, "file in archive is not in a subdirectory %.*s/: %s",
                     (int)w->prefix_len, first, name ? name : "");
            rc = refuse(w, err, CKPT_ERR_FORMAT, "RuntimeError", msg, NULL);
            goto out;
        }
    }
    bool torch2 = w->strict || w->torch == CKPT_WALK_TORCH_2;
    if (torch2 && (rc = check_local_named(w, ".data/serialization_id", err)) != CKPT_OK)
        goto out; /* read when 2.15 opens the archive */
    bool constants = false;
    for (int64_t i = 0; i < n && !constants; i++)
        constants = ckpt_torch_zip_is_constants(ckpt_zip_name(w->zip, i), w->prefix_len);
    if (!jit && constants) {
        /* torch.load passes it to torch.jit.load */
        w->stop.torchscript = true;
        rc = ckpt_err(err, CKPT_ERR_UNSUPPORTED,
                      "a TorchScript archive (torch.jit.save), not a torch.save checkpoint");
        goto out;
    }
    if (torch2 && (rc = check_local_named(w, ".format_version", err)) != CKPT_OK)
        goto out;
    if ((rc = check_byteorder(w, src, err)) != CKPT_OK)
        goto out;
    if (torch2 && (rc = check_local_named(w, ".storage_alignment", err)) != CKPT_OK)
        goto out;
    int64_t pkl = ckpt_walk_zip_find(w, "data.pkl", NULL);
    if (pkl < 0) {
        rc = refuse(w, err, CKPT_ERR_FORMAT, "RuntimeError", "PytorchStreamReader failed locating "
                    "file data.pkl: file not found", "no '%.*s/data.pkl' record",
                    (int)w->prefix_len, first);
        goto out;
    }
    if ((rc = check_local(w, pkl, "data.pkl", err)) != CKPT_OK) {
        w->stop.pickle = 0; /* read inside torch.load's _load */
        goto out;
    }
    uint8_t *buf;
    size_t len;
    rc = ckpt_zip_read_all(w->zip, pkl, w->pickle_limit ? w->pickle_limit : UINT64_MAX, &buf,
                           &len, err);
    if (rc != CKPT_OK)
        goto out;
    ckpt_walk_pickle p = {.index = 0, .name = ckpt_zip_name(w->zip, pkl), .offset = UINT64_MAX,
                          .buf = buf, .len = len, .pid_fields = 5};
    ckpt_error e = {0};
    if (ckpt_zip_data_offset(w->zip, pkl, &p.offset, &e) != CKPT_OK)
        p.offset = UINT64_MAX; /* deflated: not in the file as is */
    size_t used = 0;
    ckpt_value *root = NULL;
    rc = w->pickle(w, &p, &used, &root);
    free(buf);
out:
    if (!w->keep) {
        ckpt_zip_close(src->zip);
        src->zip = NULL;
        w->zip = NULL;
        w->prefix = NULL;
    }
    return rc;
}
