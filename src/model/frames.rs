//! What kind of code a stack frame is in (the user's own Python, an installed library, the
//! Python standard library, other compiled code, or capture and interpreter noise), for POSIX
//! and Windows paths alike, and the dotted module a library frame belongs to. The noise rules
//! start from those of PyTorch's memory viewer (`_frame_filter` in `torch/cuda/_memory_viz.py`
//! and `torch/utils/viz/MemoryViz.js`), applied to compiled frames only, and add the caching
//! allocator, the dispatcher's glue, CPython's start-up and call machinery, thread start and the
//! CUDA runtime and driver.
//!
//! Written by hand: the rules are substring and path-component tests over a few hundred
//! distinct frames per file, which no crate packages.

use super::stack::Frame;

/// What a frame is, for picking the frame to show and the frames to hide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Stack capture, the caching allocator, the dispatcher's glue, the CPython interpreter,
    /// thread and process start-up, the CUDA runtime and driver: left out of filtered stacks.
    Noise,
    /// Other compiled code: PyTorch's operators and autograd nodes, a program's own C/C++.
    Native,
    /// The Python standard library.
    Stdlib,
    /// An installed package (site-packages, dist-packages), PyTorch's own Python and the code
    /// it generates, debuggers.
    Library,
    /// The user's own Python code.
    User,
}

impl FrameKind {
    /// Python code that is not the user's.
    pub fn is_library(self) -> bool {
        matches!(self, FrameKind::Library | FrameKind::Stdlib)
    }
}

/// Parts of compiled function names that mark noise. The first seven are PyTorch's memory
/// viewer's own (less `_start`, matched whole below so `restart`-like names stay); then the
/// caching allocator, the dispatcher's glue and the empty-tensor helpers every allocation
/// passes through.
const NOISE_IN_NAME: [&str; 13] = [
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
    "CUDACachingAllocator",
    "c10::impl::wrap_kernel_functor_unboxed_",
    "c10::impl::make_boxed_from_unboxed_functor",
    "::redispatch(",
    "at::detail::empty",
    "at::detail::_empty",
];

/// Whole compiled function names that are noise: process and thread start, unknown symbols,
/// CPython's call trampolines.
const NOISE_NAMES: [&str; 13] = [
    "",
    "??",
    "_start",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "execute_native_thread_routine",
    "__libc_init_first",
    "cfunction_call",
    "run_eval_code_obj",
    "builtin_exec",
];

/// Beginnings of CPython's internal function names.
const NOISE_NAME_STARTS: [&str; 8] = [
    "__libc_start",
    "pymain_",
    "pyrun_",
    "run_mod",
    "cfunction_",
    "method_vectorcall",
    "vectorcall_",
    "slot_tp_",
];

/// Parts of compiled frames' file names (lower case, `/` separated, with a leading `/`) that
/// mark noise. The first ten are PyTorch's memory viewer's own; `/register` and `/redispatch`
/// also catch the bare `RegisterCUDA.cpp` that snapshots record. Then the allocator, the
/// capture, the CUDA runtime and driver, and the C library and loader (process start-up in a
/// recording's stacks).
const NOISE_IN_FILE: [&str; 16] = [
    "core/boxing",
    "/register",
    "/redispatch",
    "pythonrun.c",
    "modules/main.c",
    "objects/call.c",
    "objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
    "cudacachingallocator.cpp",
    "memory_snapshot.cpp",
    "/libcudart.so",
    "/libcuda.so",
    "/libc.so",
    "/ld-linux",
];

/// Directories of a CPython source tree, whose compiled frames are the interpreter's.
const CPYTHON_DIRS: [&str; 6] = [
    "/objects/",
    "/python/",
    "/modules/",
    "/include/",
    "/parser/",
    "/programs/",
];

/// Path parts of Python files that are a library though outside site-packages: PyTorch run
/// from a source tree, the code `torch.compile` generates, debuggers.
const LIBRARY_IN_PATH: [&str; 4] = ["/torch/", "/torchinductor_", "/debugpy/", "/pydevd"];

