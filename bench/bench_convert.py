#!/usr/bin/python3
"""Benchmark `ckpt convert` against torch + safetensors and `cp` (issue 4).

The requirement: pth -> safetensors on a 2 GiB checkpoint, against
`torch.load` + `safetensors.torch.save_file` and against `cp`, wall time and
peak RSS; the cast to bfloat16 against torch's.  The goal: within 2x of `cp`,
peak RSS bounded by the largest tensor.  This script

  1. reuses (or makes, as bench_rewrite.py does) bench_rewrite.py's
     DataParallel checkpoint `rewrite_dp_<size>gib.pth` (782 float32/int64
     tensors at 2 GiB, largest 125 MiB, storages tagged `cuda:0`, no shared
     storages, so that save_file accepts it);
  2. writes each ckpt output once, not timed, and checks it in a child with
     torch: safetensors.torch.load_file(OUT) has every tensor of
     torch.load(IN) bit-equal (dtype, shape, bytes); the bfloat16 outputs
     (pth through torch.load(weights_only=True), safetensors through
     load_file) have every floating tensor bit-equal to torch's .bfloat16()
     of the input's and the integers untouched;
  3. times whole processes, round-robin, page cache warm and no dirty pages
     left over from the previous run, output next to the input:
       cp IN OUT.pth                                      (the baseline)
       cp IN OUT.pth && sync OUT.pth                      (informative)
       ckpt convert IN OUT.safetensors
       ckpt convert --dtype bfloat16 IN OUT.pth
       ckpt convert --dtype bfloat16 IN OUT.safetensors
       python3 -c 'sd = torch.load(IN, map_location="cpu");
                   safetensors.torch.save_file(sd, OUT.safetensors)'
       python3 -c 'sd = torch.load(IN, map_location="cpu");
                   sd = {k: v.bfloat16() ...}; torch.save(sd, OUT.pth)'
     and, for torch, the load+save part alone (timed by the child), the
     kindest comparison for torch;
  4. measures the peak RSS of every run through GNU time (wait4 ru_maxrss),
     and the floor: `ckpt convert --dry-run`, which parses IN and writes
     nothing;
  5. traces one run of cp and of each ckpt command (strace -f, not timed):
     which syscalls move the bytes, and which anonymous mappings (the
     buffers malloc takes from mmap, and the brk heap) are live at the
     largest point, which says what the peak RSS is made of;
  6. prints a table (median, min, peak RSS, ratio vs cp, RSS above the
     largest tensor, speed-up vs torch), checks that the ckpt binary did not
     change during the run (SHA-256), and replaces the section
     "## ckpt convert (issue 4)" of bench/RESULTS.md.

Run with the Python that has torch and safetensors (here /usr/bin/python3):

    /usr/bin/python3 bench/bench_convert.py [--sizes 2] [--runs 5]
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
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_inspect as bi  # noqa: E402  (machine description, git revision)
import bench_rewrite as br  # noqa: E402  (the input, timing, strace, helpers)

SECTION = "## ckpt convert (issue 4)"
MAX_RATIO_CP = 2.0
# "bounded by the largest tensor": peak RSS at most the largest tensor's
# bytes plus this much (the process itself, the pickle, the parsed
# checkpoint, libraries: `ckpt convert --dry-run` takes about 7 MiB)
RSS_SLACK_MIB = 16.0

TORCH_ST_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
import safetensors, safetensors.torch
t1 = time.perf_counter()
rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t2 = time.perf_counter()
sd = torch.load(sys.argv[1], map_location='cpu')
t3 = time.perf_counter()
safetensors.torch.save_file(sd, sys.argv[2])
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t3 - t2, "save_s": t4 - t3,
                  "call_s": t4 - t2, "keys": len(sd),
                  "maxrss_after_import_kib": rss_import,
                  "torch": torch.__version__, "safetensors": safetensors.__version__}))
"""

