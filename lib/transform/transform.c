/*
 * transform.c - edits of an opened checkpoint: key renames (strip/add a
 * prefix, unwrap wrapper components, sed-style PCRE2 rules) applied to state
 * dicts and their _metadata, and storage location remaps.  Edits change the
 * value tree and the storage table; ckpt_file_write then writes the result.
 */
#include "checkpoint/checkpoint.h"

#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

typedef enum rule_kind { RULE_STRIP, RULE_ADD, RULE_UNWRAP, RULE_SED } rule_kind;

typedef struct rule {
    rule_kind kind;
    char *text;        /* prefix, or the replacement (PCRE2 syntax) */
    pcre2_code *re;
    bool global;
} rule;

struct ckpt_rename {
    rule *rules;
    size_t n;
    int code;        /* the last rule's status */
    char error[256]; /* and its message */
};

CKPT_API ckpt_rename *ckpt_rename_new(void)
{
    return calloc(1, sizeof(ckpt_rename));
}

CKPT_API void ckpt_rename_free(ckpt_rename *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->rules[i].text);
        pcre2_code_free(r->rules[i].re);
    }
    free(r->rules);
    free(r);
}

CKPT_API const char *ckpt_rename_error(const ckpt_rename *r)
{
    return r ? r->error : "";
}

CKPT_API int ckpt_rename_error_code(const ckpt_rename *r)
{
    return r ? r->code : CKPT_ERR_USAGE;
}

CKPT_API const char *ckpt_rename_error_message(const ckpt_rename *r)
{
    return ckpt_rename_error(r);
}

/* A rule added (or refused): its status kept as the handle's error. */
static int rule_done(ckpt_rename *r, int rc)
{
    if (!r)
        return rc;
    r->code = rc;
    if (rc == CKPT_OK)
        r->error[0] = '\0';
    else if (rc == CKPT_ERR_NOMEM)
        snprintf(r->error, sizeof r->error, "out of memory");
    return rc;
}

static int add_rule(ckpt_rename *r, rule x)
{
    rule *a = realloc(r->rules, (r->n + 1) * sizeof(*a));
    if (!a) {
        free(x.text);
        pcre2_code_free(x.re);
        return CKPT_ERR_NOMEM;
    }
    r->rules = a;
    r->rules[r->n++] = x;
    return CKPT_OK;
}

static int prefix_rule(ckpt_rename *r, rule_kind kind, const char *prefix)
{
    if (!r || !prefix || !prefix[0]) {
        if (r)
            snprintf(r->error, sizeof(r->error), "the prefix is empty");
        return CKPT_ERR_USAGE;
    }
    rule x = {.kind = kind, .text = strdup(prefix)};
    if (!x.text)
        return CKPT_ERR_NOMEM;
    return add_rule(r, x);
}

CKPT_API int ckpt_rename_strip_prefix(ckpt_rename *r, const char *prefix)
{
    return rule_done(r, prefix_rule(r, RULE_STRIP, prefix));
}

CKPT_API int ckpt_rename_add_prefix(ckpt_rename *r, const char *prefix)
{
    return rule_done(r, prefix_rule(r, RULE_ADD, prefix));
}

CKPT_API int ckpt_rename_unwrap(ckpt_rename *r)
{
    if (!r)
        return CKPT_ERR_USAGE;
    return rule_done(r, add_rule(r, (rule){.kind = RULE_UNWRAP}));
}

static int sed_rule(ckpt_rename *r, const char *expr);

CKPT_API int ckpt_rename_sed(ckpt_rename *r, const char *expr)
{
    return rule_done(r, sed_rule(r, expr));
}

/* Split "s<d>RE<d>REPL<d>FLAGS": an escaped delimiter is the delimiter itself
 * (kept escaped in RE, where PCRE2 reads it as a literal, unescaped in REPL);
 * \N in REPL becomes PCRE2's ${N}. */
