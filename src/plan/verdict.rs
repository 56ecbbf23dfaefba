//! What "fits" means, the same for every planner: an estimate and the headroom kept beside it
//! against a capacity. Fit: estimate plus headroom within the capacity (exit 0). Tight: the
//! estimate alone is within it, the headroom is not (exit 1: it may run, it may not). No fit:
//! the estimate alone is over (exit 1). Errors in the input exit 2 (docs/commands.md).

use serde::Serialize;

/// The answer to "does it fit".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Fit,
    Tight,
    NoFit,
}

impl Verdict {
    /// Judges `estimate` bytes with `headroom` bytes kept free against `capacity` bytes.
    pub fn judge(estimate: u64, headroom: u64, capacity: u64) -> Verdict {
        if estimate.saturating_add(headroom) <= capacity {
            Verdict::Fit
        } else if estimate <= capacity {
            Verdict::Tight
        } else {
            Verdict::NoFit
        }
    }

    /// The words the text reports use.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::Fit => "fits",
            Verdict::Tight => "tight (fits only by eating into the headroom)",
            Verdict::NoFit => "does not fit",
        }
    }

    /// Whether the command should exit 1 (a finding) for this answer.
    pub fn is_finding(self) -> bool {
        self != Verdict::Fit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_answers_at_their_edges() {
        assert_eq!(Verdict::judge(70, 10, 80), Verdict::Fit);
        assert_eq!(Verdict::judge(71, 10, 80), Verdict::Tight);
        assert_eq!(Verdict::judge(80, 10, 80), Verdict::Tight);
        assert_eq!(Verdict::judge(81, 0, 80), Verdict::NoFit);
        assert_eq!(Verdict::judge(u64::MAX, 1, 80), Verdict::NoFit);
        assert!(!Verdict::Fit.is_finding() && Verdict::Tight.is_finding());
    }
}
