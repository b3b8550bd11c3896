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
    if (CKPT_GROW(l->items, l->cap, l->len + 1) < 0)
        return ckpt_oom(&f->err);
    ckpt_path_elem *p = NULL;
    if (w->depth) {
        p = ckpt_arena_alloc(&f->arena, w->depth * sizeof(*p));
        if (!p)
            return ckpt_oom(&f->err);
        memcpy(p, w->stack, w->depth * sizeof(*p));
    }
    l->items[l->len].value = v;
    l->items[l->len].module_class = ckpt_value_is_module_sd(v) ? v->u.dict.module_class : NULL;
    l->items[l->len].path.len = w->depth;
    l->items[l->len].path.elems = p;
    l->len++;
    return CKPT_OK;
}

static int enter(walker *w, const ckpt_path_elem *e)
{
    if (CKPT_GROW(w->stack, w->cap, w->depth + 1) < 0)
        return ckpt_oom(&w->f->err);
    w->stack[w->depth++] = *e;
    return CKPT_OK;
}

/* ---- module trees: model.state_dict() of a pickled nn.Module ---- */

typedef struct module_walk {
    ckpt_file *f;
    ckpt_value *sd, *meta;
    const ckpt_value *path[256]; /* the modules above (a cycle guard) */
    size_t depth;
    char unknown_version[200]; /* a class whose _version is not in the file */
    char hooked[200];          /* a module with a state-dict hook */
} module_walk;

static const ckpt_value *state_get(const ckpt_value *state, const char *key)
{
    const ckpt_value *v = ckpt_value_dict_get(state, key);
    return v && v->kind == CKPT_KIND_DICT ? v : NULL;
}

static bool in_set(const ckpt_value *set, const ckpt_value *name)
{
    for (size_t i = 0; set && (set->kind == CKPT_KIND_SET || set->kind == CKPT_KIND_LIST) &&
                       i < set->u.seq.len;
         i++)
        if (set->u.seq.items[i]->kind == CKPT_KIND_STR &&
            strcmp(set->u.seq.items[i]->u.s.s, name->u.s.s) == 0)
            return true;
    return false;
}

/* _version of a class: a class attribute, never in the pickle.  torch.nn's
 * own (the same in 1.13 and 2.x): 2 for the batch and instance norms. */
static int64_t class_version(module_walk *mw, const char *cls)
{
    static const char *const two[] = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
                                      "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d",
                                      "SyncBatchNorm", "InstanceNorm1d", "InstanceNorm2d",
                                      "InstanceNorm3d", "LazyInstanceNorm1d",
                                      "LazyInstanceNorm2d", "LazyInstanceNorm3d"};
    if (strncmp(cls, "torch.nn.", 9) != 0) {
        if (!mw->unknown_version[0])
            snprintf(mw->unknown_version, sizeof(mw->unknown_version), "%s", cls);
        return 1;
    }
    const char *base = strrchr(cls, '.') + 1;
    for (size_t i = 0; i < sizeof(two) / sizeof(two[0]); i++)
        if (strcmp(base, two[i]) == 0 && (strncmp(cls, "torch.nn.modules.batchnorm.", 27) == 0 ||
                                          strncmp(cls, "torch.nn.modules.instancenorm.", 30) == 0))
            return 2;
    return 1;
}

static int sd_add(module_walk *mw, ckpt_value *dict, const char *prefix, const char *name,
                  ckpt_value *val)
{
    ckpt_arena *a = &mw->f->arena;
    size_t pl = strlen(prefix), nl = strlen(name);
    ckpt_value *k = ckpt_value_new(a, CKPT_KIND_STR, 0);
    char *s = ckpt_arena_alloc(a, pl + nl + 1);
    if (!k || !s)
        return ckpt_oom(&mw->f->err);
    memcpy(s, prefix, pl);
    memcpy(s + pl, name, nl + 1);
    k->u.s.s = s;
    k->u.s.len = pl + nl;
    if (ckpt_vec_push(a, &dict->u.dict.keys, k) || ckpt_vec_push(a, &dict->u.dict.vals, val))
        return ckpt_oom(&mw->f->err);
    return CKPT_OK;
}

