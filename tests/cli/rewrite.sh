#!/bin/sh
# rewrite.sh - the rewriting commands as a user runs them: strip-module,
# add-module, unwrap, rename and remap (ckpt-rewrite(7); doc/design.md,
# "Common rules" and "The rewriting commands").  Each reads IN, never changes
# it, and writes OUT, a pth-zip in torch's layout; `ckpt inspect --json OUT`
# shows what was renamed.  The refusals, I/O errors and crashes are in
# rewrite_hostile.sh.
# shellcheck disable=SC2016 # rules, regexes and scripts are single-quoted on purpose
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "no python3 to read the JSON of ckpt inspect"

# Outputs go to a directory of their own; the fixtures are read from $data.
mkdir "$tmp/w"
cd "$tmp/w"
size='[0-9]+(\.[0-9]+)? (B|KiB|MiB|GiB)' # as ckpt prints sizes

# expect_wrote OUT T S: the last line of stdout is "wrote OUT: pth-zip, T
# tensors, S storages, SIZE" and OUT is there.
expect_wrote() {
    _re="^wrote $(printf '%s' "$1" | sed 's/[.[\*^$()+?{|]/\\&/g'): pth-zip, $2 tensors?, $3 storages?, $size\$"
    if tail -n 1 "$out" | grep -Eq -- "$_re"; then
        ok "the last line of stdout is 'wrote $1: pth-zip, $2 tensors, $3 storages, SIZE'"
    else
        fail "the last line of stdout is not 'wrote $1: pth-zip, $2 tensors, $3 storages, SIZE': $last_cmd"
        show_output
    fi
    check "$1 is there" test -f "$1"
}

mlp_keys='[["n.1.weight"], ["n.1.bias"], ["n.3.weight"], ["n.3.bias"]]'
dp_keys='[["module.n.1.weight"], ["module.n.1.bias"], ["module.n.3.weight"], ["module.n.3.bias"]]'
mlp_meta='["", "n", "n.0", "n.1", "n.2", "n.3"]'
dp_meta='["", "module", "module.n", "module.n.0", "module.n.1", "module.n.2", "module.n.3"]'

# ===========================================================================
say "strip-module: take the DataParallel prefix off: ckpt strip-module dp_mlp.pth sd.pth"
cksum <"$data/dp_mlp.pth" >"$tmp/dp_mlp.cksum"
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" sd.pth
expect_stderr_empty
expect_stdout_lines 2
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote sd.pth 4 4
note "$(cat "$out")"
check "dp_mlp.pth is unchanged" test "$(cksum <"$data/dp_mlp.pth")" = "$(cat "$tmp/dp_mlp.cksum")"
note "the keys lost 'module.'; order, devices and data are kept"
expect_tensor_paths sd.pth "$mlp_keys"
json_expect 'd["format"]' '"pth-zip"'
json_expect 'd["state_dicts"]' '[{"model": true, "path": [], "source": "mapping", "tensors": 4, "wrappers": []}]'
json_expect '[t["device"] for t in d["tensors"]]' '["cuda:0", "cuda:0", "cuda:0", "cuda:0"]'
json_expect '[s["key"] for s in d["storages"]]' '["0", "1", "2", "3"]'
json_expect 'd["summary"]' '{"tensors": 4, "parameters": 101770, "bytes": 407080,
    "by_dtype": {"float32": 407080}, "by_device": {"cuda:0": 407080}}'
same_data "$data/dp_mlp.pth" sd.pth
note "the archive folder is named after OUT (sd/), every record stored and aligned for mmap"
expect_torch_zip sd.pth sd
note "_metadata (module versions) is rewritten too: '' dropped, module -> '', module.x -> x"
expect_metadata sd.pth '' "$mlp_meta"
note "which is what the unwrapped model saves (mlp.pth)"
expect_metadata "$data/mlp.pth" '' "$mlp_meta"
expect_tensor_paths "$data/mlp.pth" "$mlp_keys"

say "--dry-run prints 'old -> new' for every key that would change and writes nothing"
expect_exit 0 ckpt strip-module --dry-run "$data/dp_mlp.pth" dry.pth
expect_stderr_empty
expect_stdout_is "module.n.1.weight -> n.1.weight
module.n.1.bias -> n.1.bias
module.n.3.weight -> n.3.weight
module.n.3.bias -> n.3.bias"
check "dry.pth was not written" test ! -e dry.pth
check "nothing else was written" test "$(listing .)" = sd.pth

