/* check_zip.c - the pth-zip reader: archives built here with libzip, plus the
 * committed torch fixtures, each opened through the public API. */
#include "unit.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

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

/* A zip with NAME=DATA pairs (NULL-terminated); DEFLATE compresses records. */
static void make_zip(bool deflate, const char *const *entries, const size_t *sizes)
{
    int err;
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &err);
    ck_assert_ptr_nonnull(z);
    for (size_t i = 0; entries[2 * i]; i++) {
        size_t n = sizes ? sizes[i] : strlen(entries[2 * i + 1]);
        zip_source_t *s = zip_source_buffer(z, entries[2 * i + 1], n, 0);
        zip_int64_t idx = zip_file_add(z, entries[2 * i], s, ZIP_FL_ENC_UTF_8);
        ck_assert_int_ge(idx, 0);
        zip_set_file_compression(z, (zip_uint64_t)idx, deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
    }
    ck_assert_int_eq(zip_close(z), 0);
}

/* data.pkl of {'w': tensor of N float32 from storage '0'} */
static pk state_dict_pickle(int64_t numel)
{
    pk p = {0};
    int64_t shape[1] = {numel}, stride[1] = {1};
    pk_proto2(&p);
    pk_op(&p, '}');
    pk_str(&p, "w");
    pk_tensor(&p, "FloatStorage", "0", "cuda:0", numel, 0, 1, shape, stride);
    pk_op(&p, 's');
    pk_op(&p, '.');
    return p;
}

static int open_it(void)
{
    return ckpt_file_open(f, path);
}

/* a/ with {'w': float32 1, 2, 3, 4}, stored */
static void make_four_floats(void)
{
    pk p = state_dict_pickle(4);
    float data[4] = {1, 2, 3, 4};
    const char *e[] = {"a/data.pkl", (const char *)p.buf, "a/data/0", (const char *)data,
                       "a/version", "3", NULL};
    size_t sizes[] = {p.n, sizeof(data), 1};
    make_zip(false, e, sizes);
    pk_free(&p);
}

/* The archive's first bytes (all of these small ones), to damage and put back. */
static size_t head_read(uint8_t *buf, size_t cap)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    size_t n = fread(buf, 1, cap, fp);
    ck_assert(feof(fp));
    fclose(fp);
    return n;
}

static void head_write(const uint8_t *buf, size_t n)
{
    FILE *fp = fopen(path, "r+b");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(buf, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

START_TEST(minimal_archive_any_prefix)
{
    pk p = state_dict_pickle(2);
    float data[2] = {1.5f, -2.0f};
    const char *e[] = {"some-name/data.pkl", (const char *)p.buf, "some-name/data/0",
                       (const char *)data, "some-name/version", "3\n", NULL};
    size_t sizes[] = {p.n, sizeof(data), 2};
    make_zip(false, e, sizes);
    ck_assert_msg(open_it() == CKPT_OK, "%s", ckpt_file_error_message(f));
    ck_assert_str_eq(ckpt_file_prefix(f), "some-name");
    ck_assert_int_eq(ckpt_file_format(f), CKPT_FORMAT_PTH_ZIP);
    ck_assert_uint_eq(ckpt_file_tensor_count(f), 1);
    ckpt_path path_w;
    const ckpt_tensor *t = ckpt_file_tensor(f, 0, &path_w);
    ck_assert_str_eq(path_w.elems[0].key, "w");
    float out[2];
    ck_assert_int_eq(ckpt_tensor_read(f, t, out, sizeof(out)), CKPT_OK);
    ck_assert(out[0] == 1.5f && out[1] == -2.0f);
    pk_free(&p);
}
END_TEST

START_TEST(deflated_records_read)
{
    pk p = state_dict_pickle(64);
    float data[64] = {0};
    data[63] = 7;
    const char *e[] = {"a/data.pkl", (const char *)p.buf, "a/data/0", (const char *)data,
                       "a/version", "3", NULL};
    size_t sizes[] = {p.n, sizeof(data), 1};
    make_zip(true, e, sizes);
    ck_assert_msg(open_it() == CKPT_OK, "%s", ckpt_file_error_message(f));
    ckpt_tensor_stats st;
    ck_assert_int_eq(ckpt_tensor_stats_compute(f, ckpt_file_tensor(f, 0, NULL), &st), CKPT_OK);
    ck_assert_double_eq(st.max, 7.0);
    pk_free(&p);
}
END_TEST

START_TEST(flipped_data_byte_fails_crc)
{
    make_four_floats();
    /* flip one byte of the stored float 3.0f (0x40400000) */
    uint8_t buf[8192];
    size_t n = head_read(buf, sizeof buf);
    uint8_t pat[4] = {0x00, 0x00, 0x40, 0x40};
    size_t at = 0;
    for (size_t i = 0; i + 4 <= n; i++)
        if (memcmp(buf + i, pat, 4) == 0)
            at = i;
    ck_assert_uint_gt(at, 0);
    buf[at + 3] ^= 0x01;
    head_write(buf, n);
    ck_assert_int_eq(open_it(), CKPT_OK); /* the index alone is fine */
    float out[4];
    ck_assert_int_eq(ckpt_tensor_read(f, ckpt_file_tensor(f, 0, NULL), out, sizeof(out)),
                     CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "CRC");
}
END_TEST

/* The local header of record NAME loses its signature (the central
 * directory still points at it): torch's miniz refuses to read the record. */
static void zero_local_signature(const char *name)
{
    uint8_t buf[8192];
    size_t n = head_read(buf, sizeof buf), len = strlen(name), at = SIZE_MAX;
    for (size_t i = 0; i + 30 + len <= n; i++)
        if (memcmp(buf + i, "PK\3\4", 4) == 0 && memcmp(buf + i + 30, name, len) == 0)
            at = i;
    ck_assert_uint_ne(at, SIZE_MAX);
    memset(buf + at, 0, 4);
    head_write(buf, n);
}

START_TEST(local_header_checked_at_open_or_at_first_read)
{
    make_four_floats();
    zero_local_signature("a/data/0");
    const char *why = "record 'a/data/0' has no local header where the central directory says";
    /* by default the open refuses it */
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, why);
    /* deferred: the file opens and lists, and each read of the record fails */
    ckpt_file_free(f);
    f = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_set_defer_record_checks(f, 1), CKPT_OK);
    ck_assert_int_eq(open_it(), CKPT_OK);
    ck_assert_int_eq(ckpt_file_set_defer_record_checks(f, 0), CKPT_ERR_USAGE); /* too late */
    ck_assert_uint_eq(ckpt_file_tensor_count(f), 1);
    float out[4];
    ck_assert_int_eq(ckpt_tensor_read(f, ckpt_file_tensor(f, 0, NULL), out, sizeof(out)),
                     CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, why);
    const char *file = NULL;
    uint64_t off = 0;
    ck_assert_int_eq(ckpt_storage_file_range(f, ckpt_file_storage(f, 0), &file, &off),
                     CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, why);
}
END_TEST

