#!/bin/sh
# dcp.sh - torch.distributed.checkpoint folders as a user meets them, written
# without torch by tests/bad/make_bad_dcp.py (Python's stdlib only; skipped
# without a python3): a good two-rank folder is inspected (format dcp, global
# shapes, each tensor's chunks with rank and file), converted to .pth and
# .safetensors with the right values, diffed, extracted, checked whole with
# `inspect --stats`; every hostile folder (chunks out of bounds, overlapping
# or leaving a hole, an item past its file's end, a relative_path leading
# out, a global outside the metadata's records, a truncated item zip, a
# missing rank file) is exit 3 with one line naming the folder, and nothing
# written.  Then scale: 1,000 ranks and 100,000 tensors open under
# `ulimit -n 1024`.  Values against torch: tests/interop/dcp_folders.py.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "no python3 to write the folders"
f=$tmp/f
python3 "$srcdir/tests/bad/make_bad_dcp.py" "$f" || {
    echo "ERROR: make_bad_dcp.py failed"
    exit 99
}
w=$tmp/w
mkdir "$w"

say "a two-rank folder: inspect"
expect_exit 0 ckpt inspect "$f/good"
expect_stdout_match "^.*/good: dcp, 2 tensors in 2 storages, 108 B$"
expect_stdout_match "^model/w +float32 +\[6, 4\] +cpu +96 B +2 chunks \(ranks 0-1\)$"
inspect_json "$f/good"
json_expect 'd["format"]' '"dcp"'
json_expect '[t["path"] for t in d["tensors"]]' '[["model", "w"], ["model", "b"]]'
json_expect '[[c["offsets"], c["sizes"], c["rank"], c["file"]] for c in d["tensors"][0]["chunks"]]' \
    '[[[0, 0], [4, 4], 0, "__0_0.distcp"], [[4, 0], [2, 4], 1, "__1_0.distcp"]]'
json_expect '[s["source"] for s in d["state_dicts"]]' '["dcp"]'

say "convert to .pth and .safetensors: the values"
expect_exit 0 ckpt convert "$f/good" "$w/good.pth"
expect_exit 0 ckpt convert "$f/good" "$w/good.safetensors"
if python3 - "$w/good.safetensors" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def vals(k):
    a, z = h[k]["data_offsets"]
    return list(struct.unpack("<%df" % ((z - a) // 4), b[8 + n + a:8 + n + z]))
assert h["w"]["shape"] == [6, 4] and h["b"]["shape"] == [3], h
assert vals("w") == [10.0 * i + j for i in range(6) for j in range(4)], vals("w")
assert vals("b") == [0.5, 1.5, 2.5], vals("b")
EOF
then ok "model.w[i][j] == 10i + j and model.b as saved, in the safetensors file"; else
    fail "the safetensors values are not the saved ones"; fi
expect_exit 0 ckpt diff "$f/good" "$w/good.pth"
expect_exit 0 ckpt diff "$w/good.safetensors" "$w/good.pth"
inspect_json "$w/good.pth"
json_expect '[t["path"] for t in d["tensors"]]' '[["model", "w"], ["model", "b"]]'
expect_exit 0 ckpt extract "$f/good" "$w/model.pth"
expect_exit 0 ckpt diff "$w/model.pth" "$w/good.safetensors"
expect_exit 0 ckpt unwrap "$f/good" "$w/unwrapped.pth"
expect_exit 0 ckpt diff "$w/unwrapped.pth" "$w/good.pth"

say "inspect --stats reads every item and checks every CRC"
expect_exit 0 ckpt inspect --stats "$f/good"
expect_stdout_match "^model/w .* 0 +53 +"

for b in out_of_bounds overlap hole offset_past_eof escape absolute unknown_global os_system \
    unknown_in_item truncated_zip missing_rank list_index; do
    case $b in
    out_of_bounds) why="chunk 1 \(offset 4, size 3 in dimension 0\) lies outside" ;;
    overlap) why="tensor 'model.w': .* in two pieces" ;;
    hole) why="tensor 'model.w': .* in no piece" ;;
    offset_past_eof) why="'model.b': its item .* lies past the end of '__0_0.distcp'" ;;
    escape) why="'\.\./x\.distcp' leads out of the checkpoint's folder" ;;
    absolute) why="'/etc/passwd' leads out of the checkpoint's folder" ;;
    unknown_global) why="refused global 'evil_module.Payload': not one of the records" ;;
    unknown_in_item) why="item 'step' .* refused global 'evil_module.Payload'" ;;
    os_system) why="refused global '(posix|os)\.system'" ;;
    truncated_zip) why="'__1_0.distcp' item 'model.w' \(from byte 0\): not a torch.save zip" ;;
    missing_rank) why="'__1_0.distcp': No such file" ;;
    list_index) why="'model.b' has list index 99999999, past the 3 entries" ;;
    esac
    say "hostile folder $b: exit 3, one line, nothing written"
    expect_exit 3 ckpt convert "$f/$b" "$w/$b.pth"
    expect_stderr_line "^ckpt: convert: .*/$b: .*$why"
    check "no $b.pth written" test ! -e "$w/$b.pth"
    expect_exit 3 ckpt inspect "$f/$b"
