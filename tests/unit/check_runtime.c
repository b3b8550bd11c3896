/* check_runtime.c - the model runtime on the CPU: every op case of
 * tests/data/ops (made by PyTorch, tests/fixtures/make_verify_fixtures.py)
 * on every CPU path (plain loops, OpenBLAS, each packed-SGEMM kernel), spec
 * errors, strict-load reports and run errors. */
#include "unit.h"
#include "runtime/backends.h" /* ckpt_backend_cpu_open_with() */

#include <dirent.h>
#include <math.h>

static char *data_path(const char *rel)
{
    const char *src = getenv("srcdir");
    char *p = malloc(4096);
    if (!p)
        abort();
    snprintf(p, 4096, "%s/%s", src ? src : ".", rel);
    return p;
}

/* ---- op cases ------------------------------------------------------------ */

static char **cases;
static int ncases;

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list_cases(void)
{
    char *dir = data_path("tests/data/ops");
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "check_runtime: cannot open %s\n", dir);
        exit(1);
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0) {
            cases = realloc(cases, (size_t)(ncases + 1) * sizeof *cases);
            cases[ncases++] = strndup(e->d_name, l - 5);
        }
    }
    closedir(d);
    free(dir);
    qsort(cases, (size_t)ncases, sizeof *cases, by_name);
}

/* Ops whose result involves no rounding: must match PyTorch bit for bit. */
static int exact_case(const char *name)
{
    static const char *const exact[] = {"relu", "permute", "flatten", "reshape", "view", "cat", "prior_box",
                                        "maxpool", "add", "dropout", "squeeze", "unsqueeze",
                                        /* copies, and one rounding of exact operands */
                                        "transpose", "slice", "select", "expand", "contiguous",
                                        "clone", "alias", "embedding", "parameter", "constant",
                                        "neg", "scalar_", "bcast_"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strncmp(name, exact[i], strlen(exact[i])) == 0)
            return 1;
    return 0;
}

static void read_array(ckpt_file *f, const char *key, ckpt_array *a)
{
    const ckpt_value *v = ckpt_value_dict_get(ckpt_file_root(f), key);
    ck_assert_msg(v && ckpt_value_tensor(v), "no tensor %s", key);
    const ckpt_tensor *t = ckpt_value_tensor(v);
    a->ndim = ckpt_tensor_ndim(t);
    memcpy(a->shape, ckpt_tensor_shape(t), sizeof(int64_t) * (size_t)a->ndim);
    a->data = malloc((size_t)ckpt_tensor_numel(t) * sizeof(float) + 4);
    ck_assert_int_eq(ckpt_tensor_read_float32(f, t, a->data, (size_t)ckpt_tensor_numel(t)), 0);
}

/* What does the CPU backend's matrix products, each tested: its plain-C
 * loops, OpenBLAS (the plain loops where it is not installed) and each
 * packed-SGEMM kernel this CPU runs (skipped where it does not). */
static const char *const PRODUCTS[] = {"plain", "openblas", "avx2", "avx512"};
#define NPRODUCTS ((int)(sizeof PRODUCTS / sizeof PRODUCTS[0]))

/* The CPU backend with PRODUCTS on THREADS (0: its own count); 0 when this
 * CPU cannot run that kernel. */
static int open_cpu(const char *products, int threads, ckpt_backend **b)
{
    char err[256];
    int rc = ckpt_backend_cpu_open_with(products, threads, b, err, sizeof err);
    if (rc == CKPT_ERR_UNSUPPORTED)
        return 0;
    ck_assert_msg(rc == 0, "%s: %s", products, err);
    return 1;
}

/* Op case NAME by PRODUCTS on THREADS threads, its loops cut into chunks
 * of GRAIN items (0: the backend's own); its output into OUT, PyTorch's
 * into WANT and a second run's into AGAIN (each when not NULL).  0 when
 * this CPU cannot run that kernel. */
static int case_output(const char *name, const char *products, int threads, int64_t grain,
                       ckpt_array *out, ckpt_array *want, ckpt_array *again)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/ops/%s.json", name);
    char *spec = data_path(rel);
    snprintf(rel, sizeof rel, "tests/data/ops/%s.pth", name);
    char *pth = data_path(rel);
    ckpt_model *m = ckpt_model_new();
    ck_assert_msg(ckpt_model_load(m, spec) == 0, "%s", ckpt_model_error_message(m));
    ckpt_file *f = ckpt_file_new();
    ck_assert_msg(ckpt_file_open(f, pth) == 0, "%s", ckpt_file_error_message(f));
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_value_dict_get(ckpt_file_root(f), "params"), &r),
                     0);
    ck_assert_msg(r.ok, "%s: %s", name, r.message);
    size_t nin = ckpt_model_input_count(m);
    ckpt_array in[8] = {{0}};
    ck_assert(nin <= 8);
    for (size_t i = 0; i < nin; i++) {
        char key[128];
        snprintf(key, sizeof key, "input.%s", ckpt_model_input_name(m, i));
        read_array(f, nin == 1 ? "input" : key, &in[i]);
    }
    if (want) {
        ck_assert(ckpt_model_output_count(m) == 1);
        read_array(f, "output.y", want);
    }
    ckpt_backend *b = NULL;
    int ok = open_cpu(products, threads, &b);
    if (ok) {
        ckpt_backend_cpu_set_grain(b, grain);
        ck_assert_msg(ckpt_model_run(m, b, in, out) == 0, "%s (%s, %d threads): %s", name,
                      products, threads, ckpt_model_error_message(m));
        if (again)
            ck_assert_int_eq(ckpt_model_run(m, b, in, again), 0);
        ckpt_backend_free(b);
    }
    for (size_t i = 0; i < nin; i++)
        ckpt_array_clear(&in[i]);
    ckpt_file_free(f);
    ckpt_model_free(m);
    free(spec);
    free(pth);
    return ok;
}

static void run_case(const char *name, const char *products)
{
    ckpt_array out = {0}, want = {0}, again = {0};
    if (!case_output(name, products, 0, 0, &out, &want, &again)) {
        ckpt_array_clear(&want);
        return;
    }
    ck_assert_int_eq(out.ndim, want.ndim);
    for (int d = 0; d < out.ndim; d++)
        ck_assert_int_eq(out.shape[d], want.shape[d]);

    int64_t n = ckpt_array_numel(&out);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want.data[i]));
    for (int64_t i = 0; i < n; i++) {
        double a = out.data[i], w = want.data[i];
        if (exact_case(name)) {
            ck_assert_msg(memcmp(&out.data[i], &want.data[i], 4) == 0 || (isnan(a) && isnan(w)),
                          "%s [%lld]: %.9g, PyTorch %.9g", name, (long long)i, a, w);
            continue;
        }
        /* float32 sums in another order: within 1e-5 of the output's scale */
        double tol = 1e-5 * scale + 1e-5 * fabs(w);
        ck_assert_msg(fabs(a - w) <= tol, "%s [%lld]: %.9g, PyTorch %.9g (tolerance %.3g)", name,
                      (long long)i, a, w, tol);
        worst = fmax(worst, fabs(a - w) / (scale ? scale : 1));
    }
    /* the same run again gives the same bits */
    ck_assert_int_eq(memcmp(out.data, again.data, (size_t)n * sizeof(float)), 0);

    ckpt_array_clear(&again);
    ckpt_array_clear(&out);
    ckpt_array_clear(&want);
}

START_TEST(test_op_case)
{
    run_case(cases[_i / NPRODUCTS], PRODUCTS[_i % NPRODUCTS]);
}
END_TEST

/* Every op case gives the same bits on 1 thread as on 2 and on 3 with
 * every loop cut into chunks of one item (image, row, channel, value) and
 * every product shared: what each thread computes does not depend on how
 * the work is split. */
START_TEST(test_op_case_threads)
{
    const char *name = cases[_i / NPRODUCTS], *products = PRODUCTS[_i % NPRODUCTS];
    /* Under valgrind the plain loops alone: the other paths' threads run
     * in the sanitizer pass, and all of them here took most of CI's
     * valgrind time */
    if (unit_under_valgrind() && _i % NPRODUCTS != 0)
        return;
    ckpt_array one = {0};
    if (!case_output(name, products, 1, 0, &one, NULL, NULL))
        return;
    for (int threads = 2; threads <= 3; threads++) {
        ckpt_array many = {0};
        ck_assert(case_output(name, products, threads, 1, &many, NULL, NULL));
        ck_assert_int_eq(many.ndim, one.ndim);
        for (int d = 0; d < one.ndim; d++)
            ck_assert_int_eq(many.shape[d], one.shape[d]);
        ck_assert_msg(memcmp(one.data, many.data,
                             (size_t)ckpt_array_numel(&one) * sizeof(float)) == 0,
                      "%s (%s): other bits on %d threads than on 1", name, products, threads);
        ckpt_array_clear(&many);
    }
    ckpt_array_clear(&one);
}
END_TEST

