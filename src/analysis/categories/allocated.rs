//! The categories of a moment in block bytes: its live allocations, classified once, summed by
//! the block each got in the allocator replay (`sim::block_sizes`), so that they add up to the
//! account's `allocated_bytes` there as `torch.cuda.memory_allocated()` counts it.

use super::{listed, Categories, CategoryBytes};
use crate::model::Live;
use crate::sim::block_sizes::BlockSizes;
use serde::{Deserialize, Serialize};

/// The live allocations of one moment, each with its category (an index in the classifier's
/// names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Classified {
    /// Just after this entry; `None`: before the first.
    pub at: Option<usize>,
    pub members: Vec<(u64, Live, usize)>,
}

impl Classified {
    /// Requested bytes and counts by category (sums wrap, as the live totals' do).
    pub fn requested(&self, names: &[String]) -> Vec<CategoryBytes> {
        let mut sums = vec![(0u64, 0usize); names.len()];
        for (_, live, c) in &self.members {
            sums[*c].0 = sums[*c].0.wrapping_add(live.size);
            sums[*c].1 += 1;
        }
        listed(names, &sums)
    }

    /// Block bytes and counts by category of the allocations the program had not freed by
    /// then (those `allocated_bytes` counts); `None` unless they add up to `allocated`, the
    /// allocator's own figure there.
    pub fn allocated(
        &self,
        names: &[String],
        blocks: &BlockSizes,
        allocated: u64,
    ) -> Option<Vec<CategoryBytes>> {
        let mut sums = vec![(0u64, 0usize); names.len()];
        let mut total = 0u64;
        for (addr, live, c) in &self.members {
            if let Some(size) = blocks.allocated(*addr, live, self.at) {
                sums[*c].0 = sums[*c].0.wrapping_add(size);
                sums[*c].1 += 1;
                total = total.wrapping_add(size);
            }
        }
        (total == allocated).then(|| listed(names, &sums))
    }
}

/// The classified allocations of the peak and the OOM, kept until the allocator replay's
/// blocks are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Kept {
    pub names: Vec<String>,
    pub peak: Classified,
    pub oom: Option<Classified>,
}

impl Categories {
    /// The peak's categories as outputs show them: in allocated bytes where the account knows
    /// them, else in requested bytes.
    pub fn peak_shown(&self) -> (&[CategoryBytes], Figure) {
        shown(&self.at_peak, self.at_peak_allocated.as_deref())
    }

    /// The OOM's categories as outputs show them (as `peak_shown`); `None` without an OOM.
    pub fn oom_shown(&self) -> Option<(&[CategoryBytes], Figure)> {
        let requested = self.at_oom.as_deref()?;
        Some(shown(requested, self.at_oom_allocated.as_deref()))
    }

    /// Fills `at_peak_allocated` and `at_oom_allocated` from the allocator replay's `blocks`
    /// where the account knows the allocated bytes at the peak (`peak`) and the OOM (`oom`),
    /// then lets go of the classified allocations.
    pub fn add_allocated(
        &mut self,
        blocks: Option<&BlockSizes>,
        peak: Option<u64>,
        oom: Option<u64>,
    ) {
        let (Some(kept), Some(blocks)) = (self.kept.take(), blocks) else {
            return;
        };
        self.at_peak_allocated = peak.and_then(|a| kept.peak.allocated(&kept.names, blocks, a));
        self.at_oom_allocated = kept
            .oom
            .as_ref()
            .zip(oom)
            .and_then(|(c, a)| c.allocated(&kept.names, blocks, a));
    }
}

/// `allocated` where known, else `requested`, with the figure shown.
fn shown<'a>(
    requested: &'a [CategoryBytes],
    allocated: Option<&'a [CategoryBytes]>,
) -> (&'a [CategoryBytes], Figure) {
    match allocated {
        Some(list) => (list, Figure::AllocatedBytes),
        None => (requested, Figure::RequestedBytes),
    }
}

/// The figure a breakdown of the live memory at a moment (its categories, its tree) adds up to:
/// block sizes where the account knows the allocated bytes there, else the requested sizes a
/// trace records at every entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Figure {
    AllocatedBytes,
    RequestedBytes,
}

impl Figure {
    /// The word the text puts after a total: `allocated` or `requested`.
    pub fn word(self) -> &'static str {
        match self {
            Figure::AllocatedBytes => "allocated",
            Figure::RequestedBytes => "requested",
        }
    }
}
