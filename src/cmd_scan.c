/* cmd_scan.c - ckpt scan: list every global a file's pickles reference and
 * what uses it, classified, without running anything; one verdict per file. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ckpt scan [--json] [--max-pickle-bytes N] [--quiet] FILE...\n"
    "\n"
    "List every global (module.name) the pickles of each FILE would import --\n"
    "through GLOBAL, STACK_GLOBAL (memoized strings resolved), INST and OBJ --\n"
    "with the call or BUILD that uses it, classified as interpreted (what state\n"
    "dicts are made of), known data, or unknown, and unknown ones that can run\n"
    "commands or code marked DANGEROUS.  Nothing in a file is ever run.\n"
    "FILE may be a .pth (zip: every .pkl record; legacy: every pickle), a plain\n"
    "pickle file, or a .safetensors file (header checked; it has no pickle).\n"
    "FILE may be a folder (a torch.distributed.checkpoint or DeepSpeed checkpoint):\n"
    "every file under it, each DCP data file (*.distcp) item by item.\n"
    "\n"
    "Exit status: 0 every file holds only interpreted and known-data globals,\n"
    "1 a file holds anything else, 3 a file cannot be read as any of these\n"
    "(nothing unsafe found first), 4 a file cannot be opened; the worst wins.\n"
    "\n"
    "  --json                  one JSON document for all files (ckpt-scan(1))\n"
    "  --max-pickle-bytes N    refuse pickles larger than N bytes (default 1G;\n"
    "                          K, M, G suffixes)\n"
    "  --quiet                 print nothing; the exit status tells\n"
    "  --help                  this text\n";

enum { OPT_JSON = CLI_OPT_FIRST_COMMAND_OPTION };

/* scan_one's answer when nothing more can be done (out of memory) */
#define CLI_EXIT_IO_STOP 100

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

