/* fuzz_zip_dir.c - any bytes as a zip, parsed as torch, Python's zipfile and
 * libzip each would (lib/container/zip_dir.c), its findings made, and
 * data.pkl and every entry read as each reader reads it. */
#include "fuzz.h"

#include "container/container.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_file(data, size, ".pth");
    if (!path)
        return 0;
    int fd = open(path, O_RDONLY);
    ckpt_zip_dir *d = NULL;
    ckpt_error err = {0};
    if (fd >= 0 && ckpt_zip_dir_open(fd, size, &d, &err) == CKPT_OK) {
        size_t total = 0;
        for (size_t i = 0; i < ckpt_zip_dir_finding_count(d); i++)
            total += strlen(ckpt_zip_dir_finding(d, i));
        for (int r = 0; r < CKPT_ZIP_READERS; r++) {
            ckpt_zip_dir_find(d, (ckpt_zip_reader)r, "data.pkl");
            ckpt_zip_dir_find(d, (ckpt_zip_reader)r, "version");
            size_t n = ckpt_zip_dir_count(d, (ckpt_zip_reader)r);
            for (size_t i = 0; i < n && i < 64; i++) {
                uint8_t *buf = NULL;
                size_t len = 0;
                bool crc_ok;
                ckpt_error e2 = {0};
                /* a small cap: a fuzzer must not spend its time allocating */
                ckpt_zip_dir_read(d, fd, (ckpt_zip_reader)r, i, 1 << 20, &buf, &len, &crc_ok,
                                  &e2);
                if (len)
                    total += buf[len - 1];
                free(buf);
            }
        }
        (void)total;
    }
    ckpt_zip_dir_free(d);
    if (fd >= 0)
        close(fd);
    fuzz_file_done(path);
    return 0;
}
