#!/bin/sh
# inspect.sh - `ckpt inspect` on the fixtures of tests/data, as a user sees it:
# the text listing, the JSON document (doc/design.md), --filter, --stats and the
# exit status for files that are not there.  The fixtures are described in
# tests/data/README.md.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir" # so that file names print as tests/data/NAME.pth

# ---------------------------------------------------------------------------
say "a DataParallel state dict, as text: ckpt inspect tests/data/dp_mlp.pth"
expect_exit 0 ckpt inspect tests/data/dp_mlp.pth
expect_stderr_empty
expect_stdout_line "tests/data/dp_mlp.pth: pth-zip, 4 tensors in 4 storages, 397.5 KiB"
expect_stdout_line "archive prefix 'dp_mlp', 6 records"
note "the state dict is the root, and its keys carry the DataParallel wrapper module."
expect_stdout_line "state dict (root): 4 tensors, wrapper prefix module. (DataParallel / DistributedDataParallel)"
expect_stdout_match '^KEY +DTYPE +SHAPE +DEVICE +SIZE +NOTE$'
note "one row per key: dtype, shape, the device it was saved on, its size"
expect_stdout_match '^module\.n\.1\.weight +float32 +\[128, 784\] +cuda:0 +392\.0 KiB$'
expect_stdout_match '^module\.n\.1\.bias +float32 +\[128\] +cuda:0 +512 B$'
expect_stdout_match '^module\.n\.3\.weight +float32 +\[10, 128\] +cuda:0 +5\.0 KiB$'
expect_stdout_match '^module\.n\.3\.bias +float32 +\[10\] +cuda:0 +40 B$'
expect_stdout_line "total: 4 tensors, 101770 elements, 397.5 KiB"
expect_stdout_line "by dtype: float32 397.5 KiB"
expect_stdout_line "by device: cuda:0 397.5 KiB"

# ---------------------------------------------------------------------------
say "the same as JSON: ckpt inspect --json tests/data/dp_mlp.pth (doc/design.md)"
if have_python; then
    expect_exit 0 ckpt inspect --json tests/data/dp_mlp.pth
    expect_stderr_empty
    json_valid
    json_expect 'd["file"]' '"tests/data/dp_mlp.pth"'
    json_expect 'd["format"]' '"pth-zip"'
    json_expect 'd["records"]' '["dp_mlp/data.pkl", "dp_mlp/data/0", "dp_mlp/data/1",
                                 "dp_mlp/data/2", "dp_mlp/data/3", "dp_mlp/version"]'
    json_expect '[t["path"] for t in d["tensors"]]' \
        '[["module.n.1.weight"], ["module.n.1.bias"], ["module.n.3.weight"], ["module.n.3.bias"]]'
    note "the first tensor, field by field"
    json_expect 'd["tensors"][0]' '{"path": ["module.n.1.weight"], "dtype": "float32",
        "shape": [128, 784], "stride": [784, 1], "offset": 0, "device": "cuda:0",
        "storage": "0", "nbytes": 401408, "kind": "dense", "parameter": false,
        "requires_grad": false}'
    json_expect 'd["storages"][0]' \
        '{"key": "0", "dtype": "float32", "numel": 100352, "device": "cuda:0", "nbytes": 401408}'
    json_expect '[s["nbytes"] for s in d["storages"]]' '[401408, 512, 5120, 40]'
    json_expect 'd["state_dicts"]' '[{"model": true, "path": [], "source": "mapping", "tensors": 4, "wrappers": ["module."]}]'
    json_expect 'd["objects"]' '[]'
    json_expect 'd["summary"]' '{"tensors": 4, "parameters": 101770, "bytes": 407080,
        "by_dtype": {"float32": 407080}, "by_device": {"cuda:0": 407080}}'
    cp "$out" "$tmp/dp_mlp.json"
else
    note "SKIP the JSON checks: no python3"
fi

