/* array.c - growable arrays: the capacity doubles, every size is checked
 * for overflow, and a failed growth leaves the array as it was. */
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

size_t ckpt_grow_cap(size_t cap, size_t need, size_t size)
{
    if (need <= cap)
        return cap;
    size_t c = cap >= 8 ? cap : 8;
    while (c < need)
        c = c <= SIZE_MAX / 2 ? c * 2 : SIZE_MAX;
    return size && c > SIZE_MAX / size ? 0 : c;
}

int ckpt_grow(void *arrayp, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = ckpt_grow_cap(*cap, need, size);
    if (!c)
        return -1;
    void *old, *p;
    /* *ARRAYP is some T *: copied as bytes, not read through a void ** */
    memcpy(&old, arrayp, sizeof old);
    if (!(p = realloc(old, c * size)))
        return -1;
    memcpy(arrayp, &p, sizeof p);
    *cap = c;
    return 0;
}
