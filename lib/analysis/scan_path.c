/* scan_path.c - ckpt scan PATH...'s engine: files, folders by their
 * loaders' rules (every file under them, in the order of their paths, as
 * torch.load would read it; links followed as the loaders follow them; the
 * files a DCP .metadata names and the .distcp files item by item; a file
 * skipped, and listed, only when the unpickler stops in it before importing
 * anything), each file's verdict and exit status and the run's, and the
 * JSON document `ckpt scan --json` prints (with its torch_load objects). */
#include "analysis/analysis.h"

#include "core/json.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/*
 * A folder is scanned by the loaders' rules, over every file any of them
 * would open: DCP's dcp.load opens each file its metadata names (by that
 * path) and torch.load's the bytes; DeepSpeed torch.load's every
 * *_model_states.pt and *_optim_states.pt of the tag folder `latest` names
 * (and its engine the layer_* files); a Hugging Face snapshot is a folder of
 * links into ../../blobs that transformers opens by their names.  So every
 * file under the folder is scanned as torch.load would read it, whatever its
 * name, links followed wherever they lead (as every one of those loaders
 * follows them); a file is left out only when torch.load's unpickler would
 * stop before importing anything (text, JSON, an empty file: see
 * never_imports), and then it is listed with the reason.  What cannot be
 * read is an entry of its own: a FIFO or device (refused, never opened), a
 * dangling link, a name the metadata gives that leads out of the folder
 * (unsafe: the loader would read a file nobody scanned).
 */

#define WALK_MAX_DEPTH 64
#define INDEX_MAX_BYTES (64u << 20) /* a shard index read for its names */

typedef struct found {
    char *path;
    char *problem; /* NULL: a file to scan */
    int code, exit;
} found;

typedef struct file_list {
    found *f;
    size_t n, cap;
    char **named; /* files a DCP metadata names: scanned as DCP reads them */
    size_t nnamed, named_cap;
    int err; /* an errno that stopped the walk: ENOMEM */
} file_list;

static void file_list_free(file_list *fl)
{
    for (size_t i = 0; i < fl->n; i++) {
        free(fl->f[i].path);
        free(fl->f[i].problem);
    }
    free(fl->f);
    for (size_t i = 0; i < fl->nnamed; i++)
        free(fl->named[i]);
    free(fl->named);
}

static int found_cmp(const void *a, const void *b)
{
    return strcmp(((const found *)a)->path, ((const found *)b)->path);
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* DIR/NAME, malloc'd ("DIR/" not doubled). */
static char *join(const char *dir, const char *name)
{
    size_t dl = strlen(dir), len = dl + strlen(name) + 2;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", name);
    return p;
}

/* Add PATH (owned) to FL: a file, or with PROBLEM (printf-style) an entry
 * that is not scanned. */
static bool add_found(file_list *fl, char *path, int code, int exit, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static bool add_found(file_list *fl, char *path, int code, int exit, const char *fmt, ...)
{
    char *problem = NULL;
    if (path && fmt) {
        char msg[600];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        problem = strdup(msg);
    }
    if (!path || (fmt && !problem) || CKPT_GROW(fl->f, fl->cap, fl->n + 1) < 0) {
        free(path);
        free(problem);
        fl->err = ENOMEM;
        return false;
    }
    fl->f[fl->n++] = (found){.path = path, .problem = problem, .code = code, .exit = exit};
    return true;
}

/* REL (a name a folder's metadata gives) without "." and empty
 * components, malloc'd; NULL in *OUT when it leads out of the folder
 * (absolute, or a ".." component: the loader joins it as given). */
static bool inside_rel(const char *rel, char **out)
{
    *out = NULL;
    if (!*rel || rel[0] == '/')
        return true;
    size_t n = strlen(rel);
    char *o = malloc(n + 1), *w = o;
    if (!o)
        return false;
    for (const char *p = rel; *p;) {
        const char *e = strchr(p, '/');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == 2 && p[0] == '.' && p[1] == '.') {
            free(o);
            return true;
        }
        if (k && !(k == 1 && p[0] == '.')) {
            if (w != o)
                *w++ = '/';
            memcpy(w, p, k);
            w += k;
        }
        p += k + (e != NULL);
    }
    *w = '\0';
    if (w == o) {
        free(o);
        return true;
    }
    *out = o;
    return true;
}

/* Where a loader opens NAME of folder DIR: DIR/NAME, or NAME when absolute
 * (Python's os.path.join and pathlib's / both drop DIR then). */
static char *outside_path(const char *dir, const char *name)
{
    return name[0] == '/' ? strdup(name) : join(dir, name);
}

/* The shard names of a Hugging Face index (*.index.json) in folder DFD:
 * transformers opens os.path.join(folder, name) for each weight_map value;
 * an unsafe entry for each that leads out.  An index it cannot parse is
 * left alone: transformers fails on it too (false).  With PREFIX (the
 * index named alone), each shard inside the folder is added as a file to
 * scan, PREFIX + its name. */
static bool named_by_index(const char *dir, int dfd, const char *name, file_list *fl,
                           const char *prefix)
{
    int fd;
    struct stat st;
    ckpt_error e = {0};
    if (ckpt_open_input(dfd, name, false, &fd, &st, &e) != CKPT_OK)
        return false;
    size_t len = (size_t)st.st_size;
    char *text = len <= INDEX_MAX_BYTES ? malloc(len + 1) : NULL;
    if (!text || ckpt_pread_all(fd, text, len, 0) != CKPT_OK) {
        if (!text && len <= INDEX_MAX_BYTES)
            fl->err = ENOMEM;
        free(text);
        close(fd);
        return false;
    }
    close(fd);
    cJSON *idx = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), *v;
    const char *last = NULL;
    bool is_index = cJSON_IsObject(map);
    if (!is_index)
        map = NULL;
    cJSON_ArrayForEach(v, map) {
        char *norm;
        if (!cJSON_IsString(v) || (last && strcmp(last, v->valuestring) == 0))
            continue;
        last = v->valuestring;
        if (!inside_rel(v->valuestring, &norm))
            fl->err = ENOMEM;
        else if (!norm)
            add_found(fl, outside_path(dir, v->valuestring), CKPT_OK, CKPT_SCAN_EXIT_UNSAFE,
                      "named by %s/%s (weight_map), outside the folder: transformers would "
                      "load it there; not read", dir, name);
        else if (prefix) {
            size_t n = strlen(prefix) + strlen(norm) + 1;
            char *path = malloc(n);
            if (path)
                snprintf(path, n, "%s%s", prefix, norm);
            add_found(fl, path, CKPT_OK, CKPT_SCAN_EXIT_SAFE, NULL);
        }
        free(norm);
        if (fl->err)
            break;
    }
    cJSON_Delete(idx);
    return is_index;
}