# ---------------------------------------------------------------------------
say "DistributedDataParallel twice: the wrapper chain is module. module."
expect_exit 0 ckpt inspect tests/data/ddp2_mlp.pth
expect_stderr_empty
expect_stdout_line "state dict (root): 4 tensors, wrapper prefix module. (DataParallel / DistributedDataParallel), module. (DataParallel / DistributedDataParallel)"
expect_stdout_match '^module\.module\.n\.1\.weight +float32 +\[128, 784\] +cuda:0 '
if have_python; then
    expect_exit 0 ckpt inspect --json tests/data/ddp2_mlp.pth
    json_expect 'd["state_dicts"]' '[{"model": true, "path": [], "source": "mapping", "tensors": 4, "wrappers": ["module.", "module."]}]'
fi

say "a plain state dict has no wrapper"
expect_exit 0 ckpt inspect tests/data/mlp.pth
expect_stdout_line "state dict (root): 4 tensors"
expect_stdout_match '^n\.1\.weight +float32 +\[128, 784\] +cuda:0 +392\.0 KiB$'

# ---------------------------------------------------------------------------
say "a training checkpoint: model state dict, optimizer state, argparse.Namespace"
expect_exit 0 ckpt inspect tests/data/train_ckpt.pth
expect_stderr_empty
expect_stdout_line "tests/data/train_ckpt.pth: pth-zip, 8 tensors in 8 storages, 795.1 KiB"
expect_stdout_line "state dict model_state_dict: 4 tensors, wrapper prefix module. (DataParallel / DistributedDataParallel)"
note "the optimizer's per-parameter state ({momentum_buffer: tensor}) are state dicts too"
expect_stdout_match "^state dict optimizer_state_dict/state/0: 1 tensor \\(not a model's: rewritten only when --select names it\\)\$"
expect_stdout_match "^state dict optimizer_state_dict/state/3: 1 tensor \\(not a model's: rewritten only when --select names it\\)\$"
expect_stdout_match '^model_state_dict/module\.n\.1\.weight +float32 +\[128, 784\] +cuda:0 '
expect_stdout_match '^optimizer_state_dict/state/0/momentum_buffer +float32 +\[128, 784\] +cuda:0 '
note "args is kept opaque, not executed"
expect_stdout_line "objects kept opaque:"
expect_stdout_match '^  args +argparse\.Namespace$'
expect_stdout_line "total: 8 tensors, 203540 elements, 795.1 KiB"
if have_python; then
    expect_exit 0 ckpt inspect --json tests/data/train_ckpt.pth
    json_valid
    json_expect 'd["objects"]' '[{"path": ["args"], "global": "argparse.Namespace"}]'
    json_expect 'd["state_dicts"][0]' \
        '{"model": true, "path": ["model_state_dict"], "source": "mapping", "tensors": 4, "wrappers": ["module."]}'
    note "an int dict key stays an int in the path"
    json_expect 'd["state_dicts"][1]' \
        '{"model": false, "path": ["optimizer_state_dict", "state", 0], "source": "mapping", "tensors": 1, "wrappers": []}'
    json_expect 'len(d["state_dicts"])' 5
    json_expect 'd["tensors"][4]["path"]' '["optimizer_state_dict", "state", 0, "momentum_buffer"]'
    json_expect 'd["summary"]["tensors"]' 8
    json_expect 'd["summary"]["parameters"]' 203540
    json_expect 'd["summary"]["bytes"]' 814160
    cp "$out" "$tmp/train_ckpt.json"
fi

# ---------------------------------------------------------------------------
say "the legacy (pre-1.6) format: same content, format pth-legacy"
expect_exit 0 ckpt inspect tests/data/legacy_mlp.pth
expect_stderr_empty
expect_stdout_line "tests/data/legacy_mlp.pth: pth-legacy, 4 tensors in 4 storages, 397.5 KiB"
expect_stdout_no_match '^archive prefix'
expect_stdout_line "state dict (root): 4 tensors, wrapper prefix module. (DataParallel / DistributedDataParallel)"
if have_python; then
    expect_exit 0 ckpt inspect --json tests/data/legacy_mlp.pth
    json_expect 'd["format"]' '"pth-legacy"'
    json_expect '"records" in d' false
    cp "$out" "$tmp/legacy_mlp.json"
    run python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
