//! Allocation sites: the innermost frame of a stack that belongs to the user's program, after
//! dropping PyTorch, the Python standard library and interpreter / C++ internals.

use crate::model::{Frame, LiveSet, StackId, StackTable};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// Memory held by one allocation site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Site {
    /// `file:line:function` of the site's frame.
    pub frame: String,
    pub bytes: u64,
    pub count: u64,
    /// The full stack (innermost first) of the largest allocation at this site.
    pub stack: Vec<String>,
}

const NO_STACK: &str = "<no stack recorded>";

/// Frames of CPython, of native code and of PyTorch itself: not where a user would look.
fn is_internal(filename: &str) -> bool {
    let native = !(filename.ends_with(".py") || filename.ends_with(".pyx"));
    let torch = filename.contains("/torch/") || filename.starts_with("torch/");
    let frozen = filename.starts_with("<frozen ");
    let stdlib = filename.contains("/lib/python3") && !filename.contains("-packages/");
    native || torch || frozen || stdlib
}

/// Whether a `file:line:function` label is a frame of the user's program.
pub fn is_user_label(label: &str) -> bool {
    let mut parts = label.rsplitn(3, ':');
    let filename = parts.nth(2).unwrap_or(label);
    !is_internal(filename)
}

/// Native frames of the capture and allocator machinery, never a useful site.
const PLUMBING: [&str; 5] = [
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "CUDACachingAllocator",
    "_start",
];

/// Libraries between a program and the device: in a recording's native stacks (the CUDA runtime
/// calls the driver), never the place a user would change.
const CUDA_LIBRARIES: [&str; 2] = ["/libcudart.so", "/libcuda.so"];

fn is_plumbing(f: &Frame) -> bool {
    PLUMBING.iter().any(|p| f.name.contains(p))
        || CUDA_LIBRARIES.iter().any(|l| f.filename.contains(l))
}

/// A C++ function name without its argument list.
fn short_name(name: &str) -> &str {
    name.find('(').map_or(name, |i| &name[..i]).trim_end()
}

/// The site of a stack: the innermost user frame, else the innermost Python frame; for a
/// native-only stack (the autograd engine's thread) the backward node that allocated, else the
/// outermost ATen operator, else the innermost frame that is not capture or allocator code.
pub fn site_of(stacks: &StackTable, stack: Option<StackId>) -> String {
    let Some(id) = stack else {
        return NO_STACK.to_string();
    };
    let frames: Vec<_> = stacks.frames(id).collect();
    if let Some(f) = frames
        .iter()
        .find(|f| !is_internal(&f.filename))
        .or_else(|| frames.iter().find(|f| f.filename.ends_with(".py")))
    {
        return f.label();
    }
    let native = |f: &&&Frame| format!("{}:{}:{}", f.filename, f.line, short_name(&f.name));
    frames
        .iter()
        .find(|f| f.name.contains("autograd::generated::"))
        .or_else(|| {
            frames
                .iter()
                .rev()
                .find(|f| f.name.starts_with("at::_ops::"))
        })
        .or_else(|| frames.iter().find(|f| !is_plumbing(f)))
        .or(frames.first())
        .map_or_else(|| NO_STACK.to_string(), |f| native(&f))
}

