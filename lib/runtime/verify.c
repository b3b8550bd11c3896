/*
 * runtime/verify.c - ckpt verify's engine, beside bind: which state dict of a
 * checkpoint to load into a model (its fit to the spec), the hint and the
 * ckpt command that fixes the file when the keys differ by a wrapper prefix,
 * the run on a reference's input (or a fixed random batch), each output
 * compared with the reference's, a second checkpoint's and DataParallel's
 * replay, and the JSON document of it all (ckpt-verify(1)).  The caller opens
 * the files (runtime/ reads no format itself) and loads the model.
 */
#include "checkpoint/checkpoint.h"
#include "runtime/runtime.h"

#include "core/json.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANDOM_BATCH 4
#define MAX_REPLICAS 64

/* One checkpoint: the one verified, or the one it is compared against. */
typedef struct side {
    ckpt_model *model;
    ckpt_file *file;
    ckpt_state_dict_choice choice;
    char where[256];
    int chosen, loaded;
    ckpt_load_report load;
    ckpt_array *outputs;
} side;

struct ckpt_verify {
    int err_code;
    char err[1024];
    const char *err_path;     /* borrowed from the file the error is about */

    char *select, *device;
    double atol, rtol;
    int atol_set, rtol_set, replicas;
    int tf32;                 /* --tf32: CKPT_BACKEND_TF32, TF32's tolerance */

    side s[2];
    char hint[1024], fix[1536];

    /* the run */
    ckpt_file *ref;
    ckpt_backend *backend;
    char backend_note[256];
    ckpt_array *inputs;
    size_t ninputs;           /* the model's inputs (0 until the run) */
    char input_from[64];
    ckpt_array *refs;
    const ckpt_tensor *labels;
    size_t nout;              /* the model's outputs (0 until the run) */
    ckpt_verify_output *outs;
    int ran;

    /* the DataParallel replay */
    ckpt_backend *rep_backends[MAX_REPLICAS];
    unsigned char rep_owned[MAX_REPLICAS]; /* opened for the replay (not the main backend) */
    const char *rep_devices[MAX_REPLICAS];
    ckpt_verify_replicas rep;
    ckpt_array *gathered;
    int *batch_dims;
    char **reasons;
};

static int vfail(ckpt_verify *v, int code, const char *path, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Keep the first error of a call, with the file it is about (NULL: none). */
static int vfail(ckpt_verify *v, int code, const char *path, const char *fmt, ...)
{
    if (v->err_code != CKPT_OK)
        return v->err_code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->err, sizeof v->err, fmt, ap);
    va_end(ap);
    v->err_code = code;
    v->err_path = path;
    return code;
}

static void vclear(ckpt_verify *v)
{
    v->err_code = CKPT_OK;
    v->err[0] = '\0';
    v->err_path = NULL;
}

/* ---- comparing one output with another ------------------------------------ */

static int same_shape(const ckpt_array *a, const ckpt_array *b)
{
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

CKPT_API int ckpt_array_compare(const ckpt_array *ours, const ckpt_array *ref, double atol,
                                double rtol, unsigned flags, ckpt_output_check *c)
{
    if (!ours || !ref || !c)
        return CKPT_ERR_USAGE;
    memset(c, 0, sizeof *c);
    c->rtol = rtol;
    c->shape_ok = same_shape(ours, ref);
    if (!c->shape_ok)
        return CKPT_OK;
    int64_t n = ckpt_array_numel(ours);
    if (n && (!ours->data || !ref->data))
        return CKPT_ERR_USAGE;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref->data[i]) && fabs(ref->data[i]) > c->max_abs_reference)
            c->max_abs_reference = fabs(ref->data[i]);
    if (flags & CKPT_ATOL_SCALED)
        atol *= c->max_abs_reference;
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
    /* doc/design.md's relative error: max |ours - ref| / max |ref|, NaN when a NaN
     * met a number, infinite when the reference is all zeros */
    c->max_rel = c->max_abs == 0 ? 0
                 : isnan(c->max_abs) || c->max_abs_reference > 0 ? c->max_abs / c->max_abs_reference
                                                                 : INFINITY;
    c->pass = c->mismatched == 0;
    return CKPT_OK;
}

/* ---- choosing the state dict ------------------------------------------------ */

static const char *sd_key(const ckpt_value *sd, size_t i)
{
    const ckpt_value *k = ckpt_value_dict_key(sd, i);
    return ckpt_value_kind(k) == CKPT_KIND_STR ? ckpt_value_str(k, NULL) : NULL;
}

