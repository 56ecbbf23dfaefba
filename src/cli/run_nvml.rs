//! `memprof run`'s NVML samples: while CMD runs, NVML's figure of each process's device memory is
//! sampled at a low rate on a thread of its own (when NVML is present; without it nothing is
//! sampled and nothing is said), and when CMD has ended each recording gets the samples of its
//! process as [`Kind::NvmlSample`] records, written before its trailer. The ledger
//! (`analysis::ledger`) takes the CUDA context and driver overhead from them: NVML's figure minus
//! what the driver handed out at the same moment.

use crate::source::gpu::{open_nvml, SystemClock};
use memprof_wire::{decode_header, FileHeader, Kind, Record, HOST_VERSION, RECORD_LEN};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often NVML is asked: a few times a second, far below what a process-list query costs.
const INTERVAL: Duration = Duration::from_millis(200);

/// The sampling thread; [`NvmlWatch::stop`] ends it and returns its samples without waiting
/// for it (an NVML call that hangs cannot hold `memprof run` up).
pub struct NvmlWatch {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Record>>>,
}

/// `CLOCK_MONOTONIC` in ns, the clock of the shim's records.
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write to; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

impl NvmlWatch {
    /// Starts sampling when NVML opens; `None` (silently) when it does not.
    pub fn start() -> Option<NvmlWatch> {
        let mut nvml = open_nvml(Box::new(SystemClock)).ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let samples = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&samples);
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Acquire) {
                // A failed sample (a process list that changed between NVML's two queries) is
                // skipped.
                let sample = nvml.sample();
                let ts_ns = monotonic_ns();
                for p in sample.iter().flat_map(|s| &s.processes) {
                    let (Some(used), Ok(device)) = (p.used, i32::try_from(p.device)) else {
                        continue;
                    };
                    let mut r = Record::new(Kind::NvmlSample);
                    r.ts_ns = ts_ns;
                    r.pid = p.pid;
                    r.device = device;
                    r.size = used.0;
                    if let Ok(mut kept) = kept.lock() {
                        kept.push(r);
                    }
                }
                std::thread::sleep(INTERVAL);
            }
        });
        Some(NvmlWatch { stop, samples })
    }

    /// Ends sampling and returns every sample taken.
    pub fn stop(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Release);
        self.samples
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}

/// Writes the samples of the recording's own process into `path`, before its trailer. Only a
/// recording that was closed cleanly (ends with its trailer) in a version that has NVML samples
/// gets them; returns how many were written.
pub fn add_samples(path: &Path, samples: &[Record]) -> std::io::Result<usize> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let mut head = vec![0u8; memprof_wire::FILE_HEADER_LEN + 4];
    file.read_exact(&mut head)?;
    let (Ok(header), Ok(version)) = (FileHeader::decode(&head), decode_header(&head)) else {
        return Ok(0);
    };
    if version < HOST_VERSION {
        return Ok(0);
    }
    let block = u32::from_le_bytes([head[32], head[33], head[34], head[35]]) as u64;
    let records_at = memprof_wire::FILE_HEADER_LEN as u64 + 4 + block;
    let len = file.metadata()?.len();
    if len < records_at + RECORD_LEN as u64 || !(len - records_at).is_multiple_of(RECORD_LEN as u64)
    {
        return Ok(0);
    }
    let mut last = [0u8; RECORD_LEN];
    file.seek(SeekFrom::Start(len - RECORD_LEN as u64))?;
    file.read_exact(&mut last)?;
    if !Record::decode(&last).is_ok_and(|r| r.kind == Kind::Trailer) {
        return Ok(0);
    }
    let mine: Vec<&Record> = samples.iter().filter(|r| r.pid == header.pid).collect();
    let mut bytes = Vec::with_capacity((mine.len() + 1) * RECORD_LEN);
    for r in &mine {
        bytes.extend_from_slice(&r.encode());
    }
    bytes.extend_from_slice(&last);
    file.seek(SeekFrom::Start(len - RECORD_LEN as u64))?;
    file.write_all(&bytes)?;
    Ok(mine.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_go_before_the_trailer_of_their_own_process_only() {
        let dir = std::env::temp_dir().join(format!("memprof-nvml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("r.memprof");
        let mut bytes = FileHeader {
            pid: 42,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        bytes.extend_from_slice(&memprof_wire::ProcessInfo::default().encode());
        let mut alloc = Record::new(Kind::Alloc);
        alloc.ptr = 0x100;
        alloc.size = 10;
        bytes.extend_from_slice(&alloc.encode());
        let mut end = Record::new(Kind::Trailer);
        end.size = 1;
        bytes.extend_from_slice(&end.encode());
        std::fs::write(&path, &bytes).expect("written");
        let sample = |pid: u32, used: u64| {
            let mut r = Record::new(Kind::NvmlSample);
            r.pid = pid;
            r.device = 0;
            r.size = used;
            r
        };
        let samples = [sample(42, 500), sample(7, 900), sample(42, 510)];
        assert_eq!(add_samples(&path, &samples).expect("added"), 2);
        let read = memprof_wire::decode_recording(&std::fs::read(&path).expect("read"))
            .expect("still a recording");
        assert_eq!(read.records, vec![alloc, samples[0], samples[2]]);
        assert_eq!(read.dropped, Some(0));
        // Cut short: left alone.
        std::fs::write(&path, &bytes[..bytes.len() - RECORD_LEN]).expect("written");
        assert_eq!(add_samples(&path, &samples).expect("read"), 0);
        std::fs::remove_dir_all(&dir).expect("cleaned");
    }
}
