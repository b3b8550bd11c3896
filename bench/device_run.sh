#!/bin/bash
# bench/device_run.sh - the checks and benchmarks of a lent GPU machine, as one
# script (the lease is short: 15 minutes a session, the machine's start
# included).  Run there from the repository root, with the kit of
# bench/device_kit.sh carried beside the tree:
#
#   OUT=DIR bash bench/device_run.sh [KIT] [STEPS]
#
# STEPS (default all, in this order): tests (the CUDA unit tests, then every op
# case of tests/data/ops verified on cuda:0 against torch's outputs), portable
# (the portable folder's own CUDA module found and used), wheel (the release's
# wheel, pip install --target with python3 (torch's venv): its own CUDA module,
# cuBLAS and cuDNN found in torch's NVIDIA pip packages), pipcuda (the same
# wheel with the system's cuBLAS and cuDNN hidden: only the pip packages'
# are there to find), threads (the CPU
# backend on 1, 2, 4, 8 and 16 threads: the same bits, and the time of each),
# pairs (1 thread against 2 on one core's two hardware threads and on two
# cores, taskset),
# bench (bench_device.py: GPU and many-core rows), memcheck (compute-sanitizer over
# check_runtime_cuda).
# Every step writes its log to $OUT (seven files at most: a lease brings back
# eight) and the script goes on after a failure: one lease should bring back
# every answer it can.
set -u
kit=${1:-.dev}
steps=${2:-tests,portable,wheel,pipcuda,threads,pairs,bench,memcheck}
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
top=$(pwd)
kit=$(cd "$kit" && pwd)
export LD_LIBRARY_PATH=$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CKPT_CUDA_MODULE=$kit/lib/libckpt_cuda.so
export PYTHONUNBUFFERED=1
ckpt=$kit/bin/ckpt
t0=$SECONDS
say() { printf '== %s (%ds)\n' "$*" $((SECONDS - t0)); }
has() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }

say "machine"
{
    cat "$kit/REVISION"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nproc
    grep -m1 'model name' /proc/cpuinfo
    grep PRETTY_NAME /etc/os-release
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "cudnn", torch.backends.cudnn.version(), "threads", torch.get_num_threads())'
    "$ckpt" --version
} 2>&1 | tee "$out/summary.txt"

