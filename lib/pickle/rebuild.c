/*
 * pickle/rebuild.c - torch's _rebuild_* functions as the pickle VM (read.c)
 * meets them in a REDUCE: plain, quantized, sparse and meta tensors,
 * parameters, tensors with Python attributes, and the local shards of
 * per-rank FSDP files (ShardedTensor, DTensor).  Each checks its arguments
 * as torch would and pushes a TENSOR value that keeps the call, so a writer
 * can make the same call again.
 */
#include "pickle/rebuild.h"

#define MAX_NDIM 64

/* A refused class given as a dtype refuses the file as read.c would. */
static int refuse_use(vm *m, const ckpt_value *g)
{
    return m->refuse_use(m, g);
}

/* ---- interpreted calls ----------------------------------------------------------- */

static int as_int(vm *m, const ckpt_value *v, const char *what, int64_t *out)
{
    if (v && v->kind == CKPT_KIND_BOOL) {
        *out = v->u.b;
        return CKPT_OK;
    }
    if (!v || v->kind != CKPT_KIND_INT)
        return fail(m, CKPT_ERR_FORMAT, "tensor %s is a %s, not an int", what,
                    v ? ckpt_kind_name((ckpt_kind)v->kind) : "nothing");
    if (v->u.i.big)
        return fail(m, CKPT_ERR_FORMAT, "tensor %s does not fit in 64 bits", what);
    *out = v->u.i.v;
    return CKPT_OK;
}

/* A size or stride: a tuple of ints (or torch.Size(tuple)). */
static int int_tuple(vm *m, const ckpt_value *v, const char *what, int64_t **out, int *n)
{
    if (v && v->kind == CKPT_KIND_OBJECT && v->u.obj.callable &&
        v->u.obj.callable->kind == CKPT_KIND_GLOBAL &&
        strcmp(v->u.obj.callable->u.global.name, "torch.Size") == 0 && v->u.obj.args &&
        v->u.obj.args->u.seq.len == 1)
        v = v->u.obj.args->u.seq.items[0];
    if (!v || (v->kind != CKPT_KIND_TUPLE && v->kind != CKPT_KIND_LIST))
        return fail(m, CKPT_ERR_FORMAT, "tensor %s is not a tuple", what);
    if (v->u.seq.len > MAX_NDIM)
        return fail(m, CKPT_ERR_UNSUPPORTED, "tensor has %zu dimensions (at most %d)",
                    (size_t)v->u.seq.len, MAX_NDIM);
    *n = (int)v->u.seq.len;
    *out = ckpt_arena_alloc(m->a, (v->u.seq.len + 1) * sizeof(int64_t));
    if (!*out)
        return oom(m);
    for (size_t i = 0; i < v->u.seq.len; i++) {
        CKPT_FORWARD(as_int(m, v->u.seq.items[i], what, &(*out)[i]));
        if ((*out)[i] < 0)
            return fail(m, CKPT_ERR_FORMAT, "tensor %s has a negative entry (%lld)", what,
                        (long long)(*out)[i]);
    }
    return CKPT_OK;
}

/* Values a byte of a packed quantized dtype holds (torch pads each innermost
 * row to a byte and counts strides in values). */
static int values_per_byte(ckpt_dtype dt)
{
    return dt == CKPT_DTYPE_QUINT4X2 ? 2 : dt == CKPT_DTYPE_QUINT2X4 ? 4 : 1;
}

static int push_tensor(vm *m, ckpt_tensor *t)
{
    ckpt_value *v = node(m, CKPT_KIND_TENSOR);
    if (!v)
        return oom(m);
    v->u.tensor = t;
    return push(m, v);
}

/* shape and stride: a tuple each (or torch.Size), of one length */
static int tensor_dims(vm *m, ckpt_tensor *t, const ckpt_value *shape, const ckpt_value *stride)
{
    int nd_shape, nd_stride;
    CKPT_FORWARD(int_tuple(m, shape, "shape", &t->shape, &nd_shape));
    CKPT_FORWARD(int_tuple(m, stride, "stride", &t->stride, &nd_stride));
    if (nd_shape != nd_stride)
        return fail(m, CKPT_ERR_FORMAT, "tensor shape has %d dimensions but stride has %d",
                    nd_shape, nd_stride);
    t->ndim = nd_shape;
    return CKPT_OK;
}

/* numel, and the farthest element the view reaches (in elements) */
static int tensor_extent(vm *m, ckpt_tensor *t, uint64_t *reach_out)
{
    uint64_t numel = 1, reach = (uint64_t)t->offset;
    bool bad = false;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t span;
        bad |= ckpt_mul_overflow(numel, (uint64_t)t->shape[d], &numel);
        if (t->shape[d] > 0) {
            bad |= ckpt_mul_overflow((uint64_t)t->shape[d] - 1, (uint64_t)t->stride[d], &span);
            bad |= ckpt_add_overflow(reach, span, &reach);
        }
    }
    if (bad || numel > INT64_MAX)
        return fail(m, CKPT_ERR_FORMAT, "tensor size overflows 64 bits");
    t->numel = (int64_t)numel;
    *reach_out = reach;
    return CKPT_OK;
}

/* The view part of every tensor with a storage: storage, offset, size, stride,
 * checked to stay inside the storage once the dtype is known. */
