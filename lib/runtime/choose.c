/*
 * runtime/choose.c - choosing and opening a backend: "auto", or a device
 * named NAME / NAME:N after a backend of the table (runtime/backends.c).
 * No backend is named here.
 *
 * "auto" opens device 0 of the first backend that has one and opens, trying
 * the fallback (the CPU) last, and then says in ERR why the ones before it
 * were passed over ("no GPU found").
 */
#include "core/core.h"
#include "runtime/backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "NAME" is device 0 of an indexed backend; "NAME:N" device N (0 to 1023,
 * digits only). */
static int parse_index(const char *device, const ckpt_backend_desc *d, int *index)
{
    size_t len = strlen(d->name);
    if (strcmp(device, d->name) == 0) {
        *index = 0;
        return 0;
    }
    if (!d->indexed || strncmp(device, d->name, len) != 0 || device[len] != ':' ||
        !device[len + 1])
        return -1;
    const char *num = device + len + 1;
    char *end;
    errno = 0;
    long v = strtol(num, &end, 10);
    if (*end || errno || v < 0 || v > 1023 || num[0] == '+' || num[0] == ' ')
        return -1;
    *index = (int)v;
    return 0;
}

/* "unknown device "tpu" (use auto, cpu, cuda or cuda:N)" */
static void unknown_device(const char *device, char *err, size_t cap)
{
    const char *names[16];
    int indexed[16], n = 0;
    for (const ckpt_backend_desc *const *d = ckpt_backend_table; *d && n < 16; d++) {
        names[n] = (*d)->name;
        indexed[n++] = 0;
        if ((*d)->indexed && n < 16) {
            names[n] = (*d)->name;
            indexed[n++] = 1;
        }
    }
    size_t at = (size_t)snprintf(err, cap, "unknown device \"%s\" (use auto", device);
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(err + at, cap - at, "%s%s%s", i == n - 1 ? " or " : ", ",
                               names[i], indexed[i] ? ":N" : "");
    if (at < cap)
        snprintf(err + at, cap - at, ")");
}

static int open_auto(ckpt_backend **out, char *err, size_t cap)
{
    char why[256], note[sizeof why + 64] = "";
    for (int fallback = 0; fallback < 2; fallback++)
        for (const ckpt_backend_desc *const *t = ckpt_backend_table; *t; t++) {
            const ckpt_backend_desc *d = *t;
            if (d->fallback != fallback)
                continue;
            why[0] = '\0';
            if (d->probe(why, sizeof why) <= 0 || !d->open) {
                if (!note[0])
                    snprintf(note, sizeof note, "%s", why);
                continue;
            }
            int rc;
            if (fallback) {
                /* the last resort: its own message when it fails */
                if ((rc = d->open(0, out, err, cap)) == CKPT_OK)
                    snprintf(err, cap, "%s", note);
                return rc;
            }
            if ((rc = d->open(0, out, why, sizeof why)) == CKPT_OK)
                return rc;
            if (!note[0])
                snprintf(note, sizeof note, "%s could not be used (%s)", d->title, why);
        }
    snprintf(err, cap, "no backend can run%s%s", note[0] ? ": " : "", note);
    return CKPT_ERR_DEVICE;
}

static int backend_open(const char *device, ckpt_backend **out, char *err, size_t cap)
{
    if (strcmp(device, "auto") == 0)
        return open_auto(out, err, cap);
    for (const ckpt_backend_desc *const *t = ckpt_backend_table; *t; t++) {
        const ckpt_backend_desc *d = *t;
        int index;
        if (parse_index(device, d, &index) != 0)
            continue;
        if (!d->open) {
            char why[192];
            d->probe(why, sizeof why);
            snprintf(err, cap, "%s: %s (configure --with-%s)", device, why, d->name);
            return CKPT_ERR_DEVICE;
        }
        return d->open(index, out, err, cap);
    }
    unknown_device(device, err, cap);
    return CKPT_ERR_USAGE;
}

int ckpt_backend_open(const char *device, ckpt_backend **out, char *err, size_t cap)
{
    char dummy[8];
    if (!err || !cap) {
        err = dummy;
        cap = sizeof dummy;
    }
    err[0] = '\0';
    if (!out || !device) {
        snprintf(err, cap, "no device named");
        return CKPT_ERR_USAGE;
    }
    *out = NULL;
    int rc = backend_open(device, out, err, cap);
    if (rc == CKPT_OK)
        (*out)->refs = 1;
    return rc;
}

int ckpt_backend_open_flags(const char *device, unsigned flags, ckpt_backend **out, char *err,
                            size_t cap)
{
    char dummy[8];
    if (!err || !cap) {
        err = dummy;
        cap = sizeof dummy;
    }
    if (flags & ~CKPT_BACKEND_TF32) {
        if (out)
            *out = NULL;
        snprintf(err, cap, "unknown backend flags 0x%x", flags & ~CKPT_BACKEND_TF32);
        return CKPT_ERR_USAGE;
    }
    int rc = ckpt_backend_open(device, out, err, cap);
    if (rc != CKPT_OK || !flags)
        return rc;
    ckpt_backend *b = *out;
    if (!b->ops->set_flags) /* nothing to change on it (the CPU computes in FP32) */
        return CKPT_OK;
    if ((rc = b->ops->set_flags(b, flags)) != CKPT_OK) {
        snprintf(err, cap, "%s: %s", b->device, b->message);
        ckpt_backend_free(b);
        *out = NULL;
        return rc;
    }
    b->flags = flags;
    return CKPT_OK;
}

unsigned ckpt_backend_flags(const ckpt_backend *b)
{
    return b ? b->flags : 0;
}
