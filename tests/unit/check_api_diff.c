/* check_api_diff.c - ckpt diff's engine as a libckpt user calls it
 * (ckpt_diff_*): ckpt_diff_to_json() is byte for byte the document that
 * `ckpt diff --json` prints for the same files and options, and the
 * accessors say what the CLI's text says.  Inputs: the fixtures of
 * tests/data, and copies of them with keys renamed, written by the library
 * into a temporary folder. */
#include "unit.h"

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/check_api_diff.XXXXXX";
static const char *const made[] = {"swapped.pth", "biases.pth", "dtypes_swapped.pth",
                                   "collide.pth"};

/* tests/data/NAME under $srcdir, or a file made here (NAME without '/'). */
static const char *path_of(const char *name, char *buf, size_t cap)
{
    const char *src = getenv("srcdir");
    if (strchr(name, '/'))
        snprintf(buf, cap, "%s/%s", src ? src : ".", name);
    else
        snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static ckpt_file *open_ok(const char *path)
{
    ckpt_file *f = ckpt_file_new();
    ck_assert_ptr_nonnull(f);
    ck_assert_msg(ckpt_file_open(f, path) == CKPT_OK, "%s: %s", path, ckpt_file_error_message(f));
    return f;
}

/* SRC with its keys renamed by sed-style RULES (as `ckpt rename -e` does),
 * written as NAME in the temporary folder. */
static void write_renamed(const char *src, const char *name, const char *const *rules, size_t n)
{
    char in[4096], out[4096];
    ckpt_file *f = open_ok(path_of(src, in, sizeof(in)));
    ckpt_rename *r = ckpt_rename_new();
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ckpt_rename_sed(r, rules[i]), CKPT_OK);
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, NULL, 0, NULL), CKPT_OK);
    ck_assert_msg(ckpt_file_write(f, path_of(name, out, sizeof(out)), NULL) == CKPT_OK, "%s",
                  ckpt_file_error_message(f));
    ckpt_rename_free(r);
    ckpt_file_free(f);
}

/* The options of one diff, as the library takes them and as ckpt diff's
 * command line says them. */
typedef struct opts {
    double atol, rtol;
    int keys_only, normalize;
    const char *select;
} opts;

/* A diff of two files, with the files it borrows from. */
typedef struct run {
    ckpt_file *a, *b;
    ckpt_diff *d;
    int rc;
    char pa[4096], pb[4096];
} run;

static void diff_start(run *r, const char *a, const char *b, const opts *o)
{
    r->a = open_ok(path_of(a, r->pa, sizeof(r->pa)));
    r->b = open_ok(path_of(b, r->pb, sizeof(r->pb)));
    r->d = ckpt_diff_new();
    ck_assert_ptr_nonnull(r->d);
    ck_assert_int_eq(ckpt_diff_set_tolerance(r->d, o->atol, o->rtol), CKPT_OK);
    ck_assert_int_eq(ckpt_diff_set_keys_only(r->d, o->keys_only), CKPT_OK);
    ck_assert_int_eq(ckpt_diff_set_normalize(r->d, o->normalize), CKPT_OK);
    ck_assert_int_eq(ckpt_diff_set_select(r->d, o->select), CKPT_OK);
    r->rc = ckpt_diff_run(r->d, r->a, r->b);
}

static void diff_end(run *r)
{
    ckpt_diff_free(r->d);
    ckpt_file_free(r->a);
    ckpt_file_free(r->b);
}

/* What `ckpt diff [--json] OPTS A B` prints, stdout and stderr together
 * (malloc'd), and its exit status. */
static char *cli(const run *r, const opts *o, int json, int *status)
{
    const char *ckpt = getenv("CKPT"); /* set by make check: the built ckpt */
    char cmd[16384];
    int n = snprintf(cmd, sizeof(cmd), "'%s' diff%s", ckpt ? ckpt : "./ckpt", json ? " --json" : "");
    if (o->atol)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --atol %.17g", o->atol);
    if (o->rtol)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --rtol %.17g", o->rtol);
    if (o->keys_only)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --keys-only");
    if (o->normalize)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --normalize");
    if (o->select)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --select '%s'", o->select);
    snprintf(cmd + n, sizeof(cmd) - (size_t)n, " '%s' '%s' 2>&1", r->pa, r->pb);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t len = 0, cap = 4096;
    char *out = malloc(cap);
    ck_assert_ptr_nonnull(out);
    size_t got;
    while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 2) {
            out = realloc(out, cap *= 2);
            ck_assert_ptr_nonnull(out);
        }
    }
    out[len] = '\0';
    int st = pclose(p);
    ck_assert_msg(WIFEXITED(st), "%s: did not exit", cmd);
    *status = WEXITSTATUS(st);
    return out;
}

