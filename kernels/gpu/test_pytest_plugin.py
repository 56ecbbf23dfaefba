"""The pytest plugin and memprof_gpu.record on a real GPU (scripts/gpu-check.sh runs it; never
CI). Two tests are meant to fail, with the gate's report: the one over its limit and the leak."""

import pytest
import torch

import memprof_gpu

KEPT = []
MIB = 1 << 20


def allocate(nbytes):
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


@pytest.mark.gpu_memory(limit="64 MiB")
def test_over_the_limit_fails():
    x = allocate(128 * MIB)
    del x


@pytest.mark.gpu_memory(limit="256 MiB")
def test_under_the_limit_passes():
    x = allocate(128 * MIB)
    del x


@pytest.mark.gpu_memory_leak(tolerance="1 MiB")
def test_a_leak_fails():
    KEPT.append(allocate(16 * MIB))


def test_record_writes_the_snapshot_of_an_oom(tmp_path):
    path = tmp_path / "oom.pickle"
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with memprof_gpu.record(path):
            allocate(1 << 50)
    device = memprof_gpu.analyze(path)["inputs"][0]["devices"][0]
    assert device["trace"]["actions"].get("oom", 0) >= 1, device["trace"]
