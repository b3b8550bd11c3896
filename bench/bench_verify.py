#!/usr/bin/python3
"""Benchmark ckpt's model forward pass (`ckpt verify`'s runtime) against PyTorch (issues 5, 6).

The goals: the forward pass of the models in models/ within 2x of PyTorch's
CPU forward on the CPU, measured in the same run; on a GPU, when the machine
has one, within 1.5x of PyTorch on the same GPU.  Issue 5: the MNIST MLP and
the conv autoencoder at batch 1 and 256.  Issue 6: the full SSD300
(tests/fixtures/models.py SSD300(width=1), 26.3M parameters, ssd.pytorch's
layout; models/ssd300.json) at batch 1 and 8.  This script

  1. for SSD300, makes the full-width checkpoint once (a torch child:
     torch.manual_seed(SEED), He init of the conv weights, torch.save
     to bench/out/, reused while it is there) and, before any timing, checks
     ckpt's outputs against torch's: bench_forward --dump (the default CPU
     backend, and the plain-C loops when they are timed) on its fixed input, torch's forward
     on the same input, every output within 1e-4 of the output's largest
     |value| and the priors bit for bit; then `ckpt verify --reference` on a
     reference file of torch's outputs made from that input (the CLI's own
     verdict at its default tolerance, and the same 1e-4 criterion);
  2. times PyTorch's forward in a child process (torch.load with
     map_location='cpu', the tests/fixtures/models.py class,
     load_state_dict (strict), eval(), torch.no_grad(), the default thread
     count), warm-up forwards then RUNS timed ones, perf_counter around
     each forward;
  3. times ckpt's forward with bench/bench_forward (the same warm-up and
     runs, CLOCK_MONOTONIC around each ckpt_model_run(), which includes
     copying the input in and the outputs out): on the default CPU backend
     (its packed SGEMM; OpenBLAS on a CPU without AVX2) and with the
     plain-C loops (--plain; for SSD300 only at the batches of
     --ssd-plain-batches, 1 by default: the plain loops take about 5 s an
     image there);
  4. when torch sees CUDA and bench_forward can open cuda:0, times torch on
     the GPU twice (the input already on the GPU, torch.cuda.synchronize()
     around each forward; and including the host->device copy of the input
     and the copy of every output back, as ckpt's time does) and ckpt on
     cuda:0; otherwise records that the GPU rows were not measured;
  5. runs every line as --rounds child processes (--ssd-rounds for SSD300),
     round-robin with the other lines of the same model and batch, the
     order rotating, and takes the median of the rounds' medians (this
     2-core VM's speed drifts by up to 2x from minute to minute); measures
     the peak RSS of every child (GNU time, wait4 ru_maxrss);
  6. prints a table with ratio = ckpt median / torch median (lower is
     better; goal <= 2 on the CPU, <= 1.5 on the GPU) and replaces the
     section "## ckpt verify: model forward (issue 5)" (MLP, autoencoder)
     and/or "## ckpt verify: SSD300 forward (issue 6)" of bench/RESULTS.md,
     for the models that were run.

Run with the Python that has torch (here /usr/bin/python3), after
`make ckpt bench/bench_forward`:

    /usr/bin/python3 bench/bench_verify.py [--models mlp,ae,ssd300]
        [--runs N] [--rounds 5] [--batches 1,256]
        [--ssd-runs 3] [--ssd-rounds 3] [--ssd-warmup 1] [--ssd-batches 1,8]
        [--ssd-plain-batches 1] [--ssd-check-batch 2] [--ssd-seed 0]
        [--bench-forward bench/bench_forward] [--ckpt ./ckpt] [--workdir bench/out]
        [--results bench/RESULTS.md] [--no-thread-variants] [--no-results]

This process never imports torch itself (children do), so that its own
memory stays small; see bench_inspect.py's measure_rss() for why.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_inspect as bi  # noqa: E402  (machine description, git revision, RESULTS.md)

SECTION = "## ckpt verify: model forward (issue 5)"
SSD_SECTION = "## ckpt verify: SSD300 forward (issue 6)"
GNU_TIME = bi.GNU_TIME
WARMUP = 3  # bench_forward's default
MAX_RATIO_CPU = 2.0
MAX_RATIO_GPU = 1.5
DEFAULT_RUNS = {1: 500}  # other batch sizes: DEFAULT_RUNS_LARGE
DEFAULT_RUNS_LARGE = 50
DEFAULT_ROUNDS = 5
# SSD300: about 0.7 s a forward at batch 1 in torch here, 5 s at batch 8
SSD_RUNS = 3
SSD_ROUNDS = 3
SSD_WARMUP = 1  # the first forward fills the CPU backend's buffer pool
SSD_BATCHES = "1,8"
SSD_PLAIN_BATCHES = "1"
SSD_CHECK_BATCH = 2
SSD_SEED = 0
SSD_MAX_REL = 1e-4  # the output check: max |ckpt - torch| <= 1e-4 * max |torch|
SSD_GEN_VERSION = 2  # bump when the generated checkpoint changes

# key for --models: label, spec, checkpoint (None: generated), class in
# tests/fixtures/models.py and its keyword arguments, section
MODELS = {
    "mlp": {"label": "MLP", "spec": "models/mnist_mlp.json",
            "ckpt": "tests/data/fmnist_mlp.pth", "cls": "MLP", "kwargs": {},
            "section": SECTION},
    "ae": {"label": "autoencoder", "spec": "models/mnist_conv_autoencoder.json",
           "ckpt": "tests/data/fmnist_ae.pth", "cls": "Autoencoder", "kwargs": {},
           "section": SECTION},
    "ssd300": {"label": "SSD300", "spec": "models/ssd300.json", "ckpt": None,
               "cls": "SSD300", "kwargs": {"width": 1}, "section": SSD_SECTION},
}
MODEL_ORDER = ["mlp", "ae", "ssd300"]

PROBE_CHILD = r"""
import json, torch
cuda = torch.cuda.is_available()
print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                  "cuda": cuda,
                  "gpu": torch.cuda.get_device_name(0) if cuda else None,
                  "torch_cuda": torch.version.cuda}))
"""

TORCH_CHILD = r"""
import json, resource, statistics, sys, time
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
import torch
import_s = time.perf_counter() - t0
sys.path.insert(0, cfg["fixtures"])
import models
if cfg["threads"]:
    torch.set_num_threads(cfg["threads"])
