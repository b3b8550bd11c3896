#!/bin/sh
# scan.sh - ckpt scan as a user runs it (man/ckpt-scan.1): every fixture is
# safe (exit 0); every scanner-evasion pickle of tests/bad/scan (built by
# tests/bad/make_scan_corpus.py, never unpickled) is flagged (exit 1) with
# exactly the unknown and dangerous globals tests/bad/scan/expected.json
# lists; unreadable files exit 3, missing ones 4; several files give the
# worst status; --json; usage errors.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"

say "every good fixture is safe: state-dict globals and known data only"
for f in tests/data/*.pth tests/data/*.ref.pth tests/data/ops/conv2d_1x1.pth; do
    expect_exit 0 ckpt scan --quiet "$f"
done
expect_exit 0 ckpt scan tests/data/train_ckpt.pth
expect_stdout_line '  known data  argparse.Namespace  (GLOBAL at train_ckpt/data.pkl+1200; called by NEWOBJ at +1223)'
expect_stdout_line '  verdict: safe: only state-dict (interpreted) and known-data globals'
expect_exit 0 ckpt scan tests/data/legacy_mlp.pth
expect_stdout_match '^tests/data/legacy_mlp.pth: pth-legacy, 5 pickles$'

say "every scanner evasion is flagged, with the right globals (tests/bad/scan/expected.json)"
if have_python; then
    python3 - "$CKPT" tests/bad/scan <<'PY' >"$tmp/evasions" 2>&1 || true
import json, subprocess, sys
ckpt, d = sys.argv[1:3]
want = json.load(open(d + '/expected.json'))
for name, exp in sorted(want.items()):
    p = subprocess.run([ckpt, 'scan', '--json', d + '/' + name], capture_output=True, text=True)
    doc = json.loads(p.stdout)['files'][0]
    # a global is listed once per pickle: a file read two ways names it twice
    unknown = sorted({g['global'] for g in doc['globals'] if g['class'] == 'unknown'})
    dangerous = sorted({g['global'] for g in doc['globals'] if g['dangerous']})
    ok = p.returncode == 1 and doc['verdict'] == 'unsafe' and unknown == exp['unknown'] \
        and dangerous == exp['dangerous']
    print('%s %s exit %d unknown %s dangerous %s' % ('ok' if ok else 'FAIL', name,
                                                    p.returncode, unknown, dangerous))
PY
    n=$(grep -c '^ok ' "$tmp/evasions" || true)
    if grep -q '^FAIL' "$tmp/evasions" || [ "$n" -lt 30 ]; then
        fail "evasions not all flagged ($n ok):"
        sed 's/^/   | /' "$tmp/evasions"
    else
        ok "all $n evasions flagged with exactly the expected globals"
    fi
else
    skip "no python3 to read expected.json"
fi
expect_exit 1 ckpt scan tests/bad/scan/stack_global_memo.pkl
expect_stdout_line '  DANGEROUS   os.system  (STACK_GLOBAL at pickle 1 (from byte 0)+29; called by REDUCE at +35)'
expect_stdout_line '  verdict: UNSAFE: 1 unknown global, 1 of them dangerous'
expect_exit 1 ckpt scan tests/bad/scan/zip_extra_pkl.pth
expect_stdout_match 'os.system  \(GLOBAL at archive/extra.pkl\+2'
expect_exit 1 ckpt scan tests/bad/os_system.pth
expect_exit 1 ckpt scan tests/bad/unknown_storage_type.pth
expect_stdout_line '  unknown     torch.FooStorage  (GLOBAL at archive/data.pkl+83)'

say "what cannot be read exits 3 with one line; a missing file 4"
expect_exit 3 ckpt scan tests/bad/empty.pth
expect_stderr_line '^ckpt: scan: tests/bad/empty.pth: empty file$'
expect_exit 3 ckpt scan --quiet tests/bad/truncated_pickle.pth
expect_exit 3 ckpt scan --quiet tests/bad/st_bad_json.safetensors
expect_exit 3 ckpt scan --quiet tests/bad/mark_bomb.pth
expect_exit 4 ckpt scan "$tmp/nothing.pth"
expect_stderr_line 'nothing.pth: No such file or directory$'

say "several files: one verdict each, the worst status (1 when any is unsafe)"
expect_exit 1 ckpt scan tests/data/mlp.pth tests/bad/scan/inst.pkl tests/data/bn.pth
expect_exit 3 ckpt scan --quiet tests/data/mlp.pth tests/bad/empty.pth
expect_exit 1 ckpt scan --quiet tests/bad/scan/inst.pkl tests/bad/empty.pth
# anything unsafe is 1, whatever else failed (doc/design.md, "Exit status and messages")
expect_exit 1 ckpt scan --quiet tests/bad/scan/inst.pkl "$tmp/nothing.pth"

say "--json"
expect_exit 1 ckpt scan --json tests/data/mlp.pth tests/bad/scan/obj.pkl
json_valid
json_expect 'd["exit"]' 1
json_expect '[f["verdict"] for f in d["files"]]' '["safe", "unsafe"]'
json_expect 'd["files"][1]["globals"][0]["global"]' '"posix.system"'
json_expect 'd["files"][1]["globals"][0]["used_by"]' '"OBJ"'
json_true 'd["files"][1]["globals"][0]["dangerous"] and d["files"][1]["globals"][0]["uses"] == ["call"]'

say "--max-pickle-bytes caps what is parsed, and says so"
expect_exit 3 ckpt scan --max-pickle-bytes 100 tests/data/mlp.pth
expect_stderr_line 'over the limit of 100 \(--max-pickle-bytes\)'

say "zips that readers read differently: ambiguous (tests/bad/zip, tests/bad/make_bad_zip.py)"
for f in tests/bad/zip/*.pth; do
    case $f in
    */plain.pth) expect_exit 0 ckpt scan --quiet "$f" ;;  # the control: one reading of it
    *) expect_exit 1 ckpt scan --quiet "$f" ;;
    esac