# .bfloat16() on the floating tensors only: ckpt leaves integers alone (the
# int64 num_batches_tracked), and so the two write the same tensors
TORCH_BF16_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t2 = time.perf_counter()
sd = torch.load(sys.argv[1], map_location='cpu')
t3 = time.perf_counter()
dt = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else 'bfloat16')
sd = {k: v.to(dt) if v.is_floating_point() else v for k, v in sd.items()}
t4 = time.perf_counter()
torch.save(sd, sys.argv[2])
t5 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t3 - t2, "cast_s": t4 - t3,
                  "save_s": t5 - t4, "call_s": t5 - t2, "keys": len(sd),
                  "maxrss_after_import_kib": rss_import,
                  "torch": torch.__version__}))
"""

VERIFY_CHILD = r"""
import json, sys
import torch
import safetensors
from safetensors import safe_open
from safetensors.torch import load_file
inp, checks = sys.argv[1], json.loads(sys.argv[2])
ref = torch.load(inp, map_location='cpu')
ref_meta = list(getattr(ref, '_metadata', {}).keys())

def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)

res = []
for c in checks:
    kind, path, dtype = c['kind'], c['path'], c['dtype']
    errs, info = [], {}
    try:
        if path.endswith('.safetensors'):
            out = load_file(path)
            with safe_open(path, 'pt') as f:
                info['st_metadata'] = f.metadata()
            how = 'safetensors.torch.load_file'
        else:
            out = torch.load(path, weights_only=True, map_location='cpu')
            how = "torch.load(weights_only=True, map_location='cpu')"
            info['meta_same'] = list(getattr(out, '_metadata', {}).keys()) == ref_meta
            info['order_same'] = list(out.keys()) == list(ref.keys())
    except Exception as e:
        res.append({"kind": kind, "ok": False, "errors": ["loading failed: %s" % e]})
        continue
    if set(out.keys()) != set(ref.keys()):
        errs.append("keys differ: %d missing, %d extra"
                    % (len(set(ref) - set(out)), len(set(out) - set(ref))))
    n_eq = n_cast = n_kept = 0
    bad = []
    for k, a in ref.items():
        b = out.get(k)
        if b is None:
            continue
        if dtype and a.is_floating_point():
            exp = a.to(getattr(torch, dtype))
            n_cast += 1
        else:
            exp = a
            n_kept += 1
        if b.dtype == exp.dtype and b.shape == exp.shape and torch.equal(bits(b), bits(exp)):
            n_eq += 1
        elif len(bad) < 3:
            bad.append(k)
    if n_eq != len(ref):
        errs.append("%d of %d tensors bit-equal (first bad: %s)" % (n_eq, len(ref), bad))
    r = {"kind": kind, "ok": not errs, "errors": errs, "how": how, "keys": len(out),
         "tensors_equal": n_eq, "cast": n_cast, "kept": n_kept, "dtype": dtype,
         "torch": torch.__version__}
    r.update(info)
    res.append(r)
    del out
print(json.dumps({"ref_keys": len(ref), "torch": torch.__version__,
                  "safetensors": safetensors.__version__, "checks": res}))
