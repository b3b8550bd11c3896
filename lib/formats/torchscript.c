/*
 * torchscript.c - torch.jit.save archives (doc/whole-models.md section 3),
 * read only.  A zip like torch.save's with a constants.pkl record (torch's own
 * test), whose data.pkl is the module object tree: every module is an object
 * of an archive class "__torch__.<path> <Class>" built from one flat dict of
 * attributes.  Which attributes are parameters and buffers is said only by
 * the classes' TorchScript source in code/, of which ckpt reads the class
 * header lines and the __parameters__ / __buffers__ lists as text (nothing is
 * compiled or run).  The state dict is then named as
 * torch.jit.load(f).state_dict() names it (section 3.4).
 */
#include "formats/format.h"

#include <stdlib.h>
#include <string.h>

#define MAX_NAME 1024 /* a class or attribute name in code/ */
#define MAX_DEPTH 64  /* modules inside modules */
/* module visits: a shared submodule is visited under every path, so a hostile
 * archive of shared modules nested deep would take 2^depth; real ones take
 * one visit per module path, thousands at most */
#define MAX_VISITS (1u << 20)

/* torch.load's own test (serialization._is_torchscript_zip): a record named
 * exactly constants.pkl in the archive folder.  Any failure: not ours (pth-zip reports it). */
static bool ts_claim(int fd, uint64_t size, ckpt_zip **keep)
{
    (void)size;
    ckpt_error e = {0};
    ckpt_zip *z;
    if (ckpt_zip_open(fd, &z, &e) != CKPT_OK)
        return false;
    bool yes = false;
    const char *first = ckpt_zip_count(z) > 0 ? ckpt_zip_name(z, 0) : NULL;
    const char *slash = first ? strchr(first, '/') : NULL;
    for (int64_t i = 0; slash && slash != first && !yes && i < ckpt_zip_count(z); i++)
        yes = ckpt_torch_zip_is_constants(ckpt_zip_name(z, i), (size_t)(slash - first));
    if (keep)
        *keep = z;
    else
        ckpt_zip_close(z);
    return yes;
}

static bool ts_sniff(const uint8_t *head, size_t n)
{
    return n >= 4 && memcmp(head, "PK\x03\x04", 4) == 0;
}

/* data/<key> for every storage data.pkl named, of its exact size */
static int locate_storages(ckpt_file *f, size_t first)
{
    for (size_t k = first; k < f->nstorages; k++) {
        ckpt_storage *s = f->storages[k];
        char name[600];
        CKPT_RETURN_IF((size_t)snprintf(name, sizeof(name), "data/%s", s->src_key) >= sizeof(name),
                       &f->err, CKPT_ERR_FORMAT, "storage key too long");
        int64_t i = ckpt_file_record_find(f, name);
        CKPT_RETURN_IF(i < 0, &f->err, CKPT_ERR_FORMAT, "storage '%s' has no record '%s/%s'",
                       s->key, f->cur_src->prefix, name);
        uint64_t size = ckpt_zip_size(f->cur_src->zip, i);
        CKPT_RETURN_IF(size != s->nbytes, &f->err, CKPT_ERR_FORMAT,
                       "record '%s/%s' is %llu bytes but storage '%s' needs %llu", f->cur_src->prefix,
                       name, (unsigned long long)size, s->key, (unsigned long long)s->nbytes);
        s->loc = CKPT_LOC_ZIP_RECORD;
        s->big_endian = f->cur_src->big_endian;
        s->zip_index = i;
        s->has_crc = ckpt_zip_has_crcs(f->cur_src->zip);
        s->crc32 = ckpt_zip_crc(f->cur_src->zip, i);
    }
    return CKPT_OK;
}

/* In this archive's pickles only: its own classes are opaque objects (their
 * code is never run), torch.jit._pickle's list wrappers are identities. */
static ckpt_global_class ts_classify(void *user, const char *q)
{
    static const char *const wrappers[] = {"build_intlist", "build_tensorlist",
                                           "build_doublelist", "build_boollist",
                                           "restore_type_tag"};
    if (strncmp(q, "__torch__.", 10) == 0)
        return CKPT_GLOBAL_ALLOWED;
    if (strncmp(q, "torch.jit._pickle.", 18) == 0)
        for (size_t i = 0; i < sizeof(wrappers) / sizeof(wrappers[0]); i++)
            if (strcmp(q + 18, wrappers[i]) == 0)
                return CKPT_GLOBAL_INTERPRETED;
    return ckpt_file_classify_global(user, q);
}

