/* pickle_tool.c - runs the pickle VM in scan mode over one file for
 * tests/interop/pickle_diff.py: `pickle_tool file|bytesio PATH...` prints a
 * line per file, a JSON object: every global requested, in order (not deduplicated), the
 * names computed at run time, whether it reached STOP (or its error), the
 * file position where it ended and whether a read crossed a frame's end.
 * `pickle_tool chain MODE PATH`: the pickles back to back (below). */
#include "checkpoint/checkpoint.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_json(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            printf("\\u%04x", *p); /* bytes, not code points: the harness compares alike */
        else
            putchar(*p);
    }
    putchar('"');
}

typedef struct out {
    int nglobals;
} out;

static ckpt_global_class classify(void *user, const char *q)
{
    (void)user;
    return ckpt_globals_builtin_class(q);
}

static ckpt_value *pid(void *user, ckpt_value *id, uint64_t offset, ckpt_error *err)
{
    (void)id;
    ckpt_value *v = ckpt_value_new(user, CKPT_KIND_NONE, offset);
    if (!v)
        ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
    return v;
}

static out o;

static void on_global(void *u, const char *q, ckpt_global_class c, int op, uint64_t at)
{
    (void)u, (void)c;
    printf("%s[", o.nglobals++ ? "," : "");
    put_json(q);
    printf(",%d,%llu]", op, (unsigned long long)at);
}

static void on_use(void *u, const char *q, int op, uint64_t at)
{
    (void)u, (void)q, (void)op, (void)at;
}

static char computed[1 << 16];

/* Names shown as JSON strings of their bytes (no quote or control byte
 * needs more than \u escaping, done by the harness's reading side). */
static void on_computed(void *u, const char *shown, const char *made_by, int op, uint64_t at)
{
    (void)u, (void)shown;
    size_t n = strlen(computed);
    if (n + strlen(made_by) + 64 >= sizeof computed)
        return;
    char by[300];
    snprintf(by, sizeof by, "%.299s", made_by);
    for (char *p = by; *p; p++) /* shown for people only: the harness compares offsets */
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f || *p == '"' || *p == '\\')
            *p = '?';
    snprintf(computed + n, sizeof computed - n, "%s[\"%s\",%d,%llu]", n ? "," : "", by, op,
             (unsigned long long)at);
}

static int run(ckpt_pickle_feed feed, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    size_t cap = 1 << 16, len = 0, got;
    unsigned char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            unsigned char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "pickle_tool: out of memory\n");
        return 2;
    }
    /* the library's defaults (checkpoint/file.c) */
    static const uint64_t limits[CKPT_LIMIT_COUNT_] = {
        [CKPT_LIMIT_PICKLE_BYTES] = 1ull << 30, [CKPT_LIMIT_DEPTH] = 1000,
        [CKPT_LIMIT_STACK] = 16u << 20,        [CKPT_LIMIT_MARKS] = 100000,
        [CKPT_LIMIT_MEMO] = 16u << 20,         [CKPT_LIMIT_ITEMS] = 64u << 20,
        [CKPT_LIMIT_STORAGES] = 16u << 20};
    ckpt_arena arena;
    ckpt_arena_init(&arena);
    ckpt_pickle_ctx ctx = {.name = "pickle", .limits = limits, .classify = classify,
                           .persistent_load = pid, .user = &arena, .arena = &arena,
                           .on_global = on_global, .on_use = on_use,
                           .on_computed = on_computed, .scan = true, .feed = feed};
    ckpt_error err;
    ckpt_err_clear(&err);
    ckpt_value *root;
    size_t used = 0;
    o.nglobals = 0;
    computed[0] = '\0';
    printf("{\"globals\":[");
    int rc = ckpt_pickle_load(&ctx, buf, len, &root, &used, &err);
    printf("],\"computed\":[%s],\"stop\":%s,\"error\":", computed, rc ? "false" : "true");
    put_json(rc ? err.msg : "");
    printf(",\"code\":%d,\"consumed\":%zu,\"frame_crossed\":%s}\n", rc, used,
           ctx.frame_crossed ? "true" : "false");
    ckpt_arena_release(&arena);
    free(buf);
    return 0;
}

