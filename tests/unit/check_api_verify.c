/* check_api_verify.c - libckpt's verify engine (ckpt_verify_*, ckpt.h) as a
 * user of the library calls it, on the fixtures of tests/cli/verify.sh: the
 * state dict it chooses and why, the hint and its fix command, the verdict
 * of every output; and for the same inputs, `ckpt verify --json` (run with
 * popen) prints the same answers, and exactly the document
 * ckpt_verify_to_json() gives.  Runs from the top of the source tree, as the
 * CLI tests do, so that both see the same paths. */
#include "ckpt.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MLP "models/mnist_mlp.json"
#define AE "models/mnist_conv_autoencoder.json"
#define CRNN "models/crnn_tiny.json"

static char ckpt_bin[4096]; /* the ckpt under test ($CKPT, else the build tree's) */

/* ---- the library's side ----------------------------------------------------- */

/* Everything one verify holds; the engine borrows the models and files. */
typedef struct session {
    ckpt_verify *v;
    ckpt_model *model, *model2;
    ckpt_file *f, *f2, *ref;
} session;

static ckpt_file *open_file(const char *path)
{
    ckpt_file *f = ckpt_file_new();
    ck_assert_ptr_nonnull(f);
    ck_assert_msg(ckpt_file_open(f, path) == CKPT_OK, "%s: %s", path, ckpt_file_error_message(f));
    return f;
}

static ckpt_model *load_model(const char *spec)
{
    ckpt_model *m = ckpt_model_new();
    ck_assert_ptr_nonnull(m);
    ck_assert_msg(ckpt_model_load(m, spec) == CKPT_OK, "%s", ckpt_model_error_message(m));
    return m;
}

/* What `ckpt verify --device cpu [--select SELECT] [--replicas N]
 * [--against AGAINST] [--reference REF] --model SPEC CKPT` does, through the
 * library; returns the first failing call's status. */
static int verify(session *s, const char *spec, const char *ckpt, const char *select,
                  const char *against, const char *ref, int replicas)
{
    memset(s, 0, sizeof *s);
    s->v = ckpt_verify_new();
    ck_assert_ptr_nonnull(s->v);
    ck_assert_int_eq(ckpt_verify_set_device(s->v, "cpu"), CKPT_OK);
    ck_assert_int_eq(ckpt_verify_set_select(s->v, select), CKPT_OK);
    ck_assert_int_eq(ckpt_verify_set_replicas(s->v, replicas), CKPT_OK);
    s->model = load_model(spec);
    s->f = open_file(ckpt);
    int rc = ckpt_verify_load(s->v, s->model, s->f);
    if (rc != CKPT_OK)
        return rc;
    if (against) {
        s->model2 = load_model(spec); /* a model holds one state dict */
        s->f2 = open_file(against);
        if ((rc = ckpt_verify_load_against(s->v, s->model2, s->f2)) != CKPT_OK)
            return rc;
    }
    if (ref)
        s->ref = open_file(ref);
    return ckpt_verify_run(s->v, s->ref);
}

static void session_free(session *s)
{
    ckpt_verify_free(s->v); /* first: it points into the others */
    ckpt_model_free(s->model);
    ckpt_model_free(s->model2);
    ckpt_file_free(s->f);
    ckpt_file_free(s->f2);
    ckpt_file_free(s->ref);
}

/* ---- the CLI's side ------------------------------------------------------------ */

/* Run `ckpt verify --device cpu ARGS`, keeping its stdout (STREAM 1) or its
 * stderr (2); its exit status in *STATUS.  Malloc'd. */
static char *cli(const char *args, int stream, int *status)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' verify --device cpu %s %s", ckpt_bin, args,
             stream == 1 ? "2>/dev/null" : "2>&1 >/dev/null");
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t len = 0, cap = 1 << 16;
    char *out = malloc(cap);
    ck_assert_ptr_nonnull(out);
    size_t n;
    while ((n = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (len + 1 == cap)
            ck_assert_ptr_nonnull(out = realloc(out, cap *= 2));
    }
    out[len] = '\0';
    int st = pclose(p);
    ck_assert(WIFEXITED(st));
    *status = WEXITSTATUS(st);
    return out;
}

static const char *json_str(const cJSON *o, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static int json_true(const cJSON *o, const char *name)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, name));
}

