/* rewrite.c - the part of strip-module, add-module, unwrap, rename and remap
 * that is the same for all: arguments, the plan or report, the write. */
#include "rewrite.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* --map-location M: torch's word; M a device (every storage to it) or
 * FROM=TO as remap's --map.  1, or -1 after a usage error. */
static int map_location_option(rewrite *rw, const char *arg)
{
    const char *eq = strchr(arg, '=');
    char *from = eq ? strndup(arg, (size_t)(eq - arg)) : NULL;
    const char *to = eq ? eq + 1 : arg;
    if ((eq && (!from || !(strcmp(from, "*") == 0 || ckpt_device_valid(from)))) ||
        !ckpt_device_valid(to)) {
        free(from);
        cli_usage_error(rw->cmd, "--map-location needs a device (cpu, cuda:0) or FROM=TO "
                        "(cuda:1=cpu), got '%s'", arg);
        return -1;
    }
    const char **f = realloc(rw->map_from, (rw->nmap + 1) * sizeof(*f));
    if (f)
        rw->map_from = f;
    const char **t = realloc(rw->map_to, (rw->nmap + 1) * sizeof(*t));
    if (t)
        rw->map_to = t;
    char **o = realloc(rw->map_owned, (rw->nmap + 1) * sizeof(*o));
    if (o)
        rw->map_owned = o;
    if (!f || !t || !o) {
        free(from);
        cli_error(rw->cmd, NULL, "out of memory");
        return -1;
    }
    rw->map_from[rw->nmap] = from ? from : "*";
    rw->map_to[rw->nmap] = to;
    rw->map_owned[rw->nmap] = from;
    rw->nmap++;
    return 1;
}

int rewrite_option(rewrite *rw, int opt, const char *arg)
{
    switch (opt) {
    case REWRITE_OPT_SELECT:
        rw->select = arg;
        return 1;
    case REWRITE_OPT_DRY_RUN:
        rw->dry_run = true;
        return 1;
    case REWRITE_OPT_IN_PLACE:
        rw->in_place = true;
        return 1;
    case REWRITE_OPT_FORCE:
        rw->force = true;
        return 1;
    case REWRITE_OPT_VERBOSE:
        rw->verbose = true;
        return 1;
    case REWRITE_OPT_KEEP_UNSAFE:
        rw->keep_unsafe = true;
        return 1;
    case REWRITE_OPT_MAP_LOCATION:
        return map_location_option(rw, arg);
    case REWRITE_OPT_TO:
        return rewrite_format_option(rw->cmd, arg, true, &rw->out_format);
    default:
        return cli_common_option(rw->cmd, opt, arg, &rw->common);
    }
}

int rewrite_format_option(const char *cmd, const char *arg, bool legacy, ckpt_format *out)
{
    if (strcmp(arg, "pth") == 0 || strcmp(arg, "pth-zip") == 0)
        *out = CKPT_FORMAT_PTH_ZIP;
    else if (legacy && strcmp(arg, "pth-legacy") == 0)
        *out = CKPT_FORMAT_PTH_LEGACY;
    else if (strcmp(arg, "safetensors") == 0)
        *out = CKPT_FORMAT_SAFETENSORS;
    else {
        cli_usage_error(cmd, "--to: '%s' is not pth%s safetensors", arg,
                        legacy ? ", pth-legacy or" : " or");
        return -1;
    }
    return 1;
}

int rewrite_positional(rewrite *rw, int argc, char **argv)
{
    int n = argc - optind;
    /* --in-place FILE; --in-place IN OUT as before (OUT may be IN) */
    if (n == 1 && rw->in_place) {
        rw->in = rw->out = argv[optind];
        return CLI_EXIT_OK;
    }
    if (n != 2)
        return cli_usage_error(rw->cmd, rw->in_place ? (n < 1 ? "--in-place needs FILE"
                                                               : "expects FILE, or IN and OUT")
                                        : n < 2 ? "needs IN and OUT"
                                                : "expects only IN and OUT");
    rw->in = argv[optind];
    rw->out = argv[optind + 1];
    if (strcmp(rw->out, "-") == 0)
        return cli_usage_error(rw->cmd, "refusing to write a binary checkpoint to standard output");
    return CLI_EXIT_OK;
}

