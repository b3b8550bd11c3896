/* cmd_verify.c - ckpt verify: load a checkpoint into the model it was
 * trained for (a graph spec), strictly as torch does, run it on the CPU
 * reference or a GPU, and compare its outputs with PyTorch's.  The engine is
 * libckpt's (ckpt_verify_*: the state-dict choice, the hint and its fix, the
 * run and the comparisons); this file parses the arguments, opens the files
 * and the spec, and prints the answers. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: ckpt verify --model SPEC [--reference REF] [--against CKPT2]\n"
    "                   [--device auto|cpu|cuda[:N]] [--replicas N] [--select PATH]\n"
    "                   [--atol A] [--rtol R] [--tf32] [--json] [--junit FILE] CKPT\n"
    "\n"
    "Load CKPT's state dict into the model SPEC describes (models/*.json) the way\n"
    "torch's load_state_dict(strict=True) does, run the model, and check its\n"
    "outputs.  Exit 0 when every check passes, 1 when the load or an output fails.\n"
    "\n"
    "  --model SPEC     the graph spec (e.g. models/mnist_mlp.json)\n"
    "  --reference REF  a file holding 'input' and 'output.<name>' for every output\n"
    "                   (written by PyTorch): run on the input, compare each output\n"
    "  --against CKPT2  run CKPT2 on the same input too; outputs must be identical\n"
    "                   (bitwise, unless --atol/--rtol are given)\n"
    "  --device D       auto (CUDA when a GPU is present, else cpu), cpu, cuda, cuda:N\n"
    "  --replicas N     replay nn.DataParallel over N GPUs: scatter the batch along\n"
    "                   dim 0, run each chunk (on cuda:0..N-1 when there are N GPUs,\n"
    "                   else in turn on the device), gather every output along dim 0,\n"
    "                   and report each output that does not come back as it was\n"
    "  --select PATH    CKPT's state dict inside a training checkpoint (keys joined\n"
    "                   by '/'); by default (and for CKPT2) the state dict that best\n"
    "                   fits the model\n"
    "  --atol A         absolute tolerance (default: 1e-5 x the largest |reference|)\n"
    "  --rtol R         relative tolerance (default 1e-5 on the CPU, 1e-4 on CUDA);\n"
    "                   an element passes when |ours - ref| <= A + R * |ref|\n"
    "  --tf32           let CUDA compute in TF32, as torch's allow_tf32 = True\n"
    "                   (products and convolutions; FP32 without it; nothing\n"
    "                   changes on the CPU); the default tolerance widens to\n"
    "                   rtol 1e-2, atol 1e-3 x the largest |reference|\n"
    "  -j, --json       print a JSON document (ckpt-verify(1))\n"
    "  --junit FILE     also write a JUnit XML report to FILE (a testcase per load\n"
    "                   and per output compared), for CI systems\n"
    "  --allow-global M.NAME, --allow-unknown, --max-pickle-bytes N,\n"
    "  --max-header-bytes N, --max-depth N, -q, --quiet, -h, --help\n"
    "                   as for every command (ckpt --help)\n";

enum {
    OPT_MODEL = CLI_OPT_FIRST_COMMAND_OPTION, OPT_REFERENCE, OPT_AGAINST, OPT_DEVICE,
    OPT_SELECT, OPT_ATOL, OPT_RTOL, OPT_REPLICAS, OPT_JUNIT, OPT_TF32
};

/* The command line. */
typedef struct opts {
    const char *spec_path, *ckpt_path, *ref_path, *against_path, *device, *select;
    const char *junit;        /* --junit FILE, or NULL */
    double atol, rtol;
    int atol_set, rtol_set, json;
    int tf32;                 /* --tf32 */
    int replicas;             /* --replicas N, 0 without */
    cli_common common;
} opts;

static int parse_tol(const char *name, const char *arg, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end || errno || !isfinite(v) || v < 0)
        return cli_usage_error("verify", "--%s needs a finite number >= 0, got '%s'", name, arg);
    *out = v;
    return 0;
}

