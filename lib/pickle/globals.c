/* globals.c - the three classes of pickle globals (doc/safety.md 2): interpreted,
 * known plain data, and everything else.  Nothing is ever imported. */
#include "pickle/pickle.h"

#include <stdio.h>
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

bool ckpt_tensor_type_known(const char *q)
{
    size_t n = strlen(q);
    if (n <= 6 || n >= 64 || strcmp(q + n - 6, "Tensor") != 0)
        return false;
    char st[80];
    snprintf(st, sizeof st, "%.*sStorage", (int)(n - 6), q);
    const char *short_name;
    return ckpt_storage_type_dtype(st, &short_name) != CKPT_DTYPE_UNKNOWN &&
           strcmp(short_name, "UntypedStorage") != 0;
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
    "builtins.slice", "builtins.range", "builtins.Ellipsis", "builtins.NotImplemented",
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

/* ---- torch.distributed.checkpoint (formats/dcp.c) ---------------------------
 * The records of a DCP folder's .metadata (doc/distributed-formats.md
 * 1.2): plain data, read as records by formats/dcp.c, kept opaque elsewhere. */
static const char *const dcp_known_data[] = {
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib._local.PosixPath",
    "pathlib._local.WindowsPath",
};

/* ---- per-rank FSDP files (pickle/rebuild.c: rebuild_sharded) ------------------
 * torch.save of a state dict holding ShardedTensors (FSDP1 SHARDED_STATE_DICT)
 * or DTensors (FSDP2), doc/distributed-formats.md 3.3 and 3.5: records
 * of plain data around each rank's local shard. */
static const char *const fsdp_known_data[] = {
    "torch.distributed._shard.sharded_tensor.api.ShardedTensor",
    "torch.distributed._shard.sharded_tensor.shard.Shard",
    "torch.distributed._shard.metadata.ShardMetadata",
    "torch.distributed.remote_device._remote_device",
    "torch.distributed._shard.sharded_tensor.metadata.ShardedTensorMetadata",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
    "torch.distributed._shard.sharding_spec.api.EnumerableShardingSpec",
    "torch.distributed._shard.sharding_spec.chunk_sharding_spec.ChunkShardingSpec",
    "torch.distributed.tensor.DTensor",
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta",
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed.tensor.placement_types._StridedShard",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed._mesh_layout._FlatLayout",
};
/* ---- end of per-rank FSDP files ------------------------------------------- */

/* getattr(class, attribute) pairs that are data, for every reader and for
 * scan (builtins.getattr is otherwise never admitted): Python >= 3.11
 * pickles an enum member by name (getattr(_MEM_FORMAT_ENCODING,
 * 'TORCH_CONTIGUOUS_FORMAT')); DeepSpeed's are listed here too, beside DCP's. */
static const char *const getattr_known[][2] = {
    {"torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING", "TORCH_CONTIGUOUS_FORMAT"},
    {"torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING", "TORCH_CHANNELS_LAST"},
    {"torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING", "TORCH_PRESERVE_FORMAT"},
    /* DeepSpeed's ZeroStageEnum as Python 3.11+ pickles it */
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "disabled"},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "optimizer_states"},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "gradients"},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "weights"},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", "max_stage"},
    /* FSDP1's ShardedTensor: its state names a nested class (3.3) and
     * the memory format enum member of its TensorProperties */
    {"torch.distributed._shard.sharded_tensor.api.ShardedTensor", "ProcessGroupState"},
    {"torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING", "TORCH_CONTIGUOUS_FORMAT"},
    {"torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING", "TORCH_CHANNELS_LAST"},
    {"torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING", "TORCH_PRESERVE_FORMAT"},
};

bool ckpt_globals_getattr_known(const char *cls, const char *attr)
{
    for (size_t i = 0; i < sizeof(getattr_known) / sizeof(getattr_known[0]); i++)
        if (strcmp(cls, getattr_known[i][0]) == 0 && strcmp(attr, getattr_known[i][1]) == 0)
            return true;
    return false;
}
/* ---- end of torch.distributed.checkpoint ---------------------------------- */