/// Whether a file name is Python source (or a frozen module, a notebook cell, `exec`'d text).
pub fn is_python_file(filename: &str) -> bool {
    let lower = filename.to_ascii_lowercase();
    lower.ends_with(".py") || lower.ends_with(".pyx") || filename.starts_with('<')
}

/// `filename` in lower case with `/` separators and a leading `/`, for matching.
fn normalized(filename: &str) -> String {
    let mut out = String::with_capacity(filename.len() + 1);
    out.push('/');
    out.extend(filename.chars().map(|c| {
        if c == '\\' {
            '/'
        } else {
            c.to_ascii_lowercase()
        }
    }));
    out
}

/// A CPython API name: `Py` or `_Py`, then a capital or `_` (`Py_RunMain`, `_PyObject_Call`).
fn is_cpython_api(name: &str) -> bool {
    let rest = name.strip_prefix("_Py").or_else(|| name.strip_prefix("Py"));
    rest.and_then(|r| r.chars().next())
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
}

fn is_noise(name: &str, file: &str) -> bool {
    NOISE_IN_NAME.iter().any(|n| name.contains(n))
        || NOISE_NAMES.contains(&name)
        || NOISE_NAME_STARTS.iter().any(|n| name.starts_with(n))
        || is_cpython_api(name)
        || NOISE_IN_FILE.iter().any(|n| file.contains(n))
        || ((file.contains("/python-3") || file.contains("/cpython"))
            && CPYTHON_DIRS.iter().any(|d| file.contains(d)))
}

/// Where the Python standard library's own modules start in `parts` (a normalized path split
/// at `/`): after `lib/python3.N/` (POSIX), `Python3NN/Lib/` (Windows) or a conda
/// environment's `Lib/` (Windows).
fn stdlib_start(parts: &[&str], windows: bool) -> Option<usize> {
    (1..parts.len()).find_map(|i| {
        let (before, this) = (parts[i - 1], parts[i]);
        let posix = (before == "lib" || before == "lib64")
            && (this.starts_with("python3") || this.starts_with("pypy3"));
        let versioned =
            this == "lib" && (before.starts_with("python3") || before.starts_with("cpython-3"));
        let conda = windows
            && this == "lib"
            && (before.contains("conda")
                || before.contains("miniforge")
                || before.contains("mambaforge")
                || (i >= 2 && parts[i - 2] == "envs"));
        (posix || versioned || conda).then_some(i + 1)
    })
}

/// A Windows path: a drive letter or backslashes.
fn is_windows_path(filename: &str) -> bool {
    let b = filename.as_bytes();
    filename.contains('\\') || (b.len() > 2 && b[0].is_ascii_alphabetic() && b[1] == b':')
}

fn python_kind(filename: &str) -> FrameKind {
    if filename.starts_with("<frozen ") {
        return FrameKind::Stdlib;
    }
    if filename.starts_with('<') {
        return FrameKind::User;
    }
    let path = normalized(filename);
    if path.contains("/site-packages/")
        || path.contains("/dist-packages/")
        || LIBRARY_IN_PATH.iter().any(|p| path.contains(p))
    {
        return FrameKind::Library;
    }
    let parts: Vec<&str> = path.split('/').collect();
    if stdlib_start(&parts, is_windows_path(filename)).is_some_and(|s| s < parts.len()) {
        return FrameKind::Stdlib;
    }
    FrameKind::User
}

impl Frame {
    /// What kind of code this frame is in.
    pub fn kind(&self) -> FrameKind {
        if is_python_file(&self.filename) {
            python_kind(&self.filename)
        } else if is_noise(&self.name, &normalized(&self.filename)) {
            FrameKind::Noise
        } else {
            FrameKind::Native
        }
    }

