//! The memprof recording format, shared by the shim (writer) and the tool (reader).
//!
//! A recording is a header, the process block (version 2 on), then fixed-size little-endian
//! records:
//!
//! ```text
//! header (32 bytes): MAGIC (8) | version u32 | record length u32 | pid u32 | reserved u32
//!                    | start time u64 (CLOCK_MONOTONIC, ns)
//! process block:     length u32 | entries, each tag u16 | length u32 | bytes      (version 2)
//! record (64 bytes): kind u16 | flags u16 | tid u32 | ts_ns u64 | ptr u64 | size u64
//!                    | stream u64 | aux u64 | pid u32 | device i32 | result u32 | stack u32
//! ```
//!
//! Version 3 adds call stacks. A record's last word (reserved, zero, before) is the id of its
//! call stack, 0 for none. Two kinds of definition records, each followed by a payload padded
//! with zeros to whole 64-byte blocks, come before the first record that needs them:
//! [`Kind::Stack`] (`aux` = stack id, `size` = frame count, payload: the return addresses as
//! u64, innermost first) and [`Kind::Mapping`] (an executable file mapping of the process, as in
//! `/proc/<pid>/maps`: `ptr` = start, `size` = length, `aux` = file offset, `stream` = length of
//! the path, payload: the path's bytes), so that addresses can be symbolized after the process
//! is gone. Definitions are not events and are not in [`Recording::records`].
//!
//! Process block entries ([`ProcessInfo`]): tag 1 the wall clock (`CLOCK_REALTIME`, ns since the
//! Unix epoch) read together with the header's start time, tag 2 the host name, tag 3 one
//! command-line argument (repeated, in order). Readers skip tags they do not know, so new tags
//! need no version bump.
//!
//! Version 4 adds pinned host memory ([`Kind::HostAlloc`], [`Kind::HostFree`],
//! [`Kind::HostRegister`], [`Kind::HostUnregister`]) and NVML samples of the process's device
//! memory ([`Kind::NvmlSample`], written by `memprof run`, not the shim: after the shim's events,
//! before the trailer).
//!
//! Compatibility: this reader reads versions 1 (no process block), 2 (no stacks), 3 (no host
//! memory, no NVML samples) and 4, and refuses a newer version with a message saying so. A
//! definition record in a version 1 or 2 recording, and a host-memory or NVML record in a
//! version 1 to 3 one, is an unknown kind, as it was to the readers of those versions.
//!
//! A recording that was closed cleanly ends with one [`Kind::Trailer`] record carrying the number
//! of events written and the number dropped. A recording without one was cut short (the program
//! was killed, or is still running).
//!
//! The live stream (the shim's Unix socket) carries the same bytes: header, process block, then
//! records and definitions (each before the first record naming it), with a
//! [`Kind::LiveDropped`] record where the client fell behind (records are lost then, never
//! definitions), and the trailer when the process ends. A client that connects late first gets
//! every definition written so far, then the records of what is still alive, flagged
//! [`FLAG_SNAPSHOT`]; records made while those are sent that change what the
//! client already got come among them, unflagged, so that at the end of the snapshot the client
//! holds what is alive then.
#![forbid(unsafe_code)]

mod stream;

pub use stream::{Ending, Item, RecordingReader, StreamError};

/// First bytes of every recording.
pub const MAGIC: &[u8; 8] = b"MEMPROF\0";

/// Version of the layout written after the magic.
pub const VERSION: u32 = 4;

/// The oldest version this reader still reads.
pub const OLDEST_VERSION: u32 = 1;

/// The largest process block a reader accepts (a bigger length means a damaged file).
pub const MAX_PROCESS_BLOCK: usize = 1 << 20;

/// Length of the magic plus version, the part every version shares.
pub const HEADER_LEN: usize = MAGIC.len() + 4;

/// Length of the whole version-1 header.
pub const FILE_HEADER_LEN: usize = 32;

/// Length of one record.
pub const RECORD_LEN: usize = 64;

/// The most frames a [`Kind::Stack`] definition may hold.
pub const MAX_FRAMES: usize = 128;

/// The longest path a [`Kind::Mapping`] definition may hold, in bytes.
pub const MAX_PATH: usize = 4096;

/// The first version with call stacks ([`Kind::Stack`], [`Kind::Mapping`], [`Record::stack`]).
pub const STACKS_VERSION: u32 = 3;

/// The first version with host memory and NVML samples ([`Kind::since`] says which kinds).
pub const HOST_VERSION: u32 = 4;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: u32 = 0;

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

/// Flag: the call came through a pointer the program looked up (`cuGetProcAddress(_v2)` or a
/// handle-scoped `dlsym`), not through the exported symbol.
pub const FLAG_LOOKED_UP: u16 = 1;

/// Flag: the per-thread-default-stream (`_ptsz`) variant of the call.
pub const FLAG_PER_THREAD_STREAM: u16 = 2;

/// Flag (live stream only): a record of something alive (when the client connected, or when
/// its snapshot reached that record), sent before the stream so the client starts from the
/// process's current state. A
/// [`Kind::LiveDropped`] record of 0 with this flag ends those records (a reader that does not
/// know it takes it for no records lost).
pub const FLAG_SNAPSHOT: u16 = 4;

/// The directory of this user's live sockets: `RUNTIME_DIR/memprof` (`$XDG_RUNTIME_DIR`, when set
/// to an absolute path; a relative one is ignored, as the XDG Base Directory specification
/// says), else `/tmp/memprof-<uid>`. The shim and its clients both follow this rule.
pub fn socket_dir(runtime_dir: Option<&std::ffi::OsStr>, uid: u32) -> std::path::PathBuf {
    match runtime_dir.filter(|d| std::path::Path::new(d).is_absolute()) {
        Some(dir) => std::path::Path::new(dir).join("memprof"),
        None => std::path::PathBuf::from(format!("/tmp/memprof-{uid}")),
    }
}

