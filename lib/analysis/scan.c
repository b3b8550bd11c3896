/* scan.c - ckpt scan: every global a file's pickles name, and what uses it,
 * found by running the same safe VM that reads checkpoints in its scanning
 * mode (nothing imported, nothing called; STACK_GLOBAL operands resolved
 * through the memo exactly as when reading), so the answer cannot differ
 * from what a load would meet.  The pickles are those the formats' walks
 * hand out (formats/format.h), read as each loader reads them. */
#include "analysis/analysis.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
    uint64_t cur_at;          /* its first byte in the file; UINT64_MAX: not there as is */
    int oom;                  /* a hit could not be recorded */
    ckpt_arena *arena;        /* its VM's arena */
    ckpt_scan_reading readings[SCAN_MAX_READINGS];
    char *reading_errors[SCAN_MAX_READINGS];
    size_t nreadings;
    ckpt_scan_reading *reading; /* the one being made */
    char **ambiguities;
    size_t nambiguities;
    char **code;              /* code a loader runs besides the pickles (TorchScript) */
    size_t ncode;
    const char *path;
    const char *item;         /* a DCP item being scanned: "item at byte N" */
    int file_fd;              /* a DCP data file's descriptor */
    bool item_elsewhere;      /* the item is a zstd frame's bytes, not the file's */
    struct frame_choice *frames; /* the legacy stream's reading of its frames */
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
    for (size_t i = 0; i < s->ncode; i++)
        free(s->code[i]);
    free(s->code);
    s->code = NULL;
    s->ncode = 0;
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
    h->file_offset = s->cur_at == UINT64_MAX ? UINT64_MAX : s->cur_at + at;
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
        ckpt_oom(err);
    return v;
}

/* One reading of a legacy stream's frames (CKPT_FEED_CHOOSE): the choice
 * at each point where CPython's reading depends on the file's buffering,
 * carried from pickle to pickle, and what was met. */
typedef struct frame_choice {
    uint64_t drops, n;
    bool crossed, stop;
} frame_choice;

static void frames_enter(const frame_choice *fc, ckpt_pickle_ctx *ctx)
{
    ctx->drops = fc->drops;
    ctx->ndiverge = fc->n;
}

static void frames_leave(frame_choice *fc, const ckpt_pickle_ctx *ctx)
{
    fc->n = ctx->ndiverge;
    fc->crossed |= ctx->frame_crossed;
    fc->stop |= ctx->frame_stop;
}

/* Scan the pickle at BUF[0..LEN) named NAME, at byte AT of the file
 * (UINT64_MAX: not in it as is); *USED gets its length.  PID:
 * whether the unpickler has a persistent_load (torch's main pickles do; the
 * others are plain pickle.load calls, which stop at a persistent id).  With
 * KEEP, the VM's values live in that arena and *ROOT gets the result. */
