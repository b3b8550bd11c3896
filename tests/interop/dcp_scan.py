#!/usr/bin/env python3
"""`ckpt scan` of torch.distributed.checkpoint folders judges each .distcp item as DCP reads it
(issue 26): torch.load of the item's bytes alone, so only torch's zip reading applies.

Under torch 2.x (torch 1.13 has no DCP: skipped), in a throwaway folder:
  - a genuine folder written by dcp.save from FSDP2 (fully_shard) on 2 CPU ranks (gloo, this
    script re-executed as each rank: three Linear(256, 256), Adam, one step; model and
    optimizer state via get_state_dict) scans safe, exit 0, with no ambiguity in any file
    (rank 1's first item, a BYTES item at byte 0, once read "libzip refuses it");
  - the same folder with one BYTES item (which DCP's planner loads with torch.load(...,
    weights_only=False)) pointed, through .metadata, at a zip whose data.pkl calls
    builtins.print (the recording payload) appended to rank 1's file: dcp_to_torch_save prints
    the marker, and `ckpt scan FOLDER` calls the file unsafe (exit 1);
  - the same with a TorchScript archive as that item (tests/bad/torchscript_code.py): DCP's
    torch.load hands it to torch.jit.load, which runs its __setstate__; scan: unsafe, with a
    code finding for that item.
"""
import dataclasses
import io
import json
import os
import pickle
import shutil
import socket
import struct
import subprocess
import sys
import zipfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))


def worker(out):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    dist.init_process_group('gloo')
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)])
    mesh = init_device_mesh('cpu', (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    dcp.save({'model': msd, 'optim': osd}, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()


if len(sys.argv) == 3 and sys.argv[1] == '--worker':
    worker(sys.argv[2])
    # past the C++ destructors run at interpreter exit: gloo's threads sometimes
    # end the process there with "terminate called without an active exception"
    # (1 run in 3 here), after the folder is whole
    sys.stdout.flush()
    os._exit(0)

sys.path.insert(0, HERE)
import _common as c  # noqa: E402  (exits 77 without torch)

torch = c.torch
if int(torch.__version__.split('.')[0]) < 2:
    print('torch %s has no torch.distributed.checkpoint: skipped' % torch.__version__)
    sys.exit(c.SKIP)
sys.path.insert(0, os.path.join(c.SRCDIR, 'tests', 'bad'))
import torchscript_code  # noqa: E402

t = c.Tally()
t.need(c.CKPT, 'CKPT')
MARKER = 'CKPT-DCP-ITEM-PAYLOAD-RAN'


def fsdp2_folder(out, world=2):
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR='127.0.0.1',
               MASTER_PORT=str(port), OMP_NUM_THREADS='1')
    ps = [subprocess.Popen([sys.executable, os.path.abspath(__file__), '--worker', out],
                           env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
          for r in range(world)]
    outs = [p.communicate(timeout=300)[0] for p in ps]
    if any(p.returncode for p in ps):
        raise c.Fail('dcp.save failed: %s' % b''.join(outs).decode(errors='replace')[-600:])


def scan(folder):
    p = subprocess.run([c.CKPT, 'scan', '--json', folder], capture_output=True, text=True,
                       timeout=c.TIMEOUT)
    return p.returncode, json.loads(p.stdout)['files']


def print_item():
    """A torch.save-shaped zip whose data.pkl is builtins.print(MARKER)."""
    m = MARKER.encode()
    pkl = (b'\x80\x02cbuiltins\nprint\nX' + struct.pack('<I', len(m)) + m + b'\x85R.')
    b = io.BytesIO()
    with zipfile.ZipFile(b, 'w', zipfile.ZIP_STORED) as z:
        z.writestr('archive/data.pkl', pkl)
        z.writestr('archive/version', b'3\n')
    return b.getvalue()


def point_bytes_item(folder, blob):
    """Append BLOB to rank 1's data file and point a BYTES item of .metadata at it: the item
    DCP's planner loads with torch.load(weights_only=False).  Returns the file's name."""
    md_path = os.path.join(folder, '.metadata')
    with open(md_path, 'rb') as f:
        md = pickle.load(f)
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    key = next(k for k, v in md.storage_data.items()
               if isinstance(md.state_dict_metadata[k.fqn], BytesStorageMetadata)
               and v.relative_path.startswith('__1_'))
    info = md.storage_data[key]
    path = os.path.join(folder, info.relative_path)
    at = os.path.getsize(path)
    with open(path, 'ab') as f:
        f.write(blob)
    md.storage_data[key] = dataclasses.replace(info, offset=at, length=len(blob))
    with open(md_path, 'wb') as f:
        pickle.dump(md, f)
    return info.relative_path


def dcp_loads(folder, tmp, marker):
    """Whether dcp_to_torch_save (DCP's own reader) runs the payload."""
    code = ('import sys, warnings\nwarnings.simplefilter("ignore")\n'
            'from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n'
            'dcp_to_torch_save(sys.argv[1], sys.argv[2])\n')
    p = subprocess.run([sys.executable, '-c', code, folder, os.path.join(tmp, 'out.pth')],
                       capture_output=True, text=True, timeout=c.TIMEOUT)
    return marker in p.stdout, (p.stdout + p.stderr)[-300:]


def checks(tmp):
    errs = []
    folder = os.path.join(tmp, 'fsdp2')
    fsdp2_folder(folder)
    rc, files = scan(folder)
    amb = ['%s: %s' % (os.path.basename(f['file']), a) for f in files for a in f['ambiguities']]
    if rc != 0 or amb or any(f['verdict'] != 'safe' for f in files):
        errs.append('genuine FSDP2 folder: exit %d, verdicts %s, ambiguities %s' % (
            rc, [f['verdict'] for f in files], amb[:3]))
    ndistcp = sum(f['file'].endswith('.distcp') for f in files)
    if ndistcp != 2:
        errs.append('%d .distcp files scanned, expected 2' % ndistcp)
    t.report('FSDP2 on 2 ranks, dcp.save: scan exit 0, no ambiguity (%d files)' % len(files),
             errs)

    for what, blob, marker in [('a zip whose data.pkl calls builtins.print', print_item(),
                                MARKER),
                               ('a TorchScript archive (torch.jit.load runs __setstate__)',
                                torchscript_code.archive(), torchscript_code.MARKER)]:
        bad = os.path.join(tmp, 'hostile')
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(folder, bad)
        name = point_bytes_item(bad, blob)
        errs = []
        ran, how = dcp_loads(bad, tmp, marker)
        if not ran:
            errs.append('dcp_to_torch_save did not run the payload (%s): the case is wrong' % how)
        rc, files = scan(bad)
        f = next(f for f in files if f['file'].endswith(name))
        if rc != 1 or f['verdict'] != 'unsafe':
            errs.append('scan: exit %d, %s: %s' % (rc, name, f['verdict']))
        if 'TorchScript' in what and not f.get('code'):
            errs.append('no code finding for the TorchScript item')
        t.report('a BYTES item pointed at %s: DCP runs it, scan exit 1 (%s unsafe)' % (what, name),
                 errs)
    return []


t.run('DCP folders', checks, tmp=True)
sys.exit(t.summary())
