/*
 * select.c - what a command works on: the mapping --select names, the state
 * dict a tensors-only format writes, and tied tensors (two names for one
 * view), found by a hash so that a million names stay linear.
 */
#include "checkpoint/checkpoint.h"

#include <stdlib.h>
#include <string.h>

/* The mapping at "a/b/0": dict keys (strings, else ints), list indices. */
int ckpt_file_find_mapping(ckpt_file *f, const char *select, ckpt_value **out, ckpt_path *path)
{
    ckpt_value *v = f->root;
    char *copy = strdup(select);
    size_t nparts = 1;
    for (const char *p = select; *p; p++)
        nparts += *p == '/';
    ckpt_path_elem *elems = ckpt_arena_alloc(&f->arena, nparts * sizeof(*elems));
    if (!copy || !elems) {
        free(copy);
        return ckpt_oom(&f->err);
    }
    size_t depth = 0;
    int rc = CKPT_OK;
    char *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part && rc == CKPT_OK;
         part = strtok_r(NULL, "/", &save)) {
        ckpt_value *next = NULL;
        ckpt_path_elem e = {0};
        char *end;
        long long idx = strtoll(part, &end, 10);
        bool numeric = *part && !*end;
        if (v->kind == CKPT_KIND_DICT) {
            next = (ckpt_value *)ckpt_value_dict_get(v, part);
            if (!next && depth == 0 && f->main.ops && f->main.ops->select_extra) {
                /* a mapping a folder format offers beside its root */
                rc = f->main.ops->select_extra(f, part, &next);
                if (rc)
                    break;
            }
            if (next) {
                e.key = ckpt_arena_strndup(&f->arena, part, strlen(part));
            } else if (numeric) {
                for (size_t i = v->u.dict.keys.len; i-- > 0 && !next;) {
                    ckpt_value *k = v->u.dict.keys.items[i];
                    if (k->kind == CKPT_KIND_INT && !k->u.i.big && k->u.i.v == idx)
                        next = v->u.dict.vals.items[i];
                }
                e.is_int = 1;
                e.index = idx;
            }
        } else if (v->kind == CKPT_KIND_OBJECT && (v->flags & CKPT_VF_MODULE) && v->u.obj.module_sd &&
                   (next = (ckpt_value *)ckpt_value_dict_get(v->u.obj.module_sd, part))) {
            e.key = ckpt_arena_strndup(&f->arena, part, strlen(part)); /* a module's key */
        } else if ((v->kind == CKPT_KIND_LIST || v->kind == CKPT_KIND_TUPLE) && numeric && idx >= 0 &&
                   (size_t)idx < v->u.seq.len) {
            next = v->u.seq.items[idx];
            e.is_int = 1;
            e.index = idx;
        }
        if (!next)
            rc = ckpt_err(&f->err, CKPT_ERR_FORMAT, "--select '%s': there is no '%s' in the %s",
                          select, part, ckpt_value_kind_name(v));
        else {
            elems[depth++] = e;
            v = next;
        }
    }
    free(copy);
    CKPT_FORWARD(rc);
    if (v->kind == CKPT_KIND_OBJECT && (v->flags & CKPT_VF_MODULE) &&
        !(v = ckpt_module_state_dict(f, v))) /* a module: its state_dict() */
        return f->err.code;
    if (v->kind != CKPT_KIND_DICT)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT, "--select '%s' names %s %s, not a mapping", select,
                        strchr("aeiouAEIOU", ckpt_value_kind_name(v)[0]) ? "an" : "a",
                        ckpt_value_kind_name(v));
    path->len = depth;
    path->elems = elems;
    *out = v;
    return CKPT_OK;
}

/* "'a', 'b/c', ... (and N more)": the paths of the state dicts WHICH marks
 * (all when WHICH is NULL), each cut at 120 bytes with a mark, the list at
 * about 300 bytes with a count of those left out. */
