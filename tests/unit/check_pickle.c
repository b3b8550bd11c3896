/* check_pickle.c - the safe pickle VM: each opcode builds the value Python
 * would, and each malformed or hostile stream is an error, never a crash. */
#include "unit.h"
#include "analysis/analysis.h" /* the weights-only model */

#include <math.h>

static ckpt_file *f;
static pk p;
static ckpt_value *v;

static void setup(void)
{
    f = ckpt_file_new();
    ck_assert_ptr_nonnull(f);
    memset(&p, 0, sizeof(p));
    v = NULL;
}

static void teardown(void)
{
    ckpt_file_free(f);
    pk_free(&p);
}

static void load_ok(void)
{
    int rc = pk_load(f, &p, &v);
    ck_assert_msg(rc == CKPT_OK, "load failed: %s", ckpt_file_error_message(f));
    ck_assert_ptr_nonnull(v);
}

static void load_fails(int code, const char *needle)
{
    int rc = pk_load(f, &p, &v);
    ck_assert_msg(rc == code, "expected status %d, got %d (%s)", code, rc,
                  ckpt_file_error_message(f));
    ck_assert_msg_has(f, needle);
}

static int64_t int_of(const ckpt_value *x)
{
    int64_t i = 0;
    ck_assert_int_eq(ckpt_value_int(x, &i), CKPT_OK);
    return i;
}

/* ---- scalars ---- */

START_TEST(binint_family)
{
    pk_proto2(&p);
    pk_op(&p, '(');
    pk_int(&p, 7);      /* BININT1 */
    pk_int(&p, 300);    /* BININT2 */
    pk_int(&p, -5);     /* BININT, negative */
    pk_int(&p, 100000); /* BININT */
    pk_op(&p, 'l');
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_LIST);
    ck_assert_int_eq(ckpt_value_len(v), 4);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 0)), 7);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 1)), 300);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 2)), -5);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 3)), 100000);
}
END_TEST

START_TEST(long1_and_long4)
{
    pk_proto2(&p);
    pk_op(&p, '(');
    pk_op(&p, 0x8a); /* LONG1 2**31 */
    pk_le(&p, 5, 1);
    pk_le(&p, 0x0080000000ull, 5);
    pk_op(&p, 0x8a); /* LONG1 -1 */
    pk_le(&p, 1, 1);
    pk_op(&p, 0xff);
    pk_op(&p, 0x8a); /* LONG1 0 */
    pk_le(&p, 0, 1);
    pk_op(&p, 0x8b); /* LONG4 2**64: 9 bytes, does not fit */
    pk_le(&p, 9, 4);
    pk_le(&p, 0, 8);
    pk_op(&p, 1);
    pk_op(&p, 't');
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(int_of(ckpt_value_item(v, 0)), 2147483648ll);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 1)), -1);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 2)), 0);
    int64_t big;
    ck_assert_int_eq(ckpt_value_int(ckpt_value_item(v, 3), &big), CKPT_ERR_LIMIT);
    size_t n;
    const uint8_t *b = ckpt_value_bigint(ckpt_value_item(v, 3), &n);
    ck_assert_uint_eq(n, 9);
    ck_assert_uint_eq(b[8], 1);
}
END_TEST

START_TEST(protocol0_text_scalars)
{
    /* INT, LONG, FLOAT, STRING, UNICODE, and INT's 00/01 booleans */
    pk_text(&p, "(I42\nI-7\nI01\nI00\nL123456789012345678901234567890L\nF2.5\n"
                "S'a\\nb\\x41'\nVcaf\\u00e9\nl.");
    load_ok();
    ck_assert_int_eq(ckpt_value_len(v), 8);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 0)), 42);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 1)), -7);
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 2)), CKPT_KIND_BOOL);
    ck_assert_int_eq(ckpt_value_bool(ckpt_value_item(v, 2)), 1);
    ck_assert_int_eq(ckpt_value_bool(ckpt_value_item(v, 3)), 0);
    int64_t x;
    ck_assert_int_eq(ckpt_value_int(ckpt_value_item(v, 4), &x), CKPT_ERR_LIMIT);
    ck_assert_double_eq(ckpt_value_float(ckpt_value_item(v, 5)), 2.5);
    ck_assert_str_eq(ckpt_value_str(ckpt_value_item(v, 6), NULL), "a\nbA");
    ck_assert_str_eq(ckpt_value_str(ckpt_value_item(v, 7), NULL), "caf\xc3\xa9");
}
END_TEST

START_TEST(negative_decimal_long)
{
    pk_text(&p, "L-340282366920938463463374607431768211456L\n.");
    load_ok();
    size_t n;
    const uint8_t *b = ckpt_value_bigint(v, &n);
    /* -2**128: 16 zero bytes then 0xff */
    ck_assert_uint_ge(n, 17);
    for (size_t i = 0; i < 16; i++)
        ck_assert_uint_eq(b[i], 0);
    ck_assert_uint_eq(b[16], 0xff);
}
END_TEST

START_TEST(binfloat_none_bools)
{
    pk_proto2(&p);
    pk_op(&p, 'G'); /* 1.5 big-endian */
    uint8_t be[8] = {0x3f, 0xf8, 0, 0, 0, 0, 0, 0};
    pk_bytes(&p, be, 8);
    pk_op(&p, 'N');
    pk_op(&p, 0x88);
    pk_op(&p, 0x89);
    pk_op(&p, 0x87); /* TUPLE3 */
    pk_op(&p, 0x86); /* TUPLE2: (1.5, (None, True, False)) */
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_TUPLE);
    ck_assert_double_eq(ckpt_value_float(ckpt_value_item(v, 0)), 1.5);
    const ckpt_value *t = ckpt_value_item(v, 1);
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(t, 0)), CKPT_KIND_NONE);
    ck_assert_int_eq(ckpt_value_bool(ckpt_value_item(t, 1)), 1);
    ck_assert_int_eq(ckpt_value_bool(ckpt_value_item(t, 2)), 0);
}
END_TEST

START_TEST(strings_and_bytes)
{
    pk_op(&p, 0x80);
    pk_op(&p, 4);
    pk_op(&p, 0x95); /* FRAME */
    pk_le(&p, 40, 8);
    pk_op(&p, '(');
    pk_op(&p, 0x8c); /* SHORT_BINUNICODE */
    pk_le(&p, 2, 1);
    pk_text(&p, "hi");
    pk_op(&p, 0x8d); /* BINUNICODE8 */
    pk_le(&p, 1, 8);
    pk_text(&p, "x");
    pk_op(&p, 'U'); /* SHORT_BINSTRING */
    pk_le(&p, 3, 1);
    pk_text(&p, "abc");
    pk_op(&p, 'C'); /* SHORT_BINBYTES */
    pk_le(&p, 2, 1);
    pk_bytes(&p, "\0\1", 2);
    pk_op(&p, 'B'); /* BINBYTES */
    pk_le(&p, 1, 4);
    pk_text(&p, "z");
    pk_op(&p, 0x96); /* BYTEARRAY8 */
    pk_le(&p, 1, 8);
    pk_text(&p, "q");
    pk_op(&p, 'l');
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_len(v), 6);
    ck_assert_str_eq(ckpt_value_str(ckpt_value_item(v, 0), NULL), "hi");
    ck_assert_str_eq(ckpt_value_str(ckpt_value_item(v, 1), NULL), "x");
    ck_assert_str_eq(ckpt_value_str(ckpt_value_item(v, 2), NULL), "abc");
    size_t n;
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 3)), CKPT_KIND_BYTES);
    ck_assert_ptr_nonnull(ckpt_value_str(ckpt_value_item(v, 3), &n));
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(ckpt_value_kind_name(ckpt_value_item(v, 5)), "bytearray");
}
END_TEST

START_TEST(protocol2_3_4_counted_opcodes)
{
    /* BINSTRING, BINBYTES8, DUP, LONG_BINPUT then BINGET of it, POP */
    pk_op(&p, 0x80);
    pk_op(&p, 4);
    pk_op(&p, '(');
    pk_op(&p, 'T'); /* BINSTRING */
    pk_le(&p, 2, 4);
    pk_text(&p, "py");
    pk_op(&p, 0x8e); /* BINBYTES8 */
    pk_le(&p, 3, 8);
    pk_bytes(&p, "\x01\x02\x03", 3);
    pk_op(&p, '2'); /* DUP */
    pk_op(&p, 'r'); /* LONG_BINPUT 70000 */
    pk_le(&p, 70000, 4);
    pk_op(&p, 'N');
    pk_op(&p, '0'); /* POP the None */
    pk_op(&p, 'j');
    pk_le(&p, 70000, 4);
    pk_op(&p, 't');
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_len(v), 4);
    ck_assert_str_eq(ckpt_value_str(ckpt_value_item(v, 0), NULL), "py");
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 1)), CKPT_KIND_BYTES);
    ck_assert_ptr_eq(ckpt_value_item(v, 1), ckpt_value_item(v, 2));
    ck_assert_ptr_eq(ckpt_value_item(v, 1), ckpt_value_item(v, 3));
}
END_TEST

