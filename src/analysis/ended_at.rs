//! When each `alloc` entry of a trace ended, four bytes per allocation rather than per entry
//! (in a training trace a third of the entries are allocations): a bitmap of which entries are
//! allocations, with a count per 64 entries, turns an entry's index into its allocation's. It
//! is filled as the replay that finds the endings applies each entry, and walks over the
//! allocations read the bitmap rather than the entries.

use crate::model::{Live, TraceEntry};
use std::ops::Range;

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
    /// The entries noted so far.
    entries: usize,
}

impl EndedAt {
    /// Room for a trace of `n` entries, none noted yet: `push` notes each, in order, as a
    /// replay applies it (so no walk of its own reads the trace again).
    pub fn with_capacity(n: usize) -> EndedAt {
        let words = n.div_ceil(64);
        EndedAt {
            is_alloc: Vec::with_capacity(words),
            before: Vec::with_capacity(words),
            ended: Vec::new(),
            entries: 0,
        }
    }

    /// Notes the next entry: whether it is an `alloc` (alive until `set`).
    #[inline]
    pub fn push(&mut self, alloc: bool) {
        let bit = self.entries % 64;
        if bit == 0 {
            self.is_alloc.push(0);
            // Fewer than 2^32 allocations: more would not fit in memory as entries.
            self.before.push(self.ended.len() as u32);
        }
        if alloc {
            if let Some(word) = self.is_alloc.last_mut() {
                *word |= 1 << bit;
            }
            self.ended.push(NEVER);
        }
        self.entries += 1;
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

    /// The allocations made by `entries[..=p]` (those of the trace this was made for) still
    /// alive after entry `p`, by address. Only their entries are read.
    pub fn alive_after_entry<'e>(
        &'e self,
        entries: &'e [TraceEntry],
        p: usize,
    ) -> impl Iterator<Item = (u64, Live)> + 'e {
        self.alloc_ends(0..(p + 1).min(entries.len()))
            .filter(move |&(_, end)| alive_after(end, p))
            .filter_map(|(j, _)| {
                let e = &entries[j];
                Some((e.addr()?, Live::from_alloc(e, j)))
            })
    }

    /// The first `alloc` entry at or after entry `from`, found in the bitmap: for a walk over
    /// the allocations that must not hold this borrowed between them.
    #[inline]
    pub fn next_alloc(&self, from: usize) -> Option<usize> {
        self.indices(from..usize::MAX).next()
    }

    /// Each `alloc` entry in `range` (of the trace this was made for), in order: its index
    /// and the entry that ended it (`NEVER`). Found in the bitmap, without reading entries.
    pub fn alloc_ends(&self, range: Range<usize>) -> impl Iterator<Item = (usize, u32)> + '_ {
        let (word, bit) = (range.start / 64, range.start % 64);
        let place = match self.is_alloc.get(word) {
            Some(&w) => {
                self.before[word] as usize + (w & ((1u64 << bit) - 1)).count_ones() as usize
            }
            None => self.ended.len(),
        };
        (self.indices(range))
            .zip(&self.ended[place..])
            .map(|(j, &ended)| (j, ended))
    }

    /// The indices of the `alloc` entries in `range`, from the bitmap.
    fn indices(&self, range: Range<usize>) -> AllocIndices<'_> {
        let (word, bit) = (range.start / 64, range.start % 64);
        AllocIndices {
            words: &self.is_alloc,
            word,
            bits: self
                .is_alloc
                .get(word)
                .map_or(0, |&w| w & (u64::MAX << bit)),
            end: range.end,
        }
    }
}

/// The indices of the `alloc` entries below `end`, in order, read from the bitmap of which
/// entries are allocations (a walk over the entries themselves would read them all from
/// memory, where the bitmap of a long trace fits in the cache).
struct AllocIndices<'b> {
    words: &'b [u64],
    /// The word `bits` comes from.
    word: usize,
    /// The bits of that word not yet visited.
    bits: u64,
    end: usize,
}

impl Iterator for AllocIndices<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        while self.bits == 0 {
            self.word += 1;
            if self.word * 64 >= self.end {
                return None;
            }
            self.bits = *self.words.get(self.word)?;
        }
        let j = self.word * 64 + self.bits.trailing_zeros() as usize;
        if j >= self.end {
            return None;
        }
        self.bits &= self.bits - 1;
        Some(j)
    }
}

/// Whether an allocation that ended at `end` (`NEVER`: did not) was alive after entry `p`.
#[inline]
pub fn alive_after(end: u32, p: usize) -> bool {
    end == NEVER || end as usize > p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, StreamIndex};

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
        let mut ended = EndedAt::with_capacity(entries.len());
        for e in &entries {
            ended.push(e.action() == Action::Alloc);
        }
        assert_eq!(ended.ended.len(), allocs.len());
        for &j in &allocs {
            assert_eq!(ended.get(j), NEVER);
        }
        for &j in allocs.iter().filter(|&&j| j % 2 == 0) {
            ended.set(j, j as u32 + 5);
        }
        let walked: Vec<(usize, u32)> = ended.alloc_ends(0..entries.len()).collect();
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
        // Any range, from any bit of any word, gives the allocations in it with their ends.
        for start in [0, 1, 62, 63, 64, 65, 127, 128, 200, 299, 300] {
            for end in [start, start + 1, start + 64, start + 100, 300] {
                let from_bits: Vec<(usize, u32)> = ended.alloc_ends(start..end).collect();
                let want: Vec<(usize, u32)> = (start..end.min(300))
                    .filter(|j| allocs.contains(j))
                    .map(|j| (j, ended.get(j)))
                    .collect();
                assert_eq!(from_bits, want, "{start}..{end}");
            }
            let next = (start..300).find(|j| allocs.contains(j));
            assert_eq!(ended.next_alloc(start), next, "from {start}");
        }
    }
}
