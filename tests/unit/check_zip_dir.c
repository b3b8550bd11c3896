/* check_zip_dir.c - a zip as torch, Python's zipfile and libzip each see it
 * (lib/container/zip_dir.c): the hostile files of tests/bad/make_bad_zip.py
 * (checked against the real readers by tests/interop/zip_readers.py) and
 * archives built here byte by byte. */
#include "container/container.h"
#include "unit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static ckpt_zip_dir *open_dir(const char *name, int *fd)
{
    char path[4096];
    const char *src = getenv("srcdir");
    snprintf(path, sizeof path, "%s/tests/bad/zip/%s", src ? src : ".", name);
    *fd = open(path, O_RDONLY);
    ck_assert_int_ge(*fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(*fd, &st), 0);
    ckpt_zip_dir *d = NULL;
    ckpt_error err = {0};
    ck_assert_msg(ckpt_zip_dir_open(*fd, (uint64_t)st.st_size, &d, &err) == CKPT_OK, "%s", err.msg);
    return d;
}

static bool has_finding(const ckpt_zip_dir *d, const char *part)
{
    for (size_t i = 0; i < ckpt_zip_dir_finding_count(d); i++)
        if (strstr(ckpt_zip_dir_finding(d, i), part))
            return true;
    return false;
}

/* The bytes reader R gets for data.pkl; whether they are the payload. */
static bool reads_payload(const ckpt_zip_dir *d, int fd, ckpt_zip_reader r, bool *crc_ok)
{
    int64_t i = ckpt_zip_dir_find(d, r, "data.pkl");
    ck_assert_int_ge(i, 0);
    uint8_t *buf;
    size_t len;
    ckpt_error err = {0};
    bool ok;
    ckpt_zip_dir_read(d, fd, r, (size_t)i, 1 << 20, &buf, &len, crc_ok ? crc_ok : &ok, &err);
    bool payload = len > 12 && memcmp(buf + 3, "builtins\nprint\n", 15) == 0;
    free(buf);
    return payload;
}

START_TEST(plain_archive_has_no_findings)
{
    int fd;
    ckpt_zip_dir *d = open_dir("plain.pth", &fd);
    ck_assert_uint_eq(ckpt_zip_dir_finding_count(d), 0);
    for (int r = 0; r < CKPT_ZIP_READERS; r++) {
        ck_assert(ckpt_zip_dir_reads(d, (ckpt_zip_reader)r));
        ck_assert_uint_eq(ckpt_zip_dir_count(d, (ckpt_zip_reader)r), 2);
        bool crc_ok = false;
        ck_assert(!reads_payload(d, fd, (ckpt_zip_reader)r, &crc_ok));
        ck_assert(crc_ok);
    }
    ck_assert(ckpt_zip_dir_torch_sniffs(d));
    ckpt_zip_dir_free(d);
    close(fd);
}
END_TEST

START_TEST(two_end_records_torch_takes_the_last)
{
    int fd;
    ckpt_zip_dir *d = open_dir("two_end_records.pth", &fd);
    ck_assert(has_finding(d, "2 end-of-central-directory records"));
    ck_assert(has_finding(d, "a central directory entry at byte"));
    ck_assert(reads_payload(d, fd, CKPT_ZIP_READER_TORCH, NULL));
    ck_assert_uint_eq(ckpt_zip_dir_end_at(d, CKPT_ZIP_READER_TORCH),
                      ckpt_zip_dir_end_at(d, CKPT_ZIP_READER_PYZIPFILE));
    ckpt_zip_dir_free(d);
    close(fd);
}
END_TEST

