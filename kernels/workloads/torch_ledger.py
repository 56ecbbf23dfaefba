"""Plays PyTorch for the ledger test (tests/ledger.rs), with ctypes and no torch: allocates its
caching allocator's segments through the CUDA driver (default pool, a CUDA graph's private pool
(1, 0), and one segment freed before the dump), has the fake NCCL library (kernels/fake_nccl)
take device buffers and pinned host memory, tells the fake NVML (by rewriting its scenario file)
that the process uses the driver's total plus a CUDA context, and writes a PyTorch memory
snapshot naming exactly its segments, plus one of another process (the same segments elsewhere).

    python3 torch_ledger.py LIBDIR SCENARIO SNAPSHOT OTHER_SNAPSHOT CONTEXT_BYTES

(%p in SNAPSHOT is replaced by the process id, as `memprof run --torch` names its snapshots.)
"""
import ctypes
import os
import pickle
import sys
import time

MIB = 1 << 20
lib_dir, scenario, snapshot_path, other_path, context = sys.argv[1:6]
snapshot_path = snapshot_path.replace("%p", str(os.getpid()))
context = int(context)

cuda = ctypes.CDLL(os.path.join(lib_dir, "libcuda.so.1"))
nccl = ctypes.CDLL(os.path.join(lib_dir, "libfakenccl.so"))
nccl.fakeNcclCommInit.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t]
held = 0


def alloc(size):
    global held
    ptr = ctypes.c_uint64()
    result = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))
    assert result == 0, result
    held += size
    return ptr.value


def free(ptr, size):
    global held
    assert cuda.cuMemFree_v2(ctypes.c_uint64(ptr)) == 0
    held -= size


def nvml_reports(used):
    """The fake NVML reads its scenario again when the file is replaced."""
    text = (
        "device 85899345920 1000 85899344920 0 0 GPU-fake Fake CUDA Device\n"
        f"process 0 {os.getpid()} compute {used}\n"
    )
    with open(scenario + ".new", "w") as f:
        f.write(text)
    os.replace(scenario + ".new", scenario)
    time.sleep(1.2)  # several samples at 200 ms


assert cuda.cuInit(0) == 0
small = alloc(2 * MIB)
large = alloc(20 * MIB)
graph = alloc(4 * MIB)
gone = alloc(6 * MIB)
assert nccl.fakeNcclCommInit(2, 8 * MIB, 3 * MIB) == 0
held += 16 * MIB
nvml_reports(held + context)  # the peak
free(gone, 6 * MIB)
assert nccl.fakeNcclShrink() == 0
held -= 8 * MIB
nvml_reports(held + context)  # the end


def segment(addr, size, pool, kind):
    block = {"address": addr, "size": size, "requested_size": size,
             "state": "active_allocated", "frames": []}
    return {"device": 0, "address": addr, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0, "segment_type": kind,
            "segment_pool_id": pool, "is_expandable": False, "frames": [], "blocks": [block]}


def entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": []}


def snapshot(shift):
    live = [(small, 2 * MIB, (0, 0), "small"), (large, 20 * MIB, (0, 0), "large"),
            (graph, 4 * MIB, (1, 0), "large")]
    trace = []
    for i, (addr, size) in enumerate([(small, 2 * MIB), (large, 20 * MIB), (graph, 4 * MIB),
                                      (gone, 6 * MIB)]):
        trace.append(entry("segment_alloc", addr + shift, size, 10 * i))
        trace.append(entry("alloc", addr + shift, size, 10 * i + 1))
    trace.append(entry("free_requested", gone + shift, 6 * MIB, 100))
    trace.append(entry("free_completed", gone + shift, 6 * MIB, 101))
    trace.append(entry("segment_free", gone + shift, 6 * MIB, 102))
    return {"segments": [segment(a + shift, s, p, k) for a, s, p, k in live],
            "device_traces": [trace]}


with open(snapshot_path, "wb") as f:
    pickle.dump(snapshot(0), f, protocol=4)
with open(other_path, "wb") as f:
    pickle.dump(snapshot(1 << 40), f, protocol=3)
print(os.getpid())