/* The diff's JSON is what the CLI prints (and puts ends with a newline);
 * the CLI's exit status says what the summary says. */
static void same_as_cli(const run *r, const opts *o)
{
    ck_assert_int_eq(r->rc, CKPT_OK);
    int status;
    char *printed = cli(r, o, 1, &status);
    char *json = ckpt_diff_to_json(r->d);
    ck_assert_ptr_nonnull(json);
    size_t n = strlen(json);
    ck_assert_msg(strlen(printed) == n + 1 && memcmp(printed, json, n) == 0 && printed[n] == '\n',
                  "ckpt diff --json printed\n%s\nckpt_diff_to_json gave\n%s", printed, json);
    ck_assert_int_eq(status, ckpt_diff_summary_of(r->d)->all_equal ? 0 : 1);
    free(json);
    free(printed);
}

/* ---- equal files -------------------------------------------------------- */

START_TEST(test_equal_files)
{
    opts o = {0};
    run r;
    diff_start(&r, "tests/data/mlp.pth", "tests/data/proto4.pth", &o);
    same_as_cli(&r, &o);

    const ckpt_diff_summary *s = ckpt_diff_summary_of(r.d);
    ck_assert_int_eq(s->all_equal, 1);
    ck_assert_ptr_null(s->reason);
    ck_assert_uint_eq(s->compared, 4);
    ck_assert_uint_eq(s->equal, 4);
    ck_assert_uint_eq(s->missing + s->unexpected + s->differ, 0);
    /* one state dict each, at the root: compared by key */
    const ckpt_diff_side *a = ckpt_diff_side_of(r.d, 0);
    ck_assert_int_eq(a->by_path, 0);
    ck_assert_uint_eq(a->state_dict.len, 0);
    ck_assert_str_eq(a->state_dict_text, "");
    ck_assert_int_eq(a->format, CKPT_FORMAT_PTH_ZIP);
    const ckpt_diff_pair *p = ckpt_diff_pair_at(r.d, 0);
    ck_assert_str_eq(p->key, "n.1.weight");
    ck_assert_int_eq(p->compared_as, CKPT_DIFF_VALUES);
    ck_assert_int_eq(p->equal, 1);
    ck_assert_int_eq(p->r.mismatched, 0);
    ck_assert_int_eq(p->r.first_index, -1);
    ck_assert_ptr_null(p->first_a_text);
    ck_assert_ptr_null(ckpt_diff_pair_at(r.d, 4));
    diff_end(&r);
}
END_TEST

/* ---- values that differ ------------------------------------------------- */

/* bn.pth with running_mean and running_var swapped: a bad conversion. */
static void make_swapped(void)
{
    static const char *const rules[] = {"s/running_mean$/tmp/", "s/running_var$/running_mean/",
                                        "s/tmp$/running_var/"};
    write_renamed("tests/data/bn.pth", "swapped.pth", rules, 3);
}

