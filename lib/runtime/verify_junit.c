/*
 * runtime/verify_junit.c - ckpt verify --junit FILE: verify's results as a
 * JUnit XML report, which CI systems (GitLab, Jenkins, GitHub through its
 * test-report actions) show as tests: one testsuite; a testcase for each
 * strict load, and for each output compared (with the reference, the
 * checkpoint compared against, the DataParallel replay), a failure element
 * with the error and the tolerance where it fails.  Built from verify's
 * accessors alone; written atomically.
 */
#include "checkpoint/checkpoint.h"
#include "runtime/runtime.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct xml {
    char *p;
    size_t len, cap;
    bool oom;
} xml;

static void add(xml *x, const char *s, size_t n)
{
    if (x->oom)
        return;
    if (x->len + n + 1 > x->cap) {
        size_t cap = x->cap ? x->cap : 4096;
        while (cap < x->len + n + 1)
            cap *= 2;
        char *p = realloc(x->p, cap);
        if (!p) {
            x->oom = true;
            return;
        }
        x->p = p;
        x->cap = cap;
    }
    memcpy(x->p + x->len, s, n);
    x->len += n;
    x->p[x->len] = '\0';
}

static void adds(xml *x, const char *s)
{
    add(x, s, strlen(s));
}

static void addf(xml *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(xml *x, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        add(x, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* The length of the UTF-8 sequence at S that XML 1.0 allows (Char: tab,
 * newline, return, U+0020..U+D7FF, U+E000..U+FFFD, U+10000..U+10FFFF), or 0. */
static size_t xml_char(const unsigned char *s)
{
    unsigned c = s[0];
    if (c < 0x80)
        return c >= 0x20 || c == '\t' || c == '\n' || c == '\r' ? 1 : 0;
    size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (!n || c > 0xf4)
        return 0;
    unsigned long cp = c & (0x3f >> (n - 1));
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff)
        return 0;
    return n;
}

/* S as XML character data or an attribute value: the five markup
 * characters as entities, newline, return and tab as character references
 * (an attribute keeps them), and what XML 1.0 cannot hold at all (C0
 * controls, bytes that are not UTF-8: names are the file's bytes) as the
 * text \xHH. */
static void esc(xml *x, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        size_t n = xml_char(p);
        switch (n ? *p : 0) {
        case '&': adds(x, "&amp;"); break;
        case '<': adds(x, "&lt;"); break;
        case '>': adds(x, "&gt;"); break;
        case '"': adds(x, "&quot;"); break;
        case '\'': adds(x, "&apos;"); break;
        case '\n': adds(x, "&#10;"); break;
        case '\r': adds(x, "&#13;"); break;
        case '\t': adds(x, "&#9;"); break;
        case 0: addf(x, "\\x%02X", *p); n = 1; break;
        default: add(x, (const char *)p, n); break;
        }
        p += n;
    }
}

static void property(xml *x, const char *name, const char *value)
{
    if (!value)
        return;
    adds(x, "      <property name=\"");
    esc(x, name);
    adds(x, "\" value=\"");
    esc(x, value);
    adds(x, "\"/>\n");
}

/* A testcase NAME (classname CLASS); FAILURE: its failure's message, or
 * NULL when it passed; DETAIL: the failure's text. */
static void testcase(xml *x, const char *cls, const char *name, const char *failure,
                     const char *detail)
{
    adds(x, "    <testcase classname=\"");
    esc(x, cls);
    adds(x, "\" name=\"");
    esc(x, name);
    if (!failure) {
        adds(x, "\"/>\n");
        return;
    }
    adds(x, "\">\n      <failure type=\"FAIL\" message=\"");
    esc(x, failure);
    adds(x, "\">");
    esc(x, detail ? detail : failure);
    adds(x, "</failure>\n    </testcase>\n");
}

static const char *shape(const ckpt_array *a, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; a && i < a->ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "",
                               (long long)a->shape[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
    return buf;
}

/* An output check's failure message into BUF, or NULL when it passed.
 * OTHER: what it was compared with ("the reference"); ITS: that one's output. */
static const char *check_failure(char *buf, size_t cap, const ckpt_output_check *c,
                                 const ckpt_array *ours, const ckpt_array *its, const char *other)
{
    if (c->pass)
        return NULL;
    char a[128], b[128];
    if (!c->shape_ok)
        snprintf(buf, cap, "shape %s, %s's is %s", shape(ours, a, sizeof a), other,
                 shape(its, b, sizeof b));
    else
        snprintf(buf, cap, "max abs %.6g, max rel %.6g of max |ref| %.6g: above atol %.6g, "
                 "rtol %.6g; %lld of %lld elements out of tolerance", c->max_abs, c->max_rel,
                 c->max_abs_reference, c->atol, c->rtol, (long long)c->mismatched,
                 (long long)c->count);
    return buf;
}

/* A load's testcase: the strict load of SIDE's file. */
static void load_case(xml *x, const ckpt_verify *v, ckpt_verify_side side, const char *label,
                      const char *file)
{
    const ckpt_load_report *r = ckpt_verify_load_report(v, side);
    char name[64];
    snprintf(name, sizeof name, "load %s", label);
    if (r->ok) {
        testcase(x, "ckpt.verify", name, NULL, NULL);
        return;
    }
    /* torch's message, and for the checkpoint the hint and the command that fixes it */
    xml d = {0};
    adds(&d, r->message);
    if (side == CKPT_VERIFY_CHECKPOINT && ckpt_verify_hint(v)) {
        adds(&d, "\nhint: ");
        adds(&d, ckpt_verify_hint(v));
        adds(&d, "; fix it with: ");
        adds(&d, ckpt_verify_fix(v));
    }
    char msg[CKPT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s: the strict load (load_state_dict(strict=True)) fails", file);
    x->oom |= d.oom;
    testcase(x, "ckpt.verify", name, msg, d.p ? d.p : msg);
    free(d.p);
}

CKPT_API char *ckpt_verify_to_junit(const ckpt_verify *v, const char *spec)
{
    const char *file = v ? rt_verify_loaded(v, CKPT_VERIFY_CHECKPOINT) : NULL;
    if (!file)
        return NULL;
    const ckpt_state_dict_choice *choice = ckpt_verify_choice(v, CKPT_VERIFY_CHECKPOINT);
    const char *against = rt_verify_loaded(v, CKPT_VERIFY_AGAINST);
    const ckpt_verify_replicas *rep = ckpt_verify_replica_info(v);
    size_t nout = ckpt_verify_ran(v) ? ckpt_verify_output_count(v) : 0;
    bool has_ref = false;
    for (size_t i = 0; i < nout; i++)
        has_ref |= ckpt_verify_output_at(v, i)->reference != NULL;

    /* the counts first: tests and failures are attributes of the suite */
    size_t tests = 1 + (against != NULL), failures = 0;
    failures += !ckpt_verify_load_report(v, CKPT_VERIFY_CHECKPOINT)->ok;
    failures += against && !ckpt_verify_load_report(v, CKPT_VERIFY_AGAINST)->ok;
    for (size_t i = 0; i < nout; i++) {
        const ckpt_verify_output *o = ckpt_verify_output_at(v, i);
        tests += (o->reference || !against) + (o->against != NULL) + (rep != NULL);
        failures += (o->reference && !o->vs_reference.pass) + (o->against && !o->vs_against.pass) +
                    (rep && !o->vs_single.pass);
    }

    xml x = {0};
    adds(&x, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n");
    adds(&x, "  <testsuite name=\"ckpt verify ");
    esc(&x, file);
    addf(&x, "\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"0\">\n", tests, failures);
    adds(&x, "    <properties>\n");
    property(&x, "checkpoint", file);
    property(&x, "spec", spec);
    property(&x, "state_dict", choice->path);
    property(&x, "against", against);
    if (ckpt_verify_ran(v)) {
        property(&x, "device", ckpt_backend_description(ckpt_verify_backend(v)));
        property(&x, "input", ckpt_verify_input_from(v));
    }
    if (rep) {
        char n[32];
        snprintf(n, sizeof n, "%d", rep->requested);
        property(&x, "replicas", n);
    }
    property(&x, "result", ckpt_verify_passed(v) ? "PASS" : "FAIL");
    adds(&x, "    </properties>\n");
    load_case(&x, v, CKPT_VERIFY_CHECKPOINT, "checkpoint", file);
    if (against)
        load_case(&x, v, CKPT_VERIFY_AGAINST, "against", against);
    char name[CKPT_ERRMSG_MAX], msg[CKPT_ERRMSG_MAX];
    for (size_t i = 0; i < nout; i++) {
        const ckpt_verify_output *o = ckpt_verify_output_at(v, i);
        char sb[128];
        if (o->reference) {
            snprintf(name, sizeof name, "output %s vs reference", o->name);
            testcase(&x, "ckpt.verify.output", name,
                     check_failure(msg, sizeof msg, &o->vs_reference, o->value, o->reference,
                                   "the reference"), NULL);
        } else if (!against) { /* nothing to compare with: it ran, with this shape */
            snprintf(name, sizeof name, "output %s %s (ran; %s)", o->name,
                     shape(o->value, sb, sizeof sb),
                     has_ref ? "not in the reference" : "no reference");
            testcase(&x, "ckpt.verify.output", name, NULL, NULL);
        }
        if (o->against) {
            snprintf(name, sizeof name, "output %s vs against", o->name);
            testcase(&x, "ckpt.verify.output", name,
                     check_failure(msg, sizeof msg, &o->vs_against, o->value, o->against,
                                   "the checkpoint compared against"), NULL);
        }
        if (rep) {
            snprintf(name, sizeof name, "output %s under DataParallel", o->name);
            const char *why = NULL;
            if (!o->vs_single.pass)
                why = o->replica_reason ? o->replica_reason
                      : check_failure(msg, sizeof msg, &o->vs_single, o->value, o->gathered,
                                      "the gathered output");
            testcase(&x, "ckpt.verify.replica", name, why, NULL);
        }
    }
    adds(&x, "  </testsuite>\n</testsuites>\n");
    if (x.oom) {
        free(x.p);
        return NULL;
    }
    return x.p;
}

CKPT_API int ckpt_verify_write_junit(ckpt_verify *v, const char *path, const char *spec)
{
    if (!v || !path)
        return CKPT_ERR_USAGE;
    ckpt_error err = {0};
    char *text = ckpt_verify_to_junit(v, spec);
    if (!text)
        return rt_verify_fail(v, rt_verify_loaded(v, CKPT_VERIFY_CHECKPOINT) ? CKPT_ERR_NOMEM
                                                                             : CKPT_ERR_USAGE,
                              NULL, rt_verify_loaded(v, CKPT_VERIFY_CHECKPOINT)
                                        ? "out of memory for the JUnit report"
                                        : "no JUnit report before a checkpoint is loaded");
    size_t len = strlen(text);
    ckpt_out out;
    int rc = ckpt_out_open(&out, path, len, &err);
    if (rc == CKPT_OK)
        rc = ckpt_write_all(out.fd, text, len, 0, &err);
    if (rc == CKPT_OK)
        rc = ckpt_out_commit(&out, &err);
    if (rc != CKPT_OK)
        ckpt_out_abort(&out);
    free(text);
    return rc == CKPT_OK ? CKPT_OK : rt_verify_fail(v, rc, path, err.msg);
}
