//! The live view's feed from an attached agent: a thread of its own asks for PyTorch's figures
//! every interval (and samples NVML beside them), so a slow request never freezes the screen;
//! dropping the feed ends the thread, which detaches from the job.

use super::figures::{add_nvml, from_answer, TorchDevice};
use super::session::Session;
use crate::source::gpu::GpuSampler;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The figures of one request, or why it failed.
pub type Figures = Result<Vec<TorchDevice>, String>;

pub struct TorchFeed {
    rx: Receiver<Figures>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// "Python 3.11, torch 2.5.0" for the header.
    pub describe: String,
}

impl TorchFeed {
    pub fn start(
        mut session: Session,
        mut nvml: Option<Box<dyn GpuSampler + Send>>,
        interval: Duration,
    ) -> TorchFeed {
        let describe = format!(
            "PyTorch {} in Python {}{}",
            session.hello.torch.as_deref().unwrap_or("?"),
            session.hello.python,
            if nvml.is_some() { ", NVML beside" } else { "" }
        );
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let pid = session.pid();
            while !stopped.load(Ordering::Relaxed) {
                let start = Instant::now();
                let figures = session.request(json!({"cmd": "stats"})).map(|answer| {
                    let mut devices = from_answer(&answer);
                    if let Some(sample) = nvml.as_mut().and_then(|s| s.sample().ok()) {
                        add_nvml(&mut devices, pid, &sample);
                    }
                    devices
                });
                let failed = figures.is_err();
                if tx.send(figures).is_err() || failed {
                    break;
                }
                while start.elapsed() < interval && !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = session.detach();
        });
        TorchFeed {
            rx,
            stop,
            thread: Some(thread),
            describe,
        }
    }

    /// The newest figures since the last call, if any came.
    pub fn latest(&self) -> Option<Figures> {
        self.rx.try_iter().last()
    }
}

impl Drop for TorchFeed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
