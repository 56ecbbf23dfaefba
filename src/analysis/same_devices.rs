//! Devices of a snapshot that every analysis sees alike: the same trace entries, and the same
//! segments and annotations but for their device number. A pickle can
//! reference one trace list for every device (a 600 KB file holds 300k of them); such a snapshot
//! is analyzed once per distinct device and the result copied to its twins.

use crate::model::{Annotation, Segment, Snapshot};
use rustc_hash::{FxHashMap, FxHasher};
use std::hash::{Hash, Hasher};

/// For each device that has an earlier twin, that twin.
#[derive(Debug, Default)]
pub struct SameDevices {
    twin: FxHashMap<u32, u32>,
}

impl SameDevices {
    /// The twins among `devices` (in the order given: a device's twin comes before it).
    pub fn find(snapshot: &Snapshot, devices: &[u32]) -> SameDevices {
        let mut annotations: FxHashMap<u32, Vec<&Annotation>> = FxHashMap::default();
        for a in &snapshot.annotations {
            if let Some(device) = a.device {
                annotations.entry(device).or_default().push(a);
            }
        }
        let device = |d: u32| Device {
            snapshot,
            device: d,
            annotations: annotations.get(&d).map_or(&[], Vec::as_slice),
        };
        // Only a device whose trace length and segment count another device shares can have a
        // twin: the others are never hashed (one device alone costs nothing).
        let shape = |d: u32| {
            (
                snapshot.timeline.device(d as usize).len(),
                snapshot.device_segments(d).count(),
            )
        };
        let mut shapes: FxHashMap<(usize, usize), usize> = FxHashMap::default();
        for &d in devices {
            *shapes.entry(shape(d)).or_default() += 1;
        }
        let mut firsts: FxHashMap<u64, Vec<u32>> = FxHashMap::default();
        let mut twin = FxHashMap::default();
        for &d in devices {
            if shapes.get(&shape(d)).is_none_or(|&n| n < 2) {
                continue;
            }
            let this = device(d);
            let candidates = firsts.entry(this.fingerprint()).or_default();
            match candidates.iter().find(|&&c| device(c).alike(&this)) {
                Some(&first) => {
                    twin.insert(d, first);
                }
                None => candidates.push(d),
            }
        }
        SameDevices { twin }
    }

    /// The earlier device whose analysis is also `device`'s, if there is one.
    pub fn twin_of(&self, device: u32) -> Option<u32> {
        self.twin.get(&device).copied()
    }
}

/// What the analyses read of one device.
struct Device<'a> {
    snapshot: &'a Snapshot,
    device: u32,
    /// The annotations that name this device.
    annotations: &'a [&'a Annotation],
}

impl Device<'_> {
    /// A hash of what `alike` compares.
    fn fingerprint(&self) -> u64 {
        let mut h = FxHasher::default();
        self.snapshot
            .timeline
            .device(self.device as usize)
            .hash(&mut h);
        for s in self.snapshot.device_segments(self.device) {
            (s.address, s.total_size, s.blocks.len()).hash(&mut h);
        }
        self.annotations.len().hash(&mut h);
        h.finish()
    }

    fn alike(&self, other: &Device<'_>) -> bool {
        let (s, a, b) = (self.snapshot, self.device, other.device);
        s.timeline.device(a as usize) == s.timeline.device(b as usize)
            && s.timeline
                .device_extras(a as usize)
                .eq(s.timeline.device_extras(b as usize))
            && s.device_segments(a).count() == s.device_segments(b).count()
            && s.device_segments(a)
                .zip(s.device_segments(b))
                .all(|(x, y)| same_but_device(x, y))
            && self.annotations.len() == other.annotations.len()
            && self
                .annotations
                .iter()
                .zip(other.annotations)
                .all(|(x, y)| (x.time_us, &x.stage, &x.name) == (y.time_us, &y.stage, &y.name))
    }
}

