#!/bin/sh
# verify.sh - ckpt verify as a user (or a CI step) runs it (man/ckpt-verify.1):
# the DataParallel checkpoint fails the strict load in torch's words with the
# strip-module fix; the fixed file passes against PyTorch's outputs; the
# autoencoder; --against; --select; --json; --quiet; token ids (int64
# inputs); usage errors (2), bad specs and references (3), a missing file and
# a GPU that is not there (4).
# The load messages and numbers are checked against torch itself in
# tests/interop/verify_vs_torch.py.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
w=$tmp/w
mkdir "$w"
mlp=models/mnist_mlp.json
ae=models/mnist_conv_autoencoder.json

# ===========================================================================
say "a DataParallel checkpoint fails the strict load, in torch's words, with the fix"
expect_exit 1 ckpt verify --model $mlp --device cpu tests/data/fmnist_mlp_dp.pth
expect_stderr_empty
expect_stdout_line 'Error(s) in loading state_dict for MLP:'
expect_stdout_line '	Missing key(s) in state_dict: "n.1.weight", "n.1.bias", "n.3.weight", "n.3.bias". '
expect_stdout_line '	Unexpected key(s) in state_dict: "module.n.1.weight", "module.n.1.bias", "module.n.3.weight", "module.n.3.bias". '
expect_stdout_match '^hint +every key carries the "module\." prefix of DataParallel'
note "the file's storages are on cuda:0, which this machine lacks (CKPT_CUDA_DEVICES=0): the fix remaps them"
expect_stdout_line '            ckpt strip-module --map-location cpu tests/data/fmnist_mlp_dp.pth tests/data/fmnist_mlp_dp_stripped.pth'
expect_stdout_line 'result      FAIL'
note "on a machine with a CUDA device the keys alone need the fix"
CKPT_CUDA_DEVICES=1
expect_exit 1 ckpt verify --model $mlp --device cpu tests/data/fmnist_mlp_dp.pth
expect_stdout_line '            ckpt strip-module tests/data/fmnist_mlp_dp.pth tests/data/fmnist_mlp_dp_stripped.pth'
CKPT_CUDA_DEVICES=0

say "the fix it names works; the result passes against PyTorch's outputs"
expect_exit 0 ckpt strip-module --map-location cpu tests/data/fmnist_mlp_dp.pth "$w/mlp.pth"
expect_exit 0 ckpt verify --model $mlp --device cpu --reference tests/data/fmnist_mlp.ref.pth "$w/mlp.pth"
expect_stderr_empty
expect_stdout_line 'load        strict: all 4 keys matched'
expect_stdout_match '^device +cpu \(float32'
expect_stdout_match '^input +x \[256, 1, 28, 28\] from reference'
expect_stdout_match '^output +logits \[256, 10\]: max abs [0-9.e-]+, max rel [0-9.e-]+ of max \|ref\| [0-9.]+ \(atol [0-9.e-]+, rtol 1e-05\): PASS$'
expect_stdout_line 'accuracy    logits: 85.94% (220/256), PyTorch 85.94% (220/256)'
expect_stdout_line 'result      PASS'

say "cuda:0 tags do not matter: the same weights remapped to cpu give the same bits"
expect_exit 0 ckpt remap --to cpu "$w/mlp.pth" "$w/mlp_cpu.pth"
expect_exit 0 ckpt verify --model $mlp --device cpu --against "$w/mlp_cpu.pth" \
    --reference tests/data/fmnist_mlp.ref.pth "$w/mlp.pth"
expect_stdout_line 'against     logits [256, 10]: identical (bitwise)'

say "the autoencoder: two outputs, each compared"
expect_exit 1 ckpt verify --model $ae --device cpu tests/data/fmnist_ae_dp.pth
expect_exit 0 ckpt unwrap tests/data/fmnist_ae_dp.pth "$w/ae.pth"
expect_exit 0 ckpt verify --model $ae --reference tests/data/fmnist_ae.ref.pth "$w/ae.pth"
expect_stdout_match '^output +x_hat \[256, 1, 28, 28\]: .*: PASS$'
expect_stdout_match '^output +z \[256, 32\]: .*: PASS$'
expect_stdout_no_match '^accuracy'

say "without a reference: the strict load and a forward pass on a fixed random batch"
expect_exit 0 ckpt verify --model $mlp tests/data/fmnist_mlp.pth
expect_stdout_match '^input +x \[4, 1, 28, 28\] from random'
expect_stdout_line 'output      logits [4, 10]'

