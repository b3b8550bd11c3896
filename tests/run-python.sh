#!/bin/sh
# Runs an interop test under each torch there is: Debian's 1.13 ($PYTHON) and
# current torch 2.x from PyPI ($PYTHON2, from ./bootstrap --deps).  Each run
# prints the torch it ran under.  The test fails when a run fails, and is
# skipped (77) only when every run is.
# .ci/run's sanitizer pass (CKPT_SANITIZER_PASS=1) leaves out the tests whose
# work is torch.export of transformers in Python: the C paths they reach run
# in check_runtime's op cases there.
if [ -n "${CKPT_SANITIZER_PASS:-}" ]; then
    case $1 in
    */spec_transformers.py | */verify_layouts.py | */verify_hf.py)
        echo "left out of the sanitizer pass: torch.export in Python; its C paths are check_runtime's op cases"
        exit 77 ;;
    esac
fi
# The sanitizer pass runs each of the others under one torch, torch 2.x
# first (the next only where that one skips): a second torch reaches the
# same C paths but for the few records each version writes, which the main
# pass reads under both.
first=${PYTHON:-} second=${PYTHON2:-}
if [ -n "${CKPT_SANITIZER_PASS:-}" ]; then first=${PYTHON2:-} second=${PYTHON:-}; fi
status=77
ran=0
for py in "$first" "$second"; do
    [ -n "$py" ] && [ "$py" != false ] || continue
    [ -n "${CKPT_SANITIZER_PASS:-}" ] && [ "$status" != 77 ] && break
    ran=1
    echo "==== $("$py" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null ||
        echo "no torch") ($py): $*"
    "$py" "$@"
    rc=$?
    case $rc in
    0) [ "$status" = 77 ] && status=0 ;;
    77) ;;
    *) status=1 ;;
    esac
done
if [ "$ran" = 0 ]; then
    echo "no Python with torch: skipped (install python3-torch, ./bootstrap --deps)"
fi
exit $status
