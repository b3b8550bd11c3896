/*
 * pickle/read.c - a safe pickle VM (protocols 0-5) that builds a value tree.
 *
 * Nothing is imported or called: GLOBAL only names a class or function, which
 * is classified (interpreted / known data / refused) before it is pushed;
 * REDUCE of an interpreted function is understood here (OrderedDict) or in
 * pickle/rebuild.c (the torch tensor rebuild functions), every other call
 * becomes an opaque OBJECT node that keeps its callable and arguments.  Every length is checked
 * against the bytes that remain and every count against a limit.
 */
#include "pickle/rebuild.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DECIMAL_DIGITS 4300 /* Python's own int-from-text limit */

/* ---- input ----------------------------------------------------------------
 * As Modules/_pickle.c reads (see ckpt_pickle_feed in pickle.h). */

static int truncated(vm *m, const char *what)
{
    m->pos = m->wend = m->len; /* the file's read() took what there was */
    return fail(m, CKPT_ERR_FORMAT, "truncated pickle: %s", what);
}

/* A read of N bytes where only LEFT follow. */
static int short_read(vm *m, uint64_t n, size_t left)
{
    char what[96];
    snprintf(what, sizeof what, "an opcode needs %llu more bytes, %zu are left",
             (unsigned long long)n, left);
    return truncated(m, what);
}

/* A point where the feeds differ: bytes of a frame's buffer are left where
 * the C unpickler goes to the file (a read crossing the frame's end) or
 * stops (STOP inside the frame).  Whether they are dropped: the frame was
 * read whole with read() (BYTESIO), peeked (FILE), or as CHOOSE's bit says. */
static bool frame_dropped(vm *m)
{
    ckpt_pickle_ctx *c = m->ctx;
    uint64_t k = c->ndiverge++;
    if (c->feed == CKPT_FEED_CHOOSE)
        return k < 64 && (c->drops >> k & 1);
    return c->feed == CKPT_FEED_BYTESIO;
}

/* A read that the buffer cannot satisfy: where it starts in the file.  The
 * bytes left in a frame's buffer are dropped or read on (frame_dropped). */
static size_t refill(vm *m)
{
    if (m->wend > m->pos) {
        m->ctx->frame_crossed = true;
        if (frame_dropped(m))
            m->pos = m->wend;
    }
    return m->pos;
}

/* _Unpickler_Read: N bytes at *P. */
static int rd(vm *m, uint64_t n, const uint8_t **p)
{
    if (n <= m->wend - m->pos) {
        *p = m->buf + m->pos;
        m->pos += (size_t)n;
        return CKPT_OK;
    }
    size_t at = refill(m);
    if (n > m->len - at)
        return short_read(m, n, m->len - at);
    *p = m->buf + at;
    m->pos = m->wend = at + (size_t)n;
    return CKPT_OK;
}

/* _Unpickler_ReadInto (the data of BINBYTES, BYTEARRAY8...): the buffer's
 * rest, then the file from its position, which is where the buffer ends. */
static int rd_into(vm *m, uint64_t n, const uint8_t **p)
{
    if (n > m->len - m->pos)
        return short_read(m, n, m->len - m->pos);
    *p = m->buf + m->pos;
    m->pos += (size_t)n;
    if (m->pos > m->wend)
        m->wend = m->pos;
    return CKPT_OK;
}

/* FRAME's data: read into the buffer and rewound; a frame inside the
 * buffer's rest changes nothing. */
static int rd_frame(vm *m, uint64_t n)
{
    if (n > (uint64_t)INT64_MAX)
        return fail(m, CKPT_ERR_FORMAT, "FRAME length exceeds the maximum size");
    if (n <= m->wend - m->pos)
        return CKPT_OK;
    size_t at = refill(m);
    if (n > m->len - at)
        return truncated(m, "FRAME longer than the bytes that follow");
    m->pos = at;
    m->wend = at + (size_t)n;
    return CKPT_OK;
}

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int take_le(vm *m, int n, uint64_t *out)
{
    const uint8_t *p;
    CKPT_FORWARD(rd(m, (uint64_t)n, &p));
    *out = rd_le(p, n);
    return CKPT_OK;
}

/* _Unpickler_Readline: a text argument up to '\n' (protocol 0), consumed
 * with the newline; one the buffer does not end is read whole from the file. */
static int take_line(vm *m, const char **line, size_t *n)
{
    const uint8_t *start = m->buf + m->pos;
    const uint8_t *nl = memchr(start, '\n', m->wend - m->pos);
    if (!nl) {
        start = m->buf + refill(m);
        nl = memchr(start, '\n', m->len - m->pos);
        if (!nl)
            return truncated(m, "text argument has no end of line");
    }
    *line = (const char *)start;
    *n = (size_t)(nl - start);
    m->pos = (size_t)(nl - m->buf) + 1;
    if (m->pos > m->wend)
        m->wend = m->pos;
    return CKPT_OK;
}

/* A protocol-0 memo index (PUT, GET): the line as a C string (it ends at a
 * NUL byte) read by int(text, 10) - whitespace around, a sign, '_' between
 * digits, leading zeros - then taken as a Py_ssize_t.  Negative and huge
 * ones fail (C: "negative PUT argument", a memo too big, none found). */
static bool py_space(char c);

static int take_index_line(vm *m, uint64_t *out)
{
    const char *s;
    size_t n;
    CKPT_FORWARD(take_line(m, &s, &n));
    if (n == 0)
        return fail(m, CKPT_ERR_FORMAT, "bad memo index (an empty line)");
    if (memchr(s, 0, n))
        n = (size_t)((const char *)memchr(s, 0, n) - s);
    size_t i = 0;
    while (i < n && py_space(s[i]))
        i++;
    while (n > i && py_space(s[n - 1]))
        n--;
    bool neg = false;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        neg = s[i++] == '-';
    if (i == n || s[i] == '_')
        return fail(m, CKPT_ERR_FORMAT, "bad memo index");
    uint64_t v = 0;
    for (; i < n; i++) {
        if (s[i] == '_' && i + 1 < n && s[i + 1] != '_')
            continue;
        if (s[i] < '0' || s[i] > '9')
            return fail(m, CKPT_ERR_FORMAT, "bad memo index");
        /* saturated: the memo refuses it; the rest still has to be digits */
        v = v > (UINT64_MAX - 9) / 10 ? UINT64_MAX : v * 10 + (uint64_t)(s[i] - '0');
    }
    if (neg && v)
        return fail(m, CKPT_ERR_FORMAT, "negative memo index");
    *out = v; /* over 2**32: the memo's "out of range" */
    return CKPT_OK;
}

/* ---- stack, marks, memo ---------------------------------------------------- */

static int pop(vm *m, ckpt_value **out)
{
    if (m->sp <= floor_of(m))
        return fail(m, CKPT_ERR_FORMAT, "stack underflow (opcode 0x%02x needs a value)",
                    (unsigned)m->op);
    *out = m->stack[--m->sp];
    return CKPT_OK;
}

static int push_mark(vm *m)
{
    if (m->nmarks == m->marks_cap) {
        if (m->nmarks >= limit(m, CKPT_LIMIT_MARKS))
            return fail(m, CKPT_ERR_LIMIT, "more than %llu nested MARKs",
                        (unsigned long long)limit(m, CKPT_LIMIT_MARKS));
        if (CKPT_GROW(m->marks, m->marks_cap, m->nmarks + 1) < 0)
            return oom(m);
    }
    m->marks[m->nmarks++] = m->sp;
    return CKPT_OK;
}

/* Pop to the innermost MARK: *items points at the popped items (valid until
 * the next push), *n is their count. */
static int pop_mark(vm *m, ckpt_value ***items, size_t *n)
{
    if (!m->nmarks)
        return fail(m, CKPT_ERR_FORMAT, "opcode needs a MARK and there is none");
    size_t at = m->marks[--m->nmarks];
    if (at > m->sp) /* SETITEM took values from below a MARK */
        return fail(m, CKPT_ERR_FORMAT, "stack underflow: a MARK above the stack");
    *items = m->stack ? m->stack + at : NULL; /* nothing pushed yet: no stack at all */
    *n = m->sp - at;
    m->sp = at;
    return CKPT_OK;
}

/* The memo: index -> value.  An index goes into the dense array when it
 * is below its size, or when growing it to hold the index keeps it within
 * a few slots per entry (a hostile BINPUT 4294967295 goes to the map, and
 * costs what an entry does); the array is read first, so that a put there
 * overrides one the map holds from before the array grew over it. */
static int memo_put(vm *m, uint64_t key64, ckpt_value *v)
{
    if (key64 > UINT32_MAX)
        return fail(m, CKPT_ERR_FORMAT, "memo index %llu out of range", (unsigned long long)key64);
    size_t key = (size_t)key64;
    if (key >= m->dense_cap && key < 4 * m->memo_n + 4096) {
        size_t cap = m->dense_cap ? 2 * m->dense_cap : 1024;
        while (cap <= key)
            cap *= 2;
        ckpt_value **d = realloc(m->dense, cap * sizeof *d);
        if (!d)
            return oom(m);
        memset(d + m->dense_cap, 0, (cap - m->dense_cap) * sizeof *d);
        m->dense = d;
        m->dense_cap = cap;
    }
    bool have = key < m->dense_cap && m->dense[key];
    if (!have && m->memo.count)
        have = ckpt_map_get_u64(&m->memo, key64, NULL);
    if (!have && m->memo_n >= limit(m, CKPT_LIMIT_MEMO))
        return fail(m, CKPT_ERR_LIMIT, "more than %llu memo entries",
                    (unsigned long long)limit(m, CKPT_LIMIT_MEMO));
    if (key < m->dense_cap)
        m->dense[key] = v;
    else if (ckpt_map_set_u64(&m->memo, key64, (size_t)(uintptr_t)v) < 0)
        return oom(m);
    m->memo_n += !have;
    return CKPT_OK;
}

static int memo_get(vm *m, uint64_t key64)
{
    size_t v;
    if (key64 < m->dense_cap && m->dense[key64])
        return push(m, m->dense[key64]);
    if (key64 > UINT32_MAX || !ckpt_map_get_u64(&m->memo, key64, &v))
        return fail(m, CKPT_ERR_FORMAT, "memo index %llu read before it was stored",
                    (unsigned long long)key64);
    return push(m, (ckpt_value *)(uintptr_t)v);
}