/* Keys of SD that are spec keys, alone or after a prefix (a wrapper's). */
static size_t spec_matches(const ckpt_model *m, const ckpt_value *sd)
{
    size_t hits = 0, n = ckpt_value_len(sd);
    for (size_t i = 0; i < n; i++) {
        const char *key = sd_key(sd, i);
        if (!key)
            continue;
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

/* The mapping to load: SELECT's, else the root when the file holds no state
 * dict, else the state dict whose keys best fit the spec (the first on a
 * tie).  SELECT is resolved without re-rooting F: the caller's file stays as
 * opened. */
static int choose(ckpt_verify *v, side *sd, const char *select)
{
    ckpt_file *f = sd->file;
    const char *file = ckpt_file_path(f);
    ckpt_state_dict_choice *c = &sd->choice;
    memset(c, 0, sizeof *c);
    c->path = sd->where;
    c->candidates = ckpt_file_state_dict_count(f);
    if (select) {
        ckpt_value *mapping;
        ckpt_path p;
        ckpt_err_clear(&f->err);
        int rc = ckpt_file_find_mapping(f, select, &mapping, &p);
        if (rc != CKPT_OK)
            return vfail(v, rc, file, "%s", ckpt_file_error_message(f));
        c->state_dict = mapping;
        c->reason = CKPT_STATE_DICT_SELECTED;
        snprintf(sd->where, sizeof sd->where, "%s", select);
    } else if (c->candidates == 0) {
        const ckpt_value *root = ckpt_file_root(f);
        if (ckpt_value_kind(root) != CKPT_KIND_DICT)
            return vfail(v, CKPT_ERR_FORMAT, file,
                         "holds no state dict (a mapping of names to tensors)");
        c->state_dict = root; /* an empty or odd mapping: the load will say what is wrong */
        c->reason = CKPT_STATE_DICT_ROOT;
        snprintf(sd->where, sizeof sd->where, "the root");
    } else {
        size_t best = 0, best_hits = 0;
        for (size_t i = 0; i < c->candidates; i++) {
            size_t hits = spec_matches(sd->model, ckpt_file_state_dict(f, i, NULL));
            if (hits > best_hits) {
                best_hits = hits;
                best = i;
            }
        }
        ckpt_path p;
        c->state_dict = ckpt_file_state_dict(f, best, &p);
        c->reason = best_hits ? CKPT_STATE_DICT_BEST_FIT : CKPT_STATE_DICT_FIRST;
        if (p.len == 0)
            snprintf(sd->where, sizeof sd->where, "the root");
        else if (ckpt_path_format(&p, sd->where, sizeof sd->where) >= sizeof sd->where)
            sd->where[sizeof sd->where - 1] = '\0';
    }
    c->spec_keys = spec_matches(sd->model, c->state_dict);
    sd->chosen = 1;
    return CKPT_OK;
}

/* ---- the hint: a wrapper prefix in the way ---------------------------------- */

/* 1 when the keys of SD, with PREFIX removed (strip; as often as it repeats
 * with REPEAT) or added (!strip), are exactly the spec's keys. */
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

/* 1 when the unwrap rules (module., _orig_mod., ...) turn SD's keys into the spec's. */
static int unwrap_fits(const ckpt_model *m, const ckpt_value *sd)
{
    size_t n = ckpt_value_len(sd);
    int fit = n == ckpt_model_param_count(m);
    for (size_t i = 0; fit && i < n; i++) {
        const char *k = sd_key(sd, i);
        char *u = k ? ckpt_key_unwrap(k) : NULL;
        int found = 0;
        for (size_t p = 0; u && p < n && !found; p++)
            found = strcmp(u, ckpt_model_param_key(m, p)) == 0;
        fit = found;
        free(u);
    }
    return fit;
}

/* The fixed file's name: IN's stem, SUFFIX, ".pth" (beside IN). */
static void out_name(const char *in, const char *suffix, char *buf, size_t cap)
{
    const char *slash = strrchr(in, '/');
    const char *dot = strrchr(in, '.');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - in) : strlen(in);
    snprintf(buf, cap, "%.*s%s.pth", (int)stem, in, suffix);
}

/* " --map-location M..." when F's storages need devices this machine lacks
 * (the fix must give a file that loads here), else "". */
static void map_here(const ckpt_file *f, char *buf, size_t cap)
{
    char tags[256] = "";
    for (size_t i = 0; i < ckpt_file_storage_count(f); i++) {
        const char *d = ckpt_storage_device(ckpt_file_storage(f, i));
        char seen[80];
        snprintf(seen, sizeof seen, ", %s,", d ? d : "");
        char have[260];
        snprintf(have, sizeof have, ", %s,", tags);
        if (!d || strstr(have, seen) || strlen(tags) + strlen(d) + 3 >= sizeof tags)
            continue;
        snprintf(tags + strlen(tags), sizeof tags - strlen(tags), "%s%s", tags[0] ? ", " : "", d);
    }
    ckpt_device_remap_here(tags, "--map-location", "--map-location", buf, cap);
}

/* When the keys differ by a wrapper prefix, say so and give the command. */
static void make_hint(ckpt_verify *v)
{
    const side *s = &v->s[CKPT_VERIFY_CHECKPOINT];
    const ckpt_model *m = s->model;
    const ckpt_value *sd = s->choice.state_dict;
    const char *path = ckpt_file_path(s->file);
    char out[512], sel[300] = "", ml[160];
    map_here(s->file, ml, sizeof ml);
    if (v->select)
        snprintf(sel, sizeof sel, "--select '%s' ", v->select);
    else if (strcmp(s->where, "the root") != 0)
        snprintf(sel, sizeof sel, "--select '%s' ", s->where);
    const char *k0 = ckpt_value_len(sd) ? sd_key(sd, 0) : NULL;
    if (!k0)
        return;

    /* every key carries a prefix: find it from the first key */
    size_t kl = strlen(k0);
    for (size_t p = 0; p < ckpt_model_param_count(m); p++) {
        const char *sk = ckpt_model_param_key(m, p);
        size_t sl = strlen(sk);
        if (!(kl > sl && strcmp(k0 + kl - sl, sk) == 0 && k0[kl - sl - 1] == '.'))
            continue;
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(kl - sl), k0);
        int only_module = 1;
        for (size_t i = 0; i < kl - sl; i += 7)
            only_module &= strncmp(prefix + i, "module.", 7) == 0;
        if (only_module && keys_fit(m, sd, "module.", 1, 1)) {
            out_name(path, "_stripped", out, sizeof out);
            snprintf(v->hint, sizeof v->hint,
                     "every key carries the \"%s\" prefix of DataParallel/"
                     "DistributedDataParallel (the wrapper was saved, not the model)", prefix);
            snprintf(v->fix, sizeof v->fix, "ckpt strip-module%s %s%s %s", ml, sel, path, out);
            return;
        }
        if (unwrap_fits(m, sd))
            break; /* a known wrapper, said below */
        if (keys_fit(m, sd, prefix, 1, 0)) {
            out_name(path, "_stripped", out, sizeof out);
            snprintf(v->hint, sizeof v->hint, "every key carries the prefix \"%s\"", prefix);
            snprintf(v->fix, sizeof v->fix, "ckpt strip-module%s %s--prefix '%s' %s %s", ml,
                     sel, prefix, path, out);
            return;
        }
        break;
    }
    if (unwrap_fits(m, sd)) {
        out_name(path, "_unwrapped", out, sizeof out);
        snprintf(v->hint, sizeof v->hint,
                 "the keys carry wrapper components (module. of DataParallel, _orig_mod. of "
                 "torch.compile, _fsdp_wrapped_module. of FSDP, ...)");
        snprintf(v->fix, sizeof v->fix, "ckpt unwrap%s %s%s %s", ml, sel, path, out);
        return;
    }
    /* the model wants a prefix the checkpoint lacks */
    const char *s0 = ckpt_model_param_key(m, 0);
    size_t sl = s0 ? strlen(s0) : 0;
    for (size_t i = 0; s0 && i < ckpt_value_len(sd); i++) {
        const char *k = sd_key(sd, i);
        kl = k ? strlen(k) : 0;
        if (!(k && sl > kl && strcmp(s0 + sl - kl, k) == 0 && s0[sl - kl - 1] == '.'))
            continue;
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(sl - kl), s0);
        if (keys_fit(m, sd, prefix, 0, 0)) {
            int module = strcmp(prefix, "module.") == 0;
            out_name(path, "_wrapped", out, sizeof out);
            snprintf(v->hint, sizeof v->hint, "the model expects every key under \"%s\"%s",
                     prefix, module ? " (a DataParallel/DistributedDataParallel model)" : "");
            if (module)
                snprintf(v->fix, sizeof v->fix, "ckpt add-module%s %s%s %s", ml, sel, path, out);
            else
                snprintf(v->fix, sizeof v->fix, "ckpt add-module%s %s--prefix '%s' %s %s", ml,
                         sel, prefix, path, out);
        }
        return;
    }
}

