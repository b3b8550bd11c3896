/* cmd_verify.c - ckpt verify: load a checkpoint into the model it was
 * trained for (a graph spec), strictly as torch does, run it on the CPU
 * reference or a GPU, and compare its outputs with PyTorch's. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ckpt verify --model SPEC [--reference REF] [--against CKPT2]\n"
    "                   [--device auto|cpu|cuda[:N]] [--replicas N] [--select PATH]\n"
    "                   [--atol A] [--rtol R] [--json] CKPT\n"
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
    "  --json           print a JSON document (ckpt-verify(1))\n"
    "  --allow-global M.NAME, --allow-unknown, --max-pickle-bytes N, --quiet, --help\n"
    "                   as for every command (ckpt --help)\n";

enum {
    OPT_MODEL = CLI_OPT_FIRST_COMMAND_OPTION, OPT_REFERENCE, OPT_AGAINST, OPT_DEVICE,
    OPT_SELECT, OPT_ATOL, OPT_RTOL, OPT_JSON, OPT_REPLICAS
};

#define RANDOM_BATCH 4

/* One output's verdict against one other set of outputs. */
typedef struct check {
    int64_t count, mismatched;
    double max_abs;
    double max_rel;           /* max_abs / the largest |reference| */
    double scale;             /* the largest finite |reference| */
    double atol, rtol;
    int shape_ok, pass;
    int has_acc;
    int64_t correct, ref_correct, labels;
} check;

typedef struct verify {
    const char *spec_path, *ckpt_path, *ref_path, *against_path, *device, *select;
    double atol, rtol;
    int atol_set, rtol_set, json;
    int replicas;             /* --replicas N, 0 without */
    cli_common common;

    ckpt_model *model, *model2;
    ckpt_file *f, *f2, *ref;
    const ckpt_value *sd, *sd2;
    char sd_where[256], sd2_where[256];
    ckpt_load_report load, load2;
    char hint[1024], fix[1024];
    ckpt_backend *backend;
    char backend_note[256];
    ckpt_array *inputs, *outputs, *outputs2, *refs;
    const ckpt_tensor *labels;
    char input_from[64];
    check *vs_ref, *vs_against;
    int loaded, ran;
    /* --replicas */
    ckpt_backend *rep_backends[64];
    unsigned char rep_owned[64];  /* opened for the replay (not the main backend) */
    size_t nrep_backends;
    int rep_used;
    int64_t rep_batch;
    ckpt_array *gathered;
    int *batch_dims;
    check *vs_single;
} verify;

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

/* ---- choosing the state dict --------------------------------------------- */

static size_t spec_matches(const ckpt_model *m, const ckpt_value *sd)
{
    /* keys of SD that are spec keys, directly or under wrapper prefixes */
    size_t hits = 0, n = ckpt_value_len(sd);
    for (size_t i = 0; i < n; i++) {
        const ckpt_value *k = ckpt_value_dict_key(sd, i);
        if (ckpt_value_kind(k) != CKPT_KIND_STR)
            continue;
        const char *key = ckpt_value_str(k, NULL);
        size_t kl = strlen(key);
        for (size_t p = 0; p < ckpt_model_param_count(m); p++) {
            const char *s = ckpt_model_param_key(m, p);
            size_t sl = strlen(s);
            if (kl >= sl && strcmp(key + kl - sl, s) == 0 &&
                (kl == sl || key[kl - sl - 1] == '.')) {
                hits++;
                break;
            }
        }
    }
    return hits;
}

/* The mapping to load: --select's, else the root when it is a state dict,
 * else the state dict whose keys best fit the spec. */
static int find_state_dict(verify *v, ckpt_file *f, const char *file, const char *select,
                           const ckpt_value **out, char *where, size_t cap)
{
    if (select) {
        int rc = ckpt_file_select(f, select);
        if (rc != CKPT_OK) {
            cli_error("verify", file, "%s", ckpt_file_error_message(f));
            return cli_exit_for(rc);
        }
        *out = ckpt_file_root(f);
        snprintf(where, cap, "%s", select);
        return CLI_EXIT_OK;
    }
    size_t n = ckpt_file_state_dict_count(f), best = 0, best_hits = 0;
    if (n == 0) {
        const ckpt_value *root = ckpt_file_root(f);
        if (ckpt_value_kind(root) == CKPT_KIND_DICT) {
            *out = root; /* an empty or odd mapping: the load will say what is wrong */
            snprintf(where, cap, "the root");
            return CLI_EXIT_OK;
        }
        cli_error("verify", file, "holds no state dict (a mapping of names to tensors)");
        return CLI_EXIT_BAD_INPUT;
    }
    for (size_t i = 0; i < n; i++) {
        size_t hits = spec_matches(v->model, ckpt_file_state_dict(f, i, NULL));
        if (hits > best_hits) {
            best_hits = hits;
            best = i;
        }
    }
    ckpt_path p;
    *out = ckpt_file_state_dict(f, best, &p);
    if (p.len == 0) {
        snprintf(where, cap, "the root");
    } else {
        size_t need = ckpt_path_format(&p, where, cap);
        if (need >= cap)
            where[cap - 1] = '\0';
    }
    return CLI_EXIT_OK;
}

/* ---- the hint: a wrapper prefix in the way -------------------------------- */

static const char *sd_key(const ckpt_value *sd, size_t i)
{
    const ckpt_value *k = ckpt_value_dict_key(sd, i);
    return ckpt_value_kind(k) == CKPT_KIND_STR ? ckpt_value_str(k, NULL) : NULL;
}

/* 1 when the keys of SD, with PREFIX removed (strip) or added (!strip),
 * are exactly the spec's keys. */
