/* unit.h - helpers for the check unit tests: a pickle byte builder and a
 * checkpoint handle whose pickle context the VM can run in. */
#ifndef CKPT_UNIT_H
#define CKPT_UNIT_H

#include "checkpoint/checkpoint.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pickle builder ---- */

typedef struct pk {
    uint8_t *buf;
    size_t n, cap;
} pk;

static inline void pk_bytes(pk *p, const void *b, size_t n)
{
    if (p->n + n > p->cap) {
        p->cap = (p->n + n) * 2 + 64;
        p->buf = realloc(p->buf, p->cap);
        ck_assert_ptr_nonnull(p->buf);
    }
    memcpy(p->buf + p->n, b, n);
    p->n += n;
}
static inline void pk_op(pk *p, int op)
{
    uint8_t b = (uint8_t)op;
    pk_bytes(p, &b, 1);
}
/* V in N little-endian bytes; bytes past the eighth are 0 (no shift by 64) */
static inline void pk_le(pk *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        pk_op(p, i < 8 ? (int)((v >> (8 * i)) & 0xff) : 0);
}
static inline void pk_text(pk *p, const char *s)
{
    pk_bytes(p, s, strlen(s));
}
/* BINUNICODE */
static inline void pk_str(pk *p, const char *s)
{
    pk_op(p, 'X');
    pk_le(p, strlen(s), 4);
    pk_text(p, s);
}
/* BININT1 / BININT2 / BININT */
static inline void pk_int(pk *p, int64_t v)
{
    if (v >= 0 && v < 256) {
        pk_op(p, 'K');
        pk_le(p, (uint64_t)v, 1);
    } else if (v >= 0 && v < 65536) {
        pk_op(p, 'M');
        pk_le(p, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        pk_op(p, 'J');
        pk_le(p, (uint64_t)v, 4);
    } else {
        pk_op(p, 0x8a); /* LONG1, 8 bytes */
        pk_op(p, 8);
        pk_le(p, (uint64_t)v, 8);
    }
}
/* GLOBAL 'module\nname\n' */
static inline void pk_global(pk *p, const char *mod, const char *name)
{
    pk_op(p, 'c');
    pk_text(p, mod);
    pk_op(p, '\n');
    pk_text(p, name);
    pk_op(p, '\n');
}
static inline void pk_proto2(pk *p)
{
    pk_op(p, 0x80);
    pk_op(p, 2);
}
/* A persistent storage id: ('storage', torch.<type>, key, location, numel) */
static inline void pk_storage(pk *p, const char *type, const char *key, const char *loc,
                              int64_t numel)
{
    pk_op(p, '(');
    pk_str(p, "storage");
    pk_global(p, "torch", type);
    pk_str(p, key);
    pk_str(p, loc);
    pk_int(p, numel);
    pk_op(p, 't');
    pk_op(p, 'Q');
}
/* _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()) -> on stack */
static inline void pk_tensor(pk *p, const char *type, const char *key, const char *loc,
                             int64_t numel, int64_t offset, int nd, const int64_t *shape,
                             const int64_t *stride)
{
    pk_global(p, "torch._utils", "_rebuild_tensor_v2");
    pk_op(p, '(');
    pk_storage(p, type, key, loc, numel);
    pk_int(p, offset);
    pk_op(p, '(');
    for (int i = 0; i < nd; i++)
        pk_int(p, shape[i]);
    pk_op(p, 't');
    pk_op(p, '(');
    for (int i = 0; i < nd; i++)
        pk_int(p, stride[i]);
    pk_op(p, 't');
    pk_op(p, 0x89); /* NEWFALSE */
    pk_global(p, "collections", "OrderedDict");
    pk_op(p, ')');
    pk_op(p, 'R');
    pk_op(p, 't');
    pk_op(p, 'R');
}
static inline void pk_free(pk *p)
{
    free(p->buf);
    p->buf = NULL;
    p->n = p->cap = 0;
}

/* ---- running the VM inside a fresh ckpt_file ---- */

/* Runs BUF through the VM with F's allow-list and storage table. */
static inline int pk_load(ckpt_file *f, const pk *p, ckpt_value **out)
{
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, "test.pkl");
    ckpt_err_clear(&f->err);
    return ckpt_pickle_load(&ctx, p->buf, p->n, out, NULL, &f->err);
}

static inline const char *src_path(const char *rel)
{
    static char buf[4096];
    const char *top = getenv("srcdir");
    snprintf(buf, sizeof(buf), "%s/%s", top ? top : ".", rel);
    return buf;
}

/* A fresh temporary directory DIR and a file name PATH inside it. */
static inline void unit_tmpdir(char *dir, size_t dircap, char *path, size_t pathcap,
                               const char *name)
{
    snprintf(dir, dircap, "/tmp/ckpt_unit_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, pathcap, "%s/%s", dir, name);
}

/* Whether .ci/run's valgrind pass runs this test (CKPT_TEST_VALGRIND):
 * the tests whose threads and paths multiply the same code run fewer of
 * them there (tests/README.md); the sanitizer pass runs them all. */
static inline int unit_under_valgrind(void)
{
    return getenv("CKPT_TEST_VALGRIND") != NULL;
}

/* Run the suite; exit status 0 when every test passed. */
static inline int unit_run(Suite *s)
{
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}

/* Assert that the error message contains NEEDLE. */
#define ck_assert_msg_has(f, needle)                                                     \
    ck_assert_msg(strstr(ckpt_file_error_message(f), (needle)) != NULL,                 \
                  "message '%s' lacks '%s'", ckpt_file_error_message(f), (needle))

#endif