static int memo_put_top(vm *m, uint64_t key)
{
    ckpt_value *v = NULL;
    CKPT_FORWARD(top(m, &v));
    return memo_put(m, key, v);
}

/* ---- value construction ------------------------------------------------------ */

/* ---- reading limits, checked as the values are made (issue 26) --------------
 * Nesting: a container's depth is one more than its deepest item's, set as each
 * item goes in, so that 10^8 nested TUPLE1s stop at --max-depth instead of
 * building 10^8 tuples first.  An item that grows after it went in (a memoized
 * list appended to later) does not raise its holders' depths: the tree walk
 * (checkpoint/index.c) checks the limit again on the finished tree.
 * Memory: a pickle and the values made from it take at most max(--max-pickle-
 * bytes, 1 GiB) together (arena bytes since the load began), so that 1 GiB of
 * NONE POP cannot make 70 GiB of values. */
#define TREE_FLOOR (1ull << 30)

static int nest(vm *m, ckpt_value *owner, const ckpt_value *item)
{
    if (!item || item->depth < owner->depth)
        return CKPT_OK;
    if ((uint64_t)item->depth + 1 > limit(m, CKPT_LIMIT_DEPTH))
        return fail(m, CKPT_ERR_LIMIT, "values nested more than %llu levels (--max-depth)",
                    (unsigned long long)limit(m, CKPT_LIMIT_DEPTH));
    owner->depth = item->depth + 1;
    return CKPT_OK;
}

/* MORE: bytes about to be taken (a BINBYTES8's copy), refused before they are. */
static int within_budget(vm *m, uint64_t more)
{
    uint64_t cap = limit(m, CKPT_LIMIT_PICKLE_BYTES);
    if (cap < TREE_FLOOR)
        cap = TREE_FLOOR;
    uint64_t used = m->a->used_total - m->arena_at_start;
    if (m->len <= cap && more <= cap - m->len && used <= cap - m->len - more)
        return CKPT_OK;
    return fail(m, CKPT_ERR_LIMIT, "the pickle (%zu bytes) and the values made from it take "
                "more than %llu bytes of memory (--max-pickle-bytes, at least 1 GiB)", m->len,
                (unsigned long long)cap);
}

/* Put ITEM into OWNER's vector V. */
static int add_item(vm *m, ckpt_value *owner, ckpt_vec *v, ckpt_value *item)
{
    CKPT_FORWARD(nest(m, owner, item));
    if (v->len >= limit(m, CKPT_LIMIT_ITEMS))
        return fail(m, CKPT_ERR_LIMIT, "a container holds more than %llu items",
                    (unsigned long long)limit(m, CKPT_LIMIT_ITEMS));
    if (ckpt_vec_push(m->a, v, item))
        return oom(m);
    return CKPT_OK;
}

static int push_int(vm *m, int64_t v)
{
    ckpt_value *n = node(m, CKPT_KIND_INT);
    if (n)
        n->u.i.v = v;
    return push(m, n);
}

/* Little-endian two's complement bytes (LONG1/LONG4) -> INT. */
static int push_long_bytes(vm *m, const uint8_t *p, size_t n)
{
    ckpt_value *v = node(m, CKPT_KIND_INT);
    if (!v)
        return oom(m);
    if (n == 0) {
        v->u.i.v = 0;
        return push(m, v);
    }
    bool neg = p[n - 1] & 0x80;
    bool fits = true;
    for (size_t i = 8; i < n; i++)
        if (p[i] != (neg ? 0xff : 0x00))
            fits = false;
    if (n > 8 && fits && ((p[7] & 0x80) != 0) != neg)
        fits = false;
    if (fits) {
        uint64_t u = 0;
        size_t k = n < 8 ? n : 8;
        for (size_t i = k; i-- > 0;)
            u = (u << 8) | p[i];
        if (neg && k < 8)
            u |= ~(uint64_t)0 << (8 * k);
        v->u.i.v = (int64_t)u;
    } else {
        uint8_t *copy = ckpt_arena_alloc(m->a, n);
        if (!copy)
            return oom(m);
        memcpy(copy, p, n);
        v->u.i.big = true;
        v->u.i.bytes = copy;
        v->u.i.nbytes = n;
    }
    return push(m, v);
}

/* Python's whitespace (Py_ISSPACE), also the C locale's isspace. */
static bool py_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* int(TEXT, 0) as PyLong_FromString reads a C string (INT's fallback, LONG):
 * whitespace around, a sign, a 0x/0o/0b prefix and one '_' after it, single
 * '_' between digits, a leading 0 only in a zero, at most 4300 decimal
 * digits (power-of-two bases have no limit) -> INT of any size. */
static int push_int_text(vm *m, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && py_space(s[i]))
        i++;
    while (n > i && py_space(s[n - 1]))
        n--;
    bool neg = false;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        neg = s[i++] == '-';
    unsigned base = 10, bits = 0;
    bool zero_lead = false;
    if (i < n && s[i] == '0') {
        char c = i + 1 < n ? (char)(s[i + 1] | 0x20) : 0;
        base = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 10;
        if (base != 10) {
            bits = base == 16 ? 4 : base == 8 ? 3 : 1;
            i += 2;
            if (i < n && s[i] == '_') /* one underscore allowed after the prefix */
                i++;
        } else {
            zero_lead = true; /* "old" octal: only a zero is valid */
        }
    }
    if (i == n || s[i] == '_')
        return fail(m, CKPT_ERR_FORMAT, "invalid literal for int() with base 0");
    size_t digits = 0;
    for (size_t k = i; k < n; k++) {
        char c = s[k];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (unsigned)((c | 0x20) - 'a' + 10)
                                                             : 99;
        if (c == '_') {
            if (k + 1 == n || s[k + 1] == '_')
                return fail(m, CKPT_ERR_FORMAT, "invalid literal for int() with base 0");
        } else if (d >= base) {
            return fail(m, CKPT_ERR_FORMAT, "invalid literal for int() with base 0");
        } else {
            digits++;
            if (zero_lead && d)
                return fail(m, CKPT_ERR_FORMAT, "INT/LONG text with a leading zero");
        }
    }
    if (base == 10 && digits > MAX_DECIMAL_DIGITS)
        return fail(m, CKPT_ERR_LIMIT, "integer text longer than %d digits", MAX_DECIMAL_DIGITS);
    /* magnitude as little-endian base-256, one extra byte for the sign */
    size_t cap = base == 10 ? digits / 2 + 2 : digits * bits / 8 + 2;
    uint8_t *mag = calloc(cap, 1);
    if (!mag)
        return oom(m);
    size_t used = 1;
    for (; i < n; i++) {
        if (s[i] == '_')
            continue;
        char c = s[i];
        unsigned carry = c <= '9' ? (unsigned)(c - '0') : (unsigned)((c | 0x20) - 'a' + 10);
        for (size_t k = 0; k < used; k++) {
            unsigned t = mag[k] * base + carry;
            mag[k] = (uint8_t)t;
            carry = t >> 8;
        }
        if (carry)
            mag[used++] = (uint8_t)carry;
    }
    used++; /* room for the sign bit */
    if (neg) {
        unsigned carry = 1;
        for (size_t k = 0; k < used; k++) {
            unsigned t = (uint8_t)~mag[k] + carry;
            mag[k] = (uint8_t)t;
            carry = t >> 8;
        }
    }
    int rc = push_long_bytes(m, mag, used);
    free(mag);
    return rc;
}

/* UTF-8 as Python's decoder with 'surrogatepass' accepts it. */
bool ckpt_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += k + 1;
    }
    return true;
}

/* Strict UTF-8: also no surrogates (U+D800..U+DFFF). */
static bool utf8_strict(const uint8_t *s, size_t n)
{
    if (!ckpt_utf8_valid(s, n))
        return false;
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == 0xed && s[i + 1] >= 0xa0)
            return false;
    return true;
}

static int push_bytes(vm *m, ckpt_kind kind, const uint8_t *p, size_t n, uint8_t flags)
{
    if (kind == CKPT_KIND_STR && !ckpt_utf8_valid(p, n))
        return fail(m, CKPT_ERR_FORMAT, "string is not valid UTF-8");
    ckpt_value *v = node(m, kind);
    if (!v)
        return oom(m);
    v->flags = flags;
    v->u.s.s = ckpt_arena_strndup(m->a, (const char *)p, n);
    if (!v->u.s.s)
        return oom(m);
    v->u.s.len = n;
    return push(m, v);
}

static int take_counted(vm *m, int lenbytes, ckpt_kind kind, uint8_t flags)
{
    uint64_t n;
    CKPT_FORWARD(take_le(m, lenbytes, &n));
    /* BINSTRING's length is unsigned too (calc_binsize): no negative one */
    if (n > (uint64_t)INT64_MAX) /* calc_binsize: over PY_SSIZE_T_MAX, refused before any read */
        return fail(m, CKPT_ERR_FORMAT, "an opcode needs %llu more bytes, over the maximum size",
                    (unsigned long long)n);
    const uint8_t *p = NULL;
    if (kind == CKPT_KIND_BYTES)
        CKPT_FORWARD(rd_into(m, n, &p));
    else
        CKPT_FORWARD(rd(m, n, &p));
    /* BINSTRING / SHORT_BINSTRING decode as torch.load's encoding='utf-8'
     * (strict); BINUNICODE as 'surrogatepass' */
    if (kind == CKPT_KIND_STR &&
        (m->op == CKPT_OP_BINSTRING || m->op == CKPT_OP_SHORT_BINSTRING) &&
        !utf8_strict(p, (size_t)n))
        return fail(m, CKPT_ERR_FORMAT, "string is not valid UTF-8");
    CKPT_FORWARD(within_budget(m, n)); /* the copy push_bytes makes */
    return push_bytes(m, kind, p, (size_t)n, flags);
}

