#!/bin/sh
# scan_folders.sh - `ckpt scan FOLDER` by the rules of each folder's loader
# (man/ckpt-scan.1, issue 26): every file a loader would open is scanned,
# whatever its name or first bytes; links are followed wherever they lead (a
# Hugging Face snapshot); a name the folder's metadata gives that leads out
# of it is unsafe; a FIFO is refused unread; only a file torch.load would
# stop in before importing anything is skipped, and listed; a folder with no
# checkpoint exits 3.  The folders are tests/bad/make_bad_folders.py's
# (tests/interop/scan_folders.py proves that their real loaders run the
# payload).
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"

if ! have_python; then
    skip "no python3 to write the folders"
fi
w=$tmp/folders
python3 tests/bad/make_bad_folders.py "$w" "$tmp/pwned" >/dev/null

say "a DeepSpeed rank file in protocol 0 (no PROTO to sniff) is scanned, not skipped"
expect_exit 1 ckpt scan "$w/ds_protocol0"
expect_stdout_match '/ds_protocol0/global_step3/mp_rank_00_model_states.pt: pickle, 1 pickle$'
expect_stdout_match '^  DANGEROUS   builtins.open  \(GLOBAL at pickle 1 \(from byte 0\)\+0; called by REDUCE'
expect_stdout_match '/ds_protocol0/latest: skipped: torch.load.s unpickler reaches its end \(byte 12\) before importing anything$'

say "protocol 1 (its first byte LONG1, a pickle start): the payload in its second pickle found"
expect_exit 1 ckpt scan "$w/ds_protocol1"
expect_stdout_match '^  DANGEROUS   builtins.open  \(GLOBAL at pickle 2 \(protocol version\)\+0; called by REDUCE'

say "a rank file that begins like safetensors is read as torch.load reads a .pt: a pickle"
expect_exit 1 ckpt scan "$w/ds_polyglot"
expect_stdout_match 'DANGEROUS   builtins.open  .*; pickle reading\)$'

say "a Hugging Face snapshot: links into ../../blobs followed, scanned by their names"
expect_exit 1 ckpt scan "$w/hf_snapshot/snapshots/a1b2c3"
expect_stdout_match '/snapshots/a1b2c3/pytorch_model.bin: pickle, 1 pickle$'
expect_stdout_match '/snapshots/a1b2c3/config.json: skipped: .*0x7b is no pickle opcode'
expect_exit 1 ckpt scan --json "$w/hf_snapshot/snapshots/a1b2c3"
json_expect '[f["file"].rsplit("/", 1)[1] for f in d["files"]]' '["pytorch_model.bin"]'
json_expect '[s["file"].rsplit("/", 1)[1] for s in d["skipped"]]' '["config.json"]'
json_expect 'd["exit"]' 1

say "a file DCP's metadata names is scanned as DCP reads it, whatever its name"
expect_exit 1 ckpt scan "$w/dcp_readme"
expect_stdout_match '/dcp_readme/README.md: pickle, 1 pickle$'

say "a name the metadata gives that leads out of the folder: unsafe, not read"
expect_exit 1 ckpt scan "$w/dcp_escape"
expect_stdout_line "$w/dcp_escape/../outside.distcp: not read"
expect_stdout_line "  verdict: UNSAFE: named by $w/dcp_escape/.metadata (storage_data relative_path '../outside.distcp'), outside the folder: dcp.load would read it there; not read"
expect_exit 1 ckpt scan --json "$w/dcp_absolute"
json_expect '[(f["file"], f["verdict"], f["exit"]) for f in d["files"] if f["format"] == "unknown"]' \
    "[[\"$w/outside.distcp\", \"unsafe\", 1]]"
expect_exit 1 ckpt scan "$w/hf_index_escape"
expect_stdout_match '^  verdict: UNSAFE: named by .*pytorch_model.bin.index.json \(weight_map\), outside the folder'

say "a FIFO in a folder is refused, never opened; an empty folder exits 3"
expect_exit 3 ckpt scan "$w/fifo"
expect_stdout_match '/fifo/b.pt: not read$'
expect_exit 3 ckpt scan "$w/empty"
expect_stderr_line "^ckpt: scan: $w/empty: no checkpoint in the folder: 0 files, none that torch.load or a folder's loader would read\$"
expect_exit 3 ckpt scan --json "$w/empty"
json_expect '[(f["verdict"], f["exit"]) for f in d["files"]]' '[["error", 3]]'

say "a folder of text only has no checkpoint either"
mkdir "$tmp/text"
printf '# a model card\n' >"$tmp/text/README.md"
printf 'global_step3' >"$tmp/text/latest"
expect_exit 3 ckpt scan "$tmp/text"
expect_stdout_match '/text/README.md: skipped: torch.load.s unpickler stops at byte 0 \(0x23 is no pickle opcode\)'

say "a link loop is said, not followed forever"
mkdir "$tmp/loop"
cp tests/data/mlp.pth "$tmp/loop/"
ln -s . "$tmp/loop/up"
expect_exit 3 ckpt scan "$tmp/loop"
expect_stdout_match '/loop/up: not read$'
expect_stdout_match '^  verdict: unreadable: a link to a folder it is in \(a loop\): not walked again$'

say "a link to a folder outside the one scanned is not walked, and said (a file link is followed)"
mkdir "$tmp/outlink"
cp tests/data/mlp.pth "$tmp/outlink/"
ln -s "$srcdir/tests/data" "$tmp/outlink/data"
expect_exit 3 ckpt scan "$tmp/outlink"
expect_stdout_match '^  verdict: unreadable: a link to a folder outside the one scanned: not walked \(scan that folder itself\)$'

say "a dangling link: cannot be opened (4)"
mkdir "$tmp/dangling"
cp tests/data/mlp.pth "$tmp/dangling/"
ln -s ../../blobs/gone "$tmp/dangling/pytorch_model.bin"
expect_exit 4 ckpt scan "$tmp/dangling"
expect_stderr_line "/dangling/pytorch_model.bin: a link to '../../blobs/gone', which cannot be opened: No such file or directory\$"
check "no payload ran" test ! -e "$tmp/pwned"
finish
