/* value.c - the pickle value tree: construction and read-only accessors. */
#include "pickle/pickle.h"

#include <string.h>

ckpt_value *ckpt_value_new(ckpt_arena *a, ckpt_kind kind, uint64_t offset)
{
    ckpt_value *v = ckpt_arena_alloc(a, sizeof(*v));
    if (v) {
        v->kind = (uint8_t)kind;
        v->offset = offset;
    }
    return v;
}

const ckpt_obj_items *ckpt_obj_items_of(const ckpt_value *obj)
{
    static const ckpt_obj_items none;
    return obj->u.obj.items ? obj->u.obj.items : &none;
}

int ckpt_vec_reserve(ckpt_arena *a, ckpt_vec *v, size_t n)
{
    if (n <= v->cap)
        return 0;
    if (n > UINT32_MAX)
        return -1;
    ckpt_value **items = ckpt_arena_alloc(a, n * sizeof(ckpt_value *));
    if (!items)
        return -1;
    if (v->len)
        memcpy(items, v->items, v->len * sizeof(ckpt_value *));
    v->items = items;
    v->cap = (uint32_t)n;
    return 0;
}

int ckpt_vec_push(ckpt_arena *a, ckpt_vec *v, ckpt_value *item)
{
    if (v->len == v->cap) {
        /* Doubling inside the arena: the abandoned arrays add at most as
         * much again, so memory stays linear in the pickle size. */
        size_t cap = v->cap ? (size_t)v->cap * 2 : 4;
        if (cap > UINT32_MAX)
            return -1;
        ckpt_value **items = ckpt_arena_alloc(a, cap * sizeof(ckpt_value *));
        if (!items)
            return -1;
        if (v->len)
            memcpy(items, v->items, v->len * sizeof(ckpt_value *));
        v->items = items;
        v->cap = (uint32_t)cap;
    }
    v->items[v->len++] = item;
    return 0;
}

bool ckpt_value_is_str(const ckpt_value *v, const char *s)
{
    return v && v->kind == CKPT_KIND_STR && strlen(s) == v->u.s.len &&
           memcmp(v->u.s.s, s, v->u.s.len) == 0;
}

const char *ckpt_kind_name(ckpt_kind kind)
{
    static const char *const names[] = {
        [CKPT_KIND_NONE] = "None",      [CKPT_KIND_BOOL] = "bool",
        [CKPT_KIND_INT] = "int",        [CKPT_KIND_FLOAT] = "float",
        [CKPT_KIND_STR] = "str",        [CKPT_KIND_BYTES] = "bytes",
        [CKPT_KIND_LIST] = "list",      [CKPT_KIND_TUPLE] = "tuple",
        [CKPT_KIND_DICT] = "dict",      [CKPT_KIND_SET] = "set",
        [CKPT_KIND_FROZENSET] = "frozenset", [CKPT_KIND_GLOBAL] = "global",
        [CKPT_KIND_OBJECT] = "object",  [CKPT_KIND_TENSOR] = "tensor",
        [CKPT_KIND_STORAGE] = "storage",
    };
    if ((unsigned)kind >= sizeof(names) / sizeof(names[0]))
        return "?";
    return names[kind];
}

CKPT_API ckpt_kind ckpt_value_kind(const ckpt_value *v)
{
    return v ? (ckpt_kind)v->kind : CKPT_KIND_NONE;
}

CKPT_API const char *ckpt_value_kind_name(const ckpt_value *v)
{
    if (v && v->kind == CKPT_KIND_DICT && (v->flags & CKPT_VF_ORDERED))
        return "OrderedDict";
    if (v && v->kind == CKPT_KIND_BYTES && (v->flags & CKPT_VF_BYTEARRAY))
        return "bytearray";
    return ckpt_kind_name(ckpt_value_kind(v));
}

CKPT_API int ckpt_value_bool(const ckpt_value *v)
{
    return v && v->kind == CKPT_KIND_BOOL ? v->u.b : 0;
}

