#!/usr/bin/python3
"""Benchmark `ckpt strip-module`, `remap` and `rename` against `cp` and torch (issue 3).

The requirement: on a generated 2 GiB DataParallel checkpoint and on a 5 GiB
one (zip64), `ckpt strip-module` takes at most 1.5x the wall time of `cp` of
the same file, measured in the same run, and is at least 10x faster than
`torch.load` + `consume_prefix_in_state_dict_if_present` + `torch.save`; its
peak RSS stays under 64 MiB whatever the checkpoint size.  `remap` and
`rename` the same.  This script

  1. creates (once; reused while present) one checkpoint per size with
     torch.save in the work directory: a DataParallel-style state dict
     (`module.` keys, the ResNet-50 + transformer mix of bench_inspect.py,
     BN buffers, `_metadata`) whose storages are tagged `cuda:0`, as a save
     on a GPU tags them (through torch.serialization.register_package, as
     tests/fixtures/make_fixtures.py does), so that `remap --to cpu` has
     work to do; it checks the zip64 end records of the files past 4 GiB;
  2. runs each command once, not timed, and verifies the outputs with
     torch.load(weights_only=True): stripped keys and _metadata, every
     tensor equal to the input's, and for remap, loadable with no
     map_location onto the CPU;
  3. times whole processes, round-robin, page cache warm and no dirty pages
     left over from the previous run (each output is removed and the
     filesystem synced before the next run), output next to the input:
       cp IN OUT                                   (the baseline)
       cp IN OUT && sync OUT                       (informative: cp + fsync)
       ckpt strip-module IN OUT
       ckpt remap --to cpu IN OUT
       ckpt rename -e 's/^module\\.//' IN OUT
       python3 -c 'torch.load(IN, map_location="cpu");
                   consume_prefix_in_state_dict_if_present(sd, "module.");
                   torch.save(sd, OUT)'
     and, for torch, the load + consume + save part alone (timed by the
     child), which is the kindest comparison for torch;
  4. measures the peak RSS of every run through GNU time (wait4 ru_maxrss);
  5. prints a table with the ratios ckpt/cp and torch/ckpt, and replaces the
     section "## ckpt strip-module, remap, rename (issue 3)" of
     bench/RESULTS.md.

Run with the Python that has torch (here /usr/bin/python3):

    /usr/bin/python3 bench/bench_rewrite.py [--sizes 2,5] [--runs 3]
        [--ckpt ./ckpt] [--workdir bench/out] [--results bench/RESULTS.md]

This process never imports torch itself (children generate, load and
verify), so that its own memory stays small; see bench_inspect.py's
measure_rss() for why that matters.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_inspect as bi  # noqa: E402  (generator and machine description)

GENERATOR_VERSION = 1
SECTION = "## ckpt strip-module, remap, rename (issue 3)"
GNU_TIME = "/usr/bin/time"
TAG = "cuda:0"
RENAME_RULE = r"s/^module\.//"
MAX_RATIO_CP = 1.5
MIN_SPEEDUP_TORCH = 10.0
MAX_RSS_MIB = 64.0

TORCH_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
t1 = time.perf_counter()
rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t2 = time.perf_counter()
sd = torch.load(sys.argv[1], map_location='cpu')
t3 = time.perf_counter()
consume_prefix_in_state_dict_if_present(sd, 'module.')
t4 = time.perf_counter()
torch.save(sd, sys.argv[2])
t5 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t3 - t2, "consume_s": t4 - t3,
                  "save_s": t5 - t4, "call_s": t5 - t2, "keys": len(sd),
                  "maxrss_after_import_kib": rss_import,
                  "torch": torch.__version__}))
"""

