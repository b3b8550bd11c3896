/* scan.c - ckpt scan: every global a file's pickles name, and what uses it,
 * found by running the same safe VM that reads checkpoints in its scanning
 * mode (nothing imported, nothing called; STACK_GLOBAL operands resolved
 * through the memo exactly as when reading), so the answer cannot differ
 * from what a load would meet. */
#include "analysis/analysis.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

enum { SCAN_MAX_READINGS = 8 };

struct ckpt_scan {
    ckpt_error err;
    uint64_t limits[CKPT_LIMIT_COUNT_];
    ckpt_format format;
    int is_pickle;            /* a plain pickle file, not a checkpoint */
    char **pickles;           /* names of the pickles scanned */
    size_t npickles;
    ckpt_scan_hit *hits;
    size_t nhits, cap;
    int unsafe;               /* something neither interpreted nor known data */
    const char *cur;          /* pickle being scanned (an entry of pickles) */
    int oom;                  /* a hit could not be recorded */
    ckpt_arena *arena;        /* its VM's arena */
    ckpt_scan_reading readings[SCAN_MAX_READINGS];
    char *reading_errors[SCAN_MAX_READINGS];
    size_t nreadings;
    ckpt_scan_reading *reading; /* the one being made */
    char **ambiguities;
    size_t nambiguities;
    const char *path;
    const char *item;         /* a DCP item being scanned: "item at byte N" */
};

ckpt_scan *ckpt_scan_new(void)
{
    ckpt_scan *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    ckpt_file *f = ckpt_file_new(); /* for the default limits */
    if (!f) {
        free(s);
        return NULL;
    }
    for (int i = 0; i < CKPT_LIMIT_COUNT_; i++)
        s->limits[i] = ckpt_file_limit(f, (ckpt_limit)i);
    ckpt_file_free(f);
    return s;
}

static void scan_clear(ckpt_scan *s)
{
    for (size_t i = 0; i < s->nhits; i++) {
        free((char *)s->hits[i].global);
        free((char *)s->hits[i].computed_by);
    }
    free(s->hits);
    for (size_t i = 0; i < s->npickles; i++)
        free(s->pickles[i]);
    free(s->pickles);
    s->hits = NULL;
    s->nhits = s->cap = 0;
    s->pickles = NULL;
    s->npickles = 0;
    s->unsafe = 0;
    s->oom = 0;
    s->format = CKPT_FORMAT_UNKNOWN;
    s->is_pickle = 0;
    for (size_t i = 0; i < s->nreadings; i++)
        free(s->reading_errors[i]);
    s->nreadings = 0;
    s->reading = NULL;
    for (size_t i = 0; i < s->nambiguities; i++)
        free(s->ambiguities[i]);
    free(s->ambiguities);
    s->ambiguities = NULL;
    s->nambiguities = 0;
    s->path = NULL;
    ckpt_err_clear(&s->err);
}

void ckpt_scan_free(ckpt_scan *s)
{
    if (!s)
        return;
    scan_clear(s);
    free(s);
}

int ckpt_scan_set_limit(ckpt_scan *s, ckpt_limit which, uint64_t value)
{
    if (!s || which < 0 || which >= CKPT_LIMIT_COUNT_ || value == 0)
        return CKPT_ERR_USAGE;
    s->limits[which] = value;
    return CKPT_OK;
}

/* ---- the VM's callbacks --------------------------------------------------- */

static ckpt_scan_hit *hit_for(ckpt_scan *s, const char *q)
{
    for (size_t i = s->nhits; i-- > 0;) {
        if (s->hits[i].pickle != s->cur)
            break; /* one entry per global and pickle */
        if (strcmp(s->hits[i].global, q) == 0)
            return &s->hits[i];
    }
    return NULL;
}

static void on_global(void *user, const char *q, ckpt_global_class cls, int op, uint64_t at)
{
    ckpt_scan *s = user;
    ckpt_scan_hit *h = hit_for(s, q);
    if (h) {
        h->count++;
        return;
    }
    if (s->nhits == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        ckpt_scan_hit *n = realloc(s->hits, cap * sizeof *n);
        if (!n) {
            s->oom = 1; /* scan_pickle reports it: a lost hit must not pass as safe */
            return;
        }
        s->hits = n;
        s->cap = cap;
    }
    char *name = strdup(q);
    if (!name) {
        s->oom = 1;
        return;
    }
    h = &s->hits[s->nhits++];
    memset(h, 0, sizeof *h);
    h->global = name;
    h->pickle = s->cur;
    h->offset = at;
    h->opcode = ckpt_pickle_op_name(op);
    h->cls = cls;
    h->dangerous = cls == CKPT_GLOBAL_REFUSED && ckpt_globals_dangerous(q);
    h->count = 1;
    h->reading = s->reading ? s->reading->reader : NULL;
    if (cls != CKPT_GLOBAL_INTERPRETED && cls != CKPT_GLOBAL_KNOWN_DATA) {
        s->unsafe = 1;
        if (s->reading)
            s->reading->unsafe = 1;
    }
}