CKPT_API int ckpt_value_int(const ckpt_value *v, int64_t *out)
{
    if (!v || v->kind != CKPT_KIND_INT)
        return CKPT_ERR_USAGE;
    if (v->u.i.big)
        return CKPT_ERR_LIMIT;
    *out = v->u.i.v;
    return CKPT_OK;
}

CKPT_API const uint8_t *ckpt_value_bigint(const ckpt_value *v, size_t *len)
{
    if (!v || v->kind != CKPT_KIND_INT)
        return NULL;
    if (len)
        *len = v->u.i.nbytes;
    return v->u.i.bytes;
}

CKPT_API double ckpt_value_float(const ckpt_value *v)
{
    return v && v->kind == CKPT_KIND_FLOAT ? v->u.f : 0.0;
}

CKPT_API const char *ckpt_value_str(const ckpt_value *v, size_t *len)
{
    if (!v || (v->kind != CKPT_KIND_STR && v->kind != CKPT_KIND_BYTES))
        return NULL;
    if (len)
        *len = v->u.s.len;
    return v->u.s.s;
}

static const ckpt_vec *seq_of(const ckpt_value *v)
{
    if (!v)
        return NULL;
    switch (v->kind) {
    case CKPT_KIND_LIST:
    case CKPT_KIND_TUPLE:
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
        return &v->u.seq;
    case CKPT_KIND_DICT:
        return &v->u.dict.keys;
    default:
        return NULL;
    }
}

CKPT_API size_t ckpt_value_len(const ckpt_value *v)
{
    const ckpt_vec *s = seq_of(v);
    return s ? s->len : 0;
}

CKPT_API const ckpt_value *ckpt_value_item(const ckpt_value *v, size_t i)
{
    if (!v || v->kind == CKPT_KIND_DICT)
        return NULL;
    const ckpt_vec *s = seq_of(v);
    return s && i < s->len ? s->items[i] : NULL;
}

CKPT_API const ckpt_value *ckpt_value_dict_key(const ckpt_value *v, size_t i)
{
    if (!v || v->kind != CKPT_KIND_DICT || i >= v->u.dict.keys.len)
        return NULL;
    return v->u.dict.keys.items[i];
}

CKPT_API const ckpt_value *ckpt_value_dict_value(const ckpt_value *v, size_t i)
{
    if (!v || v->kind != CKPT_KIND_DICT || i >= v->u.dict.vals.len)
        return NULL;
    return v->u.dict.vals.items[i];
}

CKPT_API size_t ckpt_value_dict_tensor_items(const ckpt_value *v, size_t from, char *buf,
                                            size_t cap, size_t *lens,
                                            const ckpt_tensor **tensors, size_t max_items)
{
    if (!v || v->kind != CKPT_KIND_DICT || !lens || !tensors || (cap && !buf))
        return 0;
    size_t n = 0, used = 0;
    for (size_t i = from; i < v->u.dict.keys.len && n < max_items; i++, n++) {
        const ckpt_value *k = v->u.dict.keys.items[i];
        if (k->kind != CKPT_KIND_STR || k->u.s.len > cap - used)
            break;
        memcpy(buf + used, k->u.s.s, k->u.s.len);
        used += k->u.s.len;
        lens[n] = k->u.s.len;
        tensors[n] = ckpt_value_tensor(v->u.dict.vals.items[i]);
    }
    return n;
}

CKPT_API const ckpt_value *ckpt_value_dict_get(const ckpt_value *v, const char *key)
{
    if (!v || v->kind != CKPT_KIND_DICT || !key)
        return NULL;
    /* Last one wins, as in a Python dict built by SETITEMS. */
    for (size_t i = v->u.dict.keys.len; i-- > 0;)
        if (ckpt_value_is_str(v->u.dict.keys.items[i], key))
            return v->u.dict.vals.items[i];
    return NULL;
}

CKPT_API int ckpt_value_dict_ordered(const ckpt_value *v)
{
    return v && v->kind == CKPT_KIND_DICT && (v->flags & CKPT_VF_ORDERED);
}

