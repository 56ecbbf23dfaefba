//! One client of the live socket (`live.rs`): the bytes waiting for it, bounded, how far it has
//! the definitions (`definitions.rs`) and its snapshot's cursor while both are copied in pieces
//! (`table.rs`), and when it last read, so that a client that stopped reading can be dropped.
//! Never blocks: sends are non-blocking.

use crate::definitions::Definitions;
use crate::table::{Cursor, Table};
use memprof_wire::{Kind, Record, FLAG_SNAPSHOT, RECORD_LEN};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Bytes a client may have waiting to be sent; beyond, new records are dropped for it.
const MAX_PENDING: usize = 256 << 10;
/// The snapshot is copied into the waiting bytes while they are fewer than this, so that the
/// records drained meanwhile still find room.
const FILL_BELOW: usize = 64 << 10;
/// Records of the snapshot copied at a time.
const PIECE: usize = 1024;
/// A client that has had bytes to read and read none for this long is dropped.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Client {
    stream: UnixStream,
    /// Bytes accepted for this client and not yet sent.
    pending: Vec<u8>,
    /// Records dropped for this client since the last `LiveDropped` it was sent.
    lost: u64,
    /// Bytes of the definitions queued for it: it has them all when this is their length.
    defined: usize,
    /// Where its snapshot stands; `None` once the snapshot and its end mark are queued.
    snapshot: Option<Cursor>,
    /// False once a send failed (the client is gone).
    alive: bool,
    /// Bytes sent and not yet read by the client, as last seen after a send.
    unread_mark: usize,
    /// When the client last read something, or had nothing to read.
    progress: Instant,
    /// When it was accepted (`CLOCK_MONOTONIC` ns): its snapshot's end mark waits until every
    /// record stamped before has been drained.
    accepted_ns: u64,
}

/// One record of a batch (`RECORD_LEN` bytes).
fn decode(raw: &[u8]) -> Result<Record, memprof_wire::RecordError> {
    let mut record = [0u8; RECORD_LEN];
    record.copy_from_slice(raw);
    Record::decode(&record)
}

impl Client {
    /// A client that gets `head`, then the snapshot of the table; `accepted_ns` as the
    /// records' stamps count time.
    pub fn new(stream: UnixStream, head: &[u8], now: Instant, accepted_ns: u64) -> Client {
        Client {
            stream,
            pending: head.to_vec(),
            lost: 0,
            defined: 0,
            snapshot: Some(Cursor::default()),
            alive: true,
            unread_mark: 0,
            progress: now,
            accepted_ns,
        }
    }

    pub fn alive(&self) -> bool {
        self.alive
    }

    /// Whether the snapshot and its end mark, and every definition, are queued.
    pub fn caught_up(&self, defs: &Definitions) -> bool {
        self.snapshot.is_none() && self.defined == defs.len()
    }

    /// Queues the definitions it has not had, whole, as far as `MAX_PENDING` allows.
    fn define(&mut self, defs: &Definitions) {
        defs.copy(
            &mut self.defined,
            usize::MAX,
            &mut self.pending,
            |pending, len| pending + len <= MAX_PENDING,
        );
    }

    /// Whether nothing waits to be sent to it.
    pub fn idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Bytes the kernel holds for the client to read.
    fn in_socket(&self) -> usize {
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int, the bytes not yet read by the peer.
        let rc = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        if rc == 0 {
            usize::try_from(queued).unwrap_or(0)
        } else {
            0
        }
    }

    /// Since when the client has had bytes to read and read none; `None` when it has nothing
    /// to read.
    pub fn stalled_since(&self) -> Option<Instant> {
        (!self.pending.is_empty() || self.in_socket() > 0).then_some(self.progress)
    }

