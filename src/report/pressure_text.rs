//! Allocator pressure in words, shared by `analyze` and `diagnose`: OOM retries (near misses
//! that cost a full cache flush and a device synchronize each), `empty_cache()` calls and where
//! they come from, the capacity bracket and the headroom at the peak.

use crate::analysis::pressure::Pressure;
use crate::diagnose::remedies::{outcome, PressureRemedies};
use crate::model::{count, Bytes};
use crate::sim::replay::UpperBound;

fn offset(us: Option<i64>) -> String {
    us.map(|us| format!(", {:.3} s into the trace", us as f64 / 1e6))
        .unwrap_or_default()
}

/// Where the capacity came from, for a sentence.
pub fn capacity_source(source: &str, retries: usize, has_oom: bool) -> &'static str {
    match (source, retries > 0, has_oom) {
        ("given", _, _) => "as given with --capacity",
        ("inferred", true, true) => "bracketed by the OOM retries and the `oom` entry",
        ("inferred", true, false) => "bracketed by the OOM retries",
        ("inferred", false, _) => "bracketed by the `oom` entry",
        _ => "not known",
    }
}

/// What the bracket rests on, for a sentence.
fn bracket_source(p: &Pressure) -> &'static str {
    match (p.capacity_source, p.capacity_max_from) {
        ("given", _) => "as given with --capacity",
        (_, Some(UpperBound::Retry)) => {
            "at least the peak of reserved memory; less than what an OOM retry shows: reserved \
             before its releases plus the segment it then got"
        }
        (_, Some(UpperBound::OomRequest)) => {
            "at least the peak of reserved memory; less than what the `oom` entry shows: \
             reserved then plus the segment it could not get"
        }
        (_, Some(UpperBound::OomDeviceFree)) => {
            "at least the peak of reserved memory; at most what the `oom` entry shows: \
             reserved then plus the memory the device reported free"
        }
        (_, Some(UpperBound::GivenTotal)) => {
            "at least the peak of reserved memory; at most the device total given with \
             --capacity"
        }
        _ => "at least the peak of reserved memory",
    }
}

/// The capacity bracket, or `None` when nothing bounds it.
pub fn capacity_range(p: &Pressure) -> Option<String> {
    match (p.capacity_bytes_min, p.capacity_bytes_max) {
        (Some(a), Some(b)) if a == b => Some(Bytes(a).to_string()),
        (Some(a), Some(b)) => Some(format!("between {} and {}", Bytes(a), Bytes(b))),
        (Some(a), None) => Some(format!("at least {}", Bytes(a))),
        _ => None,
    }
}

/// Lines (without indentation) saying how close the device came to its limit; `has_oom` when
/// the trace ends in an `oom` entry.
pub fn lines(p: &Pressure, has_oom: bool) -> Vec<String> {
    let mut out = Vec::new();
    let unrecovered = usize::from(p.retry_before_oom.is_some());
    let recovered = p.oom_retries.saturating_sub(unrecovered);
    if recovered > 0 {
        let mut line = format!(
            "near miss: the allocator hit the device limit and recovered {} (each time it \
             released every cached block and synchronized the device, a stall of the whole \
             step)",
            match recovered {
                1 => "once".to_string(),
                n => format!("{n} times"),
            }
        );
        if let Some(first) = p.retries.first() {
            line.push_str(&format!(
                "; first at entry {}{}: a request of {} at {} released {} in {}",
                first.entry_index,
                offset(first.offset_us),
                Bytes(first.request_bytes),
                first.site,
                Bytes(first.released_bytes),
                count(first.segments_released as u64, "segment", "segments"),
            ));
        }
        out.push(line);
    }
    if let (Some(j), Some(oom)) = (p.retry_before_oom, p.oom_entry_index) {
        let before = match oom - j {
            1 => "one entry".to_string(),
            n => format!("{n} entries"),
        };
        let again = if recovered > 0 { "again " } else { "" };
        out.push(format!(
            "the allocator hit the device limit {again}at entry {j}, {before} before the OOM: it \
             released every cached block, synchronized the device and got that request, but no \
             other request was served before the OOM, so it did not recover"
        ));
    }
    if p.oom_retries > 0 {
        let mut sites: Vec<(&str, usize)> = Vec::new();
        for r in &p.retries {
            match sites.iter_mut().find(|(s, _)| *s == r.site) {
                Some((_, n)) => *n += 1,
                None => sites.push((&r.site, 1)),
            }
        }
        if sites.len() > 1 || p.retries.len() < p.oom_retries {
            let listed: Vec<String> = sites.iter().map(|(s, n)| format!("{s} ({n})")).collect();
            let shown = if p.retries.len() < p.oom_retries {
                format!(" of the first {}", p.retries.len())
            } else {
                String::new()
            };
            out.push(format!("  retried requests{shown}: {}", listed.join(", ")));
        }
    }
    if p.empty_cache_bursts > 0 {
        let from: Vec<String> = p
            .empty_cache_sites
            .iter()
            .take(3)
            .map(|s| {
                format!(
                    "{} ({}, {} released)",
                    s.site,
                    s.bursts,
                    Bytes(s.released_bytes)
                )
            })
            .collect();
        out.push(format!(
            "{} to torch.cuda.empty_cache() (not OOM retries), from {}; each returns cached \
             memory to the driver and the next allocations must ask for it again",
            count(p.empty_cache_bursts as u64, "call", "calls"),
            from.join(", ")
        ));
    }
    if let Some(range) = capacity_range(p) {
        let mut line = format!(
            "device memory for the allocator: {range} ({})",
            bracket_source(p)
        );
        if let Some(h) = p.headroom_at_peak_bytes {
            line.push_str(&format!(
                "; at the peak of reserved memory ({}) at most {} was left",
                Bytes(p.peak_reserved_bytes),
                Bytes(h)
            ));
        }
        out.push(line);
    }
    if out.is_empty() && !has_oom {
        out.push(
            "no OOM retries and no empty_cache() calls: the allocator never hit the device's \
             limit in the trace"
                .to_string(),
        );
    }
    out
}

