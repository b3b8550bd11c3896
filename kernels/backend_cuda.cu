// backend_cuda.cu - the CUDA backend of the model runtime ("cuda:N";
// float32, NCHW): cuBLAS for the matrix products, cuDNN for the
// convolutions when it is there, small kernels for everything else, one
// stream per backend.  It is built as the module
// libckpt_cuda.so, whose only export is the table ckpt_cuda_module_entry
// (ckpt_cuda.h: this backend's descriptor and the device calls);
// lib/runtime/backend_cuda.c loads it with dlopen and checks its ABI.
//
// cuBLAS is dlopen'ed when the first backend is opened, never linked:
// linking it costs every ckpt process about 0.5 s and 200 MB at start,
// whether it uses a GPU or not.  Only the C ABI of a few functions is
// needed, so the prototypes are declared here and the build needs no
// cuBLAS headers either.
//
// Results are deterministic on a given GPU: no atomics in the results (the
// one atomic, embedding's bad-id record, keeps a minimum), every reduction
// runs in a fixed order, cuBLAS gets a single stream (its documented
// condition for bitwise reproducibility), and cuDNN's algorithms are the
// deterministic ones, chosen without timing.  TF32 is used only when asked
// (CKPT_BACKEND_TF32); else cuBLAS runs in pedantic math mode and cuDNN in
// CUDNN_FMA_MATH.
//
// Errors: every CUDA and cuBLAS call is checked and becomes CKPT_ERR_DEVICE
// with a message in b->message; nothing prints or aborts.  Kernel faults
// surface at the next call that waits (download, synchronize).

#include "config.h"
#include "ckpt.h"
#include "ckpt_cuda.h"
#include "cuda_device.h"
#include "runtime/backend.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- cuBLAS: its C ABI -------------------------------------------------------

// The C ABI of the few cuBLAS calls we use (cublas_api.h): handles are
// pointers, enums are passed as int.
typedef struct ckpt_cublas_context *ckpt_cublas_handle;
enum {
    CKPT_CUBLAS_STATUS_SUCCESS = 0,
    CKPT_CUBLAS_OP_N = 0,
    CKPT_CUBLAS_OP_T = 1,
    CKPT_CUBLAS_DEFAULT_MATH = 0,
    CKPT_CUBLAS_PEDANTIC_MATH = 2,
    CKPT_CUBLAS_TF32_TENSOR_OP_MATH = 3,
};

typedef struct ckpt_cublas_api {
    int (*create)(ckpt_cublas_handle *handle);
    int (*destroy)(ckpt_cublas_handle handle);
    int (*set_stream)(ckpt_cublas_handle handle, cudaStream_t stream);
    int (*set_math_mode)(ckpt_cublas_handle handle, int mode);
    int (*sgemm)(ckpt_cublas_handle handle, int transa, int transb, int m, int n, int k,
                 const float *alpha, const float *a, int lda, const float *b, int ldb,
                 const float *beta, float *c, int ldc);
    int (*sgemm_strided_batched)(ckpt_cublas_handle handle, int transa, int transb, int m,
                                 int n, int k, const float *alpha, const float *a, int lda,
                                 long long stride_a, const float *b, int ldb,
                                 long long stride_b, const float *beta, float *c, int ldc,
                                 long long stride_c, int batch_count);
    // optional (absent from old releases)
    const char *(*status_string)(int status);
    int (*get_version)(ckpt_cublas_handle handle, int *version);
} ckpt_cublas_api;

// ---- where pip and conda put NVIDIA's libraries ------------------------------
//
// cuBLAS and cuDNN are looked for, after the loader's own search, where a
// Python user has them: NVIDIA's pip packages (torch's dependencies) put
// them in SITE/nvidia/<pkg>/lib (nvidia-cublas-cu12, nvidia-cudnn-cu13) or
// SITE/nvidia/cu13/lib (CUDA 13's merged layout), SITE being a Python's
// site-packages (dist-packages on Debian); conda puts them in PREFIX/lib.
// The places, first found wins: the folders above this module (a wheel's
// SITE/ckpt_toolkit/_native/lib/libckpt_cuda.so: its SITE, also with pip
// --target), then the prefixes of $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local,
// the python3* found on $PATH (its folder's prefix, and its real file's),
// /usr/local and /usr.  One search serves both libraries: each passes the
// paths under SITE it accepts and a function that loads and binds one.

// Loads and binds the library at PATH: 0, or -1 (the caller's note kept).
typedef int (*lib_try_fn)(const char *path);

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// FN on each existing match of PAT, last first (glob sorts: python3.12
// before python3.11).
static int lib_try_glob(const char *pat, lib_try_fn fn)
{
    glob_t gl;
    if (glob(pat, 0, NULL, &gl) != 0)
        return -1;
    int ok = -1;
    for (size_t k = gl.gl_pathc; k-- > 0 && ok != 0;)
        if (is_file(gl.gl_pathv[k]))
            ok = fn(gl.gl_pathv[k]);
    globfree(&gl);
    return ok;
}

// RELS (paths under a site-packages, NULL-ended) in the Python prefix
// PREFIX's site folders, then each one's file name in PREFIX/lib (conda).
static int lib_try_prefix(const char *prefix, const char *const *rels, lib_try_fn fn)
{
    static const char *const sites[] = {
        "%s/lib/python3*/site-packages/%s",
        "%s/lib/python3*/dist-packages/%s",
        "%s/local/lib/python3*/dist-packages/%s",
    };
    if (!prefix || !prefix[0])
        return -1;
    char pat[PATH_MAX];
    for (size_t i = 0; i < sizeof sites / sizeof sites[0]; i++)
        for (const char *const *r = rels; *r; r++)
            if (snprintf(pat, sizeof pat, sites[i], prefix, *r) < (int)sizeof pat &&
                lib_try_glob(pat, fn) == 0)
                return 0;
    for (const char *const *r = rels; *r; r++) {
        const char *base = strrchr(*r, '/');
        if (snprintf(pat, sizeof pat, "%s/lib/%s", prefix, base ? base + 1 : *r) <
                (int)sizeof pat &&
            is_file(pat) && fn(pat) == 0)
            return 0;
    }
    return -1;
}

// The folders above this module, up to four (a wheel's lib, _native,
// ckpt_toolkit, then its site-packages): RELS under each.
static int lib_try_own_site(const char *const *rels, lib_try_fn fn)
{
    Dl_info info;
    char dir[PATH_MAX];
    if (!dladdr((void *)lib_try_own_site, &info) || !info.dli_fname ||
        !realpath(info.dli_fname, dir))
        return -1;
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir)
            return -1;
        *slash = '\0';
        for (const char *const *r = rels; *r; r++) {
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", dir, *r) < (int)sizeof path &&
                is_file(path) && fn(path) == 0)
                return 0;
        }
    }
    return -1;
}

// The prefixes of the python3* programs on $PATH: DIR/.. (a venv's bin
// links to the system's python, its packages are under the venv) and the
// real file's prefix.
static int lib_try_path_pythons(const char *const *rels, lib_try_fn fn)
{
    const char *path = getenv("PATH");
    if (!path)
        return -1;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL;
    for (char *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        char pat[PATH_MAX];
        if (!dir[0] || snprintf(pat, sizeof pat, "%s/python3*", dir) >= (int)sizeof pat)
            continue;
        glob_t gl;
        if (glob(pat, 0, NULL, &gl) != 0)
            continue;
        int found = gl.gl_pathc > 0;
        char real[PATH_MAX] = "";
        if (found && !realpath(gl.gl_pathv[0], real))
            real[0] = '\0';
        globfree(&gl);
        if (!found)
            continue;
        char prefix[PATH_MAX];
        snprintf(prefix, sizeof prefix, "%s/..", dir);
        if (lib_try_prefix(prefix, rels, fn) == 0)
            return 0;
        char *slash = strrchr(real, '/');
        if (slash) { // /usr/bin/python3.12 -> /usr
            *slash = '\0';
            slash = strrchr(real, '/');
            if (slash && slash != real) {
                *slash = '\0';
                if (lib_try_prefix(real, rels, fn) == 0)
                    return 0;
            }
        }
    }
    return -1;
}

// The whole search above, in its order: 0 when FN loaded one.
static int lib_search_python(const char *const *rels, lib_try_fn fn)
{
    if (lib_try_own_site(rels, fn) == 0)
        return 0;
    const char *envs[] = {"VIRTUAL_ENV", "CONDA_PREFIX"};
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++)
        if (lib_try_prefix(getenv(envs[i]), rels, fn) == 0)
            return 0;
    const char *home = getenv("HOME");
    if (home && home[0]) {
        char local[PATH_MAX];
        snprintf(local, sizeof local, "%s/.local", home);
        if (lib_try_prefix(local, rels, fn) == 0)
            return 0;
    }
    return lib_try_path_pythons(rels, fn) == 0 || lib_try_prefix("/usr/local", rels, fn) == 0 ||
                   lib_try_prefix("/usr", rels, fn) == 0
               ? 0
               : -1;
}

// ---- cuBLAS, loaded at run time ---------------------------------------------

// Loaded once per process and never unloaded: cuBLAS keeps process-wide
// state, and unloading CUDA libraries is not reliable.
static pthread_once_t cublas_once = PTHREAD_ONCE_INIT;
static ckpt_cublas_api cublas_api;
static int cublas_loaded;
static char cublas_error[400];

// dlopen PATH (a file name alone: the loader's search) into cublas_lib;
// the first failure's text is kept for the message.
static void *cublas_lib;
static char cublas_first_error[240];

static int cublas_try(const char *path)
{
    static int error_of_file;
    cublas_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const char *e = cublas_lib ? NULL : dlerror();
    // a file that is there but does not load says why (libcublasLt not
    // beside it), ahead of a name the loader did not find
    int of_file = strchr(path, '/') && is_file(path);
    if (e && (!cublas_first_error[0] || (of_file && !error_of_file))) {
        snprintf(cublas_first_error, sizeof cublas_first_error, "%s", e);
        error_of_file = of_file;
    }
    return cublas_lib ? 0 : -1;
}

static void cublas_load(void)
{
    // The toolkit configure found comes first: it matches the CUDA runtime
    // we link (statically: cudaRuntimeGetVersion is this build's).  Then
    // the loader's search path (a Python process that imported torch has
    // its cuBLAS loaded already, found by name), newest release first; then
    // NVIDIA's pip packages and conda (lib_search_python); last the CUDA
    // toolkit's usual folders.
    int major = 0, version = 0;
    if (cudaRuntimeGetVersion(&version) == cudaSuccess)
        major = version / 1000;
    char name[64];
    snprintf(name, sizeof name, "libcublas.so.%d", major > 0 ? major : 13);
#ifdef CKPT_CUDA_LIBDIR
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", CKPT_CUDA_LIBDIR, name);
    if (cublas_try(path) == 0)
        goto found;
#endif
    if (cublas_try(name) == 0 || cublas_try("libcublas.so.13") == 0 ||
        cublas_try("libcublas.so.12") == 0)
        goto found;
    {
        static const char *const rels13[] = {"nvidia/cu13/lib/libcublas.so.13",
                                             "nvidia/cublas/lib/libcublas.so.13", NULL};
        static const char *const rels12[] = {"nvidia/cublas/lib/libcublas.so.12",
                                             "nvidia/cu12/lib/libcublas.so.12", NULL};
        if (lib_search_python(major == 12 ? rels12 : rels13, cublas_try) == 0 ||
            lib_search_python(major == 12 ? rels13 : rels12, cublas_try) == 0)
            goto found;
        const char *const dirs[] = {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"};
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/%s", dirs[i], name);
            if (is_file(p) && cublas_try(p) == 0)
                goto found;
        }
    }
    if (cublas_try("libcublas.so") == 0)
        goto found;
    snprintf(cublas_error, sizeof cublas_error,
             "cannot load cuBLAS (%s; looked for by the loader, in NVIDIA's pip packages and "
             "in /usr/local/cuda): %s",
             name, cublas_first_error[0] ? cublas_first_error : "not found");
    return;

found:
    void *lib = cublas_lib;
    struct {
        const char *name;
        void **slot;
        int required;
    } syms[] = {
        {"cublasCreate_v2", (void **)&cublas_api.create, 1},
        {"cublasDestroy_v2", (void **)&cublas_api.destroy, 1},
        {"cublasSetStream_v2", (void **)&cublas_api.set_stream, 1},
        {"cublasSetMathMode", (void **)&cublas_api.set_math_mode, 1},
        {"cublasSgemm_v2", (void **)&cublas_api.sgemm, 1},
        {"cublasSgemmStridedBatched", (void **)&cublas_api.sgemm_strided_batched, 1},
        {"cublasGetStatusString", (void **)&cublas_api.status_string, 0},
        {"cublasGetVersion_v2", (void **)&cublas_api.get_version, 0},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot && syms[i].required) {
            snprintf(cublas_error, sizeof cublas_error, "cuBLAS lacks %s (too old?)",
                     syms[i].name);
            memset(&cublas_api, 0, sizeof cublas_api);
            return; // the library stays loaded; harmless
        }
    }
    cublas_loaded = 1;
}

static const char *cublas_status_text(int status)
{
    if (cublas_api.status_string) {
        const char *s = cublas_api.status_string(status);
        if (s)
            return s;
    }
    switch (status) {
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown cuBLAS status";
    }
}

// ---- cuDNN, loaded at run time ---------------------------------------------
//
// The convolutions run through cuDNN when it can be loaded (conv2d through
// cudnnConvolutionForward, conv_transpose2d through
// cudnnConvolutionBackwardData), else through im2col / col2im and SGEMM
// below, op by op: a shape cuDNN finds no algorithm for stays on those.
// As cuBLAS, it is dlopen'ed, never linked (libcudnn.so.9 and its engines
// are over 1 GB; a CPU-only run must not pay for them), and its types come
// from cudnn.h while each function is reached through a pointer of the
// header's own type (decltype: no symbol of libcudnn is referenced).  A
// build without cudnn.h has no cuDNN path.
//
// Where it is looked for, first loaded wins: $CKPT_CUDNN alone when it is a
// path ("0" or "off": not used at all, read at each open); the loader's
// path; then where pip puts it beside torch (nvidia-cudnn-cu13/cu12,
// SITE/nvidia/cudnn/lib), in the places lib_search_python looks (above:
// this module's own site-packages, then the prefixes a Python the user
// runs would search) -- and last the CUDA toolkit's folders.
//
// Determinism: algorithms are chosen by cuDNN's heuristics (never by timing,
// cudnnFind's choice varies between runs), the first one cuDNN marks
// CUDNN_DETERMINISTIC, once per shape.  Math: CUDNN_FMA_MATH (strict FP32)
// unless TF32 is on (CKPT_BACKEND_TF32), as torch with
// torch.backends.cudnn.allow_tf32 False / True.

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define CKPT_WITH_CUDNN 1
#else
#define CKPT_WITH_CUDNN 0
#endif

