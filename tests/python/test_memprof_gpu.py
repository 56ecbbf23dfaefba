"""The installed memprof-gpu wheel from a real pytest: the plugin's markers and baseline run in
child pytest processes (pytester) over the stand-in torch in `standin/`, and the Python API in
this process. Run with the wheel installed: `python -m pytest -p pytester tests/python`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memprof_gpu
from memprof_gpu.pytest_plugin import _file_name

STANDIN = str(Path(__file__).resolve().parent / "standin")

CASES = '''
import os
import pytest
import torch

KEPT = []


def step(nbytes):
    handle = torch.cuda.standin_alloc(nbytes, "build_model", 12)
    torch.cuda.standin_free(handle)


@pytest.mark.gpu_memory(limit="2 MiB")
def test_over():
    step(3 << 20)


@pytest.mark.gpu_memory(limit="4 MiB")
def test_under():
    step(3 << 20)


@pytest.mark.gpu_memory(limit="2 MiB", metric="reserved")
def test_reserved_over():
    step(3 << 20)


@pytest.mark.gpu_memory_leak(tolerance="1 MiB")
def test_leaks():
    KEPT.append(torch.cuda.standin_alloc(2 << 20, "cache_outputs", 30))


@pytest.mark.gpu_memory_leak(tolerance="1 MiB")
def test_frees():
    step(2 << 20)


def test_grows():
    step(int(os.environ.get("STEP_BYTES", 1 << 20)))


@pytest.mark.gpu_memory(limit="1 MiB")
def test_cpu_only():
    assert sum(range(10)) == 45
'''


def run(pytester, cuda, *args):
    pytester.makepyfile(test_cases=CASES)
    env = {"PYTHONPATH": STANDIN, "STANDIN_CUDA": "1" if cuda else "0"}
    for key, value in env.items():
        pytester._monkeypatch.setenv(key, value)
    return pytester.runpytest_subprocess("-rA", *args)


def test_over_the_limit_fails_with_the_gates_report_and_keeps_the_snapshot(pytester):
    result = run(pytester, True, "-k", "over or under")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "limited to 2.00 MiB but peak requested was 3.00 MiB" in out
    assert "limited to 2.00 MiB but peak reserved was 4.00 MiB" in out
    assert "largest sites at the peak:" in out
    assert "model.py:12:build_model" in out
    kept = pytester.path / ".gpu-memory" / _file_name("test_cases.py::test_over")
    assert kept.name.startswith("test_cases.py_test_over-")
    assert f"snapshot kept: {kept}" in out
    assert kept.is_file()
    # The kept snapshot is a snapshot memprof reads: the peak the gate measured.
    doc = memprof_gpu.analyze(kept)
    assert doc["inputs"][0]["devices"][0]["trace"]["peak_active_bytes"] == 3 << 20
    # A passing test leaves no snapshot.
    assert not (pytester.path / ".gpu-memory" / _file_name("test_cases.py::test_under")).exists()


def test_without_cuda_the_markers_skip_with_a_reason(pytester):
    result = run(pytester, False, "-k", "over or under or leaks")
    result.assert_outcomes(skipped=4)
    assert "gpu_memory: CUDA is not available" in result.stdout.str()


def test_without_cuda_the_baseline_says_it_checked_and_wrote_nothing(pytester):
    baseline = pytester.path / "gpu-baseline.json"
    result = run(pytester, False, "-k", "grows", "--gpu-memory-baseline", str(baseline))
    result.assert_outcomes(passed=1)
    assert (
        f"memprof-gpu: --gpu-memory-baseline {baseline}: no test checked, nothing written: "
        "CUDA is not available"
    ) in result.stdout.str()
    assert not baseline.exists()


def test_memory_left_alive_beyond_the_tolerance_fails(pytester):
    result = run(pytester, True, "-k", "leaks or frees")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "limited to 1.00 MiB but left alive was 2.00 MiB" in out
    assert "sites that left most alive:" in out
    assert "model.py:30:cache_outputs" in out
    assert _file_name("test_cases.py::test_leaks") in out


def test_the_baseline_is_recorded_then_enforced_per_test(pytester):
    baseline = pytester.path / "gpu-baseline.json"
    args = ["-k", "grows or cpu_only", "--gpu-memory-baseline", str(baseline)]
    first = run(pytester, True, *args)
    first.assert_outcomes(passed=2)
    doc = json.loads(baseline.read_text())
    # A test that used no GPU memory passes its limit and has no entry.
    assert list(doc["tests"]) == ["test_cases.py::test_grows"]
    entry = doc["tests"]["test_cases.py::test_grows"]
    assert entry["kind"] == "memprof_gate_baseline"
    assert entry["measurements"][0]["peak_active_bytes"] == 1 << 20

    pytester._monkeypatch.setenv("STEP_BYTES", str(1 << 20))
    same = run(pytester, True, "-k", "grows", "--gpu-memory-baseline", str(baseline))
    same.assert_outcomes(passed=1)

    pytester._monkeypatch.setenv("STEP_BYTES", str(2 << 20))
    args = ["-k", "grows", "--gpu-memory-baseline", str(baseline), "--gpu-memory-max-increase", "10%"]
    grown = run(pytester, True, *args)
    grown.assert_outcomes(failed=1)
    out = grown.stdout.str()
    assert "peak requested grew from 1.00 MiB to 2.00 MiB (+100.0%), more than the allowed +10.0%" in out
    assert "sites that grew most at the peak:" in out


def test_record_writes_the_snapshot_when_the_block_runs_out_of_memory(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(STANDIN)
    monkeypatch.setenv("STANDIN_CUDA", "1")
    import torch

    path = tmp_path / "step.pickle"
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with memprof_gpu.record(path):
            kept = torch.cuda.standin_alloc(5 << 20, "forward", 7)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
    torch.cuda.standin_free(kept)
    doc = memprof_gpu.analyze(path)
    device = doc["inputs"][0]["devices"][0]
    assert device["trace"]["peak_active_bytes"] == 5 << 20
    assert device["trace"]["peak_site"] == "/work/model.py:7:forward"
    # History is off again: what happens after the block is not recorded.
    assert torch.cuda.memory._state.trace is None


def test_analyze_says_what_is_wrong_with_a_bad_file(tmp_path):
    bad = tmp_path / "notes.pickle"
    bad.write_text("not a pickle")
    with pytest.raises(memprof_gpu.MemprofError, match="notes.pickle"):
        memprof_gpu.analyze(bad)


def test_importing_the_package_does_not_import_torch():
    code = "import sys, memprof_gpu; print('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=STANDIN)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_binary_is_the_one_the_wheel_installed():
    path = Path(memprof_gpu.memprof_binary())
    assert path.parent == Path(sys.prefix) / "bin"


PARAMETRIZED = '''
import pytest
import torch


@pytest.mark.gpu_memory(limit="2 MiB")
@pytest.mark.parametrize("name", ["a/b", "a_b", "a b"])
def test_named(name):
    kept = torch.cuda.standin_alloc(3 << 20, "named", 1)
    torch.cuda.standin_free(kept)
'''


def test_tests_whose_ids_read_alike_keep_a_snapshot_each(pytester):
    names = {_file_name(f"t.py::test[{p}]") for p in ("a/b", "a_b", "a b", "a__b")}
    assert len(names) == 4, names
    assert all(len(n.encode()) <= 255 for n in names)
    assert len(_file_name("t.py::test[" + "x" * 1000 + "]").encode()) <= 255
    pytester.makepyfile(test_named=PARAMETRIZED)
    pytester._monkeypatch.setenv("PYTHONPATH", STANDIN)
    pytester._monkeypatch.setenv("STANDIN_CUDA", "1")
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(failed=3)
    kept = sorted((pytester.path / ".gpu-memory").iterdir())
    assert len(kept) == 3, kept
    out = result.stdout.str()
    for path in kept:
        assert f"snapshot kept: {path}" in out