say "a training checkpoint: the state dict that fits is found, or named with --select"
expect_exit 1 ckpt verify --model $mlp tests/data/train_ckpt.pth
expect_stdout_match '^checkpoint +tests/data/train_ckpt.pth: state dict at model_state_dict$'
expect_stdout_match "ckpt strip-module --map-location cpu --select 'model_state_dict' tests/data/train_ckpt.pth"
expect_exit 1 ckpt verify --model $mlp --select optimizer_state_dict tests/data/train_ckpt.pth
expect_stdout_match '^	Missing key\(s\) in state_dict: "n.1.weight"'

say "--json for CI"
expect_exit 1 ckpt verify --json --model $mlp tests/data/fmnist_mlp_dp.pth
json_valid
json_expect 'd["result"]' '"FAIL"'
json_expect 'd["load"]["missing"]' '["n.1.weight", "n.1.bias", "n.3.weight", "n.3.bias"]'
json_true 'd["fix"].startswith("ckpt strip-module ")'
expect_exit 0 ckpt verify --json --model $mlp --reference tests/data/fmnist_mlp.ref.pth tests/data/fmnist_mlp.pth
json_expect 'd["result"]' '"PASS"'
json_true 'd["outputs"][0]["reference"]["pass"] and d["outputs"][0]["reference"]["max_rel"] < 1e-5'
json_true 'd["outputs"][0]["accuracy"] == d["outputs"][0]["reference_accuracy"] == 220 / 256'

say "--tf32: TF32's tolerance; on the CPU it changes nothing else, and says so"
expect_exit 0 ckpt verify --tf32 --device cpu --model $mlp --reference tests/data/fmnist_mlp.ref.pth tests/data/fmnist_mlp.pth
expect_stderr_empty
expect_stdout_match '^device +cpu \(float32'
expect_stdout_line 'note        --tf32: the CPU backend computes in FP32 whatever --tf32 says; only the tolerance widens'
expect_stdout_match '^output +logits \[256, 10\]: .* \(atol [0-9.e-]+, rtol 0\.01\): PASS$'
expect_exit 0 ckpt verify --json --tf32 --device cpu --model $mlp --reference tests/data/fmnist_mlp.ref.pth tests/data/fmnist_mlp.pth
json_expect 'd["tf32"]' 'true'
json_true 'd["tf32_note"].startswith("the CPU backend computes in FP32")'
json_true 'd["outputs"][0]["reference"]["rtol"] == 1e-2'
note "the same bits as without --tf32: the CPU backend's arithmetic is untouched"
json_true 'd["outputs"][0]["reference"]["max_abs"] < 1e-5'
cp "$out" "$w/tf32.json"
expect_exit 0 ckpt verify --json --device cpu --model $mlp --reference tests/data/fmnist_mlp.ref.pth tests/data/fmnist_mlp.pth
json_expect 'd["tf32"]' 'false'
json_true '"tf32_note" not in d and d["outputs"][0]["reference"]["rtol"] == 1e-5'
json_true 'd["outputs"][0]["reference"]["max_abs"] == json.load(open("'"$w"'/tf32.json"))["outputs"][0]["reference"]["max_abs"]'
note "an explicit tolerance still wins"
expect_exit 0 ckpt verify --tf32 --rtol 1e-3 --device cpu --model $mlp --reference tests/data/fmnist_mlp.ref.pth tests/data/fmnist_mlp.pth
expect_stdout_match 'rtol 0\.001\): PASS$'
expect_exit 2 ckpt verify --tf32=1 --model $mlp tests/data/fmnist_mlp.pth

say "--quiet: the exit status tells"
expect_exit 1 ckpt verify --quiet --model $mlp tests/data/fmnist_mlp_dp.pth
expect_stdout_empty
expect_stderr_empty

say "a reference for another model fails on shapes, not silently"
expect_exit 3 ckpt verify --model $mlp --reference tests/data/fmnist_ae.ref.pth tests/data/fmnist_mlp.pth
expect_stderr_prefix "ckpt: verify: tests/data/fmnist_ae.ref.pth: has no tensor 'output.logits'"
expect_exit 1 ckpt verify --model $mlp --atol 0 --rtol 0 --reference tests/data/fmnist_mlp.ref.pth tests/data/fmnist_mlp.pth
expect_stdout_match 'FAIL, [0-9]+ of 2560 elements out of tolerance'