/* Remove the line of TEXT that holds NEEDLE, if any. */
static void drop_line(char *text, const char *needle)
{
    char *at = strstr(text, needle);
    if (!at)
        return;
    char *start = at, *end = strchr(at, '\n');
    while (start > text && start[-1] != '\n')
        start--;
    end = end ? end + 1 : at + strlen(at);
    memmove(start, end, strlen(end) + 1);
}

/* The engine's answers are what `ckpt verify --json ARGS` prints: the state
 * dict chosen, the hint and fix, each output's verdicts, the result and the
 * exit status; and its document is ckpt_verify_to_json()'s, byte for byte. */
static void same_as_cli(const session *s, const char *args)
{
    char full[4096];
    int status;
    snprintf(full, sizeof full, "--json %s", args);
    char *out = cli(full, 1, &status);
    cJSON *d = cJSON_Parse(out);
    ck_assert_msg(d != NULL, "ckpt verify %s printed no JSON: %s", full, out);
    const ckpt_verify *v = s->v;

    const cJSON *load = cJSON_GetObjectItemCaseSensitive(d, "load");
    ck_assert_str_eq(json_str(load, "state_dict"),
                     ckpt_verify_choice(v, CKPT_VERIFY_CHECKPOINT)->path);
    ck_assert_int_eq(json_true(load, "ok"), ckpt_verify_load_report(v, CKPT_VERIFY_CHECKPOINT)->ok);
    ck_assert_pstr_eq(json_str(d, "hint"), ckpt_verify_hint(v));
    ck_assert_pstr_eq(json_str(d, "fix"), ckpt_verify_fix(v));

    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(d, "outputs");
    ck_assert_int_eq(outs ? cJSON_GetArraySize(outs) : 0, (int)ckpt_verify_output_count(v));
    for (size_t i = 0; i < ckpt_verify_output_count(v); i++) {
        const ckpt_verify_output *x = ckpt_verify_output_at(v, i);
        const cJSON *o = cJSON_GetArrayItem(outs, (int)i);
        ck_assert_str_eq(json_str(o, "name"), x->name);
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(o, "reference");
        ck_assert_int_eq(ref != NULL, x->reference != NULL);
        if (ref) {
            ck_assert_int_eq(json_true(ref, "pass"), x->vs_reference.pass);
            ck_assert_int_eq(cJSON_GetObjectItem(ref, "mismatched")->valuedouble,
                             x->vs_reference.mismatched);
        }
        const cJSON *ag = cJSON_GetObjectItemCaseSensitive(o, "against");
        ck_assert_int_eq(ag != NULL, x->against != NULL);
        if (ag)
            ck_assert_int_eq(json_true(ag, "pass"), x->vs_against.pass);
    }
    const cJSON *rep = cJSON_GetObjectItemCaseSensitive(d, "replicas");
    ck_assert_int_eq(rep != NULL, ckpt_verify_replica_info(v) != NULL);
    for (size_t i = 0; rep && i < ckpt_verify_output_count(v); i++) {
        const cJSON *o = cJSON_GetArrayItem(cJSON_GetObjectItem(rep, "outputs"), (int)i);
        ck_assert_int_eq(json_true(o, "ok"), ckpt_verify_output_at(v, i)->vs_single.pass);
        ck_assert_pstr_eq(json_str(o, "reason"), ckpt_verify_output_at(v, i)->replica_reason);
    }
    ck_assert_str_eq(json_str(d, "result"), ckpt_verify_passed(v) ? "PASS" : "FAIL");
    ck_assert_int_eq(status, ckpt_verify_passed(v) ? 0 : 1);

    /* The same text, but for the device line: the kernels a process picks
     * follow the CPU it sees, and under valgrind this one sees no AVX-512
     * while the CLI does (the two kernels give the same bits). */
    char *doc = ckpt_verify_to_json(v);
    ck_assert_ptr_nonnull(doc);
    drop_line(out, "\"device_description\":");
    drop_line(doc, "\"device_description\":");
    ck_assert_uint_eq(strlen(out), strlen(doc) + 1); /* the CLI puts() it */
    ck_assert(strncmp(out, doc, strlen(doc)) == 0);
    free(doc);
    cJSON_Delete(d);
    free(out);
}

