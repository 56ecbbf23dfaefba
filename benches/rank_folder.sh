#!/usr/bin/env bash
# A folder of rank files: `memprof analyze DIR` reads every file in parallel on all cores, so N
# files should take about (N / cores) times one file. Prints the wall time of one file and of
# the folder, the time that target predicts and the ratio of the two (1.0 = on target), and the
# CPU time (user + system) of both: on a machine that other jobs keep busy the wall times
# depend on the cores left free, while the CPU times show whether the parallel run does more
# work than N single runs.
# Target (issue "What used the memory"): 64 rank files of about 100 MB each.
#
# usage: benches/rank_folder.sh [FILES] [STEPS] [RUNS]
#   default 64 files of 1700 steps (about 100 MB each; 430 steps is about 25 MB), best of 3 runs.
# The files are generated with ../shared/tools/gen_snapshot.py into a temporary folder under
# /tmp (removed at the end): one file written, the others copies of it (seeds do not change
# the work), so generating 64 files takes one generation. Needs GNU time at /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/.."
files=${1:-64}
steps=${2:-1700}
runs=${3:-3}
timer=/usr/bin/time
[ -x "$timer" ] || { echo "needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 2; }
cargo build --release --quiet --bin memprof
bin=$PWD/target/release/memprof
dir=$(mktemp -d /tmp/memprof-ranks.XXXXXX)
single=$(mktemp -d /tmp/memprof-rank.XXXXXX)
trap 'rm -rf "$dir" "$single"' EXIT
echo "generating $files rank files of $steps steps in $dir" >&2
python3 ../shared/tools/gen_snapshot.py "$dir/rank0000.pickle" --steps "$steps"
for i in $(seq 1 $((files - 1))); do
  cp "$dir/rank0000.pickle" "$dir/rank$(printf %04d "$i").pickle"
done
cp "$dir/rank0000.pickle" "$single/"

best() { # "wall cpu" seconds of the run with the least wall time, of RUNS runs
  for _ in $(seq "$runs"); do
    "$timer" -f "%e %U %S" -o "$single/time.out" "$@" >/dev/null
    awk '{print $1, $2 + $3}' "$single/time.out"
  done | sort -n | head -1
}

cores=$(nproc)
size=$(du -m "$dir/rank0000.pickle" | cut -f1)
"$bin" analyze --json "$single" >/dev/null # warm the page cache and the binary
read -r one one_cpu < <(best "$bin" analyze --json "$single")
read -r all all_cpu < <(best "$bin" analyze --json "$dir")
awk -v one="$one" -v oc="$one_cpu" -v all="$all" -v ac="$all_cpu" -v n="$files" -v c="$cores" \
  -v mb="$size" 'BEGIN {
  k = (n < c ? n : c)
  printf "one file (%d MB):             %.2f s wall, %.2f s CPU\n", mb, one, oc
  printf "folder of %d files, %d cores:  %.2f s wall, %.2f s CPU\n", n, c, all, ac
  printf "target (%d / %d x one file):   %.2f s wall\n", n, k, one * n / k
  printf "ratio folder / target:        %.2f wall; CPU %.2f of %d single runs\n", all / (one * n / k), ac / (oc * n), n
}'