/* What state_dict() holds for a parameter or buffer: the tensor, detached
 * (not a Parameter, no grad), sharing the storage. */
static ckpt_value *plain_tensor(ckpt_file *f, const ckpt_value *v)
{
    ckpt_value *c = ckpt_value_new(&f->arena, CKPT_KIND_TENSOR, v->offset);
    ckpt_tensor *t = ckpt_arena_alloc(&f->arena, sizeof(*t));
    if (!c || !t)
        return NULL;
    *t = *v->u.tensor;
    t->parameter = false;
    t->requires_grad = false;
    t->param_rebuild = NULL;
    t->param_args = NULL;
    t->state = NULL;
    t->type_args = NULL;
    /* a requires_grad written in the tensor's own call (TorchScript's
     * parameters have no _rebuild_parameter around it) is written back as
     * False: state_dict() detaches */
    const ckpt_value *a = t->rebuild_args;
    if (a && a->kind == CKPT_KIND_TUPLE && a->u.seq.len >= 6 && t->rebuild &&
        strncmp(t->rebuild, "_rebuild_tensor_v", 17) == 0 &&
        a->u.seq.items[4]->kind == CKPT_KIND_BOOL && a->u.seq.items[4]->u.b) {
        ckpt_value *na = ckpt_value_new(&f->arena, CKPT_KIND_TUPLE, a->offset),
                   *no = ckpt_value_new(&f->arena, CKPT_KIND_BOOL, a->u.seq.items[4]->offset);
        if (!na || !no)
            return NULL;
        for (size_t i = 0; i < a->u.seq.len; i++)
            if (ckpt_vec_push(&f->arena, &na->u.seq, i == 4 ? no : a->u.seq.items[i]))
                return NULL;
        t->rebuild_args = na;
    }
    c->u.tensor = t;
    return c;
}

/* Module M at PREFIX: its parameters, persistent buffers, then its children
 * (torch's Module._save_to_state_dict and state_dict order). */