static void utf8_put(uint8_t **o, uint32_t cp)
{
    uint8_t *p = *o;
    if (cp < 0x80) {
        *p++ = (uint8_t)cp;
    } else if (cp < 0x800) {
        *p++ = (uint8_t)(0xc0 | (cp >> 6));
        *p++ = (uint8_t)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        *p++ = (uint8_t)(0xe0 | (cp >> 12));
        *p++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        *p++ = (uint8_t)(0x80 | (cp & 0x3f));
    } else {
        *p++ = (uint8_t)(0xf0 | (cp >> 18));
        *p++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
        *p++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        *p++ = (uint8_t)(0x80 | (cp & 0x3f));
    }
    *o = p;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* UNICODE: raw-unicode-escape text (\uXXXX, \UXXXXXXXX; other bytes latin-1). */
static int push_raw_unicode(vm *m, const char *s, size_t n)
{
    uint8_t *out = malloc(n * 4 + 1), *o = out;
    if (!out)
        return oom(m);
    for (size_t i = 0; i < n;) {
        if (s[i] == '\\' && i + 1 < n && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
            size_t digits = s[i + 1] == 'u' ? 4 : 8;
            if (n - i - 2 < digits) {
                free(out);
                return fail(m, CKPT_ERR_FORMAT, "truncated \\u escape in UNICODE");
            }
            uint32_t cp = 0;
            for (size_t k = 0; k < digits; k++) {
                int h = hexval(s[i + 2 + k]);
                if (h < 0) {
                    free(out);
                    return fail(m, CKPT_ERR_FORMAT, "bad \\u escape in UNICODE");
                }
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10ffff) {
                free(out);
                return fail(m, CKPT_ERR_FORMAT, "code point out of range in UNICODE");
            }
            utf8_put(&o, cp);
            i += 2 + digits;
        } else {
            utf8_put(&o, (uint8_t)s[i]);
            i++;
        }
    }
    int rc = push_bytes(m, CKPT_KIND_STR, out, (size_t)(o - out), 0);
    free(out);
    return rc;
}

/* STRING: a quoted Python 2 repr; escapes as codecs.escape_decode. */
static int push_quoted(vm *m, const char *s, size_t n)
{
    if (n < 2 || (s[0] != '\'' && s[0] != '"') || s[n - 1] != s[0])
        return fail(m, CKPT_ERR_FORMAT, "STRING argument is not quoted");
    s++;
    n -= 2;
    uint8_t *out = malloc(n + 1), *o = out;
    if (!out)
        return oom(m);
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 == n) {
            *o++ = (uint8_t)s[i++];
            continue;
        }
        char c = s[i + 1];
        i += 2;
        switch (c) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case 'a': *o++ = '\a'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'v': *o++ = '\v'; break;
        case '\\': *o++ = '\\'; break;
        case '\'': *o++ = '\''; break;
        case '"': *o++ = '"'; break;
        case '\n': break;
        case 'x': {
            int h1 = i < n ? hexval(s[i]) : -1, h2 = i + 1 < n ? hexval(s[i + 1]) : -1;
            if (h1 < 0 || h2 < 0) {
                free(out);
                return fail(m, CKPT_ERR_FORMAT, "bad \\x escape in STRING");
            }
            *o++ = (uint8_t)(h1 * 16 + h2);
            i += 2;
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                unsigned v = (unsigned)(c - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                    v = v * 8 + (unsigned)(s[i++] - '0');
                *o++ = (uint8_t)v;
            } else {
                *o++ = '\\';
                *o++ = (uint8_t)c;
            }
        }
    }
    int rc = push_bytes(m, CKPT_KIND_STR, out, (size_t)(o - out), 0);
    free(out);
    return rc;
}

/* ---- globals ------------------------------------------------------------------- */

/* "mod.name" with a NUL byte shown as \x00 (scanning names every string) */
static char *scan_name(vm *m, const char *mod, size_t modlen, const char *name, size_t namelen)
{
    char *q = ckpt_arena_alloc(m->a, 4 * (modlen + namelen) + 2);
    if (!q)
        return NULL;
    char *o = q;
    for (size_t i = 0; i < modlen + 1 + namelen; i++) {
        char c = i < modlen ? mod[i] : i == modlen ? '.' : name[i - modlen - 1];
        if (c)
            *o++ = c;
        else
            o += sprintf(o, "\\x00");
    }
    *o = '\0';
    return q;
}

static int push_global(vm *m, const char *mod, size_t modlen, const char *name, size_t namelen)
{
    if (m->ctx->scan && (!modlen || !namelen || modlen > 255 || namelen > 255 ||
                         memchr(mod, 0, modlen) || memchr(name, 0, namelen))) {
        /* a name no module has: the C unpickler still asks for it */
        char *q = scan_name(m, mod, modlen, name, namelen);
        if (!q)
            return oom(m);
        m->ctx->on_global(m->ctx->user, q, CKPT_GLOBAL_REFUSED, m->op, m->op_at);
        ckpt_value *v = node(m, CKPT_KIND_GLOBAL);
        if (!v)
            return oom(m);
        v->u.global.name = q;
        v->u.global.modlen = (uint16_t)(modlen < UINT16_MAX ? modlen : UINT16_MAX);
        v->u.global.cls = CKPT_GLOBAL_ALLOWED;
        return push(m, v);
    }
    if (!modlen || !namelen || memchr(mod, 0, modlen) || memchr(name, 0, namelen))
        return fail(m, CKPT_ERR_FORMAT, "GLOBAL with an empty or invalid name");
    char modbuf[256], namebuf[256];
    if (modlen >= sizeof(modbuf) || namelen >= sizeof(namebuf))
        return fail(m, CKPT_ERR_FORMAT, "GLOBAL name longer than 255 bytes");
    memcpy(modbuf, mod, modlen);
    modbuf[modlen] = '\0';
    memcpy(namebuf, name, namelen);
    namebuf[namelen] = '\0';
    /* pickle's fix_imports: Python 2 names (__builtin__.xrange, as Python 3's
     * protocol-2 pickler writes range) read as their Python 3 names, exactly
     * when the stream's protocol is below 3 */
    const char *mod3 = modbuf, *name3 = namebuf;
    if (m->proto < 3)
        ckpt_globals_py3_name(modbuf, namebuf, &mod3, &name3);
    size_t l3 = strlen(mod3), n3 = strlen(name3);
    char *q = ckpt_arena_alloc(m->a, l3 + 1 + n3 + 1);
    if (!q)
        return oom(m);
    memcpy(q, mod3, l3);
    q[l3] = '.';
    memcpy(q + l3 + 1, name3, n3);
    ckpt_global_class cls = m->ctx->classify(m->ctx->user, q);
    if (m->ctx->scan) {
        m->ctx->on_global(m->ctx->user, q, cls, m->op, m->op_at);
        if (cls == CKPT_GLOBAL_REFUSED)
            cls = CKPT_GLOBAL_ALLOWED; /* scanned, never run: keep going */
    }
    /* builtins.getattr waits for its REDUCE: getattr(<known class>, <member>)
     * of the pairs globals.c lists is data; any other use refuses the file */
    if (cls == CKPT_GLOBAL_REFUSED && ckpt_globals_dangerous(q) &&
        strcmp(q, "builtins.getattr") != 0)
        return fail(m, CKPT_ERR_UNSAFE,
                    "refused global '%s': it can run commands or code (never admitted)", q);
    ckpt_value *v = node(m, CKPT_KIND_GLOBAL);
    if (!v)
        return oom(m);
    v->u.global.name = q;
    v->u.global.modlen = (uint16_t)l3;
    v->u.global.cls = (uint8_t)cls;
    if (cls == CKPT_GLOBAL_REFUSED) {
        /* maybe the class of nn.Modules (doc/design.md, "State dicts": module trees need no
         * flag); refused at STOP unless every use of it was one */
        if (CKPT_GROW(m->pending, m->pending_cap, m->npending + 1) < 0)
            return oom(m);
        m->pending[m->npending].g = v;
        m->pending[m->npending++].at = m->op_at;
    }
    return push(m, v);
}

/* What the whole pickle names that a reader refuses, for a hint that works:
 * found by the scanning VM (nothing run), persistent ids answered with None. */
typedef struct hint_scan {
    ckpt_pickle_ctx *outer;
    char never[256];    /* the first global no option admits */
    char admit[512];    /* " --allow-global A --allow-global B" */
    size_t nadmit;
} hint_scan;

static void hint_on_global(void *user, const char *q, ckpt_global_class cls, int op,
                           uint64_t at)
{
    hint_scan *h = user;
    (void)op, (void)at;
    if (cls != CKPT_GLOBAL_REFUSED)
        return;
    if (ckpt_globals_dangerous(q)) {
        if (!h->never[0])
            snprintf(h->never, sizeof(h->never), "%s", q);
        return;
    }
    char opt[300];
    snprintf(opt, sizeof(opt), " --allow-global %s", q);
    if (strstr(h->admit, opt))
        return;
    h->nadmit++;
    if (strlen(h->admit) + strlen(opt) < sizeof(h->admit))
        strcat(h->admit, opt);
}

static void hint_on_use(void *user, const char *q, int op, uint64_t at)
{
    (void)user, (void)q, (void)op, (void)at;
}

static ckpt_global_class hint_classify(void *user, const char *q)
{
    hint_scan *h = user;
    return h->outer->classify(h->outer->user, q);
}

static ckpt_value *hint_pid(void *user, ckpt_value *pid, uint64_t offset, ckpt_error *err)
{
    hint_scan *h = user;
    (void)pid, (void)err;
    return ckpt_value_new(h->outer->arena, CKPT_KIND_NONE, offset);
}

static int refuse_global(vm *m, const char *q, uint64_t at)
{
    if (ckpt_globals_dangerous(q)) { /* builtins.getattr used other than as data */
        m->op_at = at;
        return fail(m, CKPT_ERR_UNSAFE,
                    "refused global '%s': it can run commands or code (never admitted)", q);
    }
    hint_scan h = {.outer = m->ctx};
    ckpt_pickle_ctx sc = *m->ctx;
    sc.scan = true;
    sc.user = &h;
    sc.classify = hint_classify;
    sc.on_global = hint_on_global;
    sc.on_use = hint_on_use;
    sc.on_computed = NULL;
    sc.persistent_load = hint_pid;
    ckpt_value *ignored;
    ckpt_error e;
    ckpt_err_clear(&e);
    if (!m->ctx->scan)
        (void)ckpt_pickle_load(&sc, m->buf, m->len, &ignored, NULL, &e); /* as far as it goes */
    m->op_at = at;
    if (h.never[0])
        return fail(m, CKPT_ERR_UNSAFE,
                    "refused global '%s' (not a state-dict or known data class, nor the class "
                    "of an nn.Module); the pickle also names %s, which can run code and is "
                    "never admitted: no option reads this file", q, h.never);
    if (h.nadmit > 4 || !h.admit[0])
        return fail(m, CKPT_ERR_UNSAFE,
                    "refused global '%s' (not a state-dict or known data class, nor the class "
                    "of an nn.Module; it is one of %zu such: --allow-unknown admits them as "
                    "opaque objects)", q, h.nadmit ? h.nadmit : 1);
    return fail(m, CKPT_ERR_UNSAFE,
                "refused global '%s' (not a state-dict or known data class, nor the class of "
                "an nn.Module;%s admit%s %s as opaque objects)", q, h.admit,
                h.nadmit == 1 ? "s" : "", h.nadmit == 1 ? "it" : "them");
}