#if CKPT_WITH_CUDNN
typedef struct ckpt_cudnn_api {
    decltype(&cudnnGetVersion) get_version;
    decltype(&cudnnGetErrorString) error_string;
    decltype(&cudnnCreate) create;
    decltype(&cudnnDestroy) destroy;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnCreateTensorDescriptor) create_tensor;
    decltype(&cudnnSetTensor4dDescriptor) set_tensor;
    decltype(&cudnnDestroyTensorDescriptor) destroy_tensor;
    decltype(&cudnnCreateFilterDescriptor) create_filter;
    decltype(&cudnnSetFilter4dDescriptor) set_filter;
    decltype(&cudnnDestroyFilterDescriptor) destroy_filter;
    decltype(&cudnnCreateConvolutionDescriptor) create_conv;
    decltype(&cudnnSetConvolution2dDescriptor) set_conv;
    decltype(&cudnnSetConvolutionMathType) set_math;
    decltype(&cudnnDestroyConvolutionDescriptor) destroy_conv;
    decltype(&cudnnGetConvolutionForwardAlgorithm_v7) fwd_algos;
    decltype(&cudnnGetConvolutionForwardWorkspaceSize) fwd_workspace;
    decltype(&cudnnConvolutionForward) fwd;
    decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) bwd_algos;
    decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) bwd_workspace;
    decltype(&cudnnConvolutionBackwardData) bwd;
} ckpt_cudnn_api;

// Loaded once per process and never unloaded, as cuBLAS.
static pthread_once_t cudnn_once = PTHREAD_ONCE_INIT;
static ckpt_cudnn_api cudnn_api;
static int cudnn_loaded;
static int cudnn_version; // cudnnGetVersion(): major * 10000 + minor * 100 + patch
// Why not, short: it ends the backend's description ("no cuDNN: WHY").
static char cudnn_error[240];

static int cudnn_bind(void *lib, const char *path)
{
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cudnnGetVersion", (void **)&cudnn_api.get_version},
        {"cudnnGetErrorString", (void **)&cudnn_api.error_string},
        {"cudnnCreate", (void **)&cudnn_api.create},
        {"cudnnDestroy", (void **)&cudnn_api.destroy},
        {"cudnnSetStream", (void **)&cudnn_api.set_stream},
        {"cudnnCreateTensorDescriptor", (void **)&cudnn_api.create_tensor},
        {"cudnnSetTensor4dDescriptor", (void **)&cudnn_api.set_tensor},
        {"cudnnDestroyTensorDescriptor", (void **)&cudnn_api.destroy_tensor},
        {"cudnnCreateFilterDescriptor", (void **)&cudnn_api.create_filter},
        {"cudnnSetFilter4dDescriptor", (void **)&cudnn_api.set_filter},
        {"cudnnDestroyFilterDescriptor", (void **)&cudnn_api.destroy_filter},
        {"cudnnCreateConvolutionDescriptor", (void **)&cudnn_api.create_conv},
        {"cudnnSetConvolution2dDescriptor", (void **)&cudnn_api.set_conv},
        {"cudnnSetConvolutionMathType", (void **)&cudnn_api.set_math},
        {"cudnnDestroyConvolutionDescriptor", (void **)&cudnn_api.destroy_conv},
        {"cudnnGetConvolutionForwardAlgorithm_v7", (void **)&cudnn_api.fwd_algos},
        {"cudnnGetConvolutionForwardWorkspaceSize", (void **)&cudnn_api.fwd_workspace},
        {"cudnnConvolutionForward", (void **)&cudnn_api.fwd},
        {"cudnnGetConvolutionBackwardDataAlgorithm_v7", (void **)&cudnn_api.bwd_algos},
        {"cudnnGetConvolutionBackwardDataWorkspaceSize", (void **)&cudnn_api.bwd_workspace},
        {"cudnnConvolutionBackwardData", (void **)&cudnn_api.bwd},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(cudnn_error, sizeof cudnn_error, "%.60s lacks %s", path, syms[i].name);
            memset(&cudnn_api, 0, sizeof cudnn_api);
            return -1;
        }
    }
    // the header's major: the types and enums we compiled against
    size_t v = cudnn_api.get_version();
    if (v / 10000 != CUDNN_MAJOR) {
        snprintf(cudnn_error, sizeof cudnn_error, "%.60s is version %zu, not %d.x", path, v,
                 CUDNN_MAJOR);
        memset(&cudnn_api, 0, sizeof cudnn_api);
        return -1;
    }
    cudnn_version = (int)v;
    return 0;
}

// dlopen PATH (a file name alone: the loader's search); on success binds it.
static int cudnn_try(const char *path, char *first_error, size_t cap)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        if (!first_error[0] && e)
            snprintf(first_error, cap, "%s", e);
        // a file that is there but does not load says why (a missing
        // dependency); a name the loader did not find is not news
        if (strchr(path, '/') && !cudnn_error[0] && e)
            snprintf(cudnn_error, sizeof cudnn_error, "%.220s", e);
        return -1;
    }
    if (cudnn_bind(lib, path) != 0)
        return -1; // stays loaded: harmless, and its error is kept
    cudnn_loaded = 1;
    return 0;
}

// cudnn_try for lib_search_python: the first error in cudnn_first_error.
static char cudnn_first_error[160];
static int cudnn_try_file(const char *path)
{
    return cudnn_try(path, cudnn_first_error, sizeof cudnn_first_error);
}

static void cudnn_load(void)
{
    char *first_error = cudnn_first_error;
    const char *forced = getenv("CKPT_CUDNN");
    if (forced && forced[0] && strcmp(forced, "0") != 0 && strcmp(forced, "off") != 0) {
        // an explicit choice is never replaced by another library
        if (cudnn_try(forced, first_error, sizeof cudnn_first_error) != 0) {
            char why[sizeof cudnn_error];
            snprintf(why, sizeof why, "%s",
                     cudnn_error[0] ? cudnn_error : first_error[0] ? first_error : "no library");
            snprintf(cudnn_error, sizeof cudnn_error, "CKPT_CUDNN: %.220s", why);
        }
        return;
    }
    if (cudnn_try("libcudnn.so.9", first_error, sizeof cudnn_first_error) == 0 ||
        cudnn_try("libcudnn.so", first_error, sizeof cudnn_first_error) == 0)
        return;
    static const char *const rels[] = {"nvidia/cudnn/lib/libcudnn.so.9",
                                       "nvidia/cu13/lib/libcudnn.so.9", NULL};
    if (lib_search_python(rels, cudnn_try_file) == 0)
        return;
    const char *dirs[] = {
#ifdef CKPT_CUDA_LIBDIR
        CKPT_CUDA_LIBDIR,
#endif
        "/usr/local/cuda/lib64", "/usr/local/cuda/lib"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/libcudnn.so.9", dirs[i]);
        if (is_file(path) && cudnn_try(path, first_error, sizeof cudnn_first_error) == 0)
            return;
    }
    if (!cudnn_error[0])
        snprintf(cudnn_error, sizeof cudnn_error,
                 "libcudnn.so.9 not found (CKPT_CUDNN names it)");
}

// The file loaded (the loader's choice when it was found by name).
static void cudnn_file(char *buf, size_t cap)
{
    Dl_info info;
    if (dladdr((void *)cudnn_api.get_version, &info) && info.dli_fname)
        snprintf(buf, cap, "%s", info.dli_fname);
    else
        snprintf(buf, cap, "?");
}

static const char *cudnn_status_text(cudnnStatus_t st)
{
    const char *s = cudnn_api.error_string ? cudnn_api.error_string(st) : NULL;
    return s ? s : "unknown cuDNN status";
}
#endif // CKPT_WITH_CUDNN

// ---- backend state ------------------------------------------------------------

// The first bad token id an embedding met, kept on the device until the
// host looks (download, synchronize).  KEY: the smallest position with a
// bad id in the high 32 bits, the id's float bits in the low ones
// (atomicMin: the same answer whatever the threads' order); ~0 when none.
// OP: the serial number of the embedding call that owns KEY (the first one
// to fail; 0: none), so that a later call's ids are not mixed with its
// vocabulary.
typedef struct emb_error {
    unsigned long long key;
    unsigned long long op;
    long long vocab;
} emb_error;

// A device buffer: handed out (used) or kept for reuse.
typedef struct cuda_block {
    float *p;
    size_t bytes;
    int used;
} cuda_block;

typedef struct cuda_impl {
    int device;
    cudaStream_t stream;
    ckpt_cublas_handle cublas;
    cuda_block *blocks; // every buffer this backend owns
    size_t nblocks, capblocks;
    float *scratch; // im2col / columns, attention's scores; grown on demand
    size_t scratch_floats;
    emb_error *emb_err;              // device: the first bad token id (k_embedding)
    unsigned long long emb_serial;   // embedding calls so far
    int emb_pending;                 // an embedding ran since emb_err was last read
    int tf32;                        // CKPT_BACKEND_TF32: cuBLAS and cuDNN may use TF32
    int no_cudnn;                    // CKPT_RT_NO_CUDNN: the convolutions on our kernels
    char base_text[112];             // the description up to cuBLAS's version
    char cudnn_text[100];            // "cuDNN 9.13.0", or "no cuDNN: why"
    unsigned long long conv_cudnn, conv_own; // convolutions run by cuDNN, by our kernels
#if CKPT_WITH_CUDNN
    cudnnHandle_t cudnn;             // NULL: no cuDNN (cudnn_text says why)
    cudnnTensorDescriptor_t cudnn_x, cudnn_y;
    cudnnFilterDescriptor_t cudnn_w;
    cudnnConvolutionDescriptor_t cudnn_conv;
    struct cudnn_plan *plans;        // the algorithm chosen per shape
    size_t nplans, capplans;
#endif
} cuda_impl;

static inline cuda_impl *impl_of(ckpt_backend *b)
{
    return (cuda_impl *)b->impl;
}

// Returns CKPT_ERR_DEVICE with "OP: WHAT: CUDA's text".  Clears the
// runtime's last error so the next launch check does not see it again.
static int cuda_fail(ckpt_backend *b, const char *op, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    return ckpt_backend_fail(b, CKPT_ERR_DEVICE, "%s: %s: %s", op, what, cudaGetErrorString(e));
}

#define CUDA_TRY(b, op, what, call)                                                    \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess)                                                         \
            return cuda_fail((b), (op), (what), e_);                                   \
    } while (0)

// After a kernel launch: launch errors (bad configuration, no image for
// this GPU) are reported at once.
#define LAUNCH_CHECK(b, op, kernel) CUDA_TRY(b, op, kernel " launch", cudaGetLastError())

#define RETURN_IF(rc_expr)                                                             \
    do {                                                                               \
        int rc_ = (rc_expr);                                                           \
        if (rc_ != CKPT_OK)                                                            \
            return rc_;                                                                \
    } while (0)

// Every op makes its device current: replicas on several GPUs may share a
// host thread, and a thread may not be the one that opened the backend.
static int cuda_enter(ckpt_backend *b, const char *op)
{
    CUDA_TRY(b, op, "cudaSetDevice", cudaSetDevice(impl_of(b)->device));
    return CKPT_OK;
}

// ---- launch helpers -----------------------------------------------------------

#define THREADS 256
// Kernels loop with a grid stride, so the grid can be capped.
#define MAX_BLOCKS 65535

static unsigned grid_for(int64_t n)
{
    int64_t g = (n + THREADS - 1) / THREADS;
    if (g < 1)
        g = 1;
    if (g > MAX_BLOCKS)
        g = MAX_BLOCKS;
    return (unsigned)g;
}

// 32-bit index arithmetic is much cheaper on the GPU than 64-bit division;
// use it where every index (and index + grid stride) fits.
static bool fits_int32(int64_t n)
{
    return n >= 0 && n <= (int64_t)INT_MAX - (int64_t)MAX_BLOCKS * THREADS;
}

// ---- kernels --------------------------------------------------------------------

#define GRID_LOOP(I, idx, total)                                                       \
    for (I idx = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; idx < (total);        \
         idx += (I)blockDim.x * (I)gridDim.x)

// max that propagates NaN, as torch's max_pool2d and softmax do; the first
// NaN met is kept (the CPU reference's payload)
__device__ __forceinline__ float max_nan(float a, float v)
{
    return (v > a || (v != v && a == a)) ? v : a;
}

template <typename I> struct conv_dims {
    I in_c, in_h, in_w, out_c, out_h, out_w, k_h, k_w, s_h, s_w, p_h, p_w, d_h, d_w;
};

template <typename I> static conv_dims<I> conv_dims_of(const ckpt_conv_geom *g)
{
    conv_dims<I> d;
    d.in_c = (I)g->in_c, d.in_h = (I)g->in_h, d.in_w = (I)g->in_w;
    d.out_c = (I)g->out_c, d.out_h = (I)g->out_h, d.out_w = (I)g->out_w;
    d.k_h = (I)g->k_h, d.k_w = (I)g->k_w, d.s_h = (I)g->stride_h, d.s_w = (I)g->stride_w;
    d.p_h = (I)g->pad_h, d.p_w = (I)g->pad_w, d.d_h = (I)g->dil_h, d.d_w = (I)g->dil_w;
    return d;
}

// cols[n][c][ky][kx][oy][ox] = x[n][c][oy*s - p + ky*d][ox*s - p + kx*d], 0 in the
// padding: per image the [in_c*k_h*k_w, out_h*out_w] operand of conv2d's GEMM.
template <typename I>
__global__ void k_im2col(const float *__restrict__ x, float *__restrict__ cols,
                         conv_dims<I> d, I total)
{
    GRID_LOOP(I, idx, total) {
        I t = idx;
        I ox = t % d.out_w;
        t /= d.out_w;
        I oy = t % d.out_h;
        t /= d.out_h;
        I kx = t % d.k_w;
        t /= d.k_w;
        I ky = t % d.k_h;
        t /= d.k_h; // t = n * in_c + c
        I iy = oy * d.s_h - d.p_h + ky * d.d_h;
        I ix = ox * d.s_w - d.p_w + kx * d.d_w;
        float v = 0.0f;
        if (iy >= 0 && iy < d.in_h && ix >= 0 && ix < d.in_w)
            v = x[(t * d.in_h + iy) * d.in_w + ix];
        cols[idx] = v;
    }
}

// conv_transpose2d's col2im written as a gather: each output pixel sums the
// column entries that land on it in a fixed (ky, kx) order, so there are
// no atomics and the result is deterministic.  cols is per image
// [out_c*k_h*k_w, in_h*in_w].  Adds the bias (may be NULL).
template <typename I>
__global__ void k_col2im_gather(const float *__restrict__ cols, const float *__restrict__ bias,
                                float *__restrict__ y, conv_dims<I> d, I total)
{
    const I in_hw = d.in_h * d.in_w;
    GRID_LOOP(I, idx, total) {
        I t = idx;
        I ox = t % d.out_w;
        t /= d.out_w;
        I oy = t % d.out_h;
        t /= d.out_h;
        I oc = t % d.out_c;
        I n = t / d.out_c;
        const float *cn = cols + (n * d.out_c + oc) * d.k_h * d.k_w * in_hw;
        float acc = 0.0f;
        for (I ky = 0; ky < d.k_h; ky++) {
            // output row oy receives input row iy through tap ky when
            // iy * s - p + ky * d == oy
            I ty = oy + d.p_h - ky * d.d_h;
            if (ty < 0 || ty % d.s_h != 0)
                continue;
            I iy = ty / d.s_h;
            if (iy >= d.in_h)
                continue;
            for (I kx = 0; kx < d.k_w; kx++) {
                I tx = ox + d.p_w - kx * d.d_w;
                if (tx < 0 || tx % d.s_w != 0)
                    continue;
                I ix = tx / d.s_w;
                if (ix >= d.in_w)
                    continue;
                acc += cn[(ky * d.k_w + kx) * in_hw + iy * d.in_w + ix];
            }
        }
        y[idx] = bias ? acc + bias[oc] : acc;
    }
}