    /// Sends what it can without blocking, and notes whether the client read since the last
    /// send; false when the client is gone.
    pub fn flush(&mut self, now: Instant) -> bool {
        if !self.alive {
            return false;
        }
        let unread = self.in_socket();
        if unread < self.unread_mark || (unread == 0 && self.pending.is_empty()) {
            self.progress = now;
        }
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
                    self.alive = matches!(kind, ErrorKind::WouldBlock | ErrorKind::Interrupted);
                    break;
                }
            }
        }
        self.unread_mark = self.in_socket();
        self.alive
    }

    /// Queues whole records (`batch` holds `count` of them), or counts them as lost.
    pub fn queue(&mut self, batch: &[u8], count: u64) {
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

    /// Queues the drained records of `batch` that the client must get (all of them once its
    /// snapshot is queued; while it is being copied, those that change what it already has),
    /// after the definitions they may name; when those do not all fit, the records are lost.
    /// A snapshot copied whole ends with its mark before the first record stamped after the
    /// client connected.
    pub fn send(&mut self, batch: &[u8], defs: &Definitions, now: Instant) {
        if self.snapshot.is_some_and(|cursor| cursor.done()) {
            let accepted_ns = self.accepted_ns;
            let split = batch
                .chunks_exact(RECORD_LEN)
                .position(|raw| decode(raw).is_ok_and(|r| r.ts_ns >= accepted_ns))
                .map_or(batch.len(), |i| i * RECORD_LEN);
            let (before, after) = batch.split_at(split);
            self.enqueue(before, defs);
            if !after.is_empty() {
                self.end_snapshot();
                self.enqueue(after, defs);
            }
        } else {
            self.enqueue(batch, defs);
        }
        self.flush(now);
    }

    /// `send` without the mark and the flush.
    fn enqueue(&mut self, batch: &[u8], defs: &Definitions) {
        let wanted: std::borrow::Cow<[u8]> = match self.snapshot {
            None => batch.into(),
            Some(cursor) => batch
                .chunks_exact(RECORD_LEN)
                .filter(|raw| decode(raw).is_ok_and(|r| cursor.has_sent(&r)))
                .flatten()
                .copied()
                .collect::<Vec<u8>>()
                .into(),
        };
        let count = (wanted.len() / RECORD_LEN) as u64;
        // While the snapshot is copied, `pump` brings the definitions unless records need them now.
        if self.snapshot.is_none() || count > 0 {
            self.define(defs);
        }
        if self.defined < defs.len() {
            self.lost += count;
        } else {
            self.queue(&wanted, count);
        }
    }

    /// Queues the mark that ends the snapshot.
    fn end_snapshot(&mut self) {
        let mut end = Record::new(Kind::LiveDropped);
        end.flags = FLAG_SNAPSHOT;
        self.pending.extend_from_slice(&end.encode());
        self.snapshot = None;
    }

    /// Copies the next pieces of the definitions, then of the snapshot from `table` (taking them
    /// from `budget`, records and definitions this writer round may still copy) while the
    /// client takes them, and the end mark after the last once `floor` (every record stamped
    /// before it has been drained) has passed the client's acceptance; true when it could take
    /// more at once. After the snapshot, queues the definitions a full buffer held back.
    pub fn pump(
        &mut self,
        table: &Table,
        defs: &Definitions,
        budget: &mut usize,
        now: Instant,
        floor: u64,
    ) -> bool {
        while let Some(mut cursor) = self.snapshot {
            if !self.flush(now) || self.pending.len() >= FILL_BELOW {
                return false;
            }
            if *budget == 0 {
                return true;
            }
            if self.defined < defs.len() {
                // Definitions first: the snapshot's records name the stacks they define.
                let max = PIECE.min(*budget);
                *budget -= defs.copy(&mut self.defined, max, &mut self.pending, |pending, _| {
                    pending < FILL_BELOW
                });
                continue;
            }
            let copied = table.fill(&mut cursor, PIECE.min(*budget), &mut self.pending);
            *budget -= copied;
            self.snapshot = Some(cursor);
            if cursor.done() {
                if floor <= self.accepted_ns {
                    // Records of calls made before it connected may still be held back: they
                    // reach it as drained (`send`), before the mark.
                    break;
                }
                self.end_snapshot();
            }
        }
        if self.defined < defs.len() {
            self.define(defs);
        }
        self.flush(now);
        false
    }
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
            assert!(client.flush(Instant::now()), "the peer is there");
            match peer.read(&mut buf) {
                Ok(n) => into.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock && client.pending.is_empty() => return,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn pair(now: Instant) -> (Client, UnixStream) {
        let (ours, peer) = UnixStream::pair().expect("a socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        peer.set_nonblocking(true).expect("non-blocking");
        let mut client = Client::new(ours, &[], now, 0);
        client.snapshot = None;
        (client, peer)
    }

    /// Stack `id`'s definition (frames that make it this long) and an allocation naming it.
    fn defined_alloc(id: u32) -> (Vec<u8>, Vec<u8>) {
        let frames: Vec<u64> = (0..100).map(|f| u64::from(id) << 16 | f).collect();
        let mut r = Record::new(Kind::Alloc);
        r.ptr = u64::from(id) << 12;
        r.size = 4096;
        r.stack = id;
        (memprof_wire::encode_stack(id, &frames), r.encode().to_vec())
    }

    #[test]
    fn a_late_client_gets_every_definition_before_the_records_that_name_it() {
        use memprof_wire::{FileHeader, Item, ProcessInfo, RecordingReader};
        // 3000 stacks of 100 frames (2.6 MB of definitions, ten times what a client may have
        // waiting), each with an allocation alive, before the client connects.
        let (mut table, mut defs) = (Table::default(), Definitions::default());
        let mut next = 1u32;
        let mut drain = |table: &mut Table, defs: &mut Definitions, n: u32| {
            let (mut d, mut b) = (Vec::new(), Vec::new());
            for _ in 0..n {
                let (def, rec) = defined_alloc(next);
                d.extend_from_slice(&def);
                b.extend_from_slice(&rec);
                next += 1;
            }
            defs.append(&d);
            table.apply_all(&b);
            b
        };
        drain(&mut table, &mut defs, 3000);
        let (ours, mut peer) = UnixStream::pair().expect("a socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        peer.set_nonblocking(true).expect("non-blocking");
        let mut head = FileHeader {
            pid: 1,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        head.extend_from_slice(&ProcessInfo::default().encode());
        let mut client = Client::new(ours, &head, Instant::now(), 0);
        let mut bytes = Vec::new();
        let mut buf = [0u8; 1 << 16];
        // Writer rounds: a small budget, new stacks and records drained between pieces, the
        // client reading what it gets, until it has the snapshot and every definition.
        let mut rounds = 0;
        while !client.caught_up(&defs) || !client.idle() {
            let mut budget = 256;
            client.pump(&table, &defs, &mut budget, Instant::now(), 1);
            let batch = drain(&mut table, &mut defs, 3);
            client.send(&batch, &defs, Instant::now());
            if let Ok(n) = peer.read(&mut buf) {
                bytes.extend_from_slice(&buf[..n]);
            }
            rounds += 1;
            assert!(rounds < 100_000, "never caught up");
        }
        while let Ok(n) = peer.read(&mut buf) {
            bytes.extend_from_slice(&buf[..n]);
        }
        let mut reader = RecordingReader::new(&bytes[..]).expect("a stream");
        let mut known = std::collections::BTreeSet::new();
        let (mut named, mut lost) = (0u32, 0);
        while let Some(item) = reader.next_item().expect("whole items") {
            match item {
                Item::Stack { id, .. } => assert!(known.insert(id), "stack {id} twice"),
                Item::Event { record, .. } if record.kind == Kind::LiveDropped => {
                    lost += record.size;
                }
                Item::Event { record, .. } => {
                    assert!(known.contains(&record.stack), "{record:?} before its stack");
                    named += 1;
                }
                Item::Mapping(_) => {}
            }
        }
        // Every stack drained before and while it connected, each once.
        assert_eq!(known.len() as u32, next - 1);
        assert!(named >= 3000, "{named} records, {lost} lost");
    }

    #[test]
    fn the_end_mark_waits_for_the_records_stamped_before_the_client_connected() {
        // One allocation drained before the client was accepted (at 100 ns), one stamped
        // before and held back by the merge, one stamped after.
        let (mut table, defs) = (Table::default(), Definitions::default());
        table.apply_all(&batch(1, 1));
        let (ours, mut peer) = UnixStream::pair().expect("a socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        peer.set_nonblocking(true).expect("non-blocking");
        let mut client = Client::new(ours, &[], Instant::now(), 100);
        let mut budget = usize::MAX;
        client.pump(&table, &defs, &mut budget, Instant::now(), 100);
        assert!(!client.caught_up(&defs), "the floor has not passed it");
        // Drained in one batch: one stamped before it connected, one after.
        let stamped = |ptr: u64, ts_ns: u64| {
            let mut r = Record::new(Kind::Alloc);
            (r.ptr, r.ts_ns) = (ptr, ts_ns);
            r.encode()
        };
        let drained = [stamped(2, 99), stamped(3, 100)].concat();
        table.apply_all(&drained);
        client.send(&drained, &defs, Instant::now());
        assert!(
            client.caught_up(&defs),
            "the mark went before the later one"
        );
        client.pump(&table, &defs, &mut budget, Instant::now(), 101);
        let mut bytes = Vec::new();
        read_all(&mut client, &mut peer, &mut bytes);
        let got: Vec<(Kind, u64, bool)> = bytes
            .chunks_exact(RECORD_LEN)
            .map(|c| {
                let r = decode(c).expect("a record");
                (r.kind, r.ptr, r.flags & FLAG_SNAPSHOT != 0)
            })
            .collect();
        assert_eq!(
            got,
            [
                (Kind::Alloc, 1, true),
                (Kind::Alloc, 2, false),
                (Kind::LiveDropped, 0, true),
                (Kind::Alloc, 3, false)
            ],
            "the snapshot, what was held back, the mark, then the stream"
        );
    }

    #[test]
    fn a_slow_client_loses_whole_records_and_is_told_how_many() {
        let (mut client, mut peer) = pair(Instant::now());
        // The peer reads nothing until the socket and the pending buffer are full.
        let mut next = 0;
        while client.lost == 0 {
            client.queue(&batch(next, 64), 64);
            assert!(client.flush(Instant::now()));
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
            .map(|c| decode(c).expect("a record"))
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

    #[test]
    fn a_client_that_reads_nothing_stalls_and_one_that_reads_does_not() {
        let start = Instant::now();
        let (mut client, mut peer) = pair(start);
        assert_eq!(client.stalled_since(), None, "nothing to read yet");
        client.queue(&batch(0, 4), 4);
        assert!(client.flush(start));
        assert_eq!(
            client.stalled_since(),
            Some(start),
            "unread bytes in the socket"
        );
        let later = start + Duration::from_secs(1);
        client.queue(&batch(4, 4), 4);
        assert!(client.flush(later));
        assert_eq!(
            client.stalled_since(),
            Some(start),
            "still unread: no progress"
        );
        // The kernel counts a send as read once all of it is.
        let mut first = [0u8; 256];
        peer.read_exact(&mut first).expect("reads the first send");
        assert!(client.flush(later));
        assert_eq!(client.stalled_since(), Some(later), "it read");
        let mut rest = [0u8; 256];
        peer.read_exact(&mut rest).expect("reads the rest");
        assert!(client.flush(later));
        assert_eq!(client.stalled_since(), None, "all read");
        drop(peer);
        client.queue(&batch(4, 1), 1);
        assert!(!client.flush(later), "gone");
        assert!(!client.alive());
    }
}
