//! `analyze`'s ledger table of a recording: one table per device, a row per share of the
//! process's memory, at the peak of the device total and at the end.

use super::analyze_json::LedgerReport;
use super::terminal_text::terminal_text;
use crate::analysis::ledger::{DeviceLedger, LedgerView};
use crate::model::Bytes;
use std::fmt::Write;

/// A figure, or `-` where there is none.
fn cell(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "-".to_string(), |b| Bytes(b).to_string())
}

/// Every row label of both views, in order, with how to read its figure from a view.
type Row = (String, Box<dyn Fn(&LedgerView) -> Option<u64>>);

fn rows(d: &DeviceLedger) -> Vec<Row> {
    let mut rows: Vec<Row> = vec![
        ("NVML (the process)".into(), Box::new(|v| v.nvml_bytes)),
        (
            "CUDA context and driver".into(),
            Box::new(|v| v.context_bytes),
        ),
    ];
    if d.at_peak.torch.is_some() {
        rows.push((
            "PyTorch reserved".into(),
            Box::new(|v| v.torch.as_ref().map(|t| t.reserved_bytes)),
        ));
        for (i, p) in d.at_peak.torch.iter().flat_map(|t| &t.pools).enumerate() {
            rows.push((
                format!("  pool {} ({}, {})", p.pool, p.pool_id[0], p.pool_id[1]),
                Box::new(move |v| {
                    v.torch
                        .as_ref()
                        .and_then(|t| t.pools.get(i))
                        .map(|p| p.bytes)
                }),
            ));
        }
    }
    let mut libraries: Vec<String> = d
        .at_peak
        .outside_torch
        .iter()
        .map(|l| l.library.clone())
        .collect();
    for l in &d.at_end.outside_torch {
        if !libraries.contains(&l.library) {
            libraries.push(l.library.clone());
        }
    }
    for name in libraries {
        let label = terminal_text(&name).to_string();
        rows.push((
            label,
            Box::new(move |v| {
                Some(
                    v.outside_torch
                        .iter()
                        .find(|l| l.library == name)
                        .map_or(0, |l| l.bytes),
                )
            }),
        ));
    }
    rows.push((
        "unattributed".into(),
        Box::new(|v| Some(v.unattributed_bytes)),
    ));
    rows.push((
        "managed (not device)".into(),
        Box::new(|v| Some(v.managed_bytes)),
    ));
    if d.at_peak.torch_pinned_host.is_some() {
        rows.push((
            "pinned host: PyTorch host allocator".into(),
            Box::new(|v| v.torch_pinned_host.as_ref().map(|h| h.bytes)),
        ));
    }
    let mut host: Vec<Option<String>> = d
        .at_peak
        .pinned_host
        .iter()
        .map(|h| h.library.clone())
        .collect();
    for h in &d.at_end.pinned_host {
        if !host.contains(&h.library) {
            host.push(h.library.clone());
        }
    }
    for name in host {
        let label = format!(
            "pinned host: {}",
            name.as_deref().map_or_else(
                || "no library".to_string(),
                |n| terminal_text(n).to_string()
            )
        );
        rows.push((
            label,
            Box::new(move |v| {
                Some(
                    v.pinned_host
                        .iter()
                        .find(|h| h.library == name)
                        .map_or(0, |h| h.bytes),
                )
            }),
        ));
    }
    rows
}

/// The ledger tables.
pub fn render(ledger: &LedgerReport, out: &mut String) {
    let joined = match &ledger.snapshot {
        Some(s) => format!("joined with {}", terminal_text(s)),
        None => "no PyTorch snapshot joined".to_string(),
    };
    for d in &ledger.devices {
        let _ = writeln!(out, "  ledger of device {} ({joined})", d.device);
        let _ = writeln!(out, "    {:<36} {:>12} {:>12}", "", "at peak", "at end");
        let _ = writeln!(
            out,
            "    {:<36} {:>12} {:>12}",
            "device memory from the driver",
            cell(Some(d.at_peak.device_bytes)),
            cell(Some(d.at_end.device_bytes))
        );
        for (label, figure) in rows(d) {
            let _ = writeln!(
                out,
                "    {label:<36} {:>12} {:>12}",
                cell(figure(&d.at_peak)),
                cell(figure(&d.at_end))
            );
        }
    }
}
