#!/usr/bin/env bash
# Compares `memprof analyze --json` (load + full analysis) with Python's `pickle.load` alone on
# the same generated snapshot, in one run on one machine, and prints medians and ratios.
# Targets (issue "Workspace, PyTorch snapshot ingestion"): memprof >= 10x faster than the load,
# and memprof's peak RSS <= 1.5x the file's size.
#
# usage: benches/compare_python.sh [STEPS] [RUNS]    (default 2000 steps, about 117 MB; 5 runs)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2000}
runs=${2:-5}
data=target/bench-data
file=$data/gen_steps$steps.pickle
mkdir -p "$data"
if [ ! -f "$file" ]; then
  echo "generating $file with ../shared/tools/gen_snapshot.py --steps $steps" >&2
  python3 ../shared/tools/gen_snapshot.py "$file" --steps "$steps"
fi
cargo build --release --quiet
bin=target/release/memprof
timer=/usr/bin/time
[ -x "$timer" ] || { echo "needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 2; }

measure() { # prints "seconds max_rss_kb" for one run of the command
  "$timer" -f "%e %M" -o "$data/time.out" "$@" >/dev/null
  cat "$data/time.out"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

py_t=(); py_m=(); mp_t=(); mp_m=()
for i in $(seq "$runs"); do
  read -r t m < <(measure python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" "$file")
  py_t+=("$t"); py_m+=("$m")
  read -r t m < <(measure "$bin" analyze --json "$file")
  mp_t+=("$t"); mp_m+=("$m")
done
size=$(stat -c %s "$file")
pt=$(printf '%s\n' "${py_t[@]}" | median); pm=$(printf '%s\n' "${py_m[@]}" | median)
mt=$(printf '%s\n' "${mp_t[@]}" | median); mm=$(printf '%s\n' "${mp_m[@]}" | median)
awk -v size="$size" -v pt="$pt" -v pm="$pm" -v mt="$mt" -v mm="$mm" -v runs="$runs" -v f="$file" 'BEGIN {
  printf "input: %s (%.1f MB), medians of %d runs\n", f, size/1e6, runs
  printf "python pickle.load (load only): %.3f s, peak RSS %.1f MB (%.2fx file)\n", pt, pm*1024/1e6, pm*1024/size
  printf "memprof analyze --json:         %.3f s, peak RSS %.1f MB (%.2fx file)\n", mt, mm*1024/1e6, mm*1024/size
  printf "speed ratio (python / memprof): %.1fx   target >= 10x\n", pt/mt
  printf "memprof RSS / file size:        %.2fx   target <= 1.5x\n", mm*1024/size
}'