/* ---- spec errors name the node --------------------------------------------- */

static const struct {
    const char *json, *message;
} bad_specs[] = {
    {"[1]", "a model spec must be a JSON object"},
    {"{\"name\": \"x\"", "not valid JSON"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": "
     "[{\"op\": \"flash_attn\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (flash_attn -> \"y\"): unknown op \"flash_attn\""},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": "
     "[{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (linear -> \"y\"): the parameter \"weight\" is required"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": "
     "[{\"op\": \"relu\", \"inputs\": [\"h\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (relu -> \"y\"): input \"h\" is not defined by an input or an earlier node"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": "
     "[{\"op\": \"relu\", \"inputs\": [\"x\"], \"output\": \"x\"}], \"outputs\": [\"x\"]}",
     "the value \"x\" is defined twice"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 1, 8, 8]}], \"nodes\": "
     "[{\"op\": \"conv2d\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"groups\": 2}, "
     "\"params\": {\"weight\": \"c.weight\"}}], \"outputs\": [\"y\"]}",
     "node 0 (conv2d -> \"y\"): groups = 2 is not supported (only 1)"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 1, 8, 8]}], \"nodes\": "
     "[{\"op\": \"max_pool2d\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": "
     "{\"kernel_size\": 2, \"stride\": 0}}], \"outputs\": [\"y\"]}",
     "node 0 (max_pool2d -> \"y\"): \"stride\" must be an integer from 1"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": "
     "[{\"op\": \"softmax\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"axis\": 1}}], "
     "\"outputs\": [\"y\"]}",
     "node 0 (softmax -> \"y\"): unknown attribute \"axis\" for softmax (it takes: dim)"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": "
     "[{\"op\": \"relu\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"z\"]}",
     "output \"z\" is not a value of the graph"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, -1]}], \"nodes\": "
     "[{\"op\": \"relu\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "input \"x\": \"shape\" may mark one batch dimension (-1) only"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": "
     "[{\"op\": \"reshape\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"shape\": "
     "[-1, -1]}}], \"outputs\": [\"y\"]}",
     "node 0 (reshape -> \"y\"): \"shape\" may hold one -1 at most"},
    /* lstm: the module prefix, not the keys; torch's constructor arguments */
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [5, -1, 4]}], \"nodes\": "
     "[{\"op\": \"lstm\", \"inputs\": [\"x\"], \"output\": \"y\", \"params\": "
     "{\"weight\": \"rnn.weight_ih_l0\"}}], \"outputs\": [\"y\"]}",
     "node 0 (lstm -> \"y\"): lstm's \"params\" must be {\"module\": \"NAME\"}"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 5, 4]}], \"nodes\": "
     "[{\"op\": \"lstm\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": "
     "{\"batch_first\": true}, \"params\": {\"module\": \"rnn\"}}], \"outputs\": [\"y\"]}",
     "node 0 (lstm -> \"y\"): batch_first is not supported"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [5, -1, 4]}], \"nodes\": "
     "[{\"op\": \"lstm\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": "
     "{\"num_layers\": 0}, \"params\": {\"module\": \"rnn\"}}], \"outputs\": [\"y\"]}",
     "node 0 (lstm -> \"y\"): \"num_layers\" must be an integer from 1 to 64"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [5, -1, 4]}], \"nodes\": "
     "[{\"op\": \"lstm\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": "
     "{\"proj_size\": 3}, \"params\": {\"module\": \"rnn\"}}], \"outputs\": [\"y\"]}",
     "node 0 (lstm -> \"y\"): proj_size is not supported (only 0)"},
    /* the transformer ops: attributes, inputs and parameters as torch takes them */
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"add\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (add -> \"y\"): add of one input needs the number \"other\" (x + other)"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"mul\", \"inputs\": [\"x\", \"x\"], \"output\": \"y\", \"attrs\": {\"other\": 2}}], \"outputs\": [\"y\"]}",
     "node 0 (mul -> \"y\"): \"other\" is for mul of one input (this one has two)"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"gelu\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"approximate\": \"fast\"}}], \"outputs\": [\"y\"]}",
     "node 0 (gelu -> \"y\"): \"approximate\" must be \"none\" or \"tanh\""},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"pow\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (pow -> \"y\"): the attribute \"exponent\" is required"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"slice\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"dim\": 1, \"step\": 0}}], \"outputs\": [\"y\"]}",
     "node 0 (slice -> \"y\"): \"step\" must be an integer from 1"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"slice\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"end\": 1.5}}], \"outputs\": [\"y\"]}",
     "node 0 (slice -> \"y\"): \"end\" must be an integer or null"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"select\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"dim\": 1}}], \"outputs\": [\"y\"]}",
     "node 0 (select -> \"y\"): the attribute \"index\" is required"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"layer_norm\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (layer_norm -> \"y\"): the attribute \"normalized_shape\" is required"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"rms_norm\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"normalized_shape\": [4], \"eps\": -1}}], \"outputs\": [\"y\"]}",
     "node 0 (rms_norm -> \"y\"): \"eps\" must be a number in [0, 1]"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"embedding\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (embedding -> \"y\"): the parameter \"weight\" is required"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"addmm\", \"inputs\": [\"x\"], \"output\": \"y\", \"params\": {\"weight\": \"c.weight\"}}], \"outputs\": [\"y\"]}",
     "node 0 (addmm -> \"y\"): the parameter \"bias\" is required"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"parameter\", \"inputs\": [], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (parameter -> \"y\"): the parameter \"weight\" is required"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"scaled_dot_product_attention\", \"inputs\": [\"x\", \"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "node 0 (scaled_dot_product_attention -> \"y\"): scaled_dot_product_attention takes 3 to 4 inputs, not 2"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"scaled_dot_product_attention\", \"inputs\": [\"x\", \"x\", \"x\", \"x\"], \"output\": \"y\", \"attrs\": {\"is_causal\": true}}], \"outputs\": [\"y\"]}",
     "node 0 (scaled_dot_product_attention -> \"y\"): is_causal with a mask"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"scaled_dot_product_attention\", \"inputs\": [\"x\", \"x\", \"x\"], \"output\": \"y\", \"attrs\": {\"enable_gqa\": 1}}], \"outputs\": [\"y\"]}",
     "\"enable_gqa\" must be true or false"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"constant\", \"inputs\": [\"x\"], \"output\": \"y\", \"attrs\": {\"shape\": [2, 2], \"values\": [1, 2, 3]}}], \"outputs\": [\"y\"]}",
     "node 0 (constant -> \"y\"): constant takes no input"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"constant\", \"inputs\": [], \"output\": \"y\", \"attrs\": {\"shape\": [2, 2], \"values\": [1, 2, 3]}}], \"outputs\": [\"y\"]}",
     "node 0 (constant -> \"y\"): \"values\" holds 3 numbers for a shape of 4 elements"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"constant\", \"inputs\": [], \"output\": \"y\", \"attrs\": {\"shape\": [2], \"values\": [1, \"-Infinity\"]}}], \"outputs\": [\"y\"]}",
     "node 0 (constant -> \"y\"): \"values\" must hold numbers (or \"inf\", \"-inf\", \"nan\"); entry 1 is not one"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"constant\", \"inputs\": [], \"output\": \"y\", \"attrs\": {\"shape\": [65536, 65536], \"values\": []}}], \"outputs\": [\"y\"]}",
     "node 0 (constant -> \"y\"): \"shape\" has more elements than a spec can hold"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"constant\", \"inputs\": [], \"output\": \"y\", \"attrs\": {\"shape\": [-1], \"values\": []}}], \"outputs\": [\"y\"]}",
     "node 0 (constant -> \"y\"): \"shape\" must be an integer from 0"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"constant\", \"inputs\": [], \"output\": \"y\", \"attrs\": {\"values\": []}}], \"outputs\": [\"y\"]}",
     "node 0 (constant -> \"y\"): \"shape\" must be a list of 0 to 8 sizes"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4], \"dtype\": \"float16\"}], \"nodes\": [{\"op\": \"relu\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "input \"x\": \"dtype\" must be \"float32\", \"int64\" or \"int32\""},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4], \"high\": 9}], \"nodes\": [{\"op\": \"relu\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "input \"x\": \"high\" is for an integer input (\"dtype\": \"int64\")"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4], \"dtype\": \"int64\", \"high\": 16777217}], \"nodes\": [{\"op\": \"relu\", \"inputs\": [\"x\"], \"output\": \"y\"}], \"outputs\": [\"y\"]}",
     "input \"x\": \"high\" must be an integer from 1 to 16777216"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"h\", \"params\": {\"weight\": \"a.weight\"}}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\", \"params\": {\"weight\": \"b.weight\"}}], \"outputs\": [\"y\"], \"tied\": [\"b.weight\"]}",
     "\"tied\" must be an object of key: the key it is tied to"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"h\", \"params\": {\"weight\": \"a.weight\"}}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\", \"params\": {\"weight\": \"b.weight\"}}], \"outputs\": [\"y\"], \"tied\": {\"b.weight\": \"c.weight\"}}",
     "\"tied\": \"b.weight\" is tied to \"c.weight\", not a parameter of the graph"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"h\", \"params\": {\"weight\": \"a.weight\"}}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\", \"params\": {\"weight\": \"b.weight\"}}], \"outputs\": [\"y\"], \"tied\": {\"c.weight\": \"a.weight\"}}",
     "\"tied\": \"c.weight\" is not a parameter of the graph"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"h\", \"params\": {\"weight\": \"a.weight\"}}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\", \"params\": {\"weight\": \"b.weight\"}}], \"outputs\": [\"y\"], \"tied\": {\"b.weight\": \"b.weight\"}}",
     "\"tied\": \"b.weight\" is tied to itself"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"h\", \"params\": {\"weight\": \"a.weight\"}}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\", \"params\": {\"weight\": \"b.weight\"}}], \"outputs\": [\"y\"], \"tied\": {\"b.weight\": \"a.weight\", \"a.weight\": \"b.weight\"}}",
     "\"tied\": \"a.weight\" and \"b.weight\" are tied to each other (a cycle)"},
    {"{\"name\": \"m\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 4]}], \"nodes\": [{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"h\", \"params\": {\"weight\": \"a.weight\"}}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\", \"params\": {\"weight\": \"b.weight\"}}], \"outputs\": [\"y\"], \"tied\": {\"b.weight\": 3}}",
     "\"tied\": \"b.weight\" must name a key (a string)"},
};

