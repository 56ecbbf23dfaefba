//! `memprof analyze --at MOMENT --json FILE`: the account's figures, categories and sites of
//! each device at one moment.

use super::analyze::origin;
use super::input::load_snapshot;
use super::{AnalyzeArgs, Outcome};
use crate::account::at::state_at;
use crate::account::{self, MomentQuery};
use crate::analysis::categories::{CategoryRules, Classifier};
use crate::report::at_json::{AtReport, DeviceAt};
use anyhow::{bail, Context};
use std::io::Write;

pub fn run(args: &AnalyzeArgs, at: &str) -> anyhow::Result<Outcome> {
    let query = MomentQuery::parse(at).map_err(|e| anyhow::anyhow!("--at {e}"))?;
    let [file] = args.files.as_slice() else {
        bail!("--at reads one FILE");
    };
    let rules = CategoryRules::parse(&args.categories).map_err(anyhow::Error::msg)?;
    let shown = file.display().to_string();
    let loaded = load_snapshot(file, false).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    if let Some(d) = args.device {
        if !snapshot.devices().contains(&d) {
            bail!("{shown}: device {d} has no segments and no trace entries");
        }
    }
    // The account's classifiers sort the allocations at the moment too (a device whose
    // account is its twin's copy has none, and gets one of its own).
    let (input, mut classifiers) = account::build_keeping_classifiers(
        snapshot,
        &account::Options {
            only: args.device,
            ..account::Options::new(args.top, &rules, origin(loaded.recording.as_ref()))
        },
    );
    let mut devices = Vec::new();
    for (d, kept) in input.devices.iter().zip(classifiers.iter_mut()) {
        if !d.account.holds_memory() && args.device.is_none() {
            continue;
        }
        let device = d.analysis.device;
        let entries = snapshot.timeline.device(device as usize);
        let resolved = d
            .account
            .resolve(query, entries, input.axis)
            .map_err(|e| anyhow::anyhow!("{shown}: device {device}: --at {at}: {e}"))?;
        let blocks = d.analysis.block_sizes();
        let classifier = kept.get_or_insert_with(|| Classifier::new(snapshot, device, &rules));
        let mut state = state_at(
            snapshot, device, &d.account, blocks, &resolved, classifier, args.top,
        );
        if !args.full_stacks {
            state
                .top_sites
                .iter_mut()
                .for_each(|s| s.full_stack.clear());
        }
        devices.push(DeviceAt {
            device,
            moment: (&resolved).into(),
            state,
        });
    }
    let report = AtReport::new(shown, at.to_string(), devices);
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
    stdout.write_all(b"\n")?;
    stdout.flush()?;
    Ok(Outcome::Ok)
}