    /// The dotted module of a Python frame outside the user's code (`torch.nn.functional`,
    /// `einops.einops`, `importlib._bootstrap`); `None` for other frames.
    pub fn module(&self) -> Option<String> {
        if !is_python_file(&self.filename) {
            return None;
        }
        if let Some(frozen) = self.filename.strip_prefix("<frozen ") {
            return Some(frozen.trim_end_matches('>').to_string());
        }
        let slashed = self.filename.replace('\\', "/");
        let lower = slashed.to_ascii_lowercase();
        let parts: Vec<&str> = slashed.split('/').collect();
        let lower_parts: Vec<&str> = lower.split('/').collect();
        let packages = lower_parts
            .iter()
            .rposition(|p| *p == "site-packages" || *p == "dist-packages")
            .map(|i| i + 1);
        let start = packages
            .or_else(|| stdlib_start(&lower_parts, is_windows_path(&self.filename)))
            .or_else(|| lower_parts.iter().rposition(|p| *p == "torch"))
            .unwrap_or(parts.len().saturating_sub(1));
        let (last, dirs) = parts.get(start..)?.split_last()?;
        let stem = last.rsplit_once('.').map_or(*last, |(stem, _)| stem);
        let mut names = dirs.to_vec();
        if stem != "__init__" {
            names.push(stem);
        }
        let module = names.join(".");
        (!module.is_empty()).then_some(module)
    }
}

