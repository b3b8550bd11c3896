#!/opt/ckpt/torch2/bin/python
"""Benchmark `ckpt convert` of a DeepSpeed ZeRO-3 folder against DeepSpeed's
zero_to_fp32 and a durable copy (issue 17).

The requirement: a ZeRO-3 checkpoint of 1 GiB of fp32 weights over 4 ranks
-> one .pth; ckpt against zero_to_fp32 (followed by a sync of its output,
since ckpt fsyncs) and against a durable copy of the output's bytes, same
run, time and peak memory.  Goal: at least 2x faster than zero_to_fp32,
within 1.1x of the durable copy (issue 31; 1.5x in issue 17), peak RSS under
64 MiB + the largest tensor.
This script

  1. reuses (or makes) the folder: tests/fixtures/make_distributed.py's
     `big_zero3` (a real DeepSpeed 0.19 run on 4 CPU ranks, gloo: 16 x
     Linear(4096, 4096), fp32, ZeRO-3, AdamW, one step; each rank's optim
     file holds its fp32 flat group and the Adam moments, ~768 MiB);
  2. writes the ckpt output once, not timed, and checks it in a child with
     torch: torch.load(OUT) (weights only) equals zero_to_fp32's state dict
     tensor for tensor (names, order, dtype, shape, values);
  3. times whole processes, round-robin, page cache warm (every file of the
     folder read before each run), output removed and the filesystem synced
     after each:
       cp OUT.ref OUT && sync OUT                  (the durable copy)
       ckpt convert DIR OUT.pth                    (fsyncs OUT)
       python: get_fp32_state_dict_from_zero_checkpoint(DIR); torch.save(sd, OUT);
               os.fsync(OUT)                       (zero_to_fp32 + sync)
     and, for zero_to_fp32, the reconstruction + save + fsync alone as timed
     inside the child (without python's start and `import deepspeed`);
  4. measures the peak RSS of every run through GNU time (wait4 ru_maxrss);
  5. prints a table and replaces the section "## ckpt convert of a DeepSpeed
     ZeRO-3 folder (issue 17)" of bench/RESULTS.md.

Run with the Python that has torch and DeepSpeed (bootstrap --deps):

    /opt/ckpt/torch2/bin/python bench/bench_deepspeed.py [--runs 3]
        [--ckpt ./ckpt] [--workdir bench/out] [--results bench/RESULTS.md]

This process never imports torch or DeepSpeed itself (children do).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_inspect as bi  # noqa: E402  (machine description, git revision, RESULTS.md)
import bench_rewrite as br  # noqa: E402  (timing under GNU time, warm, rm)

SECTION = "## ckpt convert of a DeepSpeed ZeRO-3 folder (issue 17)"
MAX_RATIO_COPY = 1.1  # issue 31 (1.5 in issue 17)
MIN_SPEEDUP = 2.0
RSS_SLACK_MIB = 64.0

ZERO_TO_FP32_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
t1 = time.perf_counter()
sd = get_fp32_state_dict_from_zero_checkpoint(sys.argv[1])
t2 = time.perf_counter()
torch.save(sd, sys.argv[2])
fd = os.open(sys.argv[2], os.O_RDONLY)
os.fsync(fd)
os.close(fd)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "save_s": t3 - t2,
                  "convert_s": t3 - t1}))
"""

VERIFY_CHILD = r"""
import json, sys, torch
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
ref = get_fp32_state_dict_from_zero_checkpoint(sys.argv[1])
out = torch.load(sys.argv[2])          # weights only
same = [k for k in ref if k in out and out[k].dtype == ref[k].dtype
        and out[k].shape == ref[k].shape and torch.equal(out[k], ref[k])]
largest = max(t.numel() * t.element_size() for t in ref.values())
print(json.dumps({"tensors": len(ref), "equal": len(same), "order": list(out) == list(ref),
                  "largest": largest, "bytes": sum(t.numel() * t.element_size() for t in ref.values())}))
"""


def folder_files(d):
    out = []
    for root, _, files in os.walk(d):
        out += [os.path.join(root, f) for f in sorted(files)]
    return out


def warm_folder(d):
    for p in folder_files(d):
        br.warm(p)


def sync():
    os.sync()


