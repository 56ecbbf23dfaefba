//! One member of a zip archive, found by reading the archive's local headers in order, as a
//! stream (a pipe works as well as a file): the `data.pkl` of a `torch.save` archive. The
//! members before it are skipped unread; none is ever decoded.
//!
//! Layout (PKWARE APPNOTE 4.3.7, 4.5.3): each member is a 30-byte local header (signature
//! `PK\x03\x04`), its name and extra field, then its data; the central directory (`PK\x01\x02`)
//! follows the last member. `torch.save` writes `data.pkl` first, stored (method 0), and its
//! local header may leave the sizes to a data descriptor after the data (flag bit 3).

use std::io::{self, Read};

/// Signature of a local file header.
const LOCAL: [u8; 4] = *b"PK\x03\x04";
/// Flag bit 3: the sizes and CRC are in a data descriptor after the data.
const SIZES_AFTER: u16 = 1 << 3;
/// Flag bit 0: the member is encrypted.
const ENCRYPTED: u16 = 1;
/// The zip64 extended-information extra field's id.
const ZIP64_EXTRA: u16 = 1;
/// Member names listed when the wanted one is not there.
const NAMES_SHOWN: usize = 5;

/// Why the member could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ZipError {
    #[error("cannot read the zip archive")]
    Io(#[source] io::Error),
    #[error("the zip archive ends inside a member")]
    Truncated,
    #[error(
        "a zip archive without {wanted} (members: {members}); memprof reads the archive \
             torch.save writes of a memory snapshot"
    )]
    Missing { wanted: String, members: String },
    #[error(
        "zip member {name} is compressed with method {method}; memprof reads stored \
             (0) and deflated (8) members"
    )]
    Method { name: String, method: u16 },
    #[error("zip member {name} is encrypted")]
    Encrypted { name: String },
    #[error(
        "zip member {name} gives its size only after its data, so the members after it \
             cannot be reached in a stream"
    )]
    UnknownSize { name: String },
    #[error("not a zip archive past byte {at}: expected a member's header")]
    Damaged { at: u64 },
}

impl From<io::Error> for ZipError {
    fn from(e: io::Error) -> ZipError {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => ZipError::Truncated,
            _ => ZipError::Io(e),
        }
    }
}