static int keys_fit(const ckpt_model *m, const ckpt_value *sd, const char *prefix, int strip,
                    int repeat)
{
    size_t n = ckpt_value_len(sd), pl = strlen(prefix);
    if (n != ckpt_model_param_count(m))
        return 0;
    for (size_t i = 0; i < n; i++) {
        const char *k = sd_key(sd, i);
        if (!k)
            return 0;
        if (strip) {
            if (strncmp(k, prefix, pl) != 0)
                return 0;
            do
                k += pl;
            while (repeat && strncmp(k, prefix, pl) == 0);
        }
        int found = 0;
        for (size_t p = 0; p < n && !found; p++) {
            const char *s = ckpt_model_param_key(m, p);
            if (!strip)
                found = strncmp(s, prefix, pl) == 0 && strcmp(s + pl, k) == 0;
            else
                found = strcmp(s, k) == 0;
        }
        if (!found)
            return 0;
    }
    return 1;
}

static void out_name(const char *in, const char *suffix, char *buf, size_t cap)
{
    const char *slash = strrchr(in, '/');
    const char *dot = strrchr(in, '.');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - in) : strlen(in);
    snprintf(buf, cap, "%.*s%s.pth", (int)stem, in, suffix);
}

/* 1 when the unwrap rules (module., _orig_mod., ...) turn SD's keys into the spec's. */
static int unwrap_fits(const ckpt_model *m, const ckpt_value *sd)
{
    ckpt_rename *r = ckpt_rename_new();
    if (!r || ckpt_rename_unwrap(r) != CKPT_OK) {
        ckpt_rename_free(r);
        return 0;
    }
    size_t n = ckpt_value_len(sd);
    int fit = n == ckpt_model_param_count(m);
    for (size_t i = 0; fit && i < n; i++) {
        const char *k = sd_key(sd, i);
        char *u = k ? ckpt_rename_apply(r, k) : NULL;
        int found = 0;
        for (size_t p = 0; u && p < n && !found; p++)
            found = strcmp(u, ckpt_model_param_key(m, p)) == 0;
        fit = found;
        free(u);
    }
    ckpt_rename_free(r);
    return fit;
}

/* When the keys differ by a wrapper prefix, say so and give the command. */
static void make_hint(verify *v)
{
    const ckpt_value *sd = v->sd;
    char out[512], sel[300] = "";
    if (v->select)
        snprintf(sel, sizeof sel, "--select '%s' ", v->select);
    else if (strcmp(v->sd_where, "the root") != 0)
        snprintf(sel, sizeof sel, "--select '%s' ", v->sd_where);
    const char *k0 = ckpt_value_len(sd) ? sd_key(sd, 0) : NULL;
    if (!k0)
        return;

    /* every key carries a prefix: find it from the first key */
    size_t kl = strlen(k0);
    for (size_t p = 0; p < ckpt_model_param_count(v->model); p++) {
        const char *s = ckpt_model_param_key(v->model, p);
        size_t sl = strlen(s);
        if (!(kl > sl && strcmp(k0 + kl - sl, s) == 0 && k0[kl - sl - 1] == '.'))
            continue;
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(kl - sl), k0);
        int only_module = 1;
        for (size_t i = 0; i < kl - sl; i += 7)
            only_module &= strncmp(prefix + i, "module.", 7) == 0;
        if (only_module && keys_fit(v->model, sd, "module.", 1, 1)) {
            out_name(v->ckpt_path, "_stripped", out, sizeof out);
            snprintf(v->hint, sizeof v->hint,
                     "every key carries the \"%s\" prefix of DataParallel/"
                     "DistributedDataParallel (the wrapper was saved, not the model)", prefix);
            snprintf(v->fix, sizeof v->fix, "ckpt strip-module %s%s %s", sel, v->ckpt_path, out);
            return;
        }
        if (unwrap_fits(v->model, sd))
            break; /* a known wrapper, said below */
        if (keys_fit(v->model, sd, prefix, 1, 0)) {
            out_name(v->ckpt_path, "_stripped", out, sizeof out);
            snprintf(v->hint, sizeof v->hint, "every key carries the prefix \"%s\"", prefix);
            snprintf(v->fix, sizeof v->fix, "ckpt strip-module %s--prefix '%s' %s %s", sel,
                     prefix, v->ckpt_path, out);
            return;
        }
        break;
    }
    if (unwrap_fits(v->model, sd)) {
        out_name(v->ckpt_path, "_unwrapped", out, sizeof out);
        snprintf(v->hint, sizeof v->hint,
                 "the keys carry wrapper components (module. of DataParallel, _orig_mod. of "
                 "torch.compile, _fsdp_wrapped_module. of FSDP, ...)");
        snprintf(v->fix, sizeof v->fix, "ckpt unwrap %s%s %s", sel, v->ckpt_path, out);
        return;
    }
    /* the model wants a prefix the checkpoint lacks */
    const char *s0 = ckpt_model_param_key(v->model, 0);
    size_t sl = s0 ? strlen(s0) : 0;
    for (size_t i = 0; s0 && i < ckpt_value_len(sd); i++) {
        const char *k = sd_key(sd, i);
        kl = k ? strlen(k) : 0;
        if (!(k && sl > kl && strcmp(s0 + sl - kl, k) == 0 && s0[sl - kl - 1] == '.'))
            continue;
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(sl - kl), s0);
        if (keys_fit(v->model, sd, prefix, 0, 0)) {
            int module = strcmp(prefix, "module.") == 0;
            out_name(v->ckpt_path, "_wrapped", out, sizeof out);
            snprintf(v->hint, sizeof v->hint, "the model expects every key under \"%s\"%s",
                     prefix, module ? " (a DataParallel/DistributedDataParallel model)" : "");
            if (module)
                snprintf(v->fix, sizeof v->fix, "ckpt add-module %s%s %s", sel, v->ckpt_path,
                         out);
            else
                snprintf(v->fix, sizeof v->fix, "ckpt add-module %s--prefix '%s' %s %s", sel,
                         prefix, v->ckpt_path, out);
        }
        return;
    }
}

