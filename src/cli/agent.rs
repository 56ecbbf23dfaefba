//! `memprof agent`: serve Prometheus metrics for every GPU and process from NVML (or, for tests
//! and bug reports, from a recorded replay), and driver-level figures of the processes running
//! the memprof shim, read from their live sockets.

use super::Outcome;
use crate::agent::{host_name, sample_forever, Cache, Exporter, ShimWatch};
use crate::source::gpu::{open_nvml, GpuSampler, Recorder, Replay, SystemClock};
use crate::source::live::socket_dir;
use anyhow::Context;
use clap::Args;
use std::io::{BufReader, LineWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Args)]
#[command(after_help = crate::agent::limits_help())]
pub struct AgentArgs {
    /// Address to serve /metrics on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: String,
    /// Seconds between samples; scrapes answer the latest one.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub interval: f64,
    /// The `host` label (default: this machine's host name).
    #[arg(long)]
    pub host: Option<String>,
    /// Take samples from a recording (JSON lines, one sample each, one per interval) instead
    /// of NVML.
    #[arg(long, value_name = "FILE", hide = true)]
    pub replay: Option<PathBuf>,
    /// Do not follow the processes running the memprof shim (their driver-level figures).
    #[arg(long)]
    pub no_shims: bool,
    /// Also append every sample to FILE (JSON lines), e.g. to attach to a bug report.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
}

pub fn run(args: &AgentArgs) -> anyhow::Result<Outcome> {
    if !(args.interval.is_finite() && args.interval > 0.0 && args.interval <= 86_400.0) {
        anyhow::bail!(
            "--interval {}: expected seconds between 0 and 86400",
            args.interval
        );
    }
    let interval = Duration::from_secs_f64(args.interval);
    let sampler: Box<dyn GpuSampler + Send> = match &args.replay {
        Some(path) => {
            let file = std::fs::File::open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            Box::new(Replay::new(
                BufReader::new(file),
                &path.display().to_string(),
            ))
        }
        None => open_nvml(Box::new(SystemClock))?,
    };
    let sampler: Box<dyn GpuSampler + Send> = match &args.record {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            Box::new(Recorder::new(
                sampler,
                LineWriter::new(file),
                &path.display().to_string(),
            ))
        }
        None => sampler,
    };
    let source = sampler.describe();
    let host = args.host.clone().or_else(host_name).unwrap_or_default();
    let shims = (!args.no_shims).then(|| ShimWatch::new(socket_dir()));
    let cache = Arc::new(Cache::default());
    let exporter = Exporter::bind(&args.listen, Arc::clone(&cache))?;
    let shown = exporter
        .local_addr()
        .map_or_else(|| args.listen.clone(), |a| a.to_string());
    {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || {
            sample_forever(sampler, shims, interval, &host, &cache, &|e| {
                // A closed stderr must not stop the sampling (eprintln! would panic).
                let _ = writeln!(std::io::stderr(), "memprof agent: sample failed: {e}");
            });
        });
    }
    eprintln!(
        "memprof agent: serving http://{shown}/metrics from {source}, a sample every {}s",
        args.interval
    );
    exporter.serve();
    Ok(Outcome::Ok)
}
