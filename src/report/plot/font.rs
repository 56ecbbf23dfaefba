//! The plot font: DejaVu Sans, embedded, so text renders on machines without system fonts.
//! PNG text is drawn with it; SVG text is measured with it and names the family.

use plotters::style::{register_font, FontStyle};
use std::sync::OnceLock;

/// The family name figures ask for.
pub const FAMILY: &str = "sans-serif";

/// Registers the embedded font once per process.
pub fn register() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        register_font(FAMILY, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the embedded plot font could not be read".to_string())
    })
    .clone()
}
