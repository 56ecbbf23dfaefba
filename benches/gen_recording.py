#!/usr/bin/env python3
"""Writes a memprof recording (format version 3, crates/memprof-wire) of about SIZE_MB
megabytes, the shape a training loop under `memprof run` leaves: two devices, allocations and
frees churning over a window of live ones, call stacks (defined before first use) in a
mapped library, a cuMemGetInfo now and then, a few out-of-memory failures, a trailer.

Usage: gen_recording.py OUT SIZE_MB
"""

import struct
import sys
from collections import deque

RECORD = struct.Struct("<HHIQQQQQIiII")  # 64 bytes: see crates/memprof-wire/src/lib.rs
ALLOC, FREE, ALLOC_ASYNC, FREE_ASYNC, MEM_GET_INFO, TRAILER, STACK, MAPPING = 1, 2, 3, 4, 9, 10, 17, 18
OOM = 2
PID = 4242
LIB_START = 0x7F00_0000_0000
STACKS = 400
FRAMES = 6
LIVE = 3000  # live allocations per device before the oldest is freed
TOTAL = 80 << 30


def record(kind, ts, ptr=0, size=0, stream=0, aux=0, device=-1, result=0, stack=0, tid=7):
    return RECORD.pack(kind, 0, tid, ts, ptr, size, stream, aux, PID, device, result, stack)


def padded(payload):
    return payload + b"\0" * (-len(payload) % 64)


def main():
    out, size_mb = sys.argv[1], int(sys.argv[2])
    target = size_mb * 1_000_000
    start_ns = 1_000_000_000
    head = b"MEMPROF\0" + struct.pack("<IIIIQ", 3, 64, PID, 0, start_ns)
    body = b""
    for tag, value in [(1, struct.pack("<Q", 1_760_000_000 * 10**9)), (2, b"gen-host")]:
        body += struct.pack("<HI", tag, len(value)) + value
    for arg in [b"python", b"train.py", b"--steps", b"1000"]:
        body += struct.pack("<HI", 3, len(arg)) + arg
    written = 0
    with open(out, "wb") as f:
        f.write(head + struct.pack("<I", len(body)) + body)
        path = b"/nonexistent/libtrain.so"
        f.write(record(MAPPING, 0, LIB_START, 1 << 24, len(path), 0) + padded(path))
        written = f.tell()
        defined = set()
        live = {0: deque(), 1: deque()}
        next_addr = {0: 0x7000_0000_0000, 1: 0x7100_0000_0000}
        ts = start_ns
        step = 0
        batch = []
        while written < target:
            step += 1
            ts += 1000
            device = step & 1
            stack = step * 7 % STACKS + 1
            if stack not in defined:
                defined.add(stack)
                frames = b"".join(
                    struct.pack("<Q", LIB_START + 0x1000 + stack * 0x100 + k * 8) for k in range(FRAMES)
                )
                head_rec = record(STACK, 0, size=FRAMES, aux=stack)
                batch.append(head_rec + padded(frames))
                written += 64 + len(padded(frames))
            size = ((step * 2654435761) % (16 << 20)) + 512
            if step % 997 == 0:
                batch.append(record(MEM_GET_INFO, ts, size=TOTAL, aux=TOTAL // 3, device=device))
            elif step % 49_999 == 0:
                batch.append(record(ALLOC, ts, 0, 40 << 30, device=device, result=OOM, stack=stack))
            else:
                if len(live[device]) >= LIVE:
                    addr, stream = live[device].popleft()
                    kind = FREE_ASYNC if stream else FREE
                    batch.append(record(kind, ts - 500, addr, 0, stream, device=device))
                    written += 64
                addr = next_addr[device]
                next_addr[device] += (size + 0xFFFFF) & ~0xFFFFF
                stream = 0x55 if step % 3 == 0 else 0
                kind = ALLOC_ASYNC if stream else ALLOC
                batch.append(record(kind, ts, addr, size, stream, device=device, stack=stack))
                live[device].append((addr, stream))
            written += 64
            if len(batch) >= 65536:
                f.write(b"".join(batch))
                batch.clear()
        f.write(b"".join(batch))
        f.write(record(TRAILER, ts, size=step, aux=0))


if __name__ == "__main__":
    main()
