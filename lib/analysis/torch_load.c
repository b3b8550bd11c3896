/* torch_load.c - "will it load?": what a plain weights-only torch.load(f)
 * does with a file, for torch 2.15 ("2.6+") and torch 1.13, modelled from
 * their torch/serialization.py: the dispatch (a .safetensors name, a zip,
 * else the tar and the legacy stream), each container walked by its
 * format's walk (formats/format.h: the zip reader's checks, the tar's
 * legacy_load, the legacy chain, with torch's stops), each pickle it hands
 * out through the unpickler model (analysis/weights_only.c) with the
 * loader's persistent ids and records.
 * When torch refuses, the fix is the ckpt command that rewrites the file
 * into one it accepts (tried: the pickle ckpt would write is walked too),
 * else the add_safe_globals line that works. */
#include "analysis/analysis.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct verdict {
    ckpt_torch_verdict pub;
    char global[256], pickle[128], opname[32];
    char *message, *reason, *fix, *note, *malformed;
    char **refused; /* every global it refuses, first one first (for the fix) */
    size_t nrefused;
    char blocked[256]; /* the first of them in a blocked module, or "" */
    char devices[256]; /* every storage location tag, ", "-separated */
    char missing[256]; /* those this machine lacks (ckpt_device_present) */
} verdict;

