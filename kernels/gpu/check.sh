#!/usr/bin/env bash
# The checks memprof runs on a machine with a real NVIDIA GPU, driver, NVML and PyTorch, as one
# script (the device tool lends such a machine for minutes). Needs release builds of `memprof`
# and `libmemprof_shim.so` in BIN (default target/release) and writes everything it saw to OUT
# (default $OUT, else ./gpu-check). Each step prints what it ran; a failing step does not stop
# the others, and the last line counts them.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${BIN:-target/release}")
out=${OUT:-gpu-check}
mkdir -p "$out"
failed=0
step() { # step NAME CMD...: runs CMD, output to OUT/NAME.txt, reports the exit code
  local name=$1; shift
  echo "== $name: $*"
  "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc, $(wc -l <"$out/$name.txt") lines"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

step nvidia-smi nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv
step probe "$bin/memprof" probe --json
step python-torch python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
# The shim under a real libcudart: cuGetProcAddress, async pools and whatever PyTorch uses.
step run-torch env MEMPROF_SHIM="$bin/libmemprof_shim.so" "$bin/memprof" run -o "$out/train.memprof" -- \
  python3 kernels/gpu/torch_train.py --snapshot "$out/train.pickle" --oom
step analyze-snapshot "$bin/memprof" analyze --json "$out/train.pickle"
step analyze-recording "$bin/memprof" analyze --json "$out/train.memprof"
step validate "$bin/memprof" simulate "$out/train.pickle" --validate --json
step diagnose "$bin/memprof" diagnose "$out/train.pickle" --json
# NVML: the agent's metrics for this machine (a scrape through Python's urllib).
"$bin/memprof" agent --listen 127.0.0.1:0 >"$out/agent-start.txt" 2>&1 &
agent=$!
sleep 3
addr=$(grep -oE '127\.0\.0\.1:[0-9]+' "$out/agent-start.txt" | head -1)
step agent-scrape python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://$addr/metrics').read().decode())"
kill "$agent" 2>/dev/null
echo "checks failed: $failed"
