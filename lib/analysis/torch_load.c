/* torch_load.c - "will it load?": what a plain weights-only torch.load(f)
 * does with a file, for torch 2.15 ("2.6+") and torch 1.13, modelled from
 * their torch/serialization.py: the dispatch (a .safetensors name, a zip,
 * else the legacy stream), the zip reader's checks (prefix, version record,
 * TorchScript, byteorder), then each pickle through the unpickler model
 * (analysis/weights_only.c) with the loader's persistent ids and records.
 * When torch refuses, the fix is the ckpt command that rewrites the file
 * into one it accepts (tried: the pickle ckpt would write is walked too),
 * else the add_safe_globals line that works. */
#include "analysis/analysis.h"
#include "container/container.h"

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

typedef struct verdict {
    ckpt_torch_verdict pub;
    char global[256], pickle[128], opname[32];
    char *message, *reason, *fix, *note, *malformed;
    char **refused; /* every global it refuses, first one first (for the fix) */
    size_t nrefused;
    char blocked[256]; /* the first of them in a blocked module, or "" */
    char devices[128]; /* storage locations other than cpu */
} verdict;

struct ckpt_torch_load {
    ckpt_error err;
    uint64_t limits[CKPT_LIMIT_COUNT_];
    verdict v[CKPT_TORCH_COUNT_];
    bool done;
    bool tar; /* the file is torch 0.1's tar (tarfile.open accepts it) */
    int oom;
};

static const char UNSAFE_2_15[] =
    "In PyTorch 2.6, we changed the default value of the `weights_only` argument in "
    "`torch.load` from `False` to `True`. Re-running `torch.load` with `weights_only` set to "
    "`False` will likely succeed, but it can result in arbitrary code execution. Do it only if "
    "you got the file from a trusted source.";
static const char DOCS_2_15[] =
    "\n\nCheck the documentation of torch.load to learn more about types accepted by default "
    "with weights_only https://pytorch.org/docs/stable/generated/torch.load.html.";
static const char UNSAFE_1_13[] =
    "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will "
    "likely succeed, but it can result in arbitrary code execution.Do it only if you get the "
    "file from a trusted source. WeightsUnpickler error: ";

ckpt_torch_load *ckpt_torch_load_new(void)
{
    ckpt_torch_load *t = calloc(1, sizeof *t);
    ckpt_file *f = ckpt_file_new(); /* for the default limits */
    if (!t || !f) {
        free(t);
        ckpt_file_free(f);
        return NULL;
    }
    for (int i = 0; i < CKPT_LIMIT_COUNT_; i++)
        t->limits[i] = ckpt_file_limit(f, (ckpt_limit)i);
    ckpt_file_free(f);
    return t;
}

static void verdict_clear(verdict *v)
{
    free(v->message);
    free(v->reason);
    free(v->fix);
    free(v->note);
    free(v->malformed);
    for (size_t i = 0; i < v->nrefused; i++)
        free(v->refused[i]);
    free(v->refused);
    memset(v, 0, sizeof *v);
}

void ckpt_torch_load_free(ckpt_torch_load *t)
{
    if (!t)
        return;
    for (int i = 0; i < CKPT_TORCH_COUNT_; i++)
        verdict_clear(&t->v[i]);
    free(t);
}

const ckpt_torch_verdict *ckpt_torch_load_verdict(const ckpt_torch_load *t, ckpt_torch which)
{
    return t && t->done && which >= 0 && which < CKPT_TORCH_COUNT_ ? &t->v[which].pub : NULL;
}

const char *ckpt_torch_load_error_message(const ckpt_torch_load *t) { return t->err.msg; }

static char *xprintf(ckpt_torch_load *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *xprintf(ckpt_torch_load *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) {
        s = NULL;
        t->oom = 1;
    }
    va_end(ap);
    return s;
}

/* ---- what torch.load prints ------------------------------------------------ */

/* torch.load's message for EXC(REASON) raised FROM_UNPICKLING (inside the
 * try around _load/_legacy_load): 2.15's _get_wo_message for UnpicklingError,
 * 1.13's UNSAFE_MESSAGE prefix for RuntimeError; anything else as raised. */
static void set_message(ckpt_torch_load *t, verdict *v, ckpt_torch which, const char *exc,
                        const char *reason, bool from_unpickling)
{
    v->reason = xprintf(t, "%s", reason);
    v->pub.exception = exc;
    if (from_unpickling && which == CKPT_TORCH_1_13 && strcmp(exc, "RuntimeError") == 0) {
        v->pub.exception = "UnpicklingError";
        v->message = xprintf(t, "%s%s", UNSAFE_1_13, reason);
    } else if (from_unpickling && which == CKPT_TORCH_2_6 && strcmp(exc, "UnpicklingError") == 0) {
        if (strstr(reason, " was not an allowed global by default."))
            v->message = xprintf(t,
                "Weights only load failed. This file can still be loaded, to do so you have two "
                "options, \033[1mdo those steps only if you trust the source of the checkpoint"
                "\033[0m. \n\t(1) %s\n\t(2) Alternatively, to load with `weights_only=True` please "
                "check the recommended steps in the following error message.\n\tWeightsUnpickler "
                "error: %s%s", UNSAFE_2_15, reason, DOCS_2_15);
        else if (strstr(reason, " must be imported to load"))
            v->message = xprintf(t, "Weights only load failed. %s\n %s\n%s", reason, UNSAFE_2_15,
                                 DOCS_2_15);
        else if (strstr(reason, "is blocked"))
            v->message = xprintf(t, "Weights only load failed. %s\n\n\n%s%s", UNSAFE_2_15, reason,
                                 DOCS_2_15);
        else
            v->message = xprintf(t,
                "Weights only load failed. %s\nPlease file an issue with the following so that "
                "we can make `weights_only=True` compatible with your use case: WeightsUnpickler "
                "error: \n\n%s%s", UNSAFE_2_15, reason, DOCS_2_15);
    } else {
        v->message = xprintf(t, "%s", reason);
    }
}

