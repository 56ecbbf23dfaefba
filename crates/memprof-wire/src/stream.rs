//! Reading a recording from any `Read`, one item at a time, so that a reader never holds the
//! file (or its records) whole: the header and process block first, then each event, stack
//! definition and mapping definition in file order, then how the recording ended.
//! [`crate::decode_recording`] collects these items for a recording already in memory.

use crate::{
    decode_header, padded, payload_len, u64_at, DecodeError, FileHeader, HeaderError, Kind,
    Mapping, ProcessInfo, Record, RecordError, FILE_HEADER_LEN, MAX_PROCESS_BLOCK, RECORD_LEN,
    STACKS_VERSION,
};
use std::io::{ErrorKind, Read};

/// One item of a recording, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// An event: `index` counts events only (from 0), `offset` is its byte offset in the file.
    Event {
        index: usize,
        offset: usize,
        record: Record,
    },
    /// Call stack `id`: return addresses, innermost first.
    Stack { id: u32, frames: Vec<u64> },
    /// An executable file mapping of the process.
    Mapping(Mapping),
}

/// How a recording ended, known once [`RecordingReader::next_item`] has returned `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ending {
    /// `Some(dropped)` when the recording ends with a trailer; `None` when it was cut short.
    pub dropped: Option<u64>,
    /// Events written late because the hook waited for room (0 without a trailer).
    pub delayed: u64,
    /// Bytes at the end that do not make a whole record (or definition).
    pub trailing_bytes: usize,
}

