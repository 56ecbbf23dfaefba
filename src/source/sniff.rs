//! What an input holds, told from its first bytes: the formats memprof reads (a snapshot
//! pickle, a memprof recording, either gzip-compressed, a `torch.save` zip archive) and, for
//! the others, a name to refuse them by.

/// Bytes of the start of an input that [`sniff`] is given (fewer when the input is shorter).
pub const HEAD_LEN: usize = 4096;

/// What an input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A memprof recording (its magic).
    Recording,
    /// The start of a recording's magic, and then the end of the input.
    RecordingCut,
    /// gzip-compressed data (what is inside is sniffed again once decompressed).
    Gzip,
    /// A zip archive, such as `torch.save` writes.
    Zip,
    /// A format memprof does not read, by name.
    Other(&'static str),
    /// Anything else: read as a pickle, whose decoder says where it goes wrong.
    Pickle,
}

/// Tells the format of an input from `head`, its first bytes (up to [`HEAD_LEN`]; all of it
/// when shorter).
pub fn sniff(head: &[u8]) -> Format {
    let magic = memprof_wire::MAGIC;
    if head.starts_with(magic) {
        return Format::Recording;
    }
    if !head.is_empty() && head.len() < magic.len() && magic.starts_with(head) {
        return Format::RecordingCut;
    }
    match head {
        [0x1f, 0x8b, ..] => return Format::Gzip,
        [b'P', b'K', 3, 4, ..] => return Format::Zip,
        [b'P', b'K', 5, 6, ..] => return Format::Other("an empty zip archive"),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            return Format::Other("zstd-compressed data (decompress it first: zstd -d)")
        }
        [b'B', b'Z', b'h', ..] => {
            return Format::Other("bzip2-compressed data (decompress it first: bunzip2)")
        }
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => {
            return Format::Other("xz-compressed data (decompress it first: unxz)")
        }
        [0x7f, b'E', b'L', b'F', ..] => return Format::Other("an ELF executable or library"),
        _ => {}
    }
    let text = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let first = text.iter().position(|b| !b.is_ascii_whitespace());
    match first.map(|i| (text[i], &text[i..])) {
        Some((b'{' | b'[', rest)) => Format::Other(json_kind(rest)),
        Some((b'<', _)) => Format::Other(
            "an HTML or XML page (such as PyTorch's memory_viz exports), not the snapshot it \
             was made from",
        ),
        _ => Format::Pickle,
    }
}

/// Names JSON by what its first keys show.
fn json_kind(text: &[u8]) -> &'static str {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    if has(b"\"traceEvents\"") {
        "JSON in the Chrome trace format (such as torch.profiler exports), not a memory snapshot"
    } else if has(b"\"device_traces\"") || has(b"\"segments\"") {
        "JSON holding a snapshot's keys: a snapshot converted by another tool; give memprof the \
         pickle PyTorch wrote"
    } else if has(b"\"inputs\"") && has(b"\"memprof\"") {
        "JSON written by memprof (--json), not a snapshot"
    } else {
        "JSON, not a memory snapshot"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_format_by_its_first_bytes() {
        let cases: [(&[u8], Format); 10] = [
            (memprof_wire::MAGIC, Format::Recording),
            (&memprof_wire::MAGIC[..3], Format::RecordingCut),
            (b"\x1f\x8b\x08\x00", Format::Gzip),
            (b"PK\x03\x04\x14\x00", Format::Zip),
            (b"\x80\x04\x95", Format::Pickle),
            (b"", Format::Pickle),
            (b"(dp0\n", Format::Pickle),
            (b"\x28\xb5\x2f\xfd", Format::Other("")),
            (b"\xef\xbb\xbf\n  {\"traceEvents\": []}", Format::Other("")),
            (b"<!DOCTYPE html>", Format::Other("")),
        ];
        for (head, want) in cases {
            let got = sniff(head);
            match want {
                Format::Other(_) => assert!(matches!(got, Format::Other(_)), "{head:?}: {got:?}"),
                want => assert_eq!(got, want, "{head:?}"),
            }
        }
    }

    #[test]
    fn names_json_by_its_keys() {
        assert!(json_kind(b"{\"traceEvents\": [").contains("Chrome trace"));
        assert!(json_kind(b"{\"segments\": [], \"device_traces\": [").contains("converted"));
        assert!(json_kind(b"[1, 2]").starts_with("JSON, not"));
    }
}
