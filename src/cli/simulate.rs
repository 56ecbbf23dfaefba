//! `memprof simulate FILE`: replays a snapshot's trace through the caching-allocator model,
//! validates it against the record (`--validate`, exit 1 when a decision differs) or reports
//! what other settings would do.

use super::input::load_snapshot;
use super::Outcome;
use crate::analysis::version;
use crate::model::Bytes;
use crate::report::simulate::{
    capacity_line, warnings, Run, RunDevice, RunSource, RunsReport, ValidateDevice, ValidateReport,
};
use crate::sim::replay::{self, DeviceTrace, Prepared};
use crate::sim::{sweep, AllocatorConfig, Backend};
use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// A PyTorch memory snapshot pickle.
    pub file: PathBuf,
    /// Settings in PYTORCH_CUDA_ALLOC_CONF syntax.
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// Device memory the model may reserve (bytes or units: 80GiB).
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<String>,
    /// Replay with the recorded settings and compare each of the model's decisions with what
    /// the real allocator did.
    #[arg(long)]
    pub validate: bool,
    /// Also replay under common settings (expandable segments, split and rounding limits) to
    /// compare their peaks.
    #[arg(long)]
    pub sweep: bool,
    /// Print one JSON document (schema_version 2) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `simulate` reports: the decisions checked (`--validate`) or the replays.
pub(super) enum SimulateReport {
    Validate(ValidateReport),
    /// The replays, and the recorded run's peak the text compares them with.
    Runs(RunsReport, u64),
}

impl Serialize for SimulateReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            SimulateReport::Validate(r) => r.serialize(serializer),
            SimulateReport::Runs(r, _) => r.serialize(serializer),
        }
    }
}

pub fn run(args: &SimulateArgs) -> anyhow::Result<Outcome> {
    let report = report(args)?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        let text = match &report {
            SimulateReport::Validate(r) => r.text(),
            SimulateReport::Runs(r, recorded_peak) => r.text(*recorded_peak),
        };
        stdout.write_all(text.as_bytes())?;
    }
    stdout.flush()?;
    Ok(match &report {
        SimulateReport::Validate(r) if !r.reproduced() => Outcome::Finding,
        _ => Outcome::Ok,
    })
}

/// The report `--json` prints (the MCP tool `simulate` returns it too).
pub(super) fn report(args: &SimulateArgs) -> anyhow::Result<SimulateReport> {
    let capacity = match &args.capacity {
        Some(text) => {
            let bytes = text
                .parse::<Bytes>()
                .map_err(|e| anyhow!("--capacity: {e}"))?
                .0;
            if bytes == 0 {
                bail!("--capacity: a device of 0 bytes holds nothing; give its memory, e.g. 80GiB");
            }
            Some(bytes)
        }
        None => None,
    };
    if args.validate && (args.alloc_conf.is_some() || args.sweep) {
        bail!("--validate replays the recorded settings; drop --alloc-conf and --sweep");
    }
    let shown = args.file.display().to_string();
    let loaded = load_snapshot(&args.file, !args.json).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    if loaded.recording.is_some() {
        bail!(
            "{shown}: a memprof recording holds driver calls (the allocator's segments), not the \
             allocator's block requests, so there is nothing to replay through the allocator \
             model; simulate a PyTorch snapshot instead"
        );
    }
    for w in &loaded.parsed.warnings {
        eprintln!("memprof: warning: {shown}: {w}");
    }
    let (recorded, warning) = replay::recorded_config(snapshot);
    if let Some(w) = warning {
        eprintln!("memprof: warning: {shown}: {w}");
    }
    // Settings are read as the file's PyTorch reads them: a key it predates is refused.
    let version = version::infer(
        snapshot.format,
        &loaded.parsed.keys,
        snapshot.has_trace_entries(),
    );
    let given = match &args.alloc_conf {
        Some(conf) => Some(
            AllocatorConfig::parse_for(conf, version).map_err(|e| anyhow!("--alloc-conf: {e}"))?,
        ),
        None => None,
    };
    if given
        .as_ref()
        .is_some_and(|c| c.backend == Backend::CudaMallocAsync)
    {
        bail!("--alloc-conf: backend:cudaMallocAsync has no caching rules to simulate");
    }
    if let Some(c) = &given {
        if c.garbage_collection_threshold.is_some() {
            if c.per_process_memory_fraction.is_none() {
                eprintln!(
                    "memprof: warning: --alloc-conf: garbage_collection_threshold does nothing \
                     without a per-process memory fraction (per_process_memory_fraction here, or \
                     torch.cuda.set_per_process_memory_fraction in the program): PyTorch never \
                     runs the collector then, and neither does this replay"
                );
            } else if capacity.is_none() {
                eprintln!(
                    "memprof: warning: --alloc-conf: garbage_collection_threshold acts on a \
                     fraction of the device memory, which this replay knows only from --capacity \
                     or a trace with an OOM retry; where it does not, the collector does not run"
                );
            }
        }
    }
    if recorded.backend == Backend::CudaMallocAsync {
        bail!("{shown}: recorded with backend:cudaMallocAsync, which has no caching rules to simulate");
    }
    let prepared: Vec<Prepared> = DeviceTrace::all(snapshot)
        .iter()
        .map(|t| replay::prepare(t, &recorded, capacity))
        .collect();
    for p in &prepared {
        for w in warnings(p.issues.iter().chain(&p.recorded_run.issues)) {
            super::warn(&format!("{shown}: device {}: {w}", p.device));
        }
    }
    if args.validate {
        return Ok(SimulateReport::Validate(ValidateReport::new(
            prepared.iter().map(ValidateDevice::new).collect(),
        )));
    }
    let recorded_run = Run {
        alloc_conf: recorded.to_conf_string(),
        code: None,
        source: RunSource::Recorded,
        devices: prepared
            .iter()
            .map(|p| RunDevice::new(p, &p.recorded_run))
            .collect(),
    };
    let recorded_peak = recorded_run.peak_reserved();
    let replay_with = |config: &AllocatorConfig, source: RunSource| Run {
        alloc_conf: config.to_conf_string(),
        code: None,
        source,
        devices: prepared
            .iter()
            .map(|p| RunDevice::new(p, &replay::run(p, config, p.capacity)))
            .collect(),
    };
    // Without a request on any device every setting gives the state the snapshot shows: the
    // recorded run alone says so.
    let replayed = prepared.iter().any(|p| p.replayed_requests > 0);
    let mut runs = Vec::new();
    if let Some(config) = given.as_ref().filter(|_| replayed) {
        runs.push(replay_with(config, RunSource::Given));
    }
    runs.push(recorded_run);
    if args.sweep && replayed {
        let known = prepared.iter().all(|p| p.capacity.is_some());
        let base = recorded.to_conf_string();
        let mut swept: Vec<Run> = sweep::trials(&recorded, version, known)
            .into_iter()
            .filter(|t| given.as_ref() != Some(&t.config))
            .map(|t| Run {
                alloc_conf: t.settings_string(&base),
                code: t
                    .fraction_call
                    .map(|f| format!("torch.cuda.set_per_process_memory_fraction({f:?})")),
                ..replay_with(&t.config, RunSource::Sweep)
            })
            .collect();
        swept.sort_by_key(|r| r.outcome().rank_key());
        runs.extend(swept);
    }
    let capacities = if replayed {
        prepared.iter().map(capacity_line).collect()
    } else {
        Vec::new()
    };
    Ok(SimulateReport::Runs(
        RunsReport::new(runs, capacities),
        recorded_peak,
    ))
}
