//! Reading a serving workload: JSON Lines of requests with an arrival time (in decode steps),
//! prompt and output lengths, and optionally a shared prefix (group and length).

use crate::plan::lines::for_each_line;
use serde::Deserialize;
use std::io::BufRead;

/// Largest prompt, output or arrival step accepted.
pub const MAX_TOKENS: u64 = 1 << 26;

/// One request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Decode step at which the request arrives.
    pub arrival: u64,
    pub prompt: u64,
    pub output: u64,
    /// Requests with the same group share the KV blocks of their first `prefix` tokens.
    pub prefix_group: Option<String>,
    pub prefix: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("line {line}: {reason}")]
    Line { line: u64, reason: String },
    #[error("reading: {0}")]
    Io(#[from] std::io::Error),
    #[error("no requests in the workload")]
    Empty,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Group {
    Text(String),
    Number(u64),
}

#[derive(Deserialize)]
struct Record {
    #[serde(default)]
    arrival: f64,
    #[serde(alias = "prompt_tokens", alias = "input_len", alias = "prompt_len")]
    prompt: u64,
    #[serde(alias = "output_tokens", alias = "output_len")]
    output: u64,
    #[serde(default, alias = "prefix_id")]
    prefix_group: Option<Group>,
    #[serde(default, alias = "prefix_len")]
    prefix_tokens: u64,
}

/// Reads requests, one JSON object per line (blank lines skipped), sorted by arrival.
pub fn parse_workload(reader: impl BufRead) -> Result<Vec<Request>, WorkloadError> {
    let mut out = Vec::new();
    for_each_line(reader, |number, text| {
        let err = |reason: String| WorkloadError::Line {
            line: number,
            reason,
        };
        let r: Record = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        if !(r.arrival.is_finite() && r.arrival >= 0.0) {
            return Err(err("arrival must be a non-negative number of steps".into()));
        }
        if r.output == 0 {
            return Err(err("output must be at least 1 token".into()));
        }
        if r.prompt > MAX_TOKENS || r.output > MAX_TOKENS || r.arrival > MAX_TOKENS as f64 {
            return Err(err(format!(
                "prompt, output and arrival must be at most {MAX_TOKENS}"
            )));
        }
        out.push(Request {
            arrival: r.arrival.ceil() as u64,
            prompt: r.prompt,
            output: r.output,
            prefix: r.prefix_tokens.min(r.prompt),
            prefix_group: r.prefix_group.map(|g| match g {
                Group::Text(t) => t,
                Group::Number(n) => n.to_string(),
            }),
        });
        Ok::<(), WorkloadError>(())
    })?;
    if out.is_empty() {
        return Err(WorkloadError::Empty);
    }
    out.sort_by_key(|r| r.arrival);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_requests() {
        let text = "{\"arrival\": 2.5, \"prompt\": 10, \"output\": 5}\n\n\
                    {\"prompt_tokens\": 100, \"output_tokens\": 1, \"prefix_group\": 7, \"prefix_tokens\": 64}\n";
        let got = parse_workload(text.as_bytes()).expect("parses");
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].arrival, got[0].prompt, got[0].prefix), (0, 100, 64));
        assert_eq!(got[0].prefix_group.as_deref(), Some("7"));
        assert_eq!((got[1].arrival, got[1].output), (3, 5));
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse_workload("{\"prompt\": 1, \"output\": 0}".as_bytes()).expect_err("bad");
        assert!(err.to_string().starts_with("line 1: output"), "{err}");
        let err = parse_workload("{\"prompt\": 1}".as_bytes()).expect_err("bad");
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(matches!(
            parse_workload("".as_bytes()),
            Err(WorkloadError::Empty)
        ));
    }
}