// y[i] += bias[(i / inner) % channels]: NCHW (inner = H*W) and linear (inner = 1)
template <typename I>
__global__ void k_add_bias(float *__restrict__ y, const float *__restrict__ bias, I channels,
                           I inner, I total)
{
    GRID_LOOP(I, idx, total) {
        y[idx] += bias[(idx / inner) % channels];
    }
}

template <typename I> struct pool_dims {
    I in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, p_h, p_w, d_h, d_w;
};

// Padding never wins (it is -inf); a NaN in the window is the result, as
// torch's CPU kernel ("val > max || isnan(val)").
template <typename I>
__global__ void k_max_pool2d(const float *__restrict__ x, float *__restrict__ y, pool_dims<I> d,
                             I total)
{
    GRID_LOOP(I, idx, total) {
        I t = idx;
        I ox = t % d.out_w;
        t /= d.out_w;
        I oy = t % d.out_h;
        I plane = t / d.out_h;
        const float *xp = x + plane * d.in_h * d.in_w;
        I y0 = oy * d.s_h - d.p_h, x0 = ox * d.s_w - d.p_w;
        float m = -INFINITY;
        for (I ky = 0; ky < d.k_h; ky++) {
            I iy = y0 + ky * d.d_h;
            if (iy < 0 || iy >= d.in_h)
                continue;
            for (I kx = 0; kx < d.k_w; kx++) {
                I ix = x0 + kx * d.d_w;
                if (ix < 0 || ix >= d.in_w)
                    continue;
                m = max_nan(m, xp[iy * d.in_w + ix]);
            }
        }
        y[idx] = m;
    }
}

// relu(NaN) = NaN, as torch
template <typename I>
__global__ void k_relu(const float *__restrict__ x, float *__restrict__ y, I total)
{
    GRID_LOOP(I, idx, total) {
        float v = x[idx];
        y[idx] = v < 0.0f ? 0.0f : v; // as torch: NaN and -0.0 pass through
    }
}

// SSD's L2Norm: one thread per (image, pixel) sums the squares over the
// channels in ascending order (as the CPU reference), then scales them.
__global__ void k_l2norm(const float *__restrict__ x, const float *__restrict__ w,
                         float *__restrict__ y, long long n, long long c, long long hw,
                         float eps)
{
    GRID_LOOP(long long, idx, n * hw) {
        long long img = idx / hw, p = idx % hw;
        const float *xi = x + img * c * hw + p;
        float *yi = y + img * c * hw + p;
        float sum = 0.0f;
        for (long long ch = 0; ch < c; ch++)
            sum += xi[ch * hw] * xi[ch * hw];
        float norm = sqrtf(sum) + eps;
        for (long long ch = 0; ch < c; ch++)
            yi[ch * hw] = w[ch] * (xi[ch * hw] / norm);
    }
}

// Inference batch norm over [outer, c, inner]: scale and shift per channel
// as torch computes them (float32), then y = x * scale + shift.  Each
// thread recomputes its channel's pair: two loads and a sqrt, no extra pass.
template <typename I>
__global__ void k_batch_norm(const float *__restrict__ x, const float *__restrict__ mean,
                             const float *__restrict__ var, const float *__restrict__ w,
                             const float *__restrict__ bias, float *__restrict__ y, I c,
                             I inner, I total, float eps)
{
    GRID_LOOP(I, idx, total) {
        I ch = (idx / inner) % c;
        float invstd = 1.0f / sqrtf(var[ch] + eps);
        float scale = invstd * (w ? w[ch] : 1.0f);
        float shift = (bias ? bias[ch] : 0.0f) - mean[ch] * scale;
        y[idx] = __fadd_rn(__fmul_rn(x[idx], scale), shift); // no FMA: the CPU's roundings
    }
}

template <typename I>
__global__ void k_add(const float *__restrict__ a, const float *__restrict__ x,
                      float *__restrict__ y, I total)
{
    GRID_LOOP(I, idx, total) {
        y[idx] = a[idx] + x[idx];
    }
}

// One LSTM time step (runtime/backend.h lstm_cell): one thread per (row,
// unit), torch's gate order i, f, g, o; expf and tanhf as the CPU reference.
template <typename I>
__global__ void k_lstm_cell(const float *__restrict__ gx, const float *__restrict__ gh,
                            const float *__restrict__ bias_hh, float *__restrict__ c,
                            float *__restrict__ h, float *__restrict__ y, I hidden, I y_stride,
                            I total)
{
    GRID_LOOP(I, idx, total) {
        I r = idx / hidden, j = idx - r * hidden;
        const float *gxr = gx + r * 4 * hidden;
        const float *ghr = gh ? gh + r * 4 * hidden : bias_hh;
        float g4[4];
        for (int q = 0; q < 4; q++)
            g4[q] = gxr[q * hidden + j] + (ghr ? ghr[q * hidden + j] : 0.0f);
        float ig = 1.0f / (1.0f + expf(-g4[0])), fg = 1.0f / (1.0f + expf(-g4[1]));
        float gg = tanhf(g4[2]), og = 1.0f / (1.0f + expf(-g4[3]));
        float cn = (gh ? fg * c[idx] : 0.0f) + ig * gg;
        c[idx] = cn;
        float hn = og * tanhf(cn);
        h[idx] = hn;
        y[r * y_stride + j] = hn;
    }
}

// torch's bins: rows floor(i * in / out) .. ceil((i + 1) * in / out) - 1,
// summed row by row as the CPU reference, then divided by the bin's size.
template <typename I>
__global__ void k_adaptive_avg_pool2d(const float *__restrict__ x, float *__restrict__ y,
                                      pool_dims<I> d, I total)
{
    GRID_LOOP(I, idx, total) {
        I t = idx;
        I ox = t % d.out_w;
        t /= d.out_w;
        I oy = t % d.out_h;
        I plane = t / d.out_h;
        const float *xp = x + plane * d.in_h * d.in_w;
        I h0 = oy * d.in_h / d.out_h, h1 = ((oy + 1) * d.in_h + d.out_h - 1) / d.out_h;
        I w0 = ox * d.in_w / d.out_w, w1 = ((ox + 1) * d.in_w + d.out_w - 1) / d.out_w;
        float sum = 0.0f;
        for (I iy = h0; iy < h1; iy++)
            for (I ix = w0; ix < w1; ix++)
                sum += xp[iy * d.in_w + ix];
        y[idx] = sum / (float)((h1 - h0) * (w1 - w0));
    }
}

// expf, not __expf: the fast one is off by far more than the tolerance
template <typename I>
__global__ void k_sigmoid(const float *__restrict__ x, float *__restrict__ y, I total)
{
    GRID_LOOP(I, idx, total) {
        y[idx] = 1.0f / (1.0f + expf(-x[idx]));
    }
}

// Softmax over contiguous rows (inner == 1): one warp per row.  Each lane
// reduces its strided share in order, then an xor butterfly combines the
// lanes; every lane ends with the same bits, so the result is
// deterministic.  The row's max goes first, as torch does.
__global__ void k_softmax_rows(const float *__restrict__ x, float *__restrict__ y,
                               long long rows, long long dim)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = warp; r < rows; r += nwarps) { // uniform across the warp
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        float m = -INFINITY;
        for (long long j = lane; j < dim; j += 32)
            m = max_nan(m, xr[j]);
        for (int o = 16; o > 0; o >>= 1)
            m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.0f;
        for (long long j = lane; j < dim; j += 32) {
            float e = expf(xr[j] - m);
            yr[j] = e;
            s += e;
        }
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        for (long long j = lane; j < dim; j += 32)
            yr[j] = yr[j] / s;
    }
}

// Softmax over a strided axis (inner > 1): one thread per (outer, inner)
// pair, walking the axis in order; neighbouring threads read neighbouring
// floats.
__global__ void k_softmax_strided(const float *__restrict__ x, float *__restrict__ y,
                                  long long outer, long long dim, long long inner)
{
    const long long total = outer * inner;
    GRID_LOOP(long long, idx, total) {
        long long o = idx / inner, i = idx % inner;
        const float *xr = x + o * dim * inner + i;
        float *yr = y + o * dim * inner + i;
        float m = -INFINITY;
        for (long long j = 0; j < dim; j++)
            m = max_nan(m, xr[j * inner]);
        float s = 0.0f;
        for (long long j = 0; j < dim; j++) {
            float e = expf(xr[j * inner] - m);
            yr[j * inner] = e;
            s += e;
        }
        for (long long j = 0; j < dim; j++)
            yr[j * inner] = yr[j * inner] / s;
    }
}

// y (contiguous, dims out_shape) from x read at sum(coord[k] * in_stride[k]).
template <typename I> struct permute_dims {
    int ndim;
    I out_shape[CKPT_RT_MAX_DIMS];
    I in_stride[CKPT_RT_MAX_DIMS];
};

template <typename I>
__global__ void k_permute(const float *__restrict__ x, float *__restrict__ y, permute_dims<I> d,
                          I total)
{
    GRID_LOOP(I, idx, total) {
        I rest = idx, off = 0;
        // unrolled with constant indices: the arrays stay in registers
#pragma unroll
        for (int k = CKPT_RT_MAX_DIMS - 1; k >= 0; k--) {
            if (k < d.ndim) {
                I c = rest % d.out_shape[k];
                rest /= d.out_shape[k];
                off += c * d.in_stride[k];
            }
        }
        y[idx] = x[off];
    }
}

template <typename I>
__global__ void k_copy_rows(const float *__restrict__ x, I x_stride, float *__restrict__ y,
                            I y_stride, I len, I total)
{
    GRID_LOOP(I, idx, total) {
        I r = idx / len, j = idx % len;
        y[r * y_stride + j] = x[r * x_stride + j];
    }
}

// ---- the transformer ops' kernels ----------------------------------------------

// The CPU backend's formulas (torch's, float32), with the same libm
// functions (erff, expf), never the fast intrinsics.  GELU (tanh) is
// x / (1 + exp(-2u)): 0.5 x (1 + tanh u) without its cancellation where
// tanh u nears -1.
__device__ __forceinline__ float unary_of(int kind, float v, float s)
{
    switch (kind) {
    case CKPT_U_GELU:
        return v * 0.5f * (1.0f + erff(v * 0.70710678118654752440f));
    case CKPT_U_GELU_TANH: {
        const float beta = 0.79788456080286535588f, kappa = 0.044715f; // sqrt(2 / pi)
        float u = beta * (v + kappa * v * v * v);
        return v / (1.0f + expf(-2.0f * u));
    }
    case CKPT_U_SILU: return v / (1.0f + expf(-v));
    case CKPT_U_TANH: return tanhf(v);
    case CKPT_U_COS: return cosf(v);
    case CKPT_U_SIN: return sinf(v);
    case CKPT_U_NEG: return -v;
    case CKPT_U_EXP: return expf(v);
    case CKPT_U_SQRT: return sqrtf(v);
    case CKPT_U_RSQRT: return 1.0f / sqrtf(v);
    case CKPT_U_POW:
        // torch's pow(Tensor, Scalar) special-cases these exponents; any
        // other goes through pow in double (its std::pow(float, double))
        if (s == 0.0f)
            return 1.0f;
        if (s == 1.0f)
            return v;
        if (s == 2.0f)
            return v * v;
        if (s == 3.0f)
            return v * v * v;
        if (s == 0.5f)
            return sqrtf(v);
        if (s == -0.5f)
            return 1.0f / sqrtf(v);
        if (s == -1.0f)
            return 1.0f / v;
        if (s == -2.0f)
            return 1.0f / (v * v);
        return (float)pow((double)v, (double)s);
    case CKPT_U_ADD: return v + s;
    case CKPT_U_SUB: return v - s;
    case CKPT_U_RSUB: return s - v;
    case CKPT_U_MUL: return v * s;
    default: return v / s; // CKPT_U_DIV (the host checked the kind)
    }
}

template <typename I>
__global__ void k_unary(int kind, const float *__restrict__ x, float *__restrict__ y, I total,
                        float s)
{
    GRID_LOOP(I, idx, total) {
        y[idx] = unary_of(kind, x[idx], s);
    }
}

// y (contiguous, dims shape) = a OP x, each operand read at sum(coord[k] *
// its stride[k]) (0 where it is broadcast).
template <typename I> struct binary_dims {
    int ndim;
    I shape[CKPT_RT_MAX_DIMS];
    I a_stride[CKPT_RT_MAX_DIMS];
    I x_stride[CKPT_RT_MAX_DIMS];
};

template <typename I>
__global__ void k_binary(int kind, const float *__restrict__ a, const float *__restrict__ x,
                         float *__restrict__ y, binary_dims<I> d, I total)
{
    GRID_LOOP(I, idx, total) {
        I rest = idx, ao = 0, xo = 0;
#pragma unroll
        for (int k = CKPT_RT_MAX_DIMS - 1; k >= 0; k--) {
            if (k < d.ndim) {
                I c = rest % d.shape[k];
                rest /= d.shape[k];
                ao += c * d.a_stride[k];
                xo += c * d.x_stride[k];
            }
        }
        float p = a[ao], q = x[xo];
        float r;
        switch (kind) {
        case CKPT_B_ADD: r = p + q; break;
        case CKPT_B_SUB: r = p - q; break;
        case CKPT_B_MUL: r = p * q; break;
        default: r = p / q; break; // CKPT_B_DIV
        }
        y[idx] = r;
    }
}

__global__ void k_fill(float *__restrict__ y, float v, long long total)
{
    GRID_LOOP(long long, idx, total) {
        y[idx] = v;
    }
}

// Sum over the middle axis of [outer, dim, inner] in double, in a fixed
// order: closer to the exact sum than any float order, so the CPU's order
// matters little.  MEAN divides by DIM.
// inner == 1: one warp per row, lanes strided, then an xor butterfly (every
// lane ends with the same bits).
__global__ void k_reduce_rows(const float *__restrict__ x, float *__restrict__ y,
                              long long rows, long long dim, int mean)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = warp; r < rows; r += nwarps) { // uniform across the warp
        const float *xr = x + r * dim;
        double s = 0.0;
        for (long long j = lane; j < dim; j += 32)
            s += (double)xr[j];
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0)
            y[r] = (float)(mean ? s / (double)dim : s);
    }
}

// inner > 1: one thread per (outer, inner) pair, walking the axis in order
__global__ void k_reduce_strided(const float *__restrict__ x, float *__restrict__ y,
                                 long long outer, long long dim, long long inner, int mean)
{
    GRID_LOOP(long long, idx, outer * inner) {
        long long o = idx / inner, i = idx % inner;
        const float *xr = x + o * dim * inner + i;
        double s = 0.0;
        for (long long j = 0; j < dim; j++)
            s += (double)xr[j * inner];
        y[idx] = (float)(mean ? s / (double)dim : s);
    }
}

// The sum of V over the block (THREADS threads, a power of two) by a tree in
// shared memory SH (THREADS doubles): a fixed order, the same bits every
// run.  Every thread gets the sum; SH may be reused after it returns.
__device__ double block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half)
            sh[threadIdx.x] += sh[threadIdx.x + half];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

