#!/bin/sh
# man_examples.sh - every example in the EXAMPLES sections of the man pages
# (man/ckpt.1 and man/ckpt-<command>.1) runs, from the top of the source tree,
# with the ckpt under test, and does what the page says.
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
man/ckpt-unwrap.1 man/ckpt-rename.1 man/ckpt-remap.1 man/ckpt-diff.1 man/ckpt-convert.1
man/ckpt-verify.1 man/ckpt-scan.1"

# what the examples write; removed before each page and at the end
clean_examples() {
    rm -f /tmp/ckpt-example-*
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
# shows the output, PREFIX.N.out for each example N; print the count.
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
    /^\.Dl \$ ckpt / {
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
    name=$(basename "$page" .1)
    count=$(extract "$page" "$tmp/$name")
    note "$count examples"
    total=$((total + count))
    i=1
    while [ "$i" -le "$count" ]; do
        cmd=$(cat "$tmp/$name.$i.cmd")
        want=$(cat "$tmp/$name.$i.exit")
        printf '\n   $ %s\n' "$cmd"
        run sh -c "$cmd"
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
