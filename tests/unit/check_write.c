/* check_write.c - the writing side: pickle writer round trips, the torch
 * zip layout (alignment, zip64), key rename rules with _metadata, device
 * remaps, and whole-file rewrites read back through the reader. */
#include "unit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>
#include <zlib.h>

static char dir[256];
static char path[512];
static ckpt_file *f;
static pk p;

static void setup(void)
{
    unit_tmpdir(dir, sizeof(dir), path, sizeof(path), "out.pth");
    f = ckpt_file_new();
    memset(&p, 0, sizeof(p));
}

static void teardown(void)
{
    ckpt_file_free(f);
    pk_free(&p);
    unlink(path);
    char other[600];
    snprintf(other, sizeof(other), "%s/other.pth", dir);
    unlink(other);
    rmdir(dir);
}

/* Structural equality of two value trees (tensors by view and storage). */
static bool same_value(const ckpt_value *a, const ckpt_value *b, int depth)
{
    if (depth > 100 || a->kind != b->kind)
        return false;
    switch (a->kind) {
    case CKPT_KIND_NONE:
        return true;
    case CKPT_KIND_BOOL:
        return a->u.b == b->u.b;
    case CKPT_KIND_INT:
        if (a->u.i.big != b->u.i.big)
            return false;
        return a->u.i.big ? a->u.i.nbytes == b->u.i.nbytes &&
                                memcmp(a->u.i.bytes, b->u.i.bytes, a->u.i.nbytes) == 0
                          : a->u.i.v == b->u.i.v;
    case CKPT_KIND_FLOAT:
        return memcmp(&a->u.f, &b->u.f, sizeof(double)) == 0;
    case CKPT_KIND_STR:
    case CKPT_KIND_BYTES:
        return a->u.s.len == b->u.s.len && memcmp(a->u.s.s, b->u.s.s, a->u.s.len) == 0 &&
               (a->flags & CKPT_VF_BYTEARRAY) == (b->flags & CKPT_VF_BYTEARRAY);
    case CKPT_KIND_GLOBAL:
        return strcmp(a->u.global.name, b->u.global.name) == 0;
    case CKPT_KIND_LIST:
    case CKPT_KIND_TUPLE:
    case CKPT_KIND_SET:
    case CKPT_KIND_FROZENSET:
        if (a->u.seq.len != b->u.seq.len)
            return false;
        for (size_t i = 0; i < a->u.seq.len; i++)
            if (!same_value(a->u.seq.items[i], b->u.seq.items[i], depth + 1))
                return false;
        return true;
    case CKPT_KIND_DICT:
        if (a->u.dict.keys.len != b->u.dict.keys.len ||
            (a->flags & CKPT_VF_ORDERED) != (b->flags & CKPT_VF_ORDERED))
            return false;
        for (size_t i = 0; i < a->u.dict.keys.len; i++)
            if (!same_value(a->u.dict.keys.items[i], b->u.dict.keys.items[i], depth + 1) ||
                !same_value(a->u.dict.vals.items[i], b->u.dict.vals.items[i], depth + 1))
                return false;
        if (!a->u.dict.state != !b->u.dict.state)
            return false;
        return !a->u.dict.state || same_value(a->u.dict.state, b->u.dict.state, depth + 1);
    case CKPT_KIND_OBJECT:
        return strcmp(ckpt_value_global(a), ckpt_value_global(b)) == 0 &&
               (!a->u.obj.args || same_value(a->u.obj.args, b->u.obj.args, depth + 1)) &&
               (!a->u.obj.state || same_value(a->u.obj.state, b->u.obj.state, depth + 1));
    case CKPT_KIND_TENSOR: {
        const ckpt_tensor *x = a->u.tensor, *y = b->u.tensor;
        if (x->dtype != y->dtype || x->ndim != y->ndim || x->offset != y->offset ||
            x->parameter != y->parameter || x->requires_grad != y->requires_grad ||
            strcmp(x->storage->device, y->storage->device) != 0 ||
            x->storage->nbytes != y->storage->nbytes)
            return false;
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d] || x->stride[d] != y->stride[d])
                return false;
        return true;
    }
    default:
        return true;
    }
}

/* Write the tree of F with the pickle writer and read it back in G. */
static ckpt_value *round_trip(ckpt_file *g, const ckpt_value *root, ckpt_pickle_out *out)
{
    ck_assert_int_eq(ckpt_pickle_write(&f->arena, f->nstorages, root, out, &f->err), CKPT_OK);
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(g, &ctx, "rewritten.pkl");
    ckpt_value *v = NULL;
    int rc = ckpt_pickle_load(&ctx, out->buf, out->len, &v, NULL, &g->err);
    ck_assert_msg(rc == CKPT_OK, "%s", ckpt_file_error_message(g));
    return v;
}

static size_t count_op(const ckpt_pickle_out *o, uint8_t op)
{
    size_t n = 0;
    for (size_t i = 0; i < o->len; i++)
        n += o->buf[i] == op;
    return n;
}

START_TEST(pickle_round_trip_of_every_kind)
{
    /* protocol 4 input with sets, bytes, big ints, floats, objects */
    pk_op(&p, 0x80);
    pk_op(&p, 4);
    pk_op(&p, '(');
    pk_int(&p, -7);
    pk_int(&p, INT64_C(1) << 40);
    pk_op(&p, 0x8a); /* 2**64 */
    pk_le(&p, 9, 1);
    pk_le(&p, 0, 8);
    pk_op(&p, 1);
    pk_op(&p, 'G');
    uint8_t be[8] = {0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18}; /* pi */
    pk_bytes(&p, be, 8);
    pk_str(&p, "caf\xc3\xa9");
    pk_op(&p, 'C');
    pk_le(&p, 3, 1);
    pk_bytes(&p, "\x00\xff\x41", 3);
    pk_op(&p, 0x8f); /* EMPTY_SET + ADDITEMS */
    pk_op(&p, '(');
    pk_int(&p, 1);
    pk_op(&p, 0x90);
    pk_op(&p, '(');
    pk_int(&p, 2);
    pk_op(&p, 0x91); /* FROZENSET */
    pk_global(&p, "argparse", "Namespace");
    pk_op(&p, ')');
    pk_op(&p, 0x81);
    pk_op(&p, '}');
    pk_str(&p, "lr");
    pk_int(&p, 3);
    pk_op(&p, 's');
    pk_op(&p, 'b');
    pk_global(&p, "torch", "float16");
    pk_op(&p, 'N');
    pk_op(&p, 0x88);
    pk_op(&p, 'l');
    pk_op(&p, '.');
    ckpt_value *v;
    ck_assert_int_eq(pk_load(f, &p, &v), CKPT_OK);
    ckpt_file *g = ckpt_file_new();
    ckpt_pickle_out out;
    ckpt_value *back = round_trip(g, v, &out);
    ck_assert(same_value(v, back, 0));
    ck_assert_uint_eq(out.buf[0], 0x80);
    ck_assert_uint_eq(out.buf[1], 2);
    ckpt_pickle_out_free(&out);
    ckpt_file_free(g);
}
END_TEST

