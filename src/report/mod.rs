//! Sinks that do not interact: the JSON document and the human text of each report.

pub mod analyze_json;
pub mod analyze_text;
pub mod simulate;
