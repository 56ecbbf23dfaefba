//! Calibrating `plan train`'s activation estimate from a short run's snapshot: the most a step
//! holds at once of what it gives back before the trace ends (its activations; weights and
//! optimizer states stay) against the formula for the measured configuration, fitted as one
//! coefficient on the per-layer terms and applied to the target's.

use super::activations::{activation_memory, ActivationMemory, ActivationSettings, Recompute};
use super::model::ModelConfig;
use super::train::{activation_settings, Candidate, TrainSetup};
use crate::model::{Action, Snapshot};
use serde::Serialize;
use std::collections::HashMap;

/// What the trace of one device shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measured {
    pub device: u32,
    /// The most bytes live at once of blocks the trace frees.
    pub step_bytes: u64,
    /// Trace entries read.
    pub entries: usize,
}

/// Why a snapshot cannot calibrate the estimate.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CalibrateError {
    #[error("holds no allocation trace (record with torch.cuda.memory._record_memory_history)")]
    NoTrace,
    #[error(
        "the most its trace holds at once of what it frees is {measured} bytes, no more than the \
         formula's embedding and LM head alone ({head:.0} bytes): not a training step of the \
         measured configuration"
    )]
    TooSmall { measured: u64, head: f64 },
    #[error(
        "its trace frees nothing it allocates: record at least one whole training step \
         (forward, backward and optimizer)"
    )]
    NothingFreed,
    #[error("no candidate to calibrate")]
    NoCandidate,
}

/// The most bytes live at once, on the device with the longest trace, of blocks that the
/// trace also frees: a step's activations at their peak, while weights and optimizer states,
/// which stay, do not count. Blocks count from `alloc` to `free_completed`, as PyTorch's active
/// figure does; blocks from before the trace are not known and not counted.
pub fn measure(snapshot: &Snapshot) -> Result<Measured, CalibrateError> {
    let device = (0..snapshot.timeline.device_count())
        .max_by_key(|&d| (snapshot.timeline.device(d).len(), std::cmp::Reverse(d)))
        .filter(|&d| !snapshot.timeline.device(d).is_empty())
        .ok_or(CalibrateError::NoTrace)?;
    let entries = snapshot.timeline.device(device);
    // Which allocations the trace frees: the alloc entry each free_completed closes.
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut freed = vec![false; entries.len()];
    let mut closes = vec![None; entries.len()];
    for (i, e) in entries.iter().enumerate() {
        match (e.action(), e.addr()) {
            (Action::Alloc, Some(a)) => {
                open.insert(a, i);
            }
            (Action::FreeCompleted, Some(a)) => {
                if let Some(at) = open.remove(&a) {
                    freed[at] = true;
                    closes[i] = Some(at);
                }
            }
            _ => {}
        }
    }
    let (mut live, mut most) = (0u64, 0u64);
    for (i, e) in entries.iter().enumerate() {
        match e.action() {
            Action::Alloc if freed[i] => live += e.size,
            // The size the alloc added: a free entry naming another size (a damaged trace)
            // does not take more than that away.
            Action::FreeCompleted => match closes[i] {
                Some(at) => live -= entries[at].size,
                None => continue,
            },
            _ => continue,
        }
        most = most.max(live);
    }
    if most == 0 {
        return Err(CalibrateError::NothingFreed);
    }
    Ok(Measured {
        device: device as u32,
        step_bytes: most,
        entries: entries.len(),
    })
}

/// The formula against the measurement for the measured configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    pub measured_bytes: u64,
    /// memprof's activations for the measured configuration.
    pub formula_bytes: f64,
    /// Its embedding and LM head share, kept as the formula gives it.
    pub head_bytes: f64,
    /// Its per-layer share (layers, shapes, the layer rebuilt in backward, autocast's copies of
    /// the weights), which the coefficient scales.
    pub layers_bytes: f64,
    /// Measured per-layer share over the formula's.
    pub coefficient: f64,
}

impl Calibration {
    /// `activations` with its per-layer share scaled by the coefficient.
    pub fn apply(&self, activations: &ActivationMemory) -> f64 {
        activations.head() + self.coefficient * per_layer_share(activations)
    }
}

fn per_layer_share(a: &ActivationMemory) -> f64 {
    a.layers + a.shape + a.recompute_peak + a.weight_casts
}