// F.layer_norm: one block per row; the mean, then the biased variance
// around it (two passes: no cancellation), both summed in double; y in
// double, rounded once (as the CPU backend).
__global__ void k_layer_norm(const float *__restrict__ x, const float *__restrict__ w,
                             const float *__restrict__ bias, float *__restrict__ y,
                             long long rows, long long d, float eps)
{
    __shared__ double sh[THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) { // uniform across the block
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double s = 0.0;
        for (long long j = threadIdx.x; j < d; j += THREADS)
            s += (double)xr[j];
        const double mean = block_sum(s, sh) / (double)d;
        double q = 0.0;
        for (long long j = threadIdx.x; j < d; j += THREADS) {
            double t = (double)xr[j] - mean;
            q += t * t;
        }
        const double var = block_sum(q, sh) / (double)d;
        const double rstd = 1.0 / sqrt(var + (double)eps);
        for (long long j = threadIdx.x; j < d; j += THREADS) {
            double v = ((double)xr[j] - mean) * rstd;
            if (w)
                v *= (double)w[j];
            if (bias)
                v += (double)bias[j];
            yr[j] = (float)v;
        }
    }
}

// F.rms_norm: one block per row; mean(x^2) summed in double; then
// y = x / sqrt(mean + eps) * w in double, rounded once (as the CPU backend).
__global__ void k_rms_norm(const float *__restrict__ x, const float *__restrict__ w,
                           float *__restrict__ y, long long rows, long long d, float eps)
{
    __shared__ double sh[THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) { // uniform across the block
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double q = 0.0;
        for (long long j = threadIdx.x; j < d; j += THREADS) {
            double t = (double)xr[j];
            q += t * t;
        }
        const double ms = block_sum(q, sh) / (double)d;
        const double rstd = 1.0 / sqrt(ms + (double)eps);
        for (long long j = threadIdx.x; j < d; j += THREADS) {
            double v = (double)xr[j] * rstd;
            yr[j] = (float)(w ? v * (double)w[j] : v);
        }
    }
}


// Whether token id V is an integer in [0, vocab); NaN fails every
// comparison, so it is bad too.
__device__ __forceinline__ bool emb_id_ok(float v, long long vocab)
{
    return v >= 0.0f && (double)v < (double)vocab && floorf(v) == v;
}

// Records the bad id V at position I for the embedding call SERIAL.
__device__ void emb_record(emb_error *err, unsigned long long serial, long long i, float v,
                           long long vocab)
{
    unsigned long long prev = atomicCAS(&err->op, 0ull, serial);
    if (prev != 0ull && prev != serial)
        return; // an earlier call failed first: its report stands
    unsigned long long pos = (unsigned long long)i;
    if (pos > 0xffffffffull)
        pos = 0xffffffffull;
    atomicMin(&err->key, (pos << 32) | (unsigned long long)__float_as_uint(v));
    err->vocab = vocab; // every writer of this call writes the same
}

// y[i, j] = w[ids[i], j]; a bad id writes zeros and is recorded, never read
template <typename I>
__global__ void k_embedding(const float *__restrict__ ids, const float *__restrict__ w,
                            float *__restrict__ y, I d, long long vocab, I total,
                            emb_error *err, unsigned long long serial)
{
    GRID_LOOP(I, idx, total) {
        I i = idx / d, j = idx - i * d;
        float v = ids[i];
        if (emb_id_ok(v, vocab)) {
            y[idx] = w[(I)v * d + j];
        } else {
            y[idx] = 0.0f;
            if (j == 0)
                emb_record(err, serial, (long long)i, v, vocab);
        }
    }
}

// The ids' check alone, for an embedding of width 0
__global__ void k_embedding_ids(const float *__restrict__ ids, long long n, long long vocab,
                                emb_error *err, unsigned long long serial)
{
    GRID_LOOP(long long, i, n) {
        if (!emb_id_ok(ids[i], vocab))
            emb_record(err, serial, i, ids[i], vocab);
    }
}

// The softmax of attention, in place over the scores [batch, heads, q_len,
// kv_len] (S = q . k from cuBLAS): s * scale + mask, keys past the diagonal
// dropped when causal, the max subtracted, as torch's math kernel does.
// One warp per row, as k_softmax_rows.  A row with no key left (every
// score -inf) gives zeros, not NaN: torch 2.x's CPU kernel does, and so
// does the CPU backend.
struct attn_dims {
    long long heads, q_len, kv_len;
    long long ms0, ms1, ms2, ms3;
    float scale;
    int causal;
};

// ROW0: the absolute row (n * heads + h) * q_len + i of P's first row.
__global__ void k_attn_softmax(float *__restrict__ p, const float *__restrict__ mask,
                               long long row0, long long rows, attn_dims d)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = warp; r < rows; r += nwarps) { // uniform across the warp
        const long long ar = row0 + r;
        const long long i = ar % d.q_len, nh = ar / d.q_len;
        const long long h = nh % d.heads, n = nh / d.heads;
        float *pr = p + r * d.kv_len;
        const float *mr = mask ? mask + n * d.ms0 + h * d.ms1 + i * d.ms2 : NULL;
        // keys 0 .. end - 1 take part; the rest become 0
        const long long end = d.causal ? (i + 1 < d.kv_len ? i + 1 : d.kv_len) : d.kv_len;
        float m = -INFINITY;
        for (long long j = lane; j < end; j += 32) {
            float s = pr[j] * d.scale;
            if (mr)
                s += mr[j * d.ms3];
            pr[j] = s;
            m = max_nan(m, s);
        }
        for (int o = 16; o > 0; o >>= 1)
            m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (m == -INFINITY) {
            for (long long j = lane; j < d.kv_len; j += 32)
                pr[j] = 0.0f;
            continue;
        }
        float sum = 0.0f;
        for (long long j = lane; j < end; j += 32) {
            float e = expf(pr[j] - m);
            pr[j] = e;
            sum += e;
        }
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        for (long long j = lane; j < d.kv_len; j += 32)
            pr[j] = j < end ? pr[j] / sum : 0.0f;
    }
}

// ---- buffers --------------------------------------------------------------------

// cudaMalloc/cudaFree cost tens of microseconds and cudaFree synchronizes
// the device, so released buffers are kept and handed out again.  A kept
// buffer may still be read by queued work: that is safe because all work
// of this backend runs on its one stream, in order.
static void cuda_blocks_trim(cuda_impl *c)
{
    // callers have synchronized the stream: nothing queued uses these
    size_t j = 0;
    for (size_t i = 0; i < c->nblocks; i++) {
        if (c->blocks[i].used)
            c->blocks[j++] = c->blocks[i];
        else
            cudaFree(c->blocks[i].p);
    }
    c->nblocks = j;
    if (c->scratch) { // regrown by the next conv that needs it
        cudaFree(c->scratch);
        c->scratch = NULL;
        c->scratch_floats = 0;
    }
}

// cudaMalloc, and when the GPU is out of memory, give the kept buffers
// and the working memory back and try once more.
static cudaError_t cuda_malloc_retry(cuda_impl *c, void **p, size_t bytes)
{
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaErrorMemoryAllocation)
        return e;
    (void)cudaGetLastError();
    e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        return e;
    cuda_blocks_trim(c);
    return cudaMalloc(p, bytes);
}

static int cuda_alloc(ckpt_backend *b, size_t n, float **out)
{
    cuda_impl *c = impl_of(b);
    *out = NULL;
    if (n > (SIZE_MAX - 1024) / sizeof(float))
        return ckpt_backend_fail(b, CKPT_ERR_LIMIT, "alloc: %zu floats is too many", n);
    // n == 0 still gets a real (small) buffer: a distinct pointer that
    // release() knows
    size_t bytes = ((n ? n : 1) * sizeof(float) + 511) & ~(size_t)511;

    // best fit among kept buffers, wasting at most an eighth
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < c->nblocks; i++) {
        const cuda_block *k = &c->blocks[i];
        if (!k->used && k->bytes >= bytes && k->bytes - bytes <= bytes / 8 &&
            (best == SIZE_MAX || k->bytes < c->blocks[best].bytes))
            best = i;
    }
    if (best != SIZE_MAX) {
        c->blocks[best].used = 1;
        *out = c->blocks[best].p;
        return CKPT_OK;
    }

    RETURN_IF(cuda_enter(b, "alloc"));
    if (c->nblocks == c->capblocks) {
        size_t cap = c->capblocks ? 2 * c->capblocks : 64;
        cuda_block *nb = (cuda_block *)realloc(c->blocks, cap * sizeof *nb);
        if (!nb)
            return ckpt_backend_fail(b, CKPT_ERR_NOMEM, "alloc: out of host memory");
        c->blocks = nb;
        c->capblocks = cap;
    }
    void *p = NULL;
    cudaError_t e = cuda_malloc_retry(c, &p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ckpt_backend_fail(b, CKPT_ERR_DEVICE, "alloc: cudaMalloc of %zu bytes: %s", bytes,
                                 cudaGetErrorString(e));
    }
    c->blocks[c->nblocks].p = (float *)p;
    c->blocks[c->nblocks].bytes = bytes;
    c->blocks[c->nblocks].used = 1;
    c->nblocks++;
    *out = (float *)p;
    return CKPT_OK;
}

static void cuda_release(ckpt_backend *b, float *p)
{
    if (!b || !p)
        return;
    cuda_impl *c = impl_of(b);
    for (size_t i = 0; i < c->nblocks; i++) {
        if (c->blocks[i].p == p) {
            c->blocks[i].used = 0;
            return;
        }
    }
}

// Working memory of conv2d / conv_transpose2d, ordered on the stream like
// every buffer.  Growing it waits for queued work that may use the old one.
static int cuda_scratch(ckpt_backend *b, const char *op, size_t floats, float **out)
{
    cuda_impl *c = impl_of(b);
    if (c->scratch_floats < floats) {
        CUDA_TRY(b, op, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
        if (c->scratch) {
            cudaFree(c->scratch);
            c->scratch = NULL;
            c->scratch_floats = 0;
        }
        void *p = NULL;
        cudaError_t e = cuda_malloc_retry(c, &p, floats * sizeof(float));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return ckpt_backend_fail(b, CKPT_ERR_DEVICE,
                                     "%s: cudaMalloc of %zu bytes of working memory: %s", op,
                                     floats * sizeof(float), cudaGetErrorString(e));
        }
        c->scratch = (float *)p;
        c->scratch_floats = floats;
    }
    *out = c->scratch;
    return CKPT_OK;
}

