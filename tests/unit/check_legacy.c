/* check_legacy.c - the pre-1.6 torch.save stream, built byte by byte here and
 * read from the committed torch fixtures. */
#include "unit.h"
#include "formats/format.h"

#include <fcntl.h>
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
/* VIEW: 0 no view_metadata (None); 1 a view named by the root's own key;
 * 2 view "94824" of elements 1.. of the root, the tensor over it;
 * 3 the same view one element too long */
static void pk_main(pk *p, const char *key, int64_t numel, int view)
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
    if (view) {
        pk_str(p, view == 1 ? key : "94824");
        pk_int(p, view == 1 ? 0 : 1);
        pk_int(p, view == 2 ? numel - 1 : numel);
        pk_op(p, 0x87);
    } else {
        pk_op(p, 'N');
    }
    pk_op(p, 't');
    pk_op(p, 'Q');
    pk_int(p, 0);
    pk_int(p, view >= 2 ? numel - 1 : numel);
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
                        int ndata, int view_metadata)
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

/* PyTorch 0.3's view_metadata: a view named by its root's own key is the
 * root (torch's legacy_load finds it made already) */
START_TEST(view_metadata_of_the_root_itself)
{
    make_legacy(true, 1001, 3, 3, 3, 1);
    ck_assert_msg(ckpt_file_open(f, path) == CKPT_OK, "%s", ckpt_file_error_message(f));
    ck_assert_uint_eq(ckpt_file_storage_count(f), 1);
}
END_TEST

/* a view of elements 1..2: its own storage, whose bytes are the root's */
START_TEST(view_metadata_slices_the_root)
{
    make_legacy(true, 1001, 3, 3, 3, 2);
    ck_assert_msg(ckpt_file_open(f, path) == CKPT_OK, "%s", ckpt_file_error_message(f));
    const ckpt_tensor *t = ckpt_file_tensor(f, 0, NULL);
    int64_t off = -1;
    const ckpt_storage *root = ckpt_storage_view_of(ckpt_tensor_storage(t), &off);
    ck_assert_ptr_nonnull(root);
    ck_assert_str_eq(ckpt_storage_key(root), "94823");
    ck_assert_str_eq(ckpt_storage_key(ckpt_tensor_storage(t)), "94824");
    ck_assert_int_eq(off, 1);
    float out[2];
    ck_assert_int_eq(ckpt_tensor_read(f, t, out, sizeof(out)), CKPT_OK);
    ck_assert(out[0] == 1.5f && out[1] == 2.5f);
}
END_TEST

