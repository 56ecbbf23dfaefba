//! `diagnose` of a PyTorch snapshot that `memprof run --torch` wrote beside its recording
//! (`<stem>.oom-<pid>.pickle` next to `<stem>.memprof` or `<stem>.memprof.<pid>`): an OOM
//! caused by memory outside the allocator names who held it, from the recording's ledger at its
//! end (the libraries' device memory and the CUDA context).

use super::ledger_join;
use crate::analysis::ledger::LedgerView;
use crate::analysis::oom::{Cause, Diagnosis, RemedyKind};
use crate::model::Bytes;
use crate::report::terminal_text::terminal_text;
use crate::source::open;
use memprof_wire::FileHeader;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The recording of process `pid` that `run --torch` wrote beside `snapshot`.
fn recording_beside(snapshot: &Path) -> Option<PathBuf> {
    let name = snapshot.file_name()?.to_str()?;
    let (stem, rest) = name.rsplit_once(".oom-")?;
    let pid: u32 = rest.strip_suffix(".pickle")?.parse().ok()?;
    let candidates = [format!("{stem}.memprof"), format!("{stem}.memprof.{pid}")];
    candidates.into_iter().find_map(|c| {
        let path = snapshot.with_file_name(c);
        let mut head = [0u8; memprof_wire::FILE_HEADER_LEN];
        // Only a regular file, opened without blocking, under the roots inside `memprof mcp`.
        open::regular(&path).ok()?.file.read_exact(&mut head).ok()?;
        let header = FileHeader::decode(&head).ok()?;
        (header.pid == pid).then_some(path)
    })
}

/// Who held device memory outside PyTorch, most first: the libraries, then the context.
fn holders(view: &LedgerView) -> String {
    let mut parts: Vec<String> = (view.outside_torch.iter())
        .filter(|l| l.bytes > 0)
        .map(|l| format!("{} {}", terminal_text(&l.library), Bytes(l.bytes)))
        .collect();
    if view.unattributed_bytes > 0 {
        parts.push(format!("no library {}", Bytes(view.unattributed_bytes)));
    }
    if let Some(context) = view.context_bytes.filter(|&c| c > 0) {
        parts.push(format!("the CUDA context {}", Bytes(context)));
    }
    parts.join(", ")
}

/// Adds the holders of memory outside the allocator to each OOM it caused, when the snapshot's
/// recording is beside it and joins with it.
pub fn name_outside_holders(snapshot: &Path, diagnoses: &mut [Diagnosis]) {
    if !diagnoses.iter().any(|d| d.cause == Cause::OutsideAllocator) {
        return;
    }
    let Some(recording) = recording_beside(snapshot) else {
        return;
    };
    let Ok(ledger) = ledger_join::ledger_with(&recording, snapshot) else {
        return;
    };
    let shown = recording.display().to_string();
    for d in diagnoses
        .iter_mut()
        .filter(|d| d.cause == Cause::OutsideAllocator)
    {
        let Some(l) = ledger.iter().find(|l| l.device == d.device) else {
            continue;
        };
        let who = holders(&l.at_end);
        if who.is_empty() {
            continue;
        }
        let at = format!("at the end of {}: {who}", terminal_text(&shown));
        d.evidence.push_str(&format!(" Held outside PyTorch {at}."));
        for r in d
            .remedies
            .iter_mut()
            .filter(|r| r.kind == RemedyKind::OutsideAllocator)
        {
            r.action.push_str(&format!(" (held {at})"));
        }
    }
}