say "options may come after IN and OUT"
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" dry.pth --dry-run
expect_stdout_line "module.n.1.weight -> n.1.weight"
expect_stdout_lines 4
check "dry.pth was not written" test ! -e dry.pth
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" sd-after.pth --prefix module.
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote sd-after.pth 4 4
expect_tensor_paths sd-after.pth "$mlp_keys"

say "--quiet prints nothing and still writes OUT"
expect_exit 0 ckpt strip-module --quiet "$data/dp_mlp.pth" quiet.pth
expect_stdout_empty
expect_stderr_empty
expect_tensor_paths quiet.pth "$mlp_keys"
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" quiet2.pth --quiet
expect_stdout_empty
check "quiet2.pth is there" test -f quiet2.pth

say "an existing OUT (not IN) is replaced"
echo "an old file" >old.pth
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" old.pth
expect_wrote old.pth 4 4
expect_tensor_paths old.pth "$mlp_keys"

say "OUT's name picks the format (doc/design.md): strip-module dp_mlp.pth sd.safetensors"
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" sd.safetensors
expect_stdout_match '^wrote sd\.safetensors: safetensors, 4 tensors, 4 storages'
expect_exit 0 ckpt inspect sd.safetensors
expect_stdout_match '^sd\.safetensors: safetensors, 4 tensors in 4 storages'
expect_tensor_paths sd.safetensors "$mlp_keys"

say "strip-module removes the prefix as many times as it repeats (DDP of DDP)"
expect_exit 0 ckpt strip-module --dry-run "$data/ddp2_mlp.pth" ddp2.pth
expect_stdout_is "module.module.n.1.weight -> n.1.weight
module.module.n.1.bias -> n.1.bias
module.module.n.3.weight -> n.3.weight
module.module.n.3.bias -> n.3.bias"
expect_exit 0 ckpt strip-module "$data/ddp2_mlp.pth" ddp2.pth
expect_stderr_empty
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote ddp2.pth 4 4
expect_tensor_paths ddp2.pth "$mlp_keys"
json_expect 'd["state_dicts"]' '[{"model": true, "path": [], "source": "mapping", "tensors": 4, "wrappers": []}]'
expect_metadata ddp2.pth '' "$mlp_meta"
same_data "$data/ddp2_mlp.pth" ddp2.pth

say "strip-module --prefix P: any prefix"
expect_exit 0 ckpt strip-module --prefix n. "$data/mlp.pth" no-n.pth
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote no-n.pth 4 4
expect_tensor_paths no-n.pth '[["1.weight"], ["1.bias"], ["3.weight"], ["3.bias"]]'
expect_metadata no-n.pth '' '["", "0", "1", "2", "3"]'

# ===========================================================================
say "add-module: what DataParallel saves: ckpt add-module mlp.pth dp.pth"
expect_exit 0 ckpt add-module "$data/mlp.pth" dp.pth
expect_stderr_empty
expect_stdout_lines 2
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote dp.pth 4 4
expect_tensor_paths dp.pth "$dp_keys"
json_expect 'd["state_dicts"]' '[{"model": true, "path": [], "source": "mapping", "tensors": 4, "wrappers": ["module."]}]'
same_data "$data/mlp.pth" dp.pth
expect_torch_zip dp.pth dp
note "_metadata: x -> module.x, '' -> module, and a new '' first, as in dp_mlp.pth"
expect_metadata dp.pth '' "$dp_meta"
expect_metadata "$data/dp_mlp.pth" '' "$dp_meta"

say "add-module --dry-run"
expect_exit 0 ckpt add-module --dry-run "$data/mlp.pth" dry.pth
expect_stderr_empty
expect_stdout_is "n.1.weight -> module.n.1.weight
n.1.bias -> module.n.1.bias
n.3.weight -> module.n.3.weight
n.3.bias -> module.n.3.bias"
check "dry.pth was not written" test ! -e dry.pth

say "add-module adds the prefix once, even where it is there already"
expect_exit 0 ckpt add-module "$data/dp_mlp.pth" dp2.pth
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_tensor_paths dp2.pth '[["module.module.n.1.weight"], ["module.module.n.1.bias"],
    ["module.module.n.3.weight"], ["module.module.n.3.bias"]]'

