//! Trace-entry metadata parked in the entries while the trace is folded.
//!
//! A trace entry keeps no room for its rare metadata (`compile_context`, `user_metadata`,
//! `forward_frames`): the timeline holds it beside the entries, by index. While the reader
//! folds, rows are staged, copied for dicts the pickle names again, and rearranged into
//! devices, so their final indices are not known. Until then an entry with metadata holds, in
//! its stream and pool fields, the index of its (stream and pool, metadata) pair here: the id
//! travels with every copy, and `restore` puts the fields back once the rows are in place.

use crate::model::{ExtraId, TraceEntry};
use rustc_hash::FxHashMap;

/// The (stream and pool fields, metadata id) pairs parked in entries, by index.
#[derive(Default)]
pub struct ParkedExtras {
    pairs: Vec<(u32, ExtraId)>,
    /// By metadata id: the stream and pool fields first parked with it, and that pair's
    /// index (a trace has few streams, and metadata ids are small and dense, so this finds
    /// nearly every pair without hashing).
    first_with: Vec<Option<(u32, u32)>>,
    /// The index of every other pair.
    index_of: FxHashMap<(u32, ExtraId), u32>,
}

impl ParkedExtras {
    /// `row` marked as having metadata `extra`, which it carries in its stream and pool fields.
    #[inline]
    pub fn park(&mut self, row: TraceEntry, extra: ExtraId) -> Result<TraceEntry, String> {
        let lane = row.lane();
        let slot = extra.0.get() as usize - 1;
        if slot >= self.first_with.len() {
            self.first_with.resize(slot + 1, None);
        }
        let index = match self.first_with[slot] {
            Some((first, index)) if first == lane => index,
            first => {
                let pair = (lane, extra);
                match self.index_of.get(&pair) {
                    Some(&index) => index,
                    None => {
                        let index = u32::try_from(self.pairs.len())
                            .map_err(|_| "too many distinct trace-entry metadata values")?;
                        self.pairs.push(pair);
                        match first {
                            None => self.first_with[slot] = Some((lane, index)),
                            Some(_) => {
                                self.index_of.insert(pair, index);
                            }
                        }
                        index
                    }
                }
            }
        };
        Ok(row.with_lane(index).with_extra(true))
    }

    /// Puts back the stream and pool fields of every entry that has metadata, and returns each
    /// such entry's index and metadata id, in order.
    pub fn restore(&self, entries: &mut [TraceEntry]) -> Result<Vec<(u32, ExtraId)>, String> {
        if self.pairs.is_empty() {
            return Ok(Vec::new());
        }
        let mut at = Vec::new();
        for (i, e) in entries.iter_mut().enumerate() {
            if e.has_extra() {
                let id = self.unpark(e);
                let i = u32::try_from(i).map_err(|_| "more than 4,294,967,296 trace entries")?;
                at.push((i, id));
            }
        }
        Ok(at)
    }

    /// Puts back the stream and pool fields of entries whose metadata nothing reads (the
    /// host allocator's), and unmarks them.
    pub fn drop_from(&self, entries: &mut [TraceEntry]) {
        if self.pairs.is_empty() {
            return;
        }
        for e in entries.iter_mut().filter(|e| e.has_extra()) {
            self.unpark(e);
            *e = e.with_extra(false);
        }
    }

    /// Puts back the stream and pool fields of `e`, which has metadata parked, and returns
    /// its metadata id.
    fn unpark(&self, e: &mut TraceEntry) -> ExtraId {
        let (lane, id) = self.pairs[e.lane() as usize];
        *e = e.with_lane(lane);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, PoolIndex, StreamIndex};
    use std::num::NonZeroU32;

    #[test]
    fn parked_metadata_follows_copies_and_comes_back() {
        let id = |n| ExtraId(NonZeroU32::new(n).expect("not zero"));
        let row = |stream, pool| {
            TraceEntry::new(Action::Alloc, Some(stream as u64), 8, StreamIndex(stream))
                .with_pool(pool)
        };
        let mut parked = ParkedExtras::default();
        let a = parked.park(row(1, None), id(1)).expect("parks");
        let b = parked
            .park(row(2, Some(PoolIndex(4))), id(1))
            .expect("parks");
        let c = parked.park(row(1, None), id(2)).expect("parks");
        let mut entries = vec![row(5, None), b, a, c, b, row(6, Some(PoolIndex(0))), a];
        let mut host = vec![c, row(3, None)];
        let at = parked.restore(&mut entries).expect("parks");
        assert_eq!(
            at,
            vec![(1, id(1)), (2, id(1)), (3, id(2)), (4, id(1)), (6, id(1))]
        );
        let want = [
            row(5, None),
            row(2, Some(PoolIndex(4))).with_extra(true),
            row(1, None).with_extra(true),
            row(1, None).with_extra(true),
            row(2, Some(PoolIndex(4))).with_extra(true),
            row(6, Some(PoolIndex(0))),
            row(1, None).with_extra(true),
        ];
        assert_eq!(entries, want);
        parked.drop_from(&mut host);
        assert_eq!(host, vec![row(1, None), row(3, None)]);
    }

    #[test]
    fn nothing_parked_leaves_entries_alone() {
        let mut entries = vec![TraceEntry::new(Action::Alloc, Some(1), 1, StreamIndex(9))];
        let before = entries.clone();
        assert_eq!(
            ParkedExtras::default().restore(&mut entries),
            Ok(Vec::new())
        );
        assert_eq!(entries, before);
    }
}
