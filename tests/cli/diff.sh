#!/bin/sh
# diff.sh - ckpt diff as a user runs it (man/ckpt-diff.1): equal files exit
# 0 across formats; missing / unexpected keys and size mismatches in the
# exact words of torch's load_state_dict; dtype mismatches; values with
# --atol / --rtol; --normalize; --keys-only reading no data; --json; usage
# errors (exit 2) and bad files (3, 4).  The numbers are checked against
# torch in tests/interop/diff_vs_torch.py; here, inputs are the fixtures,
# files made from them with `ckpt rename`, and small safetensors files
# written by plain python3 (float8, big integers, complex).
# shellcheck disable=SC2016 # rules and scripts are single-quoted on purpose
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
w=$tmp/w
mkdir "$w"

# expect_last_line TEXT: the last line of stdout is TEXT.
expect_last_line() {
    if [ "$(tail -n 1 "$out")" = "$1" ]; then
        ok "the last line is '$1'"
    else
        fail "the last line is '$(tail -n 1 "$out")', expected '$1': $last_cmd"
        show_output
    fi
}

# expect_clean N ARGS...: `ckpt diff ARGS` exits N with nothing on stderr.
expect_clean() {
    _n=$1
    shift
    expect_exit "$_n" ckpt diff "$@"
    expect_stderr_empty
}

# ===========================================================================
say "equal files exit 0, whatever their formats and archive layouts"
for pair in "mlp.pth proto4.pth" "mlp.pth deflated.pth" "mlp.pth prefix_renamed.pth" \
    "mlp.pth keepvars.pth" "dp_mlp.pth legacy_mlp.pth" "legacy_mlp.pth dp_mlp.pth" \
    "dtypes.pth dtypes.pth" "bn.pth bn.pth" "ae_model_parallel.pth ae_model_parallel.pth"; do
    # shellcheck disable=SC2086 # split on purpose
    set -- $pair
    expect_clean 0 "$data/$1" "$data/$2"
    expect_stdout_lines 1
    expect_stdout_match '^[0-9]+ tensors compared: [0-9]+ equal, 0 differ; 0 missing, 0 unexpected$'
done
note "dtypes.pth holds NaN, infinities, -0, complex: each equals itself"
ckpt diff "$data/dtypes.pth" "$data/dtypes.pth"
expect_stdout_is "20 tensors compared: 20 equal, 0 differ; 0 missing, 0 unexpected"

say "a file with several state dicts is compared by the path of every tensor"
expect_clean 0 "$data/train_ckpt.pth" "$data/legacy_train.pth"
expect_stdout_is "A: $data/train_ckpt.pth: 5 state dicts: every tensor by its path (8 tensors)
B: $data/legacy_train.pth: 5 state dicts: every tensor by its path (8 tensors)
8 tensors compared: 8 equal, 0 differ; 0 missing, 0 unexpected"

# ===========================================================================
say "missing and unexpected keys, in the words of torch (trailing space included)"
expect_clean 1 "$data/mlp.pth" "$data/dp_mlp.pth"
expect_stdout_is 'Missing key(s) in state_dict: "n.1.weight", "n.1.bias", "n.3.weight", "n.3.bias". 
Unexpected key(s) in state_dict: "module.n.1.weight", "module.n.1.bias", "module.n.3.weight", "module.n.3.bias". 
(--normalize would match 4 missing keys with unexpected ones)
0 tensors compared: 0 equal, 0 differ; 4 missing, 4 unexpected'
note "A is the model: the same pair the other way round swaps the two lists"
expect_clean 1 "$data/dp_mlp.pth" "$data/mlp.pth"
expect_stdout_line 'Missing key(s) in state_dict: "module.n.1.weight", "module.n.1.bias", "module.n.3.weight", "module.n.3.bias". '
expect_stdout_line 'Unexpected key(s) in state_dict: "n.1.weight", "n.1.bias", "n.3.weight", "n.3.bias". '

