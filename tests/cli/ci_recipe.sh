#!/bin/sh
# ci_recipe.sh - README.md's CI recipes ("CI recipes: scan and verify
# checkpoints in your repository"), run as a user's CI job would run them:
# the shell commands of the GitHub Actions and GitLab CI blocks, read from
# README.md (the ```yaml block after `<!-- ci recipe: github -->` and after
# `<!-- ci recipe: gitlab -->`, and `github-convert`'s), in a fresh git repository outside the source
# tree, with the portable binary only; then the pip route's two blocks
# (`github-pip`, `gitlab-pip`), which install the wheel into a venv.  The
# download comes from a local RELEASE folder: make portable's
# release/ckpt-*-x86_64-linux.tar.gz and SHA256SUMS when they exist, else a
# stand-in of the same layout (ckpt-VERSION-x86_64-linux/bin/ckpt, the
# build's binary, and its sum); and the wheel: make wheel-portable's, else
# one made from the build tree as make wheel makes it (the PEP 517 backend,
# /opt/ckpt/pytools), its sum added.  pip gets numpy offline from
# /opt/ckpt/wheels (./bootstrap --deps); without a wheel or numpy there the
# pip route is not run (said so).
# GitHub's steps each run in their own `bash -e` with the folders written to
# $GITHUB_PATH put on PATH, as the runner does; GitLab's script lines run in
# one shell, stopping at the first failure.  The `uses:` steps are not run.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

if ! have_python || ! python3 -c 'import yaml' 2>/dev/null; then
    skip "no python3 with PyYAML to read the recipes' YAML"
fi
command -v curl >/dev/null 2>&1 || skip "no curl, which the recipes download with"
command -v git >/dev/null 2>&1 || skip "no git to make the scratch repository"
command -v bash >/dev/null 2>&1 || skip "no bash, GitHub's shell for run steps"

# ---- the release the job downloads ------------------------------------------

rel=$tmp/release
mkdir "$rel"
set -- "$srcdir"/release/ckpt-*-x86_64-linux.tar.gz
if [ -f "$1" ] && [ -f "$srcdir/release/SHA256SUMS" ]; then
    tarball=$1
    cp "$tarball" "$srcdir/release/SHA256SUMS" "$rel/"
    note "release: make portable's $(basename "$tarball")"
else
    version=$("$CKPT" --version | sed -n '1s/^ckpt \([^ ]*\) .*/\1/p')
    pname=ckpt-$version-x86_64-linux
    mkdir -p "$tmp/stage/$pname/bin"
    cp "$CKPT" "$tmp/stage/$pname/bin/ckpt"
    (cd "$tmp/stage" && tar czf "$rel/$pname.tar.gz" "$pname")
    (cd "$rel" && sha256sum "$pname.tar.gz" >SHA256SUMS)
    note "release: a stand-in $pname.tar.gz around $CKPT (no release/ from make portable)"
fi
set -- "$rel"/ckpt-*-x86_64-linux.tar.gz
version=$(basename "$1" | sed 's/^ckpt-\(.*\)-x86_64-linux\.tar\.gz$/\1/')

# the pip route's wheel, and numpy for the job's python3 without an index
pytools=${CKPT_PYTOOLS:-/opt/ckpt/pytools}
wheels=${CKPT_WHEELS:-/opt/ckpt/wheels}
recipes="github gitlab"
builddir=$(cd "$(dirname "$CKPT")" && pwd)
set -- "$srcdir"/release/ckpt_toolkit-"$version"-*.whl
pytag=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
if [ -f "$1" ]; then
    cp "$1" "$rel/"
    (cd "$rel" && sed -i '/ ckpt_toolkit-/d' SHA256SUMS && sha256sum "$(basename "$1")" >>SHA256SUMS)
    note "wheel: make wheel-portable's $(basename "$1")"
elif "$pytools/bin/python" -c 'import build' 2>/dev/null && command -v patchelf >/dev/null 2>&1 &&
    [ -f "$builddir/.libs/libckpt.so.0" ] && ! ldd "$CKPT" "$builddir/.libs/libckpt.so.0" | grep -q libcudart &&
    ! readelf -s --wide "$CKPT" 2>/dev/null | grep -q '__asan_init'; then
    mkdir -p "$tmp/native/bin" "$tmp/native/lib"
    ln -s "$CKPT" "$tmp/native/bin/ckpt"
    ln -s "$builddir/.libs/libckpt.so.0" "$tmp/native/lib/libckpt.so.0"
    if (cd "$srcdir" && CKPT_TOOLKIT_NATIVE_DIR=$tmp/native PYTHONDONTWRITEBYTECODE=1 \
        "$pytools/bin/python" -m build --wheel --no-isolation -o "$rel" .) >"$tmp/build.log" 2>&1; then
        set -- "$rel"/ckpt_toolkit-*.whl
        (cd "$rel" && sha256sum "$(basename "$1")" >>SHA256SUMS)
        note "wheel: $(basename "$1"), made from the build tree as make wheel makes it"
    else
        fail "the wheel could not be made from the build tree"
        tail -n 20 "$tmp/build.log" | sed 's/^/   | /'
    fi