static int cuda_upload(ckpt_backend *b, float *dst, const float *src, size_t n)
{
    if (n == 0)
        return CKPT_OK;
    cuda_impl *c = impl_of(b);
    RETURN_IF(cuda_enter(b, "upload"));
    CUDA_TRY(b, "upload", "cudaMemcpyAsync",
             cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    // The caller may free or reuse SRC when we return; with pinned host
    // memory the copy above would still be in flight.
    CUDA_TRY(b, "upload", "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    return CKPT_OK;
}

// emb_err as no embedding has failed yet (ordered on the stream)
static int emb_reset(ckpt_backend *b, const char *op)
{
    static const emb_error none = {~0ull, 0ull, 0};
    cuda_impl *c = impl_of(b);
    // from pageable memory: NONE is staged before the call returns
    CUDA_TRY(b, op, "cudaMemcpyAsync",
             cudaMemcpyAsync(c->emb_err, &none, sizeof none, cudaMemcpyHostToDevice, c->stream));
    return CKPT_OK;
}

// Called once the queued work is done: an embedding's bad token id becomes
// its usage error here (the kernels cannot return one).  The record is then
// cleared, so that the backend serves on.
static int emb_check(ckpt_backend *b, const char *op)
{
    cuda_impl *c = impl_of(b);
    if (!c->emb_pending)
        return CKPT_OK;
    emb_error e;
    CUDA_TRY(b, op, "cudaMemcpyAsync",
             cudaMemcpyAsync(&e, c->emb_err, sizeof e, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(b, op, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    c->emb_pending = 0;
    if (e.op == 0)
        return CKPT_OK;
    RETURN_IF(emb_reset(b, op));
    uint32_t bits = (uint32_t)(e.key & 0xffffffffu);
    float id;
    memcpy(&id, &bits, sizeof id);
    return ckpt_backend_fail(b, CKPT_ERR_USAGE,
                             "token id %.9g is out of range for an embedding of %lld rows",
                             (double)id, (long long)e.vocab);
}

static int cuda_download(ckpt_backend *b, float *dst, const float *src, size_t n)
{
    cuda_impl *c = impl_of(b);
    RETURN_IF(cuda_enter(b, "download"));
    if (n > 0)
        CUDA_TRY(b, "download", "cudaMemcpyAsync",
                 cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    // also reports faults of the queued kernels that produced SRC
    CUDA_TRY(b, "download", "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    return emb_check(b, "download");
}

static int cuda_synchronize(ckpt_backend *b)
{
    cuda_impl *c = impl_of(b);
    RETURN_IF(cuda_enter(b, "synchronize"));
    CUDA_TRY(b, "synchronize", "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    CUDA_TRY(b, "synchronize", "cudaGetLastError", cudaGetLastError());
    return emb_check(b, "synchronize");
}

// ---- matrix products ------------------------------------------------------------

// cuBLAS is column-major: a row-major [r, c] matrix is its column-major
// [c, r] transpose, so every product below is written for the transposes.
static int gemm_check_dims(ckpt_backend *b, const char *op, int64_t m, int64_t n, int64_t k)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
        return ckpt_backend_fail(b, CKPT_ERR_LIMIT,
                                 "%s: matrix product of %lld x %lld x %lld exceeds cuBLAS's "
                                 "32-bit sizes",
                                 op, (long long)m, (long long)n, (long long)k);
    return CKPT_OK;
}

// C_i = op(A_i) * op(B_i) for BATCH matrices (column-major, cuBLAS's
// arguments), beta 0.  BATCH 1 uses plain sgemm.
static int gemm(ckpt_backend *b, const char *op, int transa, int transb, int64_t m, int64_t n,
                int64_t k, const float *a, int64_t lda, long long stride_a, const float *bm,
                int64_t ldb, long long stride_b, float *cm, int64_t ldc, long long stride_c,
                int64_t batch)
{
    cuda_impl *c = impl_of(b);
    const float one = 1.0f, zero = 0.0f;
    int st;
    if (batch == 1)
        st = cublas_api.sgemm(c->cublas, transa, transb, (int)m, (int)n, (int)k, &one, a, (int)lda,
                              bm, (int)ldb, &zero, cm, (int)ldc);
    else
        st = cublas_api.sgemm_strided_batched(c->cublas, transa, transb, (int)m, (int)n, (int)k,
                                              &one, a, (int)lda, stride_a, bm, (int)ldb,
                                              stride_b, &zero, cm, (int)ldc, stride_c,
                                              (int)batch);
    if (st != CKPT_CUBLAS_STATUS_SUCCESS) {
        (void)cudaGetLastError();
        return ckpt_backend_fail(b, CKPT_ERR_DEVICE, "%s: %s: %s", op,
                                 batch == 1 ? "cublasSgemm" : "cublasSgemmStridedBatched",
                                 cublas_status_text(st));
    }
    return CKPT_OK;
}

// y[i] += bias[(i / inner) % channels] over TOTAL floats
static int add_bias(ckpt_backend *b, const char *op, float *y, const float *bias,
                    int64_t channels, int64_t inner, int64_t total)
{
    cudaStream_t s = impl_of(b)->stream;
    if (fits_int32(total))
        k_add_bias<int><<<grid_for(total), THREADS, 0, s>>>(y, bias, (int)channels, (int)inner,
                                                            (int)total);
    else
        k_add_bias<long long><<<grid_for(total), THREADS, 0, s>>>(y, bias, channels, inner,
                                                                  total);
    LAUNCH_CHECK(b, op, "bias");
    return CKPT_OK;
}

// y = 0 (+ bias): the products with an empty inner dimension
static int zero_plus_bias(ckpt_backend *b, const char *op, float *y, const float *bias,
                          int64_t channels, int64_t inner, int64_t total)
{
    CUDA_TRY(b, op, "cudaMemsetAsync",
             cudaMemsetAsync(y, 0, (size_t)total * sizeof(float), impl_of(b)->stream));
    return bias ? add_bias(b, op, y, bias, channels, inner, total) : CKPT_OK;
}

static int cuda_linear(ckpt_backend *b, const float *x, const float *w, const float *bias,
                       float *y, int64_t rows, int64_t in, int64_t out)
{
    if (rows < 0 || in < 0 || out < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "linear: negative size");
    if (rows == 0 || out == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "linear"));
    if (in == 0)
        return zero_plus_bias(b, "linear", y, bias, out, 1, rows * out);
    RETURN_IF(gemm_check_dims(b, "linear", out, rows, in));
    // y^T [out, rows] = w [out, in] * x^T [in, rows]: w is stored as the
    // column-major [in, out] (hence T), x as the column-major [in, rows].
    RETURN_IF(gemm(b, "linear", CKPT_CUBLAS_OP_T, CKPT_CUBLAS_OP_N, out, rows, in, w, in, 0, x, in,
                   0, y, out, 0, 1));
    return bias ? add_bias(b, "linear", y, bias, out, 1, rows * out) : CKPT_OK;
}

// ---- convolutions through cuDNN --------------------------------------------------

#if CKPT_WITH_CUDNN
// The choice for one shape: conv2d (forward) or conv_transpose2d (backward
// data), the geometry, the math allowed.  USABLE 0: cuDNN offered no
// deterministic algorithm, or failed: the fallback kernels run it.
struct cudnn_plan {
    int transpose, tf32;
    ckpt_conv_geom g;
    int usable;
    int algo;
    cudnnMathType_t math;
    size_t workspace;
    // set once, when chosen: describing a shape again at every call cost
    // ResNet-50 tens of microseconds a convolution on the H200
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
};

static bool same_geom(const ckpt_conv_geom *a, const ckpt_conv_geom *b)
{
    return memcmp(a, b, sizeof *a) == 0; // all int64: no padding
}

// The descriptors for G: x and y as conv2d sees them (conv_transpose2d is
// conv2d's backward data: its input is that conv's dy, its output the dx);
// the filter is [out_c, in_c, k, k] of conv2d, [in_c, out_c, k, k] of the
// transpose, which is torch's layout of each.  Sizes beyond int: no cuDNN.
static cudnnStatus_t cudnn_describe(cudnnTensorDescriptor_t dx, cudnnTensorDescriptor_t dy,
                                    cudnnFilterDescriptor_t dw, cudnnConvolutionDescriptor_t dc,
                                    int transpose, const ckpt_conv_geom *g, cudnnMathType_t math)
{
    const int64_t v[] = {g->batch, g->in_c, g->in_h, g->in_w, g->out_c, g->out_h, g->out_w,
                         g->k_h, g->k_w, g->stride_h, g->stride_w, g->pad_h, g->pad_w,
                         g->dil_h, g->dil_w,
                         g->batch * g->in_c * g->in_h * g->in_w,
                         g->batch * g->out_c * g->out_h * g->out_w};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] > INT_MAX)
            return CUDNN_STATUS_NOT_SUPPORTED;
    cudnnStatus_t st;
    const int n = (int)g->batch, k = (int)g->out_c, ch = (int)g->in_c;
    if ((st = cudnn_api.set_tensor(dx, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, ch,
                                   (int)g->in_h, (int)g->in_w)) != CUDNN_STATUS_SUCCESS ||
        (st = cudnn_api.set_tensor(dy, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k,
                                   (int)g->out_h, (int)g->out_w)) != CUDNN_STATUS_SUCCESS ||
        (st = cudnn_api.set_filter(dw, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                   transpose ? ch : k, transpose ? k : ch, (int)g->k_h,
                                   (int)g->k_w)) != CUDNN_STATUS_SUCCESS ||
        (st = cudnn_api.set_conv(dc, (int)g->pad_h, (int)g->pad_w, (int)g->stride_h,
                                 (int)g->stride_w, (int)g->dil_h, (int)g->dil_w,
                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) !=
            CUDNN_STATUS_SUCCESS)
        return st;
    return cudnn_api.set_math(dc, math);
}

// Which math an algorithm may use: strict FP32 takes CUDNN_FMA_MATH only
// (CUDNN_DEFAULT_MATH lets cuDNN pick TF32 on Ampere and later).
static bool math_allowed(int tf32, cudnnMathType_t m)
{
    return tf32 ? (m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH || m == CUDNN_FMA_MATH)
                : m == CUDNN_FMA_MATH;
}

// Chooses (once per shape and math) the algorithm: the heuristics' first
// that is deterministic, supported and of allowed math.
static cudnn_plan *cudnn_choose(cuda_impl *c, int transpose, const ckpt_conv_geom *g)
{
    for (size_t i = 0; i < c->nplans; i++) {
        cudnn_plan *p = &c->plans[i];
        if (p->transpose == transpose && p->tf32 == c->tf32 && same_geom(&p->g, g))
            return p;
    }
    if (c->nplans == c->capplans) {
        size_t cap = c->capplans ? 2 * c->capplans : 32;
        cudnn_plan *np = (cudnn_plan *)realloc(c->plans, cap * sizeof *np);
        if (!np)
            return NULL;
        c->plans = np;
        c->capplans = cap;
    }
    cudnn_plan *p = &c->plans[c->nplans++];
    memset(p, 0, sizeof *p);
    p->transpose = transpose;
    p->tf32 = c->tf32;
    p->g = *g;
    // as torch sets it: CUDNN_DEFAULT_MATH lets FP32 run as TF32 on tensor cores
    const cudnnMathType_t asked = c->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    if (cudnn_api.create_tensor(&p->x) != CUDNN_STATUS_SUCCESS ||
        cudnn_api.create_tensor(&p->y) != CUDNN_STATUS_SUCCESS ||
        cudnn_api.create_filter(&p->w) != CUDNN_STATUS_SUCCESS ||
        cudnn_api.create_conv(&p->conv) != CUDNN_STATUS_SUCCESS)
        return p; // what was made is freed at destroy
    if (cudnn_describe(p->x, p->y, p->w, p->conv, transpose, g, asked) != CUDNN_STATUS_SUCCESS)
        return p;
    enum { MAX_ALGOS = 16 };
    int found = 0;
    if (!transpose) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
        if (cudnn_api.fwd_algos(c->cudnn, p->x, p->w, p->conv, p->y, MAX_ALGOS, &found,
                                perf) != CUDNN_STATUS_SUCCESS)
            return p;
        for (int i = 0; i < found && !p->usable; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS &&
                perf[i].determinism == CUDNN_DETERMINISTIC &&
                math_allowed(c->tf32, perf[i].mathType)) {
                p->algo = (int)perf[i].algo;
                p->math = perf[i].mathType;
                p->usable = 1;
            }
    } else {
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_ALGOS];
        if (cudnn_api.bwd_algos(c->cudnn, p->w, p->x, p->conv, p->y, MAX_ALGOS, &found,
                                perf) != CUDNN_STATUS_SUCCESS)
            return p;
        for (int i = 0; i < found && !p->usable; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS &&
                perf[i].determinism == CUDNN_DETERMINISTIC &&
                math_allowed(c->tf32, perf[i].mathType)) {
                p->algo = (int)perf[i].algo;
                p->math = perf[i].mathType;
                p->usable = 1;
            }
    }
    if (!p->usable)
        return p;
    // the workspace of the algorithm under the math it runs with
    cudnnStatus_t st = cudnn_api.set_math(p->conv, p->math);
    if (st == CUDNN_STATUS_SUCCESS)
        st = transpose ? cudnn_api.bwd_workspace(c->cudnn, p->w, p->x, p->conv, p->y,
                                                 (cudnnConvolutionBwdDataAlgo_t)p->algo,
                                                 &p->workspace)
                       : cudnn_api.fwd_workspace(c->cudnn, p->x, p->w, p->conv, p->y,
                                                 (cudnnConvolutionFwdAlgo_t)p->algo,
                                                 &p->workspace);
    if (st != CUDNN_STATUS_SUCCESS)
        p->usable = 0;
    return p;
}
#endif

// A 1x1 convolution of stride 1 and no padding: one matrix product per
// image, x itself being the columns.
static bool conv_is_pointwise(const ckpt_conv_geom *g)
{
    return g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 && g->stride_w == 1 && g->pad_h == 0 &&
           g->pad_w == 0 && g->out_h == g->in_h && g->out_w == g->in_w;
}

// conv2d (TRANSPOSE 0) or conv_transpose2d (1) of G through cuDNN, without
// the bias: *RAN false when cuDNN is not used for it (none loaded, turned
// off, no deterministic algorithm for this shape, or it declined): the
// caller runs its own kernels then.
static int cudnn_conv(ckpt_backend *b, const char *op, int transpose, const float *x,
                      const float *w, float *y, const ckpt_conv_geom *g, bool *ran)
{
    *ran = false;
#if CKPT_WITH_CUDNN
    cuda_impl *c = impl_of(b);
    if (!c->cudnn || c->no_cudnn)
        return CKPT_OK;
    // In strict FP32 a pointwise conv2d stays a cuBLAS SGEMM on the own path:
    // through cuDNN's FMA algorithms ResNet-50 (most of its layers 1x1) took
    // 9.2 ms at batch 8 on the H200, on the own path 5.2 (torch 4.8-5.0)
    if (!transpose && !c->tf32 && conv_is_pointwise(g))
        return CKPT_OK;
    cudnn_plan *p = cudnn_choose(c, transpose, g);
    if (!p)
        return ckpt_backend_fail(b, CKPT_ERR_NOMEM, "%s: out of host memory", op);
    if (!p->usable)
        return CKPT_OK;
    cudnnStatus_t st;
    float *ws = NULL;
    if (p->workspace > 0)
        RETURN_IF(cuda_scratch(b, op, (p->workspace + sizeof(float) - 1) / sizeof(float), &ws));
    const float one = 1.0f, zero = 0.0f;
    if (transpose)
        st = cudnn_api.bwd(c->cudnn, &one, p->w, w, p->x, x, p->conv,
                           (cudnnConvolutionBwdDataAlgo_t)p->algo, ws, p->workspace, &zero,
                           p->y, y);
    else
        st = cudnn_api.fwd(c->cudnn, &one, p->x, x, p->w, w, p->conv,
                           (cudnnConvolutionFwdAlgo_t)p->algo, ws, p->workspace, &zero,
                           p->y, y);
    // cuDNN 9's codes come in ranges: 2xxx a bad parameter, 3xxx not
    // supported -- declined before running: ours run it, now and next time
    if ((int)st / 1000 == CUDNN_STATUS_BAD_PARAM / 1000 ||
        (int)st / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) {
        p->usable = 0;
        return CKPT_OK;
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        (void)cudaGetLastError();
        return ckpt_backend_fail(b, CKPT_ERR_DEVICE, "%s: %s: %s", op,
                                 transpose ? "cudnnConvolutionBackwardData"
                                           : "cudnnConvolutionForward",
                                 cudnn_status_text(st));
    }
    c->conv_cudnn++;
    *ran = true;
#else
    (void)b, (void)op, (void)transpose, (void)x, (void)w, (void)y, (void)g;
#endif
    return CKPT_OK;
}

static int check_conv_geom(ckpt_backend *b, const char *op, const ckpt_conv_geom *g)
{
    if (g->batch < 0 || g->in_c < 0 || g->in_h < 0 || g->in_w < 0 || g->out_c < 0 ||
        g->out_h < 0 || g->out_w < 0 || g->k_h < 1 || g->k_w < 1 || g->stride_h < 1 ||
        g->stride_w < 1 || g->pad_h < 0 || g->pad_w < 0 || g->dil_h < 1 || g->dil_w < 1)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: invalid geometry", op);
    return CKPT_OK;
}

// The im2col / column buffer is filled for this many bytes of images at a
// time (at least one image): big batches stay within bounded memory.
#define SCRATCH_TARGET_BYTES ((size_t)256 << 20)
// cuBLAS's batched calls take the batch as an int and run it on grid.z
#define MAX_GEMM_BATCH 65535

static int64_t images_per_chunk(int64_t batch, int64_t floats_per_image)
{
    int64_t per = floats_per_image * (int64_t)sizeof(float);
    int64_t n = per > 0 ? (int64_t)SCRATCH_TARGET_BYTES / per : batch;
    if (n < 1)
        n = 1;
    if (n > batch)
        n = batch;
    if (n > MAX_GEMM_BATCH)
        n = MAX_GEMM_BATCH;
    return n;
}

static int cuda_conv2d(ckpt_backend *b, const float *x, const float *w, const float *bias,
                       float *y, const ckpt_conv_geom *g)
{
    const char *op = "conv2d";
    RETURN_IF(check_conv_geom(b, op, g));
    const int64_t out_hw = g->out_h * g->out_w, in_hw = g->in_h * g->in_w;
    const int64_t ckk = g->in_c * g->k_h * g->k_w;
    const int64_t y_total = g->batch * g->out_c * out_hw;
    if (y_total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    if (ckk == 0)
        return zero_plus_bias(b, op, y, bias, g->out_c, out_hw, y_total);
    bool ran;
    RETURN_IF(cudnn_conv(b, op, 0, x, w, y, g, &ran));
    if (ran)
        return bias ? add_bias(b, op, y, bias, g->out_c, out_hw, y_total) : CKPT_OK;
    RETURN_IF(gemm_check_dims(b, op, out_hw, g->out_c, ckk));
    cuda_impl *c = impl_of(b);
    c->conv_own++;

    // Per image, y^T [out_hw, out_c] = cols^T [out_hw, ckk] * w^T [ckk, out_c]
    // in column-major terms, cols being x itself for a plain 1x1 conv.
    const bool pointwise = conv_is_pointwise(g);
    if (pointwise) {
        for (int64_t n0 = 0; n0 < g->batch; n0 += MAX_GEMM_BATCH) {
            int64_t nb = g->batch - n0 < MAX_GEMM_BATCH ? g->batch - n0 : MAX_GEMM_BATCH;
            RETURN_IF(gemm(b, op, CKPT_CUBLAS_OP_N, CKPT_CUBLAS_OP_N, out_hw, g->out_c, ckk,
                           x + n0 * g->in_c * in_hw, out_hw, g->in_c * in_hw, w, ckk, 0,
                           y + n0 * g->out_c * out_hw, out_hw, g->out_c * out_hw, nb));
        }
    } else {
        const int64_t per_image = ckk * out_hw;
        const int64_t chunk = images_per_chunk(g->batch, per_image);
        float *cols;
        RETURN_IF(cuda_scratch(b, op, (size_t)(chunk * per_image), &cols));
        for (int64_t n0 = 0; n0 < g->batch; n0 += chunk) {
            int64_t nb = g->batch - n0 < chunk ? g->batch - n0 : chunk;
            int64_t total = nb * per_image;
            const float *xn = x + n0 * g->in_c * in_hw;
            if (fits_int32(total) && fits_int32(nb * g->in_c * in_hw))
                k_im2col<int><<<grid_for(total), THREADS, 0, c->stream>>>(
                    xn, cols, conv_dims_of<int>(g), (int)total);
            else
                k_im2col<long long><<<grid_for(total), THREADS, 0, c->stream>>>(
                    xn, cols, conv_dims_of<long long>(g), total);
            LAUNCH_CHECK(b, op, "im2col");
            RETURN_IF(gemm(b, op, CKPT_CUBLAS_OP_N, CKPT_CUBLAS_OP_N, out_hw, g->out_c, ckk, cols,
                           out_hw, per_image, w, ckk, 0, y + n0 * g->out_c * out_hw, out_hw,
                           g->out_c * out_hw, nb));
        }
    }
    return bias ? add_bias(b, op, y, bias, g->out_c, out_hw, y_total) : CKPT_OK;
}

static int cuda_conv_transpose2d(ckpt_backend *b, const float *x, const float *w,
                                 const float *bias, float *y, const ckpt_conv_geom *g)
{
    const char *op = "conv_transpose2d";
    RETURN_IF(check_conv_geom(b, op, g));
    const int64_t out_hw = g->out_h * g->out_w, in_hw = g->in_h * g->in_w;
    const int64_t ockk = g->out_c * g->k_h * g->k_w;
    const int64_t y_total = g->batch * g->out_c * out_hw;
    if (y_total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    if (g->in_c == 0 || in_hw == 0)
        return zero_plus_bias(b, op, y, bias, g->out_c, out_hw, y_total);
    bool ran;
    RETURN_IF(cudnn_conv(b, op, 1, x, w, y, g, &ran));
    if (ran)
        return bias ? add_bias(b, op, y, bias, g->out_c, out_hw, y_total) : CKPT_OK;
    RETURN_IF(gemm_check_dims(b, op, in_hw, ockk, g->in_c));
    cuda_impl *c = impl_of(b);
    c->conv_own++;

    // Per image, cols [ockk, in_hw] = w^T [ockk, in_c] * x [in_c, in_hw]; in
    // column-major terms cols^T [in_hw, ockk] = x^T [in_hw, in_c] * w [in_c, ockk],
    // w being stored as the column-major [ockk, in_c] (hence T).
    const int64_t per_image = ockk * in_hw;
    const int64_t chunk = images_per_chunk(g->batch, per_image);
    float *cols;
    RETURN_IF(cuda_scratch(b, op, (size_t)(chunk * per_image), &cols));
    for (int64_t n0 = 0; n0 < g->batch; n0 += chunk) {
        int64_t nb = g->batch - n0 < chunk ? g->batch - n0 : chunk;
        RETURN_IF(gemm(b, op, CKPT_CUBLAS_OP_N, CKPT_CUBLAS_OP_T, in_hw, ockk, g->in_c,
                       x + n0 * g->in_c * in_hw, in_hw, g->in_c * in_hw, w, ockk, 0, cols,
                       in_hw, per_image, nb));
        int64_t total = nb * g->out_c * out_hw;
        float *yn = y + n0 * g->out_c * out_hw;
        // indices into cols reach nb * per_image
        if (fits_int32(total) && fits_int32(nb * per_image))
            k_col2im_gather<int><<<grid_for(total), THREADS, 0, c->stream>>>(
                cols, bias, yn, conv_dims_of<int>(g), (int)total);
        else
            k_col2im_gather<long long><<<grid_for(total), THREADS, 0, c->stream>>>(
                cols, bias, yn, conv_dims_of<long long>(g), total);
        LAUNCH_CHECK(b, op, "col2im");
    }
    return CKPT_OK;
}

// ---- the other ops ----------------------------------------------------------------

static int cuda_max_pool2d(ckpt_backend *b, const float *x, float *y, const ckpt_pool_geom *g)
{
    const char *op = "max_pool2d";
    if (g->planes < 0 || g->in_h < 0 || g->in_w < 0 || g->out_h < 0 || g->out_w < 0 ||
        g->k_h < 1 || g->k_w < 1 || g->stride_h < 1 || g->stride_w < 1 || g->pad_h < 0 ||
        g->pad_w < 0 || g->dil_h < 1 || g->dil_w < 1)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: invalid geometry", op);
    const int64_t total = g->planes * g->out_h * g->out_w;
    if (total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    cudaStream_t s = impl_of(b)->stream;
    if (fits_int32(total) && fits_int32(g->planes * g->in_h * g->in_w)) {
        pool_dims<int> d = {(int)g->in_h,     (int)g->in_w,     (int)g->out_h,
                            (int)g->out_w,    (int)g->k_h,      (int)g->k_w,
                            (int)g->stride_h, (int)g->stride_w, (int)g->pad_h,
                            (int)g->pad_w,    (int)g->dil_h,    (int)g->dil_w};
        k_max_pool2d<int><<<grid_for(total), THREADS, 0, s>>>(x, y, d, (int)total);
    } else {
        pool_dims<long long> d = {g->in_h,     g->in_w,     g->out_h, g->out_w,
                                  g->k_h,      g->k_w,      g->stride_h, g->stride_w,
                                  g->pad_h,    g->pad_w,    g->dil_h, g->dil_w};
        k_max_pool2d<long long><<<grid_for(total), THREADS, 0, s>>>(x, y, d, total);
    }
    LAUNCH_CHECK(b, op, "max_pool2d");
    return CKPT_OK;
}

static int cuda_l2norm(ckpt_backend *b, const float *x, const float *w, float *y, int64_t n,
                       int64_t c, int64_t hw, float eps)
{
    if (n < 0 || c < 0 || hw < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "l2norm: invalid geometry");
    if (n == 0 || c == 0 || hw == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "l2norm"));
    cudaStream_t s = impl_of(b)->stream;
    k_l2norm<<<grid_for(n * hw), THREADS, 0, s>>>(x, w, y, n, c, hw, eps);
    LAUNCH_CHECK(b, "l2norm", "l2norm");
    return CKPT_OK;
}

static int cuda_batch_norm(ckpt_backend *b, const float *x, const float *mean,
                           const float *var, const float *w, const float *bias, float *y,
                           int64_t outer, int64_t c, int64_t inner, float eps)
{
    if (outer < 0 || c < 0 || inner < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "batch_norm: invalid geometry");
    if (outer == 0 || c == 0 || inner == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "batch_norm"));
    cudaStream_t s = impl_of(b)->stream;
    int64_t total = outer * c * inner;
    if (fits_int32(total))
        k_batch_norm<int><<<grid_for(total), THREADS, 0, s>>>(x, mean, var, w, bias, y, (int)c,
                                                              (int)inner, (int)total, eps);
    else
        k_batch_norm<long long><<<grid_for(total), THREADS, 0, s>>>(
            x, mean, var, w, bias, y, (long long)c, (long long)inner, (long long)total, eps);
    LAUNCH_CHECK(b, "batch_norm", "batch_norm");
    return CKPT_OK;
}

static int cuda_add(ckpt_backend *b, const float *a, const float *x, float *y, size_t n)
{
    if (n == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "add"));
    cudaStream_t s = impl_of(b)->stream;
    if (n <= (size_t)INT64_MAX && fits_int32((int64_t)n))
        k_add<int><<<grid_for((int64_t)n), THREADS, 0, s>>>(a, x, y, (int)n);
    else
        k_add<long long><<<grid_for((int64_t)n), THREADS, 0, s>>>(a, x, y, (long long)n);
    LAUNCH_CHECK(b, "add", "add");
    return CKPT_OK;
}

static int cuda_adaptive_avg_pool2d(ckpt_backend *b, const float *x, float *y,
                                    const ckpt_pool_geom *g)
{
    if (g->planes < 0 || g->in_h < 1 || g->in_w < 1 || g->out_h < 1 || g->out_w < 1)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "adaptive_avg_pool2d: invalid geometry");
    int64_t total = g->planes * g->out_h * g->out_w;
    if (total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "adaptive_avg_pool2d"));
    cudaStream_t s = impl_of(b)->stream;
    /* (oy + 1) * in_h is formed in the index type: keep it in range */
    int64_t reach = g->planes * g->in_h * g->in_w + (g->out_h + 1) * g->in_h +
                    (g->out_w + 1) * g->in_w;
    if (fits_int32(total) && fits_int32(reach)) {
        pool_dims<int> d = {(int)g->in_h, (int)g->in_w, (int)g->out_h, (int)g->out_w};
        k_adaptive_avg_pool2d<int><<<grid_for(total), THREADS, 0, s>>>(x, y, d, (int)total);
    } else {
        pool_dims<long long> d = {g->in_h, g->in_w, g->out_h, g->out_w};
        k_adaptive_avg_pool2d<long long><<<grid_for(total), THREADS, 0, s>>>(x, y, d,
                                                                             (long long)total);
    }
    LAUNCH_CHECK(b, "adaptive_avg_pool2d", "adaptive_avg_pool2d");
    return CKPT_OK;
}

static int cuda_lstm_cell(ckpt_backend *b, const float *gx, const float *gh,
                          const float *bias_hh, float *c, float *h, float *y, int64_t batch,
                          int64_t hidden, int64_t y_stride)
{
    if (batch < 0 || hidden < 0 || y_stride < hidden)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "lstm_cell: invalid sizes");
    int64_t total = batch * hidden;
    if (total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "lstm_cell"));
    cudaStream_t s = impl_of(b)->stream;
    // the furthest index formed: the gates' rows, and y's
    int64_t reach = batch * 4 * hidden + batch * y_stride;
    if (fits_int32(reach))
        k_lstm_cell<int><<<grid_for(total), THREADS, 0, s>>>(gx, gh, bias_hh, c, h, y, (int)hidden,
                                                             (int)y_stride, (int)total);
    else
        k_lstm_cell<long long><<<grid_for(total), THREADS, 0, s>>>(
            gx, gh, bias_hh, c, h, y, (long long)hidden, (long long)y_stride, (long long)total);
    LAUNCH_CHECK(b, "lstm_cell", "lstm_cell");
    return CKPT_OK;
}

