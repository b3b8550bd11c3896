/* fuzz_safetensors.c - any bytes as a safetensors header: the input is a
 * 2-byte little-endian data length L, then the JSON, framed with its 8-byte
 * length and followed by L bytes of data.  L is the fuzzer's to choose
 * because safetensors (and so ckpt) wants the tensors to cover the data
 * exactly: with a fixed length nearly every header would stop at that
 * check, before the tensors are built and read. */
#include "fuzz.h"

#include "ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > (1u << 20))
        return 0;
    size_t dlen = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    size_t total = 8 + size + dlen;
    uint8_t *buf = calloc(1, total);
    if (!buf)
        return 0;
    uint64_t n = size;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, data, size);
    for (size_t i = 0; i < dlen; i++)
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
