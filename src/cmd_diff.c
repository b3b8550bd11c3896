/* cmd_diff.c - ckpt diff: the keys, shapes, dtypes and values of two
 * checkpoints, A the model's (reference) and B the one loaded into it,
 * reported in the words of torch's load_state_dict. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const char diff_usage[] =
    "usage: ckpt diff [--atol A] [--rtol R] [--keys-only] [--normalize] [--select PATH] [--json] A B\n"
    "\n"
    "Compare two checkpoints of any format: keys missing from B and unexpected in\n"
    "B (in the words of torch's load_state_dict, A being the model and B the\n"
    "checkpoint loaded into it), shape and dtype mismatches, and the values of\n"
    "every common tensor (max absolute and relative difference, elements that\n"
    "differ, the first one).  A file with one state dict (or the one --select\n"
    "names) is compared by its keys, and its other tensors (lists, nested\n"
    "containers) by their paths when both files hold the state dict at the same\n"
    "path; any other by the path of every tensor.  Exit 0 when they are equal\n"
    "within the tolerance, 1 when they differ or when nothing was compared.\n"
    "\n"
    "  --atol A               absolute tolerance (default 0: exact)\n"
    "  --rtol R               relative tolerance, of |b| (default 0); equal when\n"
    "                         |a - b| <= A + R * |b|\n"
    "  --keys-only            compare keys, shapes and dtypes; read no data\n"
    "  --normalize            unwrap module., _orig_mod., ... of both sides' keys\n"
    "                         first (as ckpt unwrap does)\n"
    "  --select PATH          compare the state dict at PATH of each file (keys\n"
    "                         joined by '/')\n"
    "  -j, --json             print a JSON document (ckpt-diff(1))\n"
    "  --allow-global M.NAME  admit this global as an opaque object (repeatable)\n"
    "  --allow-unknown        admit every unknown global as an opaque object\n"
    "  --max-pickle-bytes N   refuse pickles larger than N bytes (default 1G)\n"
    "  --max-header-bytes N   refuse safetensors headers larger than N bytes\n"
    "                         (default 100000000, as safetensors)\n"
    "  --max-depth N          refuse values nested more than N levels (default 10000)\n"
    "  -q, --quiet            print nothing but errors; the exit status tells\n"
    "  -h, --help             this text\n";

enum { OPT_ATOL = CLI_OPT_FIRST_COMMAND_OPTION, OPT_RTOL, OPT_KEYS_ONLY, OPT_NORMALIZE,
       OPT_SELECT };

/* Progress on a terminal, once the values have taken a second: "N/M tensors". */
typedef struct progress {
    time_t start;
    bool shown;
} progress;

static void show_progress(void *user, size_t done, size_t total)
{
    progress *p = user;
    if (done == 0)
        p->start = time(NULL);
    if (done == 0 || time(NULL) - p->start < 1)
        return;
    fprintf(stderr, "\rckpt: diff: comparing values %zu/%zu tensors", done, total);
    if (done == total)
        fputc('\n', stderr);
    p->shown = true;
}

/* ---- text output --------------------------------------------------------------- */

static void print_shape(const ckpt_tensor *t)
{
    putchar('[');
    for (int i = 0; i < ckpt_tensor_ndim(t); i++)
        cli_printf("%s%lld", i ? ", " : "", (long long)ckpt_tensor_shape(t)[i]);
    putchar(']');
}

/* The first mismatch as "[i, j, k]", or its flat index. */
static void print_first(const ckpt_diff_pair *p)
{
    if (p->first_ndim < 0) {
        cli_printf("flat index %lld", (long long)p->r.first_index);
        return;
    }
    putchar('[');
    for (int k = 0; k < p->first_ndim; k++)
        cli_printf("%s%lld", k ? ", " : "", (long long)p->first_coords[k]);
    putchar(']');
}

/* torch's message list: the keys in quotes, comma-separated, then ". " */
static void print_key_list(const char *what, const ckpt_diff *d, size_t n,
                           const char *(*at)(const ckpt_diff *, size_t))
{
    cli_printf("%s key(s) in state_dict: ", what);
    for (size_t i = 0; i < n; i++)
        cli_printf("%s\"%s\"", i ? ", " : "", at(d, i));
    cli_printf(". \n");
}

