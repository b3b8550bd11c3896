#!/usr/bin/python3
"""Benchmark how ckpt's CPU forward scales from 1 thread to 2 (issue 31).

Every bench model -- the MNIST MLP and conv autoencoder (tests/data), SSD300,
ResNet-50 and the CRNN (checkpoints made once by a torch child, as
bench_models.py makes them: torch.manual_seed(16), torch's init, batch-norm
statistics randomized; --workdir, reused while there) -- at batch 8 and at
a larger batch, on the default CPU backend (its packed SGEMM) run with
`bench/bench_forward --threads 1` and `--threads 2` in the same run: --rounds
child processes each (by default each model's "rounds" below, else
ROUNDS), the two alternating, the order rotating, each timing
its forwards after warming up for --warmup-ms (a steady state's times); median of
the rounds' medians, their range, the least forward of all (on a busy
machine the nearest to a quiet one's time), peak RSS of every child (GNU
time), the 1-minute load average before each child, and how far apart
the two CPUs are just before and after each 2-thread child
(bench/bench_pingpong: one cache line's round trip between them; the VM's
host moves its vCPUs, and a round trip of ~100 ns or of ~440 ns decides
what a forward of microseconds gains from a second thread).  Goal: 1
thread's time / 2 threads' time >= 1.8 at batch >= 8.  Before any timing, the two
thread counts' outputs are compared bit for bit (bench_forward --dump).

    /usr/bin/python3 bench/bench_threads.py [--models mlp,ae,ssd300,resnet50,crnn]
        [--rounds N] [--threads 2] [--warmup-ms 500] [--workdir bench/out]
        [--results bench/RESULTS.md] [--no-results]

Run after `make bench/bench_forward bench/bench_pingpong`.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (measure(): child, GNU time, load)
import bench_models as bm  # noqa: E402  (GEN_CHILD, write_section())

ROOT = bv.ROOT
SECTION = "## CPU forward: thread scaling (issue 31)"
GOAL = 1.8
# Child processes per thread count and line, where a model does not say:
# the big models' children run for seconds, and the host's slow minutes
# fell on one round in three of 3.  The MLP and the autoencoder take 7:
# their forwards meet between the threads every few microseconds, and on
# the 2-core VM their 2-thread time moved from process to process with the
# host, as the cores' round trip did (85-145 ns).
ROUNDS = 5
# A round trip above this (ns) marks a round "far" in the table: the
# vCPUs measured 85-145 ns apart in the sessions before, 60-120 ns and
# 360-460 ns in the one that added the probe, minute by minute
FAR_NS = 250
# per model: label, spec, checkpoint (None: made by GEN_CHILD from cls and
# kwargs), batches, timed forwards per child at each batch, warm-up forwards
MODELS = {
    "mlp": {"label": "MLP", "spec": "models/mnist_mlp.json", "ckpt": "tests/data/fmnist_mlp.pth",
            "batches": [8, 256], "runs": [2000, 300], "warmup": 20, "rounds": 7},
    "ae": {"label": "autoencoder", "spec": "models/mnist_conv_autoencoder.json",
           "ckpt": "tests/data/fmnist_ae.pth", "batches": [8, 256], "runs": [1000, 40],
           "warmup": 5, "rounds": 7},
    "ssd300": {"label": "SSD300", "spec": "models/ssd300.json", "cls": "SSD300",
               "kwargs": {"width": 1}, "batches": [8, 16], "runs": [2, 1], "warmup": 1},
    "resnet50": {"label": "ResNet-50", "spec": "models/resnet50.json", "cls": "resnet",
                 "kwargs": {"depth": 50}, "batches": [8, 32], "runs": [4, 2], "warmup": 1},
    "crnn": {"label": "CRNN (5530 classes)", "spec": "models/crnn.json", "cls": "CRNN",
             "kwargs": {"imgH": 32, "nc": 1, "nclass": 5530, "nh": 256}, "batches": [8, 32],
             "runs": [5, 2], "warmup": 1},
}


def checkpoint(a, key, model):
    """The model's checkpoint: in tests/data, or made once in --workdir."""
    if not model.get("cls"):
        return os.path.join(ROOT, model["ckpt"])
    path = os.path.join(a.workdir, "threads_%s.pth" % key)
    if not os.path.exists(path):
        os.makedirs(a.workdir, exist_ok=True)
        print("making %s ..." % path, flush=True)
        cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "seed": bm.SEED,
               "cls": model["cls"], "kwargs": model["kwargs"], "path": path, "refs": [],
               "batches": [], "shape": [], "output": ""}
        subprocess.run([a.python, "-c", bm.GEN_CHILD, json.dumps(cfg)], check=True,
                       capture_output=True, text=True)
    return path


def argv(a, model, batch, threads, runs, warmup, dump=None):
    return ([a.bench_forward, "--threads", str(threads), "--warmup", str(warmup)] +
            (["--warmup-ms", str(a.warmup_ms)] if warmup and not dump else []) +
            (["--dump", dump] if dump else []) +
            [os.path.join(ROOT, model["spec"]), model["path"], str(batch), str(runs), "cpu"])