say "--replicas: DataParallel's scatter/gather replayed (checked against torch in ssd_vs_torch.py)"
# On the CPU backend a chunk's outputs are the full batch's bit for bit; on a GPU, cuBLAS
# picks other GEMM algorithms for other batch sizes, so there they are "within tolerance".
expect_exit 1 ckpt verify --device cpu --model models/ssd300.json --replicas 2 tests/data/ssd300_narrow.pth
expect_stdout_match '^replicas +2 requested; the batch of 4 split into 2 chunks'
expect_stdout_line 'replica     loc [4, 8732, 4]: gathered back identically'
expect_stdout_line 'replica     conf [4, 8732, 21]: gathered back identically'
expect_stdout_match '^replica +priors \[8732, 4\]: BREAKS under DataParallel: it has no batch dimension, so DataParallel returns 2 copies stacked along dim 0 \(\[17464, 4\] instead of \[8732, 4\]\)'
expect_exit 1 ckpt verify --model models/crnn_tiny.json --replicas 2 tests/data/crnn_tiny.pth
expect_stdout_match '^replica +logits \[8, 4, 11\]: BREAKS under DataParallel: its batch dimension is dim 1, not 0'
expect_exit 0 ckpt verify --json --model $mlp --replicas 2 tests/data/fmnist_mlp.pth
json_expect 'd["replicas"]["used"]' 2
json_expect 'd["replicas"]["outputs"][0]["gathered_shape"]' '[4, 10]'
json_true 'd["replicas"]["outputs"][0]["ok"]'

say "token ids: an int64 input, read exactly; random ids drawn below the vocabulary"
llama=tests/data/ops/chain_llama_block
expect_exit 0 ckpt verify --model $llama.json --reference $llama.pth $llama.pth
expect_stdout_match '^input +ids \[2, 6\] from reference'
expect_stdout_match '^output +y \[2, 6, 40\]: .*: PASS$'
note "without a reference the ids come from [0, 40), the embedding's rows (a float in [0, 1) would be refused)"
expect_exit 0 ckpt verify --model $llama.json $llama.pth
expect_stdout_match '^input +ids \[2, 6\] from random'
expect_exit 3 ckpt verify --model $llama.json --reference tests/data/ids_too_big.ref.pth $llama.pth
expect_stderr_line "^ckpt: verify: tests/data/ids_too_big.ref.pth: 'input' holds the id at least 16777216; the runtime carries ids from 0 to 2\^24 - 1 \(16777215\) exactly$"
expect_exit 3 ckpt verify --model $llama.json --reference tests/data/ids_float.ref.pth $llama.pth
expect_stderr_line "ids_float.ref.pth: 'input' is a float32 tensor of 2 dimensions; the model takes integer ids there"
note "the embedding may read the ids through a view: its 50 rows still bound them"
printf '{"name": "m", "inputs": [{"name": "ids", "shape": [-1, 7], "dtype": "int64"}], "nodes": [{"op": "reshape", "inputs": ["ids"], "output": "flat", "attrs": {"shape": [-1]}}, {"op": "embedding", "inputs": ["flat"], "output": "y", "params": {"weight": "p.weight"}}], "outputs": ["y"]}' >"$w/ids_view.json"
expect_exit 0 ckpt verify --model "$w/ids_view.json" --select params tests/data/ops/embedding_2d.pth
expect_stdout_line 'output      y [28, 16]'
note "an integer input no embedding reads needs \"high\" for random ids"
printf '{"name": "m", "inputs": [{"name": "ids", "shape": [-1, 784], "dtype": "int64"%s}], "nodes": [{"op": "linear", "inputs": ["ids"], "output": "h", "params": {"weight": "n.1.weight", "bias": "n.1.bias"}}, {"op": "linear", "inputs": ["h"], "output": "y", "params": {"weight": "n.3.weight", "bias": "n.3.bias"}}], "outputs": ["y"]}' '' >"$w/ids.json"
expect_exit 3 ckpt verify --model "$w/ids.json" tests/data/fmnist_mlp.pth
expect_stderr_line 'ids.json: input "ids" takes integer ids and no embedding reads it: give it "high" in the spec'
printf '{"name": "m", "inputs": [{"name": "ids", "shape": [-1, 784], "dtype": "int64"%s}], "nodes": [{"op": "linear", "inputs": ["ids"], "output": "h", "params": {"weight": "n.1.weight", "bias": "n.1.bias"}}, {"op": "linear", "inputs": ["h"], "output": "y", "params": {"weight": "n.3.weight", "bias": "n.3.bias"}}], "outputs": ["y"]}' ', "high": 7' >"$w/ids.json"
expect_exit 0 ckpt verify --model "$w/ids.json" tests/data/fmnist_mlp.pth
expect_stdout_line 'result      PASS'