/* An engine error is the CLI's one line "ckpt: verify: FILE: MESSAGE" and its
 * exit status (3 for bad input, 2 for usage). */
static void same_error_as_cli(const session *s, const char *args, int exit_status)
{
    int status;
    char *err = cli(args, 2, &status), line[2048];
    snprintf(line, sizeof line, "ckpt: verify: %s%s%s\n",
             ckpt_verify_error_path(s->v) ? ckpt_verify_error_path(s->v) : "",
             ckpt_verify_error_path(s->v) ? ": " : "", ckpt_verify_error_message(s->v));
    ck_assert_str_eq(err, line);
    ck_assert_int_eq(status, exit_status);
    free(err);
}

/* ---- choosing the state dict, the hint and the fix ------------------------------------ */

START_TEST(test_dataparallel_checkpoint_gets_the_strip_module_fix)
{
    session s;
    ck_assert_int_eq(verify(&s, MLP, "tests/data/fmnist_mlp_dp.pth", NULL, NULL, NULL, 0), CKPT_OK);

    const ckpt_state_dict_choice *c = ckpt_verify_choice(s.v, CKPT_VERIFY_CHECKPOINT);
    ck_assert_str_eq(c->path, "the root");
    ck_assert_int_eq(c->reason, CKPT_STATE_DICT_BEST_FIT);
    ck_assert_uint_eq(c->spec_keys, 4); /* each "module.KEY" ends in a spec key */

    const ckpt_load_report *load = ckpt_verify_load_report(s.v, CKPT_VERIFY_CHECKPOINT);
    ck_assert(!load->ok);
    ck_assert_uint_eq(load->missing_count, 4);
    ck_assert_str_eq(load->unexpected[0], "module.n.1.weight");
    ck_assert_str_eq(ckpt_verify_hint(s.v),
                     "every key carries the \"module.\" prefix of DataParallel/"
                     "DistributedDataParallel (the wrapper was saved, not the model)");
    /* its storages are on cuda:0, which this machine lacks (CKPT_CUDA_DEVICES=0, as
     * make check sets it): the fix remaps them too, so that its output loads here */
    ck_assert_str_eq(ckpt_verify_fix(s.v), "ckpt strip-module --map-location cpu "
                                           "tests/data/fmnist_mlp_dp.pth "
                                           "tests/data/fmnist_mlp_dp_stripped.pth");

    /* a failed load is an answer, not an error: nothing runs, the result is FAIL */
    ck_assert_int_eq(ckpt_verify_error_code(s.v), CKPT_OK);
    ck_assert(!ckpt_verify_ran(s.v));
    ck_assert_uint_eq(ckpt_verify_output_count(s.v), 0);
    ck_assert(!ckpt_verify_passed(s.v));
    same_as_cli(&s, "--model " MLP " tests/data/fmnist_mlp_dp.pth");
    session_free(&s);
}
END_TEST

START_TEST(test_training_checkpoint_model_state_dict_is_found)
{
    session s;
    ck_assert_int_eq(verify(&s, MLP, "tests/data/train_ckpt.pth", NULL, NULL, NULL, 0), CKPT_OK);
    const ckpt_state_dict_choice *c = ckpt_verify_choice(s.v, CKPT_VERIFY_CHECKPOINT);
    ck_assert_str_eq(c->path, "model_state_dict");
    ck_assert_int_eq(c->reason, CKPT_STATE_DICT_BEST_FIT);
    ck_assert_uint_gt(c->candidates, 1); /* the optimizer's state is a mapping too */
    ck_assert_ptr_eq(c->state_dict,
                     ckpt_value_dict_get(ckpt_file_root(s.f), "model_state_dict"));
    /* the fix names the state dict it applies to */
    ck_assert_str_eq(ckpt_verify_fix(s.v), "ckpt strip-module --map-location cpu "
                                           "--select 'model_state_dict' "
                                           "tests/data/train_ckpt.pth "
                                           "tests/data/train_ckpt_stripped.pth");
    same_as_cli(&s, "--model " MLP " tests/data/train_ckpt.pth");
    session_free(&s);
}
END_TEST

