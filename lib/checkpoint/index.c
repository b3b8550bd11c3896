/*
 * index.c - one walk over the value tree after parsing: it checks nesting
 * depth (and survives cycles), merges repeated dict keys, and lists every
 * tensor, state dict and opaque object with its path from the root.
 */
#include "checkpoint/checkpoint.h"

#include <stdlib.h>
#include <string.h>

typedef struct walker {
    ckpt_file *f;
    ckpt_path_elem *stack;
    size_t depth, cap;
} walker;

static int list_add(walker *w, ckpt_walk_list *l, const ckpt_value *v)
{
    ckpt_file *f = w->f;
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        ckpt_walk_entry *e = realloc(l->items, cap * sizeof(*e));
        if (!e)
            return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
        l->items = e;
        l->cap = cap;
    }
    ckpt_path_elem *p = NULL;
    if (w->depth) {
        p = ckpt_arena_alloc(&f->arena, w->depth * sizeof(*p));
        if (!p)
            return ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
        memcpy(p, w->stack, w->depth * sizeof(*p));
    }
    l->items[l->len].value = v;
    l->items[l->len].path.len = w->depth;
    l->items[l->len].path.elems = p;
    l->len++;
    return CKPT_OK;
}

static int enter(walker *w, const ckpt_path_elem *e)
{
    if (w->depth == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 32;
        ckpt_path_elem *s = realloc(w->stack, cap * sizeof(*s));
        if (!s)
            return ckpt_err(&w->f->err, CKPT_ERR_NOMEM, "out of memory");
        w->stack = s;
        w->cap = cap;
    }
    w->stack[w->depth++] = *e;
    return CKPT_OK;
}

static bool is_state_dict(const ckpt_value *d)
{
    if (d->u.dict.keys.len == 0)
        return false;
    for (size_t i = 0; i < d->u.dict.keys.len; i++)
        if (d->u.dict.keys.items[i]->kind != CKPT_KIND_STR ||
            d->u.dict.vals.items[i]->kind != CKPT_KIND_TENSOR)
            return false;
    return true;
}

static int walk(walker *w, ckpt_value *v, size_t level, bool on_path);

static int walk_child(walker *w, ckpt_value *child, const ckpt_path_elem *e, size_t level,
                      bool on_path)
{
    if (!child)
        return CKPT_OK;
    if (on_path && e) {
        CKPT_FORWARD(enter(w, e));
        int rc = walk(w, child, level + 1, true);
        w->depth--;
        return rc;
    }
    return walk(w, child, level + 1, false);
}

static int walk_vec(walker *w, ckpt_vec *vec, size_t level, bool on_path)
{
    for (size_t i = 0; i < vec->len; i++) {
        ckpt_path_elem e = {.is_int = 1, .index = (int64_t)i};
        CKPT_FORWARD(walk_child(w, vec->items[i], &e, level, on_path));
    }
    return CKPT_OK;
}

static int walk(walker *w, ckpt_value *v, size_t level, bool on_path)
{
    ckpt_file *f = w->f;
    if (level > f->limits[CKPT_LIMIT_DEPTH])
        return ckpt_err(&f->err, CKPT_ERR_LIMIT,
                        "values nested more than %llu levels deep (pickle byte %llu)",
                        (unsigned long long)f->limits[CKPT_LIMIT_DEPTH],
                        (unsigned long long)v->offset);
    switch (v->kind) {
    case CKPT_KIND_TENSOR:
        if (on_path)
            CKPT_FORWARD(list_add(w, &f->tensors, v));
        if (v->u.tensor->state)
            CKPT_FORWARD(walk_child(w, v->u.tensor->state, NULL, level, false));
        return CKPT_OK;
    case CKPT_KIND_GLOBAL:
        if (on_path && v->u.global.cls != CKPT_GLOBAL_INTERPRETED)
            CKPT_FORWARD(list_add(w, &f->objects, v));
        return CKPT_OK;
    case CKPT_KIND_DICT:
    case CKPT_KIND_LIST:
    case CKPT_KIND_TUPLE:
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
    case CKPT_KIND_OBJECT:
        break;
    default:
        return CKPT_OK;
    }
    /* Containers are walked once: a second reference (or a cycle) is not
     * followed, so shared sub-trees cannot blow the walk up. */
    if (v->flags & (CKPT_VF_VISITED | CKPT_VF_WALKING))
        return CKPT_OK;
    v->flags |= CKPT_VF_WALKING;
    int rc = CKPT_OK;
    switch (v->kind) {
    case CKPT_KIND_DICT:
        if (ckpt_dict_dedupe(&f->arena, v)) {
            rc = ckpt_err(&f->err, CKPT_ERR_NOMEM, "out of memory");
            break;
        }
        if (on_path && is_state_dict(v) && (rc = list_add(w, &f->state_dicts, v)))
            break;
        for (size_t i = 0; i < v->u.dict.keys.len && !rc; i++) {
            const ckpt_value *k = v->u.dict.keys.items[i];
            ckpt_path_elem e = {0};
            bool keyed = true;
            if (k->kind == CKPT_KIND_STR) {
                e.key = k->u.s.s;
            } else if (k->kind == CKPT_KIND_INT && !k->u.i.big) {
                e.is_int = 1;
                e.index = k->u.i.v;
            } else {
                keyed = false; /* a key a path cannot name (tuple, float, ...) */
            }
            rc = walk_child(w, v->u.dict.vals.items[i], keyed ? &e : NULL, level, on_path);
        }
        if (!rc && v->u.dict.state)
            rc = walk_child(w, v->u.dict.state, NULL, level, false);
        break;
    case CKPT_KIND_LIST:
    case CKPT_KIND_TUPLE:
        rc = walk_vec(w, &v->u.seq, level, on_path);
        break;
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
        rc = walk_vec(w, &v->u.seq, level, false);
        break;
    case CKPT_KIND_OBJECT:
        if (on_path)
            rc = list_add(w, &f->objects, v);
        if (!rc && v->u.obj.args)
            rc = walk_child(w, v->u.obj.args, NULL, level, false);
        if (!rc && v->u.obj.kwargs)
            rc = walk_child(w, v->u.obj.kwargs, NULL, level, false);
        if (!rc && v->u.obj.state)
            rc = walk_child(w, v->u.obj.state, NULL, level, false);
        if (!rc)
            rc = walk_vec(w, &v->u.obj.listitems, level, false);
        if (!rc)
            rc = walk_vec(w, &v->u.obj.dictvals, level, false);
        break;
    default:
        break;
    }
    v->flags &= (uint8_t)~CKPT_VF_WALKING;
    v->flags |= CKPT_VF_VISITED;
    return rc;
}

