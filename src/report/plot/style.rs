//! What the figures share: colours, fonts sizes, the size unit of an axis, short site labels,
//! titles cut to fit, step-shaped lines, the areas' top in each pixel column and the OOM marks
//! of the charts over time.

use super::font::FAMILY;
use super::legend::Swatch;
use crate::model::Bytes;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::RGBColor;

/// Colours of the allocation sites in stacked plots; "other" is `OTHER`.
pub const SITE_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];
pub const OTHER: RGBColor = RGBColor(175, 175, 175);

/// Colours of the built-in categories, each its own whatever else the plot shows ("other" is
/// `OTHER`); the user's categories take `USER_CATEGORY_COLORS` in turn.
const CATEGORY_COLORS: [(&str, RGBColor); 7] = [
    ("parameter", RGBColor(31, 119, 180)),
    ("gradient", RGBColor(255, 127, 14)),
    ("optimizer_state", RGBColor(44, 160, 44)),
    ("activation", RGBColor(148, 103, 189)),
    ("autograd", RGBColor(140, 86, 75)),
    ("workspace", RGBColor(188, 189, 34)),
    ("other", OTHER),
];
const USER_CATEGORY_COLORS: [RGBColor; 4] = [
    RGBColor(23, 190, 207),
    RGBColor(227, 119, 194),
    RGBColor(0, 80, 60),
    RGBColor(240, 200, 0),
];

/// The colour of each category in `names`, in order.
pub fn category_colors(names: &[String]) -> Vec<RGBColor> {
    let mut user = USER_CATEGORY_COLORS.iter().cycle();
    names
        .iter()
        .map(|n| match CATEGORY_COLORS.iter().find(|(b, _)| b == n) {
            Some(&(_, c)) => c,
            None => *user.next().unwrap_or(&OTHER),
        })
        .collect()
}
pub const RESERVED: RGBColor = RGBColor(20, 20, 20);
pub const ACTIVE: RGBColor = RGBColor(100, 100, 100);
pub const PEAK: RGBColor = RGBColor(150, 0, 0);
pub const OOM: RGBColor = RGBColor(214, 39, 40);
pub const ALLOCATED: RGBColor = RGBColor(31, 119, 180);
pub const PENDING_FREE: RGBColor = RGBColor(255, 127, 14);
pub const FREE: RGBColor = RGBColor(222, 222, 222);

pub const TITLE_PX: u32 = 26;
pub const LABEL_PX: u32 = 17;
pub const TICK_PX: u32 = 14;

/// A binary size unit for an axis: GiB, or MiB when everything is under 1 GiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unit {
    pub name: &'static str,
    bytes: f64,
}

impl Unit {
    /// The unit for an axis whose largest value is `max` bytes.
    pub fn for_max(max: u64) -> Unit {
        if max >= 1 << 30 {
            Unit {
                name: "GiB",
                bytes: (1u64 << 30) as f64,
            }
        } else {
            Unit {
                name: "MiB",
                bytes: (1u64 << 20) as f64,
            }
        }
    }

    pub fn of(self, bytes: u64) -> f64 {
        bytes as f64 / self.bytes
    }
}

/// A tick label with as few decimals as the axis range needs.
pub fn tick(value: f64, range: f64) -> String {
    let decimals = match range {
        r if r >= 20.0 => 0,
        r if r >= 2.0 => 1,
        r if r >= 0.2 => 2,
        _ => 3,
    };
    format!("{value:.decimals$}")
}

/// `file:line:function` with the file's directories dropped, cut to fit a legend.
pub fn short_site(label: &str) -> String {
    const MAX: usize = 60;
    let mut parts = label.rsplitn(3, ':');
    let (function, line, file) = (parts.next(), parts.next(), parts.next());
    let short = match (file, line, function) {
        (Some(file), Some(line), Some(function)) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            format!("{base}:{line}:{function}")
        }
        _ => label.to_string(),
    };
    if short.chars().count() > MAX {
        let cut: String = short.chars().take(MAX - 1).collect();
        format!("{cut}…")
    } else {
        short
    }
}