START_TEST(record_size_must_match_storage)
{
    pk p = state_dict_pickle(4);
    float data[3] = {1, 2, 3};
    const char *e[] = {"a/data.pkl", (const char *)p.buf, "a/data/0", (const char *)data,
                       "a/version", "3", NULL};
    size_t sizes[] = {p.n, sizeof(data), 1};
    make_zip(false, e, sizes);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "is 12 bytes but storage '0'");
    pk_free(&p);
}
END_TEST

START_TEST(missing_data_record)
{
    pk p = state_dict_pickle(1);
    const char *e[] = {"a/data.pkl", (const char *)p.buf, "a/version", "3", NULL};
    size_t sizes[] = {p.n, 1};
    make_zip(false, e, sizes);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "has no record 'a/data/0'");
    pk_free(&p);
}
END_TEST

START_TEST(records_not_in_a_folder)
{
    const char *e[] = {"data.pkl", "\x80\x02N.", NULL};
    make_zip(false, e, NULL);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "not in a subdirectory");
}
END_TEST

START_TEST(version_required_and_bounded)
{
    const char *e1[] = {"a/data.pkl", "\x80\x02N.", NULL};
    make_zip(false, e1, NULL);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "version");
    ckpt_file_free(f);
    f = ckpt_file_new();
    const char *e2[] = {"a/data.pkl", "\x80\x02N.", "a/version", "11\n", NULL};
    make_zip(false, e2, NULL);
    ck_assert_int_eq(open_it(), CKPT_ERR_UNSUPPORTED);
    ck_assert_msg_has(f, "version 11");
}
END_TEST

START_TEST(case_insensitive_lookup_like_torch)
{
    const char *e[] = {"a/DATA.PKL", "\x80\x02N.", "a/Version", "3", NULL};
    make_zip(false, e, NULL);
    ck_assert_msg(open_it() == CKPT_OK, "%s", ckpt_file_error_message(f));
}
END_TEST

START_TEST(big_endian_read)
{
    /* a big-endian file: read, its values swapped (tests/interop/torch2_files.py) */
    const char *e[] = {"a/data.pkl", "\x80\x02N.", "a/byteorder", "big", "a/version", "3", NULL};
    make_zip(false, e, NULL);
    ck_assert_msg(open_it() == CKPT_OK, "%s", ckpt_file_error_message(f));
}
END_TEST