/* ---- containers ---- */

START_TEST(dict_setitems_and_memo)
{
    /* {'a': 1, 'b': [1, 1]} with the int memoized and fetched back */
    pk_proto2(&p);
    pk_op(&p, '}');
    pk_op(&p, 'q');
    pk_le(&p, 0, 1);
    pk_op(&p, '(');
    pk_str(&p, "a");
    pk_int(&p, 1);
    pk_op(&p, 'q');
    pk_le(&p, 1, 1); /* BINPUT 1 */
    pk_str(&p, "b");
    pk_op(&p, ']');
    pk_op(&p, 'h');
    pk_le(&p, 1, 1); /* BINGET 1 */
    pk_op(&p, 'a');  /* APPEND */
    pk_op(&p, '(');
    pk_op(&p, 'j');
    pk_le(&p, 1, 4); /* LONG_BINGET 1 */
    pk_op(&p, 'e');  /* APPENDS */
    pk_op(&p, 'u');  /* SETITEMS */
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_DICT);
    ck_assert_int_eq(ckpt_value_len(v), 2);
    ck_assert_int_eq(int_of(ckpt_value_dict_get(v, "a")), 1);
    const ckpt_value *b = ckpt_value_dict_get(v, "b");
    ck_assert_int_eq(ckpt_value_len(b), 2);
    ck_assert_ptr_eq(ckpt_value_item(b, 0), ckpt_value_dict_get(v, "a"));
}
END_TEST

START_TEST(pop_mark_discards_the_mark)
{
    /* dict 'k' DUP, then MARK 9 POP_MARK (drops 9 and its MARK), 3 POP:
     * the LIST that follows has no MARK left: an error, not a crash */
    pk_text(&p, "(dp0\nS'k'\np1\nI1\nsg1\n2(I9\n1I3\n0l.");
    load_fails(CKPT_ERR_FORMAT, "MARK");
}
END_TEST

START_TEST(text_put_get)
{
    /* protocol 0: MARK DICT PUT, STRING PUT, INT, SETITEM, GET of the dict */
    pk_text(&p, "(dp0\nS'k'\np1\nI1\nsg0\n.");
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_DICT);
    ck_assert_int_eq(int_of(ckpt_value_dict_get(v, "k")), 1);
}
END_TEST

START_TEST(sets_and_frozensets)
{
    pk_op(&p, 0x80);
    pk_op(&p, 4);
    pk_op(&p, 0x8f); /* EMPTY_SET */
    pk_op(&p, 0x94); /* MEMOIZE */
    pk_op(&p, '(');
    pk_int(&p, 1);
    pk_int(&p, 2);
    pk_op(&p, 0x90); /* ADDITEMS */
    pk_op(&p, '(');
    pk_int(&p, 3);
    pk_op(&p, 0x91); /* FROZENSET */
    pk_op(&p, 0x86);
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 0)), CKPT_KIND_SET);
    ck_assert_int_eq(ckpt_value_len(ckpt_value_item(v, 0)), 2);
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 1)), CKPT_KIND_FROZENSET);
}
END_TEST

START_TEST(ordered_dict_with_metadata)
{
    /* what torch.save writes for a state dict without tensors */
    pk_proto2(&p);
    pk_global(&p, "collections", "OrderedDict");
    pk_op(&p, 'q');
    pk_le(&p, 0, 1);
    pk_op(&p, ')');
    pk_op(&p, 'R');
    pk_str(&p, "x");
    pk_int(&p, 1);
    pk_op(&p, 's');
    pk_op(&p, '}');
    pk_str(&p, "_metadata");
    pk_op(&p, 'h');
    pk_le(&p, 0, 1);
    pk_op(&p, ')');
    pk_op(&p, 'R');
    pk_str(&p, "");
    pk_op(&p, '}');
    pk_str(&p, "version");
    pk_int(&p, 1);
    pk_op(&p, 's');
    pk_op(&p, 's');
    pk_op(&p, 's');
    pk_op(&p, 'b'); /* BUILD */
    pk_op(&p, '.');
    load_ok();
    ck_assert(ckpt_value_dict_ordered(v));
    const ckpt_value *st = ckpt_value_state(v);
    ck_assert_ptr_nonnull(st);
    const ckpt_value *md = ckpt_value_dict_get(st, "_metadata");
    ck_assert(ckpt_value_dict_ordered(md));
    ck_assert_int_eq(int_of(ckpt_value_dict_get(ckpt_value_dict_get(md, ""), "version")), 1);
}
END_TEST

START_TEST(stack_global_and_known_data)
{
    /* argparse.Namespace via STACK_GLOBAL + NEWOBJ + BUILD: kept opaque */
    pk_op(&p, 0x80);
    pk_op(&p, 4);
    pk_op(&p, 0x8c);
    pk_le(&p, 8, 1);
    pk_text(&p, "argparse");
    pk_op(&p, 0x8c);
    pk_le(&p, 9, 1);
    pk_text(&p, "Namespace");
    pk_op(&p, 0x93); /* STACK_GLOBAL */
    pk_op(&p, ')');
    pk_op(&p, 0x81); /* NEWOBJ */
    pk_op(&p, '}');
    pk_str(&p, "lr");
    pk_int(&p, 1);
    pk_op(&p, 's');
    pk_op(&p, 'b');
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_OBJECT);
    ck_assert_str_eq(ckpt_value_global(v), "argparse.Namespace");
    ck_assert_ptr_nonnull(ckpt_value_dict_get(ckpt_value_state(v), "lr"));
}
END_TEST

START_TEST(py2_builtin_names_and_inst_obj)
{
    /* __builtin__.set maps to builtins.set; INST and OBJ become opaque objects */
    pk_text(&p, "(c__builtin__\nset\n((lp0\nI1\naI2\natRp1\n(iargparse\nNamespace\np2\n"
                "(cargparse\nNamespace\noc__builtin__\ncomplex\n(F1.0\nF2.0\ntRt.");
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_TUPLE);
    ck_assert_int_eq(ckpt_value_len(v), 4);
    /* set([1, 2]) as protocol 2 spells it is the set itself */
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 0)), CKPT_KIND_SET);
    ck_assert_int_eq(ckpt_value_len(ckpt_value_item(v, 0)), 2);
    ck_assert_str_eq(ckpt_value_global(ckpt_value_item(v, 1)), "argparse.Namespace");
    ck_assert_str_eq(ckpt_value_global(ckpt_value_item(v, 2)), "argparse.Namespace");
    ck_assert_str_eq(ckpt_value_global(ckpt_value_item(v, 3)), "builtins.complex");
}
END_TEST

START_TEST(py2_names_mapped_below_protocol_3)
{
    /* _compat_pickle's NAME_MAPPING: what Python 3's protocol-2 pickler writes
     * for range, int, str, zip and a Python 2 exception */
    pk_proto2(&p);
    pk_op(&p, '(');
    pk_global(&p, "__builtin__", "xrange");
    pk_global(&p, "__builtin__", "long");
    pk_global(&p, "__builtin__", "unicode");
    pk_global(&p, "__builtin__", "basestring");
    pk_global(&p, "itertools", "izip_longest");
    pk_global(&p, "exceptions", "StandardError");
    pk_global(&p, "UserDict", "IterableUserDict");
    pk_global(&p, "__builtin__", "Ellipsis");
    pk_op(&p, 't');
    pk_op(&p, '.');
    ckpt_file_set_allow_unknown(f, 1);
    load_ok();
    static const char *const want[] = {
        "builtins.range", "builtins.int", "builtins.str", "builtins.str",
        "itertools.zip_longest", "builtins.Exception", "collections.UserDict",
        "builtins.Ellipsis"};
    ck_assert_int_eq(ckpt_value_len(v), 8);
    for (size_t i = 0; i < 8; i++)
        ck_assert_str_eq(ckpt_value_global(ckpt_value_item(v, i)), want[i]);
}
END_TEST

START_TEST(py2_names_kept_from_protocol_3)
{
    /* protocol 3+: no fix_imports, a Python 2 name is what it says */
    pk_op(&p, 0x80);
    pk_op(&p, 3);
    pk_global(&p, "__builtin__", "xrange");
    pk_op(&p, '.');
    load_fails(CKPT_ERR_UNSAFE, "'__builtin__.xrange'");
}
END_TEST

START_TEST(py2_names_dangerous_after_mapping)
{
    /* __builtin__.reduce is functools.reduce, __builtin__.getattr is
     * builtins.getattr: never admitted */
    pk_proto2(&p);
    pk_global(&p, "__builtin__", "reduce");
    pk_op(&p, '.');
    ckpt_file_set_allow_unknown(f, 1);
    load_fails(CKPT_ERR_UNSAFE, "'functools.reduce': it can run commands");
}
END_TEST

