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
        let fonts = [
            (FontStyle::Normal, dejavu::sans::regular()),
            (FontStyle::Bold, dejavu::sans::bold()),
        ];
        for (style, bytes) in fonts {
            register_font(FAMILY, style, bytes)
                .map_err(|_| "the embedded plot font could not be read".to_string())?;
        }
        Ok(())
    })
    .clone()
}
