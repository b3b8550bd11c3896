#!/usr/bin/env python3
"""Pickles that evade pickle scanners, for `ckpt scan` (tests/cli/scan.sh).

    python3 tests/bad/make_scan_corpus.py       (from the top of the tree)

Each file is built opcode by opcode (doc/safety.md section 10: memo
tricks, STACK_GLOBAL, INST / OBJ, importlib and getattr chains, nested
pickles, Python 2 module names, globals outside data.pkl, a case-changed
record name, protocol 0); none is ever unpickled.  tests/bad/scan/expected.json
lists, per file, the globals `ckpt scan` must report as unknown and which of
those are dangerous.  Plain python3, no torch; deterministic."""
import io
import json
import os
import struct
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bypasses as bp  # noqa: E402
import torchscript_code as tsc  # noqa: E402
import frames as fr  # noqa: E402
OUT = os.path.join(HERE, 'scan')
EXPECTED = {}


def u(s):  # BINUNICODE
    b = s.encode()
    return b'X' + struct.pack('<I', len(b)) + b


def su(s):  # SHORT_BINUNICODE (protocol 4)
    b = s.encode()
    return b'\x8c' + bytes([len(b)]) + b


def g(mod, name):  # GLOBAL
    return b'c' + mod.encode() + b'\n' + name.encode() + b'\n'


P2, P4, STOP = b'\x80\x02', b'\x80\x04', b'.'
MARK, TUPLE1, REDUCE, BUILD, NONE = b'(', b'\x85', b'R', b'b', b'N'


def put(name, data, unknown, dangerous):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name), 'wb') as f:
        f.write(data)
    EXPECTED[name] = {'unknown': sorted(unknown), 'dangerous': sorted(dangerous)}


def zip_pth(records):
    """A torch-style zip (stored records under archive/)."""
    b = io.BytesIO()
    with zipfile.ZipFile(b, 'w', zipfile.ZIP_STORED) as z:
        for name, data in records:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            z.writestr(info, data)
    return b.getvalue()


def call(mod, name, arg):
    return g(mod, name) + u(arg) + TUPLE1 + REDUCE