if has tests; then
    say "check_cuda"
    timeout 120 "$kit/bin/check_cuda" >"$out/check_cuda.log" 2>&1
    echo "check_cuda rc=$?" | tee -a "$out/summary.txt"
    tail -3 "$out/check_cuda.log"
    say "check_runtime_cuda"
    timeout 150 "$kit/bin/check_runtime_cuda" >"$out/check_runtime_cuda.log" 2>&1
    echo "check_runtime_cuda rc=$?" | tee -a "$out/summary.txt"
    grep -E -i 'fail|error|cudnn|cases' "$out/check_runtime_cuda.log" | head -40
    tail -3 "$out/check_runtime_cuda.log"
    if [ "${OPS:-1}" = 1 ]; then # OPS=0: the op cases and replicas left out (a short lease)
        say "op cases verified on cuda:0"
        # eight at a time: each process pays the CUDA context's start
        ls tests/data/ops/*.json | sed 's/\.json$//' | xargs -P 8 -I{} sh -c \
            'timeout 60 "$0" verify --device cuda:0 --select params --model {}.json \
                --reference {}.pth {}.pth >/tmp/op.$$.txt 2>&1 && echo "pass {}" ||
                { echo "fail {}"; sed "s|^|  |" /tmp/op.$$.txt; }; rm -f /tmp/op.$$.txt' \
            "$ckpt" >"$out/ops.log"
        pass=$(grep -c '^pass' "$out/ops.log")
        fail=$(grep -c '^fail' "$out/ops.log")
        echo "op cases on cuda:0: $pass passed, $fail failed" | tee -a "$out/summary.txt"
        grep -v '^pass' "$out/ops.log" | head -60
        say "verify.sh's models on cuda:0"
        for m in "models/mnist_mlp.json tests/data/fmnist_mlp.pth" \
            "models/mnist_conv_autoencoder.json tests/data/fmnist_ae.pth"; do
            set -- $m
            "$ckpt" verify --device cuda:0 --replicas 2 --model "$1" "$2" 2>&1 | tail -4
        done | tee -a "$out/summary.txt"
    fi
    say "the convolutions through cuDNN and without, strict FP32 and --tf32, against torch"
    # the device line names the path: "cuDNN 9.x.y" or "no cuDNN: why"
    ae="--model models/mnist_conv_autoencoder.json --reference tests/data/fmnist_ae.ref.pth"
    for v in "" "--tf32"; do
        for cudnn in "" off; do
            echo "-- CKPT_CUDNN=${cudnn:-unset} ${v:-strict FP32}"
            CKPT_CUDNN=$cudnn "$ckpt" verify --device cuda:0 $v $ae tests/data/fmnist_ae.pth 2>&1 |
                grep -E '^(device|note|output|result)'
        done
    done | tee -a "$out/summary.txt"
fi

if has portable; then
    say "portable folder"
    p=/tmp/ckpt-portable
    rm -rf "$p"
    mkdir -p "$p"
    tar xzf "$kit"/ckpt-*-x86_64-linux.tar.gz -C "$p" && (
        cd "$p"/ckpt-*-x86_64-linux || exit 1
        unset LD_LIBRARY_PATH CKPT_CUDA_MODULE
        bin/ckpt --version
        bin/ckpt verify --device cuda --model "$top/models/mnist_mlp.json" \
            "$top/tests/data/fmnist_mlp.pth"
        echo "portable verify on cuda rc=$?"
    ) 2>&1 | tee -a "$out/summary.txt" | tail -12
fi

if has wheel; then
    say "the wheel: its own CUDA module, cuBLAS and cuDNN from torch's pip packages"
    # which cuBLAS and cuDNN were loaded: the loader's own record
    # (LD_DEBUG=libs: "calling init: FILE"), kept outside $OUT
    loaded() { grep -h -o 'calling init: [^ ]*lib\(cublas\|cublasLt\|cudnn\)\.so[.0-9]*' "$@" |
        sed 's/calling init: /  loaded /' | sort -u; }
    set -- "$kit"/ckpt_toolkit-*.whl
    site=/tmp/ckpt-wheel-site
    rm -rf "$site" /tmp/ckpt-wheel-ld.*
    if [ -f "$1" ]; then (
        unset LD_LIBRARY_PATH CKPT_CUDA_MODULE CKPT_CUDNN
        echo "wheel: $(basename "$1"), python3 $(command -v python3)"
        python3 -m pip install -q --no-deps --no-index --target "$site" "$1" || exit 1
        export PYTHONPATH=$site # bin/ckpt is pip's script: it imports ckpt_toolkit
        "$site/bin/ckpt" --version
        python3 -m ckpt_toolkit --version
        # as a pip user runs it: torch's venv found through python3 on PATH
        LD_DEBUG=libs LD_DEBUG_OUTPUT=/tmp/ckpt-wheel-ld.user "$site/bin/ckpt" verify --device cuda \
            --model models/mnist_mlp.json tests/data/fmnist_mlp.pth 2>&1 | tail -4
        echo "wheel verify on cuda (PATH as is) rc=${PIPESTATUS[0]}"
        loaded /tmp/ckpt-wheel-ld.user.*
        LD_DEBUG=libs LD_DEBUG_OUTPUT=/tmp/ckpt-wheel-ld.ae "$site/bin/ckpt" verify --device cuda \
            --model models/mnist_conv_autoencoder.json --reference tests/data/fmnist_ae.ref.pth \
            tests/data/fmnist_ae.pth 2>&1 | grep -E '^(device|note|result)'
        echo "wheel verify of the autoencoder on cuda rc=${PIPESTATUS[0]}"
        loaded /tmp/ckpt-wheel-ld.ae.*
        # the site-packages holding the module searched first: torch's
        # nvidia/ put beside ckpt_toolkit, no python3 on PATH, no HOME (the
        # loader's own path, when it has cuBLAS, still comes first)
        ln -s "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia" "$site/nvidia"
        env -i PATH=/usr/bin:/bin PYTHONPATH="$site" LD_DEBUG=libs LD_DEBUG_OUTPUT=/tmp/ckpt-wheel-ld.site \
            "$site/bin/ckpt" verify --device cuda --model models/mnist_mlp.json \
            tests/data/fmnist_mlp.pth 2>&1 | tail -2
        echo "wheel verify on cuda (nvidia/ beside ckpt_toolkit, bare environment) rc=${PIPESTATUS[0]}"
        loaded /tmp/ckpt-wheel-ld.site.*
    ) 2>&1 | tee -a "$out/summary.txt" | tail -30
    else
        echo "wheel: no ckpt_toolkit-*.whl in $kit (make wheel-portable, then bench/device_kit.sh)" |
            tee -a "$out/summary.txt"
    fi
fi

if has pipcuda; then
    say "the wheel on a machine whose loader path has no cuBLAS or cuDNN: torch's pip packages"
    # the system's copies hidden in a mount namespace of this command alone
    # (each bound over by an empty file: dlopen of it fails), so that the
    # module's search of torch's site-packages is what finds them
    set -- "$kit"/ckpt_toolkit-*.whl
    site=/tmp/ckpt-wheel-site
    if [ -f "$1" ] && command -v unshare >/dev/null; then (
        unset LD_LIBRARY_PATH CKPT_CUDA_MODULE CKPT_CUDNN
        rm -rf "$site"
        python3 -m pip install -q --no-deps --no-index --target "$site" "$1" || exit 1
        unshare -m sh -c '
            for f in $(ldconfig -p | grep -E "lib(cublas|cublasLt|cudnn)[a-z_]*\.so" | awk "{print \$NF}") \
                /usr/local/cuda/targets/x86_64-linux/lib/libcublas*.so* /usr/local/cuda/lib64/libcublas*.so*; do
                [ -e "$f" ] && mount --bind /dev/null "$(readlink -f "$f")" 2>/dev/null
            done
            echo "hidden: $(mount | grep -c " on /.*lib.*\(cublas\|cudnn\)") files"
            # (its status, not a pipe'"'"'s: sh has no PIPESTATUS)
            PYTHONPATH=$0 LD_DEBUG=libs LD_DEBUG_OUTPUT=/tmp/ckpt-pip-ld "$0/bin/ckpt" verify --device cuda \
                --model models/mnist_conv_autoencoder.json --reference tests/data/fmnist_ae.ref.pth \
                tests/data/fmnist_ae.pth >/tmp/ckpt-pip-verify.txt 2>&1
            rc=$?
            grep -E "^(device|note|result)" /tmp/ckpt-pip-verify.txt
            echo "wheel verify of the autoencoder, system cuBLAS and cuDNN hidden: rc=$rc"
        ' "$site"
        grep -h -o 'calling init: [^ ]*lib\(cublas\|cublasLt\|cudnn\)\.so[.0-9]*' /tmp/ckpt-pip-ld.* |
            sed 's/calling init: /  loaded /' | sort -u
    ) 2>&1 | tee -a "$out/summary.txt" | tail -12
    else
        echo "pipcuda: no wheel in $kit or no unshare" | tee -a "$out/summary.txt"
    fi
fi

# The MNIST MLP and autoencoder at batch 8 and 256 for the CPU steps, a line
# "SPEC CKPT BATCH RUNS" each: a steady state's times (bench_threads.py's
# warm-up), 2000 forwards at batch 8 (tens of microseconds each), 300 at 256
small_lines() {
    for m in "models/mnist_mlp.json tests/data/fmnist_mlp.pth" \
        "models/mnist_conv_autoencoder.json tests/data/fmnist_ae.pth"; do
        echo "$m 8 2000"
        echo "$m 256 300"
    done
}

if has threads; then
    say "the CPU backend on 1 to 16 threads: the same bits, and the time of each"
    small_lines | while read -r spec ck b runs; do
        for t in 1 2 4 8 16; do
            d=/tmp/ckpt-threads-$t
            mkdir -p $d
            "$kit/bin/bench_forward" --threads $t --warmup-ms 300 --dump $d "$spec" "$ck" $b $runs \
                cpu </dev/null |
                sed -n 's/.*"model": "\([^"]*\)".*"batch": \([0-9]*\).*"median_ms": \([0-9.]*\).*/\1 batch \2: '$t' threads \3 ms/p'
            for f in $d/output.*; do
                cmp -s "$f" /tmp/ckpt-threads-1/"${f##*/}" ||
                    echo "  DIFFERENT BITS: $f on $t threads"
            done
        done
    done 2>&1 | tee -a "$out/summary.txt"
