//! What the attach view shows: in shim mode the live stream's figures (`LiveTally`) and held
//! memory per device over time; in NVML mode the process's used memory per device over time.
//! Whether the process is still running, the help overlay and the rate of events. Pure.

use crate::model::Bytes;
use crate::source::attach::figures::TorchDevice;
use crate::source::gpu::Sample;
use crate::source::live::LiveEvent;
use crate::source::live_tally::LiveTally;
use crate::tui::keys::Key;
use crate::tui::Flow;
use std::collections::BTreeMap;

/// Points kept per device (older ones scroll off).
pub const SERIES_LEN: usize = 600;

/// Where the figures come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The shim's event stream: every driver allocation.
    Shim,
    /// NVML samples (`source` names the sampler); `why` says why the shim is not read.
    Nvml { source: String, why: String },
    /// PyTorch's own figures from memprof's agent in the job (`source` says which).
    Torch { source: String },
}

/// The attach view's state.
#[derive(Clone, Debug, PartialEq)]
pub struct AttachState {
    pub pid: u32,
    pub command: Option<String>,
    pub mode: Mode,
    pub tally: LiveTally,
    /// Per device, (time ms, bytes) at each tick: held through the driver (shim) or NVML's
    /// used figure (`None` where NVML will not say).
    pub series: BTreeMap<u32, Vec<(u64, Option<Bytes>)>>,
    /// Time of the latest tick.
    pub now_ms: Option<u64>,
    /// Records per second over the last tick.
    pub rate: Option<f64>,
    last: Option<(u64, u64)>,
    /// The process has ended (the last state stays on screen).
    pub gone: bool,
    /// Why the stream or the last sample failed.
    pub error: Option<String>,
    pub help: bool,
    /// PyTorch's figures at the latest tick, in torch mode.
    pub torch: Vec<TorchDevice>,
}

impl AttachState {
    pub fn new(pid: u32, command: Option<String>, mode: Mode) -> AttachState {
        AttachState {
            pid,
            command,
            mode,
            tally: LiveTally::default(),
            series: BTreeMap::new(),
            now_ms: None,
            rate: None,
            last: None,
            gone: false,
            error: None,
            help: false,
            torch: Vec::new(),
        }
    }

    /// A tick in torch mode: PyTorch's figures; the series is each device's reserved memory.
    pub fn tick_torch(&mut self, now_ms: u64, devices: Vec<TorchDevice>) {
        self.now_ms = Some(now_ms);
        self.error = None;
        for d in &devices {
            self.push_point(d.device, now_ms, d.reserved);
        }
        self.torch = devices;
    }

    /// Applies one item of the shim's stream.
    pub fn apply(&mut self, item: Result<LiveEvent, String>) {
        match item {
            Ok(event) => {
                self.tally.apply(&event);
                if self.tally.ended {
                    self.gone = true;
                }
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// A tick in shim mode at `now_ms`: adds a point of held memory per device and the rate.
    pub fn tick_shim(&mut self, now_ms: u64) {
        let records = self.tally.records;
        if let Some((ms, before)) = self.last {
            if now_ms > ms {
                self.rate = Some((records - before) as f64 * 1000.0 / (now_ms - ms) as f64);
            }
        }
        self.last = Some((now_ms, records));
        self.now_ms = Some(now_ms);
        let held: Vec<(u32, Bytes)> = self
            .tally
            .devices
            .iter()
            .map(|(&d, f)| (d, f.held))
            .collect();
        for (device, bytes) in held {
            self.push_point(device, now_ms, Some(bytes));
        }
    }

    /// A tick in NVML mode: the process's share of `sample` (or why it failed).
    pub fn tick_nvml(&mut self, now_ms: u64, sample: Result<Sample, String>) {
        self.now_ms = Some(now_ms);
        match sample {
            Ok(sample) => {
                self.error = None;
                let time = if sample.time_ms == 0 {
                    now_ms
                } else {
                    sample.time_ms
                };
                let pid = self.pid;
                for p in sample.processes.iter().filter(|p| p.pid == pid) {
                    self.push_point(p.device, time, p.used);
                }
            }
            Err(e) => self.error = Some(e),
        }
    }

    fn push_point(&mut self, device: u32, time: u64, bytes: Option<Bytes>) {
        let points = self.series.entry(device).or_default();
        points.push((time, bytes));
        if points.len() > SERIES_LEN {
            points.drain(..points.len() - SERIES_LEN);
        }
    }

    /// The most recent figure of each device's series.
    pub fn latest(&self, device: u32) -> Option<Bytes> {
        self.series.get(&device)?.last()?.1
    }

    /// Handles a key: `q` quits, Esc goes back (quits when the view stands alone).
    pub fn on_key(&mut self, key: Key) -> Flow {
        if let Some(flow) = crate::tui::help::dismiss(&mut self.help, key) {
            return flow;
        }
        match key {
            Key::Char('q') | Key::Esc | Key::Interrupt => Flow::Quit,
            Key::Char('?') => {
                self.help = true;
                Flow::Continue
            }
            _ => Flow::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_wire::{Kind, Record};

    fn alloc(ptr: u64, size: u64) -> Result<LiveEvent, String> {
        Ok(LiveEvent::Record(Record {
            ptr,
            size,
            device: 0,
            ..Record::new(Kind::Alloc)
        }))
    }

    #[test]
    fn ticks_record_held_memory_and_the_event_rate_and_the_end_marks_the_process_gone() {
        let mut s = AttachState::new(7, None, Mode::Shim);
        s.apply(alloc(0x1000, 100));
        s.tick_shim(1000);
        assert_eq!(s.rate, None, "no rate before two ticks");
        s.apply(alloc(0x2000, 50));
        s.apply(alloc(0x3000, 25));
        s.tick_shim(1500);
        assert_eq!(s.rate, Some(4.0));
        assert_eq!(
            s.series.get(&0).cloned(),
            Some(vec![(1000, Some(Bytes(100))), (1500, Some(Bytes(175)))])
        );
        assert!(!s.gone);
        s.apply(Ok(LiveEvent::End { dropped: 3 }));
        assert!(s.gone);
        assert_eq!(s.tally.dropped, Some(3));
        assert_eq!(s.latest(0), Some(Bytes(175)), "the last state stays");
    }
}