/* Undo the marks of an earlier walk: marked nodes are exactly the ones it
 * reached, so following marks terminates. */
static void unmark(ckpt_value *v)
{
    if (!v || !(v->flags & CKPT_VF_VISITED))
        return;
    v->flags &= (uint8_t)~CKPT_VF_VISITED;
    switch (v->kind) {
    case CKPT_KIND_DICT:
        for (size_t i = 0; i < v->u.dict.vals.len; i++)
            unmark(v->u.dict.vals.items[i]);
        unmark(v->u.dict.state);
        break;
    case CKPT_KIND_LIST:
    case CKPT_KIND_TUPLE:
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
        for (size_t i = 0; i < v->u.seq.len; i++)
            unmark(v->u.seq.items[i]);
        break;
    case CKPT_KIND_OBJECT:
        unmark(v->u.obj.args);
        unmark(v->u.obj.kwargs);
        unmark(v->u.obj.state);
        for (size_t i = 0; i < v->u.obj.listitems.len; i++)
            unmark(v->u.obj.listitems.items[i]);
        for (size_t i = 0; i < v->u.obj.dictvals.len; i++)
            unmark(v->u.obj.dictvals.items[i]);
        break;
    default:
        break;
    }
}

int ckpt_file_reindex(ckpt_file *f, ckpt_value *old_root)
{
    unmark(old_root);
    f->tensors.len = f->state_dicts.len = f->objects.len = 0;
    return ckpt_file_index(f);
}

int ckpt_file_index(ckpt_file *f)
{
    walker w = {.f = f};
    int rc = walk(&w, f->root, 0, true);
    free(w.stack);
    return rc;
}

/* ---- dict key merging ---- */

static bool same_key(const ckpt_value *a, const ckpt_value *b)
{
    if (a->kind == CKPT_KIND_STR && b->kind == CKPT_KIND_STR)
        return a->u.s.len == b->u.s.len && memcmp(a->u.s.s, b->u.s.s, a->u.s.len) == 0;
    if (a->kind == CKPT_KIND_INT && b->kind == CKPT_KIND_INT && !a->u.i.big && !b->u.i.big)
        return a->u.i.v == b->u.i.v;
    return false;
}

static uint64_t key_hash(const ckpt_value *k)
{
    uint64_t h = 1469598103934665603ull;
    if (k->kind == CKPT_KIND_STR) {
        for (size_t i = 0; i < k->u.s.len; i++)
            h = (h ^ (uint8_t)k->u.s.s[i]) * 1099511628211ull;
    } else if (k->kind == CKPT_KIND_INT && !k->u.i.big) {
        h ^= (uint64_t)k->u.i.v * 0x9e3779b97f4a7c15ull;
    } else {
        return 0;
    }
    return h | 1;
}

int ckpt_dict_dedupe(ckpt_arena *a, ckpt_value *d)
{
    (void)a;
    size_t n = d->u.dict.keys.len;
    if (n < 2)
        return 0;
    size_t size = 16;
    while (size < n * 2)
        size *= 2;
    size_t *slots = calloc(size, sizeof(*slots)); /* index + 1 */
    if (!slots)
        return -1;
    ckpt_value **keys = d->u.dict.keys.items, **vals = d->u.dict.vals.items;
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = key_hash(keys[i]);
        if (h) {
            size_t b = h & (size - 1);
            while (slots[b] && !same_key(keys[slots[b] - 1], keys[i]))
                b = (b + 1) & (size - 1);
            if (slots[b]) { /* repeated key: the value changes, the place stays */
                vals[slots[b] - 1] = vals[i];
                continue;
            }
            slots[b] = out + 1;
        }
        keys[out] = keys[i];
        vals[out] = vals[i];
        out++;
    }
    free(slots);
    d->u.dict.keys.len = d->u.dict.vals.len = out;
    return 0;
}

