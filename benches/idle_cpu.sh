#!/usr/bin/env bash
# Idle CPU of the `memprof view` dashboard at its default refresh: runs the release binary in
# a detached tmux pane on FILE, waits until it has drawn, then reads utime+stime from
# /proc/PID/stat over SECONDS and prints the share of one core. Target: under 2%.
#
# usage: benches/idle_cpu.sh [FILE] [SECONDS]   (default: fixtures/snapshots/demo_oom.pickle, 10)
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-fixtures/snapshots/demo_oom.pickle}
seconds=${2:-10}
command -v tmux >/dev/null || { echo "needs tmux" >&2; exit 2; }
cargo build --release --quiet
socket="memprof-idle-$$"
tmux -L "$socket" -f /dev/null new-session -d -x 120 -y 40 "target/release/memprof view $file"
trap 'tmux -L "$socket" kill-server 2>/dev/null || true' EXIT
drawn=no
for _ in $(seq 1200); do
  if tmux -L "$socket" capture-pane -p | grep -q "Memory over time"; then drawn=yes; break; fi
  sleep 0.1
done
[ "$drawn" = yes ] || { echo "the dashboard did not draw within 120 s: nothing measured" >&2; exit 2; }
pid=$(tmux -L "$socket" display -p '#{pane_pid}')
ticks() { # utime + stime of the process, in clock ticks (fields 14 and 15 after the comm)
  sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}'
}
hz=$(getconf CLK_TCK)
sleep 1
t0=$(ticks); s0=$(date +%s.%N)
sleep "$seconds"
t1=$(ticks); s1=$(date +%s.%N)
awk -v t0="$t0" -v t1="$t1" -v s0="$s0" -v s1="$s1" -v hz="$hz" -v f="$file" 'BEGIN {
  cpu = (t1 - t0) / hz; wall = s1 - s0
  printf "memprof view %s idle: %.3f s CPU over %.1f s = %.2f%% of one core (target < 2%%)\n",
    f, cpu, wall, 100 * cpu / wall
}'
