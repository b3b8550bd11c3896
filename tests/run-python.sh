#!/bin/sh
# Runs an interop test with the Python that has torch; skips (77) without one.
if [ -z "${PYTHON:-}" ] || [ "$PYTHON" = false ]; then
    echo "no Python with torch: skipped (install python3-torch, ./bootstrap --deps)"
    exit 77
fi
exec "$PYTHON" "$@"
