/*
 * runtime/backend_cuda.c - the CUDA backend as libckpt sees it: the module
 * libckpt_cuda.so (kernels/, built with nvcc and linked against libcudart),
 * loaded with dlopen the first time a CUDA device is asked for, so that
 * libckpt and the ckpt binary need no CUDA library at all and one build
 * serves CPU-only and GPU machines.  Its descriptor, ckpt_backend_cuda,
 * forwards to the module's; when the module or the CUDA runtime it needs
 * is absent, the descriptor says why ("auto" then takes the CPU; "cuda"
 * is an error naming what is missing).
 *
 * Where the module is looked for, first found wins:
 *   1. $CKPT_CUDA_MODULE, a file path, when set and not empty (alone: an
 *      explicit choice is never replaced by another module);
 *   2. beside the object that holds this code (libckpt.so, or the program
 *      libckpt is linked into), found with dladdr: DIR, DIR/ckpt,
 *      DIR/../lib, DIR/../lib/ckpt (an installed tree, the portable
 *      folder, the wheel's _native/lib);
 *   3. the install folder, $(pkglibdir) (CKPT_PKGLIBDIR).
 * The module is checked before use: its table's ABI number and the sizes
 * of the structs both sides share (kernels/ckpt_cuda.h).
 */
#include "core/core.h"
#include "kernels/ckpt_cuda.h"
#include "runtime/backends.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Loaded once per process and never unloaded: the CUDA runtime keeps
 * process-wide state and threads. */
static pthread_once_t module_once = PTHREAD_ONCE_INIT;
static const ckpt_cuda_module *module;
static char module_path[PATH_MAX];
static char module_why[640];

/* The folder of the file that holds this code: libckpt.so, or the program
 * when libckpt is linked in statically (its dladdr name is then argv[0],
 * which may be no path at all: /proc/self/exe is asked instead). */
static int own_folder(char *dir, size_t cap)
{
    Dl_info info;
    struct link_map *map = NULL;
    char file[PATH_MAX];
    if (!dladdr1((void *)own_folder, &info, (void **)&map, RTLD_DL_LINKMAP))
        return -1;
    if (map && map->l_name && map->l_name[0] && info.dli_fname) {
        if (!realpath(info.dli_fname, file))
            return -1;
    } else {
        ssize_t n = readlink("/proc/self/exe", file, sizeof file - 1);
        if (n <= 0)
            return -1;
        file[n] = '\0';
    }
    char *slash = strrchr(file, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    snprintf(dir, cap, "%s", file[0] ? file : "/");
    return 0;
}

/* dlopen PATH and check its table: 0 (module set) or -1 with module_why. */
static int load(const char *path)
{
    snprintf(module_path, sizeof module_path, "%s", path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        /* dlerror names the missing library: "libcudart.so.13: cannot open
         * shared object file: No such file or directory" */
        const char *e = dlerror();
        snprintf(module_why, sizeof module_why, "%s", e ? e : "dlopen failed");
        if (!strstr(module_why, path)) {
            size_t len = strlen(module_why);
            snprintf(module_why + len, sizeof module_why - len, " (loading %s)", path);
        }
        return -1;
    }
    const ckpt_cuda_module *m = (const ckpt_cuda_module *)dlsym(h, CKPT_CUDA_MODULE_SYMBOL);
    if (!m) {
        snprintf(module_why, sizeof module_why, "%s: no %s: not a ckpt CUDA module", path,
                 CKPT_CUDA_MODULE_SYMBOL);
        dlclose(h);
        return -1;
    }
    if (m->abi != CKPT_CUDA_MODULE_ABI || m->size != sizeof(ckpt_cuda_module) ||
        m->backend_size != sizeof(ckpt_backend) || m->ops_size != sizeof(ckpt_backend_ops) ||
        m->desc_size != sizeof(ckpt_backend_desc) || !m->backend || !m->runtime_version ||
        !m->device_count) {
        /* its structs would not be ours: calling into it could corrupt memory */
        snprintf(module_why, sizeof module_why,
                 "%s: module ABI %u, this libckpt needs ABI %d (a module of another ckpt "
                 "build: install the one built with this ckpt)",
                 path, m->abi, CKPT_CUDA_MODULE_ABI);
        dlclose(h);
        return -1;
    }
    module = m;
    return 0;
}

static void find_module(void)
{
    const char *forced = getenv("CKPT_CUDA_MODULE");
    if (forced && *forced) {
        if (access(forced, F_OK) != 0)
            snprintf(module_why, sizeof module_why, "CKPT_CUDA_MODULE=%s: %s", forced,
                     strerror(errno));
        else
            load(forced);
        return;
    }
    char dir[PATH_MAX], tried[sizeof module_why] = "";
    const char *subs[] = {"", "/ckpt", "/../lib", "/../lib/ckpt"};
    size_t at = 0;
    if (own_folder(dir, sizeof dir) == 0)
        for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
            char path[PATH_MAX + 32];
            snprintf(path, sizeof path, "%s%s/%s", dir, subs[i], CKPT_CUDA_MODULE_FILE);
            if (access(path, F_OK) == 0) {
                /* named without "bin/.." in messages */
                char real[PATH_MAX];
                load(realpath(path, real) ? real : path);
                return;
            }
            if (at < sizeof tried)
                at += (size_t)snprintf(tried + at, sizeof tried - at, "%s%s%s",
                                       at ? ", " : "", dir, subs[i]);
        }
#ifdef CKPT_PKGLIBDIR
    {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/%s", CKPT_PKGLIBDIR, CKPT_CUDA_MODULE_FILE);
        if (access(path, F_OK) == 0) {
            load(path);
            return;
        }
        if (at < sizeof tried)
            snprintf(tried + at, sizeof tried - at, "%s%s", at ? ", " : "", CKPT_PKGLIBDIR);
    }
#endif
    snprintf(module_why, sizeof module_why, "%s not found (looked in %s; CKPT_CUDA_MODULE names it)",
             CKPT_CUDA_MODULE_FILE, tried[0] ? tried : "no folder");
}