/* A container-level refusal (before or around the pickle). */
static void refuse_container(ckpt_torch_load *t, verdict *v, ckpt_torch which, const char *exc,
                             const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void refuse_container(ckpt_torch_load *t, verdict *v, ckpt_torch which, const char *exc,
                             const char *fmt, ...)
{
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    v->pub.accepted = 0;
    v->pub.stop = "container";
    v->pub.opcode = -1;
    set_message(t, v, which, exc, reason, false);
}

/* ---- walking a file's pickles ------------------------------------------------ */

typedef struct zip_index {
    ckpt_zip *z;
    const char *prefix;
    char **lower;   /* record names lowercased (miniz finds them case-insensitively), sorted */
    int64_t *idx;
    size_t n;
} zip_index;

typedef struct tar_walk tar_walk;

typedef struct walk_user {
    ckpt_torch_load *t;
    verdict *v;
    zip_index *zi;
    tar_walk *tw; /* the tar's main pickle (1.13): its keys */
} walk_user;

static int tar_key(void *user, const char *key);

static int cmp_lower(const void *a, const void *b, void *arg);

static int64_t zi_find(const zip_index *zi, const char *name)
{
    size_t lo = 0, hi = zi->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcasecmp(zi->lower[mid], name);
        if (c == 0)
            return zi->idx[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int on_record(void *user, const char *key, uint64_t *size)
{
    walk_user *u = user;
    char name[512];
    snprintf(name, sizeof name, "%s/data/%s", u->zi->prefix, key);
    int64_t i = zi_find(u->zi, name);
    if (i < 0)
        return 0;
    *size = ckpt_zip_size(u->zi->z, i);
    return 1;
}

static void on_location(void *user, const char *loc)
{
    walk_user *u = user;
    char *d = u->v->devices;
    if (strcmp(loc, "cpu") == 0 || strlen(d) + strlen(loc) + 3 >= sizeof u->v->devices)
        return;
    /* once each, comma-separated */
    for (const char *s = d; (s = strstr(s, loc)); s++)
        if ((s == d || s[-1] == ' ') && (s[strlen(loc)] == ',' || s[strlen(loc)] == 0))
            return;
    if (*d)
        strcat(d, ", ");
    strcat(d, loc);
}

static void add_refused(walk_user *u, const char *q, bool blocked)
{
    verdict *v = u->v;
    for (size_t i = 0; i < v->nrefused; i++)
        if (strcmp(v->refused[i], q) == 0)
            return;
    char **n = realloc(v->refused, (v->nrefused + 1) * sizeof *n);
    if (!n || !(n[v->nrefused] = strdup(q))) {
        if (n)
            v->refused = n;
        u->t->oom = 1;
        return;
    }
    v->refused = n;
    v->nrefused++;
    if (blocked && !v->blocked[0])
        snprintf(v->blocked, sizeof v->blocked, "%s", q);
}

static void on_refused(void *user, const char *q, bool blocked) { add_refused(user, q, blocked); }

/* Walk one pickle; *STOPPED when torch stops in it (the verdict is filled). */
static int walk_pickle(ckpt_torch_load *t, verdict *v, ckpt_torch which, const char *name,
                       const uint8_t *buf, size_t len, unsigned pid_fields, zip_index *zi,
                       tar_walk *tw, ckpt_wo_result *r, bool *stopped)
{
    walk_user u = {t, v, zi, tw};
    ckpt_wo_ctx ctx = {
        .torch = which == CKPT_TORCH_1_13 ? CKPT_WO_1_13 : CKPT_WO_2_15,
        .limits = t->limits,
        .pid_fields = pid_fields,
        .record = zi ? on_record : NULL,
        .check_size = which == CKPT_TORCH_2_6, /* 1.13 read whatever the record held */
        .on_location = on_location,
        .on_refused = on_refused,
        .tar_key = tw ? tar_key : NULL,
        .user = &u,
    };
    CKPT_FORWARD(ckpt_wo_walk(&ctx, buf, len, r, &t->err));
    *stopped = r->stop != CKPT_WO_OK;
    if (!*stopped)
        return CKPT_OK;
    static const char *const stops[] = {NULL, "global", "opcode", "value", "storage"};
    v->pub.accepted = 0;
    v->pub.stop = stops[r->stop];
    v->pub.opcode = r->opcode;
    v->pub.offset = r->offset;
    snprintf(v->pickle, sizeof v->pickle, "%s", name);
    v->pub.pickle = v->pickle;
    if (r->opcode >= 0) {
        snprintf(v->opname, sizeof v->opname, "%s", ckpt_pickle_op_name(r->opcode));
        v->pub.opcode_name = v->opname;
    }
    if (r->stop == CKPT_WO_GLOBAL) {
        snprintf(v->global, sizeof v->global, "%s", r->global);
        v->pub.global = v->global;
        /* the first refused global heads the list the fix names */
        char **n = realloc(v->refused, (v->nrefused + 1) * sizeof *n);
        char *g = strdup(r->global);
        if (!n || !g) {
            free(g);
            if (n)
                v->refused = n;
            return ckpt_err(&t->err, CKPT_ERR_NOMEM, "out of memory");
        }
        memmove(n + 1, n, v->nrefused * sizeof *n);
        n[0] = g;
        v->refused = n;
        v->nrefused++;
        if (r->blocked)
            snprintf(v->blocked, sizeof v->blocked, "%s", r->global);
    }
    set_message(t, v, which, r->exception, r->msg, true);
    return CKPT_OK;
}

/* ---- the zip path (torch >= 1.6 files) ---------------------------------------- */

static int cmp_lower(const void *a, const void *b, void *arg)
{
    const zip_index *zi = arg;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return strcasecmp(zi->lower[i], zi->lower[j]);
}

static void zi_free(zip_index *zi)
{
    free(zi->lower);
    free(zi->idx);
}

static int zi_build(ckpt_torch_load *t, zip_index *zi)
{
    size_t n = (size_t)ckpt_zip_count(zi->z);
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    zi->lower = malloc((n ? n : 1) * sizeof *zi->lower);
    zi->idx = malloc((n ? n : 1) * sizeof *zi->idx);
    if (!order || !zi->lower || !zi->idx) {
        free(order);
        return ckpt_err(&t->err, CKPT_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const char *name = ckpt_zip_name(zi->z, (int64_t)i);
        zi->lower[i] = (char *)(name ? name : "");
        order[i] = i;
    }
    qsort_r(order, n, sizeof *order, cmp_lower, zi);
    char **lower = malloc((n ? n : 1) * sizeof *lower);
    if (!lower) {
        free(order);
        return ckpt_err(&t->err, CKPT_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        lower[i] = zi->lower[order[i]];
        zi->idx[i] = (int64_t)order[i];
    }
    free(zi->lower);
    zi->lower = lower;
    zi->n = n;
    free(order);
    return CKPT_OK;
}

/* A small record's text (version, byteorder), NUL-terminated, or NULL. */
static char *small_record(ckpt_torch_load *t, ckpt_zip *z, int64_t i)
{
    uint8_t *buf;
    size_t len;
    ckpt_error e = {0};
    if (ckpt_zip_read_all(z, i, 64, &buf, &len, &e) != CKPT_OK)
        return NULL;
    char *s = xprintf(t, "%.*s", (int)len, (const char *)buf);
    free(buf);
    return s;
}

static int zip_verdict(ckpt_torch_load *t, ckpt_torch which, int fd)
{
    verdict *v = &t->v[which];
    ckpt_zip *z;
    int rc = ckpt_zip_open(fd, &z, &t->err);
    if (rc != CKPT_OK)
        return rc;
    zip_index zi = {.z = z};
    char prefix[256] = "", name[512];
    rc = zi_build(t, &zi);
    int64_t n = ckpt_zip_count(z);
    const char *first = n > 0 ? ckpt_zip_name(z, 0) : NULL;
    const char *slash = first ? strchr(first, '/') : NULL;
    if (rc != CKPT_OK)
        goto out;
    if (!first) {
        refuse_container(t, v, which, "RuntimeError", "PytorchStreamReader failed reading zip "
                         "archive: the archive has no records");
        goto out;
    }
    if (!slash) { /* the prefix is the first name up to its first '/' */
        refuse_container(t, v, which, "RuntimeError",
                         "file in archive is not in a subdirectory: %s", first);
        goto out;
    }
    snprintf(prefix, sizeof prefix, "%.*s", (int)(slash - first), first);
    zi.prefix = prefix;
    snprintf(name, sizeof name, "%s/.data/version", prefix);
    int64_t vi = zi_find(&zi, name);
    if (vi < 0) {
        snprintf(name, sizeof name, "%s/version", prefix);
        vi = zi_find(&zi, name);
    }
    if (vi < 0) {
        refuse_container(t, v, which, "RuntimeError", "Expected hasRecord(\"version\") to be true");
        goto out;
    }
    char *ver = small_record(t, z, vi);
    char *end = NULL;
    unsigned long long version = ver ? strtoull(ver, &end, 10) : 0;
    bool parsed = ver && end != ver && !strchr(ver, '-');
    free(ver);
    if (!parsed || version < 1 || version > 10) {
        refuse_container(t, v, which, "RuntimeError",
                         "Attempted to read a PyTorch file with version %llu, but the %s supported "
                         "version for reading is %d", version, version < 1 ? "minimum" : "maximum",
                         version < 1 ? 1 : 10);
        goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *nm = ckpt_zip_name(z, i);
        size_t pl = strlen(prefix);
        if (!nm || strncmp(nm, prefix, pl) != 0 || nm[pl] != '/') {
            refuse_container(t, v, which, "RuntimeError",
                             "file in archive is not in a subdirectory %s/: %s", prefix,
                             nm ? nm : "");
            goto out;
        }
    }
    snprintf(name, sizeof name, "%s/constants.pkl", prefix);
    if (zi_find(&zi, name) >= 0) {
        if (which == CKPT_TORCH_2_6) {
            refuse_container(t, v, which, "RuntimeError",
                             "Cannot use ``weights_only=True`` with TorchScript archives passed to "
                             "``torch.load``. %s", UNSAFE_2_15);
        } else { /* 1.13 hands it to torch.jit.load, weights_only or not */
            v->pub.accepted = 1;
            v->pub.via = "torch.jit.load";
            v->note = xprintf(t, "a TorchScript archive: torch 1.13 passes it to torch.jit.load "
                              "even with weights_only=True (not a weights-only load)");
        }
        goto out;
    }
    if (which == CKPT_TORCH_2_6) { /* 2.15 reads byteorder; 1.13 never did */
        snprintf(name, sizeof name, "%s/byteorder", prefix);
        int64_t bi = zi_find(&zi, name);
        char *bo = bi >= 0 ? small_record(t, z, bi) : NULL;
        if (bo && strcmp(bo, "little") != 0 && strcmp(bo, "big") != 0) {
            refuse_container(t, v, which, "ValueError", "Unknown endianness type: %s", bo);
            free(bo);
            goto out;
        }
        free(bo);
    }
    snprintf(name, sizeof name, "%s/data.pkl", prefix);
    int64_t di = zi_find(&zi, name);
    if (di < 0) {
        refuse_container(t, v, which, "RuntimeError",
                         "PytorchStreamReader failed locating file data.pkl: file not found");
        goto out;
    }
    uint8_t *buf;
    size_t len;
    rc = ckpt_zip_read_all(z, di, t->limits[CKPT_LIMIT_PICKLE_BYTES], &buf, &len, &t->err);
    if (rc != CKPT_OK)
        goto out;
    ckpt_wo_result r;
    bool stopped;
    const char *pname = ckpt_zip_name(z, di);
    rc = walk_pickle(t, v, which, pname, buf, len, 5, &zi, NULL, &r, &stopped);
    free(buf);
    if (rc == CKPT_OK && !stopped)
        v->pub.accepted = 1;
out:
    zi_free(&zi);
    ckpt_zip_close(z);
    return rc;
}

/* ---- the legacy path (pre-1.6 files, and whatever is neither zip nor a
 * .safetensors name: torch tries it as a legacy stream) ---------------------------- */

static int stream_verdict(ckpt_torch_load *t, ckpt_torch which, const uint8_t *buf, size_t len)
{
    /* 0x1950a86a20f9469cfc6c little-endian, as LONG1 holds it */
    static const uint8_t magic[] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    static const char *const names[] = {"magic number", "protocol version", "sys_info",
                                        "data pickle", "storage keys"};
    verdict *v = &t->v[which];
    size_t at = 0;
    for (int k = 0; k < 5; k++) {
        char name[64];
        snprintf(name, sizeof name, "pickle %d (%s)", k + 1, names[k]);
        ckpt_wo_result r;
        bool stopped;
        CKPT_FORWARD(walk_pickle(t, v, which, name, buf + at, len - at, k == 3 ? 6 : 0, NULL,
                                 NULL, &r, &stopped));
        if (stopped)
            return CKPT_OK;
        at += r.consumed;
        if (k == 0 && !(r.top_long_len == sizeof magic && memcmp(r.top_long, magic, sizeof magic) == 0)) {
            refuse_container(t, v, which, "RuntimeError", "Invalid magic number; corrupt file?");
            break;
        }
        if (k == 1 && !(r.top_kind == 1 && r.top_int == 1001)) {
            refuse_container(t, v, which, "RuntimeError", "Invalid protocol version: %lld",
                             (long long)r.top_int);
            break;
        }
    }
    if (v->pub.stop) {
        /* legacy header checks sit inside 1.13's try: wrapped like the unpickler's */
        if (which == CKPT_TORCH_1_13) {
            char *reason = v->reason;
            v->reason = NULL;
            free(v->message);
            v->message = NULL;
            set_message(t, v, which, "RuntimeError", reason ? reason : "", true);
            free(reason);
        }
        return CKPT_OK;
    }
    v->pub.accepted = 1;
    return CKPT_OK;
}

/* ---- the tar path under 1.13 (torch <= 0.1 files): its legacy_load, which
 * reads the members 'storages', 'tensors' and 'pickle' with the weights-only
 * unpickler, in that order, keeping deserialized_objects by key ------------- */

struct tar_walk {
    ckpt_torch_load *t;
    verdict *v;
    const uint8_t *map;
    uint64_t size;
    ckpt_arena arena;
    char **keys;     /* deserialized_objects: open addressing on the key text */
    size_t *klen;
    uint8_t *kind;   /* 1 a storage, 2 a tensor */
    ckpt_dtype *dtype;
    size_t cap, n;
    bool done;       /* the verdict is set */
    bool fallback;   /* a TarError: torch reads the file as a pickle stream */
};

static const char *py_type(const ckpt_value *x)
{
    static const char *const names[] = {"NoneType", "bool", "int", "float", "str", "bytes",
                                        "list", "tuple", "dict", "set", "frozenset", "type",
                                        "object", "Tensor", "TypedStorage"};
    return x->kind < sizeof names / sizeof *names ? names[x->kind] : "object";
}

static void tar_refuse(tar_walk *tw, const char *stop, const char *exc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void tar_refuse(tar_walk *tw, const char *stop, const char *exc, const char *fmt, ...)
{
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    tw->v->pub.accepted = 0;
    tw->v->pub.stop = stop;
    tw->v->pub.opcode = -1;
    /* all of _legacy_load runs inside 1.13's try: a RuntimeError gets its prefix */
    set_message(tw->t, tw->v, CKPT_TORCH_1_13, exc, reason, true);
    tw->done = true;
}

/* A value the model does not follow (the result of a call): said, not guessed. */
static void tar_unknown(tar_walk *tw, const char *what)
{
    tar_refuse(tw, "value", "unknown", "not modelled: %s is the result of a call", what);
    tw->v->malformed = xprintf(tw->t, "not modelled: %s is the result of a call, which ckpt "
                               "does not follow", what);
}

/* The decimal of a little-endian two's complement int. */
static void big_decimal(const uint8_t *le, size_t n, char *out, size_t cap)
{
    uint8_t *mag = malloc(n ? n : 1);
    if (!mag || n == 0 || cap < 3) {
        free(mag);
        snprintf(out, cap, "0");
        return;
    }
    bool neg = le[n - 1] & 0x80;
    unsigned carry = 1;
    for (size_t i = 0; i < n; i++) { /* big-endian magnitude */
        unsigned b = neg ? (uint8_t)~le[i] + carry : le[i];
        carry = neg ? b >> 8 : 0;
        mag[n - 1 - i] = (uint8_t)b;
    }
    size_t o = 0;
    char *d = out + 1;
    for (;;) { /* divide by 10 until zero; digits come out reversed */
        unsigned rem = 0;
        bool nz = false;
        for (size_t i = 0; i < n; i++) {
            unsigned cur = rem << 8 | mag[i];
            mag[i] = (uint8_t)(cur / 10);
            rem = cur % 10;
            nz |= mag[i] != 0;
        }
        if (o + 3 < cap)
            d[o++] = (char)('0' + rem);
        if (!nz)
            break;
    }
    free(mag);
    for (size_t i = 0; i < o / 2; i++) {
        char c = d[i];
        d[i] = d[o - 1 - i];
        d[o - 1 - i] = c;
    }
    d[o] = 0;
    if (neg)
        out[0] = '-';
    else
        memmove(out, d, o + 1);
}

/* A dict key as Python hashes and compares it, as text: "i:12" (ints, bools
 * and integral floats are equal), "s:..." (str), "b:..." (bytes), "n"; a key
 * that equals nothing else here (a tuple, a class) gets a unique text; false
 * with the verdict set for an unhashable one. */
static bool key_text(tar_walk *tw, const ckpt_value *x, char *buf, size_t cap, size_t *len)
{
    switch (x->kind) {
    case CKPT_KIND_BOOL:
        *len = (size_t)snprintf(buf, cap, "i:%d", x->u.b != 0);
        return true;
    case CKPT_KIND_INT:
        if (x->u.i.big) {
            memcpy(buf, "i:", 2);
            big_decimal(x->u.i.bytes, x->u.i.nbytes, buf + 2, cap - 2);
            *len = strlen(buf);
        } else {
            *len = (size_t)snprintf(buf, cap, "i:%lld", (long long)x->u.i.v);
        }
        return true;
    case CKPT_KIND_FLOAT:
        if (x->u.f == (double)(int64_t)x->u.f && x->u.f > -9.2e18 && x->u.f < 9.2e18)
            *len = (size_t)snprintf(buf, cap, "i:%lld", (long long)x->u.f);
        else
            *len = (size_t)snprintf(buf, cap, "f:%a", x->u.f);
        return true;
    case CKPT_KIND_STR:
    case CKPT_KIND_BYTES:
        if (x->u.s.len + 3 > cap) { /* too long to be any key torch wrote: equal to none */
            *len = (size_t)snprintf(buf, cap, "o:%p", (const void *)x);
            return true;
        }
        buf[0] = x->kind == CKPT_KIND_STR ? 's' : 'b';
        buf[1] = ':';
        memcpy(buf + 2, x->u.s.s, x->u.s.len);
        *len = x->u.s.len + 2;
        return true;
    case CKPT_KIND_NONE:
        *len = (size_t)snprintf(buf, cap, "n");
        return true;
    case CKPT_KIND_LIST:
    case CKPT_KIND_DICT:
    case CKPT_KIND_SET:
        tar_refuse(tw, "value", "TypeError", "unhashable type: '%s'", py_type(x));
        return false;
    default:
        *len = (size_t)snprintf(buf, cap, "o:%p", (const void *)x);
        return true;
    }
}

static uint64_t key_hash(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)k[i]) * 1099511628211ULL;
    return h;
}

static size_t *key_slot(tar_walk *tw, const char *k, size_t n, size_t *slot)
{
    for (size_t i = key_hash(k, n) & (tw->cap - 1);; i = (i + 1) & (tw->cap - 1))
        if (!tw->keys[i] || (tw->klen[i] == n && memcmp(tw->keys[i], k, n) == 0)) {
            *slot = i;
            return slot;
        }
}

/* deserialized_objects[KEY] = an object of KIND; 0, or an error code */
static int key_set(tar_walk *tw, const char *k, size_t n, uint8_t kind, ckpt_dtype dt)
{
    if (2 * (tw->n + 1) > tw->cap) {
        size_t cap = tw->cap ? 2 * tw->cap : 64;
        tar_walk old = *tw;
        tw->keys = calloc(cap, sizeof *tw->keys);
        tw->klen = calloc(cap, sizeof *tw->klen);
        tw->kind = calloc(cap, sizeof *tw->kind);
        tw->dtype = calloc(cap, sizeof *tw->dtype);
        if (!tw->keys || !tw->klen || !tw->kind || !tw->dtype) {
            free(tw->keys), free(tw->klen), free(tw->kind), free(tw->dtype);
            tw->keys = old.keys, tw->klen = old.klen, tw->kind = old.kind, tw->dtype = old.dtype;
            return ckpt_err(&tw->t->err, CKPT_ERR_NOMEM, "out of memory");
        }
        tw->cap = cap;
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i]) {
                size_t j;
                key_slot(tw, old.keys[i], old.klen[i], &j);
                tw->keys[j] = old.keys[i], tw->klen[j] = old.klen[i];
                tw->kind[j] = old.kind[i], tw->dtype[j] = old.dtype[i];
            }
        free(old.keys), free(old.klen), free(old.kind), free(old.dtype);
    }
    size_t i;
    key_slot(tw, k, n, &i);
    if (!tw->keys[i]) {
        char *c = ckpt_arena_alloc(&tw->arena, n + 1);
        if (!c)
            return ckpt_err(&tw->t->err, CKPT_ERR_NOMEM, "out of memory");
        memcpy(c, k, n);
        c[n] = 0;
        tw->keys[i] = c;
        tw->klen[i] = n;
        tw->n++;
    }
    tw->kind[i] = kind;
    tw->dtype[i] = dt;
    return CKPT_OK;
}

/* deserialized_objects[KEY]: the slot, or -1 */
static ssize_t key_get(tar_walk *tw, const char *k, size_t n)
{
    size_t i;
    if (!tw->cap)
        return -1;
    key_slot(tw, k, n, &i);
    return tw->keys[i] ? (ssize_t)i : -1;
}

/* str(KeyError(key)): the key's repr */
static void key_error(tar_walk *tw, const ckpt_value *x)
{
    char buf[300];
    size_t n;
    if (x->kind == CKPT_KIND_STR || x->kind == CKPT_KIND_BYTES)
        tar_refuse(tw, "storage", "KeyError", "%s'%.*s'", x->kind == CKPT_KIND_BYTES ? "b" : "",
                   (int)(x->u.s.len > 200 ? 200 : x->u.s.len), x->u.s.s);
    else if (x->kind == CKPT_KIND_NONE)
        tar_refuse(tw, "storage", "KeyError", "None");
    else if (x->kind == CKPT_KIND_BOOL)
        tar_refuse(tw, "storage", "KeyError", "%s", x->u.b ? "True" : "False");
    else if (key_text(tw, x, buf, sizeof buf, &n))
        tar_refuse(tw, "storage", "KeyError", "%.*s", (int)(n > 2 ? n - 2 : n),
                   buf[0] == 'i' ? buf + 2 : buf);
}

static int tar_key(void *user, const char *key)
{
    tar_walk *tw = ((walk_user *)user)->tw;
    char buf[4400];
    size_t n = (size_t)snprintf(buf, sizeof buf, "i:%s", key);
    ssize_t i = key_get(tw, buf, n < sizeof buf ? n : sizeof buf - 1);
    return i < 0 ? 0 : tw->kind[i];
}

static ckpt_global_class tar_classify(void *user, const char *q)
{
    (void)user, (void)q; /* the weights-only walk admitted every one first */
    return CKPT_GLOBAL_KNOWN_DATA;
}
static void tar_on_global(void *u, const char *q, ckpt_global_class c, int op, uint64_t at)
{
    (void)u, (void)q, (void)c, (void)op, (void)at;
}
static void tar_on_use(void *u, const char *q, int op, uint64_t at)
{
    (void)u, (void)q, (void)op, (void)at;
}

/* pickle_module.load(f) at *POS of BASE[0..LEN): the weights-only walk (the
 * verdict when torch stops there), then the value it made. */
static int tar_load(tar_walk *tw, const char *name, const uint8_t *base, size_t len, size_t *pos,
                    ckpt_value **val)
{
    ckpt_wo_result r;
    bool stopped;
    *val = NULL;
    CKPT_FORWARD(walk_pickle(tw->t, tw->v, CKPT_TORCH_1_13, name, base + *pos, len - *pos, 0,
                             NULL, NULL, &r, &stopped));
    if (stopped) {
        tw->done = true;
        return CKPT_OK;
    }
    ckpt_pickle_ctx ctx = {
        .name = name, .limits = tw->t->limits, .classify = tar_classify, .user = tw,
        .arena = &tw->arena, .on_global = tar_on_global, .on_use = tar_on_use, .scan = true,
    };
    size_t used = 0;
    ckpt_error e = {0};
    if (ckpt_pickle_load(&ctx, base + *pos, r.consumed, val, &used, &e) != CKPT_OK || !*val) {
        tar_unknown(tw, name); /* the VM fails where the model went on: not guessed */
        return CKPT_OK;
    }
    *pos += r.consumed;
    return CKPT_OK;
}

/* range(N): an int; *N < 0 loops zero times, a big one until the data ends */
static bool tar_count(tar_walk *tw, const ckpt_value *x, int64_t *n)
{
    if (x->kind == CKPT_KIND_BOOL || (x->kind == CKPT_KIND_INT && !x->u.i.big)) {
        *n = x->kind == CKPT_KIND_BOOL ? x->u.b != 0 : x->u.i.v;
        return true;
    }
    if (x->kind == CKPT_KIND_INT) {
        *n = x->u.i.nbytes && (x->u.i.bytes[x->u.i.nbytes - 1] & 0x80) ? -1 : INT64_MAX;
        return true;
    }
    if (x->kind == CKPT_KIND_OBJECT || x->kind == CKPT_KIND_TENSOR)
        tar_unknown(tw, "a count");
    else
        tar_refuse(tw, "value", "TypeError", "'%s' object cannot be interpreted as an integer",
                   py_type(x));
    return false;
}

/* `a, b, ... = x` for N names: the items, or false with the verdict set */
static bool tar_unpack(tar_walk *tw, const ckpt_value *x, size_t n, ckpt_value ***items)
{
    size_t got;
    *items = NULL;
    switch (x->kind) {
    case CKPT_KIND_TUPLE:
    case CKPT_KIND_LIST:
        got = x->u.seq.len;
        *items = x->u.seq.items;
        break;
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
        got = x->u.seq.len;
        break;
    case CKPT_KIND_DICT:
        got = x->u.dict.keys.len;
        break;
    case CKPT_KIND_STR:
        got = 0;
        for (size_t i = 0; i < x->u.s.len; i++)
            got += ((uint8_t)x->u.s.s[i] & 0xc0) != 0x80; /* code points */
        break;
    case CKPT_KIND_BYTES:
        got = x->u.s.len;
        break;
    case CKPT_KIND_OBJECT:
    case CKPT_KIND_TENSOR:
        tar_unknown(tw, "a value unpacked");
        return false;
    default:
        tar_refuse(tw, "value", "TypeError", "cannot unpack non-iterable %s object", py_type(x));
        return false;
    }
    if (got < n)
        tar_refuse(tw, "value", "ValueError", "not enough values to unpack (expected %zu, got %zu)",
                   n, got);
    else if (got > n)
        tar_refuse(tw, "value", "ValueError", "too many values to unpack (expected %zu)", n);
    else if (!*items)
        tar_unknown(tw, "the items of a set, dict, str or bytes unpacked"); /* not followed */
    return got == n && *items;
}

/* tar.extract(NAME) then open(): the member's bytes, or false (verdict set,
 * or a fallback) */
static bool tar_member(tar_walk *tw, const ckpt_tar *tar, const char *name, bool extract,
                       const uint8_t **base, size_t *len)
{
    const ckpt_tar_member *m = ckpt_tar_find(tar, name);
    if (!m) {
        tar_refuse(tw, "container", "KeyError", "\"filename '%s' not found\"", name);
        return false;
    }
    if (m->type == '1' || m->type == '2') { /* tarfile looks the link's target up */
        tar_refuse(tw, "container", "KeyError", "\"linkname of '%s' not found\" (a link: "
                   "tarfile extracts its target, which the model does not follow)", name);
        return false;
    }
    if (!m->regular) {
        if (!extract) /* extractfile() gives None */
            tar_refuse(tw, "container", "AttributeError",
                       "'NoneType' object has no attribute 'readline'");
        else if (m->type == '5')
            tar_refuse(tw, "container", "IsADirectoryError", "[Errno 21] Is a directory: '%s'",
                       name);
        else
            tar_refuse(tw, "container", "OSError", "member '%s' is a device or a FIFO (type "
                       "'%c'): extract() makes a node, not a file", name, m->type);
        return false;
    }
    uint64_t avail = (uint64_t)m->data_offset >= tw->size ? 0 : tw->size - (uint64_t)m->data_offset;
    if (m->size_huge || m->size < 0 || (extract && (uint64_t)m->size > avail)) {
        tw->fallback = true; /* copying it ends early: ReadError, a TarError */
        return false;
    }
    *len = (size_t)((uint64_t)m->size < avail ? (uint64_t)m->size : avail);
    *base = tw->map + (*len ? m->data_offset : 0);
    return true;
}

/* torch.typename of the untyped storage, as default_restore_location names it */
static bool tar_location(tar_walk *tw, const ckpt_value *loc)
{
    walk_user u = {.t = tw->t, .v = tw->v};
    if (loc->kind != CKPT_KIND_STR) {
        /* 'cpu' == loc is false; _cuda_deserialize calls loc.startswith */
        tar_refuse(tw, "storage", "AttributeError", "'%s' object has no attribute 'startswith'",
                   py_type(loc));
        return false;
    }
    const char *s = loc->u.s.s;
    size_t n = loc->u.s.len;
    if ((n == 3 && memcmp(s, "cpu", 3) == 0) || (n == 4 && memcmp(s, "meta", 4) == 0))
        return true;
    if ((n >= 4 && memcmp(s, "cuda", 4) == 0) || (n >= 3 && memcmp(s, "mps", 3) == 0)) {
        char l[64];
        snprintf(l, sizeof l, "%.*s", (int)(n < 63 ? n : 63), s);
        on_location(&u, l); /* plain torch.load needs that device: the note says so */
        return true;
    }
    tar_refuse(tw, "storage", "RuntimeError", "don't know how to restore data location of "
               "torch.storage.UntypedStorage (tagged with %.*s)", (int)(n > 200 ? 200 : n), s);
    return false;
}

static int tar_storages(tar_walk *tw, const uint8_t *base, size_t len)
{
    size_t pos = 0;
    ckpt_value *x, **a;
    int64_t n;
    char name[64], key[300];
    size_t kl;
    CKPT_FORWARD(tar_load(tw, "tar:storages count", base, len, &pos, &x));
    if (tw->done || !tar_count(tw, x, &n))
        return CKPT_OK;
    for (int64_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "tar:storages pickle %lld", (long long)i + 1);
        CKPT_FORWARD(tar_load(tw, name, base, len, &pos, &x));
        if (tw->done || !tar_unpack(tw, x, 3, &a))
            return CKPT_OK;
        /* storage_type.dtype */
        const char *tn = NULL;
        ckpt_dtype dt = a[2]->kind == CKPT_KIND_GLOBAL
                            ? ckpt_storage_type_dtype(a[2]->u.global.name, &tn) : CKPT_DTYPE_UNKNOWN;
        if (dt == CKPT_DTYPE_UNKNOWN || !tn || strcmp(tn, "UntypedStorage") == 0) {
            if (a[2]->kind == CKPT_KIND_GLOBAL)
                tar_refuse(tw, "value", "AttributeError", "type object '%s' has no attribute "
                           "'dtype'", strrchr(a[2]->u.global.name, '.') + 1);
            else if (a[2]->kind == CKPT_KIND_OBJECT || a[2]->kind == CKPT_KIND_TENSOR)
                tar_unknown(tw, "a storage type");
            else
                tar_refuse(tw, "value", "AttributeError", "'%s' object has no attribute 'dtype'",
                           py_type(a[2]));
            return CKPT_OK;
        }
        /* UntypedStorage._new_with_file(f, element_size): an int64 count, its bytes */
        size_t es = ckpt_dtype_size(dt);
        if (len - pos < 8) {
            tar_refuse(tw, "storage", "RuntimeError", "unexpected EOF, expected %zu more bytes. "
                       "The file might be corrupted.", 8 - (len - pos));
            return CKPT_OK;
        }
        int64_t count = 0;
        for (int k = 7; k >= 0; k--)
            count = (int64_t)((uint64_t)count << 8 | base[pos + (size_t)k]);
        pos += 8;
        uint64_t nbytes;
        if (count < 0 || ckpt_mul_overflow((uint64_t)count, es, &nbytes) || nbytes > INT64_MAX) {
            tar_refuse(tw, "storage", "RuntimeError", "numel: integer multiplication overflow");
            return CKPT_OK;
        }
        if (nbytes > len - pos) {
            tar_refuse(tw, "storage", "RuntimeError", "unexpected EOF, expected %llu more bytes. "
                       "The file might be corrupted.", (unsigned long long)(nbytes - (len - pos)));
            return CKPT_OK;
        }
        pos += (size_t)nbytes;
        if (!tar_location(tw, a[1]) || !key_text(tw, a[0], key, sizeof key, &kl))
            return CKPT_OK;
        CKPT_FORWARD(key_set(tw, key, kl, 1, dt));
    }
    CKPT_FORWARD(tar_load(tw, "tar:storages views", base, len, &pos, &x));
    if (tw->done)
        return CKPT_OK;
    if (x->kind != CKPT_KIND_LIST && x->kind != CKPT_KIND_TUPLE) {
        if (x->kind == CKPT_KIND_OBJECT || x->kind == CKPT_KIND_TENSOR)
            tar_unknown(tw, "the storage view list");
        else if (x->kind == CKPT_KIND_DICT ? x->u.dict.keys.len
                 : x->kind == CKPT_KIND_SET || x->kind == CKPT_KIND_FROZENSET ? x->u.seq.len
                 : x->kind == CKPT_KIND_STR || x->kind == CKPT_KIND_BYTES ? x->u.s.len : 1) {
            if (x->kind == CKPT_KIND_STR || x->kind == CKPT_KIND_BYTES || x->kind == CKPT_KIND_DICT ||
                x->kind == CKPT_KIND_SET || x->kind == CKPT_KIND_FROZENSET)
                tar_unknown(tw, "the items of the storage view list");
            else
                tar_refuse(tw, "value", "TypeError", "'%s' object is not iterable", py_type(x));
        }
        return CKPT_OK; /* an empty one loops zero times */
    }
    for (size_t i = 0; i < x->u.seq.len; i++) {
        if (!tar_unpack(tw, x->u.seq.items[i], 4, &a))
            return CKPT_OK;
        if (!key_text(tw, a[1], key, sizeof key, &kl))
            return CKPT_OK;
        ssize_t r = key_get(tw, key, kl);
        if (r < 0) {
            key_error(tw, a[1]);
            return CKPT_OK;
        }
        ckpt_dtype dt = tw->dtype[r];
        /* offset * element_size, then a slice: ints (and bools) */
        for (int k = 2; k < 4; k++)
            if (a[k]->kind != CKPT_KIND_INT && a[k]->kind != CKPT_KIND_BOOL) {
                if (a[k]->kind == CKPT_KIND_OBJECT || a[k]->kind == CKPT_KIND_TENSOR)
                    tar_unknown(tw, "a view's offset or size");
                else
                    tar_refuse(tw, "value", "TypeError", "slice indices must be integers or None "
                               "or have an __index__ method");
                return CKPT_OK;
            }
        if (!key_text(tw, a[0], key, sizeof key, &kl))
            return CKPT_OK;
        CKPT_FORWARD(key_set(tw, key, kl, 1, dt));
    }
    return CKPT_OK;
}

static int tar_tensors(tar_walk *tw, const uint8_t *base, size_t len)
{
    size_t pos = 0;
    ckpt_value *x, **a;
    int64_t n;
    char name[64], key[300];
    size_t kl;
    CKPT_FORWARD(tar_load(tw, "tar:tensors count", base, len, &pos, &x));
    if (tw->done || !tar_count(tw, x, &n))
        return CKPT_OK;
    for (int64_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "tar:tensors pickle %lld", (long long)i + 1);
        CKPT_FORWARD(tar_load(tw, name, base, len, &pos, &x));
        if (tw->done || !tar_unpack(tw, x, 3, &a) || !key_text(tw, a[1], key, sizeof key, &kl))
            return CKPT_OK;
        ssize_t r = key_get(tw, key, kl);
        if (r < 0) {
            key_error(tw, a[1]);
            return CKPT_OK;
        }
        if (tw->kind[r] == 2) { /* storage._storage of a tensor: a method, set_ refuses it */
            tar_refuse(tw, "storage", "TypeError", "set_() received an invalid combination of "
                       "arguments - got (builtin_function_or_method, int, tuple, tuple)");
            return CKPT_OK;
        }
        ckpt_dtype dt = tw->dtype[r];
        /* ndim (<i), 4 bytes skipped, sizes and strides (<{ndim}q), offset (<q) */
        if (len - pos < 4) {
            tar_refuse(tw, "value", "error", "unpack requires a buffer of 4 bytes");
            return CKPT_OK;
        }
        int32_t ndim = (int32_t)((uint32_t)base[pos] | (uint32_t)base[pos + 1] << 8 |
                                 (uint32_t)base[pos + 2] << 16 | (uint32_t)base[pos + 3] << 24);
        pos += len - pos < 8 ? len - pos : 8;
        if (ndim < 0) {
            tar_refuse(tw, "value", "error", "bad char in struct format");
            return CKPT_OK;
        }
        int64_t dims[2][64] = {{0}};
        for (int k = 0; k < 2; k++) {
            uint64_t need = 8 * (uint64_t)ndim;
            if (need > len - pos) {
                tar_refuse(tw, "value", "error", "unpack requires a buffer of %llu bytes",
                           (unsigned long long)need);
                return CKPT_OK;
            }
            for (int32_t d = 0; d < ndim && d < 64; d++) {
                uint64_t q = 0;
                for (int b = 7; b >= 0; b--)
                    q = q << 8 | base[pos + 8 * (size_t)d + (size_t)b];
                dims[k][d] = (int64_t)q;
            }
            pos += (size_t)need;
        }
        if (len - pos < 8) {
            tar_refuse(tw, "value", "error", "unpack requires a buffer of 8 bytes");
            return CKPT_OK;
        }
        int64_t off = 0;
        for (int b = 7; b >= 0; b--)
            off = (int64_t)((uint64_t)off << 8 | base[pos + (size_t)b]);
        pos += 8;
        /* set_(storage, offset, size, stride): it grows a too small storage */
        bool neg_stride = false;
        for (int32_t d = 0; d < ndim && d < 64; d++) {
            if (dims[0][d] < 0) {
                tar_refuse(tw, "value", "RuntimeError", "numel: integer multiplication overflow");
                return CKPT_OK;
            }
            neg_stride |= dims[1][d] < 0 && dims[0][d] > 1;
        }
        if (off < 0) {
            tar_refuse(tw, "value", "RuntimeError", "Tensor: invalid storage offset %lld",
                       (long long)off);
            return CKPT_OK;
        }
        if (neg_stride) {
            char sz[512] = "", st[512] = "";
            for (int32_t d = 0; d < ndim && d < 16; d++) {
                size_t a = strlen(sz), b = strlen(st);
                snprintf(sz + a, sizeof sz - a, "%s%lld", d ? ", " : "", (long long)dims[0][d]);
                snprintf(st + b, sizeof st - b, "%s%lld", d ? ", " : "", (long long)dims[1][d]);
            }
            tar_refuse(tw, "value", "RuntimeError", "Storage size calculation overflowed with "
                       "sizes=[%s%s] and strides=[%s%s]", sz, ndim > 16 ? ", ..." : "", st,
                       ndim > 16 ? ", ..." : "");
            return CKPT_OK;
        }
        if (!key_text(tw, a[0], key, sizeof key, &kl))
            return CKPT_OK;
        CKPT_FORWARD(key_set(tw, key, kl, 2, dt));
    }
    return CKPT_OK;
}