/// The live socket of process `pid` in `dir` (see [`socket_dir`]).
pub fn socket_path(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// The longest path a Unix socket address holds: `sun_path` is 108 bytes, its NUL included.
pub const MAX_SOCKET_PATH: usize = 107;

/// Runs `op` (a bind or a connect) on the socket path `path`, however deep it is. A path longer
/// than [`MAX_SOCKET_PATH`] (a deep `$XDG_RUNTIME_DIR`) is reached through a descriptor of its
/// directory, as `/proc/self/fd/N/NAME`: the socket is still made, and found, at `path`. The
/// shim (bind) and its clients (connect) both go through here.
pub fn at_socket_path<T>(
    path: &std::path::Path,
    op: impl FnOnce(&std::path::Path) -> std::io::Result<T>,
) -> std::io::Result<T> {
    use std::os::fd::AsRawFd;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return op(path);
    };
    if path.as_os_str().len() <= MAX_SOCKET_PATH {
        return op(path);
    }
    // Opening a directory read-only is allowed; the descriptor stays open until `op` returns.
    let dir = std::fs::File::open(dir)?;
    let short = std::path::Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    op(&short)
}

/// Writes the magic and version.
pub fn encode_header() -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..MAGIC.len()].copy_from_slice(MAGIC);
    out[MAGIC.len()..].copy_from_slice(&VERSION.to_le_bytes());
    out
}

/// Why a header could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    TooShort,
    NotARecording,
    /// A version this reader does not know: written by a newer memprof, or (below the oldest
    /// version) never written by one.
    UnknownVersion(u32),
    /// The header names a record length this reader does not know.
    BadRecordLength(u32),
    /// The process block is cut short or damaged; the text says how.
    BadProcessBlock(&'static str),
}

/// Reads the magic and version and returns the version (one this reader reads).
pub fn decode_header(bytes: &[u8]) -> Result<u32, HeaderError> {
    let header = bytes.get(..HEADER_LEN).ok_or(HeaderError::TooShort)?;
    if &header[..MAGIC.len()] != MAGIC {
        return Err(HeaderError::NotARecording);
    }
    match u32_at(header, MAGIC.len()) {
        v @ OLDEST_VERSION..=VERSION => Ok(v),
        other => Err(HeaderError::UnknownVersion(other)),
    }
}

/// Process block tag: the wall clock at the start, ns since the Unix epoch.
const TAG_WALL_START: u16 = 1;
/// Process block tag: the host name.
const TAG_HOST: u16 = 2;
/// Process block tag: one command-line argument.
const TAG_ARG: u16 = 3;

/// What a recording says about the recorded process (version 2 on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// `CLOCK_REALTIME` when recording started, in ns since the Unix epoch (read together with
    /// the header's monotonic start time, so record times convert to wall clock).
    pub wall_start_ns: Option<u64>,
    pub host: Option<String>,
    /// The command line, program first.
    pub args: Vec<String>,
}

/// Bytes before each entry's value in the process block: its tag (u16) and length (u32).
pub const PROCESS_ENTRY_HEAD: usize = 6;

impl ProcessInfo {
    /// The whole process block, length first.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let mut entry = |tag: u16, bytes: &[u8]| {
            body.extend_from_slice(&tag.to_le_bytes());
            body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            body.extend_from_slice(bytes);
        };
        if let Some(wall) = self.wall_start_ns {
            entry(TAG_WALL_START, &wall.to_le_bytes());
        }
        if let Some(host) = &self.host {
            entry(TAG_HOST, host.as_bytes());
        }
        for arg in &self.args {
            entry(TAG_ARG, arg.as_bytes());
        }
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&body);
        out
    }

    /// Reads a process block from the start of `bytes`; returns it and the bytes it took.
    /// Unknown tags are skipped; text that is not UTF-8 is read lossily.
    pub fn decode(bytes: &[u8]) -> Result<(ProcessInfo, usize), HeaderError> {
        let cut = HeaderError::BadProcessBlock("cut short");
        let len = bytes.get(..4).map(|b| u32_at(b, 0) as usize).ok_or(cut)?;
        if len > MAX_PROCESS_BLOCK {
            return Err(HeaderError::BadProcessBlock("longer than 1 MiB"));
        }
        let mut rest = bytes.get(4..4 + len).ok_or(cut)?;
        let mut info = ProcessInfo::default();
        while !rest.is_empty() {
            let head = rest.get(..6).ok_or(cut)?;
            let tag = u16::from_le_bytes([head[0], head[1]]);
            let n = u32_at(head, 2) as usize;
            let value = rest.get(6..6 + n).ok_or(cut)?;
            rest = &rest[6 + n..];
            let text = || String::from_utf8_lossy(value).into_owned();
            match tag {
                TAG_WALL_START => {
                    let word: [u8; 8] = value
                        .try_into()
                        .map_err(|_| HeaderError::BadProcessBlock("wall clock is not 8 bytes"))?;
                    info.wall_start_ns = Some(u64::from_le_bytes(word));
                }
                TAG_HOST => info.host = Some(text()),
                TAG_ARG => info.args.push(text()),
                _ => {}
            }
        }
        Ok((info, 4 + len))
    }
}

/// What the header says about the recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// Process id of the recorded process.
    pub pid: u32,
    /// `CLOCK_MONOTONIC` when recording started, in nanoseconds.
    pub start_ns: u64,
}

impl FileHeader {
    /// The full header, as written at the start of a recording.
    pub fn encode(&self) -> [u8; FILE_HEADER_LEN] {
        let mut out = [0u8; FILE_HEADER_LEN];
        out[..HEADER_LEN].copy_from_slice(&encode_header());
        out[12..16].copy_from_slice(&(RECORD_LEN as u32).to_le_bytes());
        out[16..20].copy_from_slice(&self.pid.to_le_bytes());
        out[24..32].copy_from_slice(&self.start_ns.to_le_bytes());
        out
    }

