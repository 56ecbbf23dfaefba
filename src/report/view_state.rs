//! The memory state at one trace entry, as `memprof view` shows it at its cursor, as a JSON
//! document (the MCP tool `view_state`): totals and the largest allocations from the view's
//! own cursor model, the segments and their free blocks from the layout rebuilt at the entry,
//! and the sites holding the live bytes.

use crate::account::Figures;
use crate::analysis::categories::CategoryRules;
use crate::analysis::{layout_at, layout_totals, site_of, top_sites, Site};
use crate::model::{replay_device, Segment, Snapshot};
use crate::report::analyze_json::SCHEMA_VERSION;
use crate::tui::view::summary::Summary;
use serde::Serialize;

/// One segment at the entry.
#[derive(Debug, Serialize)]
pub struct SegmentState {
    pub address: u64,
    pub size_bytes: u64,
    pub active_bytes: u64,
    pub largest_free_bytes: u64,
    pub expandable: bool,
}

/// A free block inside a segment.
#[derive(Debug, Serialize)]
pub struct FreeBlock {
    pub address: u64,
    pub size_bytes: u64,
}

/// A live allocation and its site.
#[derive(Debug, Serialize)]
pub struct LiveAllocation {
    pub address: u64,
    pub size_bytes: u64,
    pub site: String,
}

#[derive(Debug, Serialize)]
pub struct ViewStateReport {
    pub schema_version: u32,
    pub kind: &'static str,
    pub path: String,
    pub device: u32,
    /// Entries in the device's trace.
    pub entries: usize,
    /// The entry the state follows; `None` for a file without a trace (its final state).
    pub index: Option<usize>,
    pub action: Option<String>,
    /// Microseconds on the input's one time axis (from the first trace entry of any device).
    pub time_offset_us: Option<i64>,
    /// The figures at the entry, as the view shows them: requested and reserved bytes from the
    /// trace at any entry; the others where the account has a moment there (a peak, an OOM,
    /// the dump), `null` elsewhere.
    pub figures: Figures,
    pub reserved_bytes: u64,
    pub live_allocations: usize,
    pub segment_count: usize,
    pub free_runs: usize,
    pub largest_free_bytes: Option<u64>,
    pub segments: Vec<SegmentState>,
    pub largest_free_blocks: Vec<FreeBlock>,
    pub largest_allocations: Vec<LiveAllocation>,
    pub top_sites: Vec<Site>,
}

impl ViewStateReport {
    /// The state of `device` just after entry `index` (clamped to the trace), listing `top`
    /// free blocks, allocations and sites.
    pub fn new(
        path: String,
        snapshot: &Snapshot,
        device: u32,
        index: usize,
        top: usize,
    ) -> ViewStateReport {
        let summary = Summary::build(snapshot, device);
        let state = summary.state_at(index);
        let rules = CategoryRules::default();
        let account = crate::account::build(
            snapshot,
            &crate::account::Options {
                only: Some(device),
                ..crate::account::Options::new(top, &rules, crate::diagnose::Origin::TorchSnapshot)
            },
        );
        let axis = account.axis;
        let none = crate::account::DeviceAccount::default();
        let figures = account
            .devices
            .first()
            .map_or(&none, |d| &d.account)
            .figures_with_trace(state.index, state.allocated, state.reserved);
        let entries = snapshot.timeline.device(device as usize);
        let segments: Vec<Segment> = match state.index {
            Some(i) => layout_at(snapshot, device, i),
            None => snapshot.device_segments(device).cloned().collect(),
        };
        let mut replay = replay_device(snapshot, device);
        if let Some(i) = state.index {
            replay.run_through(i);
        }
        let mut free: Vec<FreeBlock> = segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| !b.state.is_active())
            .map(|b| FreeBlock {
                address: b.address,
                size_bytes: b.size,
            })
            .collect();
        free.sort_by(|a, b| {
            b.size_bytes
                .cmp(&a.size_bytes)
                .then(a.address.cmp(&b.address))
        });
        free.truncate(top);
        ViewStateReport {
            schema_version: SCHEMA_VERSION,
            kind: "memprof_view_state",
            path,
            device,
            entries: entries.len(),
            index: state.index,
            action: state
                .index
                .and_then(|i| entries.get(i))
                .map(|e| e.action().to_string()),
            time_offset_us: state.index.and_then(|i| axis.offset_of(entries, i)),
            figures,
            reserved_bytes: state.reserved,
            live_allocations: state.live_count,
            segment_count: state.segment_count,
            free_runs: state.free_runs,
            largest_free_bytes: state.largest_free,
            segments: segments.iter().map(segment_state).collect(),
            largest_free_blocks: free,
            largest_allocations: state
                .largest
                .iter()
                .take(top)
                .map(|b| LiveAllocation {
                    address: b.address,
                    size_bytes: b.size,
                    site: site_of(&snapshot.stacks, b.stack),
                })
                .collect(),
            top_sites: top_sites(&snapshot.stacks, replay.live(), top)
                .into_iter()
                .map(|mut s| {
                    // The filtered stack, as `analyze --json` gives it.
                    s.full_stack.clear();
                    s
                })
                .collect(),
        }
    }
}

fn segment_state(s: &Segment) -> SegmentState {
    let totals = layout_totals([s]);
    SegmentState {
        address: s.address,
        size_bytes: s.total_size,
        active_bytes: totals.active_bytes,
        largest_free_bytes: totals.fragmentation.largest_free_block_bytes,
        expandable: s.is_expandable,
    }
}