START_TEST(pickle_shared_objects_stay_shared)
{
    /* [L, L, 'k', 'k'] with L one list: the second L and 'k' are BINGETs */
    pk_proto2(&p);
    pk_op(&p, '(');
    pk_op(&p, ']');
    pk_op(&p, 'q');
    pk_le(&p, 0, 1);
    pk_op(&p, 'h');
    pk_le(&p, 0, 1);
    pk_str(&p, "k");
    pk_str(&p, "k");
    pk_op(&p, 'l');
    pk_op(&p, '.');
    ckpt_value *v;
    ck_assert_int_eq(pk_load(f, &p, &v), CKPT_OK);
    ckpt_file *g = ckpt_file_new();
    ckpt_pickle_out out;
    ckpt_value *back = round_trip(g, v, &out);
    ck_assert_ptr_eq(ckpt_value_item(back, 0), ckpt_value_item(back, 1));
    ck_assert_uint_eq(count_op(&out, 'h'), 2);
    ck_assert_uint_eq(count_op(&out, 'X'), 1);
    ckpt_pickle_out_free(&out);
    ckpt_file_free(g);
}
END_TEST

START_TEST(pickle_cycle_through_a_list)
{
    /* L = []; L.append(L) */
    pk_proto2(&p);
    pk_op(&p, ']');
    pk_op(&p, 'q');
    pk_le(&p, 0, 1);
    pk_op(&p, 'h');
    pk_le(&p, 0, 1);
    pk_op(&p, 'a');
    pk_op(&p, '.');
    ckpt_value *v;
    ck_assert_int_eq(pk_load(f, &p, &v), CKPT_OK);
    ckpt_file *g = ckpt_file_new();
    ckpt_pickle_out out;
    ckpt_value *back = round_trip(g, v, &out);
    ck_assert_ptr_eq(ckpt_value_item(back, 0), back);
    ckpt_pickle_out_free(&out);
    ckpt_file_free(g);
}
END_TEST

START_TEST(pickle_batches_of_a_thousand)
{
    pk_proto2(&p);
    pk_op(&p, ']');
    pk_op(&p, '(');
    for (int i = 0; i < 2500; i++)
        pk_op(&p, 'N');
    pk_op(&p, 'e');
    pk_op(&p, '.');
    ckpt_value *v;
    ck_assert_int_eq(pk_load(f, &p, &v), CKPT_OK);
    ckpt_file *g = ckpt_file_new();
    ckpt_pickle_out out;
    ckpt_value *back = round_trip(g, v, &out);
    ck_assert_uint_eq(ckpt_value_len(back), 2500);
    ck_assert_uint_eq(count_op(&out, 'e'), 3); /* 1000 + 1000 + 500 */
    ckpt_pickle_out_free(&out);
    ckpt_file_free(g);
}
END_TEST

/* ---- zip layout ---- */

static uint64_t data_offset_of(const char *file, const char *name)
{
    ckpt_zip *z;
    ckpt_error err = {0};
    int fd = open(file, O_RDONLY);
    ck_assert_int_eq(ckpt_zip_open(fd, &z, &err), CKPT_OK);
    int64_t i = ckpt_zip_find(z, name);
    ck_assert_int_ge(i, 0);
    uint64_t off = 0;
    ck_assert_int_eq(ckpt_zip_data_offset(z, i, &off, &err), CKPT_OK);
    ckpt_zip_close(z);
    close(fd);
    return off;
}

START_TEST(zip_records_aligned_to_64)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    ckpt_error err = {0};
    ckpt_zipw *w = ckpt_zipw_new(fd, &err);
    const char *names[] = {"x/data.pkl", "x/a", "x/longer/name/than/most", "x/empty"};
    const char *data[] = {"\x80\x02N.", "hello", "0123456789abcdef0123", ""};
    for (int i = 0; i < 4; i++) {
        uint64_t at;
        size_t n = strlen(data[i]);
        ck_assert_int_eq(ckpt_zipw_begin(w, names[i], n, &at), CKPT_OK);
        ck_assert_uint_eq(at % 64, 0);
        ck_assert_int_eq(ckpt_zipw_write(w, data[i], n), CKPT_OK);
        ck_assert_int_eq(ckpt_zipw_end(w, (uint32_t)crc32(0, (const Bytef *)data[i], (uInt)n)),
                         CKPT_OK);
    }
    ck_assert_int_eq(ckpt_zipw_finish(w), CKPT_OK);
    ckpt_zipw_free(w);
    close(fd);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(data_offset_of(path, names[i]) % 64, 0);
    /* and libzip reads it, CRCs included */
    ckpt_zip *z;
    fd = open(path, O_RDONLY);
    ck_assert_int_eq(ckpt_zip_open(fd, &z, &err), CKPT_OK);
    char buf[32];
    int64_t i = ckpt_zip_find(z, "x/longer/name/than/most");
    ck_assert_int_eq(ckpt_zip_read(z, i, 0, buf, 20, &err), CKPT_OK);
    ck_assert(memcmp(buf, data[2], 20) == 0);
    ckpt_zip_close(z);
    close(fd);
}
END_TEST