static int module_collect(module_walk *mw, ckpt_value *m, const char *prefix)
{
    ckpt_file *f = mw->f;
    bool cycle = false;
    for (size_t i = 0; i < mw->depth; i++)
        cycle |= mw->path[i] == m;
    if (cycle)
        return ckpt_err(&f->err, CKPT_ERR_FORMAT,
                        "module tree: a module inside itself (at '%.200s')", prefix);
    if (mw->depth >= sizeof(mw->path) / sizeof(mw->path[0]))
        return ckpt_err(&f->err, CKPT_ERR_LIMIT, "module tree nested more than %zu deep",
                        sizeof(mw->path) / sizeof(mw->path[0]));
    const ckpt_value *st = m->u.obj.state;
    const ckpt_value *params = state_get(st, "_parameters"), *bufs = state_get(st, "_buffers"),
                     *mods = state_get(st, "_modules"),
                     *nonpersistent = ckpt_value_dict_get(st, "_non_persistent_buffers_set");
    const char *cls = m->u.obj.callable->kind == CKPT_KIND_GLOBAL
                          ? m->u.obj.callable->u.global.name : "?";
    /* _metadata: every module visited, "" for the root */
    size_t pl = strlen(prefix);
    char *mpath = ckpt_arena_strndup(&f->arena, prefix, pl ? pl - 1 : 0);
    ckpt_value *ver = ckpt_value_new(&f->arena, CKPT_KIND_DICT, 0),
               *vnum = ckpt_value_new(&f->arena, CKPT_KIND_INT, 0);
    if (!mpath || !ver || !vnum)
        return ckpt_oom(&f->err);
    vnum->u.i.v = class_version(mw, cls);
    CKPT_FORWARD(sd_add(mw, ver, "", "version", vnum));
    CKPT_FORWARD(sd_add(mw, mw->meta, "", mpath, ver));
    static const char *const hooks[] = {"_state_dict_hooks", "_state_dict_pre_hooks"};
    for (size_t i = 0; i < 2 && !mw->hooked[0]; i++) {
        const ckpt_value *h = state_get(st, hooks[i]);
        if (h && h->u.dict.keys.len)
            snprintf(mw->hooked, sizeof(mw->hooked), "'%s' (%s)", pl ? mpath : "(root)", cls);
    }
    for (size_t i = 0; params && i < params->u.dict.keys.len; i++) {
        ckpt_value *k = params->u.dict.keys.items[i], *v = params->u.dict.vals.items[i];
        if (k->kind != CKPT_KIND_STR || v->kind != CKPT_KIND_TENSOR)
            continue; /* None: not in the state dict */
        CKPT_FORWARD(ckpt_key_check(&f->err, k->u.s.s, k->u.s.len));
        ckpt_value *c = plain_tensor(f, v);
        if (!c)
            return ckpt_oom(&f->err);
        CKPT_FORWARD(sd_add(mw, mw->sd, prefix, k->u.s.s, c));
    }
    for (size_t i = 0; bufs && i < bufs->u.dict.keys.len; i++) {
        ckpt_value *k = bufs->u.dict.keys.items[i], *v = bufs->u.dict.vals.items[i];
        if (k->kind != CKPT_KIND_STR || v->kind != CKPT_KIND_TENSOR || in_set(nonpersistent, k))
            continue;
        CKPT_FORWARD(ckpt_key_check(&f->err, k->u.s.s, k->u.s.len));
        ckpt_value *c = plain_tensor(f, v);
        if (!c)
            return ckpt_oom(&f->err);
        CKPT_FORWARD(sd_add(mw, mw->sd, prefix, k->u.s.s, c));
    }
    mw->path[mw->depth++] = m;
    int rc = CKPT_OK;
    for (size_t i = 0; mods && i < mods->u.dict.keys.len && rc == CKPT_OK; i++) {
        ckpt_value *k = mods->u.dict.keys.items[i], *v = mods->u.dict.vals.items[i];
        if (k->kind != CKPT_KIND_STR || v->kind != CKPT_KIND_OBJECT || !(v->flags & CKPT_VF_MODULE))
            continue; /* None children; anything else is not a module torch would visit */
        size_t kl = k->u.s.len;
        if ((rc = ckpt_key_check(&f->err, k->u.s.s, kl)))
            break;
        char *sub = malloc(pl + kl + 2);
        if (!sub) {
            rc = ckpt_oom(&f->err);
            break;
        }
        memcpy(sub, prefix, pl);
        memcpy(sub + pl, k->u.s.s, kl);
        memcpy(sub + pl + kl, ".", 2);
        rc = module_collect(mw, v, sub); /* a shared child: keys under every path */
        free(sub);
    }
    mw->depth--;
    return rc;
}

ckpt_value *ckpt_module_sd_new(ckpt_file *f, const ckpt_value *module)
{
    ckpt_value *sd = ckpt_value_new(&f->arena, CKPT_KIND_DICT, module->offset);
    if (!sd) {
        ckpt_oom(&f->err);
        return NULL;
    }
    sd->flags |= CKPT_VF_ORDERED | CKPT_VF_MODULE_SD;
    sd->u.dict.module_class = module->kind == CKPT_KIND_OBJECT &&
                                      module->u.obj.callable->kind == CKPT_KIND_GLOBAL
                                  ? module->u.obj.callable->u.global.name : "?";
    return sd;
}

int ckpt_module_sd_add(ckpt_file *f, ckpt_value *sd, const char *prefix, const char *name,
                       const ckpt_value *tensor)
{
    module_walk mw = {.f = f};
    ckpt_value *c = plain_tensor(f, tensor);
    if (!c)
        return ckpt_oom(&f->err);
    return sd_add(&mw, sd, prefix, name, c);
}