/* 1.13 on a file ckpt_tar_probe says tarfile.open takes; *FALLBACK when a
 * TarError sends torch to the pickle stream instead. */
static int tar_verdict(ckpt_torch_load *t, int fd, const uint8_t *map, uint64_t size,
                       bool *fallback)
{
    tar_walk tw = {.t = t, .v = &t->v[CKPT_TORCH_1_13], .map = map, .size = size};
    ckpt_arena_init(&tw.arena);
    ckpt_tar *tar = NULL;
    bool fb = false;
    ckpt_error e = {0};
    int rc = ckpt_tar_open(fd, size, &tar, &fb, &e);
    *fallback = false;
    if (rc == CKPT_ERR_NOMEM) {
        t->err = e;
        goto out;
    }
    if (rc != CKPT_OK) {
        rc = CKPT_OK;
        if (fb)
            *fallback = true;
        else /* not a TarError: it reaches the caller as whatever tarfile raised */
            tar_refuse(&tw, "container", "unknown", "tarfile fails: %s", e.msg);
        goto out;
    }
    const uint8_t *base;
    size_t len;
    if (tar_member(&tw, tar, "storages", true, &base, &len))
        rc = tar_storages(&tw, base, len);
    if (rc == CKPT_OK && !tw.done && !tw.fallback && tar_member(&tw, tar, "tensors", true, &base, &len))
        rc = tar_tensors(&tw, base, len);
    if (rc == CKPT_OK && !tw.done && !tw.fallback && tar_member(&tw, tar, "pickle", false, &base, &len)) {
        const ckpt_tar_member *m = ckpt_tar_find(tar, "pickle");
        ckpt_wo_result r;
        bool stopped;
        rc = walk_pickle(t, tw.v, CKPT_TORCH_1_13, "tar:pickle", base, len, 0, NULL, &tw, &r,
                         &stopped);
        /* extractfile() reads past the file's end: ReadError, a TarError */
        if (rc == CKPT_OK && stopped && (uint64_t)m->size > len && r.exception &&
            strcmp(r.exception, "EOFError") == 0)
            tw.fallback = true;
        else if (rc == CKPT_OK && !stopped)
            tw.v->pub.accepted = 1;
    }
    if (tw.fallback)
        *fallback = true;
out:
    ckpt_tar_close(tar);
    free(tw.keys), free(tw.klen), free(tw.kind), free(tw.dtype);
    ckpt_arena_release(&tw.arena);
    return rc;
}

