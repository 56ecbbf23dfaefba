//! Validation of a replay: what the record and the model decided, compared entry by
//! entry per action, the first mismatch, and the final layout.

use crate::model::{Action, Segment, TraceEntry};
use serde::Serialize;

/// Entries compared, and how many the model reproduced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub events: u64,
    pub matches: u64,
}

/// An entry as the mismatch report shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EntryView {
    pub action: Action,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    pub size: u64,
}

impl EntryView {
    fn of(e: &TraceEntry) -> EntryView {
        EntryView {
            action: e.action(),
            addr: e.addr(),
            size: e.size,
        }
    }
}

/// The first entry the model did not reproduce.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    pub entry_index: usize,
    /// The recorded entry; `None` when the model made an entry the record lacks.
    pub expected: Option<EntryView>,
    /// The model's entry; `None` when it made none.
    pub got: Option<EntryView>,
    /// Why, in words.
    pub reason: String,
}

/// How the model's decisions compare with the recorded ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validation {
    pub alloc: Tally,
    pub segment_alloc: Tally,
    pub segment_free: Tally,
    pub segment_map: Tally,
    pub segment_unmap: Tally,
    pub oom: Tally,
    pub first_mismatch: Option<Mismatch>,
    /// The model's segments and blocks at the end equal the snapshot's (addresses, sizes,
    /// states).
    pub final_layout_matches: bool,
}

impl Validation {
    fn tally(&mut self, action: Action) -> Option<&mut Tally> {
        match action {
            Action::Alloc => Some(&mut self.alloc),
            Action::SegmentAlloc => Some(&mut self.segment_alloc),
            Action::SegmentFree => Some(&mut self.segment_free),
            Action::SegmentMap => Some(&mut self.segment_map),
            Action::SegmentUnmap => Some(&mut self.segment_unmap),
            Action::Oom => Some(&mut self.oom),
            _ => None,
        }
    }

    pub(super) fn mismatch(&mut self, m: Mismatch) {
        if self.earliest(m.entry_index) {
            self.first_mismatch = Some(m);
        }
    }

    /// Whether a mismatch at `entry_index` would come before any noted: only the first is
    /// kept, so a later one is not worth describing (a replay that has diverged has one at
    /// nearly every entry).
    fn earliest(&self, entry_index: usize) -> bool {
        self.first_mismatch
            .as_ref()
            .is_none_or(|f| entry_index < f.entry_index)
    }

    /// Every compared entry matched.
    pub fn all_match(&self) -> bool {
        self.first_mismatch.is_none()
    }
}

/// Segments and blocks equal in address, size, pool and state (what a replay can know).
pub(super) fn same_layout(model: &[Segment], recorded: &[Segment]) -> bool {
    let key = |s: &Segment| {
        (
            s.address,
            s.total_size,
            s.is_expandable,
            s.pool_id,
            s.blocks
                .iter()
                .map(|b| (b.address, b.size, b.state))
                .collect::<Vec<_>>(),
        )
    };
    let mut recorded: Vec<_> = recorded.iter().map(key).collect();
    recorded.sort_by_key(|k| k.0);
    model.iter().map(key).eq(recorded)
}

/// Compares the recorded decisions in `entries[from..to]` with the model's, action by
/// action, in order.
pub(super) fn compare(
    entries: &[TraceEntry],
    from: usize,
    to: usize,
    got: &[TraceEntry],
    validation: &mut Validation,
) {
    let compared = |e: &TraceEntry| {
        !matches!(
            e.action(),
            Action::FreeRequested | Action::FreeCompleted | Action::Snapshot
        )
    };
    let recorded = &entries[from..to];
    if !recorded.iter().any(compared) && !got.iter().any(compared) {
        return;
    }
    if let ([want], [have]) = (recorded, got) {
        if want.action() == Action::Alloc && have.action() == Action::Alloc {
            validation.alloc.events += 1;
            if have.addr() == want.addr() && have.size == want.size {
                validation.alloc.matches += 1;
                return;
            }
            validation.alloc.events -= 1;
        }
    }
    const COMPARED: [Action; 6] = [
        Action::SegmentFree,
        Action::SegmentUnmap,
        Action::SegmentAlloc,
        Action::SegmentMap,
        Action::Alloc,
        Action::Oom,
    ];
    for action in COMPARED {
        let mut model = got.iter().filter(|e| e.action() == action);
        let mut last_index = from;
        for (index, want) in entries[from..to]
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action() == action)
        {
            let index = from + index;
            last_index = index;
            let have = model.next();
            let same = have.is_some_and(|h| {
                h.size == want.size && (action == Action::Oom || h.addr() == want.addr())
            });
            if let Some(t) = validation.tally(action) {
                t.events += 1;
                t.matches += u64::from(same);
            }
            if !same && validation.earliest(index) {
                let reason = match have {
                    None => format!("the model made no {action} here"),
                    Some(h) if h.size != want.size => {
                        format!("the model's {action} has another size")
                    }
                    Some(_) => format!("the model's {action} is at another address"),
                };
                validation.mismatch(Mismatch {
                    entry_index: index,
                    expected: Some(EntryView::of(want)),
                    got: have.map(EntryView::of),
                    reason,
                });
            }
        }
        let extra_at = last_index.min(to.saturating_sub(1));
        if let Some(extra) = model.next().filter(|_| validation.earliest(extra_at)) {
            validation.mismatch(Mismatch {
                entry_index: extra_at,
                expected: None,
                got: Some(EntryView::of(extra)),
                reason: format!("the model made a {action} the record does not have"),
            });
        }
    }
}
