/* cli.h - helpers shared by the ckpt subcommands (not part of libckpt). */
#ifndef CKPT_CLI_H
#define CKPT_CLI_H

#include "ckpt.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

/* Exit status (doc/design.md, "Exit status and messages"). */
enum cli_exit {
    CLI_EXIT_OK = 0,
    CLI_EXIT_DIFFERENT = 1, /* the check ran and found a difference / unsafe content */
    CLI_EXIT_USAGE = 2,
    CLI_EXIT_BAD_INPUT = 3, /* malformed, unsupported or refused as unsafe */
    CLI_EXIT_IO = 4
};

/* Options every reading command takes. */
typedef struct cli_common {
    const char **allow;      /* --allow-global MODULE.NAME (argv-owned strings) */
    size_t nallow;
    bool allow_unknown;      /* --allow-unknown */
    bool quiet;              /* --quiet */
    unsigned long long max_pickle_bytes; /* --max-pickle-bytes, 0 = library default */
    unsigned long long max_header_bytes; /* --max-header-bytes, 0 = library default */
    unsigned long long max_depth;        /* --max-depth, 0 = library default */
} cli_common;

/* Long-option values from 256 up, shared so each command's table can list them;
 * those with a short form (doc/design.md, "Command line": -q, -h, -j) are
 * their letter, so that getopt returns the same for both spellings. */
enum {
    CLI_OPT_ALLOW_GLOBAL = 256,
    CLI_OPT_ALLOW_UNKNOWN,
    CLI_OPT_MAX_PICKLE_BYTES,
    CLI_OPT_MAX_HEADER_BYTES,
    CLI_OPT_MAX_DEPTH,
    CLI_OPT_QUIET = 'q',
    CLI_OPT_HELP = 'h',
    CLI_OPT_JSON = 'j', /* the commands that print JSON list it themselves */
    CLI_OPT_FIRST_COMMAND_OPTION = 300
};

/* getopt strings: the common short options, and those of a command that
 * takes --json (each starts with ':' for cli_bad_option). */
#define CLI_SHORT_OPTIONS ":qh"
#define CLI_SHORT_OPTIONS_JSON ":qhj"

#define CLI_COMMON_LONG_OPTIONS                                              \
    {"allow-global", required_argument, NULL, CLI_OPT_ALLOW_GLOBAL},         \
    {"allow-unknown", no_argument, NULL, CLI_OPT_ALLOW_UNKNOWN},             \
    {"max-pickle-bytes", required_argument, NULL, CLI_OPT_MAX_PICKLE_BYTES}, \
    {"max-header-bytes", required_argument, NULL, CLI_OPT_MAX_HEADER_BYTES}, \
    {"max-depth", required_argument, NULL, CLI_OPT_MAX_DEPTH},               \
    {"quiet", no_argument, NULL, CLI_OPT_QUIET},                             \
    {"help", no_argument, NULL, CLI_OPT_HELP}

/*
 * Handle a common option inside a command's getopt loop.  Returns 1 when OPT
 * was one (and was applied), 0 when it is the command's own, -1 on a usage
 * error (already reported).
 */
int cli_common_option(const char *cmd, int opt, const char *arg, cli_common *c);
/* A SIZE option's value (doc/design.md, "Command line": K M G T, KB MB GB TB,
 * KiB MiB GiB TiB) into *OUT: 1, or -1 after a usage error naming NAME. */
int cli_size_arg(const char *cmd, const char *name, const char *arg, unsigned long long *out);
void cli_common_free(cli_common *c);

/* Text safe for a terminal (names read from a file must not put newlines or
 * escape sequences on it): C0 controls and DEL as \xNN, C1 controls as
 * \u00NN, invalid UTF-8 byte by byte as \xNN.  The one escaping of every
 * command's text output; JSON is never escaped this way.
 * cli_text: S escaped, in one of 8 buffers reused in turn (valid for the next
 * 7 calls); cli_printf: printf to stdout with every %s and %c argument
 * escaped (the format's own newlines kept); cli_vformat: the same into a
 * malloc'd string (NULL when out of memory); cli_needs_escape: whether S has
 * anything to escape. */