drop = lambda t: {k: v for k, v in t.items() if k != "storage"}  # legacy keys differ
sys.exit(0 if [drop(t) for t in a["tensors"]] == [drop(t) for t in b["tensors"]]
         and a["summary"] == b["summary"] and a["state_dicts"] == b["state_dicts"] else 1)
' "$tmp/dp_mlp.json" "$tmp/legacy_mlp.json"
    check "legacy_mlp.pth lists the same tensors, state dicts and summary as dp_mlp.pth" \
        test "$status" -eq 0
    expect_exit 0 ckpt inspect --json tests/data/legacy_train.pth
    json_expect 'd["objects"]' '[{"path": ["args"], "global": "argparse.Namespace"}]'
    json_expect '[s["path"] for s in d["state_dicts"]]' '[["model_state_dict"],
        ["optimizer_state_dict", "state", 0], ["optimizer_state_dict", "state", 1],
        ["optimizer_state_dict", "state", 2], ["optimizer_state_dict", "state", 3]]'
fi

# ---------------------------------------------------------------------------
say "other containers of mlp.pth: protocol 4, deflated records, renamed prefix"
for f in proto4 deflated prefix_renamed; do
    expect_exit 0 ckpt inspect tests/data/$f.pth
    expect_stdout_line "state dict (root): 4 tensors"
    expect_stdout_line "total: 4 tensors, 101770 elements, 397.5 KiB"
done
expect_exit 0 ckpt inspect tests/data/prefix_renamed.pth
expect_stdout_line "archive prefix 'weird-name', 6 records"

# ---------------------------------------------------------------------------
say "dtypes.pth: shared storages, offsets and non-contiguous views in the NOTE column"
expect_exit 0 ckpt inspect tests/data/dtypes.pth
expect_stderr_empty
expect_stdout_line "tests/data/dtypes.pth: pth-zip, 20 tensors in 18 storages, 723 B"
note "tied_a and tied_b are the same tensor: one storage, named in both rows"
k_a=$(sed -n 's/^tied_a .*shares storage \([^ ,]*\).*/\1/p' "$out")
k_b=$(sed -n 's/^tied_b .*shares storage \([^ ,]*\).*/\1/p' "$out")
check "tied_a and tied_b share storage '$k_a'" test -n "$k_a" -a "$k_a" = "$k_b"
note "offset_view is base[5:12]: same storage as base, offset 5"
k_base=$(sed -n 's/^base .*shares storage \([^ ,]*\).*/\1/p' "$out")
expect_stdout_match "^offset_view +float32 +\\[7\\] +cpu +28 B +shares storage $k_base, offset 5\$"
check "base and offset_view share storage '$k_base', not tied_a's" \
    test -n "$k_base" -a "$k_base" != "$k_a"
expect_stdout_match '^transposed +float32 +\[5, 3\] +cpu +60 B +non-contiguous$'
expect_stdout_match '^permuted +float32 +\[4, 2, 3\] +cpu +96 B +non-contiguous$'
expect_stdout_match '^scalar +float32 +\[\] +cpu +4 B$'
expect_stdout_match '^empty +float32 +\[0, 3\] +cpu +0 B$'
note "a tensor listed under two names counts once"
expect_stdout_line "total: 20 tensors, 182 elements, 723 B"
if have_python; then
    expect_exit 0 ckpt inspect --json tests/data/dtypes.pth
    json_true 'tensor("tied_a")["storage"] == tensor("tied_b")["storage"]' \
        "tied_a and tied_b have the same storage"
    json_true 'tensor("offset_view")["storage"] == tensor("base")["storage"]' \
        "offset_view and base have the same storage"
    json_expect '[tensor("offset_view")[k] for k in ("shape", "stride", "offset", "nbytes")]' \
        '[[7], [1], 5, 28]'
    json_expect '[tensor("transposed")[k] for k in ("shape", "stride")]' '[[5, 3], [1, 5]]'
    json_expect '[tensor("permuted")[k] for k in ("shape", "stride")]' '[[4, 2, 3], [1, 12, 4]]'
    json_expect '[tensor("scalar")[k] for k in ("shape", "stride", "nbytes")]' '[[], [], 4]'
    json_expect '[t["dtype"] for t in d["tensors"][:12]]' '["float64", "float32", "float16",
        "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64", "complex128"]'
    json_expect 'len(d["storages"])' 18
    json_expect 'd["summary"]["parameters"]' 182
    json_expect 'd["summary"]["bytes"]' 723
