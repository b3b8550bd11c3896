/* globals.c - the three classes of pickle globals (DESIGN.md): interpreted,
 * known plain data, and everything else.  Nothing is ever imported. */
#include "pickle/pickle.h"

#include <string.h>

static const struct {
    const char *name;
    ckpt_dtype dtype;
} storage_types[] = {
    {"DoubleStorage", CKPT_DTYPE_FLOAT64},
    {"FloatStorage", CKPT_DTYPE_FLOAT32},
    {"HalfStorage", CKPT_DTYPE_FLOAT16},
    {"BFloat16Storage", CKPT_DTYPE_BFLOAT16},
    {"LongStorage", CKPT_DTYPE_INT64},
    {"IntStorage", CKPT_DTYPE_INT32},
    {"ShortStorage", CKPT_DTYPE_INT16},
    {"CharStorage", CKPT_DTYPE_INT8},
    {"ByteStorage", CKPT_DTYPE_UINT8},
    {"BoolStorage", CKPT_DTYPE_BOOL},
    {"ComplexDoubleStorage", CKPT_DTYPE_COMPLEX128},
    {"ComplexFloatStorage", CKPT_DTYPE_COMPLEX64},
    {"QInt8Storage", CKPT_DTYPE_QINT8},
    {"QUInt8Storage", CKPT_DTYPE_QUINT8},
    {"QInt32Storage", CKPT_DTYPE_QINT32},
    {"QUInt4x2Storage", CKPT_DTYPE_QUINT4X2},
    {"QUInt2x4Storage", CKPT_DTYPE_QUINT2X4},
    {"UntypedStorage", CKPT_DTYPE_UINT8},
};

const char *ckpt_storage_type_name(ckpt_dtype dtype)
{
    /* the last entry, UntypedStorage, is no dtype's own type */
    for (size_t i = 0; i + 1 < sizeof(storage_types) / sizeof(storage_types[0]); i++)
        if (storage_types[i].dtype == dtype)
            return storage_types[i].name;
    return NULL;
}

ckpt_dtype ckpt_storage_type_dtype(const char *q, const char **short_name)
{
    const char *n;
    if (strcmp(q, "torch.storage.UntypedStorage") == 0) /* torch 2.x's v3 tensors */
        n = q + 14;
    else if (strncmp(q, "torch.cuda.", 11) == 0)
        n = q + 11;
    else if (strncmp(q, "torch.", 6) == 0)
        n = q + 6;
    else
        return CKPT_DTYPE_UNKNOWN;
    for (size_t i = 0; i < sizeof(storage_types) / sizeof(storage_types[0]); i++)
        if (strcmp(n, storage_types[i].name) == 0) {
            if (short_name)
                *short_name = storage_types[i].name;
            return storage_types[i].dtype;
        }
    return CKPT_DTYPE_UNKNOWN;
}

static const char *const interpreted[] = {
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "torch.Size",
    /* tensors of other kinds (quantized, sparse, meta) and plain tensors with
     * Python attributes: read, listed and written back as saved */
    "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_sparse_tensor",
    "torch._utils._rebuild_sparse_csr_tensor",
    "torch._utils._rebuild_meta_tensor_no_storage",
    "torch._tensor._rebuild_from_type_v2",
    "torch.serialization._get_layout",
    "torch.per_tensor_affine", "torch.per_channel_affine",
    "torch.per_tensor_symmetric", "torch.per_channel_symmetric",
    "torch.per_channel_affine_float_qparams",
    "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr",
    "torch.sparse_bsc", "torch.strided",
};

static const char *const known_data[] = {
    "argparse.Namespace",
    "builtins.set", "builtins.frozenset", "builtins.bytearray", "builtins.complex",
    "builtins.list", "builtins.dict", "builtins.tuple", "builtins.int",
    "builtins.float", "builtins.str", "builtins.bool", "builtins.bytes",
    "builtins.slice", "builtins.range",
    "_codecs.encode",
    "collections.defaultdict", "collections.Counter", "collections.deque",
    "torch.device",
    "torch.nn.parameter.Parameter",
    "torch.Tensor", /* the type of _rebuild_from_type_v2 */
    "torch._utils._rebuild_nested_tensor",
    "torch._utils._rebuild_wrapper_subclass",
    "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray._reconstruct", "numpy.core.multiarray.scalar",
    "numpy._core.multiarray._reconstruct", "numpy._core.multiarray.scalar",
};