static void candidate_names(const ckpt_file *f, const bool *which, char *names, size_t cap)
{
    size_t shown = 0, total = 0;
    bool full = false;
    names[0] = '\0';
    for (size_t i = 0; i < f->state_dicts.len; i++) {
        if (which && !which[i])
            continue;
        total++;
        char p[128];
        size_t need = ckpt_path_format(&f->state_dicts.items[i].path, p, sizeof(p));
        if (need >= 120) {
            size_t cut = 117;
            while (cut && ((unsigned char)p[cut] & 0xC0) == 0x80)
                cut--; /* never inside a UTF-8 sequence */
            memcpy(p + cut, "\xe2\x80\xa6", 4); /* "…" and the NUL */
        }
        size_t len = strlen(names);
        if (full || (full = len + strlen(p) + 4 > 300))
            continue; /* counted below */
        snprintf(names + len, cap - len, "%s'%s'", shown ? ", " : "",
                 f->state_dicts.items[i].path.len ? p : "(root)");
        shown++;
    }
    if (shown < total) {
        size_t len = strlen(names);
        snprintf(names + len, cap - len, " (and %zu more)", total - shown);
    }
}

CKPT_API int ckpt_file_pick_state_dict(ckpt_file *f, size_t *index)
{
    if (!ckpt_file_valid(f) || !index)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    /* the root, or a module tree: the model whatever else the file holds */
    for (size_t i = 0; i < f->state_dicts.len; i++)
        if (f->state_dicts.items[i].value == f->root ||
            ckpt_value_is_module_sd(f->state_dicts.items[i].value)) {
            *index = i;
            return CKPT_OK;
        }
    /* else the only state dict, or the only model's (not an optimizer's) */
    bool *model = calloc(f->state_dicts.len ? f->state_dicts.len : 1, sizeof(*model));
    if (!model)
        return ckpt_oom(&f->err);
    size_t nmodel = 0, last = 0;
    for (size_t i = 0; i < f->state_dicts.len; i++)
        if ((model[i] = ckpt_state_dict_is_model(f, &f->state_dicts.items[i].path))) {
            nmodel++;
            last = i;
        }
    if (f->state_dicts.len == 1 || nmodel == 1) {
        free(model);
        *index = f->state_dicts.len == 1 ? 0 : last;
        return CKPT_OK;
    }
    char names[400];
    /* the candidates: the models' state dicts, else every one */
    candidate_names(f, nmodel ? model : NULL, names, sizeof(names));
    free(model);
    if (!f->state_dicts.len) /* nothing to name: the file, not the command line */
        return ckpt_err(&f->err, CKPT_ERR_UNSUPPORTED,
                        "no state dict or module tree in this file (no mapping whose values are "
                        "all tensors)");
    if (nmodel)
        return ckpt_err(&f->err, CKPT_ERR_USAGE,
                        "which state dict? %zu are a model's: %s; name one with --select", nmodel,
                        names);
    return ckpt_err(&f->err, CKPT_ERR_USAGE,
                    "which state dict? none is a model's (optimizer state, training-loop "
                    "bookkeeping): %s; name one with --select", names);
}

/* The mapping to write: --select, the root when it was selected or is all
 * tensors, or the one ckpt_file_pick_state_dict takes. */
int ckpt_pick_state_dict(ckpt_file *f, const char *select, const ckpt_value **out)
{
    if (select && *select) {
        ckpt_value *v;
        ckpt_path p;
        CKPT_FORWARD(ckpt_file_find_mapping(f, select, &v, &p));
        *out = v;
        return CKPT_OK;
    }
    if (f->root->kind == CKPT_KIND_DICT && f->file_root) {
        *out = f->root; /* already selected (ckpt_file_select): that mapping, whatever it holds */
        return CKPT_OK;
    }
    if (f->root->kind == CKPT_KIND_DICT) {
        bool all = f->root->u.dict.keys.len > 0;
        for (size_t i = 0; i < f->root->u.dict.keys.len && all; i++)
            all = f->root->u.dict.vals.items[i]->kind == CKPT_KIND_TENSOR;
        if (all) {
            *out = f->root;
            return CKPT_OK;
        }
    }
    size_t i;
    CKPT_FORWARD(ckpt_file_pick_state_dict(f, &i));
    *out = f->state_dicts.items[i].value;
    return CKPT_OK;
}

/* An optimizer's state_dict(): a mapping holding `state` (a mapping) and
 * `param_groups` (a list). */