VERIFY_CHILD = r"""
import json, re, sys
import torch
inp, checks = sys.argv[1], json.loads(sys.argv[2])
ref = torch.load(inp, map_location='cpu')
ref_meta = list(getattr(ref, '_metadata', {}).keys())
res = []

def strip_key(k):
    while k.startswith('module.'):
        k = k[len('module.'):]
    return k

def strip_meta(p):
    out = []
    for k in p:
        if k == '':
            continue
        k2 = k
        while k2 == 'module' or k2.startswith('module.'):
            k2 = '' if k2 == 'module' else k2[len('module.'):]
        out.append(k2)
    return out

for c in checks:
    kind, path = c['kind'], c['path']
    kw = {} if kind == 'remap' else {'map_location': 'cpu'}
    errs = []
    try:
        out = torch.load(path, weights_only=True, **kw)
    except Exception as e:
        msg = ["torch.load(weights_only=True) failed: %s" % str(e).split('error: ')[-1]]
        try:
            torch.load(path, map_location='cpu')
            msg.append("a plain torch.load(map_location='cpu') loads it")
        except Exception as e2:
            msg.append("a plain torch.load(map_location='cpu') fails too: %s"
                       % str(e2).splitlines()[-1])
        res.append({"kind": kind, "ok": False, "errors": msg})
        continue
    if kind == 'remap':
        exp_keys = list(ref.keys())
        exp_meta = ref_meta
    elif kind == 'rename':
        exp_keys = [re.sub(r'^module\.', '', k, count=1) for k in ref.keys()]
        exp_meta = None   # compared as a set below
    else:
        exp_keys = [strip_key(k) for k in ref.keys()]
        exp_meta = strip_meta(ref_meta)
    if list(out.keys()) != exp_keys:
        errs.append("keys differ (first: %r vs %r)" % (list(out.keys())[:2], exp_keys[:2]))
    meta = list(getattr(out, '_metadata', {}).keys())
    if exp_meta is not None and meta != exp_meta:
        errs.append("_metadata keys differ")
    if exp_meta is None:
        want = {re.sub(r'^module\.', '', p + '.', count=1)[:-1] for p in ref_meta}
        if set(meta) != want:
            errs.append("_metadata key set differs")
    n_eq = 0
    devices = set()
    for k_ref, k_out in zip(ref.keys(), exp_keys):
        a, b = ref[k_ref], out.get(k_out)
        if b is None:
            continue
        devices.add(str(b.device))
        if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b):
            n_eq += 1
    if n_eq != len(ref):
        errs.append("%d of %d tensors equal" % (n_eq, len(ref)))
    if devices != {'cpu'}:
        errs.append("devices %s" % sorted(devices))
    res.append({"kind": kind, "ok": not errs, "errors": errs, "keys": len(out),
                "tensors_equal": n_eq, "meta_entries": len(meta),
                "devices": sorted(devices),
                "map_location": kw.get('map_location')})
    del out
print(json.dumps({"ref_keys": len(ref), "cuda_available": torch.cuda.is_available(),
                  "checks": res}))
"""


# --------------------------------------------------------------------------
# checkpoint generation (runs in a child that imports torch)

