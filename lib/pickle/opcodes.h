/*
 * pickle/opcodes.h - the pickle opcodes, once: CPython's names (pickletools)
 * and bytes, protocols 0 to 5.  The list is an X-macro so that the enum here
 * and the names of ckpt_pickle_op_name() (pickle/opcodes.c) cannot disagree.
 */
#ifndef CKPT_PICKLE_OPCODES_H
#define CKPT_PICKLE_OPCODES_H

/* X(NAME, byte) for every opcode, in protocol order as pickletools lists them */
#define CKPT_PICKLE_OPCODES(X)                                                        \
    /* protocol 0 */                                                                  \
    X(MARK, '(') X(STOP, '.') X(POP, '0') X(POP_MARK, '1') X(DUP, '2')                \
    X(FLOAT, 'F') X(INT, 'I') X(LONG, 'L') X(NONE, 'N') X(PERSID, 'P') X(REDUCE, 'R') \
    X(STRING, 'S') X(UNICODE, 'V') X(APPEND, 'a') X(BUILD, 'b') X(GLOBAL, 'c')        \
    X(DICT, 'd') X(GET, 'g') X(INST, 'i') X(LIST, 'l') X(PUT, 'p') X(SETITEM, 's')    \
    X(TUPLE, 't')                                                                     \
    /* protocol 1 */                                                                  \
    X(BININT, 'J') X(BININT1, 'K') X(BININT2, 'M') X(BINPERSID, 'Q')                  \
    X(BINSTRING, 'T') X(SHORT_BINSTRING, 'U') X(BINUNICODE, 'X') X(EMPTY_DICT, '}')   \
    X(APPENDS, 'e') X(BINGET, 'h') X(LONG_BINGET, 'j') X(EMPTY_LIST, ']') X(OBJ, 'o') \
    X(BINPUT, 'q') X(LONG_BINPUT, 'r') X(EMPTY_TUPLE, ')') X(SETITEMS, 'u')           \
    X(BINFLOAT, 'G')                                                                  \
    /* protocol 2 */                                                                  \
    X(PROTO, 0x80) X(NEWOBJ, 0x81) X(EXT1, 0x82) X(EXT2, 0x83) X(EXT4, 0x84)          \
    X(TUPLE1, 0x85) X(TUPLE2, 0x86) X(TUPLE3, 0x87) X(NEWTRUE, 0x88)                  \
    X(NEWFALSE, 0x89) X(LONG1, 0x8a) X(LONG4, 0x8b)                                   \
    /* protocol 3 */                                                                  \
    X(BINBYTES, 'B') X(SHORT_BINBYTES, 'C')                                           \
    /* protocol 4 */                                                                  \
    X(SHORT_BINUNICODE, 0x8c) X(BINUNICODE8, 0x8d) X(BINBYTES8, 0x8e)                 \
    X(EMPTY_SET, 0x8f) X(ADDITEMS, 0x90) X(FROZENSET, 0x91) X(NEWOBJ_EX, 0x92)        \
    X(STACK_GLOBAL, 0x93) X(MEMOIZE, 0x94) X(FRAME, 0x95)                             \
    /* protocol 5 */                                                                  \
    X(BYTEARRAY8, 0x96) X(NEXT_BUFFER, 0x97) X(READONLY_BUFFER, 0x98)

/* CKPT_OP_MARK = '(', ..., CKPT_OP_READONLY_BUFFER = 0x98 */
enum ckpt_pickle_op {
#define CKPT_OP_ENUM_(name, byte) CKPT_OP_##name = (byte),
    CKPT_PICKLE_OPCODES(CKPT_OP_ENUM_)
#undef CKPT_OP_ENUM_
};

/* "GLOBAL", "SHORT_BINUNICODE", ...; "?" for a byte that is no opcode. */
const char *ckpt_pickle_op_name(int op);

#endif /* CKPT_PICKLE_OPCODES_H */
