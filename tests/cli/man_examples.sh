#!/bin/sh
# man_examples.sh - every example in the EXAMPLES sections of the man pages
# (man/ckpt.1, man/ckpt-<command>.1 and man/libckpt.3) runs, from the top of
# the source tree, with the ckpt under test, and does what the page says;
# every page (man/ckpt-rewrite.7 too, which has no examples, and
# man/ckpt-python.7, whose Python examples README.md runs) renders cleanly.
#
# The convention in the pages (see the comment at the top of each):
#   .Dl $ ckpt ARGS...     an example; the roff escapes \- \e \(aq \(dq \&
#                          are undone to get the shell command
#   .\" exit: N            on the line just before: the exit status it must
#                          give (0 when absent); an example that exits 0
#                          prints nothing on stderr, one that fails prints one
#                          line starting "ckpt: "
#   .Bd -literal ... .Ed   right after the .Dl line: its exact stdout
# A command whose .Dl line ends with \e (a backslash) goes on on the next .Dl
# line, as in the shell ("\ " is a space there, to indent it).
# man/libckpt.3 (the C API) also has programs:
#   .\" program: NAME.c   on the line just before a .Bd -literal block: the
#                          block is the whole C program NAME.c (escapes
#                          undone as above); it is compiled with the build
#                          tree's compiler, -std=c11 -Wall -Wextra -Wpedantic
#                          -Werror, against the libckpt.la next to $CKPT
#   .Dl $ ./NAME ARGS...   an example that runs it (as a `ckpt` one)
# and every function of lib/ckpt.h must have its entry there, `.It Ft TYPE
# Fn NAME "ARG" ...`, with the prototype the header declares.
# Examples that write files write them as /tmp/ckpt-example-*: those are
# removed before each page (so that a page does not depend on another) and at
# the end; the examples of one page run in order, so one may read what an
# earlier one wrote.  The fixtures in tests/data must come out unchanged.
# Also, when mandoc or groff is installed, the pages must render without
# warnings (neither is needed to run the test).
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir"

# every page, in the order they are checked; a missing one is a failure
pages="man/ckpt.1 man/ckpt-inspect.1 man/ckpt-strip-module.1 man/ckpt-add-module.1
man/ckpt-unwrap.1 man/ckpt-rename.1 man/ckpt-remap.1 man/ckpt-diff.1 man/ckpt-convert.1 man/ckpt-extract.1
man/ckpt-verify.1 man/ckpt-scan.1 man/libckpt.3 man/ckpt-rewrite.7 man/ckpt-python.7"

# the build tree: where the ckpt under test is, with libckpt.la and libtool
builddir=$(cd "$(dirname "$CKPT")" && pwd)

# what the examples write; removed before each page and at the end
clean_examples() {
    rm -rf /tmp/ckpt-example-* # (folders too: a model folder's OUT)
}
clean_examples
trap 'rm -rf "$tmp"; clean_examples' EXIT

