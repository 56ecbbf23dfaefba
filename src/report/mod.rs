//! Sinks that do not interact: the JSON document and the human text of each report, the
//! CI gate's verdict, plots (PNG and SVG), the HTML report and the exports for other tools.

pub mod analyze_json;
pub mod analyze_text;
pub mod anomalies_text;
pub mod at_json;
pub mod attach_json;
pub mod categories_text;
pub mod diagnose;
pub mod export;
pub mod gate;
pub mod gate_input;
pub mod gate_output;
pub mod html;
mod html_categories;
mod html_tree;
mod ledger_text;
pub mod plan_json;
pub mod plan_text;
pub mod plot;
pub mod pressure_text;
pub mod prometheus;
pub mod simulate;
pub mod site_identity;
pub mod terminal_text;
pub mod tree_at;
pub mod tree_svg;
pub mod view_state;
