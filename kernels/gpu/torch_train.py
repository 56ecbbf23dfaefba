"""A small PyTorch training run for memprof's checks on a real GPU.

Records the caching allocator's history, trains a small MLP for a few steps, dumps a snapshot
(--snapshot), then, with --oom, asks for more memory than the device has so the snapshot also
holds an `oom` entry. Needs PyTorch with CUDA; prints one line per step.
"""

import argparse
import sys

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--snapshot", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--oom", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 4096)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(args.steps):
        x = torch.randn(256, 4096, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        print(f"step {step} reserved {torch.cuda.memory_reserved()}", flush=True)
    if args.oom:
        free, total = torch.cuda.mem_get_info()
        try:
            torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            print(f"oom as intended: {str(e).splitlines()[0]}", flush=True)
    torch.cuda.memory._dump_snapshot(args.snapshot)
    print(f"snapshot {args.snapshot}", flush=True)
    print(f"max_memory_reserved {torch.cuda.max_memory_reserved()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
