#!/bin/sh
# train_select.sh - training checkpoints through every rewrite and output
# format (issue 27): strip-module, add-module, unwrap and rename, each with
# and without --select, writing pth-zip (OUT.pth), pth-legacy (--to) and
# safetensors (OUT.safetensors, or --to safetensors whatever OUT is
# called); convert and extract the same way.  The inputs are the training
# checkpoints of tests/data: train_ckpt.pth and legacy_train.pth (a
# DataParallel model, an SGD optimizer, epoch, loss, an argparse.Namespace),
# lightning.pth (Lightning's state_dict, optimizer_states, ...) and
# train/gan.pth (two models, generator and discriminator, and their Adam
# optimizers).
#
# What doc/design.md ("Common rules") says, checked on every output:
#   - a pth OUT keeps the whole checkpoint, the selected state dict (else
#     every model state dict) rewritten, every tensor's data as it was;
#   - a safetensors OUT holds one state dict: --select's, else the model's,
#     taken as `ckpt extract` takes it, its keys rewritten, its data as it
#     was, and one line on stderr says which (none with --quiet);
#   - a file with two models and no --select is refused for a safetensors
#     OUT (exit 2), naming both and --select; nothing is written.
# That torch and the safetensors package load these outputs with the same
# values is tests/interop/train_select.py's part.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

have_python || skip "no python3 to read the JSON of ckpt inspect"

mkdir "$tmp/w"
cd "$tmp/w"
gan=$data/train/gan.pth

# the model state dict of each input, and its tensors
sel_of() {
    case $1 in
    lightning) echo state_dict ;;
    gan) echo generator ;;
    *) echo model_state_dict ;;
    esac
}
models_of() { # every model state dict: what a rewrite without --select touches
    case $1 in
    gan) echo generator,discriminator ;;
    *) sel_of "$1" ;;
    esac
}
path_of() {
    case $1 in
    gan) echo "$gan" ;;
    *) echo "$data/$1.pth" ;;
    esac
}

# check.py SRC.json OUT.json MODE SDS RULE FORMAT: OUT (inspect --json
# --stats) is what SRC becomes when RULE rewrites the keys of the state
# dicts SDS (','-separated paths): MODE whole (a pth: every tensor of SRC,
# in order) or only (the one state dict SDS names, its keys alone), each
# tensor's dtype, shape and crc32 as in SRC; OUT's format is FORMAT.
cat >"$tmp/check.py" <<'PYEOF'
import json, re, sys
src, out = (json.load(open(f)) for f in sys.argv[1:3])
mode, sds, rule, fmt = sys.argv[3:7]
sds = [s.split("/") for s in sds.split(",")]
WRAP = {"module", "_orig_mod", "_fsdp_wrapped_module", "_forward_module",
        "_checkpoint_wrapped_module"}
def rewrite(k):
    if rule == "strip-module":
        return re.sub(r"^(module\.)+", "", k)
    if rule == "add-module":
        return "module." + k
    if rule == "unwrap":
        return ".".join(p for p in k.split(".") if p not in WRAP)
    if rule == "rename":
        return re.sub(r"\.bias$", ".b", k)
    return k
props = lambda t: [t["dtype"], t["shape"], t["crc32"]]
want = []
for t in src["tensors"]:
    p = t["path"]
    sd = next((s for s in sds if p[:len(s)] == s and len(p) == len(s) + 1), None)
    if sd is not None:
        key = rewrite(p[-1])
        want.append([[key] if mode == "only" else p[:-1] + [key], props(t)])
    elif mode == "whole":
        want.append([p, props(t)])
got = [[t["path"], props(t)] for t in out["tensors"]]
problems = []
if out["format"] != fmt:
    problems.append("format %s, not %s" % (out["format"], fmt))
if mode == "only":  # a header's order is the writer's to choose
    want, got = sorted(want), sorted(got)
if got != want:
    problems.append("tensors %s, expected %s" % (got, want))
print("; ".join(problems))
sys.exit(1 if problems else 0)
PYEOF

# expect_holds OUT MODE IN SDS RULE FORMAT: check.py's check, as a test check
expect_holds() {
    inspect_json "$3" --stats --allow-global argparse.Namespace
    cp "$out" "$tmp/src.json"
    inspect_json "$1" --stats --allow-global argparse.Namespace
    cp "$out" "$tmp/out.json"
    if _why=$(python3 "$tmp/check.py" "$tmp/src.json" "$tmp/out.json" "$2" "$4" "$5" "$6" 2>&1); then
        case $2 in
        whole) ok "$1 ($6): all of $(basename "$3"), the keys of $4 rewritten by $5, the data as it was" ;;
        *) ok "$1 ($6): $4 of $(basename "$3") alone, its keys rewritten by $5, the data as it was" ;;
        esac
    else
        fail "$1 is not what $5 makes of $3 ($2, $4): $_why"
    fi
}

