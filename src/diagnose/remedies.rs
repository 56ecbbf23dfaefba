//! Remedies for an OOM: allocator settings replayed through the simulator with the recorded
//! trace and the inferred capacity, each written as the complete settings string the user
//! sets (the recorded settings with the change) for the variable and PyTorch version the file
//! shows; and the changes to the program that only a plan can size.

use crate::analysis::oom::SettingChange;
use crate::analysis::oom::{shortfall_bytes, Cause, OomFacts, OomSite, Remedy, RemedyKind};
use crate::analysis::version::{Release, VersionRange, FRACTION_IN_CONF};
use crate::model::Bytes;
use crate::sim::alloc_conf::split_top_level;
use crate::sim::replay::{self, Prepared};
use crate::sim::AllocatorConfig;

/// `max_split_size_mb` values tried; the best one is offered.
const SPLIT_SIZES_MB: [u64; 4] = [64, 128, 256, 512];

/// The first release whose `PYTORCH_ALLOC_CONF` reliably configures the CUDA allocator
/// (2.8 to 2.11 warn that the old name is deprecated, and some of them ignore the new name
/// for CUDA: pytorch/pytorch#183387).
const NEW_ENV_NAME: Release = Release(2, 12);

/// Expandable segments arrived with this release; a 2.0 file never gets them offered.
const EXPANDABLE_SEGMENTS: Release = Release(2, 1);

/// What the remedies are written against: the recorded settings and the file's version.
#[derive(Clone, Copy, Debug)]
pub struct Recorded<'a> {
    pub config: &'a AllocatorConfig,
    /// The settings string the file recorded (empty when none).
    pub conf: &'a str,
    pub version: VersionRange,
}

/// The variable the file's PyTorch reads the settings from.
pub fn env_name(version: VersionRange) -> &'static str {
    if version.at_least(NEW_ENV_NAME) {
        "PYTORCH_ALLOC_CONF"
    } else {
        "PYTORCH_CUDA_ALLOC_CONF"
    }
}