static void on_use(void *user, const char *q, int op, uint64_t at)
{
    ckpt_scan *s = user;
    ckpt_scan_hit *h = hit_for(s, q);
    if (!h)
        return;
    h->uses |= op == CKPT_OP_BUILD ? CKPT_SCAN_BUILT : CKPT_SCAN_CALLED;
    if (!h->used_by) {
        h->used_by = ckpt_pickle_op_name(op);
        h->use_offset = at;
    }
}

/* builtins.getattr used only as getattr(<known class>, <member>) (DeepSpeed's
 * ZeroStageEnum as Python 3.11+ pickles it): known data in this pickle; the
 * verdicts are counted again without it. */
static void on_getattr_data(void *user, const char *shown)
{
    ckpt_scan *s = user;
    ckpt_scan_hit *h = hit_for(s, "builtins.getattr");
    char *name = h ? strdup(shown) : NULL;
    if (!name)
        return; /* (out of memory: it stays dangerous) */
    free((char *)h->global);
    h->global = name;
    h->cls = CKPT_GLOBAL_KNOWN_DATA;
    h->dangerous = 0;
    s->unsafe = 0;
    if (s->reading)
        s->reading->unsafe = 0;
    for (size_t i = 0; i < s->nhits; i++) {
        const ckpt_scan_hit *x = &s->hits[i];
        if (x->cls == CKPT_GLOBAL_INTERPRETED || x->cls == CKPT_GLOBAL_KNOWN_DATA)
            continue;
        s->unsafe = 1;
        if (s->reading && x->reading == s->reading->reader)
            s->reading->unsafe = 1;
    }
}

/* A name computed at run time: dangerous whatever it turns out to be, since
 * no reading of the bytes can tell what torch would import. */
static void on_computed(void *user, const char *shown, const char *made_by, int op, uint64_t at)
{
    ckpt_scan *s = user;
    on_global(user, shown, CKPT_GLOBAL_REFUSED, op, at);
    ckpt_scan_hit *h = hit_for(s, shown);
    if (!h)
        return; /* out of memory: on_global flagged it */
    h->dangerous = 1;
    if (!h->computed_by && !(h->computed_by = strdup(made_by ? made_by : "a call")))
        s->oom = 1;
}

static ckpt_global_class classify(void *user, const char *q)
{
    ckpt_scan *s = user;
    /* a tar checkpoint's tensors member names the tensor classes of its
     * tensors (torch.FloatTensor), which torch imports and ignores: data
     * there, as the tar reader takes them, and unknown anywhere else */
    if (s->cur && strncmp(s->cur, "tar:tensors", 11) == 0 && ckpt_tensor_type_known(q))
        return CKPT_GLOBAL_KNOWN_DATA;
    return ckpt_globals_builtin_class(q);
}

static ckpt_value *any_pid(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    /* storages are not read when scanning: a None stands for any of them */
    ckpt_scan *s = user;
    (void)pid;
    (void)offset;
    ckpt_value *v = ckpt_arena_alloc(s->arena, sizeof *v); /* zeroed: kind NONE */
    if (!v)
        ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
    return v;
}

/* Scan the pickle at BUF[0..LEN) named NAME; *USED gets its length.  PID:
 * whether the unpickler has a persistent_load (torch's main pickles do; the
 * others are plain pickle.load calls, which stop at a persistent id).  With
 * KEEP, the VM's values live in that arena and *ROOT gets the result. */
static int scan_pickle_ex(ckpt_scan *s, const char *name, const uint8_t *buf, size_t len,
                          size_t *used, bool pid, ckpt_arena *keep, ckpt_value **root,
                          ckpt_pickle_feed feed, bool *crossed)
{
    char **n = realloc(s->pickles, (s->npickles + 1) * sizeof *n);
    if (!n)
        return ckpt_err(&s->err, CKPT_ERR_NOMEM, "out of memory");
    s->pickles = n;
    if (!(n[s->npickles] = strdup(name)))
        return ckpt_err(&s->err, CKPT_ERR_NOMEM, "out of memory");
    s->cur = n[s->npickles++];
    if (s->reading)
        s->reading->pickles++;

    ckpt_arena own;
    ckpt_arena *arena = keep ? keep : &own;
    if (!keep)
        ckpt_arena_init(&own);
    ckpt_pickle_ctx ctx = {
        .name = s->cur,
        .limits = s->limits,
        .classify = classify,
        .persistent_load = pid ? any_pid : NULL,
        .user = s,
        .arena = arena,
        .on_global = on_global,
        .on_use = on_use,
        .on_computed = on_computed,
        .on_getattr_data = on_getattr_data,
        .scan = true,
        .feed = feed,
    };
    ckpt_value *r = NULL;
    s->arena = arena;
    *used = 0;
    int rc = ckpt_pickle_load(&ctx, buf, len, &r, used, &s->err);
    s->arena = NULL;
    if (crossed)
        *crossed = ctx.frame_crossed;
    if (root)
        *root = rc == CKPT_OK ? r : NULL;
    if (!keep)
        ckpt_arena_release(&own);
    if (s->oom) {
        ckpt_err_clear(&s->err);
        rc = ckpt_err(&s->err, CKPT_ERR_NOMEM, "%s: out of memory for the globals found", name);
    }
    return rc;
}

/* ---- readings and ambiguities ------------------------------------------------ */