say "--normalize unwraps module., _orig_mod., ... on both sides"
expect_clean 0 --normalize "$data/mlp.pth" "$data/dp_mlp.pth"
expect_stdout_is "4 tensors compared: 4 equal, 0 differ; 0 missing, 0 unexpected"
expect_clean 0 --normalize "$data/ddp2_mlp.pth" "$data/compiled.pth"
expect_clean 0 --normalize "$data/legacy_mlp.pth" "$data/compiled.pth"
note "and in each component of a path (a training checkpoint)"
expect_clean 0 --normalize --json "$data/train_ckpt.pth" "$data/train_ckpt.pth"
json_expect 'd["tensors"][0]["key"]' '"model_state_dict/n.1.weight"'
json_expect 'd["tensors"][0]["a_key"]' '"model_state_dict/module.n.1.weight"'
json_expect 'd["tensors"][7]["key"]' '"optimizer_state_dict/state/3/momentum_buffer"'
note "the values differ: another seed, one SGD step"
expect_clean 1 --normalize "$data/mlp.pth" "$data/train_ckpt.pth"
expect_stdout_line "A: $data/mlp.pth: state dict (root) (4 tensors)"

say "--normalize refuses two keys of one file that unwrap to the same key (exit 3)"
expect_exit 0 ckpt rename --quiet -e 's/^module\.n\.1\.bias$/_orig_mod.n.1.weight/' \
    "$data/dp_mlp.pth" "$w/collide.pth"
expect_exit 3 ckpt diff --normalize "$w/collide.pth" "$data/mlp.pth"
expect_stdout_empty
expect_stderr_line "^ckpt: diff: $w/collide.pth: keys 'module.n.1.weight' and '_orig_mod.n.1.weight' would both be compared as 'n.1.weight'\$"
note "without --normalize they are two keys"
expect_clean 1 "$w/collide.pth" "$data/dp_mlp.pth"
expect_stdout_line 'Missing key(s) in state_dict: "_orig_mod.n.1.weight". '
expect_stdout_line 'Unexpected key(s) in state_dict: "module.n.1.bias". '

# ===========================================================================
say "size mismatch, in the words of torch (B the checkpoint, A the current model)"
expect_exit 0 ckpt rename --quiet -e 's/^n\.1\.bias$/tmp/' -e 's/^n\.3\.bias$/n.1.bias/' \
    -e 's/^tmp$/n.3.bias/' "$data/mlp.pth" "$w/biases.pth"
expect_clean 1 "$data/mlp.pth" "$w/biases.pth"
expect_stdout_is 'size mismatch for n.1.bias: copying a param with shape torch.Size([10]) from checkpoint, the shape in current model is torch.Size([128]).
size mismatch for n.3.bias: copying a param with shape torch.Size([128]) from checkpoint, the shape in current model is torch.Size([10]).
4 tensors compared: 2 equal, 2 differ (2 size mismatches); 0 missing, 0 unexpected'
expect_clean 1 --json "$data/mlp.pth" "$w/biases.pth"
json_expect 'd["size_mismatch"]' '[{"key": "n.1.bias", "a_shape": [128], "b_shape": [10]},
    {"key": "n.3.bias", "a_shape": [10], "b_shape": [128]}]'
json_expect '[t["compared_as"] for t in d["tensors"]]' '["values", null, "values", null]'
json_expect 'd["equal"]' 'false'

# ===========================================================================
say "values: BatchNorm running statistics swapped by a bad conversion"
expect_exit 0 ckpt rename --quiet -e 's/running_mean$/tmp/' -e 's/running_var$/running_mean/' \
    -e 's/tmp$/running_var/' "$data/bn.pth" "$w/swapped.pth"
expect_clean 1 "$data/bn.pth" "$w/swapped.pth"
expect_stdout_is 'features.1.running_mean: max abs 0.932, max rel 1, 4 of 4 elements differ, first at [0] (0.0046823877 vs 0.9233928)
features.1.running_var: max abs 0.932, max rel 1.16e+03, 4 of 4 elements differ, first at [0] (0.9233928 vs 0.0046823877)
features.4.running_mean: max abs 0.938, max rel 1.03, 6 of 6 elements differ, first at [0] (-0.010914415 vs 0.90895677)
features.4.running_var: max abs 0.938, max rel 229, 6 of 6 elements differ, first at [0] (0.90895677 vs -0.010914415)
14 tensors compared: 10 equal, 4 differ; 0 missing, 0 unexpected'

