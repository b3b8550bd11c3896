/* error.c - status codes and the error record kept in each handle. */
#include "core/core.h"

#include <string.h>

CKPT_API const char *ckpt_strerror(int status)
{
    switch (status) {
    case CKPT_OK: return "success";
    case CKPT_EOF: return "end of iteration";
    case CKPT_ERR_USAGE: return "invalid argument";
    case CKPT_ERR_FORMAT: return "malformed input";
    case CKPT_ERR_UNSAFE: return "refused as unsafe";
    case CKPT_ERR_LIMIT: return "resource limit exceeded";
    case CKPT_ERR_UNSUPPORTED: return "unsupported input";
    case CKPT_ERR_IO: return "I/O error";
    case CKPT_ERR_NOMEM: return "out of memory";
    case CKPT_ERR_DEVICE: return "device error";
    default: return "unknown status";
    }
}

int ckpt_err(ckpt_error *e, int code, const char *fmt, ...)
{
    if (e && e->code == CKPT_OK) {
        va_list ap;
        e->code = code;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

int ckpt_oom(ckpt_error *e)
{
    return ckpt_err(e, CKPT_ERR_NOMEM, "out of memory");
}

void ckpt_err_clear(ckpt_error *e)
{
    e->code = CKPT_OK;
    e->msg[0] = '\0';
}