/* Every record's CRC-32 comes from ckpt_crc32_update (carry-less multiplication
 * where the CPU has it): the same value as zlib's for any length, alignment,
 * starting CRC and split into calls. */
START_TEST(crc32_equals_zlib_at_any_length_and_alignment)
{
    enum { N = 70000 };
    uint8_t *buf = malloc(N + 64);
    ck_assert_ptr_nonnull(buf);
    uint32_t x = 12345;
    for (size_t i = 0; i < N + 64; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    size_t lens[] = {0, 1, 15, 16, 63, 64, 65, 79, 80, 127, 128, 129, 1000, 4096, 65537, N};
    for (size_t a = 0; a < 64; a += 7)
        for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
            uint32_t start = k % 2 ? 0 : 0xdeadbeefu;
            ck_assert_uint_eq(ckpt_crc32_update(start, buf + a, lens[k]),
                              (uint32_t)crc32(start, buf + a, (uInt)lens[k]));
        }
    uint32_t whole = (uint32_t)crc32(0, buf, N), parts = 0;
    for (size_t at = 0, step = 1; at < N; at += step, step = step * 3 % 997 + 1)
        parts = ckpt_crc32_update(parts, buf + at, at + step > N ? N - at : step);
    ck_assert_uint_eq(parts, whole);
    free(buf);
}
END_TEST

START_TEST(zip64_sizes_and_offsets)
{
    /* a 4.5 GiB record of zeros (a sparse hole), then a small one whose
     * local header lies past 4 GiB */
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    ckpt_error err = {0};
    ckpt_zipw *w = ckpt_zipw_new(fd, &err);
    uint64_t big = (UINT64_C(9) << 29), at;
    ck_assert_int_eq(ckpt_zipw_begin(w, "x/data/0", big, &at), CKPT_OK);
    ck_assert_int_eq(ftruncate(fd, (off_t)(at + big)), 0);
    ckpt_zipw_advance(w, big);
    static uint8_t zeros[1 << 20];
    uLong crc = crc32(0, Z_NULL, 0);
    for (uint64_t done = 0; done < big; done += sizeof(zeros))
        crc = crc32(crc, zeros, sizeof(zeros));
    ck_assert_int_eq(ckpt_zipw_end(w, (uint32_t)crc), CKPT_OK);
    ck_assert_int_eq(ckpt_zipw_begin(w, "x/version", 2, &at), CKPT_OK);
    ck_assert_uint_gt(at, UINT64_C(0xFFFFFFFF));
    ck_assert_uint_eq(at % 64, 0);
    ck_assert_int_eq(ckpt_zipw_write(w, "3\n", 2), CKPT_OK);
    ck_assert_int_eq(ckpt_zipw_end(w, (uint32_t)crc32(0, (const Bytef *)"3\n", 2)), CKPT_OK);
    ck_assert_int_eq(ckpt_zipw_finish(w), CKPT_OK);
    ckpt_zipw_free(w);
    close(fd);
    ckpt_zip *z;
    fd = open(path, O_RDONLY);
    ck_assert_int_eq(ckpt_zip_open(fd, &z, &err), CKPT_OK);
    ck_assert_uint_eq(ckpt_zip_size(z, ckpt_zip_find(z, "x/data/0")), big);
    char v[2];
    ck_assert_int_eq(ckpt_zip_read(z, ckpt_zip_find(z, "x/version"), 0, v, 2, &err), CKPT_OK);
    ck_assert(v[0] == '3');
    ckpt_zip_close(z);
    close(fd);
    ck_assert_uint_eq(data_offset_of(path, "x/version") % 64, 0);
}
END_TEST

/* ---- rename rules ---- */

static char *apply1(ckpt_rename *r, const char *key)
{
    char *s = ckpt_rename_apply(r, key);
    ck_assert_ptr_nonnull(s);
    return s;
}

#define ck_assert_renames(r, from, to)          \
    do {                                        \
        char *s_ = apply1((r), (from));         \
        ck_assert_str_eq(s_, (to));             \
        free(s_);                               \
    } while (0)

START_TEST(rules_strip_add_unwrap)
{
    ckpt_rename *r = ckpt_rename_new();
    ck_assert_int_eq(ckpt_rename_strip_prefix(r, "module."), CKPT_OK);
    ck_assert_renames(r, "module.module.n.1.weight", "n.1.weight");
    ck_assert_renames(r, "n.1.weight", "n.1.weight");
    ck_assert_renames(r, "encoder.module.x", "encoder.module.x");
    ckpt_rename_free(r);

    r = ckpt_rename_new();
    ck_assert_int_eq(ckpt_rename_add_prefix(r, "module."), CKPT_OK);
    ck_assert_renames(r, "n.1.weight", "module.n.1.weight");
    ck_assert_int_eq(ckpt_rename_add_prefix(r, ""), CKPT_ERR_USAGE);
    ckpt_rename_free(r);

    r = ckpt_rename_new();
    ck_assert_int_eq(ckpt_rename_unwrap(r), CKPT_OK);
    ck_assert_renames(r, "module._orig_mod.enc._fsdp_wrapped_module.w", "enc.w");
    ck_assert_renames(r, "my_module.w", "my_module.w");
    ck_assert_renames(r, "a._checkpoint_wrapped_module._forward_module.b", "a.b");
    ckpt_rename_free(r);
}
END_TEST