say "--atol: |a - b| <= atol"
expect_clean 0 --atol 1 "$data/bn.pth" "$w/swapped.pth"
expect_stdout_line 'features.1.running_mean: max abs 0.932, max rel 1, all 4 elements within tolerance'
expect_last_line '14 tensors compared: 14 equal, 0 differ; 0 missing, 0 unexpected'
expect_clean 1 --atol 0.935 "$data/bn.pth" "$w/swapped.pth"
expect_last_line '14 tensors compared: 12 equal, 2 differ; 0 missing, 0 unexpected'
expect_stdout_match '^features\.4\.running_mean: max abs 0\.938, max rel 1\.03, [1-6] of 6 elements differ'
expect_clean 0 --atol=0.94 "$data/bn.pth" "$w/swapped.pth"

say "--rtol: |a - b| <= rtol * |b| (b is the checkpoint, B)"
expect_clean 1 --rtol 1.1 "$data/bn.pth" "$w/swapped.pth"
expect_last_line '14 tensors compared: 12 equal, 2 differ; 0 missing, 0 unexpected'
expect_stdout_match '^features\.1\.running_var: max abs 0\.932, max rel 1\.16e\+03, 4 of 4 elements differ'
expect_clean 0 --rtol 2000 "$data/bn.pth" "$w/swapped.pth"
note "a tolerance of 0 (the default) is exact; -0 is 0"
expect_clean 1 --atol 0 --rtol -0 "$data/bn.pth" "$w/swapped.pth"

say "dtypes: floats and integers are compared as numbers across dtypes, complex not"
expect_exit 0 ckpt rename --quiet -e 's/^float64$/t1/' -e 's/^float32$/float64/' \
    -e 's/^t1$/float32/' -e 's/^complex64$/t2/' -e 's/^complex128$/complex64/' \
    -e 's/^t2$/complex128/' -e 's/^int64$/t3/' -e 's/^int32$/int64/' -e 's/^t3$/int32/' \
    "$data/dtypes.pth" "$w/dtypes_swapped.pth"
expect_clean 1 "$data/dtypes.pth" "$w/dtypes_swapped.pth"
expect_stdout_is 'dtype mismatch for float64: float64 in A, float32 in B
float64: max abs 1.8e+308, max rel 5.28e+269, 6 of 14 elements differ, first at [7] (1.7976931348623157e+308 vs 3.4028235e+38)
dtype mismatch for float32: float32 in A, float64 in B
float32: max abs 1.8e+308, max rel 2.84e+278, 6 of 14 elements differ, first at [7] (3.4028235e+38 vs 1.7976931348623157e+308)
dtype mismatch for int64: int64 in A, int32 in B
int64: max abs 9.22e+18, max rel 4.29e+09, 4 of 8 elements differ, first at [0] (-9223372036854775808 vs -2147483648)
dtype mismatch for int32: int32 in A, int64 in B
int32: max abs 9.22e+18, max rel 1, 4 of 8 elements differ, first at [0] (-2147483648 vs -9223372036854775808)
dtype mismatch for complex64: complex64 in A, complex128 in B
complex64: values not compared: complex64 in A, complex128 in B
dtype mismatch for complex128: complex128 in A, complex64 in B
complex128: values not compared: complex128 in A, complex64 in B
20 tensors compared: 14 equal, 6 differ; 0 missing, 0 unexpected'
if have_python; then
    expect_clean 1 --json "$data/dtypes.pth" "$w/dtypes_swapped.pth"
    json_expect 'd["tensors"][10]' '{"key": "complex64", "equal": false, "compared_as": null,
        "count": null, "mismatched": null, "max_abs": null, "max_rel": null,
        "first_index": null, "first_a": null, "first_b": null}'
    json_expect '[d["tensors"][4][k] for k in ("first_a", "first_b", "max_abs")]' \
        '[-9223372036854775808, -2147483648, 9223372034707292160.0]'
    json_expect '[t["key"] for t in d["dtype_mismatch"]]' \
        '["float64", "float32", "int64", "int32", "complex64", "complex128"]'
fi
note "--keys-only: a dtype mismatch alone is no difference"
expect_clean 0 --keys-only "$data/dtypes.pth" "$w/dtypes_swapped.pth"
expect_last_line '20 tensors compared (keys, shapes and dtypes only): 20 equal, 0 differ; 0 missing, 0 unexpected'

