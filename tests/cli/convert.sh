#!/bin/sh
# convert.sh - ckpt convert as a user runs it (man/ckpt-convert.1): the
# output format from OUT's extension or --to; pth-zip, pth-legacy,
# safetensors and sharded sets in; --select, --dtype (with --dry-run),
# --no-dedupe, --shard-size; the safetensors header as the format has it;
# and the refusals: a training checkpoint with two models to safetensors
# without --select (2, naming them), complex tensors (3), bad --to / --dtype (2),
# OUT that is IN (2), a corrupt input (3, no partial OUT), hostile
# safetensors and shard indexes (3), a header over the 100,000,000-byte
# limit (3).  The values are checked against torch and the safetensors
# package in tests/interop/convert_vs_torch.py; here, plain python3 reads
# the JSON of `ckpt inspect` and the safetensors headers, and small inputs
# are made with the helpers of tests/bad/make_bad.py (no torch needed).
# shellcheck disable=SC2016 # Python expressions are single-quoted on purpose
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "no python3 to read the JSON of ckpt inspect"

mkdir "$tmp/w"
cd "$tmp/w"
size='[0-9]+(\.[0-9]+)? (B|KiB|MiB|GiB)' # as ckpt prints sizes

# expect_wrote OUT FORMAT T S: the last line of stdout is "wrote OUT:
# FORMAT, T tensors, S storages, SIZE" and OUT is there.
expect_wrote() {
    _re="^wrote $(printf '%s' "$1" | sed 's/[.[\*^$()+?{|]/\\&/g'): $2, $3 tensors?, $4 storages?, $size\$"
    if tail -n 1 "$out" | grep -Eq -- "$_re"; then
        ok "the last line of stdout is 'wrote $1: $2, $3 tensors, $4 storages, SIZE'"
    else
        fail "the last line of stdout is not 'wrote $1: $2, $3 tensors, $4 storages, SIZE': $last_cmd"
        show_output
    fi
    check "$1 is there" test -f "$1"
}

# st_eval FILE EXPR: print json.dumps(EXPR), where EXPR may use `n` (the
# header length field), `raw` (the header bytes), `h` (the parsed header,
# ordered, without __metadata__), `md` (__metadata__), `data` (the bytes
# after the header) and `size` (of the file).
st_eval() {
    python3 - "$1" "$2" <<'PYEOF'
import collections, json, struct, sys
blob = open(sys.argv[1], "rb").read()
size = len(blob)
n = struct.unpack("<Q", blob[:8])[0]
raw = blob[8:8 + n]
h = json.loads(raw.decode("utf-8"), object_pairs_hook=collections.OrderedDict)
md = h.pop("__metadata__", None)
data = blob[8 + n:]
print(json.dumps(eval(sys.argv[2])))
PYEOF
}

# st_expect FILE EXPR EXPECTED: st_eval FILE EXPR gives the JSON EXPECTED.
st_expect() {
    if _got=$(st_eval "$1" "$2" 2>&1) &&
        python3 -c 'import json,sys; sys.exit(json.loads(sys.argv[1]) != json.loads(sys.argv[2]))' "$_got" "$3"; then
        ok "$1: $2 == $3"
    else
        fail "$1: $2 is $_got, expected $3"
    fi
}