CKPT_API const ckpt_value *ckpt_value_state(const ckpt_value *v)
{
    if (!v)
        return NULL;
    if (v->kind == CKPT_KIND_DICT)
        return v->u.dict.state;
    if (v->kind == CKPT_KIND_OBJECT)
        return v->u.obj.state;
    if (v->kind == CKPT_KIND_TENSOR)
        return v->u.tensor->state;
    return NULL;
}

CKPT_API const char *ckpt_value_global(const ckpt_value *v)
{
    if (!v)
        return NULL;
    if (v->kind == CKPT_KIND_GLOBAL)
        return v->u.global.name;
    if (v->kind == CKPT_KIND_OBJECT && v->u.obj.callable)
        return v->u.obj.callable->u.global.name;
    return NULL;
}

CKPT_API const ckpt_value *ckpt_value_object_args(const ckpt_value *v)
{
    return v && v->kind == CKPT_KIND_OBJECT ? v->u.obj.args : NULL;
}

CKPT_API uint64_t ckpt_value_offset(const ckpt_value *v)
{
    return v ? v->offset : 0;
}

CKPT_API const ckpt_tensor *ckpt_value_tensor(const ckpt_value *v)
{
    return v && v->kind == CKPT_KIND_TENSOR ? v->u.tensor : NULL;
}

CKPT_API const ckpt_storage *ckpt_value_storage(const ckpt_value *v)
{
    if (!v)
        return NULL;
    if (v->kind == CKPT_KIND_STORAGE)
        return v->u.st.ptr;
    if (v->kind == CKPT_KIND_TENSOR)
        return v->u.tensor->storage;
    return NULL;
}

/* ---- tensors and storages ---- */

CKPT_API ckpt_dtype ckpt_tensor_dtype(const ckpt_tensor *t) { return t->dtype; }
CKPT_API int ckpt_tensor_ndim(const ckpt_tensor *t) { return t->ndim; }
CKPT_API const int64_t *ckpt_tensor_shape(const ckpt_tensor *t) { return t->shape; }
CKPT_API const int64_t *ckpt_tensor_stride(const ckpt_tensor *t) { return t->stride; }
CKPT_API int64_t ckpt_tensor_offset(const ckpt_tensor *t) { return t->offset; }
CKPT_API int64_t ckpt_tensor_numel(const ckpt_tensor *t) { return t->numel; }
CKPT_API int ckpt_tensor_requires_grad(const ckpt_tensor *t) { return t->requires_grad; }
CKPT_API int ckpt_tensor_is_parameter(const ckpt_tensor *t) { return t->parameter; }
CKPT_API const ckpt_storage *ckpt_tensor_storage(const ckpt_tensor *t) { return t->storage; }

CKPT_API size_t ckpt_tensor_nbytes(const ckpt_tensor *t)
{
    /* checked against the storage when the tensor was built */
    if (!t->storage)
        return 0;
    if (t->numel > 0 && (t->dtype == CKPT_DTYPE_QUINT4X2 || t->dtype == CKPT_DTYPE_QUINT2X4)) {
        /* packed values, each innermost row padded to a byte */
        int64_t k = t->dtype == CKPT_DTYPE_QUINT4X2 ? 2 : 4, last = t->shape[t->ndim - 1];
        return (size_t)(t->numel / last) * (size_t)((last + k - 1) / k);
    }
    /* a packed float6 tensor is whole bytes (its reader checked) */
    size_t es = ckpt_dtype_size(t->dtype);
    return es ? (size_t)t->numel * es
              : (size_t)((uint64_t)t->numel * ckpt_dtype_bits(t->dtype) / 8);
}

CKPT_API ckpt_tensor_kind ckpt_tensor_kind_of(const ckpt_tensor *t)
{
    return (ckpt_tensor_kind)t->kind;
}

