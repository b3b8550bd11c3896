/* cuda_module_stub.c - a stand-in for the CUDA backend module, with no CUDA
 * in it, so that check_cuda_loader tests libckpt's loader on any machine:
 * built twice, as a module of this build's ABI whose "runtime" has no GPU
 * (tests/unit/.libs/cuda_module_stub.so) and with STUB_ABI_OFF set, as a
 * module of another ABI (cuda_module_stub_abi.so). */
#include "config.h"
#include "ckpt.h"
#include "kernels/ckpt_cuda.h"

#include <stdio.h>

#ifndef STUB_ABI_OFF
#define STUB_ABI_OFF 0
#endif

static int stub_runtime_version(int *version)
{
    *version = 12040; /* "12.4": not this machine's, so the test sees it is the stub's */
    return 0;
}

static int stub_device_count(int *count)
{
    *count = 0;
    return 0;
}

static int stub_device_name(int device, char *buf, int cap)
{
    (void)device, (void)buf, (void)cap;
    return 100; /* cudaErrorNoDevice */
}

static const char *stub_strerror(int status)
{
    return status ? "stub error" : "no error";
}

static int stub_probe(char *why, size_t cap)
{
    snprintf(why, cap, "stub: no GPU here");
    return 0;
}

static int stub_open(int index, ckpt_backend **out, char *err, size_t cap)
{
    *out = NULL;
    snprintf(err, cap, "cuda:%d: stub: no GPU here", index);
    return CKPT_ERR_DEVICE;
}

static const ckpt_backend_desc stub_desc = {
    .name = "cuda",
    .title = "CUDA",
    .indexed = 1,
    .fallback = 0,
    .probe = stub_probe,
    .open = stub_open,
};

const ckpt_cuda_module ckpt_cuda_module_entry = {
    .abi = CKPT_CUDA_MODULE_ABI + STUB_ABI_OFF,
    .size = sizeof(ckpt_cuda_module),
    .backend_size = sizeof(ckpt_backend),
    .ops_size = sizeof(ckpt_backend_ops),
    .desc_size = sizeof(ckpt_backend_desc),
    .version = PACKAGE_VERSION,
    .runtime_version = stub_runtime_version,
    .device_count = stub_device_count,
    .device_name = stub_device_name,
    .strerror = stub_strerror,
    .backend = &stub_desc,
};