/* ---- code/: class headers and the two name lists ---------------------------- */

typedef struct ts_class {
    char *qname; /* "__torch__.torch.nn.modules.linear.Linear" */
    bool module; /* class X(Module): */
    bool has_params, has_bufs;
    char **params, **bufs;
    size_t nparams, nbufs;
} ts_class;

typedef struct ts_index {
    ts_class *c;
    size_t n, cap;
} ts_index;

typedef struct code_file {
    ckpt_file *f;
    ts_index *ix;
    const char *name; /* the record, for messages */
    size_t line;
    ts_class *cur;
} code_file;

static int code_err(code_file *cf, const char *what)
{
    return ckpt_err(&cf->f->err, CKPT_ERR_FORMAT, "code file '%s' line %zu: %s", cf->name,
                    cf->line, what);
}

static bool ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The class that ends: a module's class must have said both lists, as every
 * module class torch.jit.save writes does (else its tensors are unknown). */
static int class_end(code_file *cf)
{
    ts_class *c = cf->cur;
    cf->cur = NULL;
    if (c && c->module && (!c->has_params || !c->has_bufs)) {
        char msg[MAX_NAME + 200];
        snprintf(msg, sizeof(msg), "module class %.*s has no %s list", MAX_NAME, c->qname,
                 c->has_params ? "__buffers__" : "__parameters__");
        return code_err(cf, msg);
    }
    return CKPT_OK;
}

/* "class Name(Base):" at column 0, of module MOD ("__torch__.a.b") */
static int class_begin(code_file *cf, const char *mod, const char *s, size_t n)
{
    CKPT_FORWARD(class_end(cf));
    size_t i = 6, k = i; /* after "class " */
    while (k < n && ident_char(s[k]))
        k++;
    if (k == i || k - i > MAX_NAME || k >= n || (s[k] != '(' && s[k] != ':'))
        return code_err(cf, "a class header without a valid class name (of at most 1024 bytes)");
    size_t name_at = i, name_len = k - i;
    bool module = false;
    if (s[k] == '(') {
        size_t b = ++k;
        while (k < n && s[k] != ')')
            k++;
        if (k >= n)
            return code_err(cf, "a class header without ')'");
        module = k - b == 6 && memcmp(s + b, "Module", 6) == 0;
    }
    ts_index *ix = cf->ix;
    if (ix->n == ix->cap) {
        size_t cap = ix->cap ? ix->cap * 2 : 32;
        ts_class *c = realloc(ix->c, cap * sizeof(*c));
        if (!c)
            return ckpt_oom(&cf->f->err);
        ix->c = c;
        ix->cap = cap;
    }
    size_t ml = strlen(mod);
    char *q = ckpt_arena_alloc(&cf->f->arena, ml + 1 + name_len + 1);
    if (!q)
        return ckpt_oom(&cf->f->err);
    memcpy(q, mod, ml);
    q[ml] = '.';
    memcpy(q + ml + 1, s + name_at, name_len);
    q[ml + 1 + name_len] = '\0';
    cf->cur = &ix->c[ix->n++];
    *cf->cur = (ts_class){.qname = q, .module = module};
    return CKPT_OK;
}

/* `["a", "b", ]` from S[0..N) (the rest of the line after the '='): quoted
 * names without escapes, each at most MAX_NAME bytes; the list must end on
 * its line, as torch writes it. */
