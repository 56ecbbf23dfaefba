"""pytest plugin (entry point `pytest11`): GPU memory limits, leaks and baselines per test.

    @pytest.mark.gpu_memory(limit="2 GiB")                      # peak requested memory
    @pytest.mark.gpu_memory(limit="3 GiB", metric="reserved")   # peak reserved memory
    @pytest.mark.gpu_memory_leak(tolerance="1 MiB")             # memory still alive at the end

`--gpu-memory-baseline FILE` checks every test that uses CUDA against its entry in FILE
(`--gpu-memory-max-increase`, default 5%), and records the entries FILE lacks.

Each checked test runs with PyTorch's peak statistics reset and its memory history on; its
snapshot is taken at the end and handed to `memprof gate`, whose verdict and report (the limit,
the measured value, the sites that grew most) decide the test. The snapshot of a failed check
is kept, under a path the failure names. Without CUDA, marked tests are skipped with a reason,
and `--gpu-memory-baseline` says at the end of the run that it checked and wrote nothing.
"""

import gc
import hashlib
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
        help="check each CUDA test's peak requested memory against its entry in FILE (JSON); "
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
        'gpu_memory(limit, metric="active"): fail when the test\'s peak requested (or reserved) '
        "GPU memory is over limit (bytes or units: \"2 GiB\")",
    )
    config.addinivalue_line(
        "markers",
        'gpu_memory_leak(tolerance="0 B"): fail when the test leaves more than tolerance of the '
        "GPU memory it allocated alive at its end",
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
    """The kept snapshot's file name: the test id made safe for a file name (readable, but
    `test[a/b]`, `test[a_b]` and `test[a b]` all give `test_a_b_`), then a hash of the whole id,
    so that no two tests share a file; cut short to stay within a file name's 255 bytes."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:200]
    digest = hashlib.sha256(nodeid.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{readable}-{digest}.pickle"


def _gate(snapshot, args):
    """`memprof gate SNAPSHOT ARGS`: (passed, its report)."""
    done = run_memprof(["gate", snapshot, *args])
    if done.returncode not in (0, 1):
        pytest.fail(f"memprof gate could not check {snapshot}: {done.stderr.strip()}", pytrace=False)
    return done.returncode == 0, done.stdout.rstrip()


def _checks(state, item, snapshot):
    """The failures of the test's checks (the gate's reports); records missing baselines."""
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
    leak = item.get_closest_marker("gpu_memory_leak")
    if leak is not None:
        # What the test allocated and left alive: its trace starts with the test.
        tolerance = leak.kwargs.get("tolerance", leak.args[0] if leak.args else "0 B")
        passed, report = _gate(snapshot, ["--limit", str(tolerance), "--metric", "left-alive"])
        if not passed:
            failures.append(report)
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


def _used_no_gpu_memory(snapshot):
    """Whether a snapshot has neither a segment nor a trace entry (a test on the CPU only)."""
    return not snapshot.get("segments") and not any(snapshot.get("device_traces") or [])


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
    memory._record_memory_history(max_entries=MAX_ENTRIES)
    try:
        result = yield
        gc.collect()  # what only garbage holds is not left alive
        taken = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    state.kept.mkdir(parents=True, exist_ok=True)
    snapshot = state.kept / _file_name(item.nodeid)
    with open(snapshot, "wb") as out:
        pickle.dump(taken, out)
    # A test that used no GPU memory passes every check (0 bytes), and has no baseline.
    failures = [] if _used_no_gpu_memory(taken) else _checks(state, item, str(snapshot))
    if not failures:
        snapshot.unlink()
        return result
    failures.append(f"snapshot kept: {snapshot} (open it with `memprof view {snapshot}`)")
    pytest.fail("\n".join(failures), pytrace=False)


def pytest_terminal_summary(terminalreporter, config):
    state = config.stash.get(_STATE, None)
    if state is None or state.baseline_path is None:
        return
    torch, why = _cuda_torch()
    if torch is None:
        terminalreporter.write_line(
            f"memprof-gpu: --gpu-memory-baseline {state.baseline_path}: no test checked, "
            f"nothing written: {why}",
            yellow=True,
        )


def pytest_sessionfinish(session):
    state = session.config.stash.get(_STATE, None)
    if state is not None:
        state.save()