/* ---- the handle --------------------------------------------------------------- */

CKPT_API ckpt_verify *ckpt_verify_new(void)
{
    return calloc(1, sizeof(ckpt_verify));
}

/* Forget the run (inputs, outputs, checks, the replay, the backend). */
static void clear_run(ckpt_verify *v)
{
    for (size_t i = 0; v->inputs && i < v->ninputs; i++)
        ckpt_array_clear(&v->inputs[i]);
    for (size_t i = 0; i < v->nout; i++) {
        for (int k = 0; k < 2; k++)
            if (v->s[k].outputs)
                ckpt_array_clear(&v->s[k].outputs[i]);
        if (v->refs)
            ckpt_array_clear(&v->refs[i]);
        if (v->gathered)
            ckpt_array_clear(&v->gathered[i]);
        if (v->reasons)
            free(v->reasons[i]);
    }
    for (int k = 0; k < 2; k++) {
        free(v->s[k].outputs);
        v->s[k].outputs = NULL;
    }
    free(v->inputs);
    free(v->refs);
    free(v->outs);
    free(v->gathered);
    free(v->batch_dims);
    free(v->reasons);
    for (size_t i = 0; i < v->rep.device_count; i++)
        if (v->rep_owned[i])
            ckpt_backend_free(v->rep_backends[i]);
    ckpt_backend_free(v->backend);
    v->inputs = v->refs = v->gathered = NULL;
    v->outs = NULL;
    v->batch_dims = NULL;
    v->reasons = NULL;
    v->backend = NULL;
    v->backend_note[0] = v->input_from[0] = '\0';
    v->ninputs = v->nout = 0;
    v->labels = NULL;
    v->ref = NULL;
    v->ran = 0;
    memset(v->rep_owned, 0, sizeof v->rep_owned);
    memset(&v->rep, 0, sizeof v->rep);
}

CKPT_API void ckpt_verify_free(ckpt_verify *v)
{
    if (!v)
        return;
    clear_run(v);
    free(v->select);
    free(v->device);
    free(v);
}

CKPT_API int ckpt_verify_error_code(const ckpt_verify *v)
{
    return v ? v->err_code : CKPT_ERR_USAGE;
}

CKPT_API const char *ckpt_verify_error_message(const ckpt_verify *v) { return v ? v->err : ""; }
CKPT_API const char *ckpt_verify_error_path(const ckpt_verify *v) { return v ? v->err_path : NULL; }

static int set_string(ckpt_verify *v, char **slot, const char *s)
{
    char *copy = NULL;
    if (s && !(copy = strdup(s)))
        return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
    free(*slot);
    *slot = copy;
    return CKPT_OK;
}

CKPT_API int ckpt_verify_set_select(ckpt_verify *v, const char *path)
{
    if (!v)
        return CKPT_ERR_USAGE;
    vclear(v);
    return set_string(v, &v->select, path);
}

CKPT_API int ckpt_verify_set_device(ckpt_verify *v, const char *device)
{
    if (!v)
        return CKPT_ERR_USAGE;
    vclear(v);
    return set_string(v, &v->device, device);
}

static int set_tol(ckpt_verify *v, double x, double *slot, int *set, const char *name)
{
    if (!v)
        return CKPT_ERR_USAGE;
    vclear(v);
    if (!isfinite(x) || x < 0)
        return vfail(v, CKPT_ERR_USAGE, NULL, "%s needs a finite number >= 0", name);
    *slot = x;
    *set = 1;
    return CKPT_OK;
}

CKPT_API int ckpt_verify_set_atol(ckpt_verify *v, double atol)
{
    return set_tol(v, atol, v ? &v->atol : NULL, v ? &v->atol_set : NULL, "atol");
}

CKPT_API int ckpt_verify_set_rtol(ckpt_verify *v, double rtol)
{
    return set_tol(v, rtol, v ? &v->rtol : NULL, v ? &v->rtol_set : NULL, "rtol");
}

CKPT_API int ckpt_verify_set_replicas(ckpt_verify *v, int n)
{
    if (!v)
        return CKPT_ERR_USAGE;
    vclear(v);
    if (n < 0 || n > MAX_REPLICAS)
        return vfail(v, CKPT_ERR_USAGE, NULL, "replicas: a count from 1 to %d (0: none), got %d",
                     MAX_REPLICAS, n);
    v->replicas = n;
    return CKPT_OK;
}

CKPT_API int ckpt_verify_set_tf32(ckpt_verify *v, int on)
{
    if (!v)
        return CKPT_ERR_USAGE;
    vclear(v);
    v->tf32 = on != 0;
    return CKPT_OK;
}