fi

say "keep_vars=True: nn.Parameter values are marked"
expect_exit 0 ckpt inspect tests/data/keepvars.pth
expect_stdout_match '^n\.1\.weight +float32 +\[128, 784\] +cuda:0 +392\.0 KiB +parameter$'
if have_python; then
    expect_exit 0 ckpt inspect --json tests/data/keepvars.pth
    json_true 'all(t["parameter"] and t["requires_grad"] for t in d["tensors"])' \
        "every tensor has parameter and requires_grad true"
fi

say "a model split over two GPUs: bytes by device"
expect_exit 0 ckpt inspect tests/data/ae_model_parallel.pth
expect_stdout_match '^by device: cuda:0 [0-9.]+ KiB, cuda:1 [0-9.]+ KiB$'
if have_python; then
    expect_exit 0 ckpt inspect --json tests/data/ae_model_parallel.pth
    json_expect 'd["summary"]["by_device"]' '{"cuda:0": 420544, "cuda:1": 432708}'
    json_true 'all(t["device"] == ("cuda:0" if t["path"][0].startswith("encoder.") else "cuda:1")
                   for t in d["tensors"])' "encoder tensors on cuda:0, decoder tensors on cuda:1"
fi

say "BatchNorm buffers: 0-dim int64 num_batches_tracked"
expect_exit 0 ckpt inspect tests/data/bn.pth
expect_stdout_match '^features\.1\.num_batches_tracked +int64 +\[\] +cpu +8 B$'

# ---------------------------------------------------------------------------
say "--filter: a PCRE2 regex over the path; the summary still covers the file"
expect_exit 0 ckpt inspect --filter 'n\.3\.' tests/data/dp_mlp.pth
expect_stderr_empty
expect_stdout_match '^module\.n\.3\.weight '
expect_stdout_match '^module\.n\.3\.bias '
expect_stdout_no_match '^module\.n\.1\.'
expect_stdout_line "(2 of 4 tensors match the filter)"
expect_stdout_line "state dict (root): 4 tensors, wrapper prefix module. (DataParallel / DistributedDataParallel)"
expect_stdout_line "total: 4 tensors, 101770 elements, 397.5 KiB"
note "the path is joined with '/', and the regex is unanchored"
expect_exit 0 ckpt inspect --filter '^optimizer_state_dict/state/[0-9]+/' tests/data/train_ckpt.pth
expect_stdout_line "(4 of 8 tensors match the filter)"
expect_exit 0 ckpt inspect --filter 'bias$' tests/data/train_ckpt.pth
expect_stdout_line "(2 of 8 tensors match the filter)"
expect_exit 0 ckpt inspect --filter 'no such key' tests/data/dp_mlp.pth
expect_stdout_line "(0 of 4 tensors match the filter)"
if have_python; then
    expect_exit 0 ckpt inspect --json --filter 'n\.3\.' tests/data/dp_mlp.pth
    json_expect '[t["path"] for t in d["tensors"]]' '[["module.n.3.weight"], ["module.n.3.bias"]]'
    cp "$out" "$tmp/filtered.json"
    run python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
sys.exit(0 if all(a[k] == b[k] for k in ("storages", "state_dicts", "objects", "summary")) else 1)
' "$tmp/dp_mlp.json" "$tmp/filtered.json"
    check "storages, state_dicts, objects and summary are those of the unfiltered run" \
        test "$status" -eq 0