static int tensor_view(vm *m, const char *fn, ckpt_value **a, ckpt_dtype dtype, ckpt_tensor *t)
{
    if (a[0]->kind != CKPT_KIND_STORAGE)
        return fail(m, CKPT_ERR_FORMAT, "%s: first argument is a %s, not a storage", fn,
                    ckpt_kind_name((ckpt_kind)a[0]->kind));
    ckpt_storage *s = a[0]->u.st.ptr;
    t->storage = s;
    t->dtype = dtype != CKPT_DTYPE_UNKNOWN ? dtype : a[0]->u.st.dtype;
    CKPT_FORWARD(as_int(m, a[1], "offset", &t->offset));
    if (t->offset < 0)
        return fail(m, CKPT_ERR_FORMAT, "negative tensor offset");
    CKPT_FORWARD(tensor_dims(m, t, a[2], a[3]));
    uint64_t reach, end_bytes;
    CKPT_FORWARD(tensor_extent(m, t, &reach));
    int k = values_per_byte(t->dtype);
    if (k > 1) {
        /* packed: only torch's own layout, C-contiguous rows padded to a byte */
        if (t->numel > 0 && (!ckpt_tensor_is_contiguous(t) || t->offset != 0))
            return fail(m, CKPT_ERR_UNSUPPORTED, "%s: a strided view of a packed %s tensor", fn,
                        ckpt_dtype_name(t->dtype));
        if (t->numel > 0 && ckpt_tensor_nbytes(t) > s->nbytes)
            return fail(m, CKPT_ERR_FORMAT,
                        "%s tensor of %lld values needs %zu bytes, storage '%s' has %llu", 
                        ckpt_dtype_name(t->dtype), (long long)t->numel, ckpt_tensor_nbytes(t),
                        s->key, (unsigned long long)s->nbytes);
        return CKPT_OK;
    }
    size_t es = ckpt_dtype_size(t->dtype);
    if (t->numel > 0 &&
        (ckpt_add_overflow(reach, 1, &end_bytes) || ckpt_mul_overflow(end_bytes, es, &end_bytes) ||
         end_bytes > s->nbytes))
        return fail(m, CKPT_ERR_FORMAT,
                    "tensor view (offset %lld, reaching element %llu) goes past the end of "
                    "storage '%s' (%lld %s elements)",
                    (long long)t->offset, (unsigned long long)reach, s->key,
                    (long long)(s->nbytes / (es ? es : 1)), ckpt_dtype_name(t->dtype));
    return CKPT_OK;
}

static int requires_grad(vm *m, const char *fn, const ckpt_value *v, bool *out)
{
    if (v->kind != CKPT_KIND_BOOL && v->kind != CKPT_KIND_INT)
        return fail(m, CKPT_ERR_FORMAT, "%s: requires_grad is a %s", fn,
                    ckpt_kind_name((ckpt_kind)v->kind));
    *out = v->kind == CKPT_KIND_BOOL ? v->u.b : v->u.i.v != 0;
    return CKPT_OK;
}

static int dtype_arg(vm *m, const char *fn, const ckpt_value *v, ckpt_dtype *out)
{
    if (v->kind != CKPT_KIND_GLOBAL)
        return fail(m, CKPT_ERR_FORMAT, "%s: dtype argument is not a dtype", fn);
    if (v->u.global.cls == CKPT_GLOBAL_REFUSED)
        return refuse_use(m, v);
    *out = ckpt_dtype_from_name(v->u.global.name);
    if (ckpt_dtype_bits(*out) % 8) /* float6: safetensors only, no torch dtype */
        *out = CKPT_DTYPE_UNKNOWN;
    if (*out == CKPT_DTYPE_UNKNOWN)
        return fail(m, CKPT_ERR_UNSUPPORTED, "unknown dtype '%s'", v->u.global.name);
    return CKPT_OK;
}

/* _rebuild_tensor(storage, offset, size, stride)
 * _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
 * _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata]) */
static int rebuild_tensor(vm *m, const char *fn, ckpt_value *args)
{
    size_t n = args->u.seq.len;
    ckpt_value **a = args->u.seq.items;
    bool v3 = strcmp(fn, "_rebuild_tensor_v3") == 0;
    bool v1 = strcmp(fn, "_rebuild_tensor") == 0;
    size_t min = v1 ? 4 : v3 ? 7 : 6;
    if (n < min || n > min + 1 || (v1 && n != 4))
        return fail(m, CKPT_ERR_FORMAT, "%s called with %zu arguments", fn, n);
    ckpt_tensor *t = ckpt_arena_alloc(m->a, sizeof(*t));
    if (!t)
        return oom(m);
    t->rebuild = fn;
    t->rebuild_args = args;
    ckpt_dtype dtype = CKPT_DTYPE_UNKNOWN;
    if (v3) {
        if (a[0]->kind != CKPT_KIND_STORAGE)
            return fail(m, CKPT_ERR_FORMAT, "%s: first argument is a %s, not a storage", fn,
                        ckpt_kind_name((ckpt_kind)a[0]->kind));
        CKPT_FORWARD(dtype_arg(m, fn, a[6], &dtype));
        if (values_per_byte(dtype) > 1)
            return fail(m, CKPT_ERR_FORMAT, "%s: %s is not a plain tensor's dtype", fn,
                        ckpt_dtype_name(dtype));
    }
    CKPT_FORWARD(tensor_view(m, fn, a, dtype, t));
    if (!v1)
        CKPT_FORWARD(requires_grad(m, fn, a[4], &t->requires_grad));
    ckpt_storage *s = t->storage;
    size_t es = ckpt_dtype_size(t->dtype);
    if (v3 && s->dtype == CKPT_DTYPE_UINT8 && t->dtype != CKPT_DTYPE_UINT8 &&
        strcmp(a[0]->u.st.type_name, "UntypedStorage") == 0 && s->nbytes % es == 0) {
        /* a byte storage read as another dtype: describe it in that dtype */
        s->dtype = s->src_dtype = t->dtype;
        s->numel = (int64_t)(s->nbytes / es);
    }
    return push_tensor(m, t);
}

