#!/usr/bin/env python3
"""The seed corpus of fuzz_folder: folders packed as that target reads its
input (u8 count; per file: u16 name length, name, u32 data length, data;
little-endian; names relative to the folder; '@' before a name: a symbolic
link, its target the data; '|': a FIFO).  The folders are the good and
hostile DeepSpeed ZeRO folders tests/bad/make_bad_deepspeed.py writes,
the DCP folders of tests/bad/make_bad_dcp.py, the folders of
tests/bad/make_bad_folders.py (links, a FIFO; no torch needed for any),
and the committed fixture tests/fixtures/distributed/deepspeed/zero2_fp32_2
when it is there.

    python3 tests/fuzz/make_folder_corpus.py [tests/fuzz/corpus/folder]
"""
import os
import stat
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def pack(folder):
    files = []
    for base, dirs, names in os.walk(folder):
        for n in sorted(names) + sorted(d for d in dirs if os.path.islink(os.path.join(base, d))):
            p = os.path.join(base, n)
            rel = os.path.relpath(p, folder)
            if rel.count('/') > 1 or n.endswith('.py'):
                continue
            if os.path.islink(p):
                target = os.readlink(p)
                if target.startswith('/'):
                    continue
                files.append(('@' + rel, target.encode()))
            elif stat.S_ISFIFO(os.lstat(p).st_mode):
                files.append(('|' + rel, b''))
            else:
                files.append((rel, open(p, 'rb').read()))
    files = [(n.encode(), d) for n, d in files]
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
        for script, prefix in (('make_bad_dcp.py', 'dcp_'), ('make_bad_folders.py', 'scan_')):
            d = os.path.join(tmp, prefix)
            subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'bad', script), d],
                           check=True, stdout=subprocess.DEVNULL)
            for n in sorted(os.listdir(d)):
                path = os.path.join(d, n)
                if not os.path.isdir(path):
                    continue
                if n == 'hf_snapshot':  # the snapshot folder itself, its links into blobs
                    path = os.path.join(path, 'snapshots', 'a1b2c3')
                name = prefix + n
                with open(os.path.join(out, name), 'wb') as f:
                    f.write(pack(path))
                print(name)


if __name__ == '__main__':
    main()