START_TEST(rules_sed)
{
    ckpt_rename *r = ckpt_rename_new();
    ck_assert_int_eq(ckpt_rename_sed(r, "s/^partitions\\.0\\.0\\./encoder./"), CKPT_OK);
    ck_assert_int_eq(ckpt_rename_sed(r, "s|^partitions\\.1\\.(\\d)\\.|decoder.\\1.|"), CKPT_OK);
    ck_assert_renames(r, "partitions.0.0.conv1.weight", "encoder.conv1.weight");
    ck_assert_renames(r, "partitions.1.1.fc.weight", "decoder.1.fc.weight");
    ckpt_rename_free(r);

    r = ckpt_rename_new();
    ck_assert_int_eq(ckpt_rename_sed(r, "s/(\\w+)\\.weight/$1.W/g"), CKPT_OK);
    ck_assert_renames(r, "a.weight.b.weight", "a.W.b.W");
    ckpt_rename_free(r);

    r = ckpt_rename_new();
    ck_assert_int_eq(ckpt_rename_sed(r, "s/LAYER/layer/i"), CKPT_OK);
    ck_assert_renames(r, "Layer.Layer", "layer.Layer");
    ck_assert_int_eq(ckpt_rename_sed(r, "s/a/b"), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_rename_sed(r, "x/a/b/"), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_rename_sed(r, "s/(/b/"), CKPT_ERR_USAGE);
    ck_assert(strstr(ckpt_rename_error(r), "bad regular expression") != NULL);
    ck_assert_int_eq(ckpt_rename_sed(r, "s/a/b/q"), CKPT_ERR_USAGE);
    /* a group the expression lacks is an error even when no key matches */
    ck_assert_int_eq(ckpt_rename_sed(r, "s/zzz/\\2/"), CKPT_ERR_USAGE);
    ck_assert(strstr(ckpt_rename_error(r), "refers to group 2") != NULL);
    /* the error pair every handle has: the last rule's status and message */
    ck_assert_int_eq(ckpt_rename_error_code(r), CKPT_ERR_USAGE);
    ck_assert_str_eq(ckpt_rename_error_message(r), ckpt_rename_error(r));
    ck_assert_int_eq(ckpt_rename_sed(r, "s/(z)zz/${1}$$/"), CKPT_OK);
    ck_assert_int_eq(ckpt_rename_error_code(r), CKPT_OK);
    ck_assert_str_eq(ckpt_rename_error_message(r), "");
    ck_assert_int_eq(ckpt_rename_add_prefix(r, ""), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_rename_error_code(r), CKPT_ERR_USAGE);
    ck_assert_str_eq(ckpt_rename_error_message(r), "the prefix is empty");
    ck_assert_int_eq(ckpt_rename_error_code(NULL), CKPT_ERR_USAGE);
    ckpt_rename_free(r);
}
END_TEST

/* ---- edits on real files ---- */

static const ckpt_value *metadata_of(const ckpt_value *sd)
{
    return ckpt_value_dict_get(ckpt_value_state(sd), "_metadata");
}

static const char *dict_key(const ckpt_value *d, size_t i)
{
    return ckpt_value_str(ckpt_value_dict_key(d, i), NULL);
}

START_TEST(strip_rewrites_keys_and_metadata)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/ddp2_mlp.pth")), CKPT_OK);
    ckpt_rename *r = ckpt_rename_new();
    ckpt_rename_strip_prefix(r, "module.");
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, NULL, 0, NULL), CKPT_OK);
    ckpt_rename_free(r);
    const ckpt_value *sd = ckpt_file_root(f);
    ck_assert_str_eq(dict_key(sd, 0), "n.1.weight");
    const ckpt_value *md = metadata_of(sd);
    /* '', 'module', 'module.module' meet at '': the innermost wins, in first place */
    ck_assert_str_eq(dict_key(md, 0), "");
    ck_assert_str_eq(dict_key(md, 1), "n");
    for (size_t i = 0; i < ckpt_value_len(md); i++)
        ck_assert(strncmp(dict_key(md, i), "module", 6) != 0);
    ck_assert_int_eq(ckpt_file_write(f, path, NULL), CKPT_OK);
    ckpt_file *g = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(g, path), CKPT_OK);
    ck_assert(same_value(ckpt_file_root(f), ckpt_file_root(g), 0));
    /* the data came through intact */
    for (size_t i = 0; i < ckpt_file_tensor_count(g); i++) {
        ckpt_tensor_stats a, b;
        ck_assert_int_eq(ckpt_tensor_stats_compute(f, ckpt_file_tensor(f, i, NULL), &a), CKPT_OK);
        ck_assert_int_eq(ckpt_tensor_stats_compute(g, ckpt_file_tensor(g, i, NULL), &b), CKPT_OK);
        ck_assert_uint_eq(a.crc32, b.crc32);
    }
    ckpt_file_free(g);
}
END_TEST

START_TEST(add_puts_a_new_root_entry_first)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/mlp.pth")), CKPT_OK);
    ckpt_rename *r = ckpt_rename_new();
    ckpt_rename_add_prefix(r, "module.");
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, NULL, 0, NULL), CKPT_OK);
    ckpt_rename_free(r);
    const ckpt_value *md = metadata_of(ckpt_file_root(f));
    ck_assert_str_eq(dict_key(md, 0), "");
    ck_assert_str_eq(dict_key(md, 1), "module");
    ck_assert_str_eq(dict_key(md, 2), "module.n");
}
END_TEST

START_TEST(collision_refused_and_nothing_changes)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/dp_mlp.pth")), CKPT_OK);
    ckpt_rename *r = ckpt_rename_new();
    ckpt_rename_sed(r, "s/\\.(weight|bias)$//");
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, NULL, 0, NULL), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "'module.n.1.weight' and 'module.n.1.bias' would both become 'module.n.1'");
    ckpt_rename_free(r);
    ck_assert_str_eq(dict_key(ckpt_file_root(f), 0), "module.n.1.weight");
}
END_TEST

START_TEST(empty_key_refused)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/mlp.pth")), CKPT_OK);
    ckpt_rename *r = ckpt_rename_new();
    ckpt_rename_sed(r, "s/^n\\.1\\.weight$//");
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, NULL, 0, NULL), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "would become empty");
    ckpt_rename_free(r);
}
END_TEST

/* The writers' last check: whatever made the tree (here a key edited by
 * hand, as a faulty transform would), no file names a tensor twice, and
 * nothing is written. */