else
    note "no wheel (make wheel-portable, or $pytools, patchelf and a plain build: no libcudart, no sanitizers): the pip route is not run"
fi
set -- "$rel"/ckpt_toolkit-*.whl
wheel=$(basename "$1")
if [ ! -f "$1" ]; then
    :
elif set -- "$wheels"/numpy-*-"$pytag"-"$pytag"-*.whl && [ -f "$1" ]; then
    recipes="$recipes github-pip gitlab-pip"
else
    note "no numpy wheel for python3 ($pytag) in $wheels (./bootstrap --deps): the pip route is not run"
fi

# ---- the recipes, from README.md -----------------------------------------------

# recipe NAME: the ```yaml block after README's `<!-- ci recipe: NAME -->`
recipe() {
    sed -n "/^<!-- ci recipe: $1 -->\$/,/^\`\`\`\$/p" "$srcdir/README.md" |
        sed -e '1,2d' -e '$d'
}
say "README.md's recipes are YAML with the steps this test runs"
# the commands, one file per GitHub run step (NAME-stepI.sh) / one for
# GitLab's script (NAME-script.sh)
for r in github gitlab github-pip gitlab-pip github-convert; do
    recipe "$r" >"$tmp/$r.yml"
    python3 - "$tmp" "$r" <<'PYEOF'
import os, sys, yaml
tmp, name = sys.argv[1:]
doc = yaml.safe_load(open(os.path.join(tmp, name + ".yml")))
if name.startswith("github"):
    steps = [s for s in doc["jobs"]["ckpt"]["steps"] if "run" in s]
    for i, s in enumerate(steps):
        # GitHub runs `shell: bash` as bash -eo pipefail, the default as bash -e
        pre = "set -o pipefail\n" if s.get("shell") == "bash" else ""
        open(os.path.join(tmp, "%s-step%d.sh" % (name, i)), "w").write(pre + s["run"])
    uses = [s["uses"].split("@")[0] for s in doc["jobs"]["ckpt"]["steps"] if "uses" in s]
    if name == "github-convert":
        assert "actions/upload-artifact" in uses, uses
    else:
        assert "github/codeql-action/upload-sarif" in uses, uses
else:
    gl = doc["ckpt"]
    open(os.path.join(tmp, name + "-script.sh"), "w").write("".join(l + "\n" for l in gl["script"]))
    assert gl["artifacts"]["reports"]["junit"] == "report.xml", gl["artifacts"]
    assert gl["artifacts"]["when"] == "always"
PYEOF
done
for r in github github-pip; do
    set -- "$tmp/$r"-step*.sh
    check "$r: the job has 3 run steps (get ckpt, scan, verify), upload-sarif after them" test $# -eq 3