const char *ckpt_globals_py3_module(const char *module)
{
    /* The renames pickle's fix_imports applies to protocol < 3 streams. */
    static const char *const map[][2] = {
        {"__builtin__", "builtins"}, {"copy_reg", "copyreg"},
        {"UserDict", "collections"}, {"UserList", "collections"},
        {"exceptions", "builtins"}, {"cPickle", "pickle"}, {"commands", "subprocess"},
        {"thread", "_thread"}, {"httplib", "http.client"}, {"urllib2", "urllib.request"},
        {"StringIO", "io"}, {"cStringIO", "io"}, {"Queue", "queue"},
        {"SocketServer", "socketserver"}, {"ConfigParser", "configparser"},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(module, map[i][0]) == 0)
            return map[i][1];
    return module;
}

/* Globals that run commands or code: refused even when the user admits
 * unknown globals or names them, so that no rewrite can carry them on. */
bool ckpt_globals_dangerous(const char *q)
{
    /* documented in ckpt-scan(1): keep the two lists in step */
    static const char *const prefixes[] = {
        "os.", "posix.", "nt.", "sys.", "subprocess.", "_posixsubprocess.", "shutil.",
        "socket.", "importlib.", "runpy.", "pty.", "webbrowser.", "ctypes.", "pickle.",
        "_pickle.", "marshal.", "code.", "codeop.", "pdb.", "bdb.", "timeit.", "profile.",
        "cProfile.", "trace.", "multiprocessing.", "asyncio.", "platform.", "pydoc.",
        "commands.", "torch.hub.", "torch.jit.", "torch._C.", "torch.classes."};
    static const char *const names[] = {
        "builtins.eval", "builtins.exec", "builtins.compile", "builtins.__import__",
        "builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.open",
        "builtins.globals", "builtins.locals", "builtins.vars", "builtins.breakpoint",
        "builtins.input", "builtins.memoryview", "operator.attrgetter",
        "operator.methodcaller", "operator.itemgetter", "functools.reduce",
        "torch.load", "torch.save", "numpy.load", "numpy.save",
        "numpy.testing._private.utils.runstring", "numpy.f2py.diagnose.run_command",
        "builtins.reduce", "builtins.intern", "types.FunctionType", "types.CodeType",
        "types.MethodType"};
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
        if (strncmp(q, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(q, names[i]) == 0)
            return true;
    return false;
}

static bool in_list(const char *q, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(q, list[i]) == 0)
            return true;
    return false;
}

ckpt_global_class ckpt_globals_builtin_class(const char *q)
{
    if (in_list(q, interpreted, sizeof(interpreted) / sizeof(interpreted[0])))
        return CKPT_GLOBAL_INTERPRETED;
    if (ckpt_storage_type_dtype(q, NULL) != CKPT_DTYPE_UNKNOWN)
        return CKPT_GLOBAL_INTERPRETED;
    /* dtypes: torch.float32, torch.bfloat16, torch.half, ... (not the
     * float6 types, which only safetensors has: torch has no such attribute) */
    ckpt_dtype dt;
    if (strncmp(q, "torch.", 6) == 0 && strchr(q + 6, '.') == NULL &&
        (dt = ckpt_dtype_from_name(q)) != CKPT_DTYPE_UNKNOWN && ckpt_dtype_bits(dt) % 8 == 0)
        return CKPT_GLOBAL_INTERPRETED;
    if (in_list(q, known_data, sizeof(known_data) / sizeof(known_data[0])))
        return CKPT_GLOBAL_KNOWN_DATA;
    return CKPT_GLOBAL_REFUSED;
}
