/* rewrite.h - what the rewriting commands share: IN/OUT, --select,
 * --dry-run, --in-place, reporting and the write itself. */
#ifndef CKPT_REWRITE_H
#define CKPT_REWRITE_H

#include "cli.h"

typedef struct rewrite {
    const char *cmd;
    cli_common common;
    const char *select;
    bool dry_run, in_place;
    bool force;          /* --force: edit in place a file with other names */
    bool verbose;        /* --verbose: say how OUT was written */
    bool keep_unsafe;    /* --keep-unsafe: keep the code-running globals named by --allow-global */
    char *kept;          /* those kept, ", "-separated (the warning), or NULL */
    const char *in, *out;
    size_t changed;      /* keys (or storages) that change */
    bool any_state_dict; /* at least one mapping was visited */
    size_t storages;     /* in IN, for remap's report */
    ckpt_format out_format; /* what to write (0: pth-zip) */
    unsigned write_flags;   /* CKPT_WRITE_NO_DEDUPE */
    uint64_t shard_size;    /* convert --shard-size */
    char *took;          /* a tensors-only OUT: the state dict of IN it holds (its path), */
    size_t took_tensors; /* its tensors, and whether it is the one IN was taken for without */
    bool took_model;     /* --select (the model's): said once OUT is written */
    char *pending;       /* report lines, printed once OUT is written */
    size_t npending;
    /* --map-location M (repeatable): remap's rules, FROM ('*' for a bare
     * device) and TO, applied in the same write */
    const char **map_from, **map_to;
    char **map_owned;
    size_t nmap;
    bool narrowed; /* OUT holds part of IN: the remap's report counts nothing */
} rewrite;

enum {
    REWRITE_OPT_SELECT = CLI_OPT_FIRST_COMMAND_OPTION + 50,
    REWRITE_OPT_DRY_RUN,
    REWRITE_OPT_IN_PLACE,
    REWRITE_OPT_FORCE,
    REWRITE_OPT_VERBOSE,
    REWRITE_OPT_KEEP_UNSAFE,
    REWRITE_OPT_MAP_LOCATION,
    REWRITE_OPT_TO /* the key rewrites' --to FORMAT (REWRITE_TO_OPTION) */
};

/* --to pth|pth-legacy|safetensors, for the commands that list it */
#define REWRITE_TO_OPTION {"to", required_argument, NULL, REWRITE_OPT_TO}

/* FORMAT named by --to ARG (pth-legacy only when LEGACY) into *OUT; 1, or
 * -1 after a usage error. */
int rewrite_format_option(const char *cmd, const char *arg, bool legacy, ckpt_format *out);

#define REWRITE_LONG_OPTIONS                                          \
    {"select", required_argument, NULL, REWRITE_OPT_SELECT},          \
    {"dry-run", no_argument, NULL, REWRITE_OPT_DRY_RUN},              \
    {"in-place", no_argument, NULL, REWRITE_OPT_IN_PLACE},            \
    {"force", no_argument, NULL, REWRITE_OPT_FORCE},                  \
    {"verbose", no_argument, NULL, REWRITE_OPT_VERBOSE},              \
    {"keep-unsafe", no_argument, NULL, REWRITE_OPT_KEEP_UNSAFE},      \
    {"map-location", required_argument, NULL, REWRITE_OPT_MAP_LOCATION}, \
    CLI_COMMON_LONG_OPTIONS

/* Options every rewrite takes: 1 handled, 0 not ours, -1 usage error. */
int rewrite_option(rewrite *rw, int opt, const char *arg);
/* IN and OUT from what getopt left (with --in-place, FILE alone is IN and
 * OUT); CLI_EXIT_OK or a usage error. */
int rewrite_positional(rewrite *rw, int argc, char **argv);
/* Open IN, rename keys by RULES, write OUT (or print the plan). */
int rewrite_keys(rewrite *rw, const ckpt_rename *rules);
/* Open IN, make one state dict (--select, else the model's) the file, write OUT. */
int rewrite_extract(rewrite *rw);
/* Open IN, remap storage devices, write OUT (or print the plan). */
int rewrite_devices(rewrite *rw, const char *const *from, const char *const *to, size_t n);
void rewrite_free(rewrite *rw);

/* Open IN, take --select as the whole file, cast to DTYPE (0: keep), and
 * write OUT in rw->out_format. */
int rewrite_convert(rewrite *rw, ckpt_dtype dtype);

/* A rewriting command: its usage text, its own options, and what it does. */
typedef struct rewrite_command {
    const char *name;
    const char *usage;
    const char *short_options;     /* its getopt string, starting with ':' (-q, -h added) */
    const struct option *options;  /* its own long options, NULL-terminated */
    int (*option)(void *state, int opt, const char *arg); /* 1 ok, 0 not ours, -1 usage */
    int (*run)(void *state, rewrite *rw);
    void *state;
} rewrite_command;

/* Parse the arguments of C (its options, the shared ones, IN OUT) and run it. */
int rewrite_main(int argc, char **argv, const rewrite_command *c);

/* strip-module / add-module: --prefix P (default "module.") made into RULE. */
int rewrite_prefix_main(int argc, char **argv, const char *name, const char *usage,
                        int (*rule)(ckpt_rename *r, const char *prefix));

#endif
