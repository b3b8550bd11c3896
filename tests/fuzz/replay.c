/* replay.c - a main() for a fuzz target without libFuzzer: runs the target
 * on every file named (directories: every file in them), so `make check`
 * replays the committed corpus and crash reproducers under the normal
 * build (and ASan/UBSan with --enable-sanitizers). */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 65536;
            uint8_t *n = realloc(buf, cap);
            if (!n) {
                free(buf);
                fclose(fp);
                return 1;
            }
            buf = n;
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        if (got == 0)
            break;
        len += got;
    }
    fclose(fp);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int bad = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: no such file\n", argv[i]);
            bad = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            bad |= run_file(p);
            files++;
        }
        if (d)
            closedir(d);
    }
    printf("replayed %d inputs\n", files);
    return bad;
}
