# memprof attach: the agent run inside a Python job that memprof attached to (src/source/attach/).
# The injector queues one call in the job that reads this file from a folder memprof made for the
# job's user (mode 0700) and runs it with `__memprof_dir__` naming that folder. This top level
# only starts a thread and returns, so the job's main thread is held for the time it takes to
# compile this file. The thread serves one connection on `agent.sock` in the folder (only the
# job's user and root can open it; the peer's user is checked too), one JSON request per line,
# one JSON answer per line:
#   {"cmd": "hello"}            what the job is: Python, torch, CUDA, allocator backend
#   {"cmd": "stats"}            torch.cuda.memory_stats() figures per device
#   {"cmd": "snapshot"}         torch.cuda.memory._dump_snapshot() into the folder
#   {"cmd": "record_start", "max_entries": N}   history on with stacks, unless it was on
#   {"cmd": "record_stop"}      dump the snapshot into the folder, history back as it was
#   {"cmd": "arm_oom"}          the next out-of-memory error dumps a snapshot into the folder
#   {"cmd": "oom"}              whether it happened
#   {"cmd": "detach"}           put everything back, close, end the thread
# Each answer carries `held_us`: how long the request ran in the job (with the GIL, at most).
# When the connection ends without `detach` (memprof was killed), or nobody connects within
# ACCEPT_WAIT seconds, the same clean-up runs. Nothing here raises into the job: every error
# becomes an `error` answer or is dropped. It never imports torch: a job that has not imported
# it is told so, and CUDA is never initialized by memprof.
import sys

_BEFORE = frozenset(sys.modules)
ACCEPT_WAIT = 30.0
STATS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "active_bytes.all.peak",
    "inactive_split_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
)


def _stdlib_modules(names):
    """The modules among `names` that come with Python (the only ones clean-up may forget)."""
    import os

    home = os.path.dirname(os.__file__)
    site = os.sep + "site-packages" + os.sep
    ours = []
    for name in names:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if module is not None and (
            path is None or (path.startswith(home) and site not in path)
        ):
            ours.append(name)
    return ours


