//! The `diagnose` report (`design/CLI.md`): the JSON document and the text a person acts on
//! (the cause in one line, the evidence, the sites, the ranked remedies).

use super::analyze_json::SCHEMA_VERSION;
use crate::analysis::oom::{Diagnosis, Remedy};
use crate::model::Bytes;
use serde::Serialize;
use std::fmt::Write;

/// The whole document.
#[derive(Debug, Serialize)]
pub struct DiagnoseReport {
    pub schema_version: u32,
    pub diagnoses: Vec<Diagnosis>,
}

impl DiagnoseReport {
    pub fn new(diagnoses: Vec<Diagnosis>) -> DiagnoseReport {
        DiagnoseReport {
            schema_version: SCHEMA_VERSION,
            diagnoses,
        }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        for d in &self.diagnoses {
            write_one(&mut out, d);
        }
        out
    }
}

fn write_one(out: &mut String, d: &Diagnosis) {
    let at = d
        .entry_index
        .map(|i| format!(" at entry {i}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "device {}: OOM{at} (request {}): {}",
        d.device,
        Bytes(d.request_bytes),
        d.cause.name()
    );
    let _ = writeln!(out, "  {}", d.evidence);
    let mut figures = format!(
        "  reserved {}, allocated {}",
        Bytes(d.reserved_bytes),
        Bytes(d.allocated_bytes)
    );
    if let Some(l) = d.largest_free_block_bytes {
        let _ = write!(figures, ", largest free block {}", Bytes(l));
    }
    if let Some(f) = d.device_free_bytes {
        let _ = write!(figures, ", device free {}", Bytes(f));
    }
    if let Some(t) = d.total_bytes {
        let _ = write!(figures, ", device total {}", Bytes(t));
    }
    let _ = writeln!(out, "{figures}");
    if let Some((first, rest)) = d.sites.split_first() {
        let _ = writeln!(out, "  failing request: {}", first.frame);
        if !rest.is_empty() {
            let _ = writeln!(out, "  live memory by site:");
            for s in rest {
                let _ = writeln!(out, "    {:>12}  {}", Bytes(s.bytes).to_string(), s.frame);
            }
        }
    }
    if d.remedies.is_empty() {
        let _ = writeln!(out, "  remedies: none the evidence supports");
    } else {
        let replayed = d
            .replay_capacity_bytes
            .map(|c| {
                format!(
                    " (settings replayed over the recorded trace, {} for the allocator)",
                    Bytes(c)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(out, "  remedies, best first{replayed}:");
        for (k, r) in d.remedies.iter().enumerate() {
            let _ = writeln!(out, "    {}. {}", k + 1, remedy_line(r));
            for s in &r.freed {
                let _ = writeln!(
                    out,
                    "         frees {:>12}  {}",
                    Bytes(s.bytes).to_string(),
                    s.frame
                );
            }
        }
    }
}

fn remedy_line(r: &Remedy) -> String {
    if !r.verified {
        return format!("{} (not verified by replay)", r.action);
    }
    let outcome = match r.oom_avoided {
        Some(true) => "no OOM through the recorded trace",
        Some(false) => "still runs out of memory",
        None => "outcome unknown",
    };
    let mut peak = r
        .new_peak_reserved_bytes
        .map(|p| format!(", peak reserved {}", Bytes(p)))
        .unwrap_or_default();
    if let Some(p) = r.new_peak_allocated_bytes {
        let _ = write!(peak, ", peak allocated {}", Bytes(p));
    }
    format!("{}: replayed, {outcome}{peak}", r.action)
}
