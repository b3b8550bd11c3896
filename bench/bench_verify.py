#!/usr/bin/python3
"""Benchmark ckpt's model forward pass (`ckpt verify`'s runtime) against PyTorch (issue 5).

The goal: the forward pass of both models in models/ (the MNIST MLP and the
conv autoencoder), at batch 1 and 256, within 2x of PyTorch's CPU forward
on the CPU, measured in the same run; on a GPU, when the machine has one,
within 1.5x of PyTorch on the same GPU.  This script

  1. times PyTorch's forward in a child process (torch.load with
     map_location='cpu', the tests/fixtures/models.py class,
     load_state_dict (strict), eval(), torch.no_grad(), the default thread
     count), 3 warm-up forwards then RUNS timed ones, perf_counter around
     each forward;
  2. times ckpt's forward with bench/bench_forward (the same warm-up and
     runs, CLOCK_MONOTONIC around each ckpt_model_run(), which includes
     copying the input in and the outputs out): on the CPU with OpenBLAS
     (the default CPU backend) and with the plain-C loops (--plain);
  3. when torch sees CUDA and bench_forward can open cuda:0, times torch on
     the GPU twice (the input already on the GPU, torch.cuda.synchronize()
     around each forward; and including the host->device copy of the input
     and the copy of every output back, as ckpt's time does) and ckpt on
     cuda:0; otherwise records that the GPU rows were not measured;
  4. runs every line as --rounds child processes, round-robin with the
     other lines of the same model and batch, the order rotating, and takes
     the median of the rounds' medians (this 2-core VM's speed drifts by
     up to 2x from minute to minute); measures the peak RSS of every child
     (GNU time, wait4 ru_maxrss);
  5. prints a table with ratio = ckpt median / torch median (lower is
     better; goal <= 2 on the CPU, <= 1.5 on the GPU) and replaces the
     section "## ckpt verify: model forward (issue 5)" of bench/RESULTS.md.

Run with the Python that has torch (here /usr/bin/python3), after
`make bench/bench_forward`:

    /usr/bin/python3 bench/bench_verify.py [--runs N] [--rounds 5] [--batches 1,256]
        [--bench-forward bench/bench_forward] [--results bench/RESULTS.md]
        [--no-thread-variants] [--no-results]

This process never imports torch itself (children do), so that its own
memory stays small; see bench_inspect.py's measure_rss() for why.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
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
GNU_TIME = bi.GNU_TIME
WARMUP = 3  # bench_forward's too
MAX_RATIO_CPU = 2.0
MAX_RATIO_GPU = 1.5
DEFAULT_RUNS = {1: 500}  # other batch sizes: DEFAULT_RUNS_LARGE
DEFAULT_RUNS_LARGE = 50
DEFAULT_ROUNDS = 5

# (label, spec, checkpoint, class in tests/fixtures/models.py)
MODELS = [
    ("MLP", "models/mnist_mlp.json", "tests/data/fmnist_mlp.pth", "MLP"),
    ("autoencoder", "models/mnist_autoencoder.json", "tests/data/fmnist_ae.pth",
     "Autoencoder"),
]

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
model = getattr(models, cfg["cls"])()
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


def torch_row(a, tmpdir, model, batch, runs, device="cpu", copies=False, threads=0):
    label, spec, ckpt, cls = model
    with open(os.path.join(ROOT, spec)) as f:
        shape = json.load(f)["inputs"][0]["shape"]
    cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "cls": cls,
           "ckpt": os.path.join(ROOT, ckpt), "shape": shape, "batch": batch,
           "runs": runs, "warmup": WARMUP, "device": device, "copies": copies,
           "threads": threads}
    return measure([a.python, "-c", TORCH_CHILD, json.dumps(cfg)], tmpdir,
                   "torch %s batch %d on %s" % (label, batch, device))


def ckpt_argv(a, model, batch, runs, device, plain=False):
    _, spec, ckpt, _ = model
    return ([a.bench_forward] + (["--plain"] if plain else []) +
            [os.path.join(ROOT, spec), os.path.join(ROOT, ckpt), str(batch), str(runs),
             device])


def ckpt_row(a, tmpdir, model, batch, runs, device="cpu", plain=False, env=None):
    return measure(ckpt_argv(a, model, batch, runs, device, plain), tmpdir,
                   "bench_forward %s batch %d on %s%s"
                   % (model[0], batch, device, " --plain" if plain else ""), env)


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


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=None,
                    help="timed forwards per line (default %d at batch 1, %d otherwise)"
                    % (DEFAULT_RUNS[1], DEFAULT_RUNS_LARGE))
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help="child processes per line, run round-robin with the order "
                    "rotating (default %d); a line's median is the median of its rounds'"
                    % DEFAULT_ROUNDS)
    ap.add_argument("--batches", default="1,256", help="comma-separated (default 1,256)")
    ap.add_argument("--bench-forward", default=os.path.join(HERE, "bench_forward"),
                    help="the driver (make bench/bench_forward)")
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "ckpt"),
                    help="the CLI, only for its --version line")
    ap.add_argument("--python", default=sys.executable, help="Python with torch")
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--no-thread-variants", action="store_true",
                    help="skip the informative lines that run torch at OpenBLAS's thread "
                    "count and OpenBLAS at torch's, when the two differ")
    ap.add_argument("--no-results", action="store_true",
                    help="print only; leave RESULTS.md alone")
    a = ap.parse_args()
    a.bench_forward = os.path.abspath(a.bench_forward)
    if a.rounds < 1 or (a.runs is not None and a.runs < 1):
        sys.exit("bench: --rounds and --runs must be at least 1")
    batches = [int(b) for b in a.batches.split(",") if b.strip()]
    if not os.access(a.bench_forward, os.X_OK):
        sys.exit("bench: %s is not an executable (make bench/bench_forward first)"
                 % a.bench_forward)
    digest = sha256(a.bench_forward)
    t_start = time.perf_counter()

    def runs_for(batch):
        return a.runs or DEFAULT_RUNS.get(batch, DEFAULT_RUNS_LARGE)

    tmpdir = tempfile.mkdtemp(prefix="bench_verify.")
    try:
        # ---- what the machine offers
        p = subprocess.run([a.python, "-c", PROBE_CHILD], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("bench: %s cannot import torch:\n%s" % (a.python, p.stderr.strip()))
        probe = last_json(p.stdout)
        rc, out, err, _, _ = run_child(ckpt_argv(a, MODELS[0], 1, 1, "cuda:0"), tmpdir)
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
        rc, out, err, _, _ = run_child(ckpt_argv(a, MODELS[0], 1, 1, "cpu"), tmpdir)
        if rc != 0:
            sys.exit("bench: bench_forward on the cpu failed:\n%s" % err.strip())
        blas_desc = last_json(out)["description"]
        tt, bt = probe["threads"], blas_threads(blas_desc)
        variants = not a.no_thread_variants and bt and tt != bt

        # ---- the lines: each (model, batch) measured in rounds, order rotating
        cpu, gpu_rows = [], []
        for model in MODELS:
            for batch in batches:
                runs = runs_for(batch)
                jobs = [
                    ("torch", lambda: torch_row(a, tmpdir, model, batch, runs)),
                    ("blas", lambda: ckpt_row(a, tmpdir, model, batch, runs)),
                    ("plain", lambda: ckpt_row(a, tmpdir, model, batch, runs, plain=True)),
                ]
                if variants:
                    jobs += [
                        ("torch_bt", lambda: torch_row(a, tmpdir, model, batch, runs,
                                                       threads=bt)),
                        ("blas_tt", lambda: ckpt_row(a, tmpdir, model, batch, runs,
                                                     env={"OPENBLAS_NUM_THREADS": str(tt)})),
                    ]
                if gpu:
                    jobs += [
                        ("g_torch", lambda: torch_row(a, tmpdir, model, batch, runs,
                                                      device="cuda:0")),
                        ("g_torch_copies", lambda: torch_row(a, tmpdir, model, batch, runs,
                                                             device="cuda:0", copies=True)),
                        ("g_ckpt", lambda: ckpt_row(a, tmpdir, model, batch, runs,
                                                    device="cuda:0")),
                    ]
                print("%s, batch %d: %d lines x %d rounds of %d forwards ..."
                      % (model[0], batch, len(jobs), a.rounds, runs), flush=True)
                got = {k: [] for k, _ in jobs}
                for rnd in range(a.rounds):
                    k0 = rnd % len(jobs)
                    for key, job in jobs[k0:] + jobs[:k0]:
                        got[key].append(job())
                rows = {k: combine(v) for k, v in got.items() if not k.startswith("g_")}
                cpu.append((model, batch, runs, rows))
                if gpu:
                    gpu_rows.append((model, batch, runs,
                                     {k[2:]: combine(v) for k, v in got.items()
                                      if k.startswith("g_")}))
    finally:
        for n in os.listdir(tmpdir):
            os.unlink(os.path.join(tmpdir, n))
        os.rmdir(tmpdir)
    elapsed = time.perf_counter() - t_start
    same_binary = sha256(a.bench_forward) == digest

    # ---- tables
    torch_threads = cpu[0][3]["torch"]["threads"]
    names = {
        "torch": "PyTorch CPU forward (%d thread%s, the default)"
                 % (torch_threads, "" if torch_threads == 1 else "s"),
        "blas": "ckpt, cpu: OpenBLAS%s (the default CPU backend)"
                % (", %d threads" % bt if bt else ""),
        "plain": "ckpt, cpu: plain-C loops (--plain)",
        "torch_bt": "PyTorch, torch.set_num_threads(%s) (informative)" % bt,
        "blas_tt": "ckpt, cpu: OpenBLAS, OPENBLAS_NUM_THREADS=%d (informative)"
                   % torch_threads,
    }
    lines = ["| model | batch | implementation | median ms | min ms | peak RSS MiB "
             "| ratio vs torch (≤ %g) |" % MAX_RATIO_CPU,
             "|---|---:|---|---:|---:|---:|---:|"]
    for model, batch, runs, rows in cpu:
        base = rows["torch"]["median_ms"]
        for key in ("torch", "blas", "plain", "torch_bt", "blas_tt"):
            if key not in rows:
                continue
            r = rows[key]
            lines.append("| %s | %d | %s | %s | %s | %s | %.2f× |"
                         % (model[0], batch, names[key], fmt(r["median_ms"]),
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
                              % (model[0], batch, gnames[key], fmt(r["median_ms"]),
                                 fmt(r["min_ms"]), mib(r["rss_kib"]),
                                 r["median_ms"] / g["torch_copies"]["median_ms"],
                                 r["median_ms"] / g["torch"]["median_ms"]))

    # ---- requirements
    req = ["| model | batch | CPU: OpenBLAS ≤ %gx torch | OpenBLAS / torch, round by round "
           "| OpenBLAS / torch, minima | CPU: plain C ≤ %gx torch (informative) "
           "| GPU: ckpt ≤ %gx torch incl. copies |"
           % (MAX_RATIO_CPU, MAX_RATIO_CPU, MAX_RATIO_GPU),
           "|---|---:|---|---|---:|---|---|"]
    min_misses = []
    misses, plain_misses, gpu_misses = [], [], []
    gmap = {(m[0], b): g for m, b, _, g in gpu_rows}
    for model, batch, runs, rows in cpu:
        base = rows["torch"]["median_ms"]
        rb = rows["blas"]["median_ms"] / base
        rp = rows["plain"]["median_ms"] / base
        if rb > MAX_RATIO_CPU:
            misses.append("%s batch %d (%.2f×)" % (model[0], batch, rb))
        if rp > MAX_RATIO_CPU:
            plain_misses.append("%s batch %d (%.2f×)" % (model[0], batch, rp))
        g = gmap.get((model[0], batch))
        if g:
            rg = g["ckpt"]["median_ms"] / g["torch_copies"]["median_ms"]
            gcell = verdict(rg, MAX_RATIO_GPU)
            if rg > MAX_RATIO_GPU:
                gpu_misses.append("%s batch %d (%.2f×)" % (model[0], batch, rg))
        else:
            gcell = "not measured (no GPU)"
        by_round = " ".join("%.2f" % (b / t) for b, t in zip(rows["blas"]["rounds_ms"],
                                                             rows["torch"]["rounds_ms"]))
        rmin = rows["blas"]["min_ms"] / rows["torch"]["min_ms"]
        if rb <= MAX_RATIO_CPU < rmin:
            min_misses.append("%s batch %d (%.2f×)" % (model[0], batch, rmin))
        req.append("| %s | %d | %s | %s | %.2f× | %s | %s |"
                   % (model[0], batch, verdict(rb, MAX_RATIO_CPU), by_round, rmin,
                      verdict(rp, MAX_RATIO_CPU), gcell))

    cpu_verdict = ("met (every row ≤ %g×)" % MAX_RATIO_CPU if not misses
                   else "NOT met: " + "; ".join(misses))
    if min_misses:
        cpu_verdict += (" on the medians, but narrowly: the ratio of the minima (each side's "
                        "fastest forward) is over %g× on %s"
                        % (MAX_RATIO_CPU, "; ".join(min_misses)))
    plain_verdict = ("within %g× on every row" % MAX_RATIO_CPU if not plain_misses
                     else "over %g× on %s" % (MAX_RATIO_CPU, "; ".join(plain_misses)))
    if gpu_rows:
        gpu_verdict = ("GPU goal (≤ %g× PyTorch on the same GPU, incl. copies) %s"
                       % (MAX_RATIO_GPU, "met" if not gpu_misses
                          else "NOT met: " + "; ".join(gpu_misses)))
    else:
        gpu_verdict = "GPU goal: %s" % gpu_note

    # ---- the section
    mi = bi.machine_info()
    ckver = "unknown"
    if os.access(a.ckpt, os.X_OK):
        v = subprocess.run([a.ckpt, "--version"], capture_output=True,
                           text=True).stdout.strip().splitlines()
        ckver = v[0] if v else ckver
    loads = [x for _, _, _, rows in cpu + gpu_rows for r in rows.values()
             for x in r["loadavgs"]]
    runs_desc = ", ".join("%d at batch %d" % (runs_for(b), b) for b in batches)
    cmd = "/usr/bin/python3 bench/bench_verify.py" + (" --runs %d" % a.runs if a.runs else "") \
        + (" --rounds %d" % a.rounds if a.rounds != DEFAULT_ROUNDS else "") \
        + (" --batches %s" % a.batches if batches != [1, 256] else "") \
        + (" --no-thread-variants" if a.no_thread_variants else "")
    t0 = cpu[0][3]["torch"]
    out = [SECTION, ""]
    out.append("Requirement: the forward pass of both models in `models/` (the MNIST MLP and "
               "the conv autoencoder) at batch 1 and 256, on the CPU within %g× of PyTorch's "
               "CPU forward measured in the same run; on a GPU, when the machine has one, "
               "within %g× of PyTorch on the same GPU." % (MAX_RATIO_CPU, MAX_RATIO_GPU))
    out.append("")
    out.append("- Date: %s" % datetime.datetime.now().astimezone().strftime(
        "%Y-%m-%d %H:%M %Z"))
    out.append("- Machine: %s, %s cores, %s RAM; %s (kernel %s)"
               % (mi["cpu"], mi["cores"], mi["ram"], mi["os"], mi["kernel"]))
    out.append("- Software: %s (git %s); `bench/bench_forward` sha256 %s…; ckpt CPU backend: "
               "%s; Python %s, torch %s (%d intra-op thread%s by default)"
               % (ckver, bi.git_rev(), digest[:12], blas_desc, mi["python"], t0["torch"],
                  torch_threads, "" if torch_threads == 1 else "s"))
    out.append("- %s%s" % (gpu_note[0].upper() + gpu_note[1:],
                           " (%s)" % gpu_why if gpu_why else ""))
    out.append("- Models: `models/mnist_mlp.json` with `tests/data/fmnist_mlp.pth` "
               "(tests/fixtures/models.py `MLP`: 784→128→10) and "
               "`models/mnist_autoencoder.json` with `tests/data/fmnist_ae.pth` "
               "(`Autoencoder`: two stride-2 convolutions, linear 3136→32→3136, two "
               "stride-2 transposed convolutions, sigmoid; outputs `x_hat` and `z`); "
               "input a fixed pseudo-random batch of shape [B, 1, 28, 28] in [0, 1).")
    out.append("- Method: every line is %d child processes (rounds), run round-robin with "
               "the other lines of the same model and batch, the order rotating from round to "
               "round; each loads the model, runs %d warm-up forwards and then the timed ones "
               "(%s) and reports the median and minimum time of one forward. A line's median "
               "is the median of its rounds' medians, its minimum the least of all. PyTorch: `torch.load(map_location='cpu')`, "
               "strict `load_state_dict`, `eval()`, `torch.no_grad()`, `time.perf_counter()` "
               "around `model(x)`. ckpt: `bench/bench_forward` (strict bind of the root "
               "state dict), `CLOCK_MONOTONIC` around `ckpt_model_run()`, which also copies "
               "the input in and the outputs out to freshly allocated host arrays. Peak RSS "
               "is the whole child process's ru_maxrss (%s): for torch it includes the "
               "interpreter and `import torch` (%.0f MiB before the first forward). The "
               "1-minute load average before the lines was %.2f–%.2f (the benchmark itself "
               "accounts for about 1). The whole run took %.0f s."
               % (a.rounds, WARMUP, runs_desc, t0["rss_how"],
                  t0["maxrss_before_forward_kib"] / 1024.0, min(loads), max(loads), elapsed))
    out.append("- Command: `%s` (after `make bench/bench_forward`)" % cmd)
    out.append("")
    out.append("CPU:")
    out.append("")
    out.extend(lines)
    out.append("")
    out.append("Ratio = median of the line / median of PyTorch's CPU forward with its default "
               "thread count, same model and batch (lower is better; the goal: ≤ %g)."
               % MAX_RATIO_CPU)
    if "torch_bt" in cpu[0][3]:
        out.append("The informative lines run each side at the other's thread count: "
                   "PyTorch defaults to %d intra-op thread%s here and ckpt's OpenBLAS to %s."
                   % (torch_threads, "" if torch_threads == 1 else "s", bt))
    out.append("")
    if glines:
        out.append("GPU:")
        out.append("")
        out.extend(glines)
        out.append("")
        out.append("Ratio = median of the line / median of PyTorch on the same GPU including "
                   "the input's host→device copy and every output's copy back (the same work "
                   "as ckpt's time; the goal: ≤ %g); the last column divides by PyTorch's "
                   "forward with the input already on the GPU (`torch.cuda.synchronize()` "
                   "before and after each forward)." % MAX_RATIO_GPU)
        out.append("")
    out.append("Requirements:")
    out.append("")
    out.extend(req)
    out.append("")
    out.append("Result: CPU goal (≤ %g× PyTorch's CPU forward, default CPU backend) %s. "
               "Plain-C path (informative): %s. %s."
               % (MAX_RATIO_CPU, cpu_verdict, plain_verdict, gpu_verdict))
    if not same_binary:
        out.append("")
        out.append("WARNING: bench/bench_forward changed during the run; these numbers "
                   "mix two builds.")
    text = "\n".join(out) + "\n"

    print()
    print(text)
    if not a.no_results:
        if not same_binary:
            print("bench/bench_forward changed during the run: %s left alone" % a.results)
        else:
            bi.update_results(os.path.abspath(a.results), text, SECTION)
            print("updated %s" % a.results)


if __name__ == "__main__":
    main()
