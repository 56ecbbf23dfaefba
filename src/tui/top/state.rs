//! What `top` shows: the latest sample, its processes sorted by device memory, the selected
//! row, the help overlay and a status message; and how keys and samples change it. Pure.

use crate::source::gpu::{ProcessSample, Sample};
use crate::tui::keys::Key;
use crate::tui::Flow;

/// The dashboard state of `top`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopState {
    /// The latest sample, its processes sorted by memory (most first, unknown last).
    pub sample: Option<Sample>,
    /// Why the latest sample failed, when it did (the previous one stays shown).
    pub error: Option<String>,
    /// Selected row of the process table.
    pub selected: usize,
    pub help: bool,
    pub message: Option<String>,
    /// Whether the processes of the latest sample run the shim, by PID (sorted), for those
    /// that could be told; `None` when not looked up.
    pub shims: Option<Vec<(u32, bool)>>,
}

impl TopState {
    /// Takes a new sample: sorts its processes and keeps the selection on the same PID.
    pub fn update(&mut self, sample: Result<Sample, String>) {
        match sample {
            Ok(mut sample) => {
                let pid = self.selected_process().map(|p| (p.pid, p.device));
                sort_processes(&mut sample.processes);
                if let Some(at) = pid.and_then(|(pid, device)| {
                    sample
                        .processes
                        .iter()
                        .position(|p| p.pid == pid && p.device == device)
                }) {
                    self.selected = at;
                }
                self.selected = self.selected.min(sample.processes.len().saturating_sub(1));
                self.sample = Some(sample);
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// Whether `pid` runs the shim: `None` when unknown.
    pub fn has_shim(&self, pid: u32) -> Option<bool> {
        let shims = self.shims.as_ref()?;
        let at = shims.binary_search_by_key(&pid, |k| k.0).ok()?;
        Some(shims[at].1)
    }

    /// The process on the selected row.
    pub fn selected_process(&self) -> Option<&ProcessSample> {
        self.sample.as_ref()?.processes.get(self.selected)
    }

    /// Handles a key.
    pub fn on_key(&mut self, key: Key) -> Flow {
        self.message = None;
        if let Some(flow) = crate::tui::help::dismiss(&mut self.help, key) {
            return flow;
        }
        let rows = self.sample.as_ref().map_or(0, |s| s.processes.len());
        match key {
            Key::Char('q') | Key::Interrupt => return Flow::Quit,
            Key::Char('?') => self.help = true,
            Key::Up | Key::Char('k') => self.selected = self.selected.saturating_sub(1),
            Key::Down | Key::Char('j') => {
                self.selected = (self.selected + 1).min(rows.saturating_sub(1))
            }
            Key::Home | Key::Char('g') => self.selected = 0,
            Key::End | Key::Char('G') => self.selected = rows.saturating_sub(1),
            Key::Enter if self.selected_process().is_none() => {
                self.message = Some("no process selected".into())
            }
            _ => {}
        }
        Flow::Continue
    }
}

/// Most memory first; processes whose memory is unknown last; ties by device, then PID.
fn sort_processes(processes: &mut [ProcessSample]) {
    processes.sort_by(|a, b| {
        b.used
            .cmp(&a.used)
            .then(a.device.cmp(&b.device))
            .then(a.pid.cmp(&b.pid))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Bytes;

    fn process(pid: u32, used: Option<u64>) -> ProcessSample {
        ProcessSample {
            pid,
            used: used.map(Bytes),
            ..ProcessSample::default()
        }
    }

    fn sample(processes: Vec<ProcessSample>) -> Sample {
        Sample {
            processes,
            ..Sample::default()
        }
    }

    #[test]
    fn sorts_by_memory_unknown_last_and_keeps_the_selected_pid() {
        let mut s = TopState::default();
        s.update(Ok(sample(vec![
            process(1, Some(10)),
            process(2, None),
            process(3, Some(30)),
        ])));
        let pids = |s: &TopState| -> Vec<u32> {
            s.sample
                .iter()
                .flat_map(|x| &x.processes)
                .map(|p| p.pid)
                .collect()
        };
        assert_eq!(pids(&s), [3, 1, 2]);
        s.on_key(Key::Down);
        assert_eq!(s.selected_process().map(|p| p.pid), Some(1));
        s.update(Ok(sample(vec![process(1, Some(50)), process(3, Some(30))])));
        assert_eq!(pids(&s), [1, 3]);
        assert_eq!(
            s.selected_process().map(|p| p.pid),
            Some(1),
            "follows the PID"
        );
        s.update(Err("NVML call failed".into()));
        assert_eq!(pids(&s), [1, 3], "the last good sample stays");
        assert!(s.error.is_some());
    }

    #[test]
    fn enter_without_a_process_says_so_and_q_quits() {
        let mut s = TopState::default();
        s.update(Ok(sample(Vec::new())));
        s.on_key(Key::Enter);
        assert_eq!(s.message.as_deref(), Some("no process selected"));
        s.update(Ok(sample(vec![process(42, Some(1))])));
        s.on_key(Key::Down);
        assert_eq!(s.selected, 0);
        assert_eq!(s.on_key(Key::Char('q')), Flow::Quit);
    }
}
