/* check_core.c - core/'s hash map, FNV-1a, growable arrays and the
 * out-of-memory error, written as the ways lib/ uses them: names to indices
 * (a zip's records, a state dict's keys), integers to values (a pickle's
 * memo), keys the caller compares (tensor views), and arrays that grow one
 * item at a time. */
#include "unit.h"
#include "core/core.h"

#include <stdint.h>

/* ---- FNV-1a ---- */

START_TEST(test_fnv1a_vectors)
{
    /* the published 64-bit FNV-1a test vectors */
    ck_assert_uint_eq(ckpt_fnv1a("", 0), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(ckpt_fnv1a("a", 1), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(ckpt_fnv1a("foobar", 6), 0x85944171f73967e8ull);
    /* continued over pieces: the hash of the whole */
    uint64_t h = ckpt_fnv1a_add(CKPT_FNV1A_BASIS, "foo", 3);
    ck_assert_uint_eq(ckpt_fnv1a_add(h, "bar", 3), ckpt_fnv1a("foobar", 6));
}
END_TEST

/* ---- BYTES maps: a name -> its index in the caller's array ---- */

START_TEST(test_names_to_indices)
{
    const char *names[] = {"model.weight", "model.bias", "model", "", "model.weight"};
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_BYTES);
    size_t first = 99;
    for (size_t i = 0; i < 4; i++)
        ck_assert_int_eq(ckpt_map_put(&m, names[i], strlen(names[i]), i, &first), 0);
    ck_assert_uint_eq(first, 99); /* untouched while nothing repeats */
    /* a repeated name: put keeps the first and says where it is */
    ck_assert_int_eq(ckpt_map_put(&m, names[4], strlen(names[4]), 4, &first), 1);
    ck_assert_uint_eq(first, 0);
    ck_assert_uint_eq(m.count, 4);

    size_t i;
    ck_assert(ckpt_map_get(&m, "model.bias", 10, &i));
    ck_assert_uint_eq(i, 1);
    ck_assert(ckpt_map_get(&m, "", 0, &i)); /* the empty name is a name */
    ck_assert_uint_eq(i, 3);
    ck_assert(ckpt_map_get(&m, "model.weight", 5, &i)); /* a prefix is its own key */
    ck_assert_uint_eq(i, 2);
    ck_assert(!ckpt_map_get(&m, "model.b", 7, &i));
    ck_assert(!ckpt_map_get(&m, "MODEL", 5, NULL)); /* case counts */
    ckpt_map_release(&m);
    ck_assert(!ckpt_map_get(&m, "model", 5, NULL)); /* empty again, and usable */
    ck_assert_int_eq(ckpt_map_put(&m, "model", 5, 7, NULL), 0);
    ckpt_map_release(&m);
}
END_TEST

START_TEST(test_bytes_are_not_strings)
{
    /* keys are N bytes: a NUL inside is part of the key */
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_BYTES);
    ck_assert_int_eq(ckpt_map_put(&m, "a\0b", 3, 1, NULL), 0);
    ck_assert_int_eq(ckpt_map_put(&m, "a\0c", 3, 2, NULL), 0);
    ck_assert_int_eq(ckpt_map_put(&m, "a", 1, 3, NULL), 0);
    size_t v;
    ck_assert(ckpt_map_get(&m, "a\0c", 3, &v));
    ck_assert_uint_eq(v, 2);
    ck_assert(ckpt_map_get(&m, "a", 1, &v));
    ck_assert_uint_eq(v, 3);
    ckpt_map_release(&m);
}
END_TEST

START_TEST(test_names_without_case)
{
    /* a zip's records as torch finds them: ASCII case does not count */
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_BYTES_NOCASE);
    ck_assert_int_eq(ckpt_map_put(&m, "archive/data.pkl", 16, 0, NULL), 0);
    ck_assert_int_eq(ckpt_map_put(&m, "archive/data/0", 14, 1, NULL), 0);
    size_t v = 99;
    ck_assert(ckpt_map_get(&m, "Archive/DATA.pkl", 16, &v));
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(ckpt_map_put(&m, "ARCHIVE/data/0", 14, 2, &v), 1); /* a repeat */
    ck_assert_uint_eq(v, 1);
    /* only A-Z fold: other bytes compare as they are */
    ck_assert_int_eq(ckpt_map_put(&m, "\xc3\x89", 2, 3, NULL), 0);
    ck_assert(!ckpt_map_get(&m, "\xc3\xa9", 2, NULL));
    ckpt_map_release(&m);
}
END_TEST

