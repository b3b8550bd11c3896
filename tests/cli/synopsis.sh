#!/bin/sh
# synopsis.sh - every option that exists is documented, everywhere: for each
# command of `ckpt --help`, the options the command accepts (each option
# named in src/ tried on it, and every letter as a short option), the
# option list of `ckpt CMD --help`, the SYNOPSIS of its page ckpt-CMD.1 and
# its entry in ckpt(1)'s SYNOPSIS are one set.  Nothing here names a command
# or an option except the few that a command parses only to refuse.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"

# help_options: the options of a --help text (stdin), one a line, sorted: the
# words that start with '-' in the first column of the lines that start
# "  -" ("  -e, --expression RULE  a rule"; the common options' lines, which
# have no second column).
help_options() {
    awk '/^  -/ {
        line = substr($0, 3)
        gap = index(line, "  ")
        if (gap) line = substr(line, 1, gap - 1)
        n = split(line, w, /[ ,]+/)
        for (i = 1; i <= n; i++)
            if (w[i] ~ /^--?[A-Za-z][A-Za-z0-9-]*$/) print w[i]
    }' | sort -u
}

# synopsis_options PAGE: the SYNOPSIS of the mdoc PAGE as "KEY OPTION" lines:
# KEY is the command of the block (.Nm then .Cm NAME; "-" for a block of
# ckpt alone), or "common-options" after a .Pp (ckpt(1) spells them out once
# there); OPTION is what each Fl renders (Fl \-json: --json, Fl q: -q),
# @common where the block names Ar common-options, or @block where it begins.
synopsis_options() {
    awk '/^\.Sh / { syn = ($0 ~ /^\.Sh SYNOPSIS/); next }
    !syn { next }
    /^\.Nm/ { key = "-"; fresh = 1; next }
    /^\.Pp/ { key = "common-options"; fresh = 0; next }
    fresh && /^\.Cm / { key = $2; fresh = 0; print key, "@block"; next }
    { fresh = 0
      line = $0
      gsub(/\\-/, "-", line)
      n = split(line, w, / +/)
      for (i = 1; i < n; i++)
          if (w[i] == ".Fl" || w[i] == "Fl") print key, "-" w[i + 1]
      if (line ~ /Ar common-options/) print key, "@common" }' "$1"
}

# block_options PAGE KEY: the options of KEY's blocks in PAGE, sorted; with
# EXPAND=yes, @common replaced by PAGE's common-options.
block_options() {
    synopsis_options "$1" >"$tmp/syn"
    awk -v k="$2" '$1 == k { print $2 }' "$tmp/syn" >"$tmp/block"
    if [ "${EXPAND:-no}" = yes ] && grep -qx @common "$tmp/block"; then
        awk '$1 == "common-options" { print $2 }' "$tmp/syn" >>"$tmp/block"
    fi
    grep -v '^@' "$tmp/block" | sort -u
}

# same_set WHAT A B: the sets A and B (sorted lines) are equal; else name
# what is in one and not the other.
same_set() {
    if [ "$2" = "$3" ]; then
        ok "$1: $(printf '%s\n' "$2" | tr '\n' ' ')"
        return
    fi
    printf '%s\n' "$2" >"$tmp/a"
    printf '%s\n' "$3" >"$tmp/b"
    fail "$1: only in the first: $(comm -23 "$tmp/a" "$tmp/b" | tr '\n' ' ')| only in the second: $(comm -13 "$tmp/a" "$tmp/b" | tr '\n' ' ')"
}

# ---------------------------------------------------------------------------
say "the commands: those of 'ckpt --help', each with a man page"
ckpt --help
cp "$out" "$tmp/top-help"
commands=$(sed -n '/^commands:$/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p' "$tmp/top-help")
check "ckpt --help lists commands: $(printf '%s\n' "$commands" | tr '\n' ' ')" test -n "$commands"
for c in $commands; do
    check "man/ckpt-$c.1 exists" test -f "man/ckpt-$c.1"
done
syn_commands=$(synopsis_options man/ckpt.1 | awk '$1 != "-" && $1 != "common-options" { print $1 }' | sort -u)
same_set "the commands of ckpt --help (and help) vs those of ckpt(1)'s SYNOPSIS" \
    "$(printf '%s\n' "$commands" help | sort -u)" "$syn_commands"

