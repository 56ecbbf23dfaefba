//! Sequence packing for fine-tuning: padding waste of pad-to-max, of length bucketing (with
//! recommended bucket edges) and of packing into `max_len` bins (first-fit decreasing and
//! best-fit decreasing, the better kept), against the lower bound `ceil(tokens / max_len)`.
//! `reference/planner-math.md` §4.

mod bins;
mod buckets;
mod lengths;

pub use bins::{best_fit_decreasing, first_fit_decreasing};
pub use buckets::{bucket_edges, Bucketing};
pub use lengths::{parse_lengths, LengthsError};

use super::activations::{activation_memory, ActivationSettings};
use super::model::ModelConfig;

/// Longest `max_len` planned for (the packer keeps a count per length).
pub const MAX_LEN: u64 = 1 << 26;

/// Most sequences per micro-batch accepted.
pub const MAX_MICRO_BATCH: u64 = 1 << 20;

/// What to plan for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackSettings {
    pub max_len: u64,
    /// Sequences (or packed bins) per micro-batch.
    pub micro_batch: u64,
    /// Buckets to recommend edges for.
    pub buckets: usize,
}

/// Pad-to-max: every sequence padded to `max_len`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Padded {
    pub batches: u64,
    pub padding_fraction: f64,
}

/// Packing into bins of `max_len` tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Packed {
    pub bins: u64,
    pub batches: u64,
    pub padding_fraction: f64,
    pub efficiency: f64,
    /// The heuristic that gave these bins.
    pub algorithm: &'static str,
}

/// The whole comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct PackReport {
    pub sequences: u64,
    /// Tokens after truncating sequences longer than `max_len`.
    pub tokens: u64,
    /// Sequences longer than `max_len` (counted at `max_len`).
    pub truncated: u64,
    pub padded: Padded,
    pub bucketed: Bucketing,
    pub packed: Packed,
    pub lower_bound_bins: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PackError {
    #[error("--max-len and --micro-batch must be at least 1")]
    Zero,
    #[error("--max-len {0} is too large (at most {MAX_LEN})")]
    TooLong(u64),
    #[error("--micro-batch {0} is too large (at most {MAX_MICRO_BATCH})")]
    MicroBatch(u64),
    #[error("no sequences in the lengths file")]
    Empty,
}

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Compares padding, bucketing and packing for `lengths`.
pub fn plan_packing(lengths: &[u64], s: &PackSettings) -> Result<PackReport, PackError> {
    if s.max_len == 0 || s.micro_batch == 0 {
        return Err(PackError::Zero);
    }
    if s.micro_batch > MAX_MICRO_BATCH {
        return Err(PackError::MicroBatch(s.micro_batch));
    }
    if s.max_len > MAX_LEN {
        return Err(PackError::TooLong(s.max_len));
    }
    if lengths.is_empty() {
        return Err(PackError::Empty);
    }
    let n = lengths.len() as u64;
    let clipped: Vec<u32> = lengths.iter().map(|&l| l.min(s.max_len) as u32).collect();
    let truncated = lengths.iter().filter(|&&l| l > s.max_len).count() as u64;
    let tokens: u64 = clipped.iter().map(|&l| u64::from(l)).sum();
    let max_len = s.max_len as u32;
    let padded = Padded {
        batches: n.div_ceil(s.micro_batch),
        padding_fraction: 1.0 - fraction(tokens, n * s.max_len),
    };
    let bucketed = bucket_edges(&clipped, max_len, s.buckets.max(1), s.micro_batch);
    let ffd = first_fit_decreasing(&clipped, max_len);
    let bfd = best_fit_decreasing(&clipped, max_len);
    let (bins, algorithm) = if bfd < ffd {
        (bfd, "best-fit decreasing")
    } else {
        (ffd, "first-fit decreasing")
    };
    let efficiency = fraction(tokens, bins * s.max_len);
    Ok(PackReport {
        sequences: n,
        tokens,
        truncated,
        padded,
        bucketed,
        packed: Packed {
            bins,
            batches: bins.div_ceil(s.micro_batch),
            padding_fraction: 1.0 - efficiency,
            efficiency,
            algorithm,
        },
        lower_bound_bins: tokens.div_ceil(s.max_len),
    })
}

/// Activation bytes of one micro-batch of `micro_batch` rows of `seq` tokens on one GPU
/// (bf16, flash or varlen attention, no recompute, no model parallelism): what a packed,
/// padded or bucketed micro-batch costs.
pub fn micro_batch_activations(model: &ModelConfig, seq: u64, micro_batch: u64) -> u64 {
    let settings = ActivationSettings::one_gpu(seq, micro_batch);
    activation_memory(model, &settings).total().round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_blog_flattening_example() {
        // HF blog "Packing with Flash Attention": lengths 4, 8, 5, 11 flatten to 28 tokens.
        let s = PackSettings {
            max_len: 28,
            micro_batch: 1,
            buckets: 2,
        };
        let r = plan_packing(&[4, 8, 5, 11], &s).expect("plans");
        assert_eq!(r.tokens, 28);
        assert_eq!((r.packed.bins, r.lower_bound_bins), (1, 1));
        assert_eq!(r.packed.padding_fraction, 0.0);
        assert_eq!(r.padded.padding_fraction, 1.0 - 28.0 / 112.0);
    }

    #[test]
    fn truncates_and_rejects() {
        let s = PackSettings {
            max_len: 10,
            micro_batch: 2,
            buckets: 4,
        };
        let r = plan_packing(&[15, 5, 5], &s).expect("plans");
        assert_eq!(
            (r.tokens, r.truncated, r.packed.bins, r.padded.batches),
            (20, 1, 2, 2)
        );
        assert_eq!(plan_packing(&[], &s), Err(PackError::Empty));
        let zero = PackSettings { max_len: 0, ..s };
        assert_eq!(plan_packing(&[1], &zero), Err(PackError::Zero));
    }
}