/* ---- inputs and outputs ------------------------------------------------------ */

/* Tensor NAME of the reference file as a float32 array. */
static int ref_array(verify *v, const char *name, ckpt_array *out, int required)
{
    const ckpt_value *root = ckpt_file_root(v->ref);
    const ckpt_value *val = ckpt_value_kind(root) == CKPT_KIND_DICT
                                ? ckpt_value_dict_get(root, name) : NULL;
    const ckpt_tensor *t = val ? ckpt_value_tensor(val) : NULL;
    if (!t) {
        if (!required)
            return 1;
        cli_error("verify", v->ref_path, "has no tensor '%s' (a reference holds 'input' and "
                  "'output.<name>' for every output of the model)", name);
        return -CLI_EXIT_BAD_INPUT;
    }
    ckpt_dtype dt = ckpt_tensor_dtype(t);
    if (!ckpt_dtype_is_floating(dt) || ckpt_tensor_ndim(t) > CKPT_MAX_DIMS) {
        cli_error("verify", v->ref_path, "'%s' is a %s tensor of %d dimensions; a reference "
                  "holds floating-point tensors", name, ckpt_dtype_name(dt), ckpt_tensor_ndim(t));
        return -CLI_EXIT_BAD_INPUT;
    }
    int64_t numel = ckpt_tensor_numel(t);
    float *data = malloc(numel ? (size_t)numel * sizeof(float) : sizeof(float));
    if (!data) {
        cli_error("verify", v->ref_path, "out of memory");
        return -CLI_EXIT_IO;
    }
    int rc = ckpt_tensor_read_float32(v->ref, t, data, (size_t)numel);
    if (rc != CKPT_OK) {
        free(data);
        cli_error("verify", v->ref_path, "%s", ckpt_file_error_message(v->ref));
        return -cli_exit_for(rc);
    }
    out->ndim = ckpt_tensor_ndim(t);
    memcpy(out->shape, ckpt_tensor_shape(t), sizeof(int64_t) * (size_t)out->ndim);
    out->data = data;
    return 0;
}

static int make_inputs(verify *v)
{
    size_t n = ckpt_model_input_count(v->model);
    if (!(v->inputs = calloc(n, sizeof *v->inputs))) {
        cli_error("verify", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    if (v->ref_path) {
        for (size_t i = 0; i < n; i++) {
            char name[300];
            snprintf(name, sizeof name, "input.%s", ckpt_model_input_name(v->model, i));
            int rc = 1;
            if (n == 1)
                rc = ref_array(v, "input", &v->inputs[i], 0);
            if (rc == 1)
                rc = ref_array(v, name, &v->inputs[i], 1);
            if (rc < 0)
                return -rc;
        }
        snprintf(v->input_from, sizeof v->input_from, "reference");
        return CLI_EXIT_OK;
    }
    /* no reference: a fixed pseudo-random batch in [0, 1) */
    uint64_t state = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < n; i++) {
        ckpt_array *a = &v->inputs[i];
        a->ndim = ckpt_model_input_shape(v->model, i, a->shape);
        int64_t count = 1;
        for (int d = 0; d < a->ndim; d++) {
            if (a->shape[d] == -1)
                a->shape[d] = v->replicas ? 2 * v->replicas : RANDOM_BATCH;
            count *= a->shape[d];
        }
        if (!(a->data = malloc((size_t)count * sizeof(float)))) {
            cli_error("verify", NULL, "out of memory");
            return CLI_EXIT_IO;
        }
        for (int64_t k = 0; k < count; k++) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            a->data[k] = (float)(state >> 40) / 16777216.0f;
        }
    }
    snprintf(v->input_from, sizeof v->input_from, "random (seed fixed, batch %d)",
             v->replicas ? 2 * v->replicas : RANDOM_BATCH);
    return CLI_EXIT_OK;
}

static int same_shape(const ckpt_array *a, const ckpt_array *b)
{
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static void compare(const ckpt_array *ours, const ckpt_array *ref, double atol, double rtol,
                    int scale_atol, check *c)
{
    memset(c, 0, sizeof *c);
    c->rtol = rtol;
    c->shape_ok = same_shape(ours, ref);
    if (!c->shape_ok)
        return;
    int64_t n = ckpt_array_numel(ours);
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref->data[i]) && fabs(ref->data[i]) > c->scale)
            c->scale = fabs(ref->data[i]);
    if (scale_atol)
        atol *= c->scale;
    c->atol = atol;
    c->count = n;
    for (int64_t i = 0; i < n; i++) {
        double a = ours->data[i], b = ref->data[i];
        if ((isnan(a) && isnan(b)) || a == b)
            continue;
        double d = fabs(a - b);
        if (isnan(d) || isinf(d))
            c->max_abs = isnan(d) ? NAN : isnan(c->max_abs) ? c->max_abs : d;
        else if (!isnan(c->max_abs) && d > c->max_abs)
            c->max_abs = d;
        if (!(d <= atol + rtol * fabs(b)) || isinf(a) || isinf(b))
            c->mismatched++;
    }
    c->max_rel = c->max_abs == 0 ? 0 : c->scale > 0 ? c->max_abs / c->scale : INFINITY;
    c->pass = c->mismatched == 0;
}