/* Python 3.11's _compat_pickle, as data: the forward tables pickle's
 * find_class applies to protocol < 3 streams (fix_imports), and the reverse
 * tables its protocol-2 pickler writes names through. */
static const char *const name_map[][4] = {
    {"UserDict", "IterableUserDict", "collections", "UserDict"},
    {"UserDict", "UserDict", "collections", "UserDict"},
    {"UserList", "UserList", "collections", "UserList"},
    {"UserString", "UserString", "collections", "UserString"},
    {"__builtin__", "basestring", "builtins", "str"},
    {"__builtin__", "intern", "sys", "intern"},
    {"__builtin__", "long", "builtins", "int"},
    {"__builtin__", "reduce", "functools", "reduce"},
    {"__builtin__", "unichr", "builtins", "chr"},
    {"__builtin__", "unicode", "builtins", "str"},
    {"__builtin__", "xrange", "builtins", "range"},
    {"_multiprocessing", "Connection", "multiprocessing.connection", "Connection"},
    {"_socket", "fromfd", "socket", "fromfd"},
    {"exceptions", "ArithmeticError", "builtins", "ArithmeticError"},
    {"exceptions", "AssertionError", "builtins", "AssertionError"},
    {"exceptions", "AttributeError", "builtins", "AttributeError"},
    {"exceptions", "BaseException", "builtins", "BaseException"},
    {"exceptions", "BufferError", "builtins", "BufferError"},
    {"exceptions", "BytesWarning", "builtins", "BytesWarning"},
    {"exceptions", "DeprecationWarning", "builtins", "DeprecationWarning"},
    {"exceptions", "EOFError", "builtins", "EOFError"},
    {"exceptions", "EnvironmentError", "builtins", "EnvironmentError"},
    {"exceptions", "Exception", "builtins", "Exception"},
    {"exceptions", "FloatingPointError", "builtins", "FloatingPointError"},
    {"exceptions", "FutureWarning", "builtins", "FutureWarning"},
    {"exceptions", "GeneratorExit", "builtins", "GeneratorExit"},
    {"exceptions", "IOError", "builtins", "IOError"},
    {"exceptions", "ImportError", "builtins", "ImportError"},
    {"exceptions", "ImportWarning", "builtins", "ImportWarning"},
    {"exceptions", "IndentationError", "builtins", "IndentationError"},
    {"exceptions", "IndexError", "builtins", "IndexError"},
    {"exceptions", "KeyError", "builtins", "KeyError"},
    {"exceptions", "KeyboardInterrupt", "builtins", "KeyboardInterrupt"},
    {"exceptions", "LookupError", "builtins", "LookupError"},
    {"exceptions", "MemoryError", "builtins", "MemoryError"},
    {"exceptions", "NameError", "builtins", "NameError"},
    {"exceptions", "NotImplementedError", "builtins", "NotImplementedError"},
    {"exceptions", "OSError", "builtins", "OSError"},
    {"exceptions", "OverflowError", "builtins", "OverflowError"},
    {"exceptions", "PendingDeprecationWarning", "builtins", "PendingDeprecationWarning"},
    {"exceptions", "ReferenceError", "builtins", "ReferenceError"},
    {"exceptions", "RuntimeError", "builtins", "RuntimeError"},
    {"exceptions", "RuntimeWarning", "builtins", "RuntimeWarning"},
    {"exceptions", "StandardError", "builtins", "Exception"},
    {"exceptions", "StopIteration", "builtins", "StopIteration"},
    {"exceptions", "SyntaxError", "builtins", "SyntaxError"},
    {"exceptions", "SyntaxWarning", "builtins", "SyntaxWarning"},
    {"exceptions", "SystemError", "builtins", "SystemError"},
    {"exceptions", "SystemExit", "builtins", "SystemExit"},
    {"exceptions", "TabError", "builtins", "TabError"},
    {"exceptions", "TypeError", "builtins", "TypeError"},
    {"exceptions", "UnboundLocalError", "builtins", "UnboundLocalError"},
    {"exceptions", "UnicodeDecodeError", "builtins", "UnicodeDecodeError"},
    {"exceptions", "UnicodeEncodeError", "builtins", "UnicodeEncodeError"},
    {"exceptions", "UnicodeError", "builtins", "UnicodeError"},
    {"exceptions", "UnicodeTranslateError", "builtins", "UnicodeTranslateError"},
    {"exceptions", "UnicodeWarning", "builtins", "UnicodeWarning"},
    {"exceptions", "UserWarning", "builtins", "UserWarning"},
    {"exceptions", "ValueError", "builtins", "ValueError"},
    {"exceptions", "Warning", "builtins", "Warning"},
    {"exceptions", "ZeroDivisionError", "builtins", "ZeroDivisionError"},
    {"itertools", "ifilter", "builtins", "filter"},
    {"itertools", "ifilterfalse", "itertools", "filterfalse"},
    {"itertools", "imap", "builtins", "map"},
    {"itertools", "izip", "builtins", "zip"},
    {"itertools", "izip_longest", "itertools", "zip_longest"},
    {"multiprocessing", "AuthenticationError", "multiprocessing.context", "AuthenticationError"},
    {"multiprocessing", "BufferTooShort", "multiprocessing.context", "BufferTooShort"},
    {"multiprocessing", "ProcessError", "multiprocessing.context", "ProcessError"},
    {"multiprocessing", "TimeoutError", "multiprocessing.context", "TimeoutError"},
    {"multiprocessing.forking", "Popen", "multiprocessing.popen_fork", "Popen"},
    {"multiprocessing.process", "Process", "multiprocessing.context", "Process"},
    {"socket", "_socketobject", "socket", "SocketType"},
    {"urllib", "ContentTooShortError", "urllib.error", "ContentTooShortError"},
    {"urllib", "getproxies", "urllib.request", "getproxies"},
    {"urllib", "pathname2url", "urllib.request", "pathname2url"},
    {"urllib", "quote", "urllib.parse", "quote"},
    {"urllib", "quote_plus", "urllib.parse", "quote_plus"},
    {"urllib", "unquote", "urllib.parse", "unquote"},
    {"urllib", "unquote_plus", "urllib.parse", "unquote_plus"},
    {"urllib", "url2pathname", "urllib.request", "url2pathname"},
    {"urllib", "urlcleanup", "urllib.request", "urlcleanup"},
    {"urllib", "urlencode", "urllib.parse", "urlencode"},
    {"urllib", "urlopen", "urllib.request", "urlopen"},
    {"urllib", "urlretrieve", "urllib.request", "urlretrieve"},
    {"urllib2", "HTTPError", "urllib.error", "HTTPError"},
    {"urllib2", "URLError", "urllib.error", "URLError"},
    {"whichdb", "whichdb", "dbm", "whichdb"},
};
static const char *const import_map[][2] = {
    {"BaseHTTPServer", "http.server"},
    {"CGIHTTPServer", "http.server"},
    {"ConfigParser", "configparser"},
    {"Cookie", "http.cookies"},
    {"Dialog", "tkinter.dialog"},
    {"DocXMLRPCServer", "xmlrpc.server"},
    {"FileDialog", "tkinter.filedialog"},
    {"HTMLParser", "html.parser"},
    {"Queue", "queue"},
    {"ScrolledText", "tkinter.scrolledtext"},
    {"SimpleDialog", "tkinter.simpledialog"},
    {"SimpleHTTPServer", "http.server"},
    {"SimpleXMLRPCServer", "xmlrpc.server"},
    {"SocketServer", "socketserver"},
    {"StringIO", "io"},
    {"Tix", "tkinter.tix"},
    {"Tkconstants", "tkinter.constants"},
    {"Tkdnd", "tkinter.dnd"},
    {"Tkinter", "tkinter"},
    {"UserDict", "collections"},
    {"UserList", "collections"},
    {"UserString", "collections"},
    {"__builtin__", "builtins"},
    {"_abcoll", "collections.abc"},
    {"_elementtree", "xml.etree.ElementTree"},
    {"_winreg", "winreg"},
    {"anydbm", "dbm"},
    {"cPickle", "pickle"},
    {"cStringIO", "io"},
    {"commands", "subprocess"},
    {"cookielib", "http.cookiejar"},
    {"copy_reg", "copyreg"},
    {"dbhash", "dbm.bsd"},
    {"dbm", "dbm.ndbm"},
    {"dumbdbm", "dbm.dumb"},
    {"dummy_thread", "_dummy_thread"},
    {"gdbm", "dbm.gnu"},
    {"htmlentitydefs", "html.entities"},
    {"httplib", "http.client"},
    {"markupbase", "_markupbase"},
    {"repr", "reprlib"},
    {"robotparser", "urllib.robotparser"},
    {"test.test_support", "test.support"},
    {"thread", "_thread"},
    {"tkColorChooser", "tkinter.colorchooser"},
    {"tkCommonDialog", "tkinter.commondialog"},
    {"tkFileDialog", "tkinter.filedialog"},
    {"tkFont", "tkinter.font"},
    {"tkMessageBox", "tkinter.messagebox"},
    {"tkSimpleDialog", "tkinter.simpledialog"},
    {"ttk", "tkinter.ttk"},
    {"urllib2", "urllib.request"},
    {"urlparse", "urllib.parse"},
    {"whichdb", "dbm"},
    {"xmlrpclib", "xmlrpc.client"},
};
static const char *const rev_name_map[][4] = {
    {"_functools", "reduce", "__builtin__", "reduce"},
    {"_socket", "socket", "socket", "_socketobject"},
    {"builtins", "ArithmeticError", "exceptions", "ArithmeticError"},
    {"builtins", "AssertionError", "exceptions", "AssertionError"},
    {"builtins", "AttributeError", "exceptions", "AttributeError"},
    {"builtins", "BaseException", "exceptions", "BaseException"},
    {"builtins", "BrokenPipeError", "exceptions", "OSError"},
    {"builtins", "BufferError", "exceptions", "BufferError"},
    {"builtins", "BytesWarning", "exceptions", "BytesWarning"},
    {"builtins", "ChildProcessError", "exceptions", "OSError"},
    {"builtins", "ConnectionAbortedError", "exceptions", "OSError"},
    {"builtins", "ConnectionError", "exceptions", "OSError"},
    {"builtins", "ConnectionRefusedError", "exceptions", "OSError"},
    {"builtins", "ConnectionResetError", "exceptions", "OSError"},
    {"builtins", "DeprecationWarning", "exceptions", "DeprecationWarning"},
    {"builtins", "EOFError", "exceptions", "EOFError"},
    {"builtins", "EnvironmentError", "exceptions", "EnvironmentError"},
    {"builtins", "Exception", "exceptions", "Exception"},
    {"builtins", "FileExistsError", "exceptions", "OSError"},
    {"builtins", "FileNotFoundError", "exceptions", "OSError"},
    {"builtins", "FloatingPointError", "exceptions", "FloatingPointError"},
    {"builtins", "FutureWarning", "exceptions", "FutureWarning"},
    {"builtins", "GeneratorExit", "exceptions", "GeneratorExit"},
    {"builtins", "IOError", "exceptions", "IOError"},
    {"builtins", "ImportError", "exceptions", "ImportError"},
    {"builtins", "ImportWarning", "exceptions", "ImportWarning"},
    {"builtins", "IndentationError", "exceptions", "IndentationError"},
    {"builtins", "IndexError", "exceptions", "IndexError"},
    {"builtins", "InterruptedError", "exceptions", "OSError"},
    {"builtins", "IsADirectoryError", "exceptions", "OSError"},
    {"builtins", "KeyError", "exceptions", "KeyError"},
    {"builtins", "KeyboardInterrupt", "exceptions", "KeyboardInterrupt"},
    {"builtins", "LookupError", "exceptions", "LookupError"},
    {"builtins", "MemoryError", "exceptions", "MemoryError"},
    {"builtins", "ModuleNotFoundError", "exceptions", "ImportError"},
    {"builtins", "NameError", "exceptions", "NameError"},
    {"builtins", "NotADirectoryError", "exceptions", "OSError"},
    {"builtins", "NotImplementedError", "exceptions", "NotImplementedError"},
    {"builtins", "OSError", "exceptions", "OSError"},
    {"builtins", "OverflowError", "exceptions", "OverflowError"},
    {"builtins", "PendingDeprecationWarning", "exceptions", "PendingDeprecationWarning"},
    {"builtins", "PermissionError", "exceptions", "OSError"},
    {"builtins", "ProcessLookupError", "exceptions", "OSError"},
    {"builtins", "ReferenceError", "exceptions", "ReferenceError"},
    {"builtins", "RuntimeError", "exceptions", "RuntimeError"},
    {"builtins", "RuntimeWarning", "exceptions", "RuntimeWarning"},
    {"builtins", "StopIteration", "exceptions", "StopIteration"},
    {"builtins", "SyntaxError", "exceptions", "SyntaxError"},
    {"builtins", "SyntaxWarning", "exceptions", "SyntaxWarning"},
    {"builtins", "SystemError", "exceptions", "SystemError"},
    {"builtins", "SystemExit", "exceptions", "SystemExit"},
    {"builtins", "TabError", "exceptions", "TabError"},
    {"builtins", "TimeoutError", "exceptions", "OSError"},
    {"builtins", "TypeError", "exceptions", "TypeError"},
    {"builtins", "UnboundLocalError", "exceptions", "UnboundLocalError"},
    {"builtins", "UnicodeDecodeError", "exceptions", "UnicodeDecodeError"},
    {"builtins", "UnicodeEncodeError", "exceptions", "UnicodeEncodeError"},
    {"builtins", "UnicodeError", "exceptions", "UnicodeError"},
    {"builtins", "UnicodeTranslateError", "exceptions", "UnicodeTranslateError"},
    {"builtins", "UnicodeWarning", "exceptions", "UnicodeWarning"},
    {"builtins", "UserWarning", "exceptions", "UserWarning"},
    {"builtins", "ValueError", "exceptions", "ValueError"},
    {"builtins", "Warning", "exceptions", "Warning"},
    {"builtins", "ZeroDivisionError", "exceptions", "ZeroDivisionError"},
    {"builtins", "chr", "__builtin__", "unichr"},
    {"builtins", "filter", "itertools", "ifilter"},
    {"builtins", "int", "__builtin__", "long"},
    {"builtins", "map", "itertools", "imap"},
    {"builtins", "range", "__builtin__", "xrange"},
    {"builtins", "str", "__builtin__", "unicode"},
    {"builtins", "zip", "itertools", "izip"},
    {"collections", "UserDict", "UserDict", "IterableUserDict"},
    {"collections", "UserList", "UserList", "UserList"},
    {"collections", "UserString", "UserString", "UserString"},
    {"dbm", "whichdb", "whichdb", "whichdb"},
    {"functools", "reduce", "__builtin__", "reduce"},
    {"http.server", "CGIHTTPRequestHandler", "CGIHTTPServer", "CGIHTTPRequestHandler"},
    {"http.server", "SimpleHTTPRequestHandler", "SimpleHTTPServer", "SimpleHTTPRequestHandler"},
    {"itertools", "filterfalse", "itertools", "ifilterfalse"},
    {"itertools", "zip_longest", "itertools", "izip_longest"},
    {"multiprocessing.connection", "Connection", "_multiprocessing", "Connection"},
    {"multiprocessing.context", "AuthenticationError", "multiprocessing", "AuthenticationError"},
    {"multiprocessing.context", "BufferTooShort", "multiprocessing", "BufferTooShort"},
    {"multiprocessing.context", "Process", "multiprocessing.process", "Process"},
    {"multiprocessing.context", "ProcessError", "multiprocessing", "ProcessError"},
    {"multiprocessing.context", "TimeoutError", "multiprocessing", "TimeoutError"},
    {"multiprocessing.popen_fork", "Popen", "multiprocessing.forking", "Popen"},
    {"socket", "fromfd", "_socket", "fromfd"},
    {"sys", "intern", "__builtin__", "intern"},
    {"tkinter.filedialog", "FileDialog", "FileDialog", "FileDialog"},
    {"tkinter.filedialog", "LoadFileDialog", "FileDialog", "LoadFileDialog"},
    {"tkinter.filedialog", "SaveFileDialog", "FileDialog", "SaveFileDialog"},
    {"tkinter.simpledialog", "SimpleDialog", "SimpleDialog", "SimpleDialog"},
    {"urllib.error", "ContentTooShortError", "urllib", "ContentTooShortError"},
    {"urllib.error", "HTTPError", "urllib2", "HTTPError"},
    {"urllib.error", "URLError", "urllib2", "URLError"},
    {"urllib.parse", "quote", "urllib", "quote"},
    {"urllib.parse", "quote_plus", "urllib", "quote_plus"},
    {"urllib.parse", "unquote", "urllib", "unquote"},
    {"urllib.parse", "unquote_plus", "urllib", "unquote_plus"},
    {"urllib.parse", "urlencode", "urllib", "urlencode"},
    {"urllib.request", "getproxies", "urllib", "getproxies"},
    {"urllib.request", "pathname2url", "urllib", "pathname2url"},
    {"urllib.request", "url2pathname", "urllib", "url2pathname"},
    {"urllib.request", "urlcleanup", "urllib", "urlcleanup"},
    {"urllib.request", "urlopen", "urllib", "urlopen"},
    {"urllib.request", "urlretrieve", "urllib", "urlretrieve"},
    {"xmlrpc.server", "DocCGIXMLRPCRequestHandler", "DocXMLRPCServer", "DocCGIXMLRPCRequestHandler"},
    {"xmlrpc.server", "DocXMLRPCRequestHandler", "DocXMLRPCServer", "DocXMLRPCRequestHandler"},
    {"xmlrpc.server", "DocXMLRPCServer", "DocXMLRPCServer", "DocXMLRPCServer"},
    {"xmlrpc.server", "ServerHTMLDoc", "DocXMLRPCServer", "ServerHTMLDoc"},
    {"xmlrpc.server", "XMLRPCDocGenerator", "DocXMLRPCServer", "XMLRPCDocGenerator"},
};
static const char *const rev_import_map[][2] = {
    {"_bz2", "bz2"},
    {"_dbm", "dbm"},
    {"_dummy_thread", "dummy_thread"},
    {"_functools", "functools"},
    {"_gdbm", "gdbm"},
    {"_markupbase", "markupbase"},
    {"_pickle", "pickle"},
    {"_thread", "thread"},
    {"builtins", "__builtin__"},
    {"collections.abc", "_abcoll"},
    {"configparser", "ConfigParser"},
    {"copyreg", "copy_reg"},
    {"dbm", "anydbm"},
    {"dbm.bsd", "dbhash"},
    {"dbm.dumb", "dumbdbm"},
    {"dbm.gnu", "gdbm"},
    {"dbm.ndbm", "dbm"},
    {"html.entities", "htmlentitydefs"},
    {"html.parser", "HTMLParser"},
    {"http.client", "httplib"},
    {"http.cookiejar", "cookielib"},
    {"http.cookies", "Cookie"},
    {"http.server", "BaseHTTPServer"},
    {"queue", "Queue"},
    {"reprlib", "repr"},
    {"socketserver", "SocketServer"},
    {"subprocess", "commands"},
    {"test.support", "test.test_support"},
    {"tkinter", "Tkinter"},
    {"tkinter.colorchooser", "tkColorChooser"},
    {"tkinter.commondialog", "tkCommonDialog"},
    {"tkinter.constants", "Tkconstants"},
    {"tkinter.dialog", "Dialog"},
    {"tkinter.dnd", "Tkdnd"},
    {"tkinter.filedialog", "tkFileDialog"},
    {"tkinter.font", "tkFont"},
    {"tkinter.messagebox", "tkMessageBox"},
    {"tkinter.scrolledtext", "ScrolledText"},
    {"tkinter.simpledialog", "tkSimpleDialog"},
    {"tkinter.tix", "Tix"},
    {"tkinter.ttk", "ttk"},
    {"urllib.parse", "urlparse"},
    {"urllib.request", "urllib2"},
    {"urllib.robotparser", "robotparser"},
    {"winreg", "_winreg"},
    {"xmlrpc.client", "xmlrpclib"},
    {"xmlrpc.server", "SimpleXMLRPCServer"},
};