static const ckpt_cuda_module *get_module(void)
{
    pthread_once(&module_once, find_module);
    return module;
}

/* The driver comes with the GPU: without libcuda.so.1 there is no GPU to
 * use, and "auto" need not load the module (and libcudart) to learn it. */
static int driver_present(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h)
        return 0;
    dlclose(h);
    return 1;
}

static int cuda_probe(char *why, size_t cap)
{
    if (!driver_present()) {
        snprintf(why, cap, "no GPU found");
        return 0;
    }
    const ckpt_cuda_module *m = get_module();
    if (!m) {
        snprintf(why, cap, "the CUDA backend is not loaded: %s", module_why);
        return 0;
    }
    return m->backend->probe(why, cap);
}

static int cuda_open(int index, ckpt_backend **out, char *err, size_t cap)
{
    const ckpt_cuda_module *m = get_module();
    if (!m) {
        snprintf(err, cap, "cuda:%d: the CUDA backend cannot be loaded: %s", index, module_why);
        return CKPT_ERR_DEVICE;
    }
    return m->backend->open(index, out, err, cap);
}

const ckpt_backend_desc ckpt_backend_cuda = {
    .name = "cuda",
    .title = "CUDA",
    .indexed = 1,
    .fallback = 0,
    .probe = cuda_probe,
    .open = cuda_open,
};

CKPT_API int ckpt_cuda_module_describe(char *buf, size_t cap)
{
    char dummy[8];
    if (!buf || !cap) {
        buf = dummy;
        cap = sizeof dummy;
    }
    const ckpt_cuda_module *m = get_module();
    if (!m) {
        snprintf(buf, cap, "%s", module_why);
        return 0;
    }
    int rt = 0, count = 0;
    char runtime[48] = "CUDA runtime unknown";
    if (m->runtime_version(&rt) == 0 && rt > 0)
        snprintf(runtime, sizeof runtime, "CUDA runtime %d.%d", rt / 1000, rt % 1000 / 10);
    int rc = m->device_count(&count);
    if (rc != 0 || count <= 0) {
        snprintf(buf, cap, "%s (%s, %s)",
                 rc != 0 && m->strerror ? m->strerror(rc) : "no GPU found", module_path, runtime);
        return 0;
    }
    snprintf(buf, cap, "%s, %s, %d GPU%s", module_path, runtime, count, count == 1 ? "" : "s");
    return count;
}
