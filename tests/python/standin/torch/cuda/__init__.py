"""`torch.cuda` of the stand-in: availability, allocated bytes, peak statistics, the OOM error."""

import os

from . import memory


class OutOfMemoryError(RuntimeError):
    pass


def is_available():
    return os.environ.get("STANDIN_CUDA") == "1"


def reset_peak_memory_stats(device=None):
    memory._state.peak = memory._state.allocated()


def memory_allocated(device=None):
    return memory._state.allocated()


def standin_alloc(nbytes, site, line=1):
    """Allocates `nbytes` on device 0 from `site` (a function name): returns its handle."""
    return memory._state.alloc(nbytes, site, line)


def standin_free(handle):
    memory._state.free(handle)
