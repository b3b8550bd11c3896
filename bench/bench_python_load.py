#!/usr/bin/env python3
"""Benchmark the Python package's loader (issue 29): ckpt_toolkit.load against
torch.load(mmap=True, weights_only=True) and safetensors' load_file, and
ckpt_toolkit.safe_open + keys() against safetensors' safe_open + keys().

1. Load and read.  A ~2 GiB transformer-like state dict (float32 embedding,
   bfloat16 attention and lm_head, float16 MLP, float32 norms, biases and
   rotary buffers; about 250 tensors) is written once by a torch child with
   torch.save (zip) and, the same tensors, with safetensors' save_file.  Then,
   each in a fresh child process (so its peak memory is its own):

     ckpt        ckpt_toolkit.load(PTH)                    + touch
     ckpt        ckpt_toolkit.load(ST)                     + touch
     torch.load  torch.load(PTH, mmap=True, weights_only=True) + touch
     safetensors safetensors.torch.load_file(ST)           + touch

   "touch" reads every tensor once, the same code for every line: with
   --touch page (the default) one byte of every 4 KiB page of each tensor's
   bytes and its last byte (so every page is faulted in, and the time is the
   loader's, not a reduction's); with --touch sum every byte (a uint8 sum).
   The touched bytes are summed into a checksum, which must be the same for
   all four lines (same keys, same bytes).  The child times the load call and
   the touch with perf_counter, and reads its own /proc/self/status (VmHWM:
   peak RSS; RssAnon and RssFile before the load and after the touch) and
   getrusage's ru_maxrss.  Goals: ckpt faster than torch.load, within 1.2x of
   safetensors on the same bytes; RssAnon grown by under 10% of the tensor
   bytes read (mapped file pages do not count).

2. Open and list.  Files of 10,000 tensors, a small one (16-element tensors)
   and a large one (about 2 GiB), each as .pth and .safetensors; each child
   times `with safe_open(F, framework="pt") as f: list(f.keys())` (after
   `import torch` and the package's import, which are timed apart), and the
   same again in the same process.  Goal: under 50 ms whatever the size,
   beside safetensors' own safe_open + keys().

Every line is timed round-robin: one warm-up round, then --runs rounds, the
order rotating; medians (and minima) are reported.  Page cache: warm (each
file read through before each run); with --cold also cold, the file's pages
dropped before each run with posix_fadvise(POSIX_FADV_DONTNEED) (this
file's pages only, nothing else of the machine's cache; fincore checks it).

The package is imported from the source tree (python/ on PYTHONPATH) with
CKPT_TOOLKIT_NATIVE pointing at a folder of symlinks to this build's ckpt
and .libs/libckpt.so.0 (--native DIR to use another folder; --native ''
for an installed package).  This process imports neither torch nor the
package; children do.

    /opt/ckpt/torch2/bin/python bench/bench_python_load.py [--size-gib 2]
        [--runs 5] [--list-runs 7] [--touch page|sum] [--cold]
        [--workdir /var/tmp/ckpt_pybench] [--native DIR] [--clean]
        [--skip-load] [--skip-list] [--results bench/RESULTS.md] [--no-results]
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_inspect as bi  # noqa: E402  (machine description, git revision, RESULTS.md)
from bench_rewrite import drop, resident, warm  # noqa: E402  (the page cache, warm or cold)

SECTION = "## Python package: load and open (issue 29)"
GIB = 1 << 30
MIB = 1 << 20
LIST_COUNT = 10000

GEN_CHILD = r"""
import json, sys, torch
from safetensors.torch import save_file
kind, target, pth, st, meta = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
torch.manual_seed(0)
f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
spec = []
if kind == "model":
    d, kv, ffn, vocab, hd = 2048, 512, 5632, 32000, 128
    def layer(i):
        p = "model.layers.%d." % i
        return [(p + "input_layernorm.weight", (d,), f32),
                (p + "self_attn.q_proj.weight", (d, d), bf16), (p + "self_attn.q_proj.bias", (d,), f32),
                (p + "self_attn.k_proj.weight", (kv, d), bf16), (p + "self_attn.k_proj.bias", (kv,), f32),
                (p + "self_attn.v_proj.weight", (kv, d), bf16), (p + "self_attn.v_proj.bias", (kv,), f32),
                (p + "self_attn.o_proj.weight", (d, d), bf16),
                (p + "self_attn.rotary_emb.inv_freq", (hd // 2,), f32),
                (p + "post_attention_layernorm.weight", (d,), f32),
                (p + "mlp.gate_proj.weight", (ffn, d), f16), (p + "mlp.up_proj.weight", (ffn, d), f16),
                (p + "mlp.down_proj.weight", (d, ffn), f16)]
    def nb(ts):
        return sum(torch.Size(s).numel() * torch.empty((), dtype=t).element_size() for _, s, t in ts)
    head = [("model.embed_tokens.weight", (vocab, d), f32)]
    tail = [("model.norm.weight", (d,), f32), ("lm_head.weight", (vocab, d), bf16)]
    n = max(1, round((target - nb(head) - nb(tail)) / nb(layer(0))))
    spec = head + [t for i in range(n) for t in layer(i)] + tail
else:  # many: 10,000 tensors of about target/10,000 bytes each, dtypes in turn
    each = max(64, int(target) // 10000)
    for i in range(10000):
        dt = (f32, bf16, f16)[i % 3]
        el = 4 if dt == f32 else 2
        rows = max(1, each // (1024 * el)) if each >= 4096 else 1
        cols = 1024 if each >= 4096 else max(1, each // el)
        spec.append(("model.layers.%d.experts.%d.weight" % (i // 10, i % 10), (rows, cols), dt))
sd = {}
for name, shape, dt in spec:
    sd[name] = torch.empty(shape, dtype=dt).normal_(0, 0.02)
torch.save(sd, pth + ".tmp")
save_file(sd, st + ".tmp", metadata={"format": "pt"})
import os
os.rename(pth + ".tmp", pth)
os.rename(st + ".tmp", st)
by = {}
for t in sd.values():
    k = str(t.dtype).replace("torch.", "")
    by[k] = by.get(k, 0) + t.numel() * t.element_size()
json.dump({"kind": kind, "target": target, "tensors": len(sd), "bytes": sum(by.values()),
           "by_dtype": by, "largest": max(t.numel() * t.element_size() for t in sd.values()),
           "torch": torch.__version__, "pth_size": os.path.getsize(pth),
           "st_size": os.path.getsize(st)}, open(meta, "w"))
"""

LOAD_CHILD = r"""
import hashlib, json, resource, sys, time
def status():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                d[k] = int(v.split()[0])
    return d
tool, path, touch = sys.argv[1:4]
t0 = time.perf_counter()
import torch
if tool == "ckpt":
    import ckpt_toolkit
elif tool == "safetensors":
    import safetensors.torch
t_import = time.perf_counter() - t0
before = status()
t1 = time.perf_counter()
if tool == "ckpt":
    sd = ckpt_toolkit.load(path)
elif tool == "torch":
    sd = torch.load(path, mmap=True, weights_only=True)
else:
    sd = safetensors.torch.load_file(path)
t2 = time.perf_counter()
loaded = status()
chk = nbytes = 0
for k in sd:
    t = sd[k]
    if t.numel() == 0:
        continue
    b = t.reshape(-1).view(torch.uint8)
    nbytes += b.numel()
    if touch == "sum":
        chk += int(b.sum())
    else:
        chk += int(b[::4096].sum()) + int(b[-1])
t3 = time.perf_counter()
after = status()
keys = hashlib.sha256("\n".join(sorted(sd)).encode()).hexdigest()[:16]
print(json.dumps({"import_s": t_import, "load_s": t2 - t1, "touch_s": t3 - t2,
                  "tensors": len(sd), "bytes": nbytes, "checksum": chk, "keys": keys,
                  "before": before, "loaded": loaded, "after": after,
                  "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

LIST_CHILD = r"""
import json, sys, time
tool, path = sys.argv[1:3]
t0 = time.perf_counter()
import torch
if tool == "ckpt":
    from ckpt_toolkit import safe_open
else:
    from safetensors import safe_open
t_import = time.perf_counter() - t0
def once():
    t, c = time.perf_counter(), time.process_time()
    with safe_open(path, framework="pt") as f:
        keys = list(f.keys())
    return time.perf_counter() - t, time.process_time() - c, len(keys)
first, first_cpu, n = once()
again, again_cpu, n2 = once()
hwm = 0
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
print(json.dumps({"import_s": t_import, "open_s": first, "again_s": again, "keys": n,
                  "open_cpu_s": first_cpu, "again_cpu_s": again_cpu,
                  "keys_again": n2, "vmhwm_kib": hwm}))
"""

VERSIONS_CHILD = r"""
import json, torch, numpy, safetensors
try:
    import ckpt_toolkit
    v = getattr(ckpt_toolkit, "__version__", "?")
except Exception as e:
    v = "not importable: %s" % e
print(json.dumps({"torch": torch.__version__, "numpy": numpy.__version__,
                  "safetensors": safetensors.__version__, "ckpt_toolkit": v}))
"""


def child_env(native):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if native:
        env["CKPT_TOOLKIT_NATIVE"] = native
    # Same thread count for every line: torch's default (one per core).
    return env


def make_native(workdir):
    """A CKPT_TOOLKIT_NATIVE folder of symlinks to this build tree."""
    nat = os.path.join(workdir, "native")
    for sub, name, target in (("bin", "ckpt", os.path.join(ROOT, "ckpt")),
                              ("lib", "libckpt.so.0",
                               os.path.join(ROOT, ".libs", "libckpt.so.0"))):
        if not os.path.exists(target):
            sys.exit("bench_python_load.py: %s missing: build the tree first (make)" % target)
        os.makedirs(os.path.join(nat, sub), exist_ok=True)
        link = os.path.join(nat, sub, name)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)
    return nat


def generate(py, workdir, kind, target, tag):
    pth = os.path.join(workdir, "%s.pth" % tag)
    st = os.path.join(workdir, "%s.safetensors" % tag)
    meta = os.path.join(workdir, "%s.json" % tag)
    try:
        with open(meta) as f:
            m = json.load(f)
        if (m["kind"] == kind and m["target"] == target and os.path.getsize(pth) == m["pth_size"]
                and os.path.getsize(st) == m["st_size"]):
            return pth, st, m
    except (OSError, ValueError, KeyError):
        pass
    print("making %s (%s, %.2f GiB) ..." % (tag, kind, target / GIB), flush=True)
    t = time.perf_counter()
    subprocess.run([py, "-c", GEN_CHILD, kind, repr(float(target)), pth, st, meta], check=True)
    print("  %.0f s" % (time.perf_counter() - t), flush=True)
    with open(meta) as f:
        return pth, st, json.load(f)


def run_child(py, env, code, args):
    t = time.perf_counter()
    r = subprocess.run([py, "-c", code] + args, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit("bench_python_load.py: child %s failed (exit %d):\n%s"
                 % (" ".join(args), r.returncode, r.stderr.strip()[-3000:]))
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    return res


def round_robin(lines, runs, prepare, label):
    """lines: [(key, path, argv-runner)]; warm-up round, then RUNS rounds,
    the order rotating; returns {key: [result, ...]} and the load averages."""
    got = {k: [] for k, _, _ in lines}
    loads = []
    for rnd in range(runs + 1):
        order = lines[rnd % len(lines):] + lines[:rnd % len(lines)]
        for key, path, fn in order:
            prepare(path)
            loads.append(os.getloadavg()[0])
            res = fn()
            if rnd > 0:
                got[key].append(res)
        print("  %s round %d/%d done" % (label, rnd, runs) if rnd else
              "  %s warm-up round done" % label, flush=True)
    return got, loads


def med(rs, f):
    return statistics.median(f(r) for r in rs)


def mn(rs, f):
    return min(f(r) for r in rs)


def load_bench(a, py, env, pth, st, meta, cache):
    lines = [("ckpt_pth", pth, ["ckpt", pth, a.touch]),
             ("ckpt_st", st, ["ckpt", st, a.touch]),
             ("torch", pth, ["torch", pth, a.touch]),
             ("safetensors", st, ["safetensors", st, a.touch])]
    prep = warm if cache == "warm" else drop
    residency = {}

    def prepare(path):
        prep(path)
        if cache == "cold" and path not in residency:
            residency[path] = resident(path)

    runners = [(k, p, (lambda args=args: run_child(py, env, LOAD_CHILD, args)))
               for k, p, args in lines]
    got, loads = round_robin(runners, a.runs, prepare, "load (%s)" % cache)
    return got, loads, residency


def list_bench(a, py, env, files, cache):
    lines = []
    for tag, (pth, st, meta) in files.items():
        lines.append(("ckpt %s pth" % tag, pth, ["ckpt", pth]))
        lines.append(("ckpt %s st" % tag, st, ["ckpt", st]))
        lines.append(("safetensors %s st" % tag, st, ["safetensors", st]))
    prep = warm if cache == "warm" else drop
    runners = [(k, p, (lambda args=args: run_child(py, env, LIST_CHILD, args)))
               for k, p, args in lines]
    return round_robin(runners, a.list_runs, prep, "open+keys (%s)" % cache)


def load_rows(got, meta):
    """Table rows and goal verdicts of one cache state."""
    call = lambda r: r["load_s"] + r["touch_s"]  # noqa: E731
    base_t = med(got["torch"], call)
    base_s = med(got["safetensors"], call)
    names = {"ckpt_pth": "`ckpt_toolkit.load` (.pth)",
             "ckpt_st": "`ckpt_toolkit.load` (.safetensors)",
             "torch": "`torch.load(mmap=True, weights_only=True)` (.pth)",
             "safetensors": "`safetensors.torch.load_file` (.safetensors)"}
    rows, info = [], {}
    for k in ("ckpt_pth", "ckpt_st", "torch", "safetensors"):
        rs = got[k]
        m = med(rs, call)
        anon_d = max(r["after"]["RssAnon"] - r["before"]["RssAnon"] for r in rs) * 1024
        info[k] = {"call": m, "vs_torch": m / base_t, "vs_st": m / base_s,
                   "anon_frac": anon_d / meta["bytes"]}
        rows.append("| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | %.0f | %.0f | %.0f | %.1f%% "
                    "| %.2fx | %.2fx |" % (
                        names[k], m, mn(rs, call), med(rs, lambda r: r["load_s"]),
                        med(rs, lambda r: r["touch_s"]), med(rs, lambda r: r["wall_s"]),
                        max(r["after"]["VmHWM"] for r in rs) / 1024.0,
                        max(r["ru_maxrss_kib"] for r in rs) / 1024.0,
                        max(r["after"]["RssAnon"] for r in rs) / 1024.0,
                        anon_d / MIB, 100.0 * anon_d / meta["bytes"], m / base_t, m / base_s))
    return rows, info


def check_same(got):
    """Every line read the same keys and bytes (the checksum of the touch)."""
    seen = {}
    for k, rs in got.items():
        for r in rs:
            seen.setdefault((r["tensors"], r["keys"], r["bytes"], r["checksum"]), []).append(k)
    return seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--list-runs", type=int, default=7)
    ap.add_argument("--touch", choices=("page", "sum"), default="page")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--workdir", default="/var/tmp/ckpt_pybench")
    ap.add_argument("--native", default=None)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-list", action="store_true")
    ap.add_argument("--clean", action="store_true", help="remove the generated files at the end")
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--no-results", action="store_true")
    a = ap.parse_args()

    os.makedirs(a.workdir, exist_ok=True)
    need = (0 if a.skip_load else 2.1 * a.size_gib) + (0 if a.skip_list else 2.1 * a.size_gib)
    free = shutil.disk_usage(a.workdir).free / GIB
    if free < need + 8:
        sys.exit("bench_python_load.py: %.1f GiB free in %s, want %.1f (the files + 8)"
                 % (free, a.workdir, need + 8))
    native = make_native(a.workdir) if a.native is None else a.native
    env = child_env(native)
    py = a.python
    rev = bi.git_rev()
    mach = bi.machine_info()
    vers = run_child(py, env, VERSIONS_CHILD, [])
    load_start = os.getloadavg()
    started = datetime.datetime.utcnow()
    caches = ["warm", "cold"] if a.cold else ["warm"]
    print("load average %.2f %.2f %.2f; ckpt_toolkit %s, torch %s, safetensors %s" % (
        load_start + (vers["ckpt_toolkit"], vers["torch"], vers["safetensors"])), flush=True)

    out = [SECTION, "",
           "Requirement: loading a 2 GiB state dict and reading every tensor once, against "
           "`torch.load(mmap=True, weights_only=True)` and safetensors' `load_file` of the same "
           "weights, same run: time and peak RSS. Goal: faster than torch.load and within 1.2x of "
           "safetensors on the same bytes; opening and listing a file of up to 10,000 tensors in "
           "under 50 ms whatever its size; anonymous memory (RssAnon) under 10% of the tensors "
           "read (mapped file pages do not count).", "",
           "- Date: %s UTC" % started.strftime("%Y-%m-%d %H:%M"),
           "- Machine: %s, %s cores (`nproc` %s), %s RAM; %s (kernel %s); load average at the "
           "start %s (shared machine)" % (
               mach["cpu"], mach["cores"], os.cpu_count(), mach["ram"], mach["os"],
               mach["kernel"], " ".join("%.2f" % x for x in load_start)),
           "- Software: ckpt_toolkit %s from the source tree (git %s), libckpt and ckpt of the "
           "same build; Python %s, torch %s, safetensors %s, numpy %s" % (
               vers["ckpt_toolkit"], rev, mach["python"], vers["torch"], vers["safetensors"],
               vers["numpy"]),
           "- Command: `%s bench/bench_python_load.py %s`" % (
               py, " ".join(sys.argv[1:]) or "(defaults)")]
    verdicts = []

    if not a.skip_load:
        pth, st, meta = generate(py, a.workdir, "model", a.size_gib * GIB, "model_%ggib" % a.size_gib)
        out += ["- Files: `%s` (%d bytes, torch.save zip, torch %s) and `%s` (%d bytes, "
                "safetensors save_file), the same %d tensors, %d bytes (%.2f GiB: %s), the largest "
                "%.1f MiB; a transformer-like layout (d 2048, GQA k/v 512, MLP 5632, vocab 32000, "
                "float32 embedding, bfloat16 attention and lm_head, float16 MLP, float32 norms, "
                "biases and rotary buffers)" % (
                    os.path.basename(pth), meta["pth_size"], meta["torch"], os.path.basename(st),
                    meta["st_size"], meta["tensors"], meta["bytes"], meta["bytes"] / GIB,
                    ", ".join("%s %.2f GiB" % (k, v / GIB) for k, v in sorted(meta["by_dtype"].items())),
                    meta["largest"] / MIB)]
        out += ["- Method (load): each line a fresh child process (`%s -c ...`); it imports torch "
                "(and the loader), then times the load call and the touch with perf_counter: "
                "%s. One warm-up round, then %d round(s), round-robin, the order rotating; medians "
                "(and the minimum of load + touch). Peak RSS: the child's VmHWM and ru_maxrss; "
                "RssAnon from /proc/self/status after the touch, its growth from before the load "
                "call (the largest of the runs) against the tensor bytes." % (
                    py, "one byte of every 4 KiB page of each tensor and its last byte (every page "
                    "faulted in; the loader's cost, not a reduction's)" if a.touch == "page" else
                    "every byte (a uint8 sum of each tensor)", a.runs), ""]
        for cache in caches:
            got, loads, residency = load_bench(a, py, env, pth, st, meta, cache)
            rows, info = load_rows(got, meta)
            same = check_same(got)
            if cache == "warm":
                how = ("page cache warm: each file read through before every run")
            else:
                how = ("page cache cold: the file's pages dropped with "
                       "posix_fadvise(DONTNEED) before every run (resident after the drop: %s)"
                       % ", ".join("%s %s" % (os.path.basename(p), "?" if v is None else
                                              "%.1f MiB" % (v / MIB))
                                   for p, v in residency.items()))
            out += ["### Load + touch, %s" % how, "",
                    "Load average before the runs: median %.2f, max %.2f." % (
                        statistics.median(loads), max(loads)), "",
                    "| line | load + touch s (median) | min s | load s | touch s | whole process s "
                    "| VmHWM MiB | ru_maxrss MiB | RssAnon MiB | RssAnon growth MiB | of tensor bytes "
                    "| vs torch.load | vs safetensors |",
                    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"] + rows + [""]
            if len(same) == 1:
                k = next(iter(same))
                out.append("Same data: every run of every line read the same %d tensors (same key "
                           "set) and %d bytes, checksum %d." % (k[0], k[2], k[3]))
            else:
                out.append("**The lines did not read the same data:** %s" % "; ".join(
                    "%s: %d tensors, keys %s, %d bytes, checksum %d" % (
                        "/".join(sorted(set(v))), k[0], k[1], k[2], k[3]) for k, v in same.items()))
            out.append("")
            imp = {k: med(got[k], lambda r: r["import_s"]) for k in got}
            out.append("Imports (in the child, before the timed call; not in the ratios): "
                       "`import torch` + ckpt_toolkit %.2f s, + safetensors.torch %.2f s, torch "
                       "alone %.2f s." % (imp["ckpt_pth"], imp["safetensors"], imp["torch"]))
            out.append("")
            # each against the reader of the same bytes: the .pth against
            # torch.load, the .safetensors against safetensors' load_file
            for k, label, against in (("ckpt_pth", "ckpt_toolkit.load (.pth)", "torch"),
                                      ("ckpt_st", "ckpt_toolkit.load (.safetensors)", "st")):
                verdicts.append((cache, label, dict(info[k], against=against)))
            print("\n".join(out[-(len(rows) + 9):]), flush=True)

    if not a.skip_list:
        files = {}
        for tag, target in (("small", 16 * 4 * LIST_COUNT), ("large", a.size_gib * GIB)):
            pth, st, meta = generate(py, a.workdir, "many", float(target),
                                     "many_%s_%s" % (LIST_COUNT, tag if tag == "small" else
                                                     "%ggib" % a.size_gib))
            files[tag] = (pth, st, meta)
        out += ["- Files (open + keys): %s." % "; ".join(
            "%s: `%s` %d bytes and `%s` %d bytes, %d tensors (float32/bfloat16/float16 in turn), "
            "%d tensor bytes" % (tag, os.path.basename(p), m["pth_size"], os.path.basename(s),
                                 m["st_size"], m["tensors"], m["bytes"])
            for tag, (p, s, m) in files.items()),
                "- Method (open + keys): each line a fresh child; after `import torch` and the "
                "package's import (timed apart), it times `with safe_open(F, framework=\"pt\") as "
                "f: list(f.keys())` (first), then the same again in the same process (again); wall time "
                "(perf_counter) and the process's CPU time (process_time, user + system: what "
                "other load on the machine changes least). "
                "One warm-up round, then %d rounds, round-robin, the order rotating; medians." %
                a.list_runs, ""]
        for cache in caches:
            got, loads = list_bench(a, py, env, files, cache)
            st_ref = {tag: med(got["safetensors %s st" % tag], lambda r: r["open_s"])
                      for tag in files}
            out += ["### Open + keys of 10,000 tensors, page cache %s" % cache, "",
                    "Load average before the runs: median %.2f, max %.2f." % (
                        statistics.median(loads), max(loads)), "",
                    "| line | file | size | keys | first ms (median) | min ms | first CPU ms "
                    "| again ms | again CPU ms | import ms | VmHWM MiB "
                    "| vs safetensors safe_open (same size) |",
                    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for key in got:
                tool, tag, ext = key.split()
                p, s, m = files[tag]
                f = p if ext == "pth" else s
                rs = got[key]
                first = med(rs, lambda r: r["open_s"])
                out.append("| %s | %s | %.2f GiB | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f "
                           "| %.0f | %.2fx |" % (
                    "`ckpt_toolkit.safe_open`" if tool == "ckpt" else "`safetensors.safe_open`",
                    os.path.basename(f), os.path.getsize(f) / GIB, rs[0]["keys"], first * 1e3,
                    mn(rs, lambda r: r["open_s"]) * 1e3, med(rs, lambda r: r["open_cpu_s"]) * 1e3,
                    med(rs, lambda r: r["again_s"]) * 1e3, med(rs, lambda r: r["again_cpu_s"]) * 1e3,
                    med(rs, lambda r: r["import_s"]) * 1e3,
                    max(r["vmhwm_kib"] for r in rs) / 1024.0, first / st_ref[tag]))
                if tool == "ckpt":
                    verdicts.append((cache, "open+keys %s" % os.path.basename(f),
                                     {"open": first, "cpu": med(rs, lambda r: r["open_cpu_s"])}))
                if any(r["keys"] != LIST_COUNT or r["keys_again"] != LIST_COUNT for r in rs):
                    out.append("**%s listed %s keys, not %d**" % (
                        key, sorted({r["keys"] for r in rs}), LIST_COUNT))
            out.append("")
            print("\n".join(out[-(len(got) + 7):]), flush=True)

    res = ["Goals:", ""]
    for cache, label, i in verdicts:
        if "open" in i:
            res.append("- %s, %s: %.1f ms (CPU %.1f ms) — %s (under 50 ms)" % (
                label, cache, i["open"] * 1e3, i["cpu"] * 1e3,
                "met" if i["open"] < 0.05 else "**missed**"))
        elif i["against"] == "torch":
            res.append("- %s, %s: %.2fx torch.load (%s: under 1x), RssAnon growth %.1f%% of the "
                       "tensor bytes (%s: under 10%%)" % (
                           label, cache, i["vs_torch"], "met" if i["vs_torch"] < 1 else "**missed**",
                           100 * i["anon_frac"], "met" if i["anon_frac"] < 0.1 else "**missed**"))
        else:
            res.append("- %s, %s: %.2fx safetensors' load_file (%s: at most 1.2x), RssAnon "
                       "growth %.1f%% of the tensor bytes (%s: under 10%%)" % (
                           label, cache, i["vs_st"], "met" if i["vs_st"] <= 1.2 else "**missed**",
                           100 * i["anon_frac"], "met" if i["anon_frac"] < 0.1 else "**missed**"))
    out += res + [""]
    load_end = os.getloadavg()
    out.append("Load average at the end: %s." % " ".join("%.2f" % x for x in load_end))
    text = "\n".join(out) + "\n"
    print("\n" + text)
    if not a.no_results:
        bi.update_results(a.results, text, SECTION)
        print("wrote section %r of %s" % (SECTION, a.results))
    if a.clean:
        for f in os.listdir(a.workdir):
            if f.endswith((".pth", ".safetensors", ".json")):
                os.unlink(os.path.join(a.workdir, f))
        print("removed the generated files in %s" % a.workdir)


if __name__ == "__main__":
    main()
