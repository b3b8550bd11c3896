/* fuzz_scan.c - any bytes as a file for ckpt scan: the dispatch over every
 * reading torch.load could make of it (zip as torch, zipfile and libzip read
 * it; the torch <= 0.1 tar; the safetensors header; the pickle stream from
 * byte 0, every reading of its frames when one crosses or holds a STOP),
 * the ambiguity findings, and the public accessors a caller walks
 * afterwards.  Half the inputs are named .safetensors: the name must change
 * nothing. */
#include "fuzz.h"

#include "ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_file(data, size, size % 2 ? ".safetensors" : ".pth");
    if (!path)
        return 0;
    ckpt_scan *s = ckpt_scan_new();
    if (s) {
        ckpt_scan_set_limit(s, CKPT_LIMIT_PICKLE_BYTES, 1 << 20);
        int rc = ckpt_scan_file(s, path);
        size_t sum = strlen(ckpt_scan_error_message(s)) + (size_t)rc;
        for (size_t i = 0; i < ckpt_scan_reading_count(s); i++) {
            const ckpt_scan_reading *r = ckpt_scan_reading_at(s, i);
            sum += strlen(r->reader) + strlen(r->who) + (r->error ? strlen(r->error) : 0);
        }
        for (size_t i = 0; i < ckpt_scan_ambiguity_count(s); i++)
            sum += strlen(ckpt_scan_ambiguity_at(s, i));
        for (size_t i = 0; i < ckpt_scan_hit_count(s); i++) {
            const ckpt_scan_hit *h = ckpt_scan_hit_at(s, i);
            sum += strlen(h->global) + strlen(h->pickle) + (h->reading ? strlen(h->reading) : 0) +
                   (h->computed_by ? strlen(h->computed_by) : 0);
        }
        for (size_t i = 0; i < ckpt_scan_pickle_count(s); i++)
            sum += strlen(ckpt_scan_pickle_name(s, i));
        if (sum == (size_t)-1)
            abort(); /* keeps the reads */
        ckpt_scan_free(s);
    }
    unlink(path);
    free(path);
    return 0;
}
