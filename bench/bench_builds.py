#!/usr/bin/python3
"""Benchmark: this build of ckpt against another build, command by command.

A refactoring must not cost speed.  This times the commands users run most
(inspect, scan, strip-module, convert to safetensors, and a model forward)
with two builds on the same files in the same run, alternating, the order
rotating every round, and prints new/old per command with wall time and
peak RSS.  Goal of a refactor (issue 25): every ratio within 1.10.

    /usr/bin/python3 bench/bench_builds.py --base OLD_TREE [--runs 5]
        [--size-gib 2] [--workdir bench/out] [--results bench/RESULTS.md]
        [--no-results]

OLD_TREE is a built checkout of the other version (its ./ckpt and
./bench/bench_forward), e.g. `git worktree add ../old <commit>` then
`./bootstrap && ./configure && make ckpt bench/bench_forward` there.  The
inputs: bench_inspect.py's state dict (DataParallel keys, ResNet-50 +
transformer layers; 2 GiB: 782 tensors) and bench_models.py's ResNet-50
checkpoint (torch's init, seed 16), made once with torch in bench/out/.
File commands are timed as whole processes (warm page cache; OUT deleted
after each run, outside the timing); the forward is bench_forward's median
of RUNS forwards of ResNet-50 at batch 1 on the CPU, one child per round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_inspect as bi  # noqa: E402  (generate, spawn_wait, measure_rss, machine_info)
import bench_models as bm  # noqa: E402  (GEN_CHILD: the ResNet-50 checkpoint)

SECTION = "## Two builds compared, command by command (issue 25)"


def make_inputs(a):
    os.makedirs(a.workdir, exist_ok=True)
    sd = os.path.join(a.workdir, "inspect_state_dict_%ggib.pth" % a.size_gib)
    if not os.path.exists(sd):
        bi.generate(sd, a.size_gib, "state_dict")
    rn = os.path.join(a.workdir, "resnet50.pth")
    if not os.path.exists(rn):
        spec = bm.MODELS["resnet50"]
        with open(os.path.join(ROOT, spec["spec"])) as f:
            sj = json.load(f)
        ref = os.path.join(a.workdir, "resnet50_b1.ref.pth")
        cfg = {"fixtures": os.path.join(ROOT, "tests", "fixtures"), "seed": bm.SEED,
               "cls": spec["cls"], "kwargs": spec["kwargs"], "path": rn, "refs": [ref],
               "batches": [1], "shape": sj["inputs"][0]["shape"], "output": sj["outputs"][0]}
        subprocess.run([a.python, "-c", bm.GEN_CHILD, json.dumps(cfg)], check=True,
                       capture_output=True)
    with open(sd, "rb") as f:          # warm the page cache
        while f.read(1 << 24):
            pass
    return sd, rn


def commands(tree, sd, rn, out):
    ck = os.path.join(tree, "ckpt")
    return {
        "inspect --json": ([ck, "inspect", "--json", sd], None),
        "scan": ([ck, "scan", "--quiet", sd], None),
        "strip-module IN OUT": ([ck, "strip-module", "--quiet", sd, out + ".pth"], out + ".pth"),
        "convert IN OUT.safetensors": ([ck, "convert", "--quiet", sd, out + ".safetensors"],
                                       out + ".safetensors"),
        "forward ResNet-50 b1 (ms)": ([os.path.join(tree, "bench", "bench_forward"),
                                      os.path.join(ROOT, "models", "resnet50.json"), rn, "1",
                                      "7", "cpu"], "forward"),
    }


def once(argv, what):
    """Seconds (a forward: bench_forward's median forward) of one run."""
    if what == "forward":
        _, _, data = bi.spawn_wait(argv, capture=True)
        return json.loads(data.decode().strip().splitlines()[-1])["median_ms"] / 1000.0
    wall, _, _ = bi.spawn_wait(argv)
    if what:
        os.unlink(what)
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a built checkout of the other version")
    ap.add_argument("--new", default=ROOT, help="this build's tree (default: this checkout)")
    ap.add_argument("--label", nargs=2, metavar=("OLD", "NEW"),
                    help="names of the two builds (default: their trees' git commits)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--workdir", default=os.path.join(HERE, "out"))
    ap.add_argument("--python", default="/usr/bin/python3", help="a Python with torch")
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--no-results", action="store_true")
    a = ap.parse_args()

    sd, rn = make_inputs(a)
    tmp = tempfile.mkdtemp(dir=a.workdir)
    out = os.path.join(tmp, "out")
    builds = {"old": commands(a.base, sd, rn, out), "new": commands(a.new, sd, rn, out)}
    times = {b: {k: [] for k in builds[b]} for b in builds}
    order = ["old", "new"]
    for r in range(a.runs + 1):            # round 0 warms up, untimed
        for name in builds["new"]:
            for b in order:
                argv, what = builds[b][name]
                t = once(argv, what)
                if r:
                    times[b][name].append(t)
        order.reverse()
    rss = {b: {} for b in builds}
    for b in builds:
        for name, (argv, what) in builds[b].items():
            rss[b][name], _ = bi.measure_rss(argv, tmp)
            if what and what != "forward":
                os.unlink(what)
    os.rmdir(tmp)

    rows, worst = [], 0.0
    for name in builds["new"]:
        o, n = statistics.median(times["old"][name]), statistics.median(times["new"][name])
        ratio = n / o
        worst = max(worst, ratio)
        unit = 1000.0
        rows.append("| %s | %.1f ms | %.1f ms | %.2fx | %.0f / %.0f MiB |" % (
            name, o * unit, n * unit, ratio, rss["old"][name] / 1024, rss["new"][name] / 1024))
    mi = bi.machine_info()
    rev = lambda t: subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"],
                                   capture_output=True, text=True).stdout.strip() or "?"
    text = "\n".join([
        SECTION, "",
        "Old build %s, new build %s, the same files in the same run, %d rounds after a "
        "warm-up round, alternating with the order rotating (bench/bench_builds.py). Input: "
        "a %g GiB DataParallel state dict (bench_inspect.py's layout); the forward is "
        "ResNet-50 at batch 1 on the CPU (bench_forward's median of 7 forwards a round). "
        "Medians; peak RSS through GNU time." % (
            *(a.label or (rev(a.base), rev(a.new))), a.runs, a.size_gib),
        "", "| command | old | new | new/old | peak RSS old / new |", "|---|---:|---:|---:|---:|",
        *rows, "",
        "Worst ratio %.2fx (goal: within 1.10x)." % worst, "",
        "Machine: %(cpu)s, %(cores)d cores, %(ram)s, %(os)s, kernel %(kernel)s." % mi, ""])
    print(text)
    if not a.no_results:
        bi.update_results(a.results, text, SECTION)


if __name__ == "__main__":
    main()
