/*
 * analysis/analysis.h - the torch-model judgements above the formats: what
 * torch.load (and the loaders of distributed checkpoints) would do with a
 * file, without doing it.  scan.c (would loading run code?), torch_load.c
 * (would plain weights-only torch.load accept it?) and weights_only.c (a
 * model of torch's weights-only unpickler).  This layer may call formats/,
 * checkpoint/, pickle/, io/ and core/, and reads a container only through
 * its format's walk (formats/format.h; tests/layers.sh rule e); nothing
 * below calls it.
 */
#ifndef CKPT_ANALYSIS_H
#define CKPT_ANALYSIS_H

#include "formats/format.h"

/* ---- a model of torch.load's weights-only unpickler (analysis/weights_only.c) -- */

typedef enum ckpt_wo_torch { CKPT_WO_2_15 = 0, CKPT_WO_1_13 = 1 } ckpt_wo_torch;

typedef enum ckpt_wo_stop {
    CKPT_WO_OK = 0,  /* it reaches STOP */
    CKPT_WO_GLOBAL,  /* a GLOBAL it refuses (r->global; r->blocked: a blocked module) */
    CKPT_WO_OPCODE,  /* an opcode it lacks, truncated data, a stack or memo fault */
    CKPT_WO_VALUE,   /* REDUCE/NEWOBJ/BUILD/APPEND/SETITEM on a value it refuses there */
    CKPT_WO_STORAGE  /* a persistent id, or its record, that the loader refuses */
} ckpt_wo_stop;

typedef struct ckpt_wo_result {
    ckpt_wo_stop stop;
    int opcode;            /* the opcode byte it stops at; -1 at the end of the data */
    uint64_t offset;
    char global[256];      /* CKPT_WO_GLOBAL: "module.name" (Python 2 names mapped as 2.15 maps them) */
    bool blocked;
    const char *exception; /* the Python exception: "UnpicklingError", "RuntimeError", ... */
    char msg[512];         /* its text, before torch.load wraps it */
    size_t consumed;       /* reached STOP: the pickle's length */
    int top_kind;          /* reached STOP: 1 when the value is an int, 2 a float: */
    int64_t top_int;       /* its value (when it fits; a float's IEEE bits), */
    const uint8_t *top_long; /* its LONG1 bytes, if it came from LONG1 */
    size_t top_long_len;
} ckpt_wo_result;

typedef struct ckpt_wo_ctx {
    ckpt_wo_torch torch;
    const uint64_t *limits; /* CKPT_LIMIT_COUNT_ values: stack, marks, memo */
    /* persistent ids: 5 fields in a zip's data.pkl, 6 in a legacy file's;
     * 0: the plain unpickler, which refuses every one */
    unsigned pid_fields;
    /* Whether record data/KEY exists (0 no, 1 yes, 2 yes but miniz refuses to extract it:
     * no local header), and its size; NULL: records not checked. */
    int (*record)(void *user, const char *key, uint64_t *size);
    bool check_size;        /* a record must hold exactly numel * element size (2.15) */
    void (*on_location)(void *user, const char *location);
    /* after the first stop: each further GLOBAL this torch refuses */
    void (*on_refused)(void *user, const char *qualified_name, bool blocked);
    /* 1.13's tar loader (torch <= 0.1 files): its persistent_load takes an
     * id that is no tuple as int(id), a key of the objects loaded before;
     * TAR_KEY says what the decimal KEY names: 0 nothing (KeyError), 1 a
     * storage, 2 a tensor.  NULL: any other loader. */
    int (*tar_key)(void *user, const char *key);
    void *user;
    /* The memo indices the pickle fetches (BINGET), sorted, when the caller
     * knows them (ckpt's own writer: ckpt_pickle_out.fetched): only those are
     * kept.  NULL: every BINPUT is kept. */
    const uint32_t *memo_fetched;
    size_t nmemo_fetched;
} ckpt_wo_ctx;

/* Walk BUF[0..LEN) as CTX->torch's weights-only unpickler would, into *R;
 * never runs anything.  Errors only for memory and limits. */
int ckpt_wo_walk(const ckpt_wo_ctx *ctx, const uint8_t *buf, size_t len, ckpt_wo_result *r,
                 ckpt_error *err);
/* Whether "module.name" is in that torch's default allow-list. */
bool ckpt_wo_allowed(ckpt_wo_torch t, const char *qualified_name);
/* How many names that allow-list has (2.15: 144; 1.13: 90). */
size_t ckpt_wo_allowed_count(ckpt_wo_torch t);
/* Whether torch refuses every global of MODULE, allow-listed or not (2.15: sys, os, posix, nt). */
bool ckpt_wo_blocked(ckpt_wo_torch t, const char *module);
#endif /* CKPT_ANALYSIS_H */
