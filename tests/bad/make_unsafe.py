#!/usr/bin/env python3
"""Checkpoints that hold a global which runs code, for the rewrites (issue 26).

    python3 tests/bad/make_unsafe.py OUTDIR [MODULE]

A rewrite must never carry such a global into its output (doc/safety.md, "Rewrites"):
tests/cli/rewrite_unsafe.sh runs every rewriting command over these files, and
tests/interop/rewrite_unsafe.py loads what `--keep-unsafe` wrote with
torch.load(weights_only=False) to show that the payload does run.

Each file is a training checkpoint as torch.save writes it to a zip:
{"model": OrderedDict(module.w, module.b, with _metadata), "cfg": <payload>}, so that
every key rewrite has keys to change and extract has a model to take out.  The payload
names MODULE (default `ckpt_probe`, a module no one has: the interop test writes a
harmless one that records what it is asked to do):

  unsafe_call.pth      cfg = MODULE.record('call')                   (REDUCE)
  unsafe_object.pth    cfg = MODULE.Config() with state {'lr': 1}    (NEWOBJ + BUILD)
  unsafe_nested.pth    cfg = collections.defaultdict(MODULE.record)  (a global as an argument
                                                                      of known data)
  unsafe_key.pth       cfg = {MODULE.record('key'): 1}               (in a dict key)
  unsafe_metadata.pth  cfg = 0; the model's _metadata holds MODULE.record('metadata')
                       (inside the state dict a key rewrite edits)
  unsafe_print.pth     cfg = builtins.print('ckpt-probe: print')     (an unknown call of the
                                                                      standard library)
  unsafe_os_system.pth cfg = os.system('true')                       (never admitted)

and unsafe_globals.txt: one line per file, FILE GLOBAL (the global to name with
--allow-global).  Built opcode by opcode; nothing is pickled or unpickled here.  Plain
python3, deterministic."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_bad import (BINPUT, EMPTY_DICT, EMPTY_TUPLE, G, I, MARK, ODICT,  # noqa: E402
                      PROTO2, REDUCE, SETITEM, SETITEMS, STOP, TUPLE1, T, U, data_for,
                      tensor, zip_bytes)

NEWOBJ = b'\x81'
BUILD = b'b'


def checkpoint(cfg, metadata=None):
    """{"model": OrderedDict(module.w, module.b), "cfg": CFG}; METADATA, pickle code of a
    value, goes into the model's _metadata {'': {'version': 1}, 'module': VALUE}."""
    ts = [T('module.w', key='0', numel=6, size=(2, 3), stride=(3, 1)),
          T('module.b', key='1', numel=2, size=(2,), stride=(1,))]
    md = MARK + U('') + EMPTY_DICT + U('version') + I(1) + SETITEM
    if metadata is not None:
        md += U('module') + metadata
    model = (ODICT + BINPUT(1) + MARK + b''.join(U(t.name) + tensor(t) for t in ts)
             + SETITEMS
             # OrderedDict state: {'_metadata': OrderedDict(...)}, as torch pickles it
             + EMPTY_DICT + U('_metadata') + ODICT + md + SETITEMS + SETITEM + BUILD)
    pkl = (PROTO2 + EMPTY_DICT + BINPUT(0) + MARK + U('model') + model + U('cfg') + cfg
           + SETITEMS + STOP)
    return zip_bytes(pkl, data_for(ts), prefix='archive/')


def files(mod):
    def call(tag):
        return G(mod, 'record') + U(tag) + TUPLE1 + REDUCE
    return [
        ('unsafe_call.pth', mod + '.record', checkpoint(call('call'))),
        ('unsafe_object.pth', mod + '.Config',
         checkpoint(G(mod, 'Config') + EMPTY_TUPLE + NEWOBJ + EMPTY_DICT + U('lr') + I(1)
                    + SETITEM + BUILD)),
        ('unsafe_nested.pth', mod + '.record',
         checkpoint(G('collections', 'defaultdict') + G(mod, 'record') + TUPLE1 + REDUCE)),
        ('unsafe_key.pth', mod + '.record',
         checkpoint(EMPTY_DICT + (call('key')) + I(1) + SETITEM)),
        ('unsafe_metadata.pth', mod + '.record',
         checkpoint(I(0), metadata=call('metadata'))),
        ('unsafe_print.pth', 'builtins.print',
         checkpoint(G('builtins', 'print') + U('ckpt-probe: print') + TUPLE1 + REDUCE)),
        ('unsafe_os_system.pth', 'os.system',
         checkpoint(G('os', 'system') + U('true') + TUPLE1 + REDUCE)),
    ]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split('\n\n')[1])
    out, mod = sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else 'ckpt_probe'
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'unsafe_globals.txt'), 'w') as lst:
        for name, glob, data in files(mod):
            with open(os.path.join(out, name), 'wb') as f:
                f.write(data)
            lst.write('%s %s\n' % (name, glob))


if __name__ == '__main__':
    main()
