//! What became of each dict the trace fold took, by handle, in a few bytes per run of handles
//! instead of four per handle: in a snapshot almost every dict becomes the next row.

/// Staged by `fold_flat`, not appended yet. The only mark that changes later.
pub const AWAITING: u32 = u32::MAX;
/// Skipped as a bad entry: each reference counts as one more.
pub const BAD: u32 = u32::MAX - 1;
/// Skipped for an action this version does not know (`TraceFolder::unknown_of`).
pub const UNKNOWN: u32 = u32::MAX - 2;
/// Staged, then passed over by a later dict's adoption (it was used elsewhere first): its row
/// is in `TraceFolder::orphans`.
pub const ORPHAN: u32 = u32::MAX - 3;
/// A row index past the marks: the dict cannot be appended again (a file of 4 billion rows).
pub const NOT_AGAIN: u32 = u32::MAX - 4;

/// The mark of the row at `index` of the fold's entries (row marks are below `NOT_AGAIN`).
pub fn row_mark(index: usize) -> u32 {
    u32::try_from(index).map_or(NOT_AGAIN, |i| i.min(NOT_AGAIN))
}

/// Handles kept one mark each before the settled ones among them are folded into runs.
const RECENT: usize = 1 << 16;

/// Handles from `handle` on, up to the next run: rows counting up from `mark` when it is a row
/// mark, else all `mark`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    handle: u32,
    mark: u32,
}

impl Run {
    fn mark_of(self, handle: u32) -> u32 {
        if self.mark < NOT_AGAIN {
            self.mark + (handle - self.handle)
        } else {
            self.mark
        }
    }
}

/// The marks by handle (handles are given out in order from 0). The oldest handles, whose
/// marks no longer change, are kept as runs; the recent ones one mark each.
#[derive(Clone, Debug)]
pub struct HandleMarks {
    runs: Vec<Run>,
    /// The first handle of `recent`; the handles below it are in `runs`.
    recent_from: u32,
    recent: Vec<u32>,
    /// How many recent handles are settled at once, at least (`RECENT`).
    settle_from: usize,
}

impl Default for HandleMarks {
    fn default() -> HandleMarks {
        HandleMarks::settling_from(RECENT)
    }
}

impl HandleMarks {
    fn settling_from(settle_from: usize) -> HandleMarks {
        HandleMarks {
            runs: Vec::new(),
            recent_from: 0,
            recent: Vec::with_capacity(settle_from),
            settle_from,
        }
    }

    /// How many handles were given out.
    pub fn len(&self) -> usize {
        self.recent_from as usize + self.recent.len()
    }

    /// Gives out the next handle, marked `mark`.
    #[inline]
    pub fn push(&mut self, mark: u32) {
        if self.recent.len() >= self.settle_from && self.recent.len() == self.recent.capacity() {
            self.settle();
        }
        self.recent.push(mark);
    }

    /// The mark of `handle`, if it was given out.
    #[inline]
    pub fn get(&self, handle: u32) -> Option<u32> {
        match handle.checked_sub(self.recent_from) {
            Some(i) => self.recent.get(i as usize).copied(),
            None => {
                let at = self.runs.partition_point(|r| r.handle <= handle);
                Some(self.runs[at - 1].mark_of(handle))
            }
        }
    }

    /// Changes the mark of `handle`, still `AWAITING` (only those change).
    #[inline]
    pub fn set(&mut self, handle: u32, mark: u32) {
        let i = handle - self.recent_from;
        self.recent[i as usize] = mark;
    }

    /// Moves the recent handles before the first still awaiting into runs, extending the last
    /// run where the marks go on from it.
    #[cold]
    #[inline(never)]
    fn settle(&mut self) {
        let settled = (self.recent.iter())
            .position(|&m| m == AWAITING)
            .unwrap_or(self.recent.len());
        // The mark the last run gives the next handle.
        let mut next = self.runs.last().map(|r| r.mark_of(self.recent_from));
        for (i, &mark) in self.recent[..settled].iter().enumerate() {
            if next != Some(mark) {
                let handle = self.recent_from + i as u32;
                self.runs.push(Run { handle, mark });
            }
            next = Some(if mark < NOT_AGAIN { mark + 1 } else { mark });
        }
        self.recent.drain(..settled);
        self.recent_from += settled as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The marks, beside a plain list of the same marks to check them against.
    struct Checked {
        marks: HandleMarks,
        dense: Vec<u32>,
        rows: usize,
    }

    impl Checked {
        fn new(settle_from: usize) -> Checked {
            Checked {
                marks: HandleMarks::settling_from(settle_from),
                dense: Vec::new(),
                rows: 0,
            }
        }

        fn push(&mut self, mark: u32) -> u32 {
            self.marks.push(mark);
            self.dense.push(mark);
            self.dense.len() as u32 - 1
        }

        fn set(&mut self, handle: u32, mark: u32) {
            self.marks.set(handle, mark);
            self.dense[handle as usize] = mark;
        }

        /// A row appended straight away.
        fn row(&mut self) {
            self.push(row_mark(self.rows));
            self.rows += 1;
        }

        /// `n` dicts staged, then adopted one by one.
        fn adopted(&mut self, n: usize) {
            for _ in 0..n {
                let handle = self.push(AWAITING);
                self.set(handle, row_mark(self.rows));
                self.rows += 1;
            }
        }

        fn assert_same(&self) {
            assert_eq!(self.marks.len(), self.dense.len());
            for (h, &m) in self.dense.iter().enumerate() {
                assert_eq!(self.marks.get(h as u32), Some(m), "handle {h}");
            }
            assert_eq!(self.marks.get(self.dense.len() as u32), None);
        }
    }

    #[test]
    fn a_snapshot_of_rows_in_order_keeps_one_run() {
        let mut checked = Checked::new(RECENT);
        checked.adopted(5 * RECENT + 17);
        checked.assert_same();
        assert_eq!(checked.marks.runs.len(), 1);
        assert!(checked.marks.recent.len() <= 2 * RECENT);
    }

    #[test]
    fn handles_still_awaiting_are_not_settled_and_can_change() {
        let mut checked = Checked::new(RECENT);
        checked.adopted(10);
        // One dict staged and left waiting while many others come and go.
        let waiting = checked.push(AWAITING);
        checked.adopted(3 * RECENT);
        assert_eq!(checked.marks.get(waiting), Some(AWAITING));
        checked.set(waiting, ORPHAN);
        checked.adopted(3 * RECENT);
        checked.assert_same();
        assert!(checked.marks.runs.len() <= 4);
    }

    proptest! {
        /// Any sequence of marks, settled or not, reads back as a plain list of them would.
        #[test]
        fn marks_read_back_as_given(
            steps in proptest::collection::vec((0u8..6, 1usize..300), 1..60),
            settle_from in 1usize..64,
        ) {
            let mut checked = Checked::new(settle_from);
            let mut waiting = Vec::new();
            for (kind, n) in steps {
                match kind {
                    0 => checked.adopted(n),
                    1 => (0..n).for_each(|_| checked.row()),
                    2 => {
                        for _ in 0..n % 40 {
                            checked.push(BAD);
                        }
                    }
                    3 => {
                        checked.push(UNKNOWN);
                    }
                    4 => waiting.push(checked.push(AWAITING)),
                    _ => {
                        if let Some(handle) = waiting.pop() {
                            checked.set(handle, if n % 2 == 0 { ORPHAN } else { NOT_AGAIN });
                        }
                    }
                }
            }
            checked.assert_same();
        }
    }
}