static int sed_rule(ckpt_rename *r, const char *expr)
{
    if (!r || !expr)
        return CKPT_ERR_USAGE;
    r->error[0] = '\0';
    size_t n = strlen(expr);
    if (n < 4 || expr[0] != 's' || expr[1] == '\\' || expr[1] == '\n' ||
        (expr[1] >= 'a' && expr[1] <= 'z') || (expr[1] >= '0' && expr[1] <= '9')) {
        snprintf(r->error, sizeof(r->error), "'%s' is not of the form s/REGEX/REPLACEMENT/[gi]",
                 expr);
        return CKPT_ERR_USAGE;
    }
    char d = expr[1];
    char *re = malloc(n + 1), *repl = malloc(n * 4 + 1);
    if (!re || !repl) {
        free(re);
        free(repl);
        return CKPT_ERR_NOMEM;
    }
    size_t i = 2, k = 0;
    for (; i < n && expr[i] != d; i++) {
        if (expr[i] == '\\' && i + 1 < n)
            re[k++] = expr[i++];
        re[k++] = expr[i];
    }
    re[k] = '\0';
    bool ok = i < n;
    k = 0;
    for (i++; ok && i < n && expr[i] != d; i++) {
        if (expr[i] == '\\' && i + 1 < n) {
            char c = expr[++i];
            if (c >= '0' && c <= '9') {
                k += (size_t)sprintf(repl + k, "${%c", c);
                while (i + 1 < n && expr[i + 1] >= '0' && expr[i + 1] <= '9')
                    repl[k++] = expr[++i];
                repl[k++] = '}';
            } else if (c == '\\') {
                repl[k++] = '\\';
            } else {
                repl[k++] = c; /* \<delimiter> and other escapes: the character */
            }
            continue;
        }
        repl[k++] = expr[i];
    }
    repl[k] = '\0';
    ok = ok && i < n;
    uint32_t options = 0;
    bool global = false;
    for (i++; ok && i < n; i++) {
        if (expr[i] == 'g')
            global = true;
        else if (expr[i] == 'i')
            options |= PCRE2_CASELESS;
        else {
            snprintf(r->error, sizeof(r->error), "unknown flag '%c' in '%s' (g and i are known)",
                     expr[i], expr);
            free(re);
            free(repl);
            return CKPT_ERR_USAGE;
        }
    }
    if (!ok) {
        snprintf(r->error, sizeof(r->error), "'%s' is not of the form s/REGEX/REPLACEMENT/[gi]",
                 expr);
        free(re);
        free(repl);
        return CKPT_ERR_USAGE;
    }
    int errcode;
    PCRE2_SIZE at;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, options | PCRE2_UTF,
                                     &errcode, &at, NULL);
    free(re);
    if (!code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(errcode, msg, sizeof(msg));
        snprintf(r->error, sizeof(r->error), "bad regular expression in '%s': %s at offset %zu",
                 expr, (char *)msg, (size_t)at);
        free(repl);
        return CKPT_ERR_USAGE;
    }
    /* every group the replacement names must exist, whether or not a key
     * happens to match */
    uint32_t groups = 0;
    pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &groups);
    for (const char *q = repl; *q; q++) {
        if (*q != '$')
            continue;
        if (q[1] == '$') {
            q++;
            continue;
        }
        const char *d = q + 1 + (q[1] == '{');
        if (*d < '0' || *d > '9')
            continue;
        unsigned long g = strtoul(d, NULL, 10);
        if (g > groups) {
            snprintf(r->error, sizeof(r->error),
                     "'%s' refers to group %lu but the expression has %u", expr, g, groups);
            free(repl);
            pcre2_code_free(code);
            return CKPT_ERR_USAGE;
        }
    }
    return add_rule(r, (rule){.kind = RULE_SED, .text = repl, .re = code, .global = global});
}

static char *apply_sed(const rule *x, const char *key, char *errbuf, size_t errcap)
{
    size_t cap = strlen(key) * 2 + 64;
    for (;;) {
        char *out = malloc(cap);
        if (!out)
            return NULL;
        PCRE2_SIZE len = cap;
        uint32_t opts = PCRE2_SUBSTITUTE_OVERFLOW_LENGTH | (x->global ? PCRE2_SUBSTITUTE_GLOBAL : 0);
        int rc = pcre2_substitute(x->re, (PCRE2_SPTR)key, PCRE2_ZERO_TERMINATED, 0, opts, NULL, NULL,
                                  (PCRE2_SPTR)x->text, PCRE2_ZERO_TERMINATED, (PCRE2_UCHAR *)out,
                                  &len);
        if (rc == PCRE2_ERROR_NOMEMORY) {
            free(out);
            cap = len + 1;
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            if (errbuf)
                snprintf(errbuf, errcap, "replacement '%s': %s", x->text, (char *)msg);
            free(out);
            return NULL;
        }
        return out;
    }
}

static char *apply_rules(const ckpt_rename *r, const char *key, char *errbuf, size_t errcap)
{
    char *cur = strdup(key);
    for (size_t i = 0; cur && i < r->n; i++) {
        const rule *x = &r->rules[i];
        char *next = NULL;
        switch (x->kind) {
        case RULE_STRIP: {
            const char *p = cur;
            size_t pl = strlen(x->text);
            while (strncmp(p, x->text, pl) == 0)
                p += pl;
            next = strdup(p);
            break;
        }
        case RULE_ADD: {
            size_t a = strlen(x->text), b = strlen(cur);
            if ((next = malloc(a + b + 1))) {
                memcpy(next, x->text, a);
                memcpy(next + a, cur, b + 1);
            }
            break;
        }
        case RULE_UNWRAP:
            next = ckpt_key_unwrap(cur); /* checkpoint/index.c: the one wrapper list */
            break;
        case RULE_SED:
            next = apply_sed(x, cur, errbuf, errcap);
            break;
        }
        free(cur);
        cur = next;
    }
    return cur;
}

CKPT_API char *ckpt_rename_apply(const ckpt_rename *r, const char *key)
{
    if (!r || !key)
        return NULL;
    return apply_rules(r, key, NULL, 0);
}

/* A module path of _metadata ("", "0", "layer1.0") through key rules: the
 * rules see "path." (a key prefix), the trailing dot is then dropped. */
static char *apply_rules_to_module_path(const ckpt_rename *r, const char *path, char *errbuf,
                                        size_t errcap)
{
    size_t n = strlen(path);
    char *k = malloc(n + 2);
    if (!k)
        return NULL;
    memcpy(k, path, n);
    if (n)
        k[n++] = '.';
    k[n] = '\0';
    char *out = apply_rules(r, k, errbuf, errcap);
    free(k);
    if (out) {
        size_t l = strlen(out);
        if (l && out[l - 1] == '.')
            out[l - 1] = '\0';
    }
    return out;
}

/* ---- applying to state dicts ---- */

typedef struct key_map {
    char **new_keys; /* per entry: NULL when the key is not a string */
    size_t n;
} key_map;

static void key_map_free(key_map *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->new_keys[i]);
    free(m->new_keys);
    m->new_keys = NULL;
}