/* ---- the fix ------------------------------------------------------------------------ */

/* Whether `ckpt convert` gives a file WHICH accepts: ckpt reads the file,
 * and the pickle it would write passes the same model. */
static bool convert_fixes(ckpt_torch_load *t, ckpt_torch which, const char *path, bool extract)
{
    ckpt_file *f = ckpt_file_new();
    if (!f)
        return false;
    bool ok = false;
    const ckpt_value *what = NULL; /* extract: a pickled model's state dict, as it writes it */
    if (ckpt_file_open(f, path) == CKPT_OK && f->root) {
        what = extract ? NULL : f->root;
        for (size_t i = 0; extract && !what && i < ckpt_file_state_dict_count(f); i++)
            if (strcmp(ckpt_file_state_dict_source(f, i), "mapping") != 0)
                what = ckpt_file_state_dict(f, i, NULL);
    }
    if (what) {
        ckpt_pickle_out out = {0};
        ckpt_error e = {0};
        if (ckpt_pickle_write(&f->arena, f->nstorages, what, &out, &e) == CKPT_OK) {
            ckpt_wo_ctx ctx = {.torch = which == CKPT_TORCH_1_13 ? CKPT_WO_1_13 : CKPT_WO_2_15,
                               .limits = t->limits, .pid_fields = 5};
            ckpt_wo_result r;
            ok = ckpt_wo_walk(&ctx, out.buf, out.len, &r, &e) == CKPT_OK && r.stop == CKPT_WO_OK;
        }
        ckpt_pickle_out_free(&out);
    }
    ckpt_file_free(f);
    return ok;
}

