//! Recorded samples: a reader that replays a JSON-lines recording (one `Sample` per line) as a
//! sampler, the writer that makes one, and a sampler that records another as it goes
//! (`memprof agent --record`), so a bug report can carry what NVML saw.

use super::{GpuSampler, Sample, SampleError};
use std::io::{BufRead, Write};

/// Replays a recording line by line; blank lines are skipped, the end is `Exhausted`.
pub struct Replay<R> {
    reader: R,
    name: String,
    line: usize,
    buffer: String,
}

impl<R: BufRead> Replay<R> {
    /// Replays `reader`; `name` (a file name) appears in error messages.
    pub fn new(reader: R, name: &str) -> Self {
        Self {
            reader,
            name: name.to_owned(),
            line: 0,
            buffer: String::new(),
        }
    }

    fn error(&self, message: String) -> SampleError {
        SampleError::Replay {
            source_name: self.name.clone(),
            line: self.line,
            message,
        }
    }
}

impl<R: BufRead> GpuSampler for Replay<R> {
    fn sample(&mut self) -> Result<Sample, SampleError> {
        loop {
            self.buffer.clear();
            self.line += 1;
            let read = self.reader.read_line(&mut self.buffer);
            match read {
                Ok(0) => return Err(SampleError::Exhausted),
                Ok(_) if self.buffer.trim().is_empty() => continue,
                Ok(_) => {
                    return serde_json::from_str(&self.buffer)
                        .map_err(|e| self.error(format!("not a sample: {e}")))
                }
                Err(e) => return Err(self.error(e.to_string())),
            }
        }
    }

    fn describe(&self) -> String {
        format!("replay of {}", self.name)
    }
}

/// Writes samples as a recording `Replay` reads back.
pub struct ReplayWriter<W> {
    writer: W,
}

impl<W: Write> ReplayWriter<W> {
    pub fn new(writer: W) -> Self {
        Self { writer }
    }

    /// Appends one sample as one line.
    pub fn write(&mut self, sample: &Sample) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.writer, sample)?;
        self.writer.write_all(b"\n")
    }

    /// Flushes and hands back the writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.writer.flush()?;
        Ok(self.writer)
    }
}

/// Passes another sampler's samples through and appends each to a recording. A sample that
/// cannot be written is an error (`Replay`, naming the recording and the line).
pub struct Recorder<S, W> {
    inner: S,
    writer: ReplayWriter<W>,
    name: String,
    lines: usize,
}

impl<S: GpuSampler, W: Write> Recorder<S, W> {
    /// Records `inner` into `writer`; `name` (a file name) appears in error messages.
    pub fn new(inner: S, writer: W, name: &str) -> Self {
        Self {
            inner,
            writer: ReplayWriter::new(writer),
            name: name.to_owned(),
            lines: 0,
        }
    }
}

impl<S: GpuSampler, W: Write> GpuSampler for Recorder<S, W> {
    fn sample(&mut self) -> Result<Sample, SampleError> {
        let sample = self.inner.sample()?;
        self.lines += 1;
        self.writer
            .write(&sample)
            .map_err(|e| SampleError::Replay {
                source_name: self.name.clone(),
                line: self.lines,
                message: format!("cannot write the recording: {e}"),
            })?;
        Ok(sample)
    }

    fn describe(&self) -> String {
        format!("{}, recorded to {}", self.inner.describe(), self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Bytes;
    use crate::source::gpu::{DeviceSample, ProcessSample};

    fn sample(time_ms: u64, used: Option<u64>) -> Sample {
        Sample {
            time_ms,
            devices: vec![DeviceSample {
                index: 0,
                name: Some("NVIDIA H100 80GB HBM3".into()),
                total: Some(Bytes(80 << 30)),
                used: used.map(Bytes),
                ..DeviceSample::default()
            }],
            processes: vec![ProcessSample {
                pid: 7,
                device: 0,
                used: used.map(Bytes),
                command: Some("python train.py".into()),
            }],
        }
    }

    #[test]
    fn a_recording_replays_what_was_written() {
        let samples = [sample(1, Some(1 << 30)), sample(2, None)];
        let mut writer = ReplayWriter::new(Vec::new());
        for s in &samples {
            writer.write(s).expect("write to memory");
        }
        let bytes = writer.finish().expect("flush");
        let mut replay = Replay::new(bytes.as_slice(), "run.jsonl");
        assert_eq!(replay.sample().ok().as_ref(), Some(&samples[0]));
        assert_eq!(replay.sample().ok().as_ref(), Some(&samples[1]));
        assert!(matches!(replay.sample(), Err(SampleError::Exhausted)));
        assert_eq!(replay.describe(), "replay of run.jsonl");
    }

    #[test]
    fn a_recorder_passes_samples_through_and_writes_them() {
        let samples = vec![sample(1, Some(5)), sample(2, Some(6))];
        let mut recorder = Recorder::new(
            crate::source::gpu::Scripted::once(samples.clone()),
            Vec::new(),
            "out.jsonl",
        );
        assert_eq!(recorder.sample().ok().as_ref(), Some(&samples[0]));
        assert_eq!(recorder.sample().ok().as_ref(), Some(&samples[1]));
        assert!(matches!(recorder.sample(), Err(SampleError::Exhausted)));
        assert_eq!(recorder.describe(), "scripted, recorded to out.jsonl");
        let bytes = recorder.writer.finish().expect("flush");
        let mut replay = Replay::new(bytes.as_slice(), "out.jsonl");
        assert_eq!(replay.sample().ok(), Some(samples[0].clone()));
        assert_eq!(replay.sample().ok(), Some(samples[1].clone()));
    }

    #[test]
    fn a_bad_line_names_its_number() {
        let text = "{\"time_ms\":1,\"devices\":[],\"processes\":[]}\n\n{\"time_ms\":\"x\"}\n";
        let mut replay = Replay::new(text.as_bytes(), "bug.jsonl");
        assert!(replay.sample().is_ok());
        match replay.sample() {
            Err(SampleError::Replay {
                source_name, line, ..
            }) => assert_eq!((source_name.as_str(), line), ("bug.jsonl", 3)),
            other => panic!("expected a replay error, got {other:?}"),
        }
    }
}