# st_layout FILE: FILE is safetensors as the format has it and as
# ckpt-convert(1) promises: the header length a multiple of 8, the header a
# JSON object padded with spaces so that the data section starts on a
# 64-byte boundary, entries {dtype, shape, data_offsets} packed back to back
# (in offset order) from 0 to the end of the file, each as long as its shape
# and dtype say and starting at a multiple of its element size, and every
# tensor whose size is a multiple of 64 bytes starting on a 64-byte boundary.
st_layout() {
    if _why=$(python3 - "$1" 2>&1 <<'PYEOF'
import collections, json, math, struct, sys
blob = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
raw = blob[8:8 + n]
size = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
        "I8": 1, "U8": 1, "BOOL": 1}
if n % 8:
    sys.exit("header length %d is not a multiple of 8" % n)
if (8 + n) % 64:
    sys.exit("the data section starts at byte %d, %d past a 64-byte boundary" % (8 + n, (8 + n) % 64))
if not raw.rstrip(b" ").endswith(b"}"):
    sys.exit("the header is not padded with spaces: %r" % raw[-8:])
h = json.loads(raw.decode("utf-8"), object_pairs_hook=collections.OrderedDict)
md = h.pop("__metadata__", None)
if not isinstance(md, dict) or md.get("format") != "pt":
    sys.exit("__metadata__ %r" % md)
at = 0
for k, e in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"]):
    if sorted(e) != ["data_offsets", "dtype", "shape"]:
        sys.exit("%s: %r" % (k, e))
    b, end = e["data_offsets"]
    if b != at:
        sys.exit("%s starts at %d, not %d: not packed" % (k, b, at))
    if end - b != math.prod(e["shape"]) * size[e["dtype"]]:
        sys.exit("%s: %d bytes for %s %s" % (k, end - b, e["dtype"], e["shape"]))
    if b % size[e["dtype"]]:
        sys.exit("%s (%s) starts at byte %d of the data" % (k, e["dtype"], b))
    if (end - b) % 64 == 0 and b % 64:
        sys.exit("%s, %d bytes, starts at %d mod 64" % (k, end - b, b % 64))
    at = end
if at != len(blob) - 8 - n:
    sys.exit("the tensors end at %d of a %d-byte data section" % (at, len(blob) - 8 - n))
PYEOF
    ); then
        ok "$1: header length a multiple of 8, JSON padded with spaces to a 64-byte boundary, __metadata__ format pt, tensors packed and aligned"
    else
        fail "$1 is not laid out as safetensors should be: $_why"
    fi
}

# refused N PREFIX ARGS...: `ckpt ARGS` exits N with one line on stderr
# starting PREFIX, nothing on stdout, and the working directory as it was
# (no OUT, no temporary file).
refused() {
    _want=$1
    _prefix=$2
    shift 2
    listing . >"$tmp/dir.before"
    ckpt "$@"
    _p=
    [ "$status" -eq "$_want" ] || _p="$_p; exit $status, expected $_want"
    [ ! -s "$out" ] || _p="$_p; output on stdout"
    _n=$(wc -l <"$err" | tr -d ' ')
    [ "$_n" -eq 1 ] || _p="$_p; $_n lines on stderr, expected 1"
    case $(head -n 1 "$err") in
    "$_prefix"?*) ;;
    *) _p="$_p; stderr does not start with '$_prefix'" ;;
    esac
    listing . >"$tmp/dir.after"
    cmp -s "$tmp/dir.before" "$tmp/dir.after" ||
        _p="$_p; the directory changed: $(diff "$tmp/dir.before" "$tmp/dir.after" | grep '^[<>]' | tr '\n' ' ')"
    if [ -z "$_p" ]; then
        ok "refused ($_want, one line on stderr, nothing written): $last_cmd"
    else
        fail "$last_cmd: ${_p#; }"
        show_output
    fi
}

# err_has TEXT: the last stderr contains TEXT.
err_has() {
    if grep -Fq -- "$1" "$err"; then
        ok "the message has '$1'"
    else
        fail "the message lacks '$1': $(cat "$err")"
    fi
}

