/* fuzz_dcp.c - any bytes as a one-rank torch.distributed.checkpoint folder:
 * the input is a 4-byte little-endian length N, then N bytes of `.metadata`
 * (its pickle read with only the DCP records admitted), then the rest as
 * `__0_0.distcp` (its items: torch.save zips at offsets, zstd frames, a
 * safetensors blob).  Exercised: the metadata reader and the checks on what
 * it says (chunk bounds, item offsets, relative paths), each item's zip in
 * its window and its data.pkl, the assembly of chunks into pieces (holes,
 * overlaps), the nesting from planner_data; then every tensor read (CRC-32s
 * of pieces) and the data file scanned item by item as `ckpt scan` does. */
#include "fuzz.h"

#include "ckpt.h"

#include <sys/stat.h>

static int write_file(const char *path, const uint8_t *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    size_t w = n ? fwrite(p, 1, n, fp) : 0;
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    size_t m = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 |
               (size_t)data[3] << 24;
    if (m > size - 4)
        m = size - 4;
    const char *tmp = getenv("TMPDIR");
    char dir[4096], meta[4200], item[4200];
    snprintf(dir, sizeof dir, "%s/ckpt-fuzz-dcp-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return 0;
    snprintf(meta, sizeof meta, "%s/.metadata", dir);
    snprintf(item, sizeof item, "%s/__0_0.distcp", dir);
    if (write_file(meta, data + 4, m) == 0 && write_file(item, data + 4 + m, size - 4 - m) == 0) {
        ckpt_file *f = ckpt_file_new();
        if (f) {
            ckpt_file_set_limit(f, CKPT_LIMIT_PICKLE_BYTES, 1 << 20);
            if (ckpt_file_open(f, dir) == CKPT_OK) {
                static uint8_t buf[1 << 16];
                for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
                    const ckpt_tensor *t = ckpt_file_tensor(f, i, NULL);
                    for (size_t c = 0; c < ckpt_tensor_chunk_count(t); c++)
                        if (!ckpt_tensor_chunk(t, c))
                            abort();
                    if (ckpt_tensor_nbytes(t) <= sizeof buf)
                        (void)ckpt_tensor_read(f, t, buf, sizeof buf);
                }
            }
            (void)strlen(ckpt_file_error_message(f));
            ckpt_file_free(f);
        }
        ckpt_scan *s = ckpt_scan_new();
        if (s) {
            ckpt_scan_set_limit(s, CKPT_LIMIT_PICKLE_BYTES, 1 << 20);
            (void)ckpt_scan_items(s, item);
            for (size_t i = 0; i < ckpt_scan_hit_count(s); i++)
                if (!ckpt_scan_hit_at(s, i)->global)
                    abort();
            ckpt_scan_free(s);
        }
    }
    unlink(meta);
    unlink(item);
    rmdir(dir);
    return 0;
}
