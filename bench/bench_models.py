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
     load_state_dict, eval(), no_grad()) under Debian's torch 1.13 and the
     current torch (--python2: the venv of ./bootstrap --deps), each at its
     default thread count and at 2 threads, and ckpt's (bench/bench_forward,
     the default CPU backend: its packed SGEMM; CLOCK_MONOTONIC around each
     ckpt_model_run()) as --rounds child processes each, alternating, the
     order rotating; median of the rounds' medians, their range, and the
     least forward of all (on a busy machine the nearest to a quiet one's
     time); peak RSS of every child (GNU time).  ckpt with its products on
     OpenBLAS (--products openblas: the path before the packed SGEMM; its
     kernels as OPENBLAS_CORETYPE says) is an informative row;
  3. prints the table and, unless --no-results, replaces the model's
     section of bench/RESULTS.md ("## ckpt verify: CRNN forward (issue 16)",
     "## ckpt verify: ResNet-50 forward (issue 16)").

    /usr/bin/python3 bench/bench_models.py [--models crnn,resnet50] [--runs 5]
        [--rounds 3] [--warmup 2] [--python2 /opt/ckpt/torch2/bin/python]
        [--results bench/RESULTS.md] [--no-results]

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


def products_label(description):
    """'packed SGEMM AVX-512' of 'cpu (float32, packed SGEMM AVX-512, 2 threads)'."""
    parts = [p.strip() for p in description.strip("cpu ()").split(",")]
    return ", ".join(p for p in parts if p != "float32" and "thread" not in p) or "cpu"


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

    # 2. timing, alternating.  PyTorch 1.13 (Debian's) and the current
    # torch (the venv ./bootstrap --deps makes), each at its default thread
    # count and at ckpt's (2 here); ckpt as it runs by default, and with
    # its products on OpenBLAS (what it did before its packed SGEMM; which
    # kernels OpenBLAS runs, OPENBLAS_CORETYPE picks), an informative row
    table = []
    desc, tvs = "cpu", {}
    torches = [("torch", a.python, 0), ("torch2", a.python, 2)]
    if a.python2 and os.path.exists(a.python2):
        torches += [("new", a.python2, 0), ("new2", a.python2, 2)]
    whos = [t[0] for t in torches] + ["ckpt", "ckpt_blas"]
    with tempfile.TemporaryDirectory() as tmp:
        for batch in spec["batches"]:
            rows = {w: [] for w in whos}
            for r in range(a.rounds):
                order = whos[r % len(whos):] + whos[:r % len(whos)]
                for who in order:
                    tch = [t for t in torches if t[0] == who]
                    if tch:
                        aa = argparse.Namespace(**dict(vars(a), python=tch[0][1]))
                        res = bv.torch_row(aa, tmp, model, batch, a.runs, a.warmup,
                                           threads=tch[0][2])
                    else:
                        res = bv.ckpt_row(a, tmp, model, batch, a.runs, a.warmup,
                                          products="openblas" if who == "ckpt_blas" else None)
                    rows[who].append(res)
                    print("  %s batch %d round %d %-9s median %.1f ms, peak RSS %d MiB" % (
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
            for who, _, threads in torches:
                tv = rows[who][0]
                tvs[who] = tv
                what = "PyTorch %s CPU, %s" % (
                    tv["torch"], "%d threads" % threads if threads else
                    "default threads (%d)" % tv["threads"])
                ratio = med["ckpt"] / med[who]
                table.append("| %s | %d | %s | %.1f ms | %s ms | %.1f ms | %.2f %s (best: %.2f) "
                             "| %d MiB |" % (
                                 spec["label"], batch, what, med[who], spread[who], best[who],
                                 ratio, "met" if ratio <= 1.5 else "NOT MET",
                                 best["ckpt"] / best[who], rss[who] // 1024))
            table.append("| %s | %d | ckpt CPU (%s) | %.1f ms | %s ms | %.1f ms | | %d MiB |" % (
                spec["label"], batch, products_label(desc), med["ckpt"], spread["ckpt"],
                best["ckpt"], rss["ckpt"] // 1024))
            d0 = rows["ckpt_blas"][0].get("description", "cpu")
            table.append("| %s | %d | ckpt CPU (%s), its products on OpenBLAS (informative; "
                         "the default's speed-up over it: %.2fx) | %.1f ms | %s ms | %.1f ms | "
                         "| %d MiB |" % (
                             spec["label"], batch, products_label(d0),
                             med["ckpt_blas"] / med["ckpt"], med["ckpt_blas"],
                             spread["ckpt_blas"], best["ckpt_blas"], rss["ckpt_blas"] // 1024))
    forced = os.environ.get("OPENBLAS_CORETYPE")
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
        "%s; ckpt %s%s." % (
            cpu, os.cpu_count(), platform.platform(),
            "; ".join("PyTorch %s (%d intra-op thread%s by default)" % (
                tvs[w]["torch"], tvs[w]["threads"], "" if tvs[w]["threads"] == 1 else "s")
                for w in ("torch", "new") if w in tvs),
            desc, "; the environment sets OPENBLAS_CORETYPE=%s" % forced if forced else ""),
        "",
        "| model | batch | what | median | rounds | best | ckpt / this (goal <= 1.5) | peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ] + table + [""]
    text = "\n".join(lines)
    print(text)
    if not a.no_results:
        write_section(a.results, spec["section"], text)
        print("updated %s" % a.results)



def chosen(models, table):
    """The keys of TABLE a --models list names, in its order; exits on a name it lacks."""
    keys = [k.strip() for k in models.split(",") if k.strip()]
    bad = [k for k in keys if k not in table]
    if bad or not keys:
        sys.exit("bench: --models: unknown %s (choose from %s)" % (", ".join(bad) or "none",
                                                                 ", ".join(table)))
    return keys

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="crnn,resnet50")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--python2", default="/opt/ckpt/torch2/bin/python",
                    help="the current torch's python (./bootstrap --deps makes it); '' skips it")
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"))
    ap.add_argument("--bench-forward", default=os.path.join(ROOT, "bench", "bench_forward"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "bench", "out"))
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "RESULTS.md"))
    ap.add_argument("--no-results", action="store_true")
    a = ap.parse_args()
    keys = chosen(a.models, MODELS)
    for k in keys:
        bench_one(a, k)


if __name__ == "__main__":
    main()
