//! The command line: clap definitions for every subcommand (docs/commands.md), and dispatch.
//! One file per built subcommand; `main.rs` maps the outcome to an exit code.

mod agent;
mod analyze;
mod analyze_at;
mod attach;
mod attach_torch;
mod diagnose;
mod diagnose_ledger;
mod diff;
mod export;
mod gate;
mod input;
mod ledger_join;
mod mcp;
mod plan;
mod plot;
mod probe;
mod report;
mod run;
mod run_nvml;
mod shim_file;
mod simulate;
mod top;
mod torch_hook;
mod tree;
mod view;

use crate::report::terminal_text::terminal_text;
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a command concluded, when it did not fail.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Ok,
    /// Exit 1: a finding that fails the command (gate regression, OOM with --fail-on-oom).
    Finding,
    /// This exit code (not 0): `memprof run` passes its command's code through.
    Exit(u8),
}

#[derive(Debug, Parser)]
#[command(
    name = "memprof",
    version,
    about = "GPU memory profiler and OOM diagnosis for PyTorch / CUDA programs",
    long_about = "GPU memory profiler and OOM diagnosis for PyTorch / CUDA programs.\n\n\
                  Exit codes: 0 ok, 1 a finding that fails the command, 2 error."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Post-mortem of PyTorch memory snapshots and memprof recordings: usage, peak,
    /// fragmentation, top sites.
    Analyze(AnalyzeArgs),
    /// Replay an allocation trace through the caching-allocator model under other settings.
    Simulate(simulate::SimulateArgs),
    /// Root cause of an out-of-memory error from a snapshot, recording or log.
    #[command(
        override_usage = "memprof diagnose [OPTIONS] FILE\n       memprof diagnose [OPTIONS] --log LOGFILE"
    )]
    Diagnose(diagnose::DiagnoseArgs),
    /// Run a program under the recording shim.
    Run(run::RunArgs),
    /// Live view of a running process.
    Attach(attach::AttachArgs),
    /// Dashboard of all GPUs and their processes.
    Top(top::TopArgs),
    /// Browse a snapshot or recording interactively.
    View(view::ViewArgs),
    /// Memory planners: training, checkpointing, sequence packing, KV cache.
    Plan(plan::PlanArgs),
    /// Fail a CI job when peak memory regresses against a baseline.
    Gate(gate::GateArgs),
    /// What changed at the peak between two runs, by site.
    Diff(diff::DiffArgs),
    /// The live memory at one moment as a caller-first tree (text, JSON, SVG icicle).
    Tree(tree::TreeArgs),
    /// Draw memory over time, the segment map or fragmentation over time (PNG or SVG).
    Plot(plot::PlotArgs),
    /// Write a self-contained HTML report: summary, plots, top sites, the OOM.
    Report(report::ReportArgs),
    /// Convert a PyTorch snapshot for other tools: memory_viz pickle, Perfetto trace, JSON.
    Export(export::ExportArgs),
    /// Serve Prometheus metrics for every GPU and process.
    Agent(agent::AgentArgs),
    /// What the CUDA driver reports: version, free/total memory, VMM granularity per device.
    Probe(probe::ProbeArgs),
    /// Serve the analyses to AI agents: a Model Context Protocol server on stdin/stdout.
    Mcp(mcp::McpArgs),
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// PyTorch memory snapshot pickles or memprof recordings (one per rank, for example).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print one JSON document (schema_version 2) instead of text.
    #[arg(long)]
    pub json: bool,
    /// How many allocation sites to list per device.
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub top: usize,
    /// With --json, also give each top site's `full_stack`: every frame as recorded, the
    /// capture, allocator and interpreter frames that `stack` leaves out included.
    #[arg(long, requires = "json")]
    pub full_stacks: bool,
    /// Only this device.
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// Also write a plot of memory over time (the first or --device device); the extension
    /// picks PNG or SVG.
    #[arg(long, value_name = "OUT.png|OUT.svg")]
    pub plot: Option<PathBuf>,
    /// A category of your own for the breakdown of live memory: allocations with a stack frame
    /// (as `stack` shows it) that REGEX matches; repeatable, the first match wins.
    #[arg(long = "category", value_name = "NAME=REGEX")]
    pub categories: Vec<String>,
    /// The account's figures, categories and sites at one moment, as JSON: `peak`,
    /// `peak-allocated`, `peak-reserved`, `oom`, `dump`, a trace entry (`120`) or a time in
    /// seconds on the input's axis (`2.5s`).
    #[arg(
        long,
        value_name = "MOMENT",
        requires = "json",
        conflicts_with = "plot"
    )]
    pub at: Option<String>,
}

/// Runs a parsed command.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Analyze(args) => analyze::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Diagnose(args) => diagnose::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Attach(args) => attach::run(&args),
        Command::Top(args) => top::run(&args),
        Command::View(args) => view::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Gate(args) => gate::run(&args),
        Command::Diff(args) => diff::run(&args),
        Command::Tree(args) => tree::run(&args),
        Command::Plot(args) => plot::run(&args),
        Command::Report(args) => report::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Agent(args) => agent::run(&args),
        Command::Probe(args) => probe::run(&args),
        Command::Mcp(args) => mcp::run(&args),
    }
}

/// Says that `path` was written: `wrote PATH` on stdout, for a command whose product is the
/// file. A closed stdout is an error the caller passes on (`main` ends quietly on it).
fn wrote(path: &Path) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    let shown = path.display().to_string();
    writeln!(stdout, "wrote {}", terminal_text(&shown))?;
    stdout.flush()
}

/// `wrote PATH` on stderr, for a file written beside the report that stdout carries (its
/// `--json` document stays the only thing there).
fn wrote_beside(path: &Path) {
    // A closed stderr must not fail the command.
    let shown = path.display().to_string();
    let _ = writeln!(std::io::stderr(), "wrote {}", terminal_text(&shown));
}

/// `memprof: warning: TEXT` on stderr, with `TEXT` (which names files and quotes them)
/// escaped for the terminal.
fn warn(text: &str) {
    // A closed stderr must not fail the command.
    let _ = writeln!(
        std::io::stderr(),
        "memprof: warning: {}",
        terminal_text(text)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every argument of `command` and its subcommands, as `memprof sub --flag`.
    fn without_help(command: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.get_help().is_none() && arg.get_long_help().is_none() && id != "help" {
                out.push(format!("{path} {id}"));
            }
        }
        for sub in command.get_subcommands() {
            if sub.get_about().is_none()
                && sub.get_long_about().is_none()
                && sub.get_name() != "help"
            {
                out.push(format!("{path} {}", sub.get_name()));
            }
            without_help(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_command_flag_and_argument_has_help_text() {
        let mut missing = Vec::new();
        without_help(&Cli::command(), "memprof", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    #[test]
    fn every_command_that_writes_a_file_takes_o_and_output() {
        let cli = Cli::command();
        for sub in ["plot", "report", "export", "run"] {
            let command = cli.find_subcommand(sub).expect("a subcommand");
            let output = command
                .get_arguments()
                .find(|a| a.get_id() == "output")
                .unwrap_or_else(|| panic!("{sub} has no output argument"));
            assert_eq!(output.get_short(), Some('o'), "{sub}");
            assert_eq!(output.get_long(), Some("output"), "{sub}");
        }
    }
}