/// Why a recording could not be read from a stream: its bytes, or the stream itself.
#[derive(Debug)]
pub enum StreamError {
    Decode(DecodeError),
    Io(std::io::Error),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Decode(e) => e.fmt(f),
            StreamError::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

impl std::error::Error for StreamError {}

impl From<std::io::Error> for StreamError {
    fn from(e: std::io::Error) -> StreamError {
        StreamError::Io(e)
    }
}

/// A recording read item by item from `R` (see the module documentation).
pub struct RecordingReader<R> {
    input: R,
    pub header: FileHeader,
    /// The format version the file was written in.
    pub version: u32,
    /// The process block; `None` in a version-1 recording.
    pub process: Option<ProcessInfo>,
    /// Byte offset of the first record.
    pub records_at: usize,
    /// Byte offset of the next record.
    at: usize,
    /// Records read so far, definitions included.
    index: usize,
    /// Events read so far.
    events: usize,
    ending: Option<Ending>,
}

/// Reads into `buf` until it is full or the input ends; returns the bytes read.
fn fill(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> RecordingReader<R> {
    /// Reads the header and the process block.
    pub fn new(mut input: R) -> Result<RecordingReader<R>, StreamError> {
        let header_error = |e| StreamError::Decode(DecodeError::Header(e));
        let mut head = [0u8; FILE_HEADER_LEN];
        let n = fill(&mut input, &mut head)?;
        let header = FileHeader::decode(&head[..n]).map_err(header_error)?;
        let version = decode_header(&head[..n]).map_err(header_error)?;
        let (process, records_at) = if version >= 2 {
            let cut = HeaderError::BadProcessBlock("cut short");
            let mut block = vec![0u8; 4];
            if fill(&mut input, &mut block)? < 4 {
                return Err(header_error(cut));
            }
            let len = u32::from_le_bytes([block[0], block[1], block[2], block[3]]) as usize;
            if len > MAX_PROCESS_BLOCK {
                return Err(header_error(HeaderError::BadProcessBlock(
                    "longer than 1 MiB",
                )));
            }
            block.resize(4 + len, 0);
            if fill(&mut input, &mut block[4..])? < len {
                return Err(header_error(cut));
            }
            let (info, taken) = ProcessInfo::decode(&block).map_err(header_error)?;
            (Some(info), FILE_HEADER_LEN + taken)
        } else {
            (None, FILE_HEADER_LEN)
        };
        Ok(RecordingReader {
            input,
            header,
            version,
            process,
            records_at,
            at: records_at,
            index: 0,
            events: 0,
            ending: None,
        })
    }

    /// How the recording ended; `None` until [`Self::next_item`] has returned `None`.
    pub fn ending(&self) -> Option<Ending> {
        self.ending
    }

    /// Events read so far.
    pub fn events(&self) -> usize {
        self.events
    }

    fn end(&mut self, ending: Ending) -> Result<Option<Item>, StreamError> {
        self.ending = Some(ending);
        Ok(None)
    }

    /// The next item; `None` at the trailer (records after it are not read), at the end of the
    /// input, or at a partial last record or definition (a killed program leaves one).
    pub fn next_item(&mut self) -> Result<Option<Item>, StreamError> {
        if self.ending.is_some() {
            return Ok(None);
        }
        let mut raw = [0u8; RECORD_LEN];
        let n = fill(&mut self.input, &mut raw)?;
        if n < RECORD_LEN {
            return self.end(Ending {
                trailing_bytes: n,
                ..Ending::default()
            });
        }
        let (index, offset) = (self.index, self.at);
        let fail = |error| {
            StreamError::Decode(DecodeError::Record {
                index,
                offset,
                error,
            })
        };
        let mut record = Record::decode(&raw).map_err(fail)?;
        if self.version < record.kind.since() {
            return Err(fail(RecordError::UnknownKind(record.kind as u16)));
        }
        if self.version < STACKS_VERSION {
            // The reserved word: not a stack id before version 3.
            record.stack = 0;
        }
        if record.kind == Kind::Trailer {
            return self.end(Ending {
                dropped: Some(record.aux),
                delayed: record.stream,
                trailing_bytes: 0,
            });
        }
        let len = payload_len(&record).map_err(fail)?;
        // Only definitions have a payload: an event needs no buffer.
        let mut payload = Vec::new();
        if len > 0 {
            payload = vec![0u8; padded(len)];
            let got = fill(&mut self.input, &mut payload)?;
            if got < payload.len() {
                return self.end(Ending {
                    trailing_bytes: RECORD_LEN + got,
                    ..Ending::default()
                });
            }
            payload.truncate(len);
        }
        self.at += RECORD_LEN + padded(len);
        self.index += 1;
        Ok(Some(match record.kind {
            Kind::Stack => Item::Stack {
                id: record.aux as u32,
                frames: payload.chunks_exact(8).map(|w| u64_at(w, 0)).collect(),
            },
            Kind::Mapping => Item::Mapping(Mapping {
                start: record.ptr,
                len: record.size,
                file_offset: record.aux,
                path: payload,
            }),
            _ => {
                self.events += 1;
                Item::Event {
                    index: self.events - 1,
                    offset,
                    record,
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_recording, encode_mapping, encode_stack, Recording, VERSION};

    /// A reader that hands out at most `step` bytes a call, as a pipe or socket may.
    struct Trickle<'a> {
        bytes: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    fn file() -> Vec<u8> {
        let mut out = FileHeader {
            pid: 9,
            start_ns: 5,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(
            &ProcessInfo {
                host: Some("h".into()),
                ..ProcessInfo::default()
            }
            .encode(),
        );
        out.extend_from_slice(&encode_mapping(&Mapping {
            start: 0x1000,
            len: 0x100,
            file_offset: 0,
            path: b"/lib/x.so".to_vec(),
        }));
        out.extend_from_slice(&encode_stack(3, &[0x1010, 0x1020]));
        for i in 0..5u64 {
            let mut r = Record::new(if i % 2 == 0 { Kind::Alloc } else { Kind::Free });
            r.ptr = 0x100 * (i / 2 + 1);
            r.size = 64;
            r.stack = 3;
            out.extend_from_slice(&r.encode());
        }
        out
    }

    /// Everything read item by item from `input`, gathered as `decode_recording` gathers it.
    fn gather(input: impl Read) -> Result<(Vec<Item>, Ending), StreamError> {
        let mut reader = RecordingReader::new(input)?;
        assert_eq!(reader.version, VERSION);
        let mut items = Vec::new();
        while let Some(item) = reader.next_item()? {
            items.push(item);
        }
        Ok((items, reader.ending().expect("ended")))
    }

    #[test]
    fn a_recording_read_in_small_pieces_is_read_as_it_is_whole() {
        let bytes = file();
        for cut in [bytes.len(), bytes.len() - 1, bytes.len() - 70] {
            let whole: Recording = decode_recording(&bytes[..cut]).expect("readable");
            for step in [1, 3, 64, 1000] {
                let input = Trickle {
                    bytes: &bytes[..cut],
                    step,
                };
                let (items, ending) = gather(input).expect("readable");
                let events: Vec<(usize, Record)> = (items.iter())
                    .filter_map(|i| match i {
                        Item::Event { offset, record, .. } => Some((*offset, *record)),
                        _ => None,
                    })
                    .collect();
                let expected: Vec<(usize, Record)> = (whole.offsets.iter().copied())
                    .zip(whole.records.iter().copied())
                    .collect();
                assert_eq!(events, expected, "cut {cut}, step {step}");
                assert!(items.contains(&Item::Stack {
                    id: 3,
                    frames: vec![0x1010, 0x1020]
                }));
                assert_eq!(ending.trailing_bytes, whole.trailing_bytes, "cut {cut}");
            }
        }
    }

    /// A stream that fails after some bytes.
    struct Failing(usize);

    impl Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let bytes = file();
            if self.0 >= 200 {
                return Err(std::io::Error::other("disk gone"));
            }
            let n = buf.len().min(200 - self.0);
            buf[..n].copy_from_slice(&bytes[self.0..self.0 + n]);
            self.0 += n;
            Ok(n)
        }
    }

    #[test]
    fn a_failing_stream_is_an_io_error_not_a_cut_recording() {
        let err = gather(Failing(0)).map(|_| ()).expect_err("fails");
        assert!(matches!(err, StreamError::Io(_)), "{err:?}");
        assert_eq!(err.to_string(), "cannot read: disk gone");
    }
}
