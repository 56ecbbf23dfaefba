"""Finds the `memprof` binary the wheel installed and runs it."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path


class MemprofError(RuntimeError):
    """`memprof` could not be found or refused its input (the message says why)."""


def _candidates():
    """Where pip, uv and pipx put a wheel's scripts, for the schemes this Python knows."""
    yield os.environ.get("MEMPROF_BIN")
    yield sysconfig.get_path("scripts")
    user = sysconfig.get_preferred_scheme("user") if hasattr(sysconfig, "get_preferred_scheme") else None
    if user:
        yield sysconfig.get_path("scripts", scheme=user)
    # `pip install --target DIR` puts scripts in DIR/bin, beside this package's folder.
    yield Path(__file__).resolve().parent.parent / "bin"
    yield Path(sys.prefix) / "bin"


def memprof_binary():
    """The path of the `memprof` binary: `MEMPROF_BIN` when set, else the one installed with
    this package, else the first on PATH."""
    for place in _candidates():
        if not place:
            continue
        path = Path(place)
        if path.name != "memprof":
            path = path / "memprof"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("memprof")
    if found:
        return found
    raise MemprofError("cannot find the memprof binary; reinstall memprof-gpu or set MEMPROF_BIN")


def run(args):
    """Runs `memprof ARGS`, capturing its output (a `CompletedProcess` with text)."""
    return subprocess.run(
        [memprof_binary(), *[str(a) for a in args]],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )


def analyze(path, *options):
    """`memprof analyze --json PATH OPTIONS...` as a dict (the document of docs/json/analyze.md).

    Raises MemprofError with memprof's message when the file cannot be read."""
    done = run(["analyze", "--json", path, *options])
    if done.returncode != 0:
        raise MemprofError(done.stderr.strip() or f"memprof analyze exited {done.returncode}")
    return json.loads(done.stdout)
