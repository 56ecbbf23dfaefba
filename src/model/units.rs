//! Units: `Bytes`, the one size type, printed one way everywhere (binary units), and counts
//! printed with their noun in the right number.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A number of bytes. Displays in binary units (KiB, MiB, GiB, TiB) with two decimals.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        // Compare against what two decimals would print, so 1 GiB - 1 B reads 1.00 GiB.
        while value >= 1023.995 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.2} {}", UNITS[unit])
    }
}

/// `n` and its noun, singular for one: `1 GPU`, `2 GPUs`, `0 frees`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Why a size given on the command line could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid size {input:?}: {reason}")]
pub struct ParseBytesError {
    input: String,
    reason: &'static str,
}

impl FromStr for Bytes {
    type Err = ParseBytesError;

    /// Accepts plain bytes (`1048576`) or a number with a unit: binary (`512MiB`, `80GiB`,
    /// `4KiB`) or decimal (`1.5GB`, `500MB`, `10kB`); `B` alone is bytes. Case of the unit
    /// letters other than `i` is ignored; spaces between number and unit are allowed.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseBytesError {
            input: input.to_string(),
            reason,
        };
        let text = input.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        if number.is_empty() {
            return Err(err("expected a number"));
        }
        let multiplier: u64 =
            match unit.trim() {
                "" | "B" | "b" => 1,
                "KiB" | "kiB" | "Ki" | "K" | "k" => 1 << 10,
                "MiB" | "Mi" | "M" | "m" => 1 << 20,
                "GiB" | "Gi" | "G" | "g" => 1 << 30,
                "TiB" | "Ti" | "T" | "t" => 1 << 40,
                // What sizes print with (`Display`), so a printed size reads back.
                "PiB" | "Pi" => 1 << 50,
                "EiB" | "Ei" => 1 << 60,
                "kB" | "KB" | "kb" => 1_000,
                "MB" | "mb" => 1_000_000,
                "GB" | "gb" => 1_000_000_000,
                "TB" | "tb" => 1_000_000_000_000,
                "PB" | "pb" => 1_000_000_000_000_000,
                "EB" | "eb" => 1_000_000_000_000_000_000,
                _ => return Err(err(
                    "unknown unit (use B, KiB, MiB, GiB, TiB, PiB, EiB, kB, MB, GB, TB, PB, EB)",
                )),
            };
        if let Ok(whole) = number.parse::<u64>() {
            return whole
                .checked_mul(multiplier)
                .map(Bytes)
                .ok_or_else(|| err("too large"));
        }
        let value: f64 = number.parse().map_err(|_| err("expected a number"))?;
        let total = (value * multiplier as f64).round();
        if !(0.0..=u64::MAX as f64).contains(&total) {
            return Err(err("too large"));
        }
        Ok(Bytes(total as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_agree_in_number() {
        assert_eq!(count(1u32, "GPU", "GPUs"), "1 GPU");
        assert_eq!(count(0u32, "GPU", "GPUs"), "0 GPUs");
        assert_eq!(count(2u64, "process", "processes"), "2 processes");
    }

    /// Found by the `sizes` fuzz target: `Bytes` printed sizes of a PiB and up in units its
    /// parser did not read, so a size memprof printed could not be given back to it.
    #[test]
    fn every_printed_size_reads_back() {
        for n in [0, 1023, 1 << 50, 1_234_567_890_123_456_789, u64::MAX] {
            let shown = Bytes(n).to_string();
            let again: Bytes = shown.parse().expect("a printed size parses");
            assert!(
                again.0.abs_diff(n) as f64 <= n as f64 / 200.0,
                "{n} {shown}"
            );
        }
        assert_eq!("2PB".parse::<Bytes>(), Ok(Bytes(2_000_000_000_000_000)));
    }

    #[test]
    fn formats_across_magnitudes() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.00 KiB"),
            (1536, "1.50 KiB"),
            (20 << 20, "20.00 MiB"),
            ((1 << 30) - 1, "1.00 GiB"),
            (80 << 30, "80.00 GiB"),
            (3 << 40, "3.00 TiB"),
            (u64::MAX, "16.00 EiB"),
        ];
        for (n, want) in cases {
            assert_eq!(Bytes(n).to_string(), want, "{n}");
        }
    }

    #[test]
    fn parses_plain_and_units() {
        let cases = [
            ("1048576", 1 << 20),
            ("512MiB", 512 << 20),
            ("80GiB", 80 << 30),
            ("80 GiB", 80 << 30),
            ("1.5GB", 1_500_000_000),
            ("2k", 2048),
            ("10B", 10),
            ("0.5MiB", 1 << 19),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Bytes>(), Ok(Bytes(want)), "{text}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for text in [
            "",
            "MiB",
            "12 parsecs",
            "-5",
            "1.2.3GB",
            "99999999999999999999TiB",
        ] {
            assert!(text.parse::<Bytes>().is_err(), "{text}");
        }
    }
}
