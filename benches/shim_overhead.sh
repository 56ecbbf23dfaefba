#!/bin/sh
# Per-pair cost of cuMemAlloc_v2 + cuMemFree_v2 on the fake driver (kernels/fake_cuda): without
# the shim, with the shim loaded but not recording (no MEMPROF_OUT), recording without call stacks
# (MEMPROF_STACKS=0) and recording with them (the default; to a file, with the live socket
# listening). Builds the release shim, compiles the fake driver and
# kernels/workloads/pair_timing.c (with frame pointers, so the stack walk goes up to main),
# runs each setting RUNS times interleaved and prints the median ns per pair and the ratio to
# the bare driver, the overhead per pair and per call (half a pair) of recording with and
# without stacks, and the recording's written/dropped/delayed counts of the last run.
#
#   sh benches/shim_overhead.sh [PAIRS] [RUNS]      (defaults: 200000 pairs, 11 runs)
set -eu
PAIRS=${1:-200000}
RUNS=${2:-11}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cargo build --quiet --release -p memprof-shim --manifest-path "$ROOT/Cargo.toml"
SHIM="$ROOT/target/release/libmemprof_shim.so"
cc -O2 -shared -fPIC -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1 -o "$WORK/libcuda.so.1" \
    "$ROOT/kernels/fake_cuda/fake_cuda.c" -lpthread
cc -O2 -fno-omit-frame-pointer -o "$WORK/pair_timing" "$ROOT/kernels/workloads/pair_timing.c" \
    -L"$WORK" -l:libcuda.so.1 -Wl,-rpath,"$WORK"

i=0
while [ "$i" -lt "$RUNS" ]; do
    env -u LD_PRELOAD -u MEMPROF_OUT "$WORK/pair_timing" "$PAIRS" >>"$WORK/bare"
    env -u MEMPROF_OUT LD_PRELOAD="$SHIM" "$WORK/pair_timing" "$PAIRS" >>"$WORK/idle"
    rm -f "$WORK/run.memprof"
    LD_PRELOAD="$SHIM" MEMPROF_OUT="$WORK/run.memprof" XDG_RUNTIME_DIR="$WORK" MEMPROF_STACKS=0 \
        "$WORK/pair_timing" "$PAIRS" >>"$WORK/no_stacks"
    rm -f "$WORK/run.memprof"
    LD_PRELOAD="$SHIM" MEMPROF_OUT="$WORK/run.memprof" XDG_RUNTIME_DIR="$WORK" \
        "$WORK/pair_timing" "$PAIRS" >>"$WORK/recording"
    i=$((i + 1))
done

python3 - "$WORK" "$PAIRS" "$RUNS" <<'PY'
import statistics, struct, sys
work, pairs, runs = sys.argv[1], sys.argv[2], sys.argv[3]
settings = ("bare", "idle", "no_stacks", "recording")
med = {k: statistics.median(float(x) for x in open(f"{work}/{k}")) for k in settings}
print(f"cuMemAlloc_v2 + cuMemFree_v2 pairs on the fake driver: {pairs} pairs x {runs} runs, median ns per pair")
for k in settings:
    print(f"  {k:<10} {med[k]:8.1f} ns/pair   x{med[k] / med['bare']:.2f}")
# A pair is two intercepted calls: the overhead per call is half the pair's.
for k, what in (("no_stacks", "stacks off"), ("recording", "stacks on")):
    extra = med[k] - med["bare"]
    print(f"  overhead, {what:<10} {extra:8.1f} ns per pair = {extra / 2:.1f} ns per call")
# Only the allocation of a pair captures a stack.
print(f"  stack capture: {med['recording'] - med['no_stacks']:.1f} ns per allocation (recording / no_stacks x{med['recording'] / med['no_stacks']:.2f})")
data = open(f"{work}/run.memprof", "rb").read()
kind, = struct.unpack_from("<H", data, len(data) - 64)
if kind == 10:
    written, delayed, dropped = struct.unpack_from("<QQQ", data, len(data) - 64 + 24)
    print(f"  last recording: {written} written, {dropped} dropped, {delayed} delayed (hook waited for room)")
else:
    print("  last recording has no trailer")
PY