fi

if has pairs; then
    say "1 -> 2 threads on one core's two hardware threads and on two cores"
    # the machine's topology: which logical CPUs share a core
    lscpu | grep -E '^(Thread|Core|Socket|Model name)' | tee -a "$out/summary.txt"
    # (a range "0-1" as the list "0,1" taskset and the test below read)
    same=$(sed 's/-/,/' /sys/devices/system/cpu/cpu0/topology/thread_siblings_list)
    echo "cpu0's core: CPUs $same" | tee -a "$out/summary.txt"
    # a CPU of another core than cpu0's: the first not in its siblings' list
    other=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do
        n=${c##*cpu}
        case ",$(sed 's/-/,/' "$c/topology/thread_siblings_list")," in
        *",0,"*) ;;
        *) echo "$n"; break ;;
        esac
    done)
    small_lines | while read -r spec ck b runs; do
        # three rounds, the placements alternating
        for r in 1 2 3; do
            for p in "1 0" "2 0,$other" "2 $same"; do
                set -- $p
                printf '%s batch %s round %s: %s threads on CPUs %s: ' "${spec##*/}" $b $r $1 $2
                taskset -c $2 "$kit/bin/bench_forward" --threads $1 --warmup-ms 300 "$spec" "$ck" \
                    $b $runs cpu </dev/null | sed -n 's/.*"median_ms": \([0-9.]*\).*/\1 ms/p'
            done
        done
    done 2>&1 | tee -a "$out/summary.txt"
fi

if has bench; then
    say "bench_device.py"
    timeout "${BENCH_S:-420}" python3 bench/bench_device.py --bench-forward "$kit/bin/bench_forward" \
        --gpu-batches "${GPU_BATCHES:-1,8}" --rounds "${ROUNDS:-1}" --out "$out" \
        ${BENCH_ARGS:-} 2>&1 | tail -60
fi

if has memcheck; then
    say "compute-sanitizer memcheck"
    if command -v compute-sanitizer >/dev/null; then
        timeout "${MEMCHECK_S:-150}" compute-sanitizer --tool memcheck --leak-check full \
            "$kit/bin/check_runtime_cuda" >"$out/memcheck.log" 2>&1
        echo "memcheck rc=$?" | tee -a "$out/summary.txt"
        grep -E 'ERROR SUMMARY|LEAK SUMMARY|bytes leaked' "$out/memcheck.log" | tail -4 |
            tee -a "$out/summary.txt"
    else
        echo "no compute-sanitizer" | tee -a "$out/summary.txt"
    fi
fi
say "done"
cat "$out/summary.txt"