/* Top-1 accuracy of class scores [B, C] against int labels [B]. */
static void accuracy(verify *v, const ckpt_array *ours, const ckpt_array *ref, check *c)
{
    if (!v->labels || ours->ndim != 2 || ours->shape[1] < 2)
        return;
    int64_t b = ours->shape[0], k = ours->shape[1];
    if (ckpt_tensor_numel(v->labels) != b)
        return;
    ckpt_dtype dt = ckpt_tensor_dtype(v->labels);
    if (dt != CKPT_DTYPE_INT64)
        return;
    int64_t *lab = malloc((size_t)b * sizeof(int64_t));
    if (!lab || ckpt_tensor_read(v->ref, v->labels, lab, (size_t)b * sizeof(int64_t))) {
        free(lab);
        return;
    }
    int64_t top = -1;
    for (int64_t i = 0; i < b; i++)
        top = lab[i] > top ? lab[i] : top;
    if (top + 1 != k) { /* not class scores for these labels (e.g. a latent code) */
        free(lab);
        return;
    }
    for (int64_t i = 0; i < b; i++) {
        int64_t am = 0, ar = 0;
        for (int64_t j = 1; j < k; j++) {
            if (ours->data[i * k + j] > ours->data[i * k + am])
                am = j;
            if (ref && ref->data[i * k + j] > ref->data[i * k + ar])
                ar = j;
        }
        c->correct += am == lab[i];
        c->ref_correct += ref && ar == lab[i];
    }
    free(lab);
    c->has_acc = 1;
    c->labels = b;
}

/* ---- output ------------------------------------------------------------------- */