START_TEST(py2_name_tables)
{
    const char *m, *n;
    ck_assert(ckpt_globals_py3_name("__builtin__", "xrange", &m, &n));
    ck_assert_str_eq(m, "builtins");
    ck_assert_str_eq(n, "range");
    ck_assert(ckpt_globals_py3_name("__builtin__", "getattr", &m, &n));
    ck_assert_str_eq(m, "builtins");
    ck_assert_str_eq(n, "getattr");
    ck_assert(ckpt_globals_py3_name("cPickle", "loads", &m, &n));
    ck_assert_str_eq(m, "pickle");
    ck_assert(!ckpt_globals_py3_name("torch._utils", "_rebuild_tensor_v2", &m, &n));
    /* the writer's spelling reads back as itself */
    ck_assert(ckpt_globals_py2_name("builtins", "range", &m, &n));
    ck_assert_str_eq(m, "__builtin__");
    ck_assert_str_eq(n, "xrange");
    ck_assert(ckpt_globals_py2_name("builtins", "int", &m, &n));
    ck_assert_str_eq(n, "long");
    ck_assert(ckpt_globals_py2_name("builtins", "set", &m, &n));
    ck_assert_str_eq(m, "__builtin__");
    ck_assert_str_eq(n, "set");
    /* Python writes exceptions.OSError for this one; that reads back as OSError */
    ck_assert(ckpt_globals_py2_name("builtins", "FileNotFoundError", &m, &n));
    ck_assert_str_eq(m, "builtins");
    ck_assert_str_eq(n, "FileNotFoundError");
    ck_assert(ckpt_globals_py2_name("dbm", "whichdb", &m, &n));
    ck_assert_str_eq(m, "whichdb");
    ck_assert(ckpt_globals_py2_name("collections", "OrderedDict", &m, &n));
    ck_assert_str_eq(m, "collections");
    /* classes: plain data known, code refused */
    ck_assert_int_eq(ckpt_globals_builtin_class("builtins.range"), CKPT_GLOBAL_KNOWN_DATA);
    ck_assert_int_eq(ckpt_globals_builtin_class("builtins.int"), CKPT_GLOBAL_KNOWN_DATA);
    ck_assert_int_eq(ckpt_globals_builtin_class("builtins.str"), CKPT_GLOBAL_KNOWN_DATA);
    ck_assert(ckpt_globals_dangerous("builtins.getattr"));
    ck_assert(ckpt_globals_dangerous("builtins.eval"));
    ck_assert(ckpt_globals_dangerous("functools.reduce"));
    ck_assert(ckpt_globals_dangerous("sys.intern"));
}
END_TEST

START_TEST(newobj_ex_defaultdict)
{
    pk_op(&p, 0x80);
    pk_op(&p, 4);
    pk_global(&p, "collections", "defaultdict");
    pk_global(&p, "builtins", "list");
    pk_op(&p, 0x85);
    pk_op(&p, '}');
    pk_op(&p, 0x92); /* NEWOBJ_EX */
    pk_str(&p, "k");
    pk_op(&p, ']');
    pk_op(&p, 's'); /* SETITEM on a dict subclass object */
    pk_op(&p, '.');
    load_ok();
    ck_assert_str_eq(ckpt_value_global(v), "collections.defaultdict");
}
END_TEST

/* ---- tensors ---- */

START_TEST(tensor_v2_and_parameter)
{
    int64_t shape[2] = {2, 3}, stride[2] = {3, 1};
    pk_proto2(&p);
    pk_global(&p, "torch._utils", "_rebuild_parameter");
    pk_op(&p, '(');
    pk_tensor(&p, "FloatStorage", "0", "cuda:1", 6, 0, 2, shape, stride);
    pk_op(&p, 0x88);
    pk_global(&p, "collections", "OrderedDict");
    pk_op(&p, ')');
    pk_op(&p, 'R');
    pk_op(&p, 't');
    pk_op(&p, 'R');
    pk_op(&p, '.');
    load_ok();
    const ckpt_tensor *t = ckpt_value_tensor(v);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(ckpt_tensor_dtype(t), CKPT_DTYPE_FLOAT32);
    ck_assert_int_eq(ckpt_tensor_ndim(t), 2);
    ck_assert_int_eq(ckpt_tensor_shape(t)[1], 3);
    ck_assert_int_eq(ckpt_tensor_numel(t), 6);
    ck_assert(ckpt_tensor_is_parameter(t));
    ck_assert(ckpt_tensor_requires_grad(t));
    ck_assert_str_eq(ckpt_storage_device(ckpt_tensor_storage(t)), "cuda:1");
    ck_assert_uint_eq(ckpt_storage_nbytes(ckpt_tensor_storage(t)), 24);
}
END_TEST

START_TEST(tensor_sharing_a_storage)
{
    int64_t s1[1] = {4}, st1[1] = {1}, s2[1] = {2}, st2[1] = {2};
    pk_proto2(&p);
    pk_op(&p, '(');
    pk_tensor(&p, "HalfStorage", "k", "cpu", 4, 0, 1, s1, st1);
    pk_tensor(&p, "HalfStorage", "k", "cpu", 4, 1, 1, s2, st2);
    pk_op(&p, 'l');
    pk_op(&p, '.');
    load_ok();
    ck_assert_uint_eq(ckpt_file_storage_count(f), 1);
    const ckpt_tensor *a = ckpt_value_tensor(ckpt_value_item(v, 0));
    const ckpt_tensor *b = ckpt_value_tensor(ckpt_value_item(v, 1));
    ck_assert_ptr_eq(ckpt_tensor_storage(a), ckpt_tensor_storage(b));
    ck_assert_int_eq(ckpt_tensor_offset(b), 1);
    ck_assert(!ckpt_tensor_is_contiguous(b));
}
END_TEST

START_TEST(tensor_view_past_storage)
{
    int64_t shape[2] = {3, 3}, stride[2] = {3, 1};
    pk_proto2(&p);
    pk_tensor(&p, "FloatStorage", "0", "cpu", 8, 0, 2, shape, stride);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "past the end of storage '0'");
}
END_TEST

START_TEST(tensor_offset_past_storage)
{
    int64_t shape[1] = {2}, stride[1] = {1};
    pk_proto2(&p);
    pk_tensor(&p, "LongStorage", "0", "cpu", 2, 1, 1, shape, stride);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "past the end");
}
END_TEST

START_TEST(tensor_empty_and_scalar)
{
    int64_t shape[2] = {0, 3}, stride[2] = {3, 1};
    pk_proto2(&p);
    pk_op(&p, '(');
    pk_tensor(&p, "FloatStorage", "0", "cpu", 0, 0, 2, shape, stride);
    pk_tensor(&p, "DoubleStorage", "1", "cpu", 1, 0, 0, NULL, NULL);
    pk_op(&p, 't');
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_tensor_numel(ckpt_value_tensor(ckpt_value_item(v, 0))), 0);
    const ckpt_tensor *s = ckpt_value_tensor(ckpt_value_item(v, 1));
    ck_assert_int_eq(ckpt_tensor_ndim(s), 0);
    ck_assert_int_eq(ckpt_tensor_numel(s), 1);
}
END_TEST

START_TEST(tensor_shape_overflow)
{
    int64_t shape[2] = {INT64_C(1) << 40, INT64_C(1) << 40}, stride[2] = {1, 1};
    pk_proto2(&p);
    pk_tensor(&p, "FloatStorage", "0", "cpu", 1, 0, 2, shape, stride);
    pk_op(&p, '.');
    int rc = pk_load(f, &p, &v);
    ck_assert_int_eq(rc, CKPT_ERR_FORMAT);
}
END_TEST

START_TEST(unknown_storage_type)
{
    pk_proto2(&p);
    pk_storage(&p, "FooStorage", "0", "cpu", 1);
    pk_op(&p, '.');
    /* torch.FooStorage is not a known global at all */
    load_fails(CKPT_ERR_UNSAFE, "torch.FooStorage");
}
END_TEST

START_TEST(storage_named_twice_with_two_sizes)
{
    pk_proto2(&p);
    pk_op(&p, '(');
    pk_storage(&p, "FloatStorage", "0", "cpu", 4);
    pk_storage(&p, "FloatStorage", "0", "cpu", 5);
    pk_op(&p, 't');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "different sizes");
}
END_TEST

/* ---- refused and malformed ---- */

START_TEST(refuses_os_system)
{
    pk_proto2(&p);
    pk_global(&p, "os", "system");
    pk_str(&p, "touch /tmp/ckpt_unit_pwned");
    pk_op(&p, 0x85);
    pk_op(&p, 'R');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_UNSAFE, "refused global 'os.system'");
    ck_assert_msg_has(f, "at byte 2");
}
END_TEST

/* getattr(ZeroStageEnum, 'weights'): DeepSpeed's stage as Python 3.11+
 * pickles an enum member; admitted as data, and only that pair's kind */
static void getattr_of(const char *cls_mod, const char *cls, const char *attr, bool in_list)
{
    pk_proto2(&p);
    if (in_list) { /* [getattr, <the member>]: getattr itself kept as a value */
        pk_op(&p, ']');
        pk_global(&p, "__builtin__", "getattr");
        pk_op(&p, 'a'); /* APPEND */
    }
    pk_global(&p, "__builtin__", "getattr");
    pk_global(&p, cls_mod, cls);
    pk_str(&p, attr);
    pk_op(&p, 0x86); /* TUPLE2 */
    pk_op(&p, 'R');
    if (in_list)
        pk_op(&p, 'a');
    pk_op(&p, '.');
}

