//! Call stacks: frames and interned stacks shared by trace entries and blocks, with each
//! frame's kind worked out once, when it is interned.

use super::event::StackId;
use super::frames::{is_python_file, without_arguments, FrameKind};
use std::num::NonZeroU32;

/// One stack frame as PyTorch records it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

impl Frame {
    /// `file:line:function`, the form reports use; a compiled frame without a line number
    /// (PyTorch records 0) drops it: `file:function`, or `function` alone when the file is
    /// unknown or already in the name (`libcudart.so.12+0x4f1a0`).
    pub fn label(&self) -> String {
        self.label_with(&self.name)
    }

    /// `label` with a compiled function's argument list left out
    /// (`at::_ops::bmm::call`), as filtered stacks and sites show it.
    pub fn short_label(&self) -> String {
        if is_python_file(&self.filename) {
            self.label()
        } else {
            self.label_with(without_arguments(&self.name))
        }
    }

    fn label_with(&self, name: &str) -> String {
        if self.line != 0 || is_python_file(&self.filename) {
            return format!("{}:{}:{}", self.filename, self.line, name);
        }
        let base = self.filename.rsplit(['/', '\\']).next().unwrap_or_default();
        if matches!(self.filename.as_str(), "" | "??") || name.starts_with(base) {
            name.to_string()
        } else {
            format!("{}:{}", self.filename, name)
        }
    }
}

/// Interned frames and stacks. A stack is a list of frames, innermost first.
#[derive(Clone, Debug, Default)]
pub struct StackTable {
    frames: Vec<Frame>,
    /// `kinds[i]` is `frames[i].kind()`.
    kinds: Vec<FrameKind>,
    stacks: Vec<Box<[u32]>>,
}

impl StackTable {
    /// Adds a frame and returns its index, for building stacks.
    pub fn add_frame(&mut self, frame: Frame) -> u32 {
        self.kinds.push(frame.kind());
        self.frames.push(frame);
        (self.frames.len() - 1) as u32
    }

    /// Rewrites every frame in place (a path moved, a line shifted), each frame's kind worked
    /// out again.
    pub fn map_frames(&mut self, mut f: impl FnMut(&mut Frame)) {
        for (frame, kind) in self.frames.iter_mut().zip(self.kinds.iter_mut()) {
            f(frame);
            *kind = frame.kind();
        }
    }

    /// Adds a stack of frame indices (innermost first); `None` for an empty stack.
    pub fn add_stack(&mut self, frames: Box<[u32]>) -> Option<StackId> {
        if frames.is_empty() {
            return None;
        }
        self.stacks.push(frames);
        NonZeroU32::new(self.stacks.len() as u32).map(StackId)
    }

    /// The frames of a stack, innermost first.
    pub fn frames(&self, id: StackId) -> impl ExactSizeIterator<Item = &Frame> + '_ {
        self.stacks[id.0.get() as usize - 1]
            .iter()
            .map(|&f| &self.frames[f as usize])
    }

    /// The frames of a stack with their kinds, innermost first.
    pub fn classified(
        &self,
        id: StackId,
    ) -> impl ExactSizeIterator<Item = (&Frame, FrameKind)> + '_ {
        self.stacks[id.0.get() as usize - 1]
            .iter()
            .map(|&f| (&self.frames[f as usize], self.kinds[f as usize]))
    }
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
    fn compiled_frames_without_a_line_drop_the_zero() {
        let cases = [
            (
                frame("/home/me/model.py", 42, "forward"),
                "/home/me/model.py:42:forward",
            ),
            (
                frame("??", 0, "at::_ops::bmm::call(at::Tensor const&)"),
                "at::_ops::bmm::call(at::Tensor const&)",
            ),
            (
                frame(
                    "Functions.cpp",
                    0,
                    "torch::autograd::generated::MmBackward0::apply()",
                ),
                "Functions.cpp:torch::autograd::generated::MmBackward0::apply()",
            ),
            (
                frame(
                    "/usr/local/cuda/lib64/libcudart.so.12",
                    0,
                    "libcudart.so.12+0x4f1a0",
                ),
                "libcudart.so.12+0x4f1a0",
            ),
            (
                frame("", 0, "c10::StorageImpl::~StorageImpl()"),
                "c10::StorageImpl::~StorageImpl()",
            ),
            (
                frame("kernels/two_sites.c", 31, "load_weights"),
                "kernels/two_sites.c:31:load_weights",
            ),
        ];
        for (f, want) in cases {
            assert_eq!(f.label(), want);
        }
        assert_eq!(
            frame(
                "Functions.cpp",
                0,
                "torch::autograd::generated::MmBackward0::apply()"
            )
            .short_label(),
            "Functions.cpp:torch::autograd::generated::MmBackward0::apply"
        );
        assert_eq!(
            frame("/w/model.py", 3, "f(x)").short_label(),
            "/w/model.py:3:f(x)",
            "a Python name is left as it is"
        );
    }
}
