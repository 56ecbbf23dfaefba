"""pytest plugin (entry point `pytest11`): GPU memory limits, leaks and baselines per test.

    @pytest.mark.gpu_memory(limit="2 GiB")                      # peak active memory
    @pytest.mark.gpu_memory(limit="3 GiB", metric="reserved")   # peak reserved memory
    @pytest.mark.gpu_memory_leak(tolerance="1 MiB")             # memory still alive at the end

`--gpu-memory-baseline FILE` checks every test that uses CUDA against its entry in FILE
(`--gpu-memory-max-increase`, default 5%), and records the entries FILE lacks.

Each checked test runs with PyTorch's peak statistics reset and its memory history on; its
snapshot is taken at the end and handed to `memprof gate`, whose verdict and report (the limit,
the measured value, the sites that grew most) decide the test. The snapshot of a failed check
is kept, under a path the failure names. Without CUDA, marked tests are skipped with a reason.
"""

import gc
import json
import os
import pickle
import re
import tempfile
from pathlib import Path

import pytest

from ._binary import run as run_memprof

METRICS = {"active": "peak-active", "reserved": "peak-reserved"}
MAX_ENTRIES = 100_000


def pytest_addoption(parser):
    group = parser.getgroup("memprof-gpu", "GPU memory checks (memprof)")
    group.addoption(
        "--gpu-memory-baseline",
        metavar="FILE",
        help="check each CUDA test's peak active memory against its entry in FILE (JSON); "
        "tests without an entry are measured and added",
    )
    group.addoption(
        "--gpu-memory-max-increase",
        metavar="PERCENT",
        default="5%",
        help="allowed increase over the baseline (default 5%%)",
    )
    group.addoption(
        "--gpu-memory-snapshots",
        metavar="DIR",
        default=".gpu-memory",
        help="where the snapshots of failed checks are kept (default .gpu-memory, from the "
        "root directory)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        'gpu_memory(limit, metric="active"): fail when the test\'s peak active (or reserved) '
        "GPU memory is over limit (bytes or units: \"2 GiB\")",
    )
    config.addinivalue_line(
        "markers",
        'gpu_memory_leak(tolerance="0 B"): fail when more GPU memory is alive after the test '
        "than before it, beyond tolerance",
    )
    config.stash[_STATE] = _State(config)


_STATE = pytest.StashKey()


class _State:
    """The run's options and the baseline file's entries."""

    def __init__(self, config):
        self.config = config
        root = Path(str(config.rootpath))
        self.kept = root / config.getoption("gpu_memory_snapshots")
        name = config.getoption("gpu_memory_baseline")
        self.baseline_path = Path(name) if name else None
        self.max_increase = config.getoption("gpu_memory_max_increase")
        self.baselines = {}
        self.added = []
        if self.baseline_path and self.baseline_path.exists():
            doc = json.loads(self.baseline_path.read_text())
            self.baselines = doc.get("tests", {})

    def save(self):
        if not (self.baseline_path and self.added):
            return
        doc = {"kind": "memprof_gpu_pytest_baselines", "tests": dict(sorted(self.baselines.items()))}
        self.baseline_path.write_text(json.dumps(doc, indent=2) + "\n")