START_TEST(getattr_enum_member_is_data)
{
    getattr_of("deepspeed.runtime.zero.config", "ZeroStageEnum", "weights", false);
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_OBJECT);
    ck_assert_str_eq(ckpt_value_global(v), "builtins.getattr");
}
END_TEST

START_TEST(getattr_other_uses_refused)
{
    getattr_of("deepspeed.runtime.zero.config", "ZeroStageEnum", "__init__", false);
    load_fails(CKPT_ERR_UNSAFE, "refused global 'builtins.getattr'");
    pk_free(&p);
    memset(&p, 0, sizeof(p));
    getattr_of("collections", "OrderedDict", "fromkeys", false);
    load_fails(CKPT_ERR_UNSAFE, "refused global 'builtins.getattr'");
    pk_free(&p);
    memset(&p, 0, sizeof(p));
    /* an admitted pair, then getattr kept as a value: refused at STOP */
    getattr_of("deepspeed.runtime.zero.config", "ZeroStageEnum", "weights", true);
    load_fails(CKPT_ERR_UNSAFE, "refused global 'builtins.getattr'");
}
END_TEST

START_TEST(allow_global_admits_as_opaque)
{
    ck_assert_int_eq(ckpt_file_allow_global(f, "mypkg.Config"), CKPT_OK);
    pk_proto2(&p);
    pk_global(&p, "mypkg", "Config");
    pk_op(&p, ')');
    pk_op(&p, 'R');
    pk_op(&p, '.');
    load_ok();
    ck_assert_str_eq(ckpt_value_global(v), "mypkg.Config");
}
END_TEST

START_TEST(allow_unknown_never_admits_os)
{
    ck_assert_int_eq(ckpt_file_set_allow_unknown(f, 1), CKPT_OK);
    ck_assert_int_eq(ckpt_file_classify_global(f, "mypkg.Thing"), CKPT_GLOBAL_ALLOWED);
    ck_assert_int_eq(ckpt_file_classify_global(f, "posix.system"), CKPT_GLOBAL_REFUSED);
    ck_assert_int_eq(ckpt_file_classify_global(f, "builtins.eval"), CKPT_GLOBAL_REFUSED);
    ck_assert_int_eq(ckpt_file_classify_global(f, "torch.float16"), CKPT_GLOBAL_INTERPRETED);
    ck_assert_int_eq(ckpt_file_classify_global(f, "torch.device"), CKPT_GLOBAL_KNOWN_DATA);
}
END_TEST

START_TEST(stack_underflow)
{
    pk_proto2(&p);
    pk_op(&p, 0x86); /* TUPLE2 on an empty stack */
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "stack underflow");
}
END_TEST

START_TEST(reduce_on_empty_stack)
{
    pk_proto2(&p);
    pk_op(&p, 'R');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "stack underflow");
}
END_TEST

START_TEST(memo_read_before_put)
{
    pk_proto2(&p);
    pk_op(&p, 'h');
    pk_le(&p, 5, 1);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "memo index 5 read before it was stored");
}
END_TEST

START_TEST(setitems_on_a_list)
{
    pk_proto2(&p);
    pk_op(&p, ']');
    pk_op(&p, '(');
    pk_str(&p, "k");
    pk_int(&p, 1);
    pk_op(&p, 'u');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "SETITEM on a list");
}
END_TEST

START_TEST(build_on_a_list)
{
    pk_proto2(&p);
    pk_op(&p, ']');
    pk_op(&p, '}');
    pk_op(&p, 'b');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "BUILD on a list");
}
END_TEST

START_TEST(append_on_a_dict)
{
    pk_proto2(&p);
    pk_op(&p, '}');
    pk_int(&p, 1);
    pk_op(&p, 'a');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "APPEND on a dict");
}
END_TEST

START_TEST(reduce_on_a_string)
{
    pk_proto2(&p);
    pk_str(&p, "os.system");
    pk_op(&p, ')');
    pk_op(&p, 'R');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "REDUCE calls a str");
}
END_TEST

START_TEST(truncated_stream)
{
    pk_proto2(&p);
    pk_op(&p, 'X');
    pk_le(&p, 10, 4);
    pk_text(&p, "abc");
    load_fails(CKPT_ERR_FORMAT, "truncated pickle");
}
END_TEST

START_TEST(no_stop)
{
    pk_proto2(&p);
    pk_op(&p, 'N');
    load_fails(CKPT_ERR_FORMAT, "no STOP");
}
END_TEST

START_TEST(huge_length_field)
{
    pk_proto2(&p);
    pk_op(&p, 'X');
    pk_le(&p, 0x80000000u, 4); /* 2 GiB string in a 10-byte stream */
    pk_op(&p, '.');
    int rc = pk_load(f, &p, &v);
    ck_assert(rc == CKPT_ERR_FORMAT || rc == CKPT_ERR_LIMIT);
}
END_TEST

START_TEST(invalid_utf8)
{
    pk_proto2(&p);
    pk_op(&p, 'X');
    pk_le(&p, 2, 4);
    pk_bytes(&p, "\xc3\x28", 2);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "not valid UTF-8");
}
END_TEST

START_TEST(surrogates_pass_like_python)
{
    pk_proto2(&p);
    pk_op(&p, 'X');
    pk_le(&p, 3, 4);
    pk_bytes(&p, "\xed\xa0\x80", 3); /* U+D800, accepted by 'surrogatepass' */
    pk_op(&p, '.');
    load_ok();
}
END_TEST

START_TEST(unknown_opcode)
{
    pk_proto2(&p);
    pk_op(&p, 0xff);
    load_fails(CKPT_ERR_FORMAT, "unknown opcode 0xff");
}
END_TEST

START_TEST(protocol_too_new)
{
    pk_op(&p, 0x80);
    pk_op(&p, 6);
    pk_op(&p, 'N');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_UNSUPPORTED, "protocol 6");
}
END_TEST

START_TEST(ext_opcodes_unsupported)
{
    pk_proto2(&p);
    pk_op(&p, 0x82);
    pk_op(&p, 1);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_UNSUPPORTED, "EXT1");
}
END_TEST

START_TEST(ext2_ext4_unsupported)
{
    pk_proto2(&p);
    pk_op(&p, 0x83);
    pk_le(&p, 1, 2);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_UNSUPPORTED, "EXT1/2/4");
    pk_free(&p);
    pk_proto2(&p);
    pk_op(&p, 0x84);
    pk_le(&p, 1, 4);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_UNSUPPORTED, "EXT1/2/4");
}
END_TEST

START_TEST(readonly_buffer_needs_bytes)
{
    /* load_readonly_buffer views the top value: bytes stay bytes, None has no buffer */
    pk_text(&p, "\x80\x05" "C\x02" "ab\x98.");
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_BYTES);
    pk_free(&p);
    pk_op(&p, 0x80);
    pk_op(&p, 5);
    pk_op(&p, 'N');
    pk_op(&p, 0x98);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_FORMAT, "not a bytes-like object");
}
END_TEST

START_TEST(out_of_band_buffer_unsupported)
{
    pk_op(&p, 0x80);
    pk_op(&p, 5);
    pk_op(&p, 0x97);
    pk_op(&p, '.');
    load_fails(CKPT_ERR_UNSUPPORTED, "out-of-band");
}
END_TEST

START_TEST(text_persid_is_not_a_storage)
{
    pk_text(&p, "P42\n.");
    load_fails(CKPT_ERR_FORMAT, "persistent id");
}
END_TEST

START_TEST(mark_bomb_hits_the_limit)
{
    pk_proto2(&p);
    for (int i = 0; i < 1000000; i++)
        pk_op(&p, '(');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_LIMIT, "nested MARKs");
}
END_TEST

START_TEST(memo_limit)
{
    ck_assert_int_eq(ckpt_file_set_limit(f, CKPT_LIMIT_MEMO, 10), CKPT_OK);
    pk_proto2(&p);
    pk_op(&p, 'N');
    for (int i = 0; i < 11; i++) {
        pk_op(&p, 'q');
        pk_le(&p, (uint64_t)i, 1);
    }
    pk_op(&p, '.');
    load_fails(CKPT_ERR_LIMIT, "memo entries");
}
END_TEST

START_TEST(stack_limit)
{
    ck_assert_int_eq(ckpt_file_set_limit(f, CKPT_LIMIT_STACK, 100), CKPT_OK);
    pk_proto2(&p);
    for (int i = 0; i < 200; i++)
        pk_op(&p, 'N');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_LIMIT, "stack deeper");
}
END_TEST

START_TEST(items_limit)
{
    ck_assert_int_eq(ckpt_file_set_limit(f, CKPT_LIMIT_ITEMS, 3), CKPT_OK);
    pk_proto2(&p);
    pk_op(&p, ']');
    pk_op(&p, '(');
    for (int i = 0; i < 4; i++)
        pk_op(&p, 'N');
    pk_op(&p, 'e');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_LIMIT, "more than 3 items");
}
END_TEST