static const char *const qschemes[] = {
    "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.per_channel_affine",
    "torch.per_channel_symmetric", "torch.per_channel_affine_float_qparams"};

/* One per-channel parameter: a 1-D tensor of one of the dtypes torch writes. */
static int channel_param(vm *m, const ckpt_value *v, const char *what, ckpt_dtype d1,
                         ckpt_dtype d2, int64_t channels, const ckpt_tensor **out)
{
    const ckpt_tensor *p = v->kind == CKPT_KIND_TENSOR ? v->u.tensor : NULL;
    if (!p || p->kind != CKPT_TENSOR_DENSE || p->ndim != 1 || (p->dtype != d1 && p->dtype != d2))
        return fail(m, CKPT_ERR_FORMAT,
                    "quantized tensor: per-channel %s are not a 1-D %s or %s tensor", what,
                    ckpt_dtype_name(d1), ckpt_dtype_name(d2));
    if (p->shape[0] != channels)
        return fail(m, CKPT_ERR_FORMAT,
                    "quantized tensor: %lld %s for %lld channels along its axis",
                    (long long)p->shape[0], what, (long long)channels);
    *out = p;
    return CKPT_OK;
}

/* _rebuild_qtensor(storage, offset, size, stride, quantizer_params, requires_grad, hooks)
 * quantizer_params: (per_tensor_affine, scale, zero_point) or
 * (per_channel_affine, scales, zero_points, axis); torch checks the axis and
 * the counts when it loads, so a file that breaks them is not one it reads. */
static int rebuild_qtensor(vm *m, const char *fn, ckpt_value *args)
{
    ckpt_value **a = args->u.seq.items;
    if (args->u.seq.len != 7)
        return fail(m, CKPT_ERR_FORMAT, "%s called with %zu arguments", fn, (size_t)args->u.seq.len);
    ckpt_tensor *t = ckpt_arena_alloc(m->a, sizeof(*t));
    if (!t)
        return oom(m);
    t->kind = CKPT_TENSOR_QUANTIZED;
    t->rebuild = fn;
    t->rebuild_args = args;
    CKPT_FORWARD(tensor_view(m, fn, a, CKPT_DTYPE_UNKNOWN, t));
    if (t->dtype < CKPT_DTYPE_QINT8 || t->dtype > CKPT_DTYPE_QUINT2X4)
        return fail(m, CKPT_ERR_FORMAT, "%s over a %s storage, not a quantized one", fn,
                    ckpt_dtype_name(t->dtype));
    CKPT_FORWARD(requires_grad(m, fn, a[5], &t->requires_grad));
    const ckpt_value *qp = a[4];
    if (qp->kind != CKPT_KIND_TUPLE || qp->u.seq.len < 3 ||
        qp->u.seq.items[0]->kind != CKPT_KIND_GLOBAL)
        return fail(m, CKPT_ERR_FORMAT, "%s: quantizer parameters are not (qscheme, ...)", fn);
    ckpt_value **p = qp->u.seq.items;
    const char *scheme = p[0]->u.global.name;
    if (!(t->q = ckpt_arena_alloc(m->a, sizeof(*t->q))))
        return oom(m);
    for (size_t i = 0; i < sizeof(qschemes) / sizeof(qschemes[0]) && !t->q->qscheme; i++)
        if (strcmp(scheme, qschemes[i]) == 0)
            t->q->qscheme = qschemes[i] + 6;
    if (!t->q->qscheme)
        return fail(m, CKPT_ERR_FORMAT, "%s: '%s' is not a qscheme", fn, scheme);
    if (strncmp(t->q->qscheme, "per_tensor", 10) == 0) {
        if (qp->u.seq.len != 3 || (p[1]->kind != CKPT_KIND_FLOAT && p[1]->kind != CKPT_KIND_INT))
            return fail(m, CKPT_ERR_FORMAT, "%s: per-tensor parameters are not (scale, zero_point)",
                        fn);
        t->q->scale = p[1]->kind == CKPT_KIND_FLOAT ? p[1]->u.f : (double)p[1]->u.i.v;
        CKPT_FORWARD(as_int(m, p[2], "zero point", &t->q->zero_point));
        return push_tensor(m, t);
    }
    int64_t axis;
    if (qp->u.seq.len != 4)
        return fail(m, CKPT_ERR_FORMAT,
                    "%s: per-channel parameters are not (scales, zero_points, axis)", fn);
    CKPT_FORWARD(as_int(m, p[3], "axis", &axis));
    if (axis < 0 || axis >= t->ndim)
        return fail(m, CKPT_ERR_FORMAT, "quantized tensor: axis %lld of a %d-dimensional tensor",
                    (long long)axis, t->ndim);
    t->q->axis = (int)axis;
    int64_t c = t->shape[axis];
    CKPT_FORWARD(channel_param(m, p[1], "scales", CKPT_DTYPE_FLOAT64, CKPT_DTYPE_FLOAT32, c,
                               &t->q->scales));
    CKPT_FORWARD(channel_param(m, p[2], "zero points", CKPT_DTYPE_INT64, CKPT_DTYPE_FLOAT32, c,
                               &t->q->zero_points));
    return push_tensor(m, t);
}