def _cuda_torch():
    """PyTorch, when it imports and sees a CUDA device; else the reason it cannot be used."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, "CUDA is not available"
    return torch, None


def _limit_markers(item):
    return list(item.iter_markers("gpu_memory"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _limit_markers(item) or item.get_closest_marker("gpu_memory_leak"):
        torch, why = _cuda_torch()
        if torch is None:
            pytest.skip(f"gpu_memory: {why}")


def _file_name(nodeid):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_") + ".pickle"


def _gate(snapshot, args):
    """`memprof gate SNAPSHOT ARGS`: (passed, its report)."""
    done = run_memprof(["gate", snapshot, *args])
    if done.returncode not in (0, 1):
        pytest.fail(f"memprof gate could not check {snapshot}: {done.stderr.strip()}", pytrace=False)
    return done.returncode == 0, done.stdout.rstrip()


def _checks(state, item, snapshot, leaked):
    """The failures of the test's checks (their reports), and the baseline entry to add."""
    failures = []
    for marker in _limit_markers(item):
        limit = marker.kwargs.get("limit", marker.args[0] if marker.args else None)
        if limit is None:
            raise pytest.UsageError(f"{item.nodeid}: gpu_memory needs limit=\"SIZE\"")
        metric = marker.kwargs.get("metric", "active")
        if metric not in METRICS:
            raise pytest.UsageError(
                f"{item.nodeid}: gpu_memory metric={metric!r}: expected \"active\" or \"reserved\""
            )
        passed, report = _gate(snapshot, ["--limit", str(limit), "--metric", METRICS[metric]])
        if not passed:
            failures.append(report)
    failures.extend(_leak_failure_of(item, leaked))
    if state.baseline_path:
        entry = state.baselines.get(item.nodeid)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "baseline.json")
            if entry is None:
                _, report = _gate(snapshot, ["--write-baseline", path])
                state.baselines[item.nodeid] = json.loads(Path(path).read_text())
                state.added.append(item.nodeid)
            else:
                Path(path).write_text(json.dumps(entry))
                args = ["--baseline", path, "--max-increase", state.max_increase]
                passed, report = _gate(snapshot, args)
                if not passed:
                    failures.append(report)
    return failures


_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _bytes(text):
    """`1 MiB`, `512KiB`, `1.5GB` or a number of bytes, as memprof reads sizes."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
    if not found or found.group(2) not in _UNITS:
        raise pytest.UsageError(f"gpu_memory_leak tolerance {text!r}: expected a size like \"1 MiB\"")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def _size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _used_no_gpu_memory(snapshot):
    """Whether a snapshot has neither a segment nor a trace entry (a test on the CPU only)."""
    return not snapshot.get("segments") and not any(snapshot.get("device_traces") or [])


def _leak_failure_of(item, leaked):
    marker = item.get_closest_marker("gpu_memory_leak")
    return [] if marker is None else _leak_failure(marker, leaked)


def _leak_failure(marker, leaked):
    """The leak check: PyTorch's count of allocated bytes after the test (after a garbage
    collection) against before it, beyond the tolerance."""
    tolerance = marker.kwargs.get("tolerance", marker.args[0] if marker.args else "0 B")
    before, after = leaked
    if after - before <= _bytes(tolerance):
        return []
    return [
        f"gpu_memory_leak: {_size(after - before)} more GPU memory alive after the test than "
        f"before it ({_size(before)} -> {_size(after)}), beyond the tolerance {tolerance}"
    ]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    state = item.config.stash[_STATE]
    marked = bool(_limit_markers(item) or item.get_closest_marker("gpu_memory_leak"))
    if not (marked or state.baseline_path):
        return (yield)
    torch, _ = _cuda_torch()
    if torch is None:
        return (yield)
    memory = torch.cuda.memory
    gc.collect()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    memory._record_memory_history(max_entries=MAX_ENTRIES)
    try:
        result = yield
        gc.collect()
        after = torch.cuda.memory_allocated()
        taken = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    state.kept.mkdir(parents=True, exist_ok=True)
    snapshot = state.kept / _file_name(item.nodeid)
    with open(snapshot, "wb") as out:
        pickle.dump(taken, out)
    if _used_no_gpu_memory(taken):
        # Nothing to gate: a peak of 0 is under any limit, and no baseline is kept for it.
        failures = _leak_failure_of(item, (before, after))
    else:
        failures = _checks(state, item, str(snapshot), (before, after))
    if not failures:
        snapshot.unlink()
        return result
    failures.append(f"snapshot kept: {snapshot} (open it with `memprof view {snapshot}`)")
    pytest.fail("\n".join(failures), pytrace=False)


def pytest_sessionfinish(session):
    state = session.config.stash.get(_STATE, None)
    if state is not None:
        state.save()
