/* sarif.c - ckpt scan --format sarif: the scan of PATH... (scan_path.c's
 * entries) as a SARIF 2.1.0 log, the format code-scanning systems (GitHub,
 * GitLab, Azure DevOps) read.  One run; a rule per kind of finding; one
 * result per unsafe global, TorchScript archive, ambiguity and name leading
 * out of a folder; the files that could not be read, and those skipped, as
 * tool execution notifications.  A global is located by the byte of its
 * opcode in the file (region.byteOffset) and, since code-scanning systems
 * show lines (GitHub requires region.startLine), by the same byte as a
 * line and a column counted in bytes: the file's newline bytes before it. */
#include "analysis/analysis.h"

#include "core/json.h"
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SARIF_SCHEMA "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/" \
                     "sarif-schema-2.1.0.json"

/* The rules, in the order of tool.driver.rules (a result's ruleIndex). */
enum { RULE_DANGEROUS, RULE_UNKNOWN, RULE_CODE, RULE_AMBIGUOUS, RULE_OUTSIDE, RULE_COUNT };

static const struct rule {
    const char *id, *name, *level, *short_text, *full_text;
} RULES[RULE_COUNT] = {
    {"dangerous-global", "DangerousGlobal", "error",
     "A pickle imports a global known to run commands or code",
     "A pickle names a global (module.name) that is neither part of a state dict nor known "
     "data, and is known to run commands or code (os.system, builtins.eval, ...): loading "
     "the file with weights_only=False runs it.  ckpt never runs it; ckpt extract writes "
     "the weights alone."},
    {"unknown-global", "UnknownGlobal", "error",
     "A pickle imports a global that is neither state-dict nor known data",
     "A pickle names a global (module.name) that is neither one state dicts are made of "
     "nor known data: loading the file with weights_only=False imports it and may run "
     "it.  Either it is code the file needs (then trust the file's source) or the file "
     "is unsafe."},
    {"torchscript-code", "TorchScriptCode", "error",
     "A TorchScript archive: torch.load compiles and runs its code",
     "The file is a TorchScript archive (torch.jit.save): torch.load hands it to "
     "torch.jit.load, which compiles and runs the code in its code/ whatever its pickles "
     "name.  ckpt extract writes its weights only."},
    {"ambiguous-content", "AmbiguousContent", "warning",
     "Readers of the file would see different content",
     "Two readers of the file (torch's zip reader, Python's zipfile, libzip, CPython's "
     "unpickler fed one way or another) would see different bytes: a scan made by one of "
     "them says nothing about what another loads.  Not safe to call safe."},
    {"outside-folder", "OutsideFolder", "error",
     "A folder's metadata names a file outside the folder",
     "A checkpoint folder's metadata (a DCP .metadata, DeepSpeed's latest, a Hugging Face "
     "index) names a file outside the folder: the loader would read a file nobody "
     "scanned.  It is not read."},
};

/* Notifications (tool.driver.notifications): what stopped a file's scan. */
enum { NOTE_UNREADABLE, NOTE_NOT_READ, NOTE_SKIPPED, NOTE_COUNT };

static const struct rule NOTES[NOTE_COUNT] = {
    {"unreadable", "Unreadable", "error", "A file cannot be read as any checkpoint format",
     "The file is not readable as any of the formats ckpt scans (or its reading failed "
     "before anything unsafe was found): ckpt scan exits 3 for it."},
    {"not-read", "NotRead", "error", "A file cannot be opened",
     "The file cannot be opened (missing, a dangling link, a folder that cannot be listed, "
     "out of memory): ckpt scan exits 4 for it."},
    {"skipped", "Skipped", "note", "A folder's file that torch.load would stop in at once",
     "A file under a scanned folder that CPython's unpickler would stop in before it "
     "imports anything (text, JSON, an empty file): listed, not scanned."},
};


/* The length of the UTF-8 sequence at S (well formed: no overlong form,
 * surrogate or code point past U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (!n || c > 0xf4)
        return 0;
    unsigned long cp = c & (0x3f >> (n - 1));
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* S as a JSON string a SARIF reader takes: a log must be UTF-8, so a byte
 * that is not (names are the file's bytes) becomes the text \xHH; the
 * JSON document (--json) keeps them exact. */
