//! `memprof export FILE --to torch-snapshot|perfetto|json -o OUT`: a snapshot or a memprof
//! recording converted for other tools. The output is written whole or not at all.

use super::input::{load_snapshot, Loaded};
use super::Outcome;
use crate::analysis::categories::CategoryRules;
use crate::report::export::{events_json, perfetto, torch_snapshot};
use anyhow::{bail, Context};
use clap::Args;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A PyTorch memory snapshot pickle or a memprof recording.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// torch-snapshot (pytorch.org/memory_viz), perfetto (ui.perfetto.dev) or json (memprof's
    /// versioned event stream).
    #[arg(long, value_name = "torch-snapshot|perfetto|json")]
    pub to: String,
    /// Where to write the export.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
}

/// The formats `--to` names.
#[derive(Clone, Copy)]
enum Format {
    TorchSnapshot,
    Perfetto,
    Json,
}

impl Format {
    fn parse(name: &str) -> anyhow::Result<Format> {
        Ok(match name {
            "torch-snapshot" => Format::TorchSnapshot,
            "perfetto" => Format::Perfetto,
            "json" => Format::Json,
            other => {
                bail!("unknown --to '{other}': expected torch-snapshot, perfetto or json")
            }
        })
    }

    /// Writes what `loaded` holds in this format; the Perfetto trace marks the moments of its
    /// account.
    fn write(self, loaded: &Loaded, out: &mut BufWriter<File>) -> io::Result<()> {
        let (snapshot, keys) = (&loaded.parsed.snapshot, &loaded.parsed.keys);
        match self {
            Format::TorchSnapshot => torch_snapshot::write(snapshot, keys, &mut *out)?,
            Format::Perfetto => {
                let rules = CategoryRules::default();
                let account = crate::account::build(
                    snapshot,
                    &crate::account::Options::new(
                        10,
                        &rules,
                        super::analyze::origin(loaded.recording.as_ref()),
                    ),
                );
                perfetto::write(snapshot, &account, &mut *out)?
            }
            Format::Json => events_json::write(snapshot, &mut *out)?,
        }
        out.flush()
    }
}

pub fn run(args: &ExportArgs) -> anyhow::Result<Outcome> {
    let format = Format::parse(&args.to)?;
    let shown = args.file.display().to_string();
    let loaded = load_snapshot(&args.file, true).with_context(|| shown.clone())?;
    for warning in &loaded.parsed.warnings {
        super::warn(&format!("{shown}: {warning}"));
    }
    write_whole(&args.output, |out| format.write(&loaded, out))?;
    super::wrote(&args.output)?;
    Ok(Outcome::Ok)
}

/// Writes to a temporary file beside `path` and renames it into place, so a failed export
/// leaves no partial file behind.
fn write_whole(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> anyhow::Result<()> {
    let shown = path.display();
    let mut name = path
        .file_name()
        .with_context(|| format!("{shown}: not a file name"))?
        .to_os_string();
    name.push(".memprof-partial");
    let partial = path.with_file_name(name);
    let file = File::create(&partial).with_context(|| format!("{shown}: cannot create"))?;
    let mut out = BufWriter::new(file);
    let written = body(&mut out).and_then(|()| out.into_inner().map_err(|e| e.into_error()));
    let result = written
        .and_then(|file| file.sync_all())
        .and_then(|()| std::fs::rename(&partial, path));
    if let Err(err) = result {
        // Best effort: the error that matters is the write's.
        let _ = std::fs::remove_file(&partial);
        return Err(err).with_context(|| format!("{shown}: cannot write"));
    }
    Ok(())
}
