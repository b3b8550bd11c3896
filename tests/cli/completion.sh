#!/bin/sh
# completion.sh - the shell completions of completions/ (bash, zsh, fish):
# the ones tools/make-completions writes from this ckpt's --help texts,
# each read by its shell, each completing commands, options, option values
# and files as a user types them; `make install` puts them where the shells
# look.  zsh and fish are checked where they are installed (bash always).
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"
comp=$srcdir/completions

say "completions/ is what tools/make-completions writes from this ckpt's --help"
if have_python; then
    expect_exit 0 python3 tools/make-completions "$CKPT" "$tmp/gen"
    for f in ckpt _ckpt ckpt.fish; do
        if cmp -s "$tmp/gen/$f" "$comp/$f"; then
            ok "completions/$f is current"
        else
            fail "completions/$f is not what tools/make-completions writes now: run" \
                "'tools/make-completions ./ckpt completions'"
            diff "$comp/$f" "$tmp/gen/$f" | sed -n '1,20s/^/   | /p'
        fi
    done
else
    note "python3 is not here: the scripts are not compared with a fresh run"
fi

# a folder to complete file names in
mkdir "$tmp/work"
: >"$tmp/work/model.pth"
: >"$tmp/work/spec.json"
mkdir "$tmp/work/shards"

# ---------------------------------------------------------------------------
say "bash: the script parses, and completes"
check "bash -n completions/ckpt" bash -n "$comp/ckpt"
# bash_complete WORD...: COMPREPLY, one a line, for the command line WORD...
# (the last word the one being completed), as bash's programmable completion
# calls _ckpt; in $tmp/work.
bash_complete() {
    (cd "$tmp/work" && bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
        _ckpt; printf "%s\n" "${COMPREPLY[@]}"' bash "$comp/ckpt" "$@")
}
# expect_bash WANT WORD...: bash completes WORD... to WANT (words, sorted,
# space-separated; '' for none).
expect_bash() {
    _want=$1
    shift
    _got=$(bash_complete "$@" | sort | tr '\n' ' ' | sed 's/ $//')
    if [ "$_got" = "$_want" ]; then
        ok "bash: '$*<TAB>' -> '$_want'"
    else
        fail "bash: '$*<TAB>' gives '$_got', expected '$_want'"
    fi
}
expect_bash strip-module ckpt str
expect_bash --shard-size ckpt convert --sh
expect_bash 'diff' ckpt di
expect_bash 'diff' ckpt help di
expect_bash 'safetensors' ckpt convert --to s
expect_bash 'safetensors' ckpt convert --to = s
expect_bash 'pth pth-legacy safetensors' ckpt unwrap --to ''
expect_bash 'pth safetensors' ckpt extract --to ''
expect_bash 'auto cpu cuda' ckpt verify --device ''
expect_bash 'float16' ckpt convert --dtype float1
expect_bash '--json' ckpt inspect --js
expect_bash '--quiet' ckpt scan --q
expect_bash '--help --version -V -h' ckpt -
expect_bash 'model.pth' ckpt inspect mo
expect_bash 'model.pth' ckpt diff model.pth mo
expect_bash 'spec.json' ckpt verify --model sp
expect_bash 'shards' ckpt scan sh
note "an option's value that cannot be listed: nothing offered"
expect_bash '' ckpt inspect --filter ''
expect_bash '' ckpt rename -e ''
note "every option of every command's --help is offered after '-'"
ckpt --help
commands=$(sed -n '/^commands:$/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p' "$out")
for c in $commands; do
    ckpt "$c" --help
    want=$(awk '/^  -/ { line = substr($0, 3); gap = index(line, "  ")
        if (gap) line = substr(line, 1, gap - 1)
        n = split(line, w, /[ ,]+/)
        for (i = 1; i <= n; i++) if (w[i] ~ /^--?[A-Za-z][A-Za-z0-9-]*$/) print w[i] }' "$out" |
        sort -u | tr '\n' ' ' | sed 's/ $//')
    expect_bash "$want" ckpt "$c" -
done

# ---------------------------------------------------------------------------
say "zsh: the script parses, and completes (typed into an interactive zsh)"
if command -v zsh >/dev/null 2>&1; then
    check "zsh -n completions/_ckpt" zsh -n "$comp/_ckpt"
    check "its first line is '#compdef ckpt'" test "$(sed -n 1p "$comp/_ckpt")" = "#compdef ckpt"
    # Each line typed, then Tab, then ^T: a widget that writes the line as
    # completion left it to $tmp/zsh.lines.  zle reads the keys in order, so
    # each line is whole before the next; the script waits for all.
    cat >"$tmp/zsh-typed" <<'EOF'
ckpt str
ckpt convert --sh
ckpt convert --to s
ckpt inspect mo
ckpt help dif
ckpt verify --model sp
EOF
    n=$(wc -l <"$tmp/zsh-typed" | tr -d ' ')
    cat >"$tmp/zsh-drive" <<'EOF'
