//! When each `alloc` entry of a trace ended, four bytes per allocation rather than per entry
//! (in a training trace a third of the entries are allocations): a bitmap of which entries are
//! allocations, with a count per 64 entries, turns an entry's index into its allocation's.

use crate::model::{Action, Live, TraceEntry};

/// An allocation still alive at the end, or an entry index past u32 (a trace of four billion
/// entries would not fit in memory anyway).
pub const NEVER: u32 = u32::MAX;

/// The entry that ended each `alloc` entry, by the entry's index.
pub struct EndedAt {
    /// Bit `j % 64` of word `j / 64` is set when entry `j` is an `alloc`.
    is_alloc: Vec<u64>,
    /// The allocations before each word's first entry.
    before: Vec<u32>,
    /// By allocation, in entry order: the entry that ended it, or `NEVER`.
    ended: Vec<u32>,
}

impl EndedAt {
    /// Every allocation of `entries` alive.
    pub fn new(entries: &[TraceEntry]) -> EndedAt {
        let words = entries.len().div_ceil(64);
        let mut is_alloc = Vec::with_capacity(words);
        let mut before = Vec::with_capacity(words);
        let mut allocs = 0u32;
        for chunk in entries.chunks(64) {
            let mut word = 0u64;
            for (k, e) in chunk.iter().enumerate() {
                word |= u64::from(e.action() == Action::Alloc) << k;
            }
            is_alloc.push(word);
            before.push(allocs);
            // Fewer than 2^32 allocations: more would not fit in memory as entries.
            allocs = allocs.wrapping_add(word.count_ones());
        }
        EndedAt {
            is_alloc,
            before,
            ended: vec![NEVER; allocs as usize],
        }
    }

    /// The place among the allocations of entry `j`, if it is an `alloc`.
    #[inline]
    fn allocation(&self, j: usize) -> Option<usize> {
        let (word, bit) = (j / 64, j % 64);
        let bits = *self.is_alloc.get(word)?;
        if bits & (1 << bit) == 0 {
            return None;
        }
        let below = bits & ((1u64 << bit) - 1);
        Some(self.before[word] as usize + below.count_ones() as usize)
    }

    /// The entry that ended the `alloc` entry at `j`; `NEVER` while it lives, and for an entry
    /// that is not an `alloc` (an `oom` entry taken as the allocation it asked for).
    #[inline]
    pub fn get(&self, j: usize) -> u32 {
        self.allocation(j).map_or(NEVER, |k| self.ended[k])
    }

    /// Notes that entry `at` ended the `alloc` entry at `j` (only allocations end).
    #[inline]
    pub fn set(&mut self, j: usize, at: u32) {
        if let Some(k) = self.allocation(j) {
            self.ended[k] = at;
        }
    }

    /// Whether the `alloc` entry at `j` was still alive after entry `p`.
    #[inline]
    pub fn alive_after(&self, j: usize, p: usize) -> bool {
        alive_after(self.get(j), p)
    }

    /// The `alloc` entries among the first `entries` (those of the trace this was made for),
    /// in order, each with its index and the entry that ended it (`NEVER`): for a walk over
    /// them all, without looking each one up.
    pub fn allocations<'e>(
        &'e self,
        entries: &'e [TraceEntry],
    ) -> impl Iterator<Item = (usize, &'e TraceEntry, u32)> + 'e {
        (entries.iter().enumerate())
            .filter(|(_, e)| e.action() == Action::Alloc)
            .zip(&self.ended)
            .map(|((j, e), &end)| (j, e, end))
    }

    /// The allocations made by `entries[..=p]` (those of the trace this was made for) still
    /// alive after entry `p`, by address.
    pub fn alive_after_entry<'e>(
        &'e self,
        entries: &'e [TraceEntry],
        p: usize,
    ) -> impl Iterator<Item = (u64, Live)> + 'e {
        let upto = &entries[..(p + 1).min(entries.len())];
        (self.allocations(upto))
            .filter(move |&(_, _, end)| alive_after(end, p))
            .filter_map(|(j, e, _)| Some((e.addr()?, Live::from_alloc(e, j))))
    }
}

/// Whether an allocation that ended at `end` (`NEVER`: did not) was alive after entry `p`.
#[inline]
fn alive_after(end: u32, p: usize) -> bool {
    end == NEVER || end as usize > p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StreamIndex;

    #[test]
    fn each_allocation_keeps_its_own_end_across_words() {
        // Allocations at irregular places over several 64-entry words, frees between.
        let entries: Vec<TraceEntry> = (0..300)
            .map(|j| {
                let action = if j % 3 == 0 || j % 7 == 0 {
                    Action::Alloc
                } else {
                    Action::FreeCompleted
                };
                TraceEntry::new(action, Some(j), 512, StreamIndex(0))
            })
            .collect();
        let allocs: Vec<usize> = (0..300).filter(|j| j % 3 == 0 || j % 7 == 0).collect();
        let mut ended = EndedAt::new(&entries);
        assert_eq!(ended.ended.len(), allocs.len());
        for &j in &allocs {
            assert_eq!(ended.get(j), NEVER);
        }
        for &j in allocs.iter().filter(|&&j| j % 2 == 0) {
            ended.set(j, j as u32 + 5);
        }
        let walked: Vec<(usize, u32)> = (ended.allocations(&entries))
            .map(|(j, _, end)| (j, end))
            .collect();
        let looked_up: Vec<(usize, u32)> = allocs.iter().map(|&j| (j, ended.get(j))).collect();
        assert_eq!(walked, looked_up);
        // Entries that are not allocations never end, and noting an end for one changes
        // nothing.
        ended.set(1, 9);
        assert_eq!(ended.get(1), NEVER);
        assert_eq!(ended.get(300), NEVER);
        for &j in &allocs {
            let want = if j % 2 == 0 { j as u32 + 5 } else { NEVER };
            assert_eq!(ended.get(j), want, "alloc at {j}");
            assert!(ended.alive_after(j, j + 4));
            assert_eq!(ended.alive_after(j, j + 5), j % 2 == 1);
        }
    }
}
