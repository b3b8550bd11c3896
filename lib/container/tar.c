/*
 * tar.c - the tar container of torch <= 0.1's checkpoints, read the way
 * Python 3.11's tarfile reads it for torch.load: tarfile.open(mode='r:')
 * parses the first header (whether torch takes the file as a tar at all),
 * getmember walks every header (and the last member of a name wins).
 * Nothing here trusts a size: every header and data range is checked
 * against the file.
 */
#include "container/container.h"

#include <stdlib.h>
#include <string.h>

#define BLOCK 512
/* CPython stops a chain of extended headers with RecursionError (about
 * 330 levels of fromtarfile/_proc_member/_proc_pax); we stop earlier. */
#define MAX_NEST 64
/* Longer GNU long names and PAX bodies are refused (a limit of ckpt's; a
 * length past the end of the file is a short read, as Python's read() gives
 * when it can allocate that much, which we do not model). */
#define MAX_EXT_BODY (64u << 20)

/* How reading one header went: tarfile's exceptions, in its terms. */
typedef enum hdr_rc {
    H_OK = 0,
    H_EOF,        /* EOFHeaderError: a block of zeros */
    H_EMPTY,      /* EmptyHeaderError: no bytes */
    H_TRUNC,      /* TruncatedHeaderError */
    H_INVALID,    /* InvalidHeaderError: checksum, a number field, a PAX record */
    H_SUBSEQUENT, /* SubsequentHeaderError: the header after a long name / PAX one */
    H_FAIL        /* something not a TarError (ValueError, MemoryError, ...):
                   * torch.load fails; or a sparse member, which we do not read */
} hdr_rc;

typedef struct pax {
    /* the keywords that change what we read; a value NULL when absent */
    uint8_t *path;
    size_t path_len;
    bool has_path;
    uint8_t *size;
    size_t size_len;
    bool has_size;
    bool sparse; /* GNU.sparse.*: we do not read sparse members */
} pax;

typedef struct state {
    int fd;
    uint64_t file_size;
    uint64_t pos;    /* the file object's position */
    int64_t offset;  /* tarfile.offset: where the next header is */
    pax global;      /* tarfile.pax_headers ('g' headers) */
    char why[160];   /* what went wrong, for messages */
} state;

typedef struct hdr {
    uint8_t *name;
    size_t name_len;
    char type;
    int64_t size;
    bool size_huge;   /* past int64: Python seeks there and fails */
    int64_t offset;   /* of its first header (a long-name or PAX one included) */
    int64_t offset_data;
} hdr;

struct ckpt_tar {
    ckpt_tar_member *m;
    size_t n, cap;
};

static void why(state *st, const char *msg)
{
    snprintf(st->why, sizeof st->why, "%s", msg);
}

