#!/usr/bin/env bash
# The speed budget: `memprof analyze --json` (reading the file and the whole account) against
# Python's `pickle.load` alone on the same generated snapshot, and against a plain read of the
# file, alternating them in one run on one machine; then the same for a memprof recording of
# about the same size. Prints medians, ratios and peak memory against the file's size, and the
# load average, so that a drop is seen in review (docs/overhead.md keeps the table). Ratios,
# not times: it fails only when a command fails, never on noise.
#
# usage: benches/compare_python.sh [STEPS] [RUNS]
#   STEPS  steps of the generated snapshot (default 2000: 117 MB; 17000: about 1 GB; 100: 6 MB)
#   RUNS   runs of each command, alternating (default 5)
#   MEMPROF_BIN=PATH  the binary to time (default: a release build of this checkout)
#   MEMPROF_BENCH_RECORDING=0  skips the recording
# The snapshot generator is the project's `gen_snapshot.py`, beside the repository in
# ../shared/tools/; without it the script says so and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2000}
runs=${2:-5}
data=target/bench-data
mkdir -p "$data"
timer=/usr/bin/time
[ -x "$timer" ] || { echo "needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 2; }
generator=../shared/tools/gen_snapshot.py
file=$data/gen_steps$steps.pickle
if [ ! -f "$file" ]; then
  if [ ! -f "$generator" ]; then
    echo "SKIPPED: compare_python: needs the snapshot generator at $generator (not in this repository)"
    exit 0
  fi
  echo "generating $file with $generator --steps $steps" >&2
  python3 "$generator" "$file" --steps "$steps"
fi
if [ -n "${MEMPROF_BIN:-}" ]; then
  bin=$MEMPROF_BIN
else
  cargo build --release --locked --quiet --bin memprof
  bin=target/release/memprof
fi

measure() { # prints "seconds max_rss_kb cpu_seconds" for one run of the command
  "$timer" -f "%e %M %U %S" -o "$data/time.out" "$@" >/dev/null
  tail -n 1 "$data/time.out" | awk '{print $1, $2, $3 + $4}'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# compare NAME FILE [python]: times memprof, a plain read and (for a pickle) pickle.load.
compare() {
  local name=$1 f=$2 python=${3:-}
  local py_t=() py_m=() py_c=() mp_t=() mp_m=() mp_c=() cat_t=()
  for _ in $(seq "$runs"); do
    if [ -n "$python" ]; then
      read -r t m c < <(measure python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" "$f")
      py_t+=("$t"); py_m+=("$m"); py_c+=("$c")
    fi
    read -r t m c < <(measure "$bin" analyze --json "$f")
    mp_t+=("$t"); mp_m+=("$m"); mp_c+=("$c")
    read -r t _ _ < <(measure cat "$f")
    cat_t+=("$t")
  done
  local size mt mm mc ct pt=0 pm=0 pc=0
  size=$(stat -L -c %s "$f")
  mt=$(printf '%s\n' "${mp_t[@]}" | median); mm=$(printf '%s\n' "${mp_m[@]}" | median)
  mc=$(printf '%s\n' "${mp_c[@]}" | median)
  ct=$(printf '%s\n' "${cat_t[@]}" | median)
  if [ -n "$python" ]; then
    pt=$(printf '%s\n' "${py_t[@]}" | median); pm=$(printf '%s\n' "${py_m[@]}" | median)
    pc=$(printf '%s\n' "${py_c[@]}" | median)
  fi
  awk -v name="$name" -v f="$f" -v size="$size" -v runs="$runs" -v mt="$mt" -v mm="$mm" \
    -v ct="$ct" -v pt="$pt" -v pm="$pm" -v mc="$mc" -v pc="$pc" 'function rate(t) { return t > 0 ? sprintf("%.0f MB/s", size / 1e6 / t) : "too fast to time" }
  BEGIN {
    printf "%s: %s (%.1f MB), medians of %d alternating runs\n", name, f, size / 1e6, runs
    printf "  memprof analyze --json: %.3f s (%s), CPU %.3f s, peak RSS %.1f MB = %.2fx the file\n", mt, rate(mt), mc, mm * 1024 / 1e6, mm * 1024 / size
    printf "  plain read (cat):       %.3f s (%s)\n", ct, rate(ct)
    if (pt > 0) {
      printf "  python pickle.load:     %.3f s (%s), CPU %.3f s, peak RSS %.1f MB = %.2fx the file\n", pt, rate(pt), pc, pm * 1024 / 1e6, pm * 1024 / size
      printf "  ratio pickle.load / memprof: %.1fx wall, %.1fx CPU   (goal: 30x)\n", (mt > 0 ? pt / mt : 0), (mc > 0 ? pc / mc : 0)
    }
    printf "  memprof RSS / file size:     %.2fx  (goal: 1.0x)\n", mm * 1024 / size
  }'
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
compare snapshot "$file" python
if [ "${MEMPROF_BENCH_RECORDING:-1}" != 0 ]; then
  # A recording of about the snapshot's size (at least 1 MB).
  mb=$(( $(stat -L -c %s "$file") / 1000000 ))
  [ "$mb" -ge 1 ] || mb=1
  rec=$data/gen_${mb}mb.memprof
  [ -f "$rec" ] || python3 benches/gen_recording.py "$rec" "$mb"
  compare recording "$rec"
fi
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
