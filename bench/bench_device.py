#!/usr/bin/env python3
"""bench_device.py - the bench models on a GPU machine: ckpt against torch on the
same GPU, and on the machine's many cores (issue 31).

    python3 bench/bench_device.py [--models mlp,ae,ssd300,resnet50,crnn]
        [--gpu-batches 8] [--gpu-models M] [--cpu-batches default] [--rounds 1] [--no-gpu] [--no-cpu]
        [--bench-forward bench/bench_forward] [--workdir /tmp/ckpt-bench-device]
        [--out DIR]

Made for the short leases of a lent GPU machine (bench/device_run.sh calls it):
every model's checkpoint is made there once by a torch child (seeded; the MNIST
models are tests/data's), then for each model:

1. GPU check: bench_forward --dump runs ckpt on cuda:0 at the first GPU batch;
   a torch child runs the same input through the model on the GPU in strict
   FP32 (TF32 off) and reports max |ckpt - torch| / max |torch| per output.
2. GPU rows: torch on cuda:0 with TF32 off for convolutions and matmuls
   (torch.backends.cudnn.allow_tf32 = False, torch.backends.cuda.matmul.allow_tf32
   = False: the fair FP32 comparison) and with torch's defaults (cuDNN
   convolutions in TF32, matmuls in FP32), each timed with the input's copy in
   and every output's copy back (what ckpt's time includes) and without; ckpt
   (bench_forward ... cuda:0), and with --tf32 when bench_forward takes it.
3. CPU rows: torch at its default thread count against ckpt's CPU backend at
   its default (the cores) on the same batches.

Each row is one child process per round, rounds alternating; a row's median is
the median of its rounds' medians; peak RSS is the child's own (wait4). It
writes DIR/bench_device.md (a RESULTS.md section) and DIR/bench_device.json.
Not a test.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEED = 16
GPU_GOAL = 1.5
CPU_GOAL = 1.5

# label, spec, checkpoint (None: made by GEN_CHILD), class, its arguments, CPU
# batches, and (runs, warm-up) per batch for the CPU and the GPU
MODELS = {
    "mlp": {"label": "MLP", "spec": "models/mnist_mlp.json", "ckpt": "tests/data/fmnist_mlp.pth",
            "cls": "MLP", "kwargs": {}, "cpu_batches": [8, 256], "cpu_runs": 200,
            "gpu_runs": 200},
    "ae": {"label": "autoencoder", "spec": "models/mnist_conv_autoencoder.json",
           "ckpt": "tests/data/fmnist_ae.pth", "cls": "Autoencoder", "kwargs": {},
           "cpu_batches": [8, 256], "cpu_runs": 50, "gpu_runs": 200},
    "ssd300": {"label": "SSD300", "spec": "models/ssd300.json", "ckpt": None, "cls": "SSD300",
               "kwargs": {"width": 1}, "cpu_batches": [8, 32], "cpu_runs": 3, "gpu_runs": 30},
    "resnet50": {"label": "ResNet-50", "spec": "models/resnet50.json", "ckpt": None,
                 "cls": "resnet", "kwargs": {"depth": 50}, "cpu_batches": [8, 64],
                 "cpu_runs": 3, "gpu_runs": 30},
    "crnn": {"label": "CRNN (5530 classes)", "spec": "models/crnn.json", "ckpt": None,
             "cls": "CRNN", "kwargs": {"imgH": 32, "nc": 1, "nclass": 5530, "nh": 256},
             "cpu_batches": [8, 64], "cpu_runs": 3, "gpu_runs": 30},
}

GEN_CHILD = r"""
import json, os, sys, torch
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["fixtures"])
import models
torch.manual_seed(cfg["seed"])
m = getattr(models, cfg["cls"])(**cfg["kwargs"])
# He init of the conv weights: with torch's default init SSD300's outputs barely
# depend on the input, and the GPU check could not see a wrong early layer
for mod in m.modules():
    if isinstance(mod, torch.nn.Conv2d):
        torch.nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