/* A refused class used as anything but the class of a module refuses the file. */
static int refuse_use(vm *m, const ckpt_value *g)
{
    for (size_t i = 0; i < m->npending; i++)
        if (m->pending[i].g == g)
            return refuse_global(m, g->u.global.name, m->pending[i].at);
    return refuse_global(m, g->u.global.name, m->op_at);
}

/* At STOP: every refused class went only into NEWOBJs, and every object of
 * one got its module BUILD. */
static int check_pending(vm *m)
{
    for (size_t i = 0; i < m->npending; i++) {
        const ckpt_value *g = m->pending[i].g;
        if (g->u.global.refs != g->u.global.modules || m->unbuilt)
            return refuse_global(m, g->u.global.name, m->pending[i].at);
    }
    return CKPT_OK;
}

/* A BUILD state that makes an object an nn.Module. */
static bool module_state(const ckpt_value *st)
{
    int found = 0;
    if (!st || st->kind != CKPT_KIND_DICT)
        return false;
    for (size_t i = 0; i < st->u.dict.keys.len; i++) {
        const ckpt_value *k = st->u.dict.keys.items[i];
        found |= (ckpt_value_is_str(k, "_parameters") << 0) | (ckpt_value_is_str(k, "_buffers") << 1) |
                 (ckpt_value_is_str(k, "_modules") << 2);
    }
    return found == 7;
}

static int new_object(vm *m, ckpt_value *callable, ckpt_value *args, ckpt_value *kwargs,
                      ckpt_obj_how how);

/* A value that stands for whatever a global or a call gives at run time. */
static bool opaque(const ckpt_value *v)
{
    return v->kind == CKPT_KIND_GLOBAL || v->kind == CKPT_KIND_OBJECT;
}

/* The global whose call (or whose value) made V. */
static const char *made_by(const ckpt_value *v)
{
    for (int i = 0; i < 64 && v; i++) {
        if (v->kind == CKPT_KIND_GLOBAL)
            return v->u.global.name;
        if (v->kind != CKPT_KIND_OBJECT || !v->u.obj.callable)
            break;
        v = v->u.obj.callable;
    }
    return "persistent_load";
}

static void shown_part(char *out, size_t cap, const ckpt_value *v)
{
    if (v->kind == CKPT_KIND_STR)
        snprintf(out, cap, "%.*s", (int)(v->u.s.len < 200 ? v->u.s.len : 200), v->u.s.s);
    else if (v->kind == CKPT_KIND_GLOBAL)
        snprintf(out, cap, "<%s>", v->u.global.name);
    else
        snprintf(out, cap, "<%s(...)>", made_by(v));
}

/* A name computed at run time: scanning reports it and goes on with an
 * opaque value; reading refuses the file. */
static int report_computed(vm *m, const ckpt_value *a, const ckpt_value *b, const ckpt_value *maker)
{
    char pa[256], pb[256], shown[520];
    shown_part(pa, sizeof pa, a);
    shown_part(pb, sizeof pb, b);
    snprintf(shown, sizeof shown, "%s.%s", pa, pb);
    const char *by = made_by(maker);
    if (!m->ctx->scan)
        return fail(m, CKPT_ERR_UNSAFE,
                    "a global named at run time (%s): its name is computed by a call of '%s', "
                    "which would run", shown, by);
    if (m->ctx->on_computed)
        m->ctx->on_computed(m->ctx->user, shown, by, m->op, m->op_at);
    return CKPT_OK;
}

static int computed_global(vm *m, ckpt_value *mod, ckpt_value *name)
{
    CKPT_FORWARD(report_computed(m, mod, name, opaque(mod) ? mod : name));
    return new_object(m, opaque(mod) ? mod : name, node(m, CKPT_KIND_TUPLE), NULL,
                      CKPT_OBJ_REDUCE);
}

static int stack_global(vm *m)
{
    ckpt_value *name, *mod;
    CKPT_FORWARD(pop(m, &name));
    CKPT_FORWARD(pop(m, &mod));
    if ((mod->kind == CKPT_KIND_STR || opaque(mod)) &&
        (name->kind == CKPT_KIND_STR || opaque(name)) &&
        (opaque(mod) || opaque(name)))
        return computed_global(m, mod, name);
    if (mod->kind != CKPT_KIND_STR || name->kind != CKPT_KIND_STR)
        return fail(m, CKPT_ERR_FORMAT, "STACK_GLOBAL needs two strings");
    return push_global(m, mod->u.s.s, mod->u.s.len, name->u.s.s, name->u.s.len);
}

static bool ascii_only(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] & 0x80)
            return false;
    return true;
}

/* load_global / load_inst: each line read, checked and decoded before the
 * next one is read (GLOBAL: UTF-8; INST: ASCII). */
static int text_line(vm *m, bool inst, const char **s, size_t *n)
{
    CKPT_FORWARD(take_line(m, s, n));
    if (*n == 0)
        return fail(m, CKPT_ERR_FORMAT, "%s with an empty name", inst ? "INST" : "GLOBAL");
    if (inst ? !ascii_only(*s, *n) : !utf8_strict((const uint8_t *)*s, *n))
        return fail(m, CKPT_ERR_FORMAT, "%s name is not valid %s", inst ? "INST" : "GLOBAL",
                    inst ? "ASCII" : "UTF-8");
    return CKPT_OK;
}

static int text_global(vm *m, ckpt_value **out)
{
    const char *mod, *name;
    size_t ml, nl;
    CKPT_FORWARD(text_line(m, out != NULL, &mod, &ml));
    CKPT_FORWARD(text_line(m, out != NULL, &name, &nl));
    CKPT_FORWARD(push_global(m, mod, ml, name, nl));
    if (out)
        return pop(m, out);
    return CKPT_OK;
}

static int new_object(vm *m, ckpt_value *callable, ckpt_value *args, ckpt_value *kwargs,
                      ckpt_obj_how how)
{
    if (m->ctx->scan && callable->kind == CKPT_KIND_GLOBAL && how != CKPT_OBJ_REDUCE)
        m->ctx->on_use(m->ctx->user, callable->u.global.name, m->op, m->op_at);
    ckpt_value *v = node(m, CKPT_KIND_OBJECT);
    if (!v)
        return oom(m);
    v->u.obj.callable = callable;
    v->u.obj.args = args;
    v->u.obj.kwargs = kwargs;
    CKPT_FORWARD(nest(m, v, args));
    CKPT_FORWARD(nest(m, v, kwargs));
    v->how = (uint8_t)how;
    return push(m, v);
}

static int seq_from(vm *m, ckpt_kind kind, ckpt_value **items, size_t n);

/* Latin-1 text (UTF-8 here, every code point < 256) back to its bytes. */
static int push_latin1(vm *m, const ckpt_value *text, uint8_t flags)
{
    const uint8_t *s = (const uint8_t *)text->u.s.s;
    size_t n = text->u.s.len, k = 0;
    uint8_t *out = malloc(n ? n : 1);
    if (!out)
        return oom(m);
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x80) {
            out[k++] = s[i];
        } else if ((s[i] == 0xc2 || s[i] == 0xc3) && i + 1 < n) {
            out[k++] = (uint8_t)(((s[i] & 0x03) << 6) | (s[i + 1] & 0x3f));
            i++;
        } else {
            free(out);
            return 1; /* not latin-1: keep the call as an object */
        }
    }
    int rc = push_bytes(m, CKPT_KIND_BYTES, out, k, flags);
    free(out);
    return rc;
}

/*
 * The values protocol 2 can only spell as calls: set([...]), frozenset([...]),
 * _codecs.encode(text, 'latin1') for bytes, bytearray(text, 'latin-1').
 * Pushes the plain value and returns 0; returns 1 to keep it as an object.
 */
static int builtin_value(vm *m, const char *q, ckpt_value *args)
{
    size_t n = args->u.seq.len;
    ckpt_value **a = args->u.seq.items;
    bool set = strcmp(q, "builtins.set") == 0, frozen = strcmp(q, "builtins.frozenset") == 0;
    if (set || frozen) {
        if (n == 0)
            return push(m, node(m, set ? CKPT_KIND_SET : CKPT_KIND_FROZENSET));
        if (n != 1 || (a[0]->kind != CKPT_KIND_LIST && a[0]->kind != CKPT_KIND_TUPLE))
            return 1;
        return seq_from(m, set ? CKPT_KIND_SET : CKPT_KIND_FROZENSET, a[0]->u.seq.items,
                        a[0]->u.seq.len);
    }
    bool codecs = strcmp(q, "_codecs.encode") == 0, bytes = strcmp(q, "builtins.bytes") == 0,
         array = strcmp(q, "builtins.bytearray") == 0;
    if ((bytes || array) && n == 0)
        return push_bytes(m, CKPT_KIND_BYTES, (const uint8_t *)"", 0,
                          array ? CKPT_VF_BYTEARRAY : 0);
    if ((codecs || array) && n == 2 && a[0]->kind == CKPT_KIND_STR &&
        (ckpt_value_is_str(a[1], "latin1") || ckpt_value_is_str(a[1], "latin-1")))
        return push_latin1(m, a[0], array ? CKPT_VF_BYTEARRAY : 0);
    return 1;
}

