/* cast_tool.c - drives the casts of lib/core/element.c directly for
 * tests/interop/cast_vs_torch.py (every pair, float64 targets too, which
 * `ckpt convert --dtype` does not offer): `cast_tool FROM TO < in > out`
 * reads raw little-endian FROM elements and writes them cast to TO. */
#include "checkpoint/checkpoint.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: cast_tool FROM TO < in > out\n");
        return 2;
    }
    ckpt_dtype from = ckpt_dtype_from_name(argv[1]), to = ckpt_dtype_from_name(argv[2]);
    if (!ckpt_cast_supported(from, to)) {
        fprintf(stderr, "cast_tool: no cast from %s to %s\n", argv[1], argv[2]);
        return 2;
    }
    size_t es_in = ckpt_dtype_size(from), es_out = ckpt_dtype_size(to);
    /* the whole input at once: ckpt_cast then sees the tensor as one call */
    size_t cap = 1 << 20, len = 0, got;
    unsigned char *in = malloc(cap);
    while (in && (got = fread(in + len, 1, cap - len, stdin)) > 0) {
        len += got;
        if (len == cap) {
            unsigned char *bigger = realloc(in, cap *= 2);
            if (!bigger)
                free(in);
            in = bigger;
        }
    }
    if (!in || ferror(stdin) || len % es_in) {
        fprintf(stderr, "cast_tool: %s\n",
                !in ? "out of memory" : ferror(stdin) ? "read error" : "input is not whole elements");
        free(in);
        return 1;
    }
    size_t n = len / es_in;
    unsigned char *out = malloc(n * es_out + 1);
    if (!out) {
        fprintf(stderr, "cast_tool: out of memory\n");
        free(in);
        return 1;
    }
    ckpt_cast(from, in, to, out, n);
    int rc = fwrite(out, es_out, n, stdout) == n && fflush(stdout) == 0 ? 0 : 1;
    if (rc)
        fprintf(stderr, "cast_tool: write error\n");
    free(in);
    free(out);
    return rc;
}