/* The metadata files of a DCP folder: ".metadata", "__R.metadata". */
static bool dcp_metadata_name(const char *n)
{
    if (strcmp(n, ".metadata") == 0)
        return true;
    if (strncmp(n, "__", 2) != 0 || n[2] < '0' || n[2] > '9')
        return false;
    const char *p = n + 2;
    while (*p >= '0' && *p <= '9')
        p++;
    return strcmp(p, ".metadata") == 0;
}

/* The names folder DIR's metadata gives: each DCP metadata's files (kept
 * in FL->named, or an unsafe entry when one leads out of the folder) and
 * DeepSpeed's `latest` tag (an unsafe entry when it leads out). */
static void named_by_metadata(ckpt_scan_paths *p, const char *dir, int dfd, char **metas,
                              size_t nmetas, file_list *fl)
{
    uint64_t limits[CKPT_LIMIT_COUNT_];
    ckpt_file *probe = ckpt_file_new(); /* the default limits */
    for (int i = 0; i < CKPT_LIMIT_COUNT_; i++)
        limits[i] = p->limits[i] ? p->limits[i] : ckpt_file_limit(probe, (ckpt_limit)i);
    ckpt_file_free(probe);
    if (!probe) {
        fl->err = ENOMEM;
        return;
    }
    for (size_t m = 0; m < nmetas && !fl->err; m++) {
        char **names;
        size_t n;
        ckpt_error e = {0};
        if (ckpt_dcp_named_files(dfd, metas[m], limits, &names, &n, &e) != CKPT_OK) {
            if (e.code == CKPT_ERR_NOMEM)
                fl->err = ENOMEM;
            continue; /* the metadata's own scan says why it cannot be read */
        }
        for (size_t i = 0; i < n; i++) {
            char *norm;
            if (!inside_rel(names[i], &norm)) {
                fl->err = ENOMEM;
            } else if (!norm) {
                add_found(fl, outside_path(dir, names[i]), CKPT_OK, CKPT_SCAN_EXIT_UNSAFE,
                          "named by %s/%s (storage_data relative_path '%s'), outside the "
                          "folder: dcp.load would read it there; not read", dir, metas[m],
                          names[i]);
            } else {
                char *full = join(dir, norm);
                free(norm);
                if (!full || CKPT_GROW(fl->named, fl->named_cap, fl->nnamed + 1) < 0) {
                    free(full);
                    fl->err = ENOMEM;
                } else {
                    fl->named[fl->nnamed++] = full;
                }
            }
            free(names[i]);
        }
        free(names);
    }
    char tag[512];
    bool present = false;
    if (ckpt_deepspeed_latest(dfd, tag, sizeof tag, &present) == CKPT_OK && present && tag[0]) {
        char *norm;
        if (!inside_rel(tag, &norm))
            fl->err = ENOMEM;
        else if (!norm)
            add_found(fl, outside_path(dir, tag), CKPT_OK, CKPT_SCAN_EXIT_UNSAFE,
                      "the tag folder %s/latest names ('%s'), outside the folder: DeepSpeed "
                      "would load its rank files there; not read", dir, tag);
        free(norm);
    }
}

/* Whether the folder link PATH leads inside ROOT (a real path). */
static bool link_inside(const char *path, const char *root)
{
    char *real = realpath(path, NULL);
    size_t n = strlen(root);
    bool in = real && strncmp(real, root, n) == 0 &&
              (real[n] == '/' || real[n] == '\0' || (n == 1 && root[0] == '/'));
    free(real);
    return in;
}

/* Every file under DIR, depth-first, links followed (ANCESTORS: the
 * folders being walked, DEPTH of them, whose links are loops; ROOT: the
 * real path of the folder scanned).  A link to a file is followed wherever
 * it leads, as every loader follows it; a link to a folder when it stays
 * in ROOT, or when it is the tag folder DeepSpeed's `latest` names (which
 * zero_to_fp32 loads wherever it is): no loader walks other folders. */
typedef struct dir_id {
    dev_t dev;
    ino_t ino;
} dir_id;