START_TEST(test_values_differ)
{
    make_swapped();
    opts o = {0};
    run r;
    diff_start(&r, "tests/data/bn.pth", "swapped.pth", &o);
    same_as_cli(&r, &o);

    const ckpt_diff_summary *s = ckpt_diff_summary_of(r.d);
    ck_assert_uint_eq(s->compared, 14);
    ck_assert_uint_eq(s->differ, 4);
    ck_assert_int_eq(s->all_equal, 0);
    const ckpt_diff_pair *p = NULL;
    for (size_t i = 0; i < ckpt_diff_pair_count(r.d); i++)
        if (strcmp(ckpt_diff_pair_at(r.d, i)->key, "features.1.running_mean") == 0)
            p = ckpt_diff_pair_at(r.d, i);
    ck_assert_ptr_nonnull(p);
    /* "features.1.running_mean: max abs 0.932, max rel 1, 4 of 4 elements
     * differ, first at [0] (0.0046823877 vs 0.9233928)" */
    ck_assert_int_eq(p->equal, 0);
    ck_assert_int_eq(p->r.mismatched, 4);
    ck_assert_int_eq(p->r.count, 4);
    ck_assert_double_eq_tol(p->r.max_abs, 0.9316380824893713, 1e-15);
    ck_assert_double_eq_tol(p->r.max_rel, 1.0021755423585819, 1e-15);
    ck_assert_int_eq(p->first_ndim, 1);
    ck_assert_int_eq(p->first_coords[0], 0);
    ck_assert_str_eq(p->first_a_text, "0.0046823877");
    ck_assert_str_eq(p->first_b_text, "0.9233928");
    diff_end(&r);

    /* within an absolute tolerance of 1, all are equal */
    o.atol = 1;
    diff_start(&r, "tests/data/bn.pth", "swapped.pth", &o);
    same_as_cli(&r, &o);
    ck_assert_int_eq(ckpt_diff_summary_of(r.d)->all_equal, 1);
    diff_end(&r);
    o = (opts){.rtol = 1.1};
    diff_start(&r, "tests/data/bn.pth", "swapped.pth", &o);
    same_as_cli(&r, &o);
    ck_assert_uint_eq(ckpt_diff_summary_of(r.d)->differ, 2);
    diff_end(&r);
}
END_TEST

/* ---- keys on one side only, and --normalize ----------------------------- */

START_TEST(test_keys_on_one_side)
{
    opts o = {0};
    run r;
    diff_start(&r, "tests/data/mlp.pth", "tests/data/dp_mlp.pth", &o);
    same_as_cli(&r, &o);

    /* torch's words: A is the model, B the checkpoint loaded into it */
    const ckpt_diff_summary *s = ckpt_diff_summary_of(r.d);
    ck_assert_uint_eq(s->compared, 0);
    ck_assert_uint_eq(s->missing, 4);
    ck_assert_uint_eq(s->unexpected, 4);
    ck_assert_str_eq(ckpt_diff_missing_at(r.d, 0), "n.1.weight");
    ck_assert_str_eq(ckpt_diff_unexpected_at(r.d, 3), "module.n.3.bias");
    ck_assert_ptr_null(ckpt_diff_missing_at(r.d, 4));
    /* "(--normalize would match 4 missing keys with unexpected ones)" */
    ck_assert_uint_eq(s->normalize_would_match, 4);
    ck_assert_ptr_null(s->reason); /* not equal already: no reason needed */
    diff_end(&r);
}
END_TEST

START_TEST(test_normalize)
{
    opts o = {.normalize = 1};
    run r;
    diff_start(&r, "tests/data/mlp.pth", "tests/data/dp_mlp.pth", &o);
    same_as_cli(&r, &o);
    ck_assert_int_eq(ckpt_diff_summary_of(r.d)->all_equal, 1);
    const ckpt_diff_pair *p = ckpt_diff_pair_at(r.d, 0);
    ck_assert_str_eq(p->key, "n.1.weight");
    ck_assert_str_eq(p->a_key, "n.1.weight");
    ck_assert_str_eq(p->b_key, "module.n.1.weight");
    diff_end(&r);

    /* every component of a path: a training checkpoint, by path */
    diff_start(&r, "tests/data/train_ckpt.pth", "tests/data/legacy_train.pth", &o);
    same_as_cli(&r, &o);
    const ckpt_diff_side *a = ckpt_diff_side_of(r.d, 0);
    ck_assert_int_eq(a->by_path, 1);
    ck_assert_uint_eq(a->state_dicts, 5);
    ck_assert_uint_eq(a->tensors, 8);
    ck_assert_ptr_null(a->state_dict_text);
    p = ckpt_diff_pair_at(r.d, 0);
    ck_assert_str_eq(p->key, "model_state_dict/n.1.weight");
    ck_assert_str_eq(p->a_key, "model_state_dict/module.n.1.weight");
    diff_end(&r);

    /* two keys of one file that unwrap to one key cannot be compared */
    static const char *const rules[] = {"s/^module\\.n\\.1\\.bias$/_orig_mod.n.1.weight/"};
    write_renamed("tests/data/dp_mlp.pth", "collide.pth", rules, 1);
    diff_start(&r, "collide.pth", "tests/data/mlp.pth", &o);
    ck_assert_int_eq(r.rc, CKPT_ERR_UNSUPPORTED);
    ck_assert_int_eq(ckpt_diff_error_side(r.d), 0);
    ck_assert_str_eq(ckpt_diff_error_message(r.d), "keys 'module.n.1.weight' and "
                     "'_orig_mod.n.1.weight' would both be compared as 'n.1.weight'");
    ck_assert_ptr_null(ckpt_diff_to_json(r.d));
    ck_assert_ptr_null(ckpt_diff_summary_of(r.d));
    int status;
    char *printed = cli(&r, &o, 0, &status);
    char want[8192];
    snprintf(want, sizeof(want), "ckpt: diff: %s: %s\n", r.pa, ckpt_diff_error_message(r.d));
    ck_assert_str_eq(printed, want);
    ck_assert_int_eq(status, 3);
    free(printed);
    diff_end(&r);
}
END_TEST