static int op_reduce(vm *m)
{
    ckpt_value *args, *fn;
    CKPT_FORWARD(pop(m, &args));
    CKPT_FORWARD(pop(m, &fn));
    if (m->ctx->scan) {
        /* load_reduce: callable(*args) - a stand-in takes any arguments; the
         * result is a stand-in too, whatever the callable (not interpreted) */
        if (!opaque(fn))
            return fail(m, CKPT_ERR_FORMAT, "REDUCE calls a %s", ckpt_value_kind_name(fn));
        if (args->kind != CKPT_KIND_TUPLE)
            return fail(m, CKPT_ERR_FORMAT, "REDUCE arguments are a %s, not a tuple",
                        ckpt_value_kind_name(args));
        if (fn->kind == CKPT_KIND_GLOBAL) {
            m->ctx->on_use(m->ctx->user, fn->u.global.name, m->op, m->op_at);
            const ckpt_vec *ga = &args->u.seq;
            if (strcmp(fn->u.global.name, "builtins.getattr") == 0 && ga->len == 2 &&
                ga->items[0]->kind == CKPT_KIND_GLOBAL &&
                ga->items[0]->u.global.cls == CKPT_GLOBAL_KNOWN_DATA &&
                ga->items[1]->kind == CKPT_KIND_STR &&
                ckpt_globals_getattr_known(ga->items[0]->u.global.name, ga->items[1]->u.s.s)) {
                m->getattr_data++; /* getattr(ZeroStageEnum, 'weights'): data */
                if (!m->getattr_shown) {
                    size_t n = strlen(ga->items[0]->u.global.name) + ga->items[1]->u.s.len + 24;
                    char *t = ckpt_arena_alloc(m->a, n);
                    if (t)
                        snprintf(t, n, "builtins.getattr(%s, '%s')", ga->items[0]->u.global.name,
                                 ga->items[1]->u.s.s);
                    m->getattr_shown = t;
                }
            }
            /* getattr(<a call's result>, name): an attribute looked up at run time */
            if (strcmp(fn->u.global.name, "builtins.getattr") == 0 && args->u.seq.len >= 2 &&
                (args->u.seq.items[0]->kind == CKPT_KIND_OBJECT ||
                 args->u.seq.items[1]->kind == CKPT_KIND_OBJECT))
                CKPT_FORWARD(report_computed(m, args->u.seq.items[0], args->u.seq.items[1],
                                             args->u.seq.items[0]->kind == CKPT_KIND_OBJECT
                                                 ? args->u.seq.items[0]
                                                 : args->u.seq.items[1]));
        }
        return new_object(m, fn, args, NULL, CKPT_OBJ_REDUCE);
    }
    if (strcmp(fn->kind == CKPT_KIND_GLOBAL ? fn->u.global.name : "", "builtins.getattr") == 0 &&
        args->kind == CKPT_KIND_TUPLE && args->u.seq.len >= 2 &&
        (args->u.seq.items[0]->kind == CKPT_KIND_OBJECT ||
         args->u.seq.items[1]->kind == CKPT_KIND_OBJECT))
        return report_computed(m, args->u.seq.items[0], args->u.seq.items[1],
                               args->u.seq.items[0]->kind == CKPT_KIND_OBJECT
                                   ? args->u.seq.items[0]
                                   : args->u.seq.items[1]);
    if (fn->kind != CKPT_KIND_GLOBAL)
        return fail(m, CKPT_ERR_FORMAT, "REDUCE calls a %s, not a global",
                    ckpt_kind_name((ckpt_kind)fn->kind));
    if (args->kind != CKPT_KIND_TUPLE)
        return fail(m, CKPT_ERR_FORMAT, "REDUCE arguments are a %s, not a tuple",
                    ckpt_kind_name((ckpt_kind)args->kind));
    const char *q = fn->u.global.name;
    if (strcmp(q, "builtins.getattr") == 0 && !m->ctx->scan && args->u.seq.len == 2 &&
        args->u.seq.items[0]->kind == CKPT_KIND_GLOBAL &&
        args->u.seq.items[0]->u.global.cls == CKPT_GLOBAL_KNOWN_DATA &&
        args->u.seq.items[1]->kind == CKPT_KIND_STR &&
        ckpt_globals_getattr_known(args->u.seq.items[0]->u.global.name,
                                  args->u.seq.items[1]->u.s.s)) {
        fn->u.global.modules++; /* an admitted use (check_pending counts them) */
        return new_object(m, fn, args, NULL, CKPT_OBJ_REDUCE);
    }
    if (fn->u.global.cls == CKPT_GLOBAL_REFUSED && !m->ctx->scan)
        return refuse_use(m, fn); /* a call: modules are made by NEWOBJ */
    if (strcmp(q, "builtins.getattr") == 0 && !m->ctx->scan) {
        /* admitted by a reader's context (a DCP .metadata's enum members):
         * only the (class, attribute) pairs known as data, kept opaque */
        const ckpt_value *c = args->u.seq.len == 2 ? args->u.seq.items[0] : NULL,
                         *a = c ? args->u.seq.items[1] : NULL;
        if (!c || c->kind != CKPT_KIND_GLOBAL || a->kind != CKPT_KIND_STR ||
            !ckpt_globals_getattr_known(c->u.global.name, a->u.s.s))
            return fail(m, CKPT_ERR_UNSAFE, "getattr on %s is not one of the (class, attribute) "
                        "pairs admitted as data",
                        c && c->kind == CKPT_KIND_GLOBAL ? c->u.global.name : "a value");
        return new_object(m, fn, args, NULL, CKPT_OBJ_REDUCE);
    }
    if (m->ctx->scan) {
        m->ctx->on_use(m->ctx->user, q, m->op, m->op_at);
        if (strncmp(q, "torch._utils._rebuild_", 22) == 0)
            return new_object(m, fn, args, NULL, CKPT_OBJ_REDUCE); /* scanning: not run */
    }
    if (fn->u.global.cls == CKPT_GLOBAL_INTERPRETED) {
        if (strcmp(q, "collections.OrderedDict") == 0) {
            ckpt_value *d = node(m, CKPT_KIND_DICT);
            if (!d)
                return oom(m);
            d->flags |= CKPT_VF_ORDERED;
            if (args->u.seq.len > 1)
                return fail(m, CKPT_ERR_FORMAT, "OrderedDict called with %zu arguments",
                            (size_t)args->u.seq.len);
            if (args->u.seq.len == 1) {
                ckpt_value *items = args->u.seq.items[0];
                if (items->kind != CKPT_KIND_LIST && items->kind != CKPT_KIND_TUPLE)
                    return fail(m, CKPT_ERR_FORMAT, "OrderedDict argument is a %s",
                                ckpt_kind_name((ckpt_kind)items->kind));
                for (size_t i = 0; i < items->u.seq.len; i++) {
                    ckpt_value *pair = items->u.seq.items[i];
                    if ((pair->kind != CKPT_KIND_TUPLE && pair->kind != CKPT_KIND_LIST) ||
                        pair->u.seq.len != 2)
                        return fail(m, CKPT_ERR_FORMAT, "OrderedDict item is not a pair");
                    CKPT_FORWARD(add_item(m, d, &d->u.dict.keys, pair->u.seq.items[0]));
                    CKPT_FORWARD(add_item(m, d, &d->u.dict.vals, pair->u.seq.items[1]));
                }
            }
            return push(m, d);
        }
        /* TorchScript's list and type-tag wrappers (torch.jit._pickle): identities
         * of their first argument.  Builtin classification never makes them
         * interpreted (torch.jit.* is refused); only the TorchScript reader's
         * context does, for its archive's pickles. */
        if (strncmp(q, "torch.jit._pickle.", 18) == 0) {
            if (args->u.seq.len < 1)
                return fail(m, CKPT_ERR_FORMAT, "%s called without an argument", q);
            return push(m, args->u.seq.items[0]);
        }
        int rc = ckpt_pickle_rebuild(m, q, args);
        if (rc <= 0)
            return rc;
    }
    if (fn->u.global.cls == CKPT_GLOBAL_KNOWN_DATA) {
        int rc = builtin_value(m, q, args);
        if (rc <= 0)
            return rc;
    }
    return new_object(m, fn, args, NULL, CKPT_OBJ_REDUCE);
}

static int scan_build(vm *m, ckpt_value *obj, ckpt_value *state);

static int op_build(vm *m)
{
    ckpt_value *state = NULL, *obj = NULL;
    CKPT_FORWARD(pop(m, &state));
    CKPT_FORWARD(top(m, &obj));
    ckpt_value **slot = NULL;
    if (m->ctx->scan) {
        /* scanning: say which class's object is built; keep no state */
        if (obj->kind == CKPT_KIND_OBJECT && obj->u.obj.callable &&
            obj->u.obj.callable->kind == CKPT_KIND_GLOBAL)
            m->ctx->on_use(m->ctx->user, obj->u.obj.callable->u.global.name, m->op, m->op_at);
        return scan_build(m, obj, state);
    }
    if (obj->kind == CKPT_KIND_DICT && (obj->flags & CKPT_VF_ORDERED))
        slot = &obj->u.dict.state;
    else if (obj->kind == CKPT_KIND_OBJECT)
        slot = &obj->u.obj.state;
    if (obj->kind == CKPT_KIND_OBJECT && obj->how == CKPT_OBJ_NEWOBJ &&
        !obj->u.obj.state && module_state(state)) {
        obj->flags |= CKPT_VF_MODULE;
        const ckpt_value *cls = obj->u.obj.callable;
        if (cls->kind == CKPT_KIND_GLOBAL && cls->u.global.cls == CKPT_GLOBAL_REFUSED)
            m->unbuilt--;
    } else if (obj->kind == CKPT_KIND_OBJECT && obj->u.obj.callable->kind == CKPT_KIND_GLOBAL &&
               obj->u.obj.callable->u.global.cls == CKPT_GLOBAL_REFUSED) {
        return refuse_use(m, obj->u.obj.callable); /* an object, but not a module */
    }
    else if (obj->kind == CKPT_KIND_TENSOR) {
        /* a tensor's __setstate__ takes its attribute dict; anything else
         * makes torch.load fail, so it is not a checkpoint torch reads */
        if (state->kind != CKPT_KIND_DICT && state->kind != CKPT_KIND_NONE)
            return fail(m, CKPT_ERR_FORMAT, "BUILD on a tensor with a %s as state",
                        ckpt_kind_name((ckpt_kind)state->kind));
        slot = &obj->u.tensor->state;
    }
    if (!slot)
        return fail(m, CKPT_ERR_FORMAT, "BUILD on a %s", ckpt_value_kind_name(obj));
    if (*slot)
        return fail(m, CKPT_ERR_UNSUPPORTED, "a second BUILD on the same %s",
                    ckpt_value_kind_name(obj));
    if (slot == &obj->u.dict.state && state->kind != CKPT_KIND_DICT &&
        state->kind != CKPT_KIND_NONE)
        return fail(m, CKPT_ERR_FORMAT, "BUILD on an OrderedDict with a %s as state",
                    ckpt_kind_name((ckpt_kind)state->kind));
    CKPT_FORWARD(nest(m, obj, state));
    *slot = state;
    return CKPT_OK;
}

