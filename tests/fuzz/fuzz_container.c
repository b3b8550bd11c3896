/* fuzz_container.c - any bytes as a checkpoint file: the format sniffing,
 * the zip reader (libzip, our central-directory parse, CRCs), the legacy
 * reader, the pickle VM behind both, the safetensors reader; then every
 * tensor's data read and summarised, as `ckpt inspect --stats` does, and the
 * check of code-running globals every rewrite makes. */
#include "fuzz.h"

#include "ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_file(data, size, ".pth");
    if (!path)
        return 0;
    ckpt_file *f = ckpt_file_new();
    /* small limits: a fuzzer must not spend its time allocating */
    ckpt_file_set_limit(f, CKPT_LIMIT_PICKLE_BYTES, 1 << 20);
    ckpt_file_set_limit(f, CKPT_LIMIT_ITEMS, 1 << 16);
    ckpt_file_set_limit(f, CKPT_LIMIT_MEMO, 1 << 16);
    ckpt_file_set_limit(f, CKPT_LIMIT_STACK, 1 << 16);
    if (f && ckpt_file_open(f, path) == CKPT_OK) {
        uint64_t budget = 16u << 20;
        for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
            const ckpt_tensor *t = ckpt_file_tensor(f, i, NULL);
            if (ckpt_tensor_nbytes(t) > budget)
                continue;
            budget -= ckpt_tensor_nbytes(t);
            ckpt_tensor_stats st;
            ckpt_tensor_stats_compute(f, t, &st);
        }
        for (size_t i = 0; i < ckpt_file_state_dict_count(f); i++) {
            const char *w[8];
            ckpt_state_dict_wrappers(ckpt_file_state_dict(f, i, NULL), w, 8);
        }
        /* what a rewrite would carry that runs code: the walk over any tree */
        ckpt_file_check_globals(f, CKPT_FORMAT_PTH_ZIP, 1, NULL, NULL);
    }
    ckpt_file_free(f);
    fuzz_file_done(path);
    return 0;
}