model = getattr(models, cfg["cls"])(**cfg["kwargs"])
model.load_state_dict(torch.load(cfg["ckpt"], map_location="cpu"))  # strict
model.eval()
dev = torch.device(cfg["device"])
cuda = dev.type == "cuda"
model.to(dev)
g = torch.Generator().manual_seed(0)
x = torch.rand([cfg["batch"] if d == -1 else d for d in cfg["shape"]], generator=g)
xd = x.to(dev)


def sync():
    if cuda:
        torch.cuda.synchronize(dev)


def as_tuple(o):
    return o if isinstance(o, tuple) else (o,)


rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
with torch.no_grad():
    for r in range(cfg["warmup"] + cfg["runs"]):
        sync()
        t = time.perf_counter()
        if cfg["copies"]:
            # what ckpt's time includes: input host->device, every output back
            o = [y.cpu() for y in as_tuple(model(x.to(dev)))]
        else:
            o = model(xd)
        sync()
        e = time.perf_counter() - t
        del o
        if r >= cfg["warmup"]:
            times.append(e * 1e3)
times.sort()
print(json.dumps({
    "median_ms": statistics.median(times), "min_ms": times[0], "max_ms": times[-1],
    "runs": len(times), "threads": torch.get_num_threads(), "torch": torch.__version__,
    "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if cuda else None,
    "cuda_max_allocated_mib": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None,
    "import_s": import_s, "maxrss_before_forward_kib": rss_before}))
"""

GEN_CHILD = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
import torch
sys.path.insert(0, cfg["fixtures"])
import models
t0 = time.perf_counter()
torch.manual_seed(cfg["seed"])
model = getattr(models, cfg["cls"])(**cfg["kwargs"])
# He init of every conv weight (biases: torch's default; L2Norm.weight 20): with
# the default init the input shapes the outputs by under 1% and the output
# check could not see a wrong early layer
for mod in model.modules():
    if isinstance(mod, torch.nn.Conv2d):
        torch.nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
sd = model.state_dict()
# multiply-adds of the conv2d layers for one 300x300 image
macs = []
def hook(mod, inp, out):
    macs.append(out[0].numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] *
                mod.kernel_size[1])
for mod in model.modules():
    if isinstance(mod, torch.nn.Conv2d):
        mod.register_forward_hook(hook)
model.eval()
with torch.no_grad():
    model(torch.zeros(1, 3, 300, 300))
tmp = cfg["path"] + ".tmp"
torch.save(sd, tmp)
os.replace(tmp, cfg["path"])
print(json.dumps({
    "version": cfg["version"], "seed": cfg["seed"], "cls": cfg["cls"],
    "kwargs": cfg["kwargs"], "torch": torch.__version__, "tensors": len(sd),
    "params": sum(v.numel() for v in sd.values()),
    "bytes": os.path.getsize(cfg["path"]), "gmac": sum(macs) / 1e9,
    "seconds": time.perf_counter() - t0}))
"""

# torch's outputs on bench_forward's dumped input, against each dump; writes
# the reference file for `ckpt verify --reference`
CHECK_CHILD = r"""
import json, os, sys
cfg = json.loads(sys.argv[1])
import torch
sys.path.insert(0, cfg["fixtures"])
import models
torch.manual_seed(0)
model = getattr(models, cfg["cls"])(**cfg["kwargs"])
model.load_state_dict(torch.load(cfg["ckpt"], map_location="cpu"))  # strict
model.eval()


def read(d, e):
    n = 1
    for k in e["shape"]:
        n *= k
    t = torch.from_file(os.path.join(d, e["file"]), shared=False, size=n,
                        dtype=torch.float32)
    return t.reshape(e["shape"])


dumps = cfg["dumps"]  # [[label, dir, [entries]], ...]
label0, dir0, ents0 = dumps[0]
inputs = [e for e in ents0 if e["file"].startswith("input.")]
assert len(inputs) == 1, inputs
x = read(dir0, inputs[0])
with torch.no_grad():
    out = model(x)
out = out if isinstance(out, tuple) else (out,)
names = cfg["outputs"]
assert len(out) == len(names)
ref = dict(zip(names, out))
res = {"input_shape": list(x.shape), "paths": []}
for label, d, ents in dumps:
    rows = []
    for e in ents:
        f = e["file"]
        if f.startswith("input."):
            same = torch.equal(read(d, e), x)
            assert same, "%s: not the same input as %s" % (label, label0)
            continue
        name = f[len("output."):-len(".f32")]
        r = ref[name]
        got = read(d, e)
        row = {"name": name, "shape": e["shape"], "torch_shape": list(r.shape)}
        if list(got.shape) == list(r.shape):
            diff = (got - r).abs()
            scale = r.abs().max().item()
            row.update({
                "max_abs": diff.max().item(), "max_ref": scale,
                "max_rel": diff.max().item() / scale if scale > 0 else float("inf"),
                "equal": torch.equal(got, r),
                "nonfinite": int((~torch.isfinite(got)).sum().item())})
        rows.append(row)
    res["paths"].append({"label": label, "outputs": rows})
refd = {"input": x}
for k, v in ref.items():
    refd["output." + k] = v.contiguous()
torch.save(refd, cfg["ref"])
print(json.dumps(res))
"""


# --------------------------------------------------------------------------
# running children

def run_child(argv, tmpdir, env=None):
    """Run argv to completion; return (rc, stdout, stderr, peak RSS KiB, how).

    The peak RSS is the child's own wait4 ru_maxrss through GNU time, which
    fork()s from its own small address space (see bi.measure_rss()); without
    GNU time, this process's wait4 (an upper bound: the child inherits this
    process's high-water mark as its floor)."""
    full_env = dict(os.environ, **(env or {}))
    if os.access(GNU_TIME, os.X_OK):
        fd, out = tempfile.mkstemp(dir=tmpdir, suffix=".rss")
        os.close(fd)
        p = subprocess.run([GNU_TIME, "-f", "%M", "-o", out] + argv, env=full_env,
                           capture_output=True, text=True)
        with open(out) as f:
            lines = f.read().strip().splitlines()
        os.unlink(out)
        rss = int(lines[-1]) if lines and lines[-1].strip().isdigit() else None
        return p.returncode, p.stdout, p.stderr, rss, "through GNU time, wait4 ru_maxrss"
    p = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    # communicate() reaped it already; RUSAGE_CHILDREN is the max over all
    # reaped children, so it is an upper bound too
    import resource
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return p.returncode, out, err, rss, "RUSAGE_CHILDREN of the bench process (upper bound)"


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def measure(argv, tmpdir, what, env=None):
    rc, out, err, rss, how = run_child(argv, tmpdir, env)
    if rc != 0:
        sys.exit("bench: %s failed (exit %d):\n%s" % (what, rc, err.strip()))
    res = last_json(out)
    res["rss_kib"] = rss
    res["rss_how"] = how
    res["loadavg"] = os.getloadavg()[0]
    return res


