/* fuzz_folder.c - any bytes as a checkpoint folder: the input is a list of
 * files (u8 count, then for each: u16 name length, the name, u32 data
 * length, the data; little-endian; a name may hold one '/' for a
 * subfolder: "global_step3/mp_rank_00_model_states.pt"; a name starting
 * with '@' is a symbolic link whose target is the data, one starting with
 * '|' a FIFO), written into a fresh folder that ckpt_file_open then reads
 * as a folder format would (a DeepSpeed ZeRO folder: latest, the rank
 * files' zips and pickles, the runs every parameter is made of; a DCP
 * folder); then every tensor read and summarised and every record
 * CRC-checked, as `ckpt inspect --stats DIR` does; then ckpt_scan_paths
 * scans the folder as `ckpt scan --json DIR` does (the folder dispatch:
 * which files, links, FIFOs, the names a metadata gives).  No input may
 * block: a FIFO is never opened for reading.
 * tests/fuzz/make_folder_corpus.py packs folders into this form. */
#include "fuzz.h"

#include "ckpt.h"

#include <fcntl.h>
#include <sys/stat.h>

static uint64_t take(const uint8_t **p, size_t *left, int n, int *ok)
{
    uint64_t v = 0;
    if (*left < (size_t)n) {
        *ok = 0;
        return 0;
    }
    for (int i = 0; i < n; i++)
        v |= (uint64_t)(*p)[i] << (8 * i);
    *p += n;
    *left -= (size_t)n;
    return v;
}

/* NAME (LEN bytes): a file name, or one folder and a file name, of
 * printable characters, neither "." nor ".." */
static int safe_name(const char *name, size_t len)
{
    int slashes = 0;
    if (!len || name[0] == '/' || name[len - 1] == '/')
        return 0;
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e)
            return 0;
        slashes += name[i] == '/';
    }
    return slashes <= 1 && !strstr(name, "./") && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0 && !(len >= 2 && name[len - 1] == '.' && name[len - 2] == '.');
}

static void remove_tree(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        /* nothing to do: a leftover folder under TMPDIR */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/ckpt-fuzz-dir-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    const uint8_t *p = data;
    size_t left = size;
    int ok = dfd >= 0;
    unsigned n = (unsigned)take(&p, &left, 1, &ok);
    for (unsigned k = 0; k < n && ok; k++) {
        size_t nl = (size_t)take(&p, &left, 2, &ok);
        if (!ok || nl > left || nl > 255)
            break;
        char name[256];
        memcpy(name, p, nl);
        name[nl] = '\0';
        p += nl;
        left -= nl;
        size_t dl = (size_t)take(&p, &left, 4, &ok);
        if (!ok || dl > left)
            break;
        char kind = nl ? name[0] : 0;
        char *nm = kind == '@' || kind == '|' ? name + 1 : name;
        size_t nml = nm == name ? nl : nl - 1;
        if (safe_name(nm, nml)) {
            char *slash = strchr(nm, '/');
            if (slash) {
                *slash = '\0';
                mkdirat(dfd, nm, 0700);
                *slash = '/';
            }
            if (kind == '|') {
                mkfifoat(dfd, nm, 0600);
                p += dl;
                left -= dl;
                continue;
            }
            if (kind == '@') {
                /* a link: to a name in the folder, "..", ".": never absolute */
                char target[256];
                size_t tl = dl < sizeof target - 1 ? dl : sizeof target - 1;
                memcpy(target, p, tl);
                target[tl] = '\0';
                if (tl && target[0] != '/' && !memchr(p, 0, tl))
                    symlinkat(target, dfd, nm);
                p += dl;
                left -= dl;
                continue;
            }
            int fd = openat(dfd, nm, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0) {
                size_t done = 0;
                while (done < dl) {
                    ssize_t w = write(fd, p + done, dl - done);
                    if (w <= 0)
                        break;
                    done += (size_t)w;
                }
                close(fd);
            }
        }
        p += dl;
        left -= dl;
    }
    if (dfd >= 0)
        close(dfd);

    ckpt_file *f = ckpt_file_new();
    if (f) {
        ckpt_file_set_limit(f, CKPT_LIMIT_PICKLE_BYTES, 1 << 20);
        ckpt_file_set_limit(f, CKPT_LIMIT_ITEMS, 1 << 16);
        ckpt_file_set_limit(f, CKPT_LIMIT_MEMO, 1 << 16);
        ckpt_file_set_limit(f, CKPT_LIMIT_STACK, 1 << 16);
    }
    if (f && ckpt_file_open(f, dir) == CKPT_OK) {
        uint64_t budget = 16u << 20;
        size_t sum = 0;
        for (size_t i = 0; i < ckpt_file_tensor_count(f); i++) {
            const ckpt_tensor *t = ckpt_file_tensor(f, i, NULL);
            const ckpt_storage *s = ckpt_tensor_storage(t);
            for (size_t r = 0; s && r < ckpt_storage_run_count(s); r++) {
                const char *file;
                uint64_t off, nb, at;
                if (ckpt_storage_run(s, r, &file, &off, &nb, &at) == CKPT_OK)
                    sum += (file ? strlen(file) : 0) + (size_t)(off + nb + at);
            }
            if (ckpt_tensor_nbytes(t) > budget)
                continue;
            budget -= ckpt_tensor_nbytes(t);
            ckpt_tensor_stats st;
            ckpt_tensor_stats_compute(f, t, &st);
        }
        ckpt_file_check_records(f);
        if (ckpt_file_layout(f))
            sum += strlen(ckpt_file_layout(f));
        for (size_t i = 0; i < ckpt_file_notice_count(f); i++)
            sum += strlen(ckpt_file_notice(f, i));
        if (sum == (size_t)-1)
            abort(); /* keeps the reads */
    }
    ckpt_file_free(f);

    ckpt_scan_paths *sp = ckpt_scan_paths_new();
    if (sp) {
        ckpt_scan_paths_set_limit(sp, CKPT_LIMIT_PICKLE_BYTES, 1 << 20);
        ckpt_scan_paths_set_limit(sp, CKPT_LIMIT_ITEMS, 1 << 16);
        ckpt_scan_paths_set_limit(sp, CKPT_LIMIT_MEMO, 1 << 16);
        ckpt_scan_paths_set_limit(sp, CKPT_LIMIT_STACK, 1 << 16);
        ckpt_scan_paths_set_torch_load(sp, 1);
        if (ckpt_scan_paths_add(sp, dir) == CKPT_OK && ckpt_scan_paths_run(sp) == CKPT_OK) {
            size_t sum = 0;
            for (size_t i = 0; i < ckpt_scan_paths_count(sp); i++) {
                const ckpt_scan_entry *e = ckpt_scan_paths_entry(sp, i);
                sum += strlen(e->path) + (e->reason ? strlen(e->reason) : 0) +
                       (e->error ? strlen(e->error) : 0) + (size_t)e->exit;
                /* a folder's verdict is never safe when it could not be read */
                if (e->kind == CKPT_SCAN_ENTRY_REFUSED && e->exit == 0)
                    abort();
            }
            char *json = ckpt_scan_paths_to_json(sp);
            sum += json ? strlen(json) : 0;
            free(json);
            char *sarif = ckpt_scan_paths_to_sarif(sp); /* names as they come, in a UTF-8 log */
            sum += sarif ? strlen(sarif) : 0;
            free(sarif);
            if (sum == (size_t)-1)
                abort();
        }
        ckpt_scan_paths_free(sp);
    }
    remove_tree(dir);
    return 0;
}