START_TEST(a_name_twice_is_never_written)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/mlp.pth")), CKPT_OK);
    ckpt_value *root = (ckpt_value *)ckpt_file_root(f);
    ckpt_value *k1 = root->u.dict.keys.items[1];
    k1->u.s.s = root->u.dict.keys.items[0]->u.s.s; /* n.1.bias -> n.1.weight */
    k1->u.s.len = root->u.dict.keys.items[0]->u.s.len;
    static const char *const outs[] = {"out.pth", "out.safetensors"};
    for (size_t i = 0; i < 2; i++) {
        char out[600];
        snprintf(out, sizeof out, "%s/%s", dir, outs[i]);
        ck_assert_int_eq(ckpt_file_write(f, out, NULL), CKPT_ERR_FORMAT);
        ck_assert_msg_has(f, "two tensors would be written under the name 'n.1.weight'");
        ck_assert_int_ne(access(out, F_OK), 0);
    }
}
END_TEST

/* ckpt_file_check_globals: what a rewrite would carry that runs code */
static char kept_names[256];

static void on_kept(void *user, const char *global)
{
    (void)user;
    strncat(kept_names, global, sizeof(kept_names) - strlen(kept_names) - 2);
    strcat(kept_names, " ");
}

START_TEST(rewrite_refuses_code_running_globals)
{
    /* two objects of unknown classes, admitted by name to read the file */
    ck_assert_int_eq(ckpt_file_allow_global(f, "mymods.X"), CKPT_OK);
    ck_assert_int_eq(ckpt_file_allow_global(f, "mymods.Y"), CKPT_OK);
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/bad/two_unknown_classes.pth")), CKPT_OK);
    ck_assert_int_eq(ckpt_file_check_globals(f, CKPT_FORMAT_PTH_ZIP, 0, on_kept, NULL),
                     CKPT_ERR_UNSAFE);
    ck_assert_msg_has(f, "the global mymods.X (at 'x')");
    ck_assert_msg_has(f, "'ckpt extract' writes the weights only");
    ck_assert_int_eq(ckpt_file_check_globals(f, CKPT_FORMAT_PTH_LEGACY, 0, NULL, NULL),
                     CKPT_ERR_UNSAFE);
    /* tensors only: nothing to refuse */
    ck_assert_int_eq(ckpt_file_check_globals(f, CKPT_FORMAT_SAFETENSORS, 0, NULL, NULL), CKPT_OK);
    /* kept when named and asked for, each reported once */
    kept_names[0] = '\0';
    ck_assert_int_eq(ckpt_file_check_globals(f, CKPT_FORMAT_PTH_ZIP, 1, on_kept, NULL), CKPT_OK);
    ck_assert_str_eq(kept_names, "mymods.X mymods.Y ");
    ckpt_file_free(f);

    /* admitted by --allow-unknown only: never kept */
    f = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_set_allow_unknown(f, 1), CKPT_OK);
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/bad/two_unknown_classes.pth")), CKPT_OK);
    ck_assert_int_eq(ckpt_file_check_globals(f, CKPT_FORMAT_PTH_ZIP, 1, NULL, NULL),
                     CKPT_ERR_UNSAFE);
    ck_assert_msg_has(f, "keeps only the globals named with --allow-global");
    ckpt_file_free(f);

    /* a module tree's class is code too; extract's state dict is not */
    f = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/torch2/whole_dp.pt")), CKPT_OK);
    ck_assert_int_eq(ckpt_file_check_globals(f, 0, 1, NULL, NULL), CKPT_ERR_UNSAFE);
    ck_assert_msg_has(f, "a pickled module tree (class torch.nn.parallel.data_parallel.DataParallel");
    ck_assert_int_eq(ckpt_file_extract(f, NULL), CKPT_OK);
    ck_assert_int_eq(ckpt_file_check_globals(f, 0, 0, NULL, NULL), CKPT_OK);
    ckpt_file_free(f);

    /* known data (argparse.Namespace) is written as it was */
    f = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/train_ckpt.pth")), CKPT_OK);
    ck_assert_int_eq(ckpt_file_check_globals(f, 0, 0, NULL, NULL), CKPT_OK);
    ck_assert_int_eq(ckpt_file_check_globals(NULL, 0, 0, NULL, NULL), CKPT_ERR_USAGE);
}
END_TEST

START_TEST(select_a_nested_mapping)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/train_ckpt.pth")), CKPT_OK);
    ckpt_rename *r = ckpt_rename_new();
    ckpt_rename_strip_prefix(r, "module.");
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, "model_state_dict", 0, NULL), CKPT_OK);
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, "nope", 0, NULL), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "there is no 'nope'");
    ck_assert_int_eq(ckpt_file_rename_keys(f, r, "epoch", 0, NULL), CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "names an int, not a mapping");
    ckpt_rename_free(r);
    const ckpt_value *msd = ckpt_value_dict_get(ckpt_file_root(f), "model_state_dict");
    ck_assert_str_eq(dict_key(msd, 0), "n.1.weight");
}
END_TEST

/* The state dict a file is taken for when written alone (extract, a
 * safetensors OUT): the model's, or a refusal naming the models. */