/// The data of the member that `wanted` accepts (by its name), decompressed; it ends where
/// the member does when the header gives its size, else where the input does (a pickle stops
/// at its own end).
pub fn member<R: Read + Send + 'static>(
    mut input: R,
    wanted: impl Fn(&str) -> bool,
    wanted_name: &str,
) -> Result<(String, Box<dyn Read + Send>), ZipError> {
    let mut names = Vec::new();
    let mut at = 0u64;
    loop {
        let mut header = [0u8; 30];
        match input.read_exact(&mut header[..4]) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(missing(wanted_name, &names))
            }
            Err(e) => return Err(e.into()),
        }
        if header[..4] != LOCAL {
            // The central directory, or the end record: no member left.
            if header[..2] == *b"PK" {
                return Err(missing(wanted_name, &names));
            }
            return Err(ZipError::Damaged { at });
        }
        input.read_exact(&mut header[4..])?;
        let u16_at = |i: usize| u16::from_le_bytes([header[i], header[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let flags = u16_at(6);
        let method = u16_at(8);
        let mut size = u64::from(u32_at(18));
        let mut name = vec![0u8; usize::from(u16_at(26))];
        input.read_exact(&mut name)?;
        let mut extra = vec![0u8; usize::from(u16_at(28))];
        input.read_exact(&mut extra)?;
        if size == u64::from(u32::MAX) {
            size = zip64_size(&extra, u32_at(22) == u32::MAX).unwrap_or(size);
        }
        at += 30 + name.len() as u64 + extra.len() as u64;
        let name = String::from_utf8_lossy(&name).into_owned();
        let sized = flags & SIZES_AFTER == 0 || size != 0;
        if wanted(&name) {
            if flags & ENCRYPTED != 0 {
                return Err(ZipError::Encrypted { name });
            }
            let data: Box<dyn Read + Send> = if sized {
                Box::new(input.take(size))
            } else {
                Box::new(input)
            };
            return match method {
                0 => Ok((name, data)),
                8 => Ok((name, Box::new(flate2::read::DeflateDecoder::new(data)))),
                method => Err(ZipError::Method { name, method }),
            };
        }
        if !sized {
            return Err(ZipError::UnknownSize { name });
        }
        let skipped = io::copy(&mut (&mut input).take(size), &mut io::sink())?;
        if skipped < size {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        at += size;
        if flags & SIZES_AFTER != 0 {
            at += skip_descriptor(&mut input, size > u64::from(u32::MAX))?;
        }
        names.push(name);
    }
}

/// The compressed size in a zip64 extra field (after the uncompressed size, which is there
/// only when the header's own is 0xFFFFFFFF).
fn zip64_size(extra: &[u8], has_uncompressed: bool) -> Option<u64> {
    let mut rest = extra;
    while rest.len() >= 4 {
        let id = u16::from_le_bytes([rest[0], rest[1]]);
        let len = usize::from(u16::from_le_bytes([rest[2], rest[3]]));
        let body = rest.get(4..4 + len)?;
        if id == ZIP64_EXTRA {
            let from = if has_uncompressed { 8 } else { 0 };
            let bytes = body.get(from..from + 8)?;
            return Some(u64::from_le_bytes(bytes.try_into().ok()?));
        }
        rest = &rest[4 + len..];
    }
    None
}

/// Skips a data descriptor (optional signature, CRC, two sizes); returns its length.
fn skip_descriptor(input: &mut impl Read, zip64: bool) -> io::Result<u64> {
    let sizes = if zip64 { 16 } else { 8 };
    let mut first = [0u8; 4];
    input.read_exact(&mut first)?;
    // Without the optional signature, `first` was the CRC.
    let rest = if first == *b"PK\x07\x08" {
        4 + sizes
    } else {
        sizes
    };
    let mut skip = vec![0u8; rest];
    input.read_exact(&mut skip)?;
    Ok(4 + rest as u64)
}

fn missing(wanted: &str, names: &[String]) -> ZipError {
    let mut members: Vec<String> = names.iter().take(NAMES_SHOWN).cloned().collect();
    if names.len() > NAMES_SHOWN {
        members.push(format!("and {} more", names.len() - NAMES_SHOWN));
    }
    if members.is_empty() {
        members.push("none".into());
    }
    ZipError::Missing {
        wanted: wanted.into(),
        members: members.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zip of stored members, each with its sizes in its local header.
    fn stored(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in members {
            out.extend_from_slice(&LOCAL);
            out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            let len = u32::try_from(data.len()).expect("small");
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            let name_len = u16::try_from(name.len()).expect("short");
            out.extend_from_slice(&name_len.to_le_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(data);
        }
        out.extend_from_slice(b"PK\x05\x06");
        out
    }

    fn is_pkl(name: &str) -> bool {
        name.ends_with("data.pkl")
    }

    #[test]
    fn finds_a_member_after_others() {
        let zip = stored(&[("a/version", b"3\n"), ("a/data.pkl", b"pickle")]);
        let (name, mut data) =
            member(std::io::Cursor::new(zip.clone()), is_pkl, "data.pkl").expect("found");
        let mut got = Vec::new();
        data.read_to_end(&mut got).expect("read");
        assert_eq!(
            (name.as_str(), got.as_slice()),
            ("a/data.pkl", &b"pickle"[..])
        );
    }

    #[test]
    fn names_the_members_when_the_wanted_one_is_absent() {
        let zip = stored(&[("x.txt", b"1"), ("y.bin", b"22")]);
        let e = member(std::io::Cursor::new(zip.clone()), is_pkl, "data.pkl")
            .err()
            .expect("refused");
        assert_eq!(
            e.to_string(),
            "a zip archive without data.pkl (members: x.txt, y.bin); memprof reads the archive \
             torch.save writes of a memory snapshot"
        );
    }

    #[test]
    fn refuses_a_member_it_cannot_size_before_the_wanted_one() {
        let mut zip = stored(&[("first", b""), ("a/data.pkl", b"p")]);
        zip[6] = SIZES_AFTER as u8;
        let e = member(std::io::Cursor::new(zip.clone()), is_pkl, "data.pkl")
            .err()
            .expect("refused");
        assert!(matches!(e, ZipError::UnknownSize { .. }), "{e}");
    }

    #[test]
    fn a_cut_header_is_an_error_not_a_panic() {
        let zip = stored(&[("a/data.pkl", b"pickle")]);
        for cut in 1..34 {
            assert!(
                member(
                    std::io::Cursor::new(zip[..cut].to_vec()),
                    is_pkl,
                    "data.pkl"
                )
                .is_err(),
                "cut at {cut}"
            );
        }
    }
}