# ===========================================================================
say "--json: the document of ckpt-diff(1)"
if have_python; then
    expect_clean 1 --json "$data/mlp.pth" "$data/dp_mlp.pth"
    json_valid
    json_expect 'sorted(d)' '["a", "a_format", "a_state_dict", "atol", "b", "b_format",
        "b_state_dict", "dtype_mismatch", "equal", "keys_only", "missing", "normalize",
        "reason", "rtol", "size_mismatch", "summary", "tensors", "unexpected"]'
    json_expect '[d["a"], d["b"], d["a_format"], d["a_state_dict"], d["equal"]]' \
        "[\"$data/mlp.pth\", \"$data/dp_mlp.pth\", \"pth-zip\", [], false]"
    json_expect 'd["missing"]' '["n.1.weight", "n.1.bias", "n.3.weight", "n.3.bias"]'
    json_expect 'd["unexpected"]' '["module.n.1.weight", "module.n.1.bias", "module.n.3.weight", "module.n.3.bias"]'
    json_expect 'd["summary"]' '{"compared": 0, "equal": 0, "differ": 0, "missing": 4,
        "unexpected": 4, "size_mismatch": 0, "dtype_mismatch": 0,
        "a_unreached_storages": 0, "b_unreached_storages": 0}'

    expect_clean 1 --json "$data/bn.pth" "$w/swapped.pth"
    json_expect 'sorted(d["tensors"][0])' '["compared_as", "count", "equal", "first_a", "first_b",
        "first_index", "key", "max_abs", "max_rel", "mismatched"]'
    json_expect 'd["tensors"][3]' '{"key": "features.1.running_mean", "equal": false,
        "compared_as": "values", "count": 4, "mismatched": 4,
        "max_abs": 0.9316380824893713, "max_rel": 1.0021755423585819, "first_index": [0],
        "first_a": 0.0046823876909911633, "first_b": 0.92339277267456055}'
    json_expect 'd["tensors"][0]["first_index"]' 'null'
    json_expect 'd["tensors"][5]' '{"key": "features.1.num_batches_tracked", "equal": true,
        "compared_as": "values", "count": 1, "mismatched": 0, "max_abs": 0.0, "max_rel": 0.0,
        "first_index": null, "first_a": null, "first_b": null}'
    json_expect '[d["atol"], d["rtol"], d["keys_only"], d["normalize"]]' '[0.0, 0.0, false, false]'
    expect_clean 0 --json --atol 1 "$data/bn.pth" "$w/swapped.pth"
    json_expect '[d["atol"], d["equal"], d["tensors"][3]["mismatched"]]' '[1.0, true, 0]'
    note "options may come after the files"
    expect_clean 0 "$data/mlp.pth" "$data/dp_mlp.pth" --normalize --json
    json_expect '[d["normalize"], d["tensors"][0]["a_key"], d["tensors"][0]["b_key"]]' \
        '[true, "n.1.weight", "module.n.1.weight"]'
else
    note "no python3: JSON not checked"
fi

# ===========================================================================
say "--keys-only reads no data: a file with a corrupt record (tests/bad/crc_flip.pth)"
expect_exit 3 ckpt diff "$bad/crc_flip.pth" "$bad/crc_flip.pth"
expect_stdout_empty
expect_stderr_line "^ckpt: diff: $bad/crc_flip.pth: w: .*CRC-32 mismatch"
expect_clean 0 --keys-only "$bad/crc_flip.pth" "$bad/crc_flip.pth"
expect_stdout_is "2 tensors compared (keys, shapes and dtypes only): 2 equal, 0 differ; 0 missing, 0 unexpected"
note "keys and shapes still differ"
expect_clean 1 --keys-only "$data/mlp.pth" "$w/biases.pth"
expect_last_line '4 tensors compared (keys, shapes and dtypes only): 2 equal, 2 differ (2 size mismatches); 0 missing, 0 unexpected'
expect_clean 0 --keys-only "$data/bn.pth" "$w/swapped.pth"
if have_python; then
    expect_clean 0 --keys-only --json "$data/bn.pth" "$w/swapped.pth"
    json_expect 'list({t["compared_as"] for t in d["tensors"]})' '[null]'
    json_expect 'list({t["count"] for t in d["tensors"]})' '[null]'
    json_expect 'd["keys_only"]' 'true'
