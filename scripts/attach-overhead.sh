#!/usr/bin/env bash
# What `memprof attach` costs a running job, measured on the stand-in workload
# (tests/python/attach_job.py over tests/python/standin: a step allocates and frees through the
# stand-in torch, then sleeps 2 ms). The job itself measures the longest pause between two of its
# steps (sleep left out) and the time its steps take; this script reads them around each step of
# attach: queuing the agent and the live view, a snapshot, a recorded window. Results are in
# docs/overhead.md. Usage: scripts/attach-overhead.sh [path/to/memprof] (default: the debug build).
set -euo pipefail
cd "$(dirname "$0")/.."
memprof=${1:-target/debug/memprof}
dir=$(mktemp -d)
trap 'kill "$job" 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 tests/python/attach_job.py "$PWD/tests/python/standin" "$dir" &
job=$!
while [ ! -f "$dir/pid" ]; do sleep 0.05; done
state() { # prints FIELD of a fresh state.json
  rm -f "$dir/state.json"; kill -USR1 "$job"
  while [ ! -f "$dir/state.json" ]; do sleep 0.01; done
  python3 -c "import json,sys; d=json.load(open('$dir/state.json')); print(*(d[k] for k in sys.argv[1:]))" "$@"
}
sleep 2
state longest_pause_ms >/dev/null
sleep 3
echo "no attach (3 s):            longest pause $(state longest_pause_ms) ms"
"$memprof" attach "$job" --json --duration 5 --interval 1 >"$dir/live.json"
held=$(python3 -c "import json; print(json.load(open('$dir/live.json'))['torch']['longest_held_us'])")
echo "attach, live view (5 s):    longest pause $(state longest_pause_ms) ms; longest request in the job ${held} us"
"$memprof" attach "$job" --snapshot "$dir/s.pickle" >/dev/null 2>"$dir/err"
echo "attach --snapshot:          longest pause $(state longest_pause_ms) ms; $(grep -o 'held .*' "$dir/err")"
read -r s0 b0 < <(state steps busy_s)
sleep 3
read -r s1 b1 < <(state steps busy_s)
"$memprof" attach "$job" --record 3 --snapshot "$dir/r.pickle" >/dev/null 2>"$dir/err"
read -r s2 b2 pause < <(state steps busy_s longest_pause_ms)
echo "attach --record 3:          longest pause $pause ms; $(grep -o 'held .*' "$dir/err")"
python3 - "$s0" "$b0" "$s1" "$b1" "$s2" "$b2" <<'PY'
import sys
s0, b0, s1, b1, s2, b2 = map(float, sys.argv[1:])
before = (b1 - b0) / (s1 - s0) * 1e6
during = (b2 - b1) / (s2 - s1) * 1e6
print("step time: %.1f us before recording, %.1f us while attach records (%+.0f%%)"
      % (before, during, (during / before - 1) * 100))
PY
