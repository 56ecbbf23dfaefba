//! Allocation sites: the innermost frame of a stack in the user's own code (outside
//! site-packages and dist-packages, the Python standard library and PyTorch's C++), with the
//! library function it called that allocated; and stacks filtered to the frames a person reads
//! (`model::FrameKind` says which are noise).

use crate::model::{Frame, FrameKind, LiveSet, StackId, StackTable};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// Memory held by one allocation site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Site {
    /// `file:line:function` of the site's frame.
    pub frame: String,
    /// The library function the site's frame called that allocated
    /// (`torch.nn.functional.linear`, `einops.einops.einsum`); `None` when the frame allocated
    /// directly or is itself not the user's.
    pub via: Option<String>,
    pub bytes: u64,
    pub count: u64,
    /// The filtered stack (innermost first) of the largest allocation at this site.
    pub stack: Vec<String>,
    /// Every frame of that stack as recorded (`analyze --json` empties it, and so leaves it
    /// out, unless given `--full-stacks`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub full_stack: Vec<String>,
}

/// The frame of a site and the library function it called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteLabel {
    /// `file:line:function`, what `site_of` returns.
    pub frame: String,
    pub via: Option<String>,
}

/// A site as one line reads it: `model.py:39:forward, via einops.einops.einsum`.
pub fn site_text(frame: &str, via: Option<&str>) -> String {
    match via {
        Some(via) => format!("{frame}, via {via}"),
        None => frame.to_string(),
    }
}

/// One stack as shown: frame labels, innermost first, and which of them is the site's frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShownStack {
    pub frames: Vec<String>,
    /// `None` when the site's frame is not among them (a stack of noise only, filtered).
    pub site: Option<usize>,
}

const NO_STACK: &str = "<no stack recorded>";

/// Library functions that only pass a call on (decorators, `nn.Module`'s call machinery,
/// `__torch_function__` dispatch): `via` names the function behind them.
const PASS_THROUGH: [&str; 12] = [
    "_wrapped_call_impl",
    "_call_impl",
    "__call__",
    "wrapper",
    "wrapped",
    "inner",
    "_fn",
    "decorate_context",
    "_use_grad",
    "__torch_function__",
    "handle_torch_function",
    "__torch_dispatch__",
];

/// Where, in a stack innermost first, its site's frame is, and the library frame it called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Position {
    site: usize,
    via: Option<usize>,
}

/// The site of a stack: the innermost user frame, else the innermost Python frame; for a stack
/// of compiled frames only (the autograd engine's thread, a recording) the backward node that
/// allocated (not the helper it called; `AccumulateGrad` for a parameter's gradient), else the outermost ATen operator, else the innermost frame that is not noise.
/// `via` is the outermost library frame inside the user frame that does more than pass the
/// call on.
fn locate(frames: &[(&Frame, FrameKind)]) -> Option<Position> {
    if let Some(user) = frames.iter().position(|&(_, k)| k == FrameKind::User) {
        let via = (0..user)
            .rev()
            .filter(|&i| frames[i].1.is_library())
            .find(|&i| !PASS_THROUGH.contains(&frames[i].0.name.as_str()));
        return Some(Position { site: user, via });
    }
    let native = |_: &Frame, k: FrameKind| k == FrameKind::Native;
    let site = frames
        .iter()
        .position(|&(_, k)| k.is_library())
        .or_else(|| {
            frames.iter().position(|&(f, k)| {
                native(f, k)
                    && ((f.name.contains("autograd::generated::")
                        && !f.name.contains("::details::"))
                        // The node that makes a parameter's `.grad`.
                        || f.name.starts_with("torch::autograd::AccumulateGrad::apply"))
            })
        })
        .or_else(|| {
            frames
                .iter()
                .rposition(|&(f, k)| native(f, k) && f.name.starts_with("at::_ops::"))
        })
        .or_else(|| frames.iter().position(|&(f, k)| native(f, k)))
        .or((!frames.is_empty()).then_some(0))?;
    Some(Position { site, via: None })
}

/// `module.function` of a library frame (the module alone for its top level).
fn via_label(f: &Frame) -> String {
    match f.module() {
        Some(module) if f.name == "<module>" => module,
        Some(module) => format!("{module}.{}", f.name),
        None => f.name.clone(),
    }
}