static int cuda_relu(ckpt_backend *b, const float *x, float *y, size_t n)
{
    if (n == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "relu"));
    cudaStream_t s = impl_of(b)->stream;
    if (n <= (size_t)INT64_MAX && fits_int32((int64_t)n))
        k_relu<int><<<grid_for((int64_t)n), THREADS, 0, s>>>(x, y, (int)n);
    else
        k_relu<long long><<<grid_for((int64_t)n), THREADS, 0, s>>>(x, y, (long long)n);
    LAUNCH_CHECK(b, "relu", "relu");
    return CKPT_OK;
}

static int cuda_sigmoid(ckpt_backend *b, const float *x, float *y, size_t n)
{
    if (n == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "sigmoid"));
    cudaStream_t s = impl_of(b)->stream;
    if (n <= (size_t)INT64_MAX && fits_int32((int64_t)n))
        k_sigmoid<int><<<grid_for((int64_t)n), THREADS, 0, s>>>(x, y, (int)n);
    else
        k_sigmoid<long long><<<grid_for((int64_t)n), THREADS, 0, s>>>(x, y, (long long)n);
    LAUNCH_CHECK(b, "sigmoid", "sigmoid");
    return CKPT_OK;
}

static int cuda_softmax(ckpt_backend *b, const float *x, float *y, int64_t outer, int64_t dim,
                        int64_t inner)
{
    if (outer < 0 || dim < 0 || inner < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "softmax: negative size");
    if (outer == 0 || dim == 0 || inner == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, "softmax"));
    cudaStream_t s = impl_of(b)->stream;
    if (inner == 1) {
        // one warp per row, THREADS / 32 rows per block
        k_softmax_rows<<<grid_for(outer * 32), THREADS, 0, s>>>(x, y, outer, dim);
    } else {
        k_softmax_strided<<<grid_for(outer * inner), THREADS, 0, s>>>(x, y, outer, dim, inner);
    }
    LAUNCH_CHECK(b, "softmax", "softmax");
    return CKPT_OK;
}

// y = the ND output dims SZ of x read at strides STR (TOTAL elements): one
// copy where they are a contiguous run of x, else k_permute, in 32-bit
// indices when NARROW (permute and strided_copy alike).
static int gather_dims(ckpt_backend *b, const char *op, const float *x, float *y, int nd,
                       const int64_t *sz, const int64_t *str, int64_t total, bool narrow)
{
    cudaStream_t s = impl_of(b)->stream;
    if (nd == 0 || (nd == 1 && str[0] == 1)) {
        CUDA_TRY(b, op, "cudaMemcpyAsync",
                 cudaMemcpyAsync(y, x, (size_t)total * sizeof(float), cudaMemcpyDeviceToDevice,
                                 s));
        return CKPT_OK;
    }
    if (narrow) {
        permute_dims<int> d = {};
        d.ndim = nd;
        for (int k = 0; k < nd; k++)
            d.out_shape[k] = (int)sz[k], d.in_stride[k] = (int)str[k];
        k_permute<int><<<grid_for(total), THREADS, 0, s>>>(x, y, d, (int)total);
    } else {
        permute_dims<long long> d = {};
        d.ndim = nd;
        for (int k = 0; k < nd; k++)
            d.out_shape[k] = sz[k], d.in_stride[k] = str[k];
        k_permute<long long><<<grid_for(total), THREADS, 0, s>>>(x, y, d, total);
    }
    LAUNCH_CHECK(b, op, "k_permute");
    return CKPT_OK;
}

static int cuda_permute(ckpt_backend *b, const float *x, float *y, int ndim,
                        const int64_t *shape, const int *perm)
{
    const char *op = "permute";
    if (ndim < 0 || ndim > CKPT_RT_MAX_DIMS)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: %d dimensions (at most %d)", op, ndim,
                                 CKPT_RT_MAX_DIMS);
    int seen[CKPT_RT_MAX_DIMS] = {0};
    int64_t total = 1;
    for (int k = 0; k < ndim; k++) {
        if (perm[k] < 0 || perm[k] >= ndim || seen[perm[k]]++)
            return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: not a permutation", op);
        if (shape[k] < 0)
            return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
        total *= shape[k];
    }
    if (total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));

    int64_t in_stride[CKPT_RT_MAX_DIMS];
    for (int k = ndim - 1, st = 1; k >= 0; k--) {
        in_stride[k] = st;
        st *= shape[k];
    }
    // Output dims in order, with their strides in x; size-1 dims dropped
    // and neighbours merged where x walks them as one dim (outer stride ==
    // inner size * inner stride), so most permutes need few divisions.
    int64_t sz[CKPT_RT_MAX_DIMS], str[CKPT_RT_MAX_DIMS];
    int nd = 0;
    for (int k = 0; k < ndim; k++) {
        int64_t size = shape[perm[k]], stride = in_stride[perm[k]];
        if (size == 1)
            continue;
        if (nd > 0 && str[nd - 1] == size * stride) {
            sz[nd - 1] *= size;
            str[nd - 1] = stride;
        } else {
            sz[nd] = size;
            str[nd] = stride;
            nd++;
        }
    }
    // x's strides below total: 32-bit indices when total fits
    return gather_dims(b, op, x, y, nd, sz, str, total, fits_int32(total));
}

