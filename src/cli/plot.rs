//! `memprof plot FILE --kind timeline|segments|fragmentation [-o OUT.png|OUT.svg]
//! [--stack-by site|category]`: one picture of one device of a snapshot (by default the device
//! that ran out of memory), its marks the input's account.

use super::input::load_snapshot;
use super::Outcome;
use crate::account::{DeviceReport, InputAccount, MomentKind};
use crate::analysis::categories::CategoryRules;
use crate::model::Snapshot;
use crate::report::plot::{self, DevicePlot, Format, Kind, Stacking};
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
    /// The device to plot [default: the first one that ran out of memory, else the first one
    /// in the file].
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// What the timeline's areas split the requested bytes by: the top allocation sites, or the
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
    if let Some(d) = args.device {
        if !snapshot.devices().contains(&d) {
            bail!("{shown}: device {d} has no segments and no trace entries");
        }
    }
    let account = crate::account::build(
        snapshot,
        &crate::account::Options {
            only: args.device,
            ..crate::account::Options::new(
                STACKED_SITES,
                &CategoryRules::default(),
                super::analyze::origin(loaded.recording.as_ref()),
            )
        },
    );
    let report = pick_device(&account, &shown)?;
    write_plot(
        snapshot,
        &account,
        report,
        &args.file,
        (args.kind.kind(), &stacking),
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

/// Sites the timeline's areas name; the rest is "other".
const STACKED_SITES: usize = 5;

/// The device to plot among those the account holds (only the one asked for, when one was):
/// the first that ran out of memory, as `view` opens on it, else the first. An error names the
/// file when it has none.
pub fn pick_device<'a>(account: &'a InputAccount, shown: &str) -> anyhow::Result<&'a DeviceReport> {
    let devices = &account.devices;
    let oom = devices
        .iter()
        .find(|d| d.account.moment(MomentKind::Oom).is_some());
    match oom.or(devices.first()) {
        Some(d) => Ok(d),
        None => bail!("{shown}: no device has segments or trace entries; nothing to plot"),
    }
}

/// Draws one plot (`kind` split by `stacking`) of `report`'s device of `file`'s snapshot and
/// writes it to `output`.
pub fn write_plot(
    snapshot: &Snapshot,
    account: &InputAccount,
    report: &DeviceReport,
    file: &Path,
    (kind, stacking): (Kind, &Stacking),
    format: Format,
    output: &Path,
) -> anyhow::Result<()> {
    let name = file
        .file_name()
        .unwrap_or(file.as_os_str())
        .to_string_lossy();
    let of = DevicePlot {
        snapshot,
        report,
        axis: account.axis,
    };
    let bytes = plot::plot(of, &name, kind, stacking, format)?;
    std::fs::write(output, bytes).with_context(|| format!("{}: cannot write", output.display()))
}