static int name_list(code_file *cf, const char *what, const char *s, size_t n, char ***out,
                     size_t *count)
{
    char msg[200];
    size_t i = 0, len = 0, cap = 0;
    char **names = NULL;
    while (i < n && s[i] == ' ')
        i++;
    if (i >= n || s[i] != '[') {
        snprintf(msg, sizeof(msg), "%s is not a list", what);
        return code_err(cf, msg);
    }
    i++;
    for (;;) {
        while (i < n && s[i] == ' ')
            i++;
        if (i >= n) {
            snprintf(msg, sizeof(msg), "unterminated %s list (no ']' on its line)", what);
            return code_err(cf, msg);
        }
        if (s[i] == ']')
            break;
        char quote = s[i];
        size_t b = ++i;
        while (i < n && s[i] != quote && s[i] != '\\' && i - b <= MAX_NAME)
            i++;
        if ((quote != '"' && quote != '\'') || i >= n || s[i] != quote || i == b) {
            snprintf(msg, sizeof(msg), "%s holds something else than quoted names of at most "
                                       "%d bytes", what, MAX_NAME);
            return code_err(cf, msg);
        }
        if (len == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = ckpt_arena_alloc(&cf->f->arena, cap * sizeof(*nn));
            if (!nn)
                return ckpt_oom(&cf->f->err);
            if (len)
                memcpy(nn, names, len * sizeof(*nn));
            names = nn;
        }
        if (!(names[len++] = ckpt_arena_strndup(&cf->f->arena, s + b, i - b)))
            return ckpt_oom(&cf->f->err);
        i++;
        while (i < n && s[i] == ' ')
            i++;
        if (i < n && s[i] == ',')
            i++;
        else if (i < n && s[i] != ']') {
            snprintf(msg, sizeof(msg), "%s: names not separated by ','", what);
            return code_err(cf, msg);
        }
    }
    *out = names;
    *count = len;
    return CKPT_OK;
}

/* One code/ file (module MOD): only class headers at column 0 and, in a
 * class, the two list lines; every other line is skipped unread. */
static int parse_code(code_file *cf, const char *mod, const char *buf, size_t len)
{
    static const char P[] = "  __parameters__ =", B[] = "  __buffers__ =";
    size_t at = 0;
    cf->line = 0;
    while (at < len) {
        const char *s = buf + at, *nl = memchr(s, '\n', len - at);
        size_t n = nl ? (size_t)(nl - s) : len - at;
        at += n + (nl ? 1 : 0);
        cf->line++;
        if (n && s[n - 1] == '\r')
            n--;
        if (n >= 6 && memcmp(s, "class ", 6) == 0) {
            CKPT_FORWARD(class_begin(cf, mod, s, n));
        } else if (n && s[0] != ' ' && s[0] != '\t' && s[0] != '#') {
            CKPT_FORWARD(class_end(cf)); /* top-level code after a class */
        } else if (cf->cur && n >= sizeof(P) - 1 && memcmp(s, P, sizeof(P) - 1) == 0) {
            if (cf->cur->has_params)
                return code_err(cf, "a second __parameters__ list");
            cf->cur->has_params = true;
            CKPT_FORWARD(name_list(cf, "__parameters__", s + sizeof(P) - 1, n - (sizeof(P) - 1),
                                   &cf->cur->params, &cf->cur->nparams));
        } else if (cf->cur && n >= sizeof(B) - 1 && memcmp(s, B, sizeof(B) - 1) == 0) {
            if (cf->cur->has_bufs)
                return code_err(cf, "a second __buffers__ list");
            cf->cur->has_bufs = true;
            CKPT_FORWARD(name_list(cf, "__buffers__", s + sizeof(B) - 1, n - (sizeof(B) - 1),
                                   &cf->cur->bufs, &cf->cur->nbufs));
        }
    }
    return class_end(cf);
}

static int class_cmp(const void *a, const void *b)
{
    return strcmp(((const ts_class *)a)->qname, ((const ts_class *)b)->qname);
}

/* Every <prefix>/code/ record ending in .py: "code/a/b.py" holds the classes of module "a.b". */
static int index_code(ckpt_file *f, ts_index *ix)
{
    char pre[1100];
    snprintf(pre, sizeof(pre), "%s/code/", f->cur_src->prefix);
    size_t pl = strlen(pre);
    ckpt_zip *z = f->cur_src->zip;
    for (int64_t i = 0; i < ckpt_zip_count(z); i++) {
        const char *name = ckpt_zip_name(z, i);
        size_t nl = name ? strlen(name) : 0;
        if (nl <= pl + 3 || strncmp(name, pre, pl) != 0 || strcmp(name + nl - 3, ".py") != 0)
            continue;
        char *mod = ckpt_arena_strndup(&f->arena, name + pl, nl - pl - 3);
        if (!mod)
            return ckpt_oom(&f->err);
        for (char *c = mod; *c; c++)
            if (*c == '/')
                *c = '.';
        uint8_t *buf;
        size_t len;
        CKPT_FORWARD(ckpt_zip_read_all(z, i, f->limits[CKPT_LIMIT_PICKLE_BYTES], &buf, &len,
                                       &f->err));
        code_file cf = {.f = f, .ix = ix, .name = name};
        int rc = parse_code(&cf, mod, (const char *)buf, len);
        free(buf);
        CKPT_FORWARD(rc);
    }
    if (ix->n)
        qsort(ix->c, ix->n, sizeof(*ix->c), class_cmp);
    for (size_t i = 1; i < ix->n; i++)
        CKPT_RETURN_IF(strcmp(ix->c[i - 1].qname, ix->c[i].qname) == 0, &f->err, CKPT_ERR_FORMAT,
                       "class %.*s is defined twice in code/", MAX_NAME, ix->c[i].qname);
    return CKPT_OK;
}

