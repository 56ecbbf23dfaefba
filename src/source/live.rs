//! The live stream of a process recording under the shim: connects to the Unix socket the shim
//! listens on (named after the process id, `crates/memprof-shim/src/live.rs`) and yields the
//! records as the shim drains them. The stream holds the bytes of a recording: header, process
//! block, records with the stack and mapping definitions they name, and the trailer when the
//! process ends.

use memprof_wire::{
    decode_header, payload_lengths, DecodeError, FileHeader, HeaderError, Kind, Mapping,
    ProcessInfo, Record, FILE_HEADER_LEN, FLAG_SNAPSHOT, HEADER_LEN, MAX_PROCESS_BLOCK, RECORD_LEN,
};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why the live stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the live stream: {0}")]
    Read(#[from] std::io::Error),
    #[error("live stream: {0}")]
    Decode(#[from] DecodeError),
    /// The shim closed the connection before its header: it serves a few clients at a time
    /// and only its own user.
    #[error("{path} closed the connection (the shim serves at most 8 clients, of its own user)")]
    Refused { path: PathBuf },
    /// The shim did not send its header in time: its writer thread is not running (the
    /// process is stopped, or the thread could not start).
    #[error("{path} sent nothing for {} s (is the process stopped?)", HEADER_WAIT.as_secs())]
    Silent { path: PathBuf },
}

/// How long a new connection waits for the shim's header.
const HEADER_WAIT: Duration = Duration::from_secs(5);

/// One thing the stream says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveEvent {
    Record(Record),
    /// Call stack `id` (return addresses, innermost first), before the first record naming it.
    Stack {
        id: u32,
        frames: Vec<u64>,
    },
    /// An executable file mapping of the process, before the first stack it covers.
    Mapping(Mapping),
    /// The client read too slowly and this many records were not sent (they are in the file).
    Lost(u64),
    /// Every record of what was alive when the client connected has come (the flagged
    /// `LiveDropped` of 0 after them).
    CaughtUp,
    /// The process ended; `dropped` events were lost from the recording itself.
    End {
        dropped: u64,
    },
}

/// The socket of the shim in process `pid`, for this user (the rule the shim follows).
pub fn socket_path(pid: u32) -> PathBuf {
    memprof_wire::socket_path(&socket_dir(), pid)
}

/// The directory where this user's shims put their sockets.
pub fn socket_dir() -> PathBuf {
    // The owner of /proc/self is this process's user.
    let uid = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
    memprof_wire::socket_dir(std::env::var_os("XDG_RUNTIME_DIR").as_deref(), uid)
}

/// Running processes with a shim socket in `dir`, in order. (A killed process leaves its socket
/// behind; it is skipped once no process has its id. A new process that reuses the id is listed
/// until connecting to the stale socket fails.)
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            name.to_str()?.strip_suffix(".sock")?.parse().ok()
        })
        .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    pids.sort_unstable();
    pids
}

/// A connection to one process's live stream (any byte stream `S`; the shim's socket unless
/// said otherwise).
pub struct LiveClient<S = UnixStream> {
    stream: S,
    pub header: FileHeader,
    /// `None` from a shim that writes format version 1.
    pub process: Option<ProcessInfo>,
    /// Records (and definitions) read so far, and the stream offset of the next (for error
    /// messages).
    read: usize,
    at: usize,
    ended: bool,
}

impl LiveClient {
    /// Connects to the shim of process `pid` and reads the stream's header.
    pub fn connect(pid: u32) -> Result<LiveClient, LiveError> {
        LiveClient::connect_path(&socket_path(pid))
    }

    /// Connects to a socket path and reads the stream's header.
    pub fn connect_path(path: &Path) -> Result<LiveClient, LiveError> {
        // A path deeper than a socket address holds is reached as the shim bound it.
        let connected = memprof_wire::at_socket_path(path, |p| UnixStream::connect(p));
        let stream = connected.map_err(|source| LiveError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        // The kernel accepts the connection on the shim's behalf; only its writer thread
        // answers, so a stopped process would make a plain read wait forever.
        stream.set_read_timeout(Some(HEADER_WAIT))?;
        let client = LiveClient::over(stream, path)?;
        client.stream.set_read_timeout(None)?;
        Ok(client)
    }

    /// How long `next_event` waits for data before it fails with a timeout (`None`: forever).
    pub fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), LiveError> {
        Ok(self.stream.set_read_timeout(timeout)?)
    }