/* Start side K over with model M and file F. */
static int side_reset(ckpt_verify *v, int k, ckpt_model *m, ckpt_file *f)
{
    vclear(v);
    if (!m || !f || !ckpt_file_root(f))
        return vfail(v, CKPT_ERR_USAGE, NULL, "a loaded model and an open checkpoint are needed");
    if (k == CKPT_VERIFY_AGAINST &&
        (!v->s[0].chosen || ckpt_model_input_count(m) != ckpt_model_input_count(v->s[0].model) ||
         ckpt_model_output_count(m) != ckpt_model_output_count(v->s[0].model)))
        return vfail(v, CKPT_ERR_USAGE, NULL,
                     "the checkpoint compared against is loaded after the one verified, into a "
                     "model of the same spec");
    clear_run(v);
    side *s = &v->s[k];
    memset(s, 0, sizeof *s);
    s->model = m;
    s->file = f;
    if (k == CKPT_VERIFY_CHECKPOINT) {
        v->hint[0] = v->fix[0] = '\0';
        memset(&v->s[CKPT_VERIFY_AGAINST], 0, sizeof(side)); /* it followed this one */
    }
    return CKPT_OK;
}

CKPT_API int ckpt_verify_choose(ckpt_verify *v, ckpt_model *m, ckpt_file *f)
{
    if (!v)
        return CKPT_ERR_USAGE;
    int rc = side_reset(v, CKPT_VERIFY_CHECKPOINT, m, f);
    return rc != CKPT_OK ? rc : choose(v, &v->s[CKPT_VERIFY_CHECKPOINT], v->select);
}

static int load_side(ckpt_verify *v, int k, ckpt_model *m, ckpt_file *f)
{
    int rc = side_reset(v, k, m, f);
    side *s = &v->s[k];
    /* --select names the state dict of the checkpoint verified only */
    if (rc != CKPT_OK ||
        (rc = choose(v, s, k == CKPT_VERIFY_CHECKPOINT ? v->select : NULL)) != CKPT_OK)
        return rc;
    rc = ckpt_model_bind(m, f, s->choice.state_dict, &s->load);
    if (rc != CKPT_OK)
        return vfail(v, rc, ckpt_file_path(f), "%s", ckpt_model_error_message(m));
    s->loaded = 1;
    return CKPT_OK;
}

CKPT_API int ckpt_verify_load(ckpt_verify *v, ckpt_model *m, ckpt_file *f)
{
    if (!v)
        return CKPT_ERR_USAGE;
    int rc = load_side(v, CKPT_VERIFY_CHECKPOINT, m, f);
    const ckpt_load_report *r = &v->s[CKPT_VERIFY_CHECKPOINT].load;
    if (rc == CKPT_OK && !r->ok && (r->missing_count || r->unexpected_count))
        make_hint(v); /* a prefix can only explain keys that differ */
    return rc;
}

CKPT_API int ckpt_verify_load_against(ckpt_verify *v, ckpt_model *m, ckpt_file *f)
{
    return v ? load_side(v, CKPT_VERIFY_AGAINST, m, f) : CKPT_ERR_USAGE;
}

/* ---- inputs ------------------------------------------------------------------ */

static int is_integer(ckpt_dtype dt)
{
    return dt == CKPT_DTYPE_INT64 || dt == CKPT_DTYPE_INT32 || dt == CKPT_DTYPE_INT16 ||
           dt == CKPT_DTYPE_INT8 || dt == CKPT_DTYPE_UINT8 || dt == CKPT_DTYPE_UINT16 ||
           dt == CKPT_DTYPE_UINT32 || dt == CKPT_DTYPE_UINT64;
}

/* Tensor NAME of the reference file as a float32 array: CKPT_OK, 1 when it
 * is absent and not REQUIRED, or an error.  IDS: the model's input is an
 * integer one (token ids): the tensor must hold integers in [0, 2^24),
 * which float32 carries exactly. */
static int ref_array(ckpt_verify *v, const char *name, ckpt_array *out, int required, int ids)
{
    const char *file = ckpt_file_path(v->ref);
    const ckpt_value *root = ckpt_file_root(v->ref);
    const ckpt_value *val = ckpt_value_kind(root) == CKPT_KIND_DICT
                                ? ckpt_value_dict_get(root, name) : NULL;
    const ckpt_tensor *t = val ? ckpt_value_tensor(val) : NULL;
    if (!t) {
        if (!required)
            return 1;
        return vfail(v, CKPT_ERR_FORMAT, file, "has no tensor '%s' (a reference holds 'input' "
                     "and 'output.<name>' for every output of the model)", name);
    }
    ckpt_dtype dt = ckpt_tensor_dtype(t);
    if (ids && (!is_integer(dt) || ckpt_tensor_ndim(t) > CKPT_MAX_DIMS))
        return vfail(v, CKPT_ERR_FORMAT, file, "'%s' is a %s tensor of %d dimensions; the model "
                     "takes integer ids there (int64, as torch's embedding does)", name,
                     ckpt_dtype_name(dt), ckpt_tensor_ndim(t));
    if (!ids && (!ckpt_dtype_is_floating(dt) || ckpt_tensor_ndim(t) > CKPT_MAX_DIMS))
        return vfail(v, CKPT_ERR_FORMAT, file, "'%s' is a %s tensor of %d dimensions; a reference "
                     "holds floating-point tensors", name, ckpt_dtype_name(dt),
                     ckpt_tensor_ndim(t));
    int64_t numel = ckpt_tensor_numel(t);
    float *data = malloc(numel ? (size_t)numel * sizeof(float) : sizeof(float));
    if (!data)
        return vfail(v, CKPT_ERR_NOMEM, file, "out of memory");
    int rc = ckpt_tensor_read_float32(v->ref, t, data, (size_t)numel);
    if (rc != CKPT_OK) {
        free(data);
        return vfail(v, rc, file, "%s", ckpt_file_error_message(v->ref));
    }
    /* every id >= 2^24 rounds to 2^24 or above: the check after the
     * conversion sees them all */
    for (int64_t i = 0; ids && i < numel; i++)
        if (!(data[i] >= 0 && (double)data[i] < (double)RT_MAX_ID)) {
            double bad = data[i];
            free(data);
            return vfail(v, CKPT_ERR_FORMAT, file, "'%s' holds the id %s%.0f; the runtime "
                         "carries ids from 0 to 2^24 - 1 (16777215) exactly", name,
                         bad >= (double)RT_MAX_ID ? "at least " : "", bad);
        }
    out->ndim = ckpt_tensor_ndim(t);
    memcpy(out->shape, ckpt_tensor_shape(t), sizeof(int64_t) * (size_t)out->ndim);
    out->data = data;
    return CKPT_OK;
}

