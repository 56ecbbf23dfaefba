//! PyTorch CUDA OOM error messages in a log (`reference/pytorch-allocator.md` §1.13): every
//! wording since 2.0, with the sizes `format_size` printed (two decimals, bytes to GiB).

/// The PyTorch versions whose wording a message has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageFormat {
    /// `(GPU n; T total capacity; A already allocated; F free; R reserved in total by PyTorch)`.
    V2_0,
    /// `GPU n has a total capacty of` (the 2.1 typo).
    V2_1,
    /// `total capacity`, pytorch.org documentation URL.
    V2_2To2_10,
    /// docs.pytorch.org documentation URL.
    V2_11,
}

impl MessageFormat {
    pub fn name(self) -> &'static str {
        match self {
            MessageFormat::V2_0 => "PyTorch 2.0",
            MessageFormat::V2_1 => "PyTorch 2.1",
            MessageFormat::V2_2To2_10 => "PyTorch 2.2-2.10",
            MessageFormat::V2_11 => "PyTorch 2.11+",
        }
    }
}

/// The numbers of one OOM message, in bytes (as printed: rounded to two decimals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedOom {
    pub format: MessageFormat,
    pub device: u32,
    /// The allocation that failed (the segment size it needed).
    pub request_bytes: u64,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Allocated by PyTorch, private pools included.
    pub allocated_bytes: u64,
    /// Free blocks cached in private pools (CUDA graphs), counted in `allocated_bytes`; 0 when
    /// not printed.
    pub private_bytes: u64,
    pub reserved_bytes: u64,
}

const START: &str = "CUDA out of memory. Tried to allocate ";

/// Every OOM message in `text`, in order. Messages without numbers ("more than 1EB") and
/// damaged ones are skipped.
pub fn parse_log(text: &str) -> Vec<LoggedOom> {
    let starts: Vec<usize> = text.match_indices(START).map(|(i, _)| i).collect();
    starts
        .iter()
        .enumerate()
        .filter_map(|(k, &i)| {
            let end = starts.get(k + 1).copied().unwrap_or(text.len());
            let one: String = text[i + START.len()..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            parse_message(&one)
        })
        .collect()
}

/// One message, whitespace collapsed, from just after "Tried to allocate ".
fn parse_message(m: &str) -> Option<LoggedOom> {
    let (request_bytes, rest) = size_prefix(m)?;
    if let Some(rest) = rest.strip_prefix(" (GPU ") {
        return parse_v2_0(request_bytes, rest);
    }
    let rest = rest.strip_prefix(". GPU ")?;
    let (device, rest) = rest.split_once(' ')?;
    let (format, rest) = if let Some(r) = rest.strip_prefix("has a total capacty of ") {
        (MessageFormat::V2_1, r)
    } else {
        let r = rest.strip_prefix("has a total capacity of ")?;
        let format = if m.contains("docs.pytorch.org") {
            MessageFormat::V2_11
        } else {
            MessageFormat::V2_2To2_10
        };
        (format, r)
    };
    let (total_bytes, rest) = size_prefix(rest)?;
    let (free_bytes, _) = size_prefix(rest.strip_prefix(" of which ")?)?;
    let (allocated_bytes, rest) = size_prefix(after(m, "Of the allocated memory ")?)?;
    let rest = rest.strip_prefix(" is allocated by PyTorch, ")?;
    let (private_bytes, rest) = match rest.strip_prefix("with ") {
        Some(r) => {
            let (p, r) = size_prefix(r)?;
            (p, after(r, "), ")?)
        }
        None => (0, rest),
    };
    let (unallocated, _) = size_prefix(rest.strip_prefix("and ")?)?;
    Some(LoggedOom {
        format,
        device: device.parse().ok()?,
        request_bytes,
        total_bytes,
        free_bytes,
        allocated_bytes,
        private_bytes,
        // The message prints allocated + private and reserved - allocated - private.
        reserved_bytes: allocated_bytes.saturating_add(unallocated),
    })
}

/// `n; T total capacity; A already allocated; F free; [M allowed; ]R reserved in total...`
fn parse_v2_0(request_bytes: u64, rest: &str) -> Option<LoggedOom> {
    let (device, rest) = rest.split_once("; ")?;
    let (total_bytes, rest) = size_prefix(rest)?;
    let rest = rest.strip_prefix(" total capacity; ")?;
    let (allocated_bytes, rest) = size_prefix(rest)?;
    let rest = rest.strip_prefix(" already allocated; ")?;
    let (free_bytes, rest) = size_prefix(rest)?;
    let mut rest = rest.strip_prefix(" free; ")?;
    let (mut reserved_bytes, mut tail) = size_prefix(rest)?;
    if let Some(r) = tail.strip_prefix(" allowed; ") {
        rest = r;
        (reserved_bytes, tail) = size_prefix(rest)?;
    }
    tail.strip_prefix(" reserved in total by PyTorch")?;
    Some(LoggedOom {
        format: MessageFormat::V2_0,
        device: device.parse().ok()?,
        request_bytes,
        total_bytes,
        free_bytes,
        allocated_bytes,
        private_bytes: 0,
        reserved_bytes,
    })
}

/// The text after the first `key`.
fn after<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    s.find(key).map(|i| &s[i + key.len()..])
}

/// A leading `format_size` value (`12.34 MiB`, `512.00 bytes`) in bytes, and the rest.
fn size_prefix(s: &str) -> Option<(u64, &str)> {
    let (number, rest) = s.split_once(' ')?;
    let value: f64 = number.parse().ok()?;
    let unit_end = rest
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(rest.len());
    let scale = match &rest[..unit_end] {
        "bytes" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    (value.is_finite() && value >= 0.0).then(|| ((value * scale).round() as u64, &rest[unit_end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_format_size_prints_them() {
        assert_eq!(size_prefix("20.00 MiB. GPU"), Some((20 << 20, ". GPU")));
        assert_eq!(size_prefix("512.00 bytes"), Some((512, "")));
        assert_eq!(size_prefix("1.50 KiB;"), Some((1536, ";")));
        assert_eq!(size_prefix("x MiB"), None);
        assert_eq!(size_prefix("1.00 TB"), None);
    }

    #[test]
    fn v2_0_with_allowed() {
        let text = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; \
                    15.78 GiB total capacity; 10.00 GiB already allocated; 1.00 GiB free; \
                    12.00 GiB allowed; 13.00 GiB reserved in total by PyTorch) If reserved";
        let got = parse_log(text);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].format, MessageFormat::V2_0);
        assert_eq!(got[0].device, 1);
        assert_eq!(got[0].reserved_bytes, 13 << 30);
        assert_eq!(got[0].allocated_bytes, 10 << 30);
    }

    #[test]
    fn private_pools_and_wrapped_lines() {
        let text = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total\n  \
                    capacity of 8.00 GiB of which 2.00 MiB is free. Of the allocated memory \
                    6.00 GiB is allocated by PyTorch, with 1.00 GiB allocated in private pools \
                    (e.g., CUDA Graphs), and 512.00 MiB is reserved by PyTorch but unallocated.";
        let got = parse_log(text);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].private_bytes, 1 << 30);
        assert_eq!(got[0].reserved_bytes, (6 << 30) + (512 << 20));
        assert!(
            parse_log("CUDA out of memory. Tried to allocate more than 1EB memory.").is_empty()
        );
    }
}