START_TEST(view_metadata_past_the_root)
{
    make_legacy(true, 1001, 3, 3, 3, 3);
    ck_assert_int_eq(ckpt_file_open(f, path), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "does not lie inside its storage '94823' of 3 elements");
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

/* ---- pth-legacy's walk, as ckpt scan and the torch_load verdicts use it ---- */

typedef struct seen {
    ckpt_arena arena;
    int npickles, nrecords;
    const char *names[5];
    uint64_t offsets[5], ends[5];
    unsigned pids[5];
    uint64_t record_offset, record_count, record_avail;
} seen;

static ckpt_global_class any_class(void *user, const char *q)
{
    (void)user, (void)q;
    return CKPT_GLOBAL_KNOWN_DATA;
}

static ckpt_value *any_pid(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    (void)pid, (void)offset, (void)err;
    return ckpt_arena_alloc(&((seen *)user)->arena, sizeof(ckpt_value)); /* None */
}

static void no_global(void *u, const char *q, ckpt_global_class c, int op, uint64_t at)
{
    (void)u, (void)q, (void)c, (void)op, (void)at;
}

static void no_use(void *u, const char *q, int op, uint64_t at)
{
    (void)u, (void)q, (void)op, (void)at;
}

/* Each pickle the walk hands out: read by the VM in scan mode, noted. */
static int on_pickle(ckpt_walk *w, const ckpt_walk_pickle *p, size_t *used, ckpt_value **root)
{
    seen *s = w->user;
    ck_assert_int_eq(p->index, s->npickles);
    static const uint64_t limits[CKPT_LIMIT_COUNT_] = {1 << 20, 100, 1 << 16, 1 << 12, 1 << 16,
                                                       1 << 16, 1 << 12};
    ckpt_pickle_ctx ctx = {.name = p->name, .limits = limits, .classify = any_class,
                           .persistent_load = p->pid_fields ? any_pid : NULL, .user = s,
                           .arena = &s->arena, .on_global = no_global, .on_use = no_use,
                           .scan = true};
    ckpt_error err = {0};
    ck_assert_int_eq(ckpt_pickle_load(&ctx, p->buf, p->len, root, used, &err), CKPT_OK);
    s->names[p->index] = p->name;
    s->offsets[p->index] = p->offset;
    s->ends[p->index] = p->offset + *used;
    s->pids[p->index] = p->pid_fields;
    s->npickles++;
    return CKPT_OK;
}

/* Each storage after the key list: its element count, 4 bytes each (float32). */
static int on_storage(ckpt_walk *w, const ckpt_walk_record *r, uint64_t *size)
{
    seen *s = w->user;
    ck_assert(r->has_count);
    s->record_offset = r->offset;
    s->record_count = r->count;
    s->record_avail = r->avail;
    s->nrecords++;
    *size = r->count * 4;
    return CKPT_OK;
}

static int walk_file(seen *s, ckpt_walk *w, ckpt_error *err)
{
    memset(s, 0, sizeof *s);
    ckpt_arena_init(&s->arena);
    w->pickle = on_pickle;
    w->record = on_storage;
    w->user = s;
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ckpt_source src = {.fd = fd, .file_size = (uint64_t)lseek(fd, 0, SEEK_END), .path = path};
    int rc = ckpt_format_pth_legacy.walk(w, &src, err);
    close(fd);
    ckpt_arena_release(&s->arena);
    return rc;
}

START_TEST(walk_hands_out_torchs_pickles_in_order)
{
    make_legacy(true, 1001, 3, 3, 3, false);
    seen s;
    ckpt_walk w = {0};
    ckpt_error err = {0};
    ck_assert_int_eq(walk_file(&s, &w, &err), CKPT_OK);
    ck_assert_ptr_null(w.stop.exception);
    static const char *const want[] = {"magic number", "protocol version", "sys_info",
                                       "data pickle", "storage keys"};
    ck_assert_int_eq(s.npickles, 5);
    for (int k = 0; k < 5; k++) {
        ck_assert_str_eq(s.names[k], want[k]);
        /* back to back from byte 0; only the data pickle has persistent ids */
        ck_assert_uint_eq(s.offsets[k], k ? s.ends[k - 1] : 0);
        ck_assert_uint_eq(s.pids[k], k == 3 ? 6 : 0);
    }
    /* then the storage: its count right after the key list, 3 floats after it */
    ck_assert_int_eq(s.nrecords, 1);
    ck_assert_uint_eq(s.record_offset, s.ends[4]);
    ck_assert_uint_eq(s.record_count, 3);
    ck_assert_uint_eq(s.record_avail, 8 + 3 * 4);
}
END_TEST

START_TEST(walk_stops_where_torch_does)
{
    make_legacy(false, 1001, 3, 3, 3, false);
    seen s;
    ckpt_walk w = {0};
    ckpt_error err = {0};
    ck_assert_int_eq(walk_file(&s, &w, &err), CKPT_ERR_FORMAT);
    /* torch's RuntimeError after the first pickle; the reader's message in ERR */
    ck_assert_int_eq(s.npickles, 1);
    ck_assert_str_eq(w.stop.exception, "RuntimeError");
    ck_assert_str_eq(w.stop.message, "Invalid magic number; corrupt file?");
    ck_assert_int_eq(w.stop.pickle, 0);
    ck_assert_uint_eq(w.stop.offset, s.ends[0]);
    ck_assert_str_eq(err.msg, "invalid magic number; not a torch.save file");

    make_legacy(true, 1000, 3, 3, 3, false);
    ckpt_err_clear(&err);
    ck_assert_int_eq(walk_file(&s, &w, &err), CKPT_ERR_UNSUPPORTED);
    ck_assert_int_eq(s.npickles, 2);
    ck_assert_str_eq(w.stop.message, "Invalid protocol version: 1000");
    ck_assert_int_eq(w.stop.pickle, 1);
}
END_TEST

/* Python compares the magic number by value: a LONG1 with a sign byte is it */
START_TEST(magic_with_a_sign_byte)
{
    static const uint8_t m[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    pk p = {0};
    pk_proto2(&p);
    pk_op(&p, 0x8a);
    pk_op(&p, 11);
    pk_bytes(&p, m, 10);
    pk_op(&p, 0);
    pk_op(&p, '.');
    pk q = {0};
    pk_header(&q, true, 1001);
    size_t magic_len = 15; /* the plain magic pickle pk_header wrote first */
    pk_bytes(&p, q.buf + magic_len, q.n - magic_len);
    pk_main(&p, "94823", 3, false);
    pk_keys(&p, "94823");
    pk_le(&p, 3, 8);
    pk_le(&p, 0, 12);
    write_file(&p);
    pk_free(&p);
    pk_free(&q);
    ck_assert_msg(ckpt_file_open(f, path) == CKPT_OK, "%s", ckpt_file_error_message(f));
    ck_assert_uint_eq(ckpt_file_tensor_count(f), 1);
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
    tcase_add_test(t, view_metadata_of_the_root_itself);
    tcase_add_test(t, view_metadata_slices_the_root);
    tcase_add_test(t, view_metadata_past_the_root);
    tcase_add_test(t, torch_fixture_legacy_mlp);
    tcase_add_test(t, torch_fixture_legacy_train);
    tcase_add_test(t, walk_hands_out_torchs_pickles_in_order);
    tcase_add_test(t, walk_stops_where_torch_does);
    tcase_add_test(t, magic_with_a_sign_byte);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
