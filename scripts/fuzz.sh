#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/fuzz_targets/) one after another, each for SECONDS, on one core,
# seeded with the repository's fixtures and the real snapshots in ../shared/fixtures/real.
# Prints each target's executions, coverage and findings (crashes land in
# fuzz/artifacts/TARGET/); the full libFuzzer output is in fuzz/logs/TARGET.log.
#
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]      (default: 60 s, every target)
# env:   FUZZ_SANITIZER=none (default: fastest, for volume) or address (the ASan pass)
#        FUZZ_RSS_MB=2048    memory limit of one input
#        FUZZ_SKIP_BUILD=1   run the targets as last built (fuzz/target/SANITIZER/, one build each)
#        FUZZ_MAX_LEN=65536  the longest input libFuzzer makes
#        FUZZ_FORK=1         0: no fork mode (faster; the run stops at the first finding)
# needs: cargo-fuzz (cargo install cargo-fuzz); the stable toolchain works with
#        RUSTC_BOOTSTRAP=1, which this script sets.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
all=(snapshot snapshot_analysis amplification recording live agent_http gate alloc_conf sizes oom_log)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
sanitizer="${FUZZ_SANITIZER:-none}"
rss="${FUZZ_RSS_MB:-2048}"
command -v cargo-fuzz >/dev/null || { echo "needs cargo-fuzz: cargo install cargo-fuzz" >&2; exit 2; }
export RUSTC_BOOTSTRAP=1
shared=../shared/fixtures/real