/// A compiled function's name without its argument list (and what follows it: `const`,
/// `[clone .localalias]`); `(anonymous namespace)` and `operator()` are kept.
pub fn without_arguments(name: &str) -> &str {
    let mut depth = 0usize;
    let mut i = 0;
    let bytes = name.as_bytes();
    while i < bytes.len() {
        match bytes[i] {
            b'<' | b'{' | b'[' => depth += 1,
            b'>' | b'}' | b']' => depth = depth.saturating_sub(1),
            b'(' if depth == 0 => {
                let rest = &name[i..];
                if rest.starts_with("(anonymous namespace)") {
                    i += "(anonymous namespace)".len();
                    continue;
                }
                if name[..i].ends_with("operator") && rest.starts_with("()") {
                    i += 2;
                    continue;
                }
                return name[..i].trim_end();
            }
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(filename: &str, name: &str) -> FrameKind {
        Frame {
            filename: filename.into(),
            line: 1,
            name: name.into(),
        }
        .kind()
    }

    fn module(filename: &str) -> Option<String> {
        Frame {
            filename: filename.into(),
            line: 1,
            name: "f".into(),
        }
        .module()
    }

    #[test]
    fn python_frames_by_where_their_file_is() {
        use FrameKind::*;
        let cases = [
            ("/home/me/model.py", User),
            ("/tmp/ipykernel_114/3105878423.py", User),
            ("<ipython-input-3-1c2b>", User),
            ("/mnt/x/select_n/lib/transformers/models/bert/modeling_bert.py", User),
            ("d:\\ai\\dev\\joel\\unet.py", User),
            ("/v/lib/python3.12/site-packages/einops/einops.py", Library),
            ("/usr/lib/python3/dist-packages/numpy/core/numeric.py", Library),
            (
                "C:\\Users\\j\\AppData\\Local\\Programs\\Python\\Python310\\lib\\site-packages\\torch\\nn\\modules\\module.py",
                Library,
            ),
            ("/src/pytorch/torch/nn/functional.py", Library),
            ("torch/nn/functional.py", Library),
            ("/tmp/torchinductor_me/fy/cfynmy2u.py", Library),
            ("/usr/lib/python3.10/threading.py", Stdlib),
            ("/env/lib64/python3.9/contextlib.py", Stdlib),
            ("C:\\Python310\\Lib\\contextlib.py", Stdlib),
            ("C:\\Users\\j\\miniconda3\\envs\\dl\\Lib\\copy.py", Stdlib),
            ("<frozen runpy>", Stdlib),
        ];
        for (file, want) in cases {
            assert_eq!(kind(file, "f"), want, "{file}");
        }
        // Python frames are never noise, whatever their function's name.
        assert_eq!(kind("/home/me/train.py", "on_train_start"), User);
        assert_eq!(kind("/home/me/train.py", "PyEval_thing"), User);
    }

    #[test]
    fn compiled_frames_noise_or_native() {
        use FrameKind::*;
        let cases = [
            ("??", "torch::unwind::unwind()", Noise),
            ("memory_snapshot.cpp", "torch::cuda::(anonymous namespace)::gather_with_cpp()", Noise),
            (
                "CUDACachingAllocator.cpp",
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char)",
                Noise,
            ),
            ("RegisterCUDA.cpp", "at::(anonymous namespace)::wrapper_CUDA_any(at::Tensor const&)", Noise),
            ("??", "at::_ops::zeros_like::redispatch(c10::DispatchKeySet, at::Tensor const&)", Noise),
            ("??", "_PyEval_EvalFrameDefault", Noise),
            ("??", "Py_BytesMain", Noise),
            ("??", "pymain_run_file", Noise),
            ("??", "run_mod.llvm.9196888086361497952", Noise),
            ("/usr/local/src/conda/python-3.10.14/Objects/call.c", "_PyObject_MakeTpCall", Noise),
            ("/usr/local/src/conda/python-3.12.7/Python/bltinmodule.c", "builtin_exec_impl", Noise),
            ("./csu/../csu/libc-start.c", "__libc_start_main_impl", Noise),
            ("??", "_start", Noise),
            ("??", "at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", Noise),
            ("", "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>)", Noise),
            ("??", "??", Noise),
            ("/usr/local/cuda/lib64/libcudart.so.12", "libcudart.so.12+0x4f1a0", Noise),
            ("/lib/x86_64-linux-gnu/libc.so.6", "libc.so.6+0x2724a", Noise),
            ("??", "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)", Native),
            ("??", "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)", Native),
            ("python_torch_functions_0.cpp", "torch::autograd::THPVariable_einsum(_object*, _object*)", Native),
            ("kernels/workloads/two_sites.c", "load_weights", Native),
            ("??", "restart_worker", Native),
            ("??", "Python_helper", Native),
        ];
        for (file, name, want) in cases {
            assert_eq!(kind(file, name), want, "{file} {name}");
        }
    }

    #[test]
    fn library_modules_are_dotted_from_the_package_root() {
        let cases = [
            (
                "/v/lib/python3.12/site-packages/einops/einops.py",
                "einops.einops",
            ),
            (
                "C:\\Users\\j\\Python310\\lib\\site-packages\\torch\\nn\\modules\\module.py",
                "torch.nn.modules.module",
            ),
            ("/v/site-packages/torch/__init__.py", "torch"),
            ("/src/pytorch/torch/nn/functional.py", "torch.nn.functional"),
            (
                "/usr/lib/python3.10/concurrent/futures/thread.py",
                "concurrent.futures.thread",
            ),
            ("C:\\Python310\\Lib\\copy.py", "copy"),
            ("<frozen importlib._bootstrap>", "importlib._bootstrap"),
            ("/tmp/torchinductor_me/fy/cfynmy2u.py", "cfynmy2u"),
        ];
        for (file, want) in cases {
            assert_eq!(module(file).as_deref(), Some(want), "{file}");
        }
        assert_eq!(module("??"), None);
    }

    #[test]
    fn argument_lists_are_dropped_from_compiled_names() {
        let cases = [
            ("at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)", "at::_ops::bmm::call"),
            (
                "torch::cuda::(anonymous namespace)::gather_with_cpp()",
                "torch::cuda::(anonymous namespace)::gather_with_cpp",
            ),
            (
                "torch::autograd::Node::operator()(std::vector<at::Tensor>&&)",
                "torch::autograd::Node::operator()",
            ),
            (
                "void at::native::gpu_reduce_kernel<bool, func_t<void (*)(int)>>(at::TensorIterator&)",
                "void at::native::gpu_reduce_kernel<bool, func_t<void (*)(int)>>",
            ),
            ("c10::TensorImpl::~TensorImpl() [clone .localalias]", "c10::TensorImpl::~TensorImpl"),
            ("load_weights", "load_weights"),
            ("broken(", "broken"),
            (")(>", ")"),
        ];
        for (name, want) in cases {
            assert_eq!(without_arguments(name), want, "{name}");
        }
    }
}