/* The add_safe_globals entry for Q that admits it: the plain form keys an
 * object by __module__.__qualname__, which differs from the pickled name for
 * torch.UntypedStorage (torch.storage) and numpy's moved modules. */
static char *safe_entry(ckpt_torch_load *t, const char *q)
{
    const char *shown = strncmp(q, "builtins.", 9) == 0 ? q + 9 : q;
    if (strcmp(q, "torch.UntypedStorage") == 0 || strncmp(q, "numpy.", 6) == 0)
        return xprintf(t, "(%s, \"%s\")", shown, q);
    return xprintf(t, "%s", shown);
}

/* The only dangerous global WHICH refuses is builtins.getattr, scan finds
 * the file safe (every getattr fetched a member of a class known as data:
 * a per-rank FSDP file's ShardedTensor state), and ckpt convert's output
 * would be accepted. */
static bool getattr_data_only(ckpt_torch_load *t, ckpt_torch which, const char *path)
{
    const verdict *v = &t->v[which];
    for (size_t i = 0; i < v->nrefused; i++)
        if (ckpt_globals_dangerous(v->refused[i]) && strcmp(v->refused[i], "builtins.getattr"))
            return false;
    ckpt_scan *s = ckpt_scan_new();
    bool safe = s && ckpt_scan_file(s, path) == CKPT_OK && !ckpt_scan_unsafe(s) &&
                ckpt_scan_ambiguity_count(s) == 0;
    ckpt_scan_free(s);
    return safe && convert_fixes(t, which, path, false);
}

