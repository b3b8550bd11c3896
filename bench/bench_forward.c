/* bench_forward.c - time ckpt's model forward pass (issue 5).
 *
 *   bench_forward [--plain] SPEC CKPT BATCH RUNS DEVICE
 *
 * Loads the graph spec SPEC, binds CKPT's root state dict to it (strictly,
 * as ckpt verify does), makes a fixed pseudo-random input batch of the
 * spec's input shape (-1 -> BATCH), runs 3 warm-up forwards and then RUNS
 * timed ones, and prints one JSON line:
 *
 *   {"device": ..., "description": ..., "model": ..., "batch": ...,
 *    "median_ms": ..., "min_ms": ..., "max_ms": ..., "runs": ...}
 *
 * Each time is CLOCK_MONOTONIC around one ckpt_model_run(), which copies
 * the input in, runs every node and copies the outputs back to the host
 * (on CUDA that waits for the GPU).  Freeing the returned outputs is not
 * timed.  DEVICE is what ckpt_backend_open() takes: cpu, cuda, cuda:N,
 * auto.  --plain (DEVICE must be cpu) uses the CPU backend's plain-C loops
 * instead of OpenBLAS.
 *
 * Built by `make bench/bench_forward`; run by bench/bench_verify.py.
 * Not a test: `make check` neither builds nor runs it.
 *
 * Exit status: 0 on success, 1 when the load fails (torch's message is
 * printed) or the model cannot run, 2 on a usage error.
 */
#include "ckpt.h"
#include "runtime_backend.h" /* ckpt_backend_cpu_plain_open(): the driver is in-tree */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WARMUP 3

static const char usage[] =
    "usage: bench_forward [--plain] SPEC CKPT BATCH RUNS DEVICE\n"
    "  SPEC    a graph spec (models/*.json)\n"
    "  CKPT    a checkpoint whose root is the model's state dict\n"
    "  BATCH   the batch size (replaces -1 in the spec's input shapes)\n"
    "  RUNS    timed forwards, after 3 warm-up forwards\n"
    "  DEVICE  cpu, cuda, cuda:N or auto\n"
    "  --plain the CPU backend's plain-C loops instead of OpenBLAS (DEVICE cpu)\n";

static int parse_pos(const char *what, const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 1 || v > (1L << 24)) {
        fprintf(stderr, "bench_forward: %s must be a whole number from 1 to %ld, got '%s'\n",
                what, 1L << 24, s);
        return -1;
    }
    *out = v;
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
    int plain = 0, argi = 1;
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--plain") == 0) {
        plain = 1;
        argi++;
    }
    if (argc - argi != 5) {
        fputs(usage, stderr);
        return 2;
    }
    const char *spec = argv[argi], *path = argv[argi + 1], *device = argv[argi + 4];
    long batch, runs;
    if (parse_pos("BATCH", argv[argi + 2], &batch) || parse_pos("RUNS", argv[argi + 3], &runs))
        return 2;
    if (plain && strcmp(device, "cpu") != 0) {
        fprintf(stderr, "bench_forward: --plain is the CPU backend: DEVICE must be cpu, "
                "got '%s'\n", device);
        return 2;
    }

    int status = 1;
    ckpt_model *m = NULL;
    ckpt_file *f = NULL;
    ckpt_backend *b = NULL;
    ckpt_array *inputs = NULL, *outputs = NULL;
    double *times = NULL;
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

    int rc = plain ? ckpt_backend_cpu_plain_open(&b, err, sizeof err)
                   : ckpt_backend_open(device, &b, err, sizeof err);
    if (rc != CKPT_OK) {
        /* the CUDA backend's messages start with the device already */
        if (strncmp(err, device, strlen(device)) == 0)
            fprintf(stderr, "bench_forward: %s\n", err);
        else
            fprintf(stderr, "bench_forward: device %s: %s\n", device, err);
        goto out;
    }

    /* a fixed pseudo-random batch in [0, 1), as ckpt verify makes without a reference */
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
        }
    }

    for (long r = 0; r < WARMUP + runs; r++) {
        double t0 = now_ms();
        rc = ckpt_model_run(m, b, inputs, outputs);
        double t1 = now_ms();
        if (rc != CKPT_OK) {
            fprintf(stderr, "bench_forward: %s\n", ckpt_model_error_message(m));
            goto out;
        }
        for (size_t i = 0; i < nout; i++)
            ckpt_array_clear(&outputs[i]);
        if (r >= WARMUP)
            times[r - WARMUP] = t1 - t0;
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
           "\"runs\": %ld}\n",
           batch, median, times[0], times[runs - 1], runs);
    status = fflush(stdout) == 0 ? 0 : 1;

out:
    for (size_t i = 0; inputs && i < nin; i++)
        ckpt_array_clear(&inputs[i]);
    for (size_t i = 0; outputs && i < nout; i++)
        ckpt_array_clear(&outputs[i]);
    free(inputs);
    free(outputs);
    free(times);
    ckpt_model_free(m);
    ckpt_backend_free(b);
    ckpt_file_free(f);
    return status;
}