START_TEST(test_spec_errors)
{
    ckpt_model *m = ckpt_model_new();
    const char *json = bad_specs[_i].json;
    int rc = ckpt_model_parse(m, json, strlen(json), "bad.json");
    ck_assert_int_eq(rc, CKPT_ERR_FORMAT);
    const char *msg = ckpt_model_error_message(m);
    ck_assert_msg(strncmp(msg, "bad.json: ", 10) == 0, "%s", msg);
    ck_assert_msg(strstr(msg, bad_specs[_i].message), "got: %s", msg);
    ck_assert_int_eq(ckpt_model_param_count(m), 0); /* nothing half-parsed is kept */
    ckpt_model_free(m);
}
END_TEST

/* ---- strict load ------------------------------------------------------------- */

static ckpt_model *load_spec(const char *rel)
{
    char *p = data_path(rel);
    ckpt_model *m = ckpt_model_new();
    ck_assert_msg(ckpt_model_load(m, p) == 0, "%s", ckpt_model_error_message(m));
    free(p);
    return m;
}

static ckpt_file *open_data(const char *rel)
{
    char *p = data_path(rel);
    ckpt_file *f = ckpt_file_new();
    ck_assert_msg(ckpt_file_open(f, p) == 0, "%s", ckpt_file_error_message(f));
    free(p);
    return f;
}