const char *cli_text(const char *s);
int cli_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *cli_vformat(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
bool cli_needs_escape(const char *s);
/* JSON text and a newline on stdout, C1 controls and DEL as \u00NN (cJSON
 * escapes only C0): the same document, safe on a terminal.  Bytes that are
 * not UTF-8 (a file or record name) are written as they are. */
int cli_json_puts(const char *json);
/* The same without the newline: a part of a document printed in pieces. */
int cli_json_write(const char *json);

/* "ckpt: <cmd>: <file>: <message>" on stderr (file may be NULL), escaped. */
void cli_error(const char *cmd, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* --json: stdout holds exactly one JSON document, also on failure (doc/design.md,
 * "JSON").  cli_begin (main, before the command): notes whether ARGV names
 * --json (or -j, alone or bundled: -qj), so that a usage error met before
 * getopt reaches it still answers in JSON; cli_json_on: the command parsed
 * --json; cli_finish (main, after the command): under --json, when RC is 2, 3
 * or 4 and the command printed no document (cli_json_puts), prints
 * {"error": cli_json_run_error(RC)}; returns the exit status.
 * cli_json_error: the error object {"exit", "command", "file" (or null),
 * "message"}; cli_json_run_error: that of the first error cli_error or
 * cli_usage_error reported (notes and warnings are not errors), for a command
 * that prints its own document on failure (scan). */
void cli_begin(const char *cmd, int argc, char **argv);
void cli_json_on(void);
int cli_finish(int rc);
struct cJSON *cli_json_error(int exit, const char *cmd, const char *file, const char *message);
struct cJSON *cli_json_run_error(int exit);

/* Report a usage error and the hint to --help; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Report getopt_long's '?' (unknown option) or ':' (missing argument);
 * commands use an optstring starting with ':'.  Returns CLI_EXIT_USAGE. */
int cli_bad_option(const char *cmd, int opt, char **argv);

/* Map a library status to the exit status. */
int cli_exit_for(int status);

/* Open PATH with the common options; on failure print the error and return
 * the exit status (the handle is freed).  0 on success. */
int cli_open(const char *cmd, const char *path, const cli_common *c, ckpt_file **out);

/* Exact JSON integers (cJSON's numbers are doubles): a raw number, and an
 * array of them (a shape). */
struct cJSON *cli_json_int(long long v);
struct cJSON *cli_json_dims(const int64_t *d, int n);

/* The torch.load verdicts of PATH (ckpt_torch_load): as the JSON object
 * "torch_load" ({"2.6+": {...}, "1.13": {...}}, or {"error": ...} when the
 * model cannot read the file), and as one text line per version.  F: PATH
 * as the command read it, when cli_reading_is_default(); else NULL (the
 * model reads the file itself). */
struct cJSON *cli_torch_load_json(const char *path, const ckpt_file *f);
void cli_torch_load_print(const char *path, const ckpt_file *f, const char *indent);
/* Whether C leaves the reading as ckpt_file_open's defaults (no allow-list,
 * no limit changed): then the command's reading is the verdict's too. */
bool cli_reading_is_default(const cli_common *c);

/* "392.0 KiB" */
const char *cli_human_bytes(unsigned long long n, char *buf, size_t cap);

/* Subcommands: one file each (src/cmd_<name>.c). */
int cmd_inspect(int argc, char **argv);
int cmd_strip_module(int argc, char **argv);
int cmd_add_module(int argc, char **argv);
int cmd_unwrap(int argc, char **argv);
int cmd_rename(int argc, char **argv);
int cmd_remap(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_extract(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_scan(int argc, char **argv);

#endif