bool ckpt_root_is_torchscript(const ckpt_file *f)
{
    const ckpt_value *r = f->root;
    return r && r->kind == CKPT_KIND_OBJECT && (r->flags & CKPT_VF_MODULE) && r->u.obj.module_sd &&
           (r->u.obj.module_sd->flags & CKPT_VF_TORCHSCRIPT);
}

bool ckpt_value_is_module_sd(const ckpt_value *v)
{
    return v && v->kind == CKPT_KIND_DICT && (v->flags & CKPT_VF_MODULE_SD);
}

ckpt_value *ckpt_module_state_dict(ckpt_file *f, ckpt_value *module)
{
    if (module->u.obj.module_sd)
        return module->u.obj.module_sd;
    module_walk mw = {.f = f};
    ckpt_value *state = ckpt_value_new(&f->arena, CKPT_KIND_DICT, module->offset);
    mw.sd = ckpt_value_new(&f->arena, CKPT_KIND_DICT, module->offset);
    mw.meta = ckpt_value_new(&f->arena, CKPT_KIND_DICT, module->offset);
    if (!state || !mw.sd || !mw.meta) {
        ckpt_oom(&f->err);
        return NULL;
    }
    mw.sd->flags |= CKPT_VF_ORDERED | CKPT_VF_MODULE_SD;
    mw.meta->flags |= CKPT_VF_ORDERED;
    if (module_collect(&mw, module, "") || sd_add(&mw, state, "", "_metadata", mw.meta))
        return NULL;
    mw.sd->u.dict.state = state; /* state_dict()'s _metadata attribute */
    mw.sd->u.dict.module_class = module->u.obj.callable->kind == CKPT_KIND_GLOBAL
                                     ? module->u.obj.callable->u.global.name : "?";
    if (mw.hooked[0] &&
        ckpt_file_notice_add(f, "module %s has a state-dict hook: torch's state_dict() may name "
                                "its keys otherwise than the module tree does", mw.hooked) < 0)
        return NULL;
    if (mw.unknown_version[0] &&
        !(mw.sd->u.dict.unknown_version =
              ckpt_arena_strndup(&f->arena, mw.unknown_version, strlen(mw.unknown_version)))) {
        ckpt_oom(&f->err);
        return NULL;
    }
    module->u.obj.module_sd = mw.sd;
    return mw.sd;
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

static int walk_vec(walker *w, const ckpt_vec *vec, size_t level, bool on_path)
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
                        "values nested more than %llu levels deep (pickle byte %llu; --max-depth)",
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
            rc = ckpt_oom(&f->err);
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
                /* a scalar's key is never a path's, and is kept whole */
                if (on_path && v->u.dict.vals.items[i]->kind > CKPT_KIND_BYTES &&
                    (rc = ckpt_key_check(&f->err, k->u.s.s, k->u.s.len)))
                    break;
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
        if (on_path && (v->flags & CKPT_VF_MODULE)) {
            /* a module tree: seen as the state dict model.state_dict() gives */
            ckpt_value *sd = ckpt_module_state_dict(f, v);
            rc = sd ? walk(w, sd, level + 1, true) : f->err.code;
            break;
        }
        if (on_path)
            rc = list_add(w, &f->objects, v);
        if (!rc && v->u.obj.args)
            rc = walk_child(w, v->u.obj.args, NULL, level, false);
        if (!rc && v->u.obj.kwargs)
            rc = walk_child(w, v->u.obj.kwargs, NULL, level, false);
        if (!rc && v->u.obj.state)
            rc = walk_child(w, v->u.obj.state, NULL, level, false);
        if (!rc)
            rc = walk_vec(w, &ckpt_obj_items_of(v)->listitems, level, false);
        if (!rc)
            rc = walk_vec(w, &ckpt_obj_items_of(v)->dictvals, level, false);
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
        unmark(v->u.obj.module_sd);
        unmark(v->u.obj.args);
        unmark(v->u.obj.kwargs);
        unmark(v->u.obj.state);
        for (size_t i = 0; i < ckpt_obj_items_of(v)->listitems.len; i++)
            unmark(ckpt_obj_items_of(v)->listitems.items[i]);
        for (size_t i = 0; i < ckpt_obj_items_of(v)->dictvals.len; i++)
            unmark(ckpt_obj_items_of(v)->dictvals.items[i]);
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

/* Per-rank FSDP files (pickle/rebuild.c: rebuild_sharded): say once that the
 * tensors listed are one rank's shards, which every writer writes as plain
 * tensors of the shard's shape. */
static int note_shards(ckpt_file *f)
{
    size_t n = 0;
    const ckpt_tensor *first = NULL;
    for (size_t i = 0; i < f->tensors.len; i++) {
        const ckpt_value *v = f->tensors.items[i].value;
        if (v->kind == CKPT_KIND_TENSOR && v->u.tensor->shard && !n++)
            first = v->u.tensor;
    }
    if (!n)
        return CKPT_OK;
    char rank[32] = "one rank";
    if (first->shard->rank >= 0)
        snprintf(rank, sizeof rank, "rank %d", first->shard->rank);
    if (ckpt_file_notice_add(f, "%zu tensor%s, each %s's shard of a sharded tensor (%s): read, "
                             "converted and extracted as a plain tensor of the shard's shape; "
                             "assembling the whole needs every rank's file", n, n == 1 ? "" : "s",
                             rank, first->shard->type) < 0)
        return ckpt_oom(&f->err);
    return CKPT_OK;
}

int ckpt_file_index(ckpt_file *f)
{
    walker w = {.f = f};
    int rc = walk(&w, f->root, 0, true);
    free(w.stack);
    return rc ? rc : note_shards(f);
}

/* ---- dict key merging ---- */

int ckpt_key_check(ckpt_error *err, const char *s, size_t len)
{
    if (!memchr(s, 0, len))
        return CKPT_OK;
    char shown[200];
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < sizeof shown; i++) {
        if (s[i])
            shown[o++] = s[i];
        else
            o += (size_t)snprintf(shown + o, sizeof shown - o, "\\x00");
    }
    shown[o] = '\0';
    return ckpt_err(err, CKPT_ERR_UNSUPPORTED, "key '%s%s' " CKPT_NAME_NUL, shown,
                    o + 8 < sizeof shown ? "" : "...");
}

