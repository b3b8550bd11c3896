#!/usr/bin/python3
"""Benchmark how ckpt scales with the number of tensors and shards (issue 26).

Issue 26 found `ckpt convert --dtype` and `convert --dry-run --dtype`
quadratic in the number of tensors (100,000 tensors: 352 s) and an index
naming 100,000 missing shards taking 17 s.  This script measures, for

  convert   ckpt convert --dtype float16 IN.safetensors OUT.safetensors
  dry-run   ckpt convert --dry-run --dtype float16 IN.safetensors OUT.safetensors
  missing   ckpt inspect NAME.index.json, whose weight_map names N tensors in
            N shards, none of them there (exit 3 on the first it opens)

  1. the count each handles in 10 s: N = 1000, 2000, 4000, ... while one run
     takes at most 10 s (the largest N timed within it; the next N, past it);
  2. time and peak RSS at fixed counts (10,000 and 100,000 by default);
  3. in the same run, the alternative: for convert, safetensors' own
     load_file + .to(float16) + save_file (Python, safetensors 0.8, torch);
     for the index, what a Python loader does first: json.load the index and
     stat each shard it names, until one is missing; and, with --old-ckpt, a
     ckpt built from before the fix (each timing capped by --old-timeout);
  4. replaces the section "## Scale: tensors and shards (issue 26)" of
     bench/RESULTS.md (with --results).

Inputs are generated in --workdir: safetensors files of N float32 tensors of
2 elements (the count, not the bytes, is what is measured), written as bytes.
Peak RSS is ru_maxrss through GNU time.  Timing is never a test: the checks
that these inputs are read right are in tests/.

    /usr/bin/python3 bench/bench_scale.py [--ckpt ./ckpt] [--old-ckpt OLD/ckpt]
        [--counts 10000,100000] [--python /opt/ckpt/torch2/bin/python]
        [--workdir bench/out/scale] [--results bench/RESULTS.md]
"""

import argparse
import datetime
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_inspect as bi  # noqa: E402  (machine description, git revision, RESULTS.md)

SECTION = "## Scale: tensors and shards (issue 26)"
BUDGET_S = 10.0

ST_CHILD = r"""
import sys, torch
from safetensors.torch import load_file, save_file
sd = load_file(sys.argv[1])
save_file({k: v.to(torch.float16) for k, v in sd.items()}, sys.argv[2])
"""

INDEX_CHILD = r"""
import json, os, sys
idx = json.load(open(sys.argv[1]))
d = os.path.dirname(sys.argv[1])
for shard in dict.fromkeys(idx["weight_map"].values()):
    if not os.path.exists(os.path.join(d, shard)):
        sys.exit(3)
"""


