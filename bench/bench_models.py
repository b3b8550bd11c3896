#!/usr/bin/python3
"""Benchmark ckpt's forward pass on the issue-16 models against PyTorch.

crnn.pytorch's CRNN as the DataParallel article trains it (tests/fixtures/
models.py CRNN(32, 1, 5530, 256): 11.1M parameters, models/crnn.json) on
32 x 256 images at batch 32 (its DataParallel batch), and torchvision's
ResNet-50 (models.resnet(50): 25.6M parameters, models/resnet50.json) on
224 x 224 images at batch 1 and 16; ckpt CPU against PyTorch CPU in the
same run; goal: ckpt within 1.5x.  For each model this script

  1. makes the checkpoint once in a torch child (torch.manual_seed(SEED),
     torch's init, batch-norm statistics randomized as after training;
     bench/out/<model>.pth, reused while it is there) with a reference file
     of torch's output on each batch, and checks `ckpt verify --reference`
     passes on it before any timing;
  2. times PyTorch's forward (bench_verify.py's torch child: strict
     load_state_dict, eval(), no_grad(), the default thread count, and 2
     threads) and ckpt's (bench/bench_forward, OpenBLAS, CLOCK_MONOTONIC
     around each ckpt_model_run()) as --rounds child processes each,
     alternating, the order rotating; median of the rounds' medians, their
     range, and the least forward of all (on a busy machine the nearest to
     a quiet one's time); peak RSS of every child (GNU time).  When the environment
     sets OPENBLAS_CORETYPE (which OpenBLAS kernels run), ckpt is also timed
     without it (OpenBLAS's own choice for the CPU), an informative row;
  3. prints the table and, unless --no-results, replaces the model's
     section of bench/RESULTS.md ("## ckpt verify: CRNN forward (issue 16)",
     "## ckpt verify: ResNet-50 forward (issue 16)").

    /usr/bin/python3 bench/bench_models.py [--models crnn,resnet50] [--runs 5]
        [--rounds 3] [--warmup 2] [--results bench/RESULTS.md] [--no-results]

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
# per model: label, spec, class in tests/fixtures/models.py and its keyword
# arguments, batches, section, and a sentence for RESULTS.md
MODELS = {
    "crnn": {"label": "CRNN (5530 classes)", "spec": "models/crnn.json", "cls": "CRNN",
             "kwargs": {"imgH": 32, "nc": 1, "nclass": 5530, "nh": 256}, "batches": [32],
             "section": "## ckpt verify: CRNN forward (issue 16)",
             "what": "crnn.pytorch's CRNN as the DataParallel article trains it: "
                     "`CRNN(32, 1, 5530, 256)` (tests/fixtures/models.py, %.1fM parameters, "
                     "models/crnn.json), 32 x 256 images"},
    "resnet50": {"label": "ResNet-50", "spec": "models/resnet50.json", "cls": "resnet",
                 "kwargs": {"depth": 50}, "batches": [1, 16],
                 "section": "## ckpt verify: ResNet-50 forward (issue 16)",
                 "what": "torchvision's ResNet-50 as the ImageNet example trains it under "
                         "nn.DataParallel: `resnet(50)` (tests/fixtures/models.py, torchvision's "
                         "module names, %.1fM parameters, models/resnet50.json), 224 x 224 "
                         "images"},
}

GEN_CHILD = r"""
import json, sys, torch
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["fixtures"])
import models
torch.set_num_threads(1)
torch.manual_seed(cfg["seed"])
m = models.randomize_batch_norms(getattr(models, cfg["cls"])(**cfg["kwargs"])).eval()
torch.save(m.state_dict(), cfg["path"])
shapes = []
for batch, ref in zip(cfg["batches"], cfg["refs"]):
    x = torch.rand([batch] + cfg["shape"][1:])
    with torch.no_grad():
        y = m(x)
    torch.save({"input": x, "output." + cfg["output"]: y}, ref)
    shapes.append(list(y.shape))