say "usage errors exit 2"
expect_exit 2 ckpt verify tests/data/fmnist_mlp.pth
expect_stderr_prefix 'ckpt: verify: --model SPEC is required'
expect_exit 2 ckpt verify --model $mlp
expect_exit 2 ckpt verify --model $mlp --device tpu tests/data/fmnist_mlp.pth
expect_exit 2 ckpt verify --model $mlp --rtol -1 tests/data/fmnist_mlp.pth
expect_exit 2 ckpt verify --model $mlp --bogus tests/data/fmnist_mlp.pth
expect_exit 2 ckpt verify --model $mlp --replicas 0 tests/data/fmnist_mlp.pth
expect_stderr_prefix "ckpt: verify: --replicas needs a count from 1 to 64"
expect_exit 2 ckpt verify --model models/ssd300.json --replicas 2 --reference tests/data/ssd300_narrow.ref.pth tests/data/ssd300_narrow.pth
expect_stderr_line 'ssd300_narrow.ref.pth: --replicas 2 needs a batch of at least 2 to split, and the input.s is 1'
expect_exit 0 ckpt verify --help
expect_stdout_match '^usage: ckpt verify --model SPEC'

say "bad specs and files exit 3 with one line; missing files 4"
printf '{"name": "m", "inputs": [{"name": "x", "shape": [-1, 4]}], "nodes": [{"op": "linear", "inputs": ["x"], "output": "y"}], "outputs": ["y"]}' >"$w/bad.json"
expect_exit 3 ckpt verify --model "$w/bad.json" tests/data/fmnist_mlp.pth
expect_stderr_line 'bad.json: node 0 \(linear -> "y"\): the parameter "weight" is required$'
printf 'not json' >"$w/junk.json"
expect_exit 3 ckpt verify --model "$w/junk.json" tests/data/fmnist_mlp.pth
expect_stderr_line 'junk.json: not valid JSON'
expect_exit 3 ckpt verify --model $mlp tests/bad/truncated_zip.pth
expect_stderr_line '^ckpt: verify: tests/bad/truncated_zip.pth: '
cp tests/data/fmnist_mlp.pth "$w/flipped.pth"
printf '\377' | dd of="$w/flipped.pth" bs=1 seek=200000 conv=notrunc 2>/dev/null
expect_exit 3 ckpt verify --model $mlp "$w/flipped.pth"
expect_stderr_line 'flipped.pth: .*CRC'
expect_exit 4 ckpt verify --model "$w/nothing.json" tests/data/fmnist_mlp.pth
expect_stderr_line 'nothing.json: No such file or directory'
expect_exit 4 ckpt verify --model $mlp "$w/nothing.pth"

say "a GPU that is not there is an error, not a silent CPU run"
if "$CKPT" --version | grep -q '; backends: cpu, cuda (' && [ "$("$CKPT" verify --json --model $mlp tests/data/fmnist_mlp.pth | python3 -c 'import json,sys; print(json.load(sys.stdin)["device"])' 2>/dev/null)" != cpu ]; then
    note "a GPU is present: cuda:0 runs, a GPU that is not there is still exit 4"
    expect_exit 0 ckpt verify --device cuda:0 --model $mlp --reference tests/data/fmnist_mlp.ref.pth tests/data/fmnist_mlp.pth
    expect_exit 4 ckpt verify --device cuda:99 --model $mlp tests/data/fmnist_mlp.pth
    expect_stderr_prefix 'ckpt: verify: --device cuda:99: '
else
    expect_exit 4 ckpt verify --device cuda --model $mlp tests/data/fmnist_mlp.pth
    expect_stderr_prefix 'ckpt: verify: --device cuda: '
    expect_exit 0 ckpt verify --device auto --model $mlp tests/data/fmnist_mlp.pth
    expect_stdout_match '^device +cpu .* -- auto: '
fi

finish
