//! Reads `driver_sequences.txt` (the format is described at its top) for the tests that check
//! a reader of driver records against it; included by path in each of them.

use memprof_wire::{Kind, Record};

/// What is expected after the records before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Held { device: u32, bytes: u64 },
    Managed { device: u32, bytes: u64 },
    Host { device: u32, bytes: u64 },
    Handles(usize),
    Mappings(usize),
}

#[derive(Debug, Clone, Copy)]
pub enum Step {
    Apply(Record),
    Expect(Expect),
}

pub struct Sequence {
    pub name: String,
    pub steps: Vec<Step>,
}

/// The shared table.
pub const TABLE: &str = include_str!("driver_sequences.txt");

fn number(text: &str, line: usize) -> u64 {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|_| panic!("line {line}: {text:?} is not a number"))
}

fn kind(name: &str, line: usize) -> Kind {
    match name {
        "alloc" => Kind::Alloc,
        "alloc_async" => Kind::AllocAsync,
        "alloc_pitch" => Kind::AllocPitch,
        "alloc_managed" => Kind::AllocManaged,
        "free" => Kind::Free,
        "free_async" => Kind::FreeAsync,
        "vmm_create" => Kind::VmmCreate,
        "vmm_map" => Kind::VmmMap,
        "vmm_unmap" => Kind::VmmUnmap,
        "vmm_release" => Kind::VmmRelease,
        "host_alloc" => Kind::HostAlloc,
        "host_register" => Kind::HostRegister,
        "host_free" => Kind::HostFree,
        "host_unregister" => Kind::HostUnregister,
        "mem_get_info" => Kind::MemGetInfo,
        _ => panic!("line {line}: unknown kind {name:?}"),
    }
}

fn record(words: &[&str], line: usize) -> Record {
    let mut r = Record::new(kind(words[0], line));
    for word in &words[1..] {
        let (key, value) = word
            .split_once('=')
            .unwrap_or_else(|| panic!("line {line}: {word:?} is not key=value"));
        match key {
            "ptr" => r.ptr = number(value, line),
            "size" => r.size = number(value, line),
            "aux" => r.aux = number(value, line),
            "device" => r.device = value.parse().expect("a device number"),
            "result" => r.result = number(value, line) as u32,
            _ => panic!("line {line}: unknown key {key:?}"),
        }
    }
    r
}

fn expect(words: &[&str], line: usize) -> Expect {
    let device = || number(words[1], line) as u32;
    let bytes = || number(words[2], line);
    match (words[0], words.len()) {
        ("held", 3) => Expect::Held {
            device: device(),
            bytes: bytes(),
        },
        ("managed", 3) => Expect::Managed {
            device: device(),
            bytes: bytes(),
        },
        ("host", 3) => Expect::Host {
            device: device(),
            bytes: bytes(),
        },
        ("handles", 2) => Expect::Handles(number(words[1], line) as usize),
        ("mappings", 2) => Expect::Mappings(number(words[1], line) as usize),
        _ => panic!("line {line}: unknown expectation {words:?}"),
    }
}

/// The sequences of the table.
pub fn sequences() -> Vec<Sequence> {
    let mut out: Vec<Sequence> = Vec::new();
    for (i, text) in TABLE.lines().enumerate() {
        let line = i + 1;
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        if let Some(name) = text.strip_prefix("sequence ") {
            out.push(Sequence {
                name: name.to_string(),
                steps: Vec::new(),
            });
            continue;
        }
        let words: Vec<&str> = text.split_whitespace().collect();
        let step = match words.split_first() {
            Some((&"expect", rest)) => Step::Expect(expect(rest, line)),
            _ => Step::Apply(record(&words, line)),
        };
        out.last_mut()
            .unwrap_or_else(|| panic!("line {line}: a step before any sequence"))
            .steps
            .push(step);
    }
    assert!(!out.is_empty(), "the table has sequences");
    out
}