    /// Reads a full header.
    pub fn decode(bytes: &[u8]) -> Result<FileHeader, HeaderError> {
        decode_header(bytes)?;
        let header = bytes.get(..FILE_HEADER_LEN).ok_or(HeaderError::TooShort)?;
        let record_len = u32_at(header, 12);
        if record_len as usize != RECORD_LEN {
            return Err(HeaderError::BadRecordLength(record_len));
        }
        Ok(FileHeader {
            pid: u32_at(header, 16),
            start_ns: u64_at(header, 24),
        })
    }
}

/// What a record describes. The numbers are part of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Kind {
    /// `cuMemAlloc_v2`: `ptr` (0 on failure), `size`.
    Alloc = 1,
    /// `cuMemFree_v2`: `ptr`.
    Free = 2,
    /// `cuMemAllocAsync`: `ptr`, `size`, `stream`.
    AllocAsync = 3,
    /// `cuMemFreeAsync`: `ptr`, `stream`.
    FreeAsync = 4,
    /// `cuMemCreate`: physical memory; `aux` = handle, `size`.
    VmmCreate = 5,
    /// `cuMemMap`: `ptr` = VA, `size`, `aux` = handle, `stream` = offset into the handle.
    VmmMap = 6,
    /// `cuMemUnmap`: `ptr` = VA, `size`.
    VmmUnmap = 7,
    /// `cuMemRelease`: `aux` = handle.
    VmmRelease = 8,
    /// `cuMemGetInfo_v2`: `aux` = free bytes, `size` = total bytes.
    MemGetInfo = 9,
    /// Last record of a cleanly closed recording: `size` = events written, `aux` = events dropped,
    /// `stream` = events written late because the hook waited for room.
    Trailer = 10,
    /// `cuMemAllocPitch_v2`: `ptr`, `size` = pitch x height, `aux` = pitch.
    AllocPitch = 11,
    /// `cuMemAllocManaged`: `ptr`, `size`, `aux` = flags. Unified memory, not device-resident
    /// until migrated.
    AllocManaged = 12,
    /// `cuMemAllocFromPoolAsync`: `ptr`, `size`, `stream`, `aux` = pool.
    AllocFromPoolAsync = 13,
    /// `cuMemAddressReserve`: `ptr` = reserved VA (0 on failure), `size`. Address space only.
    AddressReserve = 14,
    /// `cuMemAddressFree`: `ptr`, `size`.
    AddressFree = 15,
    /// Live stream only (never in a file): `size` events were not sent to this client because
    /// it read too slowly. They are in the file.
    LiveDropped = 16,
    /// Definition of call stack `aux` with `size` frames, followed by the frames (version 3).
    Stack = 17,
    /// An executable file mapping, followed by its path (version 3; see the module docs).
    Mapping = 18,
    /// `cuMemHostAlloc` or `cuMemAllocHost_v2` (version 4): pinned host memory; `ptr` (0 on
    /// failure), `size`, `aux` = flags (0 for `cuMemAllocHost_v2`).
    HostAlloc = 19,
    /// `cuMemFreeHost` (version 4): `ptr`.
    HostFree = 20,
    /// `cuMemHostRegister_v2` (version 4): host memory pinned in place; `ptr`, `size`,
    /// `aux` = flags.
    HostRegister = 21,
    /// `cuMemHostUnregister` (version 4): `ptr`.
    HostUnregister = 22,
    /// NVML's figure of the device memory process `pid` uses on device `device` (NVML's index),
    /// in `size`, sampled at `ts_ns` by `memprof run` while the program ran (version 4).
    NvmlSample = 23,
}

impl Kind {
    /// The kind with this number.
    #[inline]
    pub fn from_u16(value: u16) -> Option<Kind> {
        Some(match value {
            1 => Kind::Alloc,
            2 => Kind::Free,
            3 => Kind::AllocAsync,
            4 => Kind::FreeAsync,
            5 => Kind::VmmCreate,
            6 => Kind::VmmMap,
            7 => Kind::VmmUnmap,
            8 => Kind::VmmRelease,
            9 => Kind::MemGetInfo,
            10 => Kind::Trailer,
            11 => Kind::AllocPitch,
            12 => Kind::AllocManaged,
            13 => Kind::AllocFromPoolAsync,
            14 => Kind::AddressReserve,
            15 => Kind::AddressFree,
            16 => Kind::LiveDropped,
            17 => Kind::Stack,
            18 => Kind::Mapping,
            19 => Kind::HostAlloc,
            20 => Kind::HostFree,
            21 => Kind::HostRegister,
            22 => Kind::HostUnregister,
            23 => Kind::NvmlSample,
            _ => return None,
        })
    }

    /// The first format version that has this kind.
    pub fn since(self) -> u32 {
        match self {
            Kind::Stack | Kind::Mapping => STACKS_VERSION,
            Kind::HostAlloc
            | Kind::HostFree
            | Kind::HostRegister
            | Kind::HostUnregister
            | Kind::NvmlSample => HOST_VERSION,
            _ => OLDEST_VERSION,
        }
    }

    /// Whether the call pins host memory (`cuMemHostAlloc`, `cuMemAllocHost_v2`,
    /// `cuMemHostRegister_v2`).
    pub fn pins_host(self) -> bool {
        matches!(self, Kind::HostAlloc | Kind::HostRegister)
    }