/* ---- the state dict (section 3.4) ------------------------------------------- */

typedef struct ts_walk {
    ckpt_file *f;
    const ts_index *ix;
    ckpt_value *sd;
    const ckpt_value *path[MAX_DEPTH]; /* the modules above (a cycle guard) */
    size_t depth;
    size_t visits;
} ts_walk;

/* The archive class of object O: NULL (no error) for anything else. */
static int class_of(ts_walk *w, const ckpt_value *o, const char *at, const ts_class **out)
{
    *out = NULL;
    if (o->kind != CKPT_KIND_OBJECT || o->u.obj.callable->kind != CKPT_KIND_GLOBAL ||
        strncmp(o->u.obj.callable->u.global.name, "__torch__.", 10) != 0)
        return CKPT_OK;
    const char *q = o->u.obj.callable->u.global.name;
    ts_class key = {.qname = (char *)q};
    *out = w->ix->n ? bsearch(&key, w->ix->c, w->ix->n, sizeof(key), class_cmp) : NULL;
    /* torch.classes.* are C++ classes (TorchBind): no code, never modules */
    if (!*out && strncmp(q, "__torch__.torch.classes.", 24) != 0)
        return ckpt_err(&w->f->err, CKPT_ERR_FORMAT,
                        "data.pkl builds an object of %s (at '%s'), which no code/ file defines",
                        q, at);
    return CKPT_OK;
}

/* Module O of class C at PREFIX: its listed parameters, then its listed
 * buffers (None ones left out), then its module attributes in dict order. */
static int collect(ts_walk *w, const ckpt_value *o, const ts_class *c, const char *prefix)
{
    ckpt_file *f = w->f;
    bool cycle = false;
    for (size_t i = 0; i < w->depth; i++)
        cycle |= w->path[i] == o;
    CKPT_RETURN_IF(w->depth >= MAX_DEPTH || cycle, &f->err, CKPT_ERR_FORMAT,
                   "modules nested more than %d deep, or a module inside itself (at '%s')",
                   MAX_DEPTH, *prefix ? prefix : "(root)");
    CKPT_RETURN_IF(++w->visits > MAX_VISITS, &f->err, CKPT_ERR_LIMIT,
                   "more than %u module paths (shared submodules nested deep?)", MAX_VISITS);
    const ckpt_value *st = o->u.obj.state;
    CKPT_RETURN_IF(!st || st->kind != CKPT_KIND_DICT, &f->err, CKPT_ERR_FORMAT,
                   "the module at '%s' (%s) has no attribute dict", *prefix ? prefix : "(root)",
                   c->qname);
    for (int list = 0; list < 2; list++) {
        char **names = list ? c->bufs : c->params;
        size_t n = list ? c->nbufs : c->nparams;
        for (size_t i = 0; i < n; i++) {
            const ckpt_value *v = ckpt_value_dict_get(st, names[i]);
            CKPT_RETURN_IF(!v, &f->err, CKPT_ERR_FORMAT,
                           "'%s%s' is in %s's %s but not among the module's attributes", prefix,
                           names[i], c->qname, list ? "__buffers__" : "__parameters__");
            if (v->kind == CKPT_KIND_NONE)
                continue; /* torch.jit.load's state_dict() leaves None out */
            CKPT_RETURN_IF(v->kind != CKPT_KIND_TENSOR, &f->err, CKPT_ERR_FORMAT,
                           "'%s%s' is a %s, not a tensor", prefix, names[i],
                           ckpt_value_kind_name(v));
            CKPT_RETURN_IF(w->sd->u.dict.keys.len >= f->limits[CKPT_LIMIT_ITEMS], &f->err,
                           CKPT_ERR_LIMIT, "the state dict has more than %llu keys",
                           (unsigned long long)f->limits[CKPT_LIMIT_ITEMS]);
            CKPT_FORWARD(ckpt_module_sd_add(f, w->sd, prefix, names[i], v, !list));
        }
    }
    w->path[w->depth++] = o;
    int rc = CKPT_OK;
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < st->u.dict.keys.len && rc == CKPT_OK; i++) {
        const ckpt_value *k = st->u.dict.keys.items[i], *v = st->u.dict.vals.items[i];
        if (k->kind != CKPT_KIND_STR || v->kind != CKPT_KIND_OBJECT)
            continue;
        if ((rc = ckpt_key_check(&f->err, k->u.s.s, k->u.s.len)))
            break;
        char *sub = malloc(pl + k->u.s.len + 2);
        if (!sub) {
            rc = ckpt_oom(&f->err);
            break;
        }
        memcpy(sub, prefix, pl);
        memcpy(sub + pl, k->u.s.s, k->u.s.len);
        memcpy(sub + pl + k->u.s.len, ".", 2);
        const ts_class *sc;
        rc = class_of(w, v, sub, &sc);
        if (rc == CKPT_OK && sc && sc->module)
            rc = collect(w, v, sc, sub); /* a shared submodule: under every path */
        free(sub);
    }
    w->depth--;
    return rc;
}