#define N_OF(t) (sizeof(t) / sizeof((t)[0]))

static bool map_name(const char *const (*names)[4], size_t nn, const char *const (*mods)[2],
                     size_t nm, const char *mod, const char *name, const char **mod_out,
                     const char **name_out)
{
    *mod_out = mod;
    *name_out = name;
    for (size_t i = 0; i < nn; i++)
        if (strcmp(mod, names[i][0]) == 0 && strcmp(name, names[i][1]) == 0) {
            *mod_out = names[i][2];
            *name_out = names[i][3];
            return true;
        }
    for (size_t i = 0; i < nm; i++)
        if (strcmp(mod, mods[i][0]) == 0) {
            *mod_out = mods[i][1];
            return true;
        }
    return false;
}

bool ckpt_globals_py3_name(const char *mod, const char *name, const char **mod3,
                           const char **name3)
{
    return map_name(name_map, N_OF(name_map), import_map, N_OF(import_map), mod, name, mod3,
                    name3);
}

static bool reads_back(const char *m2, const char *n2, const char *mod, const char *name)
{
    const char *m3, *n3;
    ckpt_globals_py3_name(m2, n2, &m3, &n3);
    return strcmp(m3, mod) == 0 && strcmp(n3, name) == 0;
}

bool ckpt_globals_py2_name(const char *mod, const char *name, const char **mod2,
                           const char **name2)
{
    /* as Python's protocol-2 pickler (REVERSE_NAME_MAPPING, then
     * REVERSE_IMPORT_MAPPING), where that spelling reads back as this name;
     * Python's few lossy ones (builtins.FileNotFoundError ->
     * exceptions.OSError) are not taken */
    if (map_name(rev_name_map, N_OF(rev_name_map), rev_import_map, N_OF(rev_import_map), mod,
                 name, mod2, name2) &&
        reads_back(*mod2, *name2, mod, name))
        return true;
    *mod2 = mod;
    *name2 = name;
    return reads_back(mod, name, mod, name);
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

/* ---- DeepSpeed ZeRO checkpoints (doc/distributed-formats.md 4.2-4.3) ----
 * The classes a ZeRO optim file pickles, all plain records: the stage enum
 * (ZeroStageEnum(n), or getattr(ZeroStageEnum, 'optimizer_states') as the
 * enum pickles itself under Python 3.11+), the loss scalers (NEWOBJ + BUILD
 * of {cur_scale, dynamic, ...}) and fragment_address (NEWOBJ + BUILD of
 * {numel, start}).  Never imported; kept as opaque nodes. */
static const char *const deepspeed_data[] = {
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
};
/* ---- end of DeepSpeed ---- */

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
    if (in_list(q, known_data, sizeof(known_data) / sizeof(known_data[0])) ||
        in_list(q, deepspeed_data, sizeof(deepspeed_data) / sizeof(deepspeed_data[0])))
        return CKPT_GLOBAL_KNOWN_DATA;
    if (in_list(q, dcp_known_data, sizeof(dcp_known_data) / sizeof(dcp_known_data[0])) ||
        in_list(q, fsdp_known_data, sizeof(fsdp_known_data) / sizeof(fsdp_known_data[0])))
        return CKPT_GLOBAL_KNOWN_DATA;
    return CKPT_GLOBAL_REFUSED;
}
