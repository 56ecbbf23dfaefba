//! Call stacks: frames and interned stacks shared by trace entries and blocks.

use super::event::StackId;
use std::num::NonZeroU32;

/// One stack frame as PyTorch records it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

impl Frame {
    /// `file:line:function`, the form reports use.
    pub fn label(&self) -> String {
        format!("{}:{}:{}", self.filename, self.line, self.name)
    }
}

/// Interned frames and stacks. A stack is a list of frames, innermost first.
#[derive(Clone, Debug, Default)]
pub struct StackTable {
    frames: Vec<Frame>,
    stacks: Vec<Box<[u32]>>,
}

impl StackTable {
    /// Adds a frame and returns its index, for building stacks.
    pub fn add_frame(&mut self, frame: Frame) -> u32 {
        self.frames.push(frame);
        (self.frames.len() - 1) as u32
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
}