static void walk(ckpt_scan_paths *p, const char *dir, file_list *fl, const dir_id *ancestors,
                 int depth, const char *root)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        add_found(fl, strdup(dir), CKPT_ERR_IO, CKPT_SCAN_EXIT_IO, "cannot list the folder: %s",
                  strerror(e));
        return;
    }
    char tag[512];
    bool has_latest = false;
    if (ckpt_deepspeed_latest(dfd, tag, sizeof tag, &has_latest) != CKPT_OK)
        has_latest = false;
    dir_id here[WALK_MAX_DEPTH + 1];
    struct stat self;
    memcpy(here, ancestors, (size_t)depth * sizeof *here);
    here[depth] = fstat(dfd, &self) == 0 ? (dir_id){self.st_dev, self.st_ino} : (dir_id){0, 0};
    char **metas = NULL;
    size_t nmetas = 0, metas_cap = 0;
    struct dirent *de;
    while (!fl->err && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char *path = join(dir, de->d_name);
        struct stat st, lst;
        if (!path) {
            fl->err = ENOMEM;
            break;
        }
        bool link = fstatat(dfd, de->d_name, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode);
        if (fstatat(dfd, de->d_name, &st, 0) != 0) {
            int e = errno;
            char target[256] = "";
            ssize_t k = link ? readlinkat(dfd, de->d_name, target, sizeof target - 1) : -1;
            if (k > 0)
                target[k] = '\0';
            if (link)
                add_found(fl, path, CKPT_ERR_IO, CKPT_SCAN_EXIT_IO,
                          "a link to '%s', which cannot be opened: %s", target, strerror(e));
            else
                add_found(fl, path, CKPT_ERR_IO, CKPT_SCAN_EXIT_IO, "cannot open: %s",
                          strerror(e));
        } else if (S_ISDIR(st.st_mode)) {
            bool loop = false;
            for (int i = 0; i <= depth; i++)
                loop |= here[i].dev == st.st_dev && here[i].ino == st.st_ino;
            if (loop)
                add_found(fl, path, CKPT_ERR_UNSUPPORTED, CKPT_SCAN_EXIT_UNREADABLE,
                          "a link to a folder it is in (a loop): not walked again");
            else if (depth + 1 > WALK_MAX_DEPTH)
                add_found(fl, path, CKPT_ERR_LIMIT, CKPT_SCAN_EXIT_UNREADABLE,
                          "folders nested more than %d deep: not walked", WALK_MAX_DEPTH);
            else if (link && !link_inside(path, root) &&
                     !(has_latest && strcmp(tag, de->d_name) == 0))
                add_found(fl, path, CKPT_ERR_UNSUPPORTED, CKPT_SCAN_EXIT_UNREADABLE,
                          "a link to a folder outside the one scanned: not walked (scan "
                          "that folder itself)");
            else {
                walk(p, path, fl, here, depth + 1, root);
                free(path);
            }
        } else if (S_ISREG(st.st_mode)) {
            if (ckpt_path_has_suffix(de->d_name, ".index.json"))
                named_by_index(dir, dfd, de->d_name, fl, NULL);
            if (dcp_metadata_name(de->d_name)) {
                char *m = strdup(de->d_name);
                if (!m || CKPT_GROW(metas, metas_cap, nmetas + 1) < 0) {
                    free(m);
                    fl->err = ENOMEM;
                } else {
                    metas[nmetas++] = m;
                }
            }
            add_found(fl, path, CKPT_OK, CKPT_SCAN_EXIT_SAFE, NULL);
        } else {
            /* a loader would block on a FIFO: refused, never opened */
            add_found(fl, path, CKPT_ERR_UNSUPPORTED, CKPT_SCAN_EXIT_UNREADABLE,
                      "not a regular file (%s): refused, never read", ckpt_file_kind(st.st_mode));
        }
    }
    if (!fl->err)
        named_by_metadata(p, dir, dfd, metas, nmetas, fl);
    for (size_t i = 0; i < nmetas; i++)
        free(metas[i]);
    free(metas);
    closedir(d);
}

/* Why torch.load, given the file of BUF[0..LEN), stops before it imports
 * anything, or NULL when it may not (the file is then scanned).  Files
 * that a format claims by their first bytes (a zip, a tar, safetensors, a
 * pickle starting with PROTO) are always scanned; any other is what
 * torch.load hands its legacy loader, which runs CPython's unpickler from
 * byte 0: this follows that unpickler's opcodes, argument lengths and
 * MARKs, and answers only when it stops (a byte that is no opcode, the end
 * of the file, a missing MARK) before any opcode that imports, calls,
 * builds or ends a pickle.  Text, JSON and empty files end so. */
