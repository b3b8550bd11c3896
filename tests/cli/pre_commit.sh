#!/bin/sh
# pre_commit.sh - the hook of .pre-commit-hooks.yaml (README.md, "A
# pre-commit hook"), run by `pre-commit try-repo` as a user would try it:
# a scratch git repository outside the source tree, holding the safe
# fixtures of tests/data and the unsafe ones of tests/bad/scan
# (expected.json's list; its plain pickles saved as .pt, a name the hook
# looks at and torch.load reads).  `ckpt-scan` passes the safe files, fails
# on each unsafe one alone, and leaves files of other names alone.  The
# hook is `language: system`: the ckpt under test is put on PATH.
# pre-commit comes from PRE_COMMIT, PATH or /opt/ckpt/pre-commit
# (CKPT_PRE_COMMIT_VENV; ./bootstrap --deps installs it there); skipped
# without it.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

pc=${PRE_COMMIT:-}
[ -n "$pc" ] || pc=$(command -v pre-commit 2>/dev/null) ||
    pc=${CKPT_PRE_COMMIT_VENV:-/opt/ckpt/pre-commit}/bin/pre-commit
[ -x "$pc" ] || skip "no pre-commit (pip install pre-commit, or ./bootstrap --deps)"
command -v git >/dev/null 2>&1 || skip "no git"
have_python || skip "no python3 to read tests/bad/scan/expected.json"
note "$("$pc" --version)"

scratch=$(mktemp -d /tmp/ckpt-pre-commit.XXXXXX)
trap 'rm -rf "$tmp" "$scratch"' EXIT
mkdir "$tmp/bin"
ln -s "$CKPT" "$tmp/bin/ckpt"
PATH=$tmp/bin:$PATH
PRE_COMMIT_HOME=$tmp/pre-commit-cache
GIT_AUTHOR_NAME=test GIT_AUTHOR_EMAIL=test@example.org
GIT_COMMITTER_NAME=test GIT_COMMITTER_EMAIL=test@example.org
export PATH PRE_COMMIT_HOME GIT_AUTHOR_NAME GIT_AUTHOR_EMAIL GIT_COMMITTER_NAME GIT_COMMITTER_EMAIL

# the hook's repository: .pre-commit-hooks.yaml alone, committed (try-repo
# clones it; the source tree need not be a git checkout)
hooks=$scratch/hooks
mkdir "$hooks"
git -C "$hooks" init -q
cp "$srcdir/.pre-commit-hooks.yaml" "$hooks/"
git -C "$hooks" add .pre-commit-hooks.yaml
git -C "$hooks" commit -qm hooks

# the user's repository
repo=$scratch/repo
mkdir -p "$repo/safe" "$repo/unsafe"
git -C "$repo" init -q
cp "$data"/*.pth "$repo/safe/"
python3 -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))))' \
    "$bad/scan/expected.json" >"$tmp/unsafe"
while IFS= read -r f; do
    case $f in
    *.pkl) cp "$bad/scan/$f" "$repo/unsafe/${f%.pkl}.pt" ;;
    *) cp "$bad/scan/$f" "$repo/unsafe/$f" ;;
    esac
done <"$tmp/unsafe"
printf 'not a checkpoint\n' >"$repo/notes.txt"
git -C "$repo" add -A
cd "$repo"

# try FILE...: pre-commit try-repo with the hook on FILE...
try() {
    run "$pc" try-repo "$hooks" ckpt-scan --files "$@"
    last_cmd="pre-commit try-repo HOOKS ckpt-scan --files $*"
}

say "the safe checkpoints of tests/data pass"
# shellcheck disable=SC2046 # (file names without spaces)
try $(cd "$repo" && ls safe/*.pth)
expect_status 0
check "the hook ran on them (Passed)" grep -q '^ckpt scan (checkpoints safe to torch.load)\.*Passed$' "$out"
nsafe=$(find safe -name '*.pth' | wc -l | tr -d ' ')
note "$nsafe files"

say "each unsafe fixture of tests/bad/scan fails the hook"
n=0
for f in unsafe/*; do
    n=$((n + 1))
    try "$f"
    if [ "$status" -eq 1 ] && grep -q '\.*Failed$' "$out" && grep -q 'exit code: 1$' "$out"; then
        ok "$f: Failed, ckpt scan's exit code 1"
    else
        fail "$f: exit $status, expected the hook to fail with ckpt scan's exit code 1"
        show_output
    fi
done
check "all $(wc -l <"$tmp/unsafe" | tr -d ' ') fixtures of expected.json were tried" \
    test "$n" -eq "$(wc -l <"$tmp/unsafe" | tr -d ' ')"

say "a safe and an unsafe file together: the hook fails"
try safe/mlp.pth unsafe/sys.exit.pt
expect_status 1

say "a file of another name is not the hook's: skipped"
try notes.txt
expect_status 0
check "the hook reports no files to check" grep -q 'no files to check)Skipped$' "$out"

finish
