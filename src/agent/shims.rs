//! The shim processes the agent follows: each process with a live shim socket gets a reader
//! thread of its own that folds its stream into a `LiveTally`; the sampling loop only copies
//! the figures out under a short lock, so a slow, stopped or silent process never delays it.

use crate::source::live::{processes_in, LiveClient, LiveEvent};
use crate::source::live_libraries::{top_and_other, LibraryFigures};
use crate::source::live_tally::{DeviceFigures, LiveTally};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The figures of one followed process at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShimProcess {
    pub pid: u32,
    /// The command line the shim reported; `None` from a version-1 shim.
    pub command: Option<String>,
    pub devices: BTreeMap<u32, DeviceFigures>,
    /// Records not sent to the agent because it read too slowly.
    pub lost: u64,
    /// Per device, the memory held through the driver by library: the `TOP_LIBRARIES` that
    /// hold most, then `other` for the rest (named as in series: `live_libraries::label`).
    pub libraries: BTreeMap<u32, LibrarySplit>,
    /// Pinned host memory by library, the same way.
    pub pinned: LibrarySplit,
}

/// Libraries with series of their own per process and device; the rest are summed as `other`,
/// so that a process loading many libraries cannot make many series.
pub const TOP_LIBRARIES: usize = 8;

/// Libraries by name, the top ones then `other` (`live_libraries::top_and_other`).
pub type LibrarySplit = Vec<(String, LibraryFigures)>;

/// The library split of `tally`, as the agent serves it: per device, and pinned.
fn split(tally: &LiveTally) -> (BTreeMap<u32, LibrarySplit>, LibrarySplit) {
    let libs = &tally.libraries;
    let devices = (libs.devices().into_iter())
        .map(|d| (d, top_and_other(libs.on_device(d), TOP_LIBRARIES)))
        .collect();
    (devices, top_and_other(libs.pinned(), TOP_LIBRARIES))
}

/// What the reader thread of one process shares with the sampling loop.
#[derive(Debug, Default)]
struct Followed {
    /// `None` until the stream's header was read.
    command: Option<Option<String>>,
    tally: LiveTally,
    /// The reader stopped (the process ended, or the socket would not answer).
    done: bool,
}

fn lock(shared: &Mutex<Followed>) -> MutexGuard<'_, Followed> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every shim process in one socket directory.
#[derive(Debug)]
pub struct ShimWatch {
    dir: PathBuf,
    followed: BTreeMap<u32, Arc<Mutex<Followed>>>,
}

impl ShimWatch {
    /// Follows the shims whose sockets are in `dir` (`live::socket_dir()` for this user).
    pub fn new(dir: PathBuf) -> ShimWatch {
        ShimWatch {
            dir,
            followed: BTreeMap::new(),
        }
    }

    /// Starts following processes that appeared, forgets those whose reader stopped (one that
    /// still has a socket is tried again next time), and returns the figures of every process
    /// whose stream is being read, by PID.
    pub fn poll(&mut self) -> Vec<ShimProcess> {
        self.followed.retain(|_, shared| !lock(shared).done);
        for pid in processes_in(&self.dir) {
            if !self.followed.contains_key(&pid) {
                let shared = Arc::new(Mutex::new(Followed::default()));
                if follow(memprof_wire::socket_path(&self.dir, pid), &shared) {
                    self.followed.insert(pid, shared);
                }
            }
        }
        self.followed
            .iter()
            .filter_map(|(&pid, shared)| {
                let f = lock(shared);
                let (libraries, pinned) = split(&f.tally);
                Some(ShimProcess {
                    pid,
                    command: f.command.clone()?,
                    devices: f.tally.devices.clone(),
                    lost: f.tally.lost,
                    libraries,
                    pinned,
                })
            })
            .collect()
    }
}

/// Reads the stream at `path` into `shared` on a new thread; false when no thread could start.
fn follow(path: PathBuf, shared: &Arc<Mutex<Followed>>) -> bool {
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name("memprof-shim-reader".into())
        .spawn(move || {
            let mut client = match LiveClient::connect_path(&path) {
                Ok(client) => client,
                Err(_) => {
                    lock(&shared).done = true;
                    return;
                }
            };
            let command = client.process.as_ref().map(|p| p.args.join(" "));
            lock(&shared).command = Some(command);
            loop {
                match client.next_event() {
                    Ok(Some(LiveEvent::End { .. })) | Ok(None) | Err(_) => {
                        lock(&shared).done = true;
                        return;
                    }
                    Ok(Some(event)) => lock(&shared).tally.apply(&event),
                }
            }
        })
        .is_ok()
}
