/* cli.c - messages, exit codes and the options shared by every command. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <stdlib.h>
#include <string.h>

/* ---- text safe for a terminal ------------------------------------------------------
 * Names come from the file (keys, globals, record and file names, messages
 * quoting them): a newline must not forge an output line, nor ESC or CSI
 * (U+009B) reach the terminal.  One escaping, used by every command: C0
 * controls and DEL as \xNN, C1 controls (U+0080..U+009F) as \u00NN, each byte
 * of invalid UTF-8 (overlong, surrogate, above U+10FFFF, cut) as \xNN; the
 * rest as is.  JSON output is never escaped this way: cJSON writes controls
 * as \uXXXX and every other byte exact. */

typedef struct text_buf {
    char *s;
    size_t len, cap;
    bool oom;
} text_buf;

static void tb_add(text_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = true;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

/* The length of the valid UTF-8 sequence at S (N bytes left), 0 if none. */
static size_t utf8_seq(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        len = 2, min = 0x80, c &= 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, min = 0x800, c &= 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, min = 0x10000, c &= 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (s[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return len;
}

static void escape_into(text_buf *b, const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        size_t run = i; /* printable ASCII goes in runs */
        while (run < n && s[run] >= 0x20 && s[run] < 0x7f)
            run++;
        tb_add(b, str + i, run - i);
        if ((i = run) >= n)
            break;
        unsigned cp;
        size_t len = utf8_seq(s + i, n - i, &cp);
        char e[8];
        if (len == 0 || cp < 0x20 || cp == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", s[i]);
            tb_add(b, e, 4);
            i++;
        } else if (cp >= 0x80 && cp <= 0x9f) {
            snprintf(e, sizeof e, "\\u%04x", cp);
            tb_add(b, e, 6);
            i += len;
        } else {
            tb_add(b, str + i, len);
            i += len;
        }
    }
}

bool cli_needs_escape(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned cp;
        size_t len = utf8_seq(p, strlen((const char *)p), &cp);
        if (len == 0 || cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f))
            return true;
        p += len;
    }
    return false;
}

/* Escaped copies live in a few buffers reused in turn, so that one printf
 * may take several; freed at exit. */
enum { TEXT_SLOTS = 8 };
static text_buf text_slot[TEXT_SLOTS];
static unsigned text_next;

static void text_free(void)
{
    for (int i = 0; i < TEXT_SLOTS; i++)
        free(text_slot[i].s);
}

const char *cli_text(const char *s)
{
    if (!s)
        return "(null)";
    if (!text_slot[0].cap && !text_next)
        atexit(text_free);
    text_buf *b = &text_slot[text_next++ % TEXT_SLOTS];
    b->len = 0;
    b->oom = false;
    tb_add(b, "", 0);
    escape_into(b, s, strlen(s));
    return b->oom ? "(out of memory)" : b->s;
}

/* FMT with every %s and %c argument escaped (width and precision apply:
 * precision to the raw string, width to the escaped one). */
