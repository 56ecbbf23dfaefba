//! The writer's stack table: one id per distinct call stack, and the executable mappings of the
//! process (from `/proc/self/maps`) written before the first stack that needs them.
//!
//! Only the writer thread uses it (it may allocate and read files). The maps are read at the
//! first stack and again whenever a stack holds an address no written mapping covers (a library
//! loaded since, with `dlopen`); an address still not covered after that is remembered, so code
//! outside any file (JIT code, a wrong frame) costs one read, not one per event. A library
//! unloaded and another loaded at the same place between an event and the writer's next look is
//! attributed to the second one.

use memprof_wire::{encode_mapping, encode_stack, Mapping};
use std::collections::{BTreeMap, BTreeSet};

/// Stack ids and mappings written so far.
pub struct Stacks {
    ids: BTreeMap<Box<[u64]>, u32>,
    /// Executable mappings written so far, `(start, end)`.
    known: Vec<(u64, u64)>,
    /// The shim's own executable mappings: its frames at the top of a stack are dropped.
    own: Vec<(u64, u64)>,
    /// Addresses no mapping covered after a fresh read of the maps.
    unmapped: BTreeSet<u64>,
    /// Whether the maps were read.
    read: bool,
}

fn covered(ranges: &[(u64, u64)], addr: u64) -> bool {
    ranges
        .iter()
        .any(|&(start, end)| start <= addr && addr < end)
}

/// One executable, file-backed line of `/proc/<pid>/maps`.
fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut fields = line
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty())
        .map(std::str::from_utf8);
    let (start, end) = fields.next()?.ok()?.split_once('-')?;
    let perms = fields.next()?.ok()?;
    let offset = fields.next()?.ok()?;
    // Device and inode: ASCII; their values are not needed.
    let (_dev, _inode) = (fields.next()?.ok()?, fields.next()?.ok()?);
    // The path is the rest of the line, spaces included: bytes as the kernel gives them, which
    // need not be UTF-8 (one such path must not cost the others, or itself).
    let path = line.iter().position(|&b| b == b'/').map(|at| &line[at..])?;
    if !perms.contains('x') {
        return None;
    }
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    Some(Mapping {
        start,
        len: end.checked_sub(start)?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.to_vec(),
    })
}

impl Stacks {
    pub const fn new() -> Stacks {
        Stacks {
            ids: BTreeMap::new(),
            known: Vec::new(),
            own: Vec::new(),
            unmapped: BTreeSet::new(),
            read: false,
        }
    }

    /// Reads the maps and appends the definitions of mappings not written yet to `out`.
    fn refresh(&mut self, out: &mut Vec<u8>) {
        self.read = true;
        // Bytes, not text: a file name need not be UTF-8.
        let Ok(maps) = std::fs::read("/proc/self/maps") else {
            return;
        };
        let mappings: Vec<Mapping> = maps.split(|&b| b == b'\n').filter_map(parse_line).collect();
        let here = crate::recorder::record as fn(memprof_wire::Record) as usize as u64;
        if let Some(own) = mappings
            .iter()
            .find(|m| m.start <= here && here < m.start + m.len)
        {
            let path = own.path.clone();
            self.own = (mappings.iter().filter(|m| m.path == path))
                .map(|m| (m.start, m.start + m.len))
                .collect();
        }
        for mapping in mappings {
            let range = (mapping.start, mapping.start + mapping.len);
            if !self.known.contains(&range) {
                self.known.push(range);
                out.extend_from_slice(&encode_mapping(&mapping));
            }
        }
    }

    /// The id of this stack (innermost first, the shim's frames included), appending its
    /// definition and any new mapping to `out` the first time; `None` for an empty stack.
    pub fn id(&mut self, frames: &[u64], out: &mut Vec<u8>) -> Option<u32> {
        if frames.is_empty() {
            return None;
        }
        if !self.read {
            self.refresh(out);
        }
        let skip = frames
            .iter()
            .take_while(|&&a| covered(&self.own, a))
            .count();
        let frames = &frames[skip..];
        if frames.is_empty() {
            return None;
        }
        if let Some(&id) = self.ids.get(frames) {
            return Some(id);
        }
        let new = |s: &Stacks, a: &u64| !covered(&s.known, *a) && !s.unmapped.contains(a);
        if frames.iter().any(|a| new(self, a)) {
            self.refresh(out);
            let missing: Vec<u64> = frames.iter().copied().filter(|a| new(self, a)).collect();
            self.unmapped.extend(missing);
        }
        let id = u32::try_from(self.ids.len() + 1).ok()?;
        self.ids.insert(frames.into(), id);
        out.extend_from_slice(&encode_stack(id, frames));
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_wire::{decode_recording, FileHeader, ProcessInfo};

    #[test]
    fn maps_lines_are_read_with_their_paths() {
        let line =
            b"7f1c2a000000-7f1c2a021000 r-xp 00002000 08:01 1234  /opt/my lib/libx.so (deleted)";
        assert_eq!(
            parse_line(line),
            Some(Mapping {
                start: 0x7f1c_2a00_0000,
                len: 0x21000,
                file_offset: 0x2000,
                path: b"/opt/my lib/libx.so (deleted)".to_vec(),
            })
        );
        assert_eq!(
            parse_line(b"7f00-7f10 rw-p 00000000 08:01 1 /lib/x.so"),
            None
        );
        assert_eq!(parse_line(b"7f00-7f10 r-xp 00000000 00:00 0 [vdso]"), None);
        assert_eq!(parse_line(b"garbage"), None);
        // A path that is not UTF-8 is kept, byte for byte.
        assert_eq!(
            parse_line(b"7f00-7f10 r-xp 00000000 08:01 1 /opt/caf\xe9/libx.so").map(|m| m.path),
            Some(b"/opt/caf\xe9/libx.so".to_vec())
        );
    }

    #[inline(never)]
    fn named_caller() -> u64 {
        // Any address inside this test binary's text.
        named_caller as fn() -> u64 as usize as u64 + 1
    }

    #[test]
    fn stacks_get_ids_once_and_bring_their_mappings() {
        let mut stacks = Stacks::new();
        let mut out = FileHeader {
            pid: 1,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(&ProcessInfo::default().encode());
        let text = named_caller();
        assert_eq!(stacks.id(&[], &mut out), None);
        // The shim is linked into this test binary: a frame in it is the shim's own, dropped.
        let a = stacks.id(&[text, 0x10], &mut out);
        let b = stacks.id(&[0x10, text], &mut out);
        assert_eq!(a, Some(1));
        assert_eq!(b, Some(2));
        let len = out.len();
        assert_eq!(stacks.id(&[0x10, text], &mut out), Some(2));
        assert_eq!(out.len(), len, "a known stack writes nothing");
        let decoded = decode_recording(&out).expect("decodes");
        assert_eq!(decoded.stacks[&1], vec![0x10]);
        assert_eq!(decoded.stacks[&2], vec![0x10, text]);
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        assert!(decoded
            .mappings
            .iter()
            .any(|m| m.path == exe.as_os_str().as_encoded_bytes()
                && m.start <= text
                && text < m.start + m.len));
        // 0x10 is in no mapping: remembered, so the maps are not read again for it.
        assert!(stacks.unmapped.contains(&0x10));
    }
}
