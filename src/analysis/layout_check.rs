//! Segment layouts that cannot be: blocks that overlap one another or reach outside their
//! segment, which make allocated exceed reserved. Such an input is still read as it is, and
//! every command that reads it says so in one warning per device.

use super::layout::layout_totals;
use crate::model::{Bytes, Segment};
use std::collections::BTreeMap;

/// One line per device whose layout cannot be: how many blocks overlap an earlier one or reach
/// outside their segment, the first such segment, and allocated against reserved when it is
/// the larger.
pub fn layout_warnings(segments: &[Segment]) -> Vec<String> {
    let mut devices: BTreeMap<u32, Vec<&Segment>> = BTreeMap::new();
    for s in segments {
        devices.entry(s.device).or_default().push(s);
    }
    let mut warnings = Vec::new();
    for (device, segments) in devices {
        let mut overlapping = 0usize;
        let mut outside = 0usize;
        let mut first = None;
        for s in &segments {
            let end = s.address.saturating_add(s.total_size);
            let mut blocks: Vec<(u64, u64)> = s
                .blocks
                .iter()
                .map(|b| (b.address, b.address.saturating_add(b.size)))
                .collect();
            blocks.sort_unstable();
            let mut reached = s.address;
            let before = (overlapping, outside);
            for (start, stop) in blocks {
                if start < s.address || stop > end {
                    outside += 1;
                } else if start < reached {
                    overlapping += 1;
                }
                reached = reached.max(stop);
            }
            if first.is_none() && before != (overlapping, outside) {
                first = Some(s.address);
            }
        }
        let totals = layout_totals(segments.iter().copied());
        let over = totals.allocated_bytes > totals.reserved_bytes;
        let Some(first) = first else {
            if over {
                warnings.push(format!(
                    "device {device}: allocated {} is more than reserved {}",
                    Bytes(totals.allocated_bytes),
                    Bytes(totals.reserved_bytes)
                ));
            }
            continue;
        };
        let mut parts = Vec::new();
        if overlapping > 0 {
            parts.push(format!(
                "{overlapping} {} another block",
                if overlapping == 1 {
                    "block overlaps"
                } else {
                    "blocks overlap"
                }
            ));
        }
        if outside > 0 {
            parts.push(format!(
                "{outside} {} outside {}",
                if outside == 1 {
                    "block reaches"
                } else {
                    "blocks reach"
                },
                if outside == 1 {
                    "its segment"
                } else {
                    "their segments"
                }
            ));
        }
        let mut line = format!(
            "device {device}: the segment layout cannot be: {} (first in the segment at {first:#x})",
            parts.join(", ")
        );
        if over {
            line.push_str(&format!(
                "; allocated {} is more than reserved {}",
                Bytes(totals.allocated_bytes),
                Bytes(totals.reserved_bytes)
            ));
        }
        warnings.push(line);
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Block, BlockState, PoolKind};

    fn segment(device: u32, address: u64, size: u64, blocks: &[(u64, u64)]) -> Segment {
        Segment {
            device,
            address,
            total_size: size,
            stream: 0,
            pool: PoolKind::Large,
            pool_id: (0, 0),
            is_expandable: false,
            stack: None,
            blocks: blocks
                .iter()
                .map(|&(address, size)| Block {
                    address,
                    size,
                    requested_size: size,
                    state: BlockState::ActiveAllocated,
                    stack: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_tiled_layout_has_no_warning() {
        let m = 1 << 20;
        let fine = [
            segment(0, 4 * m, 2 * m, &[(4 * m, m), (5 * m, m)]),
            segment(1, 8 * m, 2 * m, &[(8 * m, m)]),
        ];
        assert!(layout_warnings(&fine).is_empty());
    }

    #[test]
    fn overlapping_blocks_and_allocated_over_reserved_are_named_per_device() {
        let m = 1 << 20;
        let bad = [
            segment(0, 4 * m, m, &[(4 * m, m), (4 * m, m)]),
            segment(0, 8 * m, m, &[(8 * m, 2 * m)]),
            segment(1, 16 * m, 2 * m, &[(16 * m, m)]),
        ];
        assert_eq!(
            layout_warnings(&bad),
            [
                "device 0: the segment layout cannot be: 1 block overlaps another block, 1 block \
                 reaches outside its segment (first in the segment at 0x400000); allocated 4.00 \
                 MiB is more than reserved 2.00 MiB"
            ]
        );
    }
}