m = models.randomize_batch_norms(m).eval()
torch.save(m.state_dict(), cfg["path"] + ".tmp")
os.replace(cfg["path"] + ".tmp", cfg["path"])
print(json.dumps({"params": sum(p.numel() for p in m.parameters())}))
"""

# one child per model and device: loads the model once, then each job
TORCH_CHILD = r"""
import json, os, statistics, sys, time
cfg = json.loads(sys.argv[1])
import torch
sys.path.insert(0, cfg["fixtures"])
import models
m = getattr(models, cfg["cls"])(**cfg["kwargs"])
m.load_state_dict(torch.load(cfg["ckpt"], map_location="cpu"))  # strict
m.eval()
dev = torch.device(cfg["device"])
cuda = dev.type == "cuda"
m.to(dev)

def sync():
    if cuda:
        torch.cuda.synchronize(dev)

def outs(o):
    return list(o) if isinstance(o, (tuple, list)) else [o]

def mode(name):
    # "fp32": TF32 off everywhere; "default": torch's own defaults
    if cuda:
        torch.backends.cudnn.allow_tf32 = name != "fp32"
        torch.backends.cuda.matmul.allow_tf32 = False

res = {"torch": torch.__version__, "threads": torch.get_num_threads(),
       "gpu": torch.cuda.get_device_name(dev) if cuda else None,
       "cudnn": torch.backends.cudnn.version() if cuda else None, "jobs": [], "checks": []}
with torch.no_grad():
    for chk in cfg.get("checks", []):
        mode("fp32")
        def read(e):
            n = 1
            for k in e["shape"]:
                n *= k
            return torch.from_file(os.path.join(chk["dir"], e["file"]), shared=False, size=n,
                                   dtype=torch.float32).reshape(e["shape"])
        ins = [e for e in chk["dump"] if e["file"].startswith("input.")]
        got = [e for e in chk["dump"] if e["file"].startswith("output.")]
        ys = outs(m(read(ins[0]).to(dev)))
        rows = []
        for e, y in zip(got, ys):
            y = y.float().cpu()
            g = read(e)
            scale = y.abs().max().item()
            rows.append({"output": e["file"][7:-4], "shape": list(y.shape),
                         "max_abs": (g - y).abs().max().item(), "scale": scale,
                         "rel": (g - y).abs().max().item() / scale if scale else 0.0})
        res["checks"].append({"batch": chk["batch"], "outputs": rows,
                              "count_ok": len(got) == len(ys)})
    for job in cfg["jobs"]:
        mode(job["mode"])
        g = torch.Generator().manual_seed(0)
        x = torch.rand([job["batch"] if d == -1 else d for d in cfg["shape"]], generator=g)
        xd = x.to(dev)
        times = []
        for r in range(job["warmup"] + job["runs"]):
            sync()
            t = time.perf_counter()
            if job["copies"]:
                o = [y.cpu() for y in outs(m(x.to(dev)))]
            else:
                o = m(xd)
            sync()
            e = time.perf_counter() - t
            del o
            if r >= job["warmup"]:
                times.append(e * 1e3)
        times.sort()
        res["jobs"].append(dict(job, median_ms=statistics.median(times), min_ms=times[0],
                                cuda_max_allocated_mib=(torch.cuda.max_memory_allocated(dev) /
                                                        2**20 if cuda else None)))
print(json.dumps(res))
"""


def spawn(argv, env=None):
    """(rc, stdout, stderr, peak RSS KiB of this child alone: its wait4)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, stdout=out, stderr=err, env=dict(os.environ, **(env or {})))
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(), err.read().decode(), ru.ru_maxrss


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def checkpoint(a, key, model):
    if model["ckpt"]:
        return os.path.join(ROOT, model["ckpt"])
    path = os.path.join(a.workdir, "device_%s.pth" % key)
    if not os.path.exists(path):
        cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "seed": SEED,
               "cls": model["cls"], "kwargs": model["kwargs"], "path": path}
        rc, out, err, _ = spawn([a.python, "-c", GEN_CHILD, json.dumps(cfg)])
        if rc:
            raise RuntimeError("making %s failed: %s" % (path, err.strip()[-800:]))
    return path