fi

# ---------------------------------------------------------------------------
say "--stats: read the data; min/max/mean/std of finite values, NaN/Inf counts, CRC-32"
expect_exit 0 ckpt inspect --stats tests/data/dtypes.pth
expect_stderr_empty
expect_stdout_match '^KEY +DTYPE +SHAPE +DEVICE +SIZE +MIN +MAX +MEAN +STD +NAN +INF +NOTE$'
note "float32 holds 0, -0, nan, +-inf, max, lowest, ...: 1 NaN, 2 Inf"
expect_stdout_match '^float32 +float32 +\[14\] +cpu +56 B +-3\.4028e\+38 +3\.4028e\+38 +[-0-9.e+]+ +[-0-9.e+]+ +1 +2$'
expect_stdout_match '^complex64 +complex64 +\[4\] +cpu +32 B +- +- +- +- +- +-$'
if have_python; then
    expect_exit 0 ckpt inspect --json --stats tests/data/dtypes.pth
    expect_stderr_empty
    json_valid
    json_true 'all(re.fullmatch("[0-9a-f]{8}", t["crc32"]) for t in d["tensors"])' \
        "every tensor has a crc32 of 8 lowercase hex digits"
    for f in float64 float32 float16 bfloat16; do
        json_expect "[tensor('$f')[k] for k in ('nan', 'inf')]" '[1, 2]'
    done
    json_expect '[tensor("float32")[k] for k in ("min", "max")]' \
        '[-3.4028234663852886e+38, 3.4028234663852886e+38]'
    json_expect '[tensor("float16")[k] for k in ("min", "max")]' '[-65504, 65504]'
    json_expect '[tensor("int8")[k] for k in ("min", "max", "nan", "inf")]' '[-128, 127, 0, 0]'
    json_expect '[tensor("bool")[k] for k in ("min", "max", "mean")]' '[0, 1, 0.6]'
    note "mean and std over the finite values of float64 (0, -0, 1, -1.5, +-max, ...):"
    note "the true mean is 0.24014772727..., the std sqrt(0.2) * DBL_MAX"
    json_true 'isinstance(tensor("float64")["mean"], float) and
               abs(tensor("float64")["mean"] - 0.24014772727272726) < 1e-9' \
        "float64 mean is finite (0.2401477...)"
    json_true 'isinstance(tensor("float64")["std"], float) and
               abs(tensor("float64")["std"] / 1.7976931348623157e308 - 0.4472135954999579) < 1e-9' \
        "float64 std is finite (sqrt(0.2) * DBL_MAX)"
    note "a 0-dim tensor has no std (N-1 = 0); an empty one has no min/max/mean"
    json_expect '[tensor("scalar")[k] for k in ("min", "max", "mean", "std")]' '[2.5, 2.5, 2.5, null]'
    json_expect '[tensor("empty")[k] for k in ("min", "max", "mean", "std", "nan", "inf", "crc32")]' \
        '[null, null, null, null, 0, 0, "00000000"]'
    note "complex tensors have no order: crc32 only"
    json_true 'not any(k in tensor("complex64") for k in ("min", "max", "mean", "std", "nan", "inf"))' \
        "complex64 has no min/max/mean/std/nan/inf"
    json_true '"crc32" in tensor("complex128") and "mean" not in tensor("complex128")' \
        "complex128 has a crc32 and no mean"
    note "crc32 is the CRC-32 of the elements in C order, checked with Python's zipfile and zlib"
    json_true '
all(tensor(n)["crc32"] == "%08x" % zipfile.ZipFile(srcdir + "/tests/data/dtypes.pth")
        .getinfo("dtypes/data/" + tensor(n)["storage"]).CRC
    for n in ("float64", "float32", "bool", "complex64", "scalar", "base", "tied_a"))' \
        "crc32 of a tensor covering its whole storage is the CRC of its zip record"
    json_true '