/* Every regular file under DIR (links not followed), depth-first. */
static int walk(const char *dir, file_list *fl)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        char *p = malloc(len);
        if (!p) {
            rc = -1;
            break;
        }
        snprintf(p, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            rc = walk(p, fl);
            free(p);
        } else if (lstat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            if (fl->n == fl->cap) {
                size_t cap = fl->cap ? fl->cap * 2 : 64;
                char **q = realloc(fl->names, cap * sizeof(*q));
                if (!q) {
                    free(p);
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

/* Whether some torch reader could take the file: a zip, a tar, a pickle
 * (PROTO), safetensors (an 8-byte length and '{'); else a folder's text. */
static bool checkpoint_like(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return true; /* let the scan say why it cannot be read */
    unsigned char h[512];
    size_t n = fread(h, 1, sizeof h, fp);
    fclose(fp);
    if (n >= 2 && h[0] == 0x80 && h[1] <= 5)
        return true;
    if (n >= 4 && memcmp(h, "PK", 2) == 0)
        return true;
    if (n >= 9 && h[8] == '{')
        return true;
    if (n >= 262 && memcmp(h + 257, "ustar", 5) == 0)
        return true;
    return n == 0 ? false : false;
}

static const char *class_name(const ckpt_scan_hit *h)
{
    switch (h->cls) {
    case CKPT_GLOBAL_INTERPRETED: return "interpreted";
    case CKPT_GLOBAL_KNOWN_DATA: return "known data";
    default: return h->dangerous ? "DANGEROUS" : "unknown";
    }
}

static int file_exit(const ckpt_scan *s, int rc)
{
    /* unsafe content, or readers that would disagree, outrank a parse error */
    if (ckpt_scan_unsafe(s) || ckpt_scan_ambiguity_count(s))
        return CLI_EXIT_DIFFERENT;
    if (rc != CKPT_OK)
        return rc == CKPT_ERR_IO ? CLI_EXIT_IO
               : rc == CKPT_ERR_NOMEM ? CLI_EXIT_IO : CLI_EXIT_BAD_INPUT;
    return CLI_EXIT_OK;
}

static const char *format_text(const ckpt_scan *s)
{
    if (ckpt_scan_is_pickle(s))
        return "pickle";
    ckpt_format f = ckpt_scan_format(s);
    return f == CKPT_FORMAT_UNKNOWN ? "unknown" : ckpt_format_name(f);
}

static void print_text(const char *path, const ckpt_scan *s, int rc)
{
    size_t np = ckpt_scan_pickle_count(s), nh = ckpt_scan_hit_count(s);
    size_t dangerous = 0, unknown = 0, nr = ckpt_scan_reading_count(s);
    size_t na = ckpt_scan_ambiguity_count(s);
    int many = nr > 1;
    printf("%s: %s, %zu pickle%s\n", path, format_text(s), np, np == 1 ? "" : "s");
    for (size_t i = 0; many && i < nr; i++) {
        const ckpt_scan_reading *r = ckpt_scan_reading_at(s, i);
        printf("  reading %s (%s): %s%s\n", r->reader, r->who,
               r->code == CKPT_OK ? "read to the end" : "stops: ", r->error ? r->error : "");
    }
    for (size_t i = 0; i < na; i++)
        printf("  AMBIGUOUS   %s\n", ckpt_scan_ambiguity_at(s, i));
    if (ckpt_scan_format(s) == CKPT_FORMAT_TORCHSCRIPT)
        printf("  TorchScript archive (torch.jit.save): its __torch__.* classes are compiled "
               "from its code/ by torch.jit.load (ckpt never runs them); ckpt inspect and "
               "extract read its state dict as torch.jit.load(f).state_dict() names it, "
               "which differs from the eager model's: non-persistent buffers are included\n");
    for (size_t i = 0; i < nh; i++) {
        const ckpt_scan_hit *h = ckpt_scan_hit_at(s, i);
        printf("  %-11s %s  (%s at %s+%llu", class_name(h), h->global, h->opcode, h->pickle,
               (unsigned long long)h->offset);
        if (h->used_by)
            printf("; %s by %s at +%llu", h->uses & CKPT_SCAN_CALLED ? "called" : "built",
                   h->used_by, (unsigned long long)h->use_offset);
        if (h->count > 1)
            printf("; named %zu times", h->count);
        if (h->computed_by)
            printf("; a name computed at run time by %s", h->computed_by);
        if (many && h->reading)
            printf("; %s reading", h->reading);
        printf(")\n");
        dangerous += h->dangerous;
        unknown += h->cls != CKPT_GLOBAL_INTERPRETED && h->cls != CKPT_GLOBAL_KNOWN_DATA;
    }
    if (unknown)
        printf("  verdict: UNSAFE: %zu unknown global%s, %zu of them dangerous%s%s\n", unknown,
               unknown == 1 ? "" : "s", dangerous,
               rc != CKPT_OK ? " (and the file is malformed after them)" : "",
               na ? "; and readers would see different content" : "");
    else if (na)
        printf("  verdict: AMBIGUOUS: readers would see different content (%zu finding%s): "
               "not safe to call safe\n", na, na == 1 ? "" : "s");
    else if (rc != CKPT_OK)
        printf("  verdict: unreadable: %s\n", ckpt_scan_error_message(s));
    else if (ckpt_scan_format(s) == CKPT_FORMAT_SAFETENSORS)
        printf("  verdict: safe: no pickle (a safetensors header, checked; unpickled from "
               "byte 0, as torch.load does under another name, it runs nothing)\n");
    else
        printf("  verdict: safe: only state-dict (interpreted) and known-data globals\n");
    if (ckpt_scan_format(s) != CKPT_FORMAT_DCP) /* items: DCP's reader loads them, not torch.load */
        cli_torch_load_print(path, "  ");
}

static cJSON *json_file(const char *path, const ckpt_scan *s, int rc)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", path);
    cJSON_AddStringToObject(o, "format", format_text(s));
    if (ckpt_scan_format(s) == CKPT_FORMAT_TORCHSCRIPT)
        cJSON_AddStringToObject(o, "note", "TorchScript archive (torch.jit.save): its __torch__.* "
                                "classes are compiled from its code/ by torch.jit.load; its "
                                "state dict is named as torch.jit.load(f).state_dict(), "
                                "non-persistent buffers included");
    /* extra information: the verdict and the exit status do not depend on it */
    if (ckpt_scan_format(s) != CKPT_FORMAT_DCP)
        cJSON_AddItemToObject(o, "torch_load", cli_torch_load_json(path));
    cJSON *pk = cJSON_AddArrayToObject(o, "pickles");
    for (size_t i = 0; i < ckpt_scan_pickle_count(s); i++)
        cJSON_AddItemToArray(pk, cJSON_CreateString(ckpt_scan_pickle_name(s, i)));
    cJSON *gl = cJSON_AddArrayToObject(o, "globals");
    for (size_t i = 0; i < ckpt_scan_hit_count(s); i++) {
        const ckpt_scan_hit *h = ckpt_scan_hit_at(s, i);
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "global", h->global);
        cJSON_AddStringToObject(g, "class", h->cls == CKPT_GLOBAL_INTERPRETED ? "interpreted"
                                            : h->cls == CKPT_GLOBAL_KNOWN_DATA ? "known data"
                                                                               : "unknown");
        cJSON_AddBoolToObject(g, "dangerous", h->dangerous);
        cJSON_AddStringToObject(g, "pickle", h->pickle);
        cJSON_AddItemToObject(g, "offset", cli_json_int((long long)h->offset));
        cJSON_AddStringToObject(g, "opcode", h->opcode);
        cJSON *uses = cJSON_AddArrayToObject(g, "uses");
        if (h->uses & CKPT_SCAN_CALLED)
            cJSON_AddItemToArray(uses, cJSON_CreateString("call"));
        if (h->uses & CKPT_SCAN_BUILT)
            cJSON_AddItemToArray(uses, cJSON_CreateString("build"));
        if (h->used_by) {
            cJSON_AddStringToObject(g, "used_by", h->used_by);
            cJSON_AddItemToObject(g, "use_offset", cli_json_int((long long)h->use_offset));
        }
        cJSON_AddItemToObject(g, "count", cli_json_int((long long)h->count));
        if (h->reading)
            cJSON_AddStringToObject(g, "reading", h->reading);
        if (h->computed_by)
            cJSON_AddStringToObject(g, "computed_by", h->computed_by);
        else
            cJSON_AddNullToObject(g, "computed_by");
        cJSON_AddItemToArray(gl, g);
    }
    cJSON *rd = cJSON_AddArrayToObject(o, "readings");
    for (size_t i = 0; i < ckpt_scan_reading_count(s); i++) {
        const ckpt_scan_reading *r = ckpt_scan_reading_at(s, i);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "reader", r->reader);
        cJSON_AddStringToObject(e, "who", r->who);
        cJSON_AddBoolToObject(e, "primary", r->primary);
        cJSON_AddStringToObject(e, "result", r->code == CKPT_OK ? "read" : "stops");
        if (r->error)
            cJSON_AddStringToObject(e, "error", r->error);
        else
            cJSON_AddNullToObject(e, "error");
        cJSON_AddItemToObject(e, "pickles", cli_json_int((long long)r->pickles));
        cJSON_AddBoolToObject(e, "unsafe", r->unsafe);
        cJSON_AddItemToArray(rd, e);
    }
    cJSON *am = cJSON_AddArrayToObject(o, "ambiguities");
    for (size_t i = 0; i < ckpt_scan_ambiguity_count(s); i++)
        cJSON_AddItemToArray(am, cJSON_CreateString(ckpt_scan_ambiguity_at(s, i)));
    int ex = file_exit(s, rc);
    cJSON_AddStringToObject(o, "verdict", ex == CLI_EXIT_OK ? "safe"
                                          : ckpt_scan_unsafe(s) ? "unsafe"
                                          : ex == CLI_EXIT_DIFFERENT ? "ambiguous" : "error");
    if (rc != CKPT_OK)
        cJSON_AddStringToObject(o, "error", ckpt_scan_error_message(s));
    else
        cJSON_AddNullToObject(o, "error");
    cJSON_AddItemToObject(o, "exit", cli_json_int((long long)(unsigned long long)ex));
    return o;
}

