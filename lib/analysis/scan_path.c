/* scan_path.c - ckpt scan PATH...'s engine: files, folders (every regular
 * file under them, in the order of their paths; the .distcp files item by
 * item; those whose first bytes no format claims skipped), each file's
 * verdict and exit status and the run's, and the JSON document
 * `ckpt scan --json` prints (with its torch_load objects). */
#include "analysis/analysis.h"

#include "core/json.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct entry {
    ckpt_scan_entry pub;
    char *path;
    ckpt_scan *scan;
    ckpt_torch_load *torch_load;
    char *error; /* a FOLDER entry's message */
} entry;

struct ckpt_scan_paths {
    ckpt_error err;
    uint64_t limits[CKPT_LIMIT_COUNT_]; /* 0: the scan's default */
    bool torch_load;
    char **paths;
    size_t npaths, cap;
    entry *entries;
    size_t n, ecap;
    int exit;
};

ckpt_scan_paths *ckpt_scan_paths_new(void)
{
    ckpt_scan_paths *p = calloc(1, sizeof *p);
    if (p)
        p->torch_load = true;
    return p;
}

static void entries_clear(ckpt_scan_paths *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->entries[i].path);
        free(p->entries[i].error);
        ckpt_scan_free(p->entries[i].scan);
        ckpt_torch_load_free(p->entries[i].torch_load);
    }
    free(p->entries);
    p->entries = NULL;
    p->n = p->ecap = 0;
    p->exit = CKPT_SCAN_EXIT_SAFE;
}

void ckpt_scan_paths_free(ckpt_scan_paths *p)
{
    if (!p)
        return;
    entries_clear(p);
    for (size_t i = 0; i < p->npaths; i++)
        free(p->paths[i]);
    free(p->paths);
    free(p);
}

int ckpt_scan_paths_set_limit(ckpt_scan_paths *p, ckpt_limit which, uint64_t value)
{
    if (!p || which < 0 || which >= CKPT_LIMIT_COUNT_ || value == 0)
        return CKPT_ERR_USAGE;
    p->limits[which] = value;
    return CKPT_OK;
}

int ckpt_scan_paths_set_torch_load(ckpt_scan_paths *p, int on)
{
    if (!p)
        return CKPT_ERR_USAGE;
    p->torch_load = on != 0;
    return CKPT_OK;
}

int ckpt_scan_paths_add(ckpt_scan_paths *p, const char *path)
{
    if (!p || !path)
        return CKPT_ERR_USAGE;
    ckpt_err_clear(&p->err);
    if (p->npaths == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        char **q = realloc(p->paths, cap * sizeof *q);
        if (!q)
            return ckpt_oom(&p->err);
        p->paths = q;
        p->cap = cap;
    }
    if (!(p->paths[p->npaths] = strdup(path)))
        return ckpt_oom(&p->err);
    p->npaths++;
    return CKPT_OK;
}

/* ---- a folder's files ------------------------------------------------------ */

typedef struct file_list {
    char **names;
    size_t n, cap;
} file_list;

static void file_list_free(file_list *fl)
{
    for (size_t i = 0; i < fl->n; i++)
        free(fl->names[i]);
    free(fl->names);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file under DIR (links not followed), depth-first; -1 with
 * *ERR set (an errno) when a folder cannot be listed, the walk then ends
 * there. */
static int walk(const char *dir, file_list *fl, int *err)
{
    DIR *d = opendir(dir);
    if (!d) {
        *err = errno;
        return -1;
    }
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        char *p = malloc(len);
        if (!p) {
            *err = ENOMEM;
            rc = -1;
            break;
        }
        snprintf(p, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            rc = walk(p, fl, err);
            free(p);
        } else if (lstat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            if (fl->n == fl->cap) {
                size_t cap = fl->cap ? fl->cap * 2 : 64;
                char **q = realloc(fl->names, cap * sizeof(*q));
                if (!q) {
                    free(p);
                    *err = ENOMEM;
                    rc = -1;
                    break;
                }
                fl->names = q;
                fl->cap = cap;
            }
            fl->names[fl->n++] = p;
        } else {
            free(p); /* links and devices: no checkpoint reader follows them */
        }
    }
    closedir(d);
    return rc;
}