done
check "GitLab's script downloads, checks the sum and unpacks" grep -q '^sha256sum -c --ignore-missing SHA256SUMS$' "$tmp/gitlab-script.sh"
check "GitLab's pip script downloads, checks the sum and installs" grep -q '^sha256sum -c --ignore-missing SHA256SUMS$' "$tmp/gitlab-pip-script.sh"
check "the two routes scan and verify alike" test "$(tail -n 2 "$tmp/gitlab-script.sh")" = "$(tail -n 2 "$tmp/gitlab-pip-script.sh")"
for f in "$tmp"/*-step*.sh "$tmp"/*-script.sh; do
    note "$(basename "$f"):"
    note "$(sed 's/^/  /' "$f")"
done

# ---- a user's repository ---------------------------------------------------------

# userrepo DIR: a fresh git repository, outside the source tree, with the
# spec of its model and a checkpoint that loads into it
userrepo() {
    mkdir -p "$1/checkpoints"
    git -C "$1" init -q
    cp "$srcdir/models/mnist_mlp.json" "$1/model.json"
    cp "$data/fmnist_mlp.pth" "$1/checkpoints/model.pth"
    git -C "$1" add -A
    git -C "$1" -c user.name=ci -c user.email=ci@example.org commit -qm checkpoints
}

# a scratch folder outside the tree, whatever TMPDIR is
scratch=$(mktemp -d /tmp/ckpt-ci-recipe.XXXXXX)
trap 'rm -rf "$tmp" "$scratch"' EXIT
case $scratch in "$srcdir"/*) fail "the scratch folder $scratch is inside the source tree" ;; esac

# the job's environment: only the system's PATH, no build tree on it
jobpath=/usr/local/bin:/usr/bin:/bin
command -v ckpt >/dev/null 2>&1 && note "(a ckpt on this PATH is ignored: the job's PATH is $jobpath)"

# the job's pip: numpy from ./bootstrap --deps's wheels, no index
jobpip="PIP_NO_INDEX=1 PIP_FIND_LINKS=$wheels PIP_DISABLE_PIP_VERSION_CHECK=1"

# github DIR [NAME]: run GitHub's steps of recipe NAME (github) in DIR, in
# order, until one fails; the status of each step in DIR.status (one a line)
github() {
    _r=${2:-github}
    : >"$1.status"
    : >"$1/.github_path"
    mkdir -p "$1.runner"
    _i=0
    while [ -f "$tmp/$_r-step$_i.sh" ]; do
        _p=$jobpath
        while IFS= read -r _d; do _p=$_d:$_p; done <"$1/.github_path"
        # shellcheck disable=SC2086 # ($jobpip: words)
        if (cd "$1" && env -i PATH="$_p" HOME="$HOME" LC_ALL=C RELEASE="file://$rel" \
            CKPT_VERSION="$version" CKPT_WHEEL="$wheel" GITHUB_PATH="$1/.github_path" \
            RUNNER_TEMP="$1.runner" $jobpip bash -e "$tmp/$_r-step$_i.sh") >"$1.out$_i" 2>&1; then
            echo 0 >>"$1.status"
        else
            echo $? >>"$1.status"
            return 0
        fi
        _i=$((_i + 1))
    done
}

# shellcheck disable=SC2317 # (called as "$ci")
# gitlab DIR [NAME]: run GitLab's script of recipe NAME (gitlab) in DIR
# (one shell, stops at the first failure); its exit status in DIR.status
gitlab() {
    # shellcheck disable=SC2086 # ($jobpip: words)
    if (cd "$1" && env -i PATH="$jobpath" HOME="$HOME" LC_ALL=C RELEASE="file://$rel" \
        CKPT_VERSION="$version" CKPT_WHEEL="$wheel" $jobpip sh -e "$tmp/${2:-gitlab}-script.sh") >"$1.out" 2>&1; then
        echo 0 >"$1.status"
    else
        echo $? >"$1.status"
    fi
}

# sarif_eval FILE EXPR: EXPR (Python, over the log `d` and its `results`) is true
sarif_eval() {
    if python3 - "$1" "$2" >"$tmp/pyerr" 2>&1 <<'PYEOF'; then
import json, sys
d = json.load(open(sys.argv[1]))
results = [r for run in d["runs"] for r in run.get("results", [])]
files = {l["physicalLocation"]["artifactLocation"]["uri"] for r in results for l in r["locations"]}
sys.exit(0 if eval(sys.argv[2]) else 1)
PYEOF
        ok "$(basename "$1"): $2"
    else
        fail "$1: $2 ($(tail -n 1 "$tmp/pyerr"))"
    fi
}

# junit_eval FILE EXPR: EXPR over the report's one testsuite `s` is true
junit_eval() {
    if python3 - "$1" "$2" >"$tmp/pyerr" 2>&1 <<'PYEOF'; then
import sys
import xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
s = r.find("testsuite")
cases = [c.get("name") for c in s.findall("testcase")]
sys.exit(0 if eval(sys.argv[2]) else 1)
PYEOF
        ok "$(basename "$1"): $2"
    else
        fail "$1: $2 ($(tail -n 1 "$tmp/pyerr"))"
    fi
}

# statuses REPO WANT [WHY]: the steps of the job in REPO exited WANT (one
# status a step, space-separated); their output shown when not
statuses() {
    _got=$(tr '\n' ' ' <"$1.status" | sed 's/ $//')
    if [ "$_got" = "$2" ]; then
        ok "exit statuses of the steps: $_got${3:+ ($3)}"
    else
        fail "exit statuses of the steps: $_got, expected $2"
        cat "$1".out* | sed 's/^/   | /'
    fi
}

for ci in $recipes; do
    # the runner (github or gitlab), and what the first step leaves
    runner=${ci%-pip}
    case $ci in
    *-pip) artifact=$wheel ;;
    *) artifact=ckpt-$version-x86_64-linux.tar.gz ;;
    esac
    say "$ci: a repository whose checkpoint is safe and loads: the job passes"
    repo=$scratch/$ci-safe
    userrepo "$repo"
    $runner "$repo" "$ci"
    if [ "$runner" = github ]; then want='0 0 0'; else want=0; fi
    statuses "$repo" "$want"
    check "sha256sum -c checked the download" grep -q "^$artifact: OK" "$repo".out*
    case $ci in
    github-pip) check "ckpt was installed in the job's venv" test -x "$repo.runner/ckpt-venv/bin/ckpt" ;;
    gitlab-pip) check "ckpt was installed in the job's venv" test -x "$repo/.ckpt-venv/bin/ckpt" ;;
    *) check "the binary was unpacked in the repository" test -x "$repo/ckpt-$version-x86_64-linux/bin/ckpt" ;;
    esac
    sarif_eval "$repo/ckpt.sarif" 'd["version"] == "2.1.0" and results == []'
    junit_eval "$repo/report.xml" 's.get("failures") == "0" and s.get("errors") == "0" and "load checkpoint" in cases'

    say "$ci: an unsafe checkpoint committed beside it: the scan step fails and the log names it"
    repo=$scratch/$ci-unsafe
    userrepo "$repo"
    cp "$bad/os_system.pth" "$repo/checkpoints/"
    git -C "$repo" add -A
    git -C "$repo" -c user.name=ci -c user.email=ci@example.org commit -qm 'an unsafe one'
    $runner "$repo" "$ci"
    if [ "$runner" = github ]; then want='0 1'; else want=1; fi
    statuses "$repo" "$want" "scan's 1: a file is unsafe"
    sarif_eval "$repo/ckpt.sarif" 'd["version"] == "2.1.0" and len(results) >= 1 and all(f.endswith("checkpoints/os_system.pth") for f in files)'
    sarif_eval "$repo/ckpt.sarif" 'any("os.system" in r["message"]["text"] for r in results)'
    check "verify did not run after the failed scan (no report.xml)" test ! -e "$repo/report.xml"

    # the verify step's failure once per runner: the pip route's ckpt is the
    # same program, and each job costs a venv and numpy's install
    case $ci in *-pip) continue ;; esac
    say "$ci: a DataParallel checkpoint as the model's: verify fails, the JUnit report says why"
    repo=$scratch/$ci-dp
    userrepo "$repo"
    cp "$data/fmnist_mlp_dp.pth" "$repo/checkpoints/model.pth"
    $runner "$repo" "$ci"
    if [ "$runner" = github ]; then want='0 0 1'; else want=1; fi
    statuses "$repo" "$want" "verify's 1: the strict load fails"
    junit_eval "$repo/report.xml" 's.get("failures") == "1" and cases == ["load checkpoint"]'
done

# README's "Prove a converted checkpoint in CI": a DataParallel checkpoint
# fixed and verified against torch's outputs, in a user's repository
convrepo() {
    mkdir -p "$1/checkpoints"
    git -C "$1" init -q
    cp "$srcdir/models/mnist_mlp.json" "$1/model.json"
    cp "$data/fmnist_mlp_dp.pth" "$1/checkpoints/model_dp.pth"
    cp "$2" "$1/checkpoints/model.ref.pth"
    git -C "$1" add -A
    git -C "$1" -c user.name=ci -c user.email=ci@example.org commit -qm checkpoints
}
say "github-convert: a DataParallel checkpoint fixed and proved against torch's outputs"
repo=$scratch/convert
convrepo "$repo" "$data/fmnist_mlp.ref.pth"
github "$repo" github-convert
statuses "$repo" "0 0"
check "the fixed checkpoint was written" test -f "$repo/model.pth"
check "verify.json says the outputs match torch's" python3 -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d['result'] == 'PASS' else 1)" "$repo/verify.json"
say "github-convert: a reference of another model: the proof fails the job"
repo=$scratch/convert-wrong
convrepo "$repo" "$data/fmnist_ae.ref.pth"
github "$repo" github-convert
statuses "$repo" "0 3" "verify's 3: the reference holds no output of this model"

say "a tampered download fails sha256sum -c, before anything is unpacked"
repo=$scratch/tampered
userrepo "$repo"
cp -R "$rel" "$tmp/good-release"
printf 'x' >>"$rel/ckpt-$version-x86_64-linux.tar.gz"
github "$repo"
check "the first step fails" test "$(cat "$repo.status")" = 1
check "nothing was unpacked" test ! -e "$repo/ckpt-$version-x86_64-linux"
rm -rf "$rel"
mv "$tmp/good-release" "$rel"
case $recipes in
*github-pip*)
    say "github-pip: a tampered wheel fails sha256sum -c, before pip runs"
    repo=$scratch/tampered-pip
    userrepo "$repo"
    printf 'x' >>"$rel/$wheel"
    github "$repo" github-pip
    check "the first step fails" test "$(cat "$repo.status")" = 1
    check "nothing was installed" test ! -e "$repo.runner/ckpt-venv"
    ;;
esac

finish
