#!/bin/sh
# torch_quirks.sh - files torch writes that are easy to misread, as a user
# sees ckpt read them (tests/data/quirks, made by
# tests/fixtures/make_torch_quirks.py; what torch itself loads from each is
# in its MANIFEST.json, and tests/interop/torch_quirks.py checks it live):
# skip_data's CRC-0 storage records, PyTorch 0.3's storage views, and a
# whole pickled model's parameters and tensors outside its state dict.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
q=tests/data/quirks
manifest() { # FILE KEY: torch's crc32 of tensor KEY of FILE
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); f=d[sys.argv[2]]; f=f.get("state_dict", f); print(f[sys.argv[3]]["crc32"])' \
        "$q/MANIFEST.json" "$1" "$2"
}

# ---------------------------------------------------------------------------
say "skip_data: every storage record has CRC-32 0; --stats reads it, with a note"
expect_exit 0 ckpt inspect --stats $q/skip_data.pth
expect_stderr_line '^ckpt: inspect: tests/data/quirks/skip_data.pth: note: all its 3 storage records have CRC-32 0, as torch.serialization.skip_data writes them: their bytes, filled in after the save or left zeros, are not checked$'
note "the bytes were never written: every value is 0, as torch loads it"
expect_stdout_match '^w +float32 +\[2, 3\] +cpu +24 B +0 +0 +0 +0 +0 +0$'

say "the same skeleton filled in by a second pass (mmap, MAP_SHARED): torch's values"
expect_exit 0 ckpt inspect --stats $q/skip_filled.pth
expect_stdout_match '^b +int64 +\[3\] +cpu +24 B +-1 +3 '
if have_python; then
    expect_exit 0 ckpt inspect --json --stats $q/skip_filled.pth
    for k in w b h; do
        json_expect "[t[\"crc32\"] for t in d[\"tensors\"] if t[\"path\"] == [\"$k\"]]" \
            "[\"$(manifest skip_filled.pth $k)\"]"
    done
fi

say "a rewrite writes real CRC-32s: the output reads with no note"
expect_exit 0 ckpt convert $q/skip_filled.pth "$tmp/filled.pth"
expect_exit 0 ckpt inspect --stats "$tmp/filled.pth"
expect_stderr_empty

say "one zeroed CRC-32 among computed ones is no torch writer's: still corrupt"
expect_exit 3 ckpt inspect --stats tests/bad/crc_one_zeroed.pth
expect_stderr_line "CRC-32 mismatch \(stored 00000000, data [0-9a-f]{8}\): the file is corrupt$"

# ---------------------------------------------------------------------------
say "PyTorch 0.3's storage views (legacy view_metadata): read as slices of their root"
expect_exit 0 ckpt inspect --stats $q/legacy_views.pth
expect_stderr_empty
expect_stdout_line "tests/data/quirks/legacy_views.pth: pth-legacy, 4 tensors in 4 storages, 72 B"
note "part is elements 3..6 of the root (the view starts at 2, the tensor 1 into it)"
expect_stdout_match '^part +float32 +\[2, 2\] +cpu +16 B +1\.5 +3 +2\.25 '
expect_stdout_match '^longs +int64 +\[2\] +cpu +16 B +-3 +11 '
if have_python; then
    expect_exit 0 ckpt inspect --json --stats $q/legacy_views.pth
    for k in whole part again longs; do
        json_expect "[t[\"crc32\"] for t in d[\"tensors\"] if t[\"path\"] == [\"$k\"]]" \
            "[\"$(manifest legacy_views.pth $k)\"]"
    done
    json_expect '[s.get("view_of") for s in d["storages"]]' \
        '[null, {"key": "94380312047616", "offset": 2}, null, {"key": "94380312051712", "offset": 1}]'
    json_expect 'd["summary"]["bytes"]' '72'
fi

say "converted to safetensors and pth: the views' values, written whole"
expect_exit 0 ckpt convert $q/legacy_views.pth "$tmp/views.safetensors"
expect_exit 0 ckpt diff $q/legacy_views.pth "$tmp/views.safetensors"
expect_exit 0 ckpt convert $q/legacy_views.pth "$tmp/views.pth"
expect_exit 0 ckpt diff $q/legacy_views.pth "$tmp/views.pth"

# ---------------------------------------------------------------------------
say "a whole pickled model: parameters listed as such, with their saved requires_grad"
expect_exit 0 ckpt inspect $q/whole_attrs.pt
expect_stdout_match '^0\.weight +float32 +\[2, 3\] +cpu +24 B +parameter$'
expect_stdout_match '^1\.running_mean +float32 +\[2\] +cpu +8 B$'
if have_python; then
    expect_exit 0 ckpt inspect --json $q/whole_attrs.pt
    json_expect '[(t["path"][0], t["parameter"], t["requires_grad"]) for t in d["tensors"] if t["parameter"]]' \
        '[["0.weight", true, true], ["0.bias", true, false], ["1.weight", true, true],
          ["1.bias", true, true], ["2.weight", true, true]]'
fi

say "and the tensors it holds outside its state dict, listed apart"
expect_exit 0 ckpt inspect $q/whole_attrs.pt
expect_stdout_line "other tensors (not in the state dict; listed, never written): 4"
expect_stdout_match '^anchors +float32 +\[2, 2\] +cpu +16 B +attribute$'
expect_stdout_match '^0\.stride +float32 +\[3\] +cpu +12 B +attribute$'
expect_stdout_match '^extra\.0 +int32 +\[3\] +cpu +12 B +attribute$'
expect_stdout_match '^scratch +float32 +\[2\] +cpu +8 B +non-persistent buffer$'
expect_stdout_line "total: 8 tensors, 21 elements, 136 B"
if have_python; then
    expect_exit 0 ckpt inspect --json $q/whole_attrs.pt
    json_expect '[(t["path"], t["why"]) for t in d["other_tensors"]]' \
        '[[["scratch"], "non-persistent buffer"], [["anchors"], "attribute"],
          [["extra.0"], "attribute"], [["0.stride"], "attribute"]]'
    note "a state dict file has none"
    expect_exit 0 ckpt inspect --json $q/skip_filled.pth
    json_expect 'd["other_tensors"]' '[]'
fi

say "extract writes the state dict only"
expect_exit 0 ckpt extract $q/whole_attrs.pt "$tmp/sd.pth"
expect_exit 0 ckpt inspect "$tmp/sd.pth"
expect_stdout_no_match 'anchors|other tensors'
expect_stdout_line "total: 8 tensors, 21 elements, 88 B"

finish
