//! Sinks that do not interact: the JSON document and the human text of each report, and the
//! CI gate's verdict.

pub mod analyze_json;
pub mod analyze_text;
pub mod gate;
pub mod gate_output;
pub mod plan_json;
pub mod plan_text;