static void set_fix(ckpt_torch_load *t, ckpt_torch which, const char *path)
{
    verdict *v = &t->v[which];
    const ckpt_torch_verdict *p = &v->pub;
    if (p->accepted)
        return;
    if (strcmp(p->stop, "container") == 0 && t->tar) {
        if (convert_fixes(t, which, path, false))
            v->fix = xprintf(t, "ckpt convert %s OUT.pth (ckpt reads the tar checkpoint and "
                             "writes a zip that this torch accepts)", path);
        return;
    }
    if (strcmp(p->stop, "container") == 0) {
        /* a TorchScript archive: its state dict is what a weights-only load wants */
        if (convert_fixes(t, which, path, true))
            v->fix = xprintf(t, "ckpt extract %s OUT.pth (ckpt reads the archive's state dict "
                             "without running its code, and writes it as a file this torch "
                             "accepts)", path);
        return;
    }
    if (v->blocked[0]) {
        v->fix = xprintf(t, "none: it imports %s, from a module torch never admits (not even "
                         "allow-listed); do not load it (ckpt scan shows what it would run)",
                         v->blocked);
        return;
    }
    for (size_t i = 0; i < v->nrefused; i++)
        if (ckpt_globals_dangerous(v->refused[i])) {
            if (getattr_data_only(t, which, path)) {
                v->fix = xprintf(t, "ckpt convert %s OUT.pth (its builtins.getattr only fetches "
                                 "members of classes known as data, as ckpt scan checks; ckpt "
                                 "reads it without running code and writes plain tensors, a "
                                 "sharded tensor as this rank's shard, that this torch "
                                 "accepts)", path);
                return;
            }
            v->fix = xprintf(t, "none: it imports %s, which can run commands or code; do not "
                             "load it (ckpt scan shows what it would run)", v->refused[i]);
            return;
        }
    if (t->tar && convert_fixes(t, which, path, false)) {
        v->fix = xprintf(t, "ckpt convert %s OUT.pth (ckpt reads the tar checkpoint and writes "
                         "a zip that this torch accepts)", path);
        return;
    }
    if (convert_fixes(t, which, path, true)) {
        v->fix = xprintf(t, "ckpt extract %s OUT.pth (ckpt reads the pickled model without "
                         "importing its classes, and writes its state dict, which this torch "
                         "accepts)", path);
        return;
    }
    if (convert_fixes(t, which, path, false)) {
        v->fix = xprintf(t, "ckpt convert %s OUT.pth (ckpt reads it and writes a protocol-2 "
                         "pickle that this torch accepts)", path);
        return;
    }
    if (v->nrefused) {
        if (which == CKPT_TORCH_1_13 && t->v[CKPT_TORCH_2_6].pub.accepted) {
            v->fix = xprintf(t, "plain torch.load of torch >= 2.6 loads it as it is; torch 1.13 "
                             "cannot allow-list globals (add_safe_globals came in torch 2.4): "
                             "weights_only=False only if you trust the file");
            return;
        }
        if (which == CKPT_TORCH_1_13) {
            v->fix = xprintf(t, "torch 1.13 cannot allow-list globals (add_safe_globals came in "
                             "torch 2.4): load with weights_only=False only if you trust the "
                             "file, or with torch >= 2.6 and add_safe_globals");
            return;
        }
        size_t cap = 64;
        for (size_t i = 0; i < v->nrefused; i++)
            cap += 2 * strlen(v->refused[i]) + 8;
        char *s = malloc(cap);
        if (!s) {
            t->oom = 1;
            return;
        }
        strcpy(s, "torch.serialization.add_safe_globals([");
        for (size_t i = 0; i < v->nrefused; i++) {
            char *e = safe_entry(t, v->refused[i]);
            if (e) {
                strcat(s, i ? ", " : "");
                strcat(s, e);
            }
            free(e);
        }
        strcat(s, "])");
        v->fix = xprintf(t, "%s, if you trust what they are (importing their modules first)", s);
        free(s);
        return;
    }
    /* opcodes of protocols 3 (bytes), 4 (frames, memoize, ...) and 5 */
    int proto = p->opcode == CKPT_OP_BINBYTES || p->opcode == CKPT_OP_SHORT_BINBYTES ? 3
                : p->opcode >= CKPT_OP_SHORT_BINUNICODE && p->opcode <= CKPT_OP_FRAME &&
                  p->opcode != CKPT_OP_EMPTY_SET ? 4
                : p->opcode >= CKPT_OP_BYTEARRAY8 && p->opcode <= CKPT_OP_READONLY_BUFFER ? 5 : 0;
    if (proto)
        v->fix = xprintf(t, "save it again with torch.save(obj, f) at the default "
                         "pickle_protocol=2 (%s is a protocol-%d opcode)", p->opcode_name, proto);
    else if (p->opcode == CKPT_OP_BINFLOAT && which == CKPT_TORCH_1_13)
        v->fix = xprintf(t, "none for torch 1.13, whose weights-only unpickler has no BINFLOAT: "
                         "the file holds a Python float (torch 2.x reads it)");
}

