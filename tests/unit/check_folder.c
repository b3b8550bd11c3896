/* check_folder.c - the pieces a folder checkpoint is read from
 * (checkpoint/file.c, storage.c, tensor_data.c): its files, named inside
 * the folder only, opened on demand and never too many at once, and a
 * storage made of runs of several files that must tile it exactly. */
#include "unit.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char dir[64];

/* A folder of N files "f<i>", file i holding bytes (i + k) & 0xff, k < 100. */
static ckpt_file *folder(int n)
{
    snprintf(dir, sizeof dir, "/tmp/ckpt-check-folder-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    for (int i = 0; i < n; i++) {
        char p[128];
        uint8_t b[100];
        for (int k = 0; k < 100; k++)
            b[k] = (uint8_t)(i + k);
        snprintf(p, sizeof p, "%s/f%d", dir, i);
        FILE *fp = fopen(p, "wb");
        ck_assert_ptr_nonnull(fp);
        ck_assert_uint_eq(fwrite(b, 1, sizeof b, fp), sizeof b);
        fclose(fp);
    }
    ckpt_file *f = ckpt_file_new();
    ck_assert_ptr_nonnull(f);
    f->dir_fd = open(dir, O_RDONLY | O_DIRECTORY);
    ck_assert_int_ge(f->dir_fd, 0);
    return f;
}

static void folder_done(ckpt_file *f, int n)
{
    ckpt_file_free(f);
    for (int i = 0; i < n; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s/f%d", dir, i);
        unlink(p);
    }
    rmdir(dir);
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

START_TEST(test_names_stay_inside)
{
    ckpt_file *f = folder(1);
    ckpt_error err = {0};
    const char *bad[] = {"/etc/passwd", "../f0", "a/../../f0", "./f0", "a//b", "f0/", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_ptr_null(ckpt_file_source_add(f, bad[i], &err));
        ck_assert_int_eq(err.code, CKPT_ERR_FORMAT);
        ckpt_err_clear(&err); /* the first error is kept: clear it for the next */
    }
    ck_assert_ptr_null(ckpt_file_source_add(f, "missing", &err));
    ck_assert_int_eq(err.code, CKPT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "missing"));
    ckpt_source *s = ckpt_file_source_add(f, "f0", &err);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(s->file_size, 100);
    ck_assert_int_eq(s->fd, -1); /* not opened until read */
    folder_done(f, 1);
}
END_TEST

/* 200 files, one 10-byte run of each, read as one storage: every byte
 * right, and never more than CKPT_OPEN_SOURCES_MAX of them open. */
START_TEST(test_many_files_bounded)
{
    enum { N = 200 };
    ckpt_file *f = folder(N);
    ckpt_error err = {0};
    int before = open_fds();
    ckpt_storage *s = ckpt_file_storage_new(f, "0", CKPT_DTYPE_UINT8, N * 10, "cpu", 3, &err);
    ck_assert_ptr_nonnull(s);
    ckpt_piece *p = calloc(N, sizeof(*p));
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "f%d", i);
        p[i].src = ckpt_file_source_add(f, name, &err);
        ck_assert_ptr_nonnull(p[i].src);
        p[i].file_offset = 5;
        p[i].nbytes = 10;
        p[i].dst_offset = (uint64_t)(N - 1 - i) * 10; /* given out of order */
    }
    ck_assert_int_eq(ckpt_storage_pieces_set(f, s, p, N, "test", &err), CKPT_OK);
    uint8_t *buf = malloc(N * 10);
    ck_assert_int_eq(ckpt_storage_read(f, s, 0, buf, N * 10), CKPT_OK);
    for (int j = 0; j < N; j++) /* run j came from file N-1-j */
        for (int k = 0; k < 10; k++)
            ck_assert_uint_eq(buf[j * 10 + k], (uint8_t)(N - 1 - j + 5 + k));
    ck_assert_int_le(open_fds() - before, CKPT_OPEN_SOURCES_MAX);
    /* a read inside one run, and one across two */
    ck_assert_int_eq(ckpt_storage_read(f, s, 13, buf, 4), CKPT_OK);
    ck_assert_uint_eq(buf[0], (uint8_t)(N - 2 + 5 + 3));
    ck_assert_int_eq(ckpt_storage_read(f, s, 18, buf, 4), CKPT_OK);
    ck_assert_uint_eq(buf[1], (uint8_t)(N - 2 + 5 + 9));
    ck_assert_uint_eq(buf[2], (uint8_t)(N - 3 + 5 + 0));
    free(buf);
    free(p);
    folder_done(f, N);
}
END_TEST