/// A settings string as a shell needs it: quoted when it holds anything but plain characters.
pub fn shell_value(value: &str) -> String {
    let plain = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.' | ',' | '-'));
    if plain {
        value.to_string()
    } else {
        format!("'{value}'")
    }
}

fn stalls(retries: u64, empty_cache: u64) -> String {
    format!(
        "{}, {}",
        count(retries, "OOM retry", "OOM retries"),
        count(empty_cache, "empty_cache() call", "empty_cache() calls")
    )
}

/// Lines (without indentation) giving the settings replayed against a device's OOM retries,
/// best first: those that stall less than the recorded settings as fixes, the rest as tried.
pub fn remedy_lines(r: &PressureRemedies) -> Vec<String> {
    let base = r.recorded;
    let source = match r.capacity_source {
        "given" => "as given with --capacity",
        _ => "the peak of reserved memory, where the OOM retries show the device's limit was",
    };
    let mut out = vec![format!(
        "settings replayed against the OOM retries, with {} for the allocator ({source}); the \
         recorded settings give {}:",
        Bytes(r.capacity_bytes),
        stalls(base.oom_retries, base.empty_cache_calls)
    )];
    let (better, rest): (Vec<_>, Vec<_>) = r.settings.iter().partition(|s| {
        outcome(s).rank_key() < base.rank_key() && outcome(s).stalls() < base.stalls()
    });
    if better.is_empty() {
        out.push("  no setting tried stalls less".to_string());
    }
    for (k, s) in better.iter().enumerate() {
        let env = s.env.unwrap_or("PYTORCH_CUDA_ALLOC_CONF");
        out.push(format!(
            "  {}. {env}={}",
            k + 1,
            shell_value(s.alloc_conf.as_deref().unwrap_or(""))
        ));
        if let Some(code) = &s.code {
            out.push(format!("     and in the program: {code}"));
        }
        out.push(format!(
            "     {}; peak reserved {}",
            stalls(
                s.new_oom_retries.unwrap_or(0),
                s.new_empty_cache_calls.unwrap_or(0)
            ),
            Bytes(s.new_peak_reserved_bytes.unwrap_or(0))
        ));
    }
    if !rest.is_empty() {
        let tried: Vec<String> = rest
            .iter()
            .map(|s| {
                let what = s.changed.iter().map(|c| format!("{}:{}", c.key, c.new));
                let what: Vec<String> = what.collect();
                let oom = if s.oom_avoided == Some(false) {
                    "runs out of memory"
                } else {
                    ""
                };
                let retries = count(s.new_oom_retries.unwrap_or(0), "retry", "retries");
                match oom {
                    "" => format!("{} ({retries})", what.join(",")),
                    _ => format!("{} ({oom})", what.join(",")),
                }
            })
            .collect();
        out.push(format!("  tried, no better: {}", tried.join("; ")));
    }
    out
}