/// The site of a stack and the library function it called (see `locate`).
pub fn site_label_of(stacks: &StackTable, stack: Option<StackId>) -> SiteLabel {
    let frames: Vec<_> = stack.map_or_else(Vec::new, |id| stacks.classified(id).collect());
    match locate(&frames) {
        Some(p) => SiteLabel {
            frame: frames[p.site].0.short_label(),
            via: p.via.map(|i| via_label(frames[i].0)),
        },
        None => SiteLabel {
            frame: NO_STACK.to_string(),
            via: None,
        },
    }
}

/// The `file:line:function` label of a stack's site (see `site_label_of`).
pub fn site_of(stacks: &StackTable, stack: Option<StackId>) -> String {
    site_label_of(stacks, stack).frame
}

/// A stack as shown: without noise (`full` false; compiled names without their argument
/// lists), or every frame as recorded (`full`).
pub fn shown_stack(stacks: &StackTable, id: StackId, full: bool) -> ShownStack {
    let frames: Vec<_> = stacks.classified(id).collect();
    let site = locate(&frames).map(|p| p.site);
    if full {
        return ShownStack {
            frames: frames.iter().map(|(f, _)| f.label()).collect(),
            site,
        };
    }
    let mut shown = ShownStack {
        frames: Vec::new(),
        site: None,
    };
    for (i, (f, k)) in frames.iter().enumerate() {
        if *k == FrameKind::Noise {
            continue;
        }
        if site == Some(i) {
            shown.site = Some(shown.frames.len());
        }
        shown.frames.push(f.short_label());
    }
    shown
}