/* ---- the check ----------------------------------------------------------------------- */

static void verdict_init(verdict *v, ckpt_torch which)
{
    v->pub.version = which == CKPT_TORCH_2_6 ? "2.6+" : "1.13";
    v->pub.model = which == CKPT_TORCH_2_6 ? "torch 2.15.0" : "torch 1.13.1";
    v->pub.via = "weights-only unpickler";
    v->pub.opcode = -1;
}

static void verdict_publish(ckpt_torch_load *t, verdict *v)
{
    (void)t;
    v->pub.message = v->message;
    v->pub.reason = v->reason;
    v->pub.fix = v->fix;
    if (!v->note && v->devices[0])
        v->note = xprintf(t, "storages tagged %s: plain torch.load puts them there, so it needs "
                          "that device (else map_location='cpu', or ckpt remap --to cpu)",
                          v->devices);
    v->pub.note = v->note;
    v->pub.malformed = v->malformed;
}

int ckpt_torch_load_check(ckpt_torch_load *t, const char *path)
{
    if (!t || !path)
        return CKPT_ERR_USAGE;
    for (int i = 0; i < CKPT_TORCH_COUNT_; i++)
        verdict_clear(&t->v[i]);
    t->done = false;
    t->oom = 0;
    ckpt_err_clear(&t->err);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ckpt_err(&t->err, CKPT_ERR_IO, "%s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        if (S_ISDIR(st.st_mode)) /* a folder checkpoint: its own library loads it */
            return ckpt_err(&t->err, CKPT_ERR_IO, "a folder: torch.load reads one file (a "
                            "torch.distributed.checkpoint folder loads with dcp.load; ckpt "
                            "convert makes a .pth of it)");
        return ckpt_err(&t->err, CKPT_ERR_IO, "not a regular file");
    }
    uint8_t head[4] = {0};
    ssize_t got = pread(fd, head, sizeof head, 0);
    bool zip = got == 4 && memcmp(head, "PK\3\4", 4) == 0; /* torch's _is_zipfile */
    /* not a zip, a real file at offset 0: torch tries tarfile.open first */
    bool tar = !zip && ckpt_tar_probe(fd, (uint64_t)st.st_size);
    t->tar = tar;
    size_t len = (size_t)st.st_size;
    void *map = NULL;
    if (!zip && len) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return ckpt_err(&t->err, CKPT_ERR_IO, "%s", strerror(errno));
        }
    }
    int rc = CKPT_OK;
    for (int i = 0; i < CKPT_TORCH_COUNT_ && rc == CKPT_OK; i++) {
        ckpt_torch which = (ckpt_torch)i;
        verdict *v = &t->v[i];
        verdict_init(v, which);
        /* 2.15: a path ending in .safetensors (case-sensitive) never reaches the unpickler */
        size_t pl = strlen(path);
        if (which == CKPT_TORCH_2_6 && pl >= 12 && strcmp(path + pl - 12, ".safetensors") == 0) {
            v->pub.via = "safetensors";
            ckpt_file *f = ckpt_file_new();
            if (!f) {
                rc = ckpt_err(&t->err, CKPT_ERR_NOMEM, "out of memory");
                break;
            }
            int r = ckpt_file_open(f, path);
            if (r == CKPT_OK && ckpt_file_format(f) == CKPT_FORMAT_SAFETENSORS)
                v->pub.accepted = 1;
            else
                refuse_container(t, v, which, "SafetensorError",
                                 "Error while deserializing header: %s",
                                 r == CKPT_OK ? "not a safetensors file"
                                              : ckpt_file_error_message(f));
            ckpt_file_free(f);
            continue;
        }
        if (tar && which == CKPT_TORCH_2_6)
            /* 2.15's legacy_load refuses the tar format once tarfile.open
             * succeeded, before any pickle */
            refuse_container(t, v, which, "RuntimeError",
                             "Cannot use ``weights_only=True`` with files saved in the legacy "
                             ".tar format. %s", UNSAFE_2_15);
        else if (zip)
            rc = zip_verdict(t, which, fd);
        else {
            /* 1.13 reads the tar's pickles with its weights-only unpickler;
             * a TarError on the way sends it to the pickle stream */
            bool stream = !tar;
            if (tar)
                rc = tar_verdict(t, fd, map, len, &stream);
            if (rc == CKPT_OK && stream) {
                verdict_clear(v);
                verdict_init(v, which);
                rc = stream_verdict(t, which, map ? map : (const void *)"", len);
            }
        }
        if (rc == CKPT_OK)
            set_fix(t, which, path);
    }
    if (map)
        munmap(map, len);
    close(fd);
    /* what the model admits but ckpt's reader finds malformed (values) */
    ckpt_file *f = rc == CKPT_OK ? ckpt_file_new() : NULL;
    if (f && ckpt_file_open(f, path) == CKPT_ERR_FORMAT)
        for (int i = 0; i < CKPT_TORCH_COUNT_; i++)
            if (t->v[i].pub.accepted && strcmp(t->v[i].pub.via, "weights-only unpickler") == 0)
                t->v[i].malformed = xprintf(t, "%s", ckpt_file_error_message(f));
    ckpt_file_free(f);
    if (rc == CKPT_OK && t->oom)
        rc = ckpt_err(&t->err, CKPT_ERR_NOMEM, "out of memory");
    if (rc != CKPT_OK)
        return rc;
    for (int i = 0; i < CKPT_TORCH_COUNT_; i++)
        verdict_publish(t, &t->v[i]);
    t->done = true;
    return CKPT_OK;
}