/* A layout: _get_layout("torch.sparse_coo") (2.x) or the GLOBAL torch.sparse_coo (1.13). */
static ckpt_tensor_kind layout_kind(const ckpt_value *v)
{
    const char *name = NULL;
    if (v->kind == CKPT_KIND_GLOBAL)
        name = v->u.global.name;
    else if (v->kind == CKPT_KIND_OBJECT && v->u.obj.callable->kind == CKPT_KIND_GLOBAL &&
             strcmp(v->u.obj.callable->u.global.name, "torch.serialization._get_layout") == 0 &&
             v->u.obj.args && v->u.obj.args->u.seq.len == 1 &&
             v->u.obj.args->u.seq.items[0]->kind == CKPT_KIND_STR)
        name = v->u.obj.args->u.seq.items[0]->u.s.s;
    static const struct {
        const char *name;
        ckpt_tensor_kind kind;
    } layouts[] = {{"torch.sparse_coo", CKPT_TENSOR_SPARSE_COO},
                   {"torch.sparse_csr", CKPT_TENSOR_SPARSE_CSR},
                   {"torch.sparse_csc", CKPT_TENSOR_SPARSE_CSC},
                   {"torch.sparse_bsr", CKPT_TENSOR_SPARSE_BSR},
                   {"torch.sparse_bsc", CKPT_TENSOR_SPARSE_BSC}};
    for (size_t i = 0; name && i < sizeof(layouts) / sizeof(layouts[0]); i++)
        if (strcmp(name, layouts[i].name) == 0)
            return layouts[i].kind;
    return CKPT_TENSOR_DENSE;
}

static const ckpt_tensor *part(const ckpt_value *v)
{
    return v->kind == CKPT_KIND_TENSOR && v->u.tensor->kind == CKPT_TENSOR_DENSE ? v->u.tensor
                                                                                 : NULL;
}

/* _rebuild_sparse_tensor(layout, (indices, values, size[, is_coalesced])) for COO,
 * (compressed, plain, values, size) for the compressed layouts;
 * _rebuild_sparse_csr_tensor(layout, (crow, col, values, size)) (1.13).
 * Listed with the values' dtype and the tensor's size; kept as saved. */
static int rebuild_sparse(vm *m, const char *fn, ckpt_value *args)
{
    ckpt_value **a = args->u.seq.items;
    if (args->u.seq.len != 2)
        return fail(m, CKPT_ERR_FORMAT, "%s called with %zu arguments", fn, (size_t)args->u.seq.len);
    ckpt_tensor_kind kind = layout_kind(a[0]);
    if (kind == CKPT_TENSOR_DENSE)
        return fail(m, CKPT_ERR_FORMAT, "%s: the layout is not a sparse one", fn);
    const ckpt_value *d = a[1];
    bool coo = kind == CKPT_TENSOR_SPARSE_COO;
    size_t nparts = coo ? 2 : 3;
    if (d->kind != CKPT_KIND_TUPLE || d->u.seq.len < nparts + 1 ||
        d->u.seq.len > nparts + (coo ? 2 : 1))
        return fail(m, CKPT_ERR_FORMAT, "%s: the data is not (%s, size)", fn,
                    coo ? "indices, values" : "compressed, plain, values");
    const ckpt_tensor *idx = part(d->u.seq.items[0]), *plain = part(d->u.seq.items[1]),
                      *values = part(d->u.seq.items[nparts - 1]);
    if (!idx || !plain || !values ||
        (idx->dtype != CKPT_DTYPE_INT64 && idx->dtype != CKPT_DTYPE_INT32))
        return fail(m, CKPT_ERR_FORMAT, "%s: indices and values are not plain tensors", fn);
    if (coo && (idx->ndim != 2 || values->ndim < 1))
        return fail(m, CKPT_ERR_FORMAT, "%s: indices of %d dimensions, values of %d", fn,
                    idx->ndim, values->ndim);
    if (coo && idx->shape[1] != values->shape[0])
        return fail(m, CKPT_ERR_FORMAT, "%s: indices for %lld values, %lld values", fn,
                    (long long)idx->shape[1], (long long)values->shape[0]);
    ckpt_tensor *t = ckpt_arena_alloc(m->a, sizeof(*t));
    if (!t)
        return oom(m);
    t->kind = (uint8_t)kind;
    t->rebuild = fn;
    t->rebuild_args = args;
    t->dtype = values->dtype;
    t->values = values;
    t->device = values->storage->device;
    int nd;
    CKPT_FORWARD(int_tuple(m, d->u.seq.items[nparts], "size", &t->shape, &nd));
    t->ndim = nd;
    t->stride = ckpt_arena_alloc(m->a, (size_t)(nd + 1) * sizeof(int64_t)); /* none: zeros */
    if (!t->stride)
        return oom(m);
    uint64_t reach;
    CKPT_FORWARD(tensor_extent(m, t, &reach));
    return push_tensor(m, t);
}