# the fixtures, to check that no example changes them
fixtures_sum() {
    cksum tests/data/* | sort
}
fixtures_sum >"$tmp/fixtures.before"

# `ckpt` in the examples is the binary under test
mkdir "$tmp/bin"
ln -s "$CKPT" "$tmp/bin/ckpt"
PATH=$tmp/bin:$PATH
export PATH

# extract PAGE PREFIX: write PREFIX.N.cmd, PREFIX.N.exit and, when the page
# shows the output, PREFIX.N.out for each example N; each program NAME.c as
# PREFIX.prog.NAME.c, its name on a line of PREFIX.programs; print the count.
extract() {
    awk -v prefix="$2" '
    function unescape(s) {
        gsub(/\\e/, "\001", s)
        gsub(/\\-/, "-", s)
        gsub(/\\\(aq/, "\047", s)
        gsub(/\\\(dq/, "\"", s)
        gsub(/\\&/, "", s)
        gsub(/\\ /, " ", s)
        gsub(/\001/, "\\", s)
        return s
    }
    # the example N is complete: write its command and exit status
    function emit() {
        print cmd > (prefix "." n ".cmd")
        close(prefix "." n ".cmd")
        print want > (prefix "." n ".exit")
        close(prefix "." n ".exit")
    }
    /^\.Sh / {
        if (cont) emit()
        in_ex = ($0 ~ /^\.Sh EXAMPLES[ \t]*$/); pending = ""; after = 0; cont = 0
        next
    }
    !in_ex { next }
    inblock && /^\.Ed/ { inblock = 0; close(outfile); next }
    inblock { print unescape($0) > outfile; next }
    inprog && /^\.Ed/ { inprog = 0; close(progfile); next }
    inprog { print unescape($0) > progfile; next }
    prog != "" && /^\.Bd -literal/ { # the program named on the line above
        inprog = 1
        progfile = prefix ".prog." prog
        printf "" > progfile
        print prog > (prefix ".programs")
        prog = ""
        next
    }
    { prog = "" }
    /^\.\\" program: [A-Za-z0-9_]+\.c[ \t]*$/ { prog = $3; next }
    cont && /^\.Dl / {                # a continuation line of the command
        line = $0
        sub(/^\.Dl[ \t]+/, "", line)
        sub(/[ \t]+$/, "", line)
        cmd = cmd "\n" unescape(line)
        cont = (line ~ /\\e$/)
        if (!cont) { emit(); after = 1 }
        next
    }
    cont { cont = 0; emit() }         # a continued command ends the page text
    after && /^\.Bd -literal/ {       # the output of the example just above
        inblock = 1
        outfile = prefix "." n ".out"
        printf "" > outfile
        after = 0
        next
    }
    { after = 0 }
    /^\.\\" exit: [0-9]+[ \t]*$/ { pending = $3 + 0; next }
    /^\.Dl \$ (ckpt|\.\/[A-Za-z0-9_]+) / {
        n++
        line = $0
        sub(/^\.Dl \$ /, "", line)
        sub(/[ \t]+$/, "", line)
        cmd = unescape(line)
        want = (pending == "" ? 0 : pending)
        pending = ""
        cont = (line ~ /\\e$/)        # ends with a backslash: goes on below
        if (!cont) { emit(); after = 1 }
        next
    }
    { pending = "" }
    END { if (cont) emit(); print n + 0 }
    ' "$1"
}

# build_program NAME SRC OUT: compile the C program NAME, in the file SRC,
# into OUT as a client of libckpt would (<ckpt.h>, nothing else of lib/),
# against the libckpt.la of the build tree, with the compiler and sanitizer
# flags the tree was configured with; no warning allowed.
build_program() {
    if [ ! -f "$builddir/libckpt.la" ] || [ ! -x "$builddir/libtool" ] ||
        [ ! -f "$builddir/Makefile" ]; then
        fail "no libckpt.la, libtool and Makefile next to $CKPT: cannot build $1"
        return 0
    fi
    _cc=$(sed -n 's/^CC = //p' "$builddir/Makefile")
    _san=$(sed -n 's/^SAN_FLAGS = //p' "$builddir/Makefile")
    # shellcheck disable=SC2086 # (CC and SAN_FLAGS are lists of words)
    run "$builddir/libtool" --quiet --tag=CC --mode=link ${_cc:-cc} -std=c11 -Wall -Wextra \
        -Wpedantic -Werror $_san -I"$srcdir/lib" -o "$3" "$2" "$builddir/libckpt.la"
    if [ "$status" -eq 0 ] && [ ! -s "$out" ] && [ ! -s "$err" ] && [ -x "$3" ]; then
        ok "$1 compiles without a warning and links with libckpt"
    else
        fail "$1 does not build cleanly: $last_cmd"
        show_output
    fi
}

# header_prototypes: every function lib/ckpt.h declares, one a line, as
# "TYPE|NAME|ARG, ARG, ..." (spaces normalised, comments and # lines dropped).
header_prototypes() {
    awk '
    /^[ \t]*#/ { next }
    { text = text " " $0 }
    END {
        while ((i = index(text, "/*")) > 0) {
            rest = substr(text, i + 2)
            text = substr(text, 1, i - 1) " " substr(rest, index(rest, "*/") + 2)
        }
        n = split(text, decl, ";")
        for (k = 1; k <= n; k++) {
            d = decl[k]
            if ((i = index(d, "CKPT_API")) == 0)
                continue
            d = substr(d, i + 8)
            gsub(/[ \t]+/, " ", d)
            p = index(d, "(")
            head = substr(d, 1, p - 1)
            args = substr(d, p + 1)
            sub(/\)[ ]*$/, "", args)
            match(head, /ckpt_[A-Za-z0-9_]+[ ]*$/)
            name = substr(head, RSTART, RLENGTH)
            type = substr(head, 1, RSTART - 1)
            sub(/[ ]+$/, "", name)
            sub(/^[ ]+/, "", type)
            sub(/[ ]+$/, "", type)
            m = split(args, a, ",")
            list = ""
            for (j = 1; j <= m; j++) {
                sub(/^[ ]+/, "", a[j])
                sub(/[ ]+$/, "", a[j])
                list = list (j > 1 ? ", " : "") a[j]
            }
            print type "|" name "|" list
        }
    }' "$srcdir/lib/ckpt.h"
}

# page_prototypes PAGE: the entries `.It Ft TYPE Fn NAME ARGS...` of PAGE in
# the same form (TYPE and each ARG one word or a quoted string).
page_prototypes() {
    awk '
    # the next word or quoted string of the global s, taken off it
    function word(   w) {
        sub(/^[ \t]+/, "", s)
        if (substr(s, 1, 1) == "\"") {
            s = substr(s, 2)
            w = substr(s, 1, index(s, "\"") - 1)
            s = substr(s, index(s, "\"") + 1)
        } else {
            match(s, /^[^ \t]+/)
            w = substr(s, 1, RLENGTH)
            s = substr(s, RLENGTH + 1)
        }
        return w
    }
    /^\.It Ft / {
        s = substr($0, 8)
        type = word()
        if (word() != "Fn")
            next
        name = word()
        list = ""
        for (j = 0; s ~ /[^ \t]/; j++)
            list = list (j ? ", " : "") word()
        print type "|" name "|" list
    }' "$1"
}