    /// A second handle on the connection: shutting it down from another thread makes a
    /// `next_event` blocked on this client return `None`.
    pub fn stopper(&self) -> Result<UnixStream, LiveError> {
        Ok(self.stream.try_clone()?)
    }
}

impl<S: Read> LiveClient<S> {
    /// Reads the stream's header and process block from `stream`, which `path` names in errors.
    pub fn over(mut stream: S, path: &Path) -> Result<LiveClient<S>, LiveError> {
        let header_read = |e: std::io::Error| match e.kind() {
            ErrorKind::UnexpectedEof => LiveError::Refused {
                path: path.to_path_buf(),
            },
            ErrorKind::WouldBlock | ErrorKind::TimedOut => LiveError::Silent {
                path: path.to_path_buf(),
            },
            _ => LiveError::Read(e),
        };
        let mut head = [0u8; FILE_HEADER_LEN];
        stream.read_exact(&mut head).map_err(header_read)?;
        let header_error = |e: HeaderError| LiveError::Decode(DecodeError::Header(e));
        let version = decode_header(&head[..HEADER_LEN]).map_err(header_error)?;
        let header = FileHeader::decode(&head).map_err(header_error)?;
        let mut records_at = FILE_HEADER_LEN;
        let process = if version >= 2 {
            let mut len = [0u8; 4];
            stream.read_exact(&mut len).map_err(header_read)?;
            let body_len = u32::from_le_bytes(len) as usize;
            if body_len > MAX_PROCESS_BLOCK {
                return Err(header_error(HeaderError::BadProcessBlock(
                    "longer than 1 MiB",
                )));
            }
            let mut block = len.to_vec();
            block.resize(4 + body_len, 0);
            stream.read_exact(&mut block[4..]).map_err(header_read)?;
            records_at += block.len();
            Some(ProcessInfo::decode(&block).map_err(header_error)?.0)
        } else {
            None
        };
        Ok(LiveClient {
            stream,
            header,
            process,
            read: 0,
            at: records_at,
            ended: false,
        })
    }