# make_inputs: small inputs made with the helpers of tests/bad/make_bad.py
# (nothing but the standard library): tied.safetensors (a and b one tensor,
# as ckpt writes tied tensors), complex128.pth, metadata_key.pth (a tensor
# named __metadata__), and a sharded set in set/.
make_inputs() {
    python3 - "$srcdir/tests/bad" <<'PYEOF'
import json, os, struct, sys
sys.path.insert(0, sys.argv[1])
import make_bad as mb
h = mb.st_header([("a", "F32", (2,), (0, 8)), ("c", "I64", (1,), (8, 16))])
h = h.replace(b'{"format":"pt"}', b'{"format":"pt","ckpt.tied":"{\\"b\\":\\"a\\"}"}')
open("tied.safetensors", "wb").write(
    mb.st_bytes(h, struct.pack("<2f", 1.5, -2.0) + struct.pack("<q", 7)))
m = mb.T("__metadata__", numel=2, size=(2,), stride=(1,))
open("metadata_key.pth", "wb").write(mb.ckpt_zip([m]))
z = mb.T("z", stype="ComplexDoubleStorage", numel=2, size=(2,), stride=(1,))
open("complex128.pth", "wb").write(mb.ckpt_zip([z], data={"0": struct.pack("<4d", 1, 2, 3, 4)}))
z = mb.T("z", stype="ComplexFloatStorage", numel=2, size=(2,), stride=(1,))
open("complex64.pth", "wb").write(mb.ckpt_zip([z], data={"0": struct.pack("<4f", 1, 2, 3, 4)}))
os.mkdir("set")
open("set/model-00001-of-00002.safetensors", "wb").write(mb.st_good())
c = mb.T("c", numel=4, size=(2, 2), stride=(2, 1))
open("set/model-00002-of-00002.pth", "wb").write(mb.ckpt_zip([c]))
open("set/model.safetensors.index.json", "wb").write(mb.index_json(
    {"w": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
     "c": "model-00002-of-00002.pth"}))
PYEOF
}
mkdir "$tmp/in"
(cd "$tmp/in" && make_inputs) || fail "could not make the small inputs"
in=$tmp/in

mlp_keys='[["n.1.weight"], ["n.1.bias"], ["n.3.weight"], ["n.3.bias"]]'
dp_keys='[["module.n.1.weight"], ["module.n.1.bias"], ["module.n.3.weight"], ["module.n.3.bias"]]'

# ===========================================================================
say "pth-zip to safetensors, the format chosen by OUT's extension"
cksum <"$data/mlp.pth" >"$tmp/mlp.cksum"
expect_exit 0 ckpt convert "$data/mlp.pth" mlp.safetensors
expect_stderr_empty
expect_stdout_lines 1
expect_wrote mlp.safetensors safetensors 4 4
note "$(cat "$out")"
check "mlp.pth is unchanged" test "$(cksum <"$data/mlp.pth")" = "$(cat "$tmp/mlp.cksum")"
inspect_json mlp.safetensors
json_expect 'd["format"]' '"safetensors"'
json_expect '[t["path"] for t in d["tensors"]]' "$mlp_keys"
json_expect 'sorted(set(t["device"] for t in d["tensors"]))' '["cpu"]'
same_data "$data/mlp.pth" mlp.safetensors
note "the header, byte by byte"
st_layout mlp.safetensors
st_expect mlp.safetensors 'md' '{"format": "pt"}'
st_expect mlp.safetensors 'list(h)' '["n.1.weight", "n.1.bias", "n.3.weight", "n.3.bias"]'
st_expect mlp.safetensors 'h["n.1.weight"]' '{"dtype": "F32", "shape": [128, 784], "data_offsets": [0, 401408]}'
st_expect mlp.safetensors 'h["n.3.bias"]' '{"dtype": "F32", "shape": [10], "data_offsets": [407040, 407080]}'
st_expect mlp.safetensors 'size - 8 - n' 407080

say "safetensors back to pth-zip (the default format): the same tensors, in torch's layout"
expect_exit 0 ckpt convert mlp.safetensors back.pth
expect_stderr_empty
expect_wrote back.pth pth-zip 4 4
expect_torch_zip back.pth back
expect_tensor_paths back.pth "$mlp_keys"
same_data "$data/mlp.pth" back.pth

say "--to pth-legacy: the pre-1.6 format (device tags kept), and back"
expect_exit 0 ckpt convert --to pth-legacy "$data/dp_mlp.pth" legacy.pth
expect_stderr_empty
expect_wrote legacy.pth pth-legacy 4 4
inspect_json legacy.pth
json_expect 'd["format"]' '"pth-legacy"'
json_expect '[t["path"] for t in d["tensors"]]' "$dp_keys"
json_expect '[t["device"] for t in d["tensors"]]' '["cuda:0", "cuda:0", "cuda:0", "cuda:0"]'
same_data "$data/dp_mlp.pth" legacy.pth
expect_exit 0 ckpt convert legacy.pth zip.pth
expect_wrote zip.pth pth-zip 4 4
expect_torch_zip zip.pth zip
same_data "$data/dp_mlp.pth" zip.pth
note "a legacy file to safetensors"
expect_exit 0 ckpt convert "$data/legacy_mlp.pth" legacy_mlp.safetensors
expect_wrote legacy_mlp.safetensors safetensors 4 4
same_data "$data/legacy_mlp.pth" legacy_mlp.safetensors