/// A moment of the account marked on a chart over time: where it lies on the x axis and the
/// bytes it is about.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mark {
    pub entry_index: usize,
    pub x: f64,
    pub bytes: u64,
}

/// Marks each OOM on a chart over time with a vertical line.
pub fn mark_ooms<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    ooms: &[Mark],
    y_max: f64,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for oom in ooms {
        let line = OOM.stroke_width(2);
        chart.draw_series(LineSeries::new([(oom.x, 0.0), (oom.x, y_max)], line))?;
    }
    Ok(())
}

/// The legend entry of the OOM marks: the request that failed, the last one's when several
/// did.
pub fn oom_entry(ooms: &[Mark]) -> Option<(String, Swatch)> {
    let last = ooms.last()?;
    let label = match ooms.len() {
        1 => format!("OOM: a request of {} failed", Bytes(last.bytes)),
        n => format!(
            "{n} OOMs; the last: a request of {} failed",
            Bytes(last.bytes)
        ),
    };
    Some((label, Swatch::Mark(OOM)))
}

/// How a chart's x span (`lo..hi`) falls into its `pixels` pixel columns, as plotters maps it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Columns {
    pub lo: f64,
    pub hi: f64,
    pub pixels: i32,
}

impl Columns {
    /// The pixel column of `x` (0 to `pixels`).
    fn of(self, x: f64) -> i32 {
        if self.hi <= self.lo || self.pixels <= 0 {
            return 0;
        }
        let at = (x - self.lo) / (self.hi - self.lo);
        ((f64::from(self.pixels) * at + 1e-3).floor() as i32).clamp(0, self.pixels)
    }

    /// Where column `c` starts (not past `hi`).
    fn start(self, c: i32) -> f64 {
        if self.pixels <= 0 {
            return self.lo;
        }
        let at = f64::from(c) / f64::from(self.pixels);
        (self.lo + (self.hi - self.lo) * at).min(self.hi)
    }
}

/// A step function through points at `xs` (valued by `value`) as an area `columns` wide shows
/// it: in each pixel column the highest value held anywhere in it fills the whole column, then
/// the column's last value holds from the next column on. So a rise narrower than a pixel
/// still fills its column, and the area tops out at the function's maximum. Returns each
/// drawn point's x and the index of the point whose values are drawn there.
pub fn column_tops(
    xs: &[f64],
    value: impl Fn(usize) -> u64,
    columns: Columns,
) -> Vec<(f64, usize)> {
    let mut out: Vec<(f64, usize)> = Vec::new();
    let mut push = |x: f64, i: usize| match out.last_mut() {
        Some(last) if last.0 == x => last.1 = i,
        _ => out.push((x, i)),
    };
    let mut held: Option<usize> = None;
    let mut i = 0;
    while i < xs.len() {
        let c = columns.of(xs[i]);
        let mut top = held;
        let mut j = i;
        while j < xs.len() && columns.of(xs[j]) == c {
            if top.is_none_or(|t| value(j) > value(t)) {
                top = Some(j);
            }
            j += 1;
        }
        let last = j - 1;
        let top = top.unwrap_or(last);
        // The first points start where they are; later columns from their left edge.
        let x = if held.is_some() {
            columns.start(c)
        } else {
            xs[i]
        };
        push(x, top);
        if top != last {
            push(columns.start(c + 1), last);
        }
        held = Some(last);
        i = j;
    }
    out
}

