/* bench_forward.c - time ckpt's model forward pass (issue 5).
 *
 *   bench_forward [--plain | --products P] [--threads N] [--warmup N]
 *                 [--warmup-ms MS] [--tf32] [--dump DIR] SPEC CKPT BATCH RUNS DEVICE
 *
 * Loads the graph spec SPEC, binds CKPT's root state dict to it (strictly,
 * as ckpt verify does), makes a fixed pseudo-random input batch of the
 * spec's input shape (-1 -> BATCH), runs N warm-up forwards (3 by default),
 * more while --warmup-ms MS have not passed since the first (0 by default:
 * a steady state's, not a start's timing -- on the 2-core VM the second
 * thread of the CPU backend took part in the MNIST MLP's forwards only
 * after up to 8 ms, 1000 of them), and then RUNS timed ones, and prints
 * one JSON line:
 *
 *   {"device": ..., "description": ..., "model": ..., "batch": ...,
 *    "median_ms": ..., "min_ms": ..., "max_ms": ..., "runs": ...}
 *
 * Each time is CLOCK_MONOTONIC around one ckpt_model_run(), which copies
 * the input in, runs every node and copies the outputs back to the host
 * (on CUDA that waits for the GPU).  Freeing the returned outputs is not
 * timed.  DEVICE is what ckpt_backend_open() takes: cpu, cuda, cuda:N,
 * auto.  --plain (DEVICE must be cpu) uses the CPU backend's plain-C loops
 * instead of its packed SGEMM or OpenBLAS; --products P (DEVICE cpu) picks
 * what does the CPU backend's matrix products: auto, plain, openblas,
 * avx512, avx2 (ckpt_backend_cpu_open_with).  --threads N (DEVICE cpu) runs
 * the CPU backend on N threads (default: as many as OpenBLAS runs, else the
 * cores), for bench_threads.py's 1- against 2-thread rows.  --tf32 opens
 * the backend with CKPT_BACKEND_TF32 (ckpt verify --tf32: TF32 products and
 * convolutions on CUDA), to compare with torch's allow_tf32 = True.
 *
 * --dump DIR writes the input batch and the outputs of the last forward to
 * DIR (which must exist), one file per array of raw native-endian float32
 * in C order, DIR/input.NAME.f32 and DIR/output.NAME.f32, and adds
 * "dump": [{"file": ..., "shape": [...]}, ...] to the JSON line (not timed;
 * bench_verify.py compares them with PyTorch's outputs).
 *
 * Built by `make bench/bench_forward`; run by bench/bench_verify.py.
 * Not a test: `make check` neither builds nor runs it.
 *
 * Exit status: 0 on success, 1 when the load fails (torch's message is
 * printed) or the model cannot run, 2 on a usage error.
 */
#include "ckpt.h"
#include "runtime/backends.h" /* ckpt_backend_cpu_open_with(): the driver is in-tree */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WARMUP 3

static const char usage[] =
    "usage: bench_forward [--plain | --products P] [--threads N] [--warmup N] [--warmup-ms MS]\n"
    "                     [--tf32] [--dump DIR] SPEC CKPT BATCH RUNS DEVICE\n"
    "  SPEC    a graph spec (models/*.json)\n"
    "  CKPT    a checkpoint whose root is the model's state dict\n"
    "  BATCH   the batch size (replaces -1 in the spec's input shapes)\n"
    "  RUNS    timed forwards, after the warm-up forwards\n"
    "  DEVICE  cpu, cuda, cuda:N or auto\n"
    "  --plain the CPU backend's plain-C loops (DEVICE cpu)\n"
    "  --products P  the CPU backend's matrix products by P: auto, plain, openblas,\n"
    "          avx512, avx2 (DEVICE cpu)\n"
    "  --threads N  the CPU backend's threads (DEVICE cpu; default: OpenBLAS's count,\n"
    "          else the cores)\n"
    "  --warmup N  untimed forwards before the timed ones (default 3; 0 is allowed)\n"
    "  --warmup-ms MS  more warm-up forwards while MS milliseconds have not passed\n"
    "              since the first (default 0; with N >= 1)\n"
    "  --tf32  let the backend use TF32 (CKPT_BACKEND_TF32: CUDA's products and\n"
    "          convolutions; nothing changes on the CPU)\n"
    "  --dump DIR  write the input and the last forward's outputs to DIR as raw\n"
    "              float32 (input.NAME.f32, output.NAME.f32)\n";