def ensure_input(a):
    d = os.path.join(a.workdir, "big_zero3")
    if os.path.exists(os.path.join(d, "latest")):
        return d
    os.makedirs(a.workdir, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import make_distributed as md
    print("making %s (a real DeepSpeed ZeRO-3 run on 4 ranks; minutes)" % d, flush=True)
    md.run_ranks("big_zero3", 4, a.workdir, timeout=3600, big=True)
    return d


def child(code, *args, capture=True):
    return [sys.executable, "-c", code] + list(args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"))
    ap.add_argument("--workdir", default=os.path.join(HERE, "out"))
    ap.add_argument("--input", help="a ZeRO-3 folder to use instead of making big_zero3")
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    a = ap.parse_args()
    ckpt = os.path.abspath(a.ckpt)
    digest = bi.file_digest(ckpt)
    d = os.path.abspath(a.input) if a.input else ensure_input(a)
    os.makedirs(a.workdir, exist_ok=True)
    out = os.path.join(a.workdir, "zero3_out.pth")
    ref_bytes = os.path.join(a.workdir, "zero3_ref_bytes.pth")
    tmpdir = tempfile.mkdtemp(dir=a.workdir)
    os.environ.update(DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore")  # for the children
    env = dict(os.environ)

    # the output once, not timed, verified against zero_to_fp32
    br.rm(ref_bytes)
    subprocess.run([ckpt, "convert", "--quiet", d, ref_bytes], check=True)
    v = subprocess.run(child(VERIFY_CHILD, d, ref_bytes), env=env, capture_output=True,
                       text=True, check=True)
    ver = json.loads(v.stdout.strip().splitlines()[-1])
    in_bytes = sum(os.path.getsize(p) for p in folder_files(d))

    cmds = [
        ("durable copy: cp OUT.ref OUT && sync OUT",
         ["sh", "-c", 'cp "$0" "$1" && sync "$1"', ref_bytes, out], False),
        ("ckpt convert DIR OUT.pth", [ckpt, "convert", "--quiet", d, out], False),
        ("zero_to_fp32 + torch.save + fsync: whole process",
         child(ZERO_TO_FP32_CHILD, d, out), True),
    ]
    res = {name: {"walls": [], "rss": 0, "child": []} for name, _, _ in cmds}
    loads = []
    for rnd in range(a.runs + 1):  # round 0: warm-up, not counted
        order = cmds[rnd % 2:] + cmds[:rnd % 2] if rnd else cmds
        for name, argv, is_child in order:
            warm_folder(d)
            if "cp" in name:
                br.warm(ref_bytes)
            sync()
            loads.append(os.getloadavg()[0])
            wall, rss, data = br.run_timed(argv, tmpdir, capture=is_child)
            br.rm(out)
            sync()
            if rnd == 0:
                continue
            r = res[name]
            r["walls"].append(wall)
            r["rss"] = max(r["rss"], rss)
            if is_child:
                r["child"].append(json.loads(data.decode().strip().splitlines()[-1]))
        print("round %d done" % rnd, flush=True)
    br.rm(ref_bytes)
    os.rmdir(tmpdir)
    if bi.file_digest(ckpt) != digest:
        sys.exit("bench: the ckpt binary changed during the run")

    med = {k: statistics.median(r["walls"]) for k, r in res.items()}
    z = res["zero_to_fp32 + torch.save + fsync: whole process"]
    z_conv = statistics.median(c["convert_s"] for c in z["child"])
    z_imp = statistics.median(c["import_s"] for c in z["child"])
    copy_t = med["durable copy: cp OUT.ref OUT && sync OUT"]
    ck = med["ckpt convert DIR OUT.pth"]
    largest_mib = ver["largest"] / 2 ** 20
    ck_rss = res["ckpt convert DIR OUT.pth"]["rss"] / 1024
    rows = []
    for name, _, _ in cmds:
        r = res[name]
        rows.append((name, med[name], min(r["walls"]), r["rss"] / 1024))
    rows.insert(3, ("zero_to_fp32 + torch.save + fsync: reconstruction+save+fsync alone (in "
                    "the child)", z_conv, min(c["convert_s"] for c in z["child"]), z["rss"] / 1024))
    ratio = ck / copy_t
    speed = z_conv / ck
    rss_ok = ck_rss <= largest_mib + RSS_SLACK_MIB
    m = bi.machine_info()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        import importlib.metadata as imd
        dsv, tv = imd.version("deepspeed"), imd.version("torch")
    except Exception:
        dsv = tv = "?"
    lines = [SECTION, "",
             "Requirement: a ZeRO-3 checkpoint of 1 GiB of fp32 weights over 4 ranks → one .pth: "
             "ckpt against DeepSpeed's zero_to_fp32 (followed by a sync of its output, since ckpt "
             "fsyncs) and against a durable copy of the output's bytes, same run, time and peak "
             "memory. Goal: ≥ %.0fx faster than zero_to_fp32, within %.1fx of the durable copy, "
             "peak RSS under %d MiB + the largest tensor." % (MIN_SPEEDUP, MAX_RATIO_COPY,
                                                               RSS_SLACK_MIB), "",
             "- Date: %s" % now,
             "- Machine: %s, %s cores, %s RAM; %s (kernel %s)" % (m["cpu"], m["cores"], m["ram"],
                                                                m["os"], m["kernel"]),
             "- Software: ckpt (git %s, binary SHA-256 %s…); torch %s, DeepSpeed %s, Python %s"
             % (bi.git_rev(), digest[:16], tv, dsv, m["python"]),
             "- Input: `%s`: %d files, %.2f GiB (tests/fixtures/make_distributed.py's big_zero3: "
             "a real DeepSpeed run, 4 CPU ranks, 16 x Linear(4096, 4096) fp32, ZeRO-3, AdamW, one "
             "step; each optim file holds its rank's fp32 flat group and the Adam moments); "
             "output %d tensors, %.2f GiB, largest %.0f MiB"
             % (os.path.relpath(d, ROOT) if d.startswith(ROOT) else d, len(folder_files(d)),
                in_bytes / 2 ** 30, ver["tensors"], ver["bytes"] / 2 ** 30, largest_mib),
             "- Method: each command a whole process, one warm-up round then %d rounds, "
             "round-robin (the order rotates); before every run each file of the folder is read "
             "through (page cache warm) and the filesystem synced; after it the output is removed "
             "and synced. Peak RSS: GNU time (wait4 ru_maxrss). zero_to_fp32 is "
             "`get_fp32_state_dict_from_zero_checkpoint(DIR)` + `torch.save` + `os.fsync`, what "
             "its CLI does for one output file; its line inside the child leaves out Python's "
             "start and `import deepspeed` (median %.2f s), the number kindest to it."
             % (a.runs, z_imp),
             "- Load: 1-minute load average before the runs: median %.2f, max %.2f"
             % (statistics.median(loads), max(loads)),
             "- Command: `/opt/ckpt/torch2/bin/python bench/bench_deepspeed.py --runs %d`" % a.runs,
             "",
             "| command | median s | min s | peak RSS MiB |",
             "|---|---:|---:|---:|"]
    for name, mt, mn, rss in rows:
        lines.append("| %s | %.2f | %.2f | %.1f |" % (name, mt, mn, rss))
    lines += ["",
              "Verification (the ckpt output written once, not timed): torch.load(OUT) (weights "
              "only) against zero_to_fp32's state dict: %d of %d tensors equal (dtype, shape, "
              "values); same order: %s." % (ver["equal"], ver["tensors"],
                                             "yes" if ver["order"] else "NO"),
              "",
              "Goals:", "",
              "| goal | measured | |", "|---|---:|---|",
              "| ≥ %.0fx faster than zero_to_fp32 (its reconstruction+save+fsync alone) | %.2fx | %s |"
              % (MIN_SPEEDUP, speed, "PASS" if speed >= MIN_SPEEDUP else "FAIL"),
              "| within %.1fx of the durable copy | %.2fx | %s |"
              % (MAX_RATIO_COPY, ratio, "PASS" if ratio <= MAX_RATIO_COPY else "FAIL"),
              "| peak RSS < %d MiB + largest tensor (%.0f MiB) | %.1f MiB | %s |"
              % (RSS_SLACK_MIB, largest_mib, ck_rss, "PASS" if rss_ok else "FAIL"),
              "",
              "ckpt reads only the small pickles to plan the output (each parameter: 4 runs, one "
              "slice of each rank's flat group), then streams each run from the rank file into the "
              "output zip while a second thread computes each run's CRC-32 (for the output's "
              "records); then the CRC-32 of every flat-group record it read from is combined "
              "from those of its runs, reading only the bytes no run covers (the padding), and "
              "the output is committed only if they all match; the Adam moments are never read. zero_to_fp32 unpickles every rank file (mmap), gathers each parameter "
              "with torch.cat, then torch.save writes it."]
    text = "\n".join(lines) + "\n"
    print(text)
    bi.update_results(a.results, text, SECTION)


if __name__ == "__main__":
    main()
