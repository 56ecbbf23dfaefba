//! Allocator settings: a `PYTORCH_CUDA_ALLOC_CONF` string parsed into an `AllocatorConfig`
//! (every key of the reference's §1.12, with PyTorch's value ranges and spellings), checked
//! against the PyTorch releases a file shows (`parse_for`: the one place `simulate`,
//! `diagnose`, the report, MCP and the gate take settings from), or the settings a snapshot
//! recorded.

use crate::analysis::version::{Release, VersionRange};
use crate::model::AllocatorSettings;
use std::fmt;

/// The first release whose `CUDAAllocatorConfig::parseArgs` accepts each key; every earlier
/// release stops at start-up with "Unrecognized CachingAllocator option" (c10/cuda in
/// PyTorch's source: `CUDACachingAllocator.cpp` in 2.0, `CUDAAllocatorConfig.cpp` from 2.1,
/// with the device-generic keys in `c10/core/AllocatorConfig.cpp` from 2.9).
pub const KEYS: [(&str, Release); 14] = [
    ("backend", Release(2, 0)),
    ("max_split_size_mb", Release(2, 0)),
    ("roundup_power2_divisions", Release(2, 0)),
    ("garbage_collection_threshold", Release(2, 0)),
    ("expandable_segments", Release(2, 1)),
    ("pinned_use_cuda_host_register", Release(2, 1)),
    ("pinned_num_register_threads", Release(2, 1)),
    ("release_lock_on_cudamalloc", Release(2, 2)),
    ("max_non_split_rounding_mb", Release(2, 4)),
    ("pinned_use_background_threads", Release(2, 5)),
    ("per_process_memory_fraction", Release(2, 9)),
    ("graph_capture_record_stream_reuse", Release(2, 9)),
    ("pinned_reserve_segment_size_mb", Release(2, 10)),
    ("large_segment_size_mb", Release(2, 11)),
];

/// The release that first accepts `key`, `None` for a key no release knows.
pub fn key_since(key: &str) -> Option<Release> {
    KEYS.iter().find(|(k, _)| *k == key).map(|&(_, r)| r)
}

const MIB: u64 = 1 << 20;
/// Number of `roundup_power2_divisions` intervals: [1 MiB, 2 MiB) ... [32 GiB, inf).
pub const ROUNDUP_INTERVALS: usize = 16;
/// Default large-pool segment size and expandable page (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;

/// `mb` MiB in bytes; a size past what 64 bits hold is capped at the most whole MiB they do,
/// as PyTorch caps `max_split_size_mb` (so the setting writes back as it reads).
fn mib(mb: u64) -> u64 {
    mb.min(u64::MAX / MIB) * MIB
}

/// Which allocator backend the settings select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The caching allocator this module models.
    Native,
    /// CUDA's stream-ordered allocator: no caching rules to simulate.
    CudaMallocAsync,
}