/* The reference's inputs, or a fixed pseudo-random batch in [0, 1) (token
 * ids: integers in [0, high), rt_input_high). */
static int make_inputs(ckpt_verify *v, const ckpt_model *m)
{
    size_t n = ckpt_model_input_count(m);
    if (!(v->inputs = calloc(n ? n : 1, sizeof *v->inputs)))
        return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
    v->ninputs = n;
    if (v->ref) {
        for (size_t i = 0; i < n; i++) {
            char name[300];
            snprintf(name, sizeof name, "input.%s", ckpt_model_input_name(m, i));
            int rc = 1, ids = m->input_int[i];
            if (n == 1)
                rc = ref_array(v, "input", &v->inputs[i], 0, ids);
            if (rc == 1)
                rc = ref_array(v, name, &v->inputs[i], 1, ids);
            if (rc != CKPT_OK)
                return rc;
        }
        snprintf(v->input_from, sizeof v->input_from, "reference");
        return CKPT_OK;
    }
    int batch = v->replicas ? 2 * v->replicas : RANDOM_BATCH;
    uint64_t state = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < n; i++) {
        ckpt_array *a = &v->inputs[i];
        /* token ids: drawn from [0, high) */
        int64_t high = m->input_int[i] ? rt_input_high(m, i) : 0;
        if (m->input_int[i] && !high)
            return vfail(v, CKPT_ERR_FORMAT, m->path, "input \"%s\" takes integer ids and no "
                         "embedding reads it: give it \"high\" in the spec (ids are drawn "
                         "from [0, high)) or a reference file", ckpt_model_input_name(m, i));
        a->ndim = ckpt_model_input_shape(m, i, a->shape);
        int64_t count = 1;
        for (int d = 0; d < a->ndim; d++) {
            if (a->shape[d] == -1)
                a->shape[d] = batch;
            count *= a->shape[d];
        }
        if (!(a->data = malloc((size_t)count * sizeof(float))))
            return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
        for (int64_t k = 0; k < count; k++) { /* xorshift64: the same on every machine */
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            a->data[k] = high ? (float)((state >> 11) % (uint64_t)high)
                              : (float)(state >> 40) / 16777216.0f;
        }
    }
    snprintf(v->input_from, sizeof v->input_from, "random (seed fixed, batch %d)", batch);
    return CKPT_OK;
}

/* ---- the run ------------------------------------------------------------------ */

static int run_side(ckpt_verify *v, side *s)
{
    if (!(s->outputs = calloc(v->nout, sizeof *s->outputs)))
        return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
    int st = ckpt_model_run(s->model, v->backend, v->inputs, s->outputs);
    if (st != CKPT_OK) /* an input that does not fit the model is a bad reference */
        return vfail(v, st == CKPT_ERR_USAGE ? CKPT_ERR_FORMAT : st,
                     ckpt_file_path(st == CKPT_ERR_USAGE && v->ref ? v->ref : s->file), "%s",
                     ckpt_model_error_message(s->model));
    return CKPT_OK;
}

/* Top-1 accuracy of class scores [B, C] against the reference's int64
 * labels [B], when the scores are for these labels (C = the largest + 1). */
static void accuracy(ckpt_verify *v, ckpt_verify_output *o)
{
    const ckpt_array *ours = o->value, *ref = o->reference;
    if (!v->labels || ours->ndim != 2 || ours->shape[1] < 2)
        return;
    int64_t b = ours->shape[0], k = ours->shape[1];
    if (ckpt_tensor_numel(v->labels) != b || ckpt_tensor_dtype(v->labels) != CKPT_DTYPE_INT64)
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
            if (ref->data[i * k + j] > ref->data[i * k + ar])
                ar = j;
        }
        o->correct += am == lab[i];
        o->reference_correct += ar == lab[i];
    }
    free(lab);
    o->has_accuracy = 1;
    o->labels = b;
}

static void shape_text(const ckpt_array *a, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < a->ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

/* Why output I does not survive DataParallel's gather, in a user's words. */
static void replica_reason(const ckpt_verify *v, size_t i, char *buf, size_t cap)
{
    const ckpt_array *one = &v->s[0].outputs[i], *g = &v->gathered[i];
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
                 "or slice one copy", v->rep.used, (shape_text(g, gb, sizeof gb), gb), sb);
    else if (d > 0)
        snprintf(buf, cap, "its batch dimension is dim %d, not 0 (a permute inside forward), so "
                 "gather concatenates along the wrong one (%s instead of %s); keep the batch "
                 "first until after the wrapper", d, (shape_text(g, gb, sizeof gb), gb), sb);
    else if (!v->outs[i].vs_single.shape_ok)
        snprintf(buf, cap, "the gathered shape %s is not %s",
                 (shape_text(g, gb, sizeof gb), gb), sb);
    else
        snprintf(buf, cap, "the values differ (max abs %.3g): the output mixes samples of the "
                 "batch, which DataParallel splits", v->outs[i].vs_single.max_abs);
}

/* DataParallel's replay: one backend per GPU when there are enough (cuda:0 ..
 * cuda:N-1, as its device_ids default), else every chunk in turn on the
 * device in use. */
