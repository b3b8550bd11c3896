/* fuzz_safetensors.c - any bytes as a safetensors header: the input is the
 * JSON, framed with its 8-byte length and followed by 4 KiB of data, so the
 * fuzzer spends its time on the header checks (offsets, shapes, dtypes). */
#include "fuzz.h"

#include "ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    size_t total = 8 + size + 4096;
    uint8_t *buf = calloc(1, total);
    if (!buf)
        return 0;
    uint64_t n = size;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, data, size);
    for (size_t i = 0; i < 4096; i++)
        buf[8 + size + i] = (uint8_t)(i * 37);
    char *path = fuzz_file(buf, total, ".safetensors");
    free(buf);
    if (!path)
        return 0;
    ckpt_file *f = ckpt_file_new();
    if (f && ckpt_file_open(f, path) == CKPT_OK) {
        for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
            ckpt_tensor_stats st;
            ckpt_tensor_stats_compute(f, ckpt_file_tensor(f, i, NULL), &st);
        }
    }
    ckpt_file_free(f);
    fuzz_file_done(path);
    return 0;
}
