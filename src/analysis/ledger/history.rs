//! The ledger's history of one device's total: the time and the total after every change,
//! kept to find the total when each NVML sample was taken (`memprof run` writes the samples
//! after all the records). A recording makes millions of changes, so each is kept as the
//! differences from the one before, in as few bytes as they need (zigzag LEB128: a change
//! microseconds after the last, of a few megabytes, takes 6 bytes where two whole values take
//! 16), with every `MARK_EVERY`-th change kept whole to start reading from. Every value reads
//! back exactly, whatever it is.

/// Changes between two kept-whole ones: a lookup decodes at most this many.
const MARK_EVERY: usize = 64;

/// A change kept whole, and where the differences after it start.
#[derive(Debug)]
struct Mark {
    time: u64,
    total: u64,
    at: usize,
}

/// The (time, total) after each change, in the order they were pushed.
#[derive(Debug, Default)]
pub struct TotalHistory {
    marks: Vec<Mark>,
    /// The differences, two numbers for each change that is not a mark.
    deltas: Vec<u8>,
    last: (u64, u64),
    len: usize,
}

impl TotalHistory {
    /// Adds the time and the total after the next change.
    #[inline]
    pub fn push(&mut self, time: u64, total: u64) {
        if self.len.is_multiple_of(MARK_EVERY) {
            self.marks.push(Mark {
                time,
                total,
                at: self.deltas.len(),
            });
        } else {
            put(&mut self.deltas, time.wrapping_sub(self.last.0));
            put(&mut self.deltas, total.wrapping_sub(self.last.1));
        }
        self.last = (time, total);
        self.len += 1;
    }

    /// The (time, total) of change `i` (below the number pushed).
    fn get(&self, i: usize) -> (u64, u64) {
        let mark = &self.marks[i / MARK_EVERY];
        let (mut time, mut total, mut at) = (mark.time, mark.total, mark.at);
        for _ in 0..i % MARK_EVERY {
            time = time.wrapping_add(take(&self.deltas, &mut at));
            total = total.wrapping_add(take(&self.deltas, &mut at));
        }
        (time, total)
    }

    /// The total after the last change at or before `ts` (0 before the first), found as a
    /// binary search of the times finds it (as `slice::partition_point`; a recording's times
    /// are in order but for a late event, and then the search is what decides).
    pub fn total_at(&self, ts: u64) -> u64 {
        let (mut low, mut high) = (0, self.len);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.get(mid).0 <= ts {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low.checked_sub(1).map_or(0, |i| self.get(i).1)
    }
}

/// Appends `delta`, a wrapping difference, as a zigzag LEB128 number: small differences of
/// either sign take few bytes.
#[inline]
fn put(out: &mut Vec<u8>, delta: u64) {
    let mut v = (delta << 1) ^ ((delta as i64 >> 63) as u64);
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads the number `put` wrote at `at`, and moves past it.
fn take(bytes: &[u8], at: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = bytes[*at];
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            break;
        }
        shift += 7;
    }
    (v >> 1) ^ (v & 1).wrapping_neg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn history(changes: &[(u64, u64)]) -> TotalHistory {
        let mut h = TotalHistory::default();
        for &(time, total) in changes {
            h.push(time, total);
        }
        h
    }

    /// What `total_at` must give: the same binary search over the plain list (on times in
    /// order, `slice::partition_point`'s answer; out of order, the one the ledger has always
    /// given).
    fn plain_total_at(changes: &[(u64, u64)], ts: u64) -> u64 {
        let (mut low, mut high) = (0, changes.len());
        while low < high {
            let mid = low + (high - low) / 2;
            if changes[mid].0 <= ts {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        if changes.is_sorted_by_key(|c| c.0) {
            assert_eq!(low, changes.partition_point(|c| c.0 <= ts));
        }
        low.checked_sub(1).map_or(0, |i| changes[i].1)
    }

    #[test]
    fn every_change_reads_back_across_marks_jumps_and_the_ends_of_u64() {
        let changes: Vec<(u64, u64)> = (0..3 * MARK_EVERY as u64 + 5)
            .map(|i| match i % 5 {
                0 => (i * 1_000, i << 20),
                1 => (u64::MAX - i, 0),
                2 => (i * 1_000 + 7, u64::MAX),
                3 => (0, 1 << 63),
                _ => (i * 1_000 + 9, 512 * i),
            })
            .collect();
        let h = history(&changes);
        let read: Vec<(u64, u64)> = (0..changes.len()).map(|i| h.get(i)).collect();
        assert_eq!(read, changes);
    }

    #[test]
    fn a_run_of_small_changes_takes_a_few_bytes_each() {
        let changes: Vec<(u64, u64)> = (0..10_000u64)
            .map(|i| (1_000_000 + 700 * i, (1 << 30) + (i % 3) * (1 << 20)))
            .collect();
        let h = history(&changes);
        // 700 ns takes 2 bytes, a megabyte or two 4.
        assert!(h.deltas.len() <= 6 * changes.len(), "{}", h.deltas.len());
        assert_eq!(h.total_at(0), 0);
        assert_eq!(h.total_at(1_000_000 + 700 * 5), changes[5].1);
        assert_eq!(h.total_at(u64::MAX), changes[9_999].1);
    }

    proptest! {
        #[test]
        fn total_at_is_the_plain_lists_binary_search(
            changes in proptest::collection::vec((0u64..5_000, any::<u64>()), 0..400),
            sorted in any::<bool>(),
            bounds in proptest::collection::vec(0u64..5_100, 1..20),
        ) {
            let mut changes = changes;
            if sorted {
                changes.sort_by_key(|c| c.0);
            }
            let h = history(&changes);
            for ts in bounds.into_iter().chain([u64::MAX]) {
                prop_assert_eq!(h.total_at(ts), plain_total_at(&changes, ts));
            }
        }
    }
}