/// Whether a `file:line:function` label is a frame of the user's own Python code.
pub fn is_user_label(label: &str) -> bool {
    let mut parts = label.rsplitn(3, ':');
    let (Some(name), Some(line), Some(filename)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Ok(line) = line.parse() else {
        return false;
    };
    let frame = Frame {
        filename: filename.into(),
        line,
        name: name.into(),
    };
    frame.kind() == FrameKind::User
}

/// The `k` sites holding the most live bytes, most first (ties by name), each with the
/// filtered and the full stack of its largest allocation.
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
                    via: None,
                    bytes: 0,
                    count: 0,
                    stack: Vec::new(),
                    full_stack: Vec::new(),
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
            site.via = site_label_of(stacks, stack).via;
            if let Some(id) = stack {
                site.stack = shown_stack(stacks, id, false).frames;
                site.full_stack = shown_stack(stacks, id, true).frames;
            }
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

    const TORCH: &str = "/usr/lib/python3.11/site-packages/torch";

    #[test]
    fn picks_the_innermost_user_frame_and_the_library_it_called() {
        let mut t = StackTable::default();
        let ids = [
            t.add_frame(frame("??", 0, "torch::unwind::unwind()")),
            t.add_frame(frame(
                &format!("{TORCH}/nn/modules/linear.py"),
                125,
                "forward",
            )),
            t.add_frame(frame(
                &format!("{TORCH}/nn/modules/module.py"),
                1750,
                "_call_impl",
            )),
            t.add_frame(frame(
                &format!("{TORCH}/nn/modules/module.py"),
                1739,
                "_wrapped_call_impl",
            )),
            t.add_frame(frame("/usr/lib/python3.11/contextlib.py", 81, "inner")),
            t.add_frame(frame("/home/me/model.py", 42, "forward")),
            t.add_frame(frame("/home/me/train.py", 7, "<module>")),
        ];
        let stack = t.add_stack(ids.into());
        assert_eq!(
            site_label_of(&t, stack),
            SiteLabel {
                frame: "/home/me/model.py:42:forward".into(),
                via: Some("torch.nn.modules.linear.forward".into()),
            }
        );
        assert_eq!(site_of(&t, stack), "/home/me/model.py:42:forward");
        // The user frame allocated directly: nothing between it and the allocator.
        let direct = t.add_stack([ids[0], ids[5], ids[6]].into());
        assert_eq!(site_label_of(&t, direct).via, None);
        let only_torch = t.add_stack([ids[0], ids[1]].into());
        assert_eq!(
            site_label_of(&t, only_torch),
            SiteLabel {
                frame: format!("{TORCH}/nn/modules/linear.py:125:forward"),
                via: None,
            }
        );
        let only_native = t.add_stack([ids[0]].into());
        assert_eq!(site_of(&t, only_native), "torch::unwind::unwind");
        assert_eq!(site_of(&t, None), NO_STACK);
        assert!(is_user_label("/home/me/model.py:42:forward"));
        assert!(is_user_label("d:\\ai\\joel\\unet.py:134:forward"));
        assert!(!is_user_label(
            "C:\\Python310\\lib\\site-packages\\torch\\nn\\functional.py:2300:linear"
        ));
        assert!(!is_user_label("torch::unwind::unwind"));
        assert!(!is_user_label("??:0:torch::unwind::unwind()"));
    }

    #[test]
    fn the_filtered_stack_drops_noise_and_knows_where_the_site_is() {
        let mut t = StackTable::default();
        let ids = [
            t.add_frame(frame("??", 0, "torch::unwind::unwind()")),
            t.add_frame(frame(
                "CUDACachingAllocator.cpp",
                0,
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
            )),
            t.add_frame(frame(
                "??",
                0,
                "at::_ops::zeros_like::call(at::Tensor const&)",
            )),
            t.add_frame(frame("??", 0, "cfunction_call")),
            t.add_frame(frame("/home/me/opt.py", 82, "step")),
            t.add_frame(frame("??", 0, "_PyEval_EvalFrameDefault")),
            t.add_frame(frame("??", 0, "_start")),
            t.add_frame(frame("/home/me/train.py", 7, "<module>")),
        ];
        let id = t.add_stack(ids.into()).expect("a stack");
        let shown = shown_stack(&t, id, false);
        assert_eq!(
            shown.frames,
            [
                "at::_ops::zeros_like::call",
                "/home/me/opt.py:82:step",
                "/home/me/train.py:7:<module>"
            ]
        );
        assert_eq!(shown.site, Some(1));
        let full = shown_stack(&t, id, true);
        assert_eq!(full.frames.len(), 8);
        assert_eq!(
            full.frames[2],
            "at::_ops::zeros_like::call(at::Tensor const&)"
        );
        assert_eq!(full.site, Some(4));
        let noise_only = t.add_stack([ids[0], ids[1]].into()).expect("a stack");
        assert_eq!(
            shown_stack(&t, noise_only, false),
            ShownStack {
                frames: Vec::new(),
                site: None
            }
        );
    }

    #[test]
    fn via_skips_what_only_passes_the_call_on() {
        let mut t = StackTable::default();
        let adam = format!("{TORCH}/optim/adam.py");
        let optimizer = format!("{TORCH}/optim/optimizer.py");
        let ids = [
            t.add_frame(frame(&adam, 111, "_init_group")),
            t.add_frame(frame(&adam, 157, "step")),
            t.add_frame(frame(&optimizer, 76, "_use_grad")),
            t.add_frame(frame(&optimizer, 385, "wrapper")),
            t.add_frame(frame("/home/me/fit.py", 127, "fit")),
        ];
        let stack = t.add_stack(ids.into());
        assert_eq!(
            site_label_of(&t, stack).via.as_deref(),
            Some("torch.optim.adam.step")
        );
        // Only pass-through frames between: the user's call was intercepted, not a library's.
        let device = format!("{TORCH}/utils/_device.py");
        let mode = t.add_frame(frame(&device, 104, "__torch_function__"));
        let intercepted = t.add_stack([mode, ids[4]].into());
        assert_eq!(site_label_of(&t, intercepted).via, None);
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
        let helper = t.add_frame(frame(
            "??",
            0,
            "torch::autograd::generated::details::mm_mat1_backward(at::Tensor const&)",
        ));
        let engine = t.add_frame(frame("??", 0, "torch::autograd::Engine::thread_main()"));
        let backward = t.add_stack([unwind, malloc, op, helper, node, engine].into());
        assert_eq!(
            site_of(&t, backward),
            "torch::autograd::generated::BmmBackward0::apply"
        );
        let forward = t.add_stack([unwind, malloc, op].into());
        assert_eq!(site_of(&t, forward), "at::_ops::bmm::call");
        // A recording's stack: the CUDA runtime's frames are passed over.
        let runtime = t.add_frame(frame(
            "/usr/local/cuda/lib64/libcudart.so.12",
            0,
            "libcudart.so.12+0x4f1a0",
        ));
        let caller = t.add_frame(frame("/src/app.cc", 31, "load_weights()"));
        let start = t.add_frame(frame("??", 0, "_start"));
        let recorded = t.add_stack([runtime, caller, start].into());
        assert_eq!(site_of(&t, recorded), "/src/app.cc:31:load_weights");
        let runtime_only = t.add_stack([runtime].into());
        assert_eq!(site_of(&t, runtime_only), "libcudart.so.12+0x4f1a0");
        let bare = t.add_stack([unwind, malloc, engine].into());
        assert_eq!(site_of(&t, bare), "torch::autograd::Engine::thread_main");
    }
}