struct ckpt_torch_load {
    ckpt_error err;
    uint64_t limits[CKPT_LIMIT_COUNT_];
    verdict v[CKPT_TORCH_COUNT_];
    bool done;
    bool tar; /* the file is torch 0.1's tar (tarfile.open accepts it) */
    int oom;
    const ckpt_file *file; /* the caller's reading of the file, or NULL */
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

typedef struct walk_user {
    ckpt_torch_load *t;
    verdict *v;
    const ckpt_walk *zip; /* the zip walk: its records (data/KEY) */
    const ckpt_walk *tar; /* the tar walk, at its main pickle (1.13): its keys */
} walk_user;

static int tar_key(void *user, const char *key)
{
    return ckpt_walk_tar_kind(((walk_user *)user)->tar, key);
}

static int on_record(void *user, const char *key, uint64_t *size)
{
    walk_user *u = user;
    char *name;
    if (asprintf(&name, "data/%s", key) < 0) {
        u->t->oom = 1;
        return 0;
    }
    int64_t i = ckpt_walk_zip_find(u->zip, name, size);
    free(name);
    return i < 0 ? 0 : ckpt_walk_zip_local_ok(u->zip, i) ? 1 : 2;
}

static void on_location(void *user, const char *loc)
{
    walk_user *u = user;
    char *d = u->v->devices;
    if (strlen(d) + strlen(loc) + 3 >= sizeof u->v->devices)
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
                       const uint8_t *buf, size_t len, unsigned pid_fields, const ckpt_walk *zip,
                       const ckpt_walk *tar, ckpt_wo_result *r, bool *stopped)
{
    walk_user u = {t, v, zip, tar};
    ckpt_wo_ctx ctx = {
        .torch = which == CKPT_TORCH_1_13 ? CKPT_WO_1_13 : CKPT_WO_2_15,
        .limits = t->limits,
        .pid_fields = pid_fields,
        .record = zip ? on_record : NULL,
        .check_size = which == CKPT_TORCH_2_6, /* 1.13 read whatever the record held */
        .on_location = on_location,
        .on_refused = on_refused,
        .tar_key = tar ? tar_key : NULL,
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
            return ckpt_oom(&t->err);
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

typedef struct zip_user {
    ckpt_torch_load *t;
    ckpt_torch which;
} zip_user;

static int zip_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    zip_user *zu = w->user;
    verdict *v = &zu->t->v[zu->which];
    ckpt_wo_result r;
    bool stopped;
    (void)used, (void)root;
    CKPT_FORWARD(walk_pickle(zu->t, v, zu->which, p->name, p->buf, p->len, p->pid_fields, w, NULL,
                             &r, &stopped));
    if (!stopped)
        v->pub.accepted = 1;
    return CKPT_OK;
}

/* The zip FD (SIZE bytes), as pth-zip's walk hands it out. */
static int zip_verdict(ckpt_torch_load *t, ckpt_torch which, int fd, uint64_t size)
{
    verdict *v = &t->v[which];
    zip_user zu = {t, which};
    ckpt_walk w = {.torch = which == CKPT_TORCH_1_13 ? CKPT_WALK_TORCH_1_13 : CKPT_WALK_TORCH_2,
                   .pickle = zip_pickle, .user = &zu,
                   .pickle_limit = t->limits[CKPT_LIMIT_PICKLE_BYTES]};
    ckpt_source src = {.fd = fd, .file_size = size};
    ckpt_error e = {0};
    int rc = ckpt_format_pth_zip.walk(&w, &src, &e);
    if (w.stop.torchscript) {
        if (which == CKPT_TORCH_2_6) {
            refuse_container(t, v, which, "RuntimeError",
                             "Cannot use ``weights_only=True`` with TorchScript archives passed to "
                             "``torch.load``. %s", UNSAFE_2_15);
        } else { /* 1.13 hands it to torch.jit.load, weights_only or not */
            v->pub.accepted = 1;
            v->pub.via = "torch.jit.load";
            v->note = xprintf(t, "a TorchScript archive: torch 1.13 passes it to torch.jit.load "
                              "even with weights_only=True, which compiles and runs the "
                              "archive's code (not a weights-only load: ckpt scan calls it "
                              "unsafe; ckpt extract writes its weights only)");
        }
        return CKPT_OK;
    }
    if (w.stop.exception) {
        refuse_container(t, v, which, w.stop.exception, "%s", w.stop.message);
        if (w.stop.pickle == 0 && which == CKPT_TORCH_1_13) {
            /* data.pkl is read inside 1.13's try around _load: wrapped like the unpickler's */
            char *reason = v->reason;
            v->reason = NULL;
            free(v->message);
            v->message = NULL;
            set_message(t, v, which, w.stop.exception, reason ? reason : "", true);
            free(reason);
        }
        return CKPT_OK;
    }
    if (rc != CKPT_OK && e.code)
        t->err = e;
    return rc;
}

/* ---- the legacy path (pre-1.6 files, and whatever is neither zip nor a
 * .safetensors name: torch tries it as a legacy stream) ---------------------------- */

typedef struct stream_user {
    ckpt_torch_load *t;
    ckpt_torch which;
    ckpt_value top; /* the int a pickle ends with, for the walk's checks */
} stream_user;

static int stream_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    stream_user *su = w->user;
    char name[64];
    snprintf(name, sizeof name, "pickle %d (%s)", p->index + 1, p->name);
    ckpt_wo_result r;
    bool stopped;
    CKPT_FORWARD(walk_pickle(su->t, &su->t->v[su->which], su->which, name, p->buf, p->len,
                             p->pid_fields, NULL, NULL, &r, &stopped));
    if (stopped)
        return CKPT_WALK_STOP; /* the verdict is set */
    *used = r.consumed;
    if (r.top_kind == 1) {
        memset(&su->top, 0, sizeof su->top);
        su->top.kind = CKPT_KIND_INT;
        su->top.u.i.v = r.top_int;
        su->top.u.i.bytes = r.top_long;
        su->top.u.i.nbytes = r.top_long_len;
        su->top.u.i.big = r.top_long && r.top_long_len > 8;
        *root = &su->top;
    } else if (r.top_kind == 2) {
        /* 1001.0 passes the protocol check */
        memset(&su->top, 0, sizeof su->top);
        su->top.kind = CKPT_KIND_FLOAT;
        uint64_t bits = (uint64_t)r.top_int;
        memcpy(&su->top.u.f, &bits, sizeof bits);
        *root = &su->top;
    }
    return CKPT_OK;
}

/* The legacy stream of FD (LEN bytes), as pth-legacy's walk hands it out. */
static int stream_verdict(ckpt_torch_load *t, ckpt_torch which, int fd, uint64_t len)
{
    verdict *v = &t->v[which];
    stream_user su = {.t = t, .which = which};
    ckpt_walk w = {.torch = which == CKPT_TORCH_1_13 ? CKPT_WALK_TORCH_1_13 : CKPT_WALK_TORCH_2,
                   .pickle = stream_pickle, .user = &su};
    ckpt_source src = {.fd = fd, .file_size = len};
    ckpt_error e = {0};
    int rc = ckpt_format_pth_legacy.walk(&w, &src, &e);
    if (rc == CKPT_WALK_STOP)
        return CKPT_OK; /* stopped inside a pickle */
    if (rc != CKPT_OK && !w.stop.exception) {
        if (e.code)
            t->err = e;
        return rc;
    }
    if (w.stop.exception) {
        refuse_container(t, v, which, w.stop.exception, "%s", w.stop.message);
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

/* ---- the tar path under 1.13 (torch <= 0.1 files): pth-tar's walk of its
 * legacy_load (the members 'storages', 'tensors' and 'pickle', the objects
 * loaded kept by key), each pickle through the weights-only model ------------ */

typedef struct tar_user {
    ckpt_torch_load *t;
    verdict *v;
    ckpt_arena arena; /* the values the walk reads on from */
    bool fallback;    /* a TarError: torch reads the file as a pickle stream */
} tar_user;

static void tar_refuse(tar_user *tu, const char *stop, const char *exc, const char *reason)
{
    tu->v->pub.accepted = 0;
    tu->v->pub.stop = stop;
    tu->v->pub.opcode = -1;
    /* all of _legacy_load runs inside 1.13's try: a RuntimeError gets its prefix */
    set_message(tu->t, tu->v, CKPT_TORCH_1_13, exc, reason, true);
}

/* A value the model does not follow (the result of a call): said, not guessed. */
static void tar_unknown(tar_user *tu, const char *reason)
{
    tar_refuse(tu, "value", "unknown", reason);
    tu->v->malformed = xprintf(tu->t, "%s, which ckpt does not follow", reason);
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

/* pickle_module.load(f): the weights-only walk (the verdict when torch stops
 * there), then, for a member's pickle, the value it made. */
static int tar_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    tar_user *tu = w->user;
    bool main = p->pid_fields != 0;
    ckpt_wo_result r;
    bool stopped;
    CKPT_FORWARD(walk_pickle(tu->t, tu->v, CKPT_TORCH_1_13, p->name, p->buf, p->len, 0, NULL,
                             main ? w : NULL, &r, &stopped));
    if (stopped) {
        /* extractfile() reads past the file's end: ReadError, a TarError */
        if (main && p->truncated && r.exception && strcmp(r.exception, "EOFError") == 0)
            tu->fallback = true;
        return CKPT_WALK_STOP;
    }
    *used = r.consumed;
    if (main) {
        tu->v->pub.accepted = 1;
        return CKPT_OK;
    }
    ckpt_pickle_ctx ctx = {
        .name = p->name, .limits = tu->t->limits, .classify = tar_classify, .user = tu,
        .arena = &tu->arena, .on_global = tar_on_global, .on_use = tar_on_use, .scan = true,
    };
    size_t n = 0;
    ckpt_error e = {0};
    if (ckpt_pickle_load(&ctx, p->buf, r.consumed, root, &n, &e) != CKPT_OK || !*root) {
        char reason[300]; /* the VM fails where the model went on: not guessed */
        snprintf(reason, sizeof reason, "not modelled: %s is the result of a call", p->name);
        tar_unknown(tu, reason);
        return CKPT_WALK_STOP;
    }
    return CKPT_OK;
}

/* A storage's location tag: plain torch.load needs that device (the note). */
static int tar_storage(ckpt_walk *w, const ckpt_walk_record *r, uint64_t *size)
{
    tar_user *tu = w->user;
    const char *s = r->location;
    size_t n = r->location_len;
    (void)size;
    if (s && n) {
        char l[64];
        snprintf(l, sizeof l, "%.*s", (int)(n < 63 ? n : 63), s);
        walk_user u = {.t = tu->t, .v = tu->v};
        on_location(&u, l);
    }
    return CKPT_OK;
}

/* 1.13 on a file tarfile.open takes (pth-tar's claim); *FALLBACK when a
 * TarError sends torch to the pickle stream instead. */
static int tar_verdict(ckpt_torch_load *t, int fd, uint64_t size, bool *fallback)
{
    tar_user tu = {.t = t, .v = &t->v[CKPT_TORCH_1_13]};
    ckpt_arena_init(&tu.arena);
    ckpt_walk w = {.torch = CKPT_WALK_TORCH_1_13, .pickle = tar_pickle, .record = tar_storage,
                   .user = &tu};
    ckpt_source src = {.fd = fd, .file_size = size};
    ckpt_error e = {0};
    int rc = ckpt_format_pth_tar.walk(&w, &src, &e);
    ckpt_arena_release(&tu.arena);
    *fallback = tu.fallback || w.stop.fallback;
    if (rc == CKPT_WALK_STOP || *fallback)
        return CKPT_OK;
    if (w.stop.exception) {
        if (strcmp(w.stop.exception, "unknown") == 0 && strcmp(w.stop.stage, "value") == 0)
            tar_unknown(&tu, w.stop.message);
        else
            tar_refuse(&tu, w.stop.stage, w.stop.exception, w.stop.message);
        return CKPT_OK;
    }
    if (rc != CKPT_OK && e.code)
        t->err = e;
    return rc;
}

/* ---- the fix ------------------------------------------------------------------------ */

/* Whether `ckpt convert` gives a file WHICH accepts: ckpt reads the file,
 * and the pickle it would write passes the same model. */
static bool convert_fixes(ckpt_torch_load *t, ckpt_torch which, const char *path, bool extract)
{
    /* the caller's reading when there is one, else a reading of our own */
    ckpt_file *own = t->file ? NULL : ckpt_file_new();
    const ckpt_file *f = t->file ? t->file : own;
    if (!f)
        return false;
    bool ok = false;
    const ckpt_value *what = NULL; /* extract: a pickled model's state dict, as it writes it */
    if ((!own || ckpt_file_open(own, path) == CKPT_OK) && f->root) {
        what = extract ? NULL : f->root;
        for (size_t i = 0; extract && !what && i < ckpt_file_state_dict_count(f); i++)
            if (strcmp(ckpt_file_state_dict_source(f, i), "mapping") != 0)
                what = ckpt_file_state_dict(f, i, NULL);
    }
    if (what) {
        ckpt_pickle_out out = {0};
        ckpt_error e = {0};
        ckpt_arena memo; /* the writer's memo texts: the file is only read */
        ckpt_arena_init(&memo);
        int wrc = ckpt_pickle_write(&memo, f->nstorages, what, &out, &e);
        ckpt_arena_release(&memo);
        /* the walk reads the pickle alone: our own model goes first, so
         * the two are never held at once (issue 26: a 100 MB header) */
        ckpt_file_free(own);
        own = NULL;
        if (wrc == CKPT_OK) {
            /* only the memo entries the pickle reads back are kept */
            ckpt_wo_ctx ctx = {.torch = which == CKPT_TORCH_1_13 ? CKPT_WO_1_13 : CKPT_WO_2_15,
                               .limits = t->limits, .pid_fields = 5,
                               .memo_fetched = out.fetched, .nmemo_fetched = out.nfetched};
            ckpt_wo_result r;
            ok = ckpt_wo_walk(&ctx, out.buf, out.len, &r, &e) == CKPT_OK && r.stop == CKPT_WO_OK;
        }
        ckpt_pickle_out_free(&out);
    }
    ckpt_file_free(own);
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

/* ---- devices: what the storages need and this machine lacks ---------------------------- */

/* The next tag of a ", "-separated list into TAG; false at its end. */
static bool next_tag(const char **p, char *tag, size_t cap)
{
    while (**p == ',' || **p == ' ')
        (*p)++;
    if (!**p)
        return false;
    size_t n = strcspn(*p, ",");
    snprintf(tag, cap, "%.*s", (int)(n < cap - 1 ? n : cap - 1), *p);
    *p += n;
    return true;
}

/* v->missing: the tags of v->devices that ckpt_device_present() denies */
static void find_missing(verdict *v)
{
    char tag[64];
    v->missing[0] = '\0';
    for (const char *p = v->devices; next_tag(&p, tag, sizeof tag);)
        if (!ckpt_device_present(tag) && strlen(v->missing) + strlen(tag) + 3 < sizeof v->missing) {
            if (v->missing[0])
                strcat(v->missing, ", ");
            strcat(v->missing, tag);
        }
}

/* The remap that makes v's storages load here (ckpt_device_remap_here). */
static void remap_args(const verdict *v, const char *all, const char *each, char *buf, size_t cap)
{
    ckpt_device_remap_here(v->devices, all, each, buf, cap);
}

/* Why this machine lacks what v->missing names, and torch's own message for the first. */
static char *missing_note(ckpt_torch_load *t, const verdict *v, ckpt_torch which)
{
    /* 1.13's weights-only unpickler wraps what its persistent_load raises */
    const char *raises = which == CKPT_TORCH_1_13
                             ? "torch.load(f, weights_only=True) raises UnpicklingError: ... "
                               "WeightsUnpickler error"
                             : "plain torch.load raises RuntimeError";
    char tag[64];
    const char *p = v->missing;
    next_tag(&p, tag, sizeof tag);
    int n = ckpt_cuda_driver_device_count();
    bool cuda = strncmp(tag, "cuda", 4) == 0;
    if (cuda && n == 0) /* serialization.py's _validate_device, 1.13 and 2.15 alike */
        return xprintf(t, "its storages need %s, which this machine lacks (no CUDA device: no "
                       "driver, or it finds none): %s: "
                       "Attempting to deserialize object on a CUDA device but "
                       "torch.cuda.is_available() is False", v->missing, raises);
    if (cuda)
        return xprintf(t, "its storages need %s, which this machine lacks (the CUDA driver finds "
                       "%d device%s): %s: Attempting to "
                       "deserialize object on CUDA device %s but torch.cuda.device_count() is "
                       "%d", v->missing, n, n == 1 ? "" : "s", raises,
                       tag[4] == ':' ? tag + 5 : "0", n);
    return xprintf(t, "its storages need %s, which this machine lacks (%s): torch.load fails "
                   "to restore them there", v->missing,
                   strncmp(tag, "mps", 3) == 0 ? "mps is macOS's"
                                               : "a device of its own build of torch or plug-in");
}

/* A refused global outside the known-data classes runs code when torch
 * loads the file (a call; a class, whose __setstate__ or __reduce__ torch
 * runs once allow-listed): the fix is never to allow-list it, but
 * `ckpt extract`, which writes the weights only.  Tried: the state dict
 * extract takes, read with those globals admitted, is walked as written. */
static bool code_refused(const verdict *v)
{
    for (size_t i = 0; i < v->nrefused; i++)
        if (ckpt_globals_builtin_class(v->refused[i]) != CKPT_GLOBAL_KNOWN_DATA)
            return true;
    return false;
}

static void extract_fix(ckpt_torch_load *t, ckpt_torch which, const char *path)
{
    verdict *v = &t->v[which];
    char admit[512] = "", names[400] = "";
    size_t n = 0;
    ckpt_file *f = ckpt_file_new();
    bool ok = f != NULL;
    for (size_t i = 0; i < v->nrefused; i++) {
        if (ckpt_globals_builtin_class(v->refused[i]) == CKPT_GLOBAL_KNOWN_DATA)
            continue;
        ok = ok && ckpt_file_allow_global(f, v->refused[i]) == CKPT_OK;
        if (strlen(admit) + strlen(v->refused[i]) + 20 < sizeof(admit))
            snprintf(admit + strlen(admit), sizeof(admit) - strlen(admit), "--allow-global %s ",
                     v->refused[i]);
        if (strlen(names) + strlen(v->refused[i]) + 8 < sizeof(names))
            snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                     n++ ? ", " : "", v->refused[i]);
    }
    /* admitted globals that are plain data keep their class: allowed too */
    for (size_t i = 0; ok && i < v->nrefused; i++)
        if (ckpt_globals_builtin_class(v->refused[i]) == CKPT_GLOBAL_KNOWN_DATA)
            ok = ckpt_file_allow_global(f, v->refused[i]) == CKPT_OK;
    bool opened = ok && ckpt_file_open(f, path) == CKPT_OK;
    ok = opened && ckpt_file_extract(f, NULL) == CKPT_OK;
    bool picked = ok; /* else several state dicts: the user names one */
    bool none = opened && !ckpt_file_state_dict_count(f); /* no weights to keep */
    if (ok) {
        ckpt_pickle_out out = {0};
        ckpt_error e = {0};
        ckpt_wo_ctx ctx = {.torch = which == CKPT_TORCH_1_13 ? CKPT_WO_1_13 : CKPT_WO_2_15,
                           .limits = t->limits, .pid_fields = 5};
        ckpt_wo_result r;
        ok = ckpt_pickle_write(&f->arena, f->nstorages, f->root, &out, &e) == CKPT_OK;
        ckpt_file_free(f); /* the walk reads the pickle alone: not both held at once */
        f = NULL;
        ok = ok && ckpt_wo_walk(&ctx, out.buf, out.len, &r, &e) == CKPT_OK &&
             r.stop == CKPT_WO_OK;
        ckpt_pickle_out_free(&out);
    }
    ckpt_file_free(f);
    if (none) {
        v->fix = xprintf(t, "none: %s run%s code when the file loads, and it holds no state "
                         "dict that ckpt extract could write; never allow-list %s in torch "
                         "(ckpt scan shows what it would run)", names, n == 1 ? "s" : "",
                         n == 1 ? "it" : "them");
        return;
    }
    /* a global inside the state dict itself (its _metadata): tensors only */
    char ml[256]; /* storages this machine can load */
    remap_args(v, "--map-location", "--map-location", ml, sizeof ml);
    v->fix = xprintf(t, "ckpt extract%s %s%s%s %s (writes the %s only%s); %s run%s code when the "
                     "file loads: never allow-list %s in torch", ml, admit,
                     ok ? "" : picked ? "--to safetensors " : "--select PATH ", path,
                     ok || !picked ? "OUT.pth" : "OUT.safetensors",
                     ok || !picked ? "weights" : "tensors",
                     picked ? "" : ": name the state dict to keep", names, n == 1 ? "s" : "",
                     n == 1 ? "it" : "them");
}

/* The key rewrite a file's model state dicts want (their keys carry a
 * wrapper: "strip-module" for module. alone, else "unwrap"), or NULL. */
static const char *wrapper_rewrite(ckpt_torch_load *t, const char *path)
{
    /* the caller's reading when there is one, else a reading of our own */
    ckpt_file *own = t->file ? NULL : ckpt_file_new();
    const ckpt_file *f = t->file ? t->file : own;
    const char *cmd = NULL;
    if (f && (!own || ckpt_file_open(own, path) == CKPT_OK))
        for (size_t i = 0; i < ckpt_file_state_dict_count(f); i++) {
            const char *w[16];
            if (!ckpt_file_state_dict_is_model(f, i))
                continue;
            size_t n = ckpt_state_dict_wrappers(ckpt_file_state_dict(f, i, NULL), w, 16);
            for (size_t k = 0; k < n && k < 16; k++)
                cmd = strcmp(w[k], "module.") == 0 && (!cmd || strcmp(cmd, "unwrap") != 0)
                          ? "strip-module" : "unwrap";
        }
    ckpt_file_free(own);
    return cmd;
}

static void set_fix(ckpt_torch_load *t, ckpt_torch which, const char *path)
{
    verdict *v = &t->v[which];
    const ckpt_torch_verdict *p = &v->pub;
    char ml[256]; /* the fixes below write storages this machine can load */
    find_missing(v);
    remap_args(v, "--map-location", "--map-location", ml, sizeof ml);
    if (p->accepted && v->missing[0]) {
        char args[256];
        remap_args(v, "--to", "--map", args, sizeof args);
        const char *wrap = wrapper_rewrite(t, path);
        if (wrap) /* the whole job: the keys the plain model wants too */
            v->fix = xprintf(t, "ckpt %s%s %s OUT.pth (storages this machine has, and keys "
                             "without the %s; ckpt remap%s changes the devices alone)", wrap, ml,
                             path, strcmp(wrap, "strip-module") == 0
                                       ? "module. prefix of DataParallel"
                                       : "wrapper components (module., _orig_mod., ...)", args);
        else
            v->fix = xprintf(t, "ckpt remap%s %s OUT.pth%s", args, path,
                             strcmp(args, " --to cpu") == 0
                                 ? " (or torch.load(f, map_location='cpu'))" : "");
        return;
    }
    if (p->accepted)
        return;
    if (strcmp(p->stop, "container") == 0 && t->tar) {
        if (convert_fixes(t, which, path, false))
            v->fix = xprintf(t, "ckpt convert%s %s OUT.pth (ckpt reads the tar checkpoint and "
                             "writes a zip that this torch accepts)", ml, path);
        return;
    }
    if (strcmp(p->stop, "container") == 0) {
        /* a TorchScript archive: its state dict is what a weights-only load wants */
        if (convert_fixes(t, which, path, true))
            v->fix = xprintf(t, "ckpt extract%s %s OUT.pth (ckpt reads the archive's state dict "
                             "without running its code, and writes it as a file this torch "
                             "accepts)", ml, path);
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
                v->fix = xprintf(t, "ckpt convert%s %s OUT.pth (its builtins.getattr only fetches "
                                 "members of classes known as data, as ckpt scan checks; ckpt "
                                 "reads it without running code and writes plain tensors, a "
                                 "sharded tensor as this rank's shard, that this torch "
                                 "accepts)", ml, path);
                return;
            }
            v->fix = xprintf(t, "none: it imports %s, which can run commands or code; do not "
                             "load it (ckpt scan shows what it would run)", v->refused[i]);
            return;
        }
    if (t->tar && convert_fixes(t, which, path, false)) {
        v->fix = xprintf(t, "ckpt convert%s %s OUT.pth (ckpt reads the tar checkpoint and writes "
                         "a zip that this torch accepts)", ml, path);
        return;
    }
    if (convert_fixes(t, which, path, true)) {
        v->fix = xprintf(t, "ckpt extract%s %s OUT.pth (ckpt reads the pickled model without "
                         "importing its classes, and writes its state dict, which this torch "
                         "accepts)", ml, path);
        return;
    }
    if (convert_fixes(t, which, path, false)) {
        v->fix = xprintf(t, "ckpt convert%s %s OUT.pth (ckpt reads it and writes a protocol-2 "
                         "pickle that this torch accepts)", ml, path);
        return;
    }
    if (v->nrefused && code_refused(v)) {
        extract_fix(t, which, path);
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

static void verdict_publish(ckpt_torch_load *t, verdict *v, ckpt_torch which)
{
    (void)t;
    v->pub.message = v->message;
    v->pub.reason = v->reason;
    v->pub.fix = v->fix;
    char placed[256] = ""; /* the tags torch.load puts somewhere other than the cpu */
    char tag[64];
    for (const char *p = v->devices; next_tag(&p, tag, sizeof tag);)
        if (strcmp(tag, "cpu") != 0 && strlen(placed) + strlen(tag) + 3 < sizeof placed)
            snprintf(placed + strlen(placed), sizeof placed - strlen(placed), "%s%s",
                     placed[0] ? ", " : "", tag);
    if (!v->note && v->missing[0])
        v->note = missing_note(t, v, which);
    else if (!v->note && placed[0])
        v->note = xprintf(t, "storages tagged %s: plain torch.load puts them there, and this "
                          "machine has %s", placed, strchr(placed, ',') ? "them" : "it");
    v->pub.note = v->note;
    v->pub.devices = v->devices;
    v->pub.missing_here = v->missing;
    v->pub.malformed = v->malformed;
}

int ckpt_torch_load_use_file(ckpt_torch_load *t, const ckpt_file *f)
{
    if (!t || (f && !f->root))
        return CKPT_ERR_USAGE;
    t->file = f;
    return CKPT_OK;
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
    int fd;
    struct stat st;
    if (ckpt_open_input(AT_FDCWD, path, true, &fd, &st, &t->err) != CKPT_OK) {
        if (t->err.code == CKPT_ERR_IO) { /* the system's word alone, as always */
            int e = errno;
            ckpt_err_clear(&t->err);
            ckpt_err(&t->err, CKPT_ERR_IO, "%s", strerror(e));
        }
        return t->err.code; /* a FIFO or device: refused, never read */
    }
    if (S_ISDIR(st.st_mode)) { /* a folder checkpoint: its own library loads it */
        const char *w = ckpt_model_folder_weights(fd);
        close(fd);
        if (w)
            return ckpt_err(&t->err, CKPT_ERR_IO, "a Hugging Face model folder: torch.load "
                            "reads one file (transformers' from_pretrained loads the folder, "
                            "from %s)", w);
        return ckpt_err(&t->err, CKPT_ERR_IO, "a folder: torch.load reads one file (a "
                        "distributed checkpoint folder loads with its own loader: dcp.load "
                        "for torch.distributed.checkpoint, DeepSpeed's for ZeRO; ckpt "
                        "convert makes a .pth of it)");
    }
    uint8_t head[4] = {0};
    ssize_t got = pread(fd, head, sizeof head, 0);
    bool zip = got == 4 && memcmp(head, "PK\3\4", 4) == 0; /* torch's _is_zipfile */
    /* not a zip, a real file at offset 0: torch tries tarfile.open first */
    bool tar = !zip && ckpt_format_pth_tar.claim(fd, (uint64_t)st.st_size, NULL);
    t->tar = tar;
    uint64_t len = (uint64_t)st.st_size;
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
                rc = ckpt_oom(&t->err);
                break;
            }
            /* safetensors reads the file as safetensors whatever else it is (a zip
             * whose first bytes are also a header length: a polyglot); the
             * caller's reading says it when it was read so */
            int r = t->file && t->file->format == CKPT_FORMAT_SAFETENSORS
                        ? CKPT_OK
                        : ckpt_file_open_as(f, path, &ckpt_format_safetensors);
            if (r == CKPT_OK) {
                v->pub.accepted = 1;
            } else if (r == CKPT_ERR_UNSUPPORTED &&
                       ckpt_file_format(f) == CKPT_FORMAT_SAFETENSORS) {
                /* what safetensors reads and ckpt refuses (a NUL in a name, a
                 * name twice): the verdict is safetensors', ckpt's rule a note */
                v->pub.accepted = 1;
                v->note = xprintf(t, "safetensors reads it, ckpt refuses it: %s",
                                  ckpt_file_error_message(f));
            } else
                refuse_container(t, v, which, "SafetensorError",
                                 "Error while deserializing header: %s",
                                 ckpt_file_error_message(f));
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
            rc = zip_verdict(t, which, fd, (uint64_t)st.st_size);
        else {
            /* 1.13 reads the tar's pickles with its weights-only unpickler;
             * a TarError on the way sends it to the pickle stream */
            bool stream = !tar;
            if (tar)
                rc = tar_verdict(t, fd, len, &stream);
            if (rc == CKPT_OK && stream) {
                verdict_clear(v);
                verdict_init(v, which);
                rc = stream_verdict(t, which, fd, len);
            }
        }
        if (rc == CKPT_OK)
            set_fix(t, which, path);
    }
    close(fd);
    /* what the model admits but ckpt's reader finds malformed (values) */
    bool unpickled = false; /* only then is there a verdict to qualify: else no second read */
    for (int i = 0; i < CKPT_TORCH_COUNT_; i++)
        unpickled |= t->v[i].pub.accepted &&
                     strcmp(t->v[i].pub.via, "weights-only unpickler") == 0;
    /* the caller's reading succeeded: nothing malformed to find */
    ckpt_file *f = rc == CKPT_OK && unpickled && !t->file ? ckpt_file_new() : NULL;
    if (f && ckpt_file_open(f, path) == CKPT_ERR_FORMAT)
        for (int i = 0; i < CKPT_TORCH_COUNT_; i++)
            if (t->v[i].pub.accepted && strcmp(t->v[i].pub.via, "weights-only unpickler") == 0)
                t->v[i].malformed = xprintf(t, "%s", ckpt_file_error_message(f));
    ckpt_file_free(f);
    if (rc == CKPT_OK && t->oom)
        rc = ckpt_oom(&t->err);
    if (rc != CKPT_OK)
        return rc;
    for (int i = 0; i < CKPT_TORCH_COUNT_; i++)
        verdict_publish(t, &t->v[i], (ckpt_torch)i);
    t->done = true;
    return CKPT_OK;
}

/* the same meaning as ckpt_file_error_code(): the last check's status */
int ckpt_torch_load_error_code(const ckpt_torch_load *t) { return t ? t->err.code : CKPT_ERR_USAGE; }
