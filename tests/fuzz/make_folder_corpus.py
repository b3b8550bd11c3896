#!/usr/bin/env python3
"""The seed corpus of fuzz_folder: folders packed as that target reads its
input (u8 count; per file: u16 name length, name, u32 data length, data;
little-endian; names relative to the folder).  The folders are the good and
hostile DeepSpeed ZeRO folders tests/bad/make_bad_deepspeed.py writes
(no torch needed), and the committed fixture tests/fixtures/distributed/
deepspeed/zero2_fp32_2 when it is there.

    python3 tests/fuzz/make_folder_corpus.py [tests/fuzz/corpus/folder]
"""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def pack(folder):
    files = []
    for base, _, names in os.walk(folder):
        for n in sorted(names):
            p = os.path.join(base, n)
            rel = os.path.relpath(p, folder)
            if rel.count('/') > 1 or n.endswith('.py'):
                continue
            files.append((rel.encode(), open(p, 'rb').read()))
    out = bytearray([len(files)])
    for name, data in files:
        out += struct.pack('<H', len(name)) + name + struct.pack('<I', len(data)) + data
    return bytes(out)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, 'corpus', 'folder')
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'bad', 'make_bad_deepspeed.py'),
                        tmp], check=True)
        folders = [(n, os.path.join(tmp, n)) for n in sorted(os.listdir(tmp))
                   if os.path.isdir(os.path.join(tmp, n))]
        fx = os.path.join(ROOT, 'tests', 'fixtures', 'distributed', 'deepspeed', 'zero2_fp32_2')
        if os.path.isdir(fx):
            folders.append(('fixture_zero2_fp32_2', fx))
        for name, path in folders:
            with open(os.path.join(out, 'deepspeed_' + name), 'wb') as f:
                f.write(pack(path))
            print('deepspeed_' + name)


if __name__ == '__main__':
    main()