START_TEST(end_record_in_comment)
{
    int fd;
    ckpt_zip_dir *d = open_dir("end_in_comment.pth", &fd);
    ck_assert(has_finding(d, "inside the comment"));
    ck_assert(reads_payload(d, fd, CKPT_ZIP_READER_TORCH, NULL));
    /* zipfile takes the hidden record too, shifts offsets and fails */
    ck_assert(!ckpt_zip_dir_reads(d, CKPT_ZIP_READER_PYZIPFILE));
    ck_assert(has_finding(d, "Python's zipfile refuses it"));
    ckpt_zip_dir_free(d);
    close(fd);
}
END_TEST

START_TEST(local_name_disagrees)
{
    int fd;
    ckpt_zip_dir *d = open_dir("name_mismatch.pth", &fd);
    ck_assert(has_finding(d, "its local header at byte 0 holds another name"));
    ck_assert(reads_payload(d, fd, CKPT_ZIP_READER_TORCH, NULL));
    uint8_t *buf;
    size_t len;
    bool crc_ok;
    ckpt_error err = {0};
    int64_t i = ckpt_zip_dir_find(d, CKPT_ZIP_READER_PYZIPFILE, "data.pkl");
    ck_assert_int_eq(ckpt_zip_dir_read(d, fd, CKPT_ZIP_READER_PYZIPFILE, (size_t)i, 1 << 20,
                                       &buf, &len, &crc_ok, &err), CKPT_ERR_FORMAT);
    free(buf);
    ckpt_zip_dir_free(d);
    close(fd);
}
END_TEST

START_TEST(duplicates_torch_takes_miniz_pick)
{
    int fd;
    ckpt_zip_dir *d = open_dir("duplicate_data_pkl.pth", &fd);
    ck_assert(has_finding(d, "two entries named 'archive/data.pkl'"));
    /* miniz's heap sort puts the last of three equal names first (torch 1.13
     * and 2.x agree: tests/interop/zip_readers.py); zipfile the last, libzip
     * the first */
    ck_assert_int_eq(ckpt_zip_dir_find(d, CKPT_ZIP_READER_TORCH, "data.pkl"), 2);
    ck_assert_int_eq(ckpt_zip_dir_find(d, CKPT_ZIP_READER_PYZIPFILE, "data.pkl"), 2);
    ck_assert_int_eq(ckpt_zip_dir_find(d, CKPT_ZIP_READER_LIBZIP, "data.pkl"), 0);
    ckpt_zip_dir_free(d);
    d = open_dir("duplicate_case.pth", &fd);
    ck_assert(has_finding(d, "differ only in case"));
    ck_assert_int_eq(ckpt_zip_dir_find(d, CKPT_ZIP_READER_TORCH, "data.pkl"), 2);
    ck_assert_int_eq(ckpt_zip_dir_find(d, CKPT_ZIP_READER_PYZIPFILE, "data.pkl"), 0);
    ckpt_zip_dir_free(d);
    close(fd);
}
END_TEST

START_TEST(bad_crc_read_anyway)
{
    int fd;
    ckpt_zip_dir *d = open_dir("crc_global.pth", &fd);
    ck_assert_uint_eq(ckpt_zip_dir_finding_count(d), 0);
    bool crc_ok = true;
    ck_assert(reads_payload(d, fd, CKPT_ZIP_READER_TORCH, &crc_ok));
    ck_assert(!crc_ok);
    ckpt_zip_dir_free(d);
    close(fd);
}
END_TEST

START_TEST(overlap_prefix_zip64)
{
    int fd;
    ckpt_zip_dir *d = open_dir("overlapping.pth", &fd);
    ck_assert(has_finding(d, "overlap (bytes"));
    ckpt_zip_dir_free(d);
    close(fd);
    d = open_dir("prefixed.pth", &fd);
    ck_assert(!ckpt_zip_dir_torch_sniffs(d));
    ck_assert(has_finding(d, "does not start with a local header"));
    ckpt_zip_dir_free(d);
    close(fd);
    d = open_dir("zip64_locator.pth", &fd);
    ck_assert(reads_payload(d, fd, CKPT_ZIP_READER_TORCH, NULL));
    ck_assert(!reads_payload(d, fd, CKPT_ZIP_READER_PYZIPFILE, NULL));
    ck_assert(has_finding(d, "Python's zipfile reads the central directory at byte"));
    ckpt_zip_dir_free(d);
    close(fd);
}
END_TEST