# Seeds: copies, so libFuzzer may add to the corpus (fuzz/corpus/ is git-ignored).
seed() { # TARGET FILE...
    local dir="fuzz/corpus/$1"
    shift
    mkdir -p "$dir"
    for f in "$@"; do [[ -f "$f" ]] && cp "$f" "$dir/" || true; done
}
seed_text() { # TARGET NAME TEXT
    mkdir -p "fuzz/corpus/$1"
    printf '%b' "$3" > "fuzz/corpus/$1/$2"
}
seed snapshot fixtures/snapshots/*.pickle fixtures/invalid/* "$shared"/*.pickle "$shared"/more/*.pickle
seed snapshot_analysis fixtures/snapshots/*.pickle fixtures/invalid/* "$shared"/*.pickle "$shared"/more/*.pickle
seed amplification fixtures/snapshots/*.pickle fixtures/invalid/* "$shared"/*.pickle "$shared"/more/*.pickle
# Snapshots that name one trace entry many times (memo references past one APPENDS batch, DUP),
# written by Python's pickle, for the targets that read snapshots.
if command -v python3 >/dev/null; then
    for t in snapshot snapshot_analysis amplification; do
        python3 - "fuzz/corpus/$t" <<'PY'
import pickle, struct, sys
out = sys.argv[1]
frame = {"filename": "train.py", "line": 7, "name": "step"}
entry = {"action": "alloc", "addr": 512, "size": 512, "stream": 0}
nested = dict(entry, frames=[frame])
segment = {"address": 0, "total_size": 2 << 20, "device": 0, "stream": 0,
           "segment_type": "large", "blocks": [{"address": 0, "size": 2 << 20,
                                                "state": "active_allocated"}]}
def write(name, obj):
    with open(f"{out}/{name}", "wb") as f:
        f.write(pickle.dumps(obj, 4))
write("shared_entry", {"segments": [], "device_traces": [[nested] * 1500]})
write("shared_flat_entry", {"segments": [], "device_traces": [[entry] * 1500]})
write("shared_entry_then_segments",
      {"device_traces": [[nested] * 3], "segments": [segment, dict(segment, address=4 << 20)]})
def text(s):
    return b"X" + struct.pack("<I", len(s)) + s.encode()
dup = (b"\x80\x02}(" + text("segments") + b"]" + text("device_traces") + b"]](}("
       + text("action") + text("alloc") + text("addr") + b"K\x00" + text("size") + b"K\x01u"
       + b"2" * 3000 + b"eau.")
with open(f"{out}/duplicated_entry", "wb") as f:
    f.write(dup)
PY
    done
fi
recordings=(fixtures/recordings/*.memprof)
while IFS= read -r f; do recordings+=("$f"); done < <(find target/tmp -name '*.memprof' -size -64k 2>/dev/null | head -200)
seed recording "${recordings[@]}"
seed live "${recordings[@]}"
seed oom_log fixtures/logs/*
seed_text agent_http get 'GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n'
seed_text agent_http pipelined 'GET /metrics HTTP/1.0\r\n\r\nHEAD / HTTP/1.1\r\nHost: a\r\n\r\n'
seed_text agent_http body 'POST /metrics HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\nab'
seed_text agent_http chunked 'GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n'
n=0
for conf in "expandable_segments:True" "max_split_size_mb:128,garbage_collection_threshold:0.6" \
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]" "backend:cudaMallocAsync" \
    "per_process_memory_fraction:0.5,max_non_split_rounding_mb:64,large_segment_size_mb:40" \
    "roundup_power2_divisions:4,pinned_use_cuda_host_register:True"; do
    n=$((n + 1))
    seed_text alloc_conf "conf$n" "$conf"
done
n=0
for size in 0 512 1048576 80GiB 1.5GB "4 KiB" 10kB 3TiB "1023.99 KiB" 18446744073709551615; do
    n=$((n + 1))
    seed_text sizes "size$n" "$size"
done
# Gate inputs: a baseline and an analyze document of the same fixture, NUL between.
bin=target/debug/memprof
if [[ -x "$bin" ]]; then
    mkdir -p fuzz/corpus/gate
    tmp=$(mktemp -d)
    for f in fixtures/snapshots/oom.pickle fixtures/snapshots/multi_device.pickle fixtures/recordings/peak_oom_v2.memprof; do
        name=$(basename "$f")
        "$bin" gate --write-baseline "$tmp/base.json" "$f" > /dev/null 2>&1 || continue
        "$bin" analyze --json "$f" > "$tmp/analyze.json" 2> /dev/null || continue
        { cat "$tmp/base.json"; printf '\0'; cat "$tmp/analyze.json"; } > "fuzz/corpus/gate/$name"
    done
    rm -rf "$tmp"
else
    echo "note: $bin is not built (cargo build): the gate target starts without seeds" >&2
fi

dict() { # TARGET -> libFuzzer dictionary flag, when there is one
    case "$1" in
    snapshot | snapshot_analysis | amplification) echo "-dict=fuzz/snapshot.dict" ;;
    agent_http) echo "-dict=fuzz/http.dict" ;;
    *) echo "" ;;
    esac
}

if [[ -z "${FUZZ_SKIP_BUILD:-}" ]]; then
    (cd fuzz && cargo fuzz build -s "$sanitizer" --target-dir "target/$sanitizer")
fi
triple=$(rustc -vV | sed -n 's/^host: //p')
mkdir -p fuzz/logs
printf '%-11s %14s %9s %9s %s\n' target executions cov features findings
for t in "${targets[@]}"; do
    log="fuzz/logs/$t.log"
    mkdir -p "fuzz/artifacts/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    # One worker in fork mode, so a finding is kept and the run goes on (the parent is idle);
    # without it (FUZZ_FORK=0) the target runs several times faster and stops at a finding.
    fork=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
    [[ "${FUZZ_FORK:-1}" == 0 ]] && fork=()
    # shellcheck disable=SC2046
    "fuzz/target/$sanitizer/$triple/release/$t" "fuzz/corpus/$t" $(dict "$t") \
        -artifact_prefix="fuzz/artifacts/$t/" -max_total_time="$secs" -rss_limit_mb="$rss" \
        -max_len="${FUZZ_MAX_LEN:-65536}" -timeout=30 "${fork[@]}" \
        -print_final_stats=1 > "$log" 2>&1 || true
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
    ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
    printf '%-11s %14s %9s %9s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" $((after - before))
done
