#!/usr/bin/python3
"""Benchmark ckpt's forward pass on crnn.pytorch's CRNN against PyTorch (issue 16).

The article's model (tests/fixtures/models.py CRNN(32, 1, 5530, 256): 11.1M
parameters, models/crnn.json) on 32 x 256 images at batch 32 (its
DataParallel batch), ckpt CPU against PyTorch CPU in the same run; goal:
ckpt within 1.5x.  This script

  1. makes the checkpoint once in a torch child (torch.manual_seed(SEED),
     torch's init, batch-norm statistics randomized as after training;
     bench/out/crnn.pth, reused while it is there) with a reference file of
     torch's output on a batch of 32, and checks `ckpt verify --reference`
     passes on it before any timing;
  2. times PyTorch's forward (bench_verify.py's torch child: strict
     load_state_dict, eval(), no_grad(), the default thread count) and
     ckpt's (bench/bench_forward, OpenBLAS, CLOCK_MONOTONIC around each
     ckpt_model_run()) as --rounds child processes each, alternating, the
     order rotating; median of the rounds' medians; peak RSS of every child
     (GNU time);
  3. prints the table and, unless --no-results, replaces the section
     "## ckpt verify: CRNN forward (issue 16)" of bench/RESULTS.md.

    /usr/bin/python3 bench/bench_crnn.py [--batch 32] [--runs 5] [--rounds 3]
        [--warmup 2] [--results bench/RESULTS.md] [--no-results]

Run after `make ckpt bench/bench_forward`.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (its torch child, measure(), RESULTS helpers)

ROOT = bv.ROOT
SEED = 16
SECTION = "## ckpt verify: CRNN forward (issue 16)"
MODEL = {"label": "CRNN", "spec": "models/crnn.json", "cls": "CRNN",
         "kwargs": {"imgH": 32, "nc": 1, "nclass": 5530, "nh": 256}}

GEN_CHILD = r"""
import json, sys, torch
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["fixtures"])
import models
torch.set_num_threads(1)
torch.manual_seed(cfg["seed"])
m = models.randomize_batch_norms(models.CRNN(**cfg["kwargs"])).eval()
torch.save(m.state_dict(), cfg["path"])
x = torch.rand(cfg["batch"], 1, 32, 256)
with torch.no_grad():
    y = m(x)
torch.save({"input": x, "output.logits": y}, cfg["ref"])
print(json.dumps({"params": sum(p.numel() for p in m.parameters()), "shape": list(y.shape)}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"))
    ap.add_argument("--bench-forward", default=os.path.join(ROOT, "bench", "bench_forward"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "bench", "out"))
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "RESULTS.md"))
    ap.add_argument("--no-results", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    path = os.path.join(a.workdir, "crnn.pth")
    ref = os.path.join(a.workdir, "crnn_b%d.ref.pth" % a.batch)
    cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "seed": SEED,
           "kwargs": MODEL["kwargs"], "path": path, "ref": ref, "batch": a.batch}
    gen = json.loads(subprocess.run([a.python, "-c", GEN_CHILD, json.dumps(cfg)], check=True,
                                    capture_output=True, text=True).stdout.splitlines()[-1])
    model = dict(MODEL, path=path)

    # 1. correctness before timing: the CLI's own verdict
    p = subprocess.run([a.ckpt, "verify", "--json", "--device", "cpu", "--model",
                        os.path.join(ROOT, MODEL["spec"]), "--reference", ref, path],
                       capture_output=True, text=True)
    doc = json.loads(p.stdout)
    o = doc["outputs"][0]
    if p.returncode != 0 or doc["result"] != "PASS":
        sys.exit("bench: ckpt verify does not pass on the benchmark's checkpoint: %s" % o)
    check = "ckpt verify --reference at batch %d: PASS, logits %s, max rel %.2e" % (
        a.batch, o["shape"], o["reference"]["max_rel"])
    print(check)

    # 2. timing, alternating
    # torch here defaults to 1 intra-op thread, ckpt's OpenBLAS to 2: a
    # torch row at 2 threads too, the fair one
    rows = {"torch": [], "torch2": [], "ckpt": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ["torch", "torch2", "ckpt"][r % 3:] + ["torch", "torch2", "ckpt"][:r % 3]
            for who in order:
                if who.startswith("torch"):
                    res = bv.torch_row(a, tmp, model, a.batch, a.runs, a.warmup,
                                       threads=2 if who == "torch2" else 0)
                else:
                    res = bv.ckpt_row(a, tmp, model, a.batch, a.runs, a.warmup)
                rows[who].append(res)
                print("  round %d %-5s median %.1f ms, peak RSS %d MiB" % (
                    r + 1, who, res["median_ms"], res["rss_kib"] // 1024))
    med = {k: statistics.median(x["median_ms"] for x in v) for k, v in rows.items()}
    rss = {k: max(x["rss_kib"] for x in v) for k, v in rows.items()}
    ratio = med["ckpt"] / med["torch"]
    ratio2 = med["ckpt"] / med["torch2"]
    desc = rows["ckpt"][0].get("description", "cpu")
    tv = rows["torch"][0]
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        SECTION, "",
        "crnn.pytorch's CRNN as the DataParallel article trains it: `CRNN(32, 1, 5530, 256)` "
        "(tests/fixtures/models.py, %.1fM parameters, models/crnn.json), 32 x 256 images, "
        "batch %d, output logits %s. `bench/bench_crnn.py`: %d rounds of child processes, "
        "torch and ckpt alternating, %d warm-up and %d timed forwards each; the median of the "
        "rounds' medians; peak RSS by GNU time. Checked first: %s." % (
            gen["params"] / 1e6, a.batch, gen["shape"], a.rounds, a.warmup, a.runs, check),
        "",
        "Machine: %s, %d cores (shared with other jobs: medians, not minima), %s; "
        "PyTorch %s (%d intra-op thread%s by default; also timed with "
        "torch.set_num_threads(2)); ckpt %s." % (
            cpu, os.cpu_count(), platform.platform(), tv["torch"], tv["threads"],
            "" if tv["threads"] == 1 else "s", desc),
        "",
        "| model | batch | what | median | ckpt / this (goal <= 1.5) | peak RSS |",
        "|---|---|---|---|---|---|",
        "| CRNN (5530 classes) | %d | PyTorch CPU, default threads | %.1f ms | %.2f %s | %d MiB |"
        % (a.batch, med["torch"], ratio, "met" if ratio <= 1.5 else "NOT MET",
           rss["torch"] // 1024),
        "| CRNN (5530 classes) | %d | PyTorch CPU, 2 threads | %.1f ms | %.2f %s | %d MiB |"
        % (a.batch, med["torch2"], ratio2, "met" if ratio2 <= 1.5 else "NOT MET",
           rss["torch2"] // 1024),
        "| CRNN (5530 classes) | %d | ckpt CPU (OpenBLAS) | %.1f ms | | %d MiB |"
        % (a.batch, med["ckpt"], rss["ckpt"] // 1024),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not a.no_results:
        with open(a.results) as f:
            old = f.read()
        start = old.find(SECTION)
        if start < 0:
            new = old.rstrip("\n") + "\n\n" + text
        else:
            end = old.find("\n## ", start + len(SECTION))
            new = old[:start] + text + ("\n" + old[end + 1:] if end >= 0 else "")
        with open(a.results, "w") as f:
            f.write(new)
        print("updated %s" % a.results)


if __name__ == "__main__":
    main()