START_TEST(test_tiling_checked)
{
    ckpt_file *f = folder(2);
    ckpt_error err = {0};
    ckpt_source *a = ckpt_file_source_add(f, "f0", &err), *b = ckpt_file_source_add(f, "f1", &err);
    ckpt_storage *s = ckpt_file_storage_new(f, "0", CKPT_DTYPE_UINT8, 20, "cpu", 3, &err);
    ckpt_piece gap[2] = {{.src = a, .nbytes = 10}, {.src = b, .nbytes = 9, .dst_offset = 11}};
    ck_assert_int_eq(ckpt_storage_pieces_set(f, s, gap, 2, "t", &err), CKPT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "in no piece"));
    ckpt_err_clear(&err);
    ckpt_piece over[2] = {{.src = a, .nbytes = 11}, {.src = b, .nbytes = 10, .dst_offset = 10}};
    ck_assert_int_eq(ckpt_storage_pieces_set(f, s, over, 2, "t", &err), CKPT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "two pieces"));
    ckpt_err_clear(&err);
    ckpt_piece past[2] = {{.src = a, .nbytes = 10, .file_offset = 95},
                          {.src = b, .nbytes = 10, .dst_offset = 10}};
    ck_assert_int_eq(ckpt_storage_pieces_set(f, s, past, 2, "t", &err), CKPT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "past the end of 'f0'"));
    ckpt_err_clear(&err);
    ckpt_piece shrt[1] = {{.src = a, .nbytes = 10}};
    ck_assert_int_eq(ckpt_storage_pieces_set(f, s, shrt, 1, "t", &err), CKPT_ERR_FORMAT);
    folder_done(f, 2);
}
END_TEST

/* A whole-record piece carries its CRC; bytes from memory mix with files. */
START_TEST(test_crc_and_memory)
{
    ckpt_file *f = folder(1);
    ckpt_error err = {0};
    ckpt_source *a = ckpt_file_source_add(f, "f0", &err);
    uint8_t want[100];
    for (int k = 0; k < 100; k++)
        want[k] = (uint8_t)k;
    static const uint8_t mem[4] = {9, 8, 7, 6};
    ckpt_storage *s = ckpt_file_storage_new(f, "0", CKPT_DTYPE_UINT8, 104, "cpu", 3, &err);
    ckpt_piece p[2] = {{.src = a, .nbytes = 100, .has_crc = true,
                        .crc32 = (uint32_t)crc32(0, want, 100)},
                       {.mem = mem, .nbytes = 4, .dst_offset = 100}};
    ck_assert_int_eq(ckpt_storage_pieces_set(f, s, p, 2, "t", &err), CKPT_OK);
    uint8_t buf[104];
    ck_assert_int_eq(ckpt_storage_read(f, s, 0, buf, 104), CKPT_OK);
    ck_assert_mem_eq(buf, want, 100);
    ck_assert_mem_eq(buf + 100, mem, 4);
    p[0].crc32 ^= 1;
    ck_assert_int_eq(ckpt_storage_read(f, s, 0, buf, 104), CKPT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(ckpt_file_error_message(f), "CRC-32 mismatch in 'f0'"));
    folder_done(f, 1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("folder");
    TCase *tc = tcase_create("folder");
    tcase_add_test(tc, test_names_stay_inside);
    tcase_add_test(tc, test_many_files_bounded);
    tcase_add_test(tc, test_tiling_checked);
    tcase_add_test(tc, test_crc_and_memory);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
