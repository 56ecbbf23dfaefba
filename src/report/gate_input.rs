//! Reading the gate's text inputs: a baseline file written by `--write-baseline`, and a
//! `memprof analyze --json` document given in place of a snapshot.

use crate::analysis::categories::CategoryBytes;
use crate::report::gate::{Baseline, Measurement, SiteBytes};
use anyhow::{bail, Context};
use serde_json::Value;

/// A baseline file's text, checked (kind, version, figures).
pub fn parse_baseline(text: &str) -> anyhow::Result<Baseline> {
    let baseline: Baseline = serde_json::from_str(text).context("not a memprof gate baseline")?;
    baseline.validate()?;
    Ok(baseline)
}

/// Reads the measurements out of a `memprof analyze --json` document (schema_version 1 or 2:
/// the fields read here kept their meaning).
/// `name` is the input's name where the document does not give its path.
pub fn parse_analyze_json(
    text: &str,
    name: &str,
    first_rank: usize,
) -> anyhow::Result<Vec<Measurement>> {
    let doc: Value = serde_json::from_str(text).context("not valid JSON")?;
    if doc["schema_version"] != 1 && doc["schema_version"] != 2 {
        bail!("not a memprof analyze JSON document of schema_version 1 or 2");
    }
    let inputs = doc["inputs"].as_array().context("'inputs' is missing")?;
    let mut out = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let devices = input["devices"]
            .as_array()
            .context("'devices' is missing")?;
        for d in devices {
            let number = |v: &Value, what: &str| {
                v.as_u64()
                    .with_context(|| format!("'{what}' is missing or not a number"))
            };
            let sites = d["top_sites"]
                .as_array()
                .map(|sites| {
                    sites
                        .iter()
                        .map(|s| SiteBytes {
                            frame: s["frame"].as_str().unwrap_or_default().to_string(),
                            bytes: s["bytes"].as_u64().unwrap_or(0),
                            stack: s["stack"]
                                .as_array()
                                .map(|f| {
                                    f.iter()
                                        .filter_map(|x| x.as_str().map(str::to_string))
                                        .collect()
                                })
                                .unwrap_or_default(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Measurement {
                rank: first_rank + i,
                input: input["path"].as_str().unwrap_or(name).to_string(),
                device: u32::try_from(number(&d["device"], "device")?).context("device number")?,
                peak_active_bytes: number(
                    &d["trace"]["peak_active_bytes"],
                    "trace.peak_active_bytes",
                )?,
                peak_reserved_bytes: number(
                    &d["trace"]["peak_reserved_bytes"],
                    "trace.peak_reserved_bytes",
                )?,
                sites,
                // Not in an analyze document: `--metric left-alive` needs the snapshot.
                left_alive_bytes: 0,
                left_alive_sites: Vec::new(),
                categories: d["categories"]["at_peak"]
                    .as_array()
                    .map(|list| {
                        list.iter()
                            .map(|c| CategoryBytes {
                                category: c["category"].as_str().unwrap_or_default().to_string(),
                                bytes: c["bytes"].as_u64().unwrap_or(0),
                                count: c["count"].as_u64().unwrap_or(0) as usize,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                process_peak_bytes: process_peak(&input["ledger"], &d["device"]),
                // Documents before the account (schema 1) have no `peaks`, and had a trace
                // wherever they gave a peak.
                peak_known: !d["peaks"]["requested"]["bytes"].is_null() || d["peaks"].is_null(),
            });
        }
    }
    Ok(out)
}

/// A recording's process peak on `device` from its analyze document's ledger: NVML's figure at
/// the peak, else the driver's total there.
fn process_peak(ledger: &Value, device: &Value) -> Option<u64> {
    let d = ledger["devices"]
        .as_array()?
        .iter()
        .find(|d| &d["device"] == device)?;
    let peak = &d["at_peak"];
    peak["nvml_bytes"]
        .as_u64()
        .or_else(|| peak["device_bytes"].as_u64())
}