/* _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad) */
static int rebuild_meta(vm *m, const char *fn, ckpt_value *args)
{
    ckpt_value **a = args->u.seq.items;
    if (args->u.seq.len != 4)
        return fail(m, CKPT_ERR_FORMAT, "%s called with %zu arguments", fn, (size_t)args->u.seq.len);
    ckpt_tensor *t = ckpt_arena_alloc(m->a, sizeof(*t));
    if (!t)
        return oom(m);
    t->kind = CKPT_TENSOR_META;
    t->rebuild = fn;
    t->rebuild_args = args;
    t->device = "meta";
    CKPT_FORWARD(dtype_arg(m, fn, a[0], &t->dtype));
    CKPT_FORWARD(tensor_dims(m, t, a[1], a[2]));
    CKPT_FORWARD(requires_grad(m, fn, a[3], &t->requires_grad));
    uint64_t reach;
    CKPT_FORWARD(tensor_extent(m, t, &reach));
    return push_tensor(m, t);
}

static int rebuild_call(vm *m, const char *q, ckpt_value *args);

/* ---- per-rank FSDP files: ShardedTensor and DTensor ---------------------
 * _rebuild_from_type_v2(_rebuild_wrapper_subclass, ShardedTensor | DTensor,
 * (cls, dtype, global_size, global_stride, 0, layout, device, requires_grad),
 * state) as doc/distributed-formats.md 3.3 and 3.5 lay it out: the
 * tensor is the rank's local shard (a plain _rebuild_tensor_v2 inside the
 * state), with where it lies in the whole kept in t->shard. */

/* An object's BUILD state as a dict: {..} or (None, {..}) (slots) */
static const ckpt_value *obj_dict(const ckpt_value *o)
{
    const ckpt_value *st = o && o->kind == CKPT_KIND_OBJECT ? o->u.obj.state : NULL;
    if (st && st->kind == CKPT_KIND_TUPLE && st->u.seq.len == 2)
        st = st->u.seq.items[1];
    return st && st->kind == CKPT_KIND_DICT ? st : NULL;
}

static const char *const st_class = "torch.distributed._shard.sharded_tensor.api.ShardedTensor";
static const char *const dt_class = "torch.distributed.tensor.DTensor";

/* SI's one chunk: the box OFF/SZ (SI's ndim each) held by SI's rank. */
static int one_chunk(vm *m, ckpt_shard_info *si, int64_t *off, int64_t *sz)
{
    ckpt_chunk *c = ckpt_arena_alloc(m->a, sizeof(*c));
    if (!c)
        return oom(m);
    memset(c, 0, sizeof(*c));
    c->ndim = si->ndim;
    c->offsets = off;
    c->sizes = sz;
    c->rank = si->rank;
    si->chunks = c;
    si->nchunks = 1;
    return CKPT_OK;
}

/* ShardedTensor state: (local_shards, metadata, ProcessGroupState, spec, init_rrefs);
 * each Shard's state {'tensor', 'metadata': ShardMetadata{shard_offsets,
 * shard_sizes, placement: _remote_device{_rank}}} */
static int sharded_local(vm *m, const char *fn, const ckpt_value *state, ckpt_shard_info *si,
                         const ckpt_value **local)
{
    if (state->kind != CKPT_KIND_TUPLE || state->u.seq.len < 3 ||
        state->u.seq.items[0]->kind != CKPT_KIND_LIST)
        return fail(m, CKPT_ERR_FORMAT, "%s: a ShardedTensor's state is not (local_shards, ...)", fn);
    const ckpt_vec *shards = &state->u.seq.items[0]->u.seq;
    const ckpt_value *pgs = obj_dict(state->u.seq.items[2]);
    const ckpt_value *gr = pgs ? ckpt_value_dict_get(pgs, "global_rank") : NULL;
    if (gr && gr->kind == CKPT_KIND_INT && gr->u.i.v >= 0 && gr->u.i.v < INT32_MAX)
        si->rank = (int)gr->u.i.v;
    if (shards->len > 1) /* torch's FSDP1 gives a rank one shard a tensor */
        return fail(m, CKPT_ERR_UNSUPPORTED, "%s: a ShardedTensor with %zu local shards", fn,
                    (size_t)shards->len);
    if (shards->len == 0)
        return CKPT_OK;
    const ckpt_value *sd = obj_dict(shards->items[0]);
    const ckpt_value *md = sd ? obj_dict(ckpt_value_dict_get(sd, "metadata")) : NULL;
    *local = sd ? ckpt_value_dict_get(sd, "tensor") : NULL;
    if (!md || !*local)
        return fail(m, CKPT_ERR_FORMAT, "%s: a ShardedTensor's Shard has no tensor or metadata", fn);
    int64_t *off, *sz;
    int n1, n2;
    CKPT_FORWARD(int_tuple(m, ckpt_value_dict_get(md, "shard_offsets"), "shard offsets", &off, &n1));
    CKPT_FORWARD(int_tuple(m, ckpt_value_dict_get(md, "shard_sizes"), "shard sizes", &sz, &n2));
    if (n1 != si->ndim || n2 != si->ndim)
        return fail(m, CKPT_ERR_FORMAT, "%s: a shard's box has %d/%d dimensions, the tensor %d", fn,
                    n1, n2, si->ndim);
    const ckpt_value *pl = obj_dict(ckpt_value_dict_get(md, "placement"));
    const ckpt_value *r = pl ? ckpt_value_dict_get(pl, "_rank") : NULL;
    if (r && r->kind == CKPT_KIND_INT && r->u.i.v >= 0 && r->u.i.v < INT32_MAX)
        si->rank = (int)r->u.i.v;
    return one_chunk(m, si, off, sz);
}

