//! The live socket: while a process records, the shim listens on a Unix socket named after its
//! pid and streams the recording's bytes to every connected client. Only the writer thread
//! touches it, so the hooks never wait on a client.
//!
//! Where: `$XDG_RUNTIME_DIR/memprof/<pid>.sock`, or `/tmp/memprof-<uid>/<pid>.sock` without
//! `XDG_RUNTIME_DIR` (or with a relative one); the directory is made mode 0700 and must belong to
//! this user, the socket is mode 0600, and a client whose peer credentials are not this user's
//! (or root's) is closed at once. A path longer than a socket address holds (a deep runtime
//! directory) is bound through a descriptor of its directory (`memprof_wire::at_socket_path`),
//! so the socket is still where clients look. When no socket can be made the process says so
//! once on stderr, and records to its file all the same. What a client gets: the header and
//! process block, the records of what is alive when it connects (`table.rs`, flagged
//! `FLAG_SNAPSHOT`; everything drained before it was accepted, which the writer does first each
//! round) and a `LiveDropped` record of 0 flagged so that ends them, then the records drained
//! after it connected,
//! then the trailer when the process ends. A client that reads too slowly loses whole
//! records (never part of one); the next thing it gets is a `LiveDropped` record counting them.
//! The socket file is removed at exit.

use crate::table::Table;
use memprof_wire::{Kind, Record, FLAG_SNAPSHOT, RECORD_LEN};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// At most this many clients at once; more are closed on connect.
const MAX_CLIENTS: usize = 8;
/// Bytes a client may have waiting to be sent; beyond, new records are dropped for it.
const MAX_PENDING: usize = 256 << 10;
/// Tries, 1 ms apart, to hand the last bytes to the clients at exit.
const CLOSE_TRIES: u32 = 50;

fn socket_dir() -> PathBuf {
    memprof_wire::socket_dir(std::env::var_os("XDG_RUNTIME_DIR").as_deref(), uid())
}

fn uid() -> u32 {
    // SAFETY: getuid takes no arguments and cannot fail.
    unsafe { libc::getuid() }
}

struct Client {
    stream: UnixStream,
    /// Bytes accepted for this client and not yet sent.
    pending: Vec<u8>,
    /// Records dropped for this client since the last `LiveDropped` it was sent.
    lost: u64,
}

impl Client {
    /// Sends what it can without blocking; false when the client is gone.
    fn flush(&mut self) -> bool {
        while !self.pending.is_empty() {
            // SAFETY: the pointer and length describe `pending`, which outlives the call; the
            // flags make the call non-blocking and keep SIGPIPE away from the program.
            let sent = unsafe {
                libc::send(
                    self.stream.as_raw_fd(),
                    self.pending.as_ptr().cast(),
                    self.pending.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            match usize::try_from(sent) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(_) => {
                    let kind = std::io::Error::last_os_error().kind();
                    return matches!(kind, ErrorKind::WouldBlock | ErrorKind::Interrupted);
                }
            }
        }
        true
    }

    /// Queues whole records (`batch` holds `count` of them), or counts them as lost.
    fn queue(&mut self, batch: &[u8], count: u64) {
        let note = if self.lost > 0 { RECORD_LEN } else { 0 };
        if self.pending.len() + note + batch.len() > MAX_PENDING {
            self.lost += count;
            return;
        }
        if self.lost > 0 {
            let mut lost = Record::new(Kind::LiveDropped);
            lost.size = self.lost;
            self.pending.extend_from_slice(&lost.encode());
            self.lost = 0;
        }
        self.pending.extend_from_slice(batch);
    }
}

/// The listening socket and its clients.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    /// The header and process block every client gets first.
    head: Vec<u8>,
    /// What is alive, for clients that connect later.
    table: Table,
    clients: Vec<Client>,
}