static int parse_num(const char *what, const char *s, long lo, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > (1L << 24)) {
        fprintf(stderr, "bench_forward: %s must be a whole number from %ld to %ld, got '%s'\n",
                what, lo, 1L << 24, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_pos(const char *what, const char *s, long *out)
{
    return parse_num(what, s, 1, out);
}

/* DIR/KIND.NAME.f32 holds A's values; its entry of the "dump" list goes to
 * JSON (a growing string).  Returns 0, or -1 with a message printed. */
static int dump_array(const char *dir, const char *kind, const char *name, const ckpt_array *a,
                      char **json, size_t *len)
{
    for (const char *p = name; *p; p++)
        if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z') &&
            !(*p >= '0' && *p <= '9') && *p != '_' && *p != '-' && *p != '.') {
            fprintf(stderr, "bench_forward: --dump: %s name '%s' is not a plain file name\n",
                    kind, name);
            return -1;
        }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s.%s.f32", dir, kind, name) >= sizeof path) {
        fprintf(stderr, "bench_forward: --dump: path too long\n");
        return -1;
    }
    FILE *fp = fopen(path, "wb");
    int64_t n = ckpt_array_numel(a);
    if (!fp || (n > 0 && fwrite(a->data, sizeof(float), (size_t)n, fp) != (size_t)n) ||
        fclose(fp) != 0) {
        fprintf(stderr, "bench_forward: --dump: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char entry[4096 + 256];
    int k = snprintf(entry, sizeof entry, "%s{\"file\": \"%s.%s.f32\", \"shape\": [",
                     *len ? ", " : "", kind, name);
    for (int d = 0; d < a->ndim; d++)
        k += snprintf(entry + k, sizeof entry - (size_t)k, "%s%lld", d ? ", " : "",
                      (long long)a->shape[d]);
    k += snprintf(entry + k, sizeof entry - (size_t)k, "]}");
    char *grown = realloc(*json, *len + (size_t)k + 1);
    if (!grown) {
        fprintf(stderr, "bench_forward: out of memory\n");
        return -1;
    }
    memcpy(grown + *len, entry, (size_t)k + 1);
    *json = grown;
    *len += (size_t)k;
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* S as a JSON string, quotes included. */
static void put_json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

int main(int argc, char **argv)
{
    int plain = 0, tf32 = 0, argi = 1;
    const char *products = NULL;
    long warmup = WARMUP, threads = 0, warmup_ms = 0;
    const char *dump = NULL;
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    for (; argi < argc && strncmp(argv[argi], "--", 2) == 0; argi++) {
        if (strcmp(argv[argi], "--plain") == 0) {
            plain = 1;
            products = "plain";
        } else if (strcmp(argv[argi], "--products") == 0 && argi + 1 < argc) {
            products = argv[++argi];
        } else if (strcmp(argv[argi], "--threads") == 0 && argi + 1 < argc) {
            if (parse_pos("--threads", argv[++argi], &threads))
                return 2;
        } else if (strcmp(argv[argi], "--warmup") == 0 && argi + 1 < argc) {
            if (parse_num("--warmup", argv[++argi], 0, &warmup))
                return 2;
        } else if (strcmp(argv[argi], "--warmup-ms") == 0 && argi + 1 < argc) {
            if (parse_num("--warmup-ms", argv[++argi], 0, &warmup_ms))
                return 2;
        } else if (strcmp(argv[argi], "--tf32") == 0) {
            tf32 = 1;
        } else if (strcmp(argv[argi], "--dump") == 0 && argi + 1 < argc) {
            dump = argv[++argi];
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (argc - argi != 5) {
        fputs(usage, stderr);
        return 2;
    }
    const char *spec = argv[argi], *path = argv[argi + 1], *device = argv[argi + 4];
    long batch, runs;
    if (parse_pos("BATCH", argv[argi + 2], &batch) || parse_pos("RUNS", argv[argi + 3], &runs))
        return 2;
    if ((products || threads) && strcmp(device, "cpu") != 0) {
        fprintf(stderr, "bench_forward: --%s is the CPU backend's: DEVICE must be cpu, "
                "got '%s'\n", plain ? "plain" : products ? "products" : "threads", device);
        return 2;
    }

    int status = 1;
    ckpt_model *m = NULL;
    ckpt_file *f = NULL;
    ckpt_backend *b = NULL;
    ckpt_array *inputs = NULL, *outputs = NULL;
    double *times = NULL;
    char *dump_json = NULL;
    size_t dump_len = 0;
    size_t nin = 0, nout = 0;
    char err[256] = "";

    if (!(m = ckpt_model_new()) || !(f = ckpt_file_new())) {
        fprintf(stderr, "bench_forward: out of memory\n");
        goto out;
    }
    if (ckpt_model_load(m, spec) != CKPT_OK) {
        fprintf(stderr, "bench_forward: %s\n", ckpt_model_error_message(m));
        goto out;
    }
    if (ckpt_file_open(f, path) != CKPT_OK) {
        fprintf(stderr, "bench_forward: %s: %s\n", path, ckpt_file_error_message(f));
        goto out;
    }
    const ckpt_value *root = ckpt_file_root(f);
    if (ckpt_value_kind(root) != CKPT_KIND_DICT) {
        fprintf(stderr, "bench_forward: %s: the root is a %s, not a state dict\n", path,
                ckpt_value_kind_name(root));
        goto out;
    }
    ckpt_load_report report;
    if (ckpt_model_bind(m, f, root, &report) != CKPT_OK) {
        fprintf(stderr, "bench_forward: %s: %s\n", path, ckpt_model_error_message(m));
        goto out;
    }
    if (!report.ok) {
        fprintf(stderr, "bench_forward: %s: the load failed:\n%s\n", path, report.message);
        goto out;
    }

    int rc = products || threads
                 ? ckpt_backend_cpu_open_with(products, (int)threads, &b, err, sizeof err)
                      : ckpt_backend_open_flags(device, tf32 ? CKPT_BACKEND_TF32 : 0, &b, err,
                                                sizeof err);
    if (rc != CKPT_OK) {
        /* the CUDA backend's messages start with the device already */
        if (strncmp(err, device, strlen(device)) == 0)
            fprintf(stderr, "bench_forward: %s\n", err);
        else
            fprintf(stderr, "bench_forward: device %s: %s\n", device, err);
        goto out;
    }

    /* a fixed pseudo-random batch in [0, 1), as ckpt verify makes without a
     * reference; token ids in [0, limit) */
    nin = ckpt_model_input_count(m);
    nout = ckpt_model_output_count(m);
    inputs = calloc(nin ? nin : 1, sizeof *inputs);
    outputs = calloc(nout ? nout : 1, sizeof *outputs);
    times = malloc((size_t)runs * sizeof *times);
    if (!inputs || !outputs || !times) {
        fprintf(stderr, "bench_forward: out of memory\n");
        goto out;
    }
    uint64_t state = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < nin; i++) {
        ckpt_array *a = &inputs[i];
        int64_t limit = ckpt_model_input_id_limit(m, i);
        if (limit == 0) {
            fprintf(stderr, "bench_forward: input %s takes token ids and nothing bounds them "
                    "(give it \"high\" in the spec)\n", ckpt_model_input_name(m, i));
            goto out;
        }
        a->ndim = ckpt_model_input_shape(m, i, a->shape);
        int64_t count = 1;
        for (int d = 0; d < a->ndim; d++) {
            if (a->shape[d] == -1)
                a->shape[d] = batch;
            count *= a->shape[d];
        }
        if (!(a->data = malloc((size_t)(count > 0 ? count : 1) * sizeof(float)))) {
            fprintf(stderr, "bench_forward: out of memory\n");
            goto out;
        }
        for (int64_t k = 0; k < count; k++) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            a->data[k] = (float)(state >> 40) / 16777216.0f;
            if (limit > 0) /* an integer below limit (< 2^24), exact in float32 */
                a->data[k] = (float)(int64_t)((double)a->data[k] * (double)limit);
        }
    }

    double start = now_ms();
    for (long r = 0; r < warmup + runs; r++) {
        double t0 = now_ms();
        rc = ckpt_model_run(m, b, inputs, outputs);
        double t1 = now_ms();
        if (rc != CKPT_OK) {
            fprintf(stderr, "bench_forward: %s\n", ckpt_model_error_message(m));
            goto out;
        }
        if (dump && r == warmup + runs - 1) {
            for (size_t i = 0; i < nin; i++)
                if (dump_array(dump, "input", ckpt_model_input_name(m, i), &inputs[i],
                               &dump_json, &dump_len))
                    goto out;
            for (size_t i = 0; i < nout; i++)
                if (dump_array(dump, "output", ckpt_model_output_name(m, i), &outputs[i],
                               &dump_json, &dump_len))
                    goto out;
        }
        for (size_t i = 0; i < nout; i++)
            ckpt_array_clear(&outputs[i]);
        if (r == warmup - 1 && t1 - start < (double)warmup_ms)
            warmup++; /* (r stays the last warm-up forward) */
        else if (r >= warmup)
            times[r - warmup] = t1 - t0;
    }
    qsort(times, (size_t)runs, sizeof *times, cmp_double);
    double median = runs % 2 ? times[runs / 2] : (times[runs / 2 - 1] + times[runs / 2]) / 2;

    printf("{\"device\": ");
    put_json_str(ckpt_backend_device(b));
    printf(", \"description\": ");
    put_json_str(ckpt_backend_description(b));
    printf(", \"model\": ");
    put_json_str(ckpt_model_name(m));
    printf(", \"batch\": %ld, \"median_ms\": %.6f, \"min_ms\": %.6f, \"max_ms\": %.6f, "
           "\"runs\": %ld, \"warmup\": %ld",
           batch, median, times[0], times[runs - 1], runs, warmup);
    if (dump)
        printf(", \"dump\": [%s]", dump_json ? dump_json : "");
    printf("}\n");
    status = fflush(stdout) == 0 ? 0 : 1;

out:
    for (size_t i = 0; inputs && i < nin; i++)
        ckpt_array_clear(&inputs[i]);
    for (size_t i = 0; outputs && i < nout; i++)
        ckpt_array_clear(&outputs[i]);
    free(inputs);
    free(outputs);
    free(times);
    free(dump_json);
    ckpt_model_free(m);
    ckpt_backend_free(b);
    ckpt_file_free(f);
    return status;
}