say "add-module --prefix P"
expect_exit 0 ckpt add-module "$data/mlp.pth" backbone.pth --prefix backbone.
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote backbone.pth 4 4
expect_tensor_paths backbone.pth '[["backbone.n.1.weight"], ["backbone.n.1.bias"],
    ["backbone.n.3.weight"], ["backbone.n.3.bias"]]'
expect_metadata backbone.pth '' \
    '["", "backbone", "backbone.n", "backbone.n.0", "backbone.n.1", "backbone.n.2", "backbone.n.3"]'
expect_exit 0 ckpt strip-module --prefix backbone. backbone.pth backbone-off.pth
expect_tensor_paths backbone-off.pth "$mlp_keys"
expect_metadata backbone-off.pth '' "$mlp_meta"

say "add-module keeps BatchNorm's module versions (version 2) with their modules"
expect_exit 0 ckpt add-module "$data/bn.pth" bn-dp.pth
expect_stdout_line "state dict (root): 14 of 14 keys renamed"
json_ok=$(pickle_eval bn-dp.pth '[root._metadata[k]["version"] for k in
    ("", "module", "module.features.1", "module.features.4", "module.head")]' 2>&1) || true
check "_metadata versions of '', module, module.features.1, .4, module.head: $json_ok" \
    test "$json_ok" = "[1, 1, 2, 2, 1]"
same_data "$data/bn.pth" bn-dp.pth

say "add-module keeps nn.Parameter values (keep_vars=True) as parameters"
expect_exit 0 ckpt add-module "$data/keepvars.pth" keepvars-dp.pth
inspect_json keepvars-dp.pth
json_expect '[t["path"] for t in d["tensors"]]' "$dp_keys"
json_expect '[(t["parameter"], t["requires_grad"]) for t in d["tensors"]]' \
    '[[true, true], [true, true], [true, true], [true, true]]'

# ===========================================================================
say "a rewritten file can be rewritten again: strip then add gives the input's keys back"
expect_exit 0 ckpt add-module sd.pth back.pth
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote back.pth 4 4
expect_tensor_paths back.pth "$dp_keys"
expect_metadata back.pth '' "$dp_meta"
same_data "$data/dp_mlp.pth" back.pth
expect_exit 0 ckpt strip-module back.pth again.pth
expect_tensor_paths again.pth "$mlp_keys"
expect_metadata again.pth '' "$mlp_meta"

# ===========================================================================
say "unwrap: every wrapper component, wherever it stands in a key"
note "a state dict with a wrapper of each kind, made with ckpt rename"
expect_exit 0 ckpt rename "$data/dp_mlp.pth" wrapped.pth \
    -e 's/^module\.n\.1\.weight$/module._orig_mod.n.1.weight/' \
    -e 's/^module\.n\.1\.bias$/_fsdp_wrapped_module.n.1._fsdp_wrapped_module.bias/' \
    -e 's/^module\.n\.3\.weight$/_forward_module.n.3.weight/' \
    -e 's/^module\.n\.3\.bias$/n._checkpoint_wrapped_module.3.bias/'
expect_tensor_paths wrapped.pth '[["module._orig_mod.n.1.weight"],
    ["_fsdp_wrapped_module.n.1._fsdp_wrapped_module.bias"],
    ["_forward_module.n.3.weight"], ["n._checkpoint_wrapped_module.3.bias"]]'
expect_exit 0 ckpt unwrap --dry-run wrapped.pth dry.pth
expect_stderr_empty
expect_stdout_is "module._orig_mod.n.1.weight -> n.1.weight
_fsdp_wrapped_module.n.1._fsdp_wrapped_module.bias -> n.1.bias
_forward_module.n.3.weight -> n.3.weight
n._checkpoint_wrapped_module.3.bias -> n.3.bias"
check "dry.pth was not written" test ! -e dry.pth
expect_exit 0 ckpt unwrap wrapped.pth unwrapped.pth
expect_stderr_empty
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote unwrapped.pth 4 4
expect_tensor_paths unwrapped.pth "$mlp_keys"
same_data "$data/dp_mlp.pth" unwrapped.pth

say "unwrap on DataParallel and DDP-of-DDP files: the same as strip-module, _metadata included"
for f in dp_mlp ddp2_mlp; do
    expect_exit 0 ckpt unwrap "$data/$f.pth" "unwrap-$f.pth"
    expect_stdout_line "state dict (root): 4 of 4 keys renamed"
    expect_tensor_paths "unwrap-$f.pth" "$mlp_keys"
    expect_metadata "unwrap-$f.pth" '' "$mlp_meta"
