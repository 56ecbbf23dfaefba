"""`torch.cuda.memory` of the stand-in: history, `_snapshot` and `_dump_snapshot`."""

import pickle

SEGMENT = 2 << 20  # every allocation has a segment of its own, rounded up to 2 MiB


class _State:
    def __init__(self):
        self.live = {}  # address -> (size, segment size, frames)
        self.next_address = 0x7F0000000000
        self.trace = None  # None while history is off
        self.peak = 0

    def allocated(self):
        return sum(size for size, _, _ in self.live.values())

    def record(self, action, address, size, frames):
        if self.trace is not None:
            self.trace.append(
                {"action": action, "addr": address, "size": size, "stream": 0, "frames": frames}
            )

    def alloc(self, nbytes, site, line):
        frames = [{"name": site, "filename": "/work/model.py", "line": line}]
        segment = -(-nbytes // SEGMENT) * SEGMENT
        address = self.next_address
        self.next_address += segment
        self.record("segment_alloc", address, segment, frames)
        self.record("alloc", address, nbytes, frames)
        self.live[address] = (nbytes, segment, frames)
        self.peak = max(self.peak, self.allocated())
        return address

    def free(self, address):
        nbytes, segment, frames = self.live.pop(address)
        self.record("free_requested", address, nbytes, frames)
        self.record("free_completed", address, nbytes, frames)
        self.record("segment_free", address, segment, frames)


_state = _State()


def _record_memory_history(enabled="all", max_entries=1, **_):
    _state.trace = None if enabled is None else []


def _snapshot():
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
    with open(filename, "wb") as out:
        pickle.dump(_snapshot(), out)