START_TEST(byte_order_junk_refused)
{
    const char *e[] = {"a/data.pkl", "\x80\x02N.", "a/byteorder", "middle", "a/version", "3", NULL};
    make_zip(false, e, NULL);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "unknown byte order 'middle'");
}
END_TEST

START_TEST(storage_alignment_junk_refused)
{
    /* torch.load parses it with int() */
    const char *e[] = {"a/data.pkl", "\x80\x02N.", "a/.storage_alignment", "6x4", "a/version", "3",
                       NULL};
    make_zip(false, e, NULL);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, ".storage_alignment");
}
END_TEST

START_TEST(torchscript_refused)
{
    /* a constants.pkl makes it a TorchScript archive (formats/torchscript.c),
     * whose data.pkl must be a module of its code/: None is not */
    const char *e[] = {"a/data.pkl", "\x80\x02N.", "a/constants.pkl", "\x80\x02N.", "a/version",
                       "3", NULL};
    make_zip(false, e, NULL);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_int_eq(ckpt_file_format(f), CKPT_FORMAT_TORCHSCRIPT);
    ck_assert_msg_has(f, "not a module of the archive's code/");
}
END_TEST

START_TEST(truncated_archive)
{
    pk p = state_dict_pickle(256);
    float data[256] = {0};
    const char *e[] = {"a/data.pkl", (const char *)p.buf, "a/data/0", (const char *)data,
                       "a/version", "3", NULL};
    size_t sizes[] = {p.n, sizeof(data), 1};
    make_zip(false, e, sizes);
    ck_assert_int_eq(truncate(path, 600), 0);
    int rc = open_it();
    ck_assert_int_eq(rc, CKPT_ERR_FORMAT);
    pk_free(&p);
}
END_TEST

START_TEST(empty_and_foreign_files)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "empty file");
    ckpt_file_free(f);
    f = ckpt_file_new();
    FILE *fp = fopen(path, "w");
    fputs("hello, not a checkpoint\n", fp);
    fclose(fp);
    ck_assert_int_eq(open_it(), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "not a PyTorch checkpoint");
}
END_TEST

START_TEST(missing_file_is_io)
{
    ck_assert_int_eq(ckpt_file_open(f, "/nonexistent/x.pth"), CKPT_ERR_IO);
    ck_assert_msg_has(f, "No such file");
}
END_TEST

START_TEST(handle_is_single_use)
{
    ck_assert_int_eq(ckpt_file_open(f, "/nonexistent/x.pth"), CKPT_ERR_IO);
    ck_assert_int_eq(ckpt_file_open(f, "/nonexistent/x.pth"), CKPT_ERR_USAGE);
    ckpt_file_free(NULL); /* accepted */
}
END_TEST

/* torch's own output: zip64 end records, FB padding, data descriptors */
START_TEST(torch_fixture_dp_mlp)
{
    ck_assert_msg(ckpt_file_open(f, src_path("tests/data/dp_mlp.pth")) == CKPT_OK, "%s",
                  ckpt_file_error_message(f));
    ck_assert_str_eq(ckpt_file_prefix(f), "dp_mlp");
    ck_assert_uint_eq(ckpt_file_tensor_count(f), 4);
    ck_assert_uint_eq(ckpt_file_state_dict_count(f), 1);
    const char *w[4];
    ck_assert_uint_eq(ckpt_state_dict_wrappers(ckpt_file_state_dict(f, 0, NULL), w, 4), 1);
    ck_assert_str_eq(w[0], "module.");
    const ckpt_tensor *t = ckpt_file_tensor(f, 0, NULL);
    ck_assert_int_eq(ckpt_tensor_shape(t)[0], 128);
    ck_assert_int_eq(ckpt_tensor_shape(t)[1], 784);
    ck_assert_str_eq(ckpt_storage_device(ckpt_tensor_storage(t)), "cuda:0");
    for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
        ckpt_tensor_stats st;
        ck_assert_int_eq(ckpt_tensor_stats_compute(f, ckpt_file_tensor(f, i, NULL), &st), CKPT_OK);
    }
}
END_TEST

START_TEST(torch_fixture_ddp_twice)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/ddp2_mlp.pth")), CKPT_OK);
    const char *w[4];
    ck_assert_uint_eq(ckpt_state_dict_wrappers(ckpt_file_state_dict(f, 0, NULL), w, 4), 2);
    ck_assert_str_eq(w[0], "module.");
    ck_assert_str_eq(w[1], "module.");
}
END_TEST

/* ckpt_storage_file_range: a stored record is a range of the file holding
 * exactly what ckpt_storage_read gives (what the Python binding maps); a
 * deflated record and a big-endian file's storages are not (read instead). */
