#!/bin/sh
# map_location.sh - `--map-location M` on the rewrites (strip-module,
# add-module, unwrap, rename, extract, convert): the storages' device tags
# remapped in the same write as the rewrite, as `ckpt remap` does, so one
# command ends with a file that loads on this machine; and the torch_load
# verdict's `devices` / `missing_here` (ckpt-inspect(1), "Will it load?"),
# with CKPT_CUDA_DEVICES standing for the CUDA driver's count.  Plain
# torch.load of the outputs is tests/interop/map_location.py.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "no python3 to read the JSON of ckpt inspect"

mkdir "$tmp/w"
cd "$tmp/w"
cpu4='["cpu", "cpu", "cpu", "cpu"]'
cuda4='["cuda:0", "cuda:0", "cuda:0", "cuda:0"]'
mlp_keys='[["n.1.weight"], ["n.1.bias"], ["n.3.weight"], ["n.3.bias"]]'

# ===========================================================================
say "the verdict names the devices and those this machine lacks (no CUDA: CKPT_CUDA_DEVICES=0)"
CKPT_CUDA_DEVICES=0
inspect_json "$data/dp_mlp.pth"
json_expect 'd["torch_load"]["2.6+"]["devices"]' '["cuda:0"]'
json_expect 'd["torch_load"]["2.6+"]["missing_here"]' '["cuda:0"]'
json_expect 'd["torch_load"]["1.13"]["missing_here"]' '["cuda:0"]'
json_true 'd["torch_load"]["2.6+"]["accepted"]' "accepted stays the file's own property"
json_true '"Attempting to deserialize object on a CUDA device" in d["torch_load"]["2.6+"]["note"]' \
    "the note quotes torch's error"
json_expect 'd["torch_load"]["2.6+"]["fix"].split(" (")[0]' \
    "\"ckpt strip-module --map-location cpu $data/dp_mlp.pth OUT.pth\""
ckpt inspect "$data/dp_mlp.pth"
expect_stdout_match '^torch\.load \(2\.6\+, weights-only\): accepted by the unpickler, but not on this machine: its storages need cuda:0, which this machine lacks .*; fix: ckpt strip-module --map-location cpu '
expect_stdout_no_match ': accepted$'
note "a file without a wrapper prefix: the fix is remap alone"
inspect_json "$data/mlp.pth"
json_expect 'd["torch_load"]["1.13"]["fix"]' \
    "\"ckpt remap --to cpu $data/mlp.pth OUT.pth (or torch.load(f, map_location='cpu'))\""
note "two GPUs' tags (ae_model_parallel.pth): both missing"
inspect_json "$data/ae_model_parallel.pth"
json_expect 'd["torch_load"]["2.6+"]["missing_here"]' '["cuda:0", "cuda:1"]'
note "scan says the same"
ckpt scan "$data/dp_mlp.pth"
expect_stdout_match '^  torch\.load \(1\.13, weights-only\): accepted by the unpickler, but not on this machine'

say "a machine with one GPU (CKPT_CUDA_DEVICES=1): cuda:0 is here, cuda:1 is not"
CKPT_CUDA_DEVICES=1
inspect_json "$data/dp_mlp.pth"
json_expect 'd["torch_load"]["2.6+"]["missing_here"]' '[]'
json_true '"fix" not in d["torch_load"]["2.6+"]' "no fix where nothing is missing"
ckpt inspect "$data/dp_mlp.pth"
expect_stdout_line 'torch.load (2.6+, weights-only): accepted (storages tagged cuda:0: plain torch.load puts them there, and this machine has it)'
inspect_json "$data/ae_model_parallel.pth"
json_expect 'd["torch_load"]["2.6+"]["missing_here"]' '["cuda:1"]'
json_expect 'd["torch_load"]["2.6+"]["fix"]' \
    "\"ckpt remap --map cuda:1=cuda:0 $data/ae_model_parallel.pth OUT.pth\""
json_true '"torch.cuda.device_count() is 1" in d["torch_load"]["2.6+"]["note"]' \
    "the note quotes torch's error for an index past the count"
CKPT_CUDA_DEVICES=0

# ===========================================================================
say "strip-module --map-location cpu: keys and devices in one write"
expect_exit 0 ckpt strip-module --map-location cpu "$data/dp_mlp.pth" sd.pth
expect_stdout_line 'state dict (root): 4 of 4 keys renamed'
expect_stdout_line 'storages: 4 of 4 remapped (cuda:0 -> cpu)'
expect_stderr_empty
expect_tensor_paths sd.pth "$mlp_keys"
expect_devices sd.pth "$cpu4"
json_expect 'd["torch_load"]["2.6+"]["devices"]' '["cpu"]'
json_expect 'd["torch_load"]["2.6+"]["missing_here"]' '[]'
json_expect 'd["torch_load"]["1.13"]["missing_here"]' '[]'
same_data "$data/dp_mlp.pth" sd.pth
ckpt inspect sd.pth
expect_stdout_line 'torch.load (2.6+, weights-only): accepted'

say "--dry-run shows the key changes and the tag changes, and writes nothing"
expect_exit 0 ckpt strip-module --dry-run --map-location cpu "$data/dp_mlp.pth" dry.pth
expect_stdout_is 'module.n.1.weight -> n.1.weight
module.n.1.bias -> n.1.bias
module.n.3.weight -> n.3.weight
module.n.3.bias -> n.3.bias
cuda:0 -> cpu (4 storages)'
check "no dry.pth" test ! -e dry.pth