tensor("offset_view")["crc32"] == "%08x" % zlib.crc32(
    zipfile.ZipFile(srcdir + "/tests/data/dtypes.pth")
        .read("dtypes/data/" + tensor("offset_view")["storage"])[5 * 4:12 * 4])' \
        "crc32 of offset_view is the CRC of elements 5..11 of its storage"
    json_true '
(lambda raw: tensor("transposed")["crc32"] == "%08x" % zlib.crc32(b"".join(
    raw[(j * 5 + i) * 4:(j * 5 + i) * 4 + 4] for i in range(5) for j in range(3))))(
    zipfile.ZipFile(srcdir + "/tests/data/dtypes.pth")
        .read("dtypes/data/" + tensor("transposed")["storage"]))' \
        "crc32 of transposed (stride [1, 5]) is the CRC of its elements in C order"
    json_true 'tensor("tied_a")["crc32"] == tensor("tied_b")["crc32"]' "tied_a and tied_b have the same crc32"
fi

say "--stats: the same data in three containers has the same crc32"
if have_python; then
    for f in mlp deflated legacy_mlp; do
        expect_exit 0 ckpt inspect --json --stats tests/data/$f.pth
        expect_stderr_empty
        cp "$out" "$tmp/stats-$f.json"
    done
    run python3 -c '
import json, sys
crcs = [[t["crc32"] for t in json.load(open(f))["tensors"]] for f in sys.argv[1:]]
print(crcs[0])
sys.exit(0 if crcs[0] == crcs[1] == crcs[2] else 1)
' "$tmp/stats-mlp.json" "$tmp/stats-deflated.json" "$tmp/stats-legacy_mlp.json"
    check "mlp.pth, deflated.pth and legacy_mlp.pth: crc32 $(cat "$out")" test "$status" -eq 0
fi

say "--quiet prints nothing; with --stats it still reads and checks all the data"
expect_exit 0 ckpt inspect --quiet tests/data/train_ckpt.pth
expect_stdout_empty
expect_stderr_empty
expect_exit 0 ckpt inspect --stats --quiet tests/data/deflated.pth
expect_stdout_empty
expect_stderr_empty

# ---------------------------------------------------------------------------
say "errors: a bad regex is a usage error (2)"
expect_exit 2 ckpt inspect --filter '(' tests/data/dp_mlp.pth
expect_stdout_empty
expect_stderr_prefix "ckpt: inspect: --filter '(': "

say "errors: a missing file is an I/O error (4)"
expect_exit 4 ckpt inspect tests/data/no_such_file.pth
expect_stdout_empty
expect_stderr_prefix "ckpt: inspect: tests/data/no_such_file.pth: "

say "errors: a directory that is no checkpoint folder (DCP, DeepSpeed) is unsupported input (3)"
expect_exit 3 ckpt inspect tests/data
expect_stdout_empty
expect_stderr_line '^ckpt: inspect: tests/data: a directory, but not a .* checkpoint folder$'

say "a refusal's hint is a command that works on that file: run it"
expect_exit 3 ckpt inspect tests/bad/two_unknown_classes.pth
expect_stderr_line "--allow-global mymods.X --allow-global mymods.Y admit them"
# shellcheck disable=SC2046
hint=$(sed -n 's/.*; \(--allow-global [^;]*\) admit them.*/\1/p' "$err")
note "the hint: $hint"
# shellcheck disable=SC2086
expect_exit 0 ckpt inspect $hint tests/bad/two_unknown_classes.pth
expect_stdout_line "objects kept opaque:"
note "a file that also names code: no option is offered, for none would read it"
expect_exit 3 ckpt inspect tests/bad/unknown_and_dangerous.pth
expect_stderr_line "the pickle also names operator.attrgetter, which can run code and is never admitted: no option reads this file"
expect_exit 3 ckpt inspect --allow-unknown tests/bad/unknown_and_dangerous.pth

say "options may follow FILE, as users often type them"
expect_exit 0 ckpt inspect tests/data/dp_mlp.pth --json
json_valid

finish