/* Scan PATH (IN_FOLDER: a file found in a folder), print or add its result;
 * its exit status. */
static int scan_one(const char *path, bool in_folder, int json, cJSON *files,
                    const cli_common *common)
{
    ckpt_scan *s = ckpt_scan_new();
    if (!s) {
        cli_error("scan", NULL, "out of memory");
        return CLI_EXIT_IO_STOP;
    }
    if (common->max_pickle_bytes)
        ckpt_scan_set_limit(s, CKPT_LIMIT_PICKLE_BYTES, common->max_pickle_bytes);
    size_t n = strlen(path);
    int rc;
    if (in_folder && n > 7 && strcmp(path + n - 7, ".distcp") == 0) {
        rc = ckpt_scan_items(s, path); /* a DCP data file: its items, each a zip */
    } else if (in_folder && !checkpoint_like(path)) {
        /* a folder's other files (DeepSpeed's `latest`, a README): no reader of
         * torch's would load them */
        if (!common->quiet && !json)
            printf("%s: skipped: not a zip, tar, safetensors or pickle file\n", path);
        ckpt_scan_free(s);
        return CLI_EXIT_OK;
    } else {
        rc = ckpt_scan_file(s, path);
    }
    int ex = file_exit(s, rc);
    if (rc != CKPT_OK) /* errors even with --quiet, as for every command */
        cli_error("scan", path, "%s", ckpt_scan_error_message(s));
    if (!common->quiet && !(rc == CKPT_ERR_IO && !json)) {
        if (json)
            cJSON_AddItemToArray(files, json_file(path, s, rc));
        else
            print_text(path, s, rc);
    }
    ckpt_scan_free(s);
    return ex;
}

