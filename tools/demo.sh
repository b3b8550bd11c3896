#!/bin/sh
# demo.sh - `make demo`: the story of README's quick start, each command
# shown ("$ ...") before it runs.  A Fashion-MNIST classifier saved from
# nn.DataParallel on cuda:0: what is in it, why it does not load here, the
# fix in one command (keys and device tags), the proof that the fixed
# weights compute what PyTorch computed, then an autoencoder and the
# article's model-parallel autoencoder (encoder on cuda:0, decoder on
# cuda:1; PyTorch trains it on the CPU for a few steps), remapped with
# `ckpt remap`; it ends with plain torch.load of the fixed files on this
# machine.  The outputs stay in a folder it names.
#
# Environment (make demo sets the first three):
#   CKPT      the ckpt to run (default: ./ckpt)
#   PYTHON    a Python with torch (1.13 or 2.x) for the training; "false" or
#             empty: the parts that need torch are skipped
#   PYTHON2   a Python with torch 2.x, whose plain torch.load(f) is the
#             weights-only one, for the loads (default: PYTHON)
#   DEMO_DIR  the folder for the outputs (default: a new
#             ${TMPDIR:-/tmp}/ckpt-demo.XXXXXX); kept
# tests/cli/demo.sh runs it and compares what it prints with README.md's
# transcript.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
CKPT=${CKPT:-./ckpt}
case $CKPT in /*) ;; *) CKPT=$(pwd)/$CKPT ;; esac
PYTHON=${PYTHON:-false}
PYTHON2=${PYTHON2:-$PYTHON}
[ "$PYTHON2" != false ] || PYTHON2=$PYTHON
if [ -n "${DEMO_DIR:-}" ]; then
    d=$DEMO_DIR
    mkdir -p "$d"
else
    d=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-demo.XXXXXX")
fi
cd "$top" # the commands read tests/data and models/ as README's examples do

# shown ARG: ARG as a shell would need it typed (quoted when it must be).
shown() {
    case $1 in
    *[!A-Za-z0-9_./:=+,@%-]* | '') printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")" ;;
    *) printf '%s' "$1" ;;
    esac
}

# say_cmd CMD ARGS...: print "$ CMD ARGS" (ckpt for $CKPT).
say_cmd() {
    _line='$'
    for _a in "$@"; do
        if [ "$_a" = "$CKPT" ]; then _a=ckpt; fi
        _line="$_line $(shown "$_a")"
    done
    printf '%s\n' "$_line"
}

# show WANT CMD ARGS...: print the command, run it, and stop the demo
# unless it exits WANT.
show() {
    _want=$1
    shift
    say_cmd "$@"
    _rc=0
    "$@" || _rc=$?
    if [ "$_rc" -ne "$_want" ]; then
        echo "demo: that exited $_rc, not $_want" >&2
        exit 1
    fi
}

# show_last CMD ARGS...: print the command, run it, and print only the last
# line of what it prints (a traceback's message), whatever it exits.
show_last() {
    say_cmd "$@"
    { "$@" 2>&1 || :; } | tail -n 1
}

step() {
    printf '\n== %s\n' "$*"
}

# the torch.load a user types: no map_location, no weights_only (torch 2.x:
# the weights-only unpickler)
load='import sys, torch; sd = torch.load(sys.argv[1]); print(len(sd), "tensors on", *sorted({str(t.device) for t in sd.values()}))'

echo "ckpt demo: the outputs go to $d (kept)"

step "1. ckpt inspect: an MLP saved from nn.DataParallel on cuda:0"
show 0 "$CKPT" inspect tests/data/fmnist_mlp_dp.pth

if [ "$PYTHON2" != false ]; then
    step "2. plain torch.load on this machine (the last line of what it prints)"
    show_last "$PYTHON2" -c "$load" tests/data/fmnist_mlp_dp.pth
fi

step "3. ckpt verify: ckpt's own check of the keys against the plain model (in load_state_dict's words), and the fix"
show 1 "$CKPT" verify --model models/mnist_mlp.json tests/data/fmnist_mlp_dp.pth

step "4. the fix, in one command: the keys, and the device tags for this machine"
show 0 "$CKPT" strip-module --map-location cpu tests/data/fmnist_mlp_dp.pth "$d/fmnist_mlp.pth"

step "5. ckpt verify: the fixed weights against PyTorch's outputs on 256 test images"
show 0 "$CKPT" verify --model models/mnist_mlp.json --reference tests/data/fmnist_mlp.ref.pth \
    "$d/fmnist_mlp.pth"

step "6. the autoencoder, unwrapped and verified the same way"
show 0 "$CKPT" unwrap --map-location cpu tests/data/fmnist_ae_dp.pth "$d/fmnist_ae.pth"
show 0 "$CKPT" verify --model models/mnist_conv_autoencoder.json \
    --reference tests/data/fmnist_ae.ref.pth "$d/fmnist_ae.pth"

step "7. the model-parallel autoencoder: encoder on cuda:0, decoder on cuda:1"
if [ "$PYTHON" = false ]; then
    echo "skipped: no Python with torch (./bootstrap --deps)"
    echo
    echo "The outputs are in $d."
    exit 0
fi
echo "(trained here on the CPU by PyTorch, saved as the two-GPU run and as DataParallel save it)"
show 0 "$PYTHON" tests/fixtures/make_mp_ae_fixtures.py "$d"
show 0 "$CKPT" inspect "$d/mp_ae.pth"
show 0 "$CKPT" verify --model models/mnist_autoencoder.json --reference "$d/mp_ae.ref.pth" \
    "$d/mp_ae.pth"
echo "(ckpt remap: the storages of both GPUs to the cpu, data copied untouched)"
show 0 "$CKPT" remap --to cpu "$d/mp_ae.pth" "$d/mp_ae_cpu.pth"

step "8. the same weights through nn.DataParallel: every key under module., all on cuda:0"
show 1 "$CKPT" verify --model models/mnist_autoencoder.json "$d/mp_ae_dp.pth"
show 0 "$CKPT" strip-module --map-location cpu "$d/mp_ae_dp.pth" "$d/mp_ae_dp_stripped.pth"
show 0 "$CKPT" verify --model models/mnist_autoencoder.json --reference "$d/mp_ae.ref.pth" \
    "$d/mp_ae_dp_stripped.pth"

step "9. plain torch.load of the fixed files, on this machine"
for f in fmnist_mlp fmnist_ae mp_ae_cpu mp_ae_dp_stripped; do
    show 0 "$PYTHON2" -c "$load" "$d/$f.pth"
done

echo
echo "The outputs are in $d."