class _Agent:
    def __init__(self, folder):
        self.folder = folder
        self.started_history = False
        self.oom_hook = None  # the one-slot list the registered observer reads
        self.oom = None

    def torch(self):
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "cuda"):
            return None
        return torch

    def path(self, name):
        import os

        return os.path.join(self.folder, name)

    def hello(self, _):
        torch = self.torch()
        answer = {"python": list(sys.version_info[:3]), "torch": None}
        if torch is None:
            return answer
        answer["torch"] = str(getattr(torch, "__version__", "?"))
        answer["cuda_initialized"] = bool(torch.cuda.is_initialized())
        try:
            answer["backend"] = str(torch.cuda.get_allocator_backend())
        except Exception as e:
            answer["backend"] = None
            answer["backend_error"] = str(e)
        if answer["cuda_initialized"]:
            answer["devices"] = int(torch.cuda.device_count())
        return answer

    def stats(self, _):
        torch = self.torch()
        if torch is None or not torch.cuda.is_initialized():
            return {"devices": []}
        devices = []
        for device in range(int(torch.cuda.device_count())):
            stats = torch.cuda.memory_stats(device)
            if not stats:
                continue
            figures = {key: stats.get(key) for key in STATS}
            figures["device"] = device
            devices.append(figures)
        return {"devices": devices}

    def history_on(self, torch):
        snapshot = torch.cuda.memory._snapshot()
        if any(snapshot.get("device_traces") or []):
            return True
        for segment in snapshot.get("segments") or []:
            for block in segment.get("blocks") or []:
                if block.get("frames"):
                    return True
        return False

    def snapshot(self, _):
        torch = self.torch()
        path = self.path("snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        return {"path": path}

    def record_start(self, request):
        torch = self.torch()
        if self.started_history:
            return {"was_on": False}
        if self.history_on(torch):
            return {"was_on": True}
        entries = int(request.get("max_entries") or 100000)
        torch.cuda.memory._record_memory_history(max_entries=entries)
        self.started_history = True
        return {"was_on": False}

    def record_stop(self, _):
        torch = self.torch()
        path = self.path("record.pickle")
        try:
            torch.cuda.memory._dump_snapshot(path)
        finally:
            self.stop_history()
        return {"path": path}

    def stop_history(self):
        if self.started_history:
            self.started_history = False
            torch = self.torch()
            if torch is not None:
                torch.cuda.memory._record_memory_history(enabled=None)

    def arm_oom(self, _):
        torch = self.torch()
        if self.oom_hook is None:
            # The observer PyTorch keeps (it has no way to remove one) sees only this one-slot
            # list, which detach empties: after detach it is a function that does nothing.
            scope = {"__builtins__": __builtins__, "hook": []}
            exec(
                "def observer(device, alloc, device_total, device_free):\n"
                "    for act in hook:\n"
                "        try:\n"
                "            act(device, alloc, device_total, device_free)\n"
                "        except BaseException:\n"
                "            pass\n",
                scope,
            )
            torch._C._cuda_attach_out_of_memory_observer(scope["observer"])
            self.oom_hook = scope["hook"]
        if not self.oom_hook:
            self.oom_hook.append(self.on_oom)
        return {"path": self.path("oom.pickle")}

    def on_oom(self, device, alloc, device_total, device_free):
        import os

        torch = self.torch()
        path = self.path("oom.pickle")
        # Whole or not at all: the job may die of this error right after.
        torch.cuda.memory._dump_snapshot(path + ".part")
        os.rename(path + ".part", path)
        self.oom = {
            "path": path,
            "device": int(device),
            "alloc": int(alloc),
            "device_total": int(device_total),
            "device_free": int(device_free),
        }
        del self.oom_hook[:]  # the next one is not ours to catch

    def oom_state(self, _):
        return {"oom": self.oom}

    def restore(self):
        """Puts the job back as it was: history, the observer; says what it did."""
        done = {"history_stopped": self.started_history, "observer_disarmed": False}
        try:
            self.stop_history()
        except Exception:
            done["history_stopped"] = False
        if self.oom_hook:
            del self.oom_hook[:]
            done["observer_disarmed"] = True
        return done


def _serve(folder):
    import json
    import os
    import socket
    import struct
    import time

    # What the imports above (and `_thread`) added; clean-up forgets them again.
    ours = _stdlib_modules(set(sys.modules) - _BEFORE)
    agent = _Agent(folder)
    handlers = {
        "hello": agent.hello,
        "stats": agent.stats,
        "snapshot": agent.snapshot,
        "record_start": agent.record_start,
        "record_stop": agent.record_stop,
        "arm_oom": agent.arm_oom,
        "oom": agent.oom_state,
    }
    path = os.path.join(folder, "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = None
    try:
        server.bind(path)
        server.listen(1)
        server.settimeout(ACCEPT_WAIT)
        conn, _ = server.accept()
        conn.settimeout(None)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        uid = struct.unpack("3i", creds)[1]
        if uid not in (0, os.getuid()):
            return
        reader = conn.makefile("rb")
        for line in reader:
            start = time.perf_counter()
            try:
                request = json.loads(line)
                command = request.get("cmd")
                if command == "detach":
                    answer = {"restored": agent.restore()}
                    _forget(ours)
                else:
                    answer = handlers[command](request)
            except Exception as e:
                answer = {"error": "%s: %s" % (type(e).__name__, e)}
                command = None
            answer["held_us"] = int((time.perf_counter() - start) * 1e6)
            conn.sendall(json.dumps(answer).encode() + b"\n")
            if command == "detach":
                break
        reader.close()
    except BaseException:
        pass
    finally:
        try:
            agent.restore()
        except BaseException:
            pass
        for closing in (conn, server):
            try:
                if closing is not None:
                    closing.close()
            except BaseException:
                pass
        try:
            os.unlink(path)
        except BaseException:
            pass
        _forget(ours)


def _forget(names):
    """Takes the modules the agent imported out of `sys.modules` again (before its answer to
    `detach`, so the job is as it was when memprof returns)."""
    for name in names:
        sys.modules.pop(name, None)


def _start(folder):
    import _thread

    _thread.start_new_thread(_serve, (folder,))


try:
    _start(__memprof_dir__)  # noqa: F821 (given by the injected call)
except BaseException:
    pass