/* The entries by their new names: a map reserved for all N of them. */
static int name_index_init(ckpt_map *x, size_t n)
{
    ckpt_map_init(x, CKPT_MAP_BYTES);
    return ckpt_map_reserve(x, n);
}

/* Insert entry I under NAMES[I]; returns the index of an earlier entry with
 * the same name, or SIZE_MAX.  (Reserved for every entry: never grows, so
 * never fails.) */
static size_t name_index_put(ckpt_map *x, char *const *names, size_t i)
{
    size_t prev;
    return ckpt_map_put(x, names[i], strlen(names[i]), i, &prev) == 1 ? prev : SIZE_MAX;
}

static ckpt_value *new_str(ckpt_file *f, const char *s)
{
    ckpt_value *v = ckpt_value_new(&f->arena, CKPT_KIND_STR, 0);
    if (!v || !(v->u.s.s = ckpt_arena_strndup(&f->arena, s, strlen(s))))
        return NULL;
    v->u.s.len = strlen(s);
    return v;
}

static int rename_metadata(ckpt_file *f, ckpt_value *md, const ckpt_rename *r)
{
    size_t n = md->u.dict.keys.len;
    char **nk = calloc(n ? n : 1, sizeof(*nk));
    size_t *orig_len = calloc(n ? n : 1, sizeof(*orig_len));
    ckpt_map idx;
    int rc = (name_index_init(&idx, n) || !nk || !orig_len) ? CKPT_ERR_NOMEM : CKPT_OK;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        ckpt_value *k = md->u.dict.keys.items[i];
        if (k->kind != CKPT_KIND_STR)
            continue;
        char errbuf[256] = "";
        orig_len[i] = k->u.s.len;
        nk[i] = apply_rules_to_module_path(r, k->u.s.s, errbuf, sizeof(errbuf));
        if (!nk[i])
            rc = errbuf[0] ? ckpt_err(&f->err, CKPT_ERR_USAGE, "%s", errbuf)
                           : ckpt_oom(&f->err);
    }
    /* Entries that meet: the first one's place, the inner module's value
     * (the longer original path: DDP's 'module' wins over its own ''). */
    size_t out = 0;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        if (!nk[i]) {
            md->u.dict.keys.items[out] = md->u.dict.keys.items[i];
            md->u.dict.vals.items[out++] = md->u.dict.vals.items[i];
            continue;
        }
        size_t prev = name_index_put(&idx, nk, i);
        if (prev != SIZE_MAX) {
            /* find where PREV landed */
            for (size_t j = 0; j < out; j++)
                if (ckpt_value_is_str(md->u.dict.keys.items[j], nk[i])) {
                    if (orig_len[i] > orig_len[prev])
                        md->u.dict.vals.items[j] = md->u.dict.vals.items[i];
                    break;
                }
            if (orig_len[i] > orig_len[prev])
                orig_len[prev] = orig_len[i];
            continue;
        }
        ckpt_value *key = md->u.dict.keys.items[i];
        if (strcmp(key->u.s.s, nk[i]) != 0 && !(key = new_str(f, nk[i])))
            rc = ckpt_oom(&f->err);
        md->u.dict.keys.items[out] = key;
        md->u.dict.vals.items[out++] = md->u.dict.vals.items[i];
    }
    if (rc == CKPT_OK)
        md->u.dict.keys.len = md->u.dict.vals.len = out;
    /* adding a wrapper: the wrapper's own entry comes first */
    bool adds = false;
    for (size_t i = 0; i < r->n; i++)
        adds |= r->rules[i].kind == RULE_ADD;
    if (rc == CKPT_OK && adds && !ckpt_value_dict_get(md, "")) {
        ckpt_value *k = new_str(f, ""), *v = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0),
                   *vk = new_str(f, "version"), *one = ckpt_value_new(&f->arena, CKPT_KIND_INT, 0);
        if (!k || !v || !vk || !one || ckpt_vec_push(&f->arena, &v->u.dict.keys, vk) ||
            ckpt_vec_push(&f->arena, &v->u.dict.vals, one) ||
            ckpt_vec_push(&f->arena, &md->u.dict.keys, k) ||
            ckpt_vec_push(&f->arena, &md->u.dict.vals, v)) {
            rc = ckpt_oom(&f->err);
        } else {
            one->u.i.v = 1;
            size_t last = md->u.dict.keys.len - 1;
            memmove(md->u.dict.keys.items + 1, md->u.dict.keys.items, last * sizeof(ckpt_value *));
            memmove(md->u.dict.vals.items + 1, md->u.dict.vals.items, last * sizeof(ckpt_value *));
            md->u.dict.keys.items[0] = k;
            md->u.dict.vals.items[0] = v;
        }
    }
    for (size_t i = 0; nk && i < n; i++)
        free(nk[i]);
    free(nk);
    free(orig_len);
    ckpt_map_release(&idx);
    return rc;
}