def same_bits(a, tmp, model, batch, threads):
    """Outputs of one forward on 1 thread and on THREADS: equal bytes."""
    files = []
    for t in (1, threads):
        d = os.path.join(tmp, "dump%d" % t)
        os.makedirs(d, exist_ok=True)
        bv.measure(argv(a, model, batch, t, 1, 0, dump=d), tmp, "bench_forward dump")
        files.append(d)
    names = sorted(n for n in os.listdir(files[0]) if n.startswith("output."))
    for n in names:
        with open(os.path.join(files[0], n), "rb") as f1, \
                open(os.path.join(files[1], n), "rb") as f2:
            if f1.read() != f2.read():
                sys.exit("bench: %s batch %d: %s differs on 1 and %d threads"
                         % (model["label"], batch, n, threads))
    return len(names)


def round_trip(a, tmp):
    """ns of one cache line's round trip between the first two CPUs, now."""
    return bv.measure([a.pingpong, "30"], tmp, "bench_pingpong")["round_trip_ns"]


def near(trip):
    return max(trip) <= FAR_NS


def rounds_by_count(keys):
    """[(rounds, [labels])] of the chosen models, at their default rounds."""
    out = {}
    for key in keys:
        out.setdefault(MODELS[key].get("rounds", ROUNDS), []).append(MODELS[key]["label"])
    return sorted(out.items(), reverse=True)


