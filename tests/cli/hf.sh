#!/bin/sh
# hf.sh - Hugging Face model folders (config.json beside the weights) and
# SIZE units: every reading command takes the folder; `ckpt convert
# MODEL_DIR OUT` writes a folder (weights rewritten, every other file
# copied; OUT must not exist, or --force replaces it whole; nothing is left
# on an error); --shard-size in transformers' units (5GB = 5e9 bytes) and
# 1024's (5G, 5GiB); scan of an index or a folder scans the set.
# Fixtures: tests/data/hf (tests/fixtures/make_hf_fixtures.py, transformers 4.57).
. "${srcdir:-.}/tests/cli/setup.sh"

hf=$data/hf
bin=$hf/gpt2_bin_sharded
mkdir "$tmp/w"
cd "$tmp/w"

# err_has TEXT: the last stderr contains TEXT.
err_has() {
    if grep -Fq -- "$1" "$err"; then ok "the message has '$1'"; else fail "the message lacks '$1': $(cat "$err")"; fi
}

# refused N PREFIX ARGS...: exit N, one line on stderr starting PREFIX,
# nothing on stdout, and this folder as it was (no OUT, no temporary folder).
refused() {
    _want=$1
    _prefix=$2
    shift 2
    listing . >"$tmp/dir.before"
    ckpt "$@"
    _p=
    [ "$status" -eq "$_want" ] || _p="$_p; exit $status, expected $_want"
    [ ! -s "$out" ] || _p="$_p; output on stdout"
    [ "$(wc -l <"$err" | tr -d ' ')" -eq 1 ] || _p="$_p; not one line on stderr"
    case $(head -n 1 "$err") in "$_prefix"?*) ;; *) _p="$_p; stderr does not start '$_prefix'" ;; esac
    listing . >"$tmp/dir.after"
    cmp -s "$tmp/dir.before" "$tmp/dir.after" || _p="$_p; the folder changed"
    if [ -z "$_p" ]; then ok "refused ($_want, nothing written): $last_cmd"; else fail "$last_cmd: ${_p#; }"; show_output; fi
}

say "a model folder is an input: inspect, diff, extract read its weights (the .bin index and shards)"
expect_exit 0 ckpt inspect "$bin"
expect_stdout_match "^torch.load: not modelled: a Hugging Face model folder: .*from_pretrained loads the folder, from pytorch_model.bin.index.json"
inspect_json "$bin"
json_expect 'd["format"]' '"sharded"'
json_expect 'len(d["tensors"])' '29'
expect_exit 0 ckpt extract "$bin" sd.pth
expect_exit 0 ckpt diff "$bin" sd.pth
expect_exit 0 ckpt diff "$hf/gpt2_bin" "$bin"
expect_exit 0 ckpt convert "$bin" one.safetensors
expect_stdout_match "^wrote one.safetensors: safetensors, 29 tensors, 28 storages, "

say "convert MODEL_DIR OUT: a folder, model.safetensors (transformers' default), the other files copied"
expect_exit 0 ckpt convert "$bin" model
expect_stdout_line "wrote model: model folder, safetensors weights (model.safetensors), 29 tensors, 28 storages"
check "OUT holds: $(listing model | tr '\n' ' ')" test "$(listing model | tr '\n' ' ')" = \
    "config.json generation_config.json model.safetensors special_tokens_map.json tokenizer.json tokenizer_config.json "
for f in config.json generation_config.json special_tokens_map.json tokenizer.json tokenizer_config.json; do
    check "$f copied byte for byte" cmp -s "$bin/$f" "model/$f"
done
expect_exit 0 ckpt diff "$bin" model
expect_exit 0 ckpt scan model

say "OUT exists: refused (2), OUT untouched; --force replaces it whole"
touch model/stray
refused 2 "ckpt: convert: model: " convert "$bin" model
err_has "exists"
expect_exit 0 ckpt convert --force --to pth "$bin" model
check "--force: OUT replaced whole (no stray file, pytorch_model.bin, no model.safetensors)" \
    test ! -e model/stray -a -f model/pytorch_model.bin -a ! -e model/model.safetensors
check "no temporary folder is left beside OUT" test -z "$(ls -A | grep '^\.model\.ckpt-' || true)"
refused 2 "ckpt: convert: " convert --force "$bin" "$bin"

note "OUT inside IN: its temporary folder is not copied into itself"
cp -r "$bin" inner
expect_exit 0 ckpt convert inner inner/converted
check "inner/converted holds the weights and the five other files, no folder" \
    test "$(listing inner/converted | wc -l)" = 6 -a -f inner/converted/model.safetensors
rm -rf inner