CKPT_API const char *ckpt_tensor_kind_name(ckpt_tensor_kind kind)
{
    static const char *const names[] = {"dense",      "quantized",  "sparse_coo", "sparse_csr",
                                        "sparse_csc", "sparse_bsr", "sparse_bsc", "meta"};
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

CKPT_API const char *ckpt_tensor_device(const ckpt_tensor *t)
{
    return t->device ? t->device : t->storage ? t->storage->device : "meta";
}

CKPT_API const ckpt_value *ckpt_tensor_sparse_data(const ckpt_tensor *t)
{
    if (!t || t->kind < CKPT_TENSOR_SPARSE_COO || t->kind > CKPT_TENSOR_SPARSE_BSC ||
        !t->rebuild_args || t->rebuild_args->kind != CKPT_KIND_TUPLE ||
        t->rebuild_args->u.seq.len != 2)
        return NULL;
    return t->rebuild_args->u.seq.items[1]; /* (layout, DATA): checked by rebuild_sparse */
}

CKPT_API size_t ckpt_tensor_chunk_count(const ckpt_tensor *t)
{
    return t && t->storage ? t->storage->nchunks : 0;
}

CKPT_API const ckpt_chunk *ckpt_tensor_chunk(const ckpt_tensor *t, size_t i)
{
    return t && t->storage && i < t->storage->nchunks ? &t->storage->chunks[i] : NULL;
}

CKPT_API int ckpt_tensor_shard(const ckpt_tensor *t, ckpt_shard_info *out)
{
    if (!t || !t->shard)
        return CKPT_ERR_USAGE;
    *out = *t->shard;
    return CKPT_OK;
}

CKPT_API int ckpt_tensor_qparams(const ckpt_tensor *t, ckpt_qparams *out)
{
    if (t->kind != CKPT_TENSOR_QUANTIZED)
        return CKPT_ERR_USAGE;
    if (t->q)
        *out = *t->q;
    else
        memset(out, 0, sizeof(*out));
    return CKPT_OK;
}

CKPT_API int ckpt_tensor_is_contiguous(const ckpt_tensor *t)
{
    /* torch's rule: size-1 dimensions may have any stride */
    int64_t expected = 1;
    if (t->numel == 0)
        return 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != expected)
            return 0;
        expected *= t->shape[d];
    }
    return 1;
}

CKPT_API const char *ckpt_storage_key(const ckpt_storage *s) { return s->key; }
CKPT_API ckpt_dtype ckpt_storage_dtype(const ckpt_storage *s) { return s->dtype; }
CKPT_API int64_t ckpt_storage_numel(const ckpt_storage *s) { return s->numel; }
CKPT_API size_t ckpt_storage_nbytes(const ckpt_storage *s) { return (size_t)s->nbytes; }
CKPT_API const char *ckpt_storage_device(const ckpt_storage *s) { return s->device; }
CKPT_API size_t ckpt_storage_index(const ckpt_storage *s) { return s->index; }
CKPT_API const ckpt_storage *ckpt_storage_view_of(const ckpt_storage *s, int64_t *offset)
{
    size_t es = ckpt_dtype_size(s->dtype);
    if (offset)
        *offset = s->view_root && es ? (int64_t)(s->view_offset / es) : 0;
    return s->view_root;
}

/* ---- building tensors that did not come from a pickle (safetensors) ---- */

ckpt_value *ckpt_tensor_value_new(ckpt_arena *a, struct ckpt_storage *s, ckpt_dtype dtype, int ndim,
                                  const int64_t *shape, const int64_t *stride, int64_t offset)
{
    ckpt_tensor *t = ckpt_arena_alloc(a, sizeof(*t));
    ckpt_value *v = ckpt_value_new(a, CKPT_KIND_TENSOR, 0);
    if (!t || !v)
        return NULL;
    /* one array for both, never NULL (a scalar's too): stride at shape + ndim */
    int64_t *dims = ckpt_arena_alloc(a, (2 * (size_t)ndim + 1) * sizeof(int64_t));
    if (!dims)
        return NULL;
    t->shape = dims;
    t->stride = dims + ndim;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->stride[d] = stride[d];
        numel *= shape[d];
    }
    t->dtype = dtype;
    t->made_dtype = (uint8_t)dtype;
    t->ndim = ndim;
    t->offset = offset;
    t->numel = numel;
    t->storage = s;
    /* new dtypes: UntypedStorage + an explicit dtype */
    t->rebuild = ckpt_storage_type_name(dtype) ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3";
    v->u.tensor = t;
    return v;
}
