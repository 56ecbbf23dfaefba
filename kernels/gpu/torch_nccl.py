"""A PyTorch step with an NCCL all-reduce (one process, world size 1) and pinned host memory,
for the ledger check on a real GPU (scripts/gpu-check.sh): under `memprof run -o OUT.memprof`
it writes PyTorch's snapshot as OUT.oom-<pid>.pickle, where `memprof analyze` finds it, so the
ledger joins PyTorch's segments and names NCCL's memory outside them.

    python3 torch_nccl.py OUT.memprof
"""

import os
import pickle
import sys

import torch
import torch.distributed as dist


def main() -> int:
    recording = sys.argv[1]
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    dist.init_process_group("nccl", rank=0, world_size=1)
    x = torch.randn(64 << 20, device="cuda")  # 256 MiB
    dist.all_reduce(x)
    pinned = torch.empty(32 << 20, pin_memory=True)  # 128 MiB of pinned host memory
    torch.cuda.synchronize()
    print("max_memory_reserved", torch.cuda.max_memory_reserved(), "pinned", pinned.numel() * 4)
    stem = recording[: -len(".memprof")] if recording.endswith(".memprof") else recording
    with open(f"{stem}.oom-{os.getpid()}.pickle", "wb") as f:
        pickle.dump(torch.cuda.memory._snapshot(), f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