say "--to wins over the extension; without either, pth-zip"
expect_exit 0 ckpt convert --to safetensors "$data/mlp.pth" weights.bin
expect_wrote weights.bin safetensors 4 4
inspect_json weights.bin
json_expect 'd["format"]' '"safetensors"'
expect_exit 0 ckpt convert --to pth mlp.safetensors named.safetensors
expect_wrote named.safetensors pth-zip 4 4
inspect_json named.safetensors
json_expect 'd["format"]' '"pth-zip"'
expect_exit 0 ckpt convert --to pth-zip mlp.safetensors zip2.pth
expect_wrote zip2.pth pth-zip 4 4
expect_exit 0 ckpt convert mlp.safetensors model.pt
expect_wrote model.pt pth-zip 4 4
expect_torch_zip model.pt model
note "options may come after IN and OUT"
expect_exit 0 ckpt convert "$data/mlp.pth" after.bin --to safetensors
expect_wrote after.bin safetensors 4 4

say "--quiet prints nothing and still writes OUT"
expect_exit 0 ckpt convert --quiet "$data/mlp.pth" quiet.safetensors
expect_stdout_empty
expect_stderr_empty
check "quiet.safetensors is there" test -f quiet.safetensors

# ===========================================================================
say "--select: the model of a training checkpoint; the root's scalars go to __metadata__"
expect_exit 0 ckpt convert --select model_state_dict "$data/train_ckpt.pth" train.safetensors
expect_stderr_empty
expect_wrote train.safetensors safetensors 4 4
st_layout train.safetensors
st_expect train.safetensors 'list(h)' '["module.n.1.weight", "module.n.1.bias", "module.n.3.weight", "module.n.3.bias"]'
st_expect train.safetensors 'md' '{"format": "pt", "epoch": "3", "loss": "0.25"}'
expect_exit 0 ckpt convert --select model_state_dict "$data/train_ckpt.pth" train_model.pth
expect_wrote train_model.pth pth-zip 4 4
inspect_json train_model.pth
json_expect '[t["path"] for t in d["tensors"]]' "$dp_keys"
json_expect 'd["state_dicts"]' '[{"model": true, "path": [], "source": "mapping", "tensors": 4, "wrappers": ["module."]}]'
json_expect 'd["objects"]' '[]'
same_data train.safetensors train_model.pth
note "the values are those of model_state_dict in train_ckpt.pth"
inspect_json "$data/train_ckpt.pth" --stats --allow-global argparse.Namespace
cp "$out" "$tmp/train.json"
inspect_json train_model.pth --stats
if python3 - "$tmp/train.json" "$out" <<'PYEOF'
import json, sys
a, b = (json.load(open(f))["tensors"] for f in sys.argv[1:])
a = [(t["path"][1:], t["dtype"], t["shape"], t["crc32"]) for t in a if t["path"][0] == "model_state_dict"]
b = [(t["path"], t["dtype"], t["shape"], t["crc32"]) for t in b]
sys.exit(len(a) != 4 or a != b)
PYEOF
then
    ok "train_model.pth holds model_state_dict of train_ckpt.pth (dtype, shape, crc32)"
else
    fail "train_model.pth does not hold model_state_dict of train_ckpt.pth"
fi

# ===========================================================================
say "--dtype with --dry-run: the casts, per source dtype; nothing written"
expect_exit 0 ckpt convert --dry-run --dtype float16 "$data/dtypes.pth" half.pth
expect_stderr_empty
expect_stdout_is "float64 -> float16 (1 storage)
float32 -> float16 (7 storages)
bfloat16 -> float16 (1 storage)"
check "half.pth was not written" test ! -e half.pth
expect_exit 0 ckpt convert --dry-run --dtype float32 "$data/dtypes.pth" f32.safetensors
expect_stdout_is "float64 -> float32 (1 storage)
float16 -> float32 (1 storage)
bfloat16 -> float32 (1 storage)"
check "f32.safetensors was not written" test ! -e f32.safetensors
expect_exit 0 ckpt convert --dry-run "$data/dtypes.pth" plain.pth
expect_stdout_empty
check "plain.pth was not written" test ! -e plain.pth

