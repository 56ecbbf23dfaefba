//! Which shared library asked the driver for memory: the file of the first frame of a recorded
//! native stack that is outside the recording shim and the CUDA runtime and driver, found in the
//! executable mappings the recording keeps.

use memprof_wire::Mapping;

/// File-name prefixes of the frames skipped: the shim and the CUDA runtime and driver
/// (`libcuda.so.1`, `libcudart.so.12`).
const SKIPPED: [&str; 2] = ["libmemprof_shim", "libcuda"];

/// The base name of a mapped file, without the " (deleted)" `/proc/<pid>/maps` adds.
fn file_name(path: &[u8]) -> String {
    let text = String::from_utf8_lossy(path);
    let text = text.strip_suffix(" (deleted)").unwrap_or(&text);
    text.rsplit('/').next().unwrap_or_default().to_string()
}

/// Finds mapped files by address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Libraries {
    /// (start, end, file name), by start.
    ranges: Vec<(u64, u64, String)>,
}

impl Libraries {
    pub fn new() -> Libraries {
        Libraries { ranges: Vec::new() }
    }

    /// Learns a mapping (definitions come before the stacks that use them).
    pub fn add(&mut self, m: &Mapping) {
        let entry = (m.start, m.start.saturating_add(m.len), file_name(&m.path));
        let at = self.ranges.partition_point(|r| r.0 < m.start);
        self.ranges.insert(at, entry);
    }

    /// The file mapped at `addr`.
    fn at(&self, addr: u64) -> Option<&str> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= addr)
            .checked_sub(1)?;
        let (start, end, name) = &self.ranges[i];
        (*start <= addr && addr < *end).then_some(name.as_str())
    }

    /// The library of the first frame (innermost first) outside the shim and CUDA; `None` when
    /// every frame is inside them or in no known file.
    pub fn of_stack(&self, frames: &[u64]) -> Option<String> {
        frames
            .iter()
            .filter_map(|&a| self.at(a))
            .find(|name| !SKIPPED.iter().any(|s| name.starts_with(s)))
            .map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, len: u64, path: &str) -> Mapping {
        Mapping {
            start,
            len,
            file_offset: 0,
            path: path.as_bytes().to_vec(),
        }
    }

    #[test]
    fn the_first_frame_outside_the_shim_and_cuda_names_the_library() {
        let mut libs = Libraries::new();
        libs.add(&mapping(0x5000, 0x1000, "/opt/lib/libnccl.so.2 (deleted)"));
        libs.add(&mapping(0x1000, 0x1000, "/tmp/libmemprof_shim-ab.so"));
        libs.add(&mapping(0x3000, 0x1000, "/usr/lib/libcudart.so.12"));
        libs.add(&mapping(0x8000, 0x1000, "/usr/bin/python3.12"));
        assert_eq!(
            libs.of_stack(&[0x1010, 0x3020, 0x9999_0000, 0x5100, 0x8100]),
            Some("libnccl.so.2".to_string())
        );
        assert_eq!(libs.of_stack(&[0x1010, 0x3020]), None);
        assert_eq!(libs.of_stack(&[0x6000]), None, "just past the end");
    }
}