def main():
    # 1. the plain one
    put('global_reduce.pkl', P2 + call('os', 'system', 'id') + STOP, ['os.system'], ['os.system'])
    # 2. STACK_GLOBAL whose operands come from the memo (BINPUT / BINGET), pushed
    #    far from the STACK_GLOBAL: scanners that read the two preceding opcodes miss it
    body = (P4 + su('os') + b'\x94' + su('system') + b'\x94' + b'0' + b'0' +
            su('junk') + b'0' + b'h\x00' + b'h\x01' + b'\x93' + su('id') + TUPLE1 + REDUCE + STOP)
    put('stack_global_memo.pkl', body, ['os.system'], ['os.system'])
    # 3. STACK_GLOBAL with BINPUT/LONG_BINGET at protocol 2 numbering
    body = (P2 + u('subprocess') + b'q\x07' + u('check_output') + b'r\x09\x00\x00\x00' + b'0' +
            b'0' + b'h\x07' + b'j\x09\x00\x00\x00' + b'\x93' + MARK + u('id') + b'l' +
            TUPLE1 + REDUCE + STOP)
    put('stack_global_long_memo.pkl', body, ['subprocess.check_output'],
        ['subprocess.check_output'])
    # 4. INST: the class named inline, called with the MARKed arguments
    put('inst.pkl', b'(' + u('id') + b'ios\nsystem\n' + STOP, ['os.system'], ['os.system'])
    # 5. OBJ: MARK, class, arguments, OBJ
    put('obj.pkl', P2 + MARK + g('posix', 'system') + u('id') + b'o' + STOP,
        ['posix.system'], ['posix.system'])
    # 6. __import__ + getattr chain: getattr(__import__('os'), 'system')('id')
    body = (P2 + g('builtins', 'getattr') + MARK + g('builtins', '__import__') + u('os') +
            TUPLE1 + REDUCE + u('system') + b't' + REDUCE + u('id') + TUPLE1 + REDUCE + STOP)
    # getattr on a call's result: a name computed at run time, reported as such
    computed = '<builtins.__import__(...)>.system'
    put('import_getattr.pkl', body, ['builtins.getattr', 'builtins.__import__', computed],
        ['builtins.getattr', 'builtins.__import__', computed])
    # 7. importlib.import_module('os') then getattr
    body = (P2 + g('builtins', 'getattr') + MARK + g('importlib', 'import_module') + u('os') +
            TUPLE1 + REDUCE + u('system') + b't' + REDUCE + u('id') + TUPLE1 + REDUCE + STOP)
    computed = '<importlib.import_module(...)>.system'
    put('importlib_chain.pkl', body, ['builtins.getattr', 'importlib.import_module', computed],
        ['builtins.getattr', 'importlib.import_module', computed])
    # 8. a pickle inside a pickle: pickle.loads(b'...')
    inner = P2 + call('os', 'system', 'id') + STOP
    body = P2 + g('pickle', 'loads') + b'C' + bytes([len(inner)]) + inner + TUPLE1 + REDUCE + STOP
    put('nested_pickle.pkl', body, ['pickle.loads'], ['pickle.loads'])
    # 9. Python 2 names: __builtin__.eval is builtins.eval
    put('py2_builtin_eval.pkl', P2 + call('__builtin__', 'eval', '1+1') + STOP,
        ['builtins.eval'], ['builtins.eval'])
    # 10. protocol 0, text opcodes only
    put('protocol0.pkl', b'cos\nsystem\n(Vid\ntR.', ['os.system'], ['os.system'])
    # 11. runpy / nt / shutil / socket / ctypes / sys / timeit / pdb / code
    for mod, name in [('runpy', '_run_code'), ('nt', 'system'), ('shutil', 'rmtree'),
                      ('socket', 'create_connection'), ('ctypes', 'CDLL'), ('sys', 'exit'),
                      ('timeit', 'timeit'), ('pdb', 'run'), ('code', 'InteractiveInterpreter'),
                      ('operator', 'attrgetter'), ('numpy.testing._private.utils', 'runstring'),
                      ('torch', 'load'), ('marshal', 'loads'), ('builtins', 'exec'),
                      ('builtins', 'compile'), ('builtins', 'open')]:
        put('%s.%s.pkl' % (mod, name), P2 + call(mod, name, 'x') + STOP,
            ['%s.%s' % (mod, name)], ['%s.%s' % (mod, name)])
    # 12. subprocess.Popen through NEWOBJ
    body = P2 + g('subprocess', 'Popen') + MARK + u('id') + b'l' + TUPLE1 + b'\x81' + STOP
    put('newobj_popen.pkl', body, ['subprocess.Popen'], ['subprocess.Popen'])
    # 13. an unknown class that is not known to be dangerous: still not safe
    put('unknown_class.pkl', P2 + g('mypkg.models', 'Evil') + b')' + REDUCE + STOP,
        ['mypkg.models.Evil'], [])
    # 14. BUILD on an unknown object (its __setstate__ would run)
    body = P2 + g('mypkg', 'Stateful') + b')' + REDUCE + b'}' + BUILD + STOP
    put('build_unknown.pkl', body, ['mypkg.Stateful'], [])
    # 15. zip checkpoints: the payload outside data.pkl, and a record named DATA.PKL
    ok = P2 + b'}' + STOP
    bad = P2 + call('os', 'system', 'id') + STOP
    put('zip_extra_pkl.pth', zip_pth([('archive/data.pkl', ok), ('archive/version', b'3\n'),
                                      ('archive/extra.pkl', bad)]), ['os.system'], ['os.system'])
    put('zip_upper_pkl.pth', zip_pth([('archive/DATA.PKL', bad), ('archive/version', b'3\n')]),
        ['os.system'], ['os.system'])
    # 16. legacy format with the payload in the sys_info pickle (the third)
    magic = P2 + b'\x8a\x0a' + (0x1950a86a20f9469cfc6c).to_bytes(10, 'little') + STOP
    proto = P2 + b'M\xe9\x03' + STOP
    sysinfo = P2 + call('os', 'system', 'id') + STOP
    put('legacy_sysinfo.pth', magic + proto + sysinfo + P2 + b'}' + STOP + P2 + b']' + STOP,
        ['os.system'], ['os.system'])
    # 17. FRAME-split protocol-4 stream with MEMOIZE
    frame_body = su('os') + b'\x94' + su('system') + b'\x94' + b'\x93' + su('id') + TUPLE1 + REDUCE + STOP
    body = P4 + b'\x95' + struct.pack('<Q', len(frame_body)) + frame_body
    put('frame_memoize.pkl', body, ['os.system'], ['os.system'])
    # 18. the global stashed in the memo and called later from a BINGET
    body = P2 + g('os', 'system') + b'q\x01' + b'0' + NONE + b'0' + b'h\x01' + u('id') + TUPLE1 + REDUCE + STOP
    put('memo_global_call.pkl', body, ['os.system'], ['os.system'])
    # 19. issue 15: bytes torch.load reads otherwise than a naive reader would
    #     (tests/bad/bypasses.py; tests/interop/scan_bypasses.py checks torch's side)
    put('safetensors_pickle.safetensors', bp.safetensors_pickle(), ['os.getcwd'], ['os.getcwd'])
    put('frame_crossing.pkl', bp.frame_crossing(64), ['os.getcwd'], ['os.getcwd'])
    put('frame_crossing_zip.pth', bp.zip_with(bp.frame_crossing(64)), ['os.getcwd'],
        ['os.getcwd'])
    put('legacy_tar_polyglot.pth', bp.legacy_tar_polyglot(), ['os.getcwd'], ['os.getcwd'])
    for name, data, by in [('computed_rot13.pkl', bp.computed_rot13(), '_codecs.encode'),
                           ('computed_str.pkl', bp.computed_str(), 'builtins.str')]:
        shown = '<%s(...)>.getcwd' % by
        put(name, data, [shown], [shown])
    # 20. issue 26: a TorchScript archive is code (torch.load hands it to torch.jit.load, which
    #     runs its __setstate__), whatever its classes are named: no unknown global, unsafe
    #     all the same (tests/bad/torchscript_code.py; tests/interop/code_and_polyglots.py)
    put('torchscript_argparse.pth', tsc.archive(), [], [])
    # 21. issue 26: the legacy chain as torch reads it (tests/bad/frames.py;
    #     tests/interop/legacy_frames.py checks that torch runs the payload)
    put('legacy_stop_in_frame.pth', fr.stop_in_frame(bp.PAYLOAD, 300), ['os.getcwd'],
        ['os.getcwd'])
    put('legacy_stop_in_small_frame.pth', fr.stop_in_small_frame(bp.PAYLOAD), ['os.getcwd'],
        ['os.getcwd'])
    put('legacy_magic_by_call.pth', fr.magic_by_call(bp.PAYLOAD), ['os.getcwd'], ['os.getcwd'])
    put('legacy_protocol_float.pth', fr.protocol_float(bp.PAYLOAD), ['os.getcwd'],
        ['os.getcwd'])

    with open(os.path.join(OUT, 'expected.json'), 'w') as f:
        json.dump(EXPECTED, f, indent=1, sort_keys=True)
        f.write('\n')


if __name__ == '__main__':
    main()
