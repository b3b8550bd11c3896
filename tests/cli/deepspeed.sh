#!/bin/sh
# deepspeed.sh - DeepSpeed ZeRO checkpoint folders as a user meets them,
# made by tests/bad/make_bad_deepspeed.py (plain Python: no torch, no
# DeepSpeed): the folder with `latest` (ZeRO-2) and a tag folder given
# directly (ZeRO-3) read as zero_to_fp32 reconstructs them (EXPECTED.pth),
# through every command; then hostile folders, each refused with exit 3,
# one line on stderr and no OUT.  Values against real DeepSpeed runs:
# tests/interop/deepspeed_folders.py.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

py=${PYTHON:-python3}
command -v "$py" >/dev/null 2>&1 || skip "no $py to write the folders"
w=$tmp/ds
"$py" "$srcdir/tests/bad/make_bad_deepspeed.py" "$w" || skip "make_bad_deepspeed.py failed"
want=$w/EXPECTED.pth

for in in "$w/good_zero2" "$w/good_zero3/global_step3"; do
    say "$(basename "$(dirname "$in")")/$(basename "$in"): every command on the folder"
    expect_exit 0 ckpt inspect "$in"
    expect_stdout_match "^$in: deepspeed, 5 tensors in 4 storages"
    expect_stdout_match "^DeepSpeed ZeRO stage [23] \(DeepSpeedZeroOptimizer\)"
    inspect_json "$in"
    json_expect 'd["format"]' '"deepspeed"'
    json_expect '[s["source"] for s in d["state_dicts"]]' '["deepspeed"]'
    json_expect '[t["path"][0] for t in d["tensors"]]' '["running", "fz", "a", "b", "c"]'
    json_expect 'd["layout"]["world_size"]' 2
    json_true 'tensor("a")["storage"] == tensor("c")["storage"]' "the tied alias c is a's storage"
    # b: all in rank 1's partition at ZeRO-2, 3 + 2 elements at ZeRO-3
    json_expect '[r["rank"] for r in tensor("b")["runs"]]' \
        "$(case $in in *zero2*) echo '[1]' ;; *) echo '[0, 1]' ;; esac)"
    expect_exit 0 ckpt inspect --stats "$in"
    expect_exit 0 ckpt convert "$in" "$tmp/out.pth"
    expect_exit 0 ckpt diff "$tmp/out.pth" "$want"
    expect_exit 0 ckpt diff "$in" "$want"
    expect_exit 0 ckpt convert "$in" "$tmp/out.safetensors"
    expect_exit 0 ckpt diff "$tmp/out.safetensors" "$want"
    mkdir -p "$tmp/sh"
    expect_exit 0 ckpt convert --shard-size 40 "$in" "$tmp/sh/model.safetensors.index.json"
    expect_exit 0 ckpt diff "$tmp/sh/model.safetensors.index.json" "$want"
    expect_exit 0 ckpt extract "$in" "$tmp/ex.pth"
    expect_exit 0 ckpt diff "$tmp/ex.pth" "$want"
    expect_exit 0 ckpt strip-module "$in" "$tmp/strip.pth"
    expect_exit 0 ckpt diff "$tmp/strip.pth" "$want"
    expect_exit 0 ckpt unwrap "$in" "$tmp/unwrap.pth"
    expect_exit 0 ckpt convert --dtype bfloat16 "$in" "$tmp/bf16.pth"
    rm -rf "$tmp/sh" "$tmp"/*.pth "$tmp/out.safetensors"
done

say "good_zero1_fp16: fp16 training at ZeRO-1, the frozen parameter from module (upcast)"
expect_exit 0 ckpt convert "$w/good_zero1_fp16" "$tmp/z1.pth"
expect_stderr_line "note: 1 frozen parameter: ZeRO stage 1 does not record them and zero_to_fp32 drops them; .*\(upcast to float32\)"
expect_exit 0 ckpt diff "$tmp/z1.pth" "$want"
expect_exit 0 ckpt convert --select module "$w/good_zero1_fp16" "$tmp/z1m.pth"
inspect_json "$tmp/z1m.pth"
json_expect '[t["dtype"] for t in d["tensors"]]' '["float16", "float16", "float16", "float16", "float16"]'
rm -f "$tmp/z1.pth" "$tmp/z1m.pth"

say "--select module: the module as trained (ZeRO-2); refused at ZeRO-3"
expect_exit 0 ckpt convert --select module "$w/good_zero2" "$tmp/module.pth"
inspect_json "$tmp/module.pth"
json_expect '[t["path"][0] for t in d["tensors"]]' '["running", "a", "b", "fz", "c"]'
expect_exit 3 ckpt convert --select module "$w/good_zero3/global_step3" "$tmp/m3.pth"
expect_stderr_line 'at ZeRO stage 3, .*placeholders'
check "no OUT for a refused --select" test ! -e "$tmp/m3.pth"

say "scan DIR: every pickle file of the folder; getattr(ZeroStageEnum, member) is data"
expect_exit 0 ckpt scan "$w/good_zero2"
expect_stdout_match "^$w/good_zero2/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt: pth-zip, 1 pickle"
expect_stdout_no_match "UNSAFE|DANGEROUS"
expect_exit 0 ckpt scan --json "$w/good_zero3"
json_expect '[f["file"].rsplit("/", 1)[1] for f in d["files"]]' \
    '["zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]'
expect_exit 1 ckpt scan "$w/getattr_not_data"
expect_stdout_match "DANGEROUS +builtins.getattr "

# a model's weights through ZeRO folders (the weights as trainable
# parameters; zero_to_fp32 gives them back unchanged): verify runs the model
# on the folder itself; a DataParallel model's folder, once strip-module'd
mlp=models/mnist_mlp.json
cd "$srcdir"
for st in 2 3; do
    say "fmnist_mlp.pth through a ZeRO-$st folder of 3 ranks: diff, verify"
    z=$tmp/mlp_zero$st
    expect_exit 0 ckpt convert --quiet tests/data/fmnist_mlp.pth "$tmp/mlp.safetensors"
    expect_exit 0 "$py" tests/bad/make_bad_deepspeed.py --from "$tmp/mlp.safetensors" --stage $st --ranks 3 "$z"
    expect_exit 0 ckpt diff "$z" tests/data/fmnist_mlp.pth
    expect_exit 0 ckpt verify --device cpu --model $mlp --reference tests/data/fmnist_mlp.ref.pth "$z"
    expect_stdout_line "result      PASS"
    rm -rf "$z" "$tmp/mlp.safetensors"
done
say "300 ranks (600 files) under ulimit -n 100: the open files stay bounded"
expect_exit 0 ckpt convert --quiet tests/data/fmnist_mlp.pth "$tmp/mlp.safetensors"
expect_exit 0 "$py" tests/bad/make_bad_deepspeed.py --from "$tmp/mlp.safetensors" --stage 3 --ranks 300 "$tmp/r300"
expect_exit 0 sh -c 'ulimit -n 100 && "$0" convert --quiet "$1" "$2" && "$0" inspect --stats --quiet "$1" &&
    "$0" scan --quiet "$1"' "$CKPT" "$tmp/r300" "$tmp/r300.pth"
expect_exit 0 ckpt diff "$tmp/r300.pth" tests/data/fmnist_mlp.pth
rm -rf "$tmp/r300" "$tmp/r300.pth" "$tmp/mlp.safetensors"

say "a DataParallel model's ZeRO-2 folder: verify fails on module. keys; strip-module/unwrap DIR OUT fix it"
expect_exit 0 ckpt convert --quiet tests/data/fmnist_mlp_dp.pth "$tmp/dp.safetensors"
expect_exit 0 "$py" tests/bad/make_bad_deepspeed.py --from "$tmp/dp.safetensors" --stage 2 --ranks 2 "$tmp/dpz"
expect_exit 1 ckpt verify --device cpu --model $mlp "$tmp/dpz"
expect_exit 0 ckpt strip-module "$tmp/dpz" "$tmp/dp_stripped.pth"
expect_exit 0 ckpt verify --device cpu --model $mlp --reference tests/data/fmnist_mlp.ref.pth "$tmp/dp_stripped.pth"
expect_exit 0 ckpt unwrap "$tmp/dpz" "$tmp/dp_unwrapped.pth"
expect_exit 0 ckpt diff "$tmp/dp_unwrapped.pth" tests/data/fmnist_mlp.pth
rm -rf "$tmp/dpz" "$tmp/dp.safetensors" "$tmp/dp_stripped.pth" "$tmp/dp_unwrapped.pth"

say "the input folder is never written"
(cd "$w/good_zero2" && find . -type f | sort | xargs cksum) >"$tmp/before"
expect_exit 0 ckpt convert "$w/good_zero2" "$tmp/again.pth"
(cd "$w/good_zero2" && find . -type f | sort | xargs cksum) >"$tmp/after"
check "good_zero2 unchanged" cmp -s "$tmp/before" "$tmp/after"

# NAME PATTERN: the hostile folder NAME is refused by inspect (plain, or
# --stats for a defect in the data) and convert: exit 3, one line, no OUT
refuse() {
    _name=$1 _pat=$2 _stats=${3:-}
    say "$_name: refused"
    expect_exit 3 ckpt inspect $_stats "$w/$_name"
    expect_stderr_line "^ckpt: inspect: $w/$_name: .*$_pat"
    expect_stdout_empty
    expect_exit 3 ckpt convert "$w/$_name" "$tmp/$_name.pth"
    expect_stderr_line "^ckpt: convert: $w/$_name: .*$_pat"
    check "no OUT for $_name" test ! -e "$tmp/$_name.pth"
    check "no temporary file left for $_name" test -z "$(ls -A "$tmp" | grep -v -e '^out$' -e '^err$' -e '^ds$' -e '^before$' -e '^after$' -e '^again.pth$' -e '^module.pth$')"
}
refuse missing_rank "partition_count says 2 ranks but 'global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt' is missing"
refuse count_more_ranks "partition_count says 3 ranks but 'global_step3/zero_pp_rank_2_mp_rank_00_optim_states.pt' is missing"
refuse bad_partition_count "partition_count\[0\] is not a positive int"
refuse short_partition "hold 8 elements; parameter 'b' \(5\) needs them up to 11"
refuse latest_escape "latest: the tag '\.\./x' is not a folder name inside"
refuse latest_missing_tag "latest names the tag 'global_step9', which is not a folder"
refuse truncated_optim "zero_pp_rank_1_mp_rank_00_optim_states.pt: not a zip archive"
refuse view_past_storage "goes past the end of storage"
refuse padding_overrun "needs them up to 20"
refuse stage3_unequal "zero_pp_rank_1_mp_rank_00_optim_states.pt: its flat fp32 groups hold 4 elements, rank 0's 6"
refuse getattr_not_data "refused global 'builtins.getattr': it can run commands or code"
refuse not_a_tensor "single_partition_of_fp32_groups\[0\] is a str, not a tensor"
refuse latest_symlink "latest names the tag 'global_step3', which is a symbolic link"
refuse big_endian "saved big-endian \(byteorder 'big'\)"
refuse crc_flip "CRC-32 mismatch in record data/0" --stats
refuse crc_flip_padding "zero_pp_rank_1_mp_rank_00_optim_states.pt: CRC-32 mismatch in record data/0" --stats
say "crc_flip: plain inspect reads no data"
expect_exit 0 ckpt inspect "$w/crc_flip"

say "a folder that is no checkpoint"
mkdir "$tmp/empty"
expect_exit 3 ckpt inspect "$tmp/empty"
expect_stderr_line 'a directory, but not a .*deepspeed.* checkpoint folder'
rmdir "$tmp/empty"

finish