print(json.dumps({"params": sum(p.numel() for p in m.parameters()), "shapes": shapes}))
"""


class coretype_unset:
    """OPENBLAS_CORETYPE out of the environment the children inherit."""

    def __enter__(self):
        self.saved = os.environ.pop("OPENBLAS_CORETYPE", None)

    def __exit__(self, *exc):
        if self.saved is not None:
            os.environ["OPENBLAS_CORETYPE"] = self.saved


def blas_label(description):
    """'OpenBLAS 0.3.21 Haswell' of 'cpu (float32, OpenBLAS 0.3.21 Haswell, 2 threads)'."""
    parts = [p.strip() for p in description.strip("cpu ()").split(",")]
    return next((p for p in parts if p.startswith("OpenBLAS")), "plain C")


def write_section(path, section, text):
    with open(path) as f:
        old = f.read()
    start = old.find(section)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(section))
        new = old[:start] + text + ("\n" + old[end + 1:] if end >= 0 else "")
    with open(path, "w") as f:
        f.write(new)


def bench_one(a, key):
    spec = MODELS[key]
    os.makedirs(a.workdir, exist_ok=True)
    path = os.path.join(a.workdir, "%s.pth" % key)
    refs = [os.path.join(a.workdir, "%s_b%d.ref.pth" % (key, b)) for b in spec["batches"]]
    with open(os.path.join(ROOT, spec["spec"])) as f:
        sj = json.load(f)
    cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "seed": SEED, "cls": spec["cls"],
           "kwargs": spec["kwargs"], "path": path, "refs": refs, "batches": spec["batches"],
           "shape": sj["inputs"][0]["shape"], "output": sj["outputs"][0]}
    gen = json.loads(subprocess.run([a.python, "-c", GEN_CHILD, json.dumps(cfg)], check=True,
                                    capture_output=True, text=True).stdout.splitlines()[-1])
    model = dict(spec, path=path)

    # 1. correctness before timing: the CLI's own verdict, at every batch
    checks = []
    for batch, ref in zip(spec["batches"], refs):
        p = subprocess.run([a.ckpt, "verify", "--json", "--device", "cpu", "--model",
                            os.path.join(ROOT, spec["spec"]), "--reference", ref, path],
                           capture_output=True, text=True)
        doc = json.loads(p.stdout)
        o = doc["outputs"][0]
        if p.returncode != 0 or doc["result"] != "PASS":
            sys.exit("bench: ckpt verify does not pass on %s at batch %d: %s" % (key, batch, o))
        checks.append("batch %d: PASS, %s %s, max rel %.2e" % (
            batch, o["name"], o["shape"], o["reference"]["max_rel"]))
    check = "`ckpt verify --reference` at " + "; ".join(checks)
    print(check)

    # 2. timing, alternating; torch here defaults to 1 intra-op thread, ckpt's
    # OpenBLAS to 2: a torch row at 2 threads too, the fair one.  When the
    # environment picks OpenBLAS's kernels (OPENBLAS_CORETYPE), ckpt runs as
    # set, and also without it (OpenBLAS's own choice for this CPU, "ckpt0"),
    # an informative row
    table = []
    desc, tv = "cpu", None
    forced = os.environ.get("OPENBLAS_CORETYPE")
    whos = ["torch", "torch2", "ckpt"] + (["ckpt0"] if forced else [])
    with tempfile.TemporaryDirectory() as tmp:
        for batch in spec["batches"]:
            rows = {w: [] for w in whos}
            for r in range(a.rounds):
                order = whos[r % len(whos):] + whos[:r % len(whos)]
                for who in order:
                    if who.startswith("torch"):
                        res = bv.torch_row(a, tmp, model, batch, a.runs, a.warmup,
                                           threads=2 if who == "torch2" else 0)
                    elif who == "ckpt0":
                        with coretype_unset():
                            res = bv.ckpt_row(a, tmp, model, batch, a.runs, a.warmup)
                    else:
                        res = bv.ckpt_row(a, tmp, model, batch, a.runs, a.warmup)
                    rows[who].append(res)
                    print("  %s batch %d round %d %-6s median %.1f ms, peak RSS %d MiB" % (
                        key, batch, r + 1, who, res["median_ms"], res["rss_kib"] // 1024))
            med = {k: statistics.median(x["median_ms"] for x in v) for k, v in rows.items()}
            # the spread: the rounds' medians, least and greatest
            spread = {k: "%.1f-%.1f" % (min(x["median_ms"] for x in v),
                                        max(x["median_ms"] for x in v)) for k, v in rows.items()}
            # the least single forward of all rounds: on a busy machine, the
            # nearest to a quiet one's time
            best = {k: min(x["min_ms"] for x in v) for k, v in rows.items()}
            rss = {k: max(x["rss_kib"] for x in v) for k, v in rows.items()}
            desc = rows["ckpt"][0].get("description", "cpu")
            tv = rows["torch"][0]
            for who, what in (("torch", "PyTorch CPU, default threads"),
                              ("torch2", "PyTorch CPU, 2 threads")):
                ratio = med["ckpt"] / med[who]
                table.append("| %s | %d | %s | %.1f ms | %s ms | %.1f ms | %.2f %s (best: %.2f) "
                             "| %d MiB |" % (
                                 spec["label"], batch, what, med[who], spread[who], best[who],
                                 ratio, "met" if ratio <= 1.5 else "NOT MET",
                                 best["ckpt"] / best[who], rss[who] // 1024))
            table.append("| %s | %d | ckpt CPU (%s) | %.1f ms | %s ms | %.1f ms | | %d MiB |" % (
                spec["label"], batch, blas_label(desc), med["ckpt"], spread["ckpt"],
                best["ckpt"], rss["ckpt"] // 1024))
            if forced:
                d0 = rows["ckpt0"][0].get("description", "cpu")
                table.append("| %s | %d | ckpt CPU (%s), OPENBLAS_CORETYPE unset "
                             "(informative; / PyTorch 2 threads: %.2f, best: %.2f) | %.1f ms | "
                             "%s ms | %.1f ms | | %d MiB |" % (
                                 spec["label"], batch, blas_label(d0),
                                 med["ckpt0"] / med["torch2"], best["ckpt0"] / best["torch2"],
                                 med["ckpt0"], spread["ckpt0"], best["ckpt0"],
                                 rss["ckpt0"] // 1024))
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        spec["section"], "",
        (spec["what"] % (gen["params"] / 1e6)) +
        ", batch %s, output %s. `bench/bench_models.py --models %s`: %d rounds of child "
        "processes, torch and ckpt alternating, %d warm-up and %d timed forwards each; the "
        "median of the rounds' medians; peak RSS by GNU time. Checked first: %s." % (
            " and ".join(map(str, spec["batches"])), " / ".join(map(str, gen["shapes"])), key,
            a.rounds, a.warmup, a.runs, check),
        "",
        "Machine: %s, %d cores (shared with other jobs: medians, not minima), %s; "
        "PyTorch %s (%d intra-op thread%s by default; also timed with "
        "torch.set_num_threads(2)); ckpt %s%s." % (
            cpu, os.cpu_count(), platform.platform(), tv["torch"], tv["threads"],
            "" if tv["threads"] == 1 else "s", desc,
            "; the environment sets OPENBLAS_CORETYPE=%s" % forced if forced else ""),
        "",
        "| model | batch | what | median | rounds | best | ckpt / this (goal <= 1.5) | peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ] + table + [""]
    text = "\n".join(lines)
    print(text)
    if not a.no_results:
        write_section(a.results, spec["section"], text)
        print("updated %s" % a.results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="crnn,resnet50")
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
    keys = [k.strip() for k in a.models.split(",") if k.strip()]
    bad = [k for k in keys if k not in MODELS]
    if bad or not keys:
        sys.exit("bench: --models: unknown %s (choose from %s)" % (", ".join(bad) or "none",
                                                                 ", ".join(MODELS)))
    for k in keys:
        bench_one(a, k)


if __name__ == "__main__":
    main()
