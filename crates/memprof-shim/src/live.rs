//! The live socket: while a process records, the shim listens on a Unix socket named after its
//! pid and streams the recording's bytes to every connected client. Only the writer thread
//! touches it, and only with non-blocking calls and bounded work per round, so the hooks never
//! wait on a client.
//!
//! Where: `$XDG_RUNTIME_DIR/memprof/<pid>.sock`, or `/tmp/memprof-<uid>/<pid>.sock` without
//! `XDG_RUNTIME_DIR` (or with a relative one); the directory is made mode 0700 and must belong to
//! this user, the socket is mode 0600, and a client whose peer credentials are not this user's
//! (or root's) is closed at once. A path longer than a socket address holds (a deep runtime
//! directory) is bound through a descriptor of its directory (`memprof_wire::at_socket_path`),
//! so the socket is still where clients look. When no socket can be made the process says so
//! once on stderr, and records to its file all the same. What a client gets: the header and
//! process block, every stack and mapping definition drained so far (`definitions.rs`, copied in
//! pieces as the snapshot is, so that it can name the library of every record it gets), the
//! records of what is alive (`table.rs`, flagged `FLAG_SNAPSHOT`; everything
//! drained before it was accepted, which the writer does first each round) and a `LiveDropped`
//! record of 0 flagged so that ends them, then the records drained after that, then the trailer
//! when the process ends. The end mark waits until every record stamped before the client was
//! accepted has been drained (the merge holds some back to keep time order: `buffers.rs`), so
//! that at the mark the client has at least what the process had done when it connected. The
//! snapshot is copied in pieces as the client reads it (at most
//! `ROUND_RECORDS` a writer round for all clients); records drained meanwhile that change what
//! the client already has come unflagged among the snapshot's, so that at the mark it holds what
//! is alive then. Definitions drained later come before the records that name them; they are
//! never lost, only held back while the client's buffer is full (records are then lost instead:
//! a record never comes before its definitions). A client that reads too slowly loses whole records (never part of one); the
//! next thing it gets is a `LiveDropped` record counting them. A client with bytes to read that
//! reads none for `STALL_TIMEOUT` is dropped; a client that connects while `MAX_CLIENTS` are
//! connected takes the place of the one that has gone longest without reading what it has
//! (refused only when every one has read everything). Each client holds at most
//! `MAX_PENDING` bytes (`live_client.rs`). The socket file is removed at exit.

use crate::definitions::Definitions;
use crate::live_client::{Client, STALL_TIMEOUT};
use crate::table::Table;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// At most this many clients at once.
const MAX_CLIENTS: usize = 8;
/// Connections taken per writer round (more wait in the listen queue for the next).
const MAX_ACCEPTS: usize = 64;
/// Snapshot records copied per writer round, for all clients together.
const ROUND_RECORDS: usize = 8192;
/// Tries, 1 ms apart, to hand the last bytes to the clients at exit.
const CLOSE_TRIES: u32 = 50;

fn socket_dir() -> PathBuf {
    memprof_wire::socket_dir(std::env::var_os("XDG_RUNTIME_DIR").as_deref(), uid())
}

fn uid() -> u32 {
    // SAFETY: getuid takes no arguments and cannot fail.
    unsafe { libc::getuid() }
}

/// The listening socket and its clients.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    /// The header and process block every client gets first.
    head: Vec<u8>,
    /// What is alive, and every definition so far, for clients that connect later.
    table: Table,
    defs: Definitions,
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
                defs: Definitions::default(),
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

    /// One writer round: sends what clients wait for and drops those gone or stalled, takes
    /// the clients waiting to connect, and copies the next pieces of the snapshots (a snapshot
    /// must reach a client of an idle process too). `floor`: every record stamped before it
    /// has been drained. True when a snapshot could take more at once (the writer then comes
    /// back without sleeping).
    pub fn accept(&mut self, floor: u64) -> bool {
        let now = Instant::now();
        self.clients.retain_mut(|client| {
            client.flush(now)
                && client
                    .stalled_since()
                    .is_none_or(|since| now.duration_since(since) < STALL_TIMEOUT)
        });
        for _ in 0..MAX_ACCEPTS {
            let Ok((stream, _)) = self.listener.accept() else {
                break;
            };
            if !same_user(&stream) || stream.set_nonblocking(true).is_err() || !self.make_room() {
                continue;
            }
            // Read after the connection was taken: every record of a call that returned
            // before the client connected is stamped earlier.
            let accepted_ns = crate::recorder::now_ns();
            self.clients
                .push(Client::new(stream, &self.head, now, accepted_ns));
        }
        let mut budget = ROUND_RECORDS;
        let mut more = false;
        // Each round another client has the first go at the budget.
        if !self.clients.is_empty() {
            self.clients.rotate_left(1);
        }
        for client in &mut self.clients {
            more |= client.pump(&self.table, &self.defs, &mut budget, now, floor);
        }
        self.clients.retain(Client::alive);
        more
    }

    /// Whether a new client can join: there is room, or the client that has gone longest
    /// without reading what it has was dropped to make some.
    fn make_room(&mut self) -> bool {
        if self.clients.len() < MAX_CLIENTS {
            return true;
        }
        let oldest = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(i, client)| client.stalled_since().map(|since| (since, i)))
            .min();
        match oldest {
            Some((_, i)) => {
                self.clients.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Sends the definitions `defs` and the records of `batch` that may name them (both whole)
    /// to every client, without blocking.
    pub fn send(&mut self, defs: &[u8], batch: &[u8]) {
        self.defs.append(defs);
        self.table.apply_all(batch);
        let now = Instant::now();
        for client in &mut self.clients {
            client.send(batch, &self.defs, now);
        }
        self.clients.retain(Client::alive);
    }

    /// Sends `trailer` after everything queued (and after the rest of a snapshot being
    /// copied), waiting a little for slow clients, then removes the socket.
    pub fn close(&mut self, trailer: &[u8]) {
        let mut ended = vec![false; self.clients.len()];
        for _ in 0..CLOSE_TRIES {
            let now = Instant::now();
            let mut budget = usize::MAX;
            for (client, ended) in self.clients.iter_mut().zip(&mut ended) {
                // Everything has been drained.
                client.pump(&self.table, &self.defs, &mut budget, now, u64::MAX);
                if client.caught_up(&self.defs) && !*ended {
                    client.send(trailer, &self.defs, now);
                    *ended = true;
                }
            }
            let done = self
                .clients
                .iter()
                .zip(&ended)
                .all(|(client, &ended)| !client.alive() || (ended && client.idle()));
            if done {
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
