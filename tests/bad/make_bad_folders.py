#!/usr/bin/env python3
"""make_bad_folders.py - checkpoint folders whose loader runs a payload that
`ckpt scan` once did not see (issue 26): files a loader opens were skipped
or scanning stopped early.  Plain python3, no torch: the pickles are written
opcode by opcode, the DCP metadata with tests/bad/make_bad_dcp.py's
stand-ins, the DeepSpeed rank zips by tests/bad/make_bad_deepspeed.py.

    make_bad_folders.py OUTDIR [MARKER]

The payload is harmless and recording: builtins.open(MARKER, 'w'), which
creates MARKER (default /tmp/ckpt_pwned) when a loader runs it.
tests/interop/scan_folders.py runs the real loaders on these folders (and
checks that each creates MARKER) and `ckpt scan` (which must exit 1);
tests/cli/scan_folders.sh runs `ckpt scan` alone.

Folders made (what the loader is; what it opens):
  ds_protocol0/         DeepSpeed (zero_to_fp32): latest + global_step3/;
                        mp_rank_00_model_states.pt is a protocol-0 pickle
                        (its first byte 'c', GLOBAL: no PROTO to sniff)
  ds_protocol1/         the same, the model file a legacy stream of protocol
                        1: the magic number as LONG1 (first byte 0x8a), then
                        the payload as torch's "protocol version" pickle
  ds_polyglot/          the same, the model file a valid safetensors file
                        whose bytes from 0 are the payload pickle: it begins
                        like another format (torch.load of a .pt unpickles it)
  hf_snapshot/          a Hugging Face hub cache: snapshots/REV/ holds links
                        (pytorch_model.bin -> ../../blobs/SHA, config.json);
                        scan hf_snapshot/snapshots/REV as transformers loads it
  dcp_readme/           DCP (dcp.load): .metadata names README.md for the
                        BYTES item 'step'; README.md is a protocol-0 pickle,
                        which DCP hands to torch.load(weights_only=False)
  dcp_escape/           DCP: .metadata names ../outside.distcp for 'step'
                        (outside.distcp, beside the folder, holds the payload
                        as a torch.save zip): dcp.load reads it there
  dcp_absolute/         DCP: the same by an absolute relative_path (OUTDIR's
                        outside.distcp, named by its absolute path)
  hf_index_escape/      a sharded checkpoint whose index names
                        ../outside.bin (transformers joins it to the folder)
  fifo/                 a FIFO beside a safe file (made with os.mkfifo): a
                        loader would block on it; ckpt refuses it unread
  empty/                no file at all (ckpt-scan(1): exit 3)
"""
import io
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def payload(marker, proto=2):
    """builtins.open(MARKER, 'w'): creates MARKER when unpickled."""
    m = marker.encode()
    assert b"'" not in m and b'\n' not in m and b'\\' not in m
    if proto == 0:
        return b"cbuiltins\nopen\n(S'" + m + b"'\nS'w'\ntR."
    return (b'\x80\x02cbuiltins\nopen\nX' + struct.pack('<I', len(m)) + m +
            b'X\x01\x00\x00\x00w\x86R.')


# the legacy magic number as protocol 1 writes it: LONG1, no PROTO
MAGIC_P1 = b'\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.'


def zip_payload(marker):
    """A torch.save zip whose data.pkl is the payload."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_STORED) as z:
        z.writestr('archive/data.pkl', payload(marker))
        z.writestr('archive/byteorder', 'little')
        z.writestr('archive/version', '3\n')
    return buf.getvalue()


def safetensors_polyglot(marker):
    """A valid safetensors file (one U8 tensor) whose bytes from 0 are a
    pickle: the length's first byte is 'V' (UNICODE: a line), the JSON's one
    newline ends it, its '}' is EMPTY_DICT, and the tensor is the payload
    (as tests/bad/bypasses.py's safetensors_pickle)."""
    body = payload(marker)
    for pad in range(400):
        h = ('{"t":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]},"__metadata__":'
             '{"p":"%s"}\n}' % (len(body), len(body), ' ' * pad)).encode()
        if len(h) & 0xff == ord('V'):
            break
    return struct.pack('<Q', len(h)) + h + body


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data)