/* Python's str.strip() on ASCII: whitespace and the separators \x1c..\x1f. */
static bool py_space(uint8_t c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* int(TEXT, BASE) for ASCII TEXT as Python parses it (sign, 0o/0x prefix
 * when BASE says so, '_' between digits); false when Python raises
 * ValueError.  *HUGE when the value does not fit in int64. */
static bool py_int(const uint8_t *s, size_t n, int base, int64_t *out, bool *huge)
{
    size_t i = 0;
    while (n && py_space(s[n - 1]))
        n--;
    while (i < n && py_space(s[i]))
        i++;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    bool prefixed = false;
    if (base == 8 && n - i >= 2 && s[i] == '0' && (s[i + 1] == 'o' || s[i + 1] == 'O')) {
        i += 2;
        prefixed = true;
    }
    if (prefixed && i < n && s[i] == '_')
        i++; /* "0o_7" is 7 */
    if (i >= n)
        return false;
    uint64_t v = 0;
    bool over = false;
    for (;;) {
        uint8_t c = s[i];
        if (c < '0' || c >= '0' + base)
            return false;
        if (v > (UINT64_MAX - (uint64_t)(c - '0')) / (uint64_t)base)
            over = true;
        v = v * (uint64_t)base + (uint64_t)(c - '0');
        if (++i == n)
            break;
        if (s[i] == '_' && ++i == n)
            return false; /* one '_' between digits only */
    }
    if (over || v > (uint64_t)INT64_MAX + (neg ? 1u : 0u)) {
        *huge = true;
        *out = neg ? INT64_MIN : INT64_MAX;
        return true;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* tarfile.nti: a base-256 field (first byte 0x80 or 0xff) or octal text up
 * to the first NUL; false where it raises InvalidHeaderError. */
static bool nti(const uint8_t *s, size_t n, int64_t *out, bool *huge)
{
    *huge = false;
    if (s[0] == 0x80 || s[0] == 0xff) {
        /* value of bytes 1..n-1, minus 256**(n-1) for 0xff */
        uint64_t v = 0;
        bool over = false;
        for (size_t i = 1; i < n; i++) {
            if (v >> 56)
                over = true;
            v = (v << 8) | s[i];
        }
        if (s[0] == 0x80) {
            if (over || v > INT64_MAX) {
                *huge = true;
                *out = INT64_MAX;
            } else {
                *out = (int64_t)v;
            }
            return true;
        }
        /* -(256**(n-1) - v): for n-1 <= 7 exact in int64 */
        if (n - 1 <= 7) {
            *out = (int64_t)v - (int64_t)(1ull << (8 * (n - 1)));
            return true;
        }
        /* 11 bytes: the value is negative unless the top bytes are all 0xff */
        bool all_ff = true;
        for (size_t i = 1; i + 8 < n; i++)
            all_ff &= s[i] == 0xff;
        if (all_ff && v >= (1ull << 63)) {
            *out = (int64_t)(v - (1ull << 63)) + INT64_MIN;
            return true;
        }
        *huge = true;
        *out = INT64_MIN;
        return true;
    }
    size_t len = 0;
    while (len < n && s[len])
        len++;
    for (size_t i = 0; i < len; i++)
        if (s[i] >= 0x80)
            return false; /* nts(..., 'ascii', 'strict') */
    size_t a = 0, b = len;
    while (b > a && py_space(s[b - 1]))
        b--;
    while (a < b && py_space(s[a]))
        a++;
    if (a == b) {
        *out = 0;
        return true;
    }
    return py_int(s + a, b - a, 8, out, huge);
}

/* tarfile.nts: up to the first NUL (names are compared as bytes: the
 * surrogateescape decoding maps bytes one to one). */
static size_t nts_len(const uint8_t *s, size_t n)
{
    const uint8_t *z = memchr(s, 0, n);
    return z ? (size_t)(z - s) : n;
}

/* TarInfo._block: COUNT rounded up to blocks (Python's floor division) */
static int64_t block_of(int64_t count)
{
    int64_t q = count / BLOCK, r = count % BLOCK;
    if (r < 0) {
        q--;
        r += BLOCK;
    }
    if (r)
        q++;
    return q > INT64_MAX / BLOCK ? INT64_MAX : q < INT64_MIN / BLOCK ? INT64_MIN : q * BLOCK;
}

static bool is_regular(char t)
{
    return t == '0' || t == '\0' || t == '7' || t == 'S';
}

static bool is_supported(char t)
{
    return is_regular(t) || strchr("123456LK", t) != NULL;
}

/* file.read(N) at the position: N < 0 (or past the end) reads to the end.
 * *BUF gets a malloc'd copy (NULL for none) when WANT. */
static hdr_rc read_body(state *st, int64_t n, bool want, uint8_t **buf, size_t *len)
{
    uint64_t left = st->pos < st->file_size ? st->file_size - st->pos : 0;
    uint64_t take = n < 0 || (uint64_t)n > left ? left : (uint64_t)n;
    *buf = NULL;
    *len = 0;
    if (want && take > MAX_EXT_BODY) {
        why(st, "an extended header is too long");
        return H_FAIL;
    }
    if (want && take) {
        *buf = malloc((size_t)take);
        if (!*buf || ckpt_pread_all(st->fd, *buf, (size_t)take, st->pos) != CKPT_OK) {
            free(*buf);
            *buf = NULL;
            why(st, "cannot read an extended header");
            return H_FAIL;
        }
        *len = (size_t)take;
    }
    st->pos += take;
    return H_OK;
}

static void pax_free(pax *p)
{
    free(p->path);
    free(p->size);
    memset(p, 0, sizeof(*p));
}

static bool pax_copy(pax *dst, const pax *src)
{
    *dst = *src;
    dst->path = dst->size = NULL;
    if (src->path && !(dst->path = malloc(src->path_len + 1)))
        return false;
    if (src->path)
        memcpy(dst->path, src->path, src->path_len);
    if (src->size && !(dst->size = malloc(src->size_len + 1))) {
        free(dst->path);
        return false;
    }
    if (src->size)
        memcpy(dst->size, src->size, src->size_len);
    return true;
}

/* TarInfo._apply_pax_info for the keywords we track. */
static bool apply_pax(hdr *h, const pax *p)
{
    if (p->sparse)
        return false;
    if (p->has_path) {
        size_t n = p->path_len;
        while (n && p->path[n - 1] == '/')
            n--;
        uint8_t *name = malloc(n + 1);
        if (!name)
            return false;
        memcpy(name, p->path, n);
        free(h->name);
        h->name = name;
        h->name_len = n;
    }
    if (p->has_size) {
        int64_t v = 0;
        bool huge = false, ascii = true;
        for (size_t i = 0; i < p->size_len; i++)
            ascii &= p->size[i] < 0x80;
        if (!ascii)
            return false; /* int() of non-ASCII digits: not modelled */
        if (!py_int(p->size, p->size_len, 10, &v, &huge))
            v = 0, huge = false; /* ValueError: tarfile sets 0 */
        h->size = v;
        h->size_huge = huge;
    }
    return true;
}

static hdr_rc from_tarfile(state *st, hdr *h, int depth);

/* _proc_pax: the records of an 'x' or 'g' header, then the header they describe */
static hdr_rc proc_pax(state *st, hdr *self, hdr *next, int depth)
{
    memset(next, 0, sizeof(*next));
    uint8_t *buf;
    size_t len;
    hdr_rc rc = read_body(st, block_of(self->size), true, &buf, &len);
    if (rc)
        return rc;
    pax local, *p = &st->global;
    if (self->type != 'g') {
        if (!pax_copy(&local, &st->global)) {
            free(buf);
            why(st, "out of memory");
            return H_FAIL;
        }
        p = &local;
    }
    size_t pos = 0;
    while (rc == H_OK && pos < len && buf[pos] != 0) {
        /* "([0-9]{1,20}) " then KEYWORD=VALUE up to a newline ending LENGTH bytes */
        size_t d = pos;
        while (d < len && d - pos < 20 && buf[d] >= '0' && buf[d] <= '9')
            d++;
        uint64_t length = 0;
        for (size_t i = pos; i < d; i++)
            length = length * 10 + (uint64_t)(buf[i] - '0');
        if (d == pos || d >= len || buf[d] != ' ' || length < 5 || length > len - pos) {
            why(st, "an invalid PAX record");
            rc = H_INVALID;
            break;
        }
        size_t end = pos + (size_t)length - 1, kv = d + 1;
        const uint8_t *eq = kv < end ? memchr(buf + kv, '=', end - kv) : NULL;
        if (!eq || eq == buf + kv || buf[end] != '\n') {
            why(st, "an invalid PAX record");
            rc = H_INVALID;
            break;
        }
        size_t klen = (size_t)(eq - (buf + kv));
        const uint8_t *val = eq + 1;
        size_t vlen = (size_t)(buf + end - val);
        const char *k = (const char *)buf + kv;
        if (klen == 4 && memcmp(k, "path", 4) == 0) {
            free(p->path);
            p->path = malloc(vlen + 1);
            p->path_len = vlen;
            p->has_path = true;
            if (p->path)
                memcpy(p->path, val, vlen);
        } else if (klen == 4 && memcmp(k, "size", 4) == 0) {
            free(p->size);
            p->size = malloc(vlen + 1);
            p->size_len = vlen;
            p->has_size = true;
            if (p->size)
                memcpy(p->size, val, vlen);
        } else if (klen > 11 && memcmp(k, "GNU.sparse.", 11) == 0) {
            p->sparse = true;
        }
        if ((p->has_path && !p->path) || (p->has_size && !p->size)) {
            why(st, "out of memory");
            rc = H_FAIL;
        }
        pos += (size_t)length;
    }
    free(buf);
    if (rc == H_OK) {
        rc = from_tarfile(st, next, depth + 1);
        if (rc >= H_EOF && rc <= H_INVALID) {
            char m[sizeof st->why];
            snprintf(m, sizeof m, "the header after a PAX header: %.100s", st->why);
            why(st, m);
            rc = H_SUBSEQUENT;
        }
    }
    if (rc == H_OK && p->sparse) {
        why(st, "a GNU sparse member (not supported)");
        rc = H_FAIL;
    }
    if (rc == H_OK && self->type != 'g') {
        if (!apply_pax(next, p)) {
            why(st, "a PAX header ckpt does not read (sparse, or a non-ASCII size)");
            rc = H_FAIL;
        }
        next->offset = self->offset;
        if (rc == H_OK && p->has_size) {
            int64_t off = next->offset_data;
            if (is_regular(next->type) || !is_supported(next->type))
                off = block_of(next->size) > INT64_MAX - off ? INT64_MAX : off + block_of(next->size);
            st->offset = off;
        }
    }
    if (p == &local)
        pax_free(&local);
    return rc;
}

/* TarInfo.fromtarfile: frombuf on the block at the position, then _proc_member */
static hdr_rc from_tarfile(state *st, hdr *h, int depth)
{
    memset(h, 0, sizeof(*h));
    if (depth > MAX_NEST) {
        why(st, "extended headers nested too deep");
        return H_FAIL;
    }
    uint8_t b[BLOCK];
    uint64_t left = st->pos < st->file_size ? st->file_size - st->pos : 0;
    if (left == 0) {
        why(st, "empty header");
        return H_EMPTY;
    }
    if (left < BLOCK) {
        why(st, "truncated header");
        return H_TRUNC;
    }
    if (ckpt_pread_all(st->fd, b, BLOCK, st->pos) != CKPT_OK) {
        why(st, "cannot read a header");
        return H_FAIL;
    }
    size_t zeros = 0;
    for (size_t i = 0; i < BLOCK; i++)
        zeros += b[i] == 0;
    if (zeros == BLOCK) {
        why(st, "end of file header");
        return H_EOF;
    }
    int64_t sum, v;
    bool huge;
    if (!nti(b + 148, 8, &sum, &huge)) {
        why(st, "invalid header");
        return H_INVALID;
    }
    int64_t us = 256, ss = 256;
    for (size_t i = 0; i < BLOCK; i++) {
        if (i >= 148 && i < 156)
            continue;
        us += b[i];
        ss += (int8_t)b[i];
    }
    if (huge || (sum != us && sum != ss)) {
        why(st, "bad checksum");
        return H_INVALID;
    }
    static const struct {
        uint16_t at, n;
    } nums[] = {{100, 8}, {108, 8}, {116, 8}, {136, 12}, {329, 8}, {337, 8}};
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
        if (!nti(b + nums[i].at, nums[i].n, &v, &huge)) {
            why(st, "invalid header");
            return H_INVALID;
        }
    if (!nti(b + 124, 12, &h->size, &h->size_huge)) {
        why(st, "invalid header");
        return H_INVALID;
    }
    h->type = (char)b[156];
    size_t nlen = nts_len(b, 100), plen = nts_len(b + 345, 155);
    if (h->type == 'S') {
        /* up to four sparse structs, then origsize: each nti may raise */
        for (int i = 0; i < 4; i++)
            if (!nti(b + 386 + 24 * i, 12, &v, &huge) || !nti(b + 398 + 24 * i, 12, &v, &huge)) {
                why(st, "invalid header");
                return H_INVALID;
            }
        if (!nti(b + 483, 12, &v, &huge)) {
            why(st, "invalid header");
            return H_INVALID;
        }
    }
    if (h->type == '\0' && nlen && b[nlen - 1] == '/')
        h->type = '5'; /* V7: a directory is a regular file ending in '/' */
    if (h->type == '5')
        while (nlen && b[nlen - 1] == '/')
            nlen--;
    bool prefix = plen && !strchr("LKS", h->type ? h->type : 'x');
    h->name_len = prefix ? plen + 1 + nlen : nlen;
    h->name = malloc(h->name_len + 1);
    if (!h->name) {
        why(st, "out of memory");
        return H_FAIL;
    }
    if (prefix) {
        memcpy(h->name, b + 345, plen);
        h->name[plen] = '/';
        memcpy(h->name + plen + 1, b, nlen);
    } else {
        memcpy(h->name, b, nlen);
    }
    st->pos += BLOCK;
    h->offset = (int64_t)(st->pos - BLOCK);

    hdr_rc rc = H_OK;
    if (h->type == 'L' || h->type == 'K') {
        uint8_t *body;
        size_t blen;
        if (h->size_huge) {
            why(st, "a long name's length is past the end of the file");
            return H_FAIL;
        }
        if ((rc = read_body(st, block_of(h->size), h->type == 'L', &body, &blen)) != H_OK)
            return rc;
        hdr next;
        rc = from_tarfile(st, &next, depth + 1);
        if (rc >= H_EOF && rc <= H_INVALID) {
            char m[sizeof st->why];
            snprintf(m, sizeof m, "the header after a GNU long name: %.100s", st->why);
            why(st, m);
            rc = H_SUBSEQUENT;
        }
        if (rc != H_OK) {
            free(body);
            free(next.name);
            return rc;
        }
        next.offset = h->offset;
        if (h->type == 'L') {
            free(next.name);
            next.name_len = body ? nts_len(body, blen) : 0;
            next.name = body ? body : malloc(1);
            if (!next.name) {
                why(st, "out of memory");
                return H_FAIL;
            }
            if (next.type == '5' && next.name_len && next.name[next.name_len - 1] == '/')
                next.name_len--;
        }
        free(h->name);
        *h = next;
        return H_OK;
    }
    if (h->type == 'S') {
        why(st, "a GNU sparse member (not supported)");
        return H_FAIL;
    }
    if (h->type == 'x' || h->type == 'g' || h->type == 'X') {
        hdr next;
        if (h->size_huge) {
            why(st, "a PAX header's length is past the end of the file");
            return H_FAIL;
        }
        rc = proc_pax(st, h, &next, depth);
        free(h->name);
        if (rc != H_OK) {
            free(next.name);
            memset(h, 0, sizeof(*h));
            return rc;
        }
        *h = next;
        return H_OK;
    }
    /* _proc_builtin */
    h->offset_data = (int64_t)st->pos;
    int64_t off = h->offset_data;
    if (is_regular(h->type) || !is_supported(h->type)) {
        if (h->size_huge) {
            off = h->size < 0 ? INT64_MIN : INT64_MAX;
        } else {
            int64_t blk = block_of(h->size);
            off = blk > 0 && off > INT64_MAX - blk ? INT64_MAX : off + blk;
        }
    }
    st->offset = off;
    if (!apply_pax(h, &st->global)) {
        why(st, "a PAX header ckpt does not read (sparse, or a non-ASCII size)");
        return H_FAIL;
    }
    if (h->type == '5')
        while (h->name_len && h->name[h->name_len - 1] == '/')
            h->name_len--;
    return H_OK;
}

/* TarFile.next(): H_OK with *H, or H_EOF at the archive's end (None); the
 * rest as tarfile raises them (H_INVALID, H_EMPTY, H_TRUNC: ReadError at
 * offset 0 only; H_SUBSEQUENT: ReadError; H_FAIL: not a TarError). */
static hdr_rc tar_next(state *st, hdr *h)
{
    memset(h, 0, sizeof(*h));
    if (st->offset != (int64_t)st->pos) {
        if (st->offset == 0)
            return H_EOF;
        if (st->offset < 1) {
            why(st, "a member's size is negative (Python's seek fails)");
            return H_FAIL;
        }
        if ((uint64_t)st->offset > st->file_size) {
            why(st, "unexpected end of data: a member reaches past the end of the file");
            return H_SUBSEQUENT; /* ReadError */
        }
        st->pos = (uint64_t)st->offset;
    }
    int64_t at = st->offset;
    hdr_rc rc = from_tarfile(st, h, 0);
    if (rc == H_EOF)
        return H_EOF;
    if (rc == H_INVALID || rc == H_EMPTY || rc == H_TRUNC)
        return at == 0 ? rc : H_EOF;
    return rc;
}

static void state_init(state *st, int fd, uint64_t size)
{
    memset(st, 0, sizeof(*st));
    st->fd = fd;
    st->file_size = size;
}

bool ckpt_tar_head_ok(const uint8_t *head, size_t n)
{
    if (n < BLOCK)
        return false;
    size_t zeros = 0;
    for (size_t i = 0; i < BLOCK; i++)
        zeros += head[i] == 0;
    if (zeros == BLOCK)
        return true; /* an empty archive opens */
    int64_t sum;
    bool huge;
    if (!nti(head + 148, 8, &sum, &huge) || huge)
        return false;
    int64_t us = 256, ss = 256;
    for (size_t i = 0; i < BLOCK; i++)
        if (i < 148 || i >= 156) {
            us += head[i];
            ss += (int8_t)head[i];
        }
    return sum == us || sum == ss;
}

bool ckpt_tar_probe(int fd, uint64_t size)
{
    state st;
    state_init(&st, fd, size);
    hdr h;
    hdr_rc rc = tar_next(&st, &h);
    free(h.name);
    pax_free(&st.global);
    /* ReadError at offset 0 is what makes torch try the pickle stream; an
     * error that is not a TarError fails torch.load in the tar reader */
    return rc == H_OK || rc == H_EOF || rc == H_FAIL;
}

void ckpt_tar_close(ckpt_tar *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        free(t->m[i].name);
    free(t->m);
    free(t);
}

int ckpt_tar_open(int fd, uint64_t size, ckpt_tar **out, bool *falls_back, ckpt_error *err)
{
    *out = NULL;
    if (falls_back)
        *falls_back = false;
    ckpt_tar *t = calloc(1, sizeof(*t));
    if (!t)
        return ckpt_oom(err);
    state st;
    state_init(&st, fd, size);
    int rc = CKPT_OK;
    for (;;) {
        hdr h;
        hdr_rc hr = tar_next(&st, &h);
        if (hr == H_EOF) {
            free(h.name);
            break;
        }
        if (hr != H_OK) {
            free(h.name);
            bool fb = hr != H_FAIL;
            if (falls_back)
                *falls_back = fb;
            rc = ckpt_err(err, fb ? CKPT_ERR_FORMAT : CKPT_ERR_UNSUPPORTED,
                          "tar header %zu: %s%s", t->n + 1, st.why,
                          fb ? " (torch then reads the file as a pickle stream)" : "");
            break;
        }
        if (CKPT_GROW(t->m, t->cap, t->n + 1) < 0) {
            free(h.name);
            rc = ckpt_oom(err);
            break;
        }
        h.name[h.name_len] = '\0';
        t->m[t->n++] = (ckpt_tar_member){
            .name = (char *)h.name,
            .name_len = h.name_len,
            .type = h.type,
            .header_offset = h.offset,
            .data_offset = h.offset_data,
            .size = h.size,
            .size_huge = h.size_huge,
            .regular = is_regular(h.type) || !is_supported(h.type),
        };
    }
    pax_free(&st.global);
    if (rc) {
        ckpt_tar_close(t);
        return rc;
    }
    *out = t;
    return CKPT_OK;
}

size_t ckpt_tar_count(const ckpt_tar *t)
{
    return t->n;
}

const ckpt_tar_member *ckpt_tar_member_at(const ckpt_tar *t, size_t i)
{
    return i < t->n ? &t->m[i] : NULL;
}

const ckpt_tar_member *ckpt_tar_find(const ckpt_tar *t, const char *name)
{
    size_t n = strlen(name);
    while (n && name[n - 1] == '/')
        n--; /* getmember(name.rstrip('/')) */
    for (size_t i = t->n; i-- > 0;)
        if (t->m[i].name_len == n && memcmp(t->m[i].name, name, n) == 0)
            return &t->m[i];
    return NULL;
}