    /// Whether the call asks for memory (and so can fail with out-of-memory).
    pub fn allocates(self) -> bool {
        matches!(
            self,
            Kind::Alloc
                | Kind::AllocAsync
                | Kind::VmmCreate
                | Kind::AllocPitch
                | Kind::AllocManaged
                | Kind::AllocFromPoolAsync
        )
    }
}

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Kernel thread id of the caller.
    pub tid: u32,
    /// `CLOCK_MONOTONIC` in nanoseconds: after the call returned, or, for calls that give
    /// memory back (frees, unmaps, releases, address frees), before it was made, so that a free
    /// precedes an allocation in another thread that gets the address back. Records are in this
    /// order (see the shim's `buffers.rs` for the exceptions).
    pub ts_ns: u64,
    pub ptr: u64,
    pub size: u64,
    pub stream: u64,
    pub aux: u64,
    pub pid: u32,
    /// Device ordinal, or -1 when the call does not say.
    pub device: i32,
    /// The `CUresult` the call returned.
    pub result: u32,
    /// Id of the call stack (a [`Kind::Stack`] definition), 0 for none (always 0 before
    /// version 3).
    pub stack: u32,
}

impl Record {
    /// A record of this kind with every other field zero (device -1).
    pub fn new(kind: Kind) -> Record {
        Record {
            kind,
            flags: 0,
            tid: 0,
            ts_ns: 0,
            ptr: 0,
            size: 0,
            stream: 0,
            aux: 0,
            pid: 0,
            device: -1,
            result: CUDA_SUCCESS,
            stack: 0,
        }
    }

    /// An allocation that failed with `CUDA_ERROR_OUT_OF_MEMORY`; `size` is the request.
    pub fn is_oom(&self) -> bool {
        self.kind.allocates() && self.result == CUDA_ERROR_OUT_OF_MEMORY
    }

    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[0..2].copy_from_slice(&(self.kind as u16).to_le_bytes());
        out[2..4].copy_from_slice(&self.flags.to_le_bytes());
        out[4..8].copy_from_slice(&self.tid.to_le_bytes());
        out[8..16].copy_from_slice(&self.ts_ns.to_le_bytes());
        out[16..24].copy_from_slice(&self.ptr.to_le_bytes());
        out[24..32].copy_from_slice(&self.size.to_le_bytes());
        out[32..40].copy_from_slice(&self.stream.to_le_bytes());
        out[40..48].copy_from_slice(&self.aux.to_le_bytes());
        out[48..52].copy_from_slice(&self.pid.to_le_bytes());
        out[52..56].copy_from_slice(&self.device.to_le_bytes());
        out[56..60].copy_from_slice(&self.result.to_le_bytes());
        out[60..64].copy_from_slice(&self.stack.to_le_bytes());
        out
    }

    /// Reads one record from exactly `RECORD_LEN` bytes (inlined into a reader's loop).
    #[inline]
    pub fn decode(bytes: &[u8; RECORD_LEN]) -> Result<Record, RecordError> {
        let kind_number = u16::from_le_bytes([bytes[0], bytes[1]]);
        let kind = Kind::from_u16(kind_number).ok_or(RecordError::UnknownKind(kind_number))?;
        Ok(Record {
            kind,
            flags: u16::from_le_bytes([bytes[2], bytes[3]]),
            tid: u32_at(bytes, 4),
            ts_ns: u64_at(bytes, 8),
            ptr: u64_at(bytes, 16),
            size: u64_at(bytes, 24),
            stream: u64_at(bytes, 32),
            aux: u64_at(bytes, 40),
            pid: u32_at(bytes, 48),
            device: u32_at(bytes, 52) as i32,
            result: u32_at(bytes, 56),
            stack: u32_at(bytes, 60),
        })
    }
}

/// Why a record could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    UnknownKind(u16),
    /// A stack definition with no frames, more than [`MAX_FRAMES`], or id 0 / above u32.
    BadStack,
    /// A mapping definition with an empty path or one longer than [`MAX_PATH`].
    BadMapping,
}

/// An executable file mapping of the recorded process (a [`Kind::Mapping`] definition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// Offset in the file of the mapping's first byte.
    pub file_offset: u64,
    /// The file, as `/proc/<pid>/maps` names it.
    pub path: Vec<u8>,
}

/// Bytes of payload after a definition record whose header says it holds `bytes`: whole blocks.
fn padded(bytes: usize) -> usize {
    bytes.div_ceil(RECORD_LEN) * RECORD_LEN
}

/// A [`Kind::Stack`] definition with its payload. `frames` must hold 1 to [`MAX_FRAMES`]
/// addresses (more are cut off; an empty stack writes a definition readers refuse).
pub fn encode_stack(id: u32, frames: &[u64]) -> Vec<u8> {
    let frames = &frames[..frames.len().min(MAX_FRAMES)];
    let mut head = Record::new(Kind::Stack);
    head.aux = u64::from(id);
    head.size = frames.len() as u64;
    let mut out = head.encode().to_vec();
    for frame in frames {
        out.extend_from_slice(&frame.to_le_bytes());
    }
    out.resize(RECORD_LEN + padded(frames.len() * 8), 0);
    out
}

/// A [`Kind::Mapping`] definition with its payload (a path longer than [`MAX_PATH`] is cut).
pub fn encode_mapping(mapping: &Mapping) -> Vec<u8> {
    let path = &mapping.path[..mapping.path.len().min(MAX_PATH)];
    let mut head = Record::new(Kind::Mapping);
    head.ptr = mapping.start;
    head.size = mapping.len;
    head.aux = mapping.file_offset;
    head.stream = path.len() as u64;
    let mut out = head.encode().to_vec();
    out.extend_from_slice(path);
    out.resize(RECORD_LEN + padded(path.len()), 0);
    out
}