/* ---- the run: open, hand to the engine ----------------------------------------- */

/* The engine's error, as every command reports one. */
static int engine_error(const ckpt_verify *v)
{
    cli_error("verify", ckpt_verify_error_path(v), "%s", ckpt_verify_error_message(v));
    return cli_exit_for(ckpt_verify_error_code(v));
}

static int load_model(const char *spec, ckpt_model **m)
{
    *m = ckpt_model_new();
    if (!*m || ckpt_model_load(*m, spec) != CKPT_OK) {
        cli_error("verify", NULL, "%s", *m ? ckpt_model_error_message(*m) : "out of memory");
        return *m ? cli_exit_for(ckpt_model_error_code(*m)) : CLI_EXIT_IO;
    }
    return CLI_EXIT_OK;
}

typedef struct handles {
    ckpt_verify *v;
    ckpt_model *model, *model2; /* the second: a model holds one state dict */
    ckpt_file *f, *f2, *ref;
} handles;

static int verify_run(const opts *o, handles *h)
{
    int rc;
    if (!(h->v = ckpt_verify_new()) ||
        (o->select && ckpt_verify_set_select(h->v, o->select) != CKPT_OK) ||
        (o->device && ckpt_verify_set_device(h->v, o->device) != CKPT_OK)) {
        cli_error("verify", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    if ((o->atol_set && ckpt_verify_set_atol(h->v, o->atol) != CKPT_OK) ||
        (o->rtol_set && ckpt_verify_set_rtol(h->v, o->rtol) != CKPT_OK) ||
        ckpt_verify_set_replicas(h->v, o->replicas) != CKPT_OK ||
        ckpt_verify_set_tf32(h->v, o->tf32) != CKPT_OK)
        return engine_error(h->v);
    if ((rc = load_model(o->spec_path, &h->model)) != CLI_EXIT_OK ||
        (rc = cli_open("verify", o->ckpt_path, &o->common, &h->f)) != CLI_EXIT_OK)
        return rc;
    if (ckpt_verify_load(h->v, h->model, h->f) != CKPT_OK)
        return engine_error(h->v);
    if (o->against_path) {
        if ((rc = cli_open("verify", o->against_path, &o->common, &h->f2)) != CLI_EXIT_OK ||
            (rc = load_model(o->spec_path, &h->model2)) != CLI_EXIT_OK)
            return rc;
        if (ckpt_verify_load_against(h->v, h->model2, h->f2) != CKPT_OK)
            return engine_error(h->v);
    }
    if (o->ref_path && (rc = cli_open("verify", o->ref_path, &o->common, &h->ref)) != CLI_EXIT_OK)
        return rc;
    /* after a failed load nothing runs: the result is FAIL */
    return ckpt_verify_run(h->v, h->ref) != CKPT_OK ? engine_error(h->v) : CLI_EXIT_OK;
}

/* ---- the text ---------------------------------------------------------------------- */

static const char *shape_text(const ckpt_array *a, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < a->ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
    return buf;
}

/* Whether every key quoted in the load report prints as itself: then the
 * message's newlines and tabs are torch's layout, and are kept. */
static bool report_keys_plain(const ckpt_load_report *r)
{
    for (size_t i = 0; i < r->missing_count; i++)
        if (cli_needs_escape(r->missing[i]))
            return false;
    for (size_t i = 0; i < r->unexpected_count; i++)
        if (cli_needs_escape(r->unexpected[i]))
            return false;
    for (size_t i = 0; i < r->mismatch_count; i++)
        if (cli_needs_escape(r->mismatches[i].key))
            return false;
    for (size_t i = 0; i < r->bad_dtype_count; i++)
        if (cli_needs_escape(r->bad_dtype[i]))
            return false;
    return true;
}

/* torch's message, line by line ("\n\t" between its parts); when a key
 * would put a newline of its own in it, the whole of it on one line. */
static void print_load_message(const ckpt_load_report *r)
{
    if (!report_keys_plain(r)) {
        cli_printf("%s\n", r->message);
        return;
    }
    for (const char *p = r->message;;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (n && *p == '\t') {
            putchar('\t');
            p++, n--;
        }
        cli_printf("%.*s\n", (int)n, p);
        if (!nl)
            break;
        p = nl + 1;
    }
}

static void print_load(const char *label, const char *file, const ckpt_verify *v,
                       ckpt_verify_side side, const ckpt_model *m)
{
    const ckpt_load_report *r = ckpt_verify_load_report(v, side);
    size_t nparams = ckpt_model_param_count(m);
    cli_printf("%-11s %s: state dict at %s\n", label, file, ckpt_verify_choice(v, side)->path);
    if (r->ok) {
        cli_printf("%-11s strict: all %zu keys matched\n", "load", nparams);
        for (size_t i = 0; i < nparams; i++)
            if (ckpt_model_param_tied_in(m, i))
                cli_printf("%-11s %s: not in the file, tied to %s\n", "tied",
                           ckpt_model_param_key(m, i),
                           ckpt_model_param_tie(m, i));
    } else {
        cli_printf("%-11s FAIL\n", "load");
        print_load_message(r);
    }
}

static void print_output(const opts *o, const ckpt_verify_output *x)
{
    char sb[128], rb[128];
    shape_text(x->value, sb, sizeof sb);
    if (x->reference) {
        const ckpt_output_check *c = &x->vs_reference;
        if (!c->shape_ok) {
            cli_printf("%-11s %s %s: the reference's is %s: FAIL\n", "output", x->name, sb,
                       shape_text(x->reference, rb, sizeof rb));
        } else {
            cli_printf("%-11s %s %s: max abs %.3g, max rel %.3g of max |ref| %.3g "
                       "(atol %.3g, rtol %.3g)", "output", x->name, sb, c->max_abs, c->max_rel,
                       c->max_abs_reference, c->atol, c->rtol);
            if (c->pass)
                cli_printf(": PASS\n");
            else
                cli_printf(": FAIL, %lld of %lld elements out of tolerance\n",
                           (long long)c->mismatched, (long long)c->count);
        }
        if (x->has_accuracy)
            cli_printf("%-11s %s: %.2f%% (%lld/%lld), PyTorch %.2f%% (%lld/%lld)\n", "accuracy",
                       x->name, 100.0 * (double)x->correct / (double)x->labels,
                       (long long)x->correct, (long long)x->labels,
                       100.0 * (double)x->reference_correct / (double)x->labels,
                       (long long)x->reference_correct, (long long)x->labels);
    } else if (!o->against_path) {
        cli_printf("%-11s %s %s\n", "output", x->name, sb);
    }
    if (x->against) {
        const ckpt_output_check *c = &x->vs_against;
        if (!c->shape_ok)
            cli_printf("%-11s %s %s: CKPT2 gives %s: FAIL\n", "against", x->name, sb,
                       shape_text(x->against, rb, sizeof rb));
        else if (c->max_abs == 0 && c->pass)
            cli_printf("%-11s %s %s: identical%s\n", "against", x->name, sb,
                       c->atol == 0 && c->rtol == 0 ? " (bitwise)" : "");
        else
            cli_printf("%-11s %s %s: max abs %.3g, max rel %.3g: %s\n", "against", x->name, sb,
                       c->max_abs, c->max_rel, c->pass ? "PASS" : "FAIL");
    }
}

static void print_text(const opts *o, const ckpt_verify *v, const ckpt_model *m,
                       const ckpt_model *m2)
{
    size_t nparams = ckpt_model_param_count(m);
    cli_printf("%-11s %s (%s): %zu parameter tensors\n", "model", ckpt_model_name(m), o->spec_path,
               nparams);
    print_load("checkpoint", o->ckpt_path, v, CKPT_VERIFY_CHECKPOINT, m);
    if (ckpt_verify_hint(v))
        cli_printf("%-11s %s; fix it with:\n%-11s %s\n", "hint", ckpt_verify_hint(v), "",
                   ckpt_verify_fix(v));
    if (o->against_path)
        print_load("against", o->against_path, v, CKPT_VERIFY_AGAINST, m2);
    if (ckpt_verify_ran(v)) {
        const char *note = ckpt_verify_device_note(v);
        cli_printf("%-11s %s%s%s\n", "device", ckpt_backend_description(ckpt_verify_backend(v)),
                   note[0] ? " -- auto: " : "", note);
        if (ckpt_verify_tf32_note(v)[0])
            cli_printf("%-11s --tf32: %s\n", "note", ckpt_verify_tf32_note(v));
        for (size_t i = 0; i < ckpt_model_input_count(m); i++) {
            char sb[128];
            cli_printf("%-11s %s %s from %s%s%s\n", "input", ckpt_model_input_name(m, i),
                       shape_text(ckpt_verify_input(v, i), sb, sizeof sb), ckpt_verify_input_from(v),
                       o->ref_path ? " " : "", o->ref_path ? o->ref_path : "");
        }
        for (size_t i = 0; i < ckpt_verify_output_count(v); i++)
            print_output(o, ckpt_verify_output_at(v, i));
    }
    const ckpt_verify_replicas *r = ckpt_verify_replica_info(v);
    if (r) {
        cli_printf("%-11s %d requested; the batch of %lld split into %d chunk%s (torch.chunk), run "
                   "%s%s\n", "replicas", r->requested, (long long)r->batch, r->used,
                   r->used == 1 ? "" : "s", r->device_count > 1 ? "on " : "in turn on ",
                   r->device_count > 1 ? "one GPU each" : r->devices[0]);
        for (size_t i = 0; i < ckpt_verify_output_count(v); i++) {
            const ckpt_verify_output *x = ckpt_verify_output_at(v, i);
            char sb[128];
            shape_text(x->value, sb, sizeof sb);
            if (x->vs_single.pass)
                cli_printf("%-11s %s %s: gathered back %s\n", "replica", x->name, sb,
                           x->vs_single.max_abs == 0 ? "identically" : "within tolerance");
            else
                cli_printf("%-11s %s %s: BREAKS under DataParallel: %s\n", "replica", x->name, sb,
                           x->replica_reason);
        }
    }
    cli_printf("%-11s %s\n", "result", ckpt_verify_passed(v) ? "PASS" : "FAIL");
}

static int print_json(const ckpt_verify *v)
{
    char *s = ckpt_verify_to_json(v);
    if (!s) {
        cli_error("verify", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    cli_json_puts(s);
    free(s);
    return CLI_EXIT_OK;
}

/* Whether --junit names one of the files read (the report replaces FILE). */
static bool junit_names_input(const opts *o)
{
    struct stat j, st;
    if (stat(o->junit, &j) != 0)
        return false;
    const char *in[] = {o->ckpt_path, o->ref_path, o->against_path, o->spec_path};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++)
        if (in[i] && stat(in[i], &st) == 0 && st.st_dev == j.st_dev && st.st_ino == j.st_ino)
            return true;
    return false;
}

int cmd_verify(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"reference", required_argument, NULL, OPT_REFERENCE},
        {"against", required_argument, NULL, OPT_AGAINST},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"select", required_argument, NULL, OPT_SELECT},
        {"atol", required_argument, NULL, OPT_ATOL},
        {"rtol", required_argument, NULL, OPT_RTOL},
        {"json", no_argument, NULL, CLI_OPT_JSON},
        {"replicas", required_argument, NULL, OPT_REPLICAS},
        {"junit", required_argument, NULL, OPT_JUNIT},
        {"tf32", no_argument, NULL, OPT_TF32},
        CLI_COMMON_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    opts o = {0};
    handles h = {0};
    int rc = CLI_EXIT_OK, opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, CLI_SHORT_OPTIONS_JSON, longopts, NULL)) != -1) {
        int c = cli_common_option("verify", opt, optarg, &o.common);
        if (c < 0) {
            rc = CLI_EXIT_USAGE;
            goto out;
        }
        if (c > 0)
            continue;
        switch (opt) {
        case OPT_MODEL: o.spec_path = optarg; break;
        case OPT_REFERENCE: o.ref_path = optarg; break;
        case OPT_AGAINST: o.against_path = optarg; break;
        case OPT_DEVICE: o.device = optarg; break;
        case OPT_SELECT: o.select = optarg; break;
        case OPT_JUNIT: o.junit = optarg; break;
        case OPT_TF32: o.tf32 = 1; break;
        case CLI_OPT_JSON: o.json = 1; cli_json_on(); break;
        case OPT_REPLICAS: {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (end == optarg || *end || n < 1 || n > 64) {
                rc = cli_usage_error("verify", "--replicas needs a count from 1 to 64, got '%s'",
                                     optarg);
                goto out;
            }
            o.replicas = (int)n;
            break;
        }
        case OPT_ATOL:
            if (parse_tol("atol", optarg, &o.atol)) {
                rc = CLI_EXIT_USAGE;
                goto out;
            }
            o.atol_set = 1;
            break;
        case OPT_RTOL:
            if (parse_tol("rtol", optarg, &o.rtol)) {
                rc = CLI_EXIT_USAGE;
                goto out;
            }
            o.rtol_set = 1;
            break;
        case CLI_OPT_HELP:
            fputs(usage, stdout);
            goto out;
        default:
            rc = cli_bad_option("verify", opt, argv);
            goto out;
        }
    }
    if (!o.spec_path) {
        rc = cli_usage_error("verify", "--model SPEC is required (e.g. models/mnist_mlp.json)");
        goto out;
    }
    if (argc - optind != 1) {
        rc = cli_usage_error("verify", argc - optind < 1 ? "needs a checkpoint, CKPT"
                                                         : "expects exactly one checkpoint");
        goto out;
    }
    o.ckpt_path = argv[optind];
    if (o.device && strcmp(o.device, "auto") && strcmp(o.device, "cpu") &&
        strcmp(o.device, "cuda") && strncmp(o.device, "cuda:", 5)) {
        rc = cli_usage_error("verify", "--device: '%s' is not auto, cpu, cuda or cuda:N", o.device);
        goto out;
    }
    if (o.junit && junit_names_input(&o)) {
        rc = cli_usage_error("verify", "--junit %s names an input: it would be replaced",
                             o.junit);
        goto out;
    }
    if ((rc = verify_run(&o, &h)) != CLI_EXIT_OK)
        goto out;
    /* before the text: a report that cannot be written is the run's error (4) */
    if (o.junit && ckpt_verify_write_junit(h.v, o.junit, o.spec_path) != CKPT_OK) {
        rc = engine_error(h.v);
        goto out;
    }
    if (!o.common.quiet) {
        if (o.json)
            rc = print_json(h.v);
        else
            print_text(&o, h.v, h.model, h.model2);
        if (rc == CLI_EXIT_OK && (fflush(stdout) != 0 || ferror(stdout))) {
            cli_error("verify", NULL, "cannot write output");
            rc = CLI_EXIT_IO;
        }
    }
    if (rc == CLI_EXIT_OK && !ckpt_verify_passed(h.v))
        rc = CLI_EXIT_DIFFERENT;
out:
    /* the engine first: it points into the models and files */
    ckpt_verify_free(h.v);
    ckpt_model_free(h.model);
    ckpt_model_free(h.model2);
    ckpt_file_free(h.f);
    ckpt_file_free(h.f2);
    ckpt_file_free(h.ref);
    cli_common_free(&o.common);
    return rc;
}