def torch_row(a, tmpdir, model, batch, runs, warmup, device="cpu", copies=False,
              threads=0):
    with open(os.path.join(ROOT, model["spec"])) as f:
        shape = json.load(f)["inputs"][0]["shape"]
    cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "cls": model["cls"],
           "kwargs": model["kwargs"], "ckpt": model["path"], "shape": shape,
           "batch": batch, "runs": runs, "warmup": warmup, "device": device,
           "copies": copies, "threads": threads}
    return measure([a.python, "-c", TORCH_CHILD, json.dumps(cfg)], tmpdir,
                   "torch %s batch %d on %s" % (model["label"], batch, device))


def ckpt_argv(a, model, batch, runs, device, plain=False, warmup=WARMUP, dump=None,
              products=None):
    return ([a.bench_forward] + (["--plain"] if plain else []) +
            (["--products", products] if products else []) +
            (["--warmup", str(warmup)] if warmup != WARMUP else []) +
            (["--dump", dump] if dump else []) +
            [os.path.join(ROOT, model["spec"]), model["path"], str(batch), str(runs),
             device])


def ckpt_row(a, tmpdir, model, batch, runs, warmup, device="cpu", plain=False, env=None,
             products=None):
    return measure(ckpt_argv(a, model, batch, runs, device, plain, warmup, products=products),
                   tmpdir, "bench_forward %s batch %d on %s%s%s"
                   % (model["label"], batch, device, " --plain" if plain else "",
                      " --products " + products if products else ""), env)


def combine(results):
    """One line from its rounds: the median of the rounds' medians, the least
    minimum, the largest peak RSS; the rounds' medians kept for the table."""
    res = dict(results[0])
    res["rounds_ms"] = [r["median_ms"] for r in results]
    res["median_ms"] = statistics.median(res["rounds_ms"])
    res["min_ms"] = min(r["min_ms"] for r in results)
    rss = [r["rss_kib"] for r in results if r["rss_kib"] is not None]
    res["rss_kib"] = max(rss) if rss else None
    res["loadavgs"] = [r["loadavg"] for r in results]
    return res


def products_label(description):
    """'packed SGEMM AVX-512, 2 threads' of 'cpu (float32, packed SGEMM AVX-512, 2 threads)'."""
    m = re.match(r"cpu \(float32, (.*)\)$", description or "")
    return m.group(1) if m else (description or "cpu")


def blas_threads(description):
    m = re.search(r"(\d+) threads", description or "")
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------
# report

def fmt(v):
    return "%.3f" % v if v < 10 else "%.2f" % v if v < 100 else "%.1f" % v


def mib(kib):
    return "%.1f" % (kib / 1024.0) if kib is not None else "?"


def verdict(ratio, limit):
    return "%s (%.2f×)" % ("PASS" if ratio <= limit else "FAIL", ratio)


MODEL_DESC = {
    "mlp": "`models/mnist_mlp.json` with `tests/data/fmnist_mlp.pth` "
           "(tests/fixtures/models.py `MLP`: 784→128→10)",
    "ae": "`models/mnist_conv_autoencoder.json` with `tests/data/fmnist_ae.pth` "
          "(`Autoencoder`: two stride-2 convolutions, linear 3136→32→3136, two "
          "stride-2 transposed convolutions, sigmoid; outputs `x_hat` and `z`)",
}


class Group:
    """The models of one RESULTS.md section and how they are measured."""

    def __init__(self, key, section, models, batches, runs, rounds, warmup, plain_batches):
        self.key, self.section, self.models = key, section, models
        self.batches, self.runs, self.rounds, self.warmup = batches, runs, rounds, warmup
        self.plain_batches = plain_batches  # None: every batch

    def runs_for(self, batch):
        if self.runs:
            return self.runs
        return DEFAULT_RUNS.get(batch, DEFAULT_RUNS_LARGE)

    def plain(self, batch):
        return self.plain_batches is None or batch in self.plain_batches


def int_list(text, what):
    try:
        v = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        sys.exit("bench: %s: a comma-separated list of whole numbers, got '%s'" % (what, text))
    if any(b < 1 for b in v):
        sys.exit("bench: %s: every batch must be at least 1" % what)
    return v


# --------------------------------------------------------------------------
# SSD300: the generated checkpoint and the output check

