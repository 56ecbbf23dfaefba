//! `analyze`'s ledger of a recording (`analysis::ledger`), joined with the PyTorch snapshot of
//! the same process: the one given right after it (`analyze run.memprof run.oom-<pid>.pickle`;
//! the files in the other order are only analyzed side by side), else
//! the one `run --torch` wrote next to it (`<stem>.oom-<pid>.pickle`). A given snapshot that does
//! not belong to the recording (no segment is one of its allocations) is refused; one found by
//! its name only gets a warning. The snapshot's host segments (PyTorch's pinned host allocator,
//! `host_segments`) name the pinned host ranges that are PyTorch's.

use super::input::load_snapshot;
use crate::analysis::ledger::{ledger_of, DeviceLedger, LedgerError, TorchSegment};
use crate::model::Action;
use anyhow::{bail, Context};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A recording's ledger and the snapshot it was joined with.
pub struct Joined {
    pub ledger: Vec<DeviceLedger>,
    pub snapshot: Option<PathBuf>,
    pub warning: Option<String>,
}

/// Whether `path` starts as a memprof recording.
fn is_recording(path: &Path) -> bool {
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == memprof_wire::MAGIC)
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
    let loaded = load_snapshot(snapshot, false).with_context(|| snapshot.display().to_string())?;
    let host = loaded.parsed.host.as_ref().map_or_else(Vec::new, |h| {
        let made = (h.trace.iter())
            .filter(|e| e.action == Action::SegmentAlloc)
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
            let made = matches!(e.action, Action::SegmentAlloc | Action::SegmentMap);
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

/// The ledger of `recording` (process `pid`), joined with `given` or the snapshot beside it.
pub fn ledger(recording: &Path, pid: u32, given: Option<&Path>) -> anyhow::Result<Joined> {
    let read = || -> anyhow::Result<_> {
        let file = std::fs::File::open(recording)
            .with_context(|| format!("{}: cannot open", recording.display()))?;
        Ok(std::io::BufReader::new(file))
    };
    if let Some(snapshot) = given {
        let torch = segments(snapshot)?;
        return match ledger_of(read()?, &torch.segments, &torch.host) {
            Ok(ledger) => Ok(Joined {
                ledger,
                snapshot: Some(snapshot.to_path_buf()),
                warning: None,
            }),
            Err(e @ LedgerError::NotJoined { .. }) => {
                bail!("{} and {}: {e}", snapshot.display(), recording.display())
            }
            Err(e) => Err(e).with_context(|| recording.display().to_string()),
        };
    }
    let found = beside(recording, pid);
    let mut warning = None;
    if found.is_file() {
        match segments(&found) {
            Ok(torch) => match ledger_of(read()?, &torch.segments, &torch.host) {
                Ok(ledger) => {
                    return Ok(Joined {
                        ledger,
                        snapshot: Some(found),
                        warning: None,
                    })
                }
                Err(LedgerError::NotJoined { .. }) => {
                    warning = Some(format!(
                        "{} is not a snapshot of this process (none of its segments is an \
                         allocation here); the ledger has no PyTorch share",
                        found.display()
                    ))
                }
                Err(e) => return Err(e).with_context(|| recording.display().to_string()),
            },
            Err(e) => warning = Some(format!("{e:#}; the ledger has no PyTorch share")),
        }
    }
    let ledger = ledger_of(read()?, &[], &[]).with_context(|| recording.display().to_string())?;
    Ok(Joined {
        ledger,
        snapshot: None,
        warning,
    })
}