START_TEST(test_bind_dataparallel_keys)
{
    ckpt_model *m = load_spec("models/mnist_mlp.json");
    ckpt_file *f = open_data("tests/data/dp_mlp.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    ck_assert(!r.ok);
    ck_assert_uint_eq(r.missing_count, 4);
    ck_assert_uint_eq(r.unexpected_count, 4);
    ck_assert_str_eq(r.missing[0], "n.1.weight");
    ck_assert_str_eq(r.unexpected[3], "module.n.3.bias");
    ck_assert_str_eq(r.message,
                     "Error(s) in loading state_dict for MLP:\n\tMissing key(s) in state_dict: "
                     "\"n.1.weight\", \"n.1.bias\", \"n.3.weight\", \"n.3.bias\". \n\tUnexpected "
                     "key(s) in state_dict: \"module.n.1.weight\", \"module.n.1.bias\", "
                     "\"module.n.3.weight\", \"module.n.3.bias\". ");
    /* nothing bound: running is refused */
    ckpt_backend *b;
    char err[128];
    ck_assert_int_eq(ckpt_backend_open("cpu", &b, err, sizeof err), 0);
    ckpt_array in = {.ndim = 4, .shape = {1, 1, 28, 28}}, out = {0};
    in.data = calloc(784, sizeof(float));
    ck_assert_int_eq(ckpt_model_run(m, b, &in, &out), CKPT_ERR_USAGE);
    ckpt_array_clear(&in);
    ckpt_backend_free(b);
    ckpt_file_free(f);
    ckpt_model_free(m);
}
END_TEST

/* A tied key the file lacks takes the tensor of the key it is tied to (as
 * from_pretrained ties GPT-2's lm_head.weight back to the embedding): the
 * strict load passes, says so per key, and the value is that tensor's. */
START_TEST(test_bind_tied_key_missing)
{
    const char *json =
        "{\"name\": \"tied\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 784]}],"
        " \"nodes\": [{\"op\": \"linear\", \"inputs\": [\"x\"], \"output\": \"h\","
        " \"params\": {\"weight\": \"n.1.weight\", \"bias\": \"n.1.bias\"}},"
        " {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\","
        " \"params\": {\"weight\": \"n.3.weight\", \"bias\": \"n.3.bias\"}},"
        " {\"op\": \"parameter\", \"inputs\": [], \"output\": \"w\","
        " \"params\": {\"weight\": \"copy.weight\"}}],"
        " \"outputs\": [\"y\", \"w\"], \"tied\": {\"copy.weight\": \"n.3.weight\"}}";
    ckpt_model *m = ckpt_model_new();
    ck_assert_msg(ckpt_model_parse(m, json, strlen(json), "tied.json") == 0, "%s",
                  ckpt_model_error_message(m));
    ck_assert_uint_eq(ckpt_model_param_count(m), 5);
    ck_assert_str_eq(ckpt_model_param_key(m, 4), "copy.weight");
    ck_assert_str_eq(ckpt_model_param_tie(m, 4), "n.3.weight");
    ck_assert_ptr_null(ckpt_model_param_tie(m, 2));
    ckpt_file *f = open_data("tests/data/mlp.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    ck_assert_msg(r.ok, "%s", r.message);
    ck_assert_int_eq(ckpt_model_param_tied_in(m, 4), 1);
    ck_assert_int_eq(ckpt_model_param_tied_in(m, 2), 0);
    /* the output w is n.3.weight's tensor */
    ckpt_backend *b;
    char err[128];
    ck_assert_int_eq(ckpt_backend_open("cpu", &b, err, sizeof err), 0);
    ckpt_array in = {.ndim = 2, .shape = {1, 784}}, out[2] = {{0}}, w = {0};
    in.data = calloc(784, sizeof(float));
    ck_assert_int_eq(ckpt_model_run(m, b, &in, out), 0);
    read_array(f, "n.3.weight", &w);
    ck_assert_int_eq(out[1].ndim, 2);
    ck_assert_int_eq(ckpt_array_numel(&out[1]), ckpt_array_numel(&w));
    ck_assert_int_eq(memcmp(out[1].data, w.data, (size_t)ckpt_array_numel(&w) * 4), 0);
    for (int k = 0; k < 2; k++)
        ckpt_array_clear(&out[k]);
    ckpt_array_clear(&w);
    ckpt_array_clear(&in);
    ckpt_backend_free(b);
    ckpt_file_free(f);
    ckpt_model_free(m);
}
END_TEST

START_TEST(test_bind_size_mismatch)
{
    /* a graph that feeds the flattened image straight to n.3: n.3.weight is
     * [10, 128] in the file but the graph implies [10, 784] */
    const char *json =
        "{\"name\": \"short\", \"class\": \"Short\", \"inputs\": [{\"name\": \"x\", \"shape\": "
        "[-1, 1, 28, 28]}], \"nodes\": [{\"op\": \"flatten\", \"inputs\": [\"x\"], \"output\": "
        "\"h\"}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"y\", \"params\": "
        "{\"weight\": \"n.3.weight\", \"bias\": \"n.3.bias\"}}], \"outputs\": [\"y\"]}";
    ckpt_model *m = ckpt_model_new();
    ck_assert_int_eq(ckpt_model_parse(m, json, strlen(json), "short.json"), 0);
    ckpt_file *f = open_data("tests/data/mlp.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    ck_assert(!r.ok);
    ck_assert_uint_eq(r.missing_count, 0);
    ck_assert_uint_eq(r.unexpected_count, 2);
    ck_assert_uint_eq(r.mismatch_count, 1);
    ck_assert_str_eq(r.mismatches[0].key, "n.3.weight");
    ck_assert_int_eq(r.mismatches[0].model_shape[1], 784);
    ck_assert_str_eq(r.message,
                     "Error(s) in loading state_dict for Short:\n\tUnexpected key(s) in "
                     "state_dict: \"n.1.weight\", \"n.1.bias\". \n\tsize mismatch for "
                     "n.3.weight: copying a param with shape torch.Size([10, 128]) from "
                     "checkpoint, the shape in current model is torch.Size([10, 784]).");
    ckpt_file_free(f);
    ckpt_model_free(m);
}
END_TEST

START_TEST(test_bind_missing_weight_says_nothing_downstream)
{
    /* the spec names a weight the file lacks: the bias of that node and the
     * layers after it cannot be judged, so only the keys are reported */
    const char *json =
        "{\"name\": \"m\", \"class\": \"MLP\", \"inputs\": [{\"name\": \"x\", \"shape\": "
        "[-1, 1, 28, 28]}], \"nodes\": [{\"op\": \"flatten\", \"inputs\": [\"x\"], \"output\": "
        "\"h\"}, {\"op\": \"linear\", \"inputs\": [\"h\"], \"output\": \"h1\", \"params\": "
        "{\"weight\": \"n.1.w\", \"bias\": \"n.1.bias\"}}, {\"op\": \"linear\", \"inputs\": "
        "[\"h1\"], \"output\": \"y\", \"params\": {\"weight\": \"n.3.weight\", \"bias\": "
        "\"n.3.bias\"}}], \"outputs\": [\"y\"]}";
    ckpt_model *m = ckpt_model_new();
    ck_assert_int_eq(ckpt_model_parse(m, json, strlen(json), "m.json"), 0);
    ckpt_file *f = open_data("tests/data/mlp.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    ck_assert(!r.ok);
    ck_assert_uint_eq(r.mismatch_count, 0);
    ck_assert_str_eq(r.message, "Error(s) in loading state_dict for MLP:\n\tMissing key(s) in "
                                "state_dict: \"n.1.w\". \n\tUnexpected key(s) in state_dict: "
                                "\"n.1.weight\". ");
    ckpt_file_free(f);
    ckpt_model_free(m);
}
END_TEST

START_TEST(test_run_checks_input_shape)
{
    ckpt_model *m = load_spec("models/mnist_mlp.json");
    ckpt_file *f = open_data("tests/data/mlp.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    ck_assert(r.ok);
    ckpt_backend *b;
    char err[128];
    ck_assert_int_eq(ckpt_backend_open("cpu", &b, err, sizeof err), 0);
    ckpt_array in = {.ndim = 4, .shape = {2, 1, 28, 27}}, out = {0};
    in.data = calloc(2 * 28 * 27, sizeof(float));
    ck_assert_int_eq(ckpt_model_run(m, b, &in, &out), CKPT_ERR_USAGE);
    ck_assert_str_eq(ckpt_model_error_message(m),
                     "input \"x\" has shape [2, 1, 28, 27]; the model takes [-1, 1, 28, 28] "
                     "(-1: any batch size)");
    ck_assert_ptr_null(out.data);
    /* any batch size runs */
    in.shape[3] = 28;
    in.shape[0] = 1;
    ck_assert_int_eq(ckpt_model_run(m, b, &in, &out), 0);
    ck_assert_int_eq(out.ndim, 2);
    ck_assert_int_eq(out.shape[0], 1);
    ck_assert_int_eq(out.shape[1], 10);
    ckpt_array_clear(&out);
    ckpt_array_clear(&in);
    ckpt_backend_free(b);
    ckpt_file_free(f);
    ckpt_model_free(m);
}
END_TEST

/* ---- the transformer ops: shapes that do not fit, ids out of range ---------- */

/* JSON, bound to op case CASE_PTH's parameters, run on the CPU over IN: the
 * status (the model, with its message, in *MP).  A shape that does not fit
 * is found by the strict load already: 1, its message in LOAD_MSG. */
static int run_json(const char *json, const char *case_pth, ckpt_array *in, ckpt_model **mp,
                    char *load_msg, size_t cap)
{
    ckpt_model *m = ckpt_model_new();
    ck_assert_msg(ckpt_model_parse(m, json, strlen(json), "m.json") == 0, "%s",
                  ckpt_model_error_message(m));
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/ops/%s.pth", case_pth);
    ckpt_file *f = open_data(rel);
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_value_dict_get(ckpt_file_root(f), "params"), &r),
                     0);
    *mp = m;
    if (!r.ok) {
        snprintf(load_msg, cap, "%s", r.message);
        ckpt_file_free(f);
        return 1;
    }
    ckpt_backend *b;
    char err[128];
    ck_assert_int_eq(ckpt_backend_open("cpu", &b, err, sizeof err), 0);
    ckpt_array out[1] = {{0}};
    int rc = ckpt_model_run(m, b, in, out);
    ckpt_array_clear(&out[0]);
    ckpt_backend_free(b);
    ckpt_file_free(f);
    return rc;
}

static const struct {
    const char *nodes;       /* the nodes of a spec over inputs a, b, c, d */
    int64_t shapes[4][5];    /* their shapes: ndim, then the sizes */
    const char *message;
} bad_shapes[] = {
    {"{\"op\": \"add\", \"inputs\": [\"a\", \"b\"], \"output\": \"y\"}",
     {{2, 2, 3}, {1, 4}, {1, 1}, {1, 1}},
     "node 0 (add -> \"y\"): cannot broadcast [2, 3] and [4] together"},
    {"{\"op\": \"mul\", \"inputs\": [\"a\", \"b\"], \"output\": \"y\"}",
     {{3, 2, 3, 4}, {2, 2, 4}, {1, 1}, {1, 1}},
     "node 0 (mul -> \"y\"): cannot broadcast [2, 3, 4] and [2, 4] together"},
    {"{\"op\": \"matmul\", \"inputs\": [\"a\", \"b\"], \"output\": \"y\"}",
     {{2, 2, 3}, {2, 4, 5}, {1, 1}, {1, 1}},
     "node 0 (matmul -> \"y\"): cannot multiply [2, 3] by [4, 5]"},
    {"{\"op\": \"matmul\", \"inputs\": [\"a\", \"b\"], \"output\": \"y\"}",
     {{3, 2, 2, 3}, {3, 3, 3, 5}, {1, 1}, {1, 1}},
     "node 0 (matmul -> \"y\"): cannot multiply [2, 2, 3] by [3, 3, 5]"},
    {"{\"op\": \"matmul\", \"inputs\": [\"a\", \"b\"], \"output\": \"y\"}",
     {{1, 3}, {2, 3, 5}, {1, 1}, {1, 1}},
     "node 0 (matmul -> \"y\"): expects inputs of 2 or more dimensions"},
    {"{\"op\": \"bmm\", \"inputs\": [\"a\", \"b\"], \"output\": \"y\"}",
     {{4, 1, 2, 2, 3}, {4, 1, 2, 3, 5}, {1, 1}, {1, 1}},
     "node 0 (bmm -> \"y\"): expects two 3-D inputs [b, m, k] and [b, k, n]"},
    {"{\"op\": \"scaled_dot_product_attention\", \"inputs\": [\"a\", \"b\", \"c\"], "
     "\"output\": \"y\"}",
     {{4, 1, 4, 3, 8}, {4, 1, 2, 3, 8}, {4, 1, 2, 3, 8}, {1, 1}},
     "node 0 (scaled_dot_product_attention -> \"y\"): k and v have 2 heads, q 4 (grouped-query "
     "attention needs \"enable_gqa\": true)"},
    {"{\"op\": \"scaled_dot_product_attention\", \"inputs\": [\"a\", \"b\", \"c\"], "
     "\"output\": \"y\", \"attrs\": {\"enable_gqa\": true}}",
     {{4, 1, 3, 3, 8}, {4, 1, 2, 3, 8}, {4, 1, 2, 3, 8}, {1, 1}},
     "node 0 (scaled_dot_product_attention -> \"y\"): q's 3 heads are not a multiple of k's "
     "and v's 2"},
    {"{\"op\": \"scaled_dot_product_attention\", \"inputs\": [\"a\", \"b\", \"c\", \"d\"], "
     "\"output\": \"y\"}",
     {{4, 1, 2, 3, 8}, {4, 1, 2, 5, 8}, {4, 1, 2, 5, 8}, {2, 3, 3}},
     "node 0 (scaled_dot_product_attention -> \"y\"): the mask [3, 3] does not broadcast to "
     "[1, 2, 3, 5]"},
    {"{\"op\": \"scaled_dot_product_attention\", \"inputs\": [\"a\", \"b\", \"c\"], "
     "\"output\": \"y\"}",
     {{4, 1, 2, 3, 8}, {4, 1, 2, 5, 4}, {4, 1, 2, 5, 8}, {1, 1}},
     "node 0 (scaled_dot_product_attention -> \"y\"): q [1, 2, 3, 8], k [1, 2, 5, 4] and v "
     "[1, 2, 5, 8] do not fit together"},
    {"{\"op\": \"select\", \"inputs\": [\"a\"], \"output\": \"y\", \"attrs\": {\"dim\": 1, "
     "\"index\": -4}}",
     {{2, 2, 3}, {1, 1}, {1, 1}, {1, 1}},
     "node 0 (select -> \"y\"): index -4 is out of range for dim 1 of [2, 3]"},
    {"{\"op\": \"expand\", \"inputs\": [\"a\"], \"output\": \"y\", \"attrs\": {\"size\": [4, "
     "3]}}",
     {{2, 2, 3}, {1, 1}, {1, 1}, {1, 1}},
     "node 0 (expand -> \"y\"): cannot expand [2, 3]: dimension 0 is 2, not 1 or 4"},
    {"{\"op\": \"expand\", \"inputs\": [\"a\"], \"output\": \"y\", \"attrs\": {\"size\": [-1, "
     "2, 3]}}",
     {{2, 2, 3}, {1, 1}, {1, 1}, {1, 1}},
     "node 0 (expand -> \"y\"): \"size\" entry 0 is -1 for a new dimension"},
    {"{\"op\": \"transpose\", \"inputs\": [\"a\"], \"output\": \"y\", \"attrs\": {\"dim0\": 0, "
     "\"dim1\": 2}}",
     {{2, 2, 3}, {1, 1}, {1, 1}, {1, 1}},
     "node 0 (transpose -> \"y\"): dims 0, 2 are out of range for [2, 3]"},
    {"{\"op\": \"mean\", \"inputs\": [\"a\"], \"output\": \"y\", \"attrs\": {\"dim\": [1, -1]}}",
     {{2, 2, 3}, {1, 1}, {1, 1}, {1, 1}},
     "node 0 (mean -> \"y\"): \"dim\" does not name distinct dimensions of [2, 3]"},
    {"{\"op\": \"layer_norm\", \"inputs\": [\"a\"], \"output\": \"y\", \"attrs\": "
     "{\"normalized_shape\": [2, 3]}}",
     {{2, 3, 2}, {1, 1}, {1, 1}, {1, 1}},
     "node 0 (layer_norm -> \"y\"): the input [3, 2] does not end in normalized_shape [2, 3]"},
};

START_TEST(test_shape_errors)
{
    char json[1024];
    static const char *const names[] = {"a", "b", "c", "d"};
    int nin = strstr(bad_shapes[_i].nodes, "\"d\"") ? 4 : strstr(bad_shapes[_i].nodes, "\"c\"") ? 3
              : strstr(bad_shapes[_i].nodes, "\"b\"") ? 2 : 1;
    ckpt_array in[4] = {{0}};
    size_t at = (size_t)snprintf(json, sizeof json, "{\"name\": \"m\", \"inputs\": [");
    for (int i = 0; i < nin; i++) {
        const int64_t *sh = bad_shapes[_i].shapes[i];
        in[i].ndim = (int)sh[0];
        at += (size_t)snprintf(json + at, sizeof json - at, "%s{\"name\": \"%s\", \"shape\": [",
                               i ? ", " : "", names[i]);
        for (int d = 0; d < in[i].ndim; d++) {
            in[i].shape[d] = sh[1 + d];
            at += (size_t)snprintf(json + at, sizeof json - at, "%s%lld", d ? ", " : "",
                                   (long long)sh[1 + d]);
        }
        at += (size_t)snprintf(json + at, sizeof json - at, "]}");
        in[i].data = calloc((size_t)ckpt_array_numel(&in[i]), sizeof(float));
    }
    snprintf(json + at, sizeof json - at, "], \"nodes\": [%s], \"outputs\": [\"y\"]}",
             bad_shapes[_i].nodes);
    /* the strict load finds it (the run's shape pass, in the same words) */
    ckpt_model *m;
    char msg[1024];
    ck_assert_int_eq(run_json(json, "alias", in, &m, msg, sizeof msg), 1);
    ck_assert_msg(strstr(msg, bad_shapes[_i].message), "%s", msg);
    ckpt_model_free(m);
    for (int i = 0; i < nin; i++)
        ckpt_array_clear(&in[i]);
}
END_TEST

/* An id the embedding does not have, or one that is no integer, is an error
 * naming it (never a read out of the table). */
START_TEST(test_embedding_id_out_of_range)
{
    const char *json = "{\"name\": \"m\", \"inputs\": [{\"name\": \"ids\", \"shape\": [3], "
                       "\"dtype\": \"int64\"}], \"nodes\": [{\"op\": \"embedding\", \"inputs\": "
                       "[\"ids\"], \"output\": \"y\", \"params\": {\"weight\": \"p.weight\"}}], "
                       "\"outputs\": [\"y\"]}";
    static const float bad[] = {10, -1, 2.5f};
    for (int k = 0; k < 3; k++) {
        float ids[3] = {0, 9, 3};
        ids[k] = bad[k];
        ckpt_array in = {.ndim = 1, .shape = {3}, .data = ids};
        ckpt_model *m;
        char msg[64];
        ck_assert_int_eq(run_json(json, "embedding_1d_pad", &in, &m, msg, sizeof msg),
                         CKPT_ERR_USAGE);
        char want[128];
        snprintf(want, sizeof want, "token id %g is out of range for an embedding of 10 rows",
                 (double)bad[k]);
        ck_assert_msg(strstr(ckpt_model_error_message(m), want), "%s",
                      ckpt_model_error_message(m));
        ck_assert_msg(strstr(ckpt_model_error_message(m), "node 0 (embedding -> \"y\")"), "%s",
                      ckpt_model_error_message(m));
        /* what a caller making its own ids asks: below the bound table's rows */
        ck_assert_int_eq(ckpt_model_input_id_limit(m, 0), 10);
        ck_assert_int_eq(ckpt_model_input_id_limit(m, 1), -1);
        ckpt_model_free(m);
    }
}
END_TEST

/* A backend without an op (a CUDA module built before it) says which. */
START_TEST(test_op_not_available)
{
    char *p = data_path("tests/data/ops/gelu_tanh.json");
    ckpt_model *m = ckpt_model_new();
    ck_assert_int_eq(ckpt_model_load(m, p), 0);
    ckpt_file *f = open_data("tests/data/ops/gelu_tanh.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_value_dict_get(ckpt_file_root(f), "params"), &r),
                     0);
    ckpt_array in = {0}, out = {0};
    read_array(f, "input", &in);
    ckpt_backend *b;
    char err[128];
    ck_assert_int_eq(ckpt_backend_open("cpu", &b, err, sizeof err), 0);
    const ckpt_backend_ops *real = b->ops;
    ckpt_backend_ops without = *real;
    without.unary = NULL;
    b->ops = &without;
    ck_assert_int_eq(ckpt_model_run(m, b, &in, &out), CKPT_ERR_UNSUPPORTED);
    ck_assert_str_eq(ckpt_model_error_message(m),
                     "cpu: node 0 (gelu -> \"y\"): op gelu is not available on cpu");
    ck_assert_ptr_null(out.data);
    b->ops = real;
    ck_assert_int_eq(ckpt_model_run(m, b, &in, &out), 0);
    ckpt_array_clear(&out);
    ckpt_array_clear(&in);
    ckpt_backend_free(b);
    ckpt_file_free(f);
    ckpt_model_free(m);
    free(p);
}
END_TEST

/* ---- what the CPU backend does for speed changes no bit ---------------------- */

/* Run M (bound) on B over IN; the outputs into OUT[0..n). */
static void run_model(ckpt_model *m, ckpt_backend *b, const ckpt_array *in, ckpt_array *out)
{
    ck_assert_msg(ckpt_model_run(m, b, in, out) == 0, "%s", ckpt_model_error_message(m));
}

static void assert_same_bits(const ckpt_array *a, const ckpt_array *b, const char *what)
{
    ck_assert_int_eq(ckpt_array_numel(a), ckpt_array_numel(b));
    ck_assert_msg(memcmp(a->data, b->data, (size_t)ckpt_array_numel(a) * sizeof(float)) == 0,
                  "%s: the outputs differ", what);
}

/* Spec SPEC (a path in the tree) into JSON (CAP bytes; its length the
 * return), and into UNFUSED the same spec with ALSO (JSON strings) put first
 * in its outputs: values an op would fuse away, so that nothing is fused. */
static size_t spec_unfused(const char *spec, const char *also, char *json, size_t cap,
                           char *unfused, size_t ucap)
{
    char *path = data_path(spec);
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    size_t len = fread(json, 1, cap - 1, fp);
    fclose(fp);
    free(path);
    json[len] = '\0';
    char *at = strstr(json, "\"outputs\": [");
    ck_assert_ptr_nonnull(at);
    at += strlen("\"outputs\": [");
    ck_assert_int_lt(snprintf(unfused, ucap, "%.*s%s, %s", (int)(at - json), json, also, at),
                     (int)ucap);
    return len;
}

/* A conv whose batch norm, residual add and ReLU are computed in one pass
 * gives the bits of the ops run one by one: the same block with the
 * intermediate values also output (so that nothing is fused) agrees. */
START_TEST(test_fused_conv_same_bits)
{
    char json[8192], unfused[8400];
    size_t len = spec_unfused("tests/data/ops/chain_basic_block.json", "\"b2\", \"r1\"", json,
                              sizeof json, unfused, sizeof unfused);

    ckpt_file *f = open_data("tests/data/ops/chain_basic_block.pth");
    const ckpt_value *params = ckpt_value_dict_get(ckpt_file_root(f), "params");
    ckpt_array in = {0}, want = {0};
    read_array(f, "input", &in);
    read_array(f, "output.y", &want);
    for (int pi = 0; pi < NPRODUCTS; pi++) {
        ckpt_backend *b;
        if (!open_cpu(PRODUCTS[pi], 0, &b))
            continue;
        ckpt_model *m1 = ckpt_model_new(), *m2 = ckpt_model_new();
        ck_assert_int_eq(ckpt_model_parse(m1, json, len, "fused.json"), 0);
        ck_assert_int_eq(ckpt_model_parse(m2, unfused, strlen(unfused), "unfused.json"), 0);
        ckpt_load_report r;
        ck_assert_int_eq(ckpt_model_bind(m1, f, params, &r), 0);
        ck_assert(r.ok);
        ck_assert_int_eq(ckpt_model_bind(m2, f, params, &r), 0);
        ck_assert(r.ok);
        ckpt_array y1[1] = {{0}}, y2[3] = {{0}};
        run_model(m1, b, &in, y1);
        run_model(m2, b, &in, y2);
        assert_same_bits(&y1[0], &y2[2], PRODUCTS[pi]);
        ck_assert_int_eq(y2[0].shape[1], 4); /* b2: the add's other operand, kept */
        for (int64_t i = 0; i < ckpt_array_numel(&want); i++)
            ck_assert(fabs(y1[0].data[i] - want.data[i]) <= 1e-5 * (1 + fabs(want.data[i])));
        ckpt_array_clear(&y1[0]);
        for (int k = 0; k < 3; k++)
            ckpt_array_clear(&y2[k]);
        ckpt_backend_free(b);
        ckpt_model_free(m1);
        ckpt_model_free(m2);
    }
    ckpt_array_clear(&in);
    ckpt_array_clear(&want);
    ckpt_file_free(f);
}
END_TEST

/* A model keeps the plan of its last run for the next one of the same input
 * shapes: a run of another batch size, a bad shape between two good runs,
 * another backend, and a new binding each give what a fresh model gives. */
START_TEST(test_plan_follows_inputs)
{
    ckpt_model *m = load_spec("models/mnist_mlp.json");
    ckpt_file *f = open_data("tests/data/fmnist_mlp.pth");
    ckpt_file *ref = open_data("tests/data/fmnist_mlp.ref.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    ck_assert(r.ok);
    ckpt_array in = {0}, want[1] = {{0}}, y[1] = {{0}};
    read_array(ref, "input", &in);
    int64_t batch = in.shape[0];
    ck_assert_int_ge(batch, 4);
    ckpt_backend *b, *plain;
    ck_assert(open_cpu("auto", 2, &b));
    ck_assert(open_cpu("plain", 1, &plain));
    run_model(m, b, &in, want);
    /* the same backend without the fused linear and the in-place input: a
     * plan kept from the last run would call an operation it lacks */
    const ckpt_backend_ops *real = b->ops;
    ckpt_backend_ops unfused = *real;
    ck_assert_ptr_nonnull(real->linear_relu);
    unfused.linear_relu = NULL;
    unfused.borrow = NULL;
    /* 0: the whole batch; -1: a bad shape; on the plain loops at k 3, with
     * the other operations at k 5 */
    static const int64_t batches[] = {3, -1, 0, 1, 0, 0, 0};
    for (size_t k = 0; k < sizeof batches / sizeof batches[0]; k++) {
        ckpt_array part = in;
        part.shape[0] = batches[k] > 0 ? batches[k] : batch;
        if (batches[k] < 0) {
            part.shape[3] = 27;
            ck_assert_int_eq(ckpt_model_run(m, b, &part, y), CKPT_ERR_USAGE);
            continue;
        }
        b->ops = k == 5 ? &unfused : real;
        run_model(m, k == 3 ? plain : b, &part, y);
        ck_assert_int_eq(y[0].shape[0], part.shape[0]);
        /* the rows of the whole batch's logits (the plain loops: close) */
        for (int64_t i = 0; i < ckpt_array_numel(&y[0]); i++)
            ck_assert(fabs(y[0].data[i] - want[0].data[i]) <= 1e-5 * (1 + fabs(want[0].data[i])));
        if (batches[k] == 0)
            assert_same_bits(&y[0], &want[0], k == 5 ? "unfused" : "again");
        ckpt_array_clear(&y[0]);
    }
    /* bound again (the same weights): the plan is made anew */
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    run_model(m, b, &in, y);
    assert_same_bits(&y[0], &want[0], "bound again");
    ckpt_array_clear(&y[0]);
    ckpt_array_clear(&want[0]);
    ckpt_array_clear(&in);
    ckpt_backend_free(b);
    ckpt_backend_free(plain);
    ckpt_file_free(ref);
    ckpt_file_free(f);
    ckpt_model_free(m);
}
END_TEST

/* SPEC's model bound to CKPT, run on REF's input, and the same model with
 * ALSO added to its outputs (the values an op would fuse away, so that
 * nothing is fused): the same bits in every output of the first, on every
 * products path, on 1 thread and on 3 in one-item chunks.  NEG names an
 * added output that must have negative values (the relu had work). */
static void fused_same_bits(const char *spec, const char *ckpt, const char *ref_path,
                            const char *also, int neg)
{
    char json[8192], unfused[8400];
    size_t len = spec_unfused(spec, also, json, sizeof json, unfused, sizeof unfused);
    ckpt_file *f = open_data(ckpt);
    ckpt_file *ref = open_data(ref_path);
    ckpt_array in = {0};
    read_array(ref, "input", &in);
    for (int pi = 0; pi < NPRODUCTS; pi++)
        for (int threads = 1; threads <= 3; threads += 2) {
            ckpt_backend *b;
            /* under valgrind, 3 threads on the plain loops alone (as
             * test_op_case_threads): one-item chunks of every loop of the
             * autoencoder on each path took a third of check_runtime's
             * time there (152 of 467 s) */
            if (unit_under_valgrind() && threads > 1 && pi != 0)
                continue;
            if (!open_cpu(PRODUCTS[pi], threads, &b))
                continue;
            ckpt_backend_cpu_set_grain(b, threads > 1 ? 1 : 0);
            ckpt_model *m1 = ckpt_model_new(), *m2 = ckpt_model_new();
            ck_assert_int_eq(ckpt_model_parse(m1, json, len, "fused.json"), 0);
            ck_assert_msg(ckpt_model_parse(m2, unfused, strlen(unfused), "unfused.json") == 0,
                          "%s", ckpt_model_error_message(m2));
            ckpt_load_report r;
            ck_assert_int_eq(ckpt_model_bind(m1, f, ckpt_file_root(f), &r), 0);
            ck_assert_msg(r.ok, "%s", r.message);
            ck_assert_int_eq(ckpt_model_bind(m2, f, ckpt_file_root(f), &r), 0);
            ck_assert_msg(r.ok, "%s", r.message);
            size_t n1 = ckpt_model_output_count(m1), n2 = ckpt_model_output_count(m2);
            ck_assert(n1 <= 4 && n2 <= 8 && n2 > n1);
            ckpt_array y1[4] = {{0}}, y2[8] = {{0}};
            run_model(m1, b, &in, y1);
            run_model(m2, b, &in, y2);
            /* the added outputs come first in the second model */
            for (size_t k = 0; k < n1; k++)
                assert_same_bits(&y1[k], &y2[n2 - n1 + k], PRODUCTS[pi]);
            int negative = 0;
            for (int64_t i = 0; i < ckpt_array_numel(&y2[neg]); i++)
                negative += y2[neg].data[i] < 0;
            ck_assert_int_gt(negative, 0);
            for (size_t k = 0; k < n1; k++)
                ckpt_array_clear(&y1[k]);
            for (size_t k = 0; k < n2; k++)
                ckpt_array_clear(&y2[k]);
            ckpt_model_free(m1);
            ckpt_model_free(m2);
            ckpt_backend_free(b);
        }
    ckpt_array_clear(&in);
    ckpt_file_free(ref);
    ckpt_file_free(f);
}

/* A linear whose output only a relu reads stores the relu in the product
 * (linear_relu): the MNIST MLP's logits, with and without its hidden
 * layer's pre-activation as an output. */
START_TEST(test_fused_linear_same_bits)
{
    fused_same_bits("models/mnist_mlp.json", "tests/data/fmnist_mlp.pth",
                    "tests/data/fmnist_mlp.ref.pth", "\"h1\"", 0);
}
END_TEST

/* A transposed conv whose output only a relu or a sigmoid reads applies it
 * as it adds the bias (conv_transpose2d_act): the MNIST autoencoder's
 * reconstruction and code, with and without the decoder's pre-activations
 * as outputs. */
START_TEST(test_fused_conv_transpose_same_bits)
{
    fused_same_bits("models/mnist_conv_autoencoder.json", "tests/data/fmnist_ae.pth",
                    "tests/data/fmnist_ae.ref.pth", "\"d4\", \"d6\"", 0);
}
END_TEST

/* The CPU backend reads a model's inputs where the caller keeps them (no
 * copy): a run leaves them as they were, and new contents at the same
 * address give new outputs -- a product whose operand is one matrix for the
 * whole batch (matmul_weight's right, matmul_left2d's left: kept packed
 * when it is a parameter) keeps no packed copy of an input from one run to
 * the next, on any products path and thread count. */
static void inputs_in_place(const char *name)
{
    char rel[128];
    snprintf(rel, sizeof rel, "tests/data/ops/%s.json", name);
    ckpt_model *m = load_spec(rel);
    snprintf(rel, sizeof rel, "tests/data/ops/%s.pth", name);
    ckpt_file *f = open_data(rel);
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_value_dict_get(ckpt_file_root(f), "params"), &r),
                     0);
    ck_assert_msg(r.ok, "%s", r.message);
    ckpt_array in[2] = {{0}}, want = {0};
    read_array(f, "input.a", &in[0]);
    read_array(f, "input.b", &in[1]);
    read_array(f, "output.y", &want);
    size_t n[2];
    float *orig[2];
    for (int k = 0; k < 2; k++) {
        n[k] = (size_t)ckpt_array_numel(&in[k]);
        ck_assert_ptr_nonnull(orig[k] = malloc(n[k] * sizeof(float)));
        memcpy(orig[k], in[k].data, n[k] * sizeof(float));
    }
    for (int pi = 0; pi < NPRODUCTS; pi++)
        for (int threads = 1; threads <= 3; threads += 2) {
            ckpt_backend *b;
            if (!open_cpu(PRODUCTS[pi], threads, &b))
                continue;
            ckpt_array y[1] = {{0}}, y2[1] = {{0}};
            run_model(m, b, in, y);
            for (int k = 0; k < 2; k++)
                ck_assert(memcmp(in[k].data, orig[k], n[k] * sizeof(float)) == 0);
            for (int64_t i = 0; i < ckpt_array_numel(&want); i++)
                ck_assert(fabs(y[0].data[i] - want.data[i]) <= 1e-5 * (1 + fabs(want.data[i])));
            for (int k = 0; k < 2; k++) { /* input k negated in its buffer: y negated */
                for (size_t i = 0; i < n[k]; i++)
                    in[k].data[i] = -orig[k][i];
                run_model(m, b, in, y2);
                for (int64_t i = 0; i < ckpt_array_numel(&want); i++)
                    ck_assert_msg(y2[0].data[i] == -y[0].data[i],
                                  "%s, %s, %d threads, input %d negated: element %lld", name,
                                  PRODUCTS[pi], threads, k, (long long)i);
                ckpt_array_clear(&y2[0]);
                memcpy(in[k].data, orig[k], n[k] * sizeof(float));
            }
            run_model(m, b, in, y2);
            assert_same_bits(&y[0], &y2[0], PRODUCTS[pi]);
            ckpt_array_clear(&y[0]);
            ckpt_array_clear(&y2[0]);
            ckpt_backend_free(b);
        }
    for (int k = 0; k < 2; k++) {
        free(orig[k]);
        ckpt_array_clear(&in[k]);
    }
    ckpt_array_clear(&want);
    ckpt_file_free(f);
    ckpt_model_free(m);
}

START_TEST(test_inputs_read_in_place)
{
    inputs_in_place("matmul_weight");
    inputs_in_place("matmul_left2d");
}
END_TEST

/* A model whose output is a view of its input (flatten): the output is a
 * copy, and the caller's input is never released by the run (ASan and
 * valgrind see a double free otherwise). */
START_TEST(test_input_view_output)
{
    static const char json[] =
        "{\"name\": \"v\", \"inputs\": [{\"name\": \"x\", \"shape\": [-1, 2, 3]}], "
        "\"nodes\": [{\"op\": \"flatten\", \"inputs\": [\"x\"], \"output\": \"y\", "
        "\"attrs\": {\"start_dim\": 1}}], \"outputs\": [\"y\"]}";
    ckpt_model *m = ckpt_model_new();
    ck_assert_msg(ckpt_model_parse(m, json, strlen(json), "v.json") == 0, "%s",
                  ckpt_model_error_message(m));
    ckpt_file *f = open_data("tests/data/ops/matmul_4d.pth"); /* its params: none */
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_value_dict_get(ckpt_file_root(f), "params"), &r),
                     0);
    ck_assert_msg(r.ok, "%s", r.message);
    float data[12];
    for (int i = 0; i < 12; i++)
        data[i] = (float)i - 5.5f;
    ckpt_array in = {.ndim = 3, .shape = {2, 2, 3}, .data = data}, y[1] = {{0}};
    ckpt_backend *b;
    ck_assert(open_cpu("auto", 2, &b));
    for (int k = 0; k < 2; k++) {
        run_model(m, b, &in, y);
        ck_assert_int_eq(y[0].ndim, 2);
        ck_assert_int_eq(y[0].shape[1], 6);
        ck_assert(y[0].data != data);
        ck_assert(memcmp(y[0].data, data, sizeof data) == 0);
        ckpt_array_clear(&y[0]);
    }
    ckpt_backend_free(b);
    ckpt_file_free(f);
    ckpt_model_free(m);
}
END_TEST

