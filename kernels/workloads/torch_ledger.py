"""Plays PyTorch for the ledger test (tests/ledger.rs), with ctypes and no torch: allocates its
caching allocator's segments through the CUDA driver (default pool, a CUDA graph's private pool
(1, 0), and one segment freed before the dump), has the fake NCCL library (kernels/fake_nccl)
take device buffers and pinned host memory, pins host memory as PyTorch's caching host allocator
does (cuMemHostAlloc, or cuMemHostRegister of a malloc'd buffer with
pinned_use_cuda_host_register; one block given back by empty_cache before the dump), tells the
fake NVML (by rewriting its scenario file) that the process uses the driver's total plus a CUDA
context, and writes a PyTorch memory snapshot naming exactly its segments and host segments
(`host_segments`, `host_traces`), plus one of another process (the same segments elsewhere).

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


def host_alloc(size):
    """cudaHostAlloc, as the host allocator's allocate_host_memory calls it."""
    ptr = ctypes.c_void_p()
    assert cuda.cuMemHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(size), 0) == 0
    return ptr.value


def host_register(size):
    """malloc and cudaHostRegister (pinned_use_cuda_host_register)."""
    buffer = ctypes.create_string_buffer(size)
    ptr = ctypes.addressof(buffer)
    assert cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), ctypes.c_size_t(size), 0) == 0
    return buffer, ptr


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
pinned = host_alloc(2 * MIB)  # a tensor's, held to the end
registered_buffer, registered = host_register(1 * MIB)  # freed to the cache later
staging = host_alloc(4 * MIB)  # given back by empty_cache before the dump
nvml_reports(held + context)  # the peak
free(gone, 6 * MIB)
assert cuda.cuMemFreeHost(ctypes.c_void_p(staging)) == 0
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


def host_segment(addr, size, allocated):
    state = "active_allocated" if allocated else "inactive"
    used = size if allocated else 0
    block = {"address": addr, "size": size, "requested_size": size, "state": state,
             "frames": []}
    return {"device": -1, "address": addr, "total_size": size, "allocated_size": used,
            "active_size": used, "requested_size": 0, "stream": 0, "segment_type": "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [block]}


def host_entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0), "frames": []}


def host_data(shift):
    trace = []
    for i, (addr, size) in enumerate([(pinned, 2 * MIB), (registered, 1 * MIB),
                                      (staging, 4 * MIB)]):
        trace.append(host_entry("segment_alloc", addr + shift, size, 200 + 10 * i))
        trace.append(host_entry("alloc", addr + shift, size, 201 + 10 * i))
    for addr, size, t in [(registered, 1 * MIB, 240), (staging, 4 * MIB, 250)]:
        trace.append(host_entry("free_requested", addr + shift, size, t))
        trace.append(host_entry("free_completed", addr + shift, size, t + 1))
    trace.append(host_entry("segment_free", staging + shift, 4 * MIB, 260))
    segments = [host_segment(pinned + shift, 2 * MIB, True),
                host_segment(registered + shift, 1 * MIB, False)]
    return segments, trace


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
    host_segments, host_traces = host_data(shift)
    return {"segments": [segment(a + shift, s, p, k) for a, s, p, k in live],
            "device_traces": [trace], "host_segments": host_segments,
            "host_traces": host_traces}


with open(snapshot_path, "wb") as f:
    pickle.dump(snapshot(0), f, protocol=4)
with open(other_path, "wb") as f:
    pickle.dump(snapshot(1 << 40), f, protocol=3)
print(os.getpid())
