//! Opening input files: the one place `cli` turns a path into a snapshot (a PyTorch snapshot
//! pickle or a memprof recording), with a progress bar on a terminal for big snapshots.

use crate::analysis::layout_warnings;
use crate::source::driver_state::Keeper;
use crate::source::prefetch::Prefetch;
use crate::source::recording::{self, RecordingInfo};
use crate::source::torch_snapshot::{self, Parsed};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use std::fs::File;
use std::io::{BufReader, IsTerminal, Read};
use std::path::Path;

/// Files at least this large get a progress bar (on a terminal, without --json).
const PROGRESS_FROM_BYTES: u64 = 32 << 20;

/// Bytes read from a recording at a time.
const RECORDING_BUFFER: usize = 1 << 20;

/// Magic at the start of a memprof recording (`memprof-wire`).
const RECORDING_MAGIC: &[u8] = memprof_wire::MAGIC;

/// A snapshot read from a file, with the file's size.
pub struct Loaded {
    pub parsed: Parsed,
    pub bytes: u64,
    /// What a memprof recording says beyond the model; `None` for a PyTorch snapshot.
    pub recording: Option<RecordingInfo>,
}

/// Reads a snapshot file. Errors name what went wrong; the caller adds the path.
pub fn load_snapshot(path: &Path, progress: bool) -> anyhow::Result<Loaded> {
    load_with(path, progress, ()).map(|(loaded, _)| loaded)
}

/// Reads a snapshot file as [`load_snapshot`] does; a recording also feeds `extra` (the ledger)
/// in the same pass, and gives it back.
pub fn load_with<X: Keeper>(
    path: &Path,
    progress: bool,
    extra: X,
) -> anyhow::Result<(Loaded, Option<X>)> {
    let meta = std::fs::metadata(path).context("cannot open")?;
    if meta.is_dir() {
        bail!("is a directory, expected a snapshot file");
    }
    let mut file = File::open(path).context("cannot open")?;
    let mut head = [0u8; 8];
    let n = file.read(&mut head).context("cannot read")?;
    // A file that stops inside the magic is a recording cut short, not a pickle (its first
    // byte would read as a pickle opcode).
    if n > 0 && n < RECORDING_MAGIC.len() && RECORDING_MAGIC.starts_with(&head[..n]) {
        bail!(
            "recording header cut short: the file is {n} bytes, a memprof recording's header \
             is {}",
            memprof_wire::FILE_HEADER_LEN
        );
    }
    let recording = head[..n].starts_with(RECORDING_MAGIC);
    let file = File::open(path).context("cannot open")?;
    let bytes = meta.len();
    let bar =
        (progress && bytes >= PROGRESS_FROM_BYTES && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(bytes);
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            let name = path.file_name().unwrap_or(path.as_os_str());
            bar.set_message(format!("reading {}", name.to_string_lossy()));
            bar
        });
    let input: Box<dyn Read + Send> = match &bar {
        Some(bar) => Box::new(bar.wrap_read(file)),
        None => Box::new(file),
    };
    if recording {
        // Streamed record by record: memory holds the model, not the file.
        let read = recording::read_with(BufReader::with_capacity(RECORDING_BUFFER, input), extra);
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let (mut read, extra) = read?;
        let layout = layout_warnings(&read.parsed.snapshot.segments);
        read.parsed.warnings.extend(layout);
        let loaded = Loaded {
            parsed: read.parsed,
            bytes,
            recording: Some(read.info),
        };
        return Ok((loaded, Some(extra)));
    }
    let parsed = torch_snapshot::read(Prefetch::new(input));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let mut parsed = parsed?;
    let layout = layout_warnings(&parsed.snapshot.segments);
    parsed.warnings.extend(layout);
    let loaded = Loaded {
        parsed,
        bytes,
        recording: None,
    };
    Ok((loaded, None))
}