/// A whole recording read into memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recording {
    pub header: FileHeader,
    /// The format version the file was written in.
    pub version: u32,
    /// The process block; `None` in a version-1 recording.
    pub process: Option<ProcessInfo>,
    /// Byte offset of the first record.
    pub records_at: usize,
    /// The events, without the trailer and the definitions.
    pub records: Vec<Record>,
    /// Byte offset of each event in `records` (definitions make records variable in length).
    pub offsets: Vec<usize>,
    /// Call stacks by id: return addresses, innermost first (version 3).
    pub stacks: std::collections::BTreeMap<u32, Vec<u64>>,
    /// The process's executable file mappings, in the order they were recorded (version 3).
    pub mappings: Vec<Mapping>,
    /// `Some(dropped)` when the recording ends with a trailer; `None` when it was cut short.
    pub dropped: Option<u64>,
    /// Events written late because the hook waited for room (0 without a trailer).
    pub delayed: u64,
    /// Bytes at the end that do not make a whole record (a recording cut mid-write).
    pub trailing_bytes: usize,
}

/// Why a recording could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    Header(HeaderError),
    /// Record number `index` (from 0, counting definitions), at byte `offset` of the file, is
    /// not valid.
    Record {
        index: usize,
        offset: usize,
        error: RecordError,
    },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Header(HeaderError::TooShort) => write!(f, "recording header cut short"),
            DecodeError::Header(HeaderError::NotARecording) => write!(f, "not a memprof recording"),
            DecodeError::Header(HeaderError::UnknownVersion(v)) if *v > VERSION => write!(
                f,
                "recording format version {v} is newer than this memprof (it reads versions \
                 {OLDEST_VERSION} to {VERSION})"
            ),
            DecodeError::Header(HeaderError::UnknownVersion(v)) => write!(
                f,
                "recording format version {v} is not one memprof writes (versions \
                 {OLDEST_VERSION} to {VERSION}): the header is damaged"
            ),
            DecodeError::Header(HeaderError::BadProcessBlock(why)) => {
                write!(f, "recording process block {why}")
            }
            DecodeError::Header(HeaderError::BadRecordLength(n)) => {
                write!(
                    f,
                    "recording header names record length {n}, expected {RECORD_LEN}"
                )
            }
            DecodeError::Record {
                index,
                offset,
                error,
            } => {
                write!(f, "at byte {offset}: record {index} ")?;
                match error {
                    RecordError::UnknownKind(k) => write!(f, "has unknown kind {k}"),
                    RecordError::BadStack => write!(
                        f,
                        "defines a stack with id 0 or with no frames or more than {MAX_FRAMES}"
                    ),
                    RecordError::BadMapping => write!(
                        f,
                        "defines a mapping with an empty path or one longer than {MAX_PATH} bytes"
                    ),
                }
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// The payload length a definition record announces, checked against the limits.
fn payload_len(record: &Record) -> Result<usize, RecordError> {
    match record.kind {
        Kind::Stack => {
            let frames = usize::try_from(record.size).unwrap_or(usize::MAX);
            if record.aux == 0
                || record.aux > u64::from(u32::MAX)
                || frames == 0
                || frames > MAX_FRAMES
            {
                return Err(RecordError::BadStack);
            }
            Ok(frames * 8)
        }
        Kind::Mapping => {
            let len = usize::try_from(record.stream).unwrap_or(usize::MAX);
            if len == 0 || len > MAX_PATH {
                return Err(RecordError::BadMapping);
            }
            Ok(len)
        }
        _ => Ok(0),
    }
}

/// For a record read from a stream: the bytes of payload that follow it (its payload's length,
/// and that length padded to whole blocks, as in the stream); `(0, 0)` for an event. An error
/// for a definition beyond the limits.
pub fn payload_lengths(record: &Record) -> Result<(usize, usize), RecordError> {
    payload_len(record).map(|len| (len, padded(len)))
}

/// Reads a recording. Records after a trailer are ignored; a partial last record (or
/// definition) is counted in `trailing_bytes`, not an error, since a killed program leaves one.
/// A reader that should not hold the whole recording uses [`RecordingReader`].
pub fn decode_recording(bytes: &[u8]) -> Result<Recording, DecodeError> {
    let from_slice = |e: StreamError| match e {
        StreamError::Decode(e) => e,
        // Reading from a slice cannot fail.
        StreamError::Io(_) => DecodeError::Header(HeaderError::TooShort),
    };
    let mut reader = RecordingReader::new(bytes).map_err(from_slice)?;
    let mut out = Recording {
        header: reader.header,
        version: reader.version,
        process: reader.process.clone(),
        records_at: reader.records_at,
        records: Vec::with_capacity(bytes.len().saturating_sub(reader.records_at) / RECORD_LEN),
        offsets: Vec::new(),
        stacks: std::collections::BTreeMap::new(),
        mappings: Vec::new(),
        dropped: None,
        delayed: 0,
        trailing_bytes: 0,
    };
    while let Some(item) = reader.next_item().map_err(from_slice)? {
        match item {
            Item::Event { offset, record, .. } => {
                out.records.push(record);
                out.offsets.push(offset);
            }
            Item::Stack { id, frames } => {
                out.stacks.insert(id, frames);
            }
            Item::Mapping(m) => out.mappings.push(m),
        }
    }
    let ending = reader.ending().unwrap_or_default();
    out.dropped = ending.dropped;
    out.delayed = ending.delayed;
    out.trailing_bytes = ending.trailing_bytes;
    Ok(out)
}

#[inline]
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

#[inline]
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_live_in_the_runtime_dir_or_a_per_user_tmp_dir() {
        let run = std::ffi::OsStr::new("/run/user/1000");
        assert_eq!(
            socket_path(&socket_dir(Some(run), 1000), 42),
            std::path::Path::new("/run/user/1000/memprof/42.sock")
        );
        for unset in [None, Some(std::ffi::OsStr::new(""))] {
            assert_eq!(socket_dir(unset, 7), std::path::Path::new("/tmp/memprof-7"));
        }
    }

    #[test]
    fn a_relative_runtime_dir_is_ignored() {
        for relative in ["run/user/1000", "./run", "memprof"] {
            assert_eq!(
                socket_dir(Some(std::ffi::OsStr::new(relative)), 7),
                std::path::Path::new("/tmp/memprof-7"),
                "{relative}"
            );
        }
    }

    /// A directory under the system's temporary one whose socket path is `len` bytes long.
    fn deep_dir(name: &str, len: usize) -> (std::path::PathBuf, std::path::PathBuf) {
        let top = std::env::temp_dir().join(format!("memprof-wire-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&top);
        let mut dir = top.clone();
        while socket_path(&dir, 42).as_os_str().len() < len {
            dir.push("a-deep-runtime-directory");
        }
        std::fs::create_dir_all(&dir).expect("mkdir");
        (top, socket_path(&dir, 42))
    }

    #[test]
    fn a_socket_deeper_than_an_address_holds_is_bound_and_reached_where_it_belongs() {
        use std::io::{Read, Write};
        use std::os::unix::fs::FileTypeExt;
        use std::os::unix::net::{UnixListener, UnixStream};
        let (top, path) = deep_dir("deep", 200);
        assert!(path.as_os_str().len() > MAX_SOCKET_PATH);
        // What a plain bind does with it: refused, which used to leave the process unlistened.
        assert!(UnixListener::bind(&path).is_err());
        let listener = at_socket_path(&path, |p| UnixListener::bind(p)).expect("binds");
        let kind = std::fs::symlink_metadata(&path).expect("made").file_type();
        assert!(kind.is_socket(), "the socket is at its own path");
        let mut client = at_socket_path(&path, |p| UnixStream::connect(p)).expect("connects");
        let (mut served, _) = listener.accept().expect("accepts");
        served.write_all(b"hello").expect("written");
        let mut got = [0u8; 5];
        client.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"hello");
        std::fs::remove_dir_all(&top).expect("cleaned up");
    }

    #[test]
    fn a_socket_path_that_fits_is_used_as_it_is() {
        use std::os::unix::net::UnixListener;
        let (top, path) = deep_dir("short", 0);
        assert!(
            path.as_os_str().len() <= MAX_SOCKET_PATH,
            "{}",
            path.display()
        );
        let listener = at_socket_path(&path, |p| UnixListener::bind(p)).expect("binds");
        let bound = listener.local_addr().expect("an address");
        assert_eq!(bound.as_pathname(), Some(path.as_path()));
        std::fs::remove_dir_all(&top).expect("cleaned up");
    }

    #[test]
    fn header_round_trips() {
        assert_eq!(decode_header(&encode_header()), Ok(VERSION));
        let mut old = encode_header();
        old[8] = 1;
        assert_eq!(decode_header(&old), Ok(1));
        let header = FileHeader {
            pid: 4242,
            start_ns: 0x0102_0304_0506_0708,
        };
        assert_eq!(FileHeader::decode(&header.encode()), Ok(header));
    }

    #[test]
    fn header_rejects_other_files() {
        assert_eq!(decode_header(b"MEMPROF"), Err(HeaderError::TooShort));
        assert_eq!(
            decode_header(b"\x80\x04\x95........."),
            Err(HeaderError::NotARecording)
        );
        let mut newer = encode_header();
        newer[8] = 9;
        assert_eq!(decode_header(&newer), Err(HeaderError::UnknownVersion(9)));
        let full = FileHeader {
            pid: 1,
            start_ns: 2,
        }
        .encode();
        assert_eq!(FileHeader::decode(&full[..20]), Err(HeaderError::TooShort));
        let mut odd = full;
        odd[12] = 65;
        assert_eq!(
            FileHeader::decode(&odd),
            Err(HeaderError::BadRecordLength(65))
        );
    }

    fn sample(kind: Kind) -> Record {
        Record {
            kind,
            flags: FLAG_LOOKED_UP | FLAG_PER_THREAD_STREAM,
            tid: 0xdead_beef,
            ts_ns: u64::MAX - 1,
            ptr: 0x7f00_0000_1000,
            size: 1 << 40,
            stream: 0x55,
            aux: 7,
            pid: 99,
            device: -1,
            result: CUDA_ERROR_OUT_OF_MEMORY,
            stack: 0x0102_0304,
        }
    }

    #[test]
    fn every_kind_round_trips() {
        for number in 0..=30u16 {
            let Some(kind) = Kind::from_u16(number) else {
                continue;
            };
            assert_eq!(kind as u16, number);
            let record = sample(kind);
            assert_eq!(Record::decode(&record.encode()), Ok(record));
        }
    }

    #[test]
    fn layout_is_little_endian_at_fixed_offsets() {
        let bytes = sample(Kind::VmmMap).encode();
        assert_eq!(&bytes[0..2], &[6, 0]);
        assert_eq!(&bytes[16..24], &0x7f00_0000_1000u64.to_le_bytes());
        assert_eq!(&bytes[52..56], &[0xff; 4]);
        assert_eq!(&bytes[56..60], &[2, 0, 0, 0]);
        assert_eq!(&bytes[60..64], &[4, 3, 2, 1]);
    }

    #[test]
    fn oom_is_a_failed_allocation() {
        assert!(sample(Kind::Alloc).is_oom());
        assert!(sample(Kind::VmmCreate).is_oom());
        assert!(!sample(Kind::Free).is_oom());
        assert!(!Record::new(Kind::Alloc).is_oom());
    }

    fn process() -> ProcessInfo {
        ProcessInfo {
            wall_start_ns: Some(1_700_000_000_123_456_789),
            host: Some("gpu-node-7".into()),
            args: vec!["python".into(), "train.py".into(), "--lr=3e-4 x".into()],
        }
    }

    /// A recording of `version` (1: no process block) holding `records`.
    fn file_of(version: u32, records: &[Record], trailer: Option<u64>) -> Vec<u8> {
        let mut out = FileHeader {
            pid: 5,
            start_ns: 6,
        }
        .encode()
        .to_vec();
        out[8..12].copy_from_slice(&version.to_le_bytes());
        if version >= 2 {
            out.extend_from_slice(&process().encode());
        }
        for record in records {
            out.extend_from_slice(&record.encode());
        }
        if let Some(dropped) = trailer {
            let mut end = Record::new(Kind::Trailer);
            end.size = records.len() as u64;
            end.aux = dropped;
            end.stream = 4;
            out.extend_from_slice(&end.encode());
        }
        out
    }

    fn file(records: &[Record], trailer: Option<u64>) -> Vec<u8> {
        file_of(VERSION, records, trailer)
    }

    #[test]
    fn recording_round_trips() {
        let records = vec![
            sample(Kind::Alloc),
            sample(Kind::Free),
            sample(Kind::MemGetInfo),
        ];
        let decoded = decode_recording(&file(&records, Some(3))).expect("decodes");
        assert_eq!(
            decoded.header,
            FileHeader {
                pid: 5,
                start_ns: 6
            }
        );
        assert_eq!(decoded.version, VERSION);
        assert_eq!(decoded.process, Some(process()));
        assert_eq!(decoded.records, records);
        assert_eq!(decoded.dropped, Some(3));
        assert_eq!(decoded.delayed, 4);
        assert_eq!(decoded.trailing_bytes, 0);
    }

    #[test]
    fn version_1_recordings_are_still_read() {
        let records = vec![sample(Kind::Alloc), sample(Kind::Free)];
        let decoded = decode_recording(&file_of(1, &records, Some(0))).expect("decodes");
        assert_eq!(decoded.version, 1);
        assert_eq!(decoded.process, None);
        assert_eq!(decoded.records_at, FILE_HEADER_LEN);
        // Before version 3 the last word was reserved: never a stack id.
        let unstacked: Vec<Record> = records.iter().map(|r| Record { stack: 0, ..*r }).collect();
        assert_eq!(decoded.records, unstacked);
        let decoded = decode_recording(&file_of(2, &records, Some(0))).expect("decodes");
        assert_eq!(decoded.version, 2);
        assert_eq!(decoded.process, Some(process()));
        assert_eq!(decoded.records, unstacked);
        assert_eq!(
            decode_recording(&file_of(VERSION + 1, &records, None)).map(|_| ()),
            Err(DecodeError::Header(HeaderError::UnknownVersion(
                VERSION + 1
            )))
        );
    }

    #[test]
    fn host_memory_and_nvml_records_are_version_4_kinds() {
        let records = vec![
            sample(Kind::HostAlloc),
            sample(Kind::HostRegister),
            sample(Kind::NvmlSample),
            sample(Kind::HostUnregister),
            sample(Kind::HostFree),
        ];
        let decoded = decode_recording(&file_of(4, &records, Some(0))).expect("decodes");
        assert_eq!(decoded.records, records);
        assert!(Kind::HostAlloc.pins_host() && !Kind::HostAlloc.allocates());
        // In a version-3 recording they are kinds that version did not have.
        let start = FILE_HEADER_LEN + process().encode().len();
        assert_eq!(
            decode_recording(&file_of(3, &records, Some(0))).map(|_| ()),
            Err(DecodeError::Record {
                index: 0,
                offset: start,
                error: RecordError::UnknownKind(Kind::HostAlloc as u16)
            })
        );
    }

    #[test]
    fn process_blocks_round_trip_and_skip_unknown_tags() {
        for info in [ProcessInfo::default(), process()] {
            let bytes = info.encode();
            assert_eq!(ProcessInfo::decode(&bytes), Ok((info, bytes.len())));
        }
        // A tag from a later writer between two known ones.
        let mut bytes = process().encode();
        let extra = [9u8, 0, 2, 0, 0, 0, 0xaa, 0xbb];
        bytes.splice(4..4, extra);
        let len = (bytes.len() - 4) as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(ProcessInfo::decode(&bytes), Ok((process(), bytes.len())));
        // Cut anywhere inside, it is refused, never misread.
        let whole = process().encode();
        for cut in 0..whole.len() {
            assert!(ProcessInfo::decode(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = whole.clone();
        huge[..4].copy_from_slice(&(2u32 << 20).to_le_bytes());
        assert_eq!(
            ProcessInfo::decode(&huge),
            Err(HeaderError::BadProcessBlock("longer than 1 MiB"))
        );
    }

    fn mapping() -> Mapping {
        Mapping {
            start: 0x5555_0000_0000,
            len: 0x2000,
            file_offset: 0x1000,
            path: b"/usr/lib/x86_64-linux-gnu/libfoo.so.1 (deleted)".to_vec(),
        }
    }

    /// A version-3 recording: a mapping, two stacks (1 and 9 frames), and events using them.
    fn stacked_file(trailer: bool) -> (Vec<u8>, Vec<Record>) {
        let mut out = file(&[], None);
        let mut alloc = sample(Kind::Alloc);
        alloc.stack = 1;
        let mut free = sample(Kind::Free);
        free.stack = 2;
        out.extend_from_slice(&encode_mapping(&mapping()));
        out.extend_from_slice(&encode_stack(1, &[0x5555_0000_1234]));
        out.extend_from_slice(&alloc.encode());
        out.extend_from_slice(&encode_stack(2, &(1..=9).collect::<Vec<u64>>()));
        out.extend_from_slice(&free.encode());
        if trailer {
            out.extend_from_slice(&Record::new(Kind::Trailer).encode());
        }
        (out, vec![alloc, free])
    }

    #[test]
    fn stacks_and_mappings_round_trip() {
        let (bytes, records) = stacked_file(true);
        let decoded = decode_recording(&bytes).expect("decodes");
        assert_eq!(decoded.records, records);
        assert_eq!(decoded.mappings, vec![mapping()]);
        assert_eq!(decoded.stacks.len(), 2);
        assert_eq!(decoded.stacks[&1], vec![0x5555_0000_1234]);
        assert_eq!(decoded.stacks[&2], (1..=9).collect::<Vec<u64>>());
        let start = FILE_HEADER_LEN + process().encode().len();
        // mapping: 1 + 1 blocks, stack 1: 1 + 1, alloc, stack 2: 1 + 2, free.
        assert_eq!(
            decoded.offsets,
            vec![start + 4 * RECORD_LEN, start + 8 * RECORD_LEN]
        );
        assert_eq!(decoded.dropped, Some(0));
    }

    #[test]
    fn a_recording_cut_inside_a_definition_keeps_what_came_before() {
        let (bytes, records) = stacked_file(false);
        let start = FILE_HEADER_LEN + process().encode().len();
        for cut in start..bytes.len() {
            let decoded = decode_recording(&bytes[..cut]).expect("a cut recording decodes");
            let kept = decoded.records.len();
            assert_eq!(decoded.records, records[..kept], "cut at {cut}");
            let used = decoded.offsets.last().map_or(start, |&o| o + RECORD_LEN);
            assert!(decoded.trailing_bytes <= cut - used, "cut at {cut}");
            assert_eq!(decoded.dropped, None);
        }
    }

    #[test]
    fn damaged_definitions_are_errors_with_their_index() {
        let (bytes, _) = stacked_file(true);
        let start = FILE_HEADER_LEN + process().encode().len();
        let stack_at = start + 2 * RECORD_LEN;
        let cases: [(usize, usize, u64, RecordError); 4] = [
            (stack_at + 24, 1, 0, RecordError::BadStack),
            (
                stack_at + 24,
                1,
                MAX_FRAMES as u64 + 1,
                RecordError::BadStack,
            ),
            (stack_at + 40, 1, 0, RecordError::BadStack),
            (start + 32, 0, MAX_PATH as u64 + 1, RecordError::BadMapping),
        ];
        for (field, index, value, error) in cases {
            let mut damaged = bytes.clone();
            damaged[field..field + 8].copy_from_slice(&value.to_le_bytes());
            let offset = if index == 0 { start } else { stack_at };
            assert_eq!(
                decode_recording(&damaged).map(|_| ()),
                Err(DecodeError::Record {
                    index,
                    offset,
                    error
                })
            );
        }
        let mut huge_id = bytes.clone();
        huge_id[stack_at + 40..stack_at + 48].copy_from_slice(&(1u64 << 32).to_le_bytes());
        let err = decode_recording(&huge_id).map(|_| ()).expect_err("refused");
        assert_eq!(
            err.to_string(),
            format!(
                "at byte {stack_at}: record 1 defines a stack with id 0 or with no frames or \
                 more than {MAX_FRAMES}"
            )
        );
        // A definition in a version-2 recording is a kind that version did not have.
        let mut old = bytes;
        old[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(
            decode_recording(&old).map(|_| ()),
            Err(DecodeError::Record {
                index: 0,
                offset: start,
                error: RecordError::UnknownKind(Kind::Mapping as u16)
            })
        );
    }

    #[test]
    fn truncated_recordings_keep_whole_records() {
        let records = vec![sample(Kind::Alloc), sample(Kind::Free)];
        let bytes = file(&records, None);
        let start = FILE_HEADER_LEN + process().encode().len();
        for cut in start..bytes.len() {
            let decoded = decode_recording(&bytes[..cut]).expect("a cut recording still decodes");
            let whole = (cut - start) / RECORD_LEN;
            assert_eq!(decoded.records, records[..whole]);
            assert_eq!(decoded.dropped, None);
            assert_eq!(decoded.trailing_bytes, (cut - start) % RECORD_LEN);
        }
        for cut in 0..start {
            assert!(matches!(
                decode_recording(&bytes[..cut]),
                Err(DecodeError::Header(_))
            ));
        }
    }

    #[test]
    fn unknown_kinds_are_errors() {
        let mut bytes = file(&[sample(Kind::Alloc), sample(Kind::Free)], Some(0));
        let start = FILE_HEADER_LEN + process().encode().len();
        bytes[start + RECORD_LEN] = 200;
        let err = decode_recording(&bytes).map(|_| ()).expect_err("refused");
        assert_eq!(
            err,
            DecodeError::Record {
                index: 1,
                offset: start + RECORD_LEN,
                error: RecordError::UnknownKind(200)
            }
        );
        assert_eq!(
            err.to_string(),
            format!(
                "at byte {}: record 1 has unknown kind 200",
                start + RECORD_LEN
            )
        );
    }

    #[test]
    fn version_0_is_a_damaged_header_and_a_later_one_is_newer() {
        let message = |version: u32| {
            let mut bytes = file_of(VERSION, &[], Some(0));
            bytes[MAGIC.len()..HEADER_LEN].copy_from_slice(&version.to_le_bytes());
            let err = decode_recording(&bytes).map(|_| ()).expect_err("refused");
            assert_eq!(
                err,
                DecodeError::Header(HeaderError::UnknownVersion(version))
            );
            err.to_string()
        };
        assert_eq!(
            message(0),
            format!(
                "recording format version 0 is not one memprof writes (versions {OLDEST_VERSION} \
                 to {VERSION}): the header is damaged"
            )
        );
        assert_eq!(
            message(VERSION + 1),
            format!(
                "recording format version {} is newer than this memprof (it reads versions \
                 {OLDEST_VERSION} to {VERSION})",
                VERSION + 1
            )
        );
    }
}