static void format_escaped(text_buf *b, const char *fmt, va_list ap)
{
    const char *p = fmt;
    while (*p) {
        const char *pct = strchr(p, '%');
        if (!pct) {
            tb_add(b, p, strlen(p));
            break;
        }
        tb_add(b, p, (size_t)(pct - p));
        p = pct + 1;
        if (*p == '%') {
            tb_add(b, "%", 1);
            p++;
            continue;
        }
        char spec[64];
        size_t sl = 0;
        spec[sl++] = '%';
        while (*p && strchr("-+ #0", *p) && sl < 8)
            spec[sl++] = *p++;
        int width = 0, prec = -1;
        bool has_width = true;
        if (*p == '*') {
            width = va_arg(ap, int);
            p++;
        } else if (*p >= '0' && *p <= '9') {
            width = (int)strtol(p, (char **)&p, 10);
        } else {
            has_width = false;
        }
        if (*p == '.') {
            p++;
            if (*p == '*') {
                prec = va_arg(ap, int);
                p++;
            } else {
                prec = (int)strtol(p, (char **)&p, 10);
            }
        }
        char len[3] = {0};
        for (size_t k = 0; k < 2 && *p && strchr("hlzjtL", *p); k++)
            len[k] = *p++;
        char conv = *p ? *p++ : 's';
        if (conv == 's' || conv == 'c') {
            char one[2] = {0};
            const char *arg = conv == 'c' ? (one[0] = (char)va_arg(ap, int), one)
                                          : va_arg(ap, const char *);
            if (!arg)
                arg = "(null)";
            size_t n = prec >= 0 && conv == 's' ? strnlen(arg, (size_t)prec)
                                                : (conv == 'c' ? 1 : strlen(arg));
            size_t at = b->len;
            escape_into(b, arg, n);
            /* a negative '*' width is the '-' flag */
            bool left = width < 0 || memchr(spec, '-', sl) != NULL;
            size_t w = width < 0 ? (size_t)-(long)width : (size_t)width, got = b->len - at;
            for (size_t k = got; k < w; k++)
                tb_add(b, " ", 1);
            if (!left && got < w && !b->oom) { /* the padding goes first */
                memmove(b->s + at + (w - got), b->s + at, got);
                memset(b->s + at, ' ', w - got);
            }
            continue;
        }
        if (has_width)
            sl += (size_t)snprintf(spec + sl, sizeof spec - sl, "%d", width);
        if (prec >= 0)
            sl += (size_t)snprintf(spec + sl, sizeof spec - sl, ".%d", prec);
        sl += (size_t)snprintf(spec + sl, sizeof spec - sl, "%s%c", len, conv);
        char num[512];
        int k;
        bool ll = len[0] == 'l' && len[1] == 'l', l = len[0] == 'l' && !len[1];
        switch (conv) {
        case 'd':
        case 'i':
            k = len[0] == 'z' ? snprintf(num, sizeof num, spec, va_arg(ap, ssize_t))
                : len[0] == 'j' ? snprintf(num, sizeof num, spec, va_arg(ap, intmax_t))
                : len[0] == 't' ? snprintf(num, sizeof num, spec, va_arg(ap, ptrdiff_t))
                : ll ? snprintf(num, sizeof num, spec, va_arg(ap, long long))
                : l ? snprintf(num, sizeof num, spec, va_arg(ap, long))
                    : snprintf(num, sizeof num, spec, va_arg(ap, int));
            break;
        case 'u':
        case 'x':
        case 'X':
        case 'o':
            k = len[0] == 'z' ? snprintf(num, sizeof num, spec, va_arg(ap, size_t))
                : len[0] == 'j' ? snprintf(num, sizeof num, spec, va_arg(ap, uintmax_t))
                : len[0] == 't' ? snprintf(num, sizeof num, spec, va_arg(ap, ptrdiff_t))
                : ll ? snprintf(num, sizeof num, spec, va_arg(ap, unsigned long long))
                : l ? snprintf(num, sizeof num, spec, va_arg(ap, unsigned long))
                    : snprintf(num, sizeof num, spec, va_arg(ap, unsigned));
            break;
        case 'p':
            k = snprintf(num, sizeof num, spec, va_arg(ap, void *));
            break;
        default: /* f F e E g G a A */
            k = len[0] == 'L' ? snprintf(num, sizeof num, spec, va_arg(ap, long double))
                              : snprintf(num, sizeof num, spec, va_arg(ap, double));
            break;
        }
        if (k > 0)
            tb_add(b, num, (size_t)k < sizeof num ? (size_t)k : sizeof num - 1);
    }
}

char *cli_vformat(const char *fmt, va_list ap)
{
    text_buf b = {0};
    tb_add(&b, "", 0);
    format_escaped(&b, fmt, ap);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

int cli_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = cli_vformat(fmt, ap);
    va_end(ap);
    if (!s)
        return -1;
    int rc = fputs(s, stdout);
    free(s);
    return rc;
}