zmodload zsh/zpty || exit 2
comp=$1 work=$2 typed=$3 lines=$4 n=$5
zpty z zsh -f -i
zpty -w z "fpath=(${(q)comp} \$fpath); autoload -Uz compinit; compinit -u -D; cd ${(q)work}"
zpty -w z "dump() { print -r -- \"\$BUFFER\" >>${(q)lines}; BUFFER=; }; zle -N dump; bindkey '^T' dump"
while IFS= read -r l; do
    zpty -w -n z "$l"$'\t\C-t'
done <$typed
for i in {1..100}; do
    [[ -f $lines && $(wc -l <$lines) -ge $n ]] && break
    zpty -r -t z junk  # keep the terminal drained
    sleep 0.1
done
zpty -d z
EOF
    (cd "$tmp/work" && zsh -f "$tmp/zsh-drive" "$comp" "$tmp/work" "$tmp/zsh-typed" \
        "$tmp/zsh.lines" "$n") >/dev/null 2>&1 || true
    printf '%s\n' 'ckpt strip-module ' 'ckpt convert --shard-size=' 'ckpt convert --to safetensors ' \
        'ckpt inspect model.pth ' 'ckpt help diff ' 'ckpt verify --model spec.json ' >"$tmp/zsh.want"
    if cmp -s "$tmp/zsh.want" "$tmp/zsh.lines"; then
        ok "zsh completes: $(tr '\n' '|' <"$tmp/zsh.lines")"
    else
        fail "zsh: the lines after Tab are not as expected"
        echo "   typed:"
        sed 's/^/   | /' "$tmp/zsh-typed"
        echo "   got:"
        sed 's/^/   | /' "$tmp/zsh.lines" 2>/dev/null || true
    fi
else
    note "zsh is not installed: completions/_ckpt not checked"
fi

# ---------------------------------------------------------------------------
say "fish: the script parses, and completes (complete -C)"
if command -v fish >/dev/null 2>&1; then
    check "fish -n completions/ckpt.fish" fish -n "$comp/ckpt.fish"
    # expect_fish WANT LINE: fish completes LINE to the words WANT (sorted,
    # space-separated), descriptions aside
    expect_fish() {
        _got=$(cd "$tmp/work" && fish -N -c "source '$comp/ckpt.fish'; complete -C '$2'" |
            cut -f1 | sort | tr '\n' ' ' | sed 's/ $//')
        if [ "$_got" = "$1" ]; then
            ok "fish: '$2<TAB>' -> '$1'"
        else
            fail "fish: '$2<TAB>' gives '$_got', expected '$1'"
        fi
    }
    expect_fish strip-module 'ckpt str'
    expect_fish --shard-size 'ckpt convert --sh'
    expect_fish safetensors 'ckpt convert --to s'
    expect_fish 'auto cpu cuda' 'ckpt verify --device '
    expect_fish model.pth 'ckpt inspect mo'
    expect_fish spec.json 'ckpt verify --model sp'
    expect_fish diff 'ckpt help di'
    expect_fish '--quiet' 'ckpt scan --q'
else
    note "fish is not installed: completions/ckpt.fish not checked"
fi

# ---------------------------------------------------------------------------
say "make install puts them where bash-completion, zsh and fish look"
builddir=$(dirname "$CKPT")
make=${MAKE:-make}
if [ -f "$builddir/Makefile" ] && command -v "$make" >/dev/null 2>&1; then
    # make install's own targets for them, run; the whole of it only shown
    # (-n): a real one would rebuild what is out of date under the other tests
    expect_exit 0 "$make" -s -C "$builddir" install-dist_bashcompDATA install-dist_zshcompDATA \
        install-dist_fishcompDATA DESTDIR="$tmp/root"
    for f in bash-completion/completions/ckpt zsh/site-functions/_ckpt \
        fish/vendor_completions.d/ckpt.fish; do
        got=$(find "$tmp/root" -path "*/share/$f" -type f)
        if [ -n "$got" ] && cmp -s "$got" "$comp/${f##*/}"; then
            ok "installed as ${got#"$tmp/root"}"
        else
            fail "no */share/$f under DESTDIR, or not completions/${f##*/}"
        fi
    done
    expect_exit 0 "$make" -n -C "$builddir" install DESTDIR="$tmp/root"
    for f in bash-completion/completions/ckpt zsh/site-functions/_ckpt \
        fish/vendor_completions.d/ckpt.fish; do
        check "make install installs completions/${f##*/} in share/${f%/*}" \
            sh -c "grep -q \"list='completions/${f##*/}'\" '$out' && grep -q '/share/${f%/*}' '$out'"
    done
else
    note "no build tree beside $CKPT: make install not tried"
fi

finish