/* ---- public listing ---- */

static const ckpt_value *list_get(const ckpt_file *f, const ckpt_walk_list *l, size_t i,
                                  ckpt_path *path)
{
    if (!f || f->magic != CKPT_FILE_MAGIC || i >= l->len)
        return NULL;
    if (path)
        *path = l->items[i].path;
    return l->items[i].value;
}

CKPT_API size_t ckpt_file_tensor_count(const ckpt_file *f)
{
    return f && f->magic == CKPT_FILE_MAGIC ? f->tensors.len : 0;
}

CKPT_API const ckpt_tensor *ckpt_file_tensor(const ckpt_file *f, size_t i, ckpt_path *path)
{
    const ckpt_value *v = list_get(f, &f->tensors, i, path);
    return v ? v->u.tensor : NULL;
}

CKPT_API size_t ckpt_file_state_dict_count(const ckpt_file *f)
{
    return f && f->magic == CKPT_FILE_MAGIC ? f->state_dicts.len : 0;
}

CKPT_API const ckpt_value *ckpt_file_state_dict(const ckpt_file *f, size_t i, ckpt_path *path)
{
    return list_get(f, &f->state_dicts, i, path);
}

CKPT_API size_t ckpt_file_object_count(const ckpt_file *f)
{
    return f && f->magic == CKPT_FILE_MAGIC ? f->objects.len : 0;
}

CKPT_API const ckpt_value *ckpt_file_object(const ckpt_file *f, size_t i, ckpt_path *path)
{
    return list_get(f, &f->objects, i, path);
}

CKPT_API size_t ckpt_path_format(const ckpt_path *path, char *buf, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < path->len; i++) {
        char num[32];
        const char *s = path->elems[i].key;
        if (path->elems[i].is_int) {
            snprintf(num, sizeof(num), "%lld", (long long)path->elems[i].index);
            s = num;
        }
        size_t l = strlen(s);
        if (i) {
            if (n + 1 < cap)
                buf[n] = '/';
            n++;
        }
        if (n < cap)
            memcpy(buf + n, s, n + l < cap ? l : cap - n - 1);
        n += l;
    }
    if (cap)
        buf[n < cap ? n : cap - 1] = '\0';
    return n;
}

/* ---- wrapper prefixes ---- */

static const char *const wrapper_names[] = {
    "module.", "_orig_mod.", "_fsdp_wrapped_module.", "_forward_module.",
    "_checkpoint_wrapped_module.",
};
#define NWRAPPERS (sizeof(wrapper_names) / sizeof(wrapper_names[0]))

/* Does KEY have wrapper component W at a component boundary at or after FROM? */
static bool has_component(const char *key, size_t from, const char *w)
{
    for (const char *p = key + from; (p = strstr(p, w)) != NULL; p++)
        if (p == key + from || p[-1] == '.')
            return true;
    return false;
}

CKPT_API size_t ckpt_state_dict_wrappers(const ckpt_value *sd, const char **out, size_t cap)
{
    if (!sd || sd->kind != CKPT_KIND_DICT || sd->u.dict.keys.len == 0)
        return 0;
    const ckpt_vec *keys = &sd->u.dict.keys;
    size_t n = 0, at = 0;
    for (;;) { /* the chain every key starts with */
        const char *found = NULL;
        for (size_t w = 0; w < NWRAPPERS && !found; w++) {
            size_t wl = strlen(wrapper_names[w]);
            bool all = true;
            for (size_t i = 0; i < keys->len && all; i++) {
                const ckpt_value *k = keys->items[i];
                all = k->kind == CKPT_KIND_STR && k->u.s.len > at + wl &&
                      memcmp(k->u.s.s + at, wrapper_names[w], wl) == 0;
            }
            if (all)
                found = wrapper_names[w];
        }
        if (!found)
            break;
        if (n < cap)
            out[n] = found;
        n++;
        at += strlen(found);
    }
    for (size_t w = 0; w < NWRAPPERS; w++) { /* components elsewhere in keys */
        bool seen = false;
        for (size_t j = 0; j < n && j < cap; j++)
            seen |= out[j] == wrapper_names[w];
        for (size_t i = 0; i < keys->len && !seen; i++) {
            const ckpt_value *k = keys->items[i];
            if (k->kind == CKPT_KIND_STR && has_component(k->u.s.s, at, wrapper_names[w])) {
                if (n < cap)
                    out[n] = wrapper_names[w];
                n++;
                seen = true;
            }
        }
    }
    return n;
}