int cmd_scan(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, OPT_JSON},
        CLI_COMMON_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    cli_common common = {0};
    int json = 0, worst = CLI_EXIT_OK, opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        int c = cli_common_option("scan", opt, optarg, &common);
        if (c < 0) {
            cli_common_free(&common);
            return CLI_EXIT_USAGE;
        }
        if (c > 0)
            continue;
        switch (opt) {
        case OPT_JSON:
            json = 1;
            break;
        case CLI_OPT_HELP:
            fputs(usage, stdout);
            cli_common_free(&common);
            return CLI_EXIT_OK;
        default:
            cli_common_free(&common);
            return cli_bad_option("scan", opt, argv);
        }
    }
    if (common.nallow || common.allow_unknown) {
        cli_common_free(&common);
        return cli_usage_error("scan", "--allow-global and --allow-unknown do not apply: scan "
                                       "reports every global and admits none");
    }
    if (optind >= argc) {
        cli_common_free(&common);
        return cli_usage_error("scan", "needs at least one FILE");
    }
    cJSON *root = json ? cJSON_CreateObject() : NULL;
    cJSON *files = root ? cJSON_AddArrayToObject(root, "files") : NULL;
    for (int i = optind; i < argc && worst != CLI_EXIT_IO_STOP; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            /* a folder checkpoint (DCP, DeepSpeed): every file under it */
            file_list fl = {0};
            if (walk(argv[i], &fl) != 0) {
                cli_error("scan", argv[i], "cannot list the folder: %s", strerror(errno));
                if (CLI_EXIT_IO > worst)
                    worst = CLI_EXIT_IO;
            }
            qsort(fl.names, fl.n, sizeof(char *), name_cmp);
            for (size_t k = 0; k < fl.n; k++) {
                int ex = scan_one(fl.names[k], true, json, files, &common);
                worst = ex > worst ? ex : worst;
            }
            file_list_free(&fl);
            continue;
        }
        int ex = scan_one(argv[i], false, json, files, &common);
        if (ex == CLI_EXIT_IO_STOP)
            break;
        worst = ex > worst ? ex : worst;
    }
    if (root) {
        cJSON_AddItemToObject(root, "exit", cli_json_int((long long)(unsigned long long)worst));
        char *text = cJSON_Print(root);
        cJSON_Delete(root);
        if (text) {
            puts(text);
            free(text);
        }
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("scan", NULL, "cannot write output");
        worst = CLI_EXIT_IO;
    }
    cli_common_free(&common);
    return worst;
}