static cJSON *text_json(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), bad = 0;
    for (size_t i = 0, k; i < n; i += k ? k : 1)
        bad += (k = utf8_len(p + i)) == 0;
    if (!bad)
        return cJSON_CreateString(s);
    char *t = malloc(n + 3 * bad + 1), *w = t;
    if (!t)
        return NULL;
    for (size_t i = 0, k; i < n; i += k ? k : 1) {
        if ((k = utf8_len(p + i)) == 0) {
            w += sprintf(w, "\\x%02X", p[i]);
        } else {
            memcpy(w, p + i, k);
            w += k;
        }
    }
    *w = '\0';
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

/* {"text": TEXT} */
static cJSON *message(const char *text)
{
    cJSON *m = cJSON_CreateObject();
    if (m && !ckpt_json_put(m, "text", text_json(text))) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

/* PATH as a URI reference (RFC 3986): every byte outside the unreserved
 * characters and '/' percent-encoded, so that spaces, '%', '#', ':' in a
 * first segment and bytes that are not UTF-8 stay part of the path; an
 * absolute path becomes a file: URI. */
static char *path_uri(const char *path)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(path);
    bool abs = path[0] == '/';
    char *u = malloc(3 * n + sizeof "file://"), *w = u;
    if (!u)
        return NULL;
    if (abs)
        w += sprintf(w, "file://");
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        unsigned char c = *p;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
            *w++ = (char)c;
        } else {
            *w++ = '%';
            *w++ = hex[c >> 4];
            *w++ = hex[c & 15];
        }
    }
    *w = '\0';
    return u;
}

/* Where a byte of a file is: its offset, and its line and column (from 1;
 * 0: not known). */
typedef struct place {
    uint64_t at, line, col;
} place;

/* [{"physicalLocation": {"artifactLocation": {"uri"}, "region": {...}}}]: the
 * region only when AT->at is a byte of the file (AT NULL or UINT64_MAX: none),
 * the one-byte text region there when its line is known. */
static cJSON *locations(const char *path, const place *at)
{
    char *uri = path_uri(path);
    cJSON *a = cJSON_CreateArray(), *loc = cJSON_CreateObject(), *phys = cJSON_CreateObject();
    cJSON *art = cJSON_CreateObject();
    bool ok = uri && a && loc && phys && art && ckpt_json_put(art, "uri", cJSON_CreateString(uri));
    free(uri);
    if (ok && at && at->at != UINT64_MAX) {
        cJSON *region = cJSON_CreateObject();
        ok = region != NULL;
        if (ok && at->line)
            ok = ckpt_json_put(region, "startLine", ckpt_json_int((long long)at->line)) &&
                 ckpt_json_put(region, "startColumn", ckpt_json_int((long long)at->col)) &&
                 ckpt_json_put(region, "endLine", ckpt_json_int((long long)at->line)) &&
                 ckpt_json_put(region, "endColumn", ckpt_json_int((long long)at->col + 1));
        ok = ok && ckpt_json_put(region, "byteOffset", ckpt_json_int((long long)at->at)) &&
             ckpt_json_put(region, "byteLength", ckpt_json_int(1));
        ok = ckpt_json_put(phys, "region", region) && ok;
    }
    ok = ckpt_json_put(phys, "artifactLocation", art) && ok;
    art = NULL;
    ok = ckpt_json_put(loc, "physicalLocation", phys) && ok;
    phys = NULL;
    ok = ckpt_json_append(a, loc) && ok;
    loc = NULL;
    cJSON_Delete(art);
    cJSON_Delete(phys);
    cJSON_Delete(loc);
    if (!ok) {
        cJSON_Delete(a);
        return NULL;
    }
    return a;
}

/* A result of rule RULE at PATH (AT: the byte, or NULL) saying TEXT, with PROPS. */
static cJSON *result(int rule, const char *path, const place *at, const char *text,
                     cJSON *props)
{
    cJSON *r = cJSON_CreateObject();
    bool ok = r && ckpt_json_put(r, "ruleId", cJSON_CreateString(RULES[rule].id));
    ok = ok && ckpt_json_put(r, "ruleIndex", ckpt_json_int(rule));
    ok = ok && ckpt_json_put(r, "level", cJSON_CreateString(RULES[rule].level));
    ok = ok && ckpt_json_put(r, "message", message(text));
    ok = ok && ckpt_json_put(r, "locations", locations(path, at));
    if (ok) {
        ok = ckpt_json_put(r, "properties", props);
        props = NULL;
    }
    cJSON_Delete(props);
    if (!ok) {
        cJSON_Delete(r);
        return NULL;
    }
    return r;
}

