#!/usr/bin/env bash
# Peak memory (resident set) of `memprof analyze` and `memprof gate` reading a memprof
# recording of SIZE_MB megabytes (default 500), against the file's size: reading must stay
# within 1.25x. The recording is generated once by benches/gen_recording.py under
# target/bench-data/; the binary is the release build (or $MEMPROF_BIN).
#
# usage: benches/recording_rss.sh [SIZE_MB]
set -euo pipefail
cd "$(dirname "$0")/.."
mb="${1:-500}"
bin="${MEMPROF_BIN:-target/release/memprof}"
if [[ -z "${MEMPROF_BIN:-}" ]]; then
    cargo build --release --quiet --bin memprof
fi
if [[ ! -x /usr/bin/time ]]; then
    echo "SKIPPED: recording_rss: /usr/bin/time is not installed (apt-get install time)"
    exit 0
fi
mkdir -p target/bench-data
rec="target/bench-data/gen_${mb}mb.memprof"
[[ -f "$rec" ]] || python3 benches/gen_recording.py "$rec" "$mb"
bytes=$(stat -c %s "$rec")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
worst=0
for what in analyze gate; do
    case "$what" in
    analyze) cmd=("$bin" analyze --json "$rec") ;;
    gate) cmd=("$bin" gate --write-baseline "$out/base.json" "$rec") ;;
    esac
    /usr/bin/time -v -o "$out/time" "${cmd[@]}" > /dev/null
    kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$out/time")
    secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$out/time")
    ratio=$(awk -v kb="$kb" -v b="$bytes" 'BEGIN {printf "%.2f", kb * 1024 / b}')
    printf '%-8s %s: peak RSS %d MB = %sx the file (%d MB), wall %s\n' \
        "$what" "$rec" $((kb * 1024 / 1000000)) "$ratio" $((bytes / 1000000)) "$secs"
    worst=$(awk -v a="$worst" -v b="$ratio" 'BEGIN {print (b > a) ? b : a}')
done
if awk -v w="$worst" 'BEGIN {exit !(w > 1.25)}'; then
    echo "FAIL: peak RSS ${worst}x the recording's size, over 1.25x"
    exit 1
fi
echo "ok: peak RSS at most ${worst}x the recording's size"