say "ckpt(1)'s SYNOPSIS: ckpt's own options, and the common options of 'ckpt --help'"
same_set "ckpt(1): ckpt's own options" "$(printf '%s\n' --help --version -V -h | sort)" \
    "$(block_options man/ckpt.1 -)"
same_set "common options: 'ckpt --help' vs ckpt(1)'s common-options" \
    "$(help_options <"$tmp/top-help")" "$(block_options man/ckpt.1 common-options)"

# ---------------------------------------------------------------------------
# (printf, not echo: bash's echo takes -e and -n for its own options)
# Options a command parses only to refuse, with the message; each is checked
# to be refused still (so that this list cannot hide a real option).
refused() {
    case $1 in
    scan) echo "--allow-global --allow-unknown" ;;
    remap) echo "--select --map-location" ;;
    esac
}
say "the options a command parses only to refuse are refused"
expect_exit 2 ckpt scan --allow-global a.b "$data/mlp.pth"
expect_stderr_prefix "ckpt: scan: --allow-global and --allow-unknown do not apply"
expect_exit 2 ckpt scan --allow-unknown "$data/mlp.pth"
expect_stderr_prefix "ckpt: scan: --allow-global and --allow-unknown do not apply"
expect_exit 2 ckpt remap --to cpu --select a "$data/mlp.pth" "$tmp/o.pth"
expect_stderr_prefix "ckpt: remap: --select does not apply"
expect_exit 2 ckpt remap --to cpu --map-location cpu "$data/mlp.pth" "$tmp/o.pth"
expect_stderr_prefix "ckpt: remap: --map-location is for the other rewrites"
check "nothing written" test ! -e "$tmp/o.pth"

# Every long option named in a getopt table of src/, and every letter.
candidates=
ls src/*.c >/dev/null 2>&1 &&
    candidates=$( (sed -n 's/.*{"\([a-z][a-z0-9-]*\)", *[a-z]*_argument.*/--\1/p' \
    src/*.c src/*.h
    for l in a b c d e f g h i j k l m n o p q r s t u v w x y z \
        A B C D E F G H I J K L M N O P Q R S T U V W X Y Z; do printf -- '-%s\n' "$l"; done) | sort -u)

# accepted CMD HELP: the candidates that CMD accepts: all but those it calls
# unknown (alone, with no file, no option reaches the work) and those it
# refuses (above).  getopt_long takes an unambiguous abbreviation, so a
# candidate that begins another accepted one (--map of --map-location) is
# that one, unless HELP (the command's list) names it.
accepted() {
    for o in $candidates; do
        case " $(refused "$1") " in *" $o "*) continue ;; esac
        "$CKPT" "$1" "$o" >/dev/null 2>"$tmp/probe" || true
        grep -q "unknown option" "$tmp/probe" || printf '%s\n' "$o"
    done | sort -u >"$tmp/accepted"
    # shellcheck disable=SC2094 # (it is only read here)
    while read -r o; do
        if printf '%s\n' "$2" | grep -qx -- "$o" || ! grep -q -- "^$o." "$tmp/accepted"; then
            printf '%s\n' "$o"
        fi
    done <"$tmp/accepted"
}

for c in $commands; do
    say "ckpt $c: what it accepts = its --help = ckpt-$c.1's SYNOPSIS = its entry in ckpt(1)"
    expect_exit 0 ckpt "$c" --help
    h=$(help_options <"$out")
    if [ -n "$candidates" ]; then
        same_set "accepted vs 'ckpt $c --help'" "$(accepted "$c" "$h")" "$h"
    else
        note "no src/ here: what ckpt $c accepts is not probed"
    fi
    same_set "'ckpt $c --help' vs ckpt-$c.1" "$h" "$(block_options "man/ckpt-$c.1" "$c")"
    same_set "'ckpt $c --help' vs ckpt(1)" "$h" "$(EXPAND=yes block_options man/ckpt.1 "$c")"
    for o in $(refused "$c"); do
        check "$o (refused) is in no list" sh -c "! printf '%s\n' '$h' | grep -qx -- '$o'"
    done
done

finish