/// Whether two segments are equal in everything but their device. Every field is named, so a
/// field added to `Segment` must be decided here.
fn same_but_device(a: &Segment, b: &Segment) -> bool {
    let Segment {
        device: _,
        address,
        total_size,
        stream,
        pool,
        pool_id,
        is_expandable,
        stack,
        blocks,
    } = a;
    *address == b.address
        && *total_size == b.total_size
        && *stream == b.stream
        && *pool == b.pool
        && *pool_id == b.pool_id
        && *is_expandable == b.is_expandable
        && *stack == b.stack
        && *blocks == b.blocks
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::analysis::analyze_snapshot_with_categories;
    use crate::analysis::categories::CategoryRules;
    use crate::diagnose::{classify_ooms, Origin};
    use crate::source::torch_snapshot;
    use std::ops::Range;

    /// `demo_oom.pickle`'s device (an OOM, segments, stacks) as devices 0 and 2, and the first
    /// half of its trace, without segments, as device 1.
    fn twins_around_another() -> Snapshot {
        let mut s = demo_oom_on_devices(|n| vec![0..n, 0..n / 2, 0..n]);
        copy_device_zero(&mut s, 2);
        s
    }

    /// `demo_oom.pickle` with the device ranges `ranges` makes of its trace's length.
    pub(crate) fn demo_oom_on_devices(ranges: impl FnOnce(usize) -> Vec<Range<usize>>) -> Snapshot {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/snapshots/demo_oom.pickle"
        );
        let bytes = std::fs::read(path).expect("the fixture");
        let mut s = torch_snapshot::read(&bytes[..]).expect("reads").snapshot;
        assert_eq!(s.devices(), vec![0]);
        let n = s.timeline.device(0).len();
        s.timeline = s.timeline.with_devices(ranges(n));
        s
    }

    /// Gives `device` copies of device 0's segments and of the annotations that name it.
    pub(crate) fn copy_device_zero(s: &mut Snapshot, device: u32) {
        let copies: Vec<Segment> = s
            .segments
            .iter()
            .filter(|seg| seg.device == 0)
            .map(|seg| Segment {
                device,
                ..seg.clone()
            })
            .collect();
        s.segments.extend(copies);
        let annotations: Vec<Annotation> = s
            .annotations
            .iter()
            .filter(|a| a.device == Some(0))
            .map(|a| Annotation {
                device: Some(device),
                ..a.clone()
            })
            .collect();
        assert!(
            !annotations.is_empty(),
            "the fixture names its device in annotations"
        );
        s.annotations.extend(annotations);
    }

    #[test]
    fn a_twin_gets_the_analysis_it_would_get_alone() {
        let s = twins_around_another();
        let rules = CategoryRules::default();
        let analyze = |only| {
            let starts = crate::model::ReplayStarts::new(&s);
            let (devices, _) = analyze_snapshot_with_categories(&starts, 10, only, &rules, false);
            classify_ooms(&s, Origin::TorchSnapshot, devices)
        };
        let all = analyze(None);
        assert_eq!(
            all.iter()
                .map(|d| (d.device, d.twin_of))
                .collect::<Vec<_>>(),
            vec![(0, None), (1, None), (2, Some(0))]
        );
        let alone = analyze(Some(2));
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].twin_of, None);
        let diagnosis = all[2].oom.as_ref().and_then(|o| o.diagnosis.as_ref());
        assert_eq!(diagnosis.map(|g| g.device), Some(2));
        let json = |d| serde_json::to_value(d).expect("serializes");
        assert_eq!(json(&all[2]), json(&alone[0]));
        assert_ne!(json(&all[1]), json(&alone[0]));
    }

    #[test]
    fn devices_differing_in_a_segment_or_an_annotation_are_not_twins() {
        let mut s = twins_around_another();
        assert_eq!(SameDevices::find(&s, &s.devices()).twin_of(2), Some(0));
        let flip = |s: &mut Snapshot| {
            let last = s.segments.last_mut().expect("device 2 has segments");
            last.stream ^= 1;
        };
        flip(&mut s);
        assert_eq!(SameDevices::find(&s, &s.devices()).twin_of(2), None);
        flip(&mut s);
        let named = s.annotations.iter_mut().rev().find(|a| a.device == Some(2));
        named.expect("device 2 is annotated").name = Some("other".into());
        let twins = SameDevices::find(&s, &s.devices());
        assert_eq!((twins.twin_of(1), twins.twin_of(2)), (None, None));
    }

    #[test]
    fn devices_differing_only_in_entry_metadata_are_not_twins() {
        use crate::model::{Action, EntryExtra, ExtraId, StreamIndex, Timeline, TraceEntry};
        use std::num::NonZeroU32;
        let mut s = twins_around_another();
        s.segments.clear();
        s.annotations.clear();
        let entry = TraceEntry::new(Action::Alloc, Some(512), 512, StreamIndex(0));
        s.timeline = Timeline::new(vec![entry.with_extra(true); 2], vec![0..1, 1..2]);
        let metadata = |text: &str| EntryExtra {
            user_metadata: Some(text.into()),
            ..EntryExtra::default()
        };
        let id = |n| ExtraId(NonZeroU32::new(n).expect("not zero"));
        let extras = vec![metadata("activations"), metadata("weights")];
        s.timeline
            .set_extras(extras.clone(), vec![(0, id(1)), (1, id(2))]);
        assert_eq!(SameDevices::find(&s, &s.devices()).twin_of(1), None);
        s.timeline.set_extras(extras, vec![(0, id(2)), (1, id(2))]);
        assert_eq!(SameDevices::find(&s, &s.devices()).twin_of(1), Some(0));
        assert_eq!(
            s.timeline
                .extra_at(1, 0)
                .and_then(|x| x.user_metadata.as_deref()),
            Some("weights")
        );
    }
}