static int run_replicas(ckpt_verify *v, double atol, double rtol)
{
    ckpt_model *m = v->s[0].model;
    const char *dev = ckpt_backend_device(v->backend);
    const char *blame = ckpt_file_path(v->ref ? v->ref : v->s[0].file);
    v->rep.requested = v->replicas;
    v->rep.devices = v->rep_devices;
    v->rep_backends[0] = v->backend;
    v->rep.device_count = 1;
    if (strncmp(dev, "cuda", 4) == 0 && ckpt_cuda_device_count_usable() >= v->replicas) {
        int mine = atoi(dev + 5);
        v->rep.device_count = 0;
        for (int i = 0; i < v->replicas; i++) {
            char name[32], err[256];
            if (i == mine) {
                v->rep_backends[v->rep.device_count++] = v->backend;
                continue;
            }
            snprintf(name, sizeof name, "cuda:%d", i);
            ckpt_backend *b;
            int st = ckpt_backend_open_flags(name, v->tf32 ? CKPT_BACKEND_TF32 : 0, &b, err,
                                             sizeof err);
            if (st != CKPT_OK)
                return vfail(v, st == CKPT_ERR_NOMEM ? st : CKPT_ERR_DEVICE, NULL,
                             "--replicas: %s: %s", name, err);
            v->rep_owned[v->rep.device_count] = 1;
            v->rep_backends[v->rep.device_count++] = b;
        }
    }
    for (size_t i = 0; i < v->rep.device_count; i++)
        v->rep_devices[i] = ckpt_backend_device(v->rep_backends[i]);
    v->rep.batch = v->ninputs && v->inputs[0].ndim ? v->inputs[0].shape[0] : 0;
    if (v->rep.batch < 2) /* nothing would be split: a pass here would prove nothing */
        return vfail(v, CKPT_ERR_USAGE, v->ref ? ckpt_file_path(v->ref) : NULL,
                     "--replicas %d needs a batch of at least 2 to split, and the input's is "
                     "%lld (give a reference with a bigger batch, or none: a random batch of %d "
                     "is used then)", v->replicas, (long long)v->rep.batch, 2 * v->replicas);
    if (!(v->gathered = calloc(v->nout, sizeof *v->gathered)) ||
        !(v->batch_dims = calloc(v->nout, sizeof *v->batch_dims)) ||
        !(v->reasons = calloc(v->nout, sizeof *v->reasons)))
        return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
    int st = ckpt_model_batch_dims(m, v->inputs, v->batch_dims);
    if (st == CKPT_OK)
        st = ckpt_model_run_replicas(m, v->rep_backends, v->rep.device_count, v->replicas,
                                     v->inputs, v->gathered, &v->rep.used);
    if (st != CKPT_OK)
        return vfail(v, st == CKPT_ERR_USAGE ? CKPT_ERR_FORMAT : st, blame, "--replicas: %s",
                     ckpt_model_error_message(m));
    for (size_t i = 0; i < v->nout; i++) {
        ckpt_verify_output *o = &v->outs[i];
        o->batch_dim = v->batch_dims[i];
        if (v->gathered[i].data) {
            o->gathered = &v->gathered[i];
            ckpt_array_compare(o->gathered, o->value, atol, rtol,
                               v->atol_set ? 0 : CKPT_ATOL_SCALED, &o->vs_single);
        }
        if (!o->vs_single.pass) {
            char why[512];
            replica_reason(v, i, why, sizeof why);
            if (!(v->reasons[i] = strdup(why)))
                return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
            o->replica_reason = v->reasons[i];
        }
    }
    return CKPT_OK;
}

static int loads_ok(const ckpt_verify *v)
{
    return v->s[0].loaded && v->s[0].load.ok && (!v->s[1].loaded || v->s[1].load.ok);
}

CKPT_API int ckpt_verify_run(ckpt_verify *v, ckpt_file *reference)
{
    if (!v)
        return CKPT_ERR_USAGE;
    vclear(v);
    if (!v->s[0].loaded)
        return vfail(v, CKPT_ERR_USAGE, NULL, "no checkpoint loaded (ckpt_verify_load)");
    if (reference && !ckpt_file_root(reference))
        return vfail(v, CKPT_ERR_USAGE, NULL, "the reference is not an open file");
    clear_run(v);
    v->ref = reference;
    if (!loads_ok(v))
        return CKPT_OK; /* nothing runs: the result is FAIL */

    ckpt_model *m = v->s[0].model;
    const char *device = v->device ? v->device : "auto";
    int st = ckpt_backend_open_flags(device, v->tf32 ? CKPT_BACKEND_TF32 : 0, &v->backend,
                                     v->backend_note, sizeof v->backend_note);
    if (st != CKPT_OK) {
        v->backend = NULL;
        return vfail(v, st, NULL, "--device %s: %s", device, v->backend_note);
    }
    int rc = make_inputs(v, m);
    if (rc != CKPT_OK)
        return rc;
    size_t nout = ckpt_model_output_count(m);
    if (!(v->outs = calloc(nout, sizeof *v->outs)))
        return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
    v->nout = nout;
    if (v->ref) {
        if (!(v->refs = calloc(nout, sizeof *v->refs)))
            return vfail(v, CKPT_ERR_NOMEM, NULL, "out of memory");
        for (size_t i = 0; i < nout; i++) {
            char name[300];
            snprintf(name, sizeof name, "output.%s", ckpt_model_output_name(m, i));
            if ((rc = ref_array(v, name, &v->refs[i], 1, 0)) != CKPT_OK)
                return rc;
        }
        const ckpt_value *lv = ckpt_value_dict_get(ckpt_file_root(v->ref), "labels");
        v->labels = lv ? ckpt_value_tensor(lv) : NULL;
    }
    for (int k = 0; k < 2; k++)
        if (v->s[k].loaded && (rc = run_side(v, &v->s[k])) != CKPT_OK)
            return rc;

    /* TF32 rounds each product's inputs to a 10-bit mantissa (2^-11, about
     * 5e-4 relative): over a layer's sums and a network's depth torch's
     * results move by about 1e-3 of their scale, so TF32's default is 1e-2
     * relative and 1e-3 of the largest |ref|; it is applied on the CPU too,
     * where --tf32 changes nothing else, so that a run compares alike on
     * either device. */
    int cuda = strncmp(ckpt_backend_device(v->backend), "cuda", 4) == 0;
    double rtol = v->rtol_set ? v->rtol : v->tf32 ? 1e-2 : cuda ? 1e-4 : 1e-5;
    double atol = v->atol_set ? v->atol : v->tf32 ? 1e-3 : 1e-5;
    for (size_t i = 0; i < nout; i++) {
        ckpt_verify_output *o = &v->outs[i];
        o->name = ckpt_model_output_name(m, i);
        o->value = &v->s[0].outputs[i];
        o->batch_dim = -1;
        if (v->ref) {
            o->reference = &v->refs[i];
            ckpt_array_compare(o->value, o->reference, atol, rtol,
                               v->atol_set ? 0 : CKPT_ATOL_SCALED, &o->vs_reference);
            accuracy(v, o);
        }
    }
    if (v->replicas && (rc = run_replicas(v, atol, rtol)) != CKPT_OK)
        return rc;
    for (size_t i = 0; v->s[1].loaded && i < nout; i++) {
        /* CHECKPOINT2 against CHECKPOINT: bitwise unless tolerances were given */
        ckpt_verify_output *o = &v->outs[i];
        o->against = &v->s[1].outputs[i];
        ckpt_array_compare(o->against, o->value, v->atol_set ? v->atol : 0,
                           v->rtol_set ? v->rtol : 0, 0, &o->vs_against);
    }
    v->ran = 1;
    return CKPT_OK;
}