START_TEST(test_select_names_the_state_dict_and_leaves_the_file_alone)
{
    session s;
    ck_assert_int_eq(verify(&s, MLP, "tests/data/train_ckpt.pth", "optimizer_state_dict", NULL,
                            NULL, 0), CKPT_OK);
    const ckpt_state_dict_choice *c = ckpt_verify_choice(s.v, CKPT_VERIFY_CHECKPOINT);
    ck_assert_int_eq(c->reason, CKPT_STATE_DICT_SELECTED);
    ck_assert_str_eq(c->path, "optimizer_state_dict");
    ck_assert_uint_eq(c->spec_keys, 0);
    ck_assert(!ckpt_verify_load_report(s.v, CKPT_VERIFY_CHECKPOINT)->ok);
    ck_assert_ptr_null(ckpt_verify_hint(s.v)); /* no prefix explains an optimizer's keys */
    ck_assert_ptr_nonnull(ckpt_value_dict_get(ckpt_file_root(s.f), "model_state_dict"));
    same_as_cli(&s, "--model " MLP " --select optimizer_state_dict tests/data/train_ckpt.pth");
    session_free(&s);
}
END_TEST

START_TEST(test_wrong_model_no_hint)
{
    session s;
    ck_assert_int_eq(verify(&s, AE, "tests/data/fmnist_mlp.pth", NULL, NULL, NULL, 0), CKPT_OK);
    const ckpt_state_dict_choice *c = ckpt_verify_choice(s.v, CKPT_VERIFY_CHECKPOINT);
    ck_assert_int_eq(c->reason, CKPT_STATE_DICT_FIRST); /* not one key of the autoencoder */
    ck_assert_uint_eq(c->spec_keys, 0);
    const ckpt_load_report *load = ckpt_verify_load_report(s.v, CKPT_VERIFY_CHECKPOINT);
    ck_assert_uint_eq(load->missing_count, 12);
    ck_assert_uint_eq(load->unexpected_count, 4);
    ck_assert_ptr_null(ckpt_verify_hint(s.v));
    ck_assert_ptr_null(ckpt_verify_fix(s.v));
    same_as_cli(&s, "--model " AE " tests/data/fmnist_mlp.pth");
    session_free(&s);
}
END_TEST

START_TEST(test_choose_alone_loads_nothing)
{
    ckpt_verify *v = ckpt_verify_new();
    ckpt_model *m = load_model(MLP);
    ckpt_file *f = open_file("tests/data/train_ckpt.pth");
    ck_assert_int_eq(ckpt_verify_choose(v, m, f), CKPT_OK);
    ck_assert_str_eq(ckpt_verify_choice(v, CKPT_VERIFY_CHECKPOINT)->path, "model_state_dict");
    ck_assert_ptr_null(ckpt_verify_load_report(v, CKPT_VERIFY_CHECKPOINT));
    ck_assert_ptr_null(ckpt_verify_to_json(v));
    ck_assert_int_eq(ckpt_verify_run(v, NULL), CKPT_ERR_USAGE);
    ckpt_verify_free(v);
    ckpt_model_free(m);
    ckpt_file_free(f);
}
END_TEST

/* ---- the run: per-output verdicts ---------------------------------------------------- */

START_TEST(test_reference_verdicts)
{
    session s;
    ck_assert_int_eq(verify(&s, MLP, "tests/data/fmnist_mlp.pth", NULL, NULL,
                            "tests/data/fmnist_mlp.ref.pth", 0), CKPT_OK);
    ck_assert(ckpt_verify_ran(s.v));
    ck_assert_str_eq(ckpt_backend_device(ckpt_verify_backend(s.v)), "cpu");
    ck_assert_str_eq(ckpt_verify_input_from(s.v), "reference");
    ck_assert_int_eq(ckpt_verify_input(s.v, 0)->shape[0], 256);
    ck_assert_uint_eq(ckpt_verify_output_count(s.v), 1);

    const ckpt_verify_output *x = ckpt_verify_output_at(s.v, 0);
    ck_assert_str_eq(x->name, "logits");
    ck_assert_int_eq(x->value->shape[1], 10);
    const ckpt_output_check *c = &x->vs_reference;
    ck_assert(c->shape_ok && c->pass);
    ck_assert_int_eq(c->count, 2560);
    /* the relative error on the output's scale (doc/design.md, "ckpt verify --json") */
    ck_assert_double_eq(c->max_rel, c->max_abs / c->max_abs_reference);
    ck_assert_double_lt(c->max_rel, 1e-5);
    ck_assert_double_eq(c->rtol, 1e-5);                          /* the CPU's default */
    ck_assert_double_eq(c->atol, 1e-5 * c->max_abs_reference);   /* scaled by default */
    ck_assert(x->has_accuracy);
    ck_assert_int_eq(x->labels, 256);
    ck_assert_int_eq(x->correct, 220);
    ck_assert_int_eq(x->reference_correct, 220);
    ck_assert_ptr_null(x->against);
    ck_assert_ptr_null(ckpt_verify_replica_info(s.v));
    ck_assert(ckpt_verify_passed(s.v));
    same_as_cli(&s, "--model " MLP " --reference tests/data/fmnist_mlp.ref.pth "
                    "tests/data/fmnist_mlp.pth");
    session_free(&s);
}
END_TEST