def bench_forward(a, model, ckpt, batch, runs, device, warmup, extra=()):
    argv = [a.bench_forward, "--warmup", str(warmup)] + list(extra) + [
        os.path.join(ROOT, model["spec"]), ckpt, str(batch), str(runs), device]
    rc, out, err, rss = spawn(argv)
    if rc:
        return {"error": (err.strip() or out.strip())[-600:]}
    r = last_json(out)
    r["rss_kib"] = rss
    return r


def torch_child(a, model, ckpt, device, jobs, checks=()):
    with open(os.path.join(ROOT, model["spec"])) as f:
        shape = json.load(f)["inputs"][0]["shape"]
    cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "cls": model["cls"],
           "kwargs": model["kwargs"], "ckpt": ckpt, "device": device, "shape": shape,
           "jobs": jobs, "checks": list(checks)}
    rc, out, err, rss = spawn([a.python, "-c", TORCH_CHILD, json.dumps(cfg)])
    if rc:
        return {"error": err.strip()[-800:]}
    r = last_json(out)
    r["rss_kib"] = rss
    return r


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt_ms(v):
    if v is None:
        return "—"
    return "%.3g ms" % v if v < 100 else "%.0f ms" % v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,ae,ssd300,resnet50,crnn")
    ap.add_argument("--gpu-batches", default="8")
    ap.add_argument("--gpu-models", default=None,
                    help="the models of the GPU rows (default: --models)")
    ap.add_argument("--cpu-batches", default="default",
                    help="comma-separated, or 'default' (each model's own)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--bench-forward", default=os.path.join(HERE, "bench_forward"))
    ap.add_argument("--workdir", default="/tmp/ckpt-bench-device")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    keys = [k for k in a.models.split(",") if k]
    for k in keys:
        if k not in MODELS:
            sys.exit("bench_device.py: no model %r (%s)" % (k, ", ".join(MODELS)))
    gpu_batches = [int(b) for b in a.gpu_batches.split(",") if b]
    gpu_keys = [k for k in (a.gpu_models or a.models).split(",") if k]
    help_text = subprocess.run([a.bench_forward, "--help"], capture_output=True,
                               text=True).stdout + subprocess.run(
        [a.bench_forward, "--help"], capture_output=True, text=True).stderr
    has_tf32 = "--tf32" in help_text
    probe = subprocess.run([a.python, "-c", "import json, torch; print(json.dumps({"
                            "'torch': torch.__version__, 'cuda': torch.cuda.is_available(), "
                            "'threads': torch.get_num_threads()}))"],
                           capture_output=True, text=True)
    if probe.returncode:
        sys.exit("bench_device.py: %s has no torch: %s" % (a.python, probe.stderr.strip()[-300:]))
    tinfo = last_json(probe.stdout)
    gpu = tinfo["cuda"] and not a.no_gpu
    started = time.time()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                          "os": os_name(), "kernel": platform.release()},
              "torch": tinfo, "has_tf32": has_tf32, "models": {}}
    for key in keys:
        model = MODELS[key]
        t0 = time.time()
        entry = result["models"].setdefault(key, {"label": model["label"]})
        try:
            ckpt = checkpoint(a, key, model)
        except RuntimeError as e:
            entry["error"] = str(e)
            print(key, "error:", e, flush=True)
            continue
        if gpu and key in gpu_keys:
            entry["gpu"] = gpu_rows(a, model, ckpt, gpu_batches, has_tf32)
        if not a.no_cpu:
            batches = (model["cpu_batches"] if a.cpu_batches == "default"
                       else [int(b) for b in a.cpu_batches.split(",") if b])
            entry["cpu"] = cpu_rows(a, model, ckpt, batches)
        entry["seconds"] = time.time() - t0
        print("%s done in %.0f s" % (key, entry["seconds"]), flush=True)
        with open(os.path.join(a.out, "bench_device.json"), "w") as f:
            json.dump(result, f, indent=1)
    result["seconds"] = time.time() - started
    with open(os.path.join(a.out, "bench_device.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = section(a, result)
    with open(os.path.join(a.out, "bench_device.md"), "w") as f:
        f.write(text)
    print(text)


def gpu_rows(a, model, ckpt, batches, has_tf32):
    out = {"check": None, "rows": []}
    dump = tempfile.mkdtemp(dir=a.workdir)
    r = bench_forward(a, model, ckpt, batches[0], 1, "cuda:0", 1, ["--dump", dump])
    if "error" in r:
        out["check"] = {"error": "bench_forward on cuda:0: " + r["error"]}
        return out
    out["description"] = r.get("description")
    runs = model["gpu_runs"]
    jobs = []
    for b in batches:
        for m in ("fp32", "default"):
            for copies in (True, False):
                jobs.append({"batch": b, "mode": m, "copies": copies, "runs": runs,
                             "warmup": 5})
    per_round = []
    for rnd in range(a.rounds):
        t = torch_child(a, model, ckpt, "cuda:0", jobs,
                        [{"batch": batches[0], "dir": dump, "dump": r["dump"]}] if rnd == 0
                        else [])
        if rnd == 0:
            out["check"] = t.get("checks", [None])[0] if "error" not in t else {
                "error": t["error"]}
            out["torch"] = {k: t.get(k) for k in ("torch", "gpu", "cudnn")}
        c = {}
        for b in batches:
            c[(b, "ckpt")] = bench_forward(a, model, ckpt, b, runs, "cuda:0", 5)
            if has_tf32:
                c[(b, "ckpt-tf32")] = bench_forward(a, model, ckpt, b, runs, "cuda:0", 5,
                                                    ["--tf32"])
        per_round.append((t, c))
    for b in batches:
        row = {"batch": b}
        for m in ("fp32", "default"):
            for copies in (True, False):
                vals = [j["median_ms"] for t, _ in per_round for j in t.get("jobs", [])
                        if j["batch"] == b and j["mode"] == m and j["copies"] == copies]
                row["torch_%s%s" % (m, "" if copies else "_nocopy")] = med(vals)
        row["torch_rss_kib"] = max([t.get("rss_kib") or 0 for t, _ in per_round])
        for who in ("ckpt", "ckpt-tf32"):
            rs = [c.get((b, who)) for _, c in per_round if c.get((b, who))]
            if rs and all("error" not in x for x in rs):
                row[who] = med([x["median_ms"] for x in rs])
                row[who + "_rss_kib"] = max(x["rss_kib"] for x in rs)
            elif rs:
                row[who + "_error"] = rs[0]["error"]
        out["rows"].append(row)
    return out


def cpu_rows(a, model, ckpt, batches):
    out = {"rows": []}
    runs = model["cpu_runs"]
    jobs = [{"batch": b, "mode": "cpu", "copies": False, "runs": runs, "warmup": 1}
            for b in batches]
    per_round = []
    for rnd in range(a.rounds):
        t = torch_child(a, model, ckpt, "cpu", jobs)
        c = {b: bench_forward(a, model, ckpt, b, runs, "cpu", 1) for b in batches}
        per_round.append((t, c))
    out["torch_threads"] = per_round[0][0].get("threads")
    for b in batches:
        row = {"batch": b}
        row["torch"] = med([j["median_ms"] for t, _ in per_round for j in t.get("jobs", [])
                            if j["batch"] == b])
        row["torch_rss_kib"] = max([t.get("rss_kib") or 0 for t, _ in per_round])
        rs = [c[b] for _, c in per_round]
        if all("error" not in x for x in rs):
            row["ckpt"] = med([x["median_ms"] for x in rs])
            row["ckpt_rss_kib"] = max(x["rss_kib"] for x in rs)
            out["description"] = rs[0].get("description")
        else:
            row["ckpt_error"] = rs[0]["error"]
        errs = [t["error"] for t, _ in per_round if "error" in t]
        if errs:
            row["torch_error"] = errs[0]
        out["rows"].append(row)
    return out


def ratio(x, y):
    return "%.2fx" % (x / y) if x and y else "—"


def section(a, res):
    lines = ["## ckpt verify on a GPU machine: GPU and many cores (issue 31)", "",
             "- Date: %s" % res["date"],
             "- Machine: %s, %d cores; %s (kernel %s)" % (
                 res["machine"]["cpu"], res["machine"]["cores"], res["machine"]["os"],
                 res["machine"]["kernel"]),
             "- Software: torch %s (%d threads by default)" % (res["torch"]["torch"],
                                                              res["torch"]["threads"]),
             "- Command: `python3 bench/bench_device.py --models %s%s --gpu-batches %s "
             "--rounds %d` (bench/device_run.sh); the run took %.0f s" % (
                 a.models, " --gpu-models " + a.gpu_models if a.gpu_models else "",
                 a.gpu_batches, a.rounds, res.get("seconds", 0)), ""]
    gl = []
    for key, e in res["models"].items():
        g = e.get("gpu")
        if not g:
            continue
        if not gl:
            t = g.get("torch") or {}
            lines += ["GPU: %s, cuDNN %s; ckpt: %s" % (t.get("gpu"), t.get("cudnn"),
                                                      g.get("description")), ""]
            lines += ["| model | batch | torch FP32 (TF32 off) | torch default (TF32 convs) | "
                      "ckpt | ckpt / torch FP32 (goal <= %.1f) | ckpt / torch default | "
                      "ckpt --tf32 | torch FP32, no copies | peak RSS torch / ckpt |" % GPU_GOAL,
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in g["rows"]:
            gl.append(r)
            lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s / %s MiB |" % (
                e["label"], r["batch"], fmt_ms(r.get("torch_fp32")),
                fmt_ms(r.get("torch_default")),
                fmt_ms(r.get("ckpt")) if "ckpt" in r else "error",
                ratio(r.get("ckpt"), r.get("torch_fp32")),
                ratio(r.get("ckpt"), r.get("torch_default")),
                fmt_ms(r.get("ckpt-tf32")) if "ckpt-tf32" in r else "—",
                fmt_ms(r.get("torch_fp32_nocopy")),
                (r.get("torch_rss_kib") or 0) // 1024, (r.get("ckpt_rss_kib") or 0) // 1024))
    if gl:
        lines += ["", "Times include the input's copy to the GPU and every output's copy "
                  "back (ckpt's bench_forward times `ckpt_model_run()`, which does both).", ""]
        lines.append("GPU check (ckpt on cuda:0 against torch on cuda:0 in strict FP32, "
                     "the same input): max |ckpt - torch| / max |torch| per output:")
        lines.append("")
        for key, e in res["models"].items():
            c = (e.get("gpu") or {}).get("check")
            if not c:
                continue
            if "error" in c:
                lines.append("- %s: **error**: %s" % (e["label"], c["error"].replace("\n", " ")))
            else:
                lines.append("- %s (batch %d): %s" % (e["label"], c["batch"], ", ".join(
                    "%s %.2g" % (o["output"], o["rel"]) for o in c["outputs"])))
        lines.append("")
    cl = False
    for key, e in res["models"].items():
        c = e.get("cpu")
        if not c:
            continue
        if not cl:
            cl = True
            lines += ["CPU: torch at its default threads (%s) against ckpt's CPU backend at its "
                      "default (%s)" % (c.get("torch_threads"), c.get("description")), "",
                      "| model | batch | torch | ckpt | ckpt / torch (goal <= %.1f) | "
                      "peak RSS torch / ckpt |" % CPU_GOAL, "|---|---:|---:|---:|---:|---:|"]
        for r in c["rows"]:
            lines.append("| %s | %d | %s | %s | %s | %s / %s MiB |" % (
                e["label"], r["batch"], fmt_ms(r.get("torch")),
                fmt_ms(r.get("ckpt")) if "ckpt" in r else "error: " + r["ckpt_error"][:80],
                ratio(r.get("ckpt"), r.get("torch")), (r.get("torch_rss_kib") or 0) // 1024,
                (r.get("ckpt_rss_kib") or 0) // 1024))
    lines.append("")
    return "\n".join(lines)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def os_name():
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


if __name__ == "__main__":
    main()