START_TEST(test_set_replaces)
{
    /* set: the latest value wins (put keeps the first) */
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_BYTES);
    ck_assert_int_eq(ckpt_map_set(&m, "0", 1, 10), 0);
    ck_assert_int_eq(ckpt_map_set(&m, "0", 1, 11), 1);
    size_t v;
    ck_assert(ckpt_map_get(&m, "0", 1, &v));
    ck_assert_uint_eq(v, 11);
    ck_assert_uint_eq(m.count, 1);
    /* SIZE_MAX is no value: refused, the map unchanged */
    ck_assert_int_eq(ckpt_map_set(&m, "1", 1, SIZE_MAX), -1);
    ck_assert_int_eq(ckpt_map_put(&m, "1", 1, SIZE_MAX, NULL), -1);
    ck_assert(!ckpt_map_get(&m, "1", 1, NULL));
    ckpt_map_release(&m);
}
END_TEST

START_TEST(test_many_names)
{
    /* many names: growth keeps every entry; keys live in one buffer */
    enum { N = 100000 };
    char *buf = malloc((size_t)N * 16);
    ck_assert_ptr_nonnull(buf);
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_BYTES);
    for (size_t i = 0; i < N; i++) {
        snprintf(buf + i * 16, 16, "layer.%zu", i);
        ck_assert_int_eq(ckpt_map_put(&m, buf + i * 16, strlen(buf + i * 16), i, NULL), 0);
    }
    ck_assert_uint_eq(m.count, N);
    ck_assert_uint_ge(m.cap, 2 * (size_t)N); /* at most half full */
    for (size_t i = 0; i < N; i += 997) {
        char k[16];
        size_t v;
        snprintf(k, sizeof k, "layer.%zu", i);
        ck_assert(ckpt_map_get(&m, k, strlen(k), &v));
        ck_assert_uint_eq(v, i);
    }
    ck_assert(!ckpt_map_get(&m, "layer.100000", 12, NULL));
    ckpt_map_release(&m);
    free(buf);
}
END_TEST

START_TEST(test_reserve)
{
    /* a table sized once for the entries it will hold */
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_BYTES);
    ck_assert_int_eq(ckpt_map_reserve(&m, 1000), 0);
    size_t cap = m.cap;
    ck_assert_uint_ge(cap, 2000);
    char k[1000][8];
    for (size_t i = 0; i < 1000; i++) {
        snprintf(k[i], sizeof k[i], "%zu", i);
        ck_assert_int_eq(ckpt_map_put(&m, k[i], strlen(k[i]), i, NULL), 0);
    }
    ck_assert_uint_eq(m.cap, cap); /* no growth on the way */
    ck_assert_int_eq(ckpt_map_reserve(&m, SIZE_MAX), -1); /* too many: refused, kept */
    ck_assert_uint_eq(m.cap, cap);
    ck_assert(ckpt_map_get(&m, "999", 3, NULL));
    ckpt_map_release(&m);
}
END_TEST

/* ---- U64 maps: a pickle memo (index -> value), pointers -> indices ---- */