/* One deflated record, written here; CUT bytes of its stream left out of the
 * file (the directory still declares them). */

/* Z's end record (a central directory of N entries from offset CD, which
 * runs to the end of Z), then Z in an unlinked temporary file: its fd. */
static int end_and_write(pk *z, size_t cd, uint64_t n)
{
    size_t cdn = z->n - cd;
    pk_le(z, 0x06054b50, 4), pk_le(z, 0, 4), pk_le(z, n, 2), pk_le(z, n, 2);
    pk_le(z, cdn, 4), pk_le(z, cd, 4), pk_le(z, 0, 2);
    char tmpl[] = "/tmp/check_zip_dir_XXXXXX";
    int fd = mkstemp(tmpl);
    ck_assert_int_ge(fd, 0);
    unlink(tmpl);
    ck_assert_int_eq(write(fd, z->buf, z->n), (ssize_t)z->n);
    return fd;
}
static int deflated_zip(pk *z, const char *text, size_t cut)
{
    uint8_t def[256];
    z_stream s = {0};
    ck_assert_int_eq(deflateInit2(&s, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
    s.next_in = (Bytef *)text;
    s.avail_in = (uInt)strlen(text);
    s.next_out = def;
    s.avail_out = sizeof def;
    ck_assert_int_eq(deflate(&s, Z_FINISH), Z_STREAM_END);
    size_t dn = sizeof def - s.avail_out;
    deflateEnd(&s);
    uint32_t crc = (uint32_t)crc32(0, (const Bytef *)text, (uInt)strlen(text));
    const char *name = "archive/data.pkl";
    size_t nl = strlen(name);
    pk_le(z, 0x04034b50, 4), pk_le(z, 20, 2), pk_le(z, 0, 2), pk_le(z, 8, 2), pk_le(z, 0, 4);
    pk_le(z, crc, 4), pk_le(z, dn, 4), pk_le(z, strlen(text), 4), pk_le(z, nl, 2), pk_le(z, 0, 2);
    pk_bytes(z, name, nl);
    pk_bytes(z, def, dn - cut);
    size_t cd = z->n;
    pk_le(z, 0x02014b50, 4), pk_le(z, 20, 2), pk_le(z, 20, 2), pk_le(z, 0, 2), pk_le(z, 8, 2);
    pk_le(z, 0, 4), pk_le(z, crc, 4), pk_le(z, dn, 4), pk_le(z, strlen(text), 4);
    pk_le(z, nl, 2), pk_le(z, 0, 2), pk_le(z, 0, 2), pk_le(z, 0, 2), pk_le(z, 0, 2);
    pk_le(z, 0, 4), pk_le(z, 0, 4);
    pk_bytes(z, name, nl);
    return end_and_write(z, cd, 1);
}

START_TEST(deflated_and_truncated)
{
    const char *text = "a pickle that is not one, deflated: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for (size_t cut = 0; cut <= 8; cut += 8) {
        pk z = {0};
        int fd = deflated_zip(&z, text, cut);
        ckpt_zip_dir *d = NULL;
        ckpt_error err = {0};
        ck_assert_int_eq(ckpt_zip_dir_open(fd, z.n, &d, &err), CKPT_OK);
        ck_assert_int_eq(ckpt_zip_dir_find(d, CKPT_ZIP_READER_TORCH, "data.pkl"), 0);
        uint8_t *buf;
        size_t len;
        bool crc_ok;
        int rc = ckpt_zip_dir_read(d, fd, CKPT_ZIP_READER_TORCH, 0, 1 << 20, &buf, &len, &crc_ok,
                                   &err);
        if (cut == 0) {
            ck_assert_int_eq(rc, CKPT_OK);
            ck_assert(crc_ok);
            ck_assert_uint_eq(len, strlen(text));
            ck_assert(memcmp(buf, text, len) == 0);
        } else {
            /* the stream runs into the directory: an error, and what inflated */
            ck_assert_int_ne(rc, CKPT_OK);
            ck_assert(!crc_ok);
            ck_assert(len <= strlen(text));
        }
        free(buf);
        ckpt_zip_dir_free(d);
        free(z.buf);
        close(fd);
    }
}
END_TEST

/* Stored records named NAMES[i] holding DATA[i]; each record's directory
 * entry declares DECLARED[i] bytes (less than it holds: the rest is a gap
 * that no entry references), and GAP_AT_END bytes come before the central
 * directory.  Returns the file, written. */
static int stored_zip(pk *z, int n, const char *const *names, const char *const *data,
                      const size_t *declared, const char *gap_at_end)
{
    size_t at[8];
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(names[i]), dl = declared[i];
        uint32_t crc = (uint32_t)crc32(0, (const Bytef *)data[i], (uInt)dl);
        at[i] = z->n;
        pk_le(z, 0x04034b50, 4), pk_le(z, 20, 2), pk_le(z, 0, 2), pk_le(z, 0, 2), pk_le(z, 0, 4);
        pk_le(z, crc, 4), pk_le(z, dl, 4), pk_le(z, dl, 4), pk_le(z, nl, 2), pk_le(z, 0, 2);
        pk_bytes(z, names[i], nl);
        pk_bytes(z, data[i], strlen(data[i]));
    }
    pk_text(z, gap_at_end);
    size_t cd = z->n;
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(names[i]), dl = declared[i];
        uint32_t crc = (uint32_t)crc32(0, (const Bytef *)data[i], (uInt)dl);
        pk_le(z, 0x02014b50, 4), pk_le(z, 20, 2), pk_le(z, 20, 2), pk_le(z, 0, 2), pk_le(z, 0, 2);
        pk_le(z, 0, 4), pk_le(z, crc, 4), pk_le(z, dl, 4), pk_le(z, dl, 4);
        pk_le(z, nl, 2), pk_le(z, 0, 2), pk_le(z, 0, 2), pk_le(z, 0, 2), pk_le(z, 0, 2);
        pk_le(z, 0, 4), pk_le(z, at[i], 4);
        pk_bytes(z, names[i], nl);
    }
    return end_and_write(z, cd, (uint64_t)n);
}