/* ---- chain: pickle.load called again and again on one file object ----------
 * `pickle_tool chain bytesio|file|choose PATH` prints one line per reading of
 * the frames, {"ends":[...]}: the file position after each pickle that
 * reached STOP, back to back from byte 0 until the file ends or a pickle
 * fails; choose: every reading CKPT_FEED_CHOOSE can make (at most 256). */

static void quiet_global(void *u, const char *q, ckpt_global_class c, int op, uint64_t at)
{
    (void)u, (void)q, (void)c, (void)op, (void)at;
}

static void quiet_computed(void *u, const char *s, const char *by, int op, uint64_t at)
{
    (void)u, (void)s, (void)by, (void)op, (void)at;
}

/* One reading: the ends, and how many choice points it met. */
static uint64_t chain_reading(const unsigned char *buf, size_t len, ckpt_pickle_feed feed,
                              uint64_t drops)
{
    static const uint64_t limits[CKPT_LIMIT_COUNT_] = {
        [CKPT_LIMIT_PICKLE_BYTES] = 1ull << 30, [CKPT_LIMIT_DEPTH] = 1000,
        [CKPT_LIMIT_STACK] = 16u << 20,        [CKPT_LIMIT_MARKS] = 100000,
        [CKPT_LIMIT_MEMO] = 16u << 20,         [CKPT_LIMIT_ITEMS] = 64u << 20,
        [CKPT_LIMIT_STORAGES] = 16u << 20};
    uint64_t n = 0;
    size_t at = 0;
    int first = 1;
    printf("{\"ends\":[");
    while (at < len) {
        ckpt_arena arena;
        ckpt_arena_init(&arena);
        ckpt_pickle_ctx ctx = {.name = "pickle", .limits = limits, .classify = classify,
                               .user = &arena, .arena = &arena, .on_global = quiet_global,
                               .on_use = on_use, .on_computed = quiet_computed, .scan = true,
                               .feed = feed, .drops = drops, .ndiverge = n};
        ckpt_error err;
        ckpt_err_clear(&err);
        ckpt_value *root;
        size_t used = 0;
        int rc = ckpt_pickle_load(&ctx, buf + at, len - at, &root, &used, &err);
        ckpt_arena_release(&arena);
        n = ctx.ndiverge;
        if (rc)
            break;
        at += used;
        printf("%s%zu", first ? "" : ",", at);
        first = 0;
    }
    printf("]}\n");
    return n;
}

static int chain(const char *mode, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    size_t cap = 1 << 16, len = 0, got;
    unsigned char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            unsigned char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    if (!buf)
        return 2;
    if (strcmp(mode, "choose") != 0) {
        chain_reading(buf, len, strcmp(mode, "bytesio") == 0 ? CKPT_FEED_BYTESIO
                                                             : CKPT_FEED_FILE, 0);
        free(buf);
        return 0;
    }
    /* depth first, as ckpt scan walks them: each point past FIXED the other way */
    struct {
        uint64_t drops, fixed;
    } todo[4096];
    size_t ntodo = 1, runs = 0;
    todo[0].drops = todo[0].fixed = 0;
    while (ntodo > 0 && runs < 256) {
        ntodo--;
        uint64_t drops = todo[ntodo].drops, fixed = todo[ntodo].fixed;
        uint64_t n = chain_reading(buf, len, CKPT_FEED_CHOOSE, drops);
        runs++;
        for (uint64_t j = n < 64 ? n : 64; j-- > fixed && ntodo < 4096;) {
            todo[ntodo].drops = drops | (uint64_t)1 << j;
            todo[ntodo++].fixed = j + 1;
        }
    }
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "chain") == 0)
        return chain(argv[2], argv[3]) ? 2 : fflush(stdout) == 0 ? 0 : 1;
    if (argc < 3 || (strcmp(argv[1], "file") && strcmp(argv[1], "bytesio"))) {
        fprintf(stderr, "usage: pickle_tool file|bytesio PATH...\n"
                        "       pickle_tool chain bytesio|file|choose PATH\n");
        return 2;
    }
    ckpt_pickle_feed feed = strcmp(argv[1], "bytesio") == 0 ? CKPT_FEED_BYTESIO : CKPT_FEED_FILE;
    for (int i = 2; i < argc; i++)
        if (run(feed, argv[i]))
            return 2;
    return fflush(stdout) == 0 ? 0 : 1;
}
