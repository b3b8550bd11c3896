/* check_legacy.c - the pre-1.6 torch.save stream, built byte by byte here and
 * read from the committed torch fixtures. */
#include "unit.h"

#include <stdio.h>
#include <unistd.h>

static char dir[256];
static char path[512];
static ckpt_file *f;

static void setup(void)
{
    unit_tmpdir(dir, sizeof(dir), path, sizeof(path), "t.pth");
    f = ckpt_file_new();
}

static void teardown(void)
{
    ckpt_file_free(f);
    unlink(path);
    rmdir(dir);
}

static void pk_magic(pk *p, bool good)
{
    static const uint8_t m[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    pk_proto2(p);
    pk_op(p, 0x8a);
    pk_op(p, 10);
    pk_bytes(p, m, 9);
    pk_op(p, good ? m[9] : 0x18);
    pk_op(p, '.');
}

static void pk_header(pk *p, bool good_magic, int64_t protocol)
{
    pk_magic(p, good_magic);
    pk_proto2(p);
    pk_int(p, protocol);
    pk_op(p, '.');
    pk_proto2(p); /* sys_info */
    pk_op(p, '}');
    pk_op(p, '(');
    pk_str(p, "protocol_version");
    pk_int(p, 1001);
    pk_str(p, "little_endian");
    pk_op(p, 0x88);
    pk_op(p, 'u');
    pk_op(p, '.');
}

/* {'w': tensor(float32 x N)} with a 6-tuple persistent id, VIEW as 6th item */
static void pk_main(pk *p, const char *key, int64_t numel, bool view_metadata)
{
    pk_proto2(p);
    pk_op(p, '}');
    pk_str(p, "w");
    pk_global(p, "torch._utils", "_rebuild_tensor_v2");
    pk_op(p, '(');
    pk_op(p, '(');
    pk_str(p, "storage");
    pk_global(p, "torch", "FloatStorage");
    pk_str(p, key);
    pk_str(p, "cuda:1");
    pk_int(p, numel);
    if (view_metadata) {
        pk_str(p, key);
        pk_int(p, 0);
        pk_int(p, numel);
        pk_op(p, 0x87);
    } else {
        pk_op(p, 'N');
    }
    pk_op(p, 't');
    pk_op(p, 'Q');
    pk_int(p, 0);
    pk_int(p, numel);
    pk_op(p, 0x85);
    pk_int(p, 1);
    pk_op(p, 0x85);
    pk_op(p, 0x89);
    pk_global(p, "collections", "OrderedDict");
    pk_op(p, ')');
    pk_op(p, 'R');
    pk_op(p, 't');
    pk_op(p, 'R');
    pk_op(p, 's');
    pk_op(p, '.');
}

static void pk_keys(pk *p, const char *key)
{
    pk_proto2(p);
    pk_op(p, ']');
    pk_str(p, key);
    pk_op(p, 'a');
    pk_op(p, '.');
}

static void write_file(const pk *p)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(p->buf, 1, p->n, fp), p->n);
    fclose(fp);
}

/* A whole file: header, main pickle, key list, count COUNT then DATA floats */
static void make_legacy(bool good_magic, int64_t protocol, int64_t numel, uint64_t count,
                        int ndata, bool view_metadata)
{
    pk p = {0};
    pk_header(&p, good_magic, protocol);
    pk_main(&p, "94823", numel, view_metadata);
    pk_keys(&p, "94823");
    pk_le(&p, count, 8);
    for (int i = 0; i < ndata; i++) {
        float x = (float)i + 0.5f;
        pk_bytes(&p, &x, 4);
    }
    write_file(&p);
    pk_free(&p);
}

