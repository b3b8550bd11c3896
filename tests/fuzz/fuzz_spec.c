/* fuzz_spec.c - any bytes as a model spec: the JSON loader, then (when it
 * parses) a strict load against the bundled MLP weights, which runs every
 * node's shape rule, and a forward pass on the CPU when the weights fit. */
#include "fuzz.h"

#include "ckpt.h"

static ckpt_file *weights;
static ckpt_backend *cpu;

static void init(void)
{
    const char *src = getenv("CKPT_FUZZ_WEIGHTS"); /* tests/data/mlp.pth by default */
    weights = ckpt_file_new();
    if (ckpt_file_open(weights, src ? src : "tests/data/mlp.pth") != CKPT_OK) {
        ckpt_file_free(weights);
        weights = NULL;
    }
    char err[256];
    if (ckpt_backend_open("cpu", &cpu, err, sizeof err) != CKPT_OK)
        cpu = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        init();
        ready = 1;
    }
    ckpt_model *m = ckpt_model_new();
    if (m && ckpt_model_parse(m, (const char *)data, size, "fuzz.json") == CKPT_OK && weights) {
        ckpt_load_report r;
        if (ckpt_model_bind(m, weights, ckpt_file_root(weights), &r) == CKPT_OK && r.ok && cpu &&
            ckpt_model_input_count(m) <= 4) {
            /* small inputs only: the batch dimension 1, every size capped */
            ckpt_array in[4] = {{0}}, out[64] = {{0}};
            int ok = ckpt_model_output_count(m) <= 64;
            for (size_t i = 0; ok && i < ckpt_model_input_count(m); i++) {
                in[i].ndim = ckpt_model_input_shape(m, i, in[i].shape);
                int64_t n = 1;
                for (int d = 0; d < in[i].ndim; d++) {
                    if (in[i].shape[d] == -1)
                        in[i].shape[d] = 1;
                    n *= in[i].shape[d];
                    ok &= n <= (1 << 16);
                }
                if (ok && !(in[i].data = calloc((size_t)n, sizeof(float))))
                    ok = 0;
            }
            if (ok && ckpt_model_run(m, cpu, in, out) == CKPT_OK)
                for (size_t i = 0; i < ckpt_model_output_count(m); i++)
                    ckpt_array_clear(&out[i]);
            for (size_t i = 0; i < 4; i++)
                ckpt_array_clear(&in[i]);
        }
    }
    ckpt_model_free(m);
    return 0;
}
