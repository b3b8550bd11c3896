/* cli.c - messages, exit codes and the options shared by every command. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *cli_escape(const char *s, char *buf, size_t cap)
{
    /* names come from the file: a newline or an ESC must not reach the
     * terminal as such (one line per message, no escape sequences) */
    size_t o = 0;
    if (cap < 8)
        return "";
    for (; *s && o + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    if (*s) { /* cut: never silently, never inside a UTF-8 character */
        while (o > 0 && ((unsigned char)buf[o - 1] & 0xc0) == 0x80)
            o--;
        if (o > 0 && (unsigned char)buf[o - 1] >= 0xc0)
            o--;
        memcpy(buf + o, "\xe2\x80\xa6", 3); /* ... */
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

void cli_error(const char *cmd, const char *file, const char *fmt, ...)
{
    char msg[2048], esc[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ckpt: %s: ", cmd);
    if (file)
        fprintf(stderr, "%s: ", cli_escape(file, esc, sizeof esc));
    fprintf(stderr, "%s\n", cli_escape(msg, esc, sizeof esc));
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ckpt: %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'ckpt %s --help')\n", cmd);
    return CLI_EXIT_USAGE;
}

int cli_bad_option(const char *cmd, int opt, char **argv)
{
    const char *text = optind > 0 ? argv[optind - 1] : "?";
    if (opt == ':')
        return cli_usage_error(cmd, "option '%s' needs an argument", text);
    if (optopt)
        return cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return cli_usage_error(cmd, "unknown option '%s'", text);
}

int cli_exit_for(int status)
{
    switch (status) {
    case CKPT_OK:
        return CLI_EXIT_OK;
    case CKPT_ERR_USAGE:
        return CLI_EXIT_USAGE;
    case CKPT_ERR_IO:
    case CKPT_ERR_NOMEM:
    case CKPT_ERR_DEVICE:
        return CLI_EXIT_IO;
    default:
        return CLI_EXIT_BAD_INPUT;
    }
}

/* A reading limit's value: a positive number, with a K, M or G suffix (powers
 * of 1024) when SIZES.  1, or -1 after a usage error. */
static int cli_limit_arg(const char *cmd, const char *name, const char *arg, bool sizes,
                         unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || end == arg || v == 0 || arg[0] == '-') {
        cli_usage_error(cmd, "%s needs a positive number, got '%s'", name, arg);
        return -1;
    }
    int shift = 0;
    switch (sizes ? *end : 0) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end || v > (ULLONG_MAX >> shift)) {
        cli_usage_error(cmd, sizes ? "%s needs a number (K, M, G suffixes), got '%s'"
                                   : "%s needs a whole number, got '%s'", name, arg);
        return -1;
    }
    *out = v << shift;
    return 1;
}

int cli_common_option(const char *cmd, int opt, const char *arg, cli_common *c)
{
    switch (opt) {
    case CLI_OPT_ALLOW_GLOBAL: {
        if (!strchr(arg, '.')) {
            cli_usage_error(cmd, "--allow-global needs MODULE.NAME, got '%s'", arg);
            return -1;
        }
        const char **a = realloc(c->allow, (c->nallow + 1) * sizeof(*a));
        if (!a) {
            cli_error(cmd, NULL, "out of memory");
            return -1;
        }
        c->allow = a;
        c->allow[c->nallow++] = arg;
        return 1;
    }
    case CLI_OPT_ALLOW_UNKNOWN:
        c->allow_unknown = true;
        return 1;
    case CLI_OPT_QUIET:
        c->quiet = true;
        return 1;
    case CLI_OPT_MAX_PICKLE_BYTES:
        return cli_limit_arg(cmd, "--max-pickle-bytes", arg, true, &c->max_pickle_bytes);
    case CLI_OPT_MAX_DEPTH:
        return cli_limit_arg(cmd, "--max-depth", arg, false, &c->max_depth);
    default:
        return 0;
    }
}

void cli_common_free(cli_common *c)
{
    free(c->allow);
    c->allow = NULL;
    c->nallow = 0;
}