done

if [ -f "$data/compiled.pth" ]; then
    say "unwrap on what torch.compile saves (_orig_mod.)"
    expect_exit 0 ckpt unwrap "$data/compiled.pth" unwrap-compiled.pth
    expect_stdout_line "state dict (root): 4 of 4 keys renamed"
    expect_tensor_paths unwrap-compiled.pth "$mlp_keys"
    expect_metadata unwrap-compiled.pth '' "$mlp_meta"
    same_data "$data/mlp.pth" unwrap-compiled.pth
fi

say "unwrap leaves a component that only ends in 'module.' (submodule.)"
expect_exit 0 ckpt rename -e 's/^n\./submodule.n./' "$data/mlp.pth" sub.pth
expect_exit 0 ckpt unwrap --dry-run sub.pth dry.pth
expect_stdout_empty
check "dry.pth was not written" test ! -e dry.pth
expect_exit 0 ckpt unwrap sub.pth sub-unwrapped.pth
expect_tensor_paths sub-unwrapped.pth \
    '[["submodule.n.1.weight"], ["submodule.n.1.bias"], ["submodule.n.3.weight"], ["submodule.n.3.bias"]]'

# ===========================================================================
say "rename: -e rules apply in order, each to the result of the previous one"
expect_exit 0 ckpt rename -e 's/^n\./net./' -e 's/^net\.1\./net.fc1./' "$data/mlp.pth" r1.pth
expect_stderr_empty
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote r1.pth 4 4
expect_tensor_paths r1.pth '[["net.fc1.weight"], ["net.fc1.bias"], ["net.3.weight"], ["net.3.bias"]]'
same_data "$data/mlp.pth" r1.pth
note "_metadata: the rules apply to 'path.' and the trailing dot is dropped"
expect_metadata r1.pth '' '["", "net", "net.0", "net.fc1", "net.2", "net.3"]'
note "the other order: the first rule matches nothing, the second renames every key"
expect_exit 0 ckpt rename -e 's/^net\.1\./net.fc1./' -e 's/^n\./net./' "$data/mlp.pth" r2.pth
expect_tensor_paths r2.pth '[["net.1.weight"], ["net.1.bias"], ["net.3.weight"], ["net.3.bias"]]'

say "rename --dry-run"
expect_exit 0 ckpt rename --dry-run -e 's/^n\./net./' -e 's/^net\.1\./net.fc1./' "$data/mlp.pth" dry.pth
expect_stderr_empty
expect_stdout_is "n.1.weight -> net.fc1.weight
n.1.bias -> net.fc1.bias
n.3.weight -> net.3.weight
n.3.bias -> net.3.bias"
check "dry.pth was not written" test ! -e dry.pth

say "rename: groups as \\1"
expect_exit 0 ckpt rename -e 's/^n\.([0-9])\.(weight|bias)$/layer\1.\2/' "$data/mlp.pth" g1.pth
expect_tensor_paths g1.pth '[["layer1.weight"], ["layer1.bias"], ["layer3.weight"], ["layer3.bias"]]'

say "rename: groups as \$1 and \${1}"
expect_exit 0 ckpt rename -e 's/^n\.([0-9])\./fc$1./' "$data/mlp.pth" g2.pth
expect_tensor_paths g2.pth '[["fc1.weight"], ["fc1.bias"], ["fc3.weight"], ["fc3.bias"]]'
expect_exit 0 ckpt rename -e 's/^n\.([0-9])\.(.*)$/${2}_of_fc${1}/' "$data/mlp.pth" g3.pth
expect_tensor_paths g3.pth '[["weight_of_fc1"], ["bias_of_fc1"], ["weight_of_fc3"], ["bias_of_fc3"]]'

say "rename: without g the first match is replaced, with g every match"
expect_exit 0 ckpt rename -e 's/\./_/' "$data/mlp.pth" first.pth
expect_tensor_paths first.pth '[["n_1.weight"], ["n_1.bias"], ["n_3.weight"], ["n_3.bias"]]'
expect_exit 0 ckpt rename -e 's/\./_/g' "$data/mlp.pth" all.pth
expect_tensor_paths all.pth '[["n_1_weight"], ["n_1_bias"], ["n_3_weight"], ["n_3_bias"]]'

