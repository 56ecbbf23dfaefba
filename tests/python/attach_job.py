"""A training job for the `memprof attach` tests, started the usual way: no shim, no environment
variable, nothing of memprof's. It imports the stand-in torch from the folder given as its first
argument, initializes CUDA and steps: each step allocates and frees an activation (`forward`),
and every 20th keeps an output (`cache_outputs`, the growth). Its second argument is a folder:
  pid          written once it runs
  state.json   written on SIGUSR1: PyTorch's history, the OOM observers, `sys.modules`, the
               names in `__main__`; the steps so far, the time they took (their sleep left
               out), and the longest pause between two steps since the last state.json
  oom-now      when it appears, the next step asks for more than the device has, and the job
               dies of torch.cuda.OutOfMemoryError
Options after them: `history` (the job turns PyTorch's history on itself), `no-torch` (never
imports torch), `no-cuda` (imports it, never initializes CUDA), `async` (cudaMallocAsync)."""

import json
import os
import signal
import sys
import time

STANDIN, FOLDER = sys.argv[1], sys.argv[2]
OPTIONS = set(sys.argv[3:])
sys.path.insert(0, STANDIN)
longest_pause = 0.0
busy = 0.0


def write_state(signum, frame):
    torch = sys.modules.get("torch")
    memory = torch.cuda.memory if torch is not None else None
    state = {
        "history": torch.cuda.standin_history() if torch else None,
        "observers": len(memory._state.observers) if memory else 0,
        "modules": sorted(sys.modules),
        "main": sorted(vars(sys.modules["__main__"])),
        "longest_pause_ms": longest_pause * 1000.0,
        "steps": step,
        "busy_s": busy,
    }
    with open(os.path.join(FOLDER, "state.json.part"), "w") as out:
        json.dump(state, out)
    os.rename(os.path.join(FOLDER, "state.json.part"), os.path.join(FOLDER, "state.json"))
    globals()["longest_pause"] = 0.0


signal.signal(signal.SIGUSR1, write_state)
if "no-torch" not in OPTIONS:
    import torch

    if "async" in OPTIONS:
        torch.cuda.standin_set_backend("cudaMallocAsync")
    if "no-cuda" not in OPTIONS:
        torch.cuda.init()
    if "history" in OPTIONS:
        torch.cuda.memory._record_memory_history(max_entries=5000)
SLEEP = 0.002
kept = []
step = 0
activation = None
last = now = begun = time.perf_counter()
with open(os.path.join(FOLDER, "pid"), "w") as out:
    out.write(str(os.getpid()))
while True:
    begun = time.perf_counter()
    if "no-torch" not in OPTIONS and "no-cuda" not in OPTIONS:
        if os.path.exists(os.path.join(FOLDER, "oom-now")):
            torch.cuda.standin_set_capacity(torch.cuda.memory._state.reserved() + (1 << 20))
        activation = torch.cuda.standin_alloc(1 << 20, "forward", 12)
        torch.cuda.standin_free(activation)
        if step % 20 == 0 and len(kept) < 500:
            kept.append(torch.cuda.standin_alloc(2 << 20, "cache_outputs", 30))
    step += 1
    busy += time.perf_counter() - begun
    time.sleep(SLEEP)
    now = time.perf_counter()
    longest_pause = max(longest_pause, now - last - SLEEP)
    last = now