START_TEST(test_integer_keys)
{
    ckpt_map memo;
    ckpt_map_init(&memo, CKPT_MAP_U64);
    const char *values[] = {"zero", "one", "max"};
    ck_assert_int_eq(ckpt_map_set_u64(&memo, 0, (size_t)(uintptr_t)values[0]), 0);
    ck_assert_int_eq(ckpt_map_set_u64(&memo, 1, (size_t)(uintptr_t)values[1]), 0);
    ck_assert_int_eq(ckpt_map_set_u64(&memo, UINT64_MAX, (size_t)(uintptr_t)values[2]), 0);
    size_t v;
    ck_assert(ckpt_map_get_u64(&memo, 0, &v));
    ck_assert_str_eq((const char *)(uintptr_t)v, "zero");
    ck_assert(ckpt_map_get_u64(&memo, UINT64_MAX, &v));
    ck_assert_str_eq((const char *)(uintptr_t)v, "max");
    ck_assert(!ckpt_map_get_u64(&memo, 2, NULL));
    /* PUT again on an index: the memo's new value */
    ck_assert_int_eq(ckpt_map_set_u64(&memo, 1, (size_t)(uintptr_t)values[0]), 1);
    ck_assert(ckpt_map_get_u64(&memo, 1, &v));
    ck_assert_str_eq((const char *)(uintptr_t)v, "zero");
    ckpt_map_release(&memo);

    /* consecutive keys, the common case, and keys apart by powers of two */
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_U64);
    for (uint64_t k = 0; k < 100000; k++)
        ck_assert_int_eq(ckpt_map_put_u64(&m, k << 20, (size_t)k, NULL), 0);
    for (uint64_t k = 0; k < 100000; k += 101) {
        ck_assert(ckpt_map_get_u64(&m, k << 20, &v));
        ck_assert_uint_eq(v, k);
    }
    ck_assert_int_eq(ckpt_map_put_u64(&m, 5 << 20, 0, &v), 1);
    ck_assert_uint_eq(v, 5);
    ckpt_map_release(&m);
}
END_TEST

/* ---- HASHED maps: keys the caller compares (a tensor's view) ---- */

typedef struct view {
    int storage;
    long offset;
    int ndim;
    long shape[2];
} view;

typedef struct views {
    const view *all;
    const view *probe;
} views;

static bool same_view(const void *arg, size_t val)
{
    const views *v = arg;
    const view *a = &v->all[val], *b = v->probe;
    return a->storage == b->storage && a->offset == b->offset && a->ndim == b->ndim &&
           memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0;
}

static uint64_t view_hash(const view *v)
{
    uint64_t h = ckpt_fnv1a(&v->storage, sizeof v->storage);
    h = ckpt_fnv1a_add(h, &v->offset, sizeof v->offset);
    h = ckpt_fnv1a_add(h, &v->ndim, sizeof v->ndim);
    return ckpt_fnv1a_add(h, v->shape, (size_t)v->ndim * sizeof v->shape[0]);
}

START_TEST(test_caller_compares)
{
    /* tied weights: which tensors repeat an earlier one's view */
    const view t[] = {
        {0, 0, 2, {4, 4}}, {0, 16, 2, {4, 4}}, {0, 0, 2, {4, 4}}, {1, 0, 1, {16, 0}},
        {0, 0, 1, {16, 7}}, /* shape[1] is past ndim: not part of the key */
        {0, 0, 1, {16, 9}},
    };
    long first[6];
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_HASHED);
    for (size_t i = 0; i < 6; i++) {
        views arg = {t, &t[i]};
        size_t f;
        int r = ckpt_map_put_hashed(&m, view_hash(&t[i]), same_view, &arg, i, &f);
        ck_assert_int_ge(r, 0);
        first[i] = r == 1 ? (long)f : -1;
    }
    ck_assert_int_eq(first[0], -1);
    ck_assert_int_eq(first[1], -1);
    ck_assert_int_eq(first[2], 0);
    ck_assert_int_eq(first[3], -1);
    ck_assert_int_eq(first[4], -1);
    ck_assert_int_eq(first[5], 4);
    ckpt_map_release(&m);
}
END_TEST

static bool same_int(const void *arg, size_t val)
{
    return *(const size_t *)arg == val;
}

START_TEST(test_one_hash_for_all)
{
    /* the worst hash there is: every key alike; answers stay right */
    ckpt_map m;
    ckpt_map_init(&m, CKPT_MAP_HASHED);
    for (size_t i = 0; i < 2000; i++)
        ck_assert_int_eq(ckpt_map_put_hashed(&m, 42, same_int, &i, i, NULL), 0);
    for (size_t i = 0; i < 2000; i += 7) {
        size_t v;
        ck_assert(ckpt_map_get_hashed(&m, 42, same_int, &i, &v));
        ck_assert_uint_eq(v, i);
    }
    size_t absent = 5000;
    ck_assert(!ckpt_map_get_hashed(&m, 42, same_int, &absent, NULL));
    ckpt_map_release(&m);
}
END_TEST

