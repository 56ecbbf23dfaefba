//! What a call stack says about the allocation it made: the part of a training step it ran in
//! (parameter set-up, forward, backward, optimizer step) or the library scratch it was, read
//! from PyTorch's own functions on the stack (the user's code names nothing reliable).

use crate::model::{Frame, FrameKind, StackId, StackTable};

/// The strongest thing a stack says, strongest first (a stack with several keeps the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Context {
    /// cuBLAS, cuDNN or NCCL scratch (`getNewWorkspace`, a `*Workspace*` function, NCCL).
    Workspace,
    /// The autograd engine accumulating a parameter's gradient (`AccumulateGrad`).
    AccumulateGrad,
    /// An optimizer: `torch/optim/` (its `step`, `_init_group`, the step wrapper), or a `step`,
    /// `__init__` or `_init_group` in a file whose name says optim.
    Optimizer,
    /// Parameter set-up: `Module.to` / `cuda` / `_apply`, `load_state_dict`, `torch.nn.init`,
    /// a `torch.nn` module's `__init__`, `reset_parameters`, `from_pretrained`.
    Parameter,
    /// The autograd engine running backward nodes, or `Tensor.backward` / `autograd.backward`.
    Backward,
    /// A module's `forward` (or `nn.Module`'s call machinery).
    Forward,
    /// Nothing of the above.
    Unknown,
}

impl Context {
    /// The part of a step this context marks, for cutting the trace into phases.
    pub fn phase(self) -> Option<Context> {
        match self {
            Context::AccumulateGrad | Context::Backward => Some(Context::Backward),
            Context::Optimizer | Context::Parameter | Context::Forward => Some(self),
            Context::Workspace | Context::Unknown => None,
        }
    }
}

/// The context of a stack: the strongest any of its frames gives.
pub fn context_of(stacks: &StackTable, id: StackId) -> Context {
    stacks
        .classified(id)
        .map(|(f, kind)| frame_context(f, kind))
        .min()
        .unwrap_or(Context::Unknown)
}

/// Parameter set-up functions of `torch.nn` (and `from_pretrained` of any library).
const PARAMETER_FUNCTIONS: [&str; 8] = [
    "_apply",
    "to",
    "cuda",
    "to_empty",
    "load_state_dict",
    "_load_from_state_dict",
    "reset_parameters",
    "__init__",
];

fn frame_context(f: &Frame, kind: FrameKind) -> Context {
    let name = f.name.as_str();
    if !matches!(
        kind,
        FrameKind::User | FrameKind::Library | FrameKind::Stdlib
    ) {
        return native_context(name);
    }
    let path = f.filename.replace('\\', "/");
    let file = path.rsplit('/').next().unwrap_or_default();
    if path.contains("/torch/optim/")
        || (file.contains("optim") && matches!(name, "step" | "__init__" | "_init_group"))
    {
        return Context::Optimizer;
    }
    if name == "from_pretrained"
        || path.ends_with("/torch/nn/init.py")
        || (path.contains("/torch/nn/") && PARAMETER_FUNCTIONS.contains(&name))
    {
        return Context::Parameter;
    }
    if (path.contains("/torch/autograd/") && matches!(name, "backward" | "_make_grads" | "grad"))
        || (path.ends_with("/torch/_tensor.py") && name == "backward")
        || name == "_engine_run_backward"
    {
        return Context::Backward;
    }
    if name == "forward" || (file == "module.py" && name.ends_with("_call_impl")) {
        return Context::Forward;
    }
    Context::Unknown
}

fn native_context(name: &str) -> Context {
    if name.contains("Workspace") || name.contains("workspace") || name.contains("NCCL") {
        Context::Workspace
    } else if name.contains("AccumulateGrad") {
        Context::AccumulateGrad
    } else if name.contains("torch::autograd::Engine")
        || name.contains("torch::autograd::Node::operator")
        || (name.contains("torch::autograd::generated::") && name.contains("Backward"))
    {
        Context::Backward
    } else {
        Context::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(filename: &str, name: &str) -> Frame {
        Frame {
            filename: filename.into(),
            line: 1,
            name: name.into(),
        }
    }

    fn of(frames: Vec<Frame>) -> Context {
        let mut table = StackTable::default();
        let ids = frames.into_iter().map(|f| table.add_frame(f)).collect();
        let id = table.add_stack(ids).expect("a stack");
        context_of(&table, id)
    }

    const TORCH: &str = "/usr/lib/python3.11/site-packages/torch";

    #[test]
    fn reads_the_part_of_the_step_from_torch_functions() {
        let optim = format!("{TORCH}/optim/optimizer.py");
        let module = format!("{TORCH}/nn/modules/module.py");
        let tensor = format!("{TORCH}/_tensor.py");
        assert_eq!(
            of(vec![
                frame("/w/optimizers.py", "step"),
                frame(&optim, "wrapper"),
                frame("/w/train.py", "main"),
            ]),
            Context::Optimizer
        );
        assert_eq!(
            of(vec![
                frame("/w/model.py", "forward"),
                frame(&module, "_call_impl")
            ]),
            Context::Forward
        );
        assert_eq!(
            of(vec![frame(&module, "_apply"), frame(&module, "to")]),
            Context::Parameter
        );
        assert_eq!(
            of(vec![
                frame("??", "at::native::zeros_symint(...)"),
                frame("??", "torch::autograd::generated::MmBackward0::apply(...)"),
                frame("??", "torch::autograd::Engine::thread_main(...)"),
            ]),
            Context::Backward
        );
        assert_eq!(
            of(vec![
                frame("??", "torch::autograd::AccumulateGrad::apply(...)"),
                frame("??", "torch::autograd::Engine::thread_main(...)"),
            ]),
            Context::AccumulateGrad
        );
        assert_eq!(
            of(vec![
                frame("??", "at::cuda::getNewWorkspace()"),
                frame("/w/model.py", "forward"),
            ]),
            Context::Workspace
        );
        assert_eq!(of(vec![frame(&tensor, "backward")]), Context::Backward);
        assert_eq!(
            of(vec![frame("/w/train.py", "custom_softmax")]),
            Context::Unknown
        );
    }
}

/// The contexts of stacks, each worked out once, by stack index.
#[derive(Default)]
pub struct ContextCache(Vec<Option<Context>>);

impl ContextCache {
    /// The context of a stack.
    #[inline]
    pub fn get(&mut self, stacks: &StackTable, id: StackId) -> Context {
        let i = id.0.get() as usize - 1;
        if i >= self.0.len() {
            self.0.resize(i + 1, None);
        }
        *self.0[i].get_or_insert_with(|| context_of(stacks, id))
    }
}