static const char *never_imports(const uint8_t *b, size_t len, char *why, size_t cap)
{
    size_t at = 0;
    uint64_t marks = 0;
    if (len == 0)
        return "empty: torch.load stops at once (EOFError)";
    for (;;) {
        if (at >= len) {
            snprintf(why, cap, "torch.load's unpickler reaches its end (byte %zu) before "
                     "importing anything", len);
            return why;
        }
        size_t op_at = at;
        int op = b[at++];
        uint64_t arg = 0; /* bytes of argument after the opcode */
        int lenbytes = 0; /* a length prefix of this many bytes */
        bool line = false, mark_pop = false;
        switch (op) {
        case CKPT_OP_MARK:
            marks++;
            break;
        case CKPT_OP_POP: case CKPT_OP_DUP: case CKPT_OP_NONE: case CKPT_OP_EMPTY_TUPLE:
        case CKPT_OP_EMPTY_LIST: case CKPT_OP_EMPTY_DICT: case CKPT_OP_APPEND:
        case CKPT_OP_SETITEM: case CKPT_OP_TUPLE1: case CKPT_OP_TUPLE2: case CKPT_OP_TUPLE3:
        case CKPT_OP_NEWTRUE: case CKPT_OP_NEWFALSE: case CKPT_OP_EMPTY_SET:
        case CKPT_OP_MEMOIZE: case CKPT_OP_READONLY_BUFFER:
            break;
        case CKPT_OP_POP_MARK: case CKPT_OP_LIST: case CKPT_OP_TUPLE: case CKPT_OP_DICT:
        case CKPT_OP_APPENDS: case CKPT_OP_SETITEMS: case CKPT_OP_ADDITEMS:
        case CKPT_OP_FROZENSET:
            mark_pop = true;
            break;
        case CKPT_OP_FLOAT: case CKPT_OP_INT: case CKPT_OP_LONG: case CKPT_OP_STRING:
        case CKPT_OP_UNICODE: case CKPT_OP_GET: case CKPT_OP_PUT:
            line = true;
            break;
        case CKPT_OP_BININT1: case CKPT_OP_BINGET: case CKPT_OP_BINPUT: case CKPT_OP_PROTO:
            arg = 1;
            break;
        case CKPT_OP_BININT2:
            arg = 2;
            break;
        case CKPT_OP_BININT: case CKPT_OP_LONG_BINGET: case CKPT_OP_LONG_BINPUT:
            arg = 4;
            break;
        case CKPT_OP_BINFLOAT: case CKPT_OP_FRAME:
            arg = 8;
            break;
        case CKPT_OP_SHORT_BINSTRING: case CKPT_OP_SHORT_BINBYTES:
        case CKPT_OP_SHORT_BINUNICODE: case CKPT_OP_LONG1:
            lenbytes = 1;
            break;
        case CKPT_OP_BINSTRING: case CKPT_OP_BINUNICODE: case CKPT_OP_BINBYTES:
        case CKPT_OP_LONG4:
            lenbytes = 4;
            break;
        case CKPT_OP_BINUNICODE8: case CKPT_OP_BINBYTES8: case CKPT_OP_BYTEARRAY8:
            lenbytes = 8;
            break;
        case CKPT_OP_NEXT_BUFFER:
            snprintf(why, cap, "torch.load's unpickler stops at byte %zu (NEXT_BUFFER: no "
                     "out-of-band buffers) before importing anything", op_at);
            return why;
        case CKPT_OP_INST:
            if (marks == 0) {
                snprintf(why, cap, "torch.load's unpickler stops at byte %zu (INST without a "
                         "MARK) before importing anything", op_at);
                return why;
            }
            return NULL;
        case CKPT_OP_STOP:
            if (op_at == 0) {
                snprintf(why, cap, "torch.load's unpickler stops at byte 0 (STOP with an "
                         "empty stack) before importing anything");
                return why;
            }
            return NULL; /* a value: the next pickle of the legacy chain may follow */
        default:
            if (strcmp(ckpt_pickle_op_name(op), "?") == 0) {
                snprintf(why, cap, "torch.load's unpickler stops at byte %zu (0x%02x is no "
                         "pickle opcode) before importing anything", op_at, (unsigned)op);
                return why;
            }
            return NULL; /* GLOBAL, STACK_GLOBAL, EXT*, a persistent id, a call, BUILD, STOP */
        }
        if (mark_pop) {
            if (marks == 0) {
                snprintf(why, cap, "torch.load's unpickler stops at byte %zu (%s without a "
                         "MARK) before importing anything", op_at, ckpt_pickle_op_name(op));
                return why;
            }
            marks--;
        }
        if (line) {
            const uint8_t *nl = memchr(b + at, '\n', len - at);
            at = nl ? (size_t)(nl - b) + 1 : len;
            continue;
        }
        if (lenbytes) {
            if (len - at < (size_t)lenbytes) {
                at = len;
                continue;
            }
            for (int i = lenbytes; i-- > 0;)
                arg = (arg << 8) | b[at + (size_t)i];
            at += (size_t)lenbytes;
            /* a negative BINSTRING or LONG4 length is an error too: past the end either way */
            if (lenbytes == 4 && (op == CKPT_OP_BINSTRING || op == CKPT_OP_LONG4) &&
                (arg & 0x80000000u))
                arg = UINT64_MAX;
        }
        at = arg > len - at ? len : at + (size_t)arg;
    }
}

/* Whether a format claims the file of FD by its first bytes (a zip, a tar,
 * safetensors, a pickle stream starting with PROTO), as some torch reader
 * would take it. */
static bool claimed(int fd, uint64_t size)
{
    uint8_t head[512];
    size_t got;
    const ckpt_format_desc *d = NULL;
    if (ckpt_format_sniff_fd(fd, size, NULL, head, sizeof head, &got, &d) != CKPT_OK)
        return true;
    return (d && d->id != CKPT_FORMAT_SHARDED) || (got && head[0] == CKPT_OP_PROTO);
}

/* The reason PATH is left out of a folder's scan (malloc'd), or NULL:
 * scanned.  A file that cannot be opened is scanned, for the scan to say why. */
static char *left_out(const char *path)
{
    int fd;
    struct stat st;
    ckpt_error e = {0};
    if (ckpt_open_input(AT_FDCWD, path, false, &fd, &st, &e) != CKPT_OK)
        return NULL;
    size_t len = (size_t)st.st_size;
    char why[200];
    const char *r = NULL;
    if (len == 0) {
        r = never_imports(NULL, 0, why, sizeof why);
    } else if (!claimed(fd, len)) {
        void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map != MAP_FAILED) {
            r = never_imports(map, len, why, sizeof why);
            munmap(map, len);
        }
    }
    close(fd);
    return r ? strdup(r) : NULL;
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
    free(e->error);
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