int ckpt_dict_names_unique(ckpt_error *err, const ckpt_value *d)
{
    size_t n = d->u.dict.keys.len;
    ckpt_map names;
    ckpt_map_init(&names, CKPT_MAP_BYTES);
    int rc = ckpt_map_reserve(&names, n) < 0 ? ckpt_oom(err) : CKPT_OK;
    for (size_t i = 0; i < n && rc == CKPT_OK; i++) {
        const ckpt_value *k = d->u.dict.keys.items[i];
        if (k->kind != CKPT_KIND_STR)
            continue;
        /* as a writer takes it: up to its first NUL */
        int r = ckpt_map_put(&names, k->u.s.s, strlen(k->u.s.s), i, NULL);
        if (r < 0)
            rc = ckpt_oom(err);
        else if (r == 1)
            rc = ckpt_err(err, CKPT_ERR_FORMAT,
                          "two tensors would be written under the name '%.200s': refused, nothing "
                          "written (neither torch nor safetensors would read both back)",
                          k->u.s.s);
    }
    ckpt_map_release(&names);
    return rc;
}

int ckpt_dict_dedupe(ckpt_arena *a, ckpt_value *d)
{
    (void)a;
    size_t n = d->u.dict.keys.len;
    if (n < 2)
        return 0;
    /* str and int keys (big ints and other kinds are never merged): each
     * key -> its index in the dict being compacted; reserved first, so that
     * the dict is left whole when memory runs out */
    ckpt_value **keys = d->u.dict.keys.items, **vals = d->u.dict.vals.items;
    size_t nstr = 0, nint = 0;
    for (size_t i = 0; i < n; i++) {
        nstr += keys[i]->kind == CKPT_KIND_STR;
        nint += keys[i]->kind == CKPT_KIND_INT && !keys[i]->u.i.big;
    }
    ckpt_map strs, ints;
    ckpt_map_init(&strs, CKPT_MAP_BYTES);
    ckpt_map_init(&ints, CKPT_MAP_U64);
    int r = ckpt_map_reserve(&strs, nstr) < 0 || ckpt_map_reserve(&ints, nint) < 0 ? -1 : 0;
    size_t out = 0;
    for (size_t i = 0; i < n && r >= 0; i++) {
        const ckpt_value *k = keys[i];
        size_t first;
        if (k->kind == CKPT_KIND_STR)
            r = ckpt_map_put(&strs, k->u.s.s, k->u.s.len, out, &first);
        else if (k->kind == CKPT_KIND_INT && !k->u.i.big)
            r = ckpt_map_put_u64(&ints, (uint64_t)k->u.i.v, out, &first);
        else
            r = 0;
        if (r == 1) { /* repeated key: the value changes, the place stays */
            vals[first] = vals[i];
            continue;
        }
        keys[out] = keys[i];
        vals[out] = vals[i];
        out++;
    }
    ckpt_map_release(&strs);
    ckpt_map_release(&ints);
    if (r < 0)
        return -1;
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

CKPT_API const char *ckpt_file_state_dict_source(const ckpt_file *f, size_t i)
{
    const ckpt_value *v = list_get(f, &f->state_dicts, i, NULL);
    const ckpt_format_ops *ops = v ? f->main.ops : NULL;
    return !v                                ? NULL
           : ops && ops->sd_source            ? ops->sd_source /* a folder format's own */
           : !ckpt_value_is_module_sd(v)      ? "mapping"
           : (v->flags & CKPT_VF_TORCHSCRIPT) ? "torchscript"
                                              : "module-tree";
}

CKPT_API const char *ckpt_file_state_dict_class(const ckpt_file *f, size_t i)
{
    return list_get(f, &f->state_dicts, i, NULL) ? f->state_dicts.items[i].module_class : NULL;
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

char *ckpt_key_unwrap(const char *key)
{
    char *out = strdup(key);
    if (!out)
        return NULL;
    size_t pos = 0;
    while (out[pos]) {
        bool removed = false;
        if (pos == 0 || out[pos - 1] == '.')
            for (size_t w = 0; w < NWRAPPERS; w++) {
                size_t wl = strlen(wrapper_names[w]);
                if (strncmp(out + pos, wrapper_names[w], wl) == 0) {
                    memmove(out + pos, out + pos + wl, strlen(out + pos + wl) + 1);
                    removed = true;
                    break;
                }
            }
        if (!removed)
            pos++;
    }
    return out;
}

CKPT_API const char *ckpt_file_layout(const ckpt_file *f)
{
    return f && f->magic == CKPT_FILE_MAGIC && f->main.ops && f->main.ops->layout
               ? f->main.ops->layout(f)
               : NULL;
}

CKPT_API size_t ckpt_storage_run_count(const ckpt_storage *s)
{
    return s && s->loc == CKPT_LOC_PIECES ? s->npieces : 0;
}

CKPT_API int ckpt_storage_run(const ckpt_storage *s, size_t i, const char **file,
                              uint64_t *file_offset, uint64_t *nbytes, uint64_t *storage_offset)
{
    if (!s || s->loc != CKPT_LOC_PIECES || i >= s->npieces)
        return CKPT_ERR_USAGE;
    const ckpt_piece *p = &s->pieces[i];
    *file = p->mem || !p->src ? NULL : p->src->path;
    *file_offset = p->file_offset;
    *nbytes = p->nbytes;
    *storage_offset = p->dst_offset;
    return CKPT_OK;
}

CKPT_API int ckpt_file_check_records(ckpt_file *f)
{
    if (!f || f->magic != CKPT_FILE_MAGIC)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&f->err);
    const ckpt_format_ops *ops = f->main.ops;
    return ops && ops->check_records ? ops->check_records(f, &f->err) : CKPT_OK;
}