/* Whether the archive of stored_zip has the finding of a central-directory
 * signature that no reader uses, and at which byte. */
static bool stray_at(int n, const char *const *names, const char *const *data,
                     const size_t *declared, const char *gap_at_end, uint64_t *where)
{
    pk z = {0};
    int fd = stored_zip(&z, n, names, data, declared, gap_at_end);
    ckpt_zip_dir *d = NULL;
    ckpt_error err = {0};
    ck_assert_msg(ckpt_zip_dir_open(fd, z.n, &d, &err) == CKPT_OK, "%s", err.msg);
    bool found = false;
    for (size_t i = 0; i < ckpt_zip_dir_finding_count(d); i++) {
        unsigned long long b;
        if (sscanf(ckpt_zip_dir_finding(d, i), "a central directory entry at byte %llu", &b) == 1) {
            found = true;
            *where = b;
        }
    }
    /* the search stops at the first such signature: one finding at most */
    ckpt_zip_dir_free(d);
    free(z.buf);
    close(fd);
    return found;
}

/* A central-directory signature is a finding where no reader's entry holds
 * it whole: in a record's data it is tensor bytes (as likely as any four
 * bytes), in a gap it is a directory some reader might be pointed at.  The
 * search skips the data records, so the edges are checked here: a signature
 * that begins in a record's last three bytes and ends in the gap after it
 * is a finding, and a later one in that gap is not reported before it. */