START_TEST(reads_a_legacy_file)
{
    make_legacy(true, 1001, 3, 3, 3, false);
    ck_assert_msg(ckpt_file_open(f, path) == CKPT_OK, "%s", ckpt_file_error_message(f));
    ck_assert_int_eq(ckpt_file_format(f), CKPT_FORMAT_PTH_LEGACY);
    const ckpt_tensor *t = ckpt_file_tensor(f, 0, NULL);
    ck_assert_str_eq(ckpt_storage_key(ckpt_tensor_storage(t)), "94823");
    ck_assert_str_eq(ckpt_storage_device(ckpt_tensor_storage(t)), "cuda:1");
    float out[3];
    ck_assert_int_eq(ckpt_tensor_read(f, t, out, sizeof(out)), CKPT_OK);
    ck_assert(out[0] == 0.5f && out[2] == 2.5f);
}
END_TEST

START_TEST(bad_magic)
{
    make_legacy(false, 1001, 3, 3, 3, false);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "invalid magic number");
}
END_TEST

START_TEST(bad_protocol_version)
{
    make_legacy(true, 1000, 3, 3, 3, false);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_UNSUPPORTED);
    ck_assert_msg_has(f, "invalid protocol version: 1000");
}
END_TEST

START_TEST(count_disagrees_with_storage)
{
    make_legacy(true, 1001, 3, 4, 4, false);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "wrong byte size: expected 3 elements, got 4");
}
END_TEST

START_TEST(huge_count)
{
    make_legacy(true, 1001, 3, UINT64_MAX, 3, false);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_FORMAT);
}
END_TEST

START_TEST(truncated_data)
{
    make_legacy(true, 1001, 3, 3, 2, false);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "truncated");
}
END_TEST

START_TEST(missing_count)
{
    make_legacy(true, 1001, 3, 3, 0, false);
    ck_assert_int_ne(truncate(path, 0), 1);
    pk p = {0};
    pk_header(&p, true, 1001);
    pk_main(&p, "1", 3, false);
    pk_keys(&p, "1");
    write_file(&p);
    pk_free(&p);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "no element count");
}
END_TEST

START_TEST(key_list_names_unknown_storage)
{
    pk p = {0};
    pk_header(&p, true, 1001);
    pk_main(&p, "1", 1, false);
    pk_keys(&p, "2");
    pk_le(&p, 1, 8);
    pk_le(&p, 0, 4);
    write_file(&p);
    pk_free(&p);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "unknown storage '2'");
}
END_TEST

START_TEST(view_metadata_unsupported)
{
    make_legacy(true, 1001, 3, 3, 3, true);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_UNSUPPORTED);
    ck_assert_msg_has(f, "view_metadata");
}
END_TEST

START_TEST(torch_fixture_legacy_mlp)
{
    ck_assert_msg(ckpt_file_open(f, src_path("tests/data/legacy_mlp.pth")) == CKPT_OK, "%s",
                  ckpt_file_error_message(f));
    ck_assert_int_eq(ckpt_file_format(f), CKPT_FORMAT_PTH_LEGACY);
    ck_assert_uint_eq(ckpt_file_tensor_count(f), 4);
    for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
        ckpt_tensor_stats st;
        ck_assert_int_eq(ckpt_tensor_stats_compute(f, ckpt_file_tensor(f, i, NULL), &st), CKPT_OK);
        ck_assert_int_eq(st.nan, 0);
    }
}
END_TEST

START_TEST(torch_fixture_legacy_train)
{
    ck_assert_msg(ckpt_file_open(f, src_path("tests/data/legacy_train.pth")) == CKPT_OK, "%s",
                  ckpt_file_error_message(f));
    ck_assert_uint_eq(ckpt_file_object_count(f), 1);
    ck_assert_str_eq(ckpt_value_global(ckpt_file_object(f, 0, NULL)), "argparse.Namespace");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("legacy");
    TCase *t = tcase_create("pth-legacy");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, reads_a_legacy_file);
    tcase_add_test(t, bad_magic);
    tcase_add_test(t, bad_protocol_version);
    tcase_add_test(t, count_disagrees_with_storage);
    tcase_add_test(t, huge_count);
    tcase_add_test(t, truncated_data);
    tcase_add_test(t, missing_count);
    tcase_add_test(t, key_list_names_unknown_storage);
    tcase_add_test(t, view_metadata_unsupported);
    tcase_add_test(t, torch_fixture_legacy_mlp);
    tcase_add_test(t, torch_fixture_legacy_train);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
