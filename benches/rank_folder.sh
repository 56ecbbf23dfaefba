#!/usr/bin/env bash
# A folder of rank files: `memprof analyze DIR` reads every file in parallel on all cores, so N
# files should take about (N / cores) times one file. Prints the time of one file, of the
# folder, the time that target predicts, and the ratio of the two (1.0 = on target).
# Target (issue "What used the memory"): 64 rank files of about 100 MB each.
#
# usage: benches/rank_folder.sh [FILES] [STEPS] [RUNS]
#   default 64 files of 1700 steps (about 100 MB each; 430 steps is about 25 MB), best of 3 runs.
# The files are generated with ../shared/tools/gen_snapshot.py into a temporary folder under
# /tmp (removed at the end): one file written, the others copies of it (seeds do not change
# the work), so generating 64 files takes one generation.
set -euo pipefail
cd "$(dirname "$0")/.."
files=${1:-64}
steps=${2:-1700}
runs=${3:-3}
cargo build --release --quiet --bin memprof
bin=$PWD/target/release/memprof
dir=$(mktemp -d /tmp/memprof-ranks.XXXXXX)
trap 'rm -rf "$dir"' EXIT
echo "generating $files rank files of $steps steps in $dir" >&2
python3 ../shared/tools/gen_snapshot.py "$dir/rank0000.pickle" --steps "$steps"
for i in $(seq 1 $((files - 1))); do
  cp "$dir/rank0000.pickle" "$dir/rank$(printf %04d "$i").pickle"
done
single=$(mktemp -d /tmp/memprof-rank.XXXXXX)
trap 'rm -rf "$dir" "$single"' EXIT
cp "$dir/rank0000.pickle" "$single/"

best() { # best wall time in seconds of RUNS runs of the command
  local b=""
  for _ in $(seq "$runs"); do
    local s e
    s=$(date +%s.%N)
    "$@" >/dev/null
    e=$(date +%s.%N)
    b=$(awk -v b="$b" -v t="$(awk -v s="$s" -v e="$e" 'BEGIN {print e - s}')" \
      'BEGIN {print (b == "" || t < b) ? t : b}')
  done
  echo "$b"
}

cores=$(nproc)
size=$(du -m "$dir/rank0000.pickle" | cut -f1)
"$bin" analyze --json "$single" >/dev/null # warm the page cache and the binary
one=$(best "$bin" analyze --json "$single")
all=$(best "$bin" analyze --json "$dir")
awk -v one="$one" -v all="$all" -v n="$files" -v c="$cores" -v mb="$size" 'BEGIN {
  target = one * n / (n < c ? n : c)
  printf "one file (%d MB):            %.2f s\n", mb, one
  printf "folder of %d files, %d cores: %.2f s\n", n, c, all
  printf "target (%d / %d x one file):  %.2f s\n", n, (n < c ? n : c), target
  printf "ratio folder / target:       %.2f\n", all / target
}'