START_TEST(stray_central_signatures)
{
    const char *names[2] = {"archive/data.pkl", "archive/data/0"};
    uint64_t at = 0;
    /* inside the data: none */
    const char *inside[2] = {"\x80\x02N.", "abcPK\x01\x02xyz"};
    size_t whole[2] = {4, 11};
    ck_assert(!stray_at(2, names, inside, whole, "", &at));
    /* the same signature ending the data exactly: still inside */
    const char *ending[2] = {"\x80\x02N.", "abcdefPK\x01\x02"};
    size_t whole2[2] = {4, 10};
    ck_assert(!stray_at(2, names, ending, whole2, "", &at));
    /* the record declares 8 of its 10 bytes: "PK" in the data, "\x01\x02" in
     * the gap after it, and another signature later in that gap */
    size_t short8[2] = {4, 8};
    size_t rec0 = 30 + strlen(names[0]) + 4, data1 = rec0 + 30 + strlen(names[1]);
    ck_assert(stray_at(2, names, ending, short8, "..PK\x01\x02", &at));
    ck_assert_uint_eq(at, data1 + 6);
    /* one byte shorter: the signature lies wholly in the gap */
    size_t short6[2] = {4, 6};
    ck_assert(stray_at(2, names, ending, short6, "", &at));
    ck_assert_uint_eq(at, data1 + 6);
    /* a gap between two records, and one before the directory */
    const char *between[2] = {"\x80\x02N.PK\x01\x02", "abc"};
    size_t first4[2] = {4, 3};
    ck_assert(stray_at(2, names, between, first4, "", &at));
    ck_assert_uint_eq(at, 30 + strlen(names[0]) + 4);
    const char *plain[2] = {"\x80\x02N.", "abc"};
    size_t all[2] = {4, 3};
    ck_assert(stray_at(2, names, plain, all, "PK\x01\x02", &at));
    ck_assert_uint_eq(at, data1 + 3);
    ck_assert(!stray_at(2, names, plain, all, "PK\x01", &at));
}
END_TEST