# refused N PREFIX ARGS...: `ckpt ARGS` exits N with one line on stderr
# starting PREFIX, nothing on stdout, nothing written.
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
    cmp -s "$tmp/dir.before" "$tmp/dir.after" || _p="$_p; the directory changed"
    if [ -z "$_p" ]; then
        ok "refused ($_want, one line on stderr, nothing written): $last_cmd"
    else
        fail "$last_cmd: ${_p#; }"
        show_output
    fi
}

# err_has TEXT...: the last stderr contains each TEXT.
err_has() {
    for _t in "$@"; do
        if grep -Fq -- "$_t" "$err"; then
            ok "the message has '$_t'"
        else
            fail "the message lacks '$_t': $(cat "$err")"
        fi
    done
}

# took MODEL SEL N: stderr has the line that says which state dict a
# safetensors OUT holds (MODEL: "model's " when it was taken without --select)
took() {
    _s=s
    [ "$3" -ne 1 ] || _s=
    _line="safetensors holds tensors only: wrote the $1state dict '$2' ($3 tensor$_s), not the rest of the file"
    err_has "$_line"
}

# rule_args RULE: the command line of a rewrite
rule_args() {
    case $1 in
    rename) echo "rename -e s/\\.bias\$/.b/" ;;
    *) echo "$1" ;;
    esac
}

# ===========================================================================
for f in train_ckpt legacy_train lightning gan; do
    in=$(path_of $f)
    sel=$(sel_of $f)
    n=4
    for rule in strip-module add-module unwrap rename; do
        say "$rule of $f.pth, with and without --select $sel, to pth, pth-legacy and safetensors"
        # shellcheck disable=SC2046 # the rule's words
        for s in "" "--select $sel"; do
            sds=$sel
            [ -n "$s" ] || sds=$(models_of $f)
            # shellcheck disable=SC2086
            expect_exit 0 ckpt $(rule_args $rule) $s --allow-global argparse.Namespace "$in" zip.pth
            expect_holds zip.pth whole "$in" "$sds" $rule pth-zip
            # shellcheck disable=SC2086
            expect_exit 0 ckpt $(rule_args $rule) $s --allow-global argparse.Namespace --to pth-legacy "$in" legacy.pth
            expect_holds legacy.pth whole "$in" "$sds" $rule pth-legacy
            if [ $f = gan ] && [ -z "$s" ]; then
                note "two models and no --select: a safetensors OUT is refused, naming both"
                # shellcheck disable=SC2086
                refused 2 "ckpt: $rule: $in: " $(rule_args $rule) "$in" st.safetensors
                err_has "'generator', 'discriminator'" "--select"
                continue
            fi
            # shellcheck disable=SC2086
            expect_exit 0 ckpt $(rule_args $rule) $s --allow-global argparse.Namespace "$in" st.safetensors
            if [ -n "$s" ]; then took "" "$sel" $n; else took "model's " "$sel" $n; fi
            expect_holds st.safetensors only "$in" "$sel" $rule safetensors
            # shellcheck disable=SC2086
            expect_exit 0 ckpt $(rule_args $rule) $s --allow-global argparse.Namespace --to safetensors "$in" st.bin
            expect_holds st.bin only "$in" "$sel" $rule safetensors
        done
    done
done

# ===========================================================================
say "a sharded set holds tensors only too: the model's state dict, said so"
expect_exit 0 ckpt strip-module "$data/train_ckpt.pth" set.safetensors.index.json
expect_stderr_line "^ckpt: strip-module: .*/train_ckpt.pth: a sharded set holds tensors only: wrote the model's state dict 'model_state_dict' \\(4 tensors\\), not the rest of the file \\(name another with --select\\)\$"
expect_holds set.safetensors.index.json only "$data/train_ckpt.pth" model_state_dict strip-module sharded
expect_exit 0 ckpt convert --shard-size 200K "$data/lightning.pth" lit.safetensors.index.json
err_has "a sharded set holds tensors only: wrote the model's state dict 'state_dict' (4 tensors)"
expect_holds lit.safetensors.index.json only "$data/lightning.pth" state_dict none sharded
refused 2 "ckpt: convert: $gan: " convert --shard-size 1K "$gan" gan.safetensors.index.json

