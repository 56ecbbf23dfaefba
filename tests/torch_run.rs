//! `memprof run --torch` with real Python processes: the start-up hook is inert without PyTorch
//! (same output and exit code, `import torch` still fails as before, the program's own
//! `sitecustomize` still runs, nothing left behind), and with a stand-in `torch` package (PyTorch
//! with CUDA is not available here) it waits for CUDA's lazy initialization, then turns on the
//! memory history and registers an out-of-memory observer that dumps the snapshot next to the
//! recording. Not tested with real PyTorch on a GPU.

use crate::shim_preload::shim;
use crate::util::Scratch;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::{Command, Output};

/// Runs `script` under `memprof run --torch` in `dir`, with a temporary directory of its own
/// (`dir/tmp`): other tests and programs on the machine make and remove hook directories in
/// the system's.
fn run_torch(dir: &Path, python_path: Option<&Path>, script: &str) -> Output {
    let tmp = dir.join("tmp");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .expect("a private temporary directory");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memprof"));
    cmd.args(["run", "--torch", "-o"])
        .arg(dir.join("run.memprof"))
        .args(["--", "python3", "-c", script])
        .current_dir(dir)
        .env("MEMPROF_SHIM", shim())
        .env("STANDIN_LOG", dir.join("standin.log"))
        .env("TMPDIR", &tmp)
        .env_remove("MEMPROF_OUT")
        .env_remove("LD_PRELOAD");
    match python_path {
        Some(p) => cmd.env("PYTHONPATH", p),
        None => cmd.env_remove("PYTHONPATH"),
    };
    cmd.output().expect("memprof runs")
}

fn fresh_dir(name: &str) -> Scratch {
    Scratch::new(&format!("torch-run-{name}"))
}

/// Hook directories left in the temporary directory `run_torch` gave the run in `dir`.
fn hook_dirs(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("tmp"))
        .expect("the run's temporary directory")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("memprof-torch-")
        })
        .count()
}