/* Whether some format of the table claims the file by its first bytes (a
 * zip, a tar, a pickle stream, safetensors), as some torch reader would
 * take it; a file that cannot be read is scanned, for the scan to say why. */
static bool claimed(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true;
    struct stat st;
    uint8_t head[512];
    size_t got;
    const ckpt_format_desc *d = NULL;
    int rc = fstat(fd, &st) != 0 ? CKPT_ERR_IO
                                 : ckpt_format_sniff_fd(fd, (uint64_t)st.st_size, NULL, head,
                                                        sizeof head, &got, &d);
    close(fd);
    return rc != CKPT_OK || d;
}

/* ---- one entry --------------------------------------------------------------- */

/* A new entry for PATH (owned from now on, freed on failure too), or NULL
 * with the run's error set. */
static entry *entry_add(ckpt_scan_paths *p, char *path, ckpt_scan_entry_kind kind)
{
    if (p->n == p->ecap) {
        size_t cap = p->ecap ? p->ecap * 2 : 16;
        entry *q = realloc(p->entries, cap * sizeof *q);
        if (!q) {
            free(path);
            ckpt_oom(&p->err);
            return NULL;
        }
        p->entries = q;
        p->ecap = cap;
    }
    entry *e = &p->entries[p->n++];
    memset(e, 0, sizeof *e);
    e->path = path;
    e->pub.path = path;
    e->pub.kind = kind;
    return e;
}

/* The last entry made, half made when memory ran out: not kept. */
static int entry_drop_last(ckpt_scan_paths *p)
{
    entry *e = &p->entries[--p->n];
    free(e->path);
    ckpt_scan_free(e->scan);
    ckpt_torch_load_free(e->torch_load);
    return ckpt_oom(&p->err);
}

static int exit_of(const ckpt_scan *s, int rc)
{
    /* unsafe content, or readers that would disagree, outrank a parse error */
    if (ckpt_scan_unsafe(s) || ckpt_scan_ambiguity_count(s))
        return CKPT_SCAN_EXIT_UNSAFE;
    if (rc != CKPT_OK)
        return rc == CKPT_ERR_IO || rc == CKPT_ERR_NOMEM ? CKPT_SCAN_EXIT_IO
                                                         : CKPT_SCAN_EXIT_UNREADABLE;
    return CKPT_SCAN_EXIT_SAFE;
}

/* Scan PATH (owned; IN_FOLDER: a file found in a folder) into a new entry;
 * an error only when the run must stop. */
static int scan_one(ckpt_scan_paths *p, char *path, bool in_folder)
{
    size_t n = strlen(path);
    bool items = in_folder && n > 7 && strcmp(path + n - 7, ".distcp") == 0;
    /* a folder's other files (DeepSpeed's `latest`, a README): no reader of
     * torch's would load them */
    bool skip = in_folder && !items && !claimed(path);
    entry *e = entry_add(p, path, skip ? CKPT_SCAN_ENTRY_SKIPPED : CKPT_SCAN_ENTRY_FILE);
    if (!e)
        return p->err.code;
    e->pub.exit = CKPT_SCAN_EXIT_SAFE;
    if (skip)
        return CKPT_OK;
    ckpt_scan *s = e->scan = ckpt_scan_new();
    if (!s)
        return entry_drop_last(p);
    e->pub.scan = s;
    for (int i = 0; i < CKPT_LIMIT_COUNT_; i++)
        if (p->limits[i])
            ckpt_scan_set_limit(s, (ckpt_limit)i, p->limits[i]);
    /* a DCP data file: its items, each a zip */
    int rc = items ? ckpt_scan_items(s, e->path) : ckpt_scan_file(s, e->path);
    int ex = exit_of(s, rc);
    e->pub.code = rc;
    e->pub.error = rc != CKPT_OK ? ckpt_scan_error_message(s) : NULL;
    e->pub.exit = ex;
    e->pub.verdict = ex == CKPT_SCAN_EXIT_SAFE ? "safe"
                     : ckpt_scan_unsafe(s) ? "unsafe"
                     : ex == CKPT_SCAN_EXIT_UNSAFE ? "ambiguous" : "error";
    ckpt_format f = ckpt_scan_format(s);
    e->pub.format = ckpt_scan_is_pickle(s) ? "pickle"
                    : f == CKPT_FORMAT_UNKNOWN ? "unknown" : ckpt_format_name(f);
    if (p->torch_load && f != CKPT_FORMAT_DCP) { /* items: DCP's reader loads them, not torch.load */
        if (!(e->torch_load = ckpt_torch_load_new()))
            return entry_drop_last(p);
        e->pub.torch_load = e->torch_load;
        ckpt_torch_load_check(e->torch_load, e->path); /* its error is part of its answer */
    }
    return CKPT_OK;
}