static int rename_mapping(ckpt_file *f, ckpt_value *d, const ckpt_path *path, const ckpt_rename *r,
                          unsigned flags, const ckpt_edit_report *rep)
{
    if (ckpt_value_is_module_sd(d)) {
        char where[512];
        ckpt_path_format(path, where, sizeof(where));
        if (d->flags & CKPT_VF_TORCHSCRIPT)
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "a TorchScript archive (torch.jit.save) is not rewritten: "
                            "'ckpt extract' writes its state dict as a plain one, which "
                            "this command then rewrites");
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                        "the state dict %s%s%s is a pickled module tree, whose names come from "
                        "its modules: 'ckpt extract' writes it as a plain state dict, which "
                        "this command then rewrites", path->len ? "'" : "",
                        path->len ? where : "(root)", path->len ? "'" : "");
    }
    size_t n = d->u.dict.keys.len, changed = 0;
    key_map m = {.new_keys = calloc(n ? n : 1, sizeof(char *)), .n = n};
    ckpt_map idx;
    char where[512];
    const char *sd_name = "(root)";
    if (path->len) {
        ckpt_path_format(path, where, sizeof(where));
        sd_name = where;
    }
    if (name_index_init(&idx, n) || !m.new_keys) {
        key_map_free(&m);
        ckpt_map_release(&idx);
        return ckpt_oom(&f->err);
    }
    int rc = CKPT_OK;
    char errbuf[256] = "";
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        ckpt_value *k = d->u.dict.keys.items[i];
        if (k->kind != CKPT_KIND_STR)
            continue;
        m.new_keys[i] = apply_rules(r, k->u.s.s, errbuf, sizeof(errbuf));
        if (!m.new_keys[i])
            rc = errbuf[0] ? ckpt_err(&f->err, CKPT_ERR_USAGE, "%s", errbuf)
                           : ckpt_oom(&f->err);
    }
    for (size_t i = 0; i < n && rc == CKPT_OK; i++)
        if (m.new_keys[i] && !m.new_keys[i][0])
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "key '%s' would become empty in state dict %s; nothing was written",
                          d->u.dict.keys.items[i]->u.s.s, sd_name);
    /* refuse a rename that makes two keys equal, naming both */
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        if (!m.new_keys[i])
            continue;
        size_t prev = name_index_put(&idx, m.new_keys, i);
        if (prev != SIZE_MAX)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT,
                          "keys '%s' and '%s' would both become '%s' in state dict %s; "
                          "nothing was written",
                          d->u.dict.keys.items[prev]->u.s.s, d->u.dict.keys.items[i]->u.s.s,
                          m.new_keys[i], sd_name);
    }
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        ckpt_value *k = d->u.dict.keys.items[i];
        if (!m.new_keys[i] || strcmp(k->u.s.s, m.new_keys[i]) == 0)
            continue;
        changed++;
        if (rep && rep->key)
            rep->key(rep->user, path, k->u.s.s, m.new_keys[i]);
    }
    if (rc == CKPT_OK && !(flags & CKPT_EDIT_DRY_RUN) && changed) {
        for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
            ckpt_value *k = d->u.dict.keys.items[i];
            if (!m.new_keys[i] || strcmp(k->u.s.s, m.new_keys[i]) == 0)
                continue;
            if (!(d->u.dict.keys.items[i] = new_str(f, m.new_keys[i])))
                rc = ckpt_oom(&f->err);
        }
        const ckpt_value *md = ckpt_value_dict_get(d->u.dict.state, "_metadata");
        if (rc == CKPT_OK && md && md->kind == CKPT_KIND_DICT)
            rc = rename_metadata(f, (ckpt_value *)md, r);
    }
    if (rc == CKPT_OK && rep && rep->state_dict)
        rep->state_dict(rep->user, path, changed, n);
    key_map_free(&m);
    ckpt_map_release(&idx);
    return rc;
}

CKPT_API int ckpt_file_rename_keys(ckpt_file *f, const ckpt_rename *r, const char *select,
                                   unsigned flags, const ckpt_edit_report *report)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !f->root || !r)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (select && *select) {
        ckpt_value *d = NULL;
        ckpt_path path = {0};
        CKPT_FORWARD(ckpt_file_find_mapping(f, select, &d, &path));
        return rename_mapping(f, d, &path, r, flags, report);
    }
    /* Check every state dict before changing any, so that a collision in
     * the second leaves the first untouched too. */
    for (size_t i = 0; i < f->state_dicts.len; i++) {
        ckpt_walk_entry *e = &f->state_dicts.items[i];
        if (ckpt_state_dict_is_model(f, &e->path)) /* the model's only (doc/design.md, "State dicts") */
            CKPT_FORWARD(rename_mapping(f, (ckpt_value *)e->value, &e->path, r,
                                        CKPT_EDIT_DRY_RUN, NULL));
    }
    for (size_t i = 0; i < f->state_dicts.len; i++) {
        ckpt_walk_entry *e = &f->state_dicts.items[i];
        if (ckpt_state_dict_is_model(f, &e->path))
            CKPT_FORWARD(rename_mapping(f, (ckpt_value *)e->value, &e->path, r, flags, report));
    }
    return CKPT_OK;
}

/* ---- devices ---- */