START_TEST(pickle_size_limit)
{
    ck_assert_int_eq(ckpt_file_set_limit(f, CKPT_LIMIT_PICKLE_BYTES, 4), CKPT_OK);
    pk_proto2(&p);
    pk_op(&p, 'N');
    pk_op(&p, 'N');
    pk_op(&p, '.');
    load_fails(CKPT_ERR_LIMIT, "--max-pickle-bytes");
}
END_TEST

/* --max-depth is checked as each container is made (issue 26): 10^8 nested
 * TUPLE1s stop at the limit, not after 10^8 tuples are built. */
static void nested_tuples(int n)
{
    pk_free(&p);
    pk_proto2(&p);
    pk_op(&p, ')');
    for (int i = 0; i < n; i++)
        pk_op(&p, 0x85); /* TUPLE1: a tuple of the last one */
    pk_op(&p, '.');
}

START_TEST(depth_limit_while_reading)
{
    ck_assert_int_eq(ckpt_file_set_limit(f, CKPT_LIMIT_DEPTH, 50), CKPT_OK);
    nested_tuples(50);
    load_ok();
    nested_tuples(51);
    load_fails(CKPT_ERR_LIMIT, "nested more than 50 levels (--max-depth)");
    ck_assert_msg_has(f, "at byte 53"); /* the TUPLE1 that went past it: the VM's check */
    /* dicts: {'k': {'k': ...}} made by SETITEMs from the innermost out */
    for (int n = 50; n <= 51; n++) {
        pk_free(&p);
        pk_proto2(&p);
        pk_op(&p, '}');
        for (int i = 0; i < n; i++) {
            pk_str(&p, "k");
            pk_op(&p, '}');
        }
        for (int i = 0; i < n; i++)
            pk_op(&p, 's');
        pk_op(&p, '.');
        if (n == 50)
            load_ok();
        else
            load_fails(CKPT_ERR_LIMIT, "nested more than 50 levels (--max-depth)");
    }
}
END_TEST

START_TEST(big_memo_index_is_fine)
{
    /* Python's memo is a dict: a sparse index is legal */
    pk_proto2(&p);
    pk_op(&p, 'N');
    pk_op(&p, 'r');
    pk_le(&p, 4000000000u, 4);
    pk_op(&p, 'j');
    pk_le(&p, 4000000000u, 4);
    pk_op(&p, 0x86);
    pk_op(&p, '.');
    load_ok();
    ck_assert_int_eq(ckpt_value_len(v), 2);
}
END_TEST

/* The memo keeps small indices in an array and others in a map: an index
 * first put in the map and put again once the array has grown over it is
 * read back as its last put, counted once (MEMOIZE's next index). */
START_TEST(memo_index_moves_from_map_to_array)
{
    pk_proto2(&p);
    pk_op(&p, 'K'); /* 7 at 100000: the map (100000 is far past 4 slots an entry) */
    pk_le(&p, 7, 1);
    pk_op(&p, 'r');
    pk_le(&p, 100000, 4);
    pk_op(&p, '0');
    for (uint32_t i = 0; i < 30000; i++) { /* 0..29999: the array */
        pk_op(&p, 'K');
        pk_le(&p, i & 0xff, 1);
        pk_op(&p, 'r');
        pk_le(&p, i, 4);
        pk_op(&p, '0');
    }
    pk_op(&p, 'K'); /* 9 at 100000 again: now within the array's growth */
    pk_le(&p, 9, 1);
    pk_op(&p, 'r');
    pk_le(&p, 100000, 4);
    pk_op(&p, '0');
    pk_op(&p, 'K'); /* MEMOIZE: at the memo's length, 30001 */
    pk_le(&p, 42, 1);
    pk_op(&p, 0x94);
    pk_op(&p, '0');
    pk_op(&p, 'j');
    pk_le(&p, 100000, 4);
    pk_op(&p, 'j');
    pk_le(&p, 30001, 4);
    pk_op(&p, 0x86);
    pk_op(&p, '.');
    load_ok();
    int64_t a = 0, b = 0;
    ck_assert_int_eq(ckpt_value_int(ckpt_value_item(v, 0), &a), CKPT_OK);
    ck_assert_int_eq(ckpt_value_int(ckpt_value_item(v, 1), &b), CKPT_OK);
    ck_assert_int_eq(a, 9);
    ck_assert_int_eq(b, 42);
}
END_TEST

/* A binding lists a dict's keys in one call: their bytes packed, their
 * lengths, their tensors (none here); it stops at a key that is not a
 * string and when the buffer is full. */
START_TEST(dict_tensor_items_packed)
{
    pk_proto2(&p);
    pk_op(&p, '}');
    pk_op(&p, '(');
    pk_str(&p, "ab");
    pk_op(&p, 'N');
    pk_str(&p, "cde");
    pk_op(&p, 'N');
    pk_op(&p, 'K'); /* an int key */
    pk_le(&p, 5, 1);
    pk_op(&p, 'N');
    pk_op(&p, 'u');
    pk_op(&p, '.');
    load_ok();
    char buf[8];
    size_t lens[4];
    const ckpt_tensor *ts[4];
    ck_assert_uint_eq(ckpt_value_dict_tensor_items(v, 0, buf, sizeof buf, lens, ts, 4), 2);
    ck_assert_uint_eq(lens[0], 2);
    ck_assert_uint_eq(lens[1], 3);
    ck_assert(memcmp(buf, "abcde", 5) == 0);
    ck_assert_ptr_null(ts[0]);
    ck_assert_uint_eq(ckpt_value_dict_tensor_items(v, 1, buf, sizeof buf, lens, ts, 1), 1);
    ck_assert_uint_eq(ckpt_value_dict_tensor_items(v, 0, buf, 4, lens, ts, 4), 1); /* full */
    ck_assert_uint_eq(ckpt_value_dict_tensor_items(v, 2, buf, sizeof buf, lens, ts, 4), 0);
    ck_assert_uint_eq(ckpt_value_dict_tensor_items(ckpt_value_dict_value(v, 0), 0, buf,
                                                   sizeof buf, lens, ts, 4), 0); /* not a dict */
}
END_TEST

START_TEST(decimal_digit_limit)
{
    pk_op(&p, 'L');
    for (int i = 0; i < 5000; i++)
        pk_op(&p, '9');
    pk_text(&p, "\n.");
    load_fails(CKPT_ERR_LIMIT, "4300 digits");
}
END_TEST

START_TEST(consumed_bytes_reported)
{
    /* a legacy file is pickles back to back: the VM says where one ends */
    pk_proto2(&p);
    pk_op(&p, 'N');
    pk_op(&p, '.');
    pk_proto2(&p);
    pk_op(&p, 0x88);
    pk_op(&p, '.');
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, "t");
    size_t used = 0;
    ck_assert_int_eq(ckpt_pickle_load(&ctx, p.buf, p.n, &v, &used, &f->err), CKPT_OK);
    ck_assert_uint_eq(used, 4);
    ck_assert_int_eq(ckpt_pickle_load(&ctx, p.buf + used, p.n - used, &v, &used, &f->err), CKPT_OK);
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_BOOL);
}
END_TEST

/* ---- how the bytes are fed: FILE (contiguous) and BYTESIO (a frame's rest
 * dropped when a read needs more), as CPython's C unpickler reads them ---- */

typedef struct seen {
    char globals[512];  /* "a.b;c.d;" in request order */
    char computed[512]; /* "shown@made_by@opcode@offset;" */
} seen;

static seen *cur_seen; /* the callbacks' user is the ckpt_file */

static void seen_global(void *user, const char *q, ckpt_global_class c, int op, uint64_t at)
{
    (void)c, (void)op, (void)at;
    (void)user;
    seen *s = cur_seen;
    size_t n = strlen(s->globals);
    snprintf(s->globals + n, sizeof s->globals - n, "%s;", q);
}

static void seen_use(void *user, const char *q, int op, uint64_t at)
{
    (void)user, (void)q, (void)op, (void)at;
}

static void seen_computed(void *user, const char *shown, const char *by, int op, uint64_t at)
{
    (void)user;
    seen *s = cur_seen;
    size_t n = strlen(s->computed);
    snprintf(s->computed + n, sizeof s->computed - n, "%s@%s@0x%02x@%llu;", shown, by, op,
             (unsigned long long)at);
}

typedef struct fed {
    int rc;
    size_t consumed;
    bool crossed;
} fed;

/* Run P once with FEED, scanning (SCAN) or reading; V gets the value. */
static fed feed(ckpt_pickle_feed how, bool scan, seen *s)
{
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, "t.pkl");
    ctx.feed = how;
    ctx.frame_crossed = false; /* the VM only sets it */
    if (scan) {
        memset(s, 0, sizeof *s);
        cur_seen = s;
        ctx.scan = true;
        ctx.on_global = seen_global;
        ctx.on_use = seen_use;
        ctx.on_computed = seen_computed;
    }
    ckpt_err_clear(&f->err);
    fed r = {.consumed = 0};
    v = NULL;
    r.rc = ckpt_pickle_load(&ctx, p.buf, p.n, &v, &r.consumed, &f->err);
    r.crossed = ctx.frame_crossed;
    return r;
}