/* What the run printed and the first error it met (below, "the error of a run"). */
static struct {
    bool json;          /* the command parsed --json */
    bool json_in_argv;  /* --json on the command line (for usage errors met before it) */
    bool printed;       /* a JSON document went to stdout */
    char *cmd, *file, *message; /* the first error */
} run;

int cli_json_puts(const char *json)
{
    return cli_json_write(json) == EOF ? EOF : putchar('\n');
}

int cli_json_write(const char *json)
{
    run.printed = true;
    /* C1 controls and DEL are written \u00NN, the same string to a JSON
     * reader; bytes that are not UTF-8 stay as they are (a name is exact) */
    const unsigned char *p = (const unsigned char *)json;
    while (*p) {
        const unsigned char *q = p;
        while (*q && *q != 0x7f && !(q[0] == 0xc2 && q[1] >= 0x80 && q[1] <= 0x9f))
            q++;
        if (fwrite(p, 1, (size_t)(q - p), stdout) != (size_t)(q - p))
            return EOF;
        if (!*q)
            break;
        printf("\\u%04x", *q == 0x7f ? 0x7f : q[1]);
        p = q + (*q == 0x7f ? 1 : 2);
    }
    return 0;
}

/* ---- the error of a run, for --json ------------------------------------------------
 * The first error message (notes and warnings are not errors) is kept exact,
 * unescaped, so that under --json the command's one document can carry it
 * (doc/design.md, "JSON"): cli_finish prints {"error": ...} when the command
 * failed and printed no document of its own. */

static void run_free(void)
{
    free(run.cmd);
    free(run.file);
    free(run.message);
}

static void record_error(const char *cmd, const char *file, const char *message)
{
    /* what a reader noticed without refusing the file, and safety warnings, are
     * not the failure */
    if (run.message || strncmp(message, "note: ", 6) == 0 || strncmp(message, "warning: ", 9) == 0)
        return;
    static bool registered;
    if (!registered && atexit(run_free) == 0)
        registered = true;
    run.cmd = strdup(cmd);
    run.file = file ? strdup(file) : NULL;
    run.message = strdup(message);
}

void cli_json_on(void)
{
    run.json = true;
}

void cli_begin(const char *cmd, int argc, char **argv)
{
    static const char *const takes_json[] = {"inspect", "diff", "verify", "scan"};
    bool takes = false;
    for (size_t i = 0; i < sizeof takes_json / sizeof *takes_json; i++)
        takes |= strcmp(cmd, takes_json[i]) == 0;
    /* as getopt_long reads it, before "--": --json or an unambiguous prefix
     * (--js), scan's --format json, or -j alone or bundled with other short
     * options (-qj: those of these commands take no argument, so every
     * letter is an option) */
    for (int i = 1; takes && i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--format=json") == 0 || /* scan's, the same as --json */
            (strcmp(a, "--format") == 0 && i + 1 < argc && strcmp(argv[i + 1], "json") == 0))
            run.json_in_argv = true;
        else if (a[0] == '-' && a[1] == '-')
            run.json_in_argv |= strlen(a) >= 3 && strncmp(a, "--json", strlen(a)) == 0;
        else if (a[0] == '-')
            run.json_in_argv |= strchr(a + 1, 'j') != NULL;
    }
}

cJSON *cli_json_error(int exit, const char *cmd, const char *file, const char *message)
{
    cJSON *e = cJSON_CreateObject();
    if (!e)
        return NULL;
    cJSON_AddItemToObject(e, "exit", cli_json_int(exit));
    cJSON_AddStringToObject(e, "command", cmd);
    if (file)
        cJSON_AddStringToObject(e, "file", file);
    else
        cJSON_AddNullToObject(e, "file");
    cJSON_AddStringToObject(e, "message", message ? message
                                          : exit == CLI_EXIT_USAGE ? "usage error"
                                          : exit == CLI_EXIT_IO ? "I/O or system error"
                                                                : "malformed or refused input");
    return e;
}