total=0
npages=0
for page in $pages; do
    npages=$((npages + 1))
    say "the examples of $page"
    if [ ! -f "$page" ]; then
        fail "$page is missing"
        continue
    fi
    clean_examples
    name=$(basename "$page")
    name=${name%.[0-9]}
    count=$(extract "$page" "$tmp/$name")
    note "$count examples"
    total=$((total + count))
    mkdir -p "$tmp/prog"
    if [ -f "$tmp/$name.programs" ]; then
        while read -r prog; do
            note "the program $prog"
            build_program "$prog" "$tmp/$name.prog.$prog" "$tmp/prog/${prog%.c}"
        done <"$tmp/$name.programs"
    fi
    i=1
    while [ "$i" -le "$count" ]; do
        cmd=$(cat "$tmp/$name.$i.cmd")
        want=$(cat "$tmp/$name.$i.exit")
        printf '\n   $ %s\n' "$cmd"
        case $cmd in
        ./*) run sh -c "$tmp/prog/${cmd#./}" ;; # a program of the page
        *) run sh -c "$cmd" ;;
        esac
        last_cmd=$cmd
        if [ "$status" -ne "$want" ]; then
            fail "exit $status, the page says $want: $cmd"
            show_output
        elif [ "$want" -le 1 ] && [ -s "$err" ]; then
            fail "exit $want but stderr is not empty: $cmd"
            show_output
        elif [ "$want" -ge 2 ] && { [ "$(wc -l <"$err" | tr -d ' ')" -ne 1 ] ||
            ! grep -q '^ckpt: ' "$err"; }; then
            fail "exit $want but stderr is not one line starting 'ckpt: ': $cmd"
            show_output
        else
            ok "exit $want$([ "$want" -ge 2 ] && printf ': %s' "$(cat "$err")")"
        fi
        if [ -f "$tmp/$name.$i.out" ]; then
            if diff -u "$tmp/$name.$i.out" "$out" >"$tmp/diff"; then
                ok "stdout is the output shown in $page"
            else
                fail "stdout differs from the output shown in $page: $cmd"
                sed 's/^/   | /' "$tmp/diff"
            fi
        fi
        i=$((i + 1))
    done
done

say "man/libckpt.3 has an entry for every function of lib/ckpt.h, as declared"
header_prototypes | sort >"$tmp/protos.h"
page_prototypes man/libckpt.3 | sort >"$tmp/protos.3"
note "$(wc -l <"$tmp/protos.h" | tr -d ' ') functions in lib/ckpt.h, $(wc -l <"$tmp/protos.3" | tr -d ' ') entries in man/libckpt.3"
check "lib/ckpt.h declares functions (the header was read)" test -s "$tmp/protos.h"
if diff "$tmp/protos.h" "$tmp/protos.3" >"$tmp/diff"; then
    ok "the same functions and prototypes (TYPE|NAME|ARGS) in both"
else
    fail "lib/ckpt.h (<) and the entries of man/libckpt.3 (>) differ:"
    sed 's/^/   | /' "$tmp/diff"
fi

say "there are enough examples, and they leave the fixtures alone"
check "$total examples in the $npages pages (at least 5)" test "$total" -ge 5
fixtures_sum >"$tmp/fixtures.after"
check "the files in tests/data are unchanged" cmp -s "$tmp/fixtures.before" "$tmp/fixtures.after"

say "the pages render without warnings (with each formatter installed)"
formatters=0
if command -v mandoc >/dev/null 2>&1; then
    formatters=$((formatters + 1))
    for page in $pages; do
        [ -f "$page" ] || continue
        run mandoc -T lint -W warning "$page"
        if [ "$status" -eq 0 ] && [ ! -s "$out" ] && [ ! -s "$err" ]; then
            ok "mandoc -T lint -W warning $page"
        else
            fail "mandoc -T lint -W warning $page"
            show_output
        fi
    done
fi
if command -v groff >/dev/null 2>&1; then
    formatters=$((formatters + 1))
    for page in $pages; do
        [ -f "$page" ] || continue
        run groff -ww -mandoc -z "$page"
        if [ "$status" -eq 0 ] && [ ! -s "$err" ]; then
            ok "groff -ww -mandoc -z $page"
        else
            fail "groff -ww -mandoc -z $page"
            show_output
        fi
    done
fi
[ "$formatters" -gt 0 ] || note "neither mandoc nor groff is installed: not checked"

finish
