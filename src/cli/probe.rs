//! `memprof probe`: what the CUDA driver says about itself and each device (version, free and
//! total memory, VMM allocation granularity), as text or JSON.

use super::Outcome;
use crate::source::cuda_probe::{probe, Probe};
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ProbeArgs) -> anyhow::Result<Outcome> {
    let found = probe()?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &found)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &found)?;
    }
    Ok(Outcome::Ok)
}

fn write_text(out: &mut impl Write, found: &Probe) -> std::io::Result<()> {
    writeln!(
        out,
        "CUDA driver {} ({} device{})",
        found.driver_version,
        found.devices.len(),
        if found.devices.len() == 1 { "" } else { "s" }
    )?;
    for d in &found.devices {
        let granularity = match (d.vmm_granularity, d.vmm_granularity_recommended) {
            (Some(min), Some(rec)) => format!("{min} (recommended {rec})"),
            (Some(min), None) => min.to_string(),
            _ => "not supported".to_owned(),
        };
        writeln!(
            out,
            "device {}: {}\n  memory: {} free of {}\n  VMM granularity: {}",
            d.ordinal,
            d.name.as_deref().unwrap_or("(name unknown)"),
            d.free,
            d.total,
            granularity
        )?;
    }
    Ok(())
}