/* SPEC bound to CKPT's root, run on REF's "input" on 1 thread and on 3 by
 * every products path: the same bits.  Under valgrind by the default path
 * alone (each path's ops run there in test_op_case): SSD300 on every path
 * took two fifths of check_runtime's time there (176 of 437 s). */
static void same_bits_on_threads(const char *spec, const char *ckpt, const char *ref_path,
                                 int64_t batch)
{
    ckpt_model *m = load_spec(spec);
    ckpt_file *f = open_data(ckpt);
    ckpt_file *ref = open_data(ref_path);
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
    ck_assert_msg(r.ok, "%s", r.message);
    ckpt_array in = {0};
    read_array(ref, "input", &in);
    ck_assert_int_eq(in.shape[0], batch);
    size_t nout = ckpt_model_output_count(m);
    ck_assert(nout <= 4);
    int valgrind = unit_under_valgrind();
    for (int pi = 0; pi < (valgrind ? 1 : NPRODUCTS); pi++) {
        const char *products = valgrind ? "auto" : PRODUCTS[pi];
        ckpt_array y[2][4] = {{{0}}};
        ckpt_backend *b;
        if (!open_cpu(products, 1, &b))
            continue;
        ckpt_backend_free(b);
        for (int t = 0; t < 2; t++) {
            ck_assert(open_cpu(products, t ? 3 : 1, &b));
            run_model(m, b, &in, y[t]);
            ckpt_backend_free(b);
        }
        for (size_t k = 0; k < nout; k++) {
            assert_same_bits(&y[0][k], &y[1][k], ckpt_model_output_name(m, k));
            ckpt_array_clear(&y[0][k]);
            ckpt_array_clear(&y[1][k]);
        }
    }
    ckpt_array_clear(&in);
    ckpt_file_free(ref);
    ckpt_file_free(f);
    ckpt_model_free(m);
}