/// Fits the coefficient: the measured step less the formula's head, over the formula's
/// per-layer share, for `model` run with `settings`.
pub fn fit(
    model: &ModelConfig,
    settings: &ActivationSettings,
    measured_bytes: u64,
) -> Result<Calibration, CalibrateError> {
    let formula = activation_memory(model, settings);
    let head = formula.head();
    let layers = per_layer_share(&formula);
    let measured = measured_bytes as f64;
    if measured <= head || layers <= 0.0 {
        return Err(CalibrateError::TooSmall {
            measured: measured_bytes,
            head,
        });
    }
    Ok(Calibration {
        measured_bytes,
        formula_bytes: formula.total(),
        head_bytes: head,
        layers_bytes: layers,
        coefficient: (measured - head) / layers,
    })
}

/// A candidate's estimate with its per-layer activations calibrated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Calibrated {
    /// The candidate's activations by the formula.
    pub formula_activations: u64,
    pub activations: u64,
    /// The estimate with the calibrated activations.
    pub total: u64,
    /// With the headroom.
    pub required: u64,
    pub fits: bool,
}

/// Applies `calibration` to candidate `c` of `setup`.
pub fn apply_to(setup: &TrainSetup, c: &Candidate, calibration: &Calibration) -> Calibrated {
    let formula = activation_memory(&setup.model, &activation_settings(setup, &c.layout));
    let activations = calibration.apply(&formula).max(0.0).round() as u64;
    let formula_activations = c.memory.activations();
    let total = c.memory.total - formula_activations + activations;
    let required = total.saturating_add(setup.headroom.bytes_for(total, c.layout.gpus()).total());
    Calibrated {
        formula_activations,
        activations,
        total,
        required,
        fits: required <= setup.gpu_memory,
    }
}

/// The calibration as `plan train` reports it: the measured configuration's formula against
/// the measurement, then the listed candidate calibrated.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CalibrationReport {
    pub device: u32,
    pub trace_entries: usize,
    pub measured_model: String,
    pub measured_seq_len: u64,
    pub measured_micro_batch: u64,
    pub measured_recompute: Recompute,
    pub measured_bytes: u64,
    pub formula_bytes: u64,
    pub formula_head_bytes: u64,
    pub formula_layers_bytes: u64,
    pub coefficient: f64,
    /// Index of the candidate calibrated (the first listed).
    pub candidate: usize,
    pub formula_activations_bytes: u64,
    pub calibrated_activations_bytes: u64,
    pub calibrated_total_bytes: u64,
    pub calibrated_required_bytes: u64,
    pub gpu_memory_bytes: u64,
    pub fits: bool,
}

/// The measured run: its model and sizes; the rest as the target's first candidate (one GPU,
/// the same precision, attention and recompute).
pub struct MeasuredRun<'a> {
    pub model: &'a ModelConfig,
    pub seq_len: u64,
    pub micro_batch: u64,
}