/* ---- growable arrays ---- */

typedef struct list {
    int *items;
    size_t len, cap;
} list;

static int list_push(list *l, int x)
{
    if (CKPT_GROW(l->items, l->cap, l->len + 1) < 0)
        return -1;
    l->items[l->len++] = x;
    return 0;
}

START_TEST(test_grow_one_at_a_time)
{
    list l = {0};
    size_t grew = 0, last_cap = 0;
    for (int i = 0; i < 100000; i++) {
        ck_assert_int_eq(list_push(&l, i), 0);
        if (l.cap != last_cap) {
            grew++;
            last_cap = l.cap;
        }
    }
    for (int i = 0; i < 100000; i++)
        ck_assert_int_eq(l.items[i], i);
    ck_assert_uint_le(grew, 15); /* doubling: 8, 16, ..., 131072 */
    free(l.items);
}
END_TEST

START_TEST(test_grow_overflow)
{
    /* a count read from a file, too big for memory: refused, nothing lost */
    list l = {0};
    ck_assert_int_eq(list_push(&l, 1), 0);
    int *before = l.items;
    size_t cap = l.cap;
    ck_assert_int_eq(CKPT_GROW(l.items, l.cap, SIZE_MAX / 2), -1);
    ck_assert_ptr_eq(l.items, before);
    ck_assert_uint_eq(l.cap, cap);
    ck_assert_int_eq(l.items[0], 1);
    free(l.items);

    ck_assert_uint_eq(ckpt_grow_cap(0, 1, 4), 8);  /* 8 at least */
    ck_assert_uint_eq(ckpt_grow_cap(8, 9, 4), 16); /* doubled */
    ck_assert_uint_eq(ckpt_grow_cap(16, 100, 4), 128);
    ck_assert_uint_eq(ckpt_grow_cap(16, 16, 4), 16); /* room already */
    ck_assert_uint_eq(ckpt_grow_cap(0, SIZE_MAX / 8 + 1, 8), 0); /* bytes overflow */
}
END_TEST

/* ---- errors ---- */

static int grow_or_fail(list *l, ckpt_error *err)
{
    if (CKPT_GROW(l->items, l->cap, SIZE_MAX / 2) < 0)
        return ckpt_oom(err);
    return CKPT_OK;
}

START_TEST(test_oom)
{
    ckpt_error err;
    ckpt_err_clear(&err);
    list l = {0};
    ck_assert_int_eq(grow_or_fail(&l, &err), CKPT_ERR_NOMEM);
    ck_assert_int_eq(err.code, CKPT_ERR_NOMEM);
    ck_assert_str_eq(err.msg, "out of memory"); /* the text users see */
    /* the first cause wins: an out-of-memory on the way out keeps it */
    ckpt_err_clear(&err);
    ckpt_err(&err, CKPT_ERR_FORMAT, "truncated");
    ck_assert_int_eq(ckpt_oom(&err), CKPT_ERR_NOMEM);
    ck_assert_int_eq(err.code, CKPT_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "truncated");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("map");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_fnv1a_vectors);
    tcase_add_test(tc, test_names_to_indices);
    tcase_add_test(tc, test_bytes_are_not_strings);
    tcase_add_test(tc, test_names_without_case);
    tcase_add_test(tc, test_set_replaces);
    tcase_add_test(tc, test_many_names);
    tcase_add_test(tc, test_reserve);
    tcase_add_test(tc, test_integer_keys);
    tcase_add_test(tc, test_caller_compares);
    tcase_add_test(tc, test_one_hash_for_all);
    suite_add_tcase(s, tc);
    TCase *ta = tcase_create("array");
    tcase_add_test(ta, test_grow_one_at_a_time);
    tcase_add_test(ta, test_grow_overflow);
    suite_add_tcase(s, ta);
    TCase *te = tcase_create("error");
    tcase_add_test(te, test_oom);
    suite_add_tcase(s, te);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