/* ---- keys only, dtypes -------------------------------------------------- */

START_TEST(test_keys_only_and_dtypes)
{
    static const char *const rules[] = {
        "s/^float64$/t1/", "s/^float32$/float64/", "s/^t1$/float32/",
        "s/^complex64$/t2/", "s/^complex128$/complex64/", "s/^t2$/complex128/",
        "s/^int64$/t3/", "s/^int32$/int64/", "s/^t3$/int32/"};
    write_renamed("tests/data/dtypes.pth", "dtypes_swapped.pth", rules, 9);
    opts o = {.keys_only = 1};
    run r;
    diff_start(&r, "tests/data/dtypes.pth", "dtypes_swapped.pth", &o);
    same_as_cli(&r, &o);
    /* a dtype mismatch alone is no difference; nothing is read */
    const ckpt_diff_summary *s = ckpt_diff_summary_of(r.d);
    ck_assert_int_eq(s->all_equal, 1);
    ck_assert_uint_eq(s->dtype_mismatch, 6);
    for (size_t i = 0; i < ckpt_diff_pair_count(r.d); i++)
        ck_assert_int_eq(ckpt_diff_pair_at(r.d, i)->compared_as, CKPT_DIFF_NOT_COMPARED);
    diff_end(&r);

    /* with values: numbers across dtypes, exact integers; complex not */
    o.keys_only = 0;
    diff_start(&r, "tests/data/dtypes.pth", "dtypes_swapped.pth", &o);
    same_as_cli(&r, &o);
    for (size_t i = 0; i < ckpt_diff_pair_count(r.d); i++) {
        const ckpt_diff_pair *p = ckpt_diff_pair_at(r.d, i);
        if (strcmp(p->key, "int64") == 0) {
            ck_assert_int_eq(p->dtype_mismatch, 1);
            ck_assert_int_eq(p->compared_as, CKPT_DIFF_VALUES);
            ck_assert_str_eq(p->first_a_text, "-9223372036854775808");
            ck_assert_str_eq(p->first_b_text, "-2147483648");
        }
        if (strcmp(p->key, "complex64") == 0) {
            ck_assert_int_eq(p->compared_as, CKPT_DIFF_INCOMPARABLE);
            ck_assert_int_eq(p->equal, 0);
        }
    }
    diff_end(&r);
}
END_TEST

/* ---- a shape mismatch --------------------------------------------------- */

