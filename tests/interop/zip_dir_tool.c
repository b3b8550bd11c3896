/* zip_dir_tool.c - what lib/container/zip_dir.c says each reader makes of a
 * zip, for tests/interop/zip_readers.py to hold against the real readers.
 *   zip_dir_tool FILE
 * prints, per reader: "READER ok END DATA_AT CRC_OK RC HEX" for the entry
 * that reader's lookup of data.pkl finds ("READER refuses WHY" or
 * "READER ok END - ..." when it finds none), then "finding: SENTENCE" each. */
#include "container/container.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st))
        return 2;
    ckpt_zip_dir *d;
    ckpt_error err = {0};
    if (ckpt_zip_dir_open(fd, (uint64_t)st.st_size, &d, &err)) {
        printf("error %s\n", err.msg);
        return 0;
    }
    static const char *tag[] = {"torch", "zipfile", "libzip"};
    printf("sniffs %d\n", ckpt_zip_dir_torch_sniffs(d));
    for (int r = 0; r < CKPT_ZIP_READERS; r++) {
        if (!ckpt_zip_dir_reads(d, (ckpt_zip_reader)r)) {
            printf("%s refuses %s\n", tag[r], ckpt_zip_dir_refusal(d, (ckpt_zip_reader)r));
            continue;
        }
        int64_t i = ckpt_zip_dir_find(d, (ckpt_zip_reader)r, "data.pkl");
        unsigned long long end = (unsigned long long)ckpt_zip_dir_end_at(d, (ckpt_zip_reader)r);
        if (i < 0) {
            printf("%s ok %llu -\n", tag[r], end);
            continue;
        }
        uint8_t *buf;
        size_t len;
        bool crc_ok;
        ckpt_error e2 = {0};
        int rc = ckpt_zip_dir_read(d, fd, (ckpt_zip_reader)r, (size_t)i, 1 << 20, &buf, &len,
                                   &crc_ok, &e2);
        printf("%s ok %llu %llu %d %d ", tag[r], end,
               (unsigned long long)ckpt_zip_dir_entry(d, (ckpt_zip_reader)r, (size_t)i)->data_at,
               crc_ok, rc);
        for (size_t k = 0; k < len; k++)
            printf("%02x", buf[k]);
        printf("%s\n", len ? "" : "-");
        free(buf);
    }
    for (size_t k = 0; k < ckpt_zip_dir_finding_count(d); k++)
        printf("finding: %s\n", ckpt_zip_dir_finding(d, k));
    ckpt_zip_dir_free(d);
    close(fd);
    return 0;
}
