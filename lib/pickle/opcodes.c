/* pickle/opcodes.c - the names of the pickle opcodes, as CPython's
 * pickletools spells them, for messages: made from the list in
 * pickle/opcodes.h. */
#include "pickle/opcodes.h"

const char *ckpt_pickle_op_name(int op)
{
    switch (op) {
#define CKPT_OP_CASE_(name, byte) case (byte): return #name;
    CKPT_PICKLE_OPCODES(CKPT_OP_CASE_)
#undef CKPT_OP_CASE_
    default: return "?";
    }
}