def ms(v):
    # (the MLP at batch 8 takes ~0.010 ms: at 3 decimals its rounds looked
    # alike, 9.9 us and 10.4 us both "0.010 ms")
    return ("%.4f ms" % v if v < 0.1 else "%.3f ms" % v if v < 1 else
            "%.2f ms" % v if v < 100 else "%.0f ms" % v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,ae,ssd300,resnet50,crnn")
    ap.add_argument("--rounds", type=int, default=None,
                    help="child processes per thread count and line (default: each "
                         "model's own, else %d)" % ROUNDS)
    ap.add_argument("--threads", type=int, default=2, help="the many-thread side (default 2)")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--bench-forward", default=os.path.join(ROOT, "bench", "bench_forward"))
    ap.add_argument("--pingpong", default=os.path.join(ROOT, "bench", "bench_pingpong"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "bench", "out"))
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "RESULTS.md"))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--warmup-ms", type=int, default=500,
                    help="warm-up forwards for at least this long (default 500): a worker "
                         "thread of the 2-core VM joined the forwards only after up to 8 ms")
    a = ap.parse_args()
    keys = bm.chosen(a.models, MODELS)
    tt = a.threads
    rev = bv.bi.git_rev()  # at the start: the tree may move on while this runs
    started = datetime.datetime.now(datetime.timezone.utc)
    rows, loads, desc = [], [], "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        for key in keys:
            model = dict(MODELS[key])
            model["path"] = checkpoint(a, key, model)
            for batch, runs in zip(model["batches"], model["runs"]):
                nout = same_bits(a, tmp, model, batch, tt)
                res, row_loads, trips = {1: [], tt: []}, [], []
                rounds = a.rounds or model.get("rounds", ROUNDS)
                for r in range(rounds):
                    for t in ((1, tt) if r % 2 == 0 else (tt, 1)):
                        before = round_trip(a, tmp) if t == tt else None
                        x = bv.measure(argv(a, model, batch, t, runs, model["warmup"]), tmp,
                                       "bench_forward %s batch %d, %d threads"
                                       % (model["label"], batch, t))
                        loads.append(x["loadavg"])
                        row_loads.append(x["loadavg"])
                        if t == tt:
                            trips.append((before, round_trip(a, tmp)))
                            desc = x.get("description", desc)
                        res[t].append(x)
                        print("  %s batch %d round %d, %d thread%s: median %s (load %.2f%s)"
                              % (key, batch, r + 1, t, "" if t == 1 else "s", ms(x["median_ms"]),
                                 x["loadavg"], "" if t == 1 else
                                 ", CPUs %.0f / %.0f ns apart" % trips[-1]), flush=True)
                # each round's median per thread count; the rest is worked
                # out from them where the table is made
                rows.append({"label": model["label"], "batch": batch,
                             "meds": {t: [x["median_ms"] for x in v] for t, v in res.items()},
                             "best": {t: min(x["min_ms"] for x in v) for t, v in res.items()},
                             "rss": {t: max(x["rss_kib"] for x in v) for t, v in res.items()},
                             "nout": nout, "load": (min(row_loads), max(row_loads)),
                             "trips": trips})
    elapsed = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()

    def times(s):
        # a speed-up that rounds to the goal but misses it gets a third
        # decimal (run 14's MLP at batch 8 read "1.80x MISSED")
        return "%.3fx" % s if abs(s - GOAL) < 0.005 else "%.2fx" % s

    table = ["| model | batch | 1 thread: median (rounds) | best | %d threads: median (rounds) "
             "| best | speed-up, medians (goal >= %.1f) | round by round (†: far) "
             "| CPUs apart | speed-up, near rounds | speed-up, best | peak RSS 1 / %d | load |"
             % (tt, GOAL, tt),
             "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|"]
    met, near_met, near_none = [], 0, 0
    for r in rows:
        meds = r["meds"]
        med = {t: statistics.median(v) for t, v in meds.items()}
        ratios = [one / many for one, many in zip(meds[1], meds[tt])]
        s = med[1] / med[tt]
        ok = s >= GOAL
        met.append(ok)
        trips = [x for tr in r["trips"] for x in tr]
        close = [i for i, tr in enumerate(r["trips"]) if near(tr)]
        near_s = (statistics.median(meds[1][i] for i in close) /
                  statistics.median(meds[tt][i] for i in close)) if close else None
        near_met += near_s is not None and near_s >= GOAL
        near_none += near_s is None
        table.append("| %s | %d | %s (%s-%s) | %s | %s (%s-%s) | %s | %s %s | %s "
                     "| %.0f-%.0f ns | %s | %s | %d / %d MiB | %.2f-%.2f |" % (
                         r["label"], r["batch"], ms(med[1]), ms(min(meds[1])),
                         ms(max(meds[1])), ms(r["best"][1]), ms(med[tt]),
                         ms(min(meds[tt])), ms(max(meds[tt])), ms(r["best"][tt]),
                         times(s),
                         "met" if ok else "MISSED",
                         " ".join("%.2f%s" % (x, "" if near(tr) else "†")
                                  for x, tr in zip(ratios, r["trips"])),
                         min(trips), max(trips),
                         "%s (%d)" % (times(near_s), len(close)) if close else "none",
                         times(r["best"][1] / r["best"][tt]), r["rss"][1] // 1024,
                         r["rss"][tt] // 1024, r["load"][0], r["load"][1]))
    print("\n".join(table))
    if a.no_results:
        return
    mi = bv.bi.machine_info()
    text = [SECTION, "",
            "Requirement: every stage of the CPU forward on the thread pool, the same bits on any "
            "thread count; from 1 thread to 2, at least %.1fx faster at batch >= 8 for every "
            "bench model." % GOAL, "",
            "- Date: %s UTC" % started.strftime("%Y-%m-%d %H:%M"),
            "- Machine: %s, %s cores (shared with other jobs), %s RAM; %s (kernel %s)" % (
                mi["cpu"], mi["cores"], mi["ram"], mi["os"], mi["kernel"]),
            "- Software: ckpt git %s; ckpt CPU backend: %s" % (rev, desc),
            "- Method: per model and batch, both thread counts' outputs compared first "
            "(`bench_forward --dump`, one forward each: the same bytes, every output); then "
            "%s rounds of one child process per thread count (`bench/bench_forward --threads "
            "1` / `--threads %d`, the order alternating), each loading the model, running its "
            "warm-up forwards (for at least %d ms: a steady state's times; a worker thread of "
            "this VM took part only after up to 8 ms) and then the timed ones (CLOCK_MONOTONIC around "
            "`ckpt_model_run()`, which copies the input in and the outputs out); a line's "
            "median is the median of its rounds' medians, its best the least forward of all. "
            "Checkpoints: MLP and autoencoder from tests/data, the others made once by a torch "
            "child (bench_models.py's recipe, seed %d). The 1-minute load average before each "
            "child: %.2f-%.2f (the benchmark itself accounts for up to %d; each line's in its "
            "last column: where it is well over 1, another job held a core and the 2-thread "
            "child could not have both). Just before and after each %d-thread child, "
            "`bench/bench_pingpong 30`: the median round trip of one cache line between the "
            "first two CPUs, 30 ms of it (the column \"CPUs apart\"): the host moves this "
            "VM's vCPUs, and a round trip of more than %d ns (a round marked †, \"far\") "
            "costs each exchange between the threads several times what it costs at ~100 ns; "
            "\"speed-up, near rounds\": the medians of the other rounds (their count in "
            "brackets). The run took %.0f s."
            % (a.rounds or " or ".join("%d (%s)" % (n, ", ".join(labels)) for n, labels in
                                 rounds_by_count(keys)), tt, a.warmup_ms, bm.SEED,
               min(loads), max(loads), tt, tt, FAR_NS, elapsed),
            "- Command: `/usr/bin/python3 bench/bench_threads.py --models %s%s "
            "--warmup-ms %d` (after `make bench/bench_forward bench/bench_pingpong`)"
            % (",".join(keys), " --rounds %d" % a.rounds if a.rounds else "", a.warmup_ms),
            ""] + table + [""]
    text.append("Result: goal %s (%d of %d lines at >= %.1fx)." % (
        "met" if all(met) else "MISSED", sum(met), len(met), GOAL))
    text.append("With the CPUs near (the rounds not marked †): %d of %d lines at >= %.1fx%s." % (
        near_met, len(met) - near_none, GOAL,
        " (%d line%s had no such round)" % (near_none, "" if near_none == 1 else "s")
        if near_none else ""))
    text.append("")
    bm.write_section(a.results, SECTION, "\n".join(text))
    print("wrote %s" % os.path.relpath(a.results, ROOT))


if __name__ == "__main__":
    main()