/// The caching allocator's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    pub backend: Backend,
    /// `max_split_size_mb` in bytes; `None` when unlimited (the default).
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb` in bytes (default 20 MiB).
    pub max_non_split_rounding: u64,
    /// `large_segment_size_mb` in bytes (PyTorch 2.11; default 20 MiB).
    pub large_segment_size: u64,
    /// `garbage_collection_threshold`; `None` when off.
    pub garbage_collection_threshold: Option<f64>,
    /// Divisions per size interval (index = log2(size) - 20, clamped to 0..16); 0 = off.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    pub expandable_segments: bool,
    /// `per_process_memory_fraction`; `None` when not set.
    pub per_process_memory_fraction: Option<f64>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            backend: Backend::Native,
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            large_segment_size: LARGE_BUFFER,
            garbage_collection_threshold: None,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            expandable_segments: false,
            per_process_memory_fraction: None,
        }
    }
}

/// Why a settings string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfError {
    #[error("unknown allocator setting {0:?}")]
    UnknownKey(String),
    #[error("allocator setting {key}: {reason} (got {value:?})")]
    BadValue {
        key: String,
        value: String,
        reason: &'static str,
    },
    #[error("allocator setting {0:?} has no value (expected key:value)")]
    MissingValue(String),
    #[error(
        "allocator setting {key:?} is not accepted by {version}, which this file shows: PyTorch \
         accepts it from {since} on, and earlier releases stop at start-up on it"
    )]
    TooNew {
        key: String,
        since: Release,
        version: VersionRange,
    },
}

fn bad(key: &str, value: &str, reason: &'static str) -> ConfError {
    ConfError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    }
}

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string: comma-separated `key:value`, lists in
    /// brackets, whitespace ignored. An empty string gives the defaults. Every key some
    /// release knows is accepted; `parse_for` checks them against a file's releases.
    pub fn parse(conf: &str) -> Result<AllocatorConfig, ConfError> {
        AllocatorConfig::parse_for(conf, VersionRange::default())
    }

    /// Parses a settings string as the releases in `version` would: a key that every one of
    /// them predates is refused, as PyTorch refuses it at start-up (a range that also holds a
    /// release accepting it lets it through).
    pub fn parse_for(conf: &str, version: VersionRange) -> Result<AllocatorConfig, ConfError> {
        let text: String = conf.chars().filter(|c| !c.is_whitespace()).collect();
        let mut config = AllocatorConfig::default();
        for item in split_top_level(&text) {
            if item.is_empty() {
                continue;
            }
            let Some((key, value)) = item.split_once(':') else {
                return Err(ConfError::MissingValue(item.to_string()));
            };
            if let Some(since) = key_since(key).filter(|&since| version.before(since)) {
                return Err(ConfError::TooNew {
                    key: key.to_string(),
                    since,
                    version,
                });
            }
            config.set(key, value)?;
        }
        Ok(config)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), ConfError> {
        match key {
            "backend" => {
                self.backend = match value {
                    "native" => Backend::Native,
                    "cudaMallocAsync" => Backend::CudaMallocAsync,
                    _ => return Err(bad(key, value, "expected native or cudaMallocAsync")),
                }
            }
            "max_split_size_mb" => {
                let mb = parse_u64(key, value)?;
                if mb < LARGE_BUFFER / MIB {
                    return Err(bad(key, value, "must be at least 20"));
                }
                self.max_split_size = Some(mib(mb));
            }
            "max_non_split_rounding_mb" => {
                let mb = parse_u64(key, value)?;
                if mb < LARGE_BUFFER / MIB {
                    return Err(bad(key, value, "must be at least 20"));
                }
                self.max_non_split_rounding = mib(mb);
            }
            "large_segment_size_mb" => {
                let mb = parse_u64(key, value)?;
                if mb <= 10 {
                    return Err(bad(key, value, "must be greater than 10"));
                }
                self.large_segment_size = mib(mb);
            }
            "garbage_collection_threshold" => {
                let t = parse_f64(key, value)?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(bad(key, value, "must be between 0 and 1, exclusive"));
                }
                self.garbage_collection_threshold = Some(t);
            }
            "per_process_memory_fraction" => {
                let f = parse_f64(key, value)?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(bad(key, value, "must be between 0 and 1"));
                }
                self.per_process_memory_fraction = Some(f);
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = parse_divisions(key, value)?
            }
            "expandable_segments" => self.expandable_segments = parse_bool(key, value)?,
            // Accepted and checked, but they do not change device-memory decisions.
            "release_lock_on_cudamalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_use_background_threads"
            | "graph_capture_record_stream_reuse" => {
                parse_bool(key, value)?;
            }
            "pinned_num_register_threads" => {
                let n = parse_u64(key, value)?;
                if !n.is_power_of_two() || n > 128 {
                    return Err(bad(key, value, "must be a power of 2, at most 128"));
                }
            }
            "pinned_reserve_segment_size_mb" => {
                if parse_u64(key, value)? == 0 {
                    return Err(bad(key, value, "must be positive"));
                }
            }
            _ => return Err(ConfError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// The settings a snapshot recorded: its settings string, overridden by the structured
    /// values PyTorch wrote next to it (those are what the allocator ran with).
    pub fn from_settings(settings: &AllocatorSettings) -> Result<AllocatorConfig, ConfError> {
        let mut config = AllocatorConfig::parse(settings.alloc_conf.as_deref().unwrap_or(""))?;
        if let Some(e) = settings.expandable_segments {
            config.expandable_segments = e;
        }
        config.max_split_size = settings.max_split_size;
        config.garbage_collection_threshold =
            settings.garbage_collection_threshold.filter(|&t| t > 0.0);
        let mut divisions = [0; ROUNDUP_INTERVALS];
        for &(mb, d) in &settings.roundup_power2_divisions {
            divisions[interval_index(mb.saturating_mul(MIB))] = d;
        }
        config.roundup_power2_divisions = divisions;
        Ok(config)
    }

    /// The settings as a `PYTORCH_CUDA_ALLOC_CONF` string (empty for the defaults).
    pub fn to_conf_string(&self) -> String {
        let d = AllocatorConfig::default();
        let mut parts = Vec::new();
        if self.backend == Backend::CudaMallocAsync {
            parts.push("backend:cudaMallocAsync".to_string());
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != d.max_non_split_rounding {
            let mb = self.max_non_split_rounding / MIB;
            parts.push(format!("max_non_split_rounding_mb:{mb}"));
        }
        if self.large_segment_size != d.large_segment_size {
            let mb = self.large_segment_size / MIB;
            parts.push(format!("large_segment_size_mb:{mb}"));
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        if let Some(f) = self.per_process_memory_fraction {
            parts.push(format!("per_process_memory_fraction:{f}"));
        }
        let r = &self.roundup_power2_divisions;
        if r.iter().any(|&x| x != 0) {
            if r.iter().all(|&x| x == r[0]) {
                parts.push(format!("roundup_power2_divisions:{}", r[0]));
            } else {
                let list: Vec<String> = r
                    .iter()
                    .enumerate()
                    .map(|(i, x)| format!("{}:{x}", 1u64 << i))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
        }
        parts.join(",")
    }

    /// Divisions for a request of `size` bytes (looked up by the unrounded size).
    pub fn divisions_for(&self, size: u64) -> u64 {
        self.roundup_power2_divisions[interval_index(size)]
    }
}

impl fmt::Display for AllocatorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.to_conf_string();
        f.write_str(if s.is_empty() { "(defaults)" } else { &s })
    }
}

/// The `roundup_power2_divisions` interval of a size: log2(size) - 20, clamped to 0..16.
pub(super) fn interval_index(size: u64) -> usize {
    let log = 63 - size.max(1).leading_zeros() as usize;
    log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1)
}

/// Splits on commas that are not inside brackets.
pub fn split_top_level(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
}

fn parse_u64(key: &str, value: &str) -> Result<u64, ConfError> {
    value
        .parse()
        .map_err(|_| bad(key, value, "expected a non-negative integer"))
}

fn parse_f64(key: &str, value: &str) -> Result<f64, ConfError> {
    value
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| bad(key, value, "expected a number"))
}

/// PyTorch takes exactly `True` or `False` (its tokenizer's `toBool`, and the check of every
/// release before it): `true` stops it at start-up.
fn parse_bool(key: &str, value: &str) -> Result<bool, ConfError> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(bad(
            key,
            value,
            "expected True or False, spelled so: PyTorch refuses any other spelling",
        )),
    }
}

/// `N` (every interval) or `[MB:N,...,>:N]` (interval starts in MiB, powers of two).
fn parse_divisions(key: &str, value: &str) -> Result<[u64; ROUNDUP_INTERVALS], ConfError> {
    let division = |text: &str, allow_zero: bool| -> Result<u64, ConfError> {
        let d = parse_u64(key, text)?;
        if d.is_power_of_two() || (allow_zero && d == 0) {
            Ok(d)
        } else {
            Err(bad(key, value, "divisions must be powers of 2"))
        }
    };
    let mut out = [0; ROUNDUP_INTERVALS];
    let Some(list) = value.strip_prefix('[') else {
        out = [division(value, false)?; ROUNDUP_INTERVALS];
        return Ok(out);
    };
    let list = list
        .strip_suffix(']')
        .ok_or_else(|| bad(key, value, "unclosed ["))?;
    let mut last: Option<usize> = None;
    for entry in list.split(',') {
        let (k, v) = entry
            .split_once(':')
            .ok_or_else(|| bad(key, value, "expected [MB:N,...] entries"))?;
        let d = division(v, true)?;
        if k == ">" {
            let from = last.map_or(0, |l| l + 1);
            out[from.min(ROUNDUP_INTERVALS)..].fill(d);
            continue;
        }
        let mb = parse_u64(key, k)?;
        if !mb.is_power_of_two() {
            return Err(bad(key, value, "interval starts must be powers of 2 (MB)"));
        }
        let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
        if last.is_none() {
            out[..index].fill(d);
        }
        out[index] = d;
        last = Some(index);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(conf: &str) -> String {
        match AllocatorConfig::parse(conf) {
            Err(e) => e.to_string(),
            Ok(c) => panic!("{conf} parsed as {c:?}"),
        }
    }

    #[test]
    fn empty_string_is_the_defaults() {
        assert_eq!(AllocatorConfig::parse(""), Ok(AllocatorConfig::default()));
        assert_eq!(
            AllocatorConfig::parse(" , "),
            Ok(AllocatorConfig::default())
        );
    }

    #[test]
    fn every_key() -> Result<(), ConfError> {
        let c = AllocatorConfig::parse(
            "backend:native, max_split_size_mb:128, max_non_split_rounding_mb:64, \
             large_segment_size_mb:32, garbage_collection_threshold:0.6, \
             roundup_power2_divisions:4, expandable_segments:True, \
             per_process_memory_fraction:0.5, release_lock_on_cudamalloc:True, \
             pinned_use_cuda_host_register:False, pinned_num_register_threads:8, \
             pinned_use_background_threads:True, pinned_reserve_segment_size_mb:64, \
             graph_capture_record_stream_reuse:False",
        )?;
        assert_eq!(c.backend, Backend::Native);
        assert_eq!(c.max_split_size, Some(128 * MIB));
        assert_eq!(c.max_non_split_rounding, 64 * MIB);
        assert_eq!(c.large_segment_size, 32 * MIB);
        assert_eq!(c.garbage_collection_threshold, Some(0.6));
        assert_eq!(c.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
        assert!(c.expandable_segments);
        assert_eq!(c.per_process_memory_fraction, Some(0.5));
        let async_ = AllocatorConfig::parse("backend:cudaMallocAsync")?;
        assert_eq!(async_.backend, Backend::CudaMallocAsync);
        Ok(())
    }

    #[test]
    fn division_lists() -> Result<(), ConfError> {
        let c = AllocatorConfig::parse("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]")?;
        let mut want = [1; ROUNDUP_INTERVALS];
        want[..=6].fill(8);
        want[7] = 0;
        want[8] = 4;
        want[9] = 0;
        want[10] = 4;
        assert_eq!(c.roundup_power2_divisions, want);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[256:4,>:8]")?;
        let mut want = [8; ROUNDUP_INTERVALS];
        want[..=8].fill(4);
        assert_eq!(c.roundup_power2_divisions, want);
        assert_eq!(c.divisions_for(1000), 4);
        assert_eq!(c.divisions_for(1 << 40), 8);
        Ok(())
    }

    #[test]
    fn round_trips_through_the_string_form() -> Result<(), ConfError> {
        for conf in [
            "expandable_segments:True,max_split_size_mb:256",
            "garbage_collection_threshold:0.8,per_process_memory_fraction:0.9",
            "roundup_power2_divisions:[256:4,>:8]",
            "roundup_power2_divisions:2,large_segment_size_mb:64",
        ] {
            let c = AllocatorConfig::parse(conf)?;
            assert_eq!(AllocatorConfig::parse(&c.to_conf_string())?, c, "{conf}");
        }
        Ok(())
    }

    #[test]
    fn errors_name_the_key() {
        assert!(err("foo:1").contains("\"foo\""));
        assert!(err("expandable_segments").contains("no value"));
        assert!(err("expandable_segments:yes").contains("True or False"));
        assert!(err("max_split_size_mb:19").contains("at least 20"));
        assert!(err("max_split_size_mb:abc").contains("max_split_size_mb"));
        assert!(err("max_non_split_rounding_mb:10").contains("at least 20"));
        assert!(err("large_segment_size_mb:10").contains("greater than 10"));
        assert!(err("garbage_collection_threshold:1.0").contains("between 0 and 1"));
        assert!(err("garbage_collection_threshold:0").contains("between 0 and 1"));
        assert!(err("per_process_memory_fraction:1.5").contains("between 0 and 1"));
        assert!(err("roundup_power2_divisions:3").contains("powers of 2"));
        assert!(err("roundup_power2_divisions:[3:4]").contains("(MB)"));
        assert!(err("roundup_power2_divisions:[64:8").contains("unclosed"));
        assert!(err("pinned_num_register_threads:256").contains("at most 128"));
        assert!(err("pinned_reserve_segment_size_mb:0").contains("positive"));
        assert!(err("backend:other").contains("native"));
        assert!(err("release_lock_on_cudamalloc:2").contains("True or False"));
        assert!(err("expandable_segments:true").contains("True or False, spelled so"));
        assert!(err("expandable_segments:FALSE").contains("True or False"));
    }

    #[test]
    fn a_key_the_file_s_release_predates_is_refused() {
        let range = |min: (u32, u32), max: Option<(u32, u32)>| VersionRange {
            min: Some(Release(min.0, min.1)),
            max: max.map(|(a, b)| Release(a, b)),
        };
        let v21 = range((2, 1), Some((2, 1)));
        let e = AllocatorConfig::parse_for("per_process_memory_fraction:1.0", v21);
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err(
                "allocator setting \"per_process_memory_fraction\" is not accepted by PyTorch \
                 2.1, which this file shows: PyTorch accepts it from 2.9 on, and earlier \
                 releases stop at start-up on it"
                    .to_string()
            )
        );
        assert!(AllocatorConfig::parse_for("expandable_segments:True", v21).is_ok());
        let v20 = range((2, 0), Some((2, 0)));
        assert!(AllocatorConfig::parse_for("expandable_segments:True", v20).is_err());
        // A range that holds a release accepting the key lets it through.
        let open = range((2, 5), None);
        assert!(AllocatorConfig::parse_for("large_segment_size_mb:64", open).is_ok());
        assert!(AllocatorConfig::parse_for(
            "large_segment_size_mb:64",
            range((2, 5), Some((2, 7)))
        )
        .is_err());
        assert!(AllocatorConfig::parse_for(
            "per_process_memory_fraction:1.0",
            VersionRange::default()
        )
        .is_ok());
        for (key, _) in KEYS {
            assert!(key_since(key).is_some());
        }
    }

    #[test]
    fn recorded_settings_override_the_string() -> Result<(), ConfError> {
        let settings = AllocatorSettings {
            alloc_conf: Some("max_non_split_rounding_mb:40".into()),
            expandable_segments: Some(true),
            max_split_size: Some(256 * MIB),
            garbage_collection_threshold: Some(0.0),
            roundup_power2_divisions: vec![(1, 4), (256, 8)],
            other: Vec::new(),
        };
        let c = AllocatorConfig::from_settings(&settings)?;
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, Some(256 * MIB));
        assert_eq!(c.max_non_split_rounding, 40 * MIB);
        assert_eq!(c.garbage_collection_threshold, None);
        assert_eq!(c.roundup_power2_divisions[0], 4);
        assert_eq!(c.roundup_power2_divisions[8], 8);
        assert_eq!(c.roundup_power2_divisions[1], 0);
        Ok(())
    }

    /// Found by the `alloc_conf` fuzz target (ASan pass): a size in MiB past 64 bits was kept as
    /// `u64::MAX` bytes, which wrote back as a whole number of MiB that read as less.
    #[test]
    fn a_size_past_64_bits_is_capped_and_writes_back_as_it_reads() -> Result<(), ConfError> {
        let huge = "max_split_size_mb:666666666666666126,max_non_split_rounding_mb:99999999999999999,large_segment_size_mb:18446744073709551615";
        let c = AllocatorConfig::parse(huge)?;
        let most = (u64::MAX / MIB) * MIB;
        assert_eq!(c.max_split_size, Some(most));
        assert_eq!(
            (c.max_non_split_rounding, c.large_segment_size),
            (most, most)
        );
        assert_eq!(AllocatorConfig::parse(&c.to_conf_string())?, c);
        Ok(())
    }
}