say "--in-place: one file edited, keys and tags"
cp "$data/dp_mlp.pth" ip.pth
expect_exit 0 ckpt strip-module --in-place --map-location cpu ip.pth
expect_tensor_paths ip.pth "$mlp_keys"
expect_devices ip.pth "$cpu4"
same_data "$data/dp_mlp.pth" ip.pth

say "the training checkpoint: the model's keys, and every storage (optimizer state too) to the cpu"
expect_exit 0 ckpt strip-module --map-location cpu "$data/train_ckpt.pth" train.pth
expect_stdout_line 'storages: 8 of 8 remapped (cuda:0 -> cpu)'
inspect_json train.pth
json_expect 'sorted(set(t["device"] for t in d["tensors"]))' '["cpu"]'
json_expect 'd["torch_load"]["2.6+"]["missing_here"]' '[]'

say "add-module, unwrap, rename take it too"
expect_exit 0 ckpt add-module --map-location cpu "$data/mlp.pth" dp.pth
expect_stdout_line 'storages: 4 of 4 remapped (cuda:0 -> cpu)'
expect_devices dp.pth "$cpu4"
expect_exit 0 ckpt unwrap --map-location cpu "$data/compiled.pth" un.pth
expect_stdout_line 'storages: 4 of 4 remapped (cuda:0 -> cpu)'
expect_tensor_paths un.pth "$mlp_keys"
expect_devices un.pth "$cpu4"
expect_exit 0 ckpt rename -e 's/^n\./net./' --map-location cpu "$data/mlp.pth" rn.pth
expect_stdout_line 'storages: 4 of 4 remapped (cuda:0 -> cpu)'
expect_devices rn.pth "$cpu4"

say "extract: the model's state dict, its storages to the cpu (IN's others are not written)"
expect_exit 0 ckpt extract --map-location cpu "$data/train_ckpt.pth" ex.pth
expect_stdout_line 'storages: cuda:0 -> cpu'
expect_devices ex.pth "$cpu4"
expect_exit 0 ckpt extract --dry-run --map-location cpu "$data/train_ckpt.pth" exd.pth
expect_stdout_is "extracted the state dict 'model_state_dict': 4 tensors
cuda:0 -> cpu"
check "no exd.pth" test ! -e exd.pth

say "convert: to pth-zip and to pth-legacy, both record the tags"
expect_exit 0 ckpt convert --map-location cpu "$data/dp_mlp.pth" cv.pth
expect_stdout_line 'storages: 4 of 4 remapped (cuda:0 -> cpu)'
expect_devices cv.pth "$cpu4"
expect_exit 0 ckpt convert --to pth-legacy --map-location cpu "$data/dp_mlp.pth" cvl.pth
inspect_json cvl.pth
json_expect 'd["format"]' '"pth-legacy"'
json_expect '[t["device"] for t in d["tensors"]]' "$cpu4"
json_expect 'd["torch_load"]["1.13"]["missing_here"]' '[]'

say "safetensors records no device: said once, nothing remapped"
expect_exit 0 ckpt strip-module --map-location cpu "$data/dp_mlp.pth" sd.safetensors
expect_stderr_prefix "ckpt: strip-module: sd.safetensors: note: safetensors records no device, so --map-location has nothing to change (it loads where load() is told)"
expect_stdout_no_match '^storages:'
expect_exit 0 ckpt convert --quiet --map-location cpu "$data/dp_mlp.pth" q.safetensors
expect_stderr_empty

say "FROM=TO, repeatable, the first that matches applies (remap's --map)"
expect_exit 0 ckpt convert --map-location cuda:1=cuda:0 --map-location cuda:0=cpu \
    "$data/ae_model_parallel.pth" ae.pth
expect_stdout_line 'storages: 6 of 12 remapped (cuda:0 -> cpu)'
expect_stdout_line 'storages: 6 of 12 remapped (cuda:1 -> cuda:0)'
inspect_json ae.pth
json_expect 'sorted(set(t["device"] for t in d["tensors"]))' '["cpu", "cuda:0"]'
note "a device type matches every index"
expect_exit 0 ckpt convert --map-location cuda=cpu "$data/ae_model_parallel.pth" ae2.pth
inspect_json ae2.pth
json_expect 'sorted(set(t["device"] for t in d["tensors"]))' '["cpu"]'
note "a remap to the same device changes nothing"
expect_exit 0 ckpt strip-module --map-location cuda:0 "$data/dp_mlp.pth" same.pth
expect_stdout_no_match '^storages:'
expect_devices same.pth "$cuda4"

# ===========================================================================
say "usage errors: exit 2, one line, nothing written"
for bad in 'cuda:' 'CPU' '=cpu' 'cuda:1=' 'cuda:1=cpu=x' 'cuda:01'; do
    expect_exit 2 ckpt strip-module --map-location "$bad" "$data/dp_mlp.pth" bad.pth
    expect_stderr_prefix "ckpt: strip-module: --map-location needs a device (cpu, cuda:0) or FROM=TO (cuda:1=cpu), got '$bad' (see 'ckpt strip-module --help')"
done
check "no bad.pth" test ! -e bad.pth
expect_exit 2 ckpt extract "$data/dp_mlp.pth" bad.pth --map-location
expect_stderr_prefix "ckpt: extract: "
expect_exit 2 ckpt remap --map-location cpu "$data/dp_mlp.pth" bad.pth
expect_stderr_prefix "ckpt: remap: --map-location is for the other rewrites: use --to DEVICE or --map FROM=TO (see 'ckpt remap --help')"
check "no bad.pth" test ! -e bad.pth
note "every rewrite's --help names it"
for c in strip-module add-module unwrap rename extract convert; do
    expect_exit 0 ckpt "$c" --help
    expect_stdout_match '--map-location M'
done

finish
