#!/usr/bin/env bash
# Time to `memprof view`'s first frame and to its full dashboard, in a real terminal: runs the
# binary in a detached tmux pane on FILE, polls the pane every 20 ms, and prints, per run and
# as medians, the seconds from starting it until the pane first shows a dashboard's header
# ("NAME │", the loading screen's or the dashboard's; a progress bar on stderr does not
# count), until it shows the dump's figures ("device N:" on the loading screen; none for a
# recording or a file whose trace comes first), and until the dashboard is drawn ("Memory
# over time"). Times include starting tmux and the polling step. Prints the load average
# before and after: wall times on a busy machine say as much about the machine.
#
# usage: benches/view_first_frame.sh FILE [RUNS] [BINARY]
#   (default: 3 runs of target/release/memprof, built first)
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:?usage: benches/view_first_frame.sh FILE [RUNS] [BINARY]}
runs=${2:-3}
binary=${3:-}
command -v tmux >/dev/null || { echo "needs tmux" >&2; exit 2; }
if [ -z "$binary" ]; then
  cargo build --release --quiet --bin memprof
  binary=target/release/memprof
fi
name=$(basename "$file")
socket="memprof-first-frame-$$"
trap 'tmux -L "$socket" kill-server 2>/dev/null || true' EXIT
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
firsts=() dumps=() fulls=()
for run in $(seq "$runs"); do
  sync
  start=$(now)
  tmux -L "$socket" -f /dev/null new-session -d -x 120 -y 40 "$binary view $file"
  first='' dump='' full=''
  for _ in $(seq 30000); do
    screen=$(tmux -L "$socket" capture-pane -p 2>/dev/null || true)
    t=$(now)
    if [ -z "$first" ] && grep -qF -- "$name │" <<<"$screen"; then first=$(since "$start" "$t"); fi
    if [ -z "$dump" ] && grep -q "device [0-9]*: " <<<"$screen"; then dump=$(since "$start" "$t"); fi
    if grep -qF "Memory over time" <<<"$screen"; then
      full=$(since "$start" "$t")
      [ -n "$first" ] || first=$full
      break
    fi
    sleep 0.02
  done
  tmux -L "$socket" kill-server 2>/dev/null || true
  [ -n "$full" ] || { echo "run $run: the dashboard did not draw within 10 minutes" >&2; exit 2; }
  echo "run $run: first frame ${first} s, dump ${dump:--} s, dashboard ${full} s"
  firsts+=("$first"); fulls+=("$full"); [ -z "$dump" ] || dumps+=("$dump")
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'memprof view %s (%s): median of %d runs: first frame %s s, dump %s s, dashboard %s s\n' \
  "$file" "$(du -h "$file" | cut -f1)" "$runs" \
  "$(printf '%s\n' "${firsts[@]}" | median)" \
  "$( ((${#dumps[@]})) && printf '%s\n' "${dumps[@]}" | median || echo -)" \
  "$(printf '%s\n' "${fulls[@]}" | median)"