say "--shard-size 3KB: shards and model.safetensors.index.json as save_pretrained writes them"
expect_exit 0 ckpt convert --shard-size 3KB "$bin" sh
check "four shards and the index" test "$(listing sh | grep -c '^model-0000[1-4]-of-00004.safetensors$')" = 4 -a \
    -f sh/model.safetensors.index.json
if python3 - sh/model.safetensors.index.json <<'PYEOF'
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text)
wm = d["weight_map"]
sys.exit(d["metadata"] != {"total_parameters": 2144, "total_size": 8576} or
         "lm_head.weight" in wm or len(wm) != 28 or list(wm) != sorted(wm) or
         text != json.dumps(d, indent=2, sort_keys=True) + "\n")
PYEOF
then
    ok "the index: total_parameters 2144, total_size 8576; 28 names (lm_head.weight, tied, not stored), sorted"
else
    fail "the index is not as transformers writes it: $(head -c 400 sh/model.safetensors.index.json)"
fi
expect_exit 0 ckpt diff "$bin" sh

say "SIZE: K M G T are powers of 1024, KB MB GB TB of 1000 (transformers' 5GB), KiB MiB GiB TiB"
note "ae_model_parallel.pth: two 401408-byte weights among small tensors"
for s in 400K:4 400KiB:4 400KB:5 401536:4 5GB:1 5G:1 5GiB:1 1TB:1; do
    rm -rf sz && mkdir sz
    expect_exit 0 ckpt convert --shard-size "${s%:*}" "$data/ae_model_parallel.pth" sz/ae.safetensors.index.json
    check "--shard-size ${s%:*}: ${s#*:} shard(s)" test "$(ls sz | grep -c 'of-0000'"${s#*:}"'\.safetensors$')" = "${s#*:}"
done
for s in 5Gb 5GIB 5gib 5Ki 5.5GB "5 GB" 5B 5KBB GB 0GB -5GB 18446744073709552KB 5gb; do
    refused 2 "ckpt: convert: " convert --shard-size "$s" "$bin" bad
done
err_has "KB MB GB TB: powers of 1000"
expect_exit 0 ckpt inspect --max-pickle-bytes 1KB "$data/dp_mlp.pth"
refused 2 "ckpt: inspect: " inspect --max-header-bytes 1kB "$data/dp_mlp.pth"

say "no partial output: a file that cannot be copied (a FIFO) stops the write, nothing is left"
cp -r "$bin" fifo_in
mkfifo fifo_in/vocab.txt
refused 3 "ckpt: convert: " convert fifo_in fifo_out
err_has "vocab.txt"

say "a signal during the write: the command dies of it, and leaves no OUT and no temporary folder"
mkdir big
cp "$bin/config.json" big/
python3 - big/model.safetensors <<'PYEOF'
import json, struct, sys
n = 16 * 1024 * 1024  # 64 MiB of float32: long enough to be caught writing
h = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + 4 * n)
PYEOF
mkdir sig
if env --default-signal=TERM true 2>/dev/null; then ds="env --default-signal=TERM"; else ds=; fi
$ds "$CKPT" convert --quiet --to pth big sig/bigout 2>"$err" &
pid=$!
n=0
seen=no
while [ $seen = no ] && [ $n -lt 300000 ] && kill -0 $pid 2>/dev/null; do
    n=$((n + 1))
    for f in sig/.bigout.ckpt-*; do [ -e "$f" ] && seen=yes; done
done
kill -s TERM $pid 2>/dev/null || :
if wait $pid 2>/dev/null; then status=0; else status=$?; fi
if [ $seen = yes ] && [ "$status" -eq 143 ]; then
    ok "SIGTERM while the temporary folder was there: died of it (exit 143)"
else
    fail "SIGTERM: temporary folder seen: $seen, exit $status (the write ended first?)"
fi
check "nothing left in sig/: '$(ls -A sig | tr '\n' ' ')'" test -z "$(ls -A sig)"
rm -rf big sig

say "scan X.bin.index.json: the index (JSON, left out) and every shard it names"
expect_exit 0 ckpt scan "$bin/pytorch_model.bin.index.json"
check "five entries: the index and the four shards" \
    test "$(grep -v '^[0-9]* files: ' "$out" | grep -c '^[^ ]')" = 5
expect_stdout_match '^5 files: 4 safe, 1 skipped$'
expect_stdout_match "pytorch_model-00004-of-00004.bin: pth-zip, 1 pickle"
expect_exit 0 ckpt scan "$bin"
expect_stdout_match "tokenizer.json: skipped"
note "an index that names a file outside its folder: that entry is unsafe (1)"
mkdir esc
python3 -c 'import json; json.dump({"weight_map": {"w": "../elsewhere.bin"}}, open("esc/m.bin.index.json", "w"))'
expect_exit 1 ckpt scan esc/m.bin.index.json
expect_stdout_match "outside the folder"

finish
