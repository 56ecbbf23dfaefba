//! `analyze`'s ledger of a recording (`analysis::ledger`), joined with the PyTorch snapshot of
//! the same process: the one given right after it (`analyze run.memprof run.oom-<pid>.pickle`;
//! the files in the other order are only analyzed side by side), else
//! the one `run --torch` wrote next to it (`<stem>.oom-<pid>.pickle`). A given snapshot that does
//! not belong to the recording (no segment is one of its allocations) is refused; one found by
//! its name only gets a warning. The snapshot's host segments (PyTorch's pinned host allocator,
//! `host_segments`) name the pinned host ranges that are PyTorch's. The ledger comes from the
//! same pass over the recording as its model ([`load_with_ledger`]).

use super::input::{load_opened, load_snapshot, open, peek, Loaded};
use crate::analysis::ledger::{ledger_of, DeviceLedger, LedgerWalk, TorchSegment};
use crate::model::Action;
use crate::source::open;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// A recording's ledger and the snapshot it was joined with.
pub struct Joined {
    pub ledger: Vec<DeviceLedger>,
    pub snapshot: Option<PathBuf>,
    pub warning: Option<String>,
}

/// Whether `path` is a regular file that starts as a memprof recording (a pipe is not looked
/// into: its bytes are read once, by what reads the input).
fn is_recording(path: &Path) -> bool {
    peek(path, memprof_wire::MAGIC.len()).is_some_and(|head| head == memprof_wire::MAGIC)
}

/// `(recording, snapshot)` when the files are exactly a recording followed by a snapshot (the
/// other order, or more files, are inputs analyzed side by side).
pub fn pair(files: &[PathBuf]) -> Option<(PathBuf, PathBuf)> {
    let [a, b] = files else { return None };
    (is_recording(a) && !is_recording(b)).then(|| (a.clone(), b.clone()))
}

/// The snapshot `run --torch` writes beside `recording` for process `pid`.
fn beside(recording: &Path, pid: u32) -> PathBuf {
    let stem = recording
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    recording.with_file_name(format!("{stem}.oom-{pid}.pickle"))
}

/// What of a snapshot the ledger joins: its device segments and the addresses of its host
/// segments.
struct Torch {
    segments: Vec<TorchSegment>,
    host: Vec<u64>,
}

/// The snapshot's segments at the dump, then those its trace saw made (`segment_alloc`,
/// `segment_map`) and gone by the dump, counted in the default pool (trace entries do not say);
/// the same of its host segments and host trace.
fn segments(snapshot: &Path) -> anyhow::Result<Torch> {
    segments_named(snapshot, snapshot)
}

/// `segments` of the snapshot read from `read`, named `shown` in errors.
fn segments_named(read: &Path, shown: &Path) -> anyhow::Result<Torch> {
    let loaded = load_snapshot(read, false).with_context(|| shown.display().to_string())?;
    let host = loaded.parsed.host.as_ref().map_or_else(Vec::new, |h| {
        let made = (h.trace.iter())
            .filter(|e| e.action() == Action::SegmentAlloc)
            .filter_map(|e| e.addr());
        h.segments.iter().map(|s| s.address).chain(made).collect()
    });
    let s = &loaded.parsed.snapshot;
    let mut out: Vec<TorchSegment> = (s.segments.iter())
        .map(|s| TorchSegment {
            device: s.device,
            address: s.address,
            size: s.total_size,
            pool_id: s.pool_id,
        })
        .collect();
    let mut known: std::collections::HashSet<(u32, u64)> =
        out.iter().map(|t| (t.device, t.address)).collect();
    for index in 0..s.timeline.device_count() {
        let Ok(device) = u32::try_from(index) else {
            continue;
        };
        for e in s.timeline.device(index) {
            let made = matches!(e.action(), Action::SegmentAlloc | Action::SegmentMap);
            let Some(address) = e.addr().filter(|_| made) else {
                continue;
            };
            if known.insert((device, address)) {
                out.push(TorchSegment {
                    device,
                    address,
                    size: e.size,
                    pool_id: (0, 0),
                });
            }
        }
    }
    Ok(Torch {
        segments: out,
        host,
    })
}

/// Reads `path` (see `input::load_snapshot`; its errors name no file, the caller adds it); a
/// recording comes with its ledger, made in the same pass, joined with `given` or the snapshot
/// beside it, or the error that refused it (naming its files).
pub fn load_with_ledger(
    path: &Path,
    progress: bool,
    given: Option<&Path>,
) -> anyhow::Result<(Loaded, Option<anyhow::Result<Joined>>)> {
    // The header names the process, whose snapshot must be known before the walk.
    let opened = open(path, progress)?;
    let Some(pid) = opened.recording_pid() else {
        return Ok((load_opened(opened, ())?.0, None));
    };
    let mut warning = None;
    // A given snapshot that cannot be read is reported after the recording is read, as a
    // recording that cannot be read is the first thing to say.
    let mut unreadable = None;
    let snapshot = match given {
        Some(snapshot) => match segments(snapshot) {
            Ok(torch) => Some((snapshot.to_path_buf(), torch)),
            Err(e) => {
                unreadable = Some(e);
                None
            }
        },
        None => {
            let found = beside(path, pid);
            // Opened as `source::open` opens what an input names (a FIFO put there must not
            // hang the command), then read through that very file.
            let read = open::regular(&found)
                .ok()
                .map(|opened| segments_named(&opened.fd_path(), &found));
            match read {
                Some(Ok(torch)) => Some((found, torch)),
                Some(Err(e)) => {
                    warning = Some(format!("{e:#}; the ledger has no PyTorch share"));
                    None
                }
                None => None,
            }
        }
    };
    let walk = match &snapshot {
        Some((_, torch)) => LedgerWalk::new(&torch.segments, &torch.host),
        None => LedgerWalk::new(&[], &[]),
    };
    let (loaded, walk) = load_opened(opened, walk)?;
    let Some(walk) = walk else {
        return Ok((loaded, None));
    };
    if let Some(e) = unreadable {
        return Ok((loaded, Some(Err(e))));
    }
    let mut snapshot = snapshot.map(|(path, _)| path);
    if let (Some(e), Some(found)) = (walk.refused(), &snapshot) {
        if given.is_some() {
            let refused = anyhow::anyhow!("{} and {}: {e}", found.display(), path.display());
            return Ok((loaded, Some(Err(refused))));
        }
        warning = Some(format!(
            "{} is not a snapshot of this process (none of its segments is an allocation \
             here); the ledger has no PyTorch share",
            found.display()
        ));
        snapshot = None;
    }
    let joined = Joined {
        ledger: walk.finish(),
        snapshot,
        warning,
    };
    Ok((loaded, Some(Ok(joined))))
}

/// The ledger of `recording` alone (not its model), joined with `snapshot`; refused when they
/// are not of the same process. The recording is one found beside the snapshot, opened as
/// `source::open` opens what an input names.
pub fn ledger_with(recording: &Path, snapshot: &Path) -> anyhow::Result<Vec<DeviceLedger>> {
    let torch = segments(snapshot)?;
    let file = open::regular(recording)
        .with_context(|| format!("{}: cannot open", recording.display()))?
        .file;
    ledger_of(std::io::BufReader::new(file), &torch.segments, &torch.host)
        .with_context(|| format!("{} and {}", snapshot.display(), recording.display()))
}