START_TEST(test_exact_tolerance_fails)
{
    session s = {0};
    s.v = ckpt_verify_new();
    ck_assert_int_eq(ckpt_verify_set_atol(s.v, 0), CKPT_OK);
    ck_assert_int_eq(ckpt_verify_set_rtol(s.v, 0), CKPT_OK);
    ck_assert_int_eq(ckpt_verify_set_device(s.v, "cpu"), CKPT_OK);
    s.model = load_model(MLP);
    s.f = open_file("tests/data/fmnist_mlp.pth");
    s.ref = open_file("tests/data/fmnist_mlp.ref.pth");
    ck_assert_int_eq(ckpt_verify_load(s.v, s.model, s.f), CKPT_OK);
    ck_assert_int_eq(ckpt_verify_run(s.v, s.ref), CKPT_OK);
    const ckpt_output_check *c = &ckpt_verify_output_at(s.v, 0)->vs_reference;
    ck_assert(c->shape_ok && !c->pass);
    ck_assert_int_gt(c->mismatched, 0);
    ck_assert_double_eq(c->atol, 0); /* absolute when given */
    ck_assert(!ckpt_verify_passed(s.v));
    same_as_cli(&s, "--model " MLP " --atol 0 --rtol 0 --reference tests/data/fmnist_mlp.ref.pth "
                    "tests/data/fmnist_mlp.pth");
    /* a tolerance that is no number >= 0 is refused */
    ck_assert_int_eq(ckpt_verify_set_rtol(s.v, -1), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_verify_set_atol(s.v, NAN), CKPT_ERR_USAGE);
    session_free(&s);
}
END_TEST

START_TEST(test_against_same_weights_bitwise)
{
    session s;
    ck_assert_int_eq(verify(&s, MLP, "tests/data/fmnist_mlp.pth", NULL, "tests/data/fmnist_mlp.pth",
                            NULL, 0), CKPT_OK);
    ck_assert_str_eq(ckpt_verify_choice(s.v, CKPT_VERIFY_AGAINST)->path, "the root");
    ck_assert(ckpt_verify_load_report(s.v, CKPT_VERIFY_AGAINST)->ok);
    ck_assert_str_eq(ckpt_verify_input_from(s.v), "random (seed fixed, batch 4)");
    const ckpt_verify_output *x = ckpt_verify_output_at(s.v, 0);
    ck_assert_ptr_null(x->reference);
    ck_assert(x->vs_against.pass);
    ck_assert_double_eq(x->vs_against.max_abs, 0);
    ck_assert_double_eq(x->vs_against.max_rel, 0);
    ck_assert_double_eq(x->vs_against.atol, 0); /* bitwise by default */
    ck_assert_double_eq(x->vs_against.rtol, 0);
    same_as_cli(&s, "--model " MLP " --against tests/data/fmnist_mlp.pth tests/data/fmnist_mlp.pth");
    session_free(&s);
}
END_TEST