fi

say "--quiet: nothing printed, the exit status tells"
expect_clean 1 --quiet "$data/bn.pth" "$w/swapped.pth"
expect_stdout_empty
expect_clean 0 --quiet "$data/mlp.pth" "$data/proto4.pth"
expect_stdout_empty
expect_clean 1 --quiet --json "$data/mlp.pth" "$data/dp_mlp.pth"
expect_stdout_empty

# ===========================================================================
if have_python; then
    # safetensors FILE SPEC: write FILE with plain python3; SPEC is a Python
    # dict {name: (dtype, shape, flat values)} (the bytes for F8_*).
    safetensors() {
        python3 - "$1" "$2" <<'PYEOF'
import json, struct, sys
path, spec = sys.argv[1], eval(sys.argv[2])
fmt = {'F64': 'd', 'F32': 'f', 'F16': 'e', 'I64': 'q', 'U64': 'Q', 'I32': 'i', 'U8': 'B',
       'BOOL': '?', 'F8_E4M3': 'B', 'F8_E5M2': 'B', 'C64': 'f'}
header, data = {}, b''
for name, (dt, shape, vals) in spec.items():
    b = struct.pack('<%d%s' % (len(vals), fmt[dt]), *vals)
    header[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(header).encode()
h += b' ' * (-len(h) % 8)
open(path, 'wb').write(struct.pack('<Q', len(h)) + h + data)
PYEOF
    }
    inf=float\(\"inf\"\)
    nan=float\(\"nan\"\)

    say "float8 values are decoded exactly (e4m3fn: 448 max, no inf; e5m2: IEEE-like)"
    safetensors "$w/f8.safetensors" "{
        'e4m3': ('F8_E4M3', [8], [0x38, 0x7E, 0x01, 0x08, 0xB8, 0x7F, 0x00, 0x80]),
        'e5m2': ('F8_E5M2', [8], [0x3C, 0x7B, 0x7C, 0x01, 0xFC, 0x7F, 0x00, 0x80])}"
    safetensors "$w/f32.safetensors" "{
        'e4m3': ('F32', [8], [1.0, 448.0, 2**-9, 2**-6, -1.0, $nan, 0.0, -0.0]),
        'e5m2': ('F32', [8], [1.0, 57344.0, $inf, 2**-16, -$inf, $nan, 0.0, -0.0])}"
    expect_clean 0 "$w/f8.safetensors" "$w/f32.safetensors"
    expect_stdout_is "dtype mismatch for e4m3: float8_e4m3fn in A, float32 in B
dtype mismatch for e5m2: float8_e5m2 in A, float32 in B
2 tensors compared: 2 equal, 0 differ; 0 missing, 0 unexpected"

    say "special values: NaN equals NaN, an infinity only itself, -0 equals 0"
    safetensors "$w/s1.safetensors" "{'x': ('F64', [6], [1.0, $nan, $inf, -0.0, 5.0, -$inf])}"
    safetensors "$w/s2.safetensors" "{'x': ('F32', [6], [1.0, $nan, $inf, 0.0, 5.0, -$inf])}"
    safetensors "$w/s3.safetensors" "{'x': ('F32', [6], [1.0, $nan, -$inf, 0.0, $nan, 1.0])}"
    expect_clean 0 "$w/s1.safetensors" "$w/s2.safetensors"
    expect_stdout_line "dtype mismatch for x: float64 in A, float32 in B"
    expect_clean 1 --atol 1e300 "$w/s1.safetensors" "$w/s3.safetensors"
    expect_stdout_line "x: max abs nan, max rel nan, 3 of 6 elements differ, first at [2] (inf vs -inf)"
    expect_clean 1 --json "$w/s1.safetensors" "$w/s3.safetensors"
    json_expect '[d["tensors"][0][k] for k in ("max_abs", "max_rel", "first_a", "first_b")]' \
        '["nan", "nan", "inf", "-inf"]'

    say "integers are compared exactly, past 2^53 too; first values printed exactly"
    safetensors "$w/i1.safetensors" "{'big': ('I64', [2, 2], [2**60, 3, -2**63, 7]),
        'u': ('U64', [2], [2**64 - 1, 0]), 'flags': ('BOOL', [2], [True, False])}"
    safetensors "$w/i2.safetensors" "{'big': ('I64', [2, 2], [2**60, 3, -2**63 + 1, 7]),
        'u': ('U64', [2], [2**64 - 2, 0]), 'flags': ('BOOL', [2], [True, True])}"
    expect_clean 1 "$w/i1.safetensors" "$w/i2.safetensors"
    expect_stdout_is "big: max abs 1, max rel 1.08e-19, 1 of 4 elements differ, first at [1, 0] (-9223372036854775808 vs -9223372036854775807)