say "--dtype bfloat16: floating tensors cast, integers, bool and complex untouched, views kept"
expect_exit 0 ckpt convert --dtype bfloat16 "$data/dtypes.pth" bf16.pth
expect_stderr_empty
expect_stdout_line "cast: 1 storage float64 -> bfloat16"
expect_stdout_line "cast: 7 storages float32 -> bfloat16"
expect_stdout_line "cast: 1 storage float16 -> bfloat16"
expect_wrote bf16.pth pth-zip 20 18
inspect_json bf16.pth
json_expect '{t["path"][0]: t["dtype"] for t in d["tensors"]}' '{"float64": "bfloat16",
    "float32": "bfloat16", "float16": "bfloat16", "bfloat16": "bfloat16", "int64": "int64",
    "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
    "complex64": "complex64", "complex128": "complex128", "scalar": "bfloat16",
    "empty": "bfloat16", "transposed": "bfloat16", "base": "bfloat16",
    "offset_view": "bfloat16", "tied_a": "bfloat16", "tied_b": "bfloat16", "permuted": "bfloat16"}'
json_expect '[(t["stride"], t["offset"]) for t in d["tensors"] if t["path"][0] in ("transposed", "offset_view", "permuted")]' \
    '[[[1, 5], 0], [[1], 5], [[1, 12, 4], 0]]'
json_true 'tensor("tied_a")["storage"] == tensor("tied_b")["storage"]' "tied_a and tied_b still share a storage"
json_true 'tensor("base")["storage"] == tensor("offset_view")["storage"]' "base and offset_view still share a storage"
inspect_json bf16.pth --stats
cp "$out" "$tmp/bf16.json"
inspect_json "$data/dtypes.pth" --stats
if python3 - "$out" "$tmp/bf16.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(f))["tensors"] for f in sys.argv[1:])
keep = ("int64", "int32", "int16", "int8", "uint8", "bool", "complex64", "complex128")
f = lambda ts: [(t["path"], t["dtype"], t["crc32"]) for t in ts if t["path"][0] in keep]
sys.exit(len(f(a)) != 8 or f(a) != f(b))
PYEOF
then
    ok "the integer, bool and complex tensors hold the same bytes (crc32)"
else
    fail "the integer, bool or complex tensors changed"
fi
note "to safetensors: F16 in the header"
expect_exit 0 ckpt convert --dtype float16 "$data/mlp.pth" half.safetensors
expect_stdout_line "cast: 4 storages float32 -> float16"
expect_wrote half.safetensors safetensors 4 4
st_layout half.safetensors
st_expect half.safetensors '[e["dtype"] for e in h.values()]' '["F16", "F16", "F16", "F16"]'
st_expect half.safetensors 'size - 8 - n' 203540

# ===========================================================================
say "tied tensors (two names, one storage, one view): written once, the alias in ckpt.tied"
expect_exit 0 ckpt convert "$in/tied.safetensors" tied.pth
expect_wrote tied.pth pth-zip 3 2
inspect_json tied.pth
json_true 'tensor("a")["storage"] == tensor("b")["storage"]' "a and b are one storage in pth"
expect_exit 0 ckpt convert tied.pth tied.safetensors
expect_wrote tied.safetensors safetensors 3 2
st_layout tied.safetensors
st_expect tied.safetensors 'list(h)' '["a", "c"]'
st_expect tied.safetensors 'json.loads(md["ckpt.tied"])' '{"b": "a"}'
inspect_json tied.safetensors
json_true 'tensor("a")["storage"] == tensor("b")["storage"]' "ckpt reads b back as a"

say "--no-dedupe: every name written with its own bytes, no ckpt.tied"
expect_exit 0 ckpt convert --no-dedupe tied.pth nodedupe.safetensors
st_layout nodedupe.safetensors
st_expect nodedupe.safetensors 'sorted(h)' '["a", "b", "c"]'
st_expect nodedupe.safetensors 'md' '{"format": "pt"}'
st_expect nodedupe.safetensors 'data[h["a"]["data_offsets"][0]:h["a"]["data_offsets"][1]] == data[h["b"]["data_offsets"][0]:h["b"]["data_offsets"][1]]' true
expect_exit 0 ckpt convert nodedupe.safetensors untied.pth
inspect_json untied.pth
json_true 'tensor("a")["storage"] != tensor("b")["storage"]' "a and b are two storages"
same_data tied.pth untied.pth

