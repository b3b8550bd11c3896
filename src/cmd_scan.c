/* cmd_scan.c - ckpt scan: list every global a file's pickles reference and
 * what uses it, classified, without running anything; one verdict per file.
 * The engine (folders, which files, verdicts, exit statuses, the JSON) is
 * libckpt's ckpt_scan_paths; this prints its entries. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ckpt scan [--json | --format text|json|sarif] [--max-pickle-bytes N]\n"
    "                 [--max-header-bytes N] [--max-depth N] [--quiet] FILE...\n"
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
    "1 any file holds anything else, whatever else failed; else 4 a file cannot\n"
    "be opened, 3 a file cannot be read as any of these.  With several files the\n"
    "text ends with a count of each verdict (\"3 files: 1 unsafe, 1 unreadable,\n"
    "1 safe\").\n"
    "\n"
    "  -j, --json              one JSON document for all files (ckpt-scan(1))\n"
    "  --format F              text (the default), json (as --json) or sarif (a\n"
    "                          SARIF 2.1.0 log for code-scanning systems)\n"
    "  --max-pickle-bytes SIZE refuse pickles larger than SIZE bytes (default 1G;\n"
    "                          K M G T: powers of 1024, KB MB GB TB: of 1000)\n"
    "  --max-header-bytes N    refuse safetensors headers larger than N bytes\n"
    "                          (default 100000000, as safetensors)\n"
    "  --max-depth N           refuse values nested more than N levels (default\n"
    "                          10000)\n"
    "  -q, --quiet             print nothing; the exit status tells\n"
    "  -h, --help              this text\n";

enum { OPT_FORMAT = CLI_OPT_FIRST_COMMAND_OPTION };

enum { FORMAT_TEXT, FORMAT_JSON, FORMAT_SARIF };

static const char *class_name(const ckpt_scan_hit *h)
{
    switch (h->cls) {
    case CKPT_GLOBAL_INTERPRETED: return "interpreted";
    case CKPT_GLOBAL_KNOWN_DATA: return "known data";
    default: return h->dangerous ? "DANGEROUS" : "unknown";
    }
}

static void print_text(const ckpt_scan_entry *e)
{
    const char *path = e->path;
    const ckpt_scan *s = e->scan;
    int rc = e->code;
    size_t np = ckpt_scan_pickle_count(s), nh = ckpt_scan_hit_count(s);
    size_t dangerous = 0, unknown = 0, nr = ckpt_scan_reading_count(s);
    size_t na = ckpt_scan_ambiguity_count(s);
    int many = nr > 1;
    cli_printf("%s: %s, %zu pickle%s\n", path, e->format, np, np == 1 ? "" : "s");
    for (size_t i = 0; many && i < nr; i++) {
        const ckpt_scan_reading *r = ckpt_scan_reading_at(s, i);
        cli_printf("  reading %s (%s): %s%s\n", r->reader, r->who,
                   r->code == CKPT_OK ? "read to the end" : "stops: ", r->error ? r->error : "");
    }
    for (size_t i = 0; i < na; i++)
        cli_printf("  AMBIGUOUS   %s\n", ckpt_scan_ambiguity_at(s, i));
    size_t ncode = ckpt_scan_code_count(s);
    for (size_t i = 0; i < ncode; i++)
        cli_printf("  CODE        %s\n", ckpt_scan_code_at(s, i));
    if (ckpt_scan_format(s) == CKPT_FORMAT_TORCHSCRIPT)
        cli_printf("  TorchScript archive (torch.jit.save): its __torch__.* classes are compiled "
                   "from its code/ by torch.jit.load (ckpt never runs them); ckpt inspect and "
                   "extract read its state dict as torch.jit.load(f).state_dict() names it, "
                   "which differs from the eager model's: non-persistent buffers are included\n");
    for (size_t i = 0; i < nh; i++) {
        const ckpt_scan_hit *h = ckpt_scan_hit_at(s, i);
        cli_printf("  %-11s %s  (%s at %s+%llu", class_name(h), h->global, h->opcode, h->pickle,
                   (unsigned long long)h->offset);
        if (h->used_by)
            cli_printf("; %s by %s at +%llu", h->uses & CKPT_SCAN_CALLED ? "called" : "built",
                       h->used_by, (unsigned long long)h->use_offset);
        if (h->count > 1)
            cli_printf("; named %zu times", h->count);
        if (h->computed_by)
            cli_printf("; a name computed at run time by %s", h->computed_by);
        if (many && h->reading)
            cli_printf("; %s reading", h->reading);
        cli_printf(")\n");
        dangerous += h->dangerous;
        unknown += h->cls != CKPT_GLOBAL_INTERPRETED && h->cls != CKPT_GLOBAL_KNOWN_DATA;
    }
    if (ncode)
        cli_printf("  verdict: UNSAFE: torch.load runs the code in it (TorchScript, through "
               "torch.jit.load)%s%s; ckpt extract writes its weights only\n",
               unknown ? "; and unknown globals" : "",
               na ? "; and readers would see different content" : "");
    else if (unknown)
        cli_printf("  verdict: UNSAFE: %zu unknown global%s, %zu of them dangerous%s%s\n", unknown,
               unknown == 1 ? "" : "s", dangerous,
               rc != CKPT_OK ? " (and the file is malformed after them)" : "",
               na ? "; and readers would see different content" : "");
    else if (na)
        cli_printf("  verdict: AMBIGUOUS: readers would see different content (%zu finding%s): "
                   "not safe to call safe\n", na, na == 1 ? "" : "s");
    else if (rc != CKPT_OK)
        cli_printf("  verdict: unreadable: %s\n", ckpt_scan_error_message(s));
    else if (ckpt_scan_format(s) == CKPT_FORMAT_SAFETENSORS)
        cli_printf("  verdict: safe: no pickle (a safetensors header, checked; unpickled from "
                   "byte 0, as torch.load does under another name, it runs nothing)\n");
    else
        cli_printf("  verdict: safe: only state-dict (interpreted) and known-data globals\n");
    if (ckpt_scan_format(s) != CKPT_FORMAT_DCP) /* items: DCP's reader loads them, not torch.load */
        cli_torch_load_print(path, NULL, "  ");
}