static int ambiguity(ckpt_scan *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ambiguity(ckpt_scan *s, const char *fmt, ...)
{
    char buf[CKPT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **n = realloc(s->ambiguities, (s->nambiguities + 1) * sizeof *n);
    if (!n || !(n[s->nambiguities] = strdup(buf))) {
        if (n)
            s->ambiguities = n;
        s->oom = 1;
        return CKPT_ERR_NOMEM;
    }
    s->ambiguities = n;
    s->nambiguities++;
    return CKPT_OK;
}

static ckpt_scan_reading *reading_begin(ckpt_scan *s, const char *reader, const char *who,
                                        int primary)
{
    if (s->nreadings == SCAN_MAX_READINGS)
        return NULL; /* cannot happen: fewer readings exist */
    ckpt_scan_reading *r = &s->readings[s->nreadings];
    memset(r, 0, sizeof *r);
    s->reading_errors[s->nreadings++] = NULL;
    r->reader = reader;
    r->who = who;
    r->primary = primary;
    s->reading = r;
    return r;
}

/* Close the reading with RC (its error in s->err), which moves to the
 * reading; s->err keeps the primary reading's error only. */
static void reading_end(ckpt_scan *s, int rc, ckpt_error *primary_err)
{
    ckpt_scan_reading *r = s->reading;
    s->reading = NULL;
    if (!r)
        return;
    r->code = rc;
    if (rc != CKPT_OK) {
        size_t i = (size_t)(r - s->readings);
        s->reading_errors[i] = strdup(s->err.msg[0] ? s->err.msg : "failed");
        r->error = s->reading_errors[i] ? s->reading_errors[i] : "failed (out of memory)";
        if (r->primary && primary_err)
            *primary_err = s->err;
    }
    ckpt_err_clear(&s->err);
}

/* A zip record's pickle, fed as torch feeds it (io.BytesIO).  A FRAME that
 * ends inside an opcode's argument makes CPython's C unpickler read other
 * bytes than a contiguous reader (pickletools, the weights-only unpickler,
 * other scanners): the file is ambiguous, and both readings are scanned. */
static int scan_record_pickle(ckpt_scan *s, const char *name, const uint8_t *buf, size_t len)
{
    size_t used;
    bool crossed = false;
    int rc = scan_pickle_ex(s, name, buf, len, &used, true, NULL, NULL, CKPT_FEED_BYTESIO,
                            &crossed);
    if (!crossed)
        return rc;
    ambiguity(s, "%s: a FRAME ends inside an opcode's argument: CPython's unpickler, as "
              "torch.load feeds it (io.BytesIO), reads other bytes than a contiguous reader "
              "(the weights-only unpickler, pickletools, other scanners)", name);
    char alt[CKPT_ERRMSG_MAX + 32];
    snprintf(alt, sizeof alt, "%s (read contiguously)", name);
    ckpt_error keep = s->err;
    ckpt_err_clear(&s->err);
    if (scan_pickle_ex(s, alt, buf, len, &used, true, NULL, NULL, CKPT_FEED_FILE, NULL) !=
        CKPT_OK)
        ckpt_err_clear(&s->err); /* torch's reading decides the error */
    s->err = keep;
    return rc;
}

/* ---- formats ---------------------------------------------------------------- */

/* torch finds records case-insensitively (miniz), so "DATA.PKL" loads too */
static int ends_with_nocase(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcasecmp(s + a - b, suffix) == 0;
}

/* Whether reader R's entry E holds the same bytes as an entry already
 * scanned (so each record is scanned once, whoever reads it). */
static int same_record(const ckpt_zip_entry *a, const ckpt_zip_entry *b)
{
    return a->data_at == b->data_at && a->csize == b->csize && a->method == b->method;
}

/*
 * The zip reading: every .pkl record (in any case: torch finds DATA.PKL as
 * data.pkl) as torch reads it (miniz: no CRC-32 check, the last end record),
 * fed as torch feeds it; then each record another reader (Python's zipfile,
 * libzip: ckpt's other commands) would read at other bytes.  Where they
 * disagree, zip_dir's findings say so, and the file is ambiguous.  A bad
 * CRC-32 or a truncated record does not hide what torch would unpickle: it is
 * scanned, then reported as the reading's error.
 */
static int scan_zip(ckpt_scan *s, int fd, ckpt_zip_dir *d)
{
    for (size_t i = 0; i < ckpt_zip_dir_finding_count(d); i++)
        ambiguity(s, "%s", ckpt_zip_dir_finding(d, i));
    int rc = CKPT_OK, found = 0;
    ckpt_error first = {0};
    /* torch 2.x with compute_crc32 off writes CRC 0 for every record: no
     * corruption, as ckpt's zip reader takes it */
    bool no_crcs = false;
    for (size_t i = 0; i < ckpt_zip_dir_count(d, CKPT_ZIP_READER_TORCH); i++) {
        const ckpt_zip_entry *e = ckpt_zip_dir_entry(d, CKPT_ZIP_READER_TORCH, i);
        if (e && e->usize) {
            if (e->crc != 0) {
                no_crcs = false;
                break;
            }
            no_crcs = true;
        }
    }
    /* the records scanned, so that one read by several readers is scanned once */
    size_t total = 0;
    for (int r = 0; r < CKPT_ZIP_READERS; r++)
        total += ckpt_zip_dir_count(d, (ckpt_zip_reader)r);
    const ckpt_zip_entry **done = malloc((total ? total : 1) * sizeof *done);
    if (!done)
        return ckpt_err(&s->err, CKPT_ERR_NOMEM, "out of memory");
    size_t ndone = 0;
    for (int r = 0; r < CKPT_ZIP_READERS; r++) {
        if (!ckpt_zip_dir_reads(d, (ckpt_zip_reader)r)) {
            if (r == CKPT_ZIP_READER_TORCH && rc == CKPT_OK) {
                rc = ckpt_err(&s->err, CKPT_ERR_FORMAT, "torch's zip reader refuses it: %s",
                              ckpt_zip_dir_refusal(d, (ckpt_zip_reader)r));
                first = s->err;
            }
            continue;
        }
        /* every record, even after one fails: a payload may sit in a later one */
        for (size_t i = 0; i < ckpt_zip_dir_count(d, (ckpt_zip_reader)r); i++) {
            const ckpt_zip_entry *e = ckpt_zip_dir_entry(d, (ckpt_zip_reader)r, i);
            if (!e || !e->name || !ends_with_nocase(e->name, ".pkl"))
                continue;
            found = 1;
            int seen = 0;
            for (size_t k = 0; k < ndone && !seen; k++)
                seen = same_record(done[k], e);
            if (seen)
                continue;
            done[ndone++] = e;
            char name[CKPT_ERRMSG_MAX];
            const char *in = s->item ? s->item : "", *sep = s->item ? ": " : "";
            if (r == CKPT_ZIP_READER_TORCH)
                snprintf(name, sizeof name, "%s%s%s", in, sep, e->name);
            else
                snprintf(name, sizeof name, "%s%s%s (as %s reads it)", in, sep, e->name,
                         ckpt_zip_reader_name((ckpt_zip_reader)r));
            uint8_t *buf = NULL;
            size_t len = 0;
            bool crc_ok = true;
            ckpt_error rerr = {0};
            int rr = ckpt_zip_dir_read(d, fd, (ckpt_zip_reader)r, i,
                                       s->limits[CKPT_LIMIT_PICKLE_BYTES], &buf, &len, &crc_ok,
                                       &rerr);
            int sr = CKPT_OK;
            if (buf && len)
                sr = scan_record_pickle(s, name, buf, len);
            free(buf);
            if (no_crcs)
                crc_ok = true;
            if (rr == CKPT_OK && !crc_ok && r != CKPT_ZIP_READER_TORCH)
                continue; /* that reader refuses the record: it unpickles nothing */
            if (rr == CKPT_ERR_LIMIT) {
                char msg[CKPT_ERRMSG_MAX];
                snprintf(msg, sizeof msg, "%s", rerr.msg);
                ckpt_err_clear(&rerr);
                ckpt_err(&rerr, rr, "%s (--max-pickle-bytes)", msg);
            }
            if (rr == CKPT_OK && !crc_ok)
                rr = ckpt_err(&rerr, CKPT_ERR_FORMAT, "%s: CRC-32 mismatch (torch does not "
                              "check it: the globals listed are those it would meet)", e->name);
            if (rr != CKPT_OK && rc == CKPT_OK) {
                rc = rr;
                first = rerr;
            } else if (sr != CKPT_OK && rc == CKPT_OK) {
                rc = sr;
                first = s->err;
            }
            ckpt_err_clear(&s->err);
        }
    }
    free(done);
    if (rc != CKPT_OK)
        s->err = first;
    if (rc == CKPT_OK && !found)
        rc = ckpt_err(&s->err, CKPT_ERR_FORMAT, "a zip archive without a .pkl record");
    return rc;
}

/* ---- the tar format of torch <= 0.1 ----------------------------------------- */

typedef struct tar_walk {
    ckpt_scan *s;
    ckpt_arena arena; /* the walk reads counts and storage types from the roots */
    bool crossed;
} tar_walk;

static int tar_pickle(void *user, const char *name, const uint8_t *buf, size_t len,
                      size_t *used, ckpt_value **root)
{
    tar_walk *w = user;
    /* torch opens the extracted storages and tensors members unbuffered (no
     * peek: frames are read whole) and the pickle member through tarfile's
     * buffered reader; only the main pickle has a persistent_load */
    int main_pickle = strcmp(name, "tar:pickle") == 0;
    bool cr = false;
    int rc = scan_pickle_ex(w->s, name, buf, len, used, main_pickle, &w->arena, root,
                            main_pickle ? CKPT_FEED_FILE : CKPT_FEED_BYTESIO, &cr);
    if (cr && !w->crossed) {
        w->crossed = true;
        ambiguity(w->s, "%s: a FRAME ends inside an opcode's argument: CPython's unpickler "
                  "reads other bytes from it than a contiguous reader", name);
    }
    return rc;
}

/* The tar reading: the pickles torch's tar loader unpickles, in its order. */
static int scan_tar(ckpt_scan *s, int fd, uint64_t size)
{
    tar_walk w = {.s = s};
    ckpt_arena_init(&w.arena);
    ckpt_error err = {0};
    int rc = ckpt_pth_tar_scan(fd, size, tar_pickle, &w, &err);
    ckpt_arena_release(&w.arena);
    if (rc != CKPT_OK && err.msg[0]) {
        ckpt_err_clear(&s->err);
        s->err = err;
    } else if (rc != CKPT_OK && !s->err.msg[0]) {
        ckpt_err(&s->err, rc, "the tar checkpoint cannot be read");
    }
    return rc;
}

/* The magic number torch's legacy format starts with: 0x1950a86a20f9469cfc6c
 * as a protocol-2 LONG1. */
static const uint8_t LEGACY_MAGIC[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                       0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};

/* Whether V is the int whose little-endian bytes are LE[0..N) (positive, no
 * sign byte). */
static int int_is(const ckpt_value *v, const uint8_t *le, size_t n)
{
    if (!v || v->kind != CKPT_KIND_INT)
        return 0;
    if (!v->u.i.big) {
        if (n > 8)
            return 0;
        uint64_t want = 0;
        for (size_t i = n; i-- > 0;)
            want = want << 8 | le[i];
        return v->u.i.v >= 0 && (uint64_t)v->u.i.v == want;
    }
    if (!v->u.i.bytes)
        return 0;
    size_t k = v->u.i.nbytes;
    while (k > 0 && v->u.i.bytes[k - 1] == 0)
        k--; /* a positive int's sign byte */
    return k == n && memcmp(v->u.i.bytes, le, n) == 0;
}

/* Opcodes a pickle can start with (pickle.dumps at any protocol, or by hand). */
static int pickle_start(uint8_t b)
{
    return b == 0x80 || (b < 0x80 && strchr("()]}NIJKMLFGSTUVXBCcdlqpghjK.", b) && b);
}

/*
 * The legacy loader's reading: torch.load of a file that is neither a zip
 * nor a tar unpickles from byte 0, a pickle at a time, and goes on only
 * while each is what it expects (the magic number, protocol 1001, sys_info,
 * the data pickle with persistent ids, the storage keys).  A plain pickle
 * file fails at the magic number after its first pickle has run; other tools
 * go on calling pickle.load, so the pickles after it are scanned too (back
 * to back), except in a file that is another format (ONLY_TORCH: what
 * follows the first pickle there is data, not pickles).
 */
static int scan_stream(ckpt_scan *s, const uint8_t *buf, size_t len, int only_torch,
                       ckpt_pickle_feed feed, bool *crossed)
{
    /* FILE: the C unpickler peeking a buffered file; BYTESIO: frames read
     * whole with read() (over 128 KiB, or past what a peek returns) */
    const char *how = feed == CKPT_FEED_BYTESIO ? ", frames read whole" : "";
    if (len == 0)
        return ckpt_err(&s->err, CKPT_ERR_FORMAT, "empty file");
    int legacy = len >= sizeof LEGACY_MAGIC && memcmp(buf, LEGACY_MAGIC, sizeof LEGACY_MAGIC) == 0;
    if (!legacy && !pickle_start(buf[0]) && !only_torch)
        return ckpt_err(&s->err, CKPT_ERR_FORMAT, "not a checkpoint or a pickle (first byte "
                        "0x%02x)", buf[0]);
    static const char *const legacy_names[] = {"magic number", "protocol version", "sys_info",
                                               "data pickle", "storage keys"};
    static const uint8_t magic_le[] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    static const uint8_t proto_le[] = {0xe9, 0x03}; /* 1001 */
    uint64_t cap = s->limits[CKPT_LIMIT_PICKLE_BYTES];
    size_t at = 0;
    int torch_chain = 1; /* still on the pickles torch.load reads */
    for (int k = 0; at < len; k++) {
        if (torch_chain && k == 5)
            break; /* then raw storage bytes */
        char name[96];
        if (torch_chain && (legacy || k > 0))
            snprintf(name, sizeof name, "pickle %d (%s%s)", k + 1, legacy_names[k], how);
        else
            snprintf(name, sizeof name, "pickle %d (from byte %zu%s)", k + 1, at, how);
        if (k > 0 && !torch_chain && !pickle_start(buf[at]))
            break; /* trailing bytes, which pickle.load never reads */
        /* each pickle is bounded by the limit, not by the rest of the file */
        size_t avail = len - at, used = 0;
        int capped = avail > cap;
        if (capped)
            avail = (size_t)cap;
        ckpt_arena arena;
        ckpt_arena_init(&arena);
        ckpt_value *root = NULL;
        /* a persistent id stops torch's plain pickle.load calls (all but the data pickle),
         * but a pickle file may be read by a loader that has one: scanned past it, except
         * in another format's bytes, which only torch's exact reading may see */
        bool cr = false;
        int rc = scan_pickle_ex(s, name, buf + at, avail, &used, !only_torch || k == 3, &arena,
                                &root, feed, &cr);
        if (cr && crossed)
            *crossed = true;
        int next = torch_chain && (k == 0   ? int_is(root, magic_le, sizeof magic_le)
                                   : k == 1 ? int_is(root, proto_le, sizeof proto_le)
                                            : 1);
        ckpt_arena_release(&arena);
        if (rc != CKPT_OK) {
            char msg[CKPT_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", s->err.msg);
            ckpt_err_clear(&s->err); /* the first error is kept: replace it */
            if (capped)
                return ckpt_err(&s->err, CKPT_ERR_LIMIT, "%s does not end within the limit of "
                                "%llu bytes (--max-pickle-bytes): %s", name,
                                (unsigned long long)cap, msg);
            return ckpt_err(&s->err, rc, "%s", msg);
        }
        at += used;
        if (torch_chain && !next) {
            /* torch.load stops here: "Invalid magic number" / protocol version */
            if (only_torch || k > 0)
                return ckpt_err(&s->err, CKPT_ERR_FORMAT, "%s: torch.load stops after it (%s)",
                                name, k == 0 ? "not the magic number of torch's legacy format"
                                             : "not protocol version 1001");
            torch_chain = 0; /* a plain pickle file: go on as pickle.load would */
        }
    }
    s->format = torch_chain ? CKPT_FORMAT_PTH_LEGACY : CKPT_FORMAT_UNKNOWN;
    s->is_pickle = !torch_chain;
    return CKPT_OK;
}

/* The safetensors reading: the header, validated as when reading. */
static int scan_safetensors(ckpt_scan *s, const char *path)
{
    ckpt_file *f = ckpt_file_new();
    if (!f)
        return ckpt_err(&s->err, CKPT_ERR_NOMEM, "out of memory");
    int rc = ckpt_file_open(f, path);
    if (rc != CKPT_OK) {
        const char *msg = ckpt_file_error_message(f);
        size_t pl = strlen(path);
        /* the file's messages start with its path: drop it */
        if (strncmp(msg, path, pl) == 0 && msg[pl] == ':')
            msg += pl + 2;
        ckpt_err(&s->err, rc, "%s", msg);
    }
    ckpt_file_free(f);
    return rc;
}

static const char WHO_ZIP[] = "torch.load (torch >= 1.6) of a file starting with a zip local "
                              "header, whatever its name";
static const char WHO_ZIP_OTHERS[] = "Python's zipfile and libzip (not torch.load: no zip local "
                                     "header at byte 0)";
static const char WHO_TAR[] = "torch.load's tar loader (torch <= 0.1's format, tried by every "
                              "torch before the legacy stream for a file that is not a zip)";
static const char WHO_ST[] = "safetensors; torch.load in torch 2.x when the path ends in "
                             ".safetensors";
static const char WHO_STREAM[] = "torch.load's legacy loader: a file neither zip nor tar "
                                 "(in torch 2.x, when its path does not end in .safetensors), "
                                 "unpickled from byte 0";

/* PATH opened for reading, a regular file of *LEN bytes; -1 with the
 * error in s->err. */
static int open_regular(ckpt_scan *s, const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ckpt_err(&s->err, CKPT_ERR_IO, "%s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        ckpt_err(&s->err, CKPT_ERR_IO, "not a regular file");
        return -1;
    }
    *len = (size_t)st.st_size;
    return fd;
}

int ckpt_scan_file(ckpt_scan *s, const char *path)
{
    if (!s || !path)
        return CKPT_ERR_USAGE;
    scan_clear(s);
    s->path = path;
    size_t len;
    int fd = open_regular(s, path, &len);
    if (fd < 0)
        return s->err.code;
    if (len == 0) {
        close(fd);
        return ckpt_err(&s->err, CKPT_ERR_FORMAT, "empty file");
    }
    uint8_t head[16];
    size_t got;
    const ckpt_format_desc *d;
    ckpt_format_sniff_fd(fd, (uint64_t)len, NULL, head, sizeof head, &got, &d);
    ckpt_format fmt = d ? d->id : CKPT_FORMAT_UNKNOWN; /* unreadable: a pickle stream's error */
    ckpt_error primary = {0};
    int rc;

    if (got >= 4 && memcmp(head, "PK\x03\x04", 4) == 0) {
        /* torch >= 1.6 reads nothing else of a file that starts so */
        s->format = fmt == CKPT_FORMAT_TORCHSCRIPT ? fmt : CKPT_FORMAT_PTH_ZIP;
        reading_begin(s, "zip", WHO_ZIP, 1);
        ckpt_zip_dir *zd;
        rc = ckpt_zip_dir_open(fd, (uint64_t)len, &zd, &s->err);
        if (rc == CKPT_OK) {
            rc = scan_zip(s, fd, zd);
            ckpt_zip_dir_free(zd);
        }
        reading_end(s, rc, &primary);
        close(fd);
        s->err = primary;
        return primary.code;
    }
    {
        /* not a zip to torch, but perhaps to Python's zipfile and libzip (data
         * before the first local header): their reading is made too */
        ckpt_zip_dir *zd;
        ckpt_error zerr = {0};
        if (ckpt_zip_dir_open(fd, (uint64_t)len, &zd, &zerr) == CKPT_OK) {
            reading_begin(s, "zip", WHO_ZIP_OTHERS, 0);
            rc = scan_zip(s, fd, zd);
            reading_end(s, rc, NULL);
            ckpt_zip_dir_free(zd);
        }
    }
    if (ckpt_tar_probe(fd, (uint64_t)len)) {
        /* torch.load takes it for a tar before anything else; when a later
         * header fails it falls back to the pickle stream, made below too */
        reading_begin(s, "tar", WHO_TAR, 1);
        rc = scan_tar(s, fd, (uint64_t)len);
        reading_end(s, rc, &primary);
    }
    if (fmt == CKPT_FORMAT_SAFETENSORS) {
        reading_begin(s, "safetensors", WHO_ST, 1);
        rc = scan_safetensors(s, path);
        reading_end(s, rc, &primary);
    }
    /* mapped: only the pickles' pages are read, never the tensor data */
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return ckpt_err(&s->err, CKPT_ERR_IO, "%s", strerror(errno));
    int tar = s->nreadings && strcmp(s->readings[0].reader, "tar") == 0;
    reading_begin(s, "pickle", WHO_STREAM, fmt != CKPT_FORMAT_SAFETENSORS && !tar);
    bool crossed = false;
    rc = scan_stream(s, map, len, fmt == CKPT_FORMAT_SAFETENSORS, CKPT_FEED_FILE, &crossed);
    if (crossed) {
        /* how the C unpickler reads a frame depends on the file object and its
         * buffer: both ways are torch's, both are scanned */
        ambiguity(s, "a FRAME ends inside an opcode's argument: CPython's unpickler reads "
                  "other bytes when it reads the frame whole (io.BytesIO, or a frame of "
                  "128 KiB or more from a file) than when it peeks a buffered file");
        ckpt_error keep = s->err;
        ckpt_err_clear(&s->err);
        ckpt_format seen = s->format;
        int seen_pickle = s->is_pickle;
        if (scan_stream(s, map, len, fmt == CKPT_FORMAT_SAFETENSORS, CKPT_FEED_BYTESIO, NULL) !=
            CKPT_OK && rc == CKPT_OK) {
            rc = s->err.code;
            keep = s->err;
        }
        s->err = keep;
        s->format = seen;
        s->is_pickle = seen_pickle;
    }
    reading_end(s, rc, &primary);
    munmap(map, len);
    if (fmt == CKPT_FORMAT_SAFETENSORS || tar) {
        /* its reading is the primary one, whatever the pickle reading found */
        s->format = tar ? CKPT_FORMAT_PTH_TAR : fmt;
        s->is_pickle = 0;
    }
    s->err = primary;
    return primary.code;
}

/* ---- a DCP data file: torch.save zips (or zstd frames of them) back to back ---- */

static const char WHO_ITEMS[] = "torch.distributed.checkpoint's FileSystemReader: each item "
                                "torch.load-ed from its bytes (BYTES items with "
                                "weights_only=False)";

/* Where the zip starting at AT of MAP (N bytes) ends: just after the first
 * end record whose central directory ends right before it, counted from AT
 * (a signature inside tensor data does not fit so).  0 when none. */
static size_t zip_end(const uint8_t *map, size_t n, size_t at)
{
    for (size_t p = at; p + 22 <= n;) {
        const uint8_t *e = memmem(map + p, n - p, "PK\x05\x06", 4);
        if (!e)
            return 0;
        size_t q = (size_t)(e - map);
        if (q + 22 > n)
            return 0;
        uint64_t cd_size = (uint64_t)e[12] | (uint64_t)e[13] << 8 | (uint64_t)e[14] << 16 |
                           (uint64_t)e[15] << 24;
        uint64_t cd_at = (uint64_t)e[16] | (uint64_t)e[17] << 8 | (uint64_t)e[18] << 16 |
                         (uint64_t)e[19] << 24;
        size_t comment = (size_t)e[20] | (size_t)e[21] << 8;
        bool zip64 = cd_at == 0xFFFFFFFFu || cd_size == 0xFFFFFFFFu;
        /* torch writes a zip64 end record (56 bytes) and locator (20) before it */
        bool z64 = q - at >= 76 && memcmp(map + q - 20, "PK\x06\x07", 4) == 0;
        if ((zip64 || cd_at + cd_size == q - at || (z64 && cd_at + cd_size + 76 == q - at)) &&
            q + 22 + comment <= n)
            return q + 22 + comment;
        p = q + 1;
    }
    return 0;
}

/* One zip item at [AT, AT+LEN) of FD (the file, or a memfd of a frame's bytes). */
static int scan_item_zip(ckpt_scan *s, int fd, uint64_t at, uint64_t len, const char *label)
{
    ckpt_zip_dir *zd;
    s->item = label;
    int rc = ckpt_zip_dir_open_at(fd, at, len, &zd, &s->err);
    if (rc == CKPT_OK) {
        rc = scan_zip(s, fd, zd);
        ckpt_zip_dir_free(zd);
    }
    s->item = NULL;
    return rc;
}

int ckpt_scan_items(ckpt_scan *s, const char *path)
{
    if (!s || !path)
        return CKPT_ERR_USAGE;
    scan_clear(s);
    s->path = path;
    s->format = CKPT_FORMAT_DCP;
    size_t n;
    int fd = open_regular(s, path, &n);
    if (fd < 0)
        return s->err.code;
    if (n == 0) {
        close(fd); /* a rank with nothing to save writes an empty file */
        return CKPT_OK;
    }
    const uint8_t *map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return ckpt_err(&s->err, CKPT_ERR_IO, "%s", strerror(errno));
    }
    ckpt_error primary = {0};
    reading_begin(s, "items", WHO_ITEMS, 1);
    int rc = CKPT_OK;
    for (size_t at = 0; at < n && rc == CKPT_OK;) {
        char label[64];
        snprintf(label, sizeof label, "item at byte %zu", at);
        if (n - at >= 4 && memcmp(map + at, "PK\x03\x04", 4) == 0) {
            size_t end = zip_end(map, n, at);
            if (!end) {
                rc = ckpt_err(&s->err, CKPT_ERR_FORMAT, "%s: a zip without its end record",
                              label);
                break;
            }
            int r = scan_item_zip(s, fd, at, end - at, label);
            if (r != CKPT_OK && r != CKPT_ERR_FORMAT)
                rc = r;
            else if (r != CKPT_OK)
                rc = r; /* the pickles before were scanned; stop as the reader would */
            at = end;
        } else if (n - at >= 4 && memcmp(map + at, "\x28\xb5\x2f\xfd", 4) == 0) {
            /* stream.zstd/1: one frame holding the item's zip (its size may be
             * unstated: decompressed by streaming, up to 4x the pickle limit) */
            size_t fl = ZSTD_findFrameCompressedSize(map + at, n - at);
            if (ZSTD_isError(fl)) {
                rc = ckpt_err(&s->err, CKPT_ERR_FORMAT, "%s: a corrupt zstd frame", label);
                break;
            }
            uint64_t cap = s->limits[CKPT_LIMIT_PICKLE_BYTES] * 4;
            size_t have = 0, size = fl * 4 + 4096;
            uint8_t *buf = NULL;
            ZSTD_DStream *zs = ZSTD_createDStream();
            ZSTD_inBuffer ib = {map + at, fl, 0};
            size_t zr = zs ? ZSTD_initDStream(zs) : 1;
            while (zs && !ZSTD_isError(zr) && (ib.pos < ib.size || zr != 0)) {
                if (have == size || !buf) {
                    size = buf ? size * 2 : size;
                    uint8_t *nb = size <= cap ? realloc(buf, size) : NULL;
                    if (!nb)
                        break;
                    buf = nb;
                }
                ZSTD_outBuffer ob = {buf, size, have};
                zr = ZSTD_decompressStream(zs, &ob, &ib);
                have = ob.pos;
                if (!ZSTD_isError(zr) && zr != 0 && ib.pos == ib.size && have < size)
                    break; /* a frame cut short */
            }
            bool ok = zs && !ZSTD_isError(zr) && zr == 0 && ib.pos == ib.size;
            ZSTD_freeDStream(zs);
            int mfd = ok ? memfd_create("ckpt-scan-item", MFD_CLOEXEC) : -1;
            if (!ok || mfd < 0 || write(mfd, buf, have) != (ssize_t)have)
                rc = ckpt_err(&s->err, CKPT_ERR_FORMAT, "%s: its zstd frame does not "
                              "decompress (corrupt, cut short, or over %llu bytes)", label,
                              (unsigned long long)cap);
            else
                rc = scan_item_zip(s, mfd, 0, have, label);
            if (mfd >= 0)
                close(mfd);
            free(buf);
            at += fl;
        } else if (n - at >= 9 && map[at + 8] == '{') {
            /* the SAFETENSORS serialization: one blob to the end, no pickle */
            uint64_t hl = 0;
            for (int k = 8; k-- > 0;)
                hl = (hl << 8) | map[at + k];
            if (hl > n - at - 8)
                rc = ckpt_err(&s->err, CKPT_ERR_FORMAT, "%s: a safetensors header past the "
                              "end of the file", label);
            break;
        } else {
            rc = ckpt_err(&s->err, CKPT_ERR_FORMAT, "%s: neither a torch.save zip, a zstd frame "
                          "nor a safetensors blob", label);
        }
    }
    reading_end(s, rc, &primary);
    munmap((void *)map, n);
    close(fd);
    s->err = primary;
    return primary.code;
}

int ckpt_scan_error_code(const ckpt_scan *s) { return s->err.code; }
const char *ckpt_scan_error_message(const ckpt_scan *s) { return s->err.msg; }
ckpt_format ckpt_scan_format(const ckpt_scan *s) { return s->format; }
int ckpt_scan_is_pickle(const ckpt_scan *s) { return s->is_pickle; }
size_t ckpt_scan_pickle_count(const ckpt_scan *s) { return s->npickles; }
const char *ckpt_scan_pickle_name(const ckpt_scan *s, size_t i)
{
    return i < s->npickles ? s->pickles[i] : NULL;
}
size_t ckpt_scan_hit_count(const ckpt_scan *s) { return s->nhits; }
const ckpt_scan_hit *ckpt_scan_hit_at(const ckpt_scan *s, size_t i)
{
    return i < s->nhits ? &s->hits[i] : NULL;
}
int ckpt_scan_unsafe(const ckpt_scan *s) { return s->unsafe; }
size_t ckpt_scan_reading_count(const ckpt_scan *s) { return s->nreadings; }
const ckpt_scan_reading *ckpt_scan_reading_at(const ckpt_scan *s, size_t i)
{
    return i < s->nreadings ? &s->readings[i] : NULL;
}
size_t ckpt_scan_ambiguity_count(const ckpt_scan *s) { return s->nambiguities; }
const char *ckpt_scan_ambiguity_at(const ckpt_scan *s, size_t i)
{
    return i < s->nambiguities ? s->ambiguities[i] : NULL;
}