START_TEST(test_shape_mismatch)
{
    static const char *const rules[] = {"s/^n\\.1\\.bias$/tmp/", "s/^n\\.3\\.bias$/n.1.bias/",
                                        "s/^tmp$/n.3.bias/"};
    write_renamed("tests/data/mlp.pth", "biases.pth", rules, 3);
    opts o = {0};
    run r;
    diff_start(&r, "tests/data/mlp.pth", "biases.pth", &o);
    same_as_cli(&r, &o);
    const ckpt_diff_summary *s = ckpt_diff_summary_of(r.d);
    ck_assert_uint_eq(s->size_mismatch, 2);
    ck_assert_uint_eq(s->differ, 2);
    const ckpt_diff_pair *p = ckpt_diff_pair_at(r.d, 1);
    /* "size mismatch for n.1.bias: copying a param with shape
     * torch.Size([10]) from checkpoint, the shape in current model is
     * torch.Size([128])." */
    ck_assert_str_eq(p->key, "n.1.bias");
    ck_assert_int_eq(p->size_mismatch, 1);
    ck_assert_int_eq(p->compared_as, CKPT_DIFF_NOT_COMPARED);
    ck_assert_int_eq(ckpt_tensor_shape(p->a)[0], 128);
    ck_assert_int_eq(ckpt_tensor_shape(p->b)[0], 10);
    diff_end(&r);

    o.keys_only = 1;
    diff_start(&r, "tests/data/mlp.pth", "biases.pth", &o);
    same_as_cli(&r, &o);
    ck_assert_uint_eq(ckpt_diff_summary_of(r.d)->differ, 2);
    diff_end(&r);
}
END_TEST

/* ---- a chosen state dict, and the progress callback --------------------- */

static void count_progress(void *user, size_t done, size_t total)
{
    size_t *calls = user;
    ck_assert_uint_eq(done, calls[0]++); /* 0, then once a pair */
    calls[1] = total;
}

START_TEST(test_select_and_progress)
{
    opts o = {.select = "model_state_dict"};
    run r;
    diff_start(&r, "tests/data/train_ckpt.pth", "tests/data/legacy_train.pth", &o);
    same_as_cli(&r, &o);
    /* "state dict model_state_dict (4 tensors), and 4 other tensors by path" */
    const ckpt_diff_side *a = ckpt_diff_side_of(r.d, 0);
    ck_assert_int_eq(a->by_path, 0);
    ck_assert_str_eq(a->state_dict_text, "model_state_dict");
    ck_assert_uint_eq(a->tensors, 8);
    ck_assert_uint_eq(a->others, 4);

    size_t calls[2] = {0, 0};
    ck_assert_int_eq(ckpt_diff_set_progress(r.d, count_progress, calls), CKPT_OK);
    ck_assert_int_eq(ckpt_diff_run(r.d, r.a, r.b), CKPT_OK); /* a second run: the same results */
    ck_assert_uint_eq(calls[0], 9);
    ck_assert_uint_eq(calls[1], 8);
    same_as_cli(&r, &o);
    diff_end(&r);

    o.select = "nope";
    diff_start(&r, "tests/data/train_ckpt.pth", "tests/data/legacy_train.pth", &o);
    ck_assert_int_eq(r.rc, CKPT_ERR_FORMAT);
    ck_assert_int_eq(ckpt_diff_error_side(r.d), 0);
    ck_assert_str_eq(ckpt_diff_error_message(r.d), "--select 'nope' names no state dict of this "
                     "file (5 state dicts; ckpt inspect lists them)");
    diff_end(&r);
}
END_TEST

START_TEST(test_usage)
{
    ckpt_diff *d = ckpt_diff_new();
    ck_assert_int_eq(ckpt_diff_set_tolerance(d, -1, 0), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_diff_set_tolerance(d, 0, INFINITY), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_diff_run(d, NULL, NULL), CKPT_ERR_USAGE);
    ck_assert_ptr_null(ckpt_diff_to_json(d)); /* nothing ran */
    ck_assert_ptr_null(ckpt_diff_side_of(d, 0));
    ck_assert_uint_eq(ckpt_diff_pair_count(d), 0);
    ckpt_diff_free(d);
    ckpt_diff_free(NULL);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_diff");
    TCase *tc = tcase_create("diff");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_equal_files);
    tcase_add_test(tc, test_values_differ);
    tcase_add_test(tc, test_keys_on_one_side);
    tcase_add_test(tc, test_normalize);
    tcase_add_test(tc, test_keys_only_and_dtypes);
    tcase_add_test(tc, test_shape_mismatch);
    tcase_add_test(tc, test_select_and_progress);
    tcase_add_test(tc, test_usage);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("check_api_diff: mkdtemp");
        return 1;
    }
    int rc = unit_run(suite());
    char p[4096];
    for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++)
        unlink(path_of(made[i], p, sizeof(p)));
    rmdir(tmpdir);
    return rc;
}
