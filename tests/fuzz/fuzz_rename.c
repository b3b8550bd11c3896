/* fuzz_rename.c - any bytes as rename rules and keys: the first line is a
 * sed-style rule (PCRE2), the second a strip-prefix rule, the rest keys. */
#include "fuzz.h"

#include "ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    ckpt_rename *r = ckpt_rename_new();
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (r && line) {
        ckpt_rename_sed(r, line);
        line = strtok_r(NULL, "\n", &save);
        if (line)
            ckpt_rename_strip_prefix(r, line);
        ckpt_rename_unwrap(r);
        while ((line = strtok_r(NULL, "\n", &save))) {
            char *out = ckpt_rename_apply(r, line);
            free(out);
        }
    }
    ckpt_rename_free(r);
    free(text);
    return 0;
}