# ===========================================================================
say "a sharded set (safetensors and pth shards, a *.index.json) to one file"
inspect_json "$in/set/model.safetensors.index.json"
json_expect 'd["format"]' '"sharded"'
expect_exit 0 ckpt convert "$in/set/model.safetensors.index.json" one.pth
expect_stderr_empty
expect_wrote one.pth pth-zip 3 3
expect_tensor_paths one.pth '[["w"], ["b"], ["c"]]'
same_data "$in/set/model.safetensors.index.json" one.pth
expect_exit 0 ckpt convert "$in/set/model.safetensors.index.json" one.safetensors
expect_wrote one.safetensors safetensors 3 3
st_layout one.safetensors
st_expect one.safetensors 'list(h)' '["w", "b", "c"]'
same_data one.pth one.safetensors

say "--shard-size: OUT NAME.safetensors.index.json and shards NAME-0000k-of-0000K.safetensors beside it"
mkdir shards
expect_exit 0 ckpt convert --shard-size 300K "$data/ae_model_parallel.pth" shards/ae.safetensors.index.json
expect_stderr_empty
expect_wrote shards/ae.safetensors.index.json sharded 12 12
check "the shards are there: $(listing shards | tr '\n' ' ')" test "$(listing shards | tr '\n' ' ')" = \
    "ae-00001-of-00005.safetensors ae-00002-of-00005.safetensors ae-00003-of-00005.safetensors ae-00004-of-00005.safetensors ae-00005-of-00005.safetensors ae.safetensors.index.json "
for f in shards/ae-0000*.safetensors; do
    st_layout "$f"
done
if python3 - shards/ae.safetensors.index.json <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
wm = d["weight_map"]
sys.exit(d["metadata"] != {"total_parameters": 213313, "total_size": 853252} or len(wm) != 12 or
         sorted(set(wm.values())) != ["ae-%05d-of-00005.safetensors" % i for i in range(1, 6)] or
         open(sys.argv[1]).read() != json.dumps(d, indent=2, sort_keys=True) + "\n")
PYEOF
then
    ok "the index as transformers writes it: total_parameters 213313, total_size 853252, 12 names, sorted, indent 2"
else
    fail "the index is not as expected: $(cat shards/ae.safetensors.index.json)"
fi
inspect_json shards/ae.safetensors.index.json
json_expect 'd["format"]' '"sharded"'
expect_exit 0 ckpt convert shards/ae.safetensors.index.json ae.pth
expect_wrote ae.pth pth-zip 12 12
same_data "$data/ae_model_parallel.pth" ae.pth
note "pth shards: NAME.index.json and NAME-0000k-of-0000K.bin"
expect_exit 0 ckpt convert --shard-size 500K "$data/ae_model_parallel.pth" shards/pt.index.json
expect_wrote shards/pt.index.json sharded 12 12
check "pt-00001-of-00002.bin and pt-00002-of-00002.bin are there" \
    test -f shards/pt-00001-of-00002.bin -a -f shards/pt-00002-of-00002.bin
inspect_json shards/pt-00001-of-00002.bin
json_expect 'd["format"]' '"pth-zip"'
same_data "$data/ae_model_parallel.pth" shards/pt.index.json
note "--shard-size needs an OUT ending in .index.json, and a positive size"
refused 2 "ckpt: convert: " convert --shard-size 1M "$data/mlp.pth" x.safetensors
for n in 0 -1 1X K ''; do
    refused 2 "ckpt: convert: " convert --shard-size "$n" "$data/mlp.pth" x.index.json
done