/* DTensor state: (None, {'_local_tensor', '_spec': DTensorSpec{mesh, placements}}).
 * The file stores no offsets: mesh dims from the DeviceMesh's _layout (one
 * _FlatLayout per dim, its size the product of its shape), this rank's
 * coordinate from _coordinate_on_dim, then the placements left to right with
 * torch.chunk's rule (torch's _compute_local_shape_and_global_offset). */
static int dtensor_local(vm *m, const char *fn, const ckpt_value *state, ckpt_shard_info *si,
                         const ckpt_value **local)
{
    const ckpt_value *d = state->kind == CKPT_KIND_TUPLE && state->u.seq.len == 2
                              ? state->u.seq.items[1] : state;
    if (d->kind != CKPT_KIND_DICT)
        return fail(m, CKPT_ERR_FORMAT, "%s: a DTensor's state is not a dict", fn);
    *local = ckpt_value_dict_get(d, "_local_tensor");
    const ckpt_value *spec = obj_dict(ckpt_value_dict_get(d, "_spec"));
    const ckpt_value *mesh = spec ? obj_dict(ckpt_value_dict_get(spec, "mesh")) : NULL;
    const ckpt_value *pls = spec ? ckpt_value_dict_get(spec, "placements") : NULL;
    if (!*local || !mesh || !pls || (pls->kind != CKPT_KIND_TUPLE && pls->kind != CKPT_KIND_LIST))
        return fail(m, CKPT_ERR_FORMAT, "%s: a DTensor without _local_tensor, mesh or placements", fn);
    const ckpt_value *r = ckpt_value_dict_get(mesh, "_rank");
    if (r && r->kind == CKPT_KIND_INT && r->u.i.v >= 0 && r->u.i.v < INT32_MAX)
        si->rank = (int)r->u.i.v;
    const ckpt_value *layout = obj_dict(ckpt_value_dict_get(mesh, "_layout"));
    const ckpt_value *axes = layout ? ckpt_value_dict_get(layout, "axes") : NULL;
    int64_t *coord;
    int ncoord;
    CKPT_FORWARD(int_tuple(m, ckpt_value_dict_get(mesh, "_coordinate_on_dim"), "mesh coordinate",
                           &coord, &ncoord));
    if (!axes || (axes->kind != CKPT_KIND_TUPLE && axes->kind != CKPT_KIND_LIST) ||
        axes->u.seq.len != (size_t)ncoord || pls->u.seq.len != (size_t)ncoord)
        return fail(m, CKPT_ERR_FORMAT, "%s: a DTensor's mesh layout, coordinate and placements "
                    "disagree on the mesh's dimensions", fn);
    int64_t *off = ckpt_arena_alloc(m->a, (size_t)(si->ndim + 1) * sizeof(int64_t));
    int64_t *sz = ckpt_arena_alloc(m->a, (size_t)(si->ndim + 1) * sizeof(int64_t));
    if (!off || !sz)
        return oom(m);
    for (int k = 0; k < si->ndim; k++) {
        off[k] = 0;
        sz[k] = si->global_shape[k];
    }
    for (int md = 0; md < ncoord; md++) {
        const ckpt_value *p = pls->u.seq.items[md];
        const char *pc = obj_class(p);
        if (strcmp(pc, "torch.distributed.tensor.placement_types.Replicate") == 0)
            continue;
        const ckpt_value *pd = obj_dict(p), *dim = pd ? ckpt_value_dict_get(pd, "dim") : NULL;
        if (strcmp(pc, "torch.distributed.tensor.placement_types.Shard") != 0) {
            const char *dot = strrchr(pc, '.');
            size_t n = strlen(dot ? dot + 1 : pc) + 32;
            char *why = ckpt_arena_alloc(m->a, n);
            if (!why)
                return oom(m);
            snprintf(why, n, "placement not supported: %s", *pc ? (dot ? dot + 1 : pc) : "?");
            si->unsupported = why;
            return CKPT_OK;
        }
        /* the mesh dim's size: the product of its _FlatLayout's shape */
        const ckpt_value *fl = obj_dict(axes->u.seq.items[md]);
        int64_t *shape, size = 1;
        int ns;
        if (!fl || !dim || dim->kind != CKPT_KIND_INT)
            return fail(m, CKPT_ERR_FORMAT, "%s: a Shard placement or mesh axis is malformed", fn);
        CKPT_FORWARD(int_tuple(m, ckpt_value_dict_get(fl, "shape"), "mesh shape", &shape, &ns));
        for (int k = 0; k < ns; k++)
            if (ckpt_mul_overflow((uint64_t)size, (uint64_t)shape[k], (uint64_t *)&size) ||
                size > INT32_MAX)
                return fail(m, CKPT_ERR_FORMAT, "%s: a mesh dimension is too large", fn);
        int64_t dd = dim->u.i.v < 0 ? dim->u.i.v + si->ndim : dim->u.i.v;
        if (dd < 0 || dd >= si->ndim || size < 1 || coord[md] >= size)
            return fail(m, CKPT_ERR_FORMAT, "%s: Shard(%lld) on a %d-d tensor, coordinate %lld of %lld",
                        fn, (long long)dim->u.i.v, si->ndim, (long long)coord[md], (long long)size);
        int64_t cur = sz[dd], full = (cur + size - 1) / size, start = full * coord[md];
        if (start >= cur) { /* an empty shard: torch puts it at the end */
            sz[dd] = 0;
            off[dd] += cur;
        } else {
            sz[dd] = (start + full < cur ? start + full : cur) - start;
            off[dd] += start;
        }
    }
    return one_chunk(m, si, off, sz);
}

