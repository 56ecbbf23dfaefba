#!/bin/sh
# How much the shim's live socket can hurt the program it watches: the worst latency of a single
# CUDA call, and the growth of the program's resident memory, while clients hit the socket.
# kernels/workloads/hold_timing.c holds HELD address reservations (so a new client's first
# snapshot is HELD records), then times every call of an alloc/free loop for SECONDS while, per scenario:
#   quiet   no client;
#   churn   500 clients connect and close at once, one after another;
#   idle    8 clients connect and never read, then a 9th attaches and reads until its first
#           snapshot ends (the mark after it): "ninth" says whether it got it, and in how long;
#   both    8 idle clients, then the 500 connect/close, then the 9th.
# Runs each scenario RUNS times, interleaved, and prints the medians. Builds the release shim
# (or takes SHIM=path to compare another build), the fake driver and the workload.
#
#   sh benches/live_socket_stall.sh [HELD] [RUNS] [SECONDS]   (defaults: 200000, 5, 3)
set -eu
HELD=${1:-200000}
RUNS=${2:-5}
SECONDS_=${3:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ -z "${SHIM:-}" ]; then
    cargo build --quiet --release -p memprof-shim --manifest-path "$ROOT/Cargo.toml"
    SHIM="$ROOT/target/release/libmemprof_shim.so"
fi
cc -O2 -shared -fPIC -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1 -o "$WORK/libcuda.so.1" \
    "$ROOT/kernels/fake_cuda/fake_cuda.c" -lpthread
cc -O2 -o "$WORK/hold_timing" "$ROOT/kernels/workloads/hold_timing.c" \
    -L"$WORK" -l:libcuda.so.1 -Wl,-rpath,"$WORK"

python3 - "$WORK" "$SHIM" "$HELD" "$RUNS" "$SECONDS_" <<'PY'
import os, socket, statistics, struct, subprocess, sys, time
work, shim, held, runs, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
RECORD = 64
LIVE_DROPPED, SNAPSHOT = 16, 4
STACK, MAPPING = 17, 18

def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s

def first_sample(path, limit=30.0):
    """Seconds until the snapshot's end mark arrives, or None (refused, closed, too slow)."""
    start = time.monotonic()
    try:
        s = connect(path)
    except OSError:
        return None
    s.settimeout(limit)
    data, at = b"", None
    try:
        while time.monotonic() - start < limit:
            chunk = s.recv(1 << 20)
            if not chunk:
                return None
            data += chunk
            if at is None:
                # A 32-byte file header, then a process block that starts with its length.
                if len(data) < 36:
                    continue
                at = 36 + struct.unpack_from("<I", data, 32)[0]
            if at > 0:
                if len(data) < at:
                    continue
                data, at = data[at:], 0
            off = 0
            while off + RECORD <= len(data):
                kind, flags = struct.unpack_from("<HH", data, off)
                if kind == LIVE_DROPPED and flags & SNAPSHOT:
                    return time.monotonic() - start
                # Stack and mapping definitions carry a payload padded to whole records.
                payload = 0
                if kind == STACK:
                    payload = struct.unpack_from("<Q", data, off + 24)[0] * 8
                elif kind == MAPPING:
                    payload = struct.unpack_from("<Q", data, off + 32)[0]
                length = RECORD + -(-payload // RECORD) * RECORD
                if off + length > len(data):
                    break
                off += length
            data = data[off:]
    except OSError:
        return None
    finally:
        s.close()
    return None

def run(scenario):
    out = os.path.join(work, "run.memprof")
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ, LD_PRELOAD=shim, MEMPROF_OUT=out, XDG_RUNTIME_DIR=work)
    p = subprocess.Popen([os.path.join(work, "hold_timing"), held, seconds], env=env,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    path = os.path.join(work, "memprof", f"{p.pid}.sock")
    idle, ninth = [], None
    if scenario in ("idle", "both"):
        idle = [connect(path) for _ in range(8)]
        time.sleep(0.2)
    if scenario in ("churn", "both"):
        for _ in range(500):
            try:
                connect(path).close()
            except OSError:
                pass
    if scenario in ("idle", "both"):
        ninth = first_sample(path)
    line = p.stdout.readline()
    p.wait()
    for s in idle:
        s.close()
    fields = dict(kv.split("=") for kv in line.split())
    return (int(fields["max_ns"]) / 1e6,
            (int(fields["rss_max_kb"]) - int(fields["rss_start_kb"])) / 1024, ninth)

scenarios = ("quiet", "churn", "idle", "both")
results = {s: [] for s in scenarios}
for _ in range(runs):
    for s in scenarios:
        results[s].append(run(s))
print(f"live socket vs the program's CUDA calls: {held} reservations held, {seconds} s of timed "
      f"calls, {runs} runs per scenario, medians (shim {shim})")
for s in scenarios:
    worst = statistics.median(r[0] for r in results[s])
    rss = statistics.median(r[1] for r in results[s])
    line = f"  {s:<6} worst call {worst:9.2f} ms   resident memory +{rss:7.1f} MiB"
    if s in ("idle", "both"):
        got = [r[2] for r in results[s] if r[2] is not None]
        line += f"   ninth client got its first sample {len(got)}/{runs}"
        if got:
            line += f" (median {statistics.median(got):.2f} s)"
    print(line)
PY