/* An entry for PATH (owned) that is not a scanned file: KIND with MSG
 * (owned) as its reason, status CODE and exit status EXIT. */
static int entry_note(ckpt_scan_paths *p, char *path, ckpt_scan_entry_kind kind, char *msg,
                      int code, int exit)
{
    if (!msg) {
        free(path);
        return ckpt_oom(&p->err);
    }
    entry *e = entry_add(p, path, kind);
    if (!e) {
        free(msg);
        return p->err.code;
    }
    e->error = msg;
    e->pub.reason = msg;
    e->pub.code = code;
    e->pub.error = code != CKPT_OK ? msg : NULL;
    e->pub.exit = exit;
    e->pub.verdict = kind == CKPT_SCAN_ENTRY_SKIPPED ? NULL
                     : exit == CKPT_SCAN_EXIT_UNSAFE ? "unsafe" : "error";
    e->pub.format = kind == CKPT_SCAN_ENTRY_SKIPPED ? NULL : "unknown";
    return CKPT_OK;
}

/* Scan PATH (owned; IN_FOLDER: a file found in a folder, ITEMS: one DCP
 * reads item by item) into a new entry; an error only when the run must
 * stop. */
static int scan_one(ckpt_scan_paths *p, char *path, bool in_folder, bool items)
{
    char *why = in_folder && !items ? left_out(path) : NULL;
    if (why)
        return entry_note(p, path, CKPT_SCAN_ENTRY_SKIPPED, why, CKPT_OK, CKPT_SCAN_EXIT_SAFE);
    entry *e = entry_add(p, path, CKPT_SCAN_ENTRY_FILE);
    if (!e)
        return p->err.code;
    e->pub.exit = CKPT_SCAN_EXIT_SAFE;
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
    if (items && ex == CKPT_SCAN_EXIT_UNREADABLE) {
        /* items ckpt cannot find: DCP still torch.load's the bytes the
         * metadata says, from byte 0 for the first; that reading judged too,
         * and kept when it finds what would run */
        ckpt_scan *w = ckpt_scan_new();
        if (!w)
            return entry_drop_last(p);
        for (int i = 0; i < CKPT_LIMIT_COUNT_; i++)
            if (p->limits[i])
                ckpt_scan_set_limit(w, (ckpt_limit)i, p->limits[i]);
        int wrc = ckpt_scan_file(w, e->path);
        if (exit_of(w, wrc) == CKPT_SCAN_EXIT_UNSAFE) {
            ckpt_scan_free(s);
            e->scan = s = w;
            e->pub.scan = s;
            rc = wrc;
            ex = CKPT_SCAN_EXIT_UNSAFE;
        } else {
            ckpt_scan_free(w);
        }
    }
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

/* Whether NAME ends in ".distcp", a DCP data file by its name. */
static bool distcp_name(const char *name)
{
    size_t n = strlen(name);
    return n > 7 && strcmp(name + n - 7, ".distcp") == 0;
}

/* A folder: an entry for each file under it, and for each path that cannot
 * be read; a folder entry when it holds no checkpoint. */
static int scan_folder(ckpt_scan_paths *p, const char *dir)
{
    file_list fl = {0};
    dir_id none = {0, 0};
    char *root = realpath(dir, NULL);
    if (!root) {
        int e = errno;
        if (e == ENOMEM)
            return ckpt_oom(&p->err);
        return entry_note(p, strdup(dir), CKPT_SCAN_ENTRY_FOLDER,
                          strdup(e == ENOENT ? "cannot list the folder: No such file or directory"
                                             : "cannot list the folder"),
                          CKPT_ERR_IO, CKPT_SCAN_EXIT_IO);
    }
    walk(p, dir, &fl, &none, 0, root);
    free(root);
    if (fl.err) {
        file_list_free(&fl);
        return ckpt_oom(&p->err);
    }
    if (fl.n > 1)
        qsort(fl.f, fl.n, sizeof *fl.f, found_cmp);
    if (fl.nnamed > 1)
        qsort(fl.named, fl.nnamed, sizeof *fl.named, str_cmp);
    size_t first = p->n, files = 0, nfound = fl.n;
    int rc = CKPT_OK;
    for (size_t k = 0; k < fl.n && rc == CKPT_OK; k++) {
        found *x = &fl.f[k];
        char *path = x->path;
        x->path = NULL; /* taken */
        if (x->problem) {
            char *msg = x->problem;
            x->problem = NULL;
            rc = entry_note(p, path, CKPT_SCAN_ENTRY_REFUSED, msg, x->code, x->exit);
            continue;
        }
        bool items = distcp_name(path) ||
                     (fl.nnamed && bsearch(&path, fl.named, fl.nnamed, sizeof *fl.named, str_cmp));
        rc = scan_one(p, path, true, items);
        files += rc == CKPT_OK && p->entries[p->n - 1].pub.kind != CKPT_SCAN_ENTRY_SKIPPED;
    }
    file_list_free(&fl);
    bool problems = false;
    for (size_t i = first; i < p->n; i++)
        problems |= p->entries[i].pub.kind != CKPT_SCAN_ENTRY_SKIPPED &&
                    p->entries[i].pub.kind != CKPT_SCAN_ENTRY_FILE;
    if (rc == CKPT_OK && files == 0 && !problems) {
        char msg[200];
        snprintf(msg, sizeof msg, "no checkpoint in the folder: %zu file%s, none that "
                 "torch.load or a folder's loader would read", nfound, nfound == 1 ? "" : "s");
        rc = entry_note(p, strdup(dir), CKPT_SCAN_ENTRY_FOLDER, strdup(msg), CKPT_ERR_FORMAT,
                        CKPT_SCAN_EXIT_UNREADABLE);
    }
    return rc;
}

/* A shard index named alone (X.index.json): the set, as transformers
 * loads it: the index (JSON: left out, with the reason), then each file
 * its weight_map names, once, in name order, an unsafe entry for each that
 * leads out of its folder.  False (nothing added) when PATH is no index
 * transformers could read: then it is scanned as any file. */
static int scan_index(ckpt_scan_paths *p, const char *path, bool *done)
{
    *done = false;
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    char *prefix = slash ? strndup(path, (size_t)(slash - path) + 1) : strdup("");
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    file_list fl = {0};
    bool is_index = dfd >= 0 && prefix &&
                    named_by_index(dir, dfd, slash ? slash + 1 : path, &fl, prefix);
    if (dfd >= 0)
        close(dfd);
    free(dir);
    free(prefix);
    int rc = CKPT_OK;
    if (fl.err) {
        rc = ckpt_oom(&p->err);
    } else if (is_index) {
        *done = true;
        if (fl.n > 1)
            qsort(fl.f, fl.n, sizeof *fl.f, found_cmp);
        char *self = strdup(path);
        rc = self ? scan_one(p, self, true, false) : ckpt_oom(&p->err);
        for (size_t k = 0; k < fl.n && rc == CKPT_OK; k++) {
            found *x = &fl.f[k];
            if (k && strcmp(x->path, fl.f[k - 1].path) == 0)
                continue; /* a shard holds many names */
            char *one = strdup(x->path);
            if (!one)
                rc = ckpt_oom(&p->err);
            else if (x->problem)
                rc = entry_note(p, one, CKPT_SCAN_ENTRY_REFUSED, strdup(x->problem), x->code,
                                x->exit);
            else
                rc = scan_one(p, one, false, false);
        }
    }
    file_list_free(&fl);
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
            /* a folder checkpoint (DCP, DeepSpeed, a snapshot): every file under it */
            rc = scan_folder(p, p->paths[i]);
        } else {
            bool done = false;
            if (ckpt_path_has_suffix(p->paths[i], ".index.json"))
                rc = scan_index(p, p->paths[i], &done); /* the set it names */
            char *path = done || rc != CKPT_OK ? NULL : strdup(p->paths[i]);
            if (!done && rc == CKPT_OK)
                rc = path ? scan_one(p, path, false, false) : ckpt_oom(&p->err);
        }
    }
    /* the worst status, except that anything unsafe or ambiguous is 1
     * whatever else failed (doc/design.md): a CI job must not take a
     * run's 4 for "some file was missing" when another would run code */
    bool unsafe = false;
    for (size_t i = 0; i < p->n; i++) {
        unsafe |= p->entries[i].pub.exit == CKPT_SCAN_EXIT_UNSAFE;
        if (p->entries[i].pub.exit > p->exit)
            p->exit = p->entries[i].pub.exit;
    }
    if (unsafe)
        p->exit = CKPT_SCAN_EXIT_UNSAFE;
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


