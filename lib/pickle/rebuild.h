/*
 * pickle/rebuild.h - the pickle VM's state and the helpers that read.c (the
 * VM: input, stack, memo, opcodes) shares with rebuild.c (torch's
 * _rebuild_* functions, which make tensors).  Private to those two files.
 */
#ifndef CKPT_PICKLE_REBUILD_H
#define CKPT_PICKLE_REBUILD_H

#include "pickle/pickle.h"

#include <string.h>

typedef struct vm {
    ckpt_pickle_ctx *ctx;
    ckpt_arena *a;
    ckpt_error *err;
    const uint8_t *buf;
    /* The C unpickler's input: its buffer is always a slice of the file,
     * ending at the file position WEND; POS is its read index.  Outside a
     * frame the buffer is used up (POS == WEND). */
    size_t len, pos, wend;
    uint64_t op_at; /* offset of the opcode being run */
    int op;

    ckpt_value **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, marks_cap;
    /* The memo, index -> value: indices below dense_cap in DENSE (NULL: none),
     * as CPython's unpickler keeps them (pickles number their BINPUTs 0, 1,
     * 2, ...: a hash map of 10^5 entries cost a fifth of reading a 10,000-
     * tensor state dict); any other index in MEMO.  MEMO_N: the distinct
     * indices, the memo's length (MEMOIZE's next index). */
    ckpt_value **dense;
    size_t dense_cap, memo_n;
    ckpt_map memo;
    /* refused classes, admitted for now as possible module classes (the
     * first one's offset names it if the pickle uses it otherwise), and
     * objects of them still waiting for their module BUILD */
    struct {
        ckpt_value *g;
        uint64_t at;
    } *pending;
    size_t npending, pending_cap;
    uint64_t unbuilt;
    int proto; /* the stream's PROTO (0 before one): Python 2 names map below 3 */
    size_t arena_at_start; /* the arena's bytes when the load began (the memory budget) */
    /* scanning: builtins.getattr on the stack, and its uses that are data */
    uint64_t getattr_refs, getattr_data;
    const char *getattr_shown;
    /* read.c's refusal of a refused class used as a value, for rebuild.c's
     * dtype arguments: a call through the VM, as rebuild.c calls nothing
     * of read.c (read.c calls rebuild.c) */
    int (*refuse_use)(struct vm *m, const ckpt_value *g);
} vm;

/* The error of the opcode being run: "<pickle> at byte N: <what>". */
static inline int fail(vm *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int fail(vm *m, int code, const char *fmt, ...)
{
    char what[CKPT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return ckpt_err(m->err, code, "%s at byte %llu: %s", m->ctx->name,
                    (unsigned long long)m->op_at, what);
}

static inline int oom(vm *m)
{
    return fail(m, CKPT_ERR_NOMEM, "out of memory");
}

static inline uint64_t limit(vm *m, ckpt_limit which)
{
    return m->ctx->limits[which];
}

/* ---- the stack (read.c has the rest of it: pop, marks, memo) -------------- */

static inline int push(vm *m, ckpt_value *v)
{
    if (!v)
        return oom(m);
    if (m->sp == m->stack_cap) {
        if (m->sp >= limit(m, CKPT_LIMIT_STACK))
            return fail(m, CKPT_ERR_LIMIT, "pickle stack deeper than the limit of %llu entries",
                        (unsigned long long)limit(m, CKPT_LIMIT_STACK));
        if (CKPT_GROW(m->stack, m->stack_cap, m->sp + 1) < 0)
            return oom(m);
    }
    m->stack[m->sp++] = v;
    if (v->kind == CKPT_KIND_GLOBAL && v->u.global.cls == CKPT_GLOBAL_REFUSED)
        v->u.global.refs++;
    if (m->ctx->scan && v->kind == CKPT_KIND_GLOBAL && strcmp(v->u.global.name, "builtins.getattr") == 0)
        m->getattr_refs++;
    return CKPT_OK;
}

/* Items above the innermost MARK (or the whole stack when there is none) */
static inline size_t floor_of(vm *m)
{
    return m->nmarks ? m->marks[m->nmarks - 1] : 0;
}

static inline int top(vm *m, ckpt_value **out)
{
    if (m->sp <= floor_of(m))
        return fail(m, CKPT_ERR_FORMAT, "stack underflow: opcode needs a value on the stack");
    *out = m->stack[m->sp - 1];
    return CKPT_OK;
}

static inline ckpt_value *node(vm *m, ckpt_kind kind)
{
    return ckpt_value_new(m->a, kind, m->op_at);
}

/* The class an OBJECT was made of ("" for anything else). */
static inline const char *obj_class(const ckpt_value *o)
{
    return o && o->kind == CKPT_KIND_OBJECT && o->u.obj.callable &&
                   o->u.obj.callable->kind == CKPT_KIND_GLOBAL
               ? o->u.obj.callable->u.global.name
               : "";
}

/* REDUCE of torch's rebuild function Q (torch._utils._rebuild_*,
 * torch._tensor._rebuild_from_type_v2) with the tuple ARGS: pushes the tensor
 * it makes and returns CKPT_OK; 1 (nothing pushed) for a function or a
 * _rebuild_from_type_v2 it does not make a tensor of; or an error. */
int ckpt_pickle_rebuild(vm *m, const char *q, ckpt_value *args);

#endif /* CKPT_PICKLE_REBUILD_H */