static bool is_optimizer_state(const ckpt_value *v)
{
    const ckpt_value *st = ckpt_value_dict_get(v, "state");
    const ckpt_value *pg = ckpt_value_dict_get(v, "param_groups");
    return st && pg && st->kind == CKPT_KIND_DICT &&
           (pg->kind == CKPT_KIND_LIST || pg->kind == CKPT_KIND_TUPLE);
}

bool ckpt_state_dict_is_model(const ckpt_file *f, const ckpt_path *path)
{
    /* the training loop's bookkeeping (Lightning's names): not a model's
     * state even where its values are all tensors (best_k_models: path ->
     * score) */
    static const char *const bookkeeping[] = {"callbacks", "loops", "lr_schedulers",
                                              "optimizer_states", "best_k_models"};
    const ckpt_value *v = f->root;
    for (size_t d = 0; v && d < path->len; d++) {
        const ckpt_path_elem *e = &path->elems[d];
        const ckpt_value *next = NULL;
        if (v->kind == CKPT_KIND_DICT) {
            if (is_optimizer_state(v))
                return false;
            if (!e->is_int)
                for (size_t k = 0; k < sizeof(bookkeeping) / sizeof(bookkeeping[0]); k++)
                    if (strcmp(e->key, bookkeeping[k]) == 0)
                        return false;
            for (size_t i = 0; i < v->u.dict.keys.len && !next; i++) {
                const ckpt_value *k = v->u.dict.keys.items[i];
                if (e->is_int ? k->kind == CKPT_KIND_INT && !k->u.i.big && k->u.i.v == e->index
                              : k->kind == CKPT_KIND_STR && strcmp(k->u.s.s, e->key) == 0)
                    next = v->u.dict.vals.items[i];
            }
        } else if ((v->kind == CKPT_KIND_LIST || v->kind == CKPT_KIND_TUPLE) && e->is_int &&
                   e->index >= 0 && (uint64_t)e->index < v->u.seq.len) {
            next = v->u.seq.items[e->index];
        }
        v = next;
    }
    return true;
}

CKPT_API int ckpt_file_state_dict_is_model(const ckpt_file *f, size_t i)
{
    if (!ckpt_file_valid(f) || i >= f->state_dicts.len)
        return 0;
    return ckpt_state_dict_is_model(f, &f->state_dicts.items[i].path);
}

bool ckpt_tensor_same_view(const ckpt_tensor *a, const ckpt_tensor *b)
{
    if (a == b)
        return true;
    if (a->storage != b->storage || a->offset != b->offset || a->ndim != b->ndim ||
        a->dtype != b->dtype)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d])
            return false;
    return true;
}

static uint64_t mix(uint64_t h, uint64_t x)
{
    return ckpt_fnv1a_add(h, &x, sizeof x);
}

uint64_t ckpt_tensor_view_hash(const ckpt_tensor *t)
{
    uint64_t h = CKPT_FNV1A_BASIS;
    h = mix(h, (uintptr_t)t->storage);
    h = mix(h, (uint64_t)t->offset);
    h = mix(h, (uint64_t)t->ndim);
    h = mix(h, (uint64_t)t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        h = mix(h, (uint64_t)t->shape[d]);
        h = mix(h, (uint64_t)t->stride[d]);
    }
    return h;
}

/* the view looked up (ARG: the views and which one) is view VAL's */
typedef struct view_probe {
    const ckpt_tensor *const *t;
    size_t i;
} view_probe;

static bool same_view(const void *arg, size_t val)
{
    const view_probe *p = arg;
    return ckpt_tensor_same_view(p->t[val], p->t[p->i]);
}

int ckpt_tensors_tied(ckpt_file *f, const ckpt_tensor *const *t, size_t n, long *first)
{
    ckpt_map views;
    ckpt_map_init(&views, CKPT_MAP_HASHED);
    if (ckpt_map_reserve(&views, n) < 0)
        return ckpt_oom(&f->err);
    for (size_t i = 0; i < n; i++) {
        view_probe p = {t, i};
        size_t j;
        /* reserved for all N: never grows, never fails */
        int r = ckpt_map_put_hashed(&views, ckpt_tensor_view_hash(t[i]), same_view, &p, i, &j);
        first[i] = r == 1 ? (long)j : -1;
    }
    ckpt_map_release(&views);
    return CKPT_OK;
}