static cJSON *str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

/* ", "-separated tags as a JSON array (NULL: empty) */
static cJSON *tag_array(const char *list)
{
    cJSON *a = cJSON_CreateArray();
    for (const char *p = list ? list : ""; a && *p;) {
        size_t n = strcspn(p, ",");
        char tag[64];
        snprintf(tag, sizeof tag, "%.*s", (int)(n < 63 ? n : 63), p);
        if (!ckpt_json_append(a, cJSON_CreateString(tag))) {
            cJSON_Delete(a);
            return NULL;
        }
        p += n;
        while (*p == ',' || *p == ' ')
            p++;
    }
    return a;
}

static bool verdict_json(cJSON *o, const ckpt_torch_verdict *v)
{
    bool ok = ckpt_json_put(o, "model", cJSON_CreateString(v->model));
    ok &= ckpt_json_put(o, "accepted", cJSON_CreateBool(v->accepted));
    ok &= ckpt_json_put(o, "via", cJSON_CreateString(v->via));
    if (!v->accepted) {
        ok &= ckpt_json_put(o, "stop", cJSON_CreateString(v->stop));
        ok &= ckpt_json_put(o, "global", str_or_null(v->global));
        if (v->opcode >= 0) {
            ok &= ckpt_json_put(o, "opcode", ckpt_json_int(v->opcode));
            ok &= ckpt_json_put(o, "opcode_name", cJSON_CreateString(v->opcode_name));
        } else {
            ok &= ckpt_json_put(o, "opcode", cJSON_CreateNull());
        }
        if (v->pickle) {
            ok &= ckpt_json_put(o, "pickle", cJSON_CreateString(v->pickle));
            ok &= ckpt_json_put(o, "offset", ckpt_json_int((long long)v->offset));
        }
        ok &= ckpt_json_put(o, "exception", cJSON_CreateString(v->exception));
        ok &= ckpt_json_put(o, "message", cJSON_CreateString(v->message ? v->message : ""));
        ok &= ckpt_json_put(o, "reason", cJSON_CreateString(v->reason ? v->reason : ""));
        ok &= ckpt_json_put(o, "fix", str_or_null(v->fix));
    }
    if (v->accepted && v->fix) /* storages this machine lacks */
        ok &= ckpt_json_put(o, "fix", cJSON_CreateString(v->fix));
    if (v->note)
        ok &= ckpt_json_put(o, "note", cJSON_CreateString(v->note));
    if (v->malformed)
        ok &= ckpt_json_put(o, "malformed", cJSON_CreateString(v->malformed));
    ok &= ckpt_json_put(o, "devices", tag_array(v->devices));
    ok &= ckpt_json_put(o, "missing_here", tag_array(v->missing_here));
    return ok;
}