def make_safetensors(path, n):
    if os.path.exists(path):
        return
    hdr, off = {}, 0
    for i in range(n):
        hdr["layers.%d.weight" % i] = {"dtype": "F32", "shape": [2], "data_offsets": [off, off + 8]}
        off += 8
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.write(struct.pack("<%df" % (2 * n), *[float(i // 2) for i in range(2 * n)]))
    os.rename(path + ".tmp", path)


def make_index(path, n):
    if os.path.exists(path):
        return
    with open(path, "w") as f:
        json.dump({"metadata": {}, "weight_map": {"w%d" % i: "model-%06d.safetensors" % i
                                                  for i in range(n)}}, f)


def timed(argv, ok=(0,), timeout=None):
    """(wall seconds or None past TIMEOUT, peak RSS KiB or None, user + system
    CPU seconds or None): on a shared machine the CPU time is what scales."""
    fd, rss = tempfile.mkstemp(suffix=".rss")
    os.close(fd)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([bi.GNU_TIME, "-f", "%U %S\n%M", "-o", rss] + argv, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.unlink(rss)
        return None, None, None
    wall = time.perf_counter() - t0
    with open(rss) as f:
        lines = f.read().strip().splitlines()
    os.unlink(rss)
    if p.returncode not in ok:
        sys.exit("bench: %s exited with %d" % (" ".join(argv), p.returncode))
    cpu = sum(float(x) for x in lines[-2].split()) if len(lines) >= 2 else None
    return wall, int(lines[-1]) if lines and lines[-1].isdigit() else None, cpu


def cases(a, ckpt, work):
    """name -> (make input(n) -> argv, accepted exit statuses)."""
    def st(n):
        p = os.path.join(work, "t%d.safetensors" % n)
        make_safetensors(p, n)
        return p

    def idx(n):
        d = os.path.join(work, "missing%d" % n)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "model.safetensors.index.json")
        make_index(p, n)
        return p

    out = os.path.join(work, "out.safetensors")
    return {
        "convert": (lambda n: [ckpt, "convert", "--quiet", "--dtype", "float16", st(n), out], (0,)),
        "dry-run": (lambda n: [ckpt, "convert", "--quiet", "--dry-run", "--dtype", "float16", st(n),
                               out], (0,)),
        "missing": (lambda n: [ckpt, "inspect", "--quiet", idx(n)], (3,)),
        "convert:alt": (lambda n: [a.python, "-c", ST_CHILD, st(n), out], (0,)),
        "missing:alt": (lambda n: [a.python, "-c", INDEX_CHILD, idx(n)], (3,)),
    }


def in_budget(make, ok, start, cap, timeout=None):
    """Largest N (doubling from START, at most CAP) timed within 10 s, and the
    list of (N, seconds) tried."""
    n, best, tried = start, None, []
    while n <= cap:
        wall, _, _ = timed(make(n), ok, timeout=timeout or 4 * BUDGET_S)
        tried.append((n, wall))
        if wall is None or wall > BUDGET_S:
            break
        best = n
        n *= 2
    return best, tried


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"))
    ap.add_argument("--old-ckpt", help="a ckpt from before the fix, timed the same way")
    ap.add_argument("--old-label", default="before the fix")
    ap.add_argument("--old-timeout", type=float, default=60.0)
    ap.add_argument("--python", default="/opt/ckpt/torch2/bin/python",
                    help="a Python with torch and safetensors (the alternative)")
    ap.add_argument("--counts", default="10000,100000")
    ap.add_argument("--cap", type=int, default=1 << 20, help="largest N tried in the 10 s search")
    ap.add_argument("--workdir", default=os.path.join(HERE, "out", "scale"))
    ap.add_argument("--results", help="RESULTS.md to update")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    ckpt = os.path.abspath(a.ckpt)
    digest = bi.file_digest(ckpt)
    counts = [int(c) for c in a.counts.split(",")]
    new = cases(a, ckpt, a.workdir)
    old = cases(a, os.path.abspath(a.old_ckpt), a.workdir) if a.old_ckpt else None

    rows = []  # (case, tool, n in 10 s, tried)
    for name in ("convert", "dry-run", "missing"):
        for tool, table, key, tmo in (("ckpt", new, name, None),
                                      (a.old_label, old, name, a.old_timeout),
                                      ("alternative", new, name + ":alt", None)):
            if table is None or key not in table:
                continue
            make, ok = table[key]
            best, tried = in_budget(make, ok, 1000, a.cap, tmo)
            rows.append((name, tool, best, tried))
            print("%-8s %-16s %s in 10 s  %s" % (name, tool, best, tried), flush=True)
    fixed = []  # (case, tool, n, seconds, rss, cpu seconds)
    for n in counts:
        for name in ("convert", "dry-run", "missing"):
            for tool, table, key, tmo in (("ckpt", new, name, None),
                                          (a.old_label, old, name, a.old_timeout),
                                          ("alternative", new, name + ":alt", None)):
                if table is None or key not in table:
                    continue
                make, ok = table[key]
                wall, rss, cpu = timed(make(n), ok, timeout=tmo)
                fixed.append((name, tool, n, wall, rss, cpu))
                print("%-8s %-16s n=%d %s s %s KiB cpu %s s" % (name, tool, n, wall, rss, cpu),
                      flush=True)
    if bi.file_digest(ckpt) != digest:
        sys.exit("bench: %s changed during the run" % ckpt)

    m = bi.machine_info()
    pyver = subprocess.run([a.python, "-c", "import torch, safetensors; print(torch.__version__, "
                            "safetensors.__version__)"], capture_output=True, text=True).stdout.split()
    what = {"convert": "`convert --dtype float16` (safetensors -> safetensors)",
            "dry-run": "`convert --dry-run --dtype float16`",
            "missing": "`inspect` of an index naming N missing shards (exit 3)"}
    alt = {"convert": "safetensors load_file + .to(float16) + save_file",
           "dry-run": "(none)",
           "missing": "Python: json.load + stat each shard until one is missing"}
    lines = [SECTION, "",
             "Requirement: every walk linear or n log n in tensors and shards; 100,000 tensors "
             "`convert --dtype` under 10 s here (was 352 s); an index naming 100,000 missing shards "
             "(was 17 s).",
             "",
             "- Date: %s UTC" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"),
             "- Machine: %s, %s cores, %s RAM; %s (kernel %s); load average at the start %s (the "
             "machine is shared: wall times are upper bounds)" % (
                 m["cpu"], m["cores"], m["ram"], m["os"], m["kernel"],
                 " ".join("%.1f" % x for x in os.getloadavg())),
             "- ckpt: git %s%s; alternative: Python %s, torch %s, safetensors %s" % (
                 bi.git_rev(), "; old: %s (%s)" % (a.old_ckpt, a.old_label) if a.old_ckpt else "",
                 m["python"], *(pyver + ["?", "?"])[:2]),
             "- Inputs: safetensors files of N float32 tensors of 2 elements; indexes whose "
             "weight_map names N tensors in N shards, none there",
             "- Command: `/usr/bin/python3 bench/bench_scale.py%s --results bench/RESULTS.md`" % (
                 " --old-ckpt OLD/ckpt" if a.old_ckpt else ""),
             "",
             "Count handled in 10 s (N doubled from 1000 while one run takes at most 10 s; "
             "the runs tried in parentheses, '-' past the time limit):",
             "",
             "| case | tool | N in 10 s | runs (N: s) |", "|---|---|---:|---|"]
    for name, tool, best, tried in rows:
        lines.append("| %s | %s | %s | %s |" % (
            what[name], tool + (" (%s)" % alt[name] if tool == "alternative" else ""),
            "{:,}".format(best) if best else "< 1,000",
            ", ".join("%d: %s" % (n, "%.2f" % w if w is not None else "-") for n, w in tried)))
    lines += ["", "At fixed counts (one run each; wall time, CPU time (user + system) and peak "
              "RSS through GNU time; the ratio is of wall times):", "",
              "| case | N | tool | time s | CPU s | peak RSS MiB | ckpt faster by |",
              "|---|---:|---|---:|---:|---:|---:|"]
    ref = {(c, n): w for c, t, n, w, _, _ in fixed if t == "ckpt"}
    for name, tool, n, wall, rss, cpu in fixed:
        r = ref.get((name, n))
        lines.append("| %s | {:,} | %s | %s | %s | %s | %s |".format(n) % (
            what[name], tool, "%.2f" % wall if wall is not None else "> %d" % a.old_timeout,
            "%.2f" % cpu if cpu is not None else "-",
            "%.1f" % (rss / 1024) if rss else "-",
            "" if tool == "ckpt" or not r else
            ("%.1fx" % (wall / r) if wall is not None else "> %.0fx" % (a.old_timeout / r))))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.results:
        bi.update_results(a.results, text, SECTION)


if __name__ == "__main__":
    main()