/// A step function through `points`: each value holds until the next point's x, where the
/// line goes straight up or down, so consecutive points never change both x and y. Runs of
/// one value keep only their ends.
pub fn steps(points: impl IntoIterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (x, y) in points {
        match out.as_slice() {
            [.., (_, y0), (_, y1)] if *y0 == y && *y1 == y => {
                // A third point at the same level: move the end of the run instead.
                if let Some(last) = out.last_mut() {
                    last.0 = x;
                }
            }
            [.., (px, py)] if *px != x && *py != y => {
                let py = *py;
                out.push((x, py));
                out.push((x, y));
            }
            _ => out.push((x, y)),
        }
    }
    out
}

/// A title `make(name)` that fits `width` pixels: when it does not, the middle of `name` is
/// cut (never the rest of the title).
pub fn fit_title(make: impl Fn(&str) -> String, name: &str, width: u32) -> String {
    // Without the font nothing can be measured; the title is then kept whole.
    if super::font::register().is_err() {
        return make(name);
    }
    let font = FontDesc::from((FAMILY, TITLE_PX));
    let fits = |text: &str| font.box_size(text).is_ok_and(|(w, _)| w <= width);
    let whole = make(name);
    if fits(&whole) {
        return whole;
    }
    let chars: Vec<char> = name.chars().collect();
    for keep in (2..chars.len()).rev() {
        let head: String = chars[..keep.div_ceil(2)].iter().collect();
        let tail: String = chars[chars.len() - keep / 2..].iter().collect();
        let title = make(&format!("{head}…{tail}"));
        if fits(&title) {
            return title;
        }
    }
    make("…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_lose_their_directories() {
        assert_eq!(short_site("/home/u/train.py:99:step"), "train.py:99:step");
        assert_eq!(short_site("<no stack recorded>"), "<no stack recorded>");
        let long = format!("a.py:1:{}", "f".repeat(100));
        assert_eq!(short_site(&long).chars().count(), 60);
    }

    #[test]
    fn categories_keep_their_colour_and_user_ones_get_their_own() {
        let names: Vec<String> = ["activation", "parameter", "kv_cache", "other", "lora"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let got = category_colors(&names);
        assert_eq!(got[0], RGBColor(148, 103, 189));
        assert_eq!(got[1], RGBColor(31, 119, 180));
        assert_eq!(got[3], OTHER);
        assert_eq!(got[2], USER_CATEGORY_COLORS[0]);
        assert_eq!(got[4], USER_CATEGORY_COLORS[1]);
    }

    #[test]
    fn units_follow_the_largest_value() {
        assert_eq!(Unit::for_max(3 << 30).name, "GiB");
        assert_eq!(Unit::for_max(3 << 20).name, "MiB");
        assert_eq!(Unit::for_max(3 << 30).of(3 << 29), 1.5);
        assert_eq!(tick(1.26, 5.0), "1.3");
        assert_eq!(tick(12.0, 40.0), "12");
    }

    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        let got = steps([
            (0.0, 1.0),
            (1.0, 1.0),
            (2.0, 1.0),
            (3.0, 5.0),
            (3.0, 2.0),
            (4.0, 2.0),
        ]);
        assert_eq!(
            got,
            [
                (0.0, 1.0),
                (2.0, 1.0),
                (3.0, 1.0),
                (3.0, 5.0),
                (3.0, 2.0),
                (4.0, 2.0)
            ]
        );
        for pair in got.windows(2) {
            assert!(pair[0].0 == pair[1].0 || pair[0].1 == pair[1].1, "{pair:?}");
        }
    }

    #[test]
    fn long_names_are_cut_in_the_title_not_the_title() {
        crate::report::plot::font::register().expect("font");
        let name = format!("{}.pickle", "a_very_long_snapshot_name".repeat(8));
        let title = fit_title(|n| format!("Memory over time - {n}, device 0"), &name, 1000);
        assert!(title.starts_with("Memory over time - a_very"), "{title}");
        assert!(title.ends_with(".pickle, device 0"), "{title}");
        assert!(title.contains('…'));
        let short = fit_title(|n| format!("T - {n}"), "x.pickle", 1000);
        assert_eq!(short, "T - x.pickle");
    }
}