/* ---- scanning: where Python's own values make the C unpickler fail ------------
 * A global or a call's result is a stand-in that accepts everything (pickle.h);
 * the values the VM makes itself are Python's lists, dicts, tuples... */

static bool hashable(const ckpt_value *v, int depth)
{
    if (v->kind == CKPT_KIND_LIST || v->kind == CKPT_KIND_DICT || v->kind == CKPT_KIND_SET ||
        (v->kind == CKPT_KIND_BYTES && (v->flags & CKPT_VF_BYTEARRAY)))
        return false;
    if (v->kind == CKPT_KIND_TUPLE && depth < 1000)
        for (size_t i = 0; i < v->u.seq.len; i++)
            if (!hashable(v->u.seq.items[i], depth + 1))
                return false;
    return true;
}

static int need_hashable(vm *m, ckpt_value **items, size_t n, size_t step)
{
    for (size_t i = 0; i < n; i += step)
        if (!hashable(items[i], 0))
            return fail(m, CKPT_ERR_FORMAT, "unhashable %s as a key or set item",
                        ckpt_value_kind_name(items[i]));
    return CKPT_OK;
}

/* An int as Python's index: *out when it fits. */
static bool small_int(const ckpt_value *v, int64_t *out)
{
    if (v->kind == CKPT_KIND_BOOL) {
        *out = v->u.b;
        return true;
    }
    if (v->kind != CKPT_KIND_INT || v->u.i.big)
        return false;
    *out = v->u.i.v;
    return true;
}

/* do_setitems: TARGET[k] = v for each pair. */
static int scan_set_items(vm *m, ckpt_value *target, ckpt_value **kv, size_t n)
{
    if (n % 2)
        return fail(m, CKPT_ERR_FORMAT, "odd number of items for SETITEMS");
    if (opaque(target) || !n)
        return CKPT_OK;
    if (target->kind == CKPT_KIND_DICT) {
        CKPT_FORWARD(need_hashable(m, kv, n, 2));
        for (size_t i = 0; i < n; i += 2) {
            CKPT_FORWARD(add_item(m, target, &target->u.dict.keys, kv[i]));
            CKPT_FORWARD(add_item(m, target, &target->u.dict.vals, kv[i + 1]));
        }
        return CKPT_OK;
    }
    bool array = target->kind == CKPT_KIND_BYTES && (target->flags & CKPT_VF_BYTEARRAY);
    if (target->kind == CKPT_KIND_LIST || array) {
        int64_t len = (int64_t)(array ? target->u.s.len : target->u.seq.len), k, b;
        for (size_t i = 0; i < n; i += 2)
            if (!small_int(kv[i], &k) || k < -len || k >= len ||
                (array && (!small_int(kv[i + 1], &b) || b < 0 || b > 255)))
                return fail(m, CKPT_ERR_FORMAT, "SETITEM on a %s with a bad index or value",
                            ckpt_value_kind_name(target));
        return CKPT_OK;
    }
    return fail(m, CKPT_ERR_FORMAT, "SETITEM on a %s", ckpt_value_kind_name(target));
}

/* do_append: list.extend(items), else obj.extend / obj.append. */
static int scan_append(vm *m, ckpt_value *target, ckpt_value **items, size_t n)
{
    if (opaque(target) || !n)
        return CKPT_OK;
    if (target->kind == CKPT_KIND_LIST) {
        for (size_t i = 0; i < n; i++)
            CKPT_FORWARD(add_item(m, target, &target->u.seq, items[i]));
        return CKPT_OK;
    }
    if (target->kind == CKPT_KIND_BYTES && (target->flags & CKPT_VF_BYTEARRAY)) {
        int64_t b;
        for (size_t i = 0; i < n; i++)
            if (!small_int(items[i], &b) || b < 0 || b > 255)
                return fail(m, CKPT_ERR_FORMAT, "APPEND of a non-byte to a bytearray");
        return CKPT_OK;
    }
    return fail(m, CKPT_ERR_FORMAT, "APPEND on a %s", ckpt_value_kind_name(target));
}

/* load_build with Python's default __setstate__ for the VM's own values. */
static int scan_build(vm *m, ckpt_value *obj, ckpt_value *state)
{
    if (opaque(obj))
        return CKPT_OK;
    ckpt_value *slots = NULL;
    if (state->kind == CKPT_KIND_TUPLE && state->u.seq.len == 2) {
        slots = state->u.seq.items[1];
        state = state->u.seq.items[0];
    }
    if (state->kind != CKPT_KIND_NONE) /* needs the instance's __dict__ */
        return fail(m, CKPT_ERR_FORMAT, "BUILD state on a %s, which has no __dict__",
                    ckpt_value_kind_name(obj));
    if (slots && (slots->kind != CKPT_KIND_DICT || slots->u.dict.keys.len))
        return fail(m, CKPT_ERR_FORMAT, "BUILD slot state on a %s", ckpt_value_kind_name(obj));
    return CKPT_OK;
}

/* OBJECT's items, made at its first APPEND or SETITEM */
static int obj_items(vm *m, ckpt_value *obj)
{
    if (!obj->u.obj.items && !(obj->u.obj.items = ckpt_arena_alloc(m->a, sizeof(ckpt_obj_items))))
        return oom(m);
    return CKPT_OK;
}

static int set_items(vm *m, ckpt_value *target, ckpt_value **kv, size_t n)
{
    if (m->ctx->scan)
        return scan_set_items(m, target, kv, n);
    if (n % 2)
        return fail(m, CKPT_ERR_FORMAT, "SETITEMS with an odd number of values");
    ckpt_vec *keys, *vals;
    if (target->kind == CKPT_KIND_DICT) {
        keys = &target->u.dict.keys;
        vals = &target->u.dict.vals;
    } else if (target->kind == CKPT_KIND_OBJECT) {
        CKPT_FORWARD(obj_items(m, target));
        keys = &target->u.obj.items->dictkeys;
        vals = &target->u.obj.items->dictvals;
    } else {
        return fail(m, CKPT_ERR_FORMAT, "SETITEM on a %s", ckpt_value_kind_name(target));
    }
    for (size_t i = 0; i < n; i += 2) {
        CKPT_FORWARD(add_item(m, target, keys, kv[i]));
        CKPT_FORWARD(add_item(m, target, vals, kv[i + 1]));
    }
    return CKPT_OK;
}

static int append_items(vm *m, ckpt_value *target, ckpt_value **items, size_t n)
{
    if (m->ctx->scan)
        return scan_append(m, target, items, n);
    ckpt_vec *vec;
    if (target->kind == CKPT_KIND_LIST)
        vec = &target->u.seq;
    else if (target->kind == CKPT_KIND_OBJECT && !obj_items(m, target))
        vec = &target->u.obj.items->listitems;
    else if (target->kind == CKPT_KIND_OBJECT)
        return oom(m);
    else
        return fail(m, CKPT_ERR_FORMAT, "APPEND on a %s", ckpt_value_kind_name(target));
    for (size_t i = 0; i < n; i++)
        CKPT_FORWARD(add_item(m, target, vec, items[i]));
    return CKPT_OK;
}

static int seq_from(vm *m, ckpt_kind kind, ckpt_value **items, size_t n)
{
    ckpt_value *v = node(m, kind);
    if (!v)
        return oom(m);
    for (size_t i = 0; i < n; i++)
        CKPT_FORWARD(add_item(m, v, &v->u.seq, items[i]));
    return push(m, v);
}

static int persistent(vm *m, ckpt_value *pid)
{
    if (!m->ctx->persistent_load)
        return fail(m, CKPT_ERR_UNSUPPORTED, "persistent id outside a checkpoint");
    /* a storage type the reader does not know is a refused class, as before
     * modules were looked for */
    if (pid->kind == CKPT_KIND_TUPLE && pid->u.seq.len >= 2 &&
        !ckpt_value_is_str(pid->u.seq.items[0], "module") &&
        pid->u.seq.items[1]->kind == CKPT_KIND_GLOBAL &&
        pid->u.seq.items[1]->u.global.cls == CKPT_GLOBAL_REFUSED && !m->ctx->scan)
        return refuse_use(m, pid->u.seq.items[1]);
    ckpt_error inner;
    ckpt_err_clear(&inner);
    ckpt_value *v = m->ctx->persistent_load(m->ctx->user, pid, m->op_at, &inner);
    if (!v)
        return fail(m, inner.code ? inner.code : CKPT_ERR_FORMAT, "%s", inner.msg);
    if (m->ctx->scan) { /* what persistent_load returns: a stand-in, like a call's */
        v = node(m, CKPT_KIND_OBJECT);
        return push(m, v);
    }
    /* a legacy ('module', cls, ...) id gives its class: the tuple's reference
     * to a refused class goes with the tuple */
    if (v->kind == CKPT_KIND_GLOBAL && v->u.global.cls == CKPT_GLOBAL_REFUSED && v->u.global.refs)
        v->u.global.refs--;
    return push(m, v);
}

/* ---- the loop ----------------------------------------------------------------------- */