CKPT_API int ckpt_device_valid(const char *tag)
{
    /* torch's tags: a lower-case device type, then ":N" optionally */
    if (!tag || !((*tag >= 'a' && *tag <= 'z') || *tag == '_'))
        return 0;
    const char *p = tag;
    while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')
        p++;
    if (*p == ':') {
        p++;
        if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return *p == '\0' && p - tag <= 64;
}

CKPT_API int ckpt_device_known(const char *tag)
{
    static const char *const types[] = {"cpu", "cuda", "mps", "meta", "hpu", "xpu", "mtia",
                                        "xla", "ipu", "lazy", "hip", "ve", "vulkan", "ort",
                                        "privateuseone", "maia", "fpga"};
    if (!ckpt_device_valid(tag))
        return 0;
    size_t n = strcspn(tag, ":");
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (strlen(types[i]) == n && strncmp(tag, types[i], n) == 0)
            return 1;
    return 0;
}

static bool device_matches(const char *from, const char *tag)
{
    if (strcmp(from, "*") == 0 || strcmp(from, tag) == 0)
        return true;
    size_t n = strlen(from);
    return !strchr(from, ':') && strncmp(tag, from, n) == 0 && tag[n] == ':';
}

CKPT_API int ckpt_file_remap_devices(ckpt_file *f, const char *const *from, const char *const *to,
                                     size_t nrules, unsigned flags, const ckpt_edit_report *report)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || (!from && nrules) || (!to && nrules))
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    for (size_t k = 0; k < nrules; k++) {
        if (!(strcmp(from[k], "*") == 0 || ckpt_device_valid(from[k])))
            return ckpt_err(&f->err, CKPT_ERR_USAGE, "'%s' is not a device tag or '*'", from[k]);
        if (!ckpt_device_valid(to[k]))
            return ckpt_err(&f->err, CKPT_ERR_USAGE, "'%s' is not a device tag", to[k]);
    }
    /* tally changes per (old, new) pair, in order of first appearance */
    size_t n = f->nstorages;
    const char **olds = calloc(n ? n : 1, sizeof(*olds)), **news = calloc(n ? n : 1, sizeof(*news));
    size_t *counts = calloc(n ? n : 1, sizeof(*counts)), npairs = 0;
    int rc = (!olds || !news || !counts) ? ckpt_oom(&f->err)
                                         : CKPT_OK;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        ckpt_storage *s = f->storages[i];
        const char *target = NULL;
        for (size_t k = 0; k < nrules && !target; k++)
            if (device_matches(from[k], s->device))
                target = to[k];
        if (!target || strcmp(target, s->device) == 0)
            continue;
        size_t p = 0;
        while (p < npairs && !(strcmp(olds[p], s->device) == 0 && strcmp(news[p], target) == 0))
            p++;
        if (p == npairs) {
            olds[p] = s->device;
            news[p] = target;
            npairs++;
        }
        counts[p]++;
    }
    for (size_t p = 0; p < npairs && rc == CKPT_OK && report && report->device; p++)
        report->device(report->user, olds[p], news[p], counts[p]);
    if (rc == CKPT_OK && !(flags & CKPT_EDIT_DRY_RUN)) {
        for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
            ckpt_storage *s = f->storages[i];
            for (size_t k = 0; k < nrules; k++)
                if (device_matches(from[k], s->device)) {
                    if (strcmp(to[k], s->device) != 0 &&
                        !(s->device = ckpt_arena_strndup(&f->arena, to[k], strlen(to[k]))))
                        rc = ckpt_oom(&f->err);
                    break;
                }
        }
    }
    free(olds);
    free(news);
    free(counts);
    return rc;
}

/* ---- dtype casts ---- */

CKPT_API int ckpt_file_cast(ckpt_file *f, ckpt_dtype to, unsigned flags,
                            const ckpt_edit_report *report)
{
    if (!f || f->magic != CKPT_FILE_MAGIC)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (!ckpt_cast_supported(CKPT_DTYPE_FLOAT32, to))
        return ckpt_err(&f->err, CKPT_ERR_USAGE, "cannot cast to %s (float16, bfloat16, float32, "
                                                 "float64, float8_e4m3fn or float8_e5m2)",
                        ckpt_dtype_name(to));
    /* E8M0, float4 and float6 have no cast here that is proven bit-exact
     * against torch: refused rather than kept, as they are floating types */
    for (size_t i = 0; i < f->nstorages; i++) {
        ckpt_dtype d = f->storages[i]->dtype;
        if (d != to && (d == CKPT_DTYPE_FLOAT8_E8M0FNU || d == CKPT_DTYPE_FLOAT4_E2M1FN_X2 ||
                        d == CKPT_DTYPE_FLOAT6_E2M3FN || d == CKPT_DTYPE_FLOAT6_E3M2FN))
            return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                            "storage '%s' is %s, which ckpt cannot cast to %s bit for bit as "
                            "torch does; convert without --dtype", f->storages[i]->key,
                            ckpt_dtype_name(d), ckpt_dtype_name(to));
    }
    /* a quantizer's per-channel scales keep their dtype, as torch's .to()
     * of a state dict leaves quantized tensors alone */
    bool *keep = calloc(f->nstorages ? f->nstorages : 1, sizeof(*keep));
    /* after a selection (ckpt_file_select, _extract) the report counts the
     * storages the selected tensors use, not the whole file's */
    bool *used = f->file_root ? calloc(f->nstorages ? f->nstorages : 1, sizeof(*used)) : NULL;
    if (!keep || (f->file_root && !used)) {
        free(keep);
        free(used);
        return ckpt_oom(&f->err);
    }
    /* storage -> its index, so that this is one pass over the tensors, not
     * one per storage (100,000 tensors: 352 s before, issue 26) */
    ckpt_map at;
    ckpt_map_init(&at, CKPT_MAP_U64);
    int rc = ckpt_map_reserve(&at, f->nstorages) < 0 ? CKPT_ERR_NOMEM : CKPT_OK;
    for (size_t i = 0; i < f->nstorages && rc == CKPT_OK; i++)
        rc = ckpt_map_set_u64(&at, (uint64_t)(uintptr_t)f->storages[i], i) < 0 ? CKPT_ERR_NOMEM
                                                                             : CKPT_OK;
    for (size_t j = 0; j < f->tensors.len && rc == CKPT_OK; j++) {
        const ckpt_tensor *t = f->tensors.items[j].value->u.tensor;
        size_t i;
        const ckpt_storage *ts = t->values ? t->values->storage : t->storage;
        if (used && ts && ckpt_map_get_u64(&at, (uint64_t)(uintptr_t)ts, &i))
            used[i] = true;
        if (!t->q || !t->q->scales)
            continue;
        if (ckpt_map_get_u64(&at, (uint64_t)(uintptr_t)t->q->scales->storage, &i))
            keep[i] = true;
        if (ckpt_map_get_u64(&at, (uint64_t)(uintptr_t)t->q->zero_points->storage, &i))
            keep[i] = true;
    }
    ckpt_map_release(&at);
    if (rc != CKPT_OK) {
        free(keep);
        free(used);
        return ckpt_oom(&f->err);
    }
    /* count per source dtype, for the report */
    size_t counts[CKPT_DTYPE_COUNT_] = {0};
    for (size_t i = 0; i < f->nstorages; i++) {
        ckpt_storage *s = f->storages[i];
        if (s->dtype != to && ckpt_cast_supported(s->dtype, to) && !keep[i] && (!used || used[i]))
            counts[s->dtype]++;
    }
    free(used);
    if (report && report->device) /* reuses the "old -> new (N storages)" form */
        for (int d = 0; d < CKPT_DTYPE_COUNT_; d++)
            if (counts[d])
                report->device(report->user, ckpt_dtype_name((ckpt_dtype)d), ckpt_dtype_name(to),
                               counts[d]);
    if (flags & CKPT_EDIT_DRY_RUN) {
        free(keep);
        return CKPT_OK;
    }
    for (size_t i = 0; i < f->nstorages; i++) {
        ckpt_storage *s = f->storages[i];
        if (s->dtype == to || !ckpt_cast_supported(s->dtype, to) || keep[i])
            continue; /* integers, bool, complex and the rest keep their type */
        s->dtype = to;
        s->type_name = ckpt_storage_type_name(to);
        if (!s->type_name) /* newer dtypes: as torch 2.x saves them */
            s->type_name = "UntypedStorage";
        s->nbytes = (uint64_t)s->numel * ckpt_dtype_size(to);
    }
    for (size_t i = 0; i < f->tensors.len; i++) {
        ckpt_tensor *t = (ckpt_tensor *)f->tensors.items[i].value->u.tensor;
        const ckpt_storage *s = t->values ? t->values->storage : t->storage;
        if (s && s->dtype != s->src_dtype) /* meta tensors keep theirs */
            t->dtype = s->dtype;
    }
    free(keep);
    return CKPT_OK;
}