static void pk_frame(uint64_t n)
{
    pk_op(&p, 0x95);
    pk_le(&p, n, 8);
}

START_TEST(frame_ending_inside_an_argument)
{
    /* FRAME(3) holds SHORT_BINUNICODE, its length 2 and one byte of its text.
     * A file is read on: the text is "ab" and STOP follows.  A BytesIO drops
     * the 'a' left in the frame and reads 2 fresh bytes: "b.", then a GLOBAL
     * os.system that the file reading never sees. */
    pk_text(&p, "\x80\x04");
    pk_frame(3);
    pk_text(&p, "\x8c\x02" "a" "b." "cos\nsystem\n.");
    seen s;
    fed r = feed(CKPT_FEED_FILE, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_str_eq(s.globals, "");
    ck_assert_str_eq(ckpt_value_str(v, NULL), "ab");
    ck_assert_uint_eq(r.consumed, 16); /* after the first STOP */
    ck_assert(r.crossed);
    r = feed(CKPT_FEED_BYTESIO, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_str_eq(s.globals, "os.system;");
    ck_assert_uint_eq(r.consumed, p.n); /* the last STOP */
    ck_assert(r.crossed);
    /* reading (not scanning) refuses it only when fed as a BytesIO */
    ck_assert_int_eq(feed(CKPT_FEED_FILE, false, &s).rc, CKPT_OK);
    ck_assert_int_eq(feed(CKPT_FEED_BYTESIO, false, &s).rc, CKPT_ERR_UNSAFE);
}
END_TEST

START_TEST(readline_crossing_a_frame_end)
{
    /* GLOBAL's name line "sy" is not ended inside FRAME(6): a file reads on
     * ("system"), a BytesIO reads the line whole from after the frame ("stem") */
    pk_text(&p, "\x80\x04");
    pk_frame(6);
    pk_text(&p, "cos\nsystem\n)R.");
    seen s;
    fed r = feed(CKPT_FEED_FILE, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_str_eq(s.globals, "os.system;");
    ck_assert(r.crossed);
    r = feed(CKPT_FEED_BYTESIO, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_str_eq(s.globals, "os.stem;");
    ck_assert(r.crossed);
    ck_assert_uint_eq(r.consumed, p.n);
}
END_TEST

START_TEST(nested_frame_longer_than_what_is_left)
{
    /* the outer FRAME(15) ends one byte ('N') into the inner FRAME(3)'s data:
     * a file reads (None, True); a BytesIO drops the 'N' and frames the 3
     * bytes after the outer frame, making ("abc", True) */
    pk_text(&p, "\x80\x04");
    pk_frame(15);
    pk_text(&p, "\x8c\x03" "abc");
    pk_frame(3);
    pk_text(&p, "N\x88\x86.");
    seen s;
    fed r = feed(CKPT_FEED_FILE, false, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert(r.crossed);
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 0)), CKPT_KIND_NONE);
    ck_assert_uint_eq(r.consumed, p.n);
    r = feed(CKPT_FEED_BYTESIO, false, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert(r.crossed);
    ck_assert_str_eq(ckpt_value_str(ckpt_value_item(v, 0), NULL), "abc");
    ck_assert_int_eq(ckpt_value_bool(ckpt_value_item(v, 1)), 1);
    ck_assert_uint_eq(r.consumed, p.n);
}
END_TEST

START_TEST(frame_of_zero_bytes)
{
    /* FRAME(0) reads nothing and leaves nothing: no feed reads otherwise */
    pk_text(&p, "\x80\x04");
    pk_frame(0);
    pk_text(&p, "N.");
    seen s;
    for (int how = CKPT_FEED_FILE; how <= CKPT_FEED_BYTESIO; how++) {
        fed r = feed((ckpt_pickle_feed)how, true, &s);
        ck_assert_int_eq(r.rc, CKPT_OK);
        ck_assert(!r.crossed);
        ck_assert_uint_eq(r.consumed, p.n);
    }
}
END_TEST

/* Run P with CKPT_FEED_CHOOSE: DROPS from the point numbered FIRST on. */
static fed choose(uint64_t drops, uint64_t first, bool scan, uint64_t *points)
{
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, "t.pkl");
    ctx.feed = CKPT_FEED_CHOOSE;
    ctx.drops = drops;
    ctx.ndiverge = first;
    static seen s;
    if (scan) {
        memset(&s, 0, sizeof s);
        cur_seen = &s;
        ctx.scan = true;
        ctx.on_global = seen_global;
        ctx.on_use = seen_use;
        ctx.on_computed = seen_computed;
    }
    ckpt_err_clear(&f->err);
    fed r = {.consumed = 0};
    v = NULL;
    r.rc = ckpt_pickle_load(&ctx, p.buf, p.n, &v, &r.consumed, &f->err);
    r.crossed = ctx.frame_stop;
    *points = ctx.ndiverge;
    return r;
}

START_TEST(stop_inside_a_frame)
{
    /* FRAME(6) holds two pickles' bytes, "K\x01." and "K\x02.": STOP comes
     * with 3 bytes of the frame after it.  Peeked (a file's buffer holds the
     * frame), the next pickle.load starts after STOP (byte 14); read whole
     * (a BytesIO, a frame of 128 KiB or more), after the frame (byte 17). */
    pk_text(&p, "\x80\x04");
    pk_frame(6);
    pk_text(&p, "K\x01." "K\x02." "K\x03.");
    seen s;
    fed r = feed(CKPT_FEED_FILE, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_uint_eq(r.consumed, 14);
    ck_assert(!r.crossed); /* no read crossed the frame's end */
    r = feed(CKPT_FEED_BYTESIO, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_uint_eq(r.consumed, 17);
    /* CHOOSE: one point, taken as its bit says; bits count on from NDIVERGE */
    uint64_t points;
    r = choose(0, 0, true, &points);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_uint_eq(r.consumed, 14);
    ck_assert(r.crossed); /* frame_stop */
    ck_assert_uint_eq(points, 1);
    r = choose(1, 0, true, &points);
    ck_assert_uint_eq(r.consumed, 17);
    r = choose((uint64_t)1 << 5, 5, true, &points);
    ck_assert_uint_eq(r.consumed, 17);
    ck_assert_uint_eq(points, 6);
    r = choose((uint64_t)1 << 5, 4, true, &points);
    ck_assert_uint_eq(r.consumed, 14);
    r = choose(~(uint64_t)0, 64, true, &points); /* past 63: peeked */
    ck_assert_uint_eq(r.consumed, 14);
    /* a reader cannot know which is torch's: refused */
    ck_assert_int_eq(choose(0, 0, false, &points).rc, CKPT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(ckpt_file_error_message(f), "buffered"));
}
END_TEST

START_TEST(stop_ending_a_frame)
{
    /* what pickle.dump writes: STOP is the frame's last byte, no choice */
    pk_text(&p, "\x80\x04");
    pk_frame(3);
    pk_text(&p, "K\x01." "K\x02.");
    uint64_t points;
    fed r = choose(0, 0, false, &points);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_uint_eq(r.consumed, 14);
    ck_assert_uint_eq(points, 0);
}
END_TEST

START_TEST(binbytes_read_into_stays_contiguous)
{
    /* SHORT_BINBYTES's data is read with readinto: the frame's rest ("a")
     * then the file ("bcd"), whatever the feed; no frame is crossed */
    pk_text(&p, "\x80\x04");
    pk_frame(3);
    pk_text(&p, "C\x04" "abcd.");
    seen s;
    for (int how = CKPT_FEED_FILE; how <= CKPT_FEED_BYTESIO; how++) {
        fed r = feed((ckpt_pickle_feed)how, false, &s);
        ck_assert_int_eq(r.rc, CKPT_OK);
        size_t n;
        const char *b = ckpt_value_str(v, &n);
        ck_assert_uint_eq(n, 4);
        ck_assert_mem_eq(b, "abcd", 4);
        ck_assert(!r.crossed);
        ck_assert_uint_eq(r.consumed, p.n);
    }
}
END_TEST

static ckpt_global_class admit_all(void *user, const char *q)
{
    (void)user, (void)q;
    return CKPT_GLOBAL_ALLOWED;
}

START_TEST(stack_global_computed_by_a_call)
{
    /* STACK_GLOBAL(_codecs.encode('bf', 'rot13'), 'system'): 'os' at run time */
    pk_text(&p, "\x80\x04" "c_codecs\nencode\n\x8c\x02" "bf\x8c\x05rot13\x86R\x8c\x06system\x93)R.");
    seen s;
    fed r = feed(CKPT_FEED_FILE, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_str_eq(s.globals, "_codecs.encode;");
    ck_assert_str_eq(s.computed, "<_codecs.encode(...)>.system@_codecs.encode@0x93@39;");
    /* reading refuses it even when the user admits every global */
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, "t.pkl");
    ctx.classify = admit_all;
    ckpt_err_clear(&f->err);
    ck_assert_int_eq(ckpt_pickle_load(&ctx, p.buf, p.n, &v, NULL, &f->err), CKPT_ERR_UNSAFE);
    ck_assert_msg_has(f, "named at run time");
}
END_TEST

START_TEST(getattr_on_a_call_result)
{
    /* builtins.getattr(mymod.Thing(), 'system'): an attribute looked up at run time */
    pk_text(&p, "\x80\x04" "cbuiltins\ngetattr\ncmymod\nThing\n)R\x8c\x06system\x86R.");
    seen s;
    fed r = feed(CKPT_FEED_FILE, true, &s);
    ck_assert_int_eq(r.rc, CKPT_OK);
    ck_assert_str_eq(s.globals, "builtins.getattr;mymod.Thing;");
    ck_assert_str_eq(s.computed, "<mymod.Thing(...)>.system@mymod.Thing@0x52@44;");
    ckpt_pickle_ctx ctx;
    ckpt_file_pickle_ctx(f, &ctx, "t.pkl");
    ctx.classify = admit_all;
    ckpt_err_clear(&f->err);
    ck_assert_int_eq(ckpt_pickle_load(&ctx, p.buf, p.n, &v, NULL, &f->err), CKPT_ERR_UNSAFE);
    ck_assert_msg_has(f, "named at run time");
}
END_TEST

START_TEST(int_text_as_strtol_then_int)
{
    /* load_int: strtol base 0 (C octal, hex, leading whitespace), else
     * int(text, 0) (0o, 0b, underscores); a bool when one char reads 0 or 1 */
    pk_text(&p, "(I010\nI0x1f\nI 5\nI0o17\nI0b101\nI1_000\nI01\nI 1\nL0x10L\nL-0b1_1\nl.");
    load_ok();
    const int64_t want[] = {8, 31, 5, 15, 5, 1000};
    for (size_t i = 0; i < 6; i++)
        ck_assert_int_eq(int_of(ckpt_value_item(v, i)), want[i]);
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 6)), CKPT_KIND_BOOL);
    ck_assert_int_eq(ckpt_value_kind(ckpt_value_item(v, 7)), CKPT_KIND_BOOL);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 8)), 16);
    ck_assert_int_eq(int_of(ckpt_value_item(v, 9)), -3);
    const char *bad[] = {"I0_7\n.", "I1__0\n.", "I_1\n.", "I1_\n.", "I0x\n.", "L010L\n.", "I+ 5\n."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pk_free(&p);
        pk_text(&p, bad[i]);
        ck_assert_msg(pk_load(f, &p, &v) == CKPT_ERR_FORMAT, "%s read", bad[i]);
    }
}
END_TEST

