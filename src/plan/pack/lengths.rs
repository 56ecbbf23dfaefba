//! Reading sequence lengths: one integer per line, or JSON Lines whose objects carry a length
//! (`length`, `len`, `num_tokens`, `seq_len`) or a token list (`input_ids`, `tokens`) that is
//! counted without being kept.

use crate::plan::lines::for_each_line;
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::io::BufRead;

/// Why a lengths file could not be read; lines count from 1.
#[derive(Debug, thiserror::Error)]
pub enum LengthsError {
    #[error("line {line}: {reason}")]
    Line { line: u64, reason: String },
    #[error("reading: {0}")]
    Io(#[from] std::io::Error),
}

/// The length of a JSON array, read without keeping its elements.
struct Counted(u64);

impl<'de> Deserialize<'de> for Counted {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Count;
        impl<'de> Visitor<'de> for Count {
            type Value = Counted;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of tokens")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Counted, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Counted(n))
            }
        }
        d.deserialize_seq(Count)
    }
}

#[derive(Deserialize)]
struct Record {
    length: Option<u64>,
    len: Option<u64>,
    num_tokens: Option<u64>,
    seq_len: Option<u64>,
    input_ids: Option<Counted>,
    tokens: Option<Counted>,
}

impl Record {
    fn length(self) -> Option<u64> {
        self.length
            .or(self.len)
            .or(self.num_tokens)
            .or(self.seq_len)
            .or(self.input_ids.map(|c| c.0))
            .or(self.tokens.map(|c| c.0))
    }
}

/// Reads every length; blank lines are skipped.
pub fn parse_lengths(reader: impl BufRead) -> Result<Vec<u64>, LengthsError> {
    let mut out = Vec::new();
    for_each_line(reader, |number, text| {
        let err = |reason: String| LengthsError::Line {
            line: number,
            reason,
        };
        let length = if text.starts_with('{') {
            let record: Record = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
            record.length().ok_or_else(|| {
                err("no length, len, num_tokens, seq_len, input_ids or tokens field".into())
            })?
        } else {
            text.parse::<u64>()
                .map_err(|_| err(format!("expected a length or a JSON object, got {text:?}")))?
        };
        out.push(length);
        Ok::<(), LengthsError>(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_jsonl() {
        let text = "12\n\n7\n{\"length\": 5}\n{\"input_ids\": [1, 2, 3], \"labels\": [0]}\n{\"tokens\": []}\n";
        let got = parse_lengths(text.as_bytes()).expect("parses");
        assert_eq!(got, vec![12, 7, 5, 3, 0]);
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse_lengths("4\nfour\n".as_bytes()).expect_err("bad line");
        assert!(err.to_string().starts_with("line 2: "), "{err}");
        let err = parse_lengths("{\"text\": \"hi\"}".as_bytes()).expect_err("no field");
        assert!(err.to_string().contains("line 1: no length"), "{err}");
    }
}
