"""A training-like job for `memprof attach` on a real GPU (scripts/gpu-check.sh), started the
usual way: it steps forever, each step a matmul whose output it frees, every 20th step keeping
one (the growth, at `cache_outputs`). It writes its PID to the file given as its first argument;
when the file given as its second argument appears, it asks for more memory than the GPU has and
dies of torch.cuda.OutOfMemoryError. The third argument is where it writes, on SIGUSR1, whether
PyTorch's history is on (a snapshot with a trace or stacks) and its module count."""

import json
import os
import signal
import sys
import time

import torch

PID_FILE, OOM_FILE, STATE_FILE = sys.argv[1:4]


def write_state(signum, frame):
    snapshot = torch.cuda.memory._snapshot()
    history = any(snapshot["device_traces"]) or any(
        b.get("frames") for s in snapshot["segments"] for b in s["blocks"])
    with open(STATE_FILE, "w") as out:
        json.dump({"history": history, "modules": len(sys.modules)}, out)


signal.signal(signal.SIGUSR1, write_state)
weights = torch.randn(2048, 2048, device="cuda")
kept = []


def cache_outputs(x):
    kept.append(x.clone())


with open(PID_FILE, "w") as out:
    out.write(str(os.getpid()))
step = 0
while True:
    if os.path.exists(OOM_FILE):
        free, total = torch.cuda.mem_get_info()
        torch.empty(total, dtype=torch.uint8, device="cuda")
    y = weights @ weights
    if step % 20 == 0 and len(kept) < 200:
        cache_outputs(y)
    del y
    torch.cuda.synchronize()
    step += 1
    time.sleep(0.005)