static void print_source(const char *label, const ckpt_diff_side *s)
{
    cli_printf("%s: %s: ", label, s->file);
    if (s->by_path) {
        cli_printf("%zu state dict%s: every tensor by its path (%zu tensors)\n", s->state_dicts,
                   s->state_dicts == 1 ? "" : "s", s->tensors);
        return;
    }
    cli_printf("state dict %s (%zu tensors)", s->state_dict.len ? s->state_dict_text : "(root)",
               s->tensors - s->others);
    if (s->others)
        cli_printf(", and %zu other tensor%s by path", s->others, s->others == 1 ? "" : "s");
    cli_printf("\n");
}

static void print_values(const ckpt_diff_pair *p)
{
    const ckpt_compare_result *r = &p->r;
    if (p->compared_as == CKPT_DIFF_INCOMPARABLE) {
        cli_printf("%s: values not compared: %s in A, %s in B\n", p->key,
                   ckpt_dtype_name(ckpt_tensor_dtype(p->a)), ckpt_dtype_name(ckpt_tensor_dtype(p->b)));
    } else if (p->compared_as == CKPT_DIFF_BYTES && r->mismatched) {
        cli_printf("%s: %lld of %lld elements differ (compared as bytes), first at ", p->key,
                   (long long)r->mismatched, (long long)r->count);
        print_first(p);
        cli_printf("\n");
    } else if (p->compared_as == CKPT_DIFF_VALUES && (r->mismatched || r->max_abs != 0)) {
        cli_printf("%s: max abs %.3g, max rel %.3g, ", p->key, r->max_abs, r->max_rel);
        if (!r->mismatched) {
            cli_printf("all %lld elements within tolerance\n", (long long)r->count);
            return;
        }
        cli_printf("%lld of %lld elements differ, first at ", (long long)r->mismatched,
                   (long long)r->count);
        print_first(p);
        cli_printf(" (%s vs %s)\n", p->first_a_text, p->first_b_text);
    }
}

static void print_text(const ckpt_diff *d, bool keys_only)
{
    const ckpt_diff_side *a = ckpt_diff_side_of(d, 0), *b = ckpt_diff_side_of(d, 1);
    const ckpt_diff_summary *s = ckpt_diff_summary_of(d);
    size_t n = ckpt_diff_pair_count(d);
    if (a->by_path || b->by_path || a->state_dict.len || b->state_dict.len) {
        print_source("A", a);
        print_source("B", b);
    }
    /* torch's order: missing, unexpected, then size mismatches */
    if (s->missing)
        print_key_list("Missing", d, s->missing, ckpt_diff_missing_at);
    if (s->unexpected)
        print_key_list("Unexpected", d, s->unexpected, ckpt_diff_unexpected_at);
    for (size_t k = 0; k < n; k++) {
        const ckpt_diff_pair *p = ckpt_diff_pair_at(d, k);
        if (!p->size_mismatch)
            continue;
        cli_printf("size mismatch for %s: copying a param with shape torch.Size(", p->key);
        print_shape(p->b);
        cli_printf(") from checkpoint, the shape in current model is torch.Size(");
        print_shape(p->a);
        cli_printf(").\n");
    }
    for (size_t k = 0; k < n; k++) {
        const ckpt_diff_pair *p = ckpt_diff_pair_at(d, k);
        if (p->dtype_mismatch)
            cli_printf("dtype mismatch for %s: %s in A, %s in B\n", p->key,
                       ckpt_dtype_name(ckpt_tensor_dtype(p->a)),
                       ckpt_dtype_name(ckpt_tensor_dtype(p->b)));
        print_values(p);
    }
    if (s->normalize_would_match)
        cli_printf("(--normalize would match %zu missing key%s with unexpected ones)\n",
                   s->normalize_would_match, s->normalize_would_match == 1 ? "" : "s");
    cli_printf("%zu tensor%s compared%s: %zu equal, %zu differ", s->compared,
               s->compared == 1 ? "" : "s", keys_only ? " (keys, shapes and dtypes only)" : "",
               s->equal, s->differ);
    if (s->size_mismatch)
        cli_printf(" (%zu size mismatch%s)", s->size_mismatch, s->size_mismatch == 1 ? "" : "es");
    cli_printf("; %zu missing, %zu unexpected\n", s->missing, s->unexpected);
    if (a->unreached || b->unreached)
        cli_printf("not compared: storages inside opaque objects (%zu in A, %zu in B)\n",
                   a->unreached, b->unreached);
    if (s->reason)
        cli_printf("not equal: %s\n", s->reason);
}

/* ---- the command ------------------------------------------------------------------ */

static int tolerance(const char *name, const char *arg, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end || errno == ERANGE || !isfinite(v) || v < 0) {
        cli_usage_error("diff", "--%s needs a number >= 0, got '%s'", name, arg);
        return -1;
    }
    *out = v;
    return 0;
}