START_TEST(pick_the_model_state_dict)
{
    static const struct {
        const char *file, *path; /* path "" : the root */
    } one[] = {{"tests/data/train_ckpt.pth", "model_state_dict"},
               {"tests/data/legacy_train.pth", "model_state_dict"},
               {"tests/data/lightning.pth", "state_dict"},
               {"tests/data/mlp.pth", ""},
               {"tests/data/torch2/whole_mlp.pt", ""}};
    for (size_t k = 0; k < sizeof(one) / sizeof(one[0]); k++) {
        ckpt_file *g = ckpt_file_new();
        size_t i = 99;
        ckpt_path at;
        char name[128];
        ck_assert_int_eq(ckpt_file_open(g, src_path(one[k].file)), CKPT_OK);
        ck_assert_int_eq(ckpt_file_pick_state_dict(g, &i), CKPT_OK);
        ck_assert_ptr_nonnull(ckpt_file_state_dict(g, i, &at));
        ckpt_path_format(&at, name, sizeof(name));
        ck_assert_msg(strcmp(name, one[k].path) == 0, "%s: took '%s', not '%s'", one[k].file, name,
                      one[k].path);
        ckpt_file_free(g);
    }
    /* two models: neither is taken; both are named, and --select */
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/train/gan.pth")), CKPT_OK);
    size_t i;
    ck_assert_int_eq(ckpt_file_pick_state_dict(f, &i), CKPT_ERR_USAGE);
    ck_assert_msg_has(f, "2 are a model's: 'generator', 'discriminator'; name one with --select");
    ck_assert_int_eq(ckpt_file_extract(f, NULL), CKPT_ERR_USAGE);
    ckpt_write_options wo = {.format = CKPT_FORMAT_SAFETENSORS};
    ck_assert_int_eq(ckpt_file_write(f, path, &wo), CKPT_ERR_USAGE);
    ck_assert_int_eq(access(path, F_OK), -1);
    wo.select = "discriminator";
    ck_assert_int_eq(ckpt_file_write(f, path, &wo), CKPT_OK);
    ck_assert_int_eq(ckpt_file_pick_state_dict(NULL, &i), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_file_pick_state_dict(f, NULL), CKPT_ERR_USAGE);
    /* one model: a safetensors write without a selection holds it */
    ckpt_file *g = ckpt_file_new(), *o = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(g, src_path("tests/data/train_ckpt.pth")), CKPT_OK);
    wo.select = NULL;
    ck_assert_int_eq(ckpt_file_write(g, path, &wo), CKPT_OK);
    ck_assert_int_eq(ckpt_file_open(o, path), CKPT_OK);
    ck_assert_uint_eq(ckpt_file_tensor_count(o), 4);
    ck_assert_str_eq(dict_key(ckpt_file_root(o), 0), "module.n.1.weight");
    ckpt_file_free(o);
    ckpt_file_free(g);
}
END_TEST

START_TEST(remap_rules)
{
    ck_assert(ckpt_device_valid("cpu") && ckpt_device_valid("cuda:12") && ckpt_device_valid("cuda"));
    ck_assert(!ckpt_device_valid("cuda:") && !ckpt_device_valid("cuda:x") && !ckpt_device_valid(""));
    ck_assert(!ckpt_device_valid("CPU") && !ckpt_device_valid("cuda:01"));
    ck_assert(ckpt_device_known("mps") && !ckpt_device_known("foo:1"));
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/ae_model_parallel.pth")), CKPT_OK);
    const char *from[] = {"cuda:1", "cuda"}, *to[] = {"cpu", "cuda:3"};
    ck_assert_int_eq(ckpt_file_remap_devices(f, from, to, 2, 0, NULL), CKPT_OK);
    size_t cpu = 0, c3 = 0;
    for (size_t i = 0; i < ckpt_file_storage_count(f); i++) {
        const char *d = ckpt_storage_device(ckpt_file_storage(f, i));
        cpu += strcmp(d, "cpu") == 0;
        c3 += strcmp(d, "cuda:3") == 0;
    }
    ck_assert_uint_gt(cpu, 0);
    ck_assert_uint_gt(c3, 0);
    ck_assert_uint_eq(cpu + c3, ckpt_file_storage_count(f));
}
END_TEST

START_TEST(write_refuses_input_and_stdout)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/mlp.pth")), CKPT_OK);
    ck_assert_int_eq(ckpt_file_write(f, "-", NULL), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_file_write(f, src_path("tests/data/mlp.pth"), NULL), CKPT_ERR_USAGE);
    ck_assert_msg_has(f, "--in-place");
}
END_TEST

START_TEST(legacy_written_as_zip_with_renumbered_storages)
{
    ck_assert_int_eq(ckpt_file_open(f, src_path("tests/data/legacy_mlp.pth")), CKPT_OK);
    ck_assert_int_eq(ckpt_file_write(f, path, NULL), CKPT_OK);
    ckpt_file *g = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(g, path), CKPT_OK);
    ck_assert_int_eq(ckpt_file_format(g), CKPT_FORMAT_PTH_ZIP);
    ck_assert_str_eq(ckpt_file_prefix(g), "out");
    ck_assert_str_eq(ckpt_storage_key(ckpt_file_storage(g, 0)), "0");
    ck_assert(same_value(ckpt_file_root(f), ckpt_file_root(g), 0));
    ckpt_file_free(g);
}
END_TEST

typedef struct progress_seen {
    int calls;
    uint64_t done, total;
} progress_seen;

static void on_progress(void *user, uint64_t done, uint64_t total)
{
    progress_seen *s = user;
    ck_assert_uint_ge(done, s->done); /* never goes back */
    s->calls++;
    s->done = done;
    s->total = total;
}

/* Every one-file format says how far it is, up to all of it. */
START_TEST(every_format_reports_progress_to_the_end)
{
    static const ckpt_format formats[] = {CKPT_FORMAT_PTH_ZIP, CKPT_FORMAT_PTH_LEGACY,
                                          CKPT_FORMAT_SAFETENSORS};
    for (size_t k = 0; k < sizeof formats / sizeof *formats; k++) {
        ckpt_file *g = ckpt_file_new();
        ck_assert_int_eq(ckpt_file_open(g, src_path("tests/data/mlp.pth")), CKPT_OK);
        progress_seen seen = {0};
        ckpt_write_options opt = {.format = formats[k], .progress = on_progress, .user = &seen};
        ck_assert_int_eq(ckpt_file_write(g, path, &opt), CKPT_OK);
        ck_assert_msg(seen.calls > 0, "%s: no progress", ckpt_format_name(formats[k]));
        ck_assert_uint_gt(seen.total, 0);
        ck_assert_uint_eq(seen.done, seen.total);
        ckpt_file_free(g);
    }
}
END_TEST

