//! Analyses: pure computations over the model (layout totals, the peak and what was alive at
//! it, allocation sites, memory over time, the layout at the peak). They read `model` only; never `source`, `report`
//! or `cli`.

pub mod categories;
pub mod compare;
mod device;
mod ended_at;
pub mod growth;
pub mod host_pinned;
pub mod iterations;
mod layout;
mod layout_at;
mod layout_check;
pub mod ledger;
mod left_alive;
mod live_totals;
pub mod live_tree;
pub mod oom;
mod peak;
pub mod pool_owner;
pub mod pressure;
pub mod same_devices;
mod series;
mod sites;
pub mod trace_states;
pub mod version;

pub use device::{
    analyze_device, analyze_snapshot, analyze_snapshot_with_categories, DeviceAnalysis, OomEntry,
    TraceSummary,
};
pub use layout::{layout_totals, Fragmentation, LayoutTotals, SegmentUse};
pub use layout_at::layout_at;
pub use layout_check::layout_warnings;
pub use left_alive::left_alive;
pub use peak::{find_peak, Peak};
pub use series::{
    by_site, memory_series, x_of_entry, Grouping, MemorySeries, SeriesPoint, StackBy, XAxis,
};
pub use sites::{
    is_user_label, shown_stack, site_label_of, site_of, site_text, top_sites, ShownStack, Site,
    SiteLabel,
};