# ===========================================================================
say "a training checkpoint with two models to safetensors without --select: refused, naming both (2)"
refused 2 "ckpt: convert: $data/train/gan.pth: " convert "$data/train/gan.pth" gan.safetensors
err_has "--select"
err_has "'generator', 'discriminator'"
note "$(cat "$err")"
refused 2 "ckpt: convert: $data/train/gan.pth: " convert --to safetensors "$data/train/gan.pth" gan.bin
note "with one model, that one is taken, as ckpt extract takes it (tests/cli/train_select.sh)"
expect_exit 0 ckpt convert "$data/train_ckpt.pth" train2.safetensors
expect_stderr_line "^ckpt: convert: $data/train_ckpt.pth: safetensors holds tensors only: wrote the model's state dict 'model_state_dict' \\(4 tensors\\), not the rest of the file \\(name another with --select\\)\$"
same_data train.safetensors train2.safetensors
refused 3 "ckpt: convert: $data/train_ckpt.pth: " convert --select nope "$data/train_ckpt.pth" x.safetensors
err_has "nope"
refused 3 "ckpt: convert: $data/train_ckpt.pth: " convert --select epoch "$data/train_ckpt.pth" x.safetensors
note "an optimizer's state is not a mapping of names to tensors"
refused 3 "ckpt: convert: $data/train_ckpt.pth: " convert --select optimizer_state_dict "$data/train_ckpt.pth" x.safetensors

say "complex128 has no safetensors dtype (3); pth formats keep it; complex64 is C64"
refused 3 "ckpt: convert: $data/dtypes.pth: " convert "$data/dtypes.pth" dtypes.safetensors
err_has complex128
expect_exit 0 ckpt convert --quiet "$in/complex64.pth" c64.safetensors
st_expect c64.safetensors 'h["z"]' '{"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}'
expect_exit 0 ckpt convert --quiet c64.safetensors c64_back.pth
same_data "$in/complex64.pth" c64_back.pth
refused 3 "ckpt: convert: $in/complex128.pth: " convert "$in/complex128.pth" c.safetensors
err_has complex128
note "$(cat "$err")"
refused 3 "ckpt: convert: $in/complex128.pth: " convert --dtype float32 "$in/complex128.pth" c.safetensors
expect_exit 0 ckpt convert --to pth-legacy "$in/complex128.pth" c_legacy.pth
same_data "$in/complex128.pth" c_legacy.pth

say "a tensor named __metadata__ cannot be written as safetensors (3); pth keeps it"
refused 3 "ckpt: convert: $in/metadata_key.pth: " convert "$in/metadata_key.pth" meta.safetensors
err_has "__metadata__"
expect_exit 0 ckpt convert "$in/metadata_key.pth" meta.pth
expect_tensor_paths meta.pth '[["__metadata__"]]'

say "bad --to, --dtype and arguments: usage errors (2)"
IN=$data/mlp.pth
for to in onnx safetensor PTH ''; do
    refused 2 "ckpt: convert: " convert --to "$to" "$IN" x.pth
done
for dt in int8 bool complex64 float8 fp16 ''; do
    refused 2 "ckpt: convert: " convert --dtype "$dt" "$IN" x.pth
done
refused 2 "ckpt: convert: " convert --to
refused 2 "ckpt: convert: " convert "$IN"
refused 2 "ckpt: convert: " convert "$IN" x.pth y.pth
refused 2 "ckpt: convert: " convert --bogus "$IN" x.pth
refused 2 "ckpt: convert: " convert "$IN" -
refused 2 "ckpt: convert: " convert --to safetensors "$IN" -

say "OUT that is IN is refused without --in-place (2), by any name"
cp "$data/mlp.pth" self.pth
ln -s self.pth self-link.pth
ln self.pth self-hard.pth
cksum <self.pth >"$tmp/self.cksum"
refused 2 "ckpt: convert: " convert self.pth self.pth
refused 2 "ckpt: convert: " convert --to safetensors self.pth self-link.pth
refused 2 "ckpt: convert: " convert --to safetensors self.pth self-hard.pth
check "self.pth is unchanged" test "$(cksum <self.pth)" = "$(cat "$tmp/self.cksum")"
expect_exit 0 ckpt convert --in-place --to safetensors self.pth self.pth
expect_wrote self.pth safetensors 4 4
inspect_json self.pth
json_expect 'd["format"]' '"safetensors"'
same_data "$data/mlp.pth" self.pth
rm -f self.pth self-link.pth self-hard.pth