/* ---- accessors ------------------------------------------------------------------ */

static const side *side_at(const ckpt_verify *v, ckpt_verify_side k)
{
    return v && (k == CKPT_VERIFY_CHECKPOINT || k == CKPT_VERIFY_AGAINST) ? &v->s[k] : NULL;
}

CKPT_API const ckpt_state_dict_choice *ckpt_verify_choice(const ckpt_verify *v,
                                                          ckpt_verify_side k)
{
    const side *s = side_at(v, k);
    return s && s->chosen ? &s->choice : NULL;
}

CKPT_API const ckpt_load_report *ckpt_verify_load_report(const ckpt_verify *v, ckpt_verify_side k)
{
    const side *s = side_at(v, k);
    return s && s->loaded ? &s->load : NULL;
}

CKPT_API const char *ckpt_verify_hint(const ckpt_verify *v)
{
    return v && v->hint[0] ? v->hint : NULL;
}

CKPT_API const char *ckpt_verify_fix(const ckpt_verify *v)
{
    return v && v->fix[0] ? v->fix : NULL;
}

CKPT_API int ckpt_verify_ran(const ckpt_verify *v) { return v && v->ran; }

const char *rt_verify_loaded(const ckpt_verify *v, ckpt_verify_side which)
{
    const side *s = &v->s[which == CKPT_VERIFY_AGAINST];
    return s->loaded && s->file ? ckpt_file_path(s->file) : NULL;
}

int rt_verify_fail(ckpt_verify *v, int code, const char *path, const char *msg)
{
    return vfail(v, code, path, "%s", msg);
}

CKPT_API const ckpt_backend *ckpt_verify_backend(const ckpt_verify *v)
{
    return v && v->ran ? v->backend : NULL;
}

CKPT_API const char *ckpt_verify_device_note(const ckpt_verify *v)
{
    return v && v->ran ? v->backend_note : "";
}

CKPT_API int ckpt_verify_tf32(const ckpt_verify *v)
{
    return v ? v->tf32 : 0;
}

CKPT_API const char *ckpt_verify_tf32_note(const ckpt_verify *v)
{
    if (!v || !v->ran || !v->tf32 || (ckpt_backend_flags(v->backend) & CKPT_BACKEND_TF32))
        return "";
    return "the CPU backend computes in FP32 whatever --tf32 says; only the tolerance widens";
}

CKPT_API const ckpt_array *ckpt_verify_input(const ckpt_verify *v, size_t i)
{
    return v && v->ran && i < v->ninputs ? &v->inputs[i] : NULL;
}

CKPT_API const char *ckpt_verify_input_from(const ckpt_verify *v)
{
    return v && v->ran ? v->input_from : "";
}

CKPT_API size_t ckpt_verify_output_count(const ckpt_verify *v)
{
    return v && v->ran ? v->nout : 0;
}

CKPT_API const ckpt_verify_output *ckpt_verify_output_at(const ckpt_verify *v, size_t i)
{
    return i < ckpt_verify_output_count(v) ? &v->outs[i] : NULL;
}

CKPT_API const ckpt_verify_replicas *ckpt_verify_replica_info(const ckpt_verify *v)
{
    return v && v->ran && v->replicas ? &v->rep : NULL;
}

CKPT_API int ckpt_verify_passed(const ckpt_verify *v)
{
    if (!v || !loads_ok(v))
        return 0;
    for (size_t i = 0; v->ran && i < v->nout; i++) {
        const ckpt_verify_output *o = &v->outs[i];
        if ((o->reference && !o->vs_reference.pass) || (o->against && !o->vs_against.pass) ||
            (v->replicas && !o->vs_single.pass))
            return 0;
    }
    return 1;
}

/* ---- the JSON document (ckpt-verify(1), JSON OUTPUT) --------------------------- */

/* Exact integers and numbers of 9 significant digits (core/json.h). */
static cJSON *json_num(double d) { return ckpt_json_real(d, 9, false); }