    /// The next event, waiting for it; `None` once the process has ended or the stream closed.
    pub fn next_event(&mut self) -> Result<Option<LiveEvent>, LiveError> {
        if self.ended {
            return Ok(None);
        }
        let mut raw = [0u8; RECORD_LEN];
        if let Err(e) = self.stream.read_exact(&mut raw) {
            if e.kind() == ErrorKind::UnexpectedEof {
                self.ended = true;
                return Ok(None);
            }
            return Err(e.into());
        }
        let (index, offset) = (self.read, self.at);
        self.read += 1;
        let fail = |error| DecodeError::Record {
            index,
            offset,
            error,
        };
        let record = Record::decode(&raw).map_err(fail)?;
        // A definition's payload (checked against the format's limits before it is read).
        let (len, padded) = payload_lengths(&record).map_err(fail)?;
        let mut payload = vec![0u8; padded];
        if let Err(e) = self.stream.read_exact(&mut payload) {
            // Cut inside a definition: the process was killed as the shim wrote it.
            if e.kind() == ErrorKind::UnexpectedEof {
                self.ended = true;
                return Ok(None);
            }
            return Err(e.into());
        }
        payload.truncate(len);
        self.at += RECORD_LEN + padded;
        Ok(Some(match record.kind {
            Kind::Stack => LiveEvent::Stack {
                id: record.aux as u32,
                frames: (payload.chunks_exact(8))
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                    .collect(),
            },
            Kind::Mapping => LiveEvent::Mapping(Mapping {
                start: record.ptr,
                len: record.size,
                file_offset: record.aux,
                path: payload,
            }),
            Kind::LiveDropped if record.flags & FLAG_SNAPSHOT != 0 => LiveEvent::CaughtUp,
            Kind::LiveDropped => LiveEvent::Lost(record.size),
            Kind::Trailer => {
                self.ended = true;
                LiveEvent::End {
                    dropped: record.aux,
                }
            }
            _ => LiveEvent::Record(record),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    /// A listener at a fresh path at least `len` bytes long that answers one connection with
    /// `reply` (then closes); the directory goes when the first value is dropped.
    fn server_at(len: usize, reply: Vec<u8>) -> (tempfile::TempDir, PathBuf) {
        let top = tempfile::Builder::new()
            .prefix("memprof-live-")
            .tempdir()
            .expect("temp dir");
        let mut dir = top.path().to_path_buf();
        while dir.join("s.sock").as_os_str().len() < len {
            dir.push("a-deep-runtime-directory");
        }
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("s.sock");
        let listener =
            memprof_wire::at_socket_path(&path, |p| UnixListener::bind(p)).expect("bind");
        std::thread::spawn(move || {
            if let Ok((mut peer, _)) = listener.accept() {
                let _ = peer.write_all(&reply);
            }
        });
        (top, path)
    }

    fn server(reply: Vec<u8>) -> (tempfile::TempDir, PathBuf) {
        server_at(0, reply)
    }

    #[test]
    fn a_socket_deeper_than_an_address_holds_is_reached() {
        let (_dir, path) = server_at(180, Vec::new());
        assert!(path.as_os_str().len() > memprof_wire::MAX_SOCKET_PATH);
        // Connected, then closed before a header: the shim's refusal, not a failed connect.
        let got = LiveClient::connect_path(&path);
        assert!(
            matches!(got, Err(LiveError::Refused { .. })),
            "{:?}",
            got.err()
        );
    }

    fn head() -> Vec<u8> {
        let mut bytes = FileHeader {
            pid: 7,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        bytes.extend_from_slice(&ProcessInfo::default().encode());
        bytes
    }

    fn events(bytes: &[u8]) -> Result<Vec<LiveEvent>, LiveError> {
        let mut client = LiveClient::over(bytes, Path::new("test"))?;
        let mut out = Vec::new();
        while let Some(event) = client.next_event()? {
            out.push(event);
        }
        Ok(out)
    }

    #[test]
    fn definitions_come_with_their_payloads_and_a_bad_one_names_its_offset() {
        let mapping = Mapping {
            start: 0x5000,
            len: 0x1000,
            file_offset: 0,
            path: b"/lib/libnccl.so.2".to_vec(),
        };
        let mut alloc = Record::new(Kind::Alloc);
        alloc.stack = 3;
        let mut bytes = head();
        bytes.extend_from_slice(&memprof_wire::encode_mapping(&mapping));
        bytes.extend_from_slice(&memprof_wire::encode_stack(3, &[0x5010, 0x5020]));
        bytes.extend_from_slice(&alloc.encode());
        let got = events(&bytes).expect("reads");
        assert_eq!(
            got,
            [
                LiveEvent::Mapping(mapping),
                LiveEvent::Stack {
                    id: 3,
                    frames: vec![0x5010, 0x5020]
                },
                LiveEvent::Record(alloc),
            ]
        );
        // Cut inside the stack's payload: the stream ended, as a killed process leaves it.
        let cut = bytes.len() - RECORD_LEN - 8;
        assert_eq!(events(&bytes[..cut]).expect("reads").len(), 1);
        // A stack of no frames is refused, at its offset (after the mapping's 128 bytes).
        let mut bad = Record::new(Kind::Stack);
        bad.aux = 4;
        let mut damaged = head();
        let at = damaged.len() + 128;
        damaged.extend_from_slice(&bytes[head().len()..head().len() + 128]);
        damaged.extend_from_slice(&bad.encode());
        let err = events(&damaged).map(|_| ()).expect_err("refused");
        assert!(
            err.to_string()
                .contains(&format!("at byte {at}: record 1 defines a stack")),
            "{err}"
        );
    }

    #[test]
    fn a_refusal_or_a_damaged_header_is_a_clear_error_not_a_hang() {
        let refused = LiveClient::connect_path(&server(Vec::new()).1);
        assert!(
            matches!(refused, Err(LiveError::Refused { .. })),
            "{:?}",
            refused.err()
        );
        let garbage = LiveClient::connect_path(&server(vec![0xa5; 200]).1);
        assert!(
            matches!(garbage, Err(LiveError::Decode(_))),
            "{:?}",
            garbage.err()
        );
    }
}
