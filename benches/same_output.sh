#!/usr/bin/env bash
# Checks that a speed change changed no output: runs two memprof binaries on every snapshot and
# recording in the repository's fixtures and in the real-snapshot folder beside the repository
# (when there is one), with the commands whose output a user reads (analyze and diagnose, text
# and JSON), and compares the outputs byte for byte. Exits 1 on the first difference, naming it.
#
# usage: benches/same_output.sh BEFORE AFTER
#   BEFORE, AFTER: two memprof binaries (for example a release build of main saved aside, and
#   target/release/memprof after the change)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 BEFORE AFTER (two memprof binaries)" >&2; exit 2; }
before=$1
after=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

files=()
for dir in fixtures/snapshots fixtures/recordings ../shared/fixtures/real ../shared/fixtures/real/more; do
  [ -d "$dir" ] || { echo "(no $dir: its files are not compared)"; continue; }
  for f in "$dir"/*; do
    case $f in
      *.pickle | *.pkl | *.pickle.gz | *.memprof) files+=("$f") ;;
    esac
  done
done

compared=0
for f in "${files[@]}"; do
  for cmd in "analyze" "analyze --json" "diagnose" "diagnose --json"; do
    # shellcheck disable=SC2086 # the command's words split on purpose
    "$before" $cmd "$f" >"$work/before" 2>&1 || echo "exit $?" >>"$work/before"
    # shellcheck disable=SC2086
    "$after" $cmd "$f" >"$work/after" 2>&1 || echo "exit $?" >>"$work/after"
    if ! cmp -s "$work/before" "$work/after"; then
      echo "DIFFERENT: memprof $cmd $f" >&2
      diff "$work/before" "$work/after" | head -20 >&2
      exit 1
    fi
    compared=$((compared + 1))
  done
done
echo "same output: ${#files[@]} files, $compared outputs, byte for byte"