def deepspeed(out, name, model_file):
    """A good ZeRO-2 folder of make_bad_deepspeed.py with its model file
    replaced by MODEL_FILE."""
    tmp = os.path.join(out, '.ds_tmp')
    if not os.path.isdir(tmp):
        subprocess.run([sys.executable, os.path.join(HERE, 'make_bad_deepspeed.py'), tmp],
                       check=True, stdout=subprocess.DEVNULL)
    dst = os.path.join(out, name)
    shutil.copytree(os.path.join(tmp, 'good_zero2'), dst)
    write(os.path.join(dst, 'global_step3', 'mp_rank_00_model_states.pt'), model_file)


def dcp_folder(path, relative_path, data_path=None, data=None):
    """A DCP folder whose .metadata has one BYTES item, 'step', at byte 0 of
    RELATIVE_PATH (DATA written at DATA_PATH, when given)."""
    import make_bad_dcp as D  # its stand-ins: only in this plain python3 process
    os.makedirs(path, exist_ok=True)
    if data_path:
        write(data_path, data)
    length = len(data) if data is not None else 0
    md = D.Metadata(state_dict_metadata={'step': D.BytesStorageMetadata()},
                    planner_data={'step': ('step',)},
                    storage_data={D.MetadataIndex(fqn='step', index=None):
                                  D.StorageInfo(relative_path=relative_path, offset=0,
                                                length=length)},
                    storage_meta=None, version='1.0.0')
    with open(os.path.join(path, '.metadata'), 'wb') as f:
        pickle.dump(md, f, protocol=4)


def main(out, marker):
    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)
    deepspeed(out, 'ds_protocol0', payload(marker, 0))
    deepspeed(out, 'ds_protocol1', MAGIC_P1 + payload(marker, 0))
    deepspeed(out, 'ds_polyglot', safetensors_polyglot(marker))
    shutil.rmtree(os.path.join(out, '.ds_tmp'))

    hf = os.path.join(out, 'hf_snapshot')
    write(os.path.join(hf, 'blobs', '5d1e0c'), payload(marker))
    write(os.path.join(hf, 'blobs', '9a7f31'), b'{"model_type": "mlp"}\n')
    snap = os.path.join(hf, 'snapshots', 'a1b2c3')
    os.makedirs(snap)
    os.symlink('../../blobs/5d1e0c', os.path.join(snap, 'pytorch_model.bin'))
    os.symlink('../../blobs/9a7f31', os.path.join(snap, 'config.json'))
    os.makedirs(os.path.join(hf, 'refs'))
    write(os.path.join(hf, 'refs', 'main'), b'a1b2c3')

    p0 = payload(marker, 0)
    dcp_folder(os.path.join(out, 'dcp_readme'), 'README.md',
               os.path.join(out, 'dcp_readme', 'README.md'), p0)
    z = zip_payload(marker)
    write(os.path.join(out, 'outside.distcp'), z)
    dcp_folder(os.path.join(out, 'dcp_escape'), '../outside.distcp', None, z)
    dcp_folder(os.path.join(out, 'dcp_absolute'), os.path.join(out, 'outside.distcp'), None, z)

    write(os.path.join(out, 'outside.bin'), payload(marker))
    write(os.path.join(out, 'hf_index_escape', 'pytorch_model.bin.index.json'),
          b'{"metadata": {}, "weight_map": {"w": "../outside.bin"}}\n')

    fifo = os.path.join(out, 'fifo')
    os.makedirs(fifo)
    write(os.path.join(fifo, 'a.pkl'), b'\x80\x02}q\x00.')
    os.mkfifo(os.path.join(fifo, 'b.pt'))
    os.makedirs(os.path.join(out, 'empty'))


if __name__ == '__main__':
    if len(sys.argv) not in (2, 3):
        sys.exit('usage: make_bad_folders.py OUTDIR [MARKER]')
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else '/tmp/ckpt_pwned')