impl Server {
    /// Listens for `pid`; `None`, said once on stderr, when the socket cannot be made safely.
    pub fn open(pid: u32, head: Vec<u8>) -> Option<Server> {
        let dir = socket_dir();
        match listen(&dir, pid) {
            Ok((listener, path)) => Some(Server {
                listener,
                path,
                head,
                table: Table::default(),
                clients: Vec::new(),
            }),
            Err(why) => {
                // Whatever stderr is (closed, a pipe nobody reads), the program goes on.
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    no_live_view(pid, &dir, &why).as_bytes(),
                );
                None
            }
        }
    }

    /// Sends what clients still wait for (a snapshot bigger than the socket takes at once must
    /// reach a client of an idle process too), then takes the clients waiting to connect.
    pub fn accept(&mut self) {
        self.clients.retain_mut(|client| client.flush());
        while let Ok((stream, _)) = self.listener.accept() {
            if self.clients.len() >= MAX_CLIENTS || !same_user(&stream) {
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut pending = self.head.clone();
            pending.extend_from_slice(&self.table.snapshot());
            let mut end = Record::new(Kind::LiveDropped);
            end.flags = FLAG_SNAPSHOT;
            pending.extend_from_slice(&end.encode());
            let mut client = Client {
                stream,
                pending,
                lost: 0,
            };
            if client.flush() {
                self.clients.push(client);
            }
        }
    }

    /// Sends `batch` (whole records) to every client, without blocking.
    pub fn send(&mut self, batch: &[u8]) {
        self.table.apply_all(batch);
        let count = (batch.len() / RECORD_LEN) as u64;
        self.clients.retain_mut(|client| {
            client.queue(batch, count);
            client.flush()
        });
    }

    /// Sends `trailer` after everything queued, waiting a little for slow clients, then
    /// removes the socket.
    pub fn close(&mut self, trailer: &[u8]) {
        self.send(trailer);
        for _ in 0..CLOSE_TRIES {
            self.clients
                .retain_mut(|client| client.flush() && !client.pending.is_empty());
            if self.clients.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.clients.clear();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes the socket of `pid` in `dir`, or says why it cannot.
fn listen(dir: &Path, pid: u32) -> Result<(UnixListener, PathBuf), String> {
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir);
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    // Someone else's directory (a shared /tmp) is never used.
    if !meta.is_dir() {
        return Err("it is not a directory".into());
    }
    if meta.uid() != uid() {
        return Err(format!(
            "it belongs to user {}, not to this one",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "other users may enter it (mode {:o}, expected 700)",
            meta.mode() & 0o777
        ));
    }
    let path = memprof_wire::socket_path(dir, pid);
    // A socket left by an earlier process with this pid.
    let _ = std::fs::remove_file(&path);
    let listener = memprof_wire::at_socket_path(&path, |p| UnixListener::bind(p))
        .map_err(|e| e.to_string())?;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok((listener, path))
}

/// The one line a process without a live socket prints: where, why, and that it still records.
fn no_live_view(pid: u32, dir: &Path, why: &str) -> String {
    // The directory comes from the environment: shown escaped, never raw.
    let shown: String = dir.to_string_lossy().escape_debug().collect();
    format!(
        "memprof: no live view of PID {pid} (memprof attach, top and agent will not see it): \
         cannot listen in {shown}: {why}; the recording to the file goes on\n"
    )
}

/// Whether the peer runs as this user or as root.
fn same_user(stream: &UnixStream) -> bool {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writing and `len` is the size of `cred`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    rc == 0 && (cred.uid == uid() || cred.uid == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn batch(first: u64, count: u64) -> Vec<u8> {
        (first..first + count)
            .flat_map(|n| {
                let mut r = Record::new(Kind::Alloc);
                r.ptr = n;
                r.encode()
            })
            .collect()
    }

    /// Reads what the peer can get now, handing it whatever `client` still holds.
    fn read_all(client: &mut Client, peer: &mut UnixStream, into: &mut Vec<u8>) {
        let mut buf = [0u8; 4096];
        loop {
            assert!(client.flush(), "the peer is there");
            match peer.read(&mut buf) {
                Ok(n) => into.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock && client.pending.is_empty() => return,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn a_slow_client_loses_whole_records_and_is_told_how_many() {
        let (ours, mut peer) = UnixStream::pair().expect("a socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        peer.set_nonblocking(true).expect("non-blocking");
        let mut client = Client {
            stream: ours,
            pending: Vec::new(),
            lost: 0,
        };
        // The peer reads nothing until the socket and the pending buffer are full.
        let mut next = 0;
        while client.lost == 0 {
            client.queue(&batch(next, 64), 64);
            assert!(client.flush());
            next += 64;
        }
        let lost = client.lost;
        assert_eq!(lost, 64);
        let mut bytes = Vec::new();
        read_all(&mut client, &mut peer, &mut bytes);
        client.queue(&batch(next, 64), 64);
        read_all(&mut client, &mut peer, &mut bytes);

        assert_eq!(bytes.len() % RECORD_LEN, 0, "whole records only");
        let records: Vec<Record> = bytes
            .chunks_exact(RECORD_LEN)
            .map(|c| {
                let mut raw = [0u8; RECORD_LEN];
                raw.copy_from_slice(c);
                Record::decode(&raw).expect("a record")
            })
            .collect();
        let kept = (next - lost) as usize;
        assert_eq!(records.len(), kept + 1 + 64);
        assert!(records[..kept]
            .iter()
            .enumerate()
            .all(|(i, r)| r.kind == Kind::Alloc && r.ptr == i as u64));
        assert_eq!(
            (records[kept].kind, records[kept].size),
            (Kind::LiveDropped, lost)
        );
        assert_eq!(records[kept + 1].ptr, next);
        assert_eq!(client.lost, 0);
    }

    /// A fresh directory of this test process under the system's temporary one.
    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("memprof-shim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[test]
    fn listens_in_a_directory_deeper_than_a_socket_address_holds() {
        let top = temp("deep");
        let mut dir = top.join("memprof");
        while memprof_wire::socket_path(&dir, 42).as_os_str().len() <= memprof_wire::MAX_SOCKET_PATH
        {
            dir = dir.join("deeper");
        }
        // The deepest one is made by `listen`, mode 0700, as the runtime directory's would be.
        std::fs::create_dir_all(dir.parent().expect("a parent")).expect("mkdir");
        let (listener, path) = listen(&dir, 42).expect("listens");
        assert_eq!(path, memprof_wire::socket_path(&dir, 42));
        let mode = std::fs::metadata(&path)
            .expect("the socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _client = memprof_wire::at_socket_path(&path, |p| UnixStream::connect(p))
            .expect("connects by the path");
        listener.set_nonblocking(false).expect("blocking");
        assert!(listener.accept().is_ok());
        std::fs::remove_dir_all(&top).expect("cleaned up");
    }

    #[test]
    fn a_directory_others_may_enter_is_refused_and_the_line_says_why() {
        let top = temp("open");
        let dir = top.join("memprof");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let why = listen(&dir, 42).map(|_| ()).expect_err("refused");
        assert_eq!(why, "other users may enter it (mode 755, expected 700)");
        assert!(!memprof_wire::socket_path(&dir, 42).exists());
        let line = no_live_view(42, &dir, &why);
        assert_eq!(
            line,
            format!(
                "memprof: no live view of PID 42 (memprof attach, top and agent will not see it): \
                 cannot listen in {}: {why}; the recording to the file goes on\n",
                dir.display()
            )
        );
        let odd = no_live_view(42, Path::new("/run/\x1b[31m"), "x");
        assert!(odd.contains("/run/\\u{1b}[31m"), "{odd}");
        std::fs::remove_dir_all(&top).expect("cleaned up");
    }
}