/* The loops the CPU backend spreads over threads (im2col, the pass after
 * each conv's product, max pooling, the products) give the same bits on 1
 * thread and on 3: SSD300 (narrow) at 300 x 300, big enough that each is
 * cut into chunks. */
START_TEST(test_threads_same_bits)
{
    same_bits_on_threads("models/ssd300.json", "tests/data/ssd300_narrow.pth",
                         "tests/data/ssd300_narrow.ref.pth", 1);
}
END_TEST

/* A batch of small convs runs one image a thread, a big one image by image
 * with the threads sharing each product: the same bits either way (the
 * MNIST conv autoencoder at batch 256, on 1 thread and on 3). */
START_TEST(test_threads_same_bits_batch)
{
    same_bits_on_threads("models/mnist_conv_autoencoder.json", "tests/data/fmnist_ae.pth",
                         "tests/data/fmnist_ae.ref.pth", 256);
}
END_TEST

/* The same for the LSTM's cells and linear's bias, cut into chunks of
 * batch rows: crnn.pytorch's BidirectionalLSTM (the op case) at batch 4096. */
START_TEST(test_threads_same_bits_lstm)
{
    char *path = data_path("tests/data/ops/lstm_crnn_block.json");
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    char json[8192], big[8192];
    size_t len = fread(json, 1, sizeof json - 1, fp);
    fclose(fp);
    json[len] = '\0';
    char *shape = strstr(json, "[11, 4, 16]");
    ck_assert_ptr_nonnull(shape);
    snprintf(big, sizeof big, "%.*s[11, 4096, 16]%s", (int)(shape - json), json,
             shape + strlen("[11, 4, 16]"));
    ckpt_model *m = ckpt_model_new();
    ck_assert_int_eq(ckpt_model_parse(m, big, strlen(big), "lstm4096.json"), 0);
    ckpt_file *f = open_data("tests/data/ops/lstm_crnn_block.pth");
    ckpt_load_report r;
    ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_value_dict_get(ckpt_file_root(f), "params"), &r),
                     0);
    ck_assert(r.ok);
    ckpt_array in = {.ndim = 3, .shape = {11, 4096, 16}};
    in.data = malloc(11 * 4096 * 16 * sizeof(float));
    uint32_t seed = 16;
    for (int64_t i = 0; i < ckpt_array_numel(&in); i++) {
        seed = seed * 1664525u + 1013904223u;
        in.data[i] = (float)(seed >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
    }
    for (int pi = 0; pi < NPRODUCTS; pi++) {
        ckpt_array y[2] = {{0}};
        ckpt_backend *b;
        if (!open_cpu(PRODUCTS[pi], 1, &b))
            continue;
        ckpt_backend_free(b);
        for (int t = 0; t < 2; t++) {
            ck_assert(open_cpu(PRODUCTS[pi], t ? 3 : 1, &b));
            run_model(m, b, &in, &y[t]);
            ckpt_backend_free(b);
        }
        assert_same_bits(&y[0], &y[1], "y");
        ckpt_array_clear(&y[0]);
        ckpt_array_clear(&y[1]);
    }
    ckpt_array_clear(&in);
    ckpt_file_free(f);
    ckpt_model_free(m);
    free(path);
}
END_TEST