def ssd_checkpoint(a, model):
    """bench/out/ssd300_w1_seed<S>.pth, made once by a torch child and reused
    while it and its .json (what was written) match; returns the .json's
    content, with "made": True when it was made in this run."""
    os.makedirs(a.workdir, exist_ok=True)
    path = os.path.join(a.workdir, "ssd300_w%d_seed%d.pth" % (model["kwargs"]["width"],
                                                              a.ssd_seed))
    meta_path = path + ".json"
    model["path"] = path
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        if (meta.get("version") == SSD_GEN_VERSION and meta.get("seed") == a.ssd_seed and
                meta.get("kwargs") == model["kwargs"] and
                os.path.getsize(path) == meta.get("bytes")):
            meta["made"] = False
            return meta
    except (OSError, ValueError):
        pass
    print("making %s (torch.manual_seed(%d), %s(%s)) ..."
          % (os.path.relpath(path, ROOT), a.ssd_seed, model["cls"],
             ", ".join("%s=%r" % kv for kv in model["kwargs"].items())), flush=True)
    cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "cls": model["cls"],
           "kwargs": model["kwargs"], "seed": a.ssd_seed, "path": path,
           "version": SSD_GEN_VERSION}
    p = subprocess.run([a.python, "-c", GEN_CHILD, json.dumps(cfg)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.exit("bench: making %s failed:\n%s" % (path, p.stderr.strip()))
    meta = last_json(p.stdout)
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    meta["made"] = True
    return meta


def ssd_check(a, tmpdir, model, batch, plain):
    """Before any timing: ckpt's outputs against torch's on one input.

    bench_forward --dump (default; and --plain when PLAIN) writes its input
    and outputs; a torch child runs the model on that input, compares, and
    writes a reference file; then `ckpt verify --reference` on it."""
    t0 = time.perf_counter()
    dumps = []
    for label, pl in [("default", False)] + ([("plain", True)] if plain else []):
        d = os.path.join(tmpdir, "dump_" + label)
        os.makedirs(d)
        res = measure(ckpt_argv(a, model, batch, 1, "cpu", plain=pl, warmup=0, dump=d),
                      tmpdir, "bench_forward --dump %s batch %d%s"
                      % (model["label"], batch, " --plain" if pl else ""))
        dumps.append([label, d, res["dump"]])
    with open(os.path.join(ROOT, model["spec"])) as f:
        outputs = json.load(f)["outputs"]
    ref = os.path.join(tmpdir, "ssd300_check.ref.pth")
    cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "cls": model["cls"],
           "kwargs": model["kwargs"], "ckpt": model["path"], "dumps": dumps,
           "outputs": outputs, "ref": ref}
    p = subprocess.run([a.python, "-c", CHECK_CHILD, json.dumps(cfg)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.exit("bench: the torch side of the output check failed:\n%s" % p.stderr.strip())
    res = last_json(p.stdout)
    # the CLI on a reference made from the same input
    argv = [a.ckpt, "verify", "--json", "--device", "cpu", "--model",
            os.path.join(ROOT, model["spec"]), "--reference", ref, model["path"]]
    tv = time.perf_counter()
    rc, out, err, rss, _ = run_child(argv, tmpdir)
    verify_s = time.perf_counter() - tv
    if rc not in (0, 1):
        sys.exit("bench: ckpt verify failed (exit %d):\n%s" % (rc, err.strip()))
    doc = json.loads(out)
    if not doc["load"]["ok"]:
        sys.exit("bench: ckpt verify: the load failed:\n%s" % doc["load"]["message"])
    rows = []
    for o in doc["outputs"]:
        r = o["reference"]
        rows.append({"name": o["name"], "shape": o["shape"], "max_abs": r["max_abs"],
                     "max_ref": r["max_abs_reference"], "max_rel": r["max_rel"],
                     "equal": r["max_abs"] == 0 and r["shape_ok"], "shape_ok": r["shape_ok"],
                     "cli_pass": r["pass"], "atol": r["atol"], "rtol": r["rtol"]})
    res["paths"].append({"label": "verify", "outputs": rows, "result": doc["result"],
                         "rc": rc, "seconds": verify_s, "rss_kib": rss,
                         "device": doc["device_description"]})
    for pth in res["paths"]:
        for r in pth["outputs"]:
            shape_ok = r.get("shape_ok", r["shape"] == r.get("torch_shape", r["shape"]))
            if not shape_ok or "max_abs" not in r:
                r["ok"], r["why"] = False, "shape %s, torch %s" % (r["shape"],
                                                                   r.get("torch_shape"))
            elif r["name"] == "priors":
                r["ok"] = r["equal"]
                r["why"] = "bit-equal" if r["ok"] else "not bit-equal"
            else:
                r["ok"] = r["max_rel"] <= SSD_MAX_REL and not r.get("nonfinite")
                r["why"] = "≤ %g" % SSD_MAX_REL if r["ok"] else "over %g" % SSD_MAX_REL
    res["ok"] = all(r["ok"] for pth in res["paths"] for r in pth["outputs"])
    res["batch"] = batch
    res["seconds"] = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------
# measuring

def run_group(a, tmpdir, grp, variants, bt, tt, gpu):
    cpu, gpu_rows = [], []
    w = grp.warmup
    for model in grp.models:
        for batch in grp.batches:
            runs = grp.runs_for(batch)
            jobs = [
                ("torch", lambda: torch_row(a, tmpdir, model, batch, runs, w)),
                ("blas", lambda: ckpt_row(a, tmpdir, model, batch, runs, w)),
            ]
            if grp.plain(batch):
                jobs.append(("plain", lambda: ckpt_row(a, tmpdir, model, batch, runs, w,
                                                       plain=True)))
            if variants:
                jobs += [
                    ("torch_bt", lambda: torch_row(a, tmpdir, model, batch, runs, w,
                                                   threads=bt)),
                    ("blas_tt", lambda: ckpt_row(a, tmpdir, model, batch, runs, w,
                                                 env={"OPENBLAS_NUM_THREADS": str(tt)})),
                ]
            if gpu:
                jobs += [
                    ("g_torch", lambda: torch_row(a, tmpdir, model, batch, runs, w,
                                                  device="cuda:0")),
                    ("g_torch_copies", lambda: torch_row(a, tmpdir, model, batch, runs, w,
                                                         device="cuda:0", copies=True)),
                    ("g_ckpt", lambda: ckpt_row(a, tmpdir, model, batch, runs, w,
                                                device="cuda:0")),
                ]
            print("%s, batch %d: %d lines x %d rounds of %d forwards ..."
                  % (model["label"], batch, len(jobs), grp.rounds, runs), flush=True)
            got = {k: [] for k, _ in jobs}
            for rnd in range(grp.rounds):
                k0 = rnd % len(jobs)
                for key, job in jobs[k0:] + jobs[:k0]:
                    got[key].append(job())
            rows = {k: combine(v) for k, v in got.items() if not k.startswith("g_")}
            cpu.append((model, batch, runs, rows))
            if gpu:
                gpu_rows.append((model, batch, runs,
                                 {k[2:]: combine(v) for k, v in got.items()
                                  if k.startswith("g_")}))
    return cpu, gpu_rows


# --------------------------------------------------------------------------
# tables

def tables(cpu, gpu_rows, names, plain_skipped):
    """The CPU table, the GPU table, the requirements table and the verdicts."""
    lines = ["| model | batch | implementation | median ms | min ms | peak RSS MiB "
             "| ratio vs torch (≤ %g) |" % MAX_RATIO_CPU,
             "|---|---:|---|---:|---:|---:|---:|"]
    for model, batch, runs, rows in cpu:
        base = rows["torch"]["median_ms"]
        for key in ("torch", "blas", "plain", "torch_bt", "blas_tt"):
            if key not in rows:
                if key == "plain" and plain_skipped:
                    lines.append("| %s | %d | %s | not measured (see below) | – | – | – |"
                                 % (model["label"], batch, names[key]))
                continue
            r = rows[key]
            lines.append("| %s | %d | %s | %s | %s | %s | %.2f× |"
                         % (model["label"], batch, names[key], fmt(r["median_ms"]),
                            fmt(r["min_ms"]), mib(r["rss_kib"]), r["median_ms"] / base))
    glines = []
    if gpu_rows:
        glines = ["| model | batch | implementation | median ms | min ms | peak RSS MiB "
                  "| ratio vs torch incl. copies (≤ %g) | ratio vs torch compute only |"
                  % MAX_RATIO_GPU,
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        gnames = {"torch": "PyTorch cuda:0, input already on the GPU",
                  "torch_copies": "PyTorch cuda:0, incl. input H2D and outputs D2H",
                  "ckpt": "ckpt cuda:0 (incl. input and output copies)"}
        for model, batch, runs, g in gpu_rows:
            for key in ("torch", "torch_copies", "ckpt"):
                r = g[key]
                glines.append("| %s | %d | %s | %s | %s | %s | %.2f× | %.2f× |"
                              % (model["label"], batch, gnames[key], fmt(r["median_ms"]),
                                 fmt(r["min_ms"]), mib(r["rss_kib"]),
                                 r["median_ms"] / g["torch_copies"]["median_ms"],
                                 r["median_ms"] / g["torch"]["median_ms"]))

    req = ["| model | batch | CPU: ckpt ≤ %gx torch | ckpt / torch, round by round "
           "| ckpt / torch, minima | CPU: plain C ≤ %gx torch (informative) "
           "| GPU: ckpt ≤ %gx torch incl. copies |"
           % (MAX_RATIO_CPU, MAX_RATIO_CPU, MAX_RATIO_GPU),
           "|---|---:|---|---|---:|---|---|"]
    min_misses, misses, plain_misses, gpu_misses = [], [], [], []
    gmap = {(m["label"], b): g for m, b, _, g in gpu_rows}
    for model, batch, runs, rows in cpu:
        label = model["label"]
        base = rows["torch"]["median_ms"]
        rb = rows["blas"]["median_ms"] / base
        if rb > MAX_RATIO_CPU:
            misses.append("%s batch %d (%.2f×)" % (label, batch, rb))
        if "plain" in rows:
            rp = rows["plain"]["median_ms"] / base
            if rp > MAX_RATIO_CPU:
                plain_misses.append("%s batch %d (%.2f×)" % (label, batch, rp))
            pcell = verdict(rp, MAX_RATIO_CPU)
        else:
            pcell = "not measured"
        g = gmap.get((label, batch))
        if g:
            rg = g["ckpt"]["median_ms"] / g["torch_copies"]["median_ms"]
            gcell = verdict(rg, MAX_RATIO_GPU)
            if rg > MAX_RATIO_GPU:
                gpu_misses.append("%s batch %d (%.2f×)" % (label, batch, rg))
        else:
            gcell = "not measured (no GPU)"
        by_round = " ".join("%.2f" % (b / t) for b, t in zip(rows["blas"]["rounds_ms"],
                                                             rows["torch"]["rounds_ms"]))
        rmin = rows["blas"]["min_ms"] / rows["torch"]["min_ms"]
        if rb <= MAX_RATIO_CPU < rmin:
            min_misses.append("%s batch %d (%.2f×)" % (label, batch, rmin))
        req.append("| %s | %d | %s | %s | %.2f× | %s | %s |"
                   % (label, batch, verdict(rb, MAX_RATIO_CPU), by_round, rmin, pcell, gcell))

    cpu_verdict = ("met (every row ≤ %g×)" % MAX_RATIO_CPU if not misses
                   else "NOT met: " + "; ".join(misses))
    if min_misses:
        cpu_verdict += (" on the medians, but narrowly: the ratio of the minima (each side's "
                        "fastest forward) is over %g× on %s"
                        % (MAX_RATIO_CPU, "; ".join(min_misses)))
    measured_plain = [1 for _, _, _, rows in cpu if "plain" in rows]
    if not measured_plain:
        plain_verdict = "not measured"
    else:
        plain_verdict = ("within %g× on every row measured" % MAX_RATIO_CPU
                         if not plain_misses
                         else "over %g× on %s" % (MAX_RATIO_CPU, "; ".join(plain_misses)))
    gpu_verdict = None
    if gpu_rows:
        gpu_verdict = ("GPU goal (≤ %g× PyTorch on the same GPU, incl. copies) %s"
                       % (MAX_RATIO_GPU, "met" if not gpu_misses
                          else "NOT met: " + "; ".join(gpu_misses)))
    return lines, glines, req, cpu_verdict, plain_verdict, gpu_verdict


def check_table(chk):
    names = {"default": "bench_forward, cpu: the default backend",
             "plain": "bench_forward, cpu: plain-C loops (--plain)",
             "verify": "`ckpt verify --device cpu --reference` (the CLI)"}
    out = ["| ckpt path | output | shape | max \\|torch\\| | max abs diff | max rel "
           "(≤ %g; priors: bit-equal) | result |" % SSD_MAX_REL,
           "|---|---|---|---:|---:|---:|---|"]
    for pth in chk["paths"]:
        for r in pth["outputs"]:
            if "max_abs" in r:
                out.append("| %s | %s | %s | %.4g | %.3g | %.3g | %s (%s) |"
                           % (names[pth["label"]], r["name"],
                              "[%s]" % ",".join(map(str, r["shape"])), r["max_ref"],
                              r["max_abs"], r["max_rel"], "PASS" if r["ok"] else "FAIL",
                              r["why"]))
            else:
                out.append("| %s | %s | %s | – | – | – | FAIL (%s) |"
                           % (names[pth["label"]], r["name"],
                              "[%s]" % ",".join(map(str, r["shape"])), r["why"]))
    return out


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODEL_ORDER),
                    help="comma-separated, from %s (default: all)" % ", ".join(MODEL_ORDER))
    ap.add_argument("--runs", type=int, default=None,
                    help="MLP, autoencoder: timed forwards per line (default %d at batch 1, "
                    "%d otherwise)" % (DEFAULT_RUNS[1], DEFAULT_RUNS_LARGE))
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help="MLP, autoencoder: child processes per line, run round-robin with "
                    "the order rotating (default %d); a line's median is the median of its "
                    "rounds'" % DEFAULT_ROUNDS)
    ap.add_argument("--batches", default="1,256",
                    help="MLP, autoencoder: comma-separated (default 1,256)")
    ap.add_argument("--ssd-runs", type=int, default=SSD_RUNS,
                    help="SSD300: timed forwards per line (default %d)" % SSD_RUNS)
    ap.add_argument("--ssd-rounds", type=int, default=SSD_ROUNDS,
                    help="SSD300: child processes per line (default %d)" % SSD_ROUNDS)
    ap.add_argument("--ssd-warmup", type=int, default=SSD_WARMUP,
                    help="SSD300: untimed forwards first in each child (default %d)"
                    % SSD_WARMUP)
    ap.add_argument("--ssd-batches", default=SSD_BATCHES,
                    help="SSD300: comma-separated (default %s)" % SSD_BATCHES)
    ap.add_argument("--ssd-plain-batches", default=SSD_PLAIN_BATCHES,
                    help="SSD300: the batches at which the plain-C loops are timed too "
                    "(default %s; '' for none; about 5 s an image here)" % SSD_PLAIN_BATCHES)
    ap.add_argument("--ssd-check-batch", type=int, default=SSD_CHECK_BATCH,
                    help="SSD300: the batch of the output check (default %d)"
                    % SSD_CHECK_BATCH)
    ap.add_argument("--ssd-seed", type=int, default=SSD_SEED,
                    help="SSD300: torch.manual_seed of the generated checkpoint (default %d)"
                    % SSD_SEED)
    ap.add_argument("--bench-forward", default=os.path.join(HERE, "bench_forward"),
                    help="the driver (make bench/bench_forward)")
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"),
                    help="the CLI: its --version line, and `ckpt verify` in the SSD300 check")
    ap.add_argument("--python", default=sys.executable, help="Python with torch")
    ap.add_argument("--workdir", default=os.path.join(HERE, "out"),
                    help="where the generated SSD300 checkpoint goes (default bench/out)")
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--no-thread-variants", action="store_true",
                    help="skip the informative lines that run torch at OpenBLAS's thread "
                    "count and OpenBLAS at torch's, when the two differ")
    ap.add_argument("--no-results", action="store_true",
                    help="print only; leave RESULTS.md alone")
    a = ap.parse_args()
    a.bench_forward = os.path.abspath(a.bench_forward)
    a.ckpt = os.path.abspath(a.ckpt)
    a.workdir = os.path.abspath(a.workdir)
    keys = [k.strip() for k in a.models.split(",") if k.strip()]
    bad = [k for k in keys if k not in MODELS]
    if bad or not keys:
        sys.exit("bench: --models: unknown %s (choose from %s)"
                 % (", ".join(bad) or "(none given)", ", ".join(MODEL_ORDER)))
    keys = [k for k in MODEL_ORDER if k in keys]
    if a.rounds < 1 or (a.runs is not None and a.runs < 1) or a.ssd_rounds < 1 or \
            a.ssd_runs < 1 or a.ssd_warmup < 0 or a.ssd_check_batch < 1:
        sys.exit("bench: --rounds, --runs, --ssd-rounds, --ssd-runs and --ssd-check-batch "
                 "must be at least 1, --ssd-warmup at least 0")
    batches = int_list(a.batches, "--batches")
    ssd_batches = int_list(a.ssd_batches, "--ssd-batches")
    ssd_plain = int_list(a.ssd_plain_batches, "--ssd-plain-batches")
    if not os.access(a.bench_forward, os.X_OK):
        sys.exit("bench: %s is not an executable (make bench/bench_forward first)"
                 % a.bench_forward)
    if "ssd300" in keys and not os.access(a.ckpt, os.X_OK):
        sys.exit("bench: %s is not an executable (make ckpt first): the SSD300 check runs "
                 "`ckpt verify`" % a.ckpt)
    models = {k: dict(MODELS[k]) for k in MODEL_ORDER}
    for m in models.values():
        if m["ckpt"]:
            m["path"] = os.path.join(ROOT, m["ckpt"])
    digest = bi.file_digest(a.bench_forward)
    rev = bi.git_rev()  # at the start: the tree may move on while this runs
    groups = []
    mnist = [models[k] for k in keys if MODELS[k]["section"] == SECTION]
    if mnist:
        groups.append(Group("mnist", SECTION, mnist, batches, a.runs, a.rounds, WARMUP, None))
    if "ssd300" in keys:
        groups.append(Group("ssd", SSD_SECTION, [models["ssd300"]], ssd_batches, a.ssd_runs,
                            a.ssd_rounds, a.ssd_warmup, set(ssd_plain)))

    tmpdir = tempfile.mkdtemp(prefix="bench_verify.")
    probe_model = models["mlp"]  # small and committed: for the probes
    try:
        # ---- what the machine offers
        p = subprocess.run([a.python, "-c", PROBE_CHILD], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("bench: %s cannot import torch:\n%s" % (a.python, p.stderr.strip()))
        probe = last_json(p.stdout)
        rc, out, err, _, _ = run_child(ckpt_argv(a, probe_model, 1, 1, "cuda:0"), tmpdir)
        ckpt_gpu = rc == 0
        ckpt_gpu_why = last_json(out)["description"] if ckpt_gpu else \
            (err.strip().splitlines() or ["exit %d" % rc])[-1]
        gpu = probe["cuda"] and ckpt_gpu
        gpu_why = None
        if gpu:
            gpu_note = "GPU: torch sees %s; ckpt opens %s" % (probe["gpu"], ckpt_gpu_why)
        else:
            why = []
            if not probe["cuda"]:
                why.append("torch.cuda.is_available() is False")
            if not ckpt_gpu:
                why.append("bench_forward cuda:0: %s" % ckpt_gpu_why.replace(
                    "bench_forward: ", ""))
            gpu_note = "no GPU on this machine: GPU rows not measured"
            gpu_why = "; ".join(why)
        print(gpu_note + (" (%s)" % gpu_why if gpu_why else ""), flush=True)

        # ---- the CPU backend and the thread counts
        rc, out, err, _, _ = run_child(ckpt_argv(a, probe_model, 1, 1, "cpu"), tmpdir)
        if rc != 0:
            sys.exit("bench: bench_forward on the cpu failed:\n%s" % err.strip())
        blas_desc = last_json(out)["description"]
        tt, bt = probe["threads"], blas_threads(blas_desc)
        variants = not a.no_thread_variants and bt and tt != bt

        # ---- the lines, group by group (SSD300: the checkpoint and the check first)
        results = []
        for grp in groups:
            t_start = time.perf_counter()
            extra = {}
            if grp.key == "ssd":
                model = grp.models[0]
                extra["gen"] = ssd_checkpoint(a, model)
                print("SSD300: checking ckpt's outputs against torch's at batch %d ..."
                      % a.ssd_check_batch, flush=True)
                extra["check"] = ssd_check(a, tmpdir, model, a.ssd_check_batch,
                                           bool(grp.plain_batches & set(grp.batches)))
                print("\n".join(check_table(extra["check"])), flush=True)
                if not extra["check"]["ok"]:
                    print("bench: the SSD300 outputs do NOT match torch's; timing anyway",
                          flush=True)
            cpu, gpu_rows = run_group(a, tmpdir, grp, variants, bt, tt, gpu)
            results.append((grp, cpu, gpu_rows, extra, time.perf_counter() - t_start))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    same_binary = bi.file_digest(a.bench_forward) == digest

    # ---- the sections
    mi = bi.machine_info()
    ckver = "unknown"
    if os.access(a.ckpt, os.X_OK):
        v = subprocess.run([a.ckpt, "--version"], capture_output=True,
                           text=True).stdout.strip().splitlines()
        ckver = v[0] if v else ckver
    cmd = "/usr/bin/python3 bench/bench_verify.py" + \
        (" --models %s" % ",".join(keys) if keys != MODEL_ORDER else "") + \
        (" --runs %d" % a.runs if a.runs else "") + \
        (" --rounds %d" % a.rounds if a.rounds != DEFAULT_ROUNDS else "") + \
        (" --batches %s" % a.batches if batches != [1, 256] else "") + \
        (" --ssd-runs %d" % a.ssd_runs if a.ssd_runs != SSD_RUNS else "") + \
        (" --ssd-rounds %d" % a.ssd_rounds if a.ssd_rounds != SSD_ROUNDS else "") + \
        (" --ssd-warmup %d" % a.ssd_warmup if a.ssd_warmup != SSD_WARMUP else "") + \
        (" --ssd-batches %s" % a.ssd_batches if ssd_batches != int_list(SSD_BATCHES, "")
         else "") + \
        (" --ssd-plain-batches '%s'" % a.ssd_plain_batches
         if ssd_plain != int_list(SSD_PLAIN_BATCHES, "") else "") + \
        (" --ssd-check-batch %d" % a.ssd_check_batch
         if a.ssd_check_batch != SSD_CHECK_BATCH else "") + \
        (" --ssd-seed %d" % a.ssd_seed if a.ssd_seed != SSD_SEED else "") + \
        (" --no-thread-variants" if a.no_thread_variants else "") + \
        (" --bench-forward %s" % a.bench_forward
         if a.bench_forward != os.path.join(HERE, "bench_forward") else "") + \
        (" --ckpt %s" % a.ckpt if a.ckpt != os.path.join(ROOT, "ckpt") else "")
    texts = []
    for grp, cpu, gpu_rows, extra, elapsed in results:
        torch_threads = cpu[0][3]["torch"]["threads"]
        names = {
            "torch": "PyTorch CPU forward (%d thread%s, the default)"
                     % (torch_threads, "" if torch_threads == 1 else "s"),
            "blas": "ckpt, cpu: %s (the default CPU backend)" % products_label(blas_desc),
            "plain": "ckpt, cpu: plain-C loops (--plain)",
            "torch_bt": "PyTorch, torch.set_num_threads(%s) (informative)" % bt,
            "blas_tt": "ckpt, cpu: %d thread%s, OPENBLAS_NUM_THREADS=%d (informative)"
                       % (torch_threads, "" if torch_threads == 1 else "s", torch_threads),
        }
        plain_skipped = [b for b in grp.batches if not grp.plain(b)]
        lines, glines, req, cpu_verdict, plain_verdict, gpu_verdict = \
            tables(cpu, gpu_rows, names, plain_skipped)
        if gpu_verdict is None:
            gpu_verdict = "GPU goal: %s" % gpu_note
        loads = [x for _, _, _, rows in cpu + gpu_rows for r in rows.values()
                 for x in r["loadavgs"]]
        runs_desc = ", ".join("%d at batch %d" % (grp.runs_for(b), b) for b in grp.batches)
        t0 = cpu[0][3]["torch"]
        out = [grp.section, ""]
        if grp.key == "mnist":
            out.append("Requirement: the forward pass of both models in `models/` (the MNIST "
                       "MLP and the conv autoencoder) at batch 1 and 256, on the CPU within %g× "
                       "of PyTorch's CPU forward measured in the same run; on a GPU, when the "
                       "machine has one, within %g× of PyTorch on the same GPU."
                       % (MAX_RATIO_CPU, MAX_RATIO_GPU))
        else:
            out.append("Requirement: the full SSD300 forward at batch 1 and 8, on the CPU "
                       "against PyTorch's CPU forward in the same run, on a GPU, when one is "
                       "lent, against PyTorch on the same GPU. The goal: CPU within %g× of "
                       "PyTorch, GPU within %g×." % (MAX_RATIO_CPU, MAX_RATIO_GPU))
        out.append("")
        out.append("- Date: %s" % datetime.datetime.now().astimezone().strftime(
            "%Y-%m-%d %H:%M %Z"))
        out.append("- Machine: %s, %s cores, %s RAM; %s (kernel %s)"
                   % (mi["cpu"], mi["cores"], mi["ram"], mi["os"], mi["kernel"]))
        out.append("- Software: %s (git %s); `bench/bench_forward` sha256 %s…; ckpt CPU "
                   "backend: %s; Python %s, torch %s (%d intra-op thread%s by default)"
                   % (ckver, rev, digest[:12], blas_desc, mi["python"], t0["torch"],
                      torch_threads, "" if torch_threads == 1 else "s"))
        out.append("- %s%s" % (gpu_note[0].upper() + gpu_note[1:],
                               " (%s)" % gpu_why if gpu_why else ""))
        if grp.key == "mnist":
            out.append("- Models: %s; input a fixed pseudo-random batch of shape "
                       "[B, 1, 28, 28] in [0, 1)."
                       % " and ".join(MODEL_DESC[k] for k in keys if k in MODEL_DESC))
        else:
            gen = extra["gen"]
            out.append("- Model: `models/ssd300.json` with a full-width checkpoint made at "
                       "benchmark time (not committed): tests/fixtures/models.py "
                       "`SSD300(width=1)` (ssd.pytorch's layout, 21 classes), "
                       "`torch.manual_seed(%d)`, every conv weight re-initialised with "
                       "`kaiming_normal_(mode='fan_in', nonlinearity='relu')` (the biases "
                       "keep torch's default init, `L2Norm.weight` 20) so that the input "
                       "shapes the outputs (with the default init it moves them by under 1%%, "
                       "and a wrong early layer could hide under the check's 1e-4), its "
                       "state dict (%d tensors, %s float32 parameters) written by `torch.save` "
                       "to `%s` (%.1f MiB; %s). %.1f GMAC an image (conv2d). Outputs `loc` "
                       "[B, 8732, 4], `conf` [B, 8732, 21], `priors` [8732, 4]. Input a fixed "
                       "pseudo-random batch of shape [B, 3, 300, 300] in [0, 1) (torch: "
                       "`torch.rand`; ckpt: bench_forward's own generator)."
                       % (gen["seed"], gen["tensors"], "{:,}".format(gen["params"]),
                          os.path.relpath(models["ssd300"]["path"], ROOT),
                          gen["bytes"] / 2**20,
                          "made in this run, %.0f s" % gen["seconds"] if gen["made"]
                          else "reused from an earlier run, torch %s" % gen["torch"],
                          gen["gmac"]))
            chk = extra["check"]
            ver = [pth for pth in chk["paths"] if pth["label"] == "verify"][0]
            out.append("- Output check, before the timing, at batch %d: bench_forward "
                       "`--dump` wrote its input and outputs (the default backend%s); torch ran the "
                       "model on that input; then `ckpt verify --json --device cpu --reference` "
                       "on a reference file of torch's outputs for that input (the CLI: %s at "
                       "its default tolerance, exit %d, %.1f s, peak RSS %s MiB). Criterion: "
                       "max |ckpt − torch| ≤ %g × max |torch| for each output, `priors` bit "
                       "for bit. %s; the check took %.0f s."
                       % (chk["batch"],
                          " and the plain-C loops" if len(chk["paths"]) > 2 else "",
                          ver["result"], ver["rc"], ver["seconds"], mib(ver["rss_kib"]),
                          SSD_MAX_REL,
                          "Every output matches" if chk["ok"]
                          else "**Outputs do NOT match: the timings below are of a wrong "
                               "forward**", chk["seconds"]))
        out.append("- Method: every line is %d child processes (rounds), run round-robin "
                   "with the other lines of the same model and batch, the order rotating "
                   "from round to round; each loads the model, runs %d warm-up forward%s and "
                   "then the timed ones (%s) and reports the median and minimum time of one "
                   "forward. A line's median is the median of its rounds' medians, its "
                   "minimum the least of all. PyTorch: `torch.load(map_location='cpu')`, "
                   "strict `load_state_dict`, `eval()`, `torch.no_grad()`, "
                   "`time.perf_counter()` around `model(x)`. ckpt: `bench/bench_forward` "
                   "(strict bind of the root state dict), `CLOCK_MONOTONIC` around "
                   "`ckpt_model_run()`, which also copies the input in and the outputs out "
                   "to freshly allocated host arrays. Peak RSS is the whole child process's "
                   "ru_maxrss (%s): for torch it includes the interpreter and `import torch` "
                   "(%.0f MiB before the first forward%s). The 1-minute load average before "
                   "the lines was %.2f–%.2f (the benchmark itself accounts for about 1). "
                   "This part of the run took %.0f s."
                   % (grp.rounds, grp.warmup, "" if grp.warmup == 1 else "s", runs_desc,
                      t0["rss_how"], t0["maxrss_before_forward_kib"] / 1024.0,
                      ", the model loaded" if grp.key == "ssd" else "",
                      min(loads), max(loads), elapsed))
        out.append("- Command: `%s` (after `make ckpt bench/bench_forward`)" % cmd)
        out.append("")
        if grp.key == "ssd":
            out.append("Output check (batch %d):" % extra["check"]["batch"])
            out.append("")
            out.extend(check_table(extra["check"]))
            out.append("")
        out.append("CPU:")
        out.append("")
        out.extend(lines)
        out.append("")
        out.append("Ratio = median of the line / median of PyTorch's CPU forward with its "
                   "default thread count, same model and batch (lower is better; the goal: "
                   "≤ %g)." % MAX_RATIO_CPU)
        if "torch_bt" in cpu[0][3]:
            out.append("The informative lines run each side at the other's thread count: "
                       "PyTorch defaults to %d intra-op thread%s here and ckpt (as many as "
                       "OpenBLAS runs) to %s."
                       % (torch_threads, "" if torch_threads == 1 else "s", bt))
        if plain_skipped:
            plain_ms = [rows["plain"]["median_ms"] / b for _, b, _, rows in cpu
                        if "plain" in rows]
            out.append("The plain-C loops are not measured at batch %s: they run on one "
                       "thread and image by image%s, so a forward there would take about "
                       "%s× batch 1's, and %d rounds of %d forwards would take longer than "
                       "the rest of the benchmark (`--ssd-plain-batches` times them anyway)."
                       % (", ".join(map(str, plain_skipped)),
                          " (%.1f s an image at batch 1)" % (min(plain_ms) / 1e3)
                          if plain_ms else "",
                          "/".join(map(str, plain_skipped)),
                          grp.rounds, grp.warmup + grp.runs_for(plain_skipped[0])))
        out.append("")
        if glines:
            out.append("GPU:")
            out.append("")
            out.extend(glines)
            out.append("")
            out.append("Ratio = median of the line / median of PyTorch on the same GPU "
                       "including the input's host→device copy and every output's copy back "
                       "(the same work as ckpt's time; the goal: ≤ %g); the last column "
                       "divides by PyTorch's forward with the input already on the GPU "
                       "(`torch.cuda.synchronize()` before and after each forward)."
                       % MAX_RATIO_GPU)
            out.append("")
        out.append("Requirements:")
        out.append("")
        out.extend(req)
        out.append("")
        out.append("Result: CPU goal (≤ %g× PyTorch's CPU forward, default CPU backend) %s. "
                   "Plain-C path (informative): %s. %s."
                   % (MAX_RATIO_CPU, cpu_verdict, plain_verdict, gpu_verdict))
        if grp.key == "ssd" and not extra["check"]["ok"]:
            out.append("")
            out.append("WARNING: ckpt's outputs do not match torch's (see the output check).")
        if not same_binary:
            out.append("")
            out.append("WARNING: bench/bench_forward changed during the run; these numbers "
                       "mix two builds.")
        texts.append((grp.section, "\n".join(out) + "\n"))

    for _, text in texts:
        print()
        print(text)
    if not a.no_results:
        if not same_binary:
            print("bench/bench_forward changed during the run: %s left alone" % a.results)
        else:
            for section, text in texts:
                bi.update_results(os.path.abspath(a.results), text, section)
            print("updated %s" % a.results)


if __name__ == "__main__":
    main()
