"""`torch.cuda` of the stand-in: availability, lazy initialization, statistics, the OOM error."""

import os

from . import memory
from .memory import memory_stats  # noqa: F401


class OutOfMemoryError(RuntimeError):
    pass


memory.OutOfMemoryError = OutOfMemoryError


def is_available():
    return os.environ.get("STANDIN_CUDA") == "1"


def is_initialized():
    return memory._state.initialized


def init():
    memory._state.initialized = True


def device_count():
    return 1


def get_allocator_backend():
    return memory._state.backend


def reset_peak_memory_stats(device=None):
    memory._state.peak = memory._state.allocated()


def memory_allocated(device=None):
    return memory._state.allocated()


def standin_alloc(nbytes, site, line=1):
    """Allocates `nbytes` on device 0 from `site` (a function name): returns its handle. Raises
    OutOfMemoryError (after recording an `oom` entry and calling the observers, as PyTorch does)
    past the capacity `standin_set_capacity` set."""
    return memory._state.alloc(nbytes, site, line)


def standin_free(handle):
    memory._state.free(handle)


def standin_set_capacity(nbytes):
    """The device's memory: an allocation whose segment would pass it runs out of memory."""
    memory._state.capacity = nbytes


def standin_set_backend(name):
    """`native` (the caching allocator) or `cudaMallocAsync`, which has no snapshot."""
    memory._state.backend = name


def standin_history():
    """What the history is now: None when off, else (max_entries, entries recorded)."""
    state = memory._state
    return None if state.trace is None else (state.max_entries, len(state.trace))