done

say "verify on a folder: MNIST weights saved as DCP by two ranks (rows split) run as PyTorch ran them"
expect_exit 0 ckpt convert "$srcdir/tests/data/fmnist_mlp.pth" "$w/fmnist.safetensors"
if python3 - "$w/fmnist.safetensors" "$f/fmnist_dcp" "$srcdir/tests/bad" <<'EOF'
import json, struct, sys
sys.path.insert(0, sys.argv[3])
import make_bad_dcp as m
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
tensors = {}
for k, e in h.items():
    if k == "__metadata__":
        continue
    a, z = e["data_offsets"]
    vals = list(struct.unpack("<%df" % ((z - a) // 4), b[8 + n + a:8 + n + z]))
    shape = e["shape"]
    row = len(vals) // shape[0]
    cut = (shape[0] + 1) // 2          # torch.chunk over 2 ranks
    tensors[k] = (shape, [(0, [0] * len(shape), [cut] + shape[1:], vals[:cut * row]),
                          (1, [cut] + [0] * (len(shape) - 1), [shape[0] - cut] + shape[1:],
                           vals[cut * row:])])
m.write_folder(sys.argv[2], tensors, {}, planner_fix=lambda p: p.update({k: (k,) for k in p}))
EOF
then ok "wrote a two-rank DCP folder of fmnist_mlp.pth"; else fail "could not write the folder"; fi
expect_exit 0 ckpt verify --model "$srcdir/models/mnist_mlp.json" --device cpu \
    --reference "$srcdir/tests/data/fmnist_mlp.ref.pth" "$f/fmnist_dcp"
expect_stdout_line 'load        strict: all 4 keys matched'
expect_exit 0 ckpt diff "$f/fmnist_dcp" "$srcdir/tests/data/fmnist_mlp.pth"

say "crc_flip: a changed byte of tensor data is found by convert and inspect --stats"
expect_exit 0 ckpt inspect "$f/crc_flip"
for to in pth safetensors; do
    expect_exit 3 ckpt convert "$f/crc_flip" "$w/crc_flip.$to"
    expect_stderr_line "CRC-32 mismatch in '__1_0.distcp'"
    check "no crc_flip.$to written" test ! -e "$w/crc_flip.$to"
done
expect_exit 3 ckpt inspect --stats "$f/crc_flip"

say "scan: every pickle of the folder (.metadata, each item's data.pkl)"
expect_exit 0 ckpt scan "$f/good"
expect_stdout_match "^.*/good/\.metadata: pickle, 1 pickle$"
expect_stdout_match "^.*/good/__0_0\.distcp: dcp, 3 pickles$"
expect_stdout_match "^  known data  builtins\.getattr\(torch\.distributed\.checkpoint\.metadata\._MEM_FORMAT_ENCODING, "
expect_stdout_no_match "UNSAFE|AMBIGUOUS"
expect_exit 1 ckpt scan "$f/unknown_global"
expect_stdout_match "^  unknown     evil_module\.Payload .*pickle 1"
expect_exit 1 ckpt scan "$f/unknown_in_item"
expect_stdout_match "^  unknown     evil_module\.Payload .*item at byte 0: archive/data\.pkl"
expect_exit 1 ckpt scan "$f/os_system"
expect_stdout_match "^  DANGEROUS   (posix|os)\.system"
ckpt scan --json "$f/good"
json_expect '[x["verdict"] for x in d["files"]]' '["safe", "safe", "safe"]'

say "a folder that is no checkpoint"
mkdir "$w/empty"
expect_exit 3 ckpt inspect "$w/empty"

say "scale: 1,000 ranks, 100,000 tensors, under ulimit -n 1024"
python3 "$srcdir/tests/bad/make_bad_dcp.py" --scale "$tmp/scale"
start=$(date +%s)
run sh -c 'ulimit -n 1024 && exec "$0" inspect "$1"' "$CKPT" "$tmp/scale"
end=$(date +%s)
expect_status 0
expect_stdout_match "^total: 100000 tensors, 100000 elements"
check "opened in under 120 s (took $((end - start)) s)" test $((end - start)) -lt 120
rm -rf "$tmp/scale"

finish