/* The MNIST models at batch 8, as a small batch runs on many threads: the
 * products too small to share by their outputs cut along their depth (the
 * autoencoder's 3136 -> 32), the operand of a product several tasks read
 * packed once by all threads, images side by side.  Each on 1 thread, on 2
 * and on 3, with the default chunks and with one-item chunks: the same
 * bits. */
START_TEST(test_threads_same_bits_small_batch)
{
    static const char *const models[][2] = {
        {"models/mnist_mlp.json", "tests/data/fmnist_mlp.pth"},
        {"models/mnist_conv_autoencoder.json", "tests/data/fmnist_ae.pth"},
    };
    ckpt_file *f = open_data(models[_i][1]);
    ckpt_array in = {.ndim = 4, .shape = {8, 1, 28, 28}};
    in.data = malloc(8 * 28 * 28 * sizeof(float));
    uint32_t seed = 31;
    for (int64_t i = 0; i < ckpt_array_numel(&in); i++) {
        seed = seed * 1664525u + 1013904223u;
        in.data[i] = (float)(seed >> 8) / (float)(1u << 24);
    }
    for (int pi = 0; pi < NPRODUCTS; pi++) {
        /* a model per products path: a model runs on 16 backends at most */
        ckpt_model *m = load_spec(models[_i][0]);
        ckpt_load_report r;
        ck_assert_int_eq(ckpt_model_bind(m, f, ckpt_file_root(f), &r), 0);
        ck_assert_msg(r.ok, "%s", r.message);
        size_t nout = ckpt_model_output_count(m);
        ck_assert(nout <= 4);
        ckpt_backend *b;
        ckpt_array one[4] = {{0}};
        if (!open_cpu(PRODUCTS[pi], 1, &b)) {
            ckpt_model_free(m);
            continue;
        }
        run_model(m, b, &in, one);
        ckpt_backend_free(b);
        for (int threads = 2; threads <= 3; threads++)
            for (int64_t grain = 0; grain <= 1; grain++) {
                ckpt_array many[4] = {{0}};
                ck_assert(open_cpu(PRODUCTS[pi], threads, &b));
                ckpt_backend_cpu_set_grain(b, grain);
                run_model(m, b, &in, many);
                ckpt_backend_free(b);
                for (size_t k = 0; k < nout; k++) {
                    assert_same_bits(&one[k], &many[k], ckpt_model_output_name(m, k));
                    ckpt_array_clear(&many[k]);
                }
            }
        for (size_t k = 0; k < nout; k++)
            ckpt_array_clear(&one[k]);
        ckpt_model_free(m);
    }
    ckpt_array_clear(&in);
    ckpt_file_free(f);
}
END_TEST

