//! Opening input files: the one place `cli` turns a path into a snapshot (a PyTorch snapshot
//! pickle, or a `torch.save` zip archive of one, or a memprof recording; any of them may be
//! gzip-compressed), with a progress bar on a terminal for big files. Every input is opened
//! once and read once, as a stream, so a pipe (`/dev/stdin`, `<(…)`) reads as a file does.

use crate::analysis::layout_warnings;
use crate::model::Snapshot;
use crate::source::driver_state::Keeper;
use crate::source::pickle::DecodeErrorKind;
use crate::source::prefetch::{Prefetch, PrefetchReader};
use crate::source::recording::{self, RecordingInfo};
use crate::source::sniff::{sniff, Format, HEAD_LEN};
use crate::source::torch_snapshot::{self, Parsed, SnapshotError};
use crate::source::zip_member;
use anyhow::{anyhow, bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use std::fs::File;
use std::io::{Cursor, IsTerminal, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Files at least this large get a progress bar (on a terminal, without --json).
const PROGRESS_FROM_BYTES: u64 = 32 << 20;

/// A snapshot read from a file, with the file's size.
pub struct Loaded {
    pub parsed: Parsed,
    /// The file's size (for a pipe, the bytes read from it).
    pub bytes: u64,
    /// What a memprof recording says beyond the model; `None` for a PyTorch snapshot.
    pub recording: Option<RecordingInfo>,
}

/// What holds the snapshot or recording in the file.
enum Container {
    Plain,
    Gzip,
    /// A zip archive's member, by name.
    Zip(String),
}

/// An input opened and its first bytes read, not yet decoded.
pub struct Opened {
    /// What `head` and `rest` hold, once a gzip layer or a zip archive is taken off.
    format: Format,
    container: Container,
    head: Vec<u8>,
    rest: Box<dyn Read + Send>,
    /// The file's size, when it is a regular file.
    size: Option<u64>,
    /// Bytes read from the file so far.
    read: Arc<AtomicU64>,
    bar: Option<ProgressBar>,
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Up to [`HEAD_LEN`] bytes from the start of `input` (fewer only at its end: a pipe may hand
/// them over a few at a time).
fn read_head(input: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(HEAD_LEN);
    input.take(HEAD_LEN as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// Opens `path` and reads its first bytes, to tell its format (taking off a gzip layer or a
/// zip archive around it). Errors name what went wrong; the caller adds the path.
pub fn open(path: &Path, progress: bool) -> anyhow::Result<Opened> {
    let meta = std::fs::metadata(path).context("cannot open")?;
    if meta.is_dir() {
        bail!("is a directory, expected a snapshot file");
    }
    let file = File::open(path).context("cannot open")?;
    let size = meta.is_file().then_some(meta.len());
    let bar = size
        .filter(|&bytes| {
            progress && bytes >= PROGRESS_FROM_BYTES && std::io::stderr().is_terminal()
        })
        .map(|bytes| {
            let bar = ProgressBar::new(bytes);
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            let name = path.file_name().unwrap_or(path.as_os_str());
            bar.set_message(format!("reading {}", name.to_string_lossy()));
            bar
        });
    let read = Arc::new(AtomicU64::new(0));
    let counted = Counted {
        inner: file,
        read: Arc::clone(&read),
    };
    let mut raw: Box<dyn Read + Send> = match &bar {
        Some(bar) => Box::new(bar.wrap_read(counted)),
        None => Box::new(counted),
    };
    let head = read_head(&mut raw).context("cannot read")?;
    let (format, container, head, rest) = match sniff(&head) {
        Format::Gzip => {
            let mut inner: Box<dyn Read + Send> = Box::new(flate2::read::MultiGzDecoder::new(
                Cursor::new(head).chain(raw),
            ));
            let head = read_head(&mut inner).context("cannot decompress (gzip)")?;
            let format = match sniff(&head) {
                Format::Gzip => bail!("gzip-compressed twice: decompress it first"),
                Format::Zip => bail!("a gzip-compressed zip archive: decompress it first"),
                Format::Other(name) => bail!("gzip-compressed {name}"),
                format => format,
            };
            (format, Container::Gzip, head, inner)
        }
        Format::Zip => {
            let (member, mut inner) =
                zip_member::member(Cursor::new(head).chain(raw), is_data_pkl, "data.pkl")?;
            let head = read_head(&mut inner)
                .with_context(|| format!("{member} in the zip archive: cannot read"))?;
            if sniff(&head) != Format::Pickle {
                bail!("{member} in the zip archive is not a pickle");
            }
            (Format::Pickle, Container::Zip(member), head, inner)
        }
        format => (format, Container::Plain, head, raw),
    };
    Ok(Opened {
        format,
        container,
        head,
        rest,
        size,
        read,
        bar,
    })
}

/// The first `n` bytes of `path` when it is a regular file that long; `None` for anything
/// else, so a pipe is never read by a look at its start.
pub fn peek(path: &Path, n: usize) -> Option<Vec<u8>> {
    // Looked at before opening: opening a named pipe waits for a writer.
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut file = File::open(path).ok()?;
    let mut head = vec![0u8; n];
    file.read_exact(&mut head).ok()?;
    Some(head)
}

/// `data.pkl` at the top of a zip archive or in its one top folder, where `torch.save` puts
/// it (`ARCHIVE/data.pkl`).
fn is_data_pkl(name: &str) -> bool {
    name == "data.pkl"
        || name
            .split_once('/')
            .is_some_and(|(top, rest)| !top.is_empty() && rest == "data.pkl")
}

impl Opened {
    /// The process a recording's header names, when the input is a recording whose header
    /// was read whole.
    pub fn recording_pid(&self) -> Option<u32> {
        if self.format != Format::Recording {
            return None;
        }
        let header = self.head.get(..memprof_wire::FILE_HEADER_LEN)?;
        memprof_wire::FileHeader::decode(header)
            .ok()
            .map(|header| header.pid)
    }
}

/// Reads a snapshot file. Errors name what went wrong; the caller adds the path.
pub fn load_snapshot(path: &Path, progress: bool) -> anyhow::Result<Loaded> {
    load_with(path, progress, ()).map(|(loaded, _)| loaded)
}

/// Reads a snapshot file as [`load_snapshot`] does; a recording also feeds `extra` (the ledger)
/// in the same pass, and gives it back.
pub fn load_with<X: Keeper>(
    path: &Path,
    progress: bool,
    extra: X,
) -> anyhow::Result<(Loaded, Option<X>)> {
    load_opened(open(path, progress)?, extra)
}

impl Opened {
    /// The input's size when it is a regular file, and a count of its bytes read so far (of
    /// the file as it is stored, before any gzip layer is taken off), which goes up while it
    /// is being loaded.
    pub fn progress(&self) -> (Option<u64>, Arc<AtomicU64>) {
        (self.size, Arc::clone(&self.read))
    }

    /// Whether the input is a memprof recording (else a snapshot, or refused by `check`).
    pub fn is_recording(&self) -> bool {
        self.format == Format::Recording
    }

    /// Refuses, from its first bytes, an input that is no snapshot or recording.
    pub fn check(&self) -> anyhow::Result<()> {
        refuse(self.format, &self.read).map_err(|e| self.container.within(e))
    }
}

/// Refuses a format that is no snapshot or recording; `read`: the bytes read.
fn refuse(format: Format, read: &AtomicU64) -> anyhow::Result<()> {
    match format {
        Format::Other(name) => bail!("not a snapshot or recording: {name}"),
        Format::RecordingCut => bail!(
            "recording header cut short: the file is {} bytes, a memprof recording's header \
             is {}",
            read.load(Ordering::Relaxed),
            memprof_wire::FILE_HEADER_LEN
        ),
        _ => Ok(()),
    }
}

impl Container {
    /// `e` said of what the container holds.
    fn within(&self, e: anyhow::Error) -> anyhow::Error {
        match self {
            Container::Plain => e,
            Container::Gzip => e.context("once decompressed (gzip)"),
            Container::Zip(member) => e.context(format!("{member} in the zip archive")),
        }
    }
}

/// Reads what [`open`] opened, as [`load_with`] does.
pub fn load_opened<X: Keeper>(opened: Opened, extra: X) -> anyhow::Result<(Loaded, Option<X>)> {
    load_opened_early(opened, extra, None)
}

/// Reads what [`open`] opened, as [`load_with`] does; a snapshot that holds its segments
/// before its trace (as PyTorch writes it) also hands them to `dump` as soon as they are read
/// (`torch_snapshot::read_early`).
pub fn load_opened_early<X: Keeper>(
    opened: Opened,
    extra: X,
    dump: Option<&mut dyn FnMut(Snapshot)>,
) -> anyhow::Result<(Loaded, Option<X>)> {
    let Opened {
        format,
        container,
        head,
        rest,
        size,
        read,
        bar,
    } = opened;
    let input = Cursor::new(head).chain(rest);
    let result = refuse(format, &read).and_then(|()| match format {
        Format::Recording => {
            // Streamed record by record: memory holds the model, not the file. Read ahead on
            // the second core, as a snapshot is.
            recording::read_with(PrefetchReader::new(input), extra)
                .map(|(read, extra)| (read.parsed, Some(read.info), Some(extra)))
                .map_err(anyhow::Error::from)
        }
        _ => match dump {
            Some(dump) => torch_snapshot::read_early(Prefetch::new(input), dump),
            None => torch_snapshot::read(Prefetch::new(input)),
        }
        .map(|parsed| (parsed, None, None))
        .map_err(|e| match (&container, e) {
            (Container::Zip(_), SnapshotError::Decode(d)) => match d.kind {
                DecodeErrorKind::Refused(op) => anyhow!(
                    "refused opcode {op} at byte {}: it {}, and a memory snapshot is \
                             plain data; this archive was saved from something other than \
                             torch.cuda.memory._snapshot()",
                    d.offset,
                    if matches!(op, "PERSID" | "BINPERSID") {
                        "refers to tensors"
                    } else {
                        "would import or call Python code (a tensor, a module?)"
                    }
                ),
                _ => d.into(),
            },
            (_, e) => e.into(),
        }),
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let (mut parsed, recording, extra) = result.map_err(|e| container.within(e))?;
    let layout = layout_warnings(&parsed.snapshot.segments);
    parsed.warnings.extend(layout);
    let loaded = Loaded {
        parsed,
        bytes: size.unwrap_or_else(|| read.load(Ordering::Relaxed)),
        recording,
    };
    Ok((loaded, extra))
}