def generate(path, size_gib, seed=0):
    import torch
    tagging = [True]

    def tagger(storage):
        return TAG if tagging[0] and storage.data_ptr() != 0 else None

    def deserializer(storage, location):
        return None     # loading never goes through this package
    torch.serialization.register_package(0, tagger, deserializer)

    gen = torch.Generator().manual_seed(seed)
    spec = bi.model_spec(int(size_gib * (1 << 30)))
    sd = bi.build_state_dict(torch, spec, gen)
    tmp = path + ".tmp"
    t0 = time.perf_counter()
    torch.save(sd, tmp)
    tagging[0] = False
    os.replace(tmp, path)
    nbytes = [t.numel() * t.element_size() for t in sd.values()]
    meta = {"generator_version": GENERATOR_VERSION, "layout": "dp_state_dict",
            "size_gib": size_gib, "tag": TAG, "tensors": len(sd),
            "tensor_bytes": sum(nbytes), "largest_tensor_bytes": max(nbytes),
            "tensors_over_1mib": sum(1 for n in nbytes if n > (1 << 20)),
            "file_bytes": os.path.getsize(path), "torch": torch.__version__,
            "save_s": round(time.perf_counter() - t0, 2)}
    with open(path + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    return meta


# --------------------------------------------------------------------------
# checks on the files (no torch here)

def zip_layout(path):
    """Records, largest local header offset, and whether zip64 end records are there."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = min(size, (1 << 16) + 22 + 20 + 56)
        f.seek(size - n)
        tail = f.read(n)
        e = tail.rfind(b"PK\x05\x06")
        if e < 0:
            raise ValueError("%s: no end of central directory" % path)
        cd_off32 = struct.unpack("<I", tail[e + 16:e + 20])[0]
        loc = e - 20
        z64 = False
        if loc >= 0 and tail[loc:loc + 4] == b"PK\x06\x07":
            z64_off = struct.unpack("<Q", tail[loc + 8:loc + 16])[0]
            f.seek(z64_off)
            z64 = f.read(4) == b"PK\x06\x06"
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        max_off = max(i.header_offset for i in infos)
        pkl = [i.file_size for i in infos if i.filename.endswith("/data.pkl")]
    return {"records": len(infos), "max_header_offset": max_off,
            "zip64_end": z64, "cd_offset32": cd_off32,
            "needs_zip64": size > 0xFFFFFFFF, "pickle_bytes": pkl[0] if pkl else 0}


class _Stub:
    """What the restricted unpickler below builds for anything but a tensor."""
    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        pass


def _pickle_tensors(z, prefix):
    """(name, storage key) of each tensor of a state dict pickle, without torch."""
    import collections
    import io
    import pickle

    class U(pickle.Unpickler):
        def find_class(self, mod, name):
            if mod == "torch._utils" and name.startswith("_rebuild_tensor"):
                return lambda storage, *a: ("tensor", storage)
            if mod == "collections" and name == "OrderedDict":
                return collections.OrderedDict
            if mod == "torch":
                return name
            return _Stub

        def persistent_load(self, pid):
            return pid
    obj = U(io.BytesIO(z.read(prefix + "/data.pkl"))).load()
    return [(k, v[1][2]) for k, v in obj.items()
            if isinstance(v, tuple) and v and v[0] == "tensor"]


def storage_refs(inp, out):
    """Tensors of OUT whose storage record differs (CRC-32, size) from IN's.

    Reads only the pickles and the central directories, so it runs whatever
    torch makes of the file; it tells a wrong storage reference in the new
    pickle from a wrong copy of the bytes.
    """
    res = {}
    for role, path in (("in", inp), ("out", out)):
        z = zipfile.ZipFile(path)
        prefix = z.namelist()[0].split("/")[0]
        recs = {i.filename[len(prefix) + 6:]: (i.CRC, i.file_size)
                for i in z.infolist() if i.filename.startswith(prefix + "/data/")}
        res[role] = (_pickle_tensors(z, prefix), recs)
    (ti, ri), (to, ro) = res["in"], res["out"]
    wrong = [(ki, si, so) for (ki, si), (ko, so) in zip(ti, to) if ri[si] != ro.get(so)]
    return {"tensors": len(ti), "wrong": len(wrong), "examples": wrong[:3],
            "records_same": sorted(ri.values()) == sorted(ro.values())}


def ckpt_json(ckpt, path):
    r = subprocess.run([ckpt, "inspect", "--json", path], stdout=subprocess.PIPE,
                       check=True)
    return json.loads(r.stdout)


def warm(path):
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def drop(path):
    """PATH's pages out of the page cache (written back first): a cold run."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(path):
    """Bytes of PATH in the page cache (fincore), or None."""
    try:
        r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                           capture_output=True, text=True, check=True)
        return int(r.stdout.split()[0])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def rm(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------
# measurement

def run_timed(argv, tmpdir, capture=False):
    """Run argv under GNU time; return (wall s, peak RSS KiB, stdout or None).

    Wall time is from spawn to reap of the GNU time process (which adds a
    fork and an exec, about 1 ms); peak RSS is the ru_maxrss that GNU time
    gets from wait4 for the command (it forks from its own ~1 MiB address
    space, so the number is the command's own, not this Python's).
    """
    fd, rssf = tempfile.mkstemp(dir=tmpdir, suffix=".rss")
    os.close(fd)
    full = [GNU_TIME, "-f", "%M", "-o", rssf] + argv if HAVE_GNU_TIME else argv
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    t0 = time.perf_counter()
    p = subprocess.Popen(full, stdout=out)
    data = p.stdout.read() if capture else None
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if capture:
        p.stdout.close()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        sys.exit("bench: %s exited with %d" % (" ".join(argv), rc))
    if HAVE_GNU_TIME:
        with open(rssf) as f:
            rss = int(f.read().strip().splitlines()[-1])
    else:
        rss = ru.ru_maxrss
    os.unlink(rssf)
    return wall, rss, data


HAVE_GNU_TIME = os.access(GNU_TIME, os.X_OK)


SYNC_CALLS = ("fsync", "fdatasync", "sync_file_range")


def strace_summary(argv, tmpdir, out_path):
    """What syscalls move the bytes: calls, bytes and time (strace -T) of each.

    Per thread too: ckpt's second thread (the CRC reader) shows as "thread 2".
    """
    if not shutil.which("strace"):
        return None
    log = os.path.join(tmpdir, "strace.log")
    t0 = time.perf_counter()
    subprocess.run(["strace", "-f", "-T", "-o", log, "-e",
                    "trace=copy_file_range,ioctl,read,pread64,write,pwrite64,"
                    "sendfile,splice,fsync,fdatasync,sync_file_range"] + argv,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    rm(out_path)
    os.sync()
    calls = {}
    clone = None
    tids = []
    pat = re.compile(r"^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
    # with -f, a call that another thread interrupts is split in two lines:
    # "NAME(args <unfinished ...>" and "<... NAME resumed>rest) = RET <T>"
    resumed = re.compile(r"^(\d+)\s+<\.\.\. (\w+) resumed>(.*)\)\s+=\s+(-?\d+)")
    dur = re.compile(r"<(\d+\.\d+)>\s*$")
    with open(log) as f:
        for line in f:
            m = pat.match(line) or resumed.match(line)
            if not m:
                continue
            tid, name, args, ret = m.group(1), m.group(2), m.group(3), int(m.group(4))
            if tid not in tids:
                tids.append(tid)
            d = dur.search(line)
            secs = float(d.group(1)) if d else 0.0
            if name == "ioctl":
                if "CLONE" in args:
                    clone = "succeeded" if ret == 0 else \
                        "failed (%s)" % line.split(") = ", 1)[-1].rsplit(" <", 1)[0]
                continue
            thread = "main" if tid == tids[0] else "thread %d" % (tids.index(tid) + 1)
            c = calls.setdefault((thread, name), [0, 0, 0.0])
            c[0] += 1
            c[2] += secs
            if ret > 0 and name not in SYNC_CALLS:
                c[1] += ret
    os.unlink(log)
    return {"calls": calls, "clone": clone, "wall": wall}


def fmt_calls(s):
    if not s:
        return "strace not available"
    parts = []
    if s["clone"]:
        parts.append("ioctl(FICLONE) %s" % s["clone"])
    order = ("copy_file_range", "sendfile", "splice", "read", "pread64", "write",
             "pwrite64", "sync_file_range", "fsync", "fdatasync")
    for (thread, name), (n, b, secs) in sorted(
            s["calls"].items(), key=lambda kv: (kv[0][0] != "main", kv[0][0],
                                                order.index(kv[0][1]))):
        if b < (1 << 20) and secs < 0.05 and name not in SYNC_CALLS:
            continue            # headers, the pickle, library loading
        who = "" if thread == "main" else " [%s]" % thread
        if name in SYNC_CALLS:
            parts.append("%d %s %.2f s%s" % (n, name, secs, who))
        else:
            parts.append("%d %s, %s, %.2f s%s" % (n, name, human(b), secs, who))
    return "%s (traced run: %.2f s)" % (", ".join(parts), s["wall"])


def human(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return "%.2f %s" % (n / (1 << k), unit)
    return "%d B" % n


# --------------------------------------------------------------------------

def ensure_input(a, size):
    tag = ("%g" % size).replace(".", "_")
    path = os.path.join(os.path.abspath(a.workdir), "rewrite_dp_%sgib.pth" % tag)
    meta = None
    if os.path.exists(path) and os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            meta = json.load(f)
        if meta.get("generator_version") != GENERATOR_VERSION or \
                meta.get("file_bytes") != os.path.getsize(path):
            meta = None
    if meta is not None:
        print("reusing %s" % path, flush=True)
        return path, meta
    free = shutil.disk_usage(a.workdir).free
    need = int(size * (1 << 30) * 1.1)
    if free < need:
        sys.exit("bench: %d MiB free in %s, need ~%d MiB to generate"
                 % (free >> 20, a.workdir, need >> 20))
    print("generating %s (%g GiB, tags %s) ..." % (path, size, TAG), flush=True)
    t0 = time.perf_counter()
    r = subprocess.run([a.python, os.path.abspath(__file__), "--generate", path,
                        "--size-gib", str(size)], stdout=subprocess.PIPE, check=True)
    meta = json.loads(r.stdout.decode().strip().splitlines()[-1])
    print("  done in %.1f s" % (time.perf_counter() - t0), flush=True)
    return path, meta


def commands(a, ckpt, inp, out):
    torch_argv = [a.python, "-c", TORCH_CHILD, inp, out]
    return [
        ("cp", ["cp", inp, out], "base"),
        ("cp + sync OUT", ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", inp, out],
         "info"),
        ("ckpt strip-module", [ckpt, "strip-module", inp, out], "ckpt"),
        ("ckpt remap --to cpu", [ckpt, "remap", "--to", "cpu", inp, out], "ckpt"),
        ("ckpt rename -e '%s'" % RENAME_RULE, [ckpt, "rename", "-e", RENAME_RULE, inp,
                                               out], "ckpt"),
        ("torch load+consume+save", torch_argv, "torch"),
    ]


def verify(a, ckpt, inp, workdir, size):
    """Write each ckpt output once (not timed) and check it with torch."""
    stem = os.path.join(workdir, "rewrite_verify_")
    kinds = [("strip", [ckpt, "strip-module", "--quiet"]),
             ("remap", [ckpt, "remap", "--quiet", "--to", "cpu"]),
             ("rename", [ckpt, "rename", "--quiet", "-e", RENAME_RULE])]
    free = shutil.disk_usage(workdir).free
    together = free > size * 3.3
    groups = [kinds] if together else [[k] for k in kinds]
    results, layouts = [], {}
    for g in groups:
        checks = []
        for kind, argv in g:
            out = stem + kind + ".pth"
            subprocess.run(argv + [inp, out], check=True)
            layouts[kind] = (zip_layout(out), storage_refs(inp, out))
            checks.append({"kind": kind, "path": out})
        r = subprocess.run([a.python, "-c", VERIFY_CHILD, inp, json.dumps(checks)],
                           stdout=subprocess.PIPE, check=True)
        doc = json.loads(r.stdout.decode().strip().splitlines()[-1])
        for c in doc["checks"]:
            c["zip"], c["refs"] = layouts[c["kind"]]
            results.append(c)
        for c in checks:
            rm(c["path"])
        os.sync()
    return results, doc["cuda_available"]


def bench_size(a, ckpt, size, tmpdir):
    inp, meta = ensure_input(a, size)
    workdir = os.path.dirname(inp)
    out = os.path.join(workdir, "rewrite_out.pth")
    rm(out)
    zl = zip_layout(inp)
    if zl["needs_zip64"] and not zl["zip64_end"]:
        sys.exit("bench: %s is past 4 GiB but has no zip64 end records" % inp)
    warm(inp)
    doc = ckpt_json(ckpt, inp)
    if doc["summary"]["tensors"] != meta["tensors"]:
        sys.exit("bench: ckpt counts %s tensors in %s, torch.save wrote %s"
                 % (doc["summary"]["tensors"], inp, meta["tensors"]))
    tags = sorted(doc["summary"].get("by_device", {}))

    print("verifying the ckpt outputs on %s ..." % os.path.basename(inp), flush=True)
    checks, cuda = ([], None) if a.no_verify else verify(a, ckpt, inp, workdir, size)
    for c in checks:
        print("  %s: %s" % (c["kind"], "ok" if c["ok"] else "FAILED: %s" % c["errors"]))

    cmds = commands(a, ckpt, inp, out)
    res = {name: {"walls": [], "rss": [], "kind": kind, "argv": argv, "child": []}
           for name, argv, kind in cmds}
    fast = [c for c in cmds if c[2] != "torch"]
    slow = [c for c in cmds if c[2] == "torch"]
    for r in range(a.runs + 1):            # round 0 is the warm-up, not counted
        # rotate the order of the fast commands from round to round, so that
        # none is always the one that runs right after torch; torch comes last
        k = r % len(fast)
        for name, argv, kind in fast[k:] + fast[:k] + slow:
            warm(inp)
            os.sync()
            wall, rss, data = run_timed(argv, tmpdir, capture=(kind == "torch"))
            rm(out)
            os.sync()
            print("  %s %-32s %7.2f s %9.1f MiB%s" % (
                "warm-up" if r == 0 else "run %d  " % r, name, wall, rss / 1024.0,
                "" if kind != "torch" else "  (call %.2f s)" % json.loads(
                    data.decode().strip().splitlines()[-1])["call_s"]), flush=True)
            if r == 0:
                continue
            res[name]["walls"].append(wall)
            res[name]["rss"].append(rss)
            if kind == "torch":
                res[name]["child"].append(json.loads(data.decode().strip().splitlines()[-1]))

    # how the bytes move (one traced run each, not timed)
    warm(inp)
    os.sync()
    st_cp = strace_summary(["cp", inp, out], tmpdir, out)
    st_ck = strace_summary([ckpt, "strip-module", "--quiet", inp, out], tmpdir, out)
    return {"size": size, "path": inp, "meta": meta, "zip": zl, "tags": tags,
            "checks": checks, "cuda_available": cuda, "res": res,
            "strace": {"cp": st_cp, "ckpt": st_ck}}


def evaluate(s):
    res = s["res"]
    cp = statistics.median(res["cp"]["walls"])
    tr = res["torch load+consume+save"]["child"]
    torch_call = statistics.median(c["call_s"] for c in tr)
    rows, verdicts = [], []
    for name, r in res.items():
        med = statistics.median(r["walls"])
        row = {"name": name, "kind": r["kind"], "median": med, "min": min(r["walls"]),
               "rss_mib": max(r["rss"]) / 1024.0, "vs_cp": med / cp,
               "speedup": None}
        if r["kind"] in ("ckpt", "base", "info"):
            row["speedup"] = torch_call / med
        rows.append(row)
        if r["kind"] == "torch":
            rows.append({"name": "torch: load+consume+save alone (in the child)",
                         "kind": "torch_call", "median": torch_call,
                         "min": min(c["call_s"] for c in tr),
                         "rss_mib": max(r["rss"]) / 1024.0,
                         "vs_cp": torch_call / cp, "speedup": 1.0})
        if r["kind"] == "ckpt":
            ok = {c["kind"]: c["ok"] for c in s["checks"]}
            key = name.split()[1].replace("strip-module", "strip")
            verdicts.append({
                "name": name,
                "time": med / cp <= MAX_RATIO_CP,
                "torch": torch_call / med >= MIN_SPEEDUP_TORCH,
                "rss": max(r["rss"]) / 1024.0 < MAX_RSS_MIB,
                "verified": ok.get(key),
                "ratio": med / cp, "speedup": torch_call / med,
                "rss_mib": max(r["rss"]) / 1024.0,
                "round_ratios": [w / c for w, c in zip(r["walls"],
                                                       res["cp"]["walls"])]})
    return rows, verdicts, cp, torch_call


def pf(b):
    return "PASS" if b else "FAIL"


def env_notes():
    """Things of the machine that make timings of big writes vary."""
    notes = []
    try:
        for d in os.listdir("/sys/bus/virtio/drivers/virtio_balloon"):
            f = os.path.join("/sys/bus/virtio/drivers/virtio_balloon", d, "features")
            if os.path.exists(f):
                bits = open(f).read().strip()
                if len(bits) > 5 and bits[5] == "1":
                    notes.append("virtio-balloon free page reporting on (freed guest "
                                 "memory goes back to the host)")
                break
    except OSError:
        pass
    base = "/sys/kernel/mm/damon/admin/kdamonds"
    try:
        for k in os.listdir(base):
            st = os.path.join(base, k, "state")
            if os.path.exists(st) and open(st).read().strip() == "on":
                acts = set()
                cdir = os.path.join(base, k, "contexts")
                for root, dirs, files in os.walk(cdir):
                    if "action" in files:
                        acts.add(open(os.path.join(root, "action")).read().strip())
                notes.append("DAMON kdamond running (%s): cold page cache is reclaimed "
                             "in the background" % ", ".join(sorted(acts)))
    except OSError:
        pass
    return notes


def report(a, ckpt, sizes, rev):
    mi = bi.machine_info()
    ckver = subprocess.run([ckpt, "--version"], capture_output=True,
                           text=True).stdout.strip().splitlines()
    ckver = ckver[0] if ckver else "unknown"
    fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T",
                         os.path.abspath(a.workdir)], capture_output=True,
                        text=True).stdout.strip() or "unknown"
    cpver = subprocess.run(["cp", "--version"], capture_output=True,
                           text=True).stdout.splitlines()[0]
    torch_ver = sizes[0]["res"]["torch load+consume+save"]["child"][0]["torch"]
    cmd = "/usr/bin/python3 bench/bench_rewrite.py --sizes %s --runs %d" % (
        ",".join("%g" % s["size"] for s in sizes), a.runs)

    out = [SECTION, ""]
    out.append("Requirement: on a generated 2 GiB DataParallel checkpoint and on a 5 GiB "
               "one (zip64), `ckpt strip-module` wall time within %gx of `cp` of the "
               "same file, measured in the same run, and at least %gx faster than "
               "`torch.load` + `consume_prefix_in_state_dict_if_present` + "
               "`torch.save`; peak RSS under %g MiB whatever the checkpoint size. "
               "`remap` and `rename` the same."
               % (MAX_RATIO_CP, MIN_SPEEDUP_TORCH, MAX_RSS_MIB))
    out.append("")
    out.append("- Date: %s" % datetime.datetime.now().astimezone().strftime(
        "%Y-%m-%d %H:%M %Z"))
    out.append("- Machine: %s, %s cores, %s RAM; %s (kernel %s)"
               % (mi["cpu"], mi["cores"], mi["ram"], mi["os"], mi["kernel"]))
    out.append("- Software: %s (git %s); %s; Python %s, torch %s"
               % (ckver, rev, cpver, mi["python"], torch_ver))
    out.append("- Filesystem: inputs and outputs in `bench/out/`, on %s"
               % " ".join(fs.split()))
    notes = env_notes()
    if notes:
        out.append("- Memory: %s. Hence the input is read again before every run, "
                   "and the spread of the times." % "; ".join(notes))
    for s in sizes:
        m, z = s["meta"], s["zip"]
        out.append("- File: `%s`, %d bytes (%.2f GiB), written by torch.save (torch %s) "
                   "with storages tagged `%s`: DataParallel state dict, %d tensors "
                   "(%d over 1 MiB, largest %s), `_metadata`, %d zip records, pickle "
                   "%d bytes; %s"
                   % (os.path.basename(s["path"]), m["file_bytes"],
                      m["file_bytes"] / (1 << 30), m["torch"], m["tag"], m["tensors"],
                      m["tensors_over_1mib"], human(m["largest_tensor_bytes"]),
                      z["records"], z["pickle_bytes"],
                      ("zip64: end record and locator present, last local header at "
                       "offset %d (> 4 GiB)" % z["max_header_offset"]) if
                      z["needs_zip64"] and z["zip64_end"] else
                      ("zip64 end record %s (not needed: under 4 GiB)"
                       % ("present" if z["zip64_end"] else "absent"))))
    out.append("- Method: each command is a whole process, run once as a warm-up and "
               "then %d times, round-robin over the commands (median of %d reported; the "
               "order of the five fast commands rotates from round to round, torch "
               "runs last). "
               "Before every run the input is read through once (page cache warm) and "
               "the filesystem is synced; after it the output is removed and the "
               "filesystem synced again, so that no run pays for the writeback of "
               "another. OUT is `bench/out/rewrite_out.pth`, on the same filesystem "
               "as IN, for every command. Wall time is from spawn to reap; peak RSS "
               "is the largest ru_maxrss of the timed runs, %s. The torch line is "
               "timed twice: the whole process (python, `import torch`, load, "
               "consume, save) and the load+consume+save part alone as timed inside "
               "the child; the speed-up uses the latter, the number kindest to torch."
               % (a.runs, a.runs, "through GNU time (wait4)" if HAVE_GNU_TIME else
                  "from this process's wait4 (upper bound: no GNU time)"))
    out.append("- Command: `%s`" % cmd)
    out.append("")
    out.append("| tool | size | median s | min s | peak RSS MiB | ratio vs cp "
               "(≤ %g) | speed-up vs torch (≥ %g) |" % (MAX_RATIO_CP, MIN_SPEEDUP_TORCH))
    out.append("|---|---|---:|---:|---:|---:|---:|")
    allv = []
    for s in sizes:
        rows, verdicts, cp, torch_call = evaluate(s)
        s["verdicts"] = verdicts
        allv += [(s, v) for v in verdicts]
        for r in rows:
            name = r["name"]
            if r["kind"] == "info":
                name += " (informative: cp with ckpt's fsync)"
            if r["kind"] == "torch":
                name = "torch: whole process (python + import torch + load+consume+save)"
            out.append("| %s | %g GiB | %.2f | %.2f | %.1f | %.2f× | %s |"
                       % (name, s["size"], r["median"], r["min"], r["rss_mib"],
                          r["vs_cp"], "%.1f×" % r["speedup"] if r["speedup"] and
                          r["kind"] != "torch_call" else "—"))
    out.append("")
    out.append("Ratio vs cp = median of the line / median of `cp` (the requirement: "
               "≤ %g). Speed-up vs torch = median of torch's load+consume+save alone "
               "/ median of the line (the requirement: ≥ %g)."
               % (MAX_RATIO_CP, MIN_SPEEDUP_TORCH))
    out.append("")
    out.append("Requirements:")
    out.append("")
    out.append("| command | size | ≤ %gx cp | ≥ %gx torch | RSS < %g MiB | output "
               "verified | ckpt/cp, round by round |"
               % (MAX_RATIO_CP, MIN_SPEEDUP_TORCH, MAX_RSS_MIB))
    out.append("|---|---|---|---|---|---|---|")
    for s, v in allv:
        out.append("| %s | %g GiB | %s (%.2f×) | %s (%.1f×) | %s (%.1f MiB) | %s | %s |"
                   % (v["name"], s["size"], pf(v["time"]), v["ratio"], pf(v["torch"]),
                      v["speedup"], pf(v["rss"]), v["rss_mib"],
                      "not run" if v["verified"] is None else pf(v["verified"]),
                      " ".join("%.2f" % x for x in v["round_ratios"])))
    out.append("")
    fails = [(s, v) for s, v in allv if not (v["time"] and v["torch"] and v["rss"]
                                             and v["verified"] is not False)]
    if fails:
        out.append("Result: requirement NOT met: %s." % "; ".join(
            "%s at %g GiB (%s)" % (v["name"], s["size"], ", ".join(
                w for w, ok in (("%.2f× cp" % v["ratio"], v["time"]),
                                ("%.1f× torch" % v["speedup"], v["torch"]),
                                ("%.1f MiB" % v["rss_mib"], v["rss"]),
                                ("output fails its check", v["verified"] is not False))
                if not ok)) for s, v in fails))
    else:
        out.append("Result: requirement met for strip-module, remap and rename at "
                   "every size.")
    out.append("")
    out.append("Verification (each ckpt output written once, not timed, then loaded "
               "with `torch.load(OUT, weights_only=True)` next to "
               "`torch.load(IN, map_location='cpu')`):")
    out.append("")
    for s in sizes:
        for c in s["checks"]:
            what = {"strip": "strip-module", "remap": "remap --to cpu",
                    "rename": "rename"}[c["kind"]]
            rf = c.get("refs")
            refs = ""
            if rf:
                refs = ("; storage references (pickle + central directory, no torch): "
                        "%s of %d tensors point at a record whose CRC-32 and size "
                        "differ from the input's%s; the set of records is %s"
                        % (rf["wrong"], rf["tensors"],
                           " (e.g. %s)" % ", ".join(
                               "`%s`: storage '%s' in IN, '%s' in OUT" % e
                               for e in rf["examples"]) if rf["wrong"] else "",
                           "the same as IN's" if rf["records_same"] else "NOT the same"))
            if not c["ok"]:
                out.append("- %g GiB, %s: FAILED: %s%s" % (s["size"], what,
                                                            "; ".join(c["errors"]), refs))
                continue
            z = c["zip"]
            out.append("- %g GiB, %s: %d keys as expected, %d of %d tensors equal, "
                       "_metadata %d entries as expected; loaded with %s onto %s; "
                       "zip64 end records %s%s%s"
                       % (s["size"], what, c["keys"], c["tensors_equal"], c["keys"],
                          c["meta_entries"],
                          "no map_location" if c["map_location"] is None else
                          "map_location='cpu'", "/".join(c["devices"]),
                          "present" if z["zip64_end"] else "absent",
                          ", last local header at %d" % z["max_header_offset"]
                          if z["needs_zip64"] else "", refs))
        if s["checks"] and s["cuda_available"] is False:
            out.append("  (torch here has no CUDA: the input needs map_location, the "
                       "remap output does not)")
    out.append("")
    out.append("How the bytes move (one traced run each, `strace -f`, not timed):")
    out.append("")
    for s in sizes:
        out.append("- %g GiB: `cp`: %s. `ckpt strip-module`: %s."
                   % (s["size"], fmt_calls(s["strace"]["cp"]),
                      fmt_calls(s["strace"]["ckpt"])))
    out.append("")
    ctx = []
    for s in sizes:
        ch = s["res"]["torch load+consume+save"]["child"]
        ctx.append("%g GiB: load %.2f s, consume %.3f s, save %.2f s (medians), "
                   "`import torch` %.2f s"
                   % (s["size"], statistics.median(c["load_s"] for c in ch),
                      statistics.median(c["consume_s"] for c in ch),
                      statistics.median(c["save_s"] for c in ch),
                      statistics.median(c["import_s"] for c in ch)))
    ceil = []
    for s in sizes:
        _, _, cp, torch_call = evaluate(s)
        ceil.append("%.1f× at %g GiB" % (torch_call / cp, s["size"]))
    out.append("Context: torch's part splits as %s. Neither `cp` nor `torch.save` "
               "fsyncs; `ckpt` fsyncs its output before renaming it into place (the "
               "`cp + sync OUT` line shows what that costs `cp`). `cp` itself is faster "
               "than torch's load+consume+save by %s: that is the speed-up of a tool "
               "that writes the same bytes exactly as fast as `cp`."
               % ("; ".join(ctx), ", ".join(ceil)))
    return "\n".join(out) + "\n", allv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,5",
                    help="checkpoint sizes in GiB, comma-separated (default 2,5)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"))
    ap.add_argument("--workdir", default=os.path.join(HERE, "out"))
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch for the generator, torch and the checks")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the torch.load checks of the ckpt outputs")
    ap.add_argument("--no-results", action="store_true",
                    help="print only; leave RESULTS.md alone")
    ap.add_argument("--generate", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--size-gib", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.generate:
        print(json.dumps(generate(a.generate, a.size_gib)))
        return

    ckpt = os.path.abspath(a.ckpt)
    if not os.access(ckpt, os.X_OK):
        sys.exit("bench: %s is not an executable (make ckpt first)" % ckpt)
    os.makedirs(a.workdir, exist_ok=True)
    sizes = [float(x) for x in a.sizes.split(",") if x.strip()]
    # the numbers must come from one build: note the binary and the tree now,
    # and check at the end that the binary did not change during the run
    rev = bi.git_rev()
    digest = bi.file_digest(ckpt)
    tmpdir = tempfile.mkdtemp(prefix="bench_rewrite.")
    done = []
    try:
        for size in sizes:
            free = shutil.disk_usage(a.workdir).free
            print("== %g GiB (%d MiB free in %s)" % (size, free >> 20, a.workdir),
                  flush=True)
            done.append(bench_size(a, ckpt, size, tmpdir))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        rm(os.path.join(os.path.abspath(a.workdir), "rewrite_out.pth"))

    text, allv = report(a, ckpt, done, rev)
    print()
    print(text)
    if bi.file_digest(ckpt) != digest:
        sys.exit("bench: %s changed during the run (rebuilt?): the numbers mix two "
                 "builds; %s left alone" % (ckpt, a.results))
    if not a.no_results:
        bi.update_results(os.path.abspath(a.results), text, SECTION)
        print("updated %s" % a.results)


if __name__ == "__main__":
    main()