/// `key:value` items of a settings string, in order, without blanks.
fn items(conf: &str) -> Vec<(String, String)> {
    let text: String = conf.chars().filter(|c| !c.is_whitespace()).collect();
    split_top_level(&text)
        .into_iter()
        .filter_map(|item| item.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The complete settings string: the recorded string, with the values the allocator ran
/// with where PyTorch recorded them apart from the string, and `changes` applied. Returns it
/// with what differs from the recorded settings.
fn merged(recorded: &Recorded<'_>, changes: &[(&str, String)]) -> (String, Vec<SettingChange>) {
    let mut out = items(recorded.conf);
    for (key, value) in items(&recorded.config.to_conf_string()) {
        if !out.iter().any(|(k, _)| *k == key) {
            out.push((key, value));
        }
    }
    let mut changed = Vec::new();
    for (key, value) in changes {
        match out.iter_mut().find(|(k, _)| k == key) {
            Some((_, old)) if old == value => {}
            Some((_, old)) => {
                changed.push(SettingChange {
                    key: key.to_string(),
                    recorded: Some(old.clone()),
                    new: value.clone(),
                });
                *old = value.clone();
            }
            None => {
                changed.push(SettingChange {
                    key: key.to_string(),
                    recorded: None,
                    new: value.clone(),
                });
                out.push((key.to_string(), value.clone()));
            }
        }
    }
    let text: Vec<String> = out.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    (text.join(","), changed)
}

/// An allocator-settings remedy, not yet replayed.
fn conf_remedy(
    recorded: &Recorded<'_>,
    changes: &[(&str, String)],
    code: Option<String>,
) -> Remedy {
    let (conf, changed) = merged(recorded, changes);
    let env = env_name(recorded.version);
    let what: Vec<String> = changed
        .iter()
        .map(|c| format!("{}:{}", c.key, c.new))
        .collect();
    let mut r = Remedy::unverified(RemedyKind::AllocConf, format!("set {}", what.join(",")));
    r.alloc_conf = Some(conf);
    r.env = Some(env);
    r.code = code;
    r.changed = changed;
    r
}

/// The remedy to offer where no trace can be replayed (an OOM message): a setting alone.
pub fn unreplayed_setting(key: &str, value: &str) -> Remedy {
    let config = AllocatorConfig::default();
    let recorded = Recorded {
        config: &config,
        conf: "",
        version: VersionRange::default(),
    };
    conf_remedy(&recorded, &[(key, value.to_string())], None)
}

/// The change to the program (or its surroundings) the numbers call for: cut live memory at
/// the failing request, from the sites that hold the most (`sites`), or free memory held
/// outside the allocator.
pub fn program_remedy(cause: Cause, facts: &OomFacts, sites: &[OomSite]) -> Option<Remedy> {
    let shortfall = shortfall_bytes(facts);
    if shortfall == 0 {
        return None;
    }
    let (kind, action) = match cause {
        Cause::Growth => (
            RemedyKind::ReduceLive,
            format!(
                "stop live memory growing across iterations: at least {} must go (a leak, or \
                 tensors kept in a list: see the growing sites)",
                Bytes(shortfall)
            ),
        ),
        Cause::Exhaustion | Cause::Fragmentation => (
            RemedyKind::ReduceLive,
            format!(
                "cut live memory at the failing request by at least {} (activation \
                 checkpointing, sharding or a smaller batch; size them with `memprof plan`)",
                Bytes(shortfall)
            ),
        ),
        Cause::OversizedRequest => (
            RemedyKind::ReduceLive,
            format!(
                "make this one request at most {} (a smaller batch or sequence, or a sharded \
                 tensor; size them with `memprof plan`)",
                Bytes(
                    facts
                        .reserved_bytes
                        .saturating_add(facts.device_free_bytes.unwrap_or(0))
                )
            ),
        ),
        Cause::OutsideAllocator => (
            RemedyKind::OutsideAllocator,
            format!(
                "free at least {} held outside the allocator (other processes on the GPU, NCCL \
                 or cuBLAS workspaces)",
                Bytes(shortfall)
            ),
        ),
    };
    let mut r = Remedy::unverified(kind, action);
    r.bytes = Some(shortfall);
    if kind == RemedyKind::ReduceLive {
        r.sites = sites.to_vec();
    }
    Some(r)
}

/// Settings the recorded run did not have, replayed.
pub struct Replayed {
    /// Settings that avoid the OOM, best first.
    pub avoided: Vec<Remedy>,
    /// Settings that still run out of memory, best first.
    pub tried: Vec<Remedy>,
    /// Candidate settings already in force.
    pub already_on: Vec<String>,
}

/// Settings not in force in the recorded settings, each replayed with the prepared trace
/// under its capacity. Nothing is replayed when the capacity is unknown (without it no replay
/// can run out of memory) or when the replay with the recorded settings does not run out of
/// memory itself (then no other run can say it avoids the OOM).
pub fn replayed_settings(prepared: &Prepared, recorded: &Recorded<'_>) -> Replayed {
    let config = recorded.config;
    let mut already_on = Vec::new();
    if config.expandable_segments {
        already_on.push("expandable_segments:True".to_string());
    }
    if let Some(m) = config.max_split_size {
        already_on.push(format!("max_split_size_mb:{}", m >> 20));
    }
    if let Some(t) = config.garbage_collection_threshold {
        already_on.push(format!("garbage_collection_threshold:{t}"));
    }
    let mut out = Replayed {
        avoided: Vec::new(),
        tried: Vec::new(),
        already_on,
    };
    let Some(capacity) = prepared.capacity else {
        return out;
    };
    if prepared.recorded_run.oom.is_none() {
        return out;
    }
    let try_one = |mut remedy: Remedy, config: AllocatorConfig| {
        let run = replay::run(prepared, &config, Some(capacity));
        remedy.verified = true;
        remedy.oom_avoided = Some(run.oom.is_none());
        remedy.new_peak_reserved_bytes = Some(run.peak_reserved_bytes);
        remedy.new_peak_allocated_bytes = Some(run.peak_allocated_bytes);
        remedy
    };
    let mut runs = Vec::new();
    if !config.expandable_segments && !recorded.version.before(EXPANDABLE_SEGMENTS) {
        let new = AllocatorConfig {
            expandable_segments: true,
            ..config.clone()
        };
        let remedy = conf_remedy(recorded, &[("expandable_segments", "True".into())], None);
        runs.push(try_one(remedy, new));
    }
    if config.max_split_size.is_none() {
        let best = SPLIT_SIZES_MB
            .iter()
            .map(|&mb| {
                let new = AllocatorConfig {
                    max_split_size: Some(mb << 20),
                    ..config.clone()
                };
                let remedy = conf_remedy(recorded, &[("max_split_size_mb", mb.to_string())], None);
                try_one(remedy, new)
            })
            .min_by_key(rank);
        runs.extend(best);
    }
    if config.garbage_collection_threshold.is_none() {
        // The threshold acts only with a memory fraction set; the fraction is a settings key
        // from 2.9 on, a call before.
        let fraction = config.per_process_memory_fraction;
        let new = AllocatorConfig {
            garbage_collection_threshold: Some(0.8),
            per_process_memory_fraction: Some(fraction.unwrap_or(1.0)),
            ..config.clone()
        };
        let threshold = ("garbage_collection_threshold", "0.8".to_string());
        let remedy = if fraction.is_some() {
            conf_remedy(recorded, &[threshold], None)
        } else if recorded.version.at_least(FRACTION_IN_CONF) {
            conf_remedy(
                recorded,
                &[threshold, ("per_process_memory_fraction", "1.0".into())],
                None,
            )
        } else {
            conf_remedy(
                recorded,
                &[threshold],
                Some(
                    "torch.cuda.set_per_process_memory_fraction(1.0)  # before the first \
                     allocation; the threshold does nothing without a fraction"
                        .to_string(),
                ),
            )
        };
        runs.push(try_one(remedy, new));
    }
    runs.sort_by_key(rank);
    let (avoided, tried): (Vec<Remedy>, Vec<Remedy>) =
        runs.into_iter().partition(|r| r.oom_avoided == Some(true));
    out.avoided = avoided;
    out.tried = tried;
    out
}

/// Sort key: avoided first, then the lower peak.
pub fn rank(r: &Remedy) -> (bool, u64) {
    (
        r.oom_avoided != Some(true),
        r.new_peak_reserved_bytes.unwrap_or(u64::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::version::Release;

    fn recorded(conf: &str, min: Release) -> (AllocatorConfig, String, VersionRange) {
        let config = AllocatorConfig::parse(conf).expect("a valid setting");
        let version = VersionRange {
            min: Some(min),
            max: None,
        };
        (config, conf.to_string(), version)
    }

    #[test]
    fn a_remedy_keeps_every_recorded_setting() {
        let (config, conf, version) = recorded(
            "expandable_segments:True,pinned_use_background_threads:True",
            Release(2, 5),
        );
        let r = Recorded {
            config: &config,
            conf: &conf,
            version,
        };
        let remedy = conf_remedy(&r, &[("max_split_size_mb", "128".into())], None);
        assert_eq!(
            remedy.alloc_conf.as_deref(),
            Some(
                "expandable_segments:True,pinned_use_background_threads:True,max_split_size_mb:128"
            )
        );
        assert_eq!(remedy.env, Some("PYTORCH_CUDA_ALLOC_CONF"));
        assert_eq!(remedy.changed.len(), 1);
        assert_eq!(remedy.changed[0].recorded, None);
    }

    #[test]
    fn a_structured_setting_missing_from_the_string_is_kept() {
        let config = AllocatorConfig {
            expandable_segments: true,
            ..AllocatorConfig::default()
        };
        let r = Recorded {
            config: &config,
            conf: "",
            version: VersionRange::default(),
        };
        let remedy = conf_remedy(&r, &[("max_split_size_mb", "256".into())], None);
        assert_eq!(
            remedy.alloc_conf.as_deref(),
            Some("expandable_segments:True,max_split_size_mb:256")
        );
    }

    #[test]
    fn a_changed_value_names_the_recorded_one() {
        let (config, conf, version) = recorded("max_split_size_mb:512", Release(2, 3));
        let r = Recorded {
            config: &config,
            conf: &conf,
            version,
        };
        let remedy = conf_remedy(&r, &[("max_split_size_mb", "128".into())], None);
        assert_eq!(remedy.alloc_conf.as_deref(), Some("max_split_size_mb:128"));
        assert_eq!(remedy.changed[0].recorded.as_deref(), Some("512"));
    }

    #[test]
    fn the_variable_follows_the_version() {
        let old = VersionRange {
            min: Some(Release(2, 5)),
            max: Some(Release(2, 7)),
        };
        assert_eq!(env_name(old), "PYTORCH_CUDA_ALLOC_CONF");
        assert_eq!(env_name(VersionRange::default()), "PYTORCH_CUDA_ALLOC_CONF");
        let new = VersionRange {
            min: Some(Release(2, 12)),
            max: None,
        };
        assert_eq!(env_name(new), "PYTORCH_ALLOC_CONF");
    }
}