START_TEST(test_replicas_batch_not_first)
{
    session s;
    ck_assert_int_eq(verify(&s, CRNN, "tests/data/crnn_tiny.pth", NULL, NULL, NULL, 2), CKPT_OK);
    const ckpt_verify_replicas *r = ckpt_verify_replica_info(s.v);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->requested, 2);
    ck_assert_int_eq(r->used, 2);
    ck_assert_int_eq(r->batch, 4); /* the random batch is 2N */
    ck_assert_uint_eq(r->device_count, 1);
    ck_assert_str_eq(r->devices[0], "cpu");
    const ckpt_verify_output *x = ckpt_verify_output_at(s.v, 0);
    ck_assert_int_eq(x->batch_dim, 1); /* time first: [T, B, classes] */
    ck_assert_ptr_nonnull(x->gathered);
    ck_assert_int_eq(x->gathered->shape[0], 2 * x->value->shape[0]);
    ck_assert(!x->vs_single.pass);
    ck_assert_ptr_nonnull(strstr(x->replica_reason, "its batch dimension is dim 1, not 0"));
    ck_assert(!ckpt_verify_passed(s.v));
    same_as_cli(&s, "--model " CRNN " --replicas 2 tests/data/crnn_tiny.pth");
    session_free(&s);
}
END_TEST

/* ---- errors, as the CLI reports them ------------------------------------------------- */

START_TEST(test_reference_of_another_model)
{
    session s;
    ck_assert_int_eq(verify(&s, MLP, "tests/data/fmnist_mlp.pth", NULL, NULL,
                            "tests/data/fmnist_ae.ref.pth", 0), CKPT_ERR_FORMAT);
    ck_assert_str_eq(ckpt_verify_error_path(s.v), "tests/data/fmnist_ae.ref.pth");
    ck_assert_ptr_nonnull(strstr(ckpt_verify_error_message(s.v), "has no tensor 'output.logits'"));
    ck_assert(!ckpt_verify_ran(s.v));
    same_error_as_cli(&s, "--model " MLP " --reference tests/data/fmnist_ae.ref.pth "
                          "tests/data/fmnist_mlp.pth", 3);
    session_free(&s);
}
END_TEST

START_TEST(test_select_that_names_nothing)
{
    session s;
    ck_assert_int_eq(verify(&s, MLP, "tests/data/train_ckpt.pth", "nothing", NULL, NULL, 0),
                     CKPT_ERR_FORMAT);
    ck_assert_str_eq(ckpt_verify_error_path(s.v), "tests/data/train_ckpt.pth");
    ck_assert_ptr_null(ckpt_verify_choice(s.v, CKPT_VERIFY_CHECKPOINT));
    same_error_as_cli(&s, "--model " MLP " --select nothing tests/data/train_ckpt.pth", 3);
    session_free(&s);
}
END_TEST

START_TEST(test_replicas_need_a_batch_to_split)
{
    session s;
    ck_assert_int_eq(verify(&s, "models/ssd300.json", "tests/data/ssd300_narrow.pth", NULL, NULL,
                            "tests/data/ssd300_narrow.ref.pth", 2), CKPT_ERR_USAGE);
    same_error_as_cli(&s, "--model models/ssd300.json --replicas 2 "
                          "--reference tests/data/ssd300_narrow.ref.pth "
                          "tests/data/ssd300_narrow.pth", 2);
    session_free(&s);
}
END_TEST

/* ---- one comparison of outputs ------------------------------------------------------- */

static ckpt_array vec(float *data, int64_t n)
{
    ckpt_array a = {.ndim = 1, .shape = {n}, .data = data};
    return a;
}