/* Write dispatch: OUT's name picks the format when none is asked for. */
START_TEST(output_format_from_the_name)
{
    ck_assert_int_eq(ckpt_format_for_path("model.safetensors"), CKPT_FORMAT_SAFETENSORS);
    ck_assert_int_eq(ckpt_format_for_path("model.safetensors.index.json"), CKPT_FORMAT_SHARDED);
    ck_assert_int_eq(ckpt_format_for_path("pytorch_model.bin.index.json"), CKPT_FORMAT_SHARDED);
    ck_assert_int_eq(ckpt_format_for_path("model.pth"), CKPT_FORMAT_PTH_ZIP);
    ck_assert_int_eq(ckpt_format_for_path("model.bin"), CKPT_FORMAT_PTH_ZIP);
    ck_assert_int_eq(ckpt_format_for_path(".safetensors"), CKPT_FORMAT_PTH_ZIP); /* no name */
}
END_TEST

/* safetensors' sub-byte dtypes: F4 shapes count 4-bit values (torch's
 * float4_e2m1fn_x2 bytes: the last dimension halved), F6 6-bit ones (no
 * torch dtype: safetensors out only); both must end on a byte boundary. */
START_TEST(safetensors_sub_byte_dtypes)
{
    ck_assert_uint_eq(ckpt_dtype_bits(CKPT_DTYPE_FLOAT6_E2M3FN), 6);
    ck_assert_uint_eq(ckpt_dtype_size(CKPT_DTYPE_FLOAT6_E3M2FN), 0);
    ck_assert_uint_eq(ckpt_dtype_bits(CKPT_DTYPE_FLOAT4_E2M1FN_X2), 8);
    ck_assert_int_eq(ckpt_dtype_from_name("float6_e3m2fn"), CKPT_DTYPE_FLOAT6_E3M2FN);
    uint64_t nb = 0;
    ck_assert_int_eq(ckpt_dtype_nbytes(CKPT_DTYPE_FLOAT6_E2M3FN, 4, &nb), 0);
    ck_assert_uint_eq(nb, 3);
    ck_assert_int_eq(ckpt_dtype_nbytes(CKPT_DTYPE_FLOAT6_E2M3FN, 3, &nb), 1);
    ck_assert_int_eq(ckpt_dtype_nbytes(CKPT_DTYPE_FLOAT6_E2M3FN, UINT64_MAX / 4, &nb), -1);
    ck_assert_int_eq(ckpt_dtype_nbytes(CKPT_DTYPE_INT64, UINT64_MAX / 8, &nb), 0);

    const char *hdr = "{\"e\":{\"dtype\":\"F8_E8M0\",\"shape\":[3],\"data_offsets\":[0,3]},"
                      "\"f\":{\"dtype\":\"F4\",\"shape\":[2,4],\"data_offsets\":[3,7]},"
                      "\"g\":{\"dtype\":\"F6_E2M3\",\"shape\":[4,1],\"data_offsets\":[7,10]}}";
    char in[600];
    snprintf(in, sizeof(in), "%s/in.safetensors", dir);
    pk_le(&p, strlen(hdr), 8);
    pk_text(&p, hdr);
    for (int i = 0; i < 10; i++)
        pk_op(&p, 0x11 * i);
    FILE *fp = fopen(in, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(p.buf, 1, p.n, fp), p.n);
    fclose(fp);
    ck_assert_int_eq(ckpt_file_open(f, in), CKPT_OK);
    ck_assert_uint_eq(ckpt_file_tensor_count(f), 3);
    static const ckpt_dtype want[] = {CKPT_DTYPE_FLOAT8_E8M0FNU, CKPT_DTYPE_FLOAT4_E2M1FN_X2,
                                      CKPT_DTYPE_FLOAT6_E2M3FN};
    static const int64_t last[] = {3, 2, 1}, bytes[] = {3, 4, 3};
    for (size_t i = 0; i < 3; i++) {
        const ckpt_tensor *t = ckpt_file_tensor(f, i, NULL);
        ck_assert_int_eq(ckpt_tensor_dtype(t), want[i]);
        ck_assert_int_eq(ckpt_tensor_shape(t)[ckpt_tensor_ndim(t) - 1], last[i]);
        ck_assert_uint_eq(ckpt_tensor_nbytes(t), (size_t)bytes[i]);
        uint8_t buf[4];
        ck_assert_int_eq(ckpt_tensor_read(f, t, buf, sizeof(buf)), CKPT_OK);
        ck_assert_uint_eq(buf[0], 0x11 * (i == 0 ? 0 : i == 1 ? 3 : 7));
    }
    /* safetensors out: F4's shape counted in values again, bytes as they were */
    char out[600];
    snprintf(out, sizeof(out), "%s/out.safetensors", dir);
    ckpt_write_options opt = {.format = CKPT_FORMAT_SAFETENSORS};
    ck_assert_int_eq(ckpt_file_write(f, out, &opt), CKPT_OK);
    ckpt_file *g = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(g, out), CKPT_OK);
    ckpt_compare_result r;
    for (size_t i = 0; i < 3; i++) {
        const ckpt_tensor *a = ckpt_file_tensor(f, i, NULL), *b = ckpt_file_tensor(g, i, NULL);
        ck_assert_int_eq(ckpt_tensor_dtype(a), ckpt_tensor_dtype(b));
        ck_assert_int_eq(ckpt_tensor_compare(f, a, g, b, 0, 0, &r), CKPT_OK);
        ck_assert_int_eq(r.mismatched, 0);
    }
    ckpt_file_free(g);
    unlink(out);
    /* a torch file cannot name float6: refused, nothing written */
    ck_assert_int_eq(ckpt_file_write(f, path, NULL), CKPT_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(ckpt_file_error_message(f), "float6_e2m3fn"));
    ck_assert_int_ne(access(path, F_OK), 0);
    unlink(in);
}
END_TEST

/* safetensors out: the data section on a 64-byte boundary, every tensor at
 * a multiple of its element size, and the data ordered for aligned starts
 * (ckpt-convert(1)): first the multiple of 64 (a), then the smallest groups
 * whose sizes sum to 64 (d+g: 44+20; b+c: 60+4), each led by its largest,
 * then the rest (f, e, h: the int64 first, so that each stays at a multiple
 * of its element size).  The header keeps the input's order. */