static int rebuild_sharded(vm *m, const char *fn, ckpt_value *args)
{
    ckpt_value **a = args->u.seq.items;
    bool dt = strcmp(a[1]->u.global.name, dt_class) == 0;
    const ckpt_value *wa = a[2];
    if (wa->u.seq.len != 8 && wa->u.seq.len != 7)
        return fail(m, CKPT_ERR_FORMAT, "%s: _rebuild_wrapper_subclass with %zu arguments", fn,
                    (size_t)wa->u.seq.len);
    ckpt_shard_info *si = ckpt_arena_alloc(m->a, sizeof(*si));
    if (!si)
        return oom(m);
    memset(si, 0, sizeof(*si));
    si->type = dt ? "DTensor" : "ShardedTensor";
    si->rank = -1;
    int64_t *gshape;
    CKPT_FORWARD(int_tuple(m, wa->u.seq.items[2], "global shape", &gshape, &si->ndim));
    si->global_shape = gshape;
    ckpt_dtype dtype;
    CKPT_FORWARD(dtype_arg(m, fn, wa->u.seq.items[1], &dtype));
    const ckpt_value *local = NULL;
    if (dt)
        CKPT_FORWARD(dtensor_local(m, fn, a[3], si, &local));
    else
        CKPT_FORWARD(sharded_local(m, fn, a[3], si, &local));
    ckpt_tensor *t = ckpt_arena_alloc(m->a, sizeof(*t));
    if (!t)
        return oom(m);
    if (!local) {
        /* a rank without a shard (ShardedTensor): nothing stored; a meta
         * tensor of the whole's dtype and an empty shape */
        memset(t, 0, sizeof(*t));
        t->kind = CKPT_TENSOR_META;
        t->device = "meta";
        t->dtype = dtype;
        t->ndim = si->ndim;
        int64_t *z = ckpt_arena_alloc(m->a, (size_t)(si->ndim + 1) * sizeof(int64_t));
        int64_t *st = ckpt_arena_alloc(m->a, (size_t)(si->ndim + 1) * sizeof(int64_t));
        if (!z || !st)
            return oom(m);
        for (int k = 0; k < si->ndim; k++) {
            z[k] = k == 0 ? 0 : si->global_shape[k];
            st[k] = 1;
        }
        t->shape = z;
        t->stride = st;
        t->numel = 0;
        t->rebuild = "_rebuild_meta_tensor_no_storage";
        /* (dtype, size, stride, requires_grad), as _rebuild_meta_tensor_no_storage takes */
        ckpt_value *ra = node(m, CKPT_KIND_TUPLE), *sv = node(m, CKPT_KIND_TUPLE),
                   *tv = node(m, CKPT_KIND_TUPLE);
        if (!ra || !sv || !tv)
            return oom(m);
        for (int k = 0; k < si->ndim; k++) {
            ckpt_value *x = node(m, CKPT_KIND_INT), *y = node(m, CKPT_KIND_INT);
            if (!x || !y)
                return oom(m);
            x->u.i.v = z[k];
            y->u.i.v = 1;
            if (ckpt_vec_push(m->a, &sv->u.seq, x) < 0 || ckpt_vec_push(m->a, &tv->u.seq, y) < 0)
                return oom(m);
        }
        if (ckpt_vec_push(m->a, &ra->u.seq, wa->u.seq.items[1]) < 0 ||
            ckpt_vec_push(m->a, &ra->u.seq, sv) < 0 || ckpt_vec_push(m->a, &ra->u.seq, tv) < 0 ||
            ckpt_vec_push(m->a, &ra->u.seq, wa->u.seq.items[wa->u.seq.len - 1]) < 0)
            return oom(m);
        t->rebuild_args = ra;
    } else {
        if (local->kind != CKPT_KIND_TENSOR || local->u.tensor->type_args ||
            local->u.tensor->shard)
            return fail(m, CKPT_ERR_FORMAT, "%s: a %s's local shard is a %s, not a tensor", fn,
                        si->type, ckpt_kind_name((ckpt_kind)local->kind));
        *t = *local->u.tensor;
        if (t->dtype != dtype)
            return fail(m, CKPT_ERR_FORMAT, "%s: a %s of %s holds a %s shard", fn, si->type,
                        ckpt_dtype_name(dtype), ckpt_dtype_name(t->dtype));
        if (t->ndim != si->ndim)
            return fail(m, CKPT_ERR_FORMAT, "%s: a %d-d %s holds a %d-d shard", fn, si->ndim,
                        si->type, t->ndim);
        bool in = si->nchunks == 1;
        for (int k = 0; in && k < si->ndim; k++)
            in = si->chunks->sizes[k] == t->shape[k] && si->chunks->offsets[k] >= 0 &&
                 si->chunks->offsets[k] <= si->global_shape[k] &&
                 si->chunks->sizes[k] <= si->global_shape[k] - si->chunks->offsets[k];
        if (si->nchunks == 1 && !in)
            return fail(m, CKPT_ERR_FORMAT, "%s: a %s's local shard does not fit its box in the "
                        "whole", fn, si->type);
    }
    requires_grad(m, fn, wa->u.seq.items[wa->u.seq.len - 1], &t->requires_grad);
    t->shard = si;
    return push_tensor(m, t);
}

