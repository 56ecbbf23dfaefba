#!/usr/bin/env bash
# Try memprof's recording side without a GPU: builds the fake CUDA driver (kernels/fake_cuda)
# and a small training-like program that runs out of memory (kernels/workloads/try_train.c)
# with cc, records the program with `memprof run`, opens `memprof view` on the recording when
# standard output is a terminal, and ends with what `memprof analyze` says about it.
#
# Usage: scripts/try-without-gpu.sh [DIR]
#   DIR      where to build and write the recording (default: a new folder under ${TMPDIR:-/tmp})
#   MEMPROF  the memprof binary (default: target/debug/memprof, else target/release/memprof,
#            else memprof on PATH); `memprof run` preloads the shim MEMPROF_SHIM names, else
#            libmemprof_shim.so next to the binary, else the one the binary carries.
# Needs only cc and a built memprof (`cargo build` builds both the binary and the shim).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

memprof=${MEMPROF:-}
if [ -z "$memprof" ]; then
  for candidate in "$repo/target/debug/memprof" "$repo/target/release/memprof"; do
    if [ -x "$candidate" ]; then memprof=$candidate; break; fi
  done
fi
if [ -z "$memprof" ]; then memprof=$(command -v memprof || true); fi
if [ -z "$memprof" ] || [ ! -x "$memprof" ]; then
  echo "try-without-gpu: no memprof binary; run \`cargo build\` in $repo first (or set MEMPROF)" >&2
  exit 2
fi
if ! command -v cc >/dev/null; then
  echo "try-without-gpu: no C compiler (cc); install one (Debian/Ubuntu: apt install gcc)" >&2
  exit 2
fi

dir=${1:-$(mktemp -d "${TMPDIR:-/tmp}/memprof-try.XXXXXX")}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

echo "== building the fake CUDA driver and the demo job in $dir"
cc -O1 -shared -fPIC -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" \
  "$repo/kernels/fake_cuda/fake_cuda.c" -lpthread -ldl
cc -O1 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls -o "$dir/try_train" \
  "$repo/kernels/workloads/try_train.c" -L"$dir" -l:libcuda.so.1 -Wl,-rpath,"$dir"

echo "== memprof run -o $dir/train.memprof -- $dir/try_train"
# A 512 MiB fake device; the job exits 1 when it runs out of memory, and memprof run passes
# that code on.
status=0
FAKE_CUDA_CAPACITY=536870912 "$memprof" run -o "$dir/train.memprof" -- "$dir/try_train" || status=$?
if [ "$status" -ne 1 ]; then
  echo "try-without-gpu: the demo job exited $status; it should run out of memory and exit 1" >&2
  exit 1
fi
echo "(exit 1: the demo job ran out of memory, as it is meant to)"

if [ -t 1 ]; then
  echo "== memprof view $dir/train.memprof   (press q to leave it)"
  "$memprof" view "$dir/train.memprof"
fi

echo "== memprof analyze $dir/train.memprof"
"$memprof" analyze "$dir/train.memprof"
echo
echo "The recording stays in $dir: try \`$memprof view $dir/train.memprof\` or"
echo "\`$memprof diagnose $dir/train.memprof\`."