/* Bytes this process has read so far (read, pread, ...: /proc/self/io). */
static uint64_t bytes_read(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    ck_assert_ptr_nonnull(f);
    unsigned long long n = 0;
    char line[128];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %llu", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* The readers' views and every finding cost the headers, not the data: a
 * 1 GiB record (a hole in a sparse file, its CRC-32 not the data's) is not
 * read.  Reading it (as the search for stray signatures once did) reads
 * 1 GiB and fails this. */
START_TEST(data_records_are_not_read)
{
    const char *name = "archive/data/0", *pkl = "archive/data.pkl";
    const uint64_t big = 1ull << 30;
    pk z = {0};
    size_t nl = strlen(name), pl = strlen(pkl);
    pk_le(&z, 0x04034b50, 4), pk_le(&z, 20, 2), pk_le(&z, 0, 2), pk_le(&z, 0, 2), pk_le(&z, 0, 4);
    pk_le(&z, 0x12345678, 4), pk_le(&z, big, 4), pk_le(&z, big, 4), pk_le(&z, nl, 2);
    pk_le(&z, 0, 2);
    pk_bytes(&z, name, nl);
    uint64_t pkl_at = z.n + big;
    pk t = {0}; /* the rest, written after the hole */
    pk_le(&t, 0x04034b50, 4), pk_le(&t, 20, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 4);
    uint32_t crc = (uint32_t)crc32(0, (const Bytef *)"\x80\x02N.", 4);
    pk_le(&t, crc, 4), pk_le(&t, 4, 4), pk_le(&t, 4, 4), pk_le(&t, pl, 2), pk_le(&t, 0, 2);
    pk_bytes(&t, pkl, pl);
    pk_bytes(&t, "\x80\x02N.", 4);
    uint64_t cd = pkl_at + t.n;
    size_t cd0 = t.n;
    pk_le(&t, 0x02014b50, 4), pk_le(&t, 20, 2), pk_le(&t, 20, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2);
    pk_le(&t, 0, 4), pk_le(&t, 0x12345678, 4), pk_le(&t, big, 4), pk_le(&t, big, 4);
    pk_le(&t, nl, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2);
    pk_le(&t, 0, 4), pk_le(&t, 0, 4);
    pk_bytes(&t, name, nl);
    pk_le(&t, 0x02014b50, 4), pk_le(&t, 20, 2), pk_le(&t, 20, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2);
    pk_le(&t, 0, 4), pk_le(&t, crc, 4), pk_le(&t, 4, 4), pk_le(&t, 4, 4);
    pk_le(&t, pl, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2), pk_le(&t, 0, 2);
    pk_le(&t, 0, 4), pk_le(&t, pkl_at, 4);
    pk_bytes(&t, pkl, pl);
    size_t cdn = t.n - cd0;
    pk_le(&t, 0x06054b50, 4), pk_le(&t, 0, 4), pk_le(&t, 2, 2), pk_le(&t, 2, 2);
    pk_le(&t, cdn, 4), pk_le(&t, cd, 4), pk_le(&t, 0, 2);
    char tmpl[] = "/tmp/check_zip_dir_XXXXXX";
    int fd = mkstemp(tmpl);
    ck_assert_int_ge(fd, 0);
    unlink(tmpl);
    ck_assert_int_eq(write(fd, z.buf, z.n), (ssize_t)z.n);
    ck_assert_int_eq(pwrite(fd, t.buf, t.n, (off_t)pkl_at), (ssize_t)t.n);
    uint64_t size = pkl_at + t.n, before = bytes_read();
    ckpt_zip_dir *d = NULL;
    ckpt_error err = {0};
    ck_assert_msg(ckpt_zip_dir_open(fd, size, &d, &err) == CKPT_OK, "%s", err.msg);
    uint64_t used = bytes_read() - before;
    ck_assert_msg(used < (4u << 20), "%llu bytes read to open a zip of a 1 GiB record",
                  (unsigned long long)used);
    ck_assert_uint_eq(ckpt_zip_dir_finding_count(d), 0);
    for (int r = 0; r < CKPT_ZIP_READERS; r++)
        ck_assert_uint_eq(ckpt_zip_dir_count(d, (ckpt_zip_reader)r), 2);
    ckpt_zip_dir_free(d);
    free(z.buf);
    free(t.buf);
    close(fd);
}
END_TEST

START_TEST(not_a_zip)
{
    char tmpl[] = "/tmp/check_zip_dir_XXXXXX";
    int fd = mkstemp(tmpl);
    unlink(tmpl);
    ck_assert_int_eq(write(fd, "\x80\x02}q\x00.", 6), 6);
    ckpt_zip_dir *d = (ckpt_zip_dir *)1;
    ckpt_error err = {0};
    ck_assert_int_eq(ckpt_zip_dir_open(fd, 6, &d, &err), CKPT_ERR_FORMAT);
    ck_assert_ptr_null(d);
    close(fd);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zip_dir");
    TCase *t = tcase_create("readers");
    tcase_add_test(t, plain_archive_has_no_findings);
    tcase_add_test(t, two_end_records_torch_takes_the_last);
    tcase_add_test(t, end_record_in_comment);
    tcase_add_test(t, local_name_disagrees);
    tcase_add_test(t, duplicates_torch_takes_miniz_pick);
    tcase_add_test(t, bad_crc_read_anyway);
    tcase_add_test(t, overlap_prefix_zip64);
    tcase_add_test(t, deflated_and_truncated);
    tcase_add_test(t, not_a_zip);
    tcase_add_test(t, stray_central_signatures);
    tcase_add_test(t, data_records_are_not_read);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