cJSON *cli_json_run_error(int exit)
{
    return cli_json_error(exit, run.cmd ? run.cmd : "ckpt", run.file, run.message);
}

int cli_finish(int rc)
{
    bool json = run.json || (rc == CLI_EXIT_USAGE && run.json_in_argv);
    if (!json || run.printed || rc < CLI_EXIT_USAGE)
        return rc;
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cli_json_run_error(rc);
    char *text = root && e && cJSON_AddItemToObject(root, "error", e) ? cJSON_Print(root) : NULL;
    if (!root)
        cJSON_Delete(e);
    cJSON_Delete(root);
    if (text)
        cli_json_puts(text);
    else /* not even that fits: the message on stderr stands */
        fputs("{\"error\": {\"exit\": 4, \"message\": \"out of memory\"}}\n", stdout);
    free(text);
    if (fflush(stdout) != 0 || ferror(stdout))
        return CLI_EXIT_IO;
    return rc;
}

void cli_error(const char *cmd, const char *file, const char *fmt, ...)
{
    /* the whole message escaped: the library's messages quote the file */
    va_list ap;
    va_start(ap, fmt);
    text_buf m = {0};
    tb_add(&m, "", 0);
    {
        va_list aq;
        va_copy(aq, ap);
        int n = vsnprintf(NULL, 0, fmt, aq);
        va_end(aq);
        char *raw = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (raw) {
            vsnprintf(raw, (size_t)n + 1, fmt, ap);
            record_error(cmd, file, raw);
            escape_into(&m, raw, (size_t)n);
            free(raw);
        } else {
            tb_add(&m, "out of memory", 13);
            record_error(cmd, file, "out of memory");
        }
    }
    va_end(ap);
    fprintf(stderr, "ckpt: %s: ", cmd);
    if (file)
        fprintf(stderr, "%s: ", cli_text(file));
    fprintf(stderr, "%s\n", m.oom ? "out of memory" : m.s);
    free(m.s);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ckpt: %s: ", cmd);
    va_start(ap, fmt);
    va_list aq;
    va_copy(aq, ap);
    char *m = cli_vformat(fmt, ap); /* arguments may be file names */
    va_end(ap);
    int n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    va_start(ap, fmt); /* again, unescaped, for the JSON error */
    char *raw = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (raw)
        vsnprintf(raw, (size_t)n + 1, fmt, ap);
    va_end(ap);
    record_error(cmd, NULL, raw ? raw : "out of memory");
    free(raw);
    fputs(m ? m : "out of memory", stderr);
    free(m);
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

/* SIZE (doc/design.md, "Command line"): a whole number of bytes, or with a
 * unit: K M G T (powers of 1024, as before), KB MB GB TB (powers of 1000, as
 * transformers' max_shard_size="5GB" means 5e9), KiB MiB GiB TiB.  Units are
 * case-sensitive: transformers reads a lower-case "b" as bits. */
int cli_size_arg(const char *cmd, const char *name, const char *arg, unsigned long long *out)
{
    static const struct {
        const char *unit;
        unsigned long long mul;
    } units[] = {
        {"", 1},
        {"K", 1ull << 10}, {"M", 1ull << 20}, {"G", 1ull << 30}, {"T", 1ull << 40},
        {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
        {"KB", 1000ull}, {"MB", 1000000ull}, {"GB", 1000000000ull}, {"TB", 1000000000000ull},
    };
    char *end;
    errno = 0;
    unsigned long long v = arg[0] >= '0' && arg[0] <= '9' ? strtoull(arg, &end, 10) : 0;
    if (v == 0 || errno) {
        cli_usage_error(cmd, "%s needs a positive size (bytes, or K M G T, KB MB GB TB, "
                             "KiB MiB GiB TiB), got '%s'", name, arg);
        return -1;
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcmp(end, units[i].unit) == 0) {
            if (v > ULLONG_MAX / units[i].mul) {
                cli_usage_error(cmd, "%s: '%s' is too large", name, arg);
                return -1;
            }
            *out = v * units[i].mul;
            return 1;
        }
    cli_usage_error(cmd, "%s: '%s' has no known unit (K M G T: powers of 1024; KB MB GB TB: "
                         "powers of 1000; KiB MiB GiB TiB)", name, arg);
    return -1;
}

/* A count limit's value: a positive whole number.  1, or -1 after a usage error. */
static int cli_count_arg(const char *cmd, const char *name, const char *arg,
                         unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || end == arg || v == 0 || arg[0] == '-' || *end) {
        cli_usage_error(cmd, "%s needs a positive whole number, got '%s'", name, arg);
        return -1;
    }
    *out = v;
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
        return cli_size_arg(cmd, "--max-pickle-bytes", arg, &c->max_pickle_bytes);
    case CLI_OPT_MAX_HEADER_BYTES:
        return cli_size_arg(cmd, "--max-header-bytes", arg, &c->max_header_bytes);
    case CLI_OPT_MAX_DEPTH:
        return cli_count_arg(cmd, "--max-depth", arg, &c->max_depth);
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
    if (rc == CKPT_OK && c->max_header_bytes)
        rc = ckpt_file_set_limit(f, CKPT_LIMIT_HEADER_BYTES, c->max_header_bytes);
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

bool cli_reading_is_default(const cli_common *c)
{
    return !c->nallow && !c->allow_unknown && !c->max_pickle_bytes && !c->max_header_bytes &&
           !c->max_depth;
}

struct cJSON *cli_torch_load_json(const char *path, const ckpt_file *f)
{
    ckpt_torch_load *t = ckpt_torch_load_new();
    char *text = NULL;
    if (t && f)
        ckpt_torch_load_use_file(t, f);
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

void cli_torch_load_print(const char *path, const ckpt_file *f, const char *indent)
{
    ckpt_torch_load *t = ckpt_torch_load_new();
    if (t && f)
        ckpt_torch_load_use_file(t, f);
    if (!t || ckpt_torch_load_check(t, path) != CKPT_OK) {
        cli_printf("%storch.load: not modelled: %s\n", indent,
                   t ? ckpt_torch_load_error_message(t) : "out of memory");
        ckpt_torch_load_free(t);
        return;
    }
    for (int i = 0; i < CKPT_TORCH_COUNT_; i++) {
        const ckpt_torch_verdict *v = ckpt_torch_load_verdict(t, (ckpt_torch)i);
        cli_printf("%storch.load (%s, %s): ", indent, v->version,
                   strcmp(v->via, "weights-only unpickler") == 0 ? "weights-only" : v->via);
        bool lacks = v->missing_here && v->missing_here[0];
        if (v->accepted && lacks) {
            /* torch reads it, then fails on the storages' devices */
            cli_printf("accepted by the unpickler, but not on this machine: %s", v->note);
            if (v->fix)
                cli_printf("; fix: %s", v->fix);
        } else if (v->accepted) {
            cli_printf("accepted");
        } else {
            cli_printf("refused");
            if (v->global)
                cli_printf(" at GLOBAL %s", v->global);
            else if (v->opcode >= 0)
                cli_printf(" at %s (%d)", v->opcode_name, v->opcode);
            if (v->pickle)
                cli_printf(" in %s at byte %llu", v->pickle,
                           (unsigned long long)v->offset);
            /* the unpickler's own words: torch's wrapping adds a page of advice */
            cli_printf(" -- %s: %s", v->exception, v->reason ? v->reason : "");
            if (v->fix)
                cli_printf("; fix: %s", v->fix);
        }
        if (v->malformed)
            cli_printf(" by the unpickler, but ckpt finds it malformed (%s): torch most likely "
                       "refuses it", v->malformed);
        if (v->note && !(v->accepted && lacks))
            cli_printf(" (%s)", v->note);
        cli_printf("\n");
    }
    ckpt_torch_load_free(t);
}