/* The sentence of an unsafe global's result. */
static void hit_text(char *buf, size_t cap, const ckpt_scan_hit *h)
{
    size_t n = (size_t)snprintf(buf, cap, "%s global %s (%s at byte %llu of %s",
                                h->dangerous ? "DANGEROUS" : "unknown", h->global, h->opcode,
                                (unsigned long long)h->offset, h->pickle);
    if (h->file_offset != UINT64_MAX && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, ", byte %llu of the file",
                              (unsigned long long)h->file_offset);
    if (h->used_by && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; %s by %s at +%llu",
                              h->uses & CKPT_SCAN_CALLED ? "called" : "built", h->used_by,
                              (unsigned long long)h->use_offset);
    if (h->computed_by && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; a name computed at run time by %s",
                              h->computed_by);
    if (h->reading && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; %s reading", h->reading);
    if (n < cap)
        snprintf(buf + n, cap - n, "): torch.load (weights_only=False) imports it%s",
                 h->dangerous ? " and can run commands or code with it" : "");
}

static cJSON *hit_props(const ckpt_scan_hit *h, const char *format)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o && ckpt_json_put(o, "global", text_json(h->global));
    ok = ok && ckpt_json_put(o, "dangerous", cJSON_CreateBool(h->dangerous));
    ok = ok && ckpt_json_put(o, "pickle", text_json(h->pickle));
    ok = ok && ckpt_json_put(o, "offset", ckpt_json_int((long long)h->offset));
    if (ok && h->file_offset != UINT64_MAX)
        ok = ckpt_json_put(o, "file_offset", ckpt_json_int((long long)h->file_offset));
    ok = ok && ckpt_json_put(o, "opcode", cJSON_CreateString(h->opcode));
    if (ok && h->used_by)
        ok = ckpt_json_put(o, "used_by", cJSON_CreateString(h->used_by)) &&
             ckpt_json_put(o, "use_offset", ckpt_json_int((long long)h->use_offset));
    ok = ok && ckpt_json_put(o, "count", ckpt_json_int((long long)h->count));
    if (ok && h->reading)
        ok = ckpt_json_put(o, "reading", cJSON_CreateString(h->reading));
    if (ok && h->computed_by)
        ok = ckpt_json_put(o, "computed_by", text_json(h->computed_by));
    ok = ok && ckpt_json_put(o, "format", cJSON_CreateString(format));
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* {"format": FORMAT} and, when not NULL, KEY: VALUE */
static cJSON *small_props(const char *format, const char *key, const char *value)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o && ckpt_json_put(o, "format", cJSON_CreateString(format));
    if (ok && key)
        ok = ckpt_json_put(o, key, text_json(value));
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static bool unsafe_hit(const ckpt_scan_hit *h)
{
    return h->cls != CKPT_GLOBAL_INTERPRETED && h->cls != CKPT_GLOBAL_KNOWN_DATA;
}

static int place_cmp(const void *a, const void *b)
{
    const place *x = *(place *const *)a, *y = *(place *const *)b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* The line and column of each of the N places of PATH, in one reading of
 * the file up to the last; left 0 where the file cannot be read (or no
 * longer has that byte). */
static void find_lines(const char *path, place *pl, size_t n)
{
    place **order = n ? malloc(n * sizeof *order) : NULL;
    uint8_t *buf = order ? malloc(1 << 16) : NULL;
    int fd = -1;
    struct stat st;
    ckpt_error err = {0};
    if (!buf || ckpt_open_input(AT_FDCWD, path, false, &fd, &st, &err) != CKPT_OK) {
        free(order);
        free(buf);
        return;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = &pl[i];
    qsort(order, n, sizeof *order, place_cmp);
    uint64_t line = 1, line_start = 0, pos = 0, size = (uint64_t)st.st_size;
    size_t k = 0;
    while (k < n && order[k]->at < size) { /* UINT64_MAX, not in the file, sorts last */
        size_t len = size - pos < (1 << 16) ? (size_t)(size - pos) : (size_t)1 << 16;
        if (ckpt_pread_all(fd, buf, len, pos) != CKPT_OK)
            break;
        for (size_t i = 0; i < len && k < n; i++) {
            while (k < n && order[k]->at == pos + i) {
                order[k]->line = line;
                order[k]->col = pos + i - line_start + 1;
                k++;
            }
            if (buf[i] == '\n') {
                line++;
                line_start = pos + i + 1;
            }
        }
        pos += len;
    }
    close(fd);
    free(order);
    free(buf);
}

/* A scanned file's results, appended to RESULTS. */
static bool file_results(cJSON *results, const ckpt_scan_entry *e)
{
    const ckpt_scan *s = e->scan;
    char text[2 * CKPT_ERRMSG_MAX];
    size_t n = 0, nh = ckpt_scan_hit_count(s);
    for (size_t i = 0; i < nh; i++)
        n += unsafe_hit(ckpt_scan_hit_at(s, i));
    place *pl = n ? calloc(n, sizeof *pl) : NULL;
    if (n && !pl)
        return false;
    for (size_t i = 0, k = 0; i < nh; i++)
        if (unsafe_hit(ckpt_scan_hit_at(s, i)))
            pl[k++].at = ckpt_scan_hit_at(s, i)->file_offset;
    find_lines(e->path, pl, n);
    bool ok = true;
    for (size_t i = 0, k = 0; ok && i < nh; i++) {
        const ckpt_scan_hit *h = ckpt_scan_hit_at(s, i);
        if (!unsafe_hit(h))
            continue;
        hit_text(text, sizeof text, h);
        ok = ckpt_json_append(results, result(h->dangerous ? RULE_DANGEROUS : RULE_UNKNOWN, e->path,
                                    &pl[k++], text, hit_props(h, e->format)));
    }
    free(pl);
    for (size_t i = 0; ok && i < ckpt_scan_code_count(s); i++)
        ok = ckpt_json_append(results, result(RULE_CODE, e->path, NULL, ckpt_scan_code_at(s, i),
                                    small_props(e->format, NULL, NULL)));
    for (size_t i = 0; ok && i < ckpt_scan_ambiguity_count(s); i++)
        ok = ckpt_json_append(results, result(RULE_AMBIGUOUS, e->path, NULL,
                                    ckpt_scan_ambiguity_at(s, i),
                                    small_props(e->format, NULL, NULL)));
    return ok;
}

/* A tool execution notification NOTE about PATH saying TEXT. */
static cJSON *notification(int note, const char *path, const char *text)
{
    cJSON *n = cJSON_CreateObject(), *d = cJSON_CreateObject();
    bool ok = n && d && ckpt_json_put(d, "id", cJSON_CreateString(NOTES[note].id)) &&
              ckpt_json_put(d, "index", ckpt_json_int(note));
    ok = ckpt_json_put(n, "descriptor", d) && ok;
    ok = ok && ckpt_json_put(n, "level", cJSON_CreateString(NOTES[note].level));
    ok = ok && ckpt_json_put(n, "message", message(text));
    ok = ok && ckpt_json_put(n, "locations", locations(path, NULL));
    if (!ok) {
        cJSON_Delete(n);
        return NULL;
    }
    return n;
}

/* A reportingDescriptor of RULES or NOTES. */
static cJSON *descriptor(const struct rule *r)
{
    cJSON *o = cJSON_CreateObject(), *cfg = cJSON_CreateObject();
    bool ok = o && cfg && ckpt_json_put(o, "id", cJSON_CreateString(r->id));
    ok = ok && ckpt_json_put(o, "name", cJSON_CreateString(r->name));
    ok = ok && ckpt_json_put(o, "shortDescription", message(r->short_text));
    ok = ok && ckpt_json_put(o, "fullDescription", message(r->full_text));
    ok = ok && ckpt_json_put(cfg, "level", cJSON_CreateString(r->level));
    ok = ckpt_json_put(o, "defaultConfiguration", cfg) && ok;
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *driver(void)
{
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR,
             CKPT_VERSION_PATCH);
    cJSON *d = cJSON_CreateObject(), *rules = cJSON_CreateArray(), *notes = cJSON_CreateArray();
    bool ok = d && rules && notes && ckpt_json_put(d, "name", cJSON_CreateString("ckpt"));
    ok = ok && ckpt_json_put(d, "version", cJSON_CreateString(version));
    ok = ok && ckpt_json_put(d, "semanticVersion", cJSON_CreateString(version));
    for (int i = 0; ok && i < RULE_COUNT; i++)
        ok = ckpt_json_append(rules, descriptor(&RULES[i]));
    for (int i = 0; ok && i < NOTE_COUNT; i++)
        ok = ckpt_json_append(notes, descriptor(&NOTES[i]));
    ok = ckpt_json_put(d, "rules", rules) && ok;
    ok = ckpt_json_put(d, "notifications", notes) && ok;
    if (!ok) {
        cJSON_Delete(d);
        return NULL;
    }
    return d;
}

char *ckpt_scan_paths_to_sarif(const ckpt_scan_paths *p)
{
    if (!p)
        return NULL;
    cJSON *root = cJSON_CreateObject(), *run = cJSON_CreateObject(), *tool = cJSON_CreateObject();
    cJSON *results = cJSON_CreateArray(), *notes = cJSON_CreateArray();
    cJSON *inv = cJSON_CreateObject();
    bool ok = root && run && tool && results && notes && inv;
    bool failed = ckpt_scan_paths_error_code(p) != CKPT_OK;
    char text[2 * CKPT_ERRMSG_MAX];
    for (size_t i = 0; ok && i < ckpt_scan_paths_count(p); i++) {
        const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, i);
        if (e->kind == CKPT_SCAN_ENTRY_SKIPPED) {
            snprintf(text, sizeof text, "%s: skipped: %s", e->path, e->reason);
            ok = ckpt_json_append(notes, notification(NOTE_SKIPPED, e->path, text));
            continue;
        }
        if (e->kind == CKPT_SCAN_ENTRY_FILE)
            ok = file_results(results, e);
        else if (e->exit == CKPT_SCAN_EXIT_UNSAFE) /* a name leading out of its folder */
            ok = ckpt_json_append(results, result(RULE_OUTSIDE, e->path, NULL, e->reason,
                                        small_props("unknown", "reason", e->reason)));
        if (ok && e->exit >= CKPT_SCAN_EXIT_UNREADABLE) {
            /* the results found before the error stand (a malformed tail) */
            failed = true;
            snprintf(text, sizeof text, "%s: %s", e->path,
                     e->error ? e->error : e->reason ? e->reason : "cannot be read");
            ok = ckpt_json_append(notes, notification(e->exit == CKPT_SCAN_EXIT_IO ? NOTE_NOT_READ
                                                                         : NOTE_UNREADABLE,
                                            e->path, text));
        }
    }
    if (ok && ckpt_scan_paths_error_code(p) != CKPT_OK) { /* the run stopped */
        cJSON *n = cJSON_CreateObject();
        ok = n && ckpt_json_put(n, "level", cJSON_CreateString("error")) &&
             ckpt_json_put(n, "message", message(ckpt_scan_paths_error_message(p)));
        ok = ckpt_json_append(notes, n) && ok;
    }
    ok = ok && ckpt_json_put(inv, "executionSuccessful", cJSON_CreateBool(!failed));
    ok = ok && ckpt_json_put(inv, "exitCode", ckpt_json_int(ckpt_scan_paths_exit(p)));
    if (ok) {
        ok = ckpt_json_put(inv, "toolExecutionNotifications", notes);
        notes = NULL;
    }
    cJSON *invs = ok ? cJSON_CreateArray() : NULL;
    ok = ckpt_json_append(invs, inv) && ok;
    inv = NULL;
    ok = ok && ckpt_json_put(tool, "driver", driver());
    ok = ckpt_json_put(run, "tool", tool) && ok;
    tool = NULL;
    ok = ckpt_json_put(run, "invocations", invs) && ok;
    ok = ckpt_json_put(run, "results", results) && ok;
    results = NULL;
    cJSON *runs = cJSON_CreateArray();
    ok = ckpt_json_append(runs, run) && ok;
    run = NULL;
    ok = ok && ckpt_json_put(root, "$schema", cJSON_CreateString(SARIF_SCHEMA));
    ok = ok && ckpt_json_put(root, "version", cJSON_CreateString("2.1.0"));
    ok = ckpt_json_put(root, "runs", runs) && ok;
    cJSON_Delete(tool);
    cJSON_Delete(run);
    cJSON_Delete(results);
    cJSON_Delete(notes);
    cJSON_Delete(inv);
    char *out = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return out;
}
