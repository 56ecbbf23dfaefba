//! The memprof recording format, shared by the shim (writer) and the tool (reader).
//!
//! A recording starts with `MAGIC` and a little-endian `u32` format version. The event records
//! that follow are defined by the agent work (issue "The agent: LD_PRELOAD shim"); until then
//! this crate fixes only the header, so the tool can recognise a recording and say it is one.
#![forbid(unsafe_code)]

/// First bytes of every recording.
pub const MAGIC: &[u8; 8] = b"MEMPROF\0";

/// Version of the record layout written after the header.
pub const VERSION: u32 = 1;

/// Length of the header: magic plus version.
pub const HEADER_LEN: usize = MAGIC.len() + 4;

/// Writes the header.
pub fn encode_header() -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..MAGIC.len()].copy_from_slice(MAGIC);
    out[MAGIC.len()..].copy_from_slice(&VERSION.to_le_bytes());
    out
}

/// Why a header could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderError {
    TooShort,
    NotARecording,
    /// Written by a newer memprof.
    UnknownVersion(u32),
}

/// Reads the header and returns the version.
pub fn decode_header(bytes: &[u8]) -> Result<u32, HeaderError> {
    let header = bytes.get(..HEADER_LEN).ok_or(HeaderError::TooShort)?;
    if &header[..MAGIC.len()] != MAGIC {
        return Err(HeaderError::NotARecording);
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&header[MAGIC.len()..]);
    match u32::from_le_bytes(version) {
        VERSION => Ok(VERSION),
        other => Err(HeaderError::UnknownVersion(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        assert_eq!(decode_header(&encode_header()), Ok(VERSION));
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
    }
}