static int cuda_copy_rows(ckpt_backend *b, const float *x, int64_t x_stride, float *y,
                          int64_t y_stride, int64_t rows, int64_t len)
{
    const char *op = "copy_rows";
    if (x_stride < 0 || y_stride < 0 || rows < 0 || len < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
    if (rows == 0 || len == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    cudaStream_t s = impl_of(b)->stream;
    if ((x_stride == len && y_stride == len) || rows == 1) {
        CUDA_TRY(b, op, "cudaMemcpyAsync",
                 cudaMemcpyAsync(y, x, (size_t)(rows * len) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, s));
        return CKPT_OK;
    }
    const int64_t total = rows * len;
    const int64_t reach = (rows - 1) * (x_stride > y_stride ? x_stride : y_stride) + len;
    if (fits_int32(total) && fits_int32(reach))
        k_copy_rows<int><<<grid_for(total), THREADS, 0, s>>>(x, (int)x_stride, y, (int)y_stride,
                                                             (int)len, (int)total);
    else
        k_copy_rows<long long><<<grid_for(total), THREADS, 0, s>>>(x, x_stride, y, y_stride, len,
                                                                   total);
    LAUNCH_CHECK(b, op, "copy_rows");
    return CKPT_OK;
}

// ---- the transformer ops ------------------------------------------------------------

static int cuda_unary(ckpt_backend *b, int kind, const float *x, float *y, size_t n, float s)
{
    const char *op = "unary";
    if (kind < 0 || kind >= CKPT_U_COUNT)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: unknown function %d", op, kind);
    if (n == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    cudaStream_t st = impl_of(b)->stream;
    if (n <= (size_t)INT64_MAX && fits_int32((int64_t)n))
        k_unary<int><<<grid_for((int64_t)n), THREADS, 0, st>>>(kind, x, y, (int)n, s);
    else
        k_unary<long long><<<grid_for((int64_t)n), THREADS, 0, st>>>(kind, x, y, (long long)n,
                                                                     s);
    LAUNCH_CHECK(b, op, "unary");
    return CKPT_OK;
}

// Checks NDIM and the sizes; *TOTAL gets the product.
static int check_dims(ckpt_backend *b, const char *op, int ndim, const int64_t *shape,
                      int64_t *total)
{
    if (ndim < 0 || ndim > CKPT_RT_MAX_DIMS)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: %d dimensions (at most %d)", op, ndim,
                                 CKPT_RT_MAX_DIMS);
    int64_t t = 1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0)
            return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
        t *= shape[k];
    }
    *total = t;
    return CKPT_OK;
}

static int cuda_binary(ckpt_backend *b, int kind, const float *a, const float *x, float *y,
                       int ndim, const int64_t *shape, const int64_t *a_strides,
                       const int64_t *x_strides)
{
    const char *op = "binary";
    if (kind < 0 || kind >= CKPT_B_COUNT)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: unknown operator %d", op, kind);
    int64_t total;
    RETURN_IF(check_dims(b, op, ndim, shape, &total));
    for (int k = 0; k < ndim; k++)
        if (a_strides[k] < 0 || x_strides[k] < 0)
            return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative stride", op);
    if (total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    cudaStream_t st = impl_of(b)->stream;
    // size-1 dims dropped, and neighbours merged where both operands walk
    // them as one dim: fewer divisions per element
    int64_t sz[CKPT_RT_MAX_DIMS], as[CKPT_RT_MAX_DIMS], xs[CKPT_RT_MAX_DIMS];
    int nd = 0;
    int64_t a_reach = 0, x_reach = 0; // the furthest element each operand reads
    for (int k = 0; k < ndim; k++) {
        if (shape[k] == 1)
            continue;
        a_reach += (shape[k] - 1) * a_strides[k];
        x_reach += (shape[k] - 1) * x_strides[k];
        if (nd > 0 && as[nd - 1] == shape[k] * a_strides[k] &&
            xs[nd - 1] == shape[k] * x_strides[k]) {
            sz[nd - 1] *= shape[k];
            as[nd - 1] = a_strides[k];
            xs[nd - 1] = x_strides[k];
        } else {
            sz[nd] = shape[k];
            as[nd] = a_strides[k];
            xs[nd] = x_strides[k];
            nd++;
        }
    }
    if (fits_int32(total) && fits_int32(a_reach) && fits_int32(x_reach)) {
        binary_dims<int> d = {};
        d.ndim = nd;
        for (int k = 0; k < nd; k++)
            d.shape[k] = (int)sz[k], d.a_stride[k] = (int)as[k], d.x_stride[k] = (int)xs[k];
        k_binary<int><<<grid_for(total), THREADS, 0, st>>>(kind, a, x, y, d, (int)total);
    } else {
        binary_dims<long long> d = {};
        d.ndim = nd;
        for (int k = 0; k < nd; k++)
            d.shape[k] = sz[k], d.a_stride[k] = as[k], d.x_stride[k] = xs[k];
        k_binary<long long><<<grid_for(total), THREADS, 0, st>>>(kind, a, x, y, d, total);
    }
    LAUNCH_CHECK(b, op, "binary");
    return CKPT_OK;
}

// A gather through k_permute (its "in_stride" being x's strides here).
static int cuda_strided_copy(ckpt_backend *b, const float *x, int64_t offset, float *y,
                             int ndim, const int64_t *shape, const int64_t *strides)
{
    const char *op = "strided_copy";
    int64_t total;
    RETURN_IF(check_dims(b, op, ndim, shape, &total));
    if (offset < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative offset", op);
    for (int k = 0; k < ndim; k++)
        if (strides[k] < 0)
            return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative stride", op);
    if (total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    int64_t sz[CKPT_RT_MAX_DIMS], str[CKPT_RT_MAX_DIMS];
    int nd = 0;
    int64_t reach = 0;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] == 1)
            continue;
        reach += (shape[k] - 1) * strides[k];
        if (nd > 0 && str[nd - 1] == shape[k] * strides[k]) {
            sz[nd - 1] *= shape[k];
            str[nd - 1] = strides[k];
        } else {
            sz[nd] = shape[k];
            str[nd] = strides[k];
            nd++;
        }
    }
    const float *xo = x + offset;
    return gather_dims(b, op, xo, y, nd, sz, str, total,
                       fits_int32(total) && fits_int32(reach));
}

