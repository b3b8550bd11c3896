/* fuzz_tar.c - any bytes as a tar checkpoint of torch <= 0.1: the tar
 * decision and member listing (container/tar.c, Python's tarfile modelled),
 * the reader (formats/pth_tar.c: storages, views, tensors, the main pickle
 * with its keys) behind ckpt_file_open with every tensor's data summarised,
 * and pth-tar's walk over the same pickles (ckpt_format_pth_tar.walk, strict
 * as ckpt scan makes it and as torch 1.13 reads, the VM in scan mode). */
#include "fuzz.h"

#include "ckpt.h"
#include "formats/format.h"
#include "container/container.h"

#include <fcntl.h>

static ckpt_global_class classify(void *user, const char *q)
{
    (void)user;
    return ckpt_globals_builtin_class(q);
}

static void on_global(void *u, const char *q, ckpt_global_class c, int op, uint64_t at)
{
    (void)u, (void)q, (void)c, (void)op, (void)at;
}

static void on_use(void *u, const char *q, int op, uint64_t at)
{
    (void)u, (void)q, (void)op, (void)at;
}

static const uint64_t limits[CKPT_LIMIT_COUNT_] = {
    [CKPT_LIMIT_PICKLE_BYTES] = 1 << 20, [CKPT_LIMIT_DEPTH] = 200,
    [CKPT_LIMIT_STACK] = 1 << 16,       [CKPT_LIMIT_MARKS] = 1 << 12,
    [CKPT_LIMIT_MEMO] = 1 << 16,        [CKPT_LIMIT_ITEMS] = 1 << 16,
    [CKPT_LIMIT_STORAGES] = 1 << 12};

/* the scan's callback: the VM in scan mode, its values in the walk's arena */
static int scan_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    ckpt_pickle_ctx ctx = {.name = p->name, .limits = limits, .classify = classify,
                           .user = w->user, .arena = w->user, .on_global = on_global,
                           .on_use = on_use, .scan = true};
    ckpt_error err = {0};
    return ckpt_pickle_load(&ctx, p->buf, p->len, root, used, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_file(data, size, ".pth");
    if (!path)
        return 0;
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        if (ckpt_tar_probe(fd, size)) {
            ckpt_tar *t;
            ckpt_error err = {0};
            bool fb;
            if (ckpt_tar_open(fd, size, &t, &fb, &err) == CKPT_OK) {
                for (size_t i = 0; i < ckpt_tar_count(t); i++)
                    (void)ckpt_tar_member_at(t, i)->name[0];
                ckpt_tar_find(t, "storages");
                ckpt_tar_close(t);
            }
            /* the walk as scan (strict) and as the torch_load verdict make it */
            for (int strict = 0; strict < 2; strict++) {
                ckpt_arena arena;
                ckpt_arena_init(&arena);
                ckpt_err_clear(&err);
                ckpt_walk w = {.pickle = scan_pickle, .user = &arena, .strict = strict};
                ckpt_source src = {.fd = fd, .file_size = size};
                ckpt_format_pth_tar.walk(&w, &src, &err);
                ckpt_arena_release(&arena);
            }
        }
        close(fd);
    }
    ckpt_file *f = ckpt_file_new();
    ckpt_file_set_limit(f, CKPT_LIMIT_PICKLE_BYTES, 1 << 20);
    ckpt_file_set_limit(f, CKPT_LIMIT_ITEMS, 1 << 16);
    ckpt_file_set_limit(f, CKPT_LIMIT_MEMO, 1 << 16);
    ckpt_file_set_limit(f, CKPT_LIMIT_STACK, 1 << 16);
    if (f && ckpt_file_open(f, path) == CKPT_OK) {
        uint64_t budget = 16u << 20;
        for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
            const ckpt_tensor *t = ckpt_file_tensor(f, i, NULL);
            if (ckpt_tensor_nbytes(t) > budget)
                continue;
            budget -= ckpt_tensor_nbytes(t);
            ckpt_tensor_stats st;
            ckpt_tensor_stats_compute(f, t, &st);
        }
    }
    ckpt_file_free(f);
    fuzz_file_done(path);
    return 0;
}