say "rename: flag i ignores case; only the keys that match change"
expect_exit 0 ckpt rename -e 's/^N\.1\./n.one./i' "$data/mlp.pth" i.pth
expect_stdout_line "state dict (root): 2 of 4 keys renamed"
expect_wrote i.pth 4 4
expect_tensor_paths i.pth '[["n.one.weight"], ["n.one.bias"], ["n.3.weight"], ["n.3.bias"]]'

say "rename: another delimiter, for a replacement that holds '/'"
expect_exit 0 ckpt rename -e 's|\.|/|g' "$data/mlp.pth" slash.pth
expect_tensor_paths slash.pth '[["n/1/weight"], ["n/1/bias"], ["n/3/weight"], ["n/3/bias"]]'
expect_exit 0 ckpt rename -e 's#^n\.#net.#' "$data/mlp.pth" hash.pth
expect_tensor_paths hash.pth '[["net.1.weight"], ["net.1.bias"], ["net.3.weight"], ["net.3.bias"]]'

say "rename: options after IN and OUT"
expect_exit 0 ckpt rename "$data/mlp.pth" after.pth -e 's/^n\./net./' --quiet
expect_stdout_empty
expect_tensor_paths after.pth '[["net.1.weight"], ["net.1.bias"], ["net.3.weight"], ["net.3.bias"]]'

# ===========================================================================
say "a training checkpoint: --select model_state_dict rewrites that mapping only"
expect_exit 0 ckpt strip-module --select model_state_dict --dry-run "$data/train_ckpt.pth" dry.pth
expect_stderr_empty
expect_stdout_is "model_state_dict/module.n.1.weight -> model_state_dict/n.1.weight
model_state_dict/module.n.1.bias -> model_state_dict/n.1.bias
model_state_dict/module.n.3.weight -> model_state_dict/n.3.weight
model_state_dict/module.n.3.bias -> model_state_dict/n.3.bias"
check "dry.pth was not written" test ! -e dry.pth
expect_exit 0 ckpt strip-module --select model_state_dict "$data/train_ckpt.pth" train.pth
expect_stderr_empty
expect_stdout_lines 2
expect_stdout_line "state dict model_state_dict: 4 of 4 keys renamed"
expect_wrote train.pth 8 8
inspect_json train.pth
json_expect '[t["path"] for t in d["tensors"]]' '[["model_state_dict", "n.1.weight"],
    ["model_state_dict", "n.1.bias"], ["model_state_dict", "n.3.weight"],
    ["model_state_dict", "n.3.bias"],
    ["optimizer_state_dict", "state", 0, "momentum_buffer"],
    ["optimizer_state_dict", "state", 1, "momentum_buffer"],
    ["optimizer_state_dict", "state", 2, "momentum_buffer"],
    ["optimizer_state_dict", "state", 3, "momentum_buffer"]]'
json_expect 'd["state_dicts"][0]' '{"model": true, "path": ["model_state_dict"], "source": "mapping", "tensors": 4, "wrappers": []}'
json_expect 'len(d["state_dicts"])' 5
note "everything else is kept: the argparse.Namespace, epoch, loss, param_groups"
json_expect 'd["objects"]' '[{"path": ["args"], "global": "argparse.Namespace"}]'
got=$(pickle_eval train.pth '[sorted(root.keys()), root["epoch"], root["loss"],
    [sorted(g.keys()) for g in root["optimizer_state_dict"]["param_groups"]],
    root["optimizer_state_dict"]["param_groups"][0]["params"],
    sorted(root["args"].state.items())]' 2>&1) || true
want=$(pickle_eval "$data/train_ckpt.pth" '[sorted(root.keys()), root["epoch"], root["loss"],
    [sorted(g.keys()) for g in root["optimizer_state_dict"]["param_groups"]],
    root["optimizer_state_dict"]["param_groups"][0]["params"],
    sorted(root["args"].state.items())]' 2>&1) || true
check "the other entries are those of train_ckpt.pth: $got" test "$got" = "$want"
expect_metadata train.pth model_state_dict "$mlp_meta"
same_data "$data/train_ckpt.pth" train.pth
expect_torch_zip train.pth train

