"""`torch._C` of the stand-in: the out-of-memory observers PyTorch's allocator calls."""

from .cuda import memory as _memory


def _cuda_attach_out_of_memory_observer(observer):
    """Registers `observer(device, alloc, device_total, device_free)`; like PyTorch's, it
    cannot be removed."""
    _memory._state.observers.append(observer)