static int step(vm *m, bool *stop)
{
    ckpt_value *a = NULL, *b = NULL, *c = NULL, **items = NULL;
    size_t n = 0;
    uint64_t u;
    const char *line;
    size_t ll;

    const uint8_t *opp;
    m->op_at = m->pos;
    if (rd(m, 1, &opp)) {
        ckpt_err_clear(m->err);
        return fail(m, CKPT_ERR_FORMAT, "truncated pickle: no STOP opcode");
    }
    m->op_at = (uint64_t)(opp - m->buf);
    m->op = *opp;
    switch (m->op) {
    case CKPT_OP_PROTO:
        CKPT_FORWARD(take_le(m, 1, &u));
        if (u > 5)
            return fail(m, CKPT_ERR_UNSUPPORTED, "pickle protocol %llu (at most 5)",
                        (unsigned long long)u);
        m->proto = (int)u;
        return CKPT_OK;
    case CKPT_OP_FRAME:
        CKPT_FORWARD(take_le(m, 8, &u));
        return rd_frame(m, u);
    case CKPT_OP_STOP:
        /* inside a frame: the file position is after STOP (peeked) or at the
         * frame's end (read whole), where the next pickle.load starts */
        if (m->wend > m->pos) {
            m->ctx->frame_stop = true;
            if (frame_dropped(m))
                m->pos = m->wend;
        }
        *stop = true;
        return CKPT_OK;
    case CKPT_OP_MARK:
        return push_mark(m);
    case CKPT_OP_POP:
        if (m->sp > floor_of(m)) {
            m->sp--;
            return CKPT_OK;
        }
        return pop_mark(m, &items, &n);
    case CKPT_OP_POP_MARK:
        return pop_mark(m, &items, &n);
    case CKPT_OP_DUP:
        CKPT_FORWARD(top(m, &a));
        return push(m, a);

    case CKPT_OP_NONE:
        return push(m, node(m, CKPT_KIND_NONE));
    case CKPT_OP_NEWTRUE:
    case CKPT_OP_NEWFALSE:
        a = node(m, CKPT_KIND_BOOL);
        if (a)
            a->u.b = m->op == CKPT_OP_NEWTRUE;
        return push(m, a);
    case CKPT_OP_BININT:
        CKPT_FORWARD(take_le(m, 4, &u));
        return push_int(m, (int32_t)(uint32_t)u);
    case CKPT_OP_BININT1:
        CKPT_FORWARD(take_le(m, 1, &u));
        return push_int(m, (int64_t)u);
    case CKPT_OP_BININT2:
        CKPT_FORWARD(take_le(m, 2, &u));
        return push_int(m, (int64_t)u);
    case CKPT_OP_LONG1:
    case CKPT_OP_LONG4:
        CKPT_FORWARD(take_le(m, m->op == CKPT_OP_LONG1 ? 1 : 4, &u));
        if (m->op == CKPT_OP_LONG4 && (u & 0x80000000u))
            return fail(m, CKPT_ERR_FORMAT, "LONG4 with a negative length");
        if (u == 0)
            return push_long_bytes(m, NULL, 0);
        {
            const uint8_t *p;
            CKPT_FORWARD(rd(m, u, &p));
            return push_long_bytes(m, p, (size_t)u);
        }
    case CKPT_OP_INT: {
        CKPT_FORWARD(take_line(m, &line, &ll));
        if (ll == 0)
            return fail(m, CKPT_ERR_FORMAT, "INT with an empty argument");
        /* load_int: strtol(line, 0) - C's octal "010" and hex, leading
         * whitespace - on the line as a C string (it ends at a NUL byte);
         * what it cannot take whole (or overflows) goes to int(text, 0).  A
         * line of one character and the newline that strtol reads as 0 or 1
         * is a bool ("01", " 1" too). */
        size_t cl = memchr(line, 0, ll) ? (size_t)((const char *)memchr(line, 0, ll) - line) : ll;
        char *tmp = malloc(cl + 1);
        if (!tmp)
            return oom(m);
        memcpy(tmp, line, cl);
        tmp[cl] = '\0';
        char *end;
        errno = 0;
        long x = strtol(tmp, &end, 0);
        bool whole = !errno && *end == '\0';
        free(tmp);
        if (!whole)
            return push_int_text(m, line, cl);
        if (ll == 2 && (x == 0 || x == 1)) {
            a = node(m, CKPT_KIND_BOOL);
            if (a)
                a->u.b = x == 1;
            return push(m, a);
        }
        return push_int(m, (int64_t)x);
    }
    case CKPT_OP_LONG:
        CKPT_FORWARD(take_line(m, &line, &ll));
        if (ll == 0)
            return fail(m, CKPT_ERR_FORMAT, "LONG with an empty argument");
        if (line[ll - 1] == 'L') /* load_long drops a final 'L', then reads a C string */
            ll--;
        if (memchr(line, 0, ll))
            ll = (size_t)((const char *)memchr(line, 0, ll) - line);
        return push_int_text(m, line, ll);
    case CKPT_OP_FLOAT: {
        CKPT_FORWARD(take_line(m, &line, &ll));
        char tmp[64];
        if (memchr(line, 0, ll)) /* a C string to PyOS_string_to_double */
            ll = (size_t)((const char *)memchr(line, 0, ll) - line);
        if (ll == 0 || ll >= sizeof(tmp))
            return fail(m, CKPT_ERR_FORMAT, "bad FLOAT text");
        memcpy(tmp, line, ll);
        tmp[ll] = '\0';
        char *end;
        errno = 0;
        double d = strtod(tmp, &end);
        if (*end != '\0' || end == tmp || (errno == ERANGE && isinf(d))) /* OverflowError */
            return fail(m, CKPT_ERR_FORMAT, "bad FLOAT text");
        a = node(m, CKPT_KIND_FLOAT);
        if (a)
            a->u.f = d;
        return push(m, a);
    }
    case CKPT_OP_BINFLOAT: {
        const uint8_t *p;
        CKPT_FORWARD(rd(m, 8, &p));
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++)
            bits = (bits << 8) | p[i];
        a = node(m, CKPT_KIND_FLOAT);
        if (a)
            memcpy(&a->u.f, &bits, sizeof(double));
        return push(m, a);
    }

    case CKPT_OP_BINUNICODE:
        return take_counted(m, 4, CKPT_KIND_STR, 0);
    case CKPT_OP_SHORT_BINUNICODE:
        return take_counted(m, 1, CKPT_KIND_STR, 0);
    case CKPT_OP_BINUNICODE8:
        return take_counted(m, 8, CKPT_KIND_STR, 0);
    case CKPT_OP_BINSTRING:
        return take_counted(m, 4, CKPT_KIND_STR, 0);
    case CKPT_OP_SHORT_BINSTRING:
        return take_counted(m, 1, CKPT_KIND_STR, 0);
    case CKPT_OP_BINBYTES:
        return take_counted(m, 4, CKPT_KIND_BYTES, 0);
    case CKPT_OP_SHORT_BINBYTES:
        return take_counted(m, 1, CKPT_KIND_BYTES, 0);
    case CKPT_OP_BINBYTES8:
        return take_counted(m, 8, CKPT_KIND_BYTES, 0);
    case CKPT_OP_BYTEARRAY8:
        return take_counted(m, 8, CKPT_KIND_BYTES, CKPT_VF_BYTEARRAY);
    case CKPT_OP_STRING:
        CKPT_FORWARD(take_line(m, &line, &ll));
        return push_quoted(m, line, ll);
    case CKPT_OP_UNICODE:
        CKPT_FORWARD(take_line(m, &line, &ll));
        return push_raw_unicode(m, line, ll);

    case CKPT_OP_EMPTY_TUPLE:
        return push(m, node(m, CKPT_KIND_TUPLE));
    case CKPT_OP_TUPLE:
        CKPT_FORWARD(pop_mark(m, &items, &n));
        return seq_from(m, CKPT_KIND_TUPLE, items, n);
    case CKPT_OP_TUPLE1:
    case CKPT_OP_TUPLE2:
    case CKPT_OP_TUPLE3:
        n = (size_t)(m->op - CKPT_OP_TUPLE1 + 1);
        if (m->sp - floor_of(m) < n)
            return fail(m, CKPT_ERR_FORMAT, "stack underflow: TUPLE%zu with %zu values", n,
                        m->sp - floor_of(m));
        m->sp -= n;
        return seq_from(m, CKPT_KIND_TUPLE, m->stack + m->sp, n);
    case CKPT_OP_EMPTY_LIST:
        return push(m, node(m, CKPT_KIND_LIST));
    case CKPT_OP_LIST:
        CKPT_FORWARD(pop_mark(m, &items, &n));
        return seq_from(m, CKPT_KIND_LIST, items, n);
    case CKPT_OP_APPEND:
        CKPT_FORWARD(pop(m, &a));
        CKPT_FORWARD(top(m, &b));
        return append_items(m, b, &a, 1);
    case CKPT_OP_APPENDS:
        /* do_append: the list must lie above the enclosing MARK too */
        CKPT_FORWARD(pop_mark(m, &items, &n));
        CKPT_FORWARD(top(m, &b));
        return append_items(m, b, items, n);
    case CKPT_OP_EMPTY_DICT:
        return push(m, node(m, CKPT_KIND_DICT));
    case CKPT_OP_DICT:
        CKPT_FORWARD(pop_mark(m, &items, &n));
        a = node(m, CKPT_KIND_DICT);
        if (!a)
            return oom(m);
        {
            /* items live on the stack above sp; copy before pushing */
            int rc = set_items(m, a, items, n);
            if (!rc && m->ctx->scan && n % 2 == 0)
                rc = need_hashable(m, items, n, 2);
            if (rc)
                return rc;
        }
        return push(m, a);
    case CKPT_OP_SETITEM: {
        ckpt_value *kv[2]; /* load_setitem: the three values above the MARK */
        CKPT_FORWARD(pop(m, &kv[1]));
        CKPT_FORWARD(pop(m, &kv[0]));
        CKPT_FORWARD(top(m, &c));
        return set_items(m, c, kv, 2);
    }
    case CKPT_OP_SETITEMS:
        /* do_setitems: the dict must lie above the enclosing MARK too */
        CKPT_FORWARD(pop_mark(m, &items, &n));
        CKPT_FORWARD(top(m, &c));
        return set_items(m, c, items, n);
    case CKPT_OP_EMPTY_SET:
        return push(m, node(m, CKPT_KIND_SET));
    case CKPT_OP_ADDITEMS:
        CKPT_FORWARD(pop_mark(m, &items, &n));
        if (m->ctx->scan) { /* load_additems: set.update, else obj.add; the set
                             * must lie above the enclosing MARK */
            CKPT_FORWARD(top(m, &c));
            if (!n || opaque(c))
                return CKPT_OK;
            if (c->kind != CKPT_KIND_SET)
                return fail(m, CKPT_ERR_FORMAT, "ADDITEMS on a %s", ckpt_value_kind_name(c));
            CKPT_FORWARD(need_hashable(m, items, n, 1));
        } else {
            CKPT_FORWARD(top(m, &c));
        }
        if (c->kind != CKPT_KIND_SET)
            return fail(m, CKPT_ERR_FORMAT, "ADDITEMS on a %s", ckpt_value_kind_name(c));
        for (size_t i = 0; i < n; i++)
            CKPT_FORWARD(add_item(m, c, &c->u.seq, items[i]));
        return CKPT_OK;
    case CKPT_OP_FROZENSET:
        CKPT_FORWARD(pop_mark(m, &items, &n));
        if (m->ctx->scan)
            CKPT_FORWARD(need_hashable(m, items, n, 1));
        return seq_from(m, CKPT_KIND_FROZENSET, items, n);

    case CKPT_OP_GLOBAL:
        return text_global(m, NULL);
    case CKPT_OP_STACK_GLOBAL:
        return stack_global(m);
    case CKPT_OP_EXT1:
    case CKPT_OP_EXT2:
    case CKPT_OP_EXT4:
        /* load_extension reads its code before it finds no registry entry */
        CKPT_FORWARD(take_le(m, m->op == CKPT_OP_EXT1 ? 1 : m->op == CKPT_OP_EXT2 ? 2 : 4, &u));
        return fail(m, CKPT_ERR_UNSUPPORTED, "extension registry opcodes (EXT1/2/4) are not supported");
    case CKPT_OP_REDUCE:
        return op_reduce(m);
    case CKPT_OP_BUILD:
        return op_build(m);
    case CKPT_OP_NEWOBJ:
        CKPT_FORWARD(pop(m, &b));
        CKPT_FORWARD(pop(m, &a));
        /* getattr(ShardedTensor, 'ProcessGroupState')(): a nested class got
         * by an admitted getattr (refused at the getattr otherwise) */
        if (a->kind == CKPT_KIND_OBJECT && a->how == CKPT_OBJ_REDUCE &&
            strcmp(obj_class(a), "builtins.getattr") == 0 && b->kind == CKPT_KIND_TUPLE)
            return new_object(m, a, b, NULL, CKPT_OBJ_NEWOBJ);
        if (a->kind != CKPT_KIND_GLOBAL || b->kind != CKPT_KIND_TUPLE)
            return fail(m, CKPT_ERR_FORMAT, "NEWOBJ needs a class and a tuple");
        if (a->u.global.cls == CKPT_GLOBAL_REFUSED && !m->ctx->scan) {
            if (b->u.seq.len || ckpt_globals_dangerous(a->u.global.name))
                return refuse_use(m, a); /* a module is made with cls.__new__(cls) */
            a->u.global.modules++;
            m->unbuilt++;
        }
        return new_object(m, a, b, NULL, CKPT_OBJ_NEWOBJ);
    case CKPT_OP_NEWOBJ_EX:
        CKPT_FORWARD(pop(m, &c));
        CKPT_FORWARD(pop(m, &b));
        CKPT_FORWARD(pop(m, &a));
        if (a->kind != CKPT_KIND_GLOBAL || b->kind != CKPT_KIND_TUPLE || c->kind != CKPT_KIND_DICT)
            return fail(m, CKPT_ERR_FORMAT, "NEWOBJ_EX needs a class, a tuple and a dict");
        return new_object(m, a, b, c, CKPT_OBJ_NEWOBJ_EX);
    case CKPT_OP_INST: {
        ckpt_value *cls, *args;
        if (!m->nmarks) /* load_inst pops the MARK before it reads the name */
            return fail(m, CKPT_ERR_FORMAT, "opcode needs a MARK and there is none");
        size_t at = m->marks[m->nmarks - 1];
        m->nmarks--;
        CKPT_FORWARD(text_global(m, &cls));
        if (at > m->sp)
            return fail(m, CKPT_ERR_FORMAT, "stack underflow");
        items = m->stack ? m->stack + at : NULL;
        n = m->sp - at;
        m->sp = at;
        ckpt_value **copy = items;
        args = node(m, CKPT_KIND_TUPLE);
        if (!args)
            return oom(m);
        for (size_t i = 0; i < n; i++)
            CKPT_FORWARD(add_item(m, args, &args->u.seq, copy[i]));
        return new_object(m, cls, args, NULL, CKPT_OBJ_INST);
    }
    case CKPT_OP_OBJ: {
        CKPT_FORWARD(pop_mark(m, &items, &n));
        if (n == 0 || (items[0]->kind != CKPT_KIND_GLOBAL && !(m->ctx->scan && opaque(items[0]))))
            return fail(m, CKPT_ERR_FORMAT, "OBJ needs a class after the MARK");
        ckpt_value *cls = items[0];
        ckpt_value *args = node(m, CKPT_KIND_TUPLE);
        if (!args)
            return oom(m);
        for (size_t i = 1; i < n; i++)
            CKPT_FORWARD(add_item(m, args, &args->u.seq, items[i]));
        return new_object(m, cls, args, NULL, CKPT_OBJ_OBJ);
    }

    case CKPT_OP_PERSID:
        CKPT_FORWARD(take_line(m, &line, &ll));
        if (!ascii_only(line, ll)) /* load_persid decodes it as ASCII */
            return fail(m, CKPT_ERR_FORMAT, "PERSID argument is not ASCII");
        CKPT_FORWARD(push_bytes(m, CKPT_KIND_STR, (const uint8_t *)line, ll, 0));
        CKPT_FORWARD(pop(m, &a));
        return persistent(m, a);
    case CKPT_OP_BINPERSID:
        CKPT_FORWARD(pop(m, &a));
        return persistent(m, a);

    case CKPT_OP_PUT:
        CKPT_FORWARD(take_index_line(m, &u));
        return memo_put_top(m, u);
    case CKPT_OP_BINPUT:
        CKPT_FORWARD(take_le(m, 1, &u));
        return memo_put_top(m, u);
    case CKPT_OP_LONG_BINPUT:
        CKPT_FORWARD(take_le(m, 4, &u));
        return memo_put_top(m, u);
    case CKPT_OP_MEMOIZE:
        return memo_put_top(m, m->memo_n);
    case CKPT_OP_GET:
        CKPT_FORWARD(take_index_line(m, &u));
        return memo_get(m, u);
    case CKPT_OP_BINGET:
        CKPT_FORWARD(take_le(m, 1, &u));
        return memo_get(m, u);
    case CKPT_OP_LONG_BINGET:
        CKPT_FORWARD(take_le(m, 4, &u));
        return memo_get(m, u);

    case CKPT_OP_NEXT_BUFFER: /* torch.load passes no buffers: an error before any read */
        return fail(m, CKPT_ERR_UNSUPPORTED, "out-of-band buffers (protocol 5) are not supported");
    case CKPT_OP_READONLY_BUFFER:
        /* load_readonly_buffer: a memoryview of the top value, which must
         * export a buffer; bytes stay as they are, a bytearray is viewed
         * read-only.  What a global names or a call makes may export one:
         * scanning goes on (the stand-in assumption, pickle.h). */
        CKPT_FORWARD(top(m, &a));
        if (a->kind == CKPT_KIND_BYTES || (m->ctx->scan && opaque(a)))
            return CKPT_OK;
        return fail(m, CKPT_ERR_FORMAT, "READONLY_BUFFER on a %s, not a bytes-like object",
                    ckpt_value_kind_name(a));
    default:
        return fail(m, CKPT_ERR_FORMAT, "unknown opcode 0x%02x", (unsigned)m->op);
    }
}