/* _rebuild_from_type_v2(func, torch.Tensor, args, state): a plain tensor with
 * Python attributes (torch.nn.Buffer's, for one).  Other types are a
 * subclass torch would import: kept as an object. */
static int rebuild_from_type(vm *m, const char *fn, ckpt_value *args, bool *done)
{
    ckpt_value **a = args->u.seq.items;
    *done = false;
    if (args->u.seq.len == 4 && a[0]->kind == CKPT_KIND_GLOBAL && a[1]->kind == CKPT_KIND_GLOBAL &&
        a[2]->kind == CKPT_KIND_TUPLE &&
        strcmp(a[0]->u.global.name, "torch._utils._rebuild_wrapper_subclass") == 0 &&
        (strcmp(a[1]->u.global.name, st_class) == 0 || strcmp(a[1]->u.global.name, dt_class) == 0)) {
        CKPT_FORWARD(rebuild_sharded(m, fn, args));
        *done = true;
        return CKPT_OK;
    }
    if (args->u.seq.len != 4 || a[0]->kind != CKPT_KIND_GLOBAL ||
        a[0]->u.global.cls != CKPT_GLOBAL_INTERPRETED || a[1]->kind != CKPT_KIND_GLOBAL ||
        strcmp(a[1]->u.global.name, "torch.Tensor") != 0 || a[2]->kind != CKPT_KIND_TUPLE ||
        strncmp(a[0]->u.global.name, "torch._utils._rebuild_", 22) != 0)
        return CKPT_OK;
    CKPT_FORWARD(rebuild_call(m, a[0]->u.global.name, a[2]));
    ckpt_value *v = NULL;
    CKPT_FORWARD(top(m, &v));
    if (v->kind != CKPT_KIND_TENSOR || v->u.tensor->type_args || v->u.tensor->param_rebuild)
        return fail(m, CKPT_ERR_FORMAT, "%s: %s did not make a tensor", fn, a[0]->u.global.name);
    v->u.tensor->type_args = args;
    *done = true;
    return CKPT_OK;
}

/* _rebuild_parameter(data, requires_grad, hooks)
 * _rebuild_parameter_with_state(data, requires_grad, hooks, state) */
static int rebuild_parameter(vm *m, const char *fn, ckpt_value *args)
{
    size_t n = args->u.seq.len;
    bool with_state = strcmp(fn, "_rebuild_parameter_with_state") == 0;
    if (n != (with_state ? 4u : 3u))
        return fail(m, CKPT_ERR_FORMAT, "%s called with %zu arguments", fn, n);
    ckpt_value *data = args->u.seq.items[0], *rg = args->u.seq.items[1];
    if (data->kind != CKPT_KIND_TENSOR)
        return fail(m, CKPT_ERR_FORMAT, "%s: data is a %s, not a tensor", fn,
                    ckpt_kind_name((ckpt_kind)data->kind));
    ckpt_tensor *t = ckpt_arena_alloc(m->a, sizeof(*t));
    if (!t)
        return oom(m);
    *t = *data->u.tensor;
    t->parameter = true;
    t->requires_grad = rg->kind == CKPT_KIND_BOOL ? rg->u.b : (rg->kind == CKPT_KIND_INT && rg->u.i.v);
    t->param_rebuild = fn;
    t->param_args = args;
    ckpt_value *v = node(m, CKPT_KIND_TENSOR);
    if (!v)
        return oom(m);
    v->u.tensor = t;
    return push(m, v);
}

/* torch's rebuild functions that make a tensor; 1 (nothing pushed) for others */
static int rebuild_call(vm *m, const char *q, ckpt_value *args)
{
    if (strncmp(q, "torch._utils.", 13) != 0)
        return 1;
    const char *fn = q + 13;
    if (strncmp(fn, "_rebuild_tensor", 15) == 0)
        return rebuild_tensor(m, fn, args);
    if (strncmp(fn, "_rebuild_parameter", 18) == 0)
        return rebuild_parameter(m, fn, args);
    if (strcmp(fn, "_rebuild_qtensor") == 0)
        return rebuild_qtensor(m, fn, args);
    if (strcmp(fn, "_rebuild_sparse_tensor") == 0 || strcmp(fn, "_rebuild_sparse_csr_tensor") == 0)
        return rebuild_sparse(m, fn, args);
    if (strcmp(fn, "_rebuild_meta_tensor_no_storage") == 0)
        return rebuild_meta(m, fn, args);
    return 1;
}

/* ---- what read.c calls ------------------------------------------------------------ */

int ckpt_pickle_rebuild(vm *m, const char *q, ckpt_value *args)
{
    if (strcmp(q, "torch._tensor._rebuild_from_type_v2") == 0) {
        bool done;
        CKPT_FORWARD(rebuild_from_type(m, q, args, &done));
        return done ? CKPT_OK : 1;
    }
    return rebuild_call(m, q, args);
}
