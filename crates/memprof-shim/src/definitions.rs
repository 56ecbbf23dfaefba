//! Every stack and mapping definition the writer has drained, in order, kept for the live
//! socket: a client must get the definitions before the records that name their ids, and one
//! that connects late must get those written before it came (`live_client.rs` copies them from
//! here in whole definitions, bounded, as it copies the snapshot). Only the writer thread
//! touches it. It grows as the shim's stack table does (`stacks.rs`): one copy of each
//! distinct stack and of each executable mapping.

use memprof_wire::{payload_lengths, Record, RECORD_LEN};

#[derive(Default)]
pub struct Definitions {
    bytes: Vec<u8>,
}

/// The length of the definition at the start of `bytes` (its record and padded payload).
fn length(bytes: &[u8]) -> usize {
    let mut head = [0u8; RECORD_LEN];
    head.copy_from_slice(&bytes[..RECORD_LEN]);
    // Only the writer's own encodings are kept: always whole, valid definitions.
    let padded = Record::decode(&head)
        .and_then(|r| payload_lengths(&r))
        .map_or(0, |(_, padded)| padded);
    RECORD_LEN + padded
}

impl Definitions {
    /// Keeps the whole definitions of `defs`.
    pub fn append(&mut self, defs: &[u8]) {
        self.bytes.extend_from_slice(defs);
    }

    /// Bytes kept: the offset a client that has every definition stands at.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Copies whole definitions from offset `at` to `out`, at most `max` of them and each only
    /// while `fits(out.len(), its length)`; moves `at` past them and returns how many.
    pub fn copy(
        &self,
        at: &mut usize,
        max: usize,
        out: &mut Vec<u8>,
        fits: impl Fn(usize, usize) -> bool,
    ) -> usize {
        let mut copied = 0;
        while copied < max && *at < self.bytes.len() {
            let len = length(&self.bytes[*at..]);
            if !fits(out.len(), len) {
                break;
            }
            out.extend_from_slice(&self.bytes[*at..*at + len]);
            *at += len;
            copied += 1;
        }
        copied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_wire::{encode_mapping, encode_stack, Mapping};

    #[test]
    fn definitions_are_copied_whole_within_the_limits() {
        let mut defs = Definitions::default();
        let mapping = encode_mapping(&Mapping {
            start: 0x1000,
            len: 0x1000,
            file_offset: 0,
            path: vec![b'x'; 100],
        });
        let stack = encode_stack(1, &[0x1010; 9]);
        defs.append(&mapping);
        defs.append(&stack);
        defs.append(&encode_stack(2, &[0x1020]));
        assert_eq!(defs.len(), mapping.len() + stack.len() + 2 * RECORD_LEN);
        let mut at = 0;
        let mut out = Vec::new();
        // Room for the mapping (64 + 128 bytes) but not for the stack after it.
        assert_eq!(defs.copy(&mut at, 10, &mut out, |o, l| o + l <= 300), 1);
        assert_eq!(out, mapping);
        assert_eq!(defs.copy(&mut at, 1, &mut out, |_, _| true), 1);
        assert_eq!(defs.copy(&mut at, 10, &mut out, |_, _| true), 1);
        assert_eq!(at, defs.len());
        assert_eq!(defs.copy(&mut at, 10, &mut out, |_, _| true), 0);
        assert_eq!(out.len(), defs.len());
    }
}