START_TEST(memo_index_line_as_int_base_10)
{
    /* PUT/GET lines: int(text, 10) of the C string - whitespace, a sign,
     * underscores, leading zeros; a NUL ends it */
    pk_text(&p, "Np 0_0 \n0g+00\n.");
    load_ok();
    ck_assert_int_eq(ckpt_value_kind(v), CKPT_KIND_NONE);
    pk_free(&p);
    pk_bytes(&p, "Np0\0x\n0g0\n.", 11);
    load_ok();
    const char *bad[] = {"Np-1\n.", "Np1__0\n.", "Np0x1\n.", "Np_1\n."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pk_free(&p);
        pk_text(&p, bad[i]);
        ck_assert_msg(pk_load(f, &p, &v) == CKPT_ERR_FORMAT, "%s read", bad[i]);
    }
}
END_TEST

START_TEST(ext_reads_its_code_first)
{
    /* load_extension reads the code, then finds no registry: the file
     * position at the error is after the code (4 bytes for EXT4) */
    pk_bytes(&p, "\x80\x02\x84\x01\x00\x00\x00.", 8);
    seen s;
    fed r = feed(CKPT_FEED_BYTESIO, true, &s);
    ck_assert_int_eq(r.rc, CKPT_ERR_UNSUPPORTED);
    ck_assert_uint_eq(r.consumed, 7);
}
END_TEST

START_TEST(setitems_target_below_the_enclosing_mark)
{
    /* ] ( ( u e . - SETITEMS's dict would be the list below the outer MARK:
     * do_setitems refuses ("unexpected MARK found"), reading and scanning */
    pk_text(&p, "\x80\x02](");
    pk_frame(0);
    pk_text(&p, "(ue.");
    seen s;
    ck_assert_int_eq(feed(CKPT_FEED_FILE, true, &s).rc, CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "stack underflow");
    ck_assert_int_eq(feed(CKPT_FEED_BYTESIO, false, &s).rc, CKPT_ERR_FORMAT);
    ck_assert_msg_has(f, "stack underflow");
    pk_free(&p);
    pk_text(&p, "\x80\x02](K\x01(e1.");  /* the list above the outer MARK: fine */
    ck_assert_int_eq(feed(CKPT_FEED_FILE, true, &s).rc, CKPT_OK);
}
END_TEST

/* ---- the weights-only unpickler model (analysis/weights_only.c) ------------ */

static const uint64_t wo_limits[CKPT_LIMIT_COUNT_] = {
    [CKPT_LIMIT_PICKLE_BYTES] = 1 << 20, [CKPT_LIMIT_DEPTH] = 100, [CKPT_LIMIT_STACK] = 1 << 16,
    [CKPT_LIMIT_MARKS] = 1 << 10, [CKPT_LIMIT_MEMO] = 1 << 16, [CKPT_LIMIT_ITEMS] = 1 << 16,
    [CKPT_LIMIT_STORAGES] = 1 << 10};

static ckpt_wo_result wo(ckpt_wo_torch t, const char *pkl, size_t len)
{
    ckpt_wo_ctx ctx = {.torch = t, .limits = wo_limits, .pid_fields = 5};
    ckpt_wo_result r;
    ckpt_error err = {0};
    ck_assert_int_eq(ckpt_wo_walk(&ctx, (const uint8_t *)pkl, len, &r, &err), CKPT_OK);
    return r;
}
#define WO(t, lit) wo((t), (lit), sizeof(lit) - 1)

START_TEST(wo_allow_lists)
{
    ck_assert_uint_eq(ckpt_wo_allowed_count(CKPT_WO_2_15), 144);
    ck_assert_uint_eq(ckpt_wo_allowed_count(CKPT_WO_1_13), 90);
    ck_assert(ckpt_wo_allowed(CKPT_WO_2_15, "torch.storage.UntypedStorage"));
    ck_assert(!ckpt_wo_allowed(CKPT_WO_2_15, "torch.UntypedStorage"));
    ck_assert(ckpt_wo_allowed(CKPT_WO_2_15, "builtins.set"));
    ck_assert(!ckpt_wo_allowed(CKPT_WO_1_13, "builtins.set"));
    ck_assert(!ckpt_wo_allowed(CKPT_WO_1_13, "torch.bfloat16")); /* 1.13 knows 10 dtypes */
    ck_assert(ckpt_wo_allowed(CKPT_WO_1_13, "torch._utils._rebuild_sparse_csr_tensor"));
    ck_assert(!ckpt_wo_allowed(CKPT_WO_2_15, "torch._utils._rebuild_sparse_csr_tensor"));
    ck_assert(ckpt_wo_blocked(CKPT_WO_2_15, "os") && !ckpt_wo_blocked(CKPT_WO_2_15, "os.path"));
    ck_assert(!ckpt_wo_blocked(CKPT_WO_1_13, "os"));
}
END_TEST

START_TEST(wo_accepts_plain_data)
{
    /* {'a': [1, (2, 3)], 'b': OrderedDict()} */
    ck_assert_int_eq(WO(CKPT_WO_2_15, "\x80\x02}q\x00(X\x01\x00\x00\x00" "a]q\x01(K\x01K\x02K\x03"
                                      "\x86" "eX\x01\x00\x00\x00" "bccollections\nOrderedDict\n)Ru.")
                         .stop, CKPT_WO_OK);
    ck_assert_int_eq(WO(CKPT_WO_1_13, "\x80\x02]K\x01a.").stop, CKPT_WO_OK);
}
END_TEST

START_TEST(wo_globals)
{
    ckpt_wo_result r = WO(CKPT_WO_2_15, "\x80\x02" "cargparse\nNamespace\n)R.");
    ck_assert_int_eq(r.stop, CKPT_WO_GLOBAL);
    ck_assert_str_eq(r.global, "argparse.Namespace");
    ck_assert_uint_eq(r.offset, 2);
    ck_assert(strstr(r.msg, "add_safe_globals([argparse.Namespace])"));
    /* Python 2 names: mapped by 2.15, shown without builtins. */
    r = WO(CKPT_WO_2_15, "c__builtin__\neval\n.");
    ck_assert_str_eq(r.global, "builtins.eval");
    ck_assert(strstr(r.msg, "GLOBAL eval was not"));
    r = WO(CKPT_WO_2_15, "cos\nsystem\n.");
    ck_assert(r.blocked);
    ck_assert(strstr(r.msg, "whose module os is blocked"));
    r = WO(CKPT_WO_1_13, "c__builtin__\nset\n.");
    ck_assert_str_eq(r.msg, "Unsupported class __builtin__.set");
    ck_assert_int_eq(WO(CKPT_WO_2_15, "c__builtin__\nset\n.").stop, CKPT_WO_OK);
}
END_TEST