"""


# --------------------------------------------------------------------------

def out_paths(workdir):
    stem = os.path.join(workdir, "convert_out")
    return stem + ".pth", stem + ".safetensors"


def commands(a, ckpt, inp, workdir):
    opth, ost = out_paths(workdir)
    return [
        ("cp", ["cp", inp, opth], "base", None),
        ("cp + sync OUT", ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", inp, opth],
         "info", None),
        ("ckpt convert → safetensors", [ckpt, "convert", inp, ost], "ckpt",
         "torch → safetensors"),
        ("ckpt convert --dtype bfloat16 → pth", [ckpt, "convert", "--dtype", "bfloat16",
                                                 inp, opth], "ckpt", "torch bfloat16 → pth"),
        ("ckpt convert --dtype bfloat16 → safetensors",
         [ckpt, "convert", "--dtype", "bfloat16", inp, ost], "ckpt", None),
        ("torch → safetensors", [a.python, "-c", TORCH_ST_CHILD, inp, ost], "torch", None),
        ("torch bfloat16 → pth", [a.python, "-c", TORCH_BF16_CHILD, inp, opth], "torch",
         None),
    ] + ([  # float8: torch 2.x only (--python2)
        ("ckpt convert --dtype float8_e4m3fn → pth",
         [ckpt, "convert", "--dtype", "float8_e4m3fn", inp, opth], "ckpt",
         "torch 2.x float8_e4m3fn → pth"),
        ("torch 2.x float8_e4m3fn → pth",
         [a.python2, "-c", TORCH_BF16_CHILD, inp, opth, "float8_e4m3fn"], "torch", None),
    ] if a.python2 else [])


VERIFY_KINDS = (
    ("safetensors", [], ".safetensors", None),
    ("bf16 pth", ["--dtype", "bfloat16"], ".pth", "bfloat16"),
    ("bf16 safetensors", ["--dtype", "bfloat16"], ".safetensors", "bfloat16"),
    ("f8 pth", ["--dtype", "float8_e4m3fn"], ".pth", "float8_e4m3fn"),  # under torch 2.x
)


def verify(a, ckpt, inp, workdir, size):
    """Write each ckpt output once (not timed) and check it with torch."""
    free = shutil.disk_usage(workdir).free
    together = free > size * (1 << 30) * 2.5
    kinds = [k for k in VERIFY_KINDS if not k[0].startswith("f8") or a.python2]
    groups = [kinds] if together else [[k] for k in kinds]
    results = []
    doc = {}
    for g in groups:
        checks = []
        for kind, opts, ext, dtype in g:
            out = os.path.join(workdir, "convert_verify_%s%s" % (kind.replace(" ", "_"), ext))
            subprocess.run([ckpt, "convert", "--quiet"] + opts + [inp, out], check=True)
            checks.append({"kind": kind, "path": out, "dtype": dtype,
                           "bytes": os.path.getsize(out)})
        # the float8 outputs are read by torch 2.x (1.13 has no float8)
        for py, part in ((a.python, [c for c in checks if not c["kind"].startswith("f8")]),
                         (a.python2, [c for c in checks if c["kind"].startswith("f8")])):
            if not part:
                continue
            r = subprocess.run([py, "-c", VERIFY_CHILD, inp, json.dumps(part)],
                               stdout=subprocess.PIPE, check=True)
            d = json.loads(r.stdout.decode().strip().splitlines()[-1])
            if py == a.python:
                doc = d
            for c, chk in zip(d["checks"], part):
                c["bytes"] = chk["bytes"]
                results.append(c)
        for c in checks:
            br.rm(c["path"])
        os.sync()
    return results, {"torch": doc.get("torch"), "safetensors": doc.get("safetensors")}


# --------------------------------------------------------------------------
# what the peak RSS is made of (strace of mmap/munmap/brk, not timed)

MAP_RE = re.compile(r"^(\d+)\s+mmap\(NULL, (\d+), ([A-Z_|]+), ([A-Z_|]+), -1, 0\)\s+=\s+"
                    r"(0x[0-9a-f]+)")
UNMAP_RE = re.compile(r"^(\d+)\s+munmap\((0x[0-9a-f]+), (\d+)\)\s+=\s+0")
REMAP_RE = re.compile(r"^(\d+)\s+mremap\((0x[0-9a-f]+), (\d+), (\d+), [^)]*\)\s+=\s+"
                      r"(0x[0-9a-f]+)")
BRK_RE = re.compile(r"^(\d+)\s+brk\((?:NULL|0x[0-9a-f]+)\)\s+=\s+(0x[0-9a-f]+)")


def mem_trace(argv, tmpdir, outs):
    """Anonymous memory over time: the largest live set of read-write
    anonymous mappings plus the brk heap, and what it held then.

    glibc serves allocations above its mmap threshold (128 KiB, rising to
    at most 32 MiB as such blocks are freed) with their own mmap, so a
    storage-sized buffer shows as one mapping of about its size.  Mappings
    with PROT_NONE or MAP_NORESERVE (thread arenas reserved, not used) are
    left out; the result is an upper bound of anonymous RSS, since a mapping
    counts in full from its mmap on.
    """
    if not shutil.which("strace"):
        return None
    log = os.path.join(tmpdir, "mem.log")
    subprocess.run(["strace", "-f", "-o", log, "-e", "trace=mmap,munmap,mremap,brk"] + argv,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    for o in outs:
        br.rm(o)
    os.sync()
    live = {}
    brk0 = brk = None
    best = (0, [], 0)
    with open(log) as f:
        for line in f:
            m = MAP_RE.match(line)
            r = REMAP_RE.match(line)
            if r:
                old = int(r.group(2), 16)
                if old in live:
                    del live[old]
                    live[int(r.group(5), 16)] = int(r.group(4))
            elif m:
                n, prot, flags, addr = int(m.group(2)), m.group(3), m.group(4), m.group(5)
                if "PROT_WRITE" in prot and "MAP_ANONYMOUS" in flags and \
                        "MAP_NORESERVE" not in flags:
                    live[int(addr, 16)] = n
            else:
                m = UNMAP_RE.match(line)
                if m:
                    start, n = int(m.group(2), 16), int(m.group(3))
                    for s in [s for s in live if start <= s < start + n]:
                        del live[s]
                    continue
                m = BRK_RE.match(line)
                if not m:
                    continue
                v = int(m.group(2), 16)
                if brk0 is None:
                    brk0 = v
                brk = v
            heap = (brk - brk0) if brk0 is not None else 0
            total = sum(live.values()) + heap
            if total > best[0]:
                best = (total, sorted(live.values(), reverse=True), heap)
    os.unlink(log)
    total, sizes, heap = best
    return {"peak": total, "maps": sizes, "heap": heap}


def fmt_mem(m):
    if not m:
        return "strace not available"
    big = [s for s in m["maps"] if s >= (1 << 20)]
    small = sum(s for s in m["maps"] if s < (1 << 20))
    parts = ["%s" % br.human(s) for s in big]
    if small:
        parts.append("%d smaller mappings, %s" % (len(m["maps"]) - len(big),
                                                 br.human(small)))
    parts.append("brk heap %s" % br.human(m["heap"]))
    return "%s at the largest point (%s)" % (br.human(m["peak"]), " + ".join(parts))


# --------------------------------------------------------------------------

def floor_rss(ckpt, inp, tmpdir, runs=3):
    """Peak RSS of `ckpt convert --dry-run`: parses IN, writes nothing."""
    vals = []
    for _ in range(runs):
        _, rss, _ = br.run_timed([ckpt, "convert", "--dry-run", "--dtype", "bfloat16", inp,
                                  os.path.join(tmpdir, "never.pth")], tmpdir)
        vals.append(rss)
    return statistics.median(vals)


def bench_size(a, ckpt, size, tmpdir):
    inp, meta = br.ensure_input(a, size)
    workdir = os.path.dirname(inp)
    opth, ost = out_paths(workdir)
    br.rm(opth)
    br.rm(ost)
    zl = br.zip_layout(inp)
    br.warm(inp)
    doc = br.ckpt_json(ckpt, inp)
    if doc["summary"]["tensors"] != meta["tensors"]:
        sys.exit("bench: ckpt counts %s tensors in %s, torch.save wrote %s"
                 % (doc["summary"]["tensors"], inp, meta["tensors"]))

    print("verifying the ckpt outputs on %s ..." % os.path.basename(inp), flush=True)
    checks, vers = ([], {}) if a.no_verify else verify(a, ckpt, inp, workdir, size)
    for c in checks:
        print("  %s: %s" % (c["kind"], "ok" if c["ok"] else "FAILED: %s" % c["errors"]),
              flush=True)

    floor = floor_rss(ckpt, inp, tmpdir)
    cmds = commands(a, ckpt, inp, workdir)
    res = {name: {"walls": [], "rss": [], "kind": kind, "argv": argv, "child": [],
                  "torch": tref}
           for name, argv, kind, tref in cmds}
    fast = [c for c in cmds if c[2] != "torch"]
    slow = [c for c in cmds if c[2] == "torch"]
    loads = []                             # 1-minute load average before each run
    for r in range(a.runs + 1):            # round 0 is the warm-up, not counted
        # rotate the fast commands from round to round, so that none is
        # always the one that runs right after torch; the torch ones last
        k = r % len(fast)
        j = r % len(slow)
        for name, argv, kind, _ in fast[k:] + fast[:k] + slow[j:] + slow[:j]:
            br.warm(inp)
            os.sync()
            if r:
                loads.append(os.getloadavg()[0])
            wall, rss, data = br.run_timed(argv, tmpdir, capture=(kind == "torch"))
            br.rm(opth)
            br.rm(ost)
            os.sync()
            child = json.loads(data.decode().strip().splitlines()[-1]) \
                if kind == "torch" else None
            print("  %s %-44s %7.2f s %9.1f MiB%s" % (
                "warm-up" if r == 0 else "run %d  " % r, name, wall, rss / 1024.0,
                "" if child is None else "  (call %.2f s)" % child["call_s"]), flush=True)
            if r == 0:
                continue
            res[name]["walls"].append(wall)
            res[name]["rss"].append(rss)
            if child is not None:
                res[name]["child"].append(child)

    # how the bytes move and what the memory holds (traced runs, not timed)
    traces = {}
    for name, argv, kind, _ in cmds:
        if kind not in ("base", "ckpt"):
            continue
        br.warm(inp)
        os.sync()
        out = argv[-1]
        st = br.strace_summary(argv, tmpdir, out)
        mem = mem_trace(argv, tmpdir, [out]) if kind == "ckpt" else None
        traces[name] = {"io": st, "mem": mem}
    return {"size": size, "path": inp, "meta": meta, "zip": zl, "checks": checks,
            "versions": vers, "res": res, "floor_kib": floor, "traces": traces,
            "loads": loads}


def evaluate(s):
    res = s["res"]
    cp = statistics.median(res["cp"]["walls"])
    largest = s["meta"]["largest_tensor_bytes"] / float(1 << 20)
    calls = {n: statistics.median(c["call_s"] for c in r["child"])
             for n, r in res.items() if r["kind"] == "torch"}
    ok = {c["kind"]: c["ok"] for c in s["checks"]}
    vkey = {"ckpt convert → safetensors": "safetensors",
            "ckpt convert --dtype bfloat16 → pth": "bf16 pth",
            "ckpt convert --dtype bfloat16 → safetensors": "bf16 safetensors",
            "ckpt convert --dtype float8_e4m3fn → pth": "f8 pth"}
    rows, verdicts = [], []
    for name, r in res.items():
        med = statistics.median(r["walls"])
        rss = max(r["rss"]) / 1024.0
        row = {"name": name, "kind": r["kind"], "median": med, "min": min(r["walls"]),
               "rss_mib": rss, "vs_cp": med / cp, "above": None, "speedup": None}
        if r["kind"] == "ckpt":
            row["above"] = rss - largest
            if r["torch"]:
                row["speedup"] = calls[r["torch"]] / med
        rows.append(row)
        if r["kind"] == "torch":
            ch = r["child"]
            rows.append({"name": name + ": load+save alone (in the child)",
                         "kind": "torch_call", "median": calls[name],
                         "min": min(c["call_s"] for c in ch), "rss_mib": rss,
                         "vs_cp": calls[name] / cp, "above": None, "speedup": None})
        if r["kind"] == "ckpt":
            verdicts.append({
                "name": name, "time": med / cp <= MAX_RATIO_CP,
                "rss": rss <= largest + RSS_SLACK_MIB, "rss_mib": rss,
                "above": rss - largest, "ratio": med / cp, "speedup": row["speedup"],
                "verified": ok.get(vkey[name]),
                "round_ratios": [w / c for w, c in zip(r["walls"], res["cp"]["walls"])]})
    return rows, verdicts, cp, largest, calls


def report(a, ckpt, sizes, rev, digest):
    mi = bi.machine_info()
    ckver = subprocess.run([ckpt, "--version"], capture_output=True,
                           text=True).stdout.strip().splitlines()
    ckver = ckver[0] if ckver else "unknown"
    fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T",
                         os.path.abspath(a.workdir)], capture_output=True,
                        text=True).stdout.strip() or "unknown"
    cpver = subprocess.run(["cp", "--version"], capture_output=True,
                           text=True).stdout.splitlines()[0]
    ch = sizes[0]["res"]["torch → safetensors"]["child"][0]
    cmd = "/usr/bin/python3 bench/bench_convert.py --sizes %s --runs %d" % (
        ",".join("%g" % s["size"] for s in sizes), a.runs)
    if ckpt != os.path.join(ROOT, "ckpt"):
        cmd += " --ckpt %s" % (os.path.relpath(ckpt, ROOT) if ckpt.startswith(ROOT + "/")
                               else ckpt)

    out = [SECTION, ""]
    out.append("Requirement: pth → safetensors on a 2 GiB checkpoint, against "
               "`torch.load` + `safetensors.torch.save_file` and against `cp`, wall time "
               "and peak RSS; the cast to bfloat16 against torch's. Goal: within %gx of "
               "`cp`, peak RSS bounded by the largest tensor (here: at most the largest "
               "tensor's bytes + %g MiB)." % (MAX_RATIO_CP, RSS_SLACK_MIB))
    out.append("")
    out.append("- Date: %s" % datetime.datetime.now().astimezone().strftime(
        "%Y-%m-%d %H:%M %Z"))
    out.append("- Machine: %s, %s cores, %s RAM; %s (kernel %s)"
               % (mi["cpu"], mi["cores"], mi["ram"], mi["os"], mi["kernel"]))
    out.append("- Software: %s (git %s, binary SHA-256 %s…); %s; Python %s, torch %s, "
               "safetensors %s" % (ckver, rev, digest[:16], cpver, mi["python"],
                                   ch["torch"], ch["safetensors"]))
    out.append("- Filesystem: inputs and outputs in `bench/out/`, on %s"
               % " ".join(fs.split()))
    notes = br.env_notes()
    if notes:
        out.append("- Memory: %s. Hence the input is read again before every run, "
                   "and the spread of the times." % "; ".join(notes))
    for s in sizes:
        m, z = s["meta"], s["zip"]
        out.append("- File: `%s` (bench_rewrite.py's), %d bytes (%.2f GiB), written by "
                   "torch.save (torch %s) with storages tagged `%s`: DataParallel state "
                   "dict, %d tensors (%d over 1 MiB, largest %s), no shared storages, "
                   "`_metadata`, %d zip records, pickle %d bytes"
                   % (os.path.basename(s["path"]), m["file_bytes"],
                      m["file_bytes"] / (1 << 30), m["torch"], m["tag"], m["tensors"],
                      m["tensors_over_1mib"], br.human(m["largest_tensor_bytes"]),
                      z["records"], z["pickle_bytes"]))
    out.append("- Method: each command is a whole process, run once as a warm-up and "
               "then %d times, round-robin over the commands (median of %d reported; the "
               "order of the five fast commands rotates from round to round, the two "
               "torch ones run last, alternating). Before every run the input is read "
               "through once (page cache warm) and the filesystem is synced; after it "
               "the output is removed and the filesystem synced again, so that no run "
               "pays for the writeback of another. OUT is `bench/out/convert_out.pth` "
               "or `.safetensors`, on the same filesystem as IN. Wall time is from spawn "
               "to reap; peak RSS is the largest ru_maxrss of the timed runs, %s. Each "
               "torch line is timed twice: the whole process (python, `import torch`, "
               "load, cast, save) and the load(+cast)+save part alone as timed inside "
               "the child; the speed-up uses the latter, the number kindest to torch. "
               "Torch's cast is `{k: v.bfloat16() if v.is_floating_point() else v}`: "
               "`ckpt --dtype` leaves integer tensors alone, so both write the same "
               "tensors."
               % (a.runs, a.runs, "through GNU time (wait4)" if br.HAVE_GNU_TIME else
                  "from this process's wait4 (upper bound: no GNU time)"))
    out.append("- Load: 1-minute load average before each timed run %s (the "
               "benchmark's own runs account for about 1; more means other processes "
               "on the machine, which add to the spread)"
               % "; ".join("%g GiB: median %.2f, max %.2f" % (
                   s["size"], statistics.median(s["loads"]), max(s["loads"]))
                   for s in sizes))
    out.append("- Command: `%s`" % cmd)
    out.append("")
    out.append("| tool | size | median s | min s | peak RSS MiB | ratio vs cp (≤ %g) "
               "| RSS − largest tensor MiB (≤ %g) | speed-up vs torch |"
               % (MAX_RATIO_CP, RSS_SLACK_MIB))
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    allv = []
    for s in sizes:
        rows, verdicts, cp, largest, calls = evaluate(s)
        allv += [(s, v) for v in verdicts]
        for r in rows:
            name = r["name"]
            if r["kind"] == "info":
                name += " (informative: cp with ckpt's fsync)"
            if r["kind"] == "torch":
                name += ": whole process (python + import torch + load+save)"
            out.append("| %s | %g GiB | %.2f | %.2f | %.1f | %.2f× | %s | %s |"
                       % (name, s["size"], r["median"], r["min"], r["rss_mib"],
                          r["vs_cp"], "%+.1f" % r["above"] if r["above"] is not None
                          else "—", "%.1f×" % r["speedup"] if r["speedup"] else "—"))
    out.append("")
    out.append("Ratio vs cp = median of the line / median of `cp` (goal ≤ %g). RSS − "
               "largest tensor = peak RSS − the largest tensor's bytes (%s; goal ≤ %g "
               "MiB: what `ckpt convert --dry-run`, which parses the file and writes "
               "nothing, takes is %s). Speed-up vs torch = median of the matching torch "
               "line's load+save alone / median of the line (pth → safetensors against "
               "`torch.load` + `save_file`, the cast to a pth against `torch.load` + "
               "`.bfloat16()` + `torch.save`; the cast to safetensors has no torch line)."
               % (MAX_RATIO_CP, ", ".join(br.human(s["meta"]["largest_tensor_bytes"])
                                          for s in sizes), RSS_SLACK_MIB,
                  ", ".join("%.1f MiB" % (s["floor_kib"] / 1024.0) for s in sizes)))
    out.append("")
    out.append("Goals:")
    out.append("")
    out.append("| command | size | ≤ %gx cp | RSS ≤ largest tensor + %g MiB | output "
               "verified | ckpt/cp, round by round |" % (MAX_RATIO_CP, RSS_SLACK_MIB))
    out.append("|---|---|---|---|---|---|")
    for s, v in allv:
        out.append("| %s | %g GiB | %s (%.2f×) | %s (%.1f MiB, %+.1f) | %s | %s |"
                   % (v["name"], s["size"], br.pf(v["time"]), v["ratio"], br.pf(v["rss"]),
                      v["rss_mib"], v["above"],
                      "not run" if v["verified"] is None else br.pf(v["verified"]),
                      " ".join("%.2f" % x for x in v["round_ratios"])))
    out.append("")
    fails = [(s, v) for s, v in allv if not (v["time"] and v["rss"]
                                             and v["verified"] is not False)]
    if fails:
        out.append("Result: goal NOT met: %s." % "; ".join(
            "%s at %g GiB (%s)" % (v["name"], s["size"], ", ".join(
                w for w, ok in (("%.2f× cp" % v["ratio"], v["time"]),
                                ("%.1f MiB RSS, %+.1f MiB over the largest tensor"
                                 % (v["rss_mib"], v["above"]), v["rss"]),
                                ("output fails its check", v["verified"] is not False))
                if not ok)) for s, v in fails))
    else:
        out.append("Result: goal met for every ckpt convert line.")
    out.append("")
    out.append("Verification (each ckpt output written once, not timed, and loaded next "
               "to `torch.load(IN, map_location='cpu')`; bit-equal = same dtype, shape "
               "and bytes):")
    out.append("")
    for s in sizes:
        for c in s["checks"]:
            if not c["ok"]:
                out.append("- %g GiB, %s: FAILED: %s" % (s["size"], c["kind"],
                                                         "; ".join(c["errors"])))
                continue
            extra = []
            if "st_metadata" in c:
                extra.append("__metadata__ %s" % json.dumps(c["st_metadata"]))
            if "meta_same" in c:
                extra.append("keys in the input's order: %s; _metadata kept: %s"
                             % ("yes" if c["order_same"] else "no",
                                "yes" if c["meta_same"] else "no"))
            if c["kind"] == "safetensors":
                what = "%d of %d tensors bit-equal to the input's" % (
                    c["tensors_equal"], c["keys"])
            else:
                what = ("%d of %d tensors bit-equal: %d floating ones to torch %s's "
                        ".to(%s) of the input's, %d integer ones unchanged"
                        % (c["tensors_equal"], c["keys"], c["cast"], c.get("torch", "?"),
                           c["dtype"], c["kept"]))
            out.append("- %g GiB, %s (%s, %d bytes): %s; %s"
                       % (s["size"], c["kind"], c["how"], c["bytes"], what,
                          "; ".join(extra)))
    out.append("")
    out.append("How the bytes move (one traced run each, `strace -f`, not timed):")
    out.append("")
    for s in sizes:
        for name, t in s["traces"].items():
            out.append("- %g GiB, `%s`: %s." % (s["size"], name, br.fmt_calls(t["io"])))
    out.append("")
    out.append("What the peak RSS is made of (one traced run each, `strace -f -e "
               "mmap,munmap,mremap,brk`: read-write anonymous mappings plus the brk "
               "heap, live at once, an upper bound of the anonymous RSS):")
    out.append("")
    for s in sizes:
        largest = s["meta"]["largest_tensor_bytes"]
        for name, t in s["traces"].items():
            m = t["mem"]
            if m is None:
                continue
            note = ""
            mp = m["maps"]
            # malloc's own mapping: the request plus a 16-byte header, in pages
            if len(mp) >= 2 and 0 <= mp[0] - largest <= 8192 and \
                    0 <= mp[1] - largest // 2 <= 8192:
                note = ("; the two large mappings are the largest storage read whole "
                        "(%s) and its cast copy (%s), live at once"
                        % (br.human(largest), br.human(largest // 2)))
            out.append("- %g GiB, `%s`: %s%s." % (s["size"], name, fmt_mem(m), note))
    out.append("")
    ctx = []
    for s in sizes:
        r = s["res"]
        a_ = r["torch → safetensors"]["child"]
        b_ = r["torch bfloat16 → pth"]["child"]
        ctx.append("%g GiB: torch → safetensors: load %.2f s, save_file %.2f s; torch "
                   "bfloat16 → pth: load %.2f s, cast %.2f s, save %.2f s (medians); "
                   "`import torch` %.2f s, %.0f MiB peak RSS before the load"
                   % (s["size"], statistics.median(c["load_s"] for c in a_),
                      statistics.median(c["save_s"] for c in a_),
                      statistics.median(c["load_s"] for c in b_),
                      statistics.median(c["cast_s"] for c in b_),
                      statistics.median(c["save_s"] for c in b_),
                      statistics.median(c["import_s"] for c in a_ + b_),
                      max(c["maxrss_after_import_kib"] for c in a_ + b_) / 1024.0))
    out.append("Context: %s. Neither `cp`, `torch.save` nor `save_file` fsyncs; `ckpt` "
               "fsyncs its output before renaming it into place (the `cp + sync OUT` "
               "line shows what that costs `cp`). The casts read the whole file and "
               "write half of it (float32 → bfloat16)." % "; ".join(ctx))
    return "\n".join(out) + "\n", allv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2",
                    help="checkpoint sizes in GiB, comma-separated (default 2)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"))
    ap.add_argument("--workdir", default=os.path.join(HERE, "out"))
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch and safetensors for the generator, torch "
                         "and the checks")
    ap.add_argument("--python2", default="/opt/ckpt/torch2/bin/python"
                    if os.path.exists("/opt/ckpt/torch2/bin/python") else "",
                    help="Python with torch 2.x, for the float8 cast lines ('' to skip them)")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the checks of the ckpt outputs")
    ap.add_argument("--no-results", action="store_true",
                    help="print only; leave RESULTS.md alone")
    a = ap.parse_args()

    ckpt = os.path.abspath(a.ckpt)
    if not os.access(ckpt, os.X_OK):
        sys.exit("bench: %s is not an executable (make ckpt first)" % ckpt)
    os.makedirs(a.workdir, exist_ok=True)
    sizes = [float(x) for x in a.sizes.split(",") if x.strip()]
    # the numbers must come from one build: note the binary and the tree now,
    # and check at the end that the binary did not change during the run
    rev = bi.git_rev()
    digest = bi.file_digest(ckpt)
    tmpdir = tempfile.mkdtemp(prefix="bench_convert.")
    done = []
    try:
        for size in sizes:
            free = shutil.disk_usage(a.workdir).free
            print("== %g GiB (%d MiB free in %s)" % (size, free >> 20, a.workdir),
                  flush=True)
            done.append(bench_size(a, ckpt, size, tmpdir))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        for p in out_paths(os.path.abspath(a.workdir)):
            br.rm(p)

    text, _ = report(a, ckpt, done, rev, digest)
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
