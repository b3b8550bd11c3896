/* torch_load.c - "will it load?": what a plain weights-only torch.load(f)
 * does with a file, for torch 2.15 ("2.6+") and torch 1.13, modelled from
 * their torch/serialization.py: the dispatch (a .safetensors name, a zip,
 * else the legacy stream), the zip reader's checks (prefix, version record,
 * TorchScript, byteorder), then each pickle through the unpickler model
 * (pickle/weights_only.c) with the loader's persistent ids and records.
 * When torch refuses, the fix is the ckpt command that rewrites the file
 * into one it accepts (tried: the pickle ckpt would write is walked too),
 * else the add_safe_globals line that works. */
#include "formats/format.h"
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

typedef struct walk_user {
    ckpt_torch_load *t;
    verdict *v;
    zip_index *zi;
} walk_user;

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
                       ckpt_wo_result *r, bool *stopped)
{
    walk_user u = {t, v, zi};
    ckpt_wo_ctx ctx = {
        .torch = which == CKPT_TORCH_1_13 ? CKPT_WO_1_13 : CKPT_WO_2_15,
        .limits = t->limits,
        .pid_fields = pid_fields,
        .record = zi ? on_record : NULL,
        .check_size = which == CKPT_TORCH_2_6, /* 1.13 read whatever the record held */
        .on_location = on_location,
        .on_refused = on_refused,
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
    rc = walk_pickle(t, v, which, pname, buf, len, 5, &zi, &r, &stopped);
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
        CKPT_FORWARD(walk_pickle(t, v, which, name, buf + at, len - at, k == 3 ? 6 : 0, NULL, &r,
                                 &stopped));
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
            v->fix = xprintf(t, "none: it imports %s, which can run commands or code; do not "
                             "load it (ckpt scan shows what it would run)", v->refused[i]);
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
    int proto = p->opcode == 'B' || p->opcode == 'C' ? 3
                : p->opcode >= 0x8c && p->opcode <= 0x95 && p->opcode != 0x8f ? 4
                : p->opcode >= 0x96 && p->opcode <= 0x98 ? 5 : 0;
    if (proto)
        v->fix = xprintf(t, "save it again with torch.save(obj, f) at the default "
                         "pickle_protocol=2 (%s is a protocol-%d opcode)", p->opcode_name, proto);
    else if (p->opcode == 'G' && which == CKPT_TORCH_1_13)
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
        else
            rc = stream_verdict(t, which, map ? map : (const void *)"", len);
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
