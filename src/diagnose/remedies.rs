//! Remedies for an OOM: allocator settings replayed through the simulator with the recorded
//! trace and the inferred capacity, each written as the complete settings string the user
//! sets (the recorded settings with the change) for the variable and PyTorch version the file
//! shows; and the changes to the program that only a plan can size.

use crate::analysis::oom::SettingChange;
use crate::analysis::oom::{shortfall_bytes, Cause, OomFacts, OomSite, Remedy, RemedyKind};
use crate::analysis::version::{Release, VersionRange};
use crate::model::Bytes;
use crate::sim::alloc_conf::split_top_level;
use crate::sim::replay::{self, CapacitySource, Prepared, RunResult};
use crate::sim::sweep::{self, Outcome};
use crate::sim::AllocatorConfig;
use serde::Serialize;

/// The first release whose `PYTORCH_ALLOC_CONF` reliably configures the CUDA allocator
/// (2.8 to 2.11 warn that the old name is deprecated, and some of them ignore the new name
/// for CUDA: pytorch/pytorch#183387).
const NEW_ENV_NAME: Release = Release(2, 12);

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

/// Fills in what a replay of `remedy` gave.
pub fn set_replayed(remedy: &mut Remedy, run: &RunResult) {
    remedy.verified = true;
    remedy.oom_avoided = Some(run.oom.is_none());
    remedy.new_peak_reserved_bytes = Some(run.peak_reserved_bytes);
    remedy.new_peak_allocated_bytes = Some(run.peak_allocated_bytes);
    remedy.new_oom_retries = Some(run.oom_retries);
    remedy.new_empty_cache_calls = Some(run.empty_cache_calls);
}

/// Settings the recorded run did not have, replayed.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    /// Settings that avoid the OOM, best first.
    pub avoided: Vec<Remedy>,
    /// Settings that still run out of memory, best first.
    pub tried: Vec<Remedy>,
    /// Candidate settings already in force.
    pub already_on: Vec<String>,
    /// What the recorded settings give at the same capacity (`None`: nothing replayed).
    pub recorded: Option<Outcome>,
}

/// The settings of the one grid (`sim::sweep::trials`) that the recorded settings lack and
/// the file's PyTorch accepts, each replayed with the prepared trace under its capacity, and
/// ranked by the one order (`sim::sweep::Outcome::rank_key`); of the `max_split_size_mb`
/// values only the best is kept. Nothing is replayed when the capacity is unknown (without it
/// no replay runs out of memory or retries) or when the replay with the recorded settings
/// neither runs out of memory nor retries (then no setting has anything to avoid).
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
        already_on,
        ..Replayed::default()
    };
    let Some(capacity) = prepared.capacity else {
        return out;
    };
    let base = &prepared.recorded_run;
    if base.oom.is_none() && base.oom_retries == 0 {
        return out;
    }
    out.recorded = Some(Outcome::of(base));
    let mut runs: Vec<(&'static str, Remedy)> = Vec::new();
    for trial in sweep::trials(config, recorded.version, true) {
        let code = trial.fraction_call.map(|f| {
            format!(
                "torch.cuda.set_per_process_memory_fraction({f:?})  # before the first \
                 allocation; the threshold does nothing without a fraction"
            )
        });
        let mut remedy = conf_remedy(recorded, &trial.changes, code);
        set_replayed(
            &mut remedy,
            &replay::run(prepared, &trial.config, Some(capacity)),
        );
        runs.push((trial.family(), remedy));
    }
    runs.sort_by_key(|(_, r)| rank(r));
    let mut seen: Vec<&str> = Vec::new();
    let mut kept = Vec::new();
    for (family, remedy) in runs {
        if family == "max_split_size_mb" && seen.contains(&family) {
            continue;
        }
        seen.push(family);
        kept.push(remedy);
    }
    let (avoided, tried): (Vec<Remedy>, Vec<Remedy>) =
        kept.into_iter().partition(|r| r.oom_avoided == Some(true));
    out.avoided = avoided;
    out.tried = tried;
    out
}

/// The settings replayed against a device's OOM retries where it never ran out of memory:
/// what the recorded settings give at the replay's capacity, and every setting of the grid,
/// ranked by the one order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PressureRemedies {
    /// The device memory each replay could reserve.
    pub capacity_bytes: u64,
    /// `given` (`--capacity`) or `inferred` (the peak of reserved memory, at which the OOM
    /// retries show the allocator was at the device's limit).
    pub capacity_source: &'static str,
    /// What the recorded settings give at that capacity.
    pub recorded: Outcome,
    /// Each setting replayed, best first.
    pub settings: Vec<Remedy>,
}

/// The settings that answer a device's OOM retries, `None` when the trace ends in an OOM
/// (the diagnosis answers it) or the replay with the recorded settings does not retry.
pub fn pressure_remedies(prepared: &Prepared, recorded: &Recorded<'_>) -> Option<PressureRemedies> {
    if prepared.recorded_run.oom.is_some() {
        return None;
    }
    let replayed = replayed_settings(prepared, recorded);
    let mut settings = replayed.avoided;
    settings.extend(replayed.tried);
    settings.sort_by_key(rank);
    Some(PressureRemedies {
        capacity_bytes: prepared.capacity?,
        capacity_source: match prepared.capacity_source {
            CapacitySource::Given => "given",
            _ => "inferred",
        },
        recorded: replayed.recorded?,
        settings,
    })
}

/// What a replayed remedy gave, as the one ranker reads it (a remedy not replayed ranks
/// last).
pub fn outcome(r: &Remedy) -> Outcome {
    Outcome {
        devices_out_of_memory: usize::from(r.oom_avoided != Some(true)),
        oom_retries: r.new_oom_retries.unwrap_or(u64::MAX),
        empty_cache_calls: r.new_empty_cache_calls.unwrap_or(0),
        peak_reserved_bytes: r.new_peak_reserved_bytes.unwrap_or(u64::MAX),
    }
}

/// Sort key: the one order of `sim::sweep` (OOM avoided, then fewer stalls, then the lower
/// peak).
pub fn rank(r: &Remedy) -> (usize, u64, u64) {
    outcome(r).rank_key()
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