int ckpt_pickle_load(ckpt_pickle_ctx *ctx, const uint8_t *buf, size_t len, ckpt_value **out,
                     size_t *consumed, ckpt_error *err)
{
    vm m = {.ctx = ctx, .a = ctx->arena, .err = err, .buf = buf, .len = len,
            .refuse_use = refuse_use};
    int rc = CKPT_OK;
    bool stop = false;

    ckpt_map_init(&m.memo, CKPT_MAP_U64);
    *out = NULL;
    if (ctx->scan && (!ctx->on_global || !ctx->on_use))
        return ckpt_err(err, CKPT_ERR_USAGE, "%s: scanning needs on_global and on_use", ctx->name);
    if (len > ctx->limits[CKPT_LIMIT_PICKLE_BYTES])
        return ckpt_err(err, CKPT_ERR_LIMIT,
                        "%s: pickle of %zu bytes is over the limit of %llu (--max-pickle-bytes)",
                        ctx->name, len, (unsigned long long)ctx->limits[CKPT_LIMIT_PICKLE_BYTES]);
    m.arena_at_start = m.a->used_total;
    while (rc == CKPT_OK && !stop)
        if ((rc = step(&m, &stop)) == CKPT_OK)
            rc = within_budget(&m, 0);
    if (rc == CKPT_OK) {
        if (m.sp <= floor_of(&m)) /* STOP pops, and a MARK fences the stack */
            rc = fail(&m, CKPT_ERR_FORMAT, "STOP with an empty stack");
        else
            *out = m.stack[m.sp - 1];
    }
    if (rc == CKPT_OK)
        rc = check_pending(&m);
    /* every getattr on the stack went into a REDUCE that is data */
    if (rc == CKPT_OK && ctx->scan && ctx->on_getattr_data && m.getattr_refs &&
        m.getattr_refs == m.getattr_data && m.getattr_shown)
        ctx->on_getattr_data(ctx->user, m.getattr_shown);
    free(m.pending);
    if (consumed) /* where the file position is: BYTESIO's at the buffer's end */
        *consumed = ctx->feed == CKPT_FEED_BYTESIO ? m.wend : m.pos;
    if (rc == CKPT_OK && !ctx->scan && ctx->feed == CKPT_FEED_CHOOSE && ctx->ndiverge)
        rc = ckpt_err(err, CKPT_ERR_FORMAT, "%s: a FRAME's bytes are read differently by "
                      "CPython's unpickler as the file is buffered (a read past the frame's "
                      "end, or STOP with bytes of the frame after it): refused", ctx->name);
    free(m.stack);
    free(m.marks);
    free(m.dense);
    ckpt_map_release(&m.memo);
    return rc;
}