/* Compare the two open files and print; the exit status. */
static int run(ckpt_diff *d, ckpt_file *f[2], const char *file[2], bool json, bool quiet,
               bool keys_only)
{
    progress prog = {0};
    if (!quiet && isatty(2))
        ckpt_diff_set_progress(d, show_progress, &prog);
    int rc = ckpt_diff_run(d, f[0], f[1]);
    if (rc != CKPT_OK) {
        if (prog.shown)
            fputc('\n', stderr);
        int side = ckpt_diff_error_side(d);
        cli_error("diff", side >= 0 ? file[side] : NULL, "%s", ckpt_diff_error_message(d));
        return cli_exit_for(rc);
    }
    if (quiet)
        return ckpt_diff_summary_of(d)->all_equal ? CLI_EXIT_OK : CLI_EXIT_DIFFERENT;
    if (json) {
        char *text = ckpt_diff_to_json(d);
        if (!text) {
            cli_error("diff", NULL, "out of memory");
            return CLI_EXIT_IO;
        }
        cli_json_puts(text);
        free(text);
    } else {
        print_text(d, keys_only);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("diff", NULL, "cannot write output");
        return CLI_EXIT_IO;
    }
    return ckpt_diff_summary_of(d)->all_equal ? CLI_EXIT_OK : CLI_EXIT_DIFFERENT;
}

int cmd_diff(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"atol", required_argument, NULL, OPT_ATOL},
        {"rtol", required_argument, NULL, OPT_RTOL},
        {"keys-only", no_argument, NULL, OPT_KEYS_ONLY},
        {"normalize", no_argument, NULL, OPT_NORMALIZE},
        {"json", no_argument, NULL, CLI_OPT_JSON},
        {"select", required_argument, NULL, OPT_SELECT},
        CLI_COMMON_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    cli_common common = {0};
    double atol = 0, rtol = 0;
    bool keys_only = false, normalize = false, json = false;
    const char *select = NULL;
    ckpt_file *f[2] = {NULL, NULL};
    ckpt_diff *d = NULL;
    int rc = CLI_EXIT_OK, opt;

    opterr = 0;
    while ((opt = getopt_long(argc, argv, CLI_SHORT_OPTIONS_JSON, longopts, NULL)) != -1) {
        int c = cli_common_option("diff", opt, optarg, &common);
        if (c < 0) {
            rc = CLI_EXIT_USAGE;
            goto out;
        }
        if (c > 0)
            continue;
        switch (opt) {
        case OPT_ATOL:
        case OPT_RTOL:
            if (tolerance(opt == OPT_ATOL ? "atol" : "rtol", optarg,
                          opt == OPT_ATOL ? &atol : &rtol) < 0) {
                rc = CLI_EXIT_USAGE;
                goto out;
            }
            break;
        case OPT_KEYS_ONLY: keys_only = true; break;
        case OPT_NORMALIZE: normalize = true; break;
        case CLI_OPT_JSON: json = true; cli_json_on(); break;
        case OPT_SELECT: select = optarg; break;
        case CLI_OPT_HELP:
            fputs(diff_usage, stdout);
            goto out;
        default:
            rc = cli_bad_option("diff", opt, argv);
            goto out;
        }
    }
    if (argc - optind != 2) {
        rc = cli_usage_error("diff", argc - optind < 2 ? "needs two files, A and B"
                                                       : "expects exactly two files, A and B");
        goto out;
    }
    if (keys_only && (atol || rtol)) {
        rc = cli_usage_error("diff", "--keys-only compares no values: --atol and --rtol do not apply");
        goto out;
    }
    const char *file[2] = {argv[optind], argv[optind + 1]};
    if (!(d = ckpt_diff_new()) || ckpt_diff_set_tolerance(d, atol, rtol) != CKPT_OK ||
        ckpt_diff_set_keys_only(d, keys_only) != CKPT_OK ||
        ckpt_diff_set_normalize(d, normalize) != CKPT_OK ||
        ckpt_diff_set_select(d, select) != CKPT_OK) {
        cli_error("diff", NULL, "out of memory");
        rc = CLI_EXIT_IO;
        goto out;
    }
    for (int i = 0; i < 2; i++)
        if ((rc = cli_open("diff", file[i], &common, &f[i])) != CLI_EXIT_OK)
            goto out;
    rc = run(d, f, file, json, common.quiet, keys_only);
out:
    ckpt_diff_free(d);
    ckpt_file_free(f[0]);
    ckpt_file_free(f[1]);
    cli_common_free(&common);
    return rc;
}
