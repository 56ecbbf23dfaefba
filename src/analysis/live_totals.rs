//! The live total after each trace entry, in 2 bits an entry instead of a number: how the
//! total moved at the entry (not at all, up or down by the entry's size, or otherwise), with
//! the total before each block of entries, and the rare totals that moved otherwise kept
//! whole. Every total reads back exactly, given the same entries.

use crate::model::TraceEntry;

/// Entries per block: reading one total walks at most this many codes.
const BLOCK: usize = 1024;
/// Codes per word.
const PER_WORD: usize = 32;

/// How the total moved at one entry.
const STILL: u64 = 0;
const UP: u64 = 1;
const DOWN: u64 = 2;
const OTHER: u64 = 3;

/// The live totals of one trace, in entry order (see the module documentation).
#[derive(Debug, Default)]
pub struct LiveTotals {
    /// Each entry's move, 2 bits each, `PER_WORD` to a word.
    codes: Vec<u64>,
    /// The total before each block's first entry.
    starts: Vec<u64>,
    /// The entries whose total moved otherwise, with the total after each, in entry order.
    other: Vec<(usize, u64)>,
    len: usize,
    /// The total after the last entry (before the first, while there is none).
    last: u64,
}

impl LiveTotals {
    /// No entries yet; `before` is the total before the first.
    pub fn new(before: u64) -> LiveTotals {
        LiveTotals {
            last: before,
            ..LiveTotals::default()
        }
    }

    /// Adds the total after the next entry, whose size is `size`.
    #[inline]
    pub fn push(&mut self, size: u64, total: u64) {
        let i = self.len;
        if i.is_multiple_of(BLOCK) {
            self.starts.push(self.last);
        }
        let code = if total == self.last {
            STILL
        } else if self.last.wrapping_add(size) == total {
            UP
        } else if self.last.wrapping_sub(size) == total {
            DOWN
        } else {
            self.other.push((i, total));
            OTHER
        };
        if i.is_multiple_of(PER_WORD) {
            self.codes.push(0);
        }
        if let Some(word) = self.codes.last_mut() {
            *word |= code << (2 * (i % PER_WORD));
        }
        self.len = i + 1;
        self.last = total;
    }

    /// How many totals there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Done adding: the lists give back their spare room.
    pub fn finish(mut self) -> LiveTotals {
        self.codes.shrink_to_fit();
        self.starts.shrink_to_fit();
        self.other.shrink_to_fit();
        self
    }

    /// The totals after entries `start..` in order; `entries` are the entries they were
    /// pushed for.
    pub fn walk_from<'a>(&'a self, entries: &'a [TraceEntry], start: usize) -> Totals<'a> {
        let block = start / BLOCK;
        let first = block * BLOCK;
        let mut walk = Totals {
            totals: self,
            entries,
            next: first.min(self.len),
            total: self.starts.get(block).copied().unwrap_or(self.last),
            other: self.other.partition_point(|&(i, _)| i < first),
        };
        for _ in first..start.min(self.len) {
            walk.next();
        }
        walk
    }

    /// The total after entry `i` (`i < len()`).
    pub fn get(&self, entries: &[TraceEntry], i: usize) -> u64 {
        self.walk_from(entries, i).next().unwrap_or(self.last)
    }
}

/// The totals after each entry from some entry on (`LiveTotals::walk_from`).
pub struct Totals<'a> {
    totals: &'a LiveTotals,
    entries: &'a [TraceEntry],
    /// The entry whose total comes next.
    next: usize,
    /// The total before it.
    total: u64,
    /// Its place in `totals.other`.
    other: usize,
}

impl Iterator for Totals<'_> {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        let i = self.next;
        if i >= self.totals.len {
            return None;
        }
        let code = (self.totals.codes[i / PER_WORD] >> (2 * (i % PER_WORD))) & 3;
        let size = self.entries[i].size;
        self.total = match code {
            STILL => self.total,
            UP => self.total.wrapping_add(size),
            DOWN => self.total.wrapping_sub(size),
            _ => {
                let (_, total) = self.totals.other[self.other];
                self.other += 1;
                total
            }
        };
        self.next = i + 1;
        Some(self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, StreamIndex};
    use proptest::prelude::*;

    fn entry(size: u64) -> TraceEntry {
        TraceEntry::new(Action::Alloc, Some(0x100), size, StreamIndex(0))
    }

    /// Totals pushed for entries of the given sizes read back exactly, whole and from any
    /// entry, whatever way each moved.
    fn reads_back(before: u64, steps: &[(u64, u64)]) {
        let entries: Vec<TraceEntry> = steps.iter().map(|&(size, _)| entry(size)).collect();
        let mut totals = LiveTotals::new(before);
        for &(size, total) in steps {
            totals.push(size, total);
        }
        let totals = totals.finish();
        let want: Vec<u64> = steps.iter().map(|&(_, total)| total).collect();
        assert_eq!(totals.len(), want.len());
        assert_eq!(totals.walk_from(&entries, 0).collect::<Vec<_>>(), want);
        for start in [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            want.len() / 2,
            want.len(),
        ] {
            let start = start.min(want.len());
            let got: Vec<u64> = totals.walk_from(&entries, start).collect();
            assert_eq!(got, want[start..], "from {start}");
        }
        for (i, &total) in want.iter().enumerate().step_by(97) {
            assert_eq!(totals.get(&entries, i), total, "entry {i}");
        }
    }

    #[test]
    fn every_kind_of_move_reads_back_across_blocks() {
        // Up, down and still by the entry's size, a move by another amount, wrapping past
        // zero and the top, and a zero-sized entry; over three blocks and a bit.
        let mut total = 5u64;
        let steps: Vec<(u64, u64)> = (0..3 * BLOCK + 7)
            .map(|i| {
                let size = (i as u64 * 7919) % 5000;
                total = match i % 6 {
                    0 => total.wrapping_add(size),
                    1 => total.wrapping_sub(size / 2),
                    2 => total,
                    3 => total.wrapping_sub(size),
                    4 => u64::MAX - size,
                    _ => total.wrapping_add(size).wrapping_add(1),
                };
                (size, total)
            })
            .collect();
        reads_back(5, &steps);
        reads_back(0, &[]);
    }

    proptest! {
        #[test]
        fn any_totals_read_back(
            before in any::<u64>(),
            moves in prop::collection::vec((0u64..64, 0u8..4, any::<u64>()), 0..3000),
        ) {
            let mut total = before;
            let steps: Vec<(u64, u64)> = moves
                .iter()
                .map(|&(size, how, other)| {
                    total = match how {
                        0 => total,
                        1 => total.wrapping_add(size),
                        2 => total.wrapping_sub(size),
                        _ => other,
                    };
                    (size, total)
                })
                .collect();
            reads_back(before, &steps);
        }
    }
}