/// The `k` sites holding the most live bytes, most first (ties by name).
pub fn top_sites(stacks: &StackTable, live: &LiveSet, k: usize) -> Vec<Site> {
    let mut by_stack: FxHashMap<Option<StackId>, (u64, u64, u64)> = FxHashMap::default();
    for (_, l) in live.iter() {
        let e = by_stack.entry(l.stack).or_default();
        e.0 = e.0.saturating_add(l.size);
        e.1 += 1;
        e.2 = e.2.max(l.size);
    }
    // Stacks in a fixed order, so ties pick the same representative stack on every run.
    let mut by_stack: Vec<_> = by_stack.into_iter().collect();
    by_stack.sort_unstable_by_key(|&(stack, _)| stack);
    // Per site: the site without its stack, and the stack of its largest allocation (labelled
    // only for the sites kept).
    let mut by_site: FxHashMap<String, (Site, Option<StackId>, u64)> = FxHashMap::default();
    for (stack, (bytes, count, largest)) in by_stack {
        let frame = site_of(stacks, stack);
        let (site, site_stack, site_largest) = by_site.entry(frame.clone()).or_insert_with(|| {
            (
                Site {
                    frame,
                    bytes: 0,
                    count: 0,
                    stack: Vec::new(),
                },
                stack,
                largest,
            )
        });
        site.bytes = site.bytes.saturating_add(bytes);
        site.count += count;
        if largest > *site_largest {
            *site_largest = largest;
            *site_stack = stack;
        }
    }
    let mut sites: Vec<(Site, Option<StackId>)> = by_site
        .into_values()
        .map(|(site, stack, _)| (site, stack))
        .collect();
    sites.sort_by(|(a, _), (b, _)| b.bytes.cmp(&a.bytes).then_with(|| a.frame.cmp(&b.frame)));
    sites.truncate(k);
    sites
        .into_iter()
        .map(|(mut site, stack)| {
            site.stack = stack.map_or_else(Vec::new, |id| {
                stacks.frames(id).map(|f| f.label()).collect()
            });
            site
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(filename: &str, line: i64, name: &str) -> Frame {
        Frame {
            filename: filename.into(),
            line,
            name: name.into(),
        }
    }

    #[test]
    fn picks_the_innermost_user_frame() {
        let mut t = StackTable::default();
        let ids = [
            t.add_frame(frame("??", 0, "torch::unwind::unwind()")),
            t.add_frame(frame(
                "/usr/lib/python3.11/site-packages/torch/nn/functional.py",
                2300,
                "linear",
            )),
            t.add_frame(frame("/usr/lib/python3.11/contextlib.py", 81, "inner")),
            t.add_frame(frame("/home/me/model.py", 42, "forward")),
            t.add_frame(frame("/home/me/train.py", 7, "<module>")),
        ];
        let stack = t.add_stack(ids.into());
        assert_eq!(site_of(&t, stack), "/home/me/model.py:42:forward");
        let only_torch = t.add_stack([ids[0], ids[1]].into());
        assert_eq!(
            site_of(&t, only_torch),
            "/usr/lib/python3.11/site-packages/torch/nn/functional.py:2300:linear"
        );
        let only_native = t.add_stack([ids[0]].into());
        assert_eq!(site_of(&t, only_native), "??:0:torch::unwind::unwind");
        assert_eq!(site_of(&t, None), NO_STACK);
        assert!(is_user_label("/home/me/model.py:42:forward"));
        assert!(!is_user_label(
            "/x/site-packages/torch/nn/functional.py:2300:linear"
        ));
        assert!(!is_user_label("??:0:torch::unwind::unwind"));
    }

    #[test]
    fn native_only_stacks_name_the_backward_node_or_operator() {
        let mut t = StackTable::default();
        let unwind = t.add_frame(frame("??", 0, "torch::unwind::unwind()"));
        let malloc = t.add_frame(frame(
            "CUDACachingAllocator.cpp",
            0,
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char)",
        ));
        let op = t.add_frame(frame(
            "??",
            0,
            "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)",
        ));
        let node = t.add_frame(frame(
            "??",
            0,
            "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)",
        ));
        let engine = t.add_frame(frame("??", 0, "torch::autograd::Engine::thread_main()"));
        let backward = t.add_stack([unwind, malloc, op, node, engine].into());
        assert_eq!(
            site_of(&t, backward),
            "??:0:torch::autograd::generated::BmmBackward0::apply"
        );
        let forward = t.add_stack([unwind, malloc, op].into());
        assert_eq!(site_of(&t, forward), "??:0:at::_ops::bmm::call");
        // A recording's stack: the CUDA runtime's frames are passed over.
        let runtime = t.add_frame(frame(
            "/usr/local/cuda/lib64/libcudart.so.12",
            0,
            "libcudart.so.12+0x4f1a0",
        ));
        let caller = t.add_frame(frame("/src/app.cc", 31, "load_weights()"));
        let recorded = t.add_stack([runtime, caller].into());
        assert_eq!(site_of(&t, recorded), "/src/app.cc:31:load_weights");
        let runtime_only = t.add_stack([runtime].into());
        assert_eq!(
            site_of(&t, runtime_only),
            "/usr/local/cuda/lib64/libcudart.so.12:0:libcudart.so.12+0x4f1a0"
        );
        let bare = t.add_stack([unwind, malloc, engine].into());
        assert_eq!(
            site_of(&t, bare),
            "??:0:torch::autograd::Engine::thread_main"
        );
    }
}