say "without --select every state dict is rewritten: here only model_state_dict has the prefix"
expect_exit 0 ckpt strip-module "$data/train_ckpt.pth" train-all.pth
expect_stdout_line "state dict model_state_dict: 4 of 4 keys renamed"
expect_wrote train-all.pth 8 8
note "$(cat "$out")"
inspect_json train-all.pth
json_expect 'd["tensors"][0]["path"]' '["model_state_dict", "n.1.weight"]'
json_expect 'd["tensors"][4]["path"]' '["optimizer_state_dict", "state", 0, "momentum_buffer"]'

say "rename and add-module take --select too"
expect_exit 0 ckpt rename --select model_state_dict -e 's/^module\.n\./module.net./' \
    "$data/train_ckpt.pth" train-r.pth
expect_stdout_line "state dict model_state_dict: 4 of 4 keys renamed"
inspect_json train-r.pth
json_expect 'd["tensors"][0]["path"]' '["model_state_dict", "module.net.1.weight"]'
expect_exit 0 ckpt add-module train.pth train-back.pth --select model_state_dict
expect_stdout_line "state dict model_state_dict: 4 of 4 keys renamed"
inspect_json train-back.pth
json_expect 'd["tensors"][0]["path"]' '["model_state_dict", "module.n.1.weight"]'
json_expect 'd["tensors"][4]["path"]' '["optimizer_state_dict", "state", 0, "momentum_buffer"]'
expect_metadata train-back.pth model_state_dict "$dp_meta"

# ===========================================================================
say "a legacy (pre-1.6) file is written as a zip"
expect_exit 0 ckpt strip-module "$data/legacy_mlp.pth" from-legacy.pth
expect_stderr_empty
expect_stdout_line "state dict (root): 4 of 4 keys renamed"
expect_wrote from-legacy.pth 4 4
inspect_json from-legacy.pth
json_expect 'd["format"]' '"pth-zip"'
json_expect '[t["path"] for t in d["tensors"]]' "$mlp_keys"
json_expect '[t["device"] for t in d["tensors"]]' '["cuda:0", "cuda:0", "cuda:0", "cuda:0"]'
json_expect '[s["key"] for s in d["storages"]]' '["0", "1", "2", "3"]'
same_data "$data/legacy_mlp.pth" from-legacy.pth
same_data "$data/mlp.pth" from-legacy.pth
expect_torch_zip from-legacy.pth from-legacy
expect_metadata from-legacy.pth '' "$mlp_meta"
expect_exit 0 ckpt strip-module --select model_state_dict "$data/legacy_train.pth" legacy-train.pth
expect_stdout_line "state dict model_state_dict: 4 of 4 keys renamed"
expect_wrote legacy-train.pth 8 8
inspect_json legacy-train.pth
json_expect 'd["format"]' '"pth-zip"'
json_expect 'd["tensors"][0]["path"]' '["model_state_dict", "n.1.weight"]'
json_expect 'd["objects"]' '[{"path": ["args"], "global": "argparse.Namespace"}]'
same_data "$data/legacy_train.pth" legacy-train.pth

say "other inputs: compressed records, another archive folder, pickle protocol 4"
for f in deflated prefix_renamed proto4; do
    expect_exit 0 ckpt add-module "$data/$f.pth" "$f-dp.pth"
    expect_stdout_line "state dict (root): 4 of 4 keys renamed"
    expect_tensor_paths "$f-dp.pth" "$dp_keys"
    same_data "$data/$f.pth" "$f-dp.pth"
    expect_torch_zip "$f-dp.pth" "$f-dp"
done

say "the archive folder is OUT's base name without its last extension"
mkdir sub
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" sub/model.pt
expect_wrote sub/model.pt 4 4
expect_torch_zip sub/model.pt model
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" "$tmp/w/sub/a.pt.tar"
expect_wrote "$tmp/w/sub/a.pt.tar" 4 4
expect_torch_zip sub/a.pt.tar a.pt
note "a name with non-ASCII bytes gives the folder 'archive'"
nonascii=$(printf 'mod\303\250le.pth') # modele with a grave accent, in UTF-8
expect_exit 0 ckpt strip-module "$data/dp_mlp.pth" "$nonascii"
check "OUT is there" test -f "$nonascii"
expect_torch_zip "$nonascii" archive

