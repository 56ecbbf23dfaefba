//! Subcommands of `design/CLI.md` that are not built yet. Their flags are parsed so `--help`
//! documents the contract, and running one says plainly that it does not work yet (exit 2).

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct SimulateArgs {
    pub file: PathBuf,
    /// Settings in PYTORCH_CUDA_ALLOC_CONF syntax.
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// Device memory the model may reserve (bytes or units: 80GiB).
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<String>,
    #[arg(long)]
    pub validate: bool,
    #[arg(long)]
    pub sweep: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where to write the recording (default memprof-run.memprof).
    #[arg(short = 'o', value_name = "OUT.memprof")]
    pub output: Option<PathBuf>,
    /// Also turn on PyTorch's memory history in a Python CMD and dump a snapshot next to the
    /// recording when it runs out of memory.
    #[arg(long)]
    pub torch: bool,
    /// Open the attach dashboard on CMD while it runs (CMD's output goes to OUT.log).
    #[arg(long)]
    pub live: bool,
    /// The program and its arguments; its exit code is passed through.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}
