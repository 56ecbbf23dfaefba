"""`record(path)`: PyTorch's memory history for a block of code, its snapshot written at the end."""

from pathlib import Path


class record:
    """Context manager: turns on PyTorch's CUDA memory history on entry and writes the snapshot
    to `path` on exit, when the block ends normally and when it raises (an out-of-memory error
    included; the exception is never swallowed). History is turned off afterwards.

        with memprof_gpu.record("step.pickle"):
            train_step()
    """

    def __init__(self, path, max_entries=100_000):
        self.path = Path(path)
        self.max_entries = max_entries
        self._torch = None

    def __enter__(self):
        import torch  # imported here: importing memprof_gpu does not import PyTorch

        self._torch = torch
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        return self.path

    def __exit__(self, exc_type, exc, tb):
        memory = self._torch.cuda.memory
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            memory._dump_snapshot(str(self.path))
        finally:
            memory._record_memory_history(enabled=None)
        return False