static void shape_text(const ckpt_array *a, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < a->ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

static int all_pass(const verify *v)
{
    if (!v->load.ok || (v->against_path && !v->load2.ok))
        return 0;
    for (size_t i = 0; v->ran && i < ckpt_model_output_count(v->model); i++) {
        if (v->vs_ref && !(v->vs_ref[i].shape_ok && v->vs_ref[i].pass))
            return 0;
        if (v->vs_against && !(v->vs_against[i].shape_ok && v->vs_against[i].pass))
            return 0;
        if (v->vs_single && !(v->vs_single[i].shape_ok && v->vs_single[i].pass))
            return 0;
    }
    return 1;
}

/* Why output I does not survive DataParallel's gather, in a user's words. */
static void replica_reason(const verify *v, size_t i, char *buf, size_t cap)
{
    const ckpt_array *one = &v->outputs[i], *g = &v->gathered[i];
    int d = v->batch_dims[i];
    char sb[128], gb[128];
    shape_text(one, sb, sizeof sb);
    if (!g->data && d > 0)
        snprintf(buf, cap, "its batch dimension is dim %d, not 0 (a permute inside forward), and "
                 "the replicas' outputs differ in it, so gather cannot concatenate them along "
                 "dim 0 (torch raises); keep the batch first until after the wrapper", d);
    else if (!g->data)
        snprintf(buf, cap, "the replicas' outputs differ outside dim 0, so gather cannot "
                 "concatenate them (torch raises)");
    else if (d < 0)
        snprintf(buf, cap, "it has no batch dimension, so DataParallel returns %d copies stacked "
                 "along dim 0 (%s instead of %s); return it from outside the wrapped module, "
                 "or slice one copy", v->rep_used, (shape_text(g, gb, sizeof gb), gb), sb);
    else if (d > 0)
        snprintf(buf, cap, "its batch dimension is dim %d, not 0 (a permute inside forward), so "
                 "gather concatenates along the wrong one (%s instead of %s); keep the batch "
                 "first until after the wrapper", d, (shape_text(g, gb, sizeof gb), gb), sb);
    else if (!v->vs_single[i].shape_ok)
        snprintf(buf, cap, "the gathered shape %s is not %s",
                 (shape_text(g, gb, sizeof gb), gb), sb);
    else
        snprintf(buf, cap, "the values differ (max abs %.3g): the output mixes samples of the "
                 "batch, which DataParallel splits", v->vs_single[i].max_abs);
}

static void print_load(const char *label, const char *file, const char *where,
                       const ckpt_load_report *r, size_t nparams)
{
    printf("%-11s %s: state dict at %s\n", label, file, where);
    if (r->ok)
        printf("%-11s strict: all %zu keys matched\n", "load", nparams);
    else
        printf("%-11s FAIL\n%s\n", "load", r->message);
}

static void print_text(verify *v)
{
    size_t nout = ckpt_model_output_count(v->model);
    printf("%-11s %s (%s): %zu parameter tensors\n", "model", ckpt_model_name(v->model),
           v->spec_path, ckpt_model_param_count(v->model));
    print_load("checkpoint", v->ckpt_path, v->sd_where, &v->load,
               ckpt_model_param_count(v->model));
    if (v->hint[0])
        printf("%-11s %s; fix it with:\n%-11s %s\n", "hint", v->hint, "", v->fix);
    if (v->against_path)
        print_load("against", v->against_path, v->sd2_where, &v->load2,
                   ckpt_model_param_count(v->model));
    if (v->ran) {
        printf("%-11s %s%s%s\n", "device", ckpt_backend_description(v->backend),
               v->backend_note[0] ? " -- auto: " : "", v->backend_note);
        for (size_t i = 0; i < ckpt_model_input_count(v->model); i++) {
            char sb[128];
            shape_text(&v->inputs[i], sb, sizeof sb);
            printf("%-11s %s %s from %s%s%s\n", "input", ckpt_model_input_name(v->model, i), sb,
                   v->input_from, v->ref_path ? " " : "", v->ref_path ? v->ref_path : "");
        }
        for (size_t i = 0; i < nout; i++) {
            char sb[128], rb[128];
            const char *name = ckpt_model_output_name(v->model, i);
            shape_text(&v->outputs[i], sb, sizeof sb);
            if (v->vs_ref) {
                check *c = &v->vs_ref[i];
                if (!c->shape_ok) {
                    shape_text(&v->refs[i], rb, sizeof rb);
                    printf("%-11s %s %s: the reference's is %s: FAIL\n", "output", name, sb, rb);
                } else {
                    printf("%-11s %s %s: max abs %.3g, max rel %.3g of max |ref| %.3g "
                           "(atol %.3g, rtol %.3g)",
                           "output", name, sb, c->max_abs, c->max_rel, c->scale, c->atol, c->rtol);
                    if (c->pass)
                        printf(": PASS\n");
                    else
                        printf(": FAIL, %lld of %lld elements out of tolerance\n",
                               (long long)c->mismatched, (long long)c->count);
                }
                if (c->has_acc)
                    printf("%-11s %s: %.2f%% (%lld/%lld), PyTorch %.2f%% (%lld/%lld)\n",
                           "accuracy", name, 100.0 * (double)c->correct / (double)c->labels,
                           (long long)c->correct, (long long)c->labels,
                           100.0 * (double)c->ref_correct / (double)c->labels,
                           (long long)c->ref_correct, (long long)c->labels);
            } else if (!v->against_path) {
                printf("%-11s %s %s\n", "output", name, sb);
            }
            if (v->vs_against) {
                check *c = &v->vs_against[i];
                if (!c->shape_ok) {
                    shape_text(&v->outputs2[i], rb, sizeof rb);
                    printf("%-11s %s %s: CKPT2 gives %s: FAIL\n", "against", name, sb, rb);
                } else if (c->max_abs == 0 && c->pass && !c->mismatched)
                    printf("%-11s %s %s: identical%s\n", "against", name, sb,
                           c->atol == 0 && c->rtol == 0 ? " (bitwise)" : "");
                else
                    printf("%-11s %s %s: max abs %.3g, max rel %.3g: %s\n", "against", name, sb,
                           c->max_abs, c->max_rel, c->pass ? "PASS" : "FAIL");
            }
        }
    }
    if (v->ran && v->replicas) {
        printf("%-11s %d requested; the batch of %lld split into %d chunk%s (torch.chunk), run "
               "%s%s\n", "replicas", v->replicas, (long long)v->rep_batch, v->rep_used,
               v->rep_used == 1 ? "" : "s",
               v->nrep_backends > 1 ? "on " : "in turn on ",
               v->nrep_backends > 1 ? "one GPU each" : ckpt_backend_device(v->backend));
        for (size_t i = 0; i < nout; i++) {
            char sb[128], why[512];
            const char *name = ckpt_model_output_name(v->model, i);
            shape_text(&v->outputs[i], sb, sizeof sb);
            if (v->vs_single[i].shape_ok && v->vs_single[i].pass) {
                printf("%-11s %s %s: gathered back %s\n", "replica", name, sb,
                       v->vs_single[i].max_abs == 0 ? "identically" : "within tolerance");
            } else {
                replica_reason(v, i, why, sizeof why);
                printf("%-11s %s %s: BREAKS under DataParallel: %s\n", "replica", name, sb, why);
            }
        }
    }
    printf("%-11s %s\n", "result", all_pass(v) ? "PASS" : "FAIL");
}

static cJSON *json_num(double d)
{
    if (isnan(d))
        return cJSON_CreateString("nan");
    if (isinf(d))
        return cJSON_CreateString(d < 0 ? "-inf" : "inf");
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", d);
    return cJSON_CreateRaw(buf);
}

static cJSON *json_load(const char *file, const char *where, const ckpt_load_report *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", file);
    cJSON_AddStringToObject(o, "state_dict", where);
    cJSON_AddBoolToObject(o, "ok", r->ok);
    cJSON *miss = cJSON_AddArrayToObject(o, "missing");
    for (size_t i = 0; i < r->missing_count; i++)
        cJSON_AddItemToArray(miss, cJSON_CreateString(r->missing[i]));
    cJSON *unexp = cJSON_AddArrayToObject(o, "unexpected");
    for (size_t i = 0; i < r->unexpected_count; i++)
        cJSON_AddItemToArray(unexp, cJSON_CreateString(r->unexpected[i]));
    cJSON *mm = cJSON_AddArrayToObject(o, "size_mismatch");
    for (size_t i = 0; i < r->mismatch_count; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "key", r->mismatches[i].key);
        cJSON_AddItemToObject(e, "checkpoint",
                              cli_json_dims(r->mismatches[i].ckpt_shape, r->mismatches[i].ckpt_ndim));
        cJSON_AddItemToObject(e, "model",
                              cli_json_dims(r->mismatches[i].model_shape, r->mismatches[i].model_ndim));
        cJSON_AddItemToArray(mm, e);
    }
    cJSON *bad = cJSON_AddArrayToObject(o, "bad_type");
    for (size_t i = 0; i < r->bad_dtype_count; i++)
        cJSON_AddItemToArray(bad, cJSON_CreateString(r->bad_dtype[i]));
    cJSON_AddStringToObject(o, "message", r->message ? r->message : "");
    return o;
}

static cJSON *json_check(const check *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "shape_ok", c->shape_ok);
    cJSON_AddItemToObject(o, "max_abs", json_num(c->max_abs));
    cJSON_AddItemToObject(o, "max_rel", json_num(c->max_rel));
    cJSON_AddItemToObject(o, "max_abs_reference", json_num(c->scale));
    cJSON_AddItemToObject(o, "atol", json_num(c->atol));
    cJSON_AddItemToObject(o, "rtol", json_num(c->rtol));
    cJSON_AddItemToObject(o, "mismatched", cli_json_int(c->mismatched));
    cJSON_AddBoolToObject(o, "pass", c->shape_ok && c->pass);
    return o;
}