/* What the _metadata of an extracted module tree cannot know. */
static int note_versions(ckpt_file *f)
{
    const ckpt_value *sd = f->root;
    if (ckpt_value_is_module_sd(sd) && sd->u.dict.unknown_version &&
        ckpt_file_notice_add(f, "_metadata: the _version of %s (and of any class outside "
                                "torch.nn) is not in the file: it says 1",
                             sd->u.dict.unknown_version) < 0)
        return ckpt_oom(&f->err);
    return CKPT_OK;
}

CKPT_API int ckpt_file_extract(ckpt_file *f, const char *select)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !f->root)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    if (select) {
        CKPT_FORWARD(ckpt_file_select(f, select));
        return note_versions(f);
    }
    size_t i;
    CKPT_FORWARD(ckpt_file_pick_state_dict(f, &i));
    const ckpt_walk_entry *pick = &f->state_dicts.items[i];
    ckpt_value *old = f->root;
    if (!f->file_root)
        f->file_root = old;
    f->root = (ckpt_value *)pick->value;
    CKPT_FORWARD(ckpt_file_reindex(f, old));
    return note_versions(f);
}

CKPT_API int ckpt_file_select(ckpt_file *f, const char *select)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !f->root || !select)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    ckpt_value *v;
    ckpt_path p;
    CKPT_FORWARD(ckpt_file_find_mapping(f, select, &v, &p));
    ckpt_value *old = f->root;
    if (!f->file_root)
        f->file_root = old;
    f->root = v;
    return ckpt_file_reindex(f, old);
}

/* ---- what a write would carry that runs code (doc/safety.md 9) ---- */

/* One node reached by the walk: how, for the path a message names. */
typedef struct reached {
    const ckpt_value *v;
    size_t parent;     /* SIZE_MAX: the root */
    ckpt_path_elem e;
    bool keyed;        /* E leads from the parent (a key or an index) */
} reached;

typedef struct code_walk {
    ckpt_file *f;
    reached *nodes;
    size_t n, cap;
    size_t next;   /* nodes[next..n) are still to look into, in the order reached */
    ckpt_map seen; /* node address -> index */
} code_walk;

static bool plain(const ckpt_value *v)
{
    return v->kind == CKPT_KIND_NONE || v->kind == CKPT_KIND_BOOL || v->kind == CKPT_KIND_INT ||
           v->kind == CKPT_KIND_FLOAT || v->kind == CKPT_KIND_STR || v->kind == CKPT_KIND_BYTES ||
           v->kind == CKPT_KIND_STORAGE;
}

/* Nothing in V can be a global: a plain value, a tuple of them (a tensor's
 * shape), an empty dict (its hooks), a tensor of such arguments and no
 * state.  Not looked into: a tensor's parts are most of a large file's nodes
 * (a tensor's rebuild function is written by name, never from the tree). */