u: max abs 1, max rel 5.42e-20, 1 of 2 elements differ, first at [0] (18446744073709551615 vs 18446744073709551614)
flags: max abs 1, max rel 1, 1 of 2 elements differ, first at [1] (False vs True)
3 tensors compared: 0 equal, 3 differ; 0 missing, 0 unexpected"
    expect_clean 1 --json "$w/i1.safetensors" "$w/i2.safetensors"
    json_expect '[(t["first_a"], t["first_b"]) for t in d["tensors"]]' \
        '[[-9223372036854775808, -9223372036854775807], [18446744073709551615, 18446744073709551614], [false, true]]'
    expect_clean 0 --atol 1 "$w/i1.safetensors" "$w/i2.safetensors"

    say "across formats: a safetensors file against a zip and a legacy pth"
    safetensors "$w/empty.safetensors" "{'e': ('F32', [0, 3], [])}"
    expect_clean 0 "$w/empty.safetensors" "$w/empty.safetensors"
    expect_clean 1 "$data/mlp.pth" "$w/f32.safetensors"
    expect_stdout_line 'Unexpected key(s) in state_dict: "e4m3", "e5m2". '
fi

# ===========================================================================
say "usage errors: exit 2, one line on stderr, nothing on stdout"
for args in "" "$data/mlp.pth" "$data/mlp.pth $data/mlp.pth $data/mlp.pth" \
    "--atol -1 $data/mlp.pth $data/mlp.pth" "--atol abc $data/mlp.pth $data/mlp.pth" \
    "--atol nan $data/mlp.pth $data/mlp.pth" "--rtol inf $data/mlp.pth $data/mlp.pth" \
    "--rtol 1e999 $data/mlp.pth $data/mlp.pth" "--atol 1x $data/mlp.pth $data/mlp.pth" \
    "--keys-only --atol 1 $data/mlp.pth $data/mlp.pth" "--bogus $data/mlp.pth $data/mlp.pth" \
    "-x $data/mlp.pth $data/mlp.pth" "$data/mlp.pth $data/mlp.pth --atol" \
    "--max-pickle-bytes 0 $data/mlp.pth $data/mlp.pth"; do
    # shellcheck disable=SC2086 # split on purpose
    expect_exit 2 ckpt diff $args
    expect_stdout_empty
    expect_stderr_line "^ckpt: diff: .*\\(see 'ckpt diff --help'\\)\$"
done
expect_exit 2 ckpt diff --rtol '' "$data/mlp.pth" "$data/mlp.pth"
expect_stderr_line "^ckpt: diff: --rtol needs a number >= 0, got ''"

say "bad files: exit 3 (not a checkpoint, refused, over a limit), 4 (cannot open)"
expect_exit 3 ckpt diff "$data/mlp.pth" "$bad/not_a_checkpoint.pth"
expect_stdout_empty
expect_stderr_line "^ckpt: diff: $bad/not_a_checkpoint.pth: "
expect_exit 3 ckpt diff "$bad/os_system.pth" "$data/mlp.pth"
expect_stderr_line "^ckpt: diff: $bad/os_system.pth: "
note "the pickle of mlp.pth is 530 bytes, that of dp_mlp.pth 614"
expect_exit 3 ckpt diff --max-pickle-bytes 600 "$data/mlp.pth" "$data/dp_mlp.pth"
expect_stderr_line "^ckpt: diff: $data/dp_mlp.pth: "
expect_exit 4 ckpt diff "$data/mlp.pth" "$w/no-such-file.pth"
expect_stdout_empty
expect_stderr_line "^ckpt: diff: $w/no-such-file.pth: "
note "train_ckpt.pth carries an argparse.Namespace (known data): no option needed"
expect_clean 0 "$data/train_ckpt.pth" "$data/train_ckpt.pth"

