"""memprof from Python: record a PyTorch memory snapshot, analyze it.

`record(path)` turns on PyTorch's memory history and writes the snapshot when its block ends,
out-of-memory error included; `analyze(path)` returns `memprof analyze --json` as a dict. The
pytest plugin (`memprof_gpu.pytest_plugin`) adds GPU memory markers. PyTorch is imported only
when `record` is entered.
"""

from ._binary import MemprofError, analyze, memprof_binary
from ._record import record

__all__ = ["MemprofError", "analyze", "memprof_binary", "record"]