/* The text's last line with several entries: how many of each outcome, those
 * that are not 0 (ckpt-scan(1)); the JSON's "summary" is the library's. */
static void print_summary(const ckpt_scan_paths *sp)
{
    static const char *const outcome[] = {"unsafe", "ambiguous", "unreadable", "not_read",
                                          "safe", "skipped"};
    size_t total = ckpt_scan_paths_count(sp);
    cli_printf("%zu files:", total);
    const char *sep = " ";
    for (size_t k = 0; k < sizeof outcome / sizeof *outcome; k++) {
        size_t n = 0;
        for (size_t i = 0; i < total; i++)
            n += strcmp(ckpt_scan_entry_outcome(ckpt_scan_paths_entry(sp, i)), outcome[k]) == 0;
        if (n) {
            cli_printf("%s%zu %s", sep, n, strcmp(outcome[k], "not_read") ? outcome[k]
                                                                          : "not read");
            sep = ", ";
        }
    }
    cli_printf("\n");
}

/* The library's document; with --quiet, its files' objects left out. */
static char *scan_json(const ckpt_scan_paths *sp, bool quiet, int worst)
{
    char *text = sp ? ckpt_scan_paths_to_json(sp) : NULL;
    if (!quiet || !text) {
        if (text || sp)
            return text;
        /* no engine at all (out of memory): the error alone */
        cJSON *root = cJSON_CreateObject();
        cJSON_AddItemToObject(root, "error", cli_json_run_error(worst));
        text = cJSON_Print(root);
        cJSON_Delete(root);
        return text;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root)
        return NULL;
    cJSON_ReplaceItemInObjectCaseSensitive(root, "files", cJSON_CreateArray());
    cJSON_DeleteItemFromObjectCaseSensitive(root, "skipped");
    text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

int cmd_scan(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, CLI_OPT_JSON},
        {"format", required_argument, NULL, OPT_FORMAT},
        CLI_COMMON_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    cli_common common = {0};
    int json = 0, format = -1, opt; /* format: -1 until --format */
    opterr = 0;
    while ((opt = getopt_long(argc, argv, CLI_SHORT_OPTIONS_JSON, longopts, NULL)) != -1) {
        int c = cli_common_option("scan", opt, optarg, &common);
        if (c < 0) {
            cli_common_free(&common);
            return CLI_EXIT_USAGE;
        }
        if (c > 0)
            continue;
        switch (opt) {
        case CLI_OPT_JSON:
            json = 1;
            cli_json_on();
            break;
        case OPT_FORMAT: {
            int f = strcmp(optarg, "text") == 0    ? FORMAT_TEXT
                    : strcmp(optarg, "json") == 0  ? FORMAT_JSON
                    : strcmp(optarg, "sarif") == 0 ? FORMAT_SARIF
                                                   : -1;
            if (f < 0 || (format >= 0 && f != format)) {
                cli_common_free(&common);
                return f < 0 ? cli_usage_error("scan", "--format: '%s' is not text, json or "
                                               "sarif", optarg)
                             : cli_usage_error("scan", "--format given twice, differently");
            }
            format = f;
            if (f == FORMAT_JSON) {
                json = 1;
                cli_json_on();
            }
            break;
        }
        case CLI_OPT_HELP:
            fputs(usage, stdout);
            cli_common_free(&common);
            return CLI_EXIT_OK;
        default:
            cli_common_free(&common);
            return cli_bad_option("scan", opt, argv);
        }
    }
    if (json && format >= 0 && format != FORMAT_JSON) {
        cli_common_free(&common);
        return cli_usage_error("scan", "--json and --format %s disagree",
                               format == FORMAT_SARIF ? "sarif" : "text");
    }
    bool sarif = format == FORMAT_SARIF;
    if (common.nallow || common.allow_unknown) {
        cli_common_free(&common);
        return cli_usage_error("scan", "--allow-global and --allow-unknown do not apply: scan "
                                       "reports every global and admits none");
    }
    if (optind >= argc) {
        cli_common_free(&common);
        return cli_usage_error("scan", "needs at least one FILE");
    }
    ckpt_scan_paths *sp = ckpt_scan_paths_new();
    int rc = sp ? CKPT_OK : CKPT_ERR_NOMEM;
    if (sp && common.max_pickle_bytes)
        ckpt_scan_paths_set_limit(sp, CKPT_LIMIT_PICKLE_BYTES, common.max_pickle_bytes);
    if (sp && common.max_header_bytes)
        ckpt_scan_paths_set_limit(sp, CKPT_LIMIT_HEADER_BYTES, common.max_header_bytes);
    if (sp && common.max_depth)
        ckpt_scan_paths_set_limit(sp, CKPT_LIMIT_DEPTH, common.max_depth);
    /* its verdicts are in the JSON document; the text prints its own */
    if (sp)
        ckpt_scan_paths_set_torch_load(sp, json && !common.quiet);
    for (int i = optind; i < argc && rc == CKPT_OK; i++)
        rc = ckpt_scan_paths_add(sp, argv[i]);
    if (rc == CKPT_OK)
        rc = ckpt_scan_paths_run(sp);
    for (size_t i = 0; i < ckpt_scan_paths_count(sp); i++) {
        const ckpt_scan_entry *e = ckpt_scan_paths_entry(sp, i);
        if (e->code != CKPT_OK) /* errors even with --quiet, as for every command */
            cli_error("scan", e->path, "%s", e->error);
        if (common.quiet || json || sarif)
            continue;
        if (e->kind == CKPT_SCAN_ENTRY_SKIPPED)
            cli_printf("%s: skipped: %s\n", e->path, e->reason);
        else if (e->kind != CKPT_SCAN_ENTRY_FILE) /* not read: said why */
            cli_printf("%s: not read\n  verdict: %s: %s\n", e->path,
                   e->exit == CKPT_SCAN_EXIT_UNSAFE ? "UNSAFE" : "unreadable", e->reason);
        else if (e->code != CKPT_ERR_IO)
            print_text(e);
    }
    if (rc != CKPT_OK)
        cli_error("scan", NULL, "%s", sp ? ckpt_scan_paths_error_message(sp) : "out of memory");
    int worst = sp ? ckpt_scan_paths_exit(sp) : CLI_EXIT_IO;
    if (!json && !sarif && !common.quiet && ckpt_scan_paths_count(sp) > 1)
        print_summary(sp);
    if (json) {
        char *text = scan_json(sp, common.quiet, worst);
        if (text) {
            cli_json_puts(text);
            free(text);
        } else {
            cli_error("scan", NULL, "out of memory");
            worst = CLI_EXIT_IO;
        }
    }
    if (sarif) { /* the log, whole, also with --quiet: a CI step uploads it */
        char *text = sp ? ckpt_scan_paths_to_sarif(sp) : NULL;
        if (text) {
            fputs(text, stdout);
            putchar('\n');
            free(text);
        } else {
            cli_error("scan", NULL, "out of memory");
            worst = CLI_EXIT_IO;
        }
    }
    ckpt_scan_paths_free(sp);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("scan", NULL, "cannot write output");
        worst = CLI_EXIT_IO;
    }
    cli_common_free(&common);
    return worst;
}