#[test]
fn without_torch_the_hook_changes_nothing() {
    let dir = fresh_dir("inert");
    let own = dir.join("own");
    std::fs::create_dir_all(&own).expect("dir");
    std::fs::write(
        own.join("sitecustomize.py"),
        "import builtins\nbuiltins.OWN_SITECUSTOMIZE = 'ran'\n",
    )
    .expect("written");
    let script = "import builtins, sys\n\
        try:\n    import torch\nexcept ImportError as e:\n    print('no torch:', type(e).__name__)\n\
        print(getattr(builtins, 'OWN_SITECUSTOMIZE', 'missing'))\n\
        print('torch' in sys.modules)\nsys.exit(3)";
    let out = run_torch(&dir, Some(&own), script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(stdout, "no torch: ModuleNotFoundError\nran\nFalse\n");
    assert!(!stderr.contains("memprof --torch:"), "{stderr}");
    assert!(
        stderr.contains("no PyTorch out-of-memory snapshot was written"),
        "{stderr}"
    );
    assert_eq!(hook_dirs(&dir), 0, "the hook directory is removed");
    // The same script without memprof prints the same (with its own sitecustomize).
    let plain = Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", &own)
        .output()
        .expect("python3 runs");
    assert_eq!(plain.stdout, out.stdout);
}

const STANDIN: &str = r#"
# A stand-in for PyTorch's few entry points the hook uses; it logs each call.
import os

def _log(*words):
    with open(os.environ["STANDIN_LOG"], "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")

class _C:
    observers = []

    @staticmethod
    def _cuda_attach_out_of_memory_observer(observer):
        _C.observers.append(observer)
        _log("observer")

class _Memory:
    @staticmethod
    def _record_memory_history(max_entries):
        _log("history", max_entries)

    @staticmethod
    def _dump_snapshot(path):
        with open(path, "wb") as f:
            f.write(b"snapshot")
        _log("dump", os.path.basename(path))

class cuda:
    memory = _Memory
    queued = []

    @staticmethod
    def _lazy_call(callback):
        cuda.queued.append(callback)
        _log("lazy_call")

    @staticmethod
    def init():
        _log("init")
        for callback in cuda.queued:
            callback()
"#;

#[test]
fn with_torch_history_starts_at_cuda_init_and_oom_dumps_a_snapshot() {
    let dir = fresh_dir("standin");
    let site = dir.join("site");
    std::fs::create_dir_all(site.join("torch")).expect("dir");
    std::fs::write(site.join("torch/__init__.py"), STANDIN).expect("written");
    let script = "import os, torch\n\
        print(len(torch.cuda.queued))\n\
        torch.cuda.init()\n\
        torch._C.observers[0](0, 1 << 30, 5, 6)\n\
        print(os.getpid())\n\
        import sys\n\
        print([os.path.dirname(p) for p in sys.path if 'memprof-torch-' in p])";
    let out = run_torch(&dir, Some(&site), script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("1"), "one callback waits for CUDA");
    let pid = lines.next().expect("the pid");
    // The hook ran from the temporary directory given (so `hook_dirs` looks where it is).
    assert_eq!(
        lines.next(),
        Some(format!("['{}']", dir.join("tmp").display()).as_str()),
        "{stdout}"
    );
    assert_eq!(hook_dirs(&dir), 0, "the hook directory is removed");
    let snapshot = format!("run.oom-{pid}.pickle");
    let log = std::fs::read_to_string(dir.join("standin.log")).expect("the stand-in was used");
    assert_eq!(
        log,
        format!("lazy_call\ninit\nhistory 100000\nobserver\ndump {snapshot}\n")
    );
    assert_eq!(
        std::fs::read(dir.join(&snapshot)).expect("the snapshot is next to the recording"),
        b"snapshot"
    );
    assert!(
        stderr.contains(&format!(
            "memprof: PyTorch snapshot at out-of-memory: {}",
            dir.join(&snapshot).display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("memprof --torch: out of memory on device 0"),
        "{stderr}"
    );
}

/// With real PyTorch (a CUDA build, on a machine without a GPU): the hook finds the real
/// package's loader, queues its start behind CUDA's lazy initialization next to PyTorch's own
/// queued calls, and the functions it will call exist. Run by hand with the Python of an
/// environment that has PyTorch (`pip install torch`, about 5 GB with its CUDA libraries).
#[test]
#[ignore = "needs a Python with PyTorch: MEMPROF_TORCH_PYTHON=/path/to/bin/python"]
fn with_real_pytorch_the_hook_waits_for_cuda_and_finds_what_it_calls() {
    let python = std::env::var("MEMPROF_TORCH_PYTHON").expect("MEMPROF_TORCH_PYTHON is set");
    let dir = fresh_dir("real");
    let script = "import torch\n\
        print(torch.__version__)\n\
        print([getattr(c[0], '__name__', '?') for c in torch.cuda._queued_calls][-1])\n\
        print(all([hasattr(torch.cuda.memory, '_record_memory_history'),\n\
                   hasattr(torch.cuda.memory, '_dump_snapshot'),\n\
                   hasattr(torch._C, '_cuda_attach_out_of_memory_observer')]))\n\
        print(float(torch.ones(10).sum()))";
    let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["run", "--torch", "-o"])
        .arg(dir.join("run.memprof"))
        .args(["--", &python, "-c", script])
        .current_dir(&dir)
        .env("MEMPROF_SHIM", shim())
        .env_remove("MEMPROF_OUT")
        .env_remove("LD_PRELOAD")
        .env_remove("PYTHONPATH")
        .output()
        .expect("memprof runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[1..], ["_start_history", "True", "10.0"], "{stdout}");
    assert!(!stderr.contains("memprof --torch:"), "{stderr}");
    eprintln!("PyTorch {}", lines[0]);
}
