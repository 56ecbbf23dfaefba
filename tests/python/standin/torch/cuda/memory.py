"""`torch.cuda.memory` of the stand-in: history, `_snapshot`, `_dump_snapshot`, `memory_stats`.
Formats as in PyTorch 2.5: trace entries with `time_us`, an `oom` entry with `device_free`."""

import collections
import pickle
import sys
import time

SEGMENT = 2 << 20  # every allocation has a segment of its own, rounded up to 2 MiB
OutOfMemoryError = RuntimeError  # replaced by torch.cuda.OutOfMemoryError


class _State:
    def __init__(self):
        self.live = {}  # address -> (size, segment size, frames recorded)
        self.next_address = 0x7F0000000000
        self.trace = None  # None while history is off
        self.max_entries = 0
        self.peak = 0
        self.reserved_peak = 0
        self.initialized = False
        self.capacity = None
        self.backend = "native"
        self.observers = []
        self.num_ooms = 0

    def allocated(self):
        return sum(size for size, _, _ in self.live.values())

    def reserved(self):
        return sum(segment for _, segment, _ in self.live.values())

    def record(self, action, address, size, frames, key="addr"):
        if self.trace is not None:
            entry = {"action": action, key: address, "size": size, "stream": 0,
                     "time_us": time.time_ns() // 1000}
            if frames:
                entry["frames"] = frames
            self.trace.append(entry)
            del self.trace[:-self.max_entries]  # a ring buffer of max_entries

    def alloc(self, nbytes, site, line):
        self.initialized = True
        frames = [{"name": site, "filename": "/work/model.py", "line": line}]
        segment = -(-nbytes // SEGMENT) * SEGMENT
        if self.capacity is not None and self.reserved() + segment > self.capacity:
            free = self.capacity - self.reserved()
            self.record("oom", free, segment, frames, key="device_free")
            self.num_ooms += 1
            for observer in list(self.observers):
                observer(0, segment, self.capacity, free)  # PyTorch passes the device total
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate %d bytes. GPU 0 has a total capacity of "
                "%d bytes of which %d bytes is free." % (segment, self.capacity, free))
        address = self.next_address
        self.next_address += segment
        self.record("segment_alloc", address, segment, frames)
        self.record("alloc", address, nbytes, frames)
        # A block keeps its stack only when history was on at its allocation, as in PyTorch.
        self.live[address] = (nbytes, segment, frames if self.trace is not None else [])
        self.peak = max(self.peak, self.allocated())
        self.reserved_peak = max(self.reserved_peak, self.reserved())
        return address

    def free(self, address):
        nbytes, segment, frames = self.live.pop(address)
        self.record("free_requested", address, nbytes, frames)
        self.record("free_completed", address, nbytes, frames)
        self.record("segment_free", address, segment, frames)


_state = _State()


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                           device=None, clear_history=False):
    """As in PyTorch: None turns history off and clears it; turning it on again keeps it."""
    if enabled is None:
        _state.trace = None
        return
    if _state.trace is None or clear_history:
        _state.trace = []
    _state.max_entries = max(1, 1 if enabled == "state" else max_entries)


def _snapshot(device=None):
    if _state.backend != "native":
        raise RuntimeError("memory snapshot is not supported by the %s allocator" % _state.backend)
    segments = []
    for address, (size, segment, frames) in sorted(_state.live.items()):
        blocks = [
            {"address": address, "size": size, "requested_size": size,
             "state": "active_allocated", "frames": frames}
        ]
        if segment > size:
            blocks.append({"address": address + size, "size": segment - size,
                           "requested_size": 0, "state": "inactive", "frames": []})
        segments.append({
            "device": 0, "address": address, "total_size": segment, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
        })
    return {"segments": segments, "device_traces": [list(_state.trace or [])]}


def _dump_snapshot(filename="dump_snapshot.pickle"):
    s = _snapshot()
    with open(filename, "wb") as out:
        pickle.dump(s, out)


def memory_stats(device=None):
    """The flat statistics PyTorch returns (a subset of its keys); {} before CUDA is
    initialized, as PyTorch returns."""
    if not _state.initialized:
        return collections.OrderedDict()
    allocated, reserved = _state.allocated(), _state.reserved()
    stats = {
        "active_bytes.all.current": allocated, "active_bytes.all.peak": _state.peak,
        "allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": _state.peak,
        "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": _state.reserved_peak,
        "inactive_split_bytes.all.current": 0, "inactive_split_bytes.all.peak": 0,
        "num_alloc_retries": 0, "num_ooms": _state.num_ooms,
        "allocation.all.current": len(_state.live), "segment.all.current": len(_state.live),
    }
    return collections.OrderedDict(sorted(stats.items()))