done
expect_exit 1 ckpt scan tests/bad/zip/two_end_records.pth
expect_stdout_match '^  AMBIGUOUS   2 end-of-central-directory records'
expect_stdout_match '^  verdict: UNSAFE: .*; and readers would see different content$'
say "a bad CRC-32 does not hide what torch would unpickle (it does not check it)"
expect_exit 1 ckpt scan tests/bad/zip/crc_global.pth
expect_stdout_match '^  unknown     builtins.print  \(GLOBAL at archive/data.pkl\+2'
expect_stderr_line 'crc_global.pth: archive/data.pkl: CRC-32 mismatch \(torch does not check it'
say "a safetensors file is also a pickle from byte 0 to torch.load under another name"
expect_exit 1 ckpt scan tests/bad/scan/safetensors_pickle.safetensors
expect_stdout_match '^  reading safetensors .*: read to the end$'
expect_stdout_match '^  DANGEROUS   os.getcwd  \(GLOBAL at pickle 1 \(from byte 0\)\+94; .*; pickle reading\)$'
expect_exit 1 ckpt scan --json tests/bad/scan/safetensors_pickle.safetensors
json_expect '[(r["reader"], r["primary"], r["unsafe"]) for r in d["files"][0]["readings"]]' \
    '[["safetensors", true, false], ["pickle", false, true]]'
json_expect '[g["reading"] for g in d["files"][0]["globals"]]' '["pickle"]'
expect_exit 0 ckpt scan --json tests/data/mlp.pth
json_expect '[r["reader"] for r in d["files"][0]["readings"]]' '["zip"]'
json_expect 'd["files"][0]["ambiguities"]' '[]'

say "usage errors exit 2"
expect_exit 2 ckpt scan
expect_exit 2 ckpt scan --allow-unknown tests/data/mlp.pth
expect_exit 2 ckpt scan --bogus tests/data/mlp.pth
expect_exit 0 ckpt scan --help
expect_stdout_match '^usage: ckpt scan'

finish
