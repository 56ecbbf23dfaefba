# memprof run --torch: this file is put first on PYTHONPATH as `sitecustomize`, which Python
# imports at start-up (`site` module). It does nothing unless the program imports `torch`;
# then, once CUDA is initialized (torch.cuda._lazy_call, so importing torch still creates no
# CUDA context and forked workers keep working), it turns on PyTorch's memory history and
# registers an out-of-memory observer that dumps a snapshot to MEMPROF_TORCH_SNAPSHOT (`%p`
# becomes the process id). Any failure is one line on stderr, never an exception in the program.
# A `sitecustomize` that was already on the path is still run, after this one.
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_DIR = os.path.dirname(os.path.abspath(__file__))


def _say(message):
    try:
        sys.stderr.write("memprof --torch: %s\n" % message)
    except Exception:
        pass


def _on_oom(device, alloc, device_allocated, device_free):
    path = os.environ.get("MEMPROF_TORCH_SNAPSHOT", "").replace("%p", str(os.getpid()))
    if not path:
        return
    try:
        import torch

        torch.cuda.memory._dump_snapshot(path)
        _say("out of memory on device %d: PyTorch snapshot written to %s" % (device, path))
    except Exception as e:
        _say("could not write the snapshot %s: %s" % (path, e))


def _start_history():
    try:
        import torch

        entries = int(os.environ.get("MEMPROF_TORCH_ENTRIES", "100000"))
        torch.cuda.memory._record_memory_history(max_entries=entries)
        torch._C._cuda_attach_out_of_memory_observer(_on_oom)
    except Exception as e:
        _say("could not turn on PyTorch's memory history: %s" % e)


def _torch_loaded(torch):
    try:
        torch.cuda._lazy_call(_start_history)
    except Exception as e:
        _say("could not wait for CUDA: %s" % e)


class _Loader(importlib.abc.Loader):
    """The real loader of `torch`, and then the hook."""

    def __init__(self, real):
        self._real = real

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        _torch_loaded(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders find for `torch`, once."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def _chain():
    """Runs the `sitecustomize` this one hides, if there is one."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _DIR]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if "torch" in sys.modules:
    _torch_loaded(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _Finder())
try:
    _chain()
except Exception as e:
    _say("the program's own sitecustomize failed: %s" % e)