static bool holds_nothing(const ckpt_value *v)
{
    if (plain(v))
        return true;
    if (v->kind == CKPT_KIND_DICT)
        return !v->u.dict.keys.len && !v->u.dict.state;
    if (v->kind == CKPT_KIND_TENSOR) {
        const ckpt_tensor *t = v->u.tensor;
        const ckpt_value *a = t->rebuild_args;
        if (t->state || t->type_args || t->param_args || (a && a->kind != CKPT_KIND_TUPLE))
            return false;
        for (size_t i = 0; a && i < a->u.seq.len; i++)
            if (!holds_nothing(a->u.seq.items[i]))
                return false;
        return true;
    }
    if (v->kind != CKPT_KIND_TUPLE)
        return false;
    for (size_t i = 0; i < v->u.seq.len; i++)
        if (!plain(v->u.seq.items[i]))
            return false;
    return true;
}

static int reach(code_walk *w, const ckpt_value *v, size_t parent, const ckpt_path_elem *e)
{
    if (!v || holds_nothing(v))
        return CKPT_OK;
    size_t at;
    if (ckpt_map_get_u64(&w->seen, (uint64_t)(uintptr_t)v, &at))
        return CKPT_OK; /* shared, or a cycle: looked into once */
    if (CKPT_GROW(w->nodes, w->cap, w->n + 1) < 0 ||
        ckpt_map_put_u64(&w->seen, (uint64_t)(uintptr_t)v, w->n, NULL) < 0)
        return ckpt_oom(&w->f->err);
    w->nodes[w->n] = (reached){.v = v, .parent = parent, .e = e ? *e : (ckpt_path_elem){0},
                               .keyed = e != NULL};
    w->n++;
    return CKPT_OK;
}

static int reach_vec(code_walk *w, const ckpt_vec *vec, size_t parent, bool indexed)
{
    for (size_t i = 0; i < vec->len; i++) {
        ckpt_path_elem e = {.is_int = 1, .index = (int64_t)i};
        CKPT_FORWARD(reach(w, vec->items[i], parent, indexed ? &e : NULL));
    }
    return CKPT_OK;
}

/* Where node I sits, as a phrase: "at 'a/b'" (its keys from the root, as
 * far as keys lead), "at the root", or "in the state dict 'a'" when a state
 * dict holds it (its _metadata, a tensor's attributes): *IN_SD says so. */
static void reached_where(const code_walk *w, size_t i, char *buf, size_t cap, bool *in_sd)
{
    size_t depth = 0;
    for (size_t k = i; k != SIZE_MAX; k = w->nodes[k].parent)
        depth++;
    size_t *chain = calloc(depth, sizeof(*chain));
    ckpt_path_elem *el = calloc(depth, sizeof(*el));
    size_t n = 0, d = depth;
    *in_sd = false;
    for (size_t k = i; chain && k != SIZE_MAX; k = w->nodes[k].parent)
        chain[--d] = k;
    for (size_t j = 0; chain && el && j < depth && !*in_sd; j++) {
        const ckpt_value *v = w->nodes[chain[j]].v;
        if (j && !w->nodes[chain[j]].keyed)
            break;
        if (j)
            el[n++] = w->nodes[chain[j]].e;
        for (size_t s = 0; v->kind == CKPT_KIND_DICT && s < w->f->state_dicts.len; s++)
            *in_sd |= w->f->state_dicts.items[s].value == v;
    }
    ckpt_path p = {.len = n, .elems = el};
    char path[400] = "";
    if (n)
        ckpt_path_format(&p, path, sizeof(path));
    if (*in_sd)
        snprintf(buf, cap, n ? "in the state dict '%s'" : "in the root state dict", path);
    else if (n)
        snprintf(buf, cap, "at '%s'", path);
    else
        snprintf(buf, cap, "at the root");
    free(chain);
    free(el);
}

/* getattr(<class known as data>, <member>): an enum member, data (globals.c) */
static bool getattr_data(const ckpt_value *obj)
{
    const ckpt_value *fn = obj->u.obj.callable, *a = obj->u.obj.args;
    return fn && fn->kind == CKPT_KIND_GLOBAL &&
           strcmp(fn->u.global.name, "builtins.getattr") == 0 && a && a->kind == CKPT_KIND_TUPLE && a->u.seq.len == 2 &&
           a->u.seq.items[0]->kind == CKPT_KIND_GLOBAL &&
           a->u.seq.items[0]->u.global.cls == CKPT_GLOBAL_KNOWN_DATA &&
           a->u.seq.items[1]->kind == CKPT_KIND_STR &&
           ckpt_globals_getattr_known(a->u.seq.items[0]->u.global.name, a->u.seq.items[1]->u.s.s);
}

/* Look into node I: its children reached, *CODE the global found there that
 * runs code (NULL: none), *MODULE whether it is a module tree's class. */
