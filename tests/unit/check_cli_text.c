/* check_cli_text.c - the one escaping of every command's text output
 * (src/cli.c, issue 26): what is escaped and how, byte by byte (C0, DEL,
 * C1, every kind of invalid UTF-8), what is kept (printable ASCII, valid
 * UTF-8 from U+00A0 to U+10FFFF), and printf's conversions through
 * cli_vformat (widths count the escaped text, precisions the raw bytes). */
#include "unit.h"

#include "cli.h"

static void text_is(const char *in, const char *want)
{
    ck_assert_str_eq(cli_text(in), want);
    ck_assert_int_eq(cli_needs_escape(in), strcmp(in, want) != 0);
}

START_TEST(controls_escaped)
{
    text_is("module.w", "module.w");
    text_is("", "");
    text_is("w\x1b]0;pwned\x07", "w\\x1b]0;pwned\\x07"); /* OSC: set the window title */
    text_is("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d");       /* a forged line, a tab */
    text_is("\x01\x1f\x7f", "\\x01\\x1f\\x7f");          /* C0 ends, DEL */
    text_is("\xc2\x9b" "2J", "\\u009b2J");               /* CSI, the 8-bit ESC [ */
    text_is("\xc2\x80\xc2\x85\xc2\x9f", "\\u0080\\u0085\\u009f");
    text_is("back\\slash", "back\\slash");               /* shown as itself */
}
END_TEST

START_TEST(valid_utf8_kept)
{
    text_is("\xc2\xa0", "\xc2\xa0");                   /* U+00A0, just past C1 */
    text_is("caf\xc3\xa9", "caf\xc3\xa9");
    text_is("\xe2\x82\xac", "\xe2\x82\xac");           /* U+20AC */
    text_is("\xef\xbf\xbd", "\xef\xbf\xbd");           /* U+FFFD */
    text_is("\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80");   /* U+1F600 */
    text_is("\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf");   /* U+10FFFF */
}
END_TEST

START_TEST(invalid_utf8_byte_by_byte)
{
    text_is("\xff", "\\xff");
    text_is("\x80x", "\\x80x");                          /* a lone continuation */
    text_is("\xc0\x80", "\\xc0\\x80");                   /* overlong NUL */
    text_is("\xc1\xbf", "\\xc1\\xbf");                   /* overlong */
    text_is("\xe0\x80\xaf", "\\xe0\\x80\\xaf");          /* overlong '/' */
    text_is("\xf0\x80\x80\xaf", "\\xf0\\x80\\x80\\xaf"); /* overlong '/' */
    text_is("\xed\xa0\x80", "\\xed\\xa0\\x80");          /* a surrogate, U+D800 */
    text_is("\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"); /* past U+10FFFF */
    text_is("\xf5\x80\x80\x80", "\\xf5\\x80\\x80\\x80");
    text_is("a\xe2\x82", "a\\xe2\\x82");                 /* cut at the end */
    text_is("\xe2\x82x", "\\xe2\\x82x");                 /* cut before ASCII */
    text_is("\xc2\xc2\x9b", "\\xc2\\u009b");             /* a lead byte, then C1 */
}
END_TEST

/* Whether OUT is what a terminal may be given: valid UTF-8 (as
 * utf8_valid), no C0 control, DEL or C1 control. */
static bool terminal_safe(const char *out)
{
    const unsigned char *p = (const unsigned char *)out;
    while (*p) {
        unsigned c = *p, cp, n;
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f)
                return false;
            p++;
            continue;
        }
        n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
        cp = c & (0x3f >> (n - 1));
        for (unsigned i = 1; i < n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (c < 0xc2 || c > 0xf4 || cp < min[n] || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f)
            return false;
        p += n;
    }
    return true;
}

/* Every string of one or two bytes, and 300,000 random ones of up to 8
 * bytes drawn from the bytes that matter, come out safe. */
START_TEST(any_bytes_come_out_safe)
{
    char in[9];
    size_t bad = 0; /* counted, asserted once: check marks every assertion */
    for (unsigned a = 1; a < 256; a++)
        for (unsigned b = 0; b < 256; b++) {
            in[0] = (char)a, in[1] = (char)b, in[2] = 0;
            bad += !terminal_safe(cli_text(in));
        }
    static const unsigned char pick[] = {0x01, 0x0a, 0x1b, 0x41, 0x5c, 0x7f, 0x80, 0x8f, 0x9b,
                                         0x9f, 0xa0, 0xbf, 0xc0, 0xc2, 0xdf, 0xe0, 0xed, 0xef,
                                         0xf0, 0xf4, 0xf5, 0xff};
    uint32_t x = 1;
    for (int r = 0; r < 300000; r++) {
        x = x * 1103515245u + 12345u;
        size_t n = 1 + (x >> 16) % 8;
        for (size_t i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            in[i] = (char)pick[(x >> 16) % sizeof pick];
        }
        in[n] = 0;
        bad += !terminal_safe(cli_text(in));
    }
    ck_assert_uint_eq(bad, 0);
}
END_TEST

/* cli_vformat through a variadic call, as cli_printf makes it */
static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *s = cli_vformat(f, ap);
    va_end(ap);
    ck_assert_ptr_nonnull(s);
    return s;
}

static void fmt_is(char *got, const char *want)
{
    ck_assert_str_eq(got, want);
    free(got);
}

START_TEST(printf_arguments_escaped_format_kept)
{
    fmt_is(fmt("%s -> %s\n", "a\nb", "module.a\nb"), "a\\x0ab -> module.a\\x0ab\n");
    fmt_is(fmt("%-6s|%6s|", "\x1b", "\x1b"), "\\x1b  |  \\x1b|"); /* width: escaped text */
    fmt_is(fmt("%-*s|%*s|", 3, "abcd", -5, "ab"), "abcd|ab   |");
    fmt_is(fmt("[%.2s][%.*s]", "a\x1b" "b", 1, "\xc2\x9b"), "[a\\x1b][\\xc2]");
    fmt_is(fmt("%c%c", 'x', '\n'), "x\\x0a");
    fmt_is(fmt("%d %i %u %ld %lld %zu %zd %x %X %o %%", -1, 2, 3u, -4L, -5LL, (size_t)6,
               (ssize_t)-7, 255u, 255u, 8u),
           "-1 2 3 -4 -5 6 -7 ff FF 10 %");
    fmt_is(fmt("%5.1f|%-8.3g|%e|%08.2f|%+d", 3.14159, 0.000123456, 1.5, -2.5, 7),
           "  3.1|0.000123|1.500000e+00|-0002.50|+7");
    fmt_is(fmt("%llu %hhu %hu %lu", 18446744073709551615ULL, 300 & 0xff, 65535, 42UL),
           "18446744073709551615 44 65535 42");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cli_text");
    TCase *t = tcase_create("escape");
    tcase_set_timeout(t, 120); /* under valgrind */
    tcase_add_test(t, controls_escaped);
    tcase_add_test(t, valid_utf8_kept);
    tcase_add_test(t, invalid_utf8_byte_by_byte);
    tcase_add_test(t, any_bytes_come_out_safe);
    tcase_add_test(t, printf_arguments_escaped_format_kept);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
