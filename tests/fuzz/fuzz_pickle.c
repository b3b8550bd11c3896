/* fuzz_pickle.c - any bytes as one pickle, through the VM three times: as the
 * reader runs it (allow-list, limits, persistent ids as storages) and as
 * `ckpt scan` runs it (every global reported, nothing refused) with each
 * feed (FILE, and BYTESIO: a frame's rest dropped as the C unpickler does);
 * then as a stream of pickles read back to back with CKPT_FEED_CHOOSE, as
 * pickle.load on one file reads them (the framing model: the choices taken
 * from the input's last byte), each pickle's end checked to lie past its
 * start and inside the bytes, and as the legacy reader reads it (CHOOSE,
 * refusing a pickle whose reading depends on the file's buffering). */
#include "fuzz.h"

#include "analysis/analysis.h" /* the weights-only model */

static ckpt_global_class classify(void *user, const char *q)
{
    (void)user;
    return ckpt_globals_builtin_class(q);
}

static ckpt_value *pid(void *user, ckpt_value *id, uint64_t offset, ckpt_error *err)
{
    (void)id;
    (void)offset;
    ckpt_value *v = ckpt_arena_alloc(user, sizeof *v);
    if (!v)
        ckpt_err(err, CKPT_ERR_NOMEM, "out of memory");
    return v;
}

static void on_global(void *u, const char *q, ckpt_global_class c, int op, uint64_t at)
{
    (void)u, (void)q, (void)c, (void)op, (void)at;
}

static void on_use(void *u, const char *q, int op, uint64_t at)
{
    (void)u, (void)q, (void)op, (void)at;
}

static int wo_record(void *user, const char *key, uint64_t *size)
{
    (void)user;
    *size = 16;
    return key[0] != 'x'; /* some records missing */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint64_t limits[CKPT_LIMIT_COUNT_] = {
        [CKPT_LIMIT_PICKLE_BYTES] = 1 << 20, [CKPT_LIMIT_DEPTH] = 200,
        [CKPT_LIMIT_STACK] = 1 << 16,       [CKPT_LIMIT_MARKS] = 1 << 12,
        [CKPT_LIMIT_MEMO] = 1 << 16,        [CKPT_LIMIT_ITEMS] = 1 << 16,
        [CKPT_LIMIT_STORAGES] = 1 << 12};
    /* reader, scanner over a file, scanner over a BytesIO (frames dropped) */
    for (int run = 0; run < 3; run++) {
        int scan = run > 0;
        ckpt_arena arena;
        ckpt_arena_init(&arena);
        ckpt_pickle_ctx ctx = {.name = "fuzz.pkl", .limits = limits, .classify = classify,
                               .persistent_load = pid, .user = &arena, .arena = &arena};
        if (scan) {
            ctx.on_global = on_global;
            ctx.on_use = on_use;
            ctx.scan = true;
            ctx.feed = run == 2 ? CKPT_FEED_BYTESIO : CKPT_FEED_FILE;
        }
        ckpt_error err = {0};
        ckpt_value *root;
        size_t used;
        ckpt_pickle_load(&ctx, data, size, &root, &used, &err);
        ckpt_arena_release(&arena);
        /* the weights-only unpickler model, as a zip's data.pkl */
        ckpt_wo_ctx wctx = {.torch = scan ? CKPT_WO_1_13 : CKPT_WO_2_15, .limits = limits,
                            .pid_fields = 5, .record = wo_record, .check_size = !scan};
        ckpt_wo_result r;
        ckpt_wo_walk(&wctx, data, size, &r, &err);
    }
    /* the stream: pickle.load again and again, each frame read as DROPS says */
    uint64_t drops = size ? data[size - 1] * 0x0101010101010101ull : 0, n = 0;
    size_t at = 0;
    for (int k = 0; k < 64 && at < size; k++) {
        ckpt_arena arena;
        ckpt_arena_init(&arena);
        ckpt_pickle_ctx ctx = {.name = "fuzz.pkl", .limits = limits, .classify = classify,
                               .user = &arena, .arena = &arena, .on_global = on_global,
                               .on_use = on_use, .scan = true, .feed = CKPT_FEED_CHOOSE,
                               .drops = drops, .ndiverge = n};
        ckpt_error err = {0};
        ckpt_value *root;
        size_t used = 0;
        int rc = ckpt_pickle_load(&ctx, data + at, size - at, &root, &used, &err);
        ckpt_arena_release(&arena);
        if (ctx.ndiverge < n || (rc == CKPT_OK && (used == 0 || used > size - at)))
            abort(); /* the model lost its place */
        n = ctx.ndiverge;
        if (rc != CKPT_OK)
            break;
        at += used;
    }
    /* the legacy reader: CHOOSE, not scanning */
    ckpt_arena arena;
    ckpt_arena_init(&arena);
    ckpt_pickle_ctx ctx = {.name = "fuzz.pkl", .limits = limits, .classify = classify,
                           .persistent_load = pid, .user = &arena, .arena = &arena,
                           .feed = CKPT_FEED_CHOOSE};
    ckpt_error err = {0};
    ckpt_value *root;
    size_t used;
    if (ckpt_pickle_load(&ctx, data, size, &root, &used, &err) == CKPT_OK && ctx.ndiverge)
        abort(); /* a reader must refuse what torch may read otherwise */
    ckpt_arena_release(&arena);
    return 0;
}