static int look_into(code_walk *w, size_t i, const ckpt_value **code, bool *module)
{
    const ckpt_value *v = w->nodes[i].v;
    *code = NULL;
    *module = false;
    switch (v->kind) {
    case CKPT_KIND_GLOBAL:
        if (v->u.global.cls != CKPT_GLOBAL_INTERPRETED &&
            v->u.global.cls != CKPT_GLOBAL_KNOWN_DATA)
            *code = v;
        return CKPT_OK;
    case CKPT_KIND_DICT:
        for (size_t k = 0; k < v->u.dict.keys.len; k++) {
            const ckpt_value *key = v->u.dict.keys.items[k];
            ckpt_path_elem e = {0};
            bool keyed = true;
            if (key->kind == CKPT_KIND_STR)
                e.key = key->u.s.s;
            else if (key->kind == CKPT_KIND_INT && !key->u.i.big)
                e = (ckpt_path_elem){.is_int = 1, .index = key->u.i.v};
            else
                keyed = false;
            CKPT_FORWARD(reach(w, key, i, NULL));
            CKPT_FORWARD(reach(w, v->u.dict.vals.items[k], i, keyed ? &e : NULL));
        }
        return reach(w, v->u.dict.state, i, NULL);
    case CKPT_KIND_LIST:
    case CKPT_KIND_TUPLE:
        return reach_vec(w, &v->u.seq, i, true);
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
        return reach_vec(w, &v->u.seq, i, false);
    case CKPT_KIND_OBJECT: {
        const ckpt_value *fn = v->u.obj.callable;
        if (fn && fn->kind == CKPT_KIND_GLOBAL && !getattr_data(v) &&
            fn->u.global.cls != CKPT_GLOBAL_INTERPRETED &&
            fn->u.global.cls != CKPT_GLOBAL_KNOWN_DATA) {
            *code = fn;
            *module = (v->flags & CKPT_VF_MODULE) != 0;
        } else if (fn && fn->kind != CKPT_KIND_GLOBAL) {
            CKPT_FORWARD(reach(w, fn, i, NULL)); /* getattr(...)(): an object's class */
        }
        CKPT_FORWARD(reach(w, v->u.obj.args, i, NULL));
        CKPT_FORWARD(reach(w, v->u.obj.kwargs, i, NULL));
        CKPT_FORWARD(reach(w, v->u.obj.state, i, NULL));
        const ckpt_obj_items *it = ckpt_obj_items_of(v);
        CKPT_FORWARD(reach_vec(w, &it->listitems, i, false));
        CKPT_FORWARD(reach_vec(w, &it->dictkeys, i, false));
        return reach_vec(w, &it->dictvals, i, false);
    }
    case CKPT_KIND_TENSOR: {
        const ckpt_tensor *t = v->u.tensor;
        CKPT_FORWARD(reach(w, t->rebuild_args, i, NULL));
        CKPT_FORWARD(reach(w, t->param_args, i, NULL));
        CKPT_FORWARD(reach(w, t->type_args, i, NULL));
        return reach(w, t->state, i, NULL);
    }
    default:
        return CKPT_OK;
    }
}

/* The index of the global Q among those the user named, or SIZE_MAX. */
static size_t named_global(const ckpt_file *f, const char *q)
{
    for (size_t i = 0; i < f->nallowed; i++)
        if (strcmp(f->allowed[i], q) == 0)
            return i;
    return SIZE_MAX;
}

static int refuse_code(code_walk *w, size_t i, const ckpt_value *g, bool module, bool keep)
{
    ckpt_file *f = w->f;
    const char *q = g->u.global.name;
    char where[512];
    bool in_sd;
    reached_where(w, i, where, sizeof(where), &in_sd);
    /* extract keeps a state dict's own attributes: only tensors leave them */
    const char *only = in_sd ? "'ckpt extract --to safetensors' writes its tensors only"
                             : "'ckpt extract' writes the weights only";
    if (module)
        return ckpt_err(&f->err, CKPT_ERR_UNSAFE,
                        "a pickled module tree (class %s, %s) is not written back by a "
                        "rewrite: torch.load(weights_only=False) imports its classes and runs "
                        "them; 'ckpt extract' writes its state dict (the weights only)", q,
                        where);
    if (ckpt_globals_dangerous(q))
        return ckpt_err(&f->err, CKPT_ERR_UNSAFE,
                        "the global %s (%s) can run commands or code and is never written "
                        "back, not even with --keep-unsafe: %s", q, where, only);
    if (keep)
        return ckpt_err(&f->err, CKPT_ERR_UNSAFE,
                        "the global %s (%s) runs code when torch.load(weights_only=False) "
                        "reads the output, and --keep-unsafe keeps only the globals named with "
                        "--allow-global: add --allow-global %s to keep it, or %s", q, where, q,
                        only);
    return ckpt_err(&f->err, CKPT_ERR_UNSAFE,
                    "the global %s (%s) runs code when torch.load(weights_only=False) reads "
                    "the output, so a rewrite does not write it: %s (--allow-global %s "
                    "--keep-unsafe keeps it, and makes the output unsafe to load)", q, where,
                    only, q);
}

CKPT_API int ckpt_file_check_globals(ckpt_file *f, ckpt_format format, int keep,
                                     void (*kept)(void *user, const char *global), void *user)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || !f->root)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    /* tensors only: no pickle, or one of plain tensors (sharded.c refuses
     * anything else); a TorchScript archive is refused by every writer */
    if (format == CKPT_FORMAT_SAFETENSORS || format == CKPT_FORMAT_SHARDED ||
        ckpt_root_is_torchscript(f))
        return CKPT_OK;
    code_walk w = {.f = f};
    ckpt_map_init(&w.seen, CKPT_MAP_U64);
    bool *told = calloc(f->nallowed ? f->nallowed : 1, sizeof(*told));
    int rc = told ? reach(&w, f->root, SIZE_MAX, NULL) : ckpt_oom(&f->err);
    while (rc == CKPT_OK && w.next < w.n) {
        size_t i = w.next++; /* breadth first: the shallowest, first in order */
        const ckpt_value *g;
        bool module;
        if ((rc = look_into(&w, i, &g, &module)) != CKPT_OK || !g)
            continue;
        size_t named = named_global(f, g->u.global.name);
        if (!keep || named == SIZE_MAX || ckpt_globals_dangerous(g->u.global.name)) {
            rc = refuse_code(&w, i, g, module, keep);
            break;
        }
        if (!told[named] && kept)
            kept(user, f->allowed[named]);
        told[named] = true;
    }
    free(told);
    free(w.nodes);
    ckpt_map_release(&w.seen);
    return rc;
}