int cli_open(const char *cmd, const char *path, const cli_common *c, ckpt_file **out)
{
    *out = NULL;
    ckpt_file *f = ckpt_file_new();
    if (!f) {
        cli_error(cmd, path, "out of memory");
        return CLI_EXIT_IO;
    }
    int rc = CKPT_OK;
    for (size_t i = 0; i < c->nallow && rc == CKPT_OK; i++)
        rc = ckpt_file_allow_global(f, c->allow[i]);
    if (rc == CKPT_OK)
        rc = ckpt_file_set_allow_unknown(f, c->allow_unknown);
    if (rc == CKPT_OK && c->max_pickle_bytes)
        rc = ckpt_file_set_limit(f, CKPT_LIMIT_PICKLE_BYTES, c->max_pickle_bytes);
    if (rc == CKPT_OK && c->max_depth)
        rc = ckpt_file_set_limit(f, CKPT_LIMIT_DEPTH, c->max_depth);
    if (rc == CKPT_OK)
        rc = ckpt_file_open(f, path);
    if (rc != CKPT_OK) {
        cli_error(cmd, path, "%s", ckpt_file_error_message(f)[0] ? ckpt_file_error_message(f)
                                                                  : ckpt_strerror(rc));
        ckpt_file_free(f);
        return cli_exit_for(rc);
    }
    /* what the reader noticed without refusing the file: once, on stderr */
    for (size_t i = 0; !c->quiet && i < ckpt_file_notice_count(f); i++)
        cli_error(cmd, path, "note: %s", ckpt_file_notice(f, i));
    *out = f;
    return CLI_EXIT_OK;
}

const char *cli_human_bytes(unsigned long long n, char *buf, size_t cap)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (n < 1024) {
        snprintf(buf, cap, "%llu B", n);
        return buf;
    }
    double v = (double)n;
    int u = -1;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, "%.1f %s", v, units[u]);
    return buf;
}

cJSON *cli_json_int(long long v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", v);
    return cJSON_CreateRaw(buf);
}

cJSON *cli_json_dims(const int64_t *d, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cli_json_int(d[i]));
    return a;
}

struct cJSON *cli_torch_load_json(const char *path)
{
    ckpt_torch_load *t = ckpt_torch_load_new();
    char *text = NULL;
    if (t) {
        ckpt_torch_load_check(t, path); /* a failed check is the object's "error" */
        text = ckpt_torch_load_to_json(t);
    }
    ckpt_torch_load_free(t);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!o) {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", "out of memory");
    }
    return o;
}

void cli_torch_load_print(const char *path, const char *indent)
{
    ckpt_torch_load *t = ckpt_torch_load_new();
    char e1[512], e2[512], e3[1024];
    if (!t || ckpt_torch_load_check(t, path) != CKPT_OK) {
        printf("%storch.load: not modelled: %s\n", indent,
               t ? cli_escape(ckpt_torch_load_error_message(t), e1, sizeof e1) : "out of memory");
        ckpt_torch_load_free(t);
        return;
    }
    for (int i = 0; i < CKPT_TORCH_COUNT_; i++) {
        const ckpt_torch_verdict *v = ckpt_torch_load_verdict(t, (ckpt_torch)i);
        printf("%storch.load (%s, %s): ", indent, v->version,
               strcmp(v->via, "weights-only unpickler") == 0 ? "weights-only" : v->via);
        if (v->accepted) {
            printf("accepted");
        } else {
            printf("refused");
            if (v->global)
                printf(" at GLOBAL %s", cli_escape(v->global, e1, sizeof e1));
            else if (v->opcode >= 0)
                printf(" at %s (%d)", v->opcode_name, v->opcode);
            if (v->pickle)
                printf(" in %s at byte %llu", cli_escape(v->pickle, e2, sizeof e2),
                       (unsigned long long)v->offset);
            /* the unpickler's own words: torch's wrapping adds a page of advice */
            printf(" -- %s: %s", v->exception, cli_escape(v->reason ? v->reason : "", e3, sizeof e3));
            if (v->fix)
                printf("; fix: %s", cli_escape(v->fix, e3, sizeof e3));
        }
        if (v->malformed)
            printf(" by the unpickler, but ckpt finds it malformed (%s): torch most likely "
                   "refuses it", cli_escape(v->malformed, e3, sizeof e3));
        if (v->note)
            printf(" (%s)", cli_escape(v->note, e3, sizeof e3));
        printf("\n");
    }
    ckpt_torch_load_free(t);
}
