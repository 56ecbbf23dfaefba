//! Turns a figure into the bytes of an SVG document or a PNG image. No file is opened here:
//! the caller writes the bytes where it was told to.

use super::font;
use crate::report::terminal_text::terminal_lines;
use plotters::coord::Shift;
use plotters::prelude::{BitMapBackend, DrawingArea, DrawingAreaErrorKind, DrawingBackend};
use plotters::prelude::{IntoDrawingArea, SVGBackend};
use std::path::Path;

/// Width and height of every figure, in pixels.
pub const SIZE: (u32, u32) = (1280, 720);

/// A picture that can draw itself on any plotters backend.
pub trait Figure {
    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>;
}

/// The file format of a plot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Png,
    Svg,
}

/// Why a plot could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlotError(String);

impl Format {
    /// The format a file name asks for, by its extension (`.png` or `.svg`, any case).
    pub fn from_path(path: &Path) -> Result<Format, PlotError> {
        let ext = path.extension().and_then(|e| e.to_str());
        match ext.map(str::to_ascii_lowercase).as_deref() {
            Some("png") => Ok(Format::Png),
            Some("svg") => Ok(Format::Svg),
            _ => Err(PlotError(format!(
                "{}: a plot file name must end in .png or .svg",
                path.display()
            ))),
        }
    }
}

fn drawing<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> PlotError {
    PlotError(format!("drawing the plot failed: {e}"))
}

/// Draws a figure and returns the file's bytes.
pub fn render(figure: &impl Figure, format: Format) -> Result<Vec<u8>, PlotError> {
    // Both backends measure text with the font (SVG to place it), so register it first.
    font::register().map_err(PlotError)?;
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
                figure.draw(&root).map_err(drawing)?;
                root.present().map_err(drawing)?;
            }
            // Every label from the file has its non-printing characters escaped (which keeps
            // out the characters XML forbids), as in every other output.
            Ok(terminal_lines(&svg).into_bytes())
        }
        Format::Png => {
            let (w, h) = SIZE;
            let mut rgb = vec![0u8; w as usize * h as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
                figure.draw(&root).map_err(drawing)?;
                root.present().map_err(drawing)?;
            }
            encode_png(&rgb, SIZE)
        }
    }
}

fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> Result<Vec<u8>, PlotError> {
    let fail = |e: png::EncodingError| PlotError(format!("encoding the PNG failed: {e}"));
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(fail)?;
    writer.write_image_data(rgb).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_comes_from_the_extension() {
        assert_eq!(
            Format::from_path(Path::new("a/b.PNG")).ok(),
            Some(Format::Png)
        );
        assert_eq!(
            Format::from_path(Path::new("b.svg")).ok(),
            Some(Format::Svg)
        );
        let err = Format::from_path(Path::new("b.jpg"))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("b.jpg: a plot file name must end in .png or .svg")
        );
        assert!(Format::from_path(Path::new("noext")).is_err());
    }
}