say "--dtype with it: the cast counts the storages written (4 of the model's), not the file's 8"
expect_exit 0 ckpt convert --dtype float16 "$data/train_ckpt.pth" half.safetensors
expect_stdout_line "cast: 4 storages float32 -> float16"
expect_exit 0 ckpt convert --dtype float16 --select model_state_dict "$data/train_ckpt.pth" half.pth
expect_stdout_line "cast: 4 storages float32 -> float16"
expect_exit 0 ckpt convert --dtype float16 --allow-global argparse.Namespace "$data/train_ckpt.pth" all-half.pth
expect_stdout_line "cast: 8 storages float32 -> float16"

say "a file with no state dict at all: refused as input (3), by each command in its words"
none=$data/ops/maxpool_k2.pth # {params: {}, input: tensor, output.y: tensor}
refused 3 "ckpt: convert: $none: safetensors holds tensors only: no state dict" convert "$none" n.safetensors
refused 3 "ckpt: extract: $none: no state dict or module tree" extract "$none" n.pth
refused 3 "ckpt: strip-module: $none: no state dict found" strip-module "$none" n.safetensors

say "--quiet: the line that says which state dict goes too"
expect_exit 0 ckpt strip-module --quiet "$data/train_ckpt.pth" q.safetensors
expect_stdout_empty
expect_stderr_empty
expect_holds q.safetensors only "$data/train_ckpt.pth" model_state_dict strip-module safetensors

say "--dry-run: says what it would write, writes nothing"
listing . >"$tmp/dir.before"
expect_exit 0 ckpt strip-module --dry-run "$data/train_ckpt.pth" dry.safetensors
expect_stdout_line "model_state_dict/module.n.1.weight -> model_state_dict/n.1.weight"
expect_stderr_line "^ckpt: strip-module: .*/train_ckpt.pth: safetensors holds tensors only: would write the model's state dict 'model_state_dict' \\(4 tensors\\), not the rest of the file \\(name another with --select\\)\$"
listing . >"$tmp/dir.after"
check "nothing written" cmp -s "$tmp/dir.before" "$tmp/dir.after"

say "--select of an optimizer's per-parameter state: that one, to safetensors too"
expect_exit 0 ckpt strip-module --select optimizer_state_dict/state/0 "$data/train_ckpt.pth" mom.safetensors
took "" optimizer_state_dict/state/0 1
inspect_json mom.safetensors
json_expect '[t["path"] for t in d["tensors"]]' '[["momentum_buffer"]]'

say "--in-place to safetensors would drop all but one state dict: refused (2)"
cp "$data/train_ckpt.pth" inplace.pth
refused 2 "ckpt: strip-module: " strip-module --in-place --to safetensors inplace.pth
check "inplace.pth is as it was" cmp -s "$data/train_ckpt.pth" inplace.pth
refused 2 "ckpt: convert: " convert --in-place --to safetensors inplace.pth inplace.pth
check "inplace.pth is as it was" cmp -s "$data/train_ckpt.pth" inplace.pth

say "--to takes pth, pth-legacy and safetensors; anything else is a usage error (2)"
for c in strip-module add-module unwrap; do
    refused 2 "ckpt: $c: --to: 'onnx' is not pth, pth-legacy or safetensors" $c --to onnx "$data/train_ckpt.pth" x.pth
done
refused 2 "ckpt: rename: --to: 'onnx'" rename -e 's/a/b/' --to onnx "$data/train_ckpt.pth" x.pth
refused 2 "ckpt: remap: " remap --to "$data/train_ckpt.pth" x.pth

