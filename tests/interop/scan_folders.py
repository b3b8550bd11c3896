#!/usr/bin/env python3
"""ckpt scan judges a folder by its loaders' rules, over every file they open (issue 26).

tests/bad/make_bad_folders.py writes folders whose loader runs a harmless recording payload
(builtins.open(MARKER, 'w')) from a file that `ckpt scan` once skipped or never reached: a
DeepSpeed rank file in protocol 0 or 1, or beginning like safetensors; a Hugging Face snapshot
of links into ../../blobs; a DCP data file named README.md; a DCP .metadata, DeepSpeed tag or
shard index naming a file outside the folder.  For each, the real loader runs here and must
create MARKER (else the case is wrong), and `ckpt scan FOLDER` must call it unsafe: exit 1.

The loaders: DeepSpeed's zero_to_fp32 (get_fp32_state_dict_from_zero_checkpoint) where
deepspeed is installed, else torch.load of the rank file it loads; torch.load of the
snapshot's file by its link (transformers' way); dcp.load (torch 2.x only); the shard index as
transformers reads it (torch.load(os.path.join(folder, weight_map value))).
"""
import contextlib
import io
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as c  # noqa: E402  (exits 77 without torch)

torch = c.torch
t = c.Tally(uses='the loaders named per case; ckpt %s' % c.CKPT)
t.need(c.CKPT, 'CKPT')

OUT = c.scratch('folders')
MARKER = c.scratch('pwned')
subprocess.run(['python3', os.path.join(c.SRCDIR, 'tests', 'bad', 'make_bad_folders.py'),
                OUT, MARKER], check=True)


def quiet(fn, *a, **k):
    """FN(*A, **K) with its output swallowed; how it ended (any end: what ran before counts)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            fn(*a, **k)
        return 'loaded'
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is not an Exception
        return type(e).__name__


def deepspeed_load(folder):
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except Exception:  # noqa: BLE001 - no deepspeed under this torch
        f = os.path.join(folder, 'global_step3', 'mp_rank_00_model_states.pt')
        return 'torch.load of the model rank file', quiet(torch.load, f, map_location='cpu',
                                                           weights_only=False)
    return ('deepspeed zero_to_fp32',
            quiet(get_fp32_state_dict_from_zero_checkpoint, folder))


def dcp_load(folder):
    try:
        import torch.distributed.checkpoint as dcp
    except Exception:  # noqa: BLE001
        raise c.Skip('torch %s has no torch.distributed.checkpoint' % torch.__version__)
    if not hasattr(dcp, 'load'):
        raise c.Skip('torch %s has no dcp.load' % torch.__version__)
    return 'dcp.load', quiet(dcp.load, {'step': 0}, checkpoint_id=folder, no_dist=True)


def snapshot_load(folder):
    return 'torch.load by its link', quiet(torch.load, os.path.join(folder, 'pytorch_model.bin'),
                                           map_location='cpu', weights_only=False)


def index_load(folder):
    idx = json.load(open(os.path.join(folder, 'pytorch_model.bin.index.json')))

    def load():
        for shard in sorted(set(idx['weight_map'].values())):
            torch.load(os.path.join(folder, shard), map_location='cpu', weights_only=False)
    return 'torch.load of each shard the index names, joined to the folder', quiet(load)


def check(name, folder, loader, want=(1,)):
    def run():
        if os.path.exists(MARKER):
            os.unlink(MARKER)
        who, how = loader(folder)
        errs = []
        if not os.path.exists(MARKER):
            errs.append('%s (%s) did not run the payload: the case is wrong' % (who, how))
        r = c.ckpt('scan', '--json', folder)
        doc = json.loads(r.out)
        if r.rc not in want or doc['exit'] != r.rc:
            errs.append('ckpt scan exited %d (want %s), files %s' % (
                r.rc, want, [(f['file'], f['verdict']) for f in doc['files']]))
        print('   %s: %s ran it (%s); ckpt scan exit %d' % (name, who, how, r.rc))
        return errs
    t.run(name, run)


check('DeepSpeed rank file in protocol 0', os.path.join(OUT, 'ds_protocol0'), deepspeed_load)
check('DeepSpeed rank file, legacy stream of protocol 1', os.path.join(OUT, 'ds_protocol1'),
      deepspeed_load)
check('DeepSpeed rank file beginning like safetensors', os.path.join(OUT, 'ds_polyglot'),
      deepspeed_load)
check('Hugging Face snapshot of links into ../../blobs',
      os.path.join(OUT, 'hf_snapshot', 'snapshots', 'a1b2c3'), snapshot_load)
check('DCP data file named README.md (protocol 0)', os.path.join(OUT, 'dcp_readme'), dcp_load)
check('DCP .metadata naming ../outside.distcp', os.path.join(OUT, 'dcp_escape'), dcp_load)
check('DCP .metadata naming an absolute path', os.path.join(OUT, 'dcp_absolute'), dcp_load)
check('shard index naming ../outside.bin', os.path.join(OUT, 'hf_index_escape'), index_load)

sys.exit(t.summary())