START_TEST(wo_opcodes)
{
    ckpt_wo_result r = WO(CKPT_WO_1_13, "\x80\x02G" "?\xf0\x00\x00\x00\x00\x00\x00.");
    ck_assert_int_eq(r.stop, CKPT_WO_OPCODE);
    ck_assert_int_eq(r.opcode, 'G'); /* 1.13 has no BINFLOAT */
    ck_assert_str_eq(r.msg, "Unsupported operand 71");
    ck_assert_int_eq(WO(CKPT_WO_2_15, "\x80\x02G" "?\xf0\x00\x00\x00\x00\x00\x00.").stop, CKPT_WO_OK);
    r = WO(CKPT_WO_2_15, "\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00N.");
    ck_assert_int_eq(r.opcode, 0x95);
    ck_assert_int_eq(WO(CKPT_WO_2_15, "\x80\x02h\x05.").stop, CKPT_WO_OPCODE); /* KeyError */
    ck_assert_int_eq(WO(CKPT_WO_2_15, "\x80\x02.").stop, CKPT_WO_OPCODE);     /* empty stack */
    ck_assert_int_eq(WO(CKPT_WO_2_15, "\x80\x02X\x09\x00\x00\x00ab").stop, CKPT_WO_OPCODE);
}
END_TEST

START_TEST(wo_targets)
{
    ck_assert_int_eq(WO(CKPT_WO_2_15, "]K\x00K\x01s.").stop, CKPT_WO_VALUE); /* SETITEM on a list */
    ck_assert_int_eq(WO(CKPT_WO_1_13, "]K\x00K\x01s.").stop, CKPT_WO_OK);    /* 1.13 does not check */
    ck_assert_int_eq(WO(CKPT_WO_2_15, "}K\x01" "a.").stop, CKPT_WO_VALUE);   /* APPEND on a dict */
    ck_assert_int_eq(WO(CKPT_WO_2_15, "}}b.").stop, CKPT_WO_VALUE);          /* BUILD on a dict */
    ck_assert_int_eq(WO(CKPT_WO_2_15, "X\x01\x00\x00\x00x)R.").stop, CKPT_WO_VALUE);
    ck_assert_int_eq(WO(CKPT_WO_2_15, "ccollections\nOrderedDict\n)R}b.").stop, CKPT_WO_OK);
    /* an allowed call's result is not followed: accepted */
    ck_assert_int_eq(WO(CKPT_WO_2_15, "ctorch\nSize\n)RK\x01" "a.").stop, CKPT_WO_OK);
}
END_TEST

START_TEST(wo_persistent_ids)
{
    ckpt_wo_result r = WO(CKPT_WO_2_15, "K\x01Q.");
    ck_assert_int_eq(r.stop, CKPT_WO_STORAGE);
    ck_assert_str_eq(r.exception, "AssertionError");
    r = WO(CKPT_WO_2_15, "(X\x03\x00\x00\x00" "abcK\x01tQ.");
    ck_assert_int_eq(r.stop, CKPT_WO_STORAGE);
    ck_assert(strstr(r.msg, "Only persistent_load of storage"));
    r = WO(CKPT_WO_2_15, "(X\x07\x00\x00\x00storagectorch\nFloatStorage\ntQ.");
    ck_assert_str_eq(r.exception, "ValueError"); /* 5 fields in a zip */
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("pickle");
    TCase *ok = tcase_create("values");
    tcase_add_checked_fixture(ok, setup, teardown);
    tcase_add_test(ok, binint_family);
    tcase_add_test(ok, long1_and_long4);
    tcase_add_test(ok, protocol0_text_scalars);
    tcase_add_test(ok, negative_decimal_long);
    tcase_add_test(ok, binfloat_none_bools);
    tcase_add_test(ok, strings_and_bytes);
    tcase_add_test(ok, protocol2_3_4_counted_opcodes);
    tcase_add_test(ok, dict_setitems_and_memo);
    tcase_add_test(ok, pop_mark_discards_the_mark);
    tcase_add_test(ok, text_put_get);
    tcase_add_test(ok, sets_and_frozensets);
    tcase_add_test(ok, ordered_dict_with_metadata);
    tcase_add_test(ok, stack_global_and_known_data);
    tcase_add_test(ok, py2_builtin_names_and_inst_obj);
    tcase_add_test(ok, py2_names_mapped_below_protocol_3);
    tcase_add_test(ok, py2_names_kept_from_protocol_3);
    tcase_add_test(ok, py2_names_dangerous_after_mapping);
    tcase_add_test(ok, getattr_enum_member_is_data);
    tcase_add_test(ok, getattr_other_uses_refused);
    tcase_add_test(ok, py2_name_tables);
    tcase_add_test(ok, newobj_ex_defaultdict);
    tcase_add_test(ok, big_memo_index_is_fine);
    tcase_add_test(ok, memo_index_moves_from_map_to_array);
    tcase_add_test(ok, dict_tensor_items_packed);
    tcase_add_test(ok, surrogates_pass_like_python);
    tcase_add_test(ok, consumed_bytes_reported);
    suite_add_tcase(s, ok);

    TCase *t = tcase_create("tensors");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, tensor_v2_and_parameter);
    tcase_add_test(t, tensor_sharing_a_storage);
    tcase_add_test(t, tensor_view_past_storage);
    tcase_add_test(t, tensor_offset_past_storage);
    tcase_add_test(t, tensor_empty_and_scalar);
    tcase_add_test(t, tensor_shape_overflow);
    tcase_add_test(t, unknown_storage_type);
    tcase_add_test(t, storage_named_twice_with_two_sizes);
    suite_add_tcase(s, t);

    TCase *bad = tcase_create("errors");
    tcase_add_checked_fixture(bad, setup, teardown);
    tcase_add_test(bad, refuses_os_system);
    tcase_add_test(bad, allow_global_admits_as_opaque);
    tcase_add_test(bad, allow_unknown_never_admits_os);
    tcase_add_test(bad, stack_underflow);
    tcase_add_test(bad, reduce_on_empty_stack);
    tcase_add_test(bad, memo_read_before_put);
    tcase_add_test(bad, setitems_on_a_list);
    tcase_add_test(bad, build_on_a_list);
    tcase_add_test(bad, append_on_a_dict);
    tcase_add_test(bad, reduce_on_a_string);
    tcase_add_test(bad, truncated_stream);
    tcase_add_test(bad, no_stop);
    tcase_add_test(bad, huge_length_field);
    tcase_add_test(bad, invalid_utf8);
    tcase_add_test(bad, unknown_opcode);
    tcase_add_test(bad, protocol_too_new);
    tcase_add_test(bad, ext_opcodes_unsupported);
    tcase_add_test(bad, out_of_band_buffer_unsupported);
    tcase_add_test(bad, readonly_buffer_needs_bytes);
    tcase_add_test(bad, ext2_ext4_unsupported);
    tcase_add_test(bad, text_persid_is_not_a_storage);
    tcase_add_test(bad, mark_bomb_hits_the_limit);
    tcase_add_test(bad, memo_limit);
    tcase_add_test(bad, stack_limit);
    tcase_add_test(bad, items_limit);
    tcase_add_test(bad, pickle_size_limit);
    tcase_add_test(bad, depth_limit_while_reading);
    tcase_add_test(bad, decimal_digit_limit);
    suite_add_tcase(s, bad);
    TCase *fd = tcase_create("feeds");
    tcase_add_checked_fixture(fd, setup, teardown);
    tcase_add_test(fd, frame_ending_inside_an_argument);
    tcase_add_test(fd, readline_crossing_a_frame_end);
    tcase_add_test(fd, nested_frame_longer_than_what_is_left);
    tcase_add_test(fd, frame_of_zero_bytes);
    tcase_add_test(fd, stop_inside_a_frame);
    tcase_add_test(fd, stop_ending_a_frame);
    tcase_add_test(fd, binbytes_read_into_stays_contiguous);
    tcase_add_test(fd, stack_global_computed_by_a_call);
    tcase_add_test(fd, getattr_on_a_call_result);
    tcase_add_test(fd, int_text_as_strtol_then_int);
    tcase_add_test(fd, memo_index_line_as_int_base_10);
    tcase_add_test(fd, ext_reads_its_code_first);
    tcase_add_test(fd, setitems_target_below_the_enclosing_mark);
    suite_add_tcase(s, fd);
    TCase *wo = tcase_create("weights_only");
    tcase_add_test(wo, wo_allow_lists);
    tcase_add_test(wo, wo_accepts_plain_data);
    tcase_add_test(wo, wo_globals);
    tcase_add_test(wo, wo_opcodes);
    tcase_add_test(wo, wo_targets);
    tcase_add_test(wo, wo_persistent_ids);
    suite_add_tcase(s, wo);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