void rewrite_free(rewrite *rw)
{
    free(rw->pending);
    rw->pending = NULL;
    free(rw->took);
    rw->took = NULL;
    free(rw->kept);
    rw->kept = NULL;
    for (size_t i = 0; i < rw->nmap; i++)
        free(rw->map_owned[i]);
    free(rw->map_owned);
    free(rw->map_from);
    free(rw->map_to);
    rw->map_owned = NULL;
    rw->map_from = rw->map_to = NULL;
    rw->nmap = 0;
    cli_common_free(&rw->common);
}

/* Report lines wait for the write: a refusal or an I/O error must not be
 * preceded by a summary of work that was never written. */
static void report(rewrite *rw, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(rewrite *rw, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *line = cli_vformat(fmt, ap); /* names escaped */
    va_end(ap);
    if (!line)
        return;
    size_t len = strlen(line);
    char *b = realloc(rw->pending, rw->npending + len + 1);
    if (!b) {
        free(line);
        return;
    }
    memcpy(b + rw->npending, line, len + 1);
    free(line);
    rw->pending = b;
    rw->npending += len;
}

static const char *sd_name(const ckpt_path *p, char *buf, size_t cap)
{
    if (!p->len)
        return "(root)";
    ckpt_path_format(p, buf, cap);
    return buf;
}

static void on_key(void *user, const ckpt_path *sd, const char *old_key, const char *new_key)
{
    rewrite *rw = user;
    rw->changed++;
    if (!rw->dry_run || rw->common.quiet)
        return;
    if (sd->len) {
        char where[1024];
        ckpt_path_format(sd, where, sizeof(where));
        cli_printf("%s/%s -> %s/%s\n", where, old_key, where, new_key);
    } else {
        cli_printf("%s -> %s\n", old_key, new_key);
    }
}

static void on_state_dict(void *user, const ckpt_path *sd, size_t changed, size_t keys)
{
    rewrite *rw = user;
    rw->any_state_dict = true;
    if (rw->dry_run || rw->common.quiet || !changed)
        return;
    char buf[1024];
    report(rw, "state dict %s: %zu of %zu key%s renamed\n", sd_name(sd, buf, sizeof(buf)), changed,
           keys, keys == 1 ? "" : "s");
}

static void on_device(void *user, const char *old_tag, const char *new_tag, size_t storages)
{
    rewrite *rw = user;
    rw->changed += storages;
    if (rw->common.quiet)
        return;
    if (rw->narrowed && rw->dry_run) /* IN's counts would say more than OUT holds */
        cli_printf("%s -> %s\n", old_tag, new_tag);
    else if (rw->narrowed)
        report(rw, "storages: %s -> %s\n", old_tag, new_tag);
    else if (rw->dry_run)
        cli_printf("%s -> %s (%zu storage%s)\n", old_tag, new_tag, storages, storages == 1 ? "" : "s");
    else
        report(rw, "storages: %zu of %zu remapped (%s -> %s)\n", storages, rw->storages, old_tag,
               new_tag);
}

/* --map-location: the storages' tags remapped in the same write (remap's
 * library code and report).  Safetensors records no device: said once,
 * and nothing is remapped.  NARROWED: OUT holds part of IN (extract,
 * --select), whose storages all are remapped (those OUT does not hold are
 * not written): the report then counts none.  CKPT_OK or the remap's status. */
static int map_location(rewrite *rw, ckpt_file *f, bool narrowed)
{
    if (!rw->nmap)
        return CKPT_OK;
    ckpt_format out = rw->out_format ? rw->out_format : ckpt_format_for_path(rw->out);
    size_t ol = strlen(rw->out);
    if (out == CKPT_FORMAT_SAFETENSORS ||
        (out == CKPT_FORMAT_SHARDED && ol >= 23 &&
         strcmp(rw->out + ol - 23, ".safetensors.index.json") == 0)) {
        if (!rw->common.quiet)
            cli_error(rw->cmd, rw->out, "note: safetensors records no device, so --map-location "
                                        "has nothing to change (it loads where load() is told)");
        return CKPT_OK;
    }
    for (size_t i = 0; i < rw->nmap; i++)
        if (!ckpt_device_known(rw->map_to[i]) && !rw->common.quiet)
            cli_error(rw->cmd, NULL, "note: torch knows no device type '%.*s' without a plug-in",
                      (int)strcspn(rw->map_to[i], ":"), rw->map_to[i]);
    ckpt_edit_report rep = {.device = on_device, .user = rw};
    rw->storages = ckpt_file_storage_count(f);
    rw->narrowed = narrowed;
    return ckpt_file_remap_devices(f, rw->map_from, rw->map_to, rw->nmap,
                                   rw->dry_run ? CKPT_EDIT_DRY_RUN : 0, &rep);
}

typedef struct progress_state {
    time_t start;
    bool shown;
} progress_state;

static void on_progress(void *user, uint64_t done, uint64_t total)
{
    progress_state *p = user;
    if (time(NULL) - p->start < 1 || !total)
        return;
    fprintf(stderr, "\rckpt: writing %3d%%", (int)(done * 100 / total));
    p->shown = true;
}

/* The file OUT replaced, under its last (hidden) name: removing it frees
 * its blocks, about 0.3 s a GiB on ext4, so a child that outlives the
 * command removes it, and replacing OUT costs what writing a new one does.
 * CKPT_FREE_NOW (the benchmarks' switch) removes it before exiting. */
static void free_later(const char *path)
{
    const char *now = getenv("CKPT_FREE_NOW");
    pid_t pid = now && *now ? -1 : fork();
    if (pid == 0) {
        setsid();
        unlink(path);
        _exit(0);
    }
    if (pid < 0)
        unlink(path);
}

/* How OUT was written, with --verbose: the way taken, and for a file edited
 * in place that its checksum changed with its bytes. */
static void report_method(rewrite *rw, const ckpt_write_result *res)
{
    char a[32], b[32];
    if (rw->common.quiet && !rw->verbose)
        return;
    if (res->method == CKPT_WROTE_IN_PLACE) {
        if (rw->verbose && rw->out_format == CKPT_FORMAT_SAFETENSORS)
            cli_error(rw->cmd, rw->out,
                      "in place: rewrote the header (%llu bytes, padded with spaces to its old "
                      "length, in its first 512-byte sector); no tensor byte moved",
                      (unsigned long long)res->bytes_written);
        else if (rw->verbose)
            cli_error(rw->cmd, rw->out,
                      "in place: wrote %s (pickle record at byte %llu, directory, and a "
                      "temporary copy of the old directory%s); no tensor byte moved; %llu -> "
                      "%llu bytes, %s dead",
                      cli_human_bytes(res->bytes_written, a, sizeof(a)),
                      (unsigned long long)res->offset, res->direct ? ", O_DIRECT" : "",
                      (unsigned long long)res->old_size, (unsigned long long)res->new_size,
                      cli_human_bytes(res->dead_bytes, b, sizeof(b)));
        if (rw->verbose)
            cli_error(rw->cmd, rw->out, "note: edited in place: its bytes changed, so does any "
                                        "checksum of it (sha256, a cache's hash)");
    } else if (res->method == CKPT_WROTE_CLONE) {
        if (rw->verbose)
            cli_error(rw->cmd, rw->out, "cloned: a new file sharing the input's data (FICLONE), "
                                        "then edited in place: wrote %s",
                      cli_human_bytes(res->bytes_written, a, sizeof(a)));
    } else if (rw->verbose) {
        bool inp = rw->in_place && strcmp(rw->in, rw->out) == 0;
        cli_error(rw->cmd, rw->out, "streamed: a new file, then renamed to %s%s%s", rw->out,
                  !res->why[0] ? "" : inp ? "; not in place: " : "; not cloned: ", res->why);
    }
}

/* ---- code-running globals (doc/safety.md 9) ---- */

static void on_kept(void *user, const char *global)
{
    rewrite *rw = user;
    size_t n = rw->kept ? strlen(rw->kept) : 0;
    char *k = realloc(rw->kept, n + strlen(global) + 3);
    if (!k)
        return;
    snprintf(k + n, strlen(global) + 3, "%s%s", n ? ", " : "", global);
    rw->kept = k;
}

/* Refuse (exit 3) what OUT would hold that torch.load(weights_only=False)
 * runs, unless --keep-unsafe keeps what --allow-global names.  Before any
 * edit reports: a refusal prints nothing else. */
static int check_globals(rewrite *rw, ckpt_file *f)
{
    if (!rw->out_format) /* as finish() picks it */
        rw->out_format = ckpt_format_for_path(rw->out);
    int st = ckpt_file_check_globals(f, rw->out_format, rw->keep_unsafe, on_kept, rw);
    if (st == CKPT_OK)
        return CLI_EXIT_OK;
    cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
    return cli_exit_for(st);
}

/* A safety warning: on stderr even with --quiet and without a terminal. */
static void warn_kept(const rewrite *rw)
{
    if (!rw->kept)
        return;
    bool several = strchr(rw->kept, ',') != NULL;
    cli_error(rw->cmd, rw->out,
              "warning: %s the global%s %s (--keep-unsafe), which torch.load(weights_only=False) "
              "imports and runs: %s unsafe to load",
              rw->dry_run ? "would keep" : "keeps", several ? "s" : "", rw->kept,
              rw->dry_run ? "it would be" : "it is");
}

/* ---- formats that hold tensors only: one state dict of IN ---- */

static bool tensors_only(ckpt_format format)
{
    return format == CKPT_FORMAT_SAFETENSORS || format == CKPT_FORMAT_SHARDED;
}

static const char *holder(ckpt_format format)
{
    return format == CKPT_FORMAT_SAFETENSORS ? "safetensors" : "a sharded set";
}

/* The state dict a tensors-only OUT takes when --select names none: the
 * model's, as extract takes it (doc/design.md, "Common rules"): its index,
 * and whether it lies inside IN (then the rest of IN is left out).  Refused,
 * naming the candidates and --select, when there are several. */
static int pick_model(rewrite *rw, ckpt_file *f, size_t *i, bool *nested)
{
    int st = ckpt_file_pick_state_dict(f, i);
    if (st != CKPT_OK) {
        cli_error(rw->cmd, rw->in, "%s holds tensors only%s: %s", holder(rw->out_format),
                  ckpt_file_state_dict_count(f) ? " and this file holds more" : "",
                  ckpt_file_error_message(f));
        return cli_exit_for(st);
    }
    ckpt_path p;
    ckpt_file_state_dict(f, *i, &p);
    *nested = p.len > 0;
    return CLI_EXIT_OK;
}

/* IN replaced by one of its state dicts: the rest of it would be lost. */
static int lossy_in_place(rewrite *rw)
{
    if (!rw->in_place || strcmp(rw->in, rw->out) != 0)
        return CLI_EXIT_OK;
    return cli_usage_error(rw->cmd, "--in-place: %s holds tensors only, so %s would keep one "
                                    "state dict and lose the rest; write a new OUT",
                           holder(rw->out_format), rw->in);
}

/* Make the state dict SELECT names, else (NESTED) state dict I, the whole
 * of F, and keep the line that says so (finish prints it). */
static int take_state_dict(rewrite *rw, ckpt_file *f, const char *select, size_t i, bool nested)
{
    char name[1024];
    if (select) {
        snprintf(name, sizeof(name), "%s", select);
    } else {
        ckpt_path p;
        ckpt_file_state_dict(f, i, &p);
        ckpt_path_format(&p, name, sizeof(name));
    }
    int st = select ? ckpt_file_select(f, select) : nested ? ckpt_file_extract(f, NULL) : CKPT_OK;
    if (st != CKPT_OK) {
        cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
        return cli_exit_for(st);
    }
    if (!select && !nested)
        return CLI_EXIT_OK; /* IN is that state dict: nothing is left out */
    free(rw->took);
    rw->took = strdup(name);
    rw->took_tensors = ckpt_file_tensor_count(f);
    rw->took_model = !select;
    return CLI_EXIT_OK;
}

/* The line take_state_dict kept, on stderr: "wrote", or "would write". */
static void say_took(const rewrite *rw)
{
    if (rw->took && !rw->common.quiet)
        cli_error(rw->cmd, rw->in,
                  "%s holds tensors only: %s the %sstate dict '%s' (%zu tensor%s), not the rest "
                  "of the file%s",
                  holder(rw->out_format), rw->dry_run ? "would write" : "wrote",
                  rw->took_model ? "model's " : "", rw->took, rw->took_tensors,
                  rw->took_tensors == 1 ? "" : "s",
                  rw->took_model ? " (name another with --select)" : "");
}

/* The storages F's tensors use, and in *NT its tensors. */
static size_t used_storages(const ckpt_file *f, size_t *nt)
{
    size_t ns = ckpt_file_storage_count(f), used = 0;
    *nt = ckpt_file_tensor_count(f);
    bool *seen = calloc(ns ? ns : 1, 1);
    for (size_t i = 0; seen && i < *nt; i++) {
        const ckpt_storage *s = ckpt_tensor_storage(ckpt_file_tensor(f, i, NULL));
        if (!s)
            continue; /* sparse, meta: counted through their parts, or none */
        size_t k = ckpt_storage_index(s);
        used += !seen[k];
        seen[k] = true;
    }
    free(seen);
    return used;
}

/* Write *FP to OUT and report; *FP is freed (and NULL) once written, so
 * that reading OUT back never holds two models (issue 26). */
static int finish(rewrite *rw, ckpt_file **fp, const char *nothing_changed)
{
    ckpt_file *f = *fp;
    if (rw->dry_run) {
        say_took(rw);
        warn_kept(rw);
        return CLI_EXIT_OK;
    }
    progress_state ps = {.start = time(NULL)};
    if (!rw->out_format) /* doc/design.md, "Common rules": --to, else OUT's extension, else pth-zip */
        rw->out_format = ckpt_format_for_path(rw->out);
    ckpt_write_result res;
    ckpt_write_options wo = {.flags = (rw->in_place ? CKPT_WRITE_IN_PLACE : 0) |
                                      (rw->force ? CKPT_WRITE_FORCE : 0) |
                                      CKPT_WRITE_DEFER_FREE | rw->write_flags,
                             .format = rw->out_format,
                             .shard_size = rw->shard_size,
                             .result = &res};
    if (!rw->common.quiet && isatty(2)) {
        wo.progress = on_progress;
        wo.user = &ps;
    }
    int rc = ckpt_file_write(f, rw->out, &wo);
    if (ps.shown)
        fputc('\n', stderr);
    if (rc == CKPT_OK && res.replaced[0])
        free_later(res.replaced);
    if (rc != CKPT_OK) {
        /* errors about OUT name OUT, the rest (a corrupt input record) IN */
        bool about_out = rc == CKPT_ERR_IO || rc == CKPT_ERR_USAGE || rc == CKPT_ERR_NOMEM;
        cli_error(rw->cmd, about_out ? rw->out : rw->in, "%s", ckpt_file_error_message(f));
        return cli_exit_for(rc);
    }
    warn_kept(rw);
    say_took(rw);
    if (rw->changed == 0 && !rw->common.quiet) /* (one state dict of IN is no copy of it) */
        cli_error(rw->cmd, rw->in, "%s%s", nothing_changed,
                  rw->took ? "" : "; wrote an unchanged copy");
    report_method(rw, &res);
    if (!rw->common.quiet) {
        if (rw->pending)
            fputs(rw->pending, stdout);
        struct stat st;
        char size[32] = "?";
        if (stat(rw->out, &st) == 0)
            cli_human_bytes((unsigned long long)st.st_size, size, sizeof(size));
        /* what OUT holds, as a reader finds it (a tensors-only format holds
         * one state dict of IN: counting IN's would say more) */
        /* (a file edited in place holds what f holds: not read again) */
        size_t nt, used = used_storages(f, &nt);
        char weights[256] = "?"; /* a model folder's weights file (or index) */
        /* read back where OUT holds less than F (a tensors-only format, a
         * model folder): a pth holds what F holds, and reading back a pickle
         * of millions of tensors costs more than the rewrite (issue 26) */
        bool narrower = rw->out_format == CKPT_FORMAT_SAFETENSORS ||
                        rw->out_format == CKPT_FORMAT_SHARDED ||
                        (rw->write_flags & CKPT_WRITE_MODEL_FOLDER);
        if (res.method == CKPT_WROTE_NEW && narrower) {
            ckpt_file_free(f);
            *fp = NULL;
            ckpt_file *o = ckpt_file_new();
            if (o && ckpt_file_open(o, rw->out) == CKPT_OK) {
                used = used_storages(o, &nt);
                const char *wp = ckpt_file_path(o), *wb = wp ? strrchr(wp, '/') : NULL;
                if (wb)
                    snprintf(weights, sizeof weights, "%s", wb + 1);
            }
            ckpt_file_free(o);
        }
        if (rw->write_flags & CKPT_WRITE_MODEL_FOLDER) {
            /* a folder's size says nothing: its weights file (or index) instead */
            cli_printf("wrote %s: model folder, %s weights (%s), %zu tensors, %zu storages\n",
                       rw->out, ckpt_format_name(rw->out_format), weights, nt, used);
            return CLI_EXIT_OK;
        }
        cli_printf("wrote %s: %s, %zu tensors, %zu storages, %s\n", rw->out,
                   ckpt_format_name(rw->out_format ? rw->out_format : CKPT_FORMAT_PTH_ZIP), nt, used,
                   size);
    }
    return CLI_EXIT_OK;
}

int rewrite_keys(rewrite *rw, const ckpt_rename *rules)
{
    ckpt_file *f;
    int rc = cli_open(rw->cmd, rw->in, &rw->common, &f);
    if (rc != CLI_EXIT_OK)
        return rc;
    ckpt_edit_report rep = {.key = on_key, .state_dict = on_state_dict, .user = rw};
    /* the rename's own refusals (a module tree, two equal keys) come first */
    int st = ckpt_file_rename_keys(f, rules, rw->select, CKPT_EDIT_DRY_RUN, NULL);
    if (st == CKPT_OK && (rc = check_globals(rw, f)) != CLI_EXIT_OK) {
        ckpt_file_free(f);
        return rc;
    }
    /* a tensors-only OUT holds one state dict: which, before any key is
     * printed (check_globals set out_format) */
    bool one = st == CKPT_OK && tensors_only(rw->out_format), nested = rw->select != NULL;
    size_t pick = 0;
    /* (no state dict at all: the rename's own refusal below) */
    if (one && !rw->select && ckpt_file_state_dict_count(f) &&
        (rc = pick_model(rw, f, &pick, &nested)) != CLI_EXIT_OK) {
        ckpt_file_free(f);
        return rc;
    }
    if (one && nested && (rc = lossy_in_place(rw)) != CLI_EXIT_OK) {
        ckpt_file_free(f);
        return rc;
    }
    if (st == CKPT_OK)
        st = ckpt_file_rename_keys(f, rules, rw->select, rw->dry_run ? CKPT_EDIT_DRY_RUN : 0, &rep);
    if (st != CKPT_OK) {
        cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
        rc = cli_exit_for(st);
    } else if (!rw->any_state_dict && ckpt_file_state_dict_count(f)) {
        cli_error(rw->cmd, rw->in,
                  "no model state dict: the %zu state dict%s found %s an optimizer's state or "
                  "training-loop bookkeeping, rewritten only when named; name one with --select",
                  ckpt_file_state_dict_count(f), ckpt_file_state_dict_count(f) == 1 ? "" : "s",
                  ckpt_file_state_dict_count(f) == 1 ? "is" : "are");
        rc = CLI_EXIT_BAD_INPUT;
    } else if (!rw->any_state_dict) {
        cli_error(rw->cmd, rw->in,
                  "no state dict found (no mapping whose values are all tensors); "
                  "name one with --select");
        rc = CLI_EXIT_BAD_INPUT;
    } else if ((st = map_location(rw, f, false)) != CKPT_OK) {
        cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
        rc = cli_exit_for(st);
    } else if (!one || (rc = take_state_dict(rw, f, rw->select, pick, nested)) == CLI_EXIT_OK) {
        rc = finish(rw, &f, "no key changed");
    }
    ckpt_file_free(f);
    return rc;
}

static void on_cast(void *user, const char *from, const char *to, size_t storages)
{
    rewrite *rw = user;
    rw->changed += storages;
    if (rw->common.quiet)
        return;
    if (rw->dry_run)
        cli_printf("%s -> %s (%zu storage%s)\n", from, to, storages, storages == 1 ? "" : "s");
    else
        report(rw, "cast: %zu storage%s %s -> %s\n", storages, storages == 1 ? "" : "s", from, to);
}

int rewrite_convert(rewrite *rw, ckpt_dtype dtype)
{
    ckpt_file *f;
    int rc = cli_open(rw->cmd, rw->in, &rw->common, &f);
    if (rc != CLI_EXIT_OK)
        return rc;
    ckpt_edit_report rep = {.device = on_cast, .user = rw};
    int st = CKPT_OK;
    if (rw->select)
        st = ckpt_file_select(f, rw->select);
    /* no --select, a tensors-only OUT: the model's state dict, as extract
     * takes it (--select writes what it names in every format, silently) */
    if (st == CKPT_OK && !rw->select && tensors_only(rw->out_format)) {
        size_t pick;
        bool nested;
        if ((rc = pick_model(rw, f, &pick, &nested)) != CLI_EXIT_OK ||
            (nested && (rc = lossy_in_place(rw)) != CLI_EXIT_OK) ||
            (rc = take_state_dict(rw, f, NULL, pick, nested)) != CLI_EXIT_OK) {
            ckpt_file_free(f);
            return rc;
        }
    }
    if (st == CKPT_OK && (rc = check_globals(rw, f)) != CLI_EXIT_OK) {
        ckpt_file_free(f);
        return rc;
    }
    if (st == CKPT_OK && dtype)
        st = ckpt_file_cast(f, dtype, rw->dry_run ? CKPT_EDIT_DRY_RUN : 0, &rep);
    if (st == CKPT_OK)
        st = map_location(rw, f, rw->select != NULL);
    if (st != CKPT_OK) {
        cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
        rc = cli_exit_for(st);
    } else {
        rw->changed += 1; /* a conversion always writes something new */
        rc = finish(rw, &f, "nothing to convert");
    }
    ckpt_file_free(f);
    return rc;
}

int rewrite_extract(rewrite *rw)
{
    ckpt_file *f;
    int rc = cli_open(rw->cmd, rw->in, &rw->common, &f);
    if (rc != CLI_EXIT_OK)
        return rc;
    size_t notes = ckpt_file_notice_count(f);
    /* the one taken without --select, by its path (extract refuses as the
     * pick does when there is none) */
    char where[1024] = "";
    size_t pick;
    ckpt_path p;
    if (!rw->select && ckpt_file_pick_state_dict(f, &pick) == CKPT_OK &&
        ckpt_file_state_dict(f, pick, &p) && p.len)
        ckpt_path_format(&p, where, sizeof(where));
    int st = ckpt_file_extract(f, rw->select);
    if (st == CKPT_OK && (rc = check_globals(rw, f)) != CLI_EXIT_OK) {
        ckpt_file_free(f);
        return rc;
    }
    for (size_t i = notes; st == CKPT_OK && !rw->common.quiet && i < ckpt_file_notice_count(f); i++)
        cli_error(rw->cmd, rw->in, "note: %s", ckpt_file_notice(f, i)); /* about the output */
    if (st != CKPT_OK) {
        cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
        rc = cli_exit_for(st);
    } else {
        /* say which one, as the key rewrites do */
        const char *cls = ckpt_file_state_dict_class(f, 0);
        size_t n = ckpt_file_tensor_count(f);
        if (rw->select)
            report(rw, "extracted '%s': %zu tensors%s%s\n", rw->select, n, cls ? ", module tree of " : "",
                   cls ? cls : "");
        else
            report(rw, "extracted the %s%s%s%s: %zu tensors%s%s\n",
                   !cls ? "state dict"
                   : ckpt_file_format(f) == CKPT_FORMAT_TORCHSCRIPT ? "TorchScript module"
                                                                    : "module tree",
                   where[0] ? " '" : "", where, where[0] ? "'" : "", n, cls ? " of " : "",
                   cls ? cls : "");
        rw->changed += 1;
        if (rw->dry_run && rw->pending && !rw->common.quiet) { /* before the remap's lines */
            fputs(rw->pending, stdout);
            rw->pending[0] = '\0';
            rw->npending = 0;
        }
        if ((st = map_location(rw, f, true)) != CKPT_OK) {
            cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
            rc = cli_exit_for(st);
        } else {
            rc = rw->dry_run ? CLI_EXIT_OK : finish(rw, &f, "nothing to extract");
        }
        if (rw->dry_run)
            warn_kept(rw);
    }
    ckpt_file_free(f);
    return rc;
}

int rewrite_devices(rewrite *rw, const char *const *from, const char *const *to, size_t n)
{
    ckpt_file *f;
    int rc = cli_open(rw->cmd, rw->in, &rw->common, &f);
    if (rc != CLI_EXIT_OK)
        return rc;
    ckpt_edit_report rep = {.device = on_device, .user = rw};
    rw->storages = ckpt_file_storage_count(f);
    if ((rc = check_globals(rw, f)) != CLI_EXIT_OK) {
        ckpt_file_free(f);
        return rc;
    }
    int st = ckpt_file_remap_devices(f, from, to, n, rw->dry_run ? CKPT_EDIT_DRY_RUN : 0, &rep);
    if (st != CKPT_OK) {
        cli_error(rw->cmd, rw->in, "%s", ckpt_file_error_message(f));
        rc = cli_exit_for(st);
    } else {
        rc = finish(rw, &f, "no storage changed its device");
    }
    ckpt_file_free(f);
    return rc;
}

int rewrite_main(int argc, char **argv, const rewrite_command *c)
{
    static const struct option shared[] = {REWRITE_LONG_OPTIONS, {NULL, 0, NULL, 0}};
    size_t nown = 0, nshared = sizeof(shared) / sizeof(shared[0]);
    while (c->options && c->options[nown].name)
        nown++;
    struct option *all = calloc(nown + nshared, sizeof(*all));
    rewrite rw = {.cmd = c->name};
    int rc = CLI_EXIT_OK, opt;
    if (!all) {
        cli_error(c->name, NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    if (nown)
        memcpy(all, c->options, nown * sizeof(*all));
    memcpy(all + nown, shared, sizeof(shared));
    /* the command's short options (rename's -e) and the common ones, -q and -h */
    char shorts[32];
    snprintf(shorts, sizeof shorts, "%s%s", c->short_options ? c->short_options : ":",
             CLI_SHORT_OPTIONS + 1);
    opterr = 0; /* our own one-line messages */
    while ((opt = getopt_long(argc, argv, shorts, all, NULL)) != -1) {
        int h = rewrite_option(&rw, opt, optarg);
        if (h == 0 && c->option)
            h = c->option(c->state, opt, optarg);
        if (h < 0) {
            rc = CLI_EXIT_USAGE;
            goto out;
        }
        if (h > 0)
            continue;
        if (opt == CLI_OPT_HELP) {
            fputs(c->usage, stdout);
            goto out;
        }
        rc = cli_bad_option(c->name, opt, argv);
        goto out;
    }
    rc = rewrite_positional(&rw, argc, argv);
    if (rc == CLI_EXIT_OK)
        rc = c->run(c->state, &rw);
out:
    free(all);
    rewrite_free(&rw);
    return rc;
}

/* ---- strip-module and add-module: one rule built from --prefix ---- */

enum { OPT_PREFIX = CLI_OPT_FIRST_COMMAND_OPTION };

typedef struct prefix_state {
    const char *prefix;
    int (*rule)(ckpt_rename *r, const char *prefix);
} prefix_state;

static int prefix_option(void *st, int opt, const char *arg)
{
    if (opt != OPT_PREFIX)
        return 0;
    ((prefix_state *)st)->prefix = arg;
    return 1;
}

static int prefix_run(void *st, rewrite *rw)
{
    prefix_state *ps = st;
    ckpt_rename *r = ckpt_rename_new();
    if (!r) {
        cli_error(rw->cmd, NULL, "out of memory");
        return CLI_EXIT_IO;
    }
    int rc;
    if (ps->rule(r, ps->prefix) != CKPT_OK)
        rc = cli_usage_error(rw->cmd, "--prefix: %s", ckpt_rename_error(r));
    else
        rc = rewrite_keys(rw, r);
    ckpt_rename_free(r);
    return rc;
}

int rewrite_prefix_main(int argc, char **argv, const char *name, const char *usage,
                        int (*rule)(ckpt_rename *r, const char *prefix))
{
    static const struct option options[] = {
        {"prefix", required_argument, NULL, OPT_PREFIX},
        REWRITE_TO_OPTION,
        {NULL, 0, NULL, 0},
    };
    prefix_state st = {.prefix = "module.", .rule = rule};
    rewrite_command c = {name, usage, ":", options, prefix_option, prefix_run, &st};
    return rewrite_main(argc, argv, &c);
}