/* A folder: an entry for each file under it, after one for the folder when
 * it cannot be listed in full. */
static int scan_folder(ckpt_scan_paths *p, const char *dir)
{
    file_list fl = {0};
    int err = 0, rc = CKPT_OK;
    if (walk(dir, &fl, &err) != 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "cannot list the folder: %s", strerror(err));
        char *path = strdup(dir), *error = strdup(msg);
        entry *e = path && error ? entry_add(p, path, CKPT_SCAN_ENTRY_FOLDER) : NULL;
        if (!e) {
            if (!error)
                free(path); /* else entry_add freed it */
            free(error);
            file_list_free(&fl);
            return ckpt_oom(&p->err);
        }
        e->error = error;
        e->pub.code = CKPT_ERR_IO;
        e->pub.error = error;
        e->pub.exit = CKPT_SCAN_EXIT_IO;
    }
    if (fl.n > 1)
        qsort(fl.names, fl.n, sizeof(char *), name_cmp);
    size_t k = 0;
    for (; k < fl.n && rc == CKPT_OK; k++)
        rc = scan_one(p, fl.names[k], true); /* takes the name */
    for (; k < fl.n; k++)
        free(fl.names[k]);
    free(fl.names);
    return rc;
}

int ckpt_scan_paths_run(ckpt_scan_paths *p)
{
    if (!p)
        return CKPT_ERR_USAGE;
    entries_clear(p);
    ckpt_err_clear(&p->err);
    int rc = CKPT_OK;
    for (size_t i = 0; i < p->npaths && rc == CKPT_OK; i++) {
        struct stat st;
        if (stat(p->paths[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            /* a folder checkpoint (DCP, DeepSpeed): every file under it */
            rc = scan_folder(p, p->paths[i]);
        } else {
            char *path = strdup(p->paths[i]);
            rc = path ? scan_one(p, path, false) : ckpt_oom(&p->err);
        }
    }
    for (size_t i = 0; i < p->n; i++)
        if (p->entries[i].pub.exit > p->exit)
            p->exit = p->entries[i].pub.exit;
    if (rc != CKPT_OK)
        p->exit = CKPT_SCAN_EXIT_IO;
    return rc;
}

int ckpt_scan_paths_error_code(const ckpt_scan_paths *p) { return p ? p->err.code : CKPT_ERR_USAGE; }
const char *ckpt_scan_paths_error_message(const ckpt_scan_paths *p)
{
    return p ? p->err.msg : "invalid ckpt_scan_paths handle";
}
size_t ckpt_scan_paths_count(const ckpt_scan_paths *p) { return p ? p->n : 0; }
const ckpt_scan_entry *ckpt_scan_paths_entry(const ckpt_scan_paths *p, size_t i)
{
    return p && i < p->n ? &p->entries[i].pub : NULL;
}
int ckpt_scan_paths_exit(const ckpt_scan_paths *p) { return p ? p->exit : CKPT_SCAN_EXIT_IO; }

/* ---- JSON ------------------------------------------------------------------------ */

/* Add ITEM to O as KEY; false (ITEM freed) when it or the adding failed. */
static bool put(cJSON *o, const char *key, cJSON *item)
{
    if (item && cJSON_AddItemToObject(o, key, item))
        return true;
    cJSON_Delete(item);
    return false;
}

static bool append(cJSON *a, cJSON *item)
{
    if (item && cJSON_AddItemToArray(a, item))
        return true;
    cJSON_Delete(item);
    return false;
}

static cJSON *str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

static bool verdict_json(cJSON *o, const ckpt_torch_verdict *v)
{
    bool ok = put(o, "model", cJSON_CreateString(v->model));
    ok &= put(o, "accepted", cJSON_CreateBool(v->accepted));
    ok &= put(o, "via", cJSON_CreateString(v->via));
    if (!v->accepted) {
        ok &= put(o, "stop", cJSON_CreateString(v->stop));
        ok &= put(o, "global", str_or_null(v->global));
        if (v->opcode >= 0) {
            ok &= put(o, "opcode", ckpt_json_int(v->opcode));
            ok &= put(o, "opcode_name", cJSON_CreateString(v->opcode_name));
        } else {
            ok &= put(o, "opcode", cJSON_CreateNull());
        }
        if (v->pickle) {
            ok &= put(o, "pickle", cJSON_CreateString(v->pickle));
            ok &= put(o, "offset", ckpt_json_int((long long)v->offset));
        }
        ok &= put(o, "exception", cJSON_CreateString(v->exception));
        ok &= put(o, "message", cJSON_CreateString(v->message ? v->message : ""));
        ok &= put(o, "reason", cJSON_CreateString(v->reason ? v->reason : ""));
        ok &= put(o, "fix", str_or_null(v->fix));
    }
    if (v->note)
        ok &= put(o, "note", cJSON_CreateString(v->note));
    if (v->malformed)
        ok &= put(o, "malformed", cJSON_CreateString(v->malformed));
    return ok;
}

/* The torch_load object; NULL when out of memory. */
static cJSON *torch_load_json(const ckpt_torch_load *t)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL;
    if (ok && !ckpt_torch_load_verdict(t, CKPT_TORCH_2_6)) {
        ok = put(o, "error", cJSON_CreateString(ckpt_torch_load_error_message(t)));
    } else {
        for (int i = 0; ok && i < CKPT_TORCH_COUNT_; i++) {
            const ckpt_torch_verdict *v = ckpt_torch_load_verdict(t, (ckpt_torch)i);
            cJSON *vo = cJSON_CreateObject();
            ok = vo && verdict_json(vo, v);
            ok = put(o, v->version, vo) && ok;
        }
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* O printed and freed. */
static char *print(cJSON *o)
{
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    return text;
}

char *ckpt_torch_load_to_json(const ckpt_torch_load *t)
{
    return t ? print(torch_load_json(t)) : NULL;
}

static const char TORCHSCRIPT_NOTE[] =
    "TorchScript archive (torch.jit.save): its __torch__.* classes are compiled from its code/ "
    "by torch.jit.load; its state dict is named as torch.jit.load(f).state_dict(), "
    "non-persistent buffers included";

static bool hit_json(cJSON *g, const ckpt_scan_hit *h)
{
    bool ok = put(g, "global", cJSON_CreateString(h->global));
    ok &= put(g, "class", cJSON_CreateString(h->cls == CKPT_GLOBAL_INTERPRETED ? "interpreted"
                                             : h->cls == CKPT_GLOBAL_KNOWN_DATA ? "known data"
                                                                                : "unknown"));
    ok &= put(g, "dangerous", cJSON_CreateBool(h->dangerous));
    ok &= put(g, "pickle", cJSON_CreateString(h->pickle));
    ok &= put(g, "offset", ckpt_json_int((long long)h->offset));
    ok &= put(g, "opcode", cJSON_CreateString(h->opcode));
    cJSON *uses = cJSON_CreateArray();
    if (uses && (h->uses & CKPT_SCAN_CALLED))
        ok &= append(uses, cJSON_CreateString("call"));
    if (uses && (h->uses & CKPT_SCAN_BUILT))
        ok &= append(uses, cJSON_CreateString("build"));
    ok &= put(g, "uses", uses);
    if (h->used_by) {
        ok &= put(g, "used_by", cJSON_CreateString(h->used_by));
        ok &= put(g, "use_offset", ckpt_json_int((long long)h->use_offset));
    }
    ok &= put(g, "count", ckpt_json_int((long long)h->count));
    if (h->reading)
        ok &= put(g, "reading", cJSON_CreateString(h->reading));
    ok &= put(g, "computed_by", str_or_null(h->computed_by));
    return ok;
}

static bool reading_json(cJSON *o, const ckpt_scan_reading *r)
{
    bool ok = put(o, "reader", cJSON_CreateString(r->reader));
    ok &= put(o, "who", cJSON_CreateString(r->who));
    ok &= put(o, "primary", cJSON_CreateBool(r->primary));
    ok &= put(o, "result", cJSON_CreateString(r->code == CKPT_OK ? "read" : "stops"));
    ok &= put(o, "error", str_or_null(r->error));
    ok &= put(o, "pickles", ckpt_json_int((long long)r->pickles));
    ok &= put(o, "unsafe", cJSON_CreateBool(r->unsafe));
    return ok;
}

/* One file's object of the document, into O. */
static bool entry_json(cJSON *o, const entry *e)
{
    const ckpt_scan *s = e->scan;
    bool ok = put(o, "file", cJSON_CreateString(e->path));
    ok &= put(o, "format", cJSON_CreateString(e->pub.format));
    if (ckpt_scan_format(s) == CKPT_FORMAT_TORCHSCRIPT)
        ok &= put(o, "note", cJSON_CreateString(TORCHSCRIPT_NOTE));
    /* extra information: the verdict and the exit status do not depend on it */
    if (e->torch_load)
        ok &= put(o, "torch_load", torch_load_json(e->torch_load));
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_pickle_count(s); i++)
        ok &= append(a, cJSON_CreateString(ckpt_scan_pickle_name(s, i)));
    ok &= put(o, "pickles", a);
    a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_hit_count(s); i++) {
        cJSON *g = cJSON_CreateObject();
        ok &= g && hit_json(g, ckpt_scan_hit_at(s, i));
        ok &= append(a, g);
    }
    ok &= put(o, "globals", a);
    a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_reading_count(s); i++) {
        cJSON *r = cJSON_CreateObject();
        ok &= r && reading_json(r, ckpt_scan_reading_at(s, i));
        ok &= append(a, r);
    }
    ok &= put(o, "readings", a);
    a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_ambiguity_count(s); i++)
        ok &= append(a, cJSON_CreateString(ckpt_scan_ambiguity_at(s, i)));
    ok &= put(o, "ambiguities", a);
    a = cJSON_CreateArray(); /* code a loader runs besides the pickles (TorchScript) */
    for (size_t i = 0; a && i < ckpt_scan_code_count(s); i++)
        ok &= append(a, cJSON_CreateString(ckpt_scan_code_at(s, i)));
    ok &= put(o, "code", a);
    ok &= put(o, "verdict", cJSON_CreateString(e->pub.verdict));
    ok &= put(o, "error", str_or_null(e->pub.error));
    ok &= put(o, "exit", ckpt_json_int(e->pub.exit));
    return ok;
}

char *ckpt_scan_paths_to_json(const ckpt_scan_paths *p)
{
    if (!p)
        return NULL;
    cJSON *root = cJSON_CreateObject();
    bool ok = root && put(root, "files", cJSON_CreateArray());
    cJSON *files = ok ? cJSON_GetObjectItemCaseSensitive(root, "files") : NULL;
    for (size_t i = 0; ok && i < p->n; i++) {
        if (p->entries[i].pub.kind != CKPT_SCAN_ENTRY_FILE)
            continue; /* a skipped file, a folder's error: not in the document */
        cJSON *o = cJSON_CreateObject();
        ok = o && entry_json(o, &p->entries[i]);
        ok = append(files, o) && ok;
    }
    ok = ok && put(root, "exit", ckpt_json_int(p->exit));
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return print(root);
}