START_TEST(test_array_compare)
{
    ckpt_output_check c;
    float a1[] = {1, 2, 3, 4}, r1[] = {1, 2, 3.5f, 4};
    ckpt_array ours = vec(a1, 4), ref = vec(r1, 4);
    ck_assert_int_eq(ckpt_array_compare(&ours, &ref, 1e-5, 1e-5, CKPT_ATOL_SCALED, &c), CKPT_OK);
    ck_assert(c.shape_ok && !c.pass);
    ck_assert_int_eq(c.count, 4);
    ck_assert_int_eq(c.mismatched, 1);
    ck_assert_double_eq(c.max_abs, 0.5);
    ck_assert_double_eq(c.max_abs_reference, 4);
    ck_assert_double_eq(c.max_rel, 0.125);
    ck_assert_double_eq_tol(c.atol, 4e-5, 1e-12); /* a fraction of max |ref| */

    /* the relative error is on the output's scale, not the largest ratio of
     * two elements: 0.001 off 0.002 is 50% of that element, 1e-4 of 10 */
    float a2[] = {0.001f, 10}, r2[] = {0.002f, 10};
    ours = vec(a2, 2);
    ref = vec(r2, 2);
    ckpt_array_compare(&ours, &ref, 0, 0, 0, &c);
    ck_assert_double_eq_tol(c.max_rel, 1e-4, 1e-9);

    /* NaN equals NaN; a NaN against a number fails whatever the tolerance */
    float a3[] = {NAN, 1}, r3[] = {NAN, 1};
    ours = vec(a3, 2);
    ref = vec(r3, 2);
    ckpt_array_compare(&ours, &ref, 0, 0, 0, &c);
    ck_assert(c.pass);
    ck_assert_double_eq(c.max_abs, 0);
    ck_assert_double_eq(c.max_rel, 0);
    float a4[] = {NAN}, r4[] = {0};
    ours = vec(a4, 1);
    ref = vec(r4, 1);
    ckpt_array_compare(&ours, &ref, 1e9, 1e9, 0, &c);
    ck_assert(!c.pass);
    ck_assert(isnan(c.max_abs) && isnan(c.max_rel));
    /* any difference from a reference of zeros is infinitely large */
    float a5[] = {1e-30f};
    ours = vec(a5, 1);
    ckpt_array_compare(&ours, &ref, 1, 0, 0, &c);
    ck_assert(c.pass && isinf(c.max_rel));
    /* an infinity equals only itself */
    float a6[] = {INFINITY}, r6[] = {INFINITY}, r7[] = {1e30f};
    ours = vec(a6, 1);
    ref = vec(r6, 1);
    ckpt_array_compare(&ours, &ref, 0, 0, 0, &c);
    ck_assert(c.pass);
    ref = vec(r7, 1);
    ckpt_array_compare(&ours, &ref, 1e9, 1e9, 0, &c);
    ck_assert(!c.pass);

    /* shapes that differ: nothing is compared */
    ours = vec(a1, 4);
    ref = vec(r1, 3);
    ckpt_array_compare(&ours, &ref, 1, 1, 0, &c);
    ck_assert(!c.shape_ok && !c.pass);
    ck_assert_int_eq(c.count, 0);
    ck_assert_int_eq(ckpt_array_compare(NULL, &ref, 0, 0, 0, &c), CKPT_ERR_USAGE);
}
END_TEST

int main(void)
{
    /* no CUDA device here, GPU or not, for the library and the CLI alike (the fixes
     * name --map-location cpu for cuda-tagged files), as make check sets it */
    setenv("CKPT_CUDA_DEVICES", "0", 0);
    /* the CLI and the library see the same relative paths from the source tree */
    const char *bin = getenv("CKPT");
    char cwd[2048];
    if (bin)
        snprintf(ckpt_bin, sizeof ckpt_bin, "%s", bin);
    else if (getcwd(cwd, sizeof cwd))
        snprintf(ckpt_bin, sizeof ckpt_bin, "%s/ckpt", cwd);
    const char *src = getenv("srcdir");
    if (src && chdir(src) != 0) {
        perror(src);
        return 1;
    }
    Suite *s = suite_create("api_verify");
    TCase *choice = tcase_create("the state dict, the hint, the fix");
    tcase_add_test(choice, test_dataparallel_checkpoint_gets_the_strip_module_fix);
    tcase_add_test(choice, test_training_checkpoint_model_state_dict_is_found);
    tcase_add_test(choice, test_select_names_the_state_dict_and_leaves_the_file_alone);
    tcase_add_test(choice, test_wrong_model_no_hint);
    tcase_add_test(choice, test_choose_alone_loads_nothing);
    suite_add_tcase(s, choice);
    TCase *run = tcase_create("the run");
    tcase_set_timeout(run, 60);
    tcase_add_test(run, test_reference_verdicts);
    tcase_add_test(run, test_exact_tolerance_fails);
    tcase_add_test(run, test_against_same_weights_bitwise);
    tcase_add_test(run, test_replicas_batch_not_first);
    tcase_add_test(run, test_reference_of_another_model);
    tcase_add_test(run, test_select_that_names_nothing);
    tcase_add_test(run, test_replicas_need_a_batch_to_split);
    tcase_add_test(run, test_array_compare);
    suite_add_tcase(s, run);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