/// Measures `snapshot`, fits the coefficient for `run` and applies it to `candidate` of
/// `setup`.
pub fn calibrate(
    snapshot: &Snapshot,
    run: &MeasuredRun,
    setup: &TrainSetup,
    candidates: &[Candidate],
) -> Result<CalibrationReport, CalibrateError> {
    let measured = measure(snapshot)?;
    let first = candidates.first().ok_or(CalibrateError::NoCandidate)?;
    let settings = ActivationSettings {
        seq_len: run.seq_len,
        micro_batch: run.micro_batch,
        tp: 1,
        sp: false,
        cp: 1,
        pp: 1,
        micro_batches: 1,
        ..activation_settings(setup, &first.layout)
    };
    let calibration = fit(run.model, &settings, measured.step_bytes)?;
    let target = apply_to(setup, first, &calibration);
    let round = |x: f64| x.max(0.0).round() as u64;
    Ok(CalibrationReport {
        device: measured.device,
        trace_entries: measured.entries,
        measured_model: run.model.name.clone(),
        measured_seq_len: run.seq_len,
        measured_micro_batch: run.micro_batch,
        measured_recompute: settings.recompute,
        measured_bytes: measured.step_bytes,
        formula_bytes: round(calibration.formula_bytes),
        formula_head_bytes: round(calibration.head_bytes),
        formula_layers_bytes: round(calibration.layers_bytes),
        coefficient: calibration.coefficient,
        candidate: 0,
        formula_activations_bytes: target.formula_activations,
        calibrated_activations_bytes: target.activations,
        calibrated_total_bytes: target.total,
        calibrated_required_bytes: target.required,
        gpu_memory_bytes: setup.gpu_memory,
        fits: target.fits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SnapshotFormat, StackTable, StreamIndex, Timeline, TraceEntry};
    use crate::plan::builtin;

    fn settings(seq: u64, b: u64) -> ActivationSettings {
        ActivationSettings::one_gpu(seq, b)
    }

    /// A step as a trace: weights already there, then `layers` blocks of `per_layer` bytes kept
    /// for backward, a head of `head` bytes, a transient at the peak, then everything freed.
    fn step_snapshot(layers: u64, per_layer: u64, head: u64) -> Snapshot {
        let s = StreamIndex(0);
        let mut entries = Vec::new();
        let mut addr = 0x1000_0000u64;
        let mut live = Vec::new();
        let mut alloc = |size: u64, entries: &mut Vec<TraceEntry>, live: &mut Vec<(u64, u64)>| {
            entries.push(TraceEntry::new(Action::Alloc, Some(addr), size, s));
            live.push((addr, size));
            addr += size.next_multiple_of(512);
        };
        // Gradients of the previous step, freed before this one starts: the low point.
        alloc(3 << 20, &mut entries, &mut live);
        let (a, size) = live.pop().expect("one");
        entries.push(TraceEntry::new(Action::FreeRequested, Some(a), size, s));
        entries.push(TraceEntry::new(Action::FreeCompleted, Some(a), size, s));
        for _ in 0..layers {
            alloc(per_layer, &mut entries, &mut live);
        }
        alloc(head, &mut entries, &mut live);
        for (a, size) in live.drain(..).rev() {
            entries.push(TraceEntry::new(Action::FreeCompleted, Some(a), size, s));
        }
        let n = entries.len();
        Snapshot {
            format: SnapshotFormat::Modern,
            segments: Vec::new(),
            timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
            stacks: StackTable::default(),
            settings: None,
            annotations: Vec::new(),
        }
    }

    /// A generated step whose layers keep 1.3 times the formula's per-layer bytes and whose
    /// head is the formula's: the fit finds 1.3, and the target's per-layer share scales by it.
    #[test]
    fn recovers_a_known_per_layer_coefficient() {
        let model = builtin::find("llama-3.1-8b").expect("built-in");
        let small = settings(1024, 1);
        let formula = activation_memory(&model, &small);
        let per_layer = (1.3 * per_layer_share(&formula) / model.layers as f64).round() as u64;
        let snapshot = step_snapshot(model.layers, per_layer, formula.head().round() as u64);
        let measured = measure(&snapshot).expect("a trace");
        assert_eq!(measured.device, 0);
        let expected = per_layer * model.layers + formula.head().round() as u64;
        assert_eq!(measured.step_bytes, expected);
        let c = fit(&model, &small, measured.step_bytes).expect("fits");
        assert!((c.coefficient - 1.3).abs() < 1e-6, "{}", c.coefficient);

        let target = activation_memory(&model, &settings(8192, 2));
        let calibrated = c.apply(&target);
        let want = target.head() + 1.3 * per_layer_share(&target);
        assert!((calibrated - want).abs() <= want * 1e-6);
    }

    #[test]
    fn a_step_smaller_than_the_head_is_refused() {
        let model = builtin::find("llama-3.1-8b").expect("built-in");
        let err = fit(&model, &settings(1024, 1), 1 << 20).expect_err("too small");
        assert!(matches!(err, CalibrateError::TooSmall { .. }));
        let empty = Snapshot {
            format: SnapshotFormat::Modern,
            segments: Vec::new(),
            timeline: Timeline::new(Vec::new(), std::iter::once(0..0).collect()),
            stacks: StackTable::default(),
            settings: None,
            annotations: Vec::new(),
        };
        assert_eq!(measure(&empty), Err(CalibrateError::NoTrace));
    }

    /// A trace whose free names a larger size than its alloc (a damaged file) neither panics
    /// nor wraps around: the free takes away what the alloc added. A trace that frees nothing
    /// says so, not that it has no trace.
    #[test]
    fn a_free_of_another_size_and_a_trace_that_frees_nothing() {
        let s = StreamIndex(0);
        let of = |entries: Vec<TraceEntry>| {
            let n = entries.len();
            Snapshot {
                format: SnapshotFormat::Modern,
                segments: Vec::new(),
                timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
                stacks: StackTable::default(),
                settings: None,
                annotations: Vec::new(),
            }
        };
        let damaged = of(vec![
            TraceEntry::new(Action::Alloc, Some(0x1000), 512, s),
            TraceEntry::new(Action::FreeCompleted, Some(0x1000), 4096, s),
            TraceEntry::new(Action::Alloc, Some(0x2000), 1024, s),
            TraceEntry::new(Action::FreeCompleted, Some(0x2000), 1024, s),
        ]);
        assert_eq!(measure(&damaged).expect("measured").step_bytes, 1024);
        let kept = of(vec![TraceEntry::new(Action::Alloc, Some(0x1000), 512, s)]);
        assert_eq!(measure(&kept), Err(CalibrateError::NothingFreed));
    }
}
