/* check_cuda_loader.c - how libckpt loads the CUDA backend module
 * (lib/runtime/backend_cuda.c), on any machine: stand-in modules
 * (cuda_module_stub.c) of this build's ABI and of another, a library that
 * is not a module, and none.  What each case must give: the reason in
 * ckpt_cuda_module_describe(), an error naming it for "cuda", the CPU for
 * "auto".  Each test runs in its own process, as the module is looked for
 * once per process: main forks even under CK_FORK=no (valgrind follows the
 * forks and checks each child). */
#include "ckpt.h"
#include "kernels/ckpt_cuda.h"
#include "unit.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STUB STUB_DIR "/cuda_module_stub.so"
#define STUB_ABI STUB_DIR "/cuda_module_stub_abi.so"

static void use_module(const char *path)
{
    ck_assert_int_eq(setenv("CKPT_CUDA_MODULE", path, 1), 0);
}

/* "cuda" fails naming WANT; "auto" runs on the CPU. */
static void cuda_refused(const char *want)
{
    ckpt_backend *b = NULL;
    char err[512];
    ck_assert_int_eq(ckpt_backend_open("cuda", &b, err, sizeof err), CKPT_ERR_DEVICE);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(err, want), "cuda: '%s' lacks '%s'", err, want);
    ck_assert_int_eq(ckpt_backend_open("auto", &b, err, sizeof err), CKPT_OK);
    ck_assert_str_eq(ckpt_backend_device(b), "cpu");
    ckpt_backend_free(b);
    ck_assert_int_eq(ckpt_cuda_device_count_usable(), 0);
}

START_TEST(test_missing_module)
{
    use_module("/nonexistent/libckpt_cuda.so");
    char why[700];
    ck_assert_int_eq(ckpt_cuda_module_describe(why, sizeof why), 0);
    ck_assert_str_eq(why, "CKPT_CUDA_MODULE=/nonexistent/libckpt_cuda.so: No such file or directory");
    cuda_refused("cuda:0: the CUDA backend cannot be loaded: CKPT_CUDA_MODULE=/nonexistent/");
}
END_TEST

START_TEST(test_not_a_module)
{
    /* a shared library, but without the module's table */
    use_module(TOP_BUILDDIR "/.libs/libckpt.so.0");
    char why[700];
    ck_assert_int_eq(ckpt_cuda_module_describe(why, sizeof why), 0);
    ck_assert_msg(strstr(why, "libckpt.so.0: no ckpt_cuda_module_entry: not a ckpt CUDA module"),
                  "%s", why);
    cuda_refused("not a ckpt CUDA module");
}
END_TEST

START_TEST(test_other_abi)
{
    use_module(STUB_ABI);
    char why[700], want[64];
    ck_assert_int_eq(ckpt_cuda_module_describe(why, sizeof why), 0);
    /* the stub of another ABI is this build's plus one */
    snprintf(want, sizeof want, "module ABI %d, this libckpt needs ABI %d",
             CKPT_CUDA_MODULE_ABI + 1, CKPT_CUDA_MODULE_ABI);
    ck_assert_msg(strstr(why, STUB_ABI ": ") == why && strstr(why, want), "%s", why);
    cuda_refused(want);
}
END_TEST

START_TEST(test_module_without_gpu)
{
    /* this ABI: the loader forwards to the module's backend and runtime */
    use_module(STUB);
    char why[700];
    ck_assert_int_eq(ckpt_cuda_module_describe(why, sizeof why), 0);
    ck_assert_str_eq(why, "no GPU found (" STUB ", CUDA runtime 12.4)");
    ckpt_backend *b = NULL;
    char err[512];
    ck_assert_int_eq(ckpt_backend_open("cuda:3", &b, err, sizeof err), CKPT_ERR_DEVICE);
    ck_assert_str_eq(err, "cuda:3: stub: no GPU here");
    ck_assert_int_eq(ckpt_backend_open("auto", &b, err, sizeof err), CKPT_OK);
    ck_assert_str_eq(ckpt_backend_device(b), "cpu");
    ckpt_backend_free(b);
}
END_TEST

START_TEST(test_looked_beside_the_program)
{
    /* unset (or empty): beside the object holding libckpt -- this test
     * program, which links it statically -- then the install folder */
    use_module("");
    char pkg[4096];
    snprintf(pkg, sizeof pkg, "%s/libckpt_cuda.so", CKPT_PKGLIBDIR_FOR_TEST);
    if (access(pkg, F_OK) == 0)
        return; /* a ckpt installed here: it would be found */
    char why[700];
    ck_assert_int_eq(ckpt_cuda_module_describe(why, sizeof why), 0);
    ck_assert_msg(strstr(why, "libckpt_cuda.so not found (looked in " TOP_BUILDDIR "/tests/unit, "
                              TOP_BUILDDIR "/tests/unit/ckpt, ") == why,
                  "%s", why);
    ck_assert_msg(strstr(why, CKPT_PKGLIBDIR_FOR_TEST), "%s", why);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_loader");
    TCase *tc = tcase_create("loader");
    tcase_add_test(tc, test_missing_module);
    tcase_add_test(tc, test_not_a_module);
    tcase_add_test(tc, test_other_abi);
    tcase_add_test(tc, test_module_without_gpu);
    tcase_add_test(tc, test_looked_beside_the_program);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_set_fork_status(r, CK_FORK);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