static void index_free(ts_index *ix)
{
    free(ix->c);
}

typedef struct ts_read_state {
    ckpt_file *f;
    ckpt_value **root;
    size_t nbefore;
} ts_read_state;

/* The archive as torch's zip reader opened it (torch_zip.c), then data.pkl. */
static int ts_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **out)
{
    ts_read_state *r = w->user;
    ckpt_file *f = r->f;
    (void)out;
    /* the walk checked every record is in the prefix: the source's, for
     * ckpt_file_record_find (and the main file's, for inspect) */
    f->cur_src->prefix = ckpt_arena_strndup(&f->arena, w->prefix, w->prefix_len);
    if (!f->cur_src->prefix)
        return ckpt_oom(&f->err);
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, p->name);
    ctx.classify = ts_classify; /* this read only: ctx.user is still F */
    r->nbefore = f->nstorages;
    return ckpt_pickle_load(&ctx, p->buf, p->len, r->root, used, &f->err);
}

static int ts_read(ckpt_file *f, ckpt_source *src, ckpt_value **root)
{
    ts_read_state r = {.f = f, .root = root};
    ckpt_walk zw = {.pickle = ts_pickle, .user = &r, .strict = true, .keep = true,
                    .pickle_limit = f->limits[CKPT_LIMIT_PICKLE_BYTES]};
    CKPT_FORWARD(ckpt_torch_zip_walk(&zw, src, true, &f->err));
    if (!ckpt_zip_has_crcs(src->zip) &&
        ckpt_file_notice_add(f, "written without CRC-32s: its bytes are not checked") < 0)
        return ckpt_oom(&f->err);
    CKPT_FORWARD(locate_storages(f, r.nbefore));

    ts_index ix = {0};
    ts_walk w = {.f = f, .ix = &ix};
    const ts_class *c = NULL;
    int rc = index_code(f, &ix);
    if (rc == CKPT_OK)
        rc = class_of(&w, *root, "(root)", &c);
    if (rc == CKPT_OK && (!c || !c->module))
        rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "data.pkl holds a %s, not a module of the "
                      "archive's code/", c ? c->qname : ckpt_value_kind_name(*root));
    if (rc == CKPT_OK && !(w.sd = ckpt_module_sd_new(f, *root)))
        rc = f->err.code;
    if (rc == CKPT_OK)
        rc = collect(&w, *root, c, "");
    index_free(&ix);
    CKPT_FORWARD(rc);
    /* the index sees the root module as this state dict (checkpoint/index.c) */
    w.sd->flags |= CKPT_VF_TORCHSCRIPT;
    (*root)->flags |= CKPT_VF_MODULE;
    (*root)->u.obj.module_sd = w.sd;
    return CKPT_OK;
}

const ckpt_format_desc ckpt_format_torchscript = {
    .id = CKPT_FORMAT_TORCHSCRIPT,
    .name = "torchscript",
    .sniff = ts_sniff,
    .claim = ts_claim,
    .read = ts_read,
};