# ===========================================================================
say "no key to change: OUT is still written, a note on stderr says so"
expect_exit 0 ckpt strip-module "$data/mlp.pth" same.pth
expect_wrote same.pth 4 4
check "one line on stderr" test "$(wc -l <"$err" | tr -d ' ')" -eq 1
check "it says that no key changed: $(cat "$err")" grep -Eiq 'no key|0 of 4|unchanged|nothing' "$err"
expect_tensor_paths same.pth "$mlp_keys"
expect_metadata same.pth '' "$mlp_meta"
same_data "$data/mlp.pth" same.pth
expect_exit 0 ckpt strip-module --dry-run "$data/mlp.pth" dry.pth
expect_stdout_empty
check "dry.pth was not written" test ! -e dry.pth
note "--quiet silences the note (it is not an error)"
expect_exit 0 ckpt strip-module --quiet "$data/mlp.pth" same-quiet.pth
expect_stdout_empty
expect_stderr_empty
check "same-quiet.pth is there" test -f same-quiet.pth
note "the same for rename when no rule matches"
expect_exit 0 ckpt rename -e 's/^nothing$/x/' "$data/mlp.pth" same-r.pth
expect_wrote same-r.pth 4 4
check "a note on stderr: $(cat "$err")" test "$(wc -l <"$err" | tr -d ' ')" -eq 1
expect_tensor_paths same-r.pth "$mlp_keys"

# ===========================================================================
say "remap --to cpu: every storage's location tag; keys and data unchanged"
expect_exit 0 ckpt remap --to cpu "$data/dp_mlp.pth" cpu.pth
expect_stderr_empty
expect_stdout_lines 2
expect_stdout_line "storages: 4 of 4 remapped (cuda:0 -> cpu)"
expect_wrote cpu.pth 4 4
expect_tensor_paths cpu.pth "$dp_keys"
json_expect '[t["device"] for t in d["tensors"]]' '["cpu", "cpu", "cpu", "cpu"]'
json_expect 'd["summary"]["by_device"]' '{"cpu": 407080}'
json_expect 'd["state_dicts"]' '[{"model": true, "path": [], "source": "mapping", "tensors": 4, "wrappers": ["module."]}]'
same_data "$data/dp_mlp.pth" cpu.pth
expect_torch_zip cpu.pth cpu
expect_metadata cpu.pth '' "$dp_meta"

say "remap --dry-run: one line per change, nothing written"
expect_exit 0 ckpt remap --dry-run --to cpu "$data/dp_mlp.pth" dry.pth
expect_stderr_empty
expect_stdout_is "cuda:0 -> cpu (4 storages)"
check "dry.pth was not written" test ! -e dry.pth
expect_exit 0 ckpt remap "$data/dp_mlp.pth" dry.pth --to cpu --dry-run
expect_stdout_is "cuda:0 -> cpu (4 storages)"
check "dry.pth was not written" test ! -e dry.pth

# expect_remapped N TOTAL: the "storages: K of TOTAL remapped (FROM -> TO)"
# lines of stdout (one for each FROM -> TO) count N storages in all.
expect_remapped() {
    _sum=$(sed -n "s/^storages: \([0-9][0-9]*\) of $2 remapped ([^ ]* -> [^ ]*)\$/\1/p" "$out" |
        awk '{ s += $1 } END { print s + 0 }')
    if [ "$_sum" -eq "$1" ]; then
        ok "stdout: storages: ... of $2 remapped (FROM -> TO), $1 in all"
    else
        fail "stdout does not say 'storages: K of $2 remapped (FROM -> TO)' for $1 storages in all: $last_cmd"
        show_output
    fi
}

ae_enc='"cuda:0", "cuda:0", "cuda:0", "cuda:0", "cuda:0", "cuda:0"'
ae_dec='"cuda:1", "cuda:1", "cuda:1", "cuda:1", "cuda:1", "cuda:1"'
ae_cpu='"cpu", "cpu", "cpu", "cpu", "cpu", "cpu"'
say "remap --map FROM=TO on a model-parallel file (encoder on cuda:0, decoder on cuda:1)"
expect_devices "$data/ae_model_parallel.pth" "[$ae_enc, $ae_dec]"
note "an exact device: only the decoder moves"
expect_exit 0 ckpt remap --map cuda:1=cpu "$data/ae_model_parallel.pth" ae1.pth
expect_stderr_empty
expect_stdout_line "storages: 6 of 12 remapped (cuda:1 -> cpu)"
expect_wrote ae1.pth 12 12
expect_devices ae1.pth "[$ae_enc, $ae_cpu]"
same_data "$data/ae_model_parallel.pth" ae1.pth
note "a device type: cuda matches cuda:0 and cuda:1"
expect_exit 0 ckpt remap --map cuda=cpu "$data/ae_model_parallel.pth" ae2.pth
expect_remapped 12 12
expect_devices ae2.pth "[$ae_cpu, $ae_cpu]"
note "'*' matches every device"
expect_exit 0 ckpt remap --map '*=cpu' "$data/ae_model_parallel.pth" ae3.pth
expect_remapped 12 12
expect_devices ae3.pth "[$ae_cpu, $ae_cpu]"
note "--to cpu does the same"
expect_exit 0 ckpt remap --to cpu "$data/ae_model_parallel.pth" ae4.pth
expect_devices ae4.pth "[$ae_cpu, $ae_cpu]"