/* The torch_load object; NULL when out of memory. */
static cJSON *torch_load_json(const ckpt_torch_load *t)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL;
    if (ok && !ckpt_torch_load_verdict(t, CKPT_TORCH_2_6)) {
        ok = ckpt_json_put(o, "error", cJSON_CreateString(ckpt_torch_load_error_message(t)));
    } else {
        for (int i = 0; ok && i < CKPT_TORCH_COUNT_; i++) {
            const ckpt_torch_verdict *v = ckpt_torch_load_verdict(t, (ckpt_torch)i);
            cJSON *vo = cJSON_CreateObject();
            ok = vo && verdict_json(vo, v);
            ok = ckpt_json_put(o, v->version, vo) && ok;
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
    bool ok = ckpt_json_put(g, "global", cJSON_CreateString(h->global));
    ok &= ckpt_json_put(g, "class", cJSON_CreateString(h->cls == CKPT_GLOBAL_INTERPRETED ? "interpreted"
                                             : h->cls == CKPT_GLOBAL_KNOWN_DATA ? "known data"
                                                                                : "unknown"));
    ok &= ckpt_json_put(g, "dangerous", cJSON_CreateBool(h->dangerous));
    ok &= ckpt_json_put(g, "pickle", cJSON_CreateString(h->pickle));
    ok &= ckpt_json_put(g, "offset", ckpt_json_int((long long)h->offset));
    ok &= ckpt_json_put(g, "opcode", cJSON_CreateString(h->opcode));
    cJSON *uses = cJSON_CreateArray();
    if (uses && (h->uses & CKPT_SCAN_CALLED))
        ok &= ckpt_json_append(uses, cJSON_CreateString("call"));
    if (uses && (h->uses & CKPT_SCAN_BUILT))
        ok &= ckpt_json_append(uses, cJSON_CreateString("build"));
    ok &= ckpt_json_put(g, "uses", uses);
    if (h->used_by) {
        ok &= ckpt_json_put(g, "used_by", cJSON_CreateString(h->used_by));
        ok &= ckpt_json_put(g, "use_offset", ckpt_json_int((long long)h->use_offset));
    }
    ok &= ckpt_json_put(g, "count", ckpt_json_int((long long)h->count));
    if (h->reading)
        ok &= ckpt_json_put(g, "reading", cJSON_CreateString(h->reading));
    ok &= ckpt_json_put(g, "computed_by", str_or_null(h->computed_by));
    return ok;
}

static bool reading_json(cJSON *o, const ckpt_scan_reading *r)
{
    bool ok = ckpt_json_put(o, "reader", cJSON_CreateString(r->reader));
    ok &= ckpt_json_put(o, "who", cJSON_CreateString(r->who));
    ok &= ckpt_json_put(o, "primary", cJSON_CreateBool(r->primary));
    ok &= ckpt_json_put(o, "result", cJSON_CreateString(r->code == CKPT_OK ? "read" : "stops"));
    ok &= ckpt_json_put(o, "error", str_or_null(r->error));
    ok &= ckpt_json_put(o, "pickles", ckpt_json_int((long long)r->pickles));
    ok &= ckpt_json_put(o, "unsafe", cJSON_CreateBool(r->unsafe));
    return ok;
}

/* One file's object of the document, into O. */
static bool entry_json(cJSON *o, const entry *e)
{
    const ckpt_scan *s = e->scan;
    bool ok = ckpt_json_put(o, "file", cJSON_CreateString(e->path));
    ok &= ckpt_json_put(o, "format", cJSON_CreateString(e->pub.format));
    if (ckpt_scan_format(s) == CKPT_FORMAT_TORCHSCRIPT)
        ok &= ckpt_json_put(o, "note", cJSON_CreateString(TORCHSCRIPT_NOTE));
    /* extra information: the verdict and the exit status do not depend on it */
    if (e->torch_load)
        ok &= ckpt_json_put(o, "torch_load", torch_load_json(e->torch_load));
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_pickle_count(s); i++)
        ok &= ckpt_json_append(a, cJSON_CreateString(ckpt_scan_pickle_name(s, i)));
    ok &= ckpt_json_put(o, "pickles", a);
    a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_hit_count(s); i++) {
        cJSON *g = cJSON_CreateObject();
        ok &= g && hit_json(g, ckpt_scan_hit_at(s, i));
        ok &= ckpt_json_append(a, g);
    }
    ok &= ckpt_json_put(o, "globals", a);
    a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_reading_count(s); i++) {
        cJSON *r = cJSON_CreateObject();
        ok &= r && reading_json(r, ckpt_scan_reading_at(s, i));
        ok &= ckpt_json_append(a, r);
    }
    ok &= ckpt_json_put(o, "readings", a);
    a = cJSON_CreateArray();
    for (size_t i = 0; a && i < ckpt_scan_ambiguity_count(s); i++)
        ok &= ckpt_json_append(a, cJSON_CreateString(ckpt_scan_ambiguity_at(s, i)));
    ok &= ckpt_json_put(o, "ambiguities", a);
    a = cJSON_CreateArray(); /* code a loader runs besides the pickles (TorchScript) */
    for (size_t i = 0; a && i < ckpt_scan_code_count(s); i++)
        ok &= ckpt_json_append(a, cJSON_CreateString(ckpt_scan_code_at(s, i)));
    ok &= ckpt_json_put(o, "code", a);
    ok &= ckpt_json_put(o, "verdict", cJSON_CreateString(e->pub.verdict));
    ok &= ckpt_json_put(o, "error", str_or_null(e->pub.error));
    ok &= ckpt_json_put(o, "exit", ckpt_json_int(e->pub.exit));
    return ok;
}

