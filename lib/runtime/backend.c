/*
 * runtime/backend.c - what every backend shares: the backend object's
 * message, reference count and names, and the host arrays handed to and
 * from a model run.  It calls no backend and not the chooser
 * (runtime/choose.c), so a backend may call it.
 */
#include "core/core.h"
#include "runtime/backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Models that hold parameters on a backend keep it alive, so the order in
 * which a caller frees models and backends does not matter. */
void ckpt_backend_free(ckpt_backend *b)
{
    if (b && --b->refs <= 0)
        b->ops->destroy(b);
}

const char *ckpt_backend_device(const ckpt_backend *b)
{
    return b->device;
}

const char *ckpt_backend_description(const ckpt_backend *b)
{
    return b->description;
}

int64_t ckpt_array_numel(const ckpt_array *a)
{
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        n *= a->shape[i];
    return n;
}

void ckpt_array_clear(ckpt_array *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}