say "remap: the first matching --map wins, and a storage is mapped once"
expect_exit 0 ckpt remap --map cuda:1=cuda:0 --map cuda=cpu "$data/ae_model_parallel.pth" first1.pth
expect_devices first1.pth "[$ae_cpu, $ae_enc]"
expect_exit 0 ckpt remap --map cuda=cpu --map cuda:1=cuda:0 "$data/ae_model_parallel.pth" first2.pth
expect_devices first2.pth "[$ae_cpu, $ae_cpu]"
note "so two maps swap two GPUs"
expect_exit 0 ckpt remap --map cuda:0=cuda:1 --map cuda:1=cuda:0 "$data/ae_model_parallel.pth" swap.pth
expect_remapped 12 12
expect_devices swap.pth "[$ae_dec, $ae_enc]"
same_data "$data/ae_model_parallel.pth" swap.pth
expect_exit 0 ckpt remap --dry-run --map cuda:0=cuda:1 --map cuda:1=cuda:0 "$data/ae_model_parallel.pth" dry.pth
expect_stdout_lines 2
expect_stdout_line "cuda:0 -> cuda:1 (6 storages)"
expect_stdout_line "cuda:1 -> cuda:0 (6 storages)"
check "dry.pth was not written" test ! -e dry.pth

say "remap: other device names"
for dev in cuda:1 cuda mps meta xpu:0 cpu; do
    expect_exit 0 ckpt remap --to "$dev" "$data/mlp.pth" "to-$dev.pth"
    expect_devices "to-$dev.pth" "[\"$dev\", \"$dev\", \"$dev\", \"$dev\"]"
done

say "remap keeps views: shared storages, offsets, strides, 0-dim and empty tensors"
expect_exit 0 ckpt remap --to cuda:0 "$data/dtypes.pth" dtypes-gpu.pth
expect_stdout_line "storages: 18 of 18 remapped (cpu -> cuda:0)"
expect_wrote dtypes-gpu.pth 20 18
inspect_json dtypes-gpu.pth
json_true 'all(t["device"] == "cuda:0" for t in d["tensors"])' "every tensor is on cuda:0"
json_true 'tensor("tied_a")["storage"] == tensor("tied_b")["storage"]' "tied_a and tied_b share a storage"
json_true 'tensor("offset_view")["storage"] == tensor("base")["storage"] and tensor("offset_view")["offset"] == 5' \
    "offset_view is base's storage at offset 5"
json_expect '[s["key"] for s in d["storages"]]' '["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16", "17"]'
json_true '[k for i, k in enumerate(t["storage"] for t in d["tensors"]) if k not in [t["storage"] for t in d["tensors"]][:i]] == [str(i) for i in range(18)]' \
    "storages are numbered 0, 1, ... in the order the tensors first use them"
same_data "$data/dtypes.pth" dtypes-gpu.pth
expect_torch_zip dtypes-gpu.pth dtypes-gpu

say "remap with nothing to change still writes OUT"
expect_exit 0 ckpt remap --map cuda:7=cpu "$data/dp_mlp.pth" nochange.pth
expect_wrote nochange.pth 4 4
expect_devices nochange.pth '["cuda:0", "cuda:0", "cuda:0", "cuda:0"]'
note "stderr: $(cat "$err")"

# ===========================================================================
say "the fixtures read are unchanged"
check "dp_mlp.pth is unchanged" test "$(cksum <"$data/dp_mlp.pth")" = "$(cat "$tmp/dp_mlp.cksum")"

finish