static int cuda_reduce(ckpt_backend *b, int kind, const float *x, float *y, int64_t outer,
                       int64_t dim, int64_t inner)
{
    const char *op = "reduce";
    if (kind < 0 || kind >= CKPT_R_COUNT)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: unknown reduction %d", op, kind);
    if (outer < 0 || dim < 0 || inner < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
    if (outer == 0 || inner == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    cudaStream_t st = impl_of(b)->stream;
    int mean = kind == CKPT_R_MEAN;
    if (dim == 0) // torch: the sum of nothing is 0, its mean 0 / 0 = NaN
        k_fill<<<grid_for(outer * inner), THREADS, 0, st>>>(y, mean ? NAN : 0.0f,
                                                           outer * inner);
    else if (inner == 1)
        k_reduce_rows<<<grid_for(outer * 32), THREADS, 0, st>>>(x, y, outer, dim, mean);
    else
        k_reduce_strided<<<grid_for(outer * inner), THREADS, 0, st>>>(x, y, outer, dim, inner,
                                                                      mean);
    LAUNCH_CHECK(b, op, "reduce");
    return CKPT_OK;
}

static unsigned grid_rows(int64_t rows)
{
    return (unsigned)(rows < MAX_BLOCKS ? rows : MAX_BLOCKS);
}

static int cuda_layer_norm(ckpt_backend *b, const float *x, const float *w, const float *bias,
                           float *y, int64_t rows, int64_t d, float eps)
{
    const char *op = "layer_norm";
    if (rows < 0 || d < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
    if (rows == 0 || d == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    k_layer_norm<<<grid_rows(rows), THREADS, 0, impl_of(b)->stream>>>(x, w, bias, y, rows, d,
                                                                      eps);
    LAUNCH_CHECK(b, op, "layer_norm");
    return CKPT_OK;
}

static int cuda_rms_norm(ckpt_backend *b, const float *x, const float *w, float *y,
                         int64_t rows, int64_t d, float eps)
{
    const char *op = "rms_norm";
    if (rows < 0 || d < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
    if (rows == 0 || d == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    k_rms_norm<<<grid_rows(rows), THREADS, 0, impl_of(b)->stream>>>(x, w, y, rows, d, eps);
    LAUNCH_CHECK(b, op, "rms_norm");
    return CKPT_OK;
}

static int cuda_embedding(ckpt_backend *b, const float *ids, const float *w, float *y,
                          int64_t n, int64_t vocab, int64_t d)
{
    const char *op = "embedding";
    if (n < 0 || vocab < 0 || d < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
    int64_t total = n * d;
    if (n == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    cuda_impl *c = impl_of(b);
    const unsigned long long serial = ++c->emb_serial;
    c->emb_pending = 1;
    if (d == 0) // nothing to copy, but the ids are checked all the same
        k_embedding_ids<<<grid_for(n), THREADS, 0, c->stream>>>(ids, n, vocab, c->emb_err,
                                                                serial);
    else if (fits_int32(total) && fits_int32(vocab * d))
        k_embedding<int><<<grid_for(total), THREADS, 0, c->stream>>>(
            ids, w, y, (int)d, vocab, (int)total, c->emb_err, serial);
    else
        k_embedding<long long><<<grid_for(total), THREADS, 0, c->stream>>>(
            ids, w, y, (long long)d, vocab, (long long)total, c->emb_err, serial);
    LAUNCH_CHECK(b, op, "embedding");
    return CKPT_OK;
}

static int cuda_matmul(ckpt_backend *b, const float *a, const float *x, float *y, int64_t batch,
                       int64_t m, int64_t k, int64_t n, int64_t a_stride, int64_t x_stride)
{
    const char *op = "matmul";
    if (batch < 0 || m < 0 || k < 0 || n < 0 || a_stride < 0 || x_stride < 0)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: negative size", op);
    if (batch == 0 || m == 0 || n == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    if (k == 0) {
        CUDA_TRY(b, op, "cudaMemsetAsync",
                 cudaMemsetAsync(y, 0, (size_t)(batch * m * n) * sizeof(float),
                                 impl_of(b)->stream));
        return CKPT_OK;
    }
    // Row-major y[t] [m, n] = a[t] [m, k] @ x[t] [k, n] is, column-major,
    // y[t]^T [n, m] = x[t]^T [n, k] * a[t]^T [k, m]: each stored as it is.
    if (x_stride == 0 && (batch == 1 || a_stride == m * k)) {
        // one x for every a[t], the a[t] back to back (x @ W, W a weight):
        // one product of the stacked rows [batch * m, k] @ x
        RETURN_IF(gemm_check_dims(b, op, n, batch * m, k));
        return gemm(b, op, CKPT_CUBLAS_OP_N, CKPT_CUBLAS_OP_N, n, batch * m, k, x, n, 0, a, k, 0,
                    y, n, 0, 1);
    }
    RETURN_IF(gemm_check_dims(b, op, n, m, k));
    // a stride 0 (a broadcast operand) is a valid stride for cuBLAS
    for (int64_t t0 = 0; t0 < batch; t0 += MAX_GEMM_BATCH) {
        int64_t nb = batch - t0 < MAX_GEMM_BATCH ? batch - t0 : MAX_GEMM_BATCH;
        RETURN_IF(gemm(b, op, CKPT_CUBLAS_OP_N, CKPT_CUBLAS_OP_N, n, m, k, x + t0 * x_stride, n,
                       x_stride, a + t0 * a_stride, k, a_stride, y + t0 * m * n, n, m * n, nb));
    }
    return CKPT_OK;
}

// scaled_dot_product_attention as torch's math kernel computes it: the
// scores by cuBLAS, softmax (scale, mask, causal) by k_attn_softmax, then
// the scores times v by cuBLAS.  The GROUP = heads / kv_heads query heads
// that share a key-value head are back to back in q and y, so each (batch,
// kv head) pair is one product of [group * q_len, head_dim] rows: no copy of
// k or v per query head.  The scores live in the working memory, for as
// many pairs at a time as SCRATCH_TARGET_BYTES allows (at least one).
static int cuda_attention(ckpt_backend *b, const float *q, const float *k, const float *v,
                          const float *mask, float *y, const ckpt_attn_geom *g)
{
    const char *op = "attention";
    if (g->batch < 0 || g->heads < 0 || g->kv_heads < 1 || g->q_len < 0 || g->kv_len < 0 ||
        g->head_dim < 0 || g->v_dim < 0 || g->heads % g->kv_heads != 0 ||
        (mask && (g->mask_strides[0] < 0 || g->mask_strides[1] < 0 ||
                  g->mask_strides[2] < 0 || g->mask_strides[3] < 0)))
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%s: invalid geometry", op);
    const int64_t B = g->batch, H = g->heads, L = g->q_len, S = g->kv_len, E = g->head_dim,
                  Ev = g->v_dim;
    const int64_t y_total = B * H * L * Ev;
    if (y_total == 0)
        return CKPT_OK;
    RETURN_IF(cuda_enter(b, op));
    cuda_impl *c = impl_of(b);
    if (S == 0) { // no key: the softmax of nothing times nothing
        CUDA_TRY(b, op, "cudaMemsetAsync",
                 cudaMemsetAsync(y, 0, (size_t)y_total * sizeof(float), c->stream));
        return CKPT_OK;
    }
    const int64_t group = H / g->kv_heads, pairs = B * g->kv_heads, gl = group * L;
    RETURN_IF(gemm_check_dims(b, op, S, gl, E));
    RETURN_IF(gemm_check_dims(b, op, Ev, gl, S));
    const int64_t per_pair = gl * S;
    const int64_t chunk = images_per_chunk(pairs, per_pair);
    float *p;
    RETURN_IF(cuda_scratch(b, op, (size_t)(chunk * per_pair), &p));
    attn_dims d;
    d.heads = H;
    d.q_len = L;
    d.kv_len = S;
    d.ms0 = g->mask_strides[0];
    d.ms1 = g->mask_strides[1];
    d.ms2 = g->mask_strides[2];
    d.ms3 = g->mask_strides[3];
    d.scale = (float)g->scale;
    d.causal = g->causal != 0;
    for (int64_t t0 = 0; t0 < pairs; t0 += chunk) {
        const int64_t nb = pairs - t0 < chunk ? pairs - t0 : chunk;
        // scores^T [S, gl] = k^T (k stored as the column-major [E, S]) *
        // q (the column-major [E, gl])
        if (E == 0)
            CUDA_TRY(b, op, "cudaMemsetAsync",
                     cudaMemsetAsync(p, 0, (size_t)(nb * per_pair) * sizeof(float), c->stream));
        else
            RETURN_IF(gemm(b, op, CKPT_CUBLAS_OP_T, CKPT_CUBLAS_OP_N, S, gl, E, k + t0 * S * E, E,
                           S * E, q + t0 * gl * E, E, gl * E, p, S, per_pair, nb));
        const int64_t rows = nb * gl;
        k_attn_softmax<<<grid_for(rows * 32), THREADS, 0, c->stream>>>(p, mask, t0 * gl, rows,
                                                                        d);
        LAUNCH_CHECK(b, op, "attention softmax");
        // y^T [Ev, gl] = v (the column-major [Ev, S]) * p^T (the column-major [S, gl])
        RETURN_IF(gemm(b, op, CKPT_CUBLAS_OP_N, CKPT_CUBLAS_OP_N, Ev, gl, S, v + t0 * S * Ev, Ev,
                       S * Ev, p, S, per_pair, y + t0 * gl * Ev, Ev, gl * Ev, nb));
    }
    return CKPT_OK;
}

// ---- open / destroy ---------------------------------------------------------------

static void cuda_destroy(ckpt_backend *b)
{
    if (!b)
        return;
    cuda_impl *c = impl_of(b);
    if (c) {
        // errors are of no use here: free what can be freed
        if (cudaSetDevice(c->device) == cudaSuccess) {
            if (c->stream)
                cudaStreamSynchronize(c->stream);
            for (size_t i = 0; i < c->nblocks; i++)
                cudaFree(c->blocks[i].p);
            if (c->scratch)
                cudaFree(c->scratch);
            if (c->emb_err)
                cudaFree(c->emb_err);
            if (c->cublas)
                cublas_api.destroy(c->cublas);
#if CKPT_WITH_CUDNN
            for (size_t i = 0; i < c->nplans; i++) {
                if (c->plans[i].x)
                    cudnn_api.destroy_tensor(c->plans[i].x);
                if (c->plans[i].y)
                    cudnn_api.destroy_tensor(c->plans[i].y);
                if (c->plans[i].w)
                    cudnn_api.destroy_filter(c->plans[i].w);
                if (c->plans[i].conv)
                    cudnn_api.destroy_conv(c->plans[i].conv);
            }
            if (c->cudnn_x)
                cudnn_api.destroy_tensor(c->cudnn_x);
            if (c->cudnn_y)
                cudnn_api.destroy_tensor(c->cudnn_y);
            if (c->cudnn_w)
                cudnn_api.destroy_filter(c->cudnn_w);
            if (c->cudnn_conv)
                cudnn_api.destroy_conv(c->cudnn_conv);
            if (c->cudnn)
                cudnn_api.destroy(c->cudnn);
#endif
            if (c->stream)
                cudaStreamDestroy(c->stream);
        }
        (void)cudaGetLastError();
        free(c->blocks);
#if CKPT_WITH_CUDNN
        free(c->plans);
#endif
        free(c);
    }
    free(b);
}

static int cuda_set_flags(ckpt_backend *b, unsigned flags);

// In runtime/backend.h's order (C++17 has no designated initializers); the
// assertion catches an op added there and not here.
static_assert(sizeof(ckpt_backend_ops) == 34 * sizeof(void (*)(void)),
              "ckpt_backend_ops changed: update cuda_ops");
static const ckpt_backend_ops cuda_ops = {
    cuda_destroy,    cuda_alloc,  cuda_release, cuda_upload,    cuda_download,
    cuda_linear,     cuda_conv2d, cuda_conv_transpose2d,
    cuda_max_pool2d, cuda_l2norm, cuda_relu,    cuda_sigmoid,   cuda_softmax,   cuda_permute,
    cuda_copy_rows,  cuda_batch_norm, cuda_add, cuda_adaptive_avg_pool2d, cuda_lstm_cell,
    cuda_synchronize,
    nullptr, // conv2d_fused: the executor runs conv2d, add and relu one by one
    // the transformer ops (ABI 2)
    cuda_unary, cuda_binary, cuda_strided_copy, cuda_reduce, cuda_layer_norm, cuda_rms_norm,
    cuda_embedding, cuda_matmul, cuda_attention,
    // ABI 3
    cuda_set_flags,
    // ABI 4
    nullptr, // borrow: inputs are uploaded to the device
    nullptr, // linear_relu: the executor runs linear, then relu
    nullptr, // conv_transpose2d_act: then the activation
};

// cuDNN for a new backend: a handle on its stream and the descriptors the
// convolutions reuse.  Never fatal: without it the convolutions run on our
// kernels, and cudnn_text says why.
static void cudnn_open(ckpt_backend *b)
{
    cuda_impl *c = impl_of(b);
#if CKPT_WITH_CUDNN
    const char *env = getenv("CKPT_CUDNN");
    if (env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0)) {
        snprintf(c->cudnn_text, sizeof c->cudnn_text, "no cuDNN: CKPT_CUDNN=%s", env);
        return;
    }
    pthread_once(&cudnn_once, cudnn_load);
    if (!cudnn_loaded) {
        snprintf(c->cudnn_text, sizeof c->cudnn_text, "no cuDNN: %s", cudnn_error);
        return;
    }
    const char *what = "cudnnCreate";
    cudnnStatus_t st = cudnn_api.create(&c->cudnn);
    if (st != CUDNN_STATUS_SUCCESS)
        c->cudnn = NULL;
    else if ((what = "cudnnSetStream", st = cudnn_api.set_stream(c->cudnn, c->stream)) ==
                 CUDNN_STATUS_SUCCESS &&
             (what = "cudnnCreateTensorDescriptor",
              st = cudnn_api.create_tensor(&c->cudnn_x)) == CUDNN_STATUS_SUCCESS &&
             (st = cudnn_api.create_tensor(&c->cudnn_y)) == CUDNN_STATUS_SUCCESS &&
             (what = "cudnnCreateFilterDescriptor",
              st = cudnn_api.create_filter(&c->cudnn_w)) == CUDNN_STATUS_SUCCESS)
        what = "cudnnCreateConvolutionDescriptor", st = cudnn_api.create_conv(&c->cudnn_conv);
    if (st != CUDNN_STATUS_SUCCESS) {
        // what was made is freed at destroy; without the handle none is used
        if (c->cudnn)
            cudnn_api.destroy(c->cudnn);
        c->cudnn = NULL;
        (void)cudaGetLastError();
        snprintf(c->cudnn_text, sizeof c->cudnn_text, "no cuDNN: %s: %.50s", what,
                 cudnn_status_text(st));
        return;
    }
    snprintf(c->cudnn_text, sizeof c->cudnn_text, "cuDNN %d.%d.%d", cudnn_version / 10000,
             cudnn_version / 100 % 100, cudnn_version % 100);
#else
    snprintf(c->cudnn_text, sizeof c->cudnn_text, "no cuDNN: built without cudnn.h");
#endif
}

// "cuda:0 (NVIDIA H200, CUDA runtime 13.0, cuBLAS 13.1.0, cuDNN 9.13.0, TF32 off)"
static void cuda_describe(ckpt_backend *b)
{
    cuda_impl *c = impl_of(b);
    snprintf(b->description, sizeof b->description, "%s, %.72s, TF32 %s)", c->base_text,
             c->no_cudnn ? "no cuDNN: turned off for this backend" : c->cudnn_text,
             c->tf32 ? "on" : "off");
}

static int cuda_set_flags(ckpt_backend *b, unsigned flags)
{
    if (flags & ~(unsigned)(CKPT_BACKEND_TF32 | CKPT_RT_NO_CUDNN))
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "set_flags: unknown flags 0x%x", flags);
    cuda_impl *c = impl_of(b);
    const int tf32 = (flags & CKPT_BACKEND_TF32) != 0;
    // TF32 as torch.backends.cuda.matmul.allow_tf32 = True sets it; else
    // pedantic: FP32 products in FP32 only (no TF32, no BF16x9 emulation,
    // whatever the environment asks), the point of ckpt verify being fidelity
    int st = cublas_api.set_math_mode(c->cublas, tf32 ? CKPT_CUBLAS_TF32_TENSOR_OP_MATH
                                                       : CKPT_CUBLAS_PEDANTIC_MATH);
    if (st != CKPT_CUBLAS_STATUS_SUCCESS)
        return ckpt_backend_fail(b, CKPT_ERR_DEVICE, "set_flags: cublasSetMathMode: %s",
                                 cublas_status_text(st));
    c->tf32 = tf32;
    c->no_cudnn = (flags & CKPT_RT_NO_CUDNN) != 0;
    cuda_describe(b);
    return CKPT_OK;
}

// Fails with CKPT_ERR_DEVICE: B (if any) is destroyed, the message goes to ERR.
static int open_fail(ckpt_backend *b, char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int open_fail(ckpt_backend *b, char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();
    cuda_destroy(b);
    return CKPT_ERR_DEVICE;
}

static int cuda_open(int device, ckpt_backend **out, char *err, size_t cap)
{
    char dummy[8];
    if (!err || !cap) {
        err = dummy;
        cap = sizeof dummy;
    }
    err[0] = '\0';
    if (!out) {
        snprintf(err, cap, "cuda: no place for the backend");
        return CKPT_ERR_USAGE;
    }
    *out = NULL;

    int count = 0;
    int rc = ckpt_cuda_device_count(&count);
    if (rc != 0)
        return open_fail(NULL, err, cap, "cuda:%d: no usable CUDA driver: %s", device,
                         cudaGetErrorString((cudaError_t)rc));
    if (count == 0)
        return open_fail(NULL, err, cap, "cuda:%d: no CUDA device found", device);
    if (device < 0 || device >= count)
        return open_fail(NULL, err, cap, "cuda:%d: no such device (this machine has %d)", device,
                         count);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return open_fail(NULL, err, cap, "cuda:%d: cudaSetDevice: %s", device,
                         cudaGetErrorString(e));
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return open_fail(NULL, err, cap, "cuda:%d: cudaGetDeviceProperties: %s", device,
                         cudaGetErrorString(e));
    pthread_once(&cublas_once, cublas_load);
    if (!cublas_loaded)
        return open_fail(NULL, err, cap, "cuda:%d: %s", device, cublas_error);

    ckpt_backend *b = (ckpt_backend *)calloc(1, sizeof *b);
    cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        snprintf(err, cap, "cuda:%d: out of memory", device);
        return CKPT_ERR_NOMEM;
    }
    b->ops = &cuda_ops;
    b->impl = c;
    c->device = device;
    snprintf(b->device, sizeof b->device, "cuda:%d", device);

    // non-blocking: the legacy default stream (other libraries' work) does
    // not serialize with ours
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return open_fail(b, err, cap, "%s: cudaStreamCreate: %s", b->device,
                         cudaGetErrorString(e));
    int st = cublas_api.create(&c->cublas);
    if (st != CKPT_CUBLAS_STATUS_SUCCESS) {
        c->cublas = NULL;
        return open_fail(b, err, cap, "%s: cublasCreate: %s", b->device, cublas_status_text(st));
    }
    void *ep = NULL;
    e = cudaMalloc(&ep, sizeof(emb_error));
    if (e != cudaSuccess)
        return open_fail(b, err, cap, "%s: cudaMalloc: %s", b->device, cudaGetErrorString(e));
    c->emb_err = (emb_error *)ep;
    if (emb_reset(b, "open") != CKPT_OK)
        return open_fail(b, err, cap, "%s: %s", b->device, b->message);
    st = cublas_api.set_stream(c->cublas, c->stream);
    if (st != CKPT_CUBLAS_STATUS_SUCCESS)
        return open_fail(b, err, cap, "%s: cublasSetStream: %s", b->device,
                         cublas_status_text(st));
    cudnn_open(b);

    int rt = 0, blas = 0;
    cudaRuntimeGetVersion(&rt);
    if (cublas_api.get_version)
        cublas_api.get_version(c->cublas, &blas);
    char blas_text[32] = "cuBLAS";
    if (blas > 0) // major * 10000 + minor * 100 + patch since cuBLAS 11
        snprintf(blas_text, sizeof blas_text, "cuBLAS %d.%d.%d", blas / 10000,
                 blas / 100 % 100, blas % 100);
    snprintf(c->base_text, sizeof c->base_text, "%s (%.60s, CUDA runtime %d.%d, %s",
             b->device, prop.name, rt / 1000, rt % 1000 / 10, blas_text);
    // strict FP32 until set_flags says otherwise; it writes the description
    if (cuda_set_flags(b, 0) != CKPT_OK)
        return open_fail(b, err, cap, "%s", b->message);
    *out = b;
    return CKPT_OK;
}

// "auto" takes a GPU when there is one.
static int cuda_probe(char *why, size_t cap)
{
    int count = 0;
    if (ckpt_cuda_device_count(&count) != 0 || count <= 0) {
        snprintf(why, cap, "no GPU found");
        return 0;
    }
    return count;
}

// "cuDNN 9.13.0 (FILE)", or "no cuDNN: WHY"; loads it if not yet.  Returns
// its version (91300), or 0.
static int cuda_cudnn_describe(char *buf, size_t cap)
{
#if CKPT_WITH_CUDNN
    const char *env = getenv("CKPT_CUDNN");
    if (env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0)) {
        snprintf(buf, cap, "no cuDNN: CKPT_CUDNN=%s", env);
        return 0;
    }
    pthread_once(&cudnn_once, cudnn_load);
    if (!cudnn_loaded) {
        snprintf(buf, cap, "no cuDNN: %s", cudnn_error);
        return 0;
    }
    char file[PATH_MAX];
    cudnn_file(file, sizeof file);
    snprintf(buf, cap, "cuDNN %d.%d.%d (%s)", cudnn_version / 10000, cudnn_version / 100 % 100,
             cudnn_version % 100, file);
    return cudnn_version;
#else
    snprintf(buf, cap, "no cuDNN: built without cudnn.h");
    return 0;
#endif
}

// The convolutions B ran through cuDNN and through our kernels (tests).
static int cuda_conv_counts(const ckpt_backend *b, unsigned long long *cudnn,
                            unsigned long long *own)
{
    const cuda_impl *c = (const cuda_impl *)b->impl;
    *cudnn = c->conv_cudnn;
    *own = c->conv_own;
    return 0;
}

// In runtime/backend.h's order (no designated initializers in C++17).
static_assert(sizeof(ckpt_backend_desc) == 2 * sizeof(const char *) + 2 * sizeof(int) +
                                               2 * sizeof(void (*)(void)),
              "ckpt_backend_desc changed: update cuda_desc");
static const ckpt_backend_desc cuda_desc = {
    "cuda",     // name
    "CUDA",     // title
    1,          // indexed: cuda:N
    0,          // fallback
    cuda_probe, // probe
    cuda_open,  // open
};

// The module's one export (the build hides every other symbol): what
// lib/runtime/backend_cuda.c checks before it calls anything here.
static_assert(sizeof(ckpt_cuda_module) == 5 * sizeof(uint32_t) + 4 /* padding */ +
                                              sizeof(const char *) + 7 * sizeof(void (*)(void)),
              "ckpt_cuda_module changed: update ckpt_cuda_module_entry");
extern "C" const ckpt_cuda_module ckpt_cuda_module_entry = {
    CKPT_CUDA_MODULE_ABI,
    (uint32_t)sizeof(ckpt_cuda_module),
    (uint32_t)sizeof(ckpt_backend),
    (uint32_t)sizeof(ckpt_backend_ops),
    (uint32_t)sizeof(ckpt_backend_desc),
    PACKAGE_VERSION,
    ckpt_cuda_runtime_version,
    ckpt_cuda_device_count,
    ckpt_cuda_device_name,
    ckpt_cuda_strerror,
    &cuda_desc,
    cuda_conv_counts,
    cuda_cudnn_describe,
};