static cJSON *json_load(const side *s)
{
    const ckpt_load_report *r = &s->load;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", ckpt_file_path(s->file));
    cJSON_AddStringToObject(o, "state_dict", s->where);
    cJSON_AddBoolToObject(o, "ok", r->ok);
    cJSON *miss = cJSON_AddArrayToObject(o, "missing");
    for (size_t i = 0; i < r->missing_count; i++)
        cJSON_AddItemToArray(miss, cJSON_CreateString(r->missing[i]));
    cJSON *unexp = cJSON_AddArrayToObject(o, "unexpected");
    for (size_t i = 0; i < r->unexpected_count; i++)
        cJSON_AddItemToArray(unexp, cJSON_CreateString(r->unexpected[i]));
    cJSON *mm = cJSON_AddArrayToObject(o, "size_mismatch");
    for (size_t i = 0; i < r->mismatch_count; i++) {
        const ckpt_size_mismatch *x = &r->mismatches[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "key", x->key);
        cJSON_AddItemToObject(e, "checkpoint", ckpt_json_dims(x->ckpt_shape, x->ckpt_ndim));
        cJSON_AddItemToObject(e, "model", ckpt_json_dims(x->model_shape, x->model_ndim));
        cJSON_AddItemToArray(mm, e);
    }
    cJSON *bad = cJSON_AddArrayToObject(o, "bad_type");
    for (size_t i = 0; i < r->bad_dtype_count; i++)
        cJSON_AddItemToArray(bad, cJSON_CreateString(r->bad_dtype[i]));
    cJSON_AddStringToObject(o, "message", r->message ? r->message : "");
    cJSON *tied = cJSON_AddObjectToObject(o, "tied_in");
    for (size_t i = 0; s->model && i < ckpt_model_param_count(s->model); i++)
        if (ckpt_model_param_tied_in(s->model, i))
            cJSON_AddStringToObject(tied, ckpt_model_param_key(s->model, i),
                                    ckpt_model_param_tie(s->model, i));
    return o;
}

static cJSON *json_check(const ckpt_output_check *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "shape_ok", c->shape_ok);
    cJSON_AddItemToObject(o, "max_abs", json_num(c->max_abs));
    cJSON_AddItemToObject(o, "max_rel", json_num(c->max_rel));
    cJSON_AddItemToObject(o, "max_abs_reference", json_num(c->max_abs_reference));
    cJSON_AddItemToObject(o, "atol", json_num(c->atol));
    cJSON_AddItemToObject(o, "rtol", json_num(c->rtol));
    cJSON_AddItemToObject(o, "mismatched", ckpt_json_int(c->mismatched));
    cJSON_AddBoolToObject(o, "pass", c->pass);
    return o;
}

static void json_outputs(const ckpt_verify *v, cJSON *root)
{
    cJSON *outs = cJSON_AddArrayToObject(root, "outputs");
    for (size_t i = 0; i < v->nout; i++) {
        const ckpt_verify_output *x = &v->outs[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", x->name);
        cJSON_AddItemToObject(o, "shape", ckpt_json_dims(x->value->shape, x->value->ndim));
        if (x->reference) {
            cJSON_AddItemToObject(o, "reference", json_check(&x->vs_reference));
            if (x->has_accuracy) {
                cJSON_AddItemToObject(o, "accuracy",
                                      json_num((double)x->correct / (double)x->labels));
                cJSON_AddItemToObject(o, "reference_accuracy",
                                      json_num((double)x->reference_correct / (double)x->labels));
            }
        }
        if (x->against)
            cJSON_AddItemToObject(o, "against", json_check(&x->vs_against));
        cJSON_AddItemToArray(outs, o);
    }
}

static void json_replicas(const ckpt_verify *v, cJSON *root)
{
    cJSON *rep = cJSON_AddObjectToObject(root, "replicas");
    cJSON_AddItemToObject(rep, "requested", ckpt_json_int(v->rep.requested));
    cJSON_AddItemToObject(rep, "used", ckpt_json_int(v->rep.used));
    cJSON_AddItemToObject(rep, "batch", ckpt_json_int(v->rep.batch));
    cJSON *devs = cJSON_AddArrayToObject(rep, "devices");
    for (size_t i = 0; i < v->rep.device_count; i++)
        cJSON_AddItemToArray(devs, cJSON_CreateString(v->rep.devices[i]));
    cJSON *outs = cJSON_AddArrayToObject(rep, "outputs");
    for (size_t i = 0; i < v->nout; i++) {
        const ckpt_verify_output *x = &v->outs[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", x->name);
        cJSON_AddItemToObject(o, "shape", ckpt_json_dims(x->value->shape, x->value->ndim));
        if (x->gathered)
            cJSON_AddItemToObject(o, "gathered_shape",
                                  ckpt_json_dims(x->gathered->shape, x->gathered->ndim));
        else
            cJSON_AddNullToObject(o, "gathered_shape");
        cJSON_AddItemToObject(o, "batch_dim", ckpt_json_int(x->batch_dim));
        cJSON_AddBoolToObject(o, "ok", x->vs_single.pass);
        if (x->vs_single.shape_ok)
            cJSON_AddItemToObject(o, "max_abs", json_num(x->vs_single.max_abs));
        if (x->replica_reason)
            cJSON_AddStringToObject(o, "reason", x->replica_reason);
        cJSON_AddItemToArray(outs, o);
    }
}

CKPT_API char *ckpt_verify_to_json(const ckpt_verify *v)
{
    if (!v || !v->s[0].loaded)
        return NULL;
    const side *s = &v->s[0];
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON_AddStringToObject(root, "model", ckpt_model_name(s->model));
    cJSON_AddStringToObject(root, "spec", s->model->path ? s->model->path : "");
    cJSON_AddItemToObject(root, "load", json_load(s));
    if (v->hint[0]) {
        cJSON_AddStringToObject(root, "hint", v->hint);
        cJSON_AddStringToObject(root, "fix", v->fix);
    }
    if (v->s[1].loaded)
        cJSON_AddItemToObject(root, "against", json_load(&v->s[1]));
    if (v->ran) {
        cJSON_AddStringToObject(root, "device", ckpt_backend_device(v->backend));
        cJSON_AddStringToObject(root, "device_description", ckpt_backend_description(v->backend));
        if (v->backend_note[0])
            cJSON_AddStringToObject(root, "device_note", v->backend_note);
        cJSON_AddBoolToObject(root, "tf32", v->tf32);
        if (ckpt_verify_tf32_note(v)[0])
            cJSON_AddStringToObject(root, "tf32_note", ckpt_verify_tf32_note(v));
        if (v->ref)
            cJSON_AddStringToObject(root, "reference", ckpt_file_path(v->ref));
        json_outputs(v, root);
        if (v->replicas)
            json_replicas(v, root);
    }
    cJSON_AddStringToObject(root, "result", ckpt_verify_passed(v) ? "PASS" : "FAIL");
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}
