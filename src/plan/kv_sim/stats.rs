//! What a pool simulation measures, step by step, and its summary.

/// The pool at one decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub step: u64,
    pub running: u64,
    pub waiting: u64,
    /// Tokens whose K and V are stored (a shared prefix counted once).
    pub used_tokens: u64,
    /// Token slots allocated or reserved.
    pub allocated_tokens: u64,
}

/// Summary of a simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    /// Decode steps until the last request finished (idle gaps skipped).
    pub steps: u64,
    pub completed: u64,
    /// Requests that can never fit the pool.
    pub rejected: u64,
    pub preemptions: u64,
    pub mean_running: f64,
    pub max_running: u64,
    /// Stored tokens over allocated slots, over all busy steps.
    pub utilization: f64,
    pub peak_allocated_tokens: u64,
    /// At most `SERIES_POINTS` samples, evenly spaced.
    pub series: Vec<Sample>,
}

/// Most samples kept for the concurrency-over-time series.
pub const SERIES_POINTS: usize = 100;

/// Accumulates samples.
#[derive(Default)]
pub struct Tracker {
    samples: Vec<Sample>,
    pub completed: u64,
    pub rejected: u64,
    pub preemptions: u64,
}

impl Tracker {
    pub fn record(&mut self, sample: Sample) {
        self.samples.push(sample);
    }

    pub fn finish(self) -> SimResult {
        let n = self.samples.len();
        let used: u128 = self.samples.iter().map(|s| u128::from(s.used_tokens)).sum();
        let allocated: u128 = self
            .samples
            .iter()
            .map(|s| u128::from(s.allocated_tokens))
            .sum();
        let running: u64 = self.samples.iter().map(|s| s.running).sum();
        let stride = n.div_ceil(SERIES_POINTS).max(1);
        SimResult {
            steps: n as u64,
            completed: self.completed,
            rejected: self.rejected,
            preemptions: self.preemptions,
            mean_running: if n == 0 {
                0.0
            } else {
                running as f64 / n as f64
            },
            max_running: self.samples.iter().map(|s| s.running).max().unwrap_or(0),
            utilization: if allocated == 0 {
                0.0
            } else {
                used as f64 / allocated as f64
            },
            peak_allocated_tokens: self
                .samples
                .iter()
                .map(|s| s.allocated_tokens)
                .max()
                .unwrap_or(0),
            series: self.samples.iter().step_by(stride).copied().collect(),
        }
    }
}