START_TEST(file_range_of_stored_records)
{
    char path[4096];
    snprintf(path, sizeof path, "%s", src_path("tests/data/dp_mlp.pth"));
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_OK);
    const ckpt_storage *s = ckpt_tensor_storage(ckpt_file_tensor(f, 0, NULL));
    const char *file = NULL;
    uint64_t off = 0;
    ck_assert_int_eq(ckpt_storage_file_range(f, s, &file, &off), CKPT_OK);
    ck_assert_str_eq(file, path);
    ck_assert_uint_eq(off % 64, 0); /* torch's aligned records */
    unsigned char want[64], got[64];
    ck_assert_int_eq(ckpt_storage_read(f, s, 0, want, sizeof want), CKPT_OK);
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, got, sizeof got, (off_t)off), (ssize_t)sizeof got);
    close(fd);
    ck_assert_mem_eq(got, want, sizeof want);

    ckpt_file *d = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(d, src_path("tests/data/deflated.pth")), CKPT_OK);
    s = ckpt_tensor_storage(ckpt_file_tensor(d, 0, NULL));
    ck_assert_int_eq(ckpt_storage_file_range(d, s, &file, &off), CKPT_ERR_UNSUPPORTED);
    ckpt_file_free(d);

    ckpt_file *b = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(b, src_path("tests/data/torch2/bigendian.pth")), CKPT_OK);
    size_t swapped = 0;
    for (size_t i = 0; i < ckpt_file_storage_count(b); i++) {
        s = ckpt_file_storage(b, i);
        int rc = ckpt_storage_file_range(b, s, &file, &off);
        if (ckpt_dtype_size(ckpt_storage_dtype(s)) > 1) {
            ck_assert_int_eq(rc, CKPT_ERR_UNSUPPORTED);
            swapped++;
        }
    }
    ck_assert_uint_gt(swapped, 0);
    ckpt_file_free(b);
    ck_assert_int_eq(ckpt_storage_file_range(NULL, s, &file, &off), CKPT_ERR_USAGE);
}
END_TEST

/* ckpt_tensor_sparse_data: a sparse COO tensor's (indices, values, size, ...)
 * as saved; NULL for a dense tensor. */
START_TEST(sparse_data_of_torch_fixture)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/torch2/kinds.pth")), CKPT_OK);
    size_t sparse = 0;
    for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
        const ckpt_tensor *t = ckpt_file_tensor(f, i, NULL);
        const ckpt_value *d = ckpt_tensor_sparse_data(t);
        ckpt_tensor_kind k = ckpt_tensor_kind_of(t);
        if (k != CKPT_TENSOR_SPARSE_COO && k != CKPT_TENSOR_SPARSE_CSR) {
            ck_assert_ptr_null(d);
            continue;
        }
        sparse++;
        ck_assert_int_eq(ckpt_value_kind(d), CKPT_KIND_TUPLE);
        size_t nparts = k == CKPT_TENSOR_SPARSE_COO ? 2 : 3;
        ck_assert_uint_ge(ckpt_value_len(d), nparts + 1);
        for (size_t j = 0; j < nparts; j++)
            ck_assert_ptr_nonnull(ckpt_value_tensor(ckpt_value_item(d, j)));
        /* the values part is where the tensor's dtype comes from */
        ck_assert_int_eq(ckpt_tensor_dtype(ckpt_value_tensor(ckpt_value_item(d, nparts - 1))),
                         ckpt_tensor_dtype(t));
    }
    ck_assert_uint_eq(sparse, 2);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("zip");
    TCase *t = tcase_create("pth-zip");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, minimal_archive_any_prefix);
    tcase_add_test(t, deflated_records_read);
    tcase_add_test(t, flipped_data_byte_fails_crc);
    tcase_add_test(t, local_header_checked_at_open_or_at_first_read);
    tcase_add_test(t, record_size_must_match_storage);
    tcase_add_test(t, missing_data_record);
    tcase_add_test(t, records_not_in_a_folder);
    tcase_add_test(t, version_required_and_bounded);
    tcase_add_test(t, case_insensitive_lookup_like_torch);
    tcase_add_test(t, big_endian_read);
    tcase_add_test(t, byte_order_junk_refused);
    tcase_add_test(t, storage_alignment_junk_refused);
    tcase_add_test(t, torchscript_refused);
    tcase_add_test(t, truncated_archive);
    tcase_add_test(t, empty_and_foreign_files);
    tcase_add_test(t, missing_file_is_io);
    tcase_add_test(t, handle_is_single_use);
    tcase_add_test(t, torch_fixture_dp_mlp);
    tcase_add_test(t, torch_fixture_ddp_twice);
    tcase_add_test(t, file_range_of_stored_records);
    tcase_add_test(t, sparse_data_of_torch_fixture);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