# ===========================================================================
for f in train_ckpt legacy_train lightning gan; do
    in=$(path_of $f)
    sel=$(sel_of $f)
    say "convert $f.pth: --select writes that state dict alone, in every format"
    expect_exit 0 ckpt convert --select "$sel" --allow-global argparse.Namespace "$in" c.pth
    expect_stderr_empty
    expect_holds c.pth only "$in" "$sel" none pth-zip
    expect_exit 0 ckpt convert --select "$sel" --to pth-legacy "$in" c-legacy.pth
    expect_holds c-legacy.pth only "$in" "$sel" none pth-legacy
    expect_exit 0 ckpt convert --select "$sel" "$in" c.safetensors
    expect_stderr_empty
    expect_holds c.safetensors only "$in" "$sel" none safetensors

    say "convert $f.pth without --select: a pth keeps it all; safetensors takes the model's state dict"
    expect_exit 0 ckpt convert --allow-global argparse.Namespace "$in" all.pth
    expect_holds all.pth whole "$in" "$sel" none pth-zip
    expect_exit 0 ckpt convert --allow-global argparse.Namespace --to pth-legacy "$in" all-legacy.pth
    expect_holds all-legacy.pth whole "$in" "$sel" none pth-legacy
    if [ $f = gan ]; then
        refused 2 "ckpt: convert: $in: " convert "$in" m.safetensors
        err_has "2 are a model's: 'generator', 'discriminator'" "--select"
        refused 2 "ckpt: convert: $in: " convert --to safetensors "$in" m.bin
        refused 2 "ckpt: extract: $in: " extract "$in" m.pth
        err_has "'generator', 'discriminator'" "--select"
    else
        expect_exit 0 ckpt convert "$in" m.safetensors
        expect_stderr_line "^ckpt: convert: $in: safetensors holds tensors only: wrote the model's state dict '$sel' \\(4 tensors\\), not the rest of the file \\(name another with --select\\)\$"
        expect_stdout_line "wrote m.safetensors: safetensors, 4 tensors, 4 storages, $(wc -c <m.safetensors | awk '{printf "%.1f KiB", $1 / 1024}')"
        expect_holds m.safetensors only "$in" "$sel" none safetensors
        expect_exit 0 ckpt convert --quiet --to safetensors "$in" m.bin
        expect_stderr_empty
        expect_holds m.bin only "$in" "$sel" none safetensors
        say "extract $f.pth without --select: the same state dict, and its name"
        expect_exit 0 ckpt extract "$in" e.safetensors
        expect_stdout_line "extracted the state dict '$sel': 4 tensors"
        expect_holds e.safetensors only "$in" "$sel" none safetensors
        expect_exit 0 ckpt extract --to pth "$in" e.pth
        expect_holds e.pth only "$in" "$sel" none pth-zip
    fi
    say "extract --select $sel of $f.pth, to pth and safetensors"
    expect_exit 0 ckpt extract --select "$sel" "$in" es.pth
    expect_holds es.pth only "$in" "$sel" none pth-zip
    expect_exit 0 ckpt extract --select "$sel" "$in" es.safetensors
    expect_holds es.safetensors only "$in" "$sel" none safetensors
done

# ===========================================================================
say "README.md's examples of training checkpoints give what README.md shows"
# Every "    $ ckpt REWRITE ..." line of README.md (a key rewrite, convert
# or extract) whose command names a training
# checkpoint of tests/data, run from the top of the tree with /tmp/ made a
# folder of this test's; its stderr then its stdout must be the lines below
# it (up to a blank line or the next "$ "), the sizes at the end of "wrote"
# lines aside (how many bytes a writer takes is not what these show).
mkdir "$tmp/readme"
python3 - "$srcdir/README.md" "$tmp/readme" >"$tmp/readme.list" <<'PYEOF'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
fixtures = ("train_ckpt.pth", "legacy_train.pth", "lightning.pth", "train/gan.pth")
n = 0
for i, line in enumerate(lines):
    m = re.match(r"    \$ (ckpt (strip-module|add-module|unwrap|rename|convert|extract) .*)$", line)
    if not m or not any(f in m.group(1) for f in fixtures):
        continue
    want = []
    for nxt in lines[i + 1:]:
        if not nxt.startswith("    ") or nxt.startswith("    $ "):
            break
        want.append(nxt[4:])
    n += 1
    with open("%s/%d.cmd" % (sys.argv[2], n), "w") as f:
        f.write(m.group(1).replace("/tmp/", sys.argv[2] + "/") + "\n")
    with open("%s/%d.want" % (sys.argv[2], n), "w") as f:
        f.write("".join(w.replace("/tmp/", sys.argv[2] + "/") + "\n" for w in want))
print(n)
PYEOF
count=$(cat "$tmp/readme.list")
check "README.md has at least 6 such examples (it has $count)" test "$count" -ge 6
sizes='s/, [0-9.]+ (B|KiB|MiB|GiB)$/, SIZE/'
i=1
while [ "$i" -le "$count" ]; do
    (cd "$srcdir" && PATH=$(dirname "$CKPT"):$PATH sh "$tmp/readme/$i.cmd") >"$tmp/readme/$i.out" 2>"$tmp/readme/$i.err" || true
    cat "$tmp/readme/$i.err" "$tmp/readme/$i.out" | sed -E "$sizes" >"$tmp/readme/$i.got"
    sed -E "$sizes" "$tmp/readme/$i.want" >"$tmp/readme/$i.wantn"
    if cmp -s "$tmp/readme/$i.got" "$tmp/readme/$i.wantn"; then
        ok "README.md: \$ $(cat "$tmp/readme/$i.cmd")"
    else
        fail "README.md: \$ $(cat "$tmp/readme/$i.cmd"): $(diff "$tmp/readme/$i.wantn" "$tmp/readme/$i.got")"
    fi
    i=$((i + 1))
done

say "the discriminator is there to take too"
expect_exit 0 ckpt strip-module --select discriminator "$gan" d.safetensors
took "" discriminator 4
expect_holds d.safetensors only "$gan" discriminator strip-module safetensors

finish
