//! The scripted fake sampler: hands out a fixed list of samples, for tests and demos.

use super::{GpuSampler, Sample, SampleError};

/// Returns its samples in order, then repeats the last one (a steady machine), or, with
/// `once`, reports `Exhausted`.
#[derive(Clone, Debug)]
pub struct Scripted {
    samples: Vec<Sample>,
    next: usize,
    repeat_last: bool,
}

impl Scripted {
    /// Samples in order, then the last one again and again.
    pub fn new(samples: Vec<Sample>) -> Self {
        Self {
            samples,
            next: 0,
            repeat_last: true,
        }
    }

    /// Samples in order, then `SampleError::Exhausted`.
    pub fn once(samples: Vec<Sample>) -> Self {
        Self {
            repeat_last: false,
            ..Self::new(samples)
        }
    }
}

impl GpuSampler for Scripted {
    fn sample(&mut self) -> Result<Sample, SampleError> {
        let index = if self.next < self.samples.len() {
            self.next += 1;
            self.next - 1
        } else if self.repeat_last && !self.samples.is_empty() {
            self.samples.len() - 1
        } else {
            return Err(SampleError::Exhausted);
        };
        Ok(self.samples[index].clone())
    }

    fn describe(&self) -> String {
        "scripted".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time_ms: u64) -> Sample {
        Sample {
            time_ms,
            ..Sample::default()
        }
    }

    #[test]
    fn repeats_the_last_sample_or_stops() {
        let mut steady = Scripted::new(vec![at(1), at(2)]);
        let times: Vec<u64> = (0..4)
            .map(|_| steady.sample().map(|s| s.time_ms).unwrap_or(0))
            .collect();
        assert_eq!(times, [1, 2, 2, 2]);
        let mut once = Scripted::once(vec![at(1)]);
        assert!(once.sample().is_ok());
        assert!(matches!(once.sample(), Err(SampleError::Exhausted)));
    }
}