say "a corrupt input (a flipped bit, found by its CRC-32 while copying): 3, no OUT, an old OUT kept"
IN=$bad/crc_flip.pth
refused 3 "ckpt: convert: $IN: " convert "$IN" flip.pth
refused 3 "ckpt: convert: $IN: " convert "$IN" flip.safetensors
refused 3 "ckpt: convert: $IN: " convert --to pth-legacy "$IN" flip.pth
refused 3 "ckpt: convert: $IN: " convert --dtype float16 "$IN" flip.pth
refused 3 "ckpt: convert: $IN: " convert --dtype bfloat16 "$IN" flip.safetensors
refused 3 "ckpt: convert: $IN: " convert --dtype float16 --to pth-legacy "$IN" flip.pth
err_has "CRC-32"
echo "an old file" >old.safetensors
refused 3 "ckpt: convert: $IN: " convert "$IN" old.safetensors
check "the old OUT is as it was" test "$(cat old.safetensors)" = "an old file"
rm -f old.safetensors

say "hostile safetensors files and shard indexes of tests/bad: refused (3), nothing written"
n=0
for IN in "$bad"/*.safetensors "$bad"/*.index.json; do
    [ -f "$IN" ] || continue
    n=$((n + 1))
    refused 3 "ckpt: convert: $IN: " convert "$IN" out.pth
    note "$(cat "$err")"
    # what the message must say to be clear
    case ${IN##*/} in
    st_header_past_eof.*) err_has "header length" && err_has "past the end" ;;
    st_huge_header.*) err_has "100000000" ;;
    st_overlap.*) err_has "overlap" ;;
    st_size_mismatch.*) err_has "'w'" ;;
    st_offsets_out_of_bounds.*) err_has "'b'" ;;
    st_bad_utf8.*) err_has "UTF-8" ;;
    st_bad_json.*) err_has "JSON" ;;
    st_unknown_dtype.*) err_has "Q4" ;;
    st_duplicate_name.*) err_has "twice" ;;
    st_f4_*|st_f6_*) err_has "'w'" ;;
    sharded_missing_shard.*) err_has "model-00001-of-00002.safetensors" ;;
    sharded_escape.*) err_has "../data/mlp.pth" ;;
    sharded_absolute.*) err_has "/etc/passwd" ;;
    sharded_bad_shard.*) err_has "st_overlap.safetensors" && err_has "overlap" ;;
    esac
done
check "found $n hostile safetensors files and shard indexes in tests/bad" test "$n" -ge 10

say "a header over the 100,000,000-byte limit of the format, in a file that long (sparse) (3)"
python3 -c '
import struct, sys
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", 100000001) + b"{")
    f.truncate(8 + 100000001 + 8)
' "$tmp/in/huge.safetensors"
refused 3 "ckpt: convert: $tmp/in/huge.safetensors: " convert "$tmp/in/huge.safetensors" out.pth
err_has "100000000"
ckpt inspect "$tmp/in/huge.safetensors"
expect_status 3
expect_stderr_prefix "ckpt: inspect: $tmp/in/huge.safetensors: "
say "--max-header-bytes: raised, that header is read (and refused for what it holds)"
ckpt inspect --max-header-bytes 200M "$tmp/in/huge.safetensors"
expect_status 3
check "the message is about the JSON, not the limit" grep -q "JSON" "$err"
check "... and does not name the limit" sh -c '! grep -q -- --max-header-bytes "$1"' sh "$err"
rm -f "$tmp/in/huge.safetensors"

say "--max-header-bytes: lowered, a small header is over it; the message names the option (3)"
refused 3 "ckpt: convert: $bad/st_hole.safetensors: " convert --max-header-bytes 64 \
    "$bad/st_hole.safetensors" out.pth
err_has "over the limit of 64 (--max-header-bytes)"
expect_exit 2 ckpt inspect --max-header-bytes 0 "$bad/st_hole.safetensors"

say "IN that cannot be read: 4"
refused 4 "ckpt: convert: $tmp/in/no_such.safetensors: " convert "$tmp/in/no_such.safetensors" out.pth

say "--help"
expect_exit 0 ckpt convert --help
expect_stderr_empty
expect_stdout_match '^usage: ckpt convert '

finish