static int scan_pickle_ex(ckpt_scan *s, const char *name, uint64_t at, const uint8_t *buf,
                          size_t len, size_t *used, bool pid, ckpt_arena *keep, ckpt_value **root,
                          ckpt_pickle_feed feed, bool *crossed)
{
    char **n = realloc(s->pickles, (s->npickles + 1) * sizeof *n);
    if (!n)
        return ckpt_oom(&s->err);
    s->pickles = n;
    if (!(n[s->npickles] = strdup(name)))
        return ckpt_oom(&s->err);
    s->cur = n[s->npickles++];
    s->cur_at = at;
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
    if (feed == CKPT_FEED_CHOOSE && s->frames)
        frames_enter(s->frames, &ctx);
    int rc = ckpt_pickle_load(&ctx, buf, len, &r, used, &s->err);
    s->arena = NULL;
    if (feed == CKPT_FEED_CHOOSE && s->frames)
        frames_leave(s->frames, &ctx);
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
    for (size_t i = 0; i < s->nambiguities; i++)
        if (strcmp(s->ambiguities[i], buf) == 0)
            return CKPT_OK; /* found again by another reading of the frames */
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

/* Code torch.load would run in the zip just read (LABEL: a DCP item, or
 * NULL): a TorchScript archive goes to torch.jit.load, which compiles its
 * code/ and runs it (__setstate__ on load) whatever its classes are named,
 * so no reading of its pickles can call it safe. */
static void torchscript_code(ckpt_scan *s, const char *label)
{
    char buf[CKPT_ERRMSG_MAX];
    snprintf(buf, sizeof buf, "%s%sa TorchScript archive (a constants.pkl record): torch.load "
             "hands it to torch.jit.load, which compiles and runs the code in its code/ "
             "(__setstate__ as it loads) whatever its classes are named; weights_only=True "
             "refuses it in torch 2.x, torch 1.13 runs it anyway; ckpt extract writes its "
             "weights only", label ? label : "", label ? ": " : "");
    char **n = realloc(s->code, (s->ncode + 1) * sizeof *n);
    if (!n || !(n[s->ncode] = strdup(buf))) {
        if (n)
            s->code = n;
        s->oom = 1;
        return;
    }
    s->code = n;
    s->ncode++;
    s->unsafe = 1;
    if (s->reading)
        s->reading->unsafe = 1;
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
static int scan_record_pickle(ckpt_scan *s, const char *name, uint64_t at, const uint8_t *buf,
                              size_t len)
{
    size_t used;
    bool crossed = false;
    int rc = scan_pickle_ex(s, name, at, buf, len, &used, true, NULL, NULL, CKPT_FEED_BYTESIO,
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
    if (scan_pickle_ex(s, alt, at, buf, len, &used, true, NULL, NULL, CKPT_FEED_FILE, NULL) !=
        CKPT_OK)
        ckpt_err_clear(&s->err); /* torch's reading decides the error */
    s->err = keep;
    return rc;
}

/* ---- formats ---------------------------------------------------------------- */

static int zip_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    (void)used, (void)root;
    ckpt_scan *s = w->user;
    return scan_record_pickle(s, p->name, s->item_elsewhere ? UINT64_MAX : p->offset, p->buf,
                              p->len);
}

static void zip_finding(ckpt_walk *w, const char *text)
{
    ambiguity(w->user, "%s", text);
}

/*
 * The zip reading (pth-zip's readings): every .pkl record (in any case: torch
 * finds DATA.PKL as data.pkl) as torch reads it (miniz: no CRC-32 check, the
 * last end record), fed as torch feeds it; then each record another reader
 * (Python's zipfile, libzip: ckpt's other commands) would read at other
 * bytes.  Where they disagree, the findings say so, and the file is
 * ambiguous.  A bad CRC-32 or a truncated record does not hide what torch
 * would unpickle: it is scanned, then reported as the reading's error.  A
 * TorchScript archive (by torch's own test) is code, whatever its pickles.
 * TORCH_ONLY: torch's reading alone (a DCP item).  *OPENED: whether any
 * reader takes it for a zip.
 */
static int scan_zip(ckpt_scan *s, int fd, uint64_t base, uint64_t size, bool torch_only,
                    bool *opened)
{
    ckpt_walk w = {.pickle = zip_pickle, .finding = zip_finding, .user = s,
                   .pickle_limit = s->limits[CKPT_LIMIT_PICKLE_BYTES]};
    int rc = ckpt_pth_zip_readings(&w, fd, base, size, s->item, torch_only, &s->err);
    if (opened)
        *opened = w.opened;
    if (w.stop.torchscript) {
        torchscript_code(s, s->item);
        if (!s->item)
            s->format = CKPT_FORMAT_TORCHSCRIPT;
    }
    return rc;
}

/* ---- the tar format of torch <= 0.1 ----------------------------------------- */

typedef struct tar_scan {
    ckpt_scan *s;
    ckpt_arena arena; /* the walk reads counts and storage types from the roots */
    bool crossed;
} tar_scan;

static int tar_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    tar_scan *ts = w->user;
    /* torch opens the extracted storages and tensors members unbuffered (no
     * peek: frames are read whole) and the pickle member through tarfile's
     * buffered reader; only the main pickle has a persistent_load */
    bool main_pickle = p->pid_fields != 0, cr = false;
    int rc = scan_pickle_ex(ts->s, p->name, p->offset, p->buf, p->len, used, main_pickle, &ts->arena, root,
                            main_pickle ? CKPT_FEED_FILE : CKPT_FEED_BYTESIO, &cr);
    if (cr && !ts->crossed) {
        ts->crossed = true;
        ambiguity(ts->s, "%s: a FRAME ends inside an opcode's argument: CPython's unpickler "
                  "reads other bytes from it than a contiguous reader", p->name);
    }
    return rc;
}

/* The tar reading: the pickles torch's tar loader unpickles, in its order
 * (pth-tar's walk, with ckpt's rules). */
static int scan_tar(ckpt_scan *s, int fd, uint64_t size)
{
    tar_scan ts = {.s = s};
    ckpt_arena_init(&ts.arena);
    ckpt_error err = {0};
    ckpt_walk w = {.pickle = tar_pickle, .user = &ts, .strict = true};
    ckpt_source src = {.fd = fd, .file_size = size};
    int rc = ckpt_format_pth_tar.walk(&w, &src, &err);
    ckpt_arena_release(&ts.arena);
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

/* Opcodes a pickle can start with: every one CPython's C unpickler runs
 * first without failing at once (tests/interop/frame_chain.py checks the
 * list against it), PERSID for a loader with a persistent_load, EXT1/2/4
 * for one with registered extensions, and a few that fail there (scanned:
 * the VM says why). */
static int pickle_start(uint8_t b)
{
    switch (b) {
    case CKPT_OP_PROTO: case CKPT_OP_FRAME: case CKPT_OP_MARK: case CKPT_OP_EMPTY_TUPLE:
    case CKPT_OP_EMPTY_LIST: case CKPT_OP_EMPTY_DICT: case CKPT_OP_EMPTY_SET: case CKPT_OP_NONE:
    case CKPT_OP_NEWTRUE: case CKPT_OP_NEWFALSE: case CKPT_OP_INT: case CKPT_OP_BININT:
    case CKPT_OP_BININT1: case CKPT_OP_BININT2: case CKPT_OP_LONG: case CKPT_OP_LONG1:
    case CKPT_OP_LONG4: case CKPT_OP_FLOAT: case CKPT_OP_BINFLOAT: case CKPT_OP_STRING:
    case CKPT_OP_BINSTRING: case CKPT_OP_SHORT_BINSTRING: case CKPT_OP_UNICODE:
    case CKPT_OP_BINUNICODE: case CKPT_OP_SHORT_BINUNICODE: case CKPT_OP_BINUNICODE8:
    case CKPT_OP_BINBYTES: case CKPT_OP_SHORT_BINBYTES: case CKPT_OP_BINBYTES8:
    case CKPT_OP_BYTEARRAY8: case CKPT_OP_GLOBAL: case CKPT_OP_PERSID: case CKPT_OP_EXT1:
    case CKPT_OP_EXT2: case CKPT_OP_EXT4: case CKPT_OP_DICT: case CKPT_OP_LIST:
    case CKPT_OP_BINPUT: case CKPT_OP_PUT: case CKPT_OP_GET: case CKPT_OP_BINGET:
    case CKPT_OP_LONG_BINGET: case CKPT_OP_STOP:
        return 1;
    default:
        return 0;
    }
}

/* One pickle of the stream, NAME, at BUF[0..LEN): scanned, bounded by the
 * pickle limit (not by the rest of the file). */
static int stream_pickle(ckpt_scan *s, const char *name, uint64_t at, const uint8_t *buf,
                         size_t len, bool pid,
                         ckpt_arena *keep, ckpt_value **root, ckpt_pickle_feed feed,
                         bool *crossed, size_t *used)
{
    uint64_t cap = s->limits[CKPT_LIMIT_PICKLE_BYTES];
    size_t avail = len;
    int capped = avail > cap;
    if (capped)
        avail = (size_t)cap;
    bool cr = false;
    int rc = scan_pickle_ex(s, name, at, buf, avail, used, pid, keep, root, feed, &cr);
    if (cr && crossed)
        *crossed = true;
    if (rc == CKPT_OK)
        return CKPT_OK;
    char msg[CKPT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", s->err.msg);
    ckpt_err_clear(&s->err); /* the first error is kept: replace it */
    if (capped)
        return ckpt_err(&s->err, CKPT_ERR_LIMIT, "%s does not end within the limit of %llu bytes "
                        "(--max-pickle-bytes): %s", name, (unsigned long long)cap, msg);
    return ckpt_err(&s->err, rc, "%s", msg);
}

typedef struct stream_walk {
    ckpt_scan *s;
    int only_torch, legacy;
    ckpt_pickle_feed feed;
    const char *how;
    bool *crossed;
    ckpt_arena arena; /* the last pickle's values, which the walk checks */
    char name[96];    /* the last pickle's name */
} stream_walk;

static int stream_on_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used,
                            ckpt_value **root)
{
    stream_walk *sw = w->user;
    if (p->len == 0)
        return CKPT_WALK_STOP; /* the file ends: all torch reads is scanned */
    if (sw->legacy || p->index > 0)
        snprintf(sw->name, sizeof sw->name, "pickle %d (%s%s)", p->index + 1, p->name, sw->how);
    else
        snprintf(sw->name, sizeof sw->name, "pickle 1 (from byte 0%s)", sw->how);
    ckpt_arena_release(&sw->arena);
    ckpt_arena_init(&sw->arena);
    /* a persistent id stops torch's plain pickle.load calls (all but the data pickle),
     * but a pickle file may be read by a loader that has one: scanned past it, except
     * in another format's bytes, which only torch's exact reading may see */
    return stream_pickle(sw->s, sw->name, p->offset, p->buf, p->len, !sw->only_torch || p->pid_fields,
                         &sw->arena, root, sw->feed, sw->crossed, used);
}

/*
 * The legacy loader's reading: torch.load of a file that is neither a zip
 * nor a tar unpickles from byte 0, a pickle at a time, and goes on only
 * while each is what it expects: pth-legacy's walk.  A plain pickle file
 * fails at the magic number after its first pickle has run; other tools go
 * on calling pickle.load, so the pickles after it are scanned too (back to
 * back), except in a file that is another format (ONLY_TORCH: what follows
 * the first pickle there is data, not pickles).  FD is the file, BUF[0..LEN)
 * it mapped.
 */
static int scan_stream(ckpt_scan *s, int fd, const uint8_t *buf, size_t len, int only_torch,
                       const char *how)
{
    /* the C unpickler reading a buffered file, each frame's reading as
     * s->frames chooses (HOW names the choice for the pickles' names) */
    ckpt_pickle_feed feed = CKPT_FEED_CHOOSE;
    bool *crossed = NULL;
    if (len == 0)
        return ckpt_err(&s->err, CKPT_ERR_FORMAT, "empty file");
    int legacy = len >= sizeof LEGACY_MAGIC && memcmp(buf, LEGACY_MAGIC, sizeof LEGACY_MAGIC) == 0;
    if (!legacy && !pickle_start(buf[0]) && !only_torch)
        return ckpt_err(&s->err, CKPT_ERR_FORMAT, "not a checkpoint or a pickle (first byte "
                        "0x%02x)", buf[0]);
    stream_walk sw = {.s = s, .only_torch = only_torch, .legacy = legacy, .feed = feed,
                      .how = how, .crossed = crossed};
    ckpt_arena_init(&sw.arena);
    ckpt_walk w = {.pickle = stream_on_pickle, .user = &sw, .follow_calls = true};
    ckpt_source src = {.fd = fd, .file_size = len, .path = (char *)s->path};
    ckpt_error werr = {0};
    int rc = ckpt_format_pth_legacy.walk(&w, &src, &werr);
    ckpt_arena_release(&sw.arena);
    if (w.called >= 0 && w.called_data)
        ambiguity(s, "pickle %d (%s): its value is made by a call (or is a global), which "
                  "torch.load (weights_only=False) runs and compares with %s; ckpt does not "
                  "run it, so the pickles after it are scanned as torch reads them if it "
                  "passes", w.called + 1, w.called ? "protocol version" : "magic number",
                  w.called ? "1001" : "its legacy magic number");
    int torch_chain = w.called != 0; /* still on the pickles torch.load reads (a magic
                                      * number made by a call: perhaps) */
    if (rc != CKPT_OK && rc != CKPT_WALK_STOP && !w.stop.exception) {
        if (werr.code) /* the walk's own error (a callback's is in s->err) */
            s->err = werr;
        return rc;
    }
    if (w.stop.exception) {
        /* torch.load stops here: "Invalid magic number" / protocol version */
        if (only_torch || w.stop.pickle > 0)
            return ckpt_err(&s->err, CKPT_ERR_FORMAT, "%s: torch.load stops after it (not %s)",
                            sw.name, w.stop.expected);
        torch_chain = 0; /* a plain pickle file: go on as pickle.load would */
        size_t at = (size_t)w.stop.offset;
        for (int k = 1; at < len; k++) {
            char name[96];
            snprintf(name, sizeof name, "pickle %d (from byte %zu%s)", k + 1, at, how);
            if (!pickle_start(buf[at]))
                break; /* trailing bytes, which pickle.load never reads */
            size_t used = 0;
            CKPT_FORWARD(stream_pickle(s, name, at, buf + at, len - at, true, NULL, NULL, feed,
                                       crossed, &used));
            at += used;
        }
    }
    s->format = torch_chain ? CKPT_FORMAT_PTH_LEGACY : CKPT_FORMAT_UNKNOWN;
    s->is_pickle = !torch_chain;
    return CKPT_OK;
}

/*
 * The legacy loader's reading, every way CPython's C unpickler may read the
 * stream's frames: torch's file is a BufferedReader whose buffer size (the
 * file system's st_blksize) and boundaries decide whether a frame is peeked
 * (read on after it, and after a STOP inside it) or read whole (the rest
 * dropped there).  Each point where that matters is a choice; the readings
 * are walked depth first, all peeked first, then all read whole (an
 * io.BytesIO's reading, which may come again in the search), at most
 * FRAME_READINGS of them.
 * Any such point makes the file ambiguous: a reader other than torch's, or
 * torch on another file system, reads other pickles.
 */
enum { FRAME_READINGS = 16, FRAME_TODO = 256 };

static int scan_stream_frames(ckpt_scan *s, int fd, const uint8_t *buf, size_t len,
                              int only_torch)
{
    struct {
        uint64_t drops, fixed;
    } todo[FRAME_TODO];
    size_t ntodo = 1;
    todo[0].drops = todo[0].fixed = 0;
    unsigned runs = 0;
    bool more = false, crossed = false, stop = false;
    int rc0 = CKPT_OK;
    ckpt_error first = {0};
    ckpt_format seen = CKPT_FORMAT_UNKNOWN;
    int seen_pickle = 0;
    bool all_dropped = false;
    uint64_t n_all = UINT64_MAX; /* the points the all-read-whole reading met */
    while (ntodo > 0) {
        if (runs == FRAME_READINGS) {
            more = true;
            break;
        }
        /* second, when there is a choice: every frame read whole, as from an
         * io.BytesIO (torch.load(io.BytesIO(...))), which needs no search */
        bool second = runs == 1 && !all_dropped;
        if (!second)
            ntodo--;
        frame_choice fc = {.drops = second ? ~(uint64_t)0 : todo[ntodo].drops};
        uint64_t fixed = second ? UINT64_MAX : todo[ntodo].fixed;
        all_dropped |= second;
        uint64_t mask = fixed >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << fixed) - 1;
        if (!second && fixed == n_all && (fc.drops & mask) == mask)
            continue; /* that reading, made second */
        char how[48] = "";
        if (runs > 0)
            snprintf(how, sizeof how, ", frames: reading %u", runs + 1);
        ckpt_err_clear(&s->err);
        s->frames = &fc;
        int rc = scan_stream(s, fd, buf, len, only_torch, how);
        s->frames = NULL;
        if (runs == 0 || (rc != CKPT_OK && rc0 == CKPT_OK)) {
            rc0 = rc; /* the first reading's, or the first error */
            first = s->err;
        }
        if (runs == 0) {
            seen = s->format;
            seen_pickle = s->is_pickle;
        }
        runs++;
        if (second)
            n_all = fc.n;
        crossed |= fc.crossed;
        stop |= fc.stop;
        /* the points this reading met past FIXED, each read the other way */
        uint64_t n = fc.n < 64 ? fc.n : 64;
        more |= fc.n > 64;
        if (runs == 1 && fc.n == 0)
            break; /* the one reading there is */
        for (uint64_t j = n; fixed != UINT64_MAX && j-- > fixed;) {
            if (ntodo == FRAME_TODO) {
                more = true;
                break;
            }
            todo[ntodo].drops = fc.drops | (uint64_t)1 << j;
            todo[ntodo++].fixed = j + 1;
        }
    }
    s->format = seen;
    s->is_pickle = seen_pickle;
    s->err = first;
    if (crossed || stop)
        ambiguity(s, "a FRAME's bytes are read differently by CPython's unpickler as torch's "
                  "file is buffered (%s%s%s): %u readings scanned%s", crossed ?
                  "a read past the frame's end" : "", crossed && stop ? ", " : "", stop ?
                  "STOP with bytes of the frame after it, where the next pickle starts" : "",
                  runs, more ? " (not every reading: the others are not scanned)" : "");
    return rc0;
}

/* The safetensors reading: the header, validated as when reading (AS_ST:
 * whatever the first bytes say, for a zip that may be safetensors too). */
static int scan_safetensors(ckpt_scan *s, const char *path, bool as_st)
{
    ckpt_file *f = ckpt_file_new();
    if (!f)
        return ckpt_oom(&s->err);
    int rc = ckpt_file_set_limit(f, CKPT_LIMIT_HEADER_BYTES, s->limits[CKPT_LIMIT_HEADER_BYTES]);
    if (rc == CKPT_OK)
        rc = as_st ? ckpt_file_open_as(f, path, &ckpt_format_safetensors)
                   : ckpt_file_open(f, path);
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
    int fd;
    struct stat st;
    /* a FIFO or device: refused (exit 3), never read, so that it cannot block */
    if (ckpt_open_input(AT_FDCWD, path, false, &fd, &st, &s->err) != CKPT_OK) {
        if (s->err.code == CKPT_ERR_IO) { /* the system's word alone, as always */
            int e = errno;
            ckpt_err_clear(&s->err);
            ckpt_err(&s->err, CKPT_ERR_IO, "%s", strerror(e));
        }
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
        rc = scan_zip(s, fd, 0, (uint64_t)len, false, NULL);
        reading_end(s, rc, &primary);
        if (ckpt_format_safetensors.sniff(head, got)) {
            /* a zip whose first 8 bytes are also a header length: a polyglot
             * when safetensors reads it too (torch 2.x does for a
             * *.safetensors name, transformers picks files by that name) */
            reading_begin(s, "safetensors", WHO_ST, 0);
            rc = scan_safetensors(s, path, true);
            reading_end(s, rc, NULL);
            if (rc == CKPT_OK)
                ambiguity(s, "a zip checkpoint and a valid safetensors file at once: torch.load "
                          "reads the zip's tensors under any name but *.safetensors, "
                          "safetensors (and torch 2.x for a *.safetensors name, transformers by "
                          "file name) reads other tensors");
        }
        close(fd);
        s->err = primary;
        return primary.code;
    }
    {
        /* not a zip to torch, but perhaps to Python's zipfile and libzip (data
         * before the first local header): their reading is made too, when
         * any of them takes it for a zip */
        bool opened;
        reading_begin(s, "zip", WHO_ZIP_OTHERS, 0);
        rc = scan_zip(s, fd, 0, (uint64_t)len, false, &opened);
        if (opened) {
            reading_end(s, rc, NULL);
        } else {
            s->nreadings--; /* no reading: nothing of it was recorded */
            s->reading = NULL;
            ckpt_err_clear(&s->err);
        }
    }
    if (ckpt_format_pth_tar.claim(fd, (uint64_t)len, NULL)) {
        /* torch.load takes it for a tar before anything else; when a later
         * header fails it falls back to the pickle stream, made below too */
        reading_begin(s, "tar", WHO_TAR, 1);
        rc = scan_tar(s, fd, (uint64_t)len);
        reading_end(s, rc, &primary);
    }
    if (fmt == CKPT_FORMAT_SAFETENSORS) {
        reading_begin(s, "safetensors", WHO_ST, 1);
        rc = scan_safetensors(s, path, false);
        reading_end(s, rc, &primary);
    }
    /* mapped: only the pickles' pages are read, never the tensor data */
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return ckpt_err(&s->err, CKPT_ERR_IO, "%s", strerror(errno));
    }
    int tar = s->nreadings && strcmp(s->readings[0].reader, "tar") == 0;
    reading_begin(s, "pickle", WHO_STREAM, fmt != CKPT_FORMAT_SAFETENSORS && !tar);
    rc = scan_stream_frames(s, fd, map, len, fmt == CKPT_FORMAT_SAFETENSORS);
    reading_end(s, rc, &primary);
    munmap(map, len);
    close(fd);
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

/* One zip item at [AT, AT+LEN) of FD (the file, or a memfd of a frame's
 * bytes): DCP's reader hands torch.load those bytes alone, so torch's zip
 * reading is the only one (Python's zipfile and libzip never see an item). */
static int scan_item_zip(ckpt_scan *s, int fd, uint64_t at, uint64_t len, const char *label)
{
    s->item = label;
    int rc = scan_zip(s, fd, at, len, true, NULL);
    s->item = NULL;
    return rc;
}

static int scan_item(ckpt_walk *w, const ckpt_walk_record *r, uint64_t *size)
{
    (void)size;
    ckpt_scan *s = w->user;
    s->item_elsewhere = r->fd != s->file_fd;
    int rc = scan_item_zip(s, r->fd, r->base, r->size, r->label);
    s->item_elsewhere = false;
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
    ckpt_error primary = {0};
    reading_begin(s, "items", WHO_ITEMS, 1);
    /* DCP's walk of the data file: each item, a zstd frame's decoded */
    s->file_fd = fd;
    ckpt_walk w = {.record = scan_item, .user = s,
                   .pickle_limit = s->limits[CKPT_LIMIT_PICKLE_BYTES]};
    ckpt_source src = {.fd = fd, .file_size = n, .path = (char *)path};
    int rc = ckpt_format_dcp.walk(&w, &src, &s->err);
    reading_end(s, rc, &primary);
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
size_t ckpt_scan_code_count(const ckpt_scan *s) { return s->ncode; }
const char *ckpt_scan_code_at(const ckpt_scan *s, size_t i)
{
    return i < s->ncode ? s->code[i] : NULL;
}
size_t ckpt_scan_ambiguity_count(const ckpt_scan *s) { return s->nambiguities; }
const char *ckpt_scan_ambiguity_at(const ckpt_scan *s, size_t i)
{
    return i < s->nambiguities ? s->ambiguities[i] : NULL;
}
