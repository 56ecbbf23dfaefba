//! The PyTorch version range a snapshot was written by, from the keys it holds: each optional
//! key arrived with a release, so a key present bounds the version from below and a key
//! absent (where that release always writes it) from above.

use crate::model::{FormatKeys, SnapshotFormat};
use serde::{Serialize, Serializer};
use std::fmt;

/// A PyTorch release, `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release(pub u32, pub u32);

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

impl Serialize for Release {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The releases that could have written a file; `None` where the file does not bound it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VersionRange {
    pub min: Option<Release>,
    pub max: Option<Release>,
}

impl VersionRange {
    /// Whether every release in the range is at least `r` (false when the range starts below
    /// it or is unbounded below).
    pub fn at_least(&self, r: Release) -> bool {
        self.min.is_some_and(|m| m >= r)
    }

    /// Whether every release in the range is older than `r`.
    pub fn before(&self, r: Release) -> bool {
        self.max.is_some_and(|m| m < r)
    }
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.min, self.max) {
            (Some(a), Some(b)) if a == b => write!(f, "PyTorch {a}"),
            (Some(a), Some(b)) => write!(f, "PyTorch {a} to {b}"),
            (Some(a), None) => write!(f, "PyTorch {a} or later"),
            (None, Some(b)) => write!(f, "PyTorch {b} or earlier"),
            (None, None) => write!(f, "PyTorch of unknown version"),
        }
    }
}

/// `per_process_memory_fraction` became a key of the allocator settings string here
/// (pytorch/pytorch PR #161035); before, it is only the call
/// `torch.cuda.set_per_process_memory_fraction`.
pub const FRACTION_IN_CONF: Release = Release(2, 9);

/// The range for a file of `format` with `keys`; `has_entries` when some device's trace is
/// not empty (only then does a trace key's absence say anything).
pub fn infer(format: SnapshotFormat, keys: &FormatKeys, has_entries: bool) -> VersionRange {
    match format {
        SnapshotFormat::History => {
            return VersionRange {
                min: Some(Release(2, 0)),
                max: Some(Release(2, 0)),
            }
        }
        // `torch.cuda.memory_snapshot()`'s bare list, or not PyTorch's file at all.
        SnapshotFormat::SegmentsOnly | SnapshotFormat::Recording => return VersionRange::default(),
        SnapshotFormat::Modern => {}
    }
    // (present, release that added it, whether its absence says anything)
    let steps = [
        (keys.entry_time_us, Release(2, 2), has_entries),
        (keys.allocator_settings, Release(2, 3), true),
        (keys.external_annotations, Release(2, 5), true),
        (keys.entry_compile_context, Release(2, 8), has_entries),
        (
            keys.settings_stream_reuse,
            Release(2, 9),
            keys.allocator_settings,
        ),
        (keys.entry_user_metadata, Release(2, 10), has_entries),
    ];
    let mut min = Release(2, 1);
    let mut max: Option<Release> = None;
    for (present, added, telling) in steps {
        if present {
            min = min.max(added);
        } else if telling {
            let before = Release(added.0, added.1 - 1);
            max = Some(max.map_or(before, |m| m.min(before)));
        }
    }
    // Keys of a newer release beside the absence of an older one: a file rewritten by
    // another tool; trust what is there.
    if max.is_some_and(|m| m < min) {
        max = None;
    }
    VersionRange {
        min: Some(min),
        max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modern(keys: FormatKeys, has_entries: bool) -> String {
        infer(SnapshotFormat::Modern, &keys, has_entries).to_string()
    }

    #[test]
    fn each_step_moves_the_range() {
        let none = FormatKeys::default();
        assert_eq!(modern(none, true), "PyTorch 2.1");
        assert_eq!(modern(none, false), "PyTorch 2.1 to 2.2");
        let timed = FormatKeys {
            entry_time_us: true,
            ..none
        };
        assert_eq!(modern(timed, true), "PyTorch 2.2");
        let v25 = FormatKeys {
            allocator_settings: true,
            external_annotations: true,
            ..timed
        };
        assert_eq!(modern(v25, true), "PyTorch 2.5 to 2.7");
        assert_eq!(modern(v25, false), "PyTorch 2.5 to 2.8");
        let v210 = FormatKeys {
            entry_compile_context: true,
            settings_stream_reuse: true,
            entry_user_metadata: true,
            ..v25
        };
        assert_eq!(modern(v210, true), "PyTorch 2.10 or later");
        assert_eq!(
            infer(SnapshotFormat::History, &none, true).to_string(),
            "PyTorch 2.0"
        );
        assert_eq!(
            infer(SnapshotFormat::SegmentsOnly, &none, false).to_string(),
            "PyTorch of unknown version"
        );
    }

    #[test]
    fn a_newer_key_beside_a_missing_older_one_keeps_the_lower_bound() {
        let keys = FormatKeys {
            entry_user_metadata: true,
            ..FormatKeys::default()
        };
        let r = infer(SnapshotFormat::Modern, &keys, true);
        assert_eq!(r.min, Some(Release(2, 10)));
        assert_eq!(r.max, None);
        assert!(r.at_least(FRACTION_IN_CONF));
        assert!(!r.before(FRACTION_IN_CONF));
    }
}
