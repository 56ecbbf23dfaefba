//! `memprof plot FILE --kind timeline|segments|fragmentation [-o OUT.png|OUT.svg]
//! [--stack-by site|category]`: one picture of one device of a snapshot.

use super::input::load_snapshot;
use super::Outcome;
use crate::analysis::categories::CategoryRules;
use crate::model::Snapshot;
use crate::report::plot::{self, Format, Kind, Stacking};
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// PyTorch memory snapshot pickle or memprof recording.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Which picture: memory over time, the segment map, or fragmentation over time.
    #[arg(long, value_enum, default_value_t = KindArg::Timeline)]
    pub kind: KindArg,
    /// Output file; the extension picks the format [default: FILE's stem-KIND.png here].
    #[arg(short = 'o', long = "output", value_name = "OUT.png|OUT.svg")]
    pub output: Option<PathBuf>,
    /// The device to plot [default: the first one in the file].
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// What the timeline's areas split active memory by: the top allocation sites, or the
    /// categories (parameter, gradient, optimizer_state, activation, autograd, workspace,
    /// other, and your own) [default: site].
    #[arg(long, value_enum, value_name = "site|category")]
    pub stack_by: Option<StackByArg>,
    /// With `--stack-by category`, a category of your own, as in `analyze`: allocations with a
    /// stack frame that REGEX matches; repeatable, the first match wins.
    #[arg(long = "category", value_name = "NAME=REGEX")]
    pub categories: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StackByArg {
    Site,
    Category,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    Timeline,
    Segments,
    Fragmentation,
}

impl KindArg {
    fn kind(self) -> Kind {
        match self {
            KindArg::Timeline => Kind::Timeline,
            KindArg::Segments => Kind::Segments,
            KindArg::Fragmentation => Kind::Fragmentation,
        }
    }

    fn name(self) -> &'static str {
        match self {
            KindArg::Timeline => "timeline",
            KindArg::Segments => "segments",
            KindArg::Fragmentation => "fragmentation",
        }
    }
}

pub fn run(args: &PlotArgs) -> anyhow::Result<Outcome> {
    let output = args.output.clone().unwrap_or_else(|| {
        let stem = args.file.file_stem().unwrap_or(args.file.as_os_str());
        PathBuf::from(format!(
            "{}-{}.png",
            stem.to_string_lossy(),
            args.kind.name()
        ))
    });
    let format = Format::from_path(&output)?;
    let stacking = stacking(args)?;
    let shown = args.file.display().to_string();
    let loaded = load_snapshot(&args.file, true).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    let device = pick_device(snapshot, &shown, args.device)?;
    write_plot(
        snapshot,
        &args.file,
        device,
        args.kind.kind(),
        &stacking,
        format,
        &output,
    )?;
    super::wrote(&output)?;
    Ok(Outcome::Ok)
}

/// The timeline's split; `--stack-by` and `--category` only where they mean something.
fn stacking(args: &PlotArgs) -> anyhow::Result<Stacking> {
    if args.stack_by.is_some() && args.kind != KindArg::Timeline {
        bail!("--stack-by applies to --kind timeline only");
    }
    if !args.categories.is_empty() && args.stack_by != Some(StackByArg::Category) {
        bail!("--category needs --stack-by category");
    }
    Ok(match args.stack_by {
        None | Some(StackByArg::Site) => Stacking::Site,
        Some(StackByArg::Category) => {
            Stacking::Category(CategoryRules::parse(&args.categories).map_err(anyhow::Error::msg)?)
        }
    })
}

/// The device asked for, or the first one; an error names the file when it has none.
pub fn pick_device(snapshot: &Snapshot, shown: &str, device: Option<u32>) -> anyhow::Result<u32> {
    let devices = snapshot.devices();
    match device {
        Some(d) if devices.contains(&d) => Ok(d),
        Some(d) => bail!("{shown}: device {d} has no segments and no trace entries"),
        None => match devices.first() {
            Some(&d) => Ok(d),
            None => bail!("{shown}: no device has segments or trace entries; nothing to plot"),
        },
    }
}

/// Draws one plot of `file`'s snapshot and writes it to `output`.
pub fn write_plot(
    snapshot: &Snapshot,
    file: &Path,
    device: u32,
    kind: Kind,
    stacking: &Stacking,
    format: Format,
    output: &Path,
) -> anyhow::Result<()> {
    let name = file
        .file_name()
        .unwrap_or(file.as_os_str())
        .to_string_lossy();
    let bytes = plot::plot(snapshot, &name, device, kind, stacking, format)?;
    std::fs::write(output, bytes).with_context(|| format!("{}: cannot write", output.display()))
}
