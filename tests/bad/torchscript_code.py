"""A TorchScript archive whose code runs when torch.load hands it to torch.jit.load (issue 26),
whatever its classes are named: archive() names its module class argparse.Namespace (a class
ckpt knows as data) with its source in code/argparse.py, and its __setstate__ prints MARKER (a
harmless recording payload: TorchScript's print writes to stdout).  Plain python3, no torch:
the archive is written record by record, as torch.jit.save lays it out.

Used by tests/bad/make_scan_corpus.py (tests/bad/scan/torchscript_argparse.pth) and
tests/interop/code_and_polyglots.py (which loads it with torch 2.15 and 1.13)."""
import io
import struct
import zipfile

MARKER = 'CKPT-TS-PAYLOAD-RAN'

# The class's source as torch.jit.save writes it (code/<module>.py), __setstate__ printing the
# marker: the harmless recording payload (TorchScript's print goes to stdout).
CODE = '''class %(name)s(Module):
  __parameters__ = ["w", ]
  __buffers__ = []
  w : Tensor
  training : bool
  def forward(self: %(q)s,
    x: Tensor) -> Tensor:
    w = self.w
    return torch.mul(x, w)
  def __getstate__(self: %(q)s) -> Tuple[Tensor, bool]:
    return (self.w, self.training)
  def __setstate__(self: %(q)s,
    state: Tuple[Tensor, bool]) -> NoneType:
    print("%(marker)s")
    self.w = (state)[0]
    self.training = (state)[1]
    return None
'''


def data_pkl(module, name):
    """module.name(), BUILD with (w, True): w a 2-float tensor in storage '0'."""
    g = lambda m, n: b'c' + m.encode() + b'\n' + n.encode() + b'\n'
    u = lambda s: b'X' + struct.pack('<I', len(s)) + s.encode()
    return (b'\x80\x02' + g(module, name) + b')\x81' +
            g('torch._utils', '_rebuild_tensor_v2') + b'((' + u('storage') +
            g('torch', 'FloatStorage') + u('0') + u('cpu') + b'K\x02tQK\x00(K\x02t(K\x01t\x88' +
            g('collections', 'OrderedDict') + b')RtR\x88\x86b.')


def archive(module='argparse', name='Namespace', prefix='archive', constants='constants.pkl'):
    """A TorchScript archive whose module class is MODULE.NAME (code in code/MODULE.py)."""
    q = '%s.%s' % (module, name)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_STORED) as z:
        def put(n, d):
            z.writestr(zipfile.ZipInfo('%s/%s' % (prefix, n), date_time=(2020, 1, 1, 0, 0, 0)), d)
        put('data.pkl', data_pkl(module, name))
        put('code/%s.py' % module.replace('.', '/'),
            CODE % {'name': name, 'q': q, 'marker': MARKER})
        put('data/0', struct.pack('<2f', 1.0, 1.0))
        put(constants, b'\x80\x02).')
        put('version', b'3\n')
        put('byteorder', b'little')
    return buf.getvalue()