/* A FOLDER or REFUSED entry's object: the shape of a file's, empty. */
static bool note_json(cJSON *o, const entry *e)
{
    bool ok = ckpt_json_put(o, "file", cJSON_CreateString(e->path));
    ok &= ckpt_json_put(o, "format", cJSON_CreateString("unknown"));
    ok &= ckpt_json_put(o, "pickles", cJSON_CreateArray());
    ok &= ckpt_json_put(o, "globals", cJSON_CreateArray());
    ok &= ckpt_json_put(o, "readings", cJSON_CreateArray());
    ok &= ckpt_json_put(o, "ambiguities", cJSON_CreateArray());
    ok &= ckpt_json_put(o, "verdict", cJSON_CreateString(e->pub.verdict));
    ok &= ckpt_json_put(o, "reason", cJSON_CreateString(e->pub.reason));
    ok &= ckpt_json_put(o, "error", str_or_null(e->pub.error));
    ok &= ckpt_json_put(o, "exit", ckpt_json_int(e->pub.exit));
    return ok;
}

const char *ckpt_scan_entry_outcome(const ckpt_scan_entry *e)
{
    if (!e)
        return NULL;
    if (e->kind == CKPT_SCAN_ENTRY_SKIPPED)
        return "skipped";
    switch (e->exit) {
    case CKPT_SCAN_EXIT_SAFE: return "safe";
    case CKPT_SCAN_EXIT_UNREADABLE: return "unreadable";
    case CKPT_SCAN_EXIT_IO: return "not_read";
    default: return e->verdict && strcmp(e->verdict, "ambiguous") == 0 ? "ambiguous" : "unsafe";
    }
}

/* {"files": N, and the count of each outcome, 0 included}: the run's summary. */
static cJSON *summary_json(const ckpt_scan_paths *p)
{
    static const char *const outcomes[] = {"unsafe", "ambiguous", "unreadable", "not_read",
                                           "safe", "skipped"};
    cJSON *o = cJSON_CreateObject();
    bool ok = o && ckpt_json_put(o, "files", ckpt_json_int((long long)p->n));
    for (size_t k = 0; ok && k < sizeof outcomes / sizeof *outcomes; k++) {
        long long n = 0;
        for (size_t i = 0; i < p->n; i++)
            n += strcmp(ckpt_scan_entry_outcome(&p->entries[i].pub), outcomes[k]) == 0;
        ok = ckpt_json_put(o, outcomes[k], ckpt_json_int(n));
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The error object of every ckpt command's --json document (doc/design.md,
 * "JSON"), for a run that exits 3 or 4: the first entry that failed with the
 * run's status, else the error that stopped the run. */
static cJSON *error_json(const ckpt_scan_paths *p)
{
    const entry *failed = NULL;
    for (size_t i = 0; !failed && i < p->n; i++)
        if (p->entries[i].pub.exit == p->exit && p->entries[i].pub.error)
            failed = &p->entries[i];
    cJSON *o = cJSON_CreateObject();
    bool ok = o && ckpt_json_put(o, "exit", ckpt_json_int(p->exit));
    ok = ok && ckpt_json_put(o, "command", cJSON_CreateString("scan"));
    ok = ok && ckpt_json_put(o, "file", failed ? cJSON_CreateString(failed->path) : cJSON_CreateNull());
    ok = ok && ckpt_json_put(o, "message", cJSON_CreateString(failed ? failed->pub.error
                                                    : p->err.msg[0] ? p->err.msg
                                                    : "out of memory"));
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

char *ckpt_scan_paths_to_json(const ckpt_scan_paths *p)
{
    if (!p)
        return NULL;
    cJSON *root = cJSON_CreateObject();
    bool ok = root && ckpt_json_put(root, "files", cJSON_CreateArray());
    cJSON *files = ok ? cJSON_GetObjectItemCaseSensitive(root, "files") : NULL;
    cJSON *skipped = ok && ckpt_json_put(root, "skipped", cJSON_CreateArray())
                         ? cJSON_GetObjectItemCaseSensitive(root, "skipped") : NULL;
    ok = ok && skipped;
    for (size_t i = 0; ok && i < p->n; i++) {
        const entry *e = &p->entries[i];
        cJSON *o = cJSON_CreateObject();
        if (e->pub.kind == CKPT_SCAN_ENTRY_SKIPPED) { /* listed with the reason, no verdict */
            ok = o && ckpt_json_put(o, "file", cJSON_CreateString(e->path));
            ok = ok && ckpt_json_put(o, "reason", cJSON_CreateString(e->pub.reason));
            ok = ckpt_json_append(skipped, o) && ok;
            continue;
        }
        /* a path not read (a folder's error, a FIFO, a name leading out):
         * a file object of its own, with nothing found in it */
        ok = o && (e->pub.kind == CKPT_SCAN_ENTRY_FILE ? entry_json(o, e) : note_json(o, e));
        ok = ckpt_json_append(files, o) && ok;
    }
    ok = ok && ckpt_json_put(root, "exit", ckpt_json_int(p->exit));
    ok = ok && ckpt_json_put(root, "summary", summary_json(p));
    if (ok && p->exit >= CKPT_SCAN_EXIT_UNREADABLE)
        ok = ckpt_json_put(root, "error", error_json(p));
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return print(root);
}
