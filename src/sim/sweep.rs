//! The one grid of allocator settings memprof replays (`simulate --sweep` and the remedies of
//! `diagnose` both), each a change to the recorded settings that the file's PyTorch accepts,
//! and the one order they are ranked in: OOMs avoided first, then OOM retries and
//! `empty_cache()` stalls, then peak reserved memory.

use super::alloc_conf::{key_since, AllocatorConfig};
use super::replay::RunResult;
use crate::analysis::version::{VersionRange, FRACTION_IN_CONF};
use serde::Serialize;

/// `max_split_size_mb` values tried.
pub const SPLIT_SIZES_MB: [u64; 4] = [64, 128, 256, 512];

/// The threshold tried for the garbage collector.
const GC_THRESHOLD: &str = "0.8";

/// One setting to replay: the settings the allocator runs with, and the change to the
/// recorded settings that gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    pub config: AllocatorConfig,
    /// `key:value` pairs set on top of the recorded settings.
    pub changes: Vec<(&'static str, String)>,
    /// The memory fraction the program must set with
    /// `torch.cuda.set_per_process_memory_fraction`, where the file's PyTorch takes no
    /// `per_process_memory_fraction` key (before 2.9) and the recorded settings have none.
    pub fraction_call: Option<f64>,
}

impl Trial {
    /// The change as the text shows it (`key:value,...`).
    pub fn change_text(&self) -> String {
        let parts: Vec<String> = self
            .changes
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        parts.join(",")
    }

    /// The settings string the user sets: `base` (the recorded settings) with the changes.
    pub fn settings_string(&self, base: &str) -> String {
        let mut items: Vec<(String, String)> = super::alloc_conf::split_top_level(base)
            .into_iter()
            .filter_map(|item| item.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (key, value) in &self.changes {
            match items.iter_mut().find(|(k, _)| k == key) {
                Some((_, old)) => *old = value.clone(),
                None => items.push((key.to_string(), value.clone())),
            }
        }
        let parts: Vec<String> = items.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        parts.join(",")
    }

    /// Which trials are variants of one another (the `max_split_size_mb` values): the first
    /// changed key.
    pub fn family(&self) -> &'static str {
        self.changes.first().map_or("", |(k, _)| k)
    }
}

/// Whether every release the file shows accepts `key`.
fn accepted(key: &str, version: VersionRange) -> bool {
    key_since(key).is_some_and(|since| !version.before(since))
}

/// The settings the recorded ones lack, each as one change: expandable segments, each
/// `max_split_size_mb` of `SPLIT_SIZES_MB`, `roundup_power2_divisions:4`, and the garbage
/// collector (which acts only with a memory fraction, so only when the capacity is known).
/// A key the file's PyTorch rejects is never tried.
pub fn trials(
    recorded: &AllocatorConfig,
    version: VersionRange,
    capacity_known: bool,
) -> Vec<Trial> {
    let mut out = Vec::new();
    let mut push = |config: AllocatorConfig, changes: Vec<(&'static str, String)>, call| {
        if changes.iter().all(|(k, _)| accepted(k, version)) {
            out.push(Trial {
                config,
                changes,
                fraction_call: call,
            });
        }
    };
    if !recorded.expandable_segments {
        let config = AllocatorConfig {
            expandable_segments: true,
            ..recorded.clone()
        };
        push(config, vec![("expandable_segments", "True".into())], None);
    }
    if recorded.max_split_size.is_none() {
        for mb in SPLIT_SIZES_MB {
            let config = AllocatorConfig {
                max_split_size: Some(mb << 20),
                ..recorded.clone()
            };
            push(config, vec![("max_split_size_mb", mb.to_string())], None);
        }
    }
    if recorded.roundup_power2_divisions.iter().all(|&d| d == 0) {
        let config = AllocatorConfig {
            roundup_power2_divisions: [4; super::alloc_conf::ROUNDUP_INTERVALS],
            ..recorded.clone()
        };
        push(config, vec![("roundup_power2_divisions", "4".into())], None);
    }
    if recorded.garbage_collection_threshold.is_none() && capacity_known {
        let fraction = recorded.per_process_memory_fraction;
        let config = AllocatorConfig {
            garbage_collection_threshold: GC_THRESHOLD.parse().ok(),
            per_process_memory_fraction: Some(fraction.unwrap_or(1.0)),
            ..recorded.clone()
        };
        let threshold = ("garbage_collection_threshold", GC_THRESHOLD.to_string());
        if fraction.is_some() {
            push(config, vec![threshold], None);
        } else if version.at_least(FRACTION_IN_CONF) {
            let key = ("per_process_memory_fraction", "1.0".to_string());
            push(config, vec![threshold, key], None);
        } else {
            // The fraction is the call `torch.cuda.set_per_process_memory_fraction`.
            push(config, vec![threshold], Some(1.0));
        }
    }
    out
}