START_TEST(safetensors_data_aligned_and_ordered)
{
    static const struct {
        const char *name, *dtype;
        unsigned bytes, es;
    } t[] = {{"h", "U8", 3, 1},   {"b", "F32", 60, 4}, {"d", "F32", 44, 4},
             {"a", "F32", 128, 4}, {"c", "F32", 4, 4},  {"e", "F16", 12, 2},
             {"f", "I64", 8, 8},  {"g", "F32", 20, 4}};
    enum { N = sizeof(t) / sizeof(t[0]) };
    char hdr[2000] = "{", in[600], out[600];
    unsigned at = 0;
    for (size_t i = 0; i < N; i++) {
        snprintf(hdr + strlen(hdr), sizeof(hdr) - strlen(hdr),
                 "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%u],\"data_offsets\":[%u,%u]}",
                 i ? "," : "", t[i].name, t[i].dtype, t[i].bytes / t[i].es, at, at + t[i].bytes);
        at += t[i].bytes;
    }
    strcat(hdr, "}");
    snprintf(in, sizeof(in), "%s/in.safetensors", dir);
    snprintf(out, sizeof(out), "%s/out.safetensors", dir);
    pk_le(&p, strlen(hdr), 8);
    pk_text(&p, hdr);
    for (unsigned i = 0; i < at; i++)
        pk_op(&p, (int)(i * 7 % 251));
    FILE *fp = fopen(in, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(p.buf, 1, p.n, fp), p.n);
    fclose(fp);
    ck_assert_int_eq(ckpt_file_open(f, in), CKPT_OK);
    ckpt_write_options opt = {.format = CKPT_FORMAT_SAFETENSORS};
    ck_assert_int_eq(ckpt_file_write(f, out, &opt), CKPT_OK);

    uint8_t len8[8];
    int fd = open(out, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, len8, 8, 0), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len8[i];
    ck_assert_uint_eq(n % 8, 0);
    ck_assert_uint_eq((8 + n) % 64, 0);
    char *text = calloc(1, n + 1);
    ck_assert_int_eq(pread(fd, text, n, 8), (ssize_t)n);
    close(fd);
    /* each entry's offsets, in the header's order (the input's) */
    unsigned begin[N], aligned = 0;
    const char *q = text;
    for (size_t i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof(key), "\"%s\":", t[i].name);
        const char *k = strstr(text, key);
        ck_assert_ptr_nonnull(k);
        ck_assert(k >= q); /* in the input's order */
        q = k;
        unsigned b, e;
        ck_assert_int_eq(sscanf(strstr(k, "\"data_offsets\":["), "\"data_offsets\":[%u,%u]",
                                &b, &e), 2);
        ck_assert_uint_eq(e - b, t[i].bytes);
        ck_assert_uint_eq(b % t[i].es, 0);
        begin[i] = b;
        aligned += b % 64 == 0;
    }
    free(text);
    /* a; d (then g); b (then c); f (then e, h): 4 of 8, as many as any
     * order gives (three residues 8, 12, 3 have no sub-sum of 64) */
    ck_assert_uint_eq(aligned, 4);
    ck_assert_uint_eq(begin[3], 0);   /* a */
    ck_assert_uint_eq(begin[2], 128); /* d */
    ck_assert_uint_eq(begin[7], 172); /* g */
    ck_assert_uint_eq(begin[1], 192); /* b */
    ck_assert_uint_eq(begin[4], 252); /* c */
    ck_assert_uint_eq(begin[6], 256); /* f */
    ck_assert_uint_eq(begin[5], 264); /* e */
    ck_assert_uint_eq(begin[0], 276); /* h */
    /* the values, under their names */
    ckpt_file *g = ckpt_file_new();
    ck_assert_int_eq(ckpt_file_open(g, out), CKPT_OK);
    ckpt_compare_result r;
    for (size_t i = 0; i < N; i++) {
        const ckpt_tensor *a = ckpt_file_tensor(f, i, NULL), *b = ckpt_file_tensor(g, i, NULL);
        ck_assert_int_eq(ckpt_tensor_compare(f, a, g, b, 0, 0, &r), CKPT_OK);
        ck_assert_int_eq(r.mismatched, 0);
    }
    ckpt_file_free(g);
    unlink(out);
    unlink(in);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("write");
    TCase *t = tcase_create("pickle");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, pickle_round_trip_of_every_kind);
    tcase_add_test(t, pickle_shared_objects_stay_shared);
    tcase_add_test(t, pickle_cycle_through_a_list);
    tcase_add_test(t, pickle_batches_of_a_thousand);
    suite_add_tcase(s, t);

    TCase *z = tcase_create("zip");
    tcase_add_checked_fixture(z, setup, teardown);
    tcase_set_timeout(z, 120);
    tcase_add_test(z, zip_records_aligned_to_64);
    tcase_add_test(z, crc32_equals_zlib_at_any_length_and_alignment);
    tcase_add_test(z, zip64_sizes_and_offsets);
    suite_add_tcase(s, z);

    TCase *e = tcase_create("edits");
    tcase_add_checked_fixture(e, setup, teardown);
    tcase_add_test(e, rules_strip_add_unwrap);
    tcase_add_test(e, rules_sed);
    tcase_add_test(e, strip_rewrites_keys_and_metadata);
    tcase_add_test(e, add_puts_a_new_root_entry_first);
    tcase_add_test(e, collision_refused_and_nothing_changes);
    tcase_add_test(e, empty_key_refused);
    tcase_add_test(e, a_name_twice_is_never_written);
    tcase_add_test(e, select_a_nested_mapping);
    tcase_add_test(e, pick_the_model_state_dict);
    tcase_add_test(e, rewrite_refuses_code_running_globals);
    tcase_add_test(e, remap_rules);
    tcase_add_test(e, write_refuses_input_and_stdout);
    tcase_add_test(e, legacy_written_as_zip_with_renumbered_storages);
    tcase_add_test(e, every_format_reports_progress_to_the_end);
    tcase_add_test(e, output_format_from_the_name);
    tcase_add_test(e, safetensors_sub_byte_dtypes);
    tcase_add_test(e, safetensors_data_aligned_and_ordered);
    suite_add_tcase(s, e);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
