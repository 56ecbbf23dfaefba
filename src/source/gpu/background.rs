//! A sampler on a thread of its own, for dashboards: `sample()` answers at once with the latest
//! result, so a driver call that hangs (a GPU falling off the bus, a driver reset) cannot
//! freeze the screen or stop `q` and Ctrl-C from working.

use super::{GpuSampler, Sample, SampleError};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long the first `sample()` waits for the first result.
const FIRST_WAIT: Duration = Duration::from_secs(5);

/// Samples `inner` every `interval` on a thread; `sample()` returns the newest result.
pub struct Background {
    results: Receiver<Result<Sample, SampleError>>,
    latest: Option<Result<Sample, String>>,
    /// When the newest result arrived.
    fresh_at: Instant,
    interval: Duration,
    describe: String,
}

impl Background {
    /// Starts sampling `inner` every `interval`. The thread ends when this is dropped (at its
    /// next send) or when the sampler is exhausted.
    pub fn start(mut inner: Box<dyn GpuSampler + Send>, interval: Duration) -> Background {
        let describe = inner.describe();
        let (tx, results) = channel();
        std::thread::spawn(move || loop {
            let result = inner.sample();
            let exhausted = matches!(result, Err(SampleError::Exhausted));
            if tx.send(result).is_err() || exhausted {
                return;
            }
            std::thread::sleep(interval);
        });
        Background {
            results,
            latest: None,
            fresh_at: Instant::now(),
            interval,
            describe,
        }
    }

    /// Takes every result that arrived; waits up to `wait` for one when there is none yet.
    fn collect(&mut self, wait: Duration) {
        if self.latest.is_none() {
            match self.results.recv_timeout(wait) {
                Ok(result) => self.keep(result),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
        while let Ok(result) = self.results.try_recv() {
            self.keep(result);
        }
    }

    fn keep(&mut self, result: Result<Sample, SampleError>) {
        self.latest = Some(result.map_err(|e| e.to_string()));
        self.fresh_at = Instant::now();
    }
}

impl GpuSampler for Background {
    fn sample(&mut self) -> Result<Sample, SampleError> {
        self.collect(FIRST_WAIT);
        let silent = self.fresh_at.elapsed();
        // A result older than a few intervals means the sampler is stuck in a call.
        let stale_after = (self.interval * 3).max(Duration::from_secs(2));
        match &self.latest {
            None => Err(SampleError::Stalled {
                seconds: silent.as_secs(),
            }),
            Some(_) if silent > stale_after => Err(SampleError::Stalled {
                seconds: silent.as_secs(),
            }),
            Some(Ok(sample)) => Ok(sample.clone()),
            Some(Err(message)) => Err(SampleError::Nvml {
                call: "sample",
                message: message.clone(),
            }),
        }
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::Sender;

    /// Answers once, then blocks until the test lets it go.
    struct Hangs {
        answered: bool,
        gate: Receiver<()>,
        _keep: Option<Sender<()>>,
    }

    impl GpuSampler for Hangs {
        fn sample(&mut self) -> Result<Sample, SampleError> {
            if !self.answered {
                self.answered = true;
                return Ok(Sample {
                    time_ms: 7,
                    ..Sample::default()
                });
            }
            let _ = self.gate.recv();
            Err(SampleError::Exhausted)
        }

        fn describe(&self) -> String {
            "hangs".to_owned()
        }
    }

    #[test]
    fn a_hung_sampler_never_blocks_the_caller() {
        let (release, gate) = channel();
        let inner = Hangs {
            answered: false,
            gate,
            _keep: None,
        };
        let mut sampler = Background::start(Box::new(inner), Duration::from_millis(10));
        assert_eq!(sampler.sample().map(|s| s.time_ms).ok(), Some(7));
        // The thread now hangs in its second sample; answers stay immediate, then say so.
        let started = Instant::now();
        let mut stalled = false;
        while started.elapsed() < Duration::from_secs(4) {
            let at = Instant::now();
            let result = sampler.sample();
            assert!(at.elapsed() < Duration::from_millis(100), "sample() waited");
            if matches!(result, Err(SampleError::Stalled { .. })) {
                stalled = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(stalled, "a stuck sampler is reported");
        drop(release);
    }
}