/// What one setting's replay gives, over the devices replayed: the figures settings are
/// ranked by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// Devices that ran out of memory.
    pub devices_out_of_memory: usize,
    /// OOM retries that got their request (each a full cache flush and a device
    /// synchronize).
    pub oom_retries: u64,
    /// `torch.cuda.empty_cache()` calls (each a synchronize too).
    pub empty_cache_calls: u64,
    /// Peak reserved memory, summed over devices.
    pub peak_reserved_bytes: u64,
}

impl Outcome {
    pub fn of(run: &RunResult) -> Outcome {
        Outcome {
            devices_out_of_memory: usize::from(run.oom.is_some()),
            oom_retries: run.oom_retries,
            empty_cache_calls: run.empty_cache_calls,
            peak_reserved_bytes: run.peak_reserved_bytes,
        }
    }

    /// The outcome over several devices.
    pub fn sum(outcomes: impl IntoIterator<Item = Outcome>) -> Outcome {
        outcomes
            .into_iter()
            .fold(Outcome::default(), |a, b| Outcome {
                devices_out_of_memory: a.devices_out_of_memory + b.devices_out_of_memory,
                oom_retries: a.oom_retries.saturating_add(b.oom_retries),
                empty_cache_calls: a.empty_cache_calls.saturating_add(b.empty_cache_calls),
                peak_reserved_bytes: a.peak_reserved_bytes.saturating_add(b.peak_reserved_bytes),
            })
    }

    /// Stalls of the whole step: OOM retries and `empty_cache()` calls.
    pub fn stalls(&self) -> u64 {
        self.oom_retries.saturating_add(self.empty_cache_calls)
    }

    /// The rank: fewer OOMs first, then fewer stalls, then the lower peak reserved.
    pub fn rank_key(&self) -> (usize, u64, u64) {
        (
            self.devices_out_of_memory,
            self.stalls(),
            self.peak_reserved_bytes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::version::Release;

    fn range(min: (u32, u32), max: Option<(u32, u32)>) -> VersionRange {
        VersionRange {
            min: Some(Release(min.0, min.1)),
            max: max.map(|(a, b)| Release(a, b)),
        }
    }

    #[test]
    fn every_trial_is_a_setting_the_file_s_pytorch_accepts() {
        let defaults = AllocatorConfig::default();
        let texts = |v| -> Vec<String> {
            trials(&defaults, v, true)
                .iter()
                .map(Trial::change_text)
                .collect()
        };
        let v21 = texts(range((2, 1), Some((2, 1))));
        assert!(
            v21.iter()
                .all(|t| !t.contains("per_process_memory_fraction")),
            "{v21:?}"
        );
        assert!(v21.contains(&"garbage_collection_threshold:0.8".to_string()));
        assert!(v21.contains(&"expandable_segments:True".to_string()));
        let v20 = texts(range((2, 0), Some((2, 0))));
        assert!(v20.iter().all(|t| !t.contains("expandable")), "{v20:?}");
        let v210 = texts(range((2, 10), None));
        assert!(v210.contains(
            &"garbage_collection_threshold:0.8,per_process_memory_fraction:1.0".to_string()
        ));
        for v in [
            range((2, 0), Some((2, 0))),
            range((2, 1), Some((2, 1))),
            range((2, 10), None),
        ] {
            for t in trials(&defaults, v, true) {
                let conf = t.change_text();
                assert_eq!(
                    AllocatorConfig::parse_for(&conf, v).map(|_| ()),
                    Ok(()),
                    "{conf}"
                );
            }
        }
        // Without the capacity the collector never runs: not tried.
        assert!(trials(&defaults, VersionRange::default(), false)
            .iter()
            .all(|t| t.family() != "garbage_collection_threshold"));
    }

    #[test]
    fn oom_first_then_stalls_then_peak() {
        let o = |ooms, retries, peak| Outcome {
            devices_out_of_memory: ooms,
            oom_retries: retries,
            empty_cache_calls: 2,
            peak_reserved_bytes: peak,
        };
        let mut all = [o(1, 0, 1), o(0, 39, 5), o(0, 0, 9), o(0, 13, 1)];
        all.sort_by_key(Outcome::rank_key);
        assert_eq!(all, [o(0, 0, 9), o(0, 13, 1), o(0, 39, 5), o(1, 0, 1)]);
    }
}