static int print_json(verify *v)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", ckpt_model_name(v->model));
    cJSON_AddStringToObject(root, "spec", v->spec_path);
    cJSON_AddItemToObject(root, "load", json_load(v->ckpt_path, v->sd_where, &v->load));
    if (v->hint[0]) {
        cJSON_AddStringToObject(root, "hint", v->hint);
        cJSON_AddStringToObject(root, "fix", v->fix);
    }
    if (v->against_path)
        cJSON_AddItemToObject(root, "against", json_load(v->against_path, v->sd2_where, &v->load2));
    if (v->ran) {
        cJSON_AddStringToObject(root, "device", ckpt_backend_device(v->backend));
        cJSON_AddStringToObject(root, "device_description", ckpt_backend_description(v->backend));
        if (v->backend_note[0])
            cJSON_AddStringToObject(root, "device_note", v->backend_note);
        if (v->ref_path)
            cJSON_AddStringToObject(root, "reference", v->ref_path);
        cJSON *outs = cJSON_AddArrayToObject(root, "outputs");
        for (size_t i = 0; i < ckpt_model_output_count(v->model); i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", ckpt_model_output_name(v->model, i));
            cJSON_AddItemToObject(o, "shape", cli_json_dims(v->outputs[i].shape, v->outputs[i].ndim));
            if (v->vs_ref) {
                cJSON_AddItemToObject(o, "reference", json_check(&v->vs_ref[i]));
                if (v->vs_ref[i].has_acc) {
                    cJSON_AddItemToObject(o, "accuracy", json_num((double)v->vs_ref[i].correct /
                                                                  (double)v->vs_ref[i].labels));
                    cJSON_AddItemToObject(o, "reference_accuracy",
                                          json_num((double)v->vs_ref[i].ref_correct /
                                                   (double)v->vs_ref[i].labels));
                }
            }
            if (v->vs_against)
                cJSON_AddItemToObject(o, "against", json_check(&v->vs_against[i]));
            cJSON_AddItemToArray(outs, o);
        }
    }
    if (v->ran && v->replicas) {
        cJSON *rep = cJSON_AddObjectToObject(root, "replicas");
        cJSON_AddItemToObject(rep, "requested", cli_json_int(v->replicas));
        cJSON_AddItemToObject(rep, "used", cli_json_int(v->rep_used));
        cJSON_AddItemToObject(rep, "batch", cli_json_int(v->rep_batch));
        cJSON *devs = cJSON_AddArrayToObject(rep, "devices");
        for (size_t i = 0; i < v->nrep_backends; i++)
            cJSON_AddItemToArray(devs, cJSON_CreateString(ckpt_backend_device(v->rep_backends[i])));
        cJSON *outs = cJSON_AddArrayToObject(rep, "outputs");
        for (size_t i = 0; i < ckpt_model_output_count(v->model); i++) {
            cJSON *o = cJSON_CreateObject();
            int ok = v->vs_single[i].shape_ok && v->vs_single[i].pass;
            cJSON_AddStringToObject(o, "name", ckpt_model_output_name(v->model, i));
            cJSON_AddItemToObject(o, "shape", cli_json_dims(v->outputs[i].shape, v->outputs[i].ndim));
            if (v->gathered[i].data)
                cJSON_AddItemToObject(o, "gathered_shape",
                                      cli_json_dims(v->gathered[i].shape, v->gathered[i].ndim));
            else
                cJSON_AddNullToObject(o, "gathered_shape");
            cJSON_AddItemToObject(o, "batch_dim", cli_json_int(v->batch_dims[i]));
            cJSON_AddBoolToObject(o, "ok", ok);
            if (v->vs_single[i].shape_ok)
                cJSON_AddItemToObject(o, "max_abs", json_num(v->vs_single[i].max_abs));
            if (!ok) {
                char why[512];
                replica_reason(v, i, why, sizeof why);
                cJSON_AddStringToObject(o, "reason", why);
            }
            cJSON_AddItemToArray(outs, o);
        }
    }
    cJSON_AddStringToObject(root, "result", all_pass(v) ? "PASS" : "FAIL");
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (!s) {
        cli_error("verify", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    puts(s);
    free(s);
    return CLI_EXIT_OK;
}

/* ---- the command ---------------------------------------------------------------- */

static int load_side(verify *v, const char *path, const char *select, ckpt_file **f,
                     ckpt_model **m, const ckpt_value **sd, char *where, size_t cap,
                     ckpt_load_report *r)
{
    int rc = cli_open("verify", path, &v->common, f);
    if (rc != CLI_EXIT_OK)
        return rc;
    if (!*m) {
        *m = ckpt_model_new();
        if (!*m || ckpt_model_load(*m, v->spec_path) != CKPT_OK) {
            cli_error("verify", NULL, "%s", *m ? ckpt_model_error_message(*m) : "out of memory");
            return *m ? cli_exit_for(ckpt_model_error_code(*m)) : CLI_EXIT_IO;
        }
    }
    if ((rc = find_state_dict(v, *f, path, select, sd, where, cap)) != CLI_EXIT_OK)
        return rc;
    int st = ckpt_model_bind(*m, *f, *sd, r);
    if (st != CKPT_OK) {
        cli_error("verify", path, "%s", ckpt_model_error_message(*m));
        return cli_exit_for(st);
    }
    return CLI_EXIT_OK;
}

static int run_model(verify *v, ckpt_model *m, const char *path, ckpt_array **outs)
{
    size_t nout = ckpt_model_output_count(m);
    if (!(*outs = calloc(nout, sizeof **outs))) {
        cli_error("verify", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    int st = ckpt_model_run(m, v->backend, v->inputs, *outs);
    if (st != CKPT_OK) {
        /* a reference whose input does not fit the model is a bad reference */
        cli_error("verify", st == CKPT_ERR_USAGE && v->ref_path ? v->ref_path : path, "%s",
                  ckpt_model_error_message(m));
        return st == CKPT_ERR_USAGE ? CLI_EXIT_BAD_INPUT : cli_exit_for(st);
    }
    return CLI_EXIT_OK;
}

/* --replicas: one backend per GPU when there are enough, else the one in use. */
static int run_replicas(verify *v, double atol, double rtol)
{
    size_t nout = ckpt_model_output_count(v->model);
    const char *dev = ckpt_backend_device(v->backend);
    /* one GPU per replica, cuda:0 .. cuda:N-1, as DataParallel's device_ids
     * default; else every chunk in turn on the device in use */
    v->rep_backends[0] = v->backend;
    v->nrep_backends = 1;
    if (strncmp(dev, "cuda", 4) == 0 && ckpt_cuda_device_count_usable() >= v->replicas) {
        int mine = atoi(dev + 5);
        v->nrep_backends = 0;
        for (int i = 0; i < v->replicas; i++) {
            char name[32], err[256];
            if (i == mine) {
                v->rep_backends[v->nrep_backends++] = v->backend;
                continue;
            }
            snprintf(name, sizeof name, "cuda:%d", i);
            ckpt_backend *b;
            if (ckpt_backend_open(name, &b, err, sizeof err) != CKPT_OK) {
                cli_error("verify", NULL, "--replicas: %s: %s", name, err);
                return CLI_EXIT_IO;
            }
            v->rep_owned[v->nrep_backends] = 1;
            v->rep_backends[v->nrep_backends++] = b;
        }
    }
    v->rep_batch = v->inputs[0].ndim ? v->inputs[0].shape[0] : 0;
    if (v->rep_batch < 2) {
        /* nothing would be split: a pass here would prove nothing */
        cli_error("verify", v->ref_path, "--replicas %d needs a batch of at least 2 to split, "
                  "and the input's is %lld (give a reference with a bigger batch, or none: "
                  "a random batch of %d is used then)", v->replicas, (long long)v->rep_batch,
                  2 * v->replicas);
        return CLI_EXIT_USAGE;
    }
    if (!(v->gathered = calloc(nout, sizeof *v->gathered)) ||
        !(v->batch_dims = calloc(nout, sizeof *v->batch_dims)) ||
        !(v->vs_single = calloc(nout, sizeof *v->vs_single))) {
        cli_error("verify", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    int st = ckpt_model_batch_dims(v->model, v->inputs, v->batch_dims);
    if (st == CKPT_OK)
        st = ckpt_model_run_replicas(v->model, v->rep_backends, v->nrep_backends, v->replicas,
                                     v->inputs, v->gathered, &v->rep_used);
    if (st != CKPT_OK) {
        cli_error("verify", v->ref_path ? v->ref_path : v->ckpt_path, "--replicas: %s",
                  ckpt_model_error_message(v->model));
        return st == CKPT_ERR_USAGE ? CLI_EXIT_BAD_INPUT : cli_exit_for(st);
    }
    for (size_t i = 0; i < nout; i++) {
        if (v->gathered[i].data)
            compare(&v->gathered[i], &v->outputs[i], atol, rtol, !v->atol_set, &v->vs_single[i]);
        else
            memset(&v->vs_single[i], 0, sizeof v->vs_single[i]);
    }
    return CLI_EXIT_OK;
}

static int verify_run(verify *v)
{
    int rc;
    v->model = ckpt_model_new();
    if (!v->model) {
        cli_error("verify", NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    if (ckpt_model_load(v->model, v->spec_path) != CKPT_OK) {
        cli_error("verify", NULL, "%s", ckpt_model_error_message(v->model));
        return cli_exit_for(ckpt_model_error_code(v->model));
    }
    if ((rc = load_side(v, v->ckpt_path, v->select, &v->f, &v->model, &v->sd, v->sd_where,
                        sizeof v->sd_where, &v->load)) != CLI_EXIT_OK)
        return rc;
    if (!v->load.ok && (v->load.missing_count || v->load.unexpected_count))
        make_hint(v); /* a prefix can only explain keys that differ */
    if (v->against_path &&
        (rc = load_side(v, v->against_path, NULL, &v->f2, &v->model2, &v->sd2, v->sd2_where,
                        sizeof v->sd2_where, &v->load2)) != CLI_EXIT_OK)
        return rc;
    if (v->ref_path && (rc = cli_open("verify", v->ref_path, &v->common, &v->ref)) != CLI_EXIT_OK)
        return rc;
    if (!v->load.ok || (v->against_path && !v->load2.ok))
        return CLI_EXIT_OK; /* reported as FAIL */

    int st = ckpt_backend_open(v->device ? v->device : "auto", &v->backend, v->backend_note,
                               sizeof v->backend_note);
    if (st != CKPT_OK) {
        cli_error("verify", NULL, "--device %s: %s", v->device ? v->device : "auto",
                  v->backend_note);
        return cli_exit_for(st);
    }
    if ((rc = make_inputs(v)) != CLI_EXIT_OK)
        return rc;
    size_t nout = ckpt_model_output_count(v->model);
    if (v->ref_path) {
        if (!(v->refs = calloc(nout, sizeof *v->refs))) {
            cli_error("verify", NULL, "out of memory");
            return CLI_EXIT_IO;
        }
        for (size_t i = 0; i < nout; i++) {
            char name[300];
            snprintf(name, sizeof name, "output.%s", ckpt_model_output_name(v->model, i));
            int r = ref_array(v, name, &v->refs[i], 1);
            if (r < 0)
                return -r;
        }
        const ckpt_value *root = ckpt_file_root(v->ref);
        const ckpt_value *lv = ckpt_value_dict_get(root, "labels");
        v->labels = lv ? ckpt_value_tensor(lv) : NULL;
    }
    if ((rc = run_model(v, v->model, v->ckpt_path, &v->outputs)) != CLI_EXIT_OK)
        return rc;
    if (v->against_path &&
        (rc = run_model(v, v->model2, v->against_path, &v->outputs2)) != CLI_EXIT_OK)
        return rc;
    v->ran = 1;

    int cuda = strncmp(ckpt_backend_device(v->backend), "cuda", 4) == 0;
    double rtol = v->rtol_set ? v->rtol : cuda ? 1e-4 : 1e-5;
    double atol = v->atol_set ? v->atol : 1e-5;
    if (v->ref_path) {
        if (!(v->vs_ref = calloc(nout, sizeof *v->vs_ref)))
            return CLI_EXIT_IO;
        for (size_t i = 0; i < nout; i++) {
            compare(&v->outputs[i], &v->refs[i], atol, rtol, !v->atol_set, &v->vs_ref[i]);
            accuracy(v, &v->outputs[i], &v->refs[i], &v->vs_ref[i]);
        }
    }
    if (v->replicas && (rc = run_replicas(v, atol, rtol)) != CLI_EXIT_OK)
        return rc;
    if (v->against_path) {
        if (!(v->vs_against = calloc(nout, sizeof *v->vs_against)))
            return CLI_EXIT_IO;
        for (size_t i = 0; i < nout; i++)
            compare(&v->outputs2[i], &v->outputs[i], v->atol_set ? v->atol : 0,
                    v->rtol_set ? v->rtol : 0, 0, &v->vs_against[i]);
    }
    return CLI_EXIT_OK;
}

static void verify_free(verify *v)
{
    size_t nout = v->model ? ckpt_model_output_count(v->model) : 0;
    size_t nin = v->model ? ckpt_model_input_count(v->model) : 0;
    for (size_t i = 0; v->inputs && i < nin; i++)
        ckpt_array_clear(&v->inputs[i]);
    for (size_t i = 0; i < nout; i++) {
        if (v->outputs)
            ckpt_array_clear(&v->outputs[i]);
        if (v->outputs2)
            ckpt_array_clear(&v->outputs2[i]);
        if (v->refs)
            ckpt_array_clear(&v->refs[i]);
    }
    free(v->inputs);
    free(v->outputs);
    free(v->outputs2);
    free(v->refs);
    free(v->vs_ref);
    free(v->vs_against);
    for (size_t i = 0; v->gathered && i < nout; i++)
        ckpt_array_clear(&v->gathered[i]);
    free(v->gathered);
    free(v->batch_dims);
    free(v->vs_single);
    for (size_t i = 0; i < v->nrep_backends; i++)
        if (v->rep_owned[i])
            ckpt_backend_free(v->rep_backends[i]);
    ckpt_model_free(v->model);
    ckpt_model_free(v->model2);
    ckpt_backend_free(v->backend);
    ckpt_file_free(v->f);
    ckpt_file_free(v->f2);
    ckpt_file_free(v->ref);
    cli_common_free(&v->common);
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
        {"json", no_argument, NULL, OPT_JSON},
        {"replicas", required_argument, NULL, OPT_REPLICAS},
        CLI_COMMON_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    verify v = {0};
    int rc = CLI_EXIT_OK, opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        int c = cli_common_option("verify", opt, optarg, &v.common);
        if (c < 0) {
            rc = CLI_EXIT_USAGE;
            goto out;
        }
        if (c > 0)
            continue;
        switch (opt) {
        case OPT_MODEL: v.spec_path = optarg; break;
        case OPT_REFERENCE: v.ref_path = optarg; break;
        case OPT_AGAINST: v.against_path = optarg; break;
        case OPT_DEVICE: v.device = optarg; break;
        case OPT_SELECT: v.select = optarg; break;
        case OPT_JSON: v.json = 1; break;
        case OPT_REPLICAS: {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (end == optarg || *end || n < 1 || n > 64) {
                rc = cli_usage_error("verify", "--replicas needs a count from 1 to 64, got '%s'",
                                     optarg);
                goto out;
            }
            v.replicas = (int)n;
            break;
        }
        case OPT_ATOL:
            if (parse_tol("atol", optarg, &v.atol)) {
                rc = CLI_EXIT_USAGE;
                goto out;
            }
            v.atol_set = 1;
            break;
        case OPT_RTOL:
            if (parse_tol("rtol", optarg, &v.rtol)) {
                rc = CLI_EXIT_USAGE;
                goto out;
            }
            v.rtol_set = 1;
            break;
        case CLI_OPT_HELP:
            fputs(usage, stdout);
            goto out;
        default:
            rc = cli_bad_option("verify", opt, argv);
            goto out;
        }
    }
    if (!v.spec_path) {
        rc = cli_usage_error("verify", "--model SPEC is required (e.g. models/mnist_mlp.json)");
        goto out;
    }
    if (argc - optind != 1) {
        rc = cli_usage_error("verify", argc - optind < 1 ? "needs a checkpoint, CKPT"
                                                         : "expects exactly one checkpoint");
        goto out;
    }
    v.ckpt_path = argv[optind];
    if (v.device && strcmp(v.device, "auto") && strcmp(v.device, "cpu") &&
        strcmp(v.device, "cuda") && strncmp(v.device, "cuda:", 5)) {
        rc = cli_usage_error("verify", "--device: '%s' is not auto, cpu, cuda or cuda:N", v.device);
        goto out;
    }
    if ((rc = verify_run(&v)) != CLI_EXIT_OK)
        goto out;
    if (!v.common.quiet) {
        if (v.json)
            rc = print_json(&v);
        else
            print_text(&v);
        if (rc == CLI_EXIT_OK && (fflush(stdout) != 0 || ferror(stdout))) {
            cli_error("verify", NULL, "cannot write output");
            rc = CLI_EXIT_IO;
        }
    }
    if (rc == CLI_EXIT_OK && !all_pass(&v))
        rc = CLI_EXIT_DIFFERENT;
out:
    verify_free(&v);
    return rc;
}