START_TEST(test_backend_names)
{
    ckpt_backend *b = NULL;
    char err[256];
    ck_assert_int_eq(ckpt_backend_open("tpu", &b, err, sizeof err), CKPT_ERR_USAGE);
    ck_assert_ptr_null(b);
    ck_assert_int_eq(ckpt_backend_open("cuda:x", &b, err, sizeof err), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_backend_open("auto", &b, err, sizeof err), 0);
    if (ckpt_cuda_device_count_usable() == 0) {
        ck_assert_str_eq(ckpt_backend_device(b), "cpu");
        ck_assert(err[0]); /* says why the CPU was chosen */
        ckpt_backend_free(b);
        ck_assert_int_eq(ckpt_backend_open("cuda:0", &b, err, sizeof err), CKPT_ERR_DEVICE);
        ck_assert_ptr_null(b);
    } else {
        ck_assert_str_eq(ckpt_backend_device(b), "cuda:0");
        ckpt_backend_free(b);
    }
}
END_TEST

/* Open flags: TF32 is taken by the CPU and changes nothing on it (its
 * flags stay 0, its description too); an unknown flag is a usage error;
 * on a GPU the CUDA backend takes it and says so. */
START_TEST(test_backend_flags)
{
    ckpt_backend *b = NULL, *plain = NULL;
    char err[256];
    ck_assert_int_eq(ckpt_backend_open_flags("cpu", 0x8000, &b, err, sizeof err),
                     CKPT_ERR_USAGE);
    ck_assert_ptr_null(b);
    ck_assert_str_eq(err, "unknown backend flags 0x8000");
    ck_assert_int_eq(ckpt_backend_open_flags("cpu", CKPT_BACKEND_TF32, &b, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_backend_open("cpu", &plain, err, sizeof err), 0);
    ck_assert_uint_eq(ckpt_backend_flags(b), 0);
    ck_assert_str_eq(ckpt_backend_description(b), ckpt_backend_description(plain));
    ckpt_backend_free(b);
    ckpt_backend_free(plain);
    if (ckpt_cuda_device_count_usable() > 0) {
        ck_assert_int_eq(ckpt_backend_open_flags("cuda", CKPT_BACKEND_TF32, &b, err, sizeof err),
                         0);
        ck_assert_uint_eq(ckpt_backend_flags(b), CKPT_BACKEND_TF32);
        ck_assert_msg(strstr(ckpt_backend_description(b), ", TF32 on)"), "%s",
                      ckpt_backend_description(b));
        ckpt_backend_free(b);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("runtime");
    TCase *ops = tcase_create("ops");
    tcase_add_loop_test(ops, test_op_case, 0, ncases * NPRODUCTS);
    tcase_add_loop_test(ops, test_op_case_threads, 0, ncases * NPRODUCTS);
    suite_add_tcase(s, ops);
    TCase *tc = tcase_create("spec and load");
    tcase_add_loop_test(tc, test_spec_errors, 0, (int)(sizeof bad_specs / sizeof bad_specs[0]));
    tcase_add_test(tc, test_bind_dataparallel_keys);
    tcase_add_test(tc, test_bind_tied_key_missing);
    tcase_add_test(tc, test_bind_size_mismatch);
    tcase_add_test(tc, test_bind_missing_weight_says_nothing_downstream);
    tcase_add_test(tc, test_run_checks_input_shape);
    tcase_add_test(tc, test_plan_follows_inputs);
    tcase_add_loop_test(tc, test_shape_errors, 0, (int)(sizeof bad_shapes / sizeof bad_shapes[0]));
    tcase_add_test(tc, test_embedding_id_out_of_range);
    tcase_add_test(tc, test_op_not_available);
    tcase_add_test(tc, test_backend_names);
    tcase_add_test(tc, test_backend_flags);
    suite_add_tcase(s, tc);
    TCase *speed = tcase_create("speed keeps the bits");
    tcase_set_timeout(speed, 120);
    tcase_add_test(speed, test_fused_conv_same_bits);
    tcase_add_test(speed, test_fused_linear_same_bits);
    tcase_add_test(speed, test_fused_conv_transpose_same_bits);
    tcase_add_test(speed, test_inputs_read_in_place);
    tcase_add_test(speed, test_input_view_output);
    tcase_add_test(speed, test_threads_same_bits);
    tcase_add_test(speed, test_threads_same_bits_lstm);
    tcase_add_test(speed, test_threads_same_bits_batch);
    tcase_add_loop_test(speed, test_threads_same_bits_small_batch, 0, 2);
    suite_add_tcase(s, speed);
    return s;
}

int main(void)
{
    list_cases();
    if (ncases < 40) {
        fprintf(stderr, "check_runtime: only %d op cases found\n", ncases);
        return 1;
    }
    int rc = unit_run(suite());
    for (int i = 0; i < ncases; i++)
        free(cases[i]);
    free(cases);
    return rc;
}