# ===========================================================================
say "ckpt diff --help (its options against the man page: tests/cli/synopsis.sh)"
expect_exit 0 ckpt diff --help
expect_stderr_empty
expect_stdout_match '^usage: ckpt diff \[--atol A\] \[--rtol R\] \[--keys-only\] \[--normalize\] \[--select PATH\] \[--json\] A B$'
for o in --atol --rtol --keys-only --normalize '-j, --json' --select --allow-global --allow-unknown \
    --max-pickle-bytes '-q, --quiet' '-h, --help'; do
    check "--help lists $o" grep -q -- "^  $o" "$out"
done
expect_exit 0 ckpt --help
expect_stdout_match '^  diff +compare '

# ===========================================================================
say "nothing compared is not equal (exit 1, with the reason); a change inside a nested structure is found"
if have_python; then
    # two checkpoints without tensors, as torch.save({}) / torch.save({'a': 1}) lay them out
    python3 - "$w" <<'PY'
import pickle, sys, zipfile
for name, obj in (('empty', {}), ('one', {'a': 1})):
    with zipfile.ZipFile('%s/%s.pth' % (sys.argv[1], name), 'w', zipfile.ZIP_STORED) as z:
        z.writestr(name + '/data.pkl', pickle.dumps(obj, protocol=2))
        z.writestr(name + '/version', '3\n')
PY
    expect_clean 1 "$w/empty.pth" "$w/empty.pth"
    expect_last_line "not equal: nothing compared: no tensor of A has a counterpart in B (A: 0 tensors, B: 0)"
    expect_clean 1 "$w/empty.pth" "$w/one.pth"
    expect_clean 1 --json "$w/empty.pth" "$w/empty.pth"
    json_expect '[d["equal"], d["reason"][:17], d["summary"]["compared"]]' '[false, "nothing compared:", 0]'
    expect_clean 1 --quiet "$w/empty.pth" "$w/empty.pth"
    # the same file compares equal, with a reason of null
    expect_clean 0 --json "$data/train_ckpt.pth" "$data/train_ckpt.pth"
    json_expect '[d["equal"], d["reason"]]' '[true, null]'

    # train_ckpt.pth with the storage of one optimizer buffer changed
    key=$("$CKPT" inspect --json "$data/train_ckpt.pth" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print([t["storage"] for t in d["tensors"] if t["path"][-2:] == [3, "momentum_buffer"]][0])')
    python3 - "$data/train_ckpt.pth" "$w/nested.pth" "$key" <<'PY'
import sys, zipfile
src, dst, key = sys.argv[1:]
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, 'w', zipfile.ZIP_STORED) as zo:
    for info in zi.infolist():
        b = zi.read(info.filename)
        if info.filename.endswith('/data/' + key):
            b = b'\x00\x00\x80\x3f' + b[4:]  # the first float32 becomes 1.0
        zo.writestr(info.filename, b)
PY
    expect_clean 1 "$data/train_ckpt.pth" "$w/nested.pth"
    expect_stdout_match '^optimizer_state_dict/state/3/momentum_buffer: .*1 of 10 elements differ, first at \[0\]'
    # by the model's keys, and the other tensors by their paths
    expect_clean 1 --select model_state_dict "$data/train_ckpt.pth" "$w/nested.pth"
    expect_stdout_match '^A: .*: state dict model_state_dict \(4 tensors\), and 4 other tensors by path$'
    expect_stdout_match '^optimizer_state_dict/state/3/momentum_buffer: '
    expect_last_line "8 tensors compared: 7 equal, 1 differ; 0 missing, 0 unexpected"
    expect_exit 3 ckpt diff --select nope "$data/train_ckpt.pth" "$w/nested.pth"
    expect_stderr_line "ckpt: diff: .*train_ckpt.pth: --select 'nope' names no state dict of this file \\(5 state dicts; ckpt inspect lists them\\)"
fi

finish
