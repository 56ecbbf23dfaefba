#!/usr/bin/env bash
# Runs every command block of README.md as a newcomer would: as a user without rights, from a
# fresh clone at a path of more than 60 characters, with the tools the README lists and the
# Rust toolchain, timing each block. Fails when a command fails, or when the quick start's
# `cargo test` skips another number of tests than the README says.
#
#   sudo bash scripts/readme-check.sh [USER]     # USER: made if missing (default memprof-newcomer)
#
# USER's ~/projects, ~/.venvs/memprof and ~/.cache/memprof are replaced: give it a user of its own.
#
# Needs root (to make the user and hand it the toolchain). Lines whose comment starts with
# `needs ` (a GPU, a terminal) are not run, as in tests/doc_examples.rs; the names that stand
# for a user's own files (snapshot.pickle, train.memprof, step.pickle) are given the shipped
# stand-ins docs/README.md lists. Builds everything from scratch: about 15 minutes on 2 cores.
# CARGO_BUILD_JOBS, when set, reaches the user's cargo (to leave cores to other work).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
user=${1:-memprof-newcomer}

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED: readme-check: needs root, to run the README as a user without rights" >&2
  exit 0
fi
for tool in git python3 cc setpriv unshare mount; do
  command -v "$tool" >/dev/null || { echo "readme-check: needs $tool" >&2; exit 1; }
done
id -u "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
uid=$(id -u "$user")
gid=$(id -g "$user")
home=$(getent passwd "$user" | cut -d: -f6)
[ "$uid" -ne 0 ] || { echo "readme-check: $user is root" >&2; exit 1; }

# The clone, at an ordinary but long path (Unix socket paths made under it must still fit).
clone="$home/projects/gpu-tools/checkouts/first.last/src/memprof"
[ "${#clone}" -gt 60 ] || { echo "readme-check: $clone is not over 60 characters" >&2; exit 1; }
# What the README made in an earlier run goes (cargo's download cache stays).
rm -rf "$home/projects" "$home/.venvs/memprof" "$home/.cache/memprof"
mkdir -p "$(dirname "$clone")"
git clone --quiet --no-local "$repo" "$clone"
# What is committed, plus the working tree's changes (a check before committing sees them).
changes=$(mktemp)
git -C "$repo" diff HEAD --binary >"$changes"
[ ! -s "$changes" ] || git -C "$clone" apply "$changes"
rm -f "$changes"
chown -R "$uid:$gid" "$home/projects"

# The Rust toolchain the README asks for, read-only, at a path the user can read.
toolchain=$(rustc --print sysroot)
work=$(mktemp -d)
fail=0
# The blocks' logs are kept when a check fails.
trap '[ "$fail" -ne 0 ] || rm -rf "$work"' EXIT
chmod 755 "$work"

# Each ```sh block of README.md becomes one script, run with bash -e as the user; its trace
# marks when each command started (seconds from the block's start).
python3 - "$repo/README.md" "$work" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)
for i, block in enumerate(blocks):
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        comment = re.search(r"(^|\s)#\s*(.*)$", line)
        if comment and comment.group(2).startswith("needs "):
            line = f"echo 'not run ({comment.group(2)}): {line.split('#')[0].strip()}'"
        lines.append(line)
    with open(f"{sys.argv[2]}/block{i:02}.sh", "w") as f:
        f.write("PS4='+ [${SECONDS} s] '\nset -x\n" + "\n".join(lines) + "\n")
print(f"readme-check: {len(blocks)} command blocks", file=sys.stderr)
PY
chmod -R a+rX "$work"

# The stand-ins for the user's own files, beside the README's other paths.
for pair in snapshot.pickle:snapshots/demo_oom.pickle step.pickle:snapshots/v2_1_basic.pickle \
  train.memprof:recordings/ledger.memprof; do
  install -o "$uid" -g "$gid" -m 644 "$clone/fixtures/${pair#*:}" "$clone/${pair%%:*}"
done

for block in "$work"/block*.sh; do
  echo "== $(basename "$block"):"
  tail -n +3 "$block" | sed 's/^/   /'
  start=$(date +%s)
  status=0
  # A private mount namespace lends the toolchain at /opt/rust; the user sees nothing of root's.
  unshare -m bash -c '
    mkdir -p /opt/rust && mount --bind -o ro "$1" /opt/rust
    cd "$2" && exec setpriv --reuid "$3" --regid "$4" --init-groups --reset-env \
      env PATH="/opt/rust/bin:$5/.cargo/bin:$5/.venvs/memprof/bin:$5/.local/bin:/usr/local/bin:/usr/bin:/bin" \
      HOME="$5" USER="$6" CARGO_TERM_COLOR=never ${8:+CARGO_BUILD_JOBS="$8"} bash -e "$7"
  ' _ "$toolchain" "$clone" "$uid" "$gid" "$home" "$user" "$block" "${CARGO_BUILD_JOBS:-}" \
    >"$block.log" 2>&1 || status=$?
  took=$(( $(date +%s) - start ))
  tail -n 5 "$block.log" | sed 's/^/   | /'
  grep -E '^\+ \[[0-9]+ s\] ' "$block.log" | grep -v "^+ \[[0-9]* s\] echo 'not run" |
    cut -c1-100 | sed 's/^+ /   started at /' || true
  echo "   exit $status, ${took} s"
  [ "$status" -eq 0 ] || fail=1
  if grep -q '^cargo test --workspace' "$block"; then
    skipped=$(grep -oE 'SKIPPED: [^ ]+: .*not in this repository, see fixtures/README.md' \
      "$block.log" | awk '{print $2}' | sort -u | wc -l)
    counts=$(grep -E '^test result: ' "$block.log" |
      awk '{p += $4; f += $6; i += $8} END {print p + 0, f + 0, i + 0}')
    read -r passed failed ignored <<<"$counts"
    others=$(grep -oE 'SKIPPED: [^ ]+: ' "$block.log" | sort -u | wc -l)
    said=$(tr '\n' ' ' <README.md | tr -s ' ' | grep -oE '[0-9]+ of them pass after printing' |
      grep -oE '^[0-9]+' || echo "?")
    echo "   cargo test: $passed passed, $failed failed, $ignored ignored; $others printed SKIPPED," \
      "$skipped of them for the real snapshots, which the README says of $said"
    [ "$skipped" = "$said" ] || fail=1
  fi
done
if [ "$fail" -ne 0 ]; then
  echo "readme-check: the README does not hold as written (logs above; whole logs in $work)" >&2
  exit 1
fi
echo "readme-check: every command block of README.md ran as $user from $clone"
