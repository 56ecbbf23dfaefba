//! Site identity that survives edits and checkouts, for `diff` and `gate`: a site's path made
//! relative to the common folder of the run's own files (module-qualified for installed
//! packages and the standard library), a site whose line moved matched to its old self within
//! its function (and call path, when that decides), and the sites of a function grouped when
//! line-level matching is ambiguous. The changes are listed as grew, shrank, appeared and
//! disappeared, with an "everything else" figure that makes them add up to the total change.

use super::gate::SiteBytes;
use crate::model::{Frame, FrameKind};
use serde::Serialize;
use std::collections::BTreeMap;

/// A `file:line:function` label split in its parts; `None` for a label of another form (a
/// compiled frame without a line).
fn parse(label: &str) -> Option<(&str, i64, &str)> {
    let mut parts = label.rsplitn(3, ':');
    let (name, line, file) = (parts.next()?, parts.next()?, parts.next()?);
    Some((file, line.parse().ok()?, name))
}

fn kind_of(file: &str, line: i64, name: &str) -> (FrameKind, Frame) {
    let frame = Frame {
        filename: file.into(),
        line,
        name: name.into(),
    };
    (frame.kind(), frame)
}

/// Rewrites the labels of one run: the user's files relative to the common folder of all of
/// them, library files as their module.
#[derive(Clone, Debug, Default)]
pub struct Normalizer {
    /// The common folder of the user's files, `/`-separated, ending with `/` (empty when none).
    prefix: String,
}

impl Normalizer {
    /// The normalizer of a run whose sites and stacks carry `labels`.
    pub fn of<'a>(labels: impl IntoIterator<Item = &'a str>) -> Normalizer {
        let mut common: Option<Vec<String>> = None;
        for label in labels {
            let Some((file, line, name)) = parse(label) else {
                continue;
            };
            if kind_of(file, line, name).0 != FrameKind::User {
                continue;
            }
            let slashed = file.replace('\\', "/");
            let mut dirs: Vec<String> = slashed.split('/').map(str::to_string).collect();
            dirs.pop();
            common = Some(match common {
                None => dirs,
                Some(c) => c
                    .into_iter()
                    .zip(dirs)
                    .take_while(|(a, b)| a == b)
                    .map(|(a, _)| a)
                    .collect(),
            });
        }
        let prefix = common
            .filter(|c| !c.is_empty())
            .map(|c| c.join("/") + "/")
            .unwrap_or_default();
        Normalizer { prefix }
    }

    /// The normalizer of a run's measured sites.
    pub fn of_sites(sites: &[SiteBytes]) -> Normalizer {
        Normalizer::of(
            sites
                .iter()
                .flat_map(|s| std::iter::once(&s.frame).chain(&s.stack))
                .map(String::as_str),
        )
    }

    /// `label` as the run-independent identity shows it.
    pub fn label(&self, label: &str) -> String {
        let Some((file, line, name)) = parse(label) else {
            return label.to_string();
        };
        let (kind, frame) = kind_of(file, line, name);
        match kind {
            FrameKind::User => {
                let slashed = file.replace('\\', "/");
                let relative = slashed.strip_prefix(&self.prefix).unwrap_or(&slashed);
                format!("{relative}:{line}:{name}")
            }
            FrameKind::Library | FrameKind::Stdlib => match frame.module() {
                Some(module) => format!("{module}:{line}:{name}"),
                None => label.to_string(),
            },
            _ => label.to_string(),
        }
    }

    /// A stack as outputs show it: from the innermost of the user's frames outward (the whole
    /// stack when it has none), labels normalized.
    pub fn user_stack(&self, stack: &[String]) -> Vec<String> {
        let first = stack
            .iter()
            .position(|f| crate::analysis::is_user_label(f))
            .unwrap_or(0);
        stack[first..].iter().map(|f| self.label(f)).collect()
    }
}

/// One site (or one function's sites, grouped) compared between two runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteDelta {
    /// The site as the later run names it (`file:function` for a group of a function's sites).
    pub site: String,
    /// The earlier run's name for it, when it differs (a line that moved); null otherwise.
    pub was: Option<String>,
    pub before_bytes: u64,
    pub after_bytes: u64,
    /// The stack of its largest allocation, from the user's frames outward.
    pub stack: Vec<String>,
    /// That stack as measured (noise left out), innermost first; empty unless asked for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub full_stack: Vec<String>,
}

impl SiteDelta {
    pub fn delta(&self) -> i128 {
        i128::from(self.after_bytes) - i128::from(self.before_bytes)
    }
}

/// The changes between two runs' sites.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteChanges {
    /// The total change of the compared figure (after - before).
    pub total_change_bytes: i128,
    /// Sites in both runs that hold more, most growth first.
    pub grew: Vec<SiteDelta>,
    /// Sites in both runs that hold less, most shrinkage first.
    pub shrank: Vec<SiteDelta>,
    /// Sites only in the later run, largest first.
    pub appeared: Vec<SiteDelta>,
    /// Sites only in the earlier run, largest first.
    pub disappeared: Vec<SiteDelta>,
    /// The total change less the listed changes: sites not listed, and memory no measured
    /// site holds. The listed deltas plus this add up exactly to `total_change_bytes`.
    pub everything_else_bytes: i128,
}

/// One side's site, normalized.
struct Entry<'a> {
    label: String,
    file: String,
    line: i64,
    function: String,
    /// The user functions calling it (`file:function`, outward), from its stack.
    callers: Vec<String>,
    site: &'a SiteBytes,
}

fn entries<'a>(sites: &'a [SiteBytes], n: &Normalizer) -> Vec<Entry<'a>> {
    sites
        .iter()
        .map(|s| {
            let label = n.label(&s.frame);
            let (file, line, function) = match parse(&label) {
                Some((f, l, name)) => (f.to_string(), l, name.to_string()),
                None => (label.clone(), 0, String::new()),
            };
            let callers = s
                .stack
                .iter()
                .skip_while(|f| **f != s.frame)
                .skip(1)
                .filter(|f| crate::analysis::is_user_label(f))
                .filter_map(|f| {
                    let l = n.label(f);
                    parse(&l).map(|(file, _, name)| format!("{file}:{name}"))
                })
                .collect();
            Entry {
                label,
                file,
                line,
                function,
                callers,
                site: s,
            }
        })
        .collect()
}

/// Renames the earlier run's files to the later run's where one path ends with the other
/// (a project whose common folder changed between runs) and only one file matches.
fn reconcile(before: &mut [Entry<'_>], after: &[Entry<'_>]) {
    let files: Vec<&str> = {
        let mut f: Vec<&str> = after.iter().map(|e| e.file.as_str()).collect();
        f.sort_unstable();
        f.dedup();
        f
    };
    for e in before.iter_mut() {
        if files.binary_search(&e.file.as_str()).is_ok() || e.function.is_empty() {
            continue;
        }
        let same = |a: &str, b: &str| a.ends_with(&format!("/{b}"));
        let mut found = files
            .iter()
            .filter(|f| same(f, &e.file) || same(&e.file, f));
        if let (Some(f), None) = (found.next(), found.next()) {
            e.label = format!("{f}:{}:{}", e.line, e.function);
            e.file = f.to_string();
        }
    }
}

/// Compares the sites of two runs; every site of either run is in one delta (unchanged ones
/// too). `full` keeps each delta's measured stack.
pub fn compare_sites(before: &[SiteBytes], after: &[SiteBytes], full: bool) -> Vec<SiteDelta> {
    let (nb, na) = (Normalizer::of_sites(before), Normalizer::of_sites(after));
    let mut b = entries(before, &nb);
    let a = entries(after, &na);
    reconcile(&mut b, &a);
    type Group = (Vec<usize>, Vec<usize>);
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    for (i, e) in b.iter().enumerate() {
        let key = (e.file.clone(), e.function.clone());
        groups.entry(key).or_default().0.push(i);
    }
    for (i, e) in a.iter().enumerate() {
        let key = (e.file.clone(), e.function.clone());
        groups.entry(key).or_default().1.push(i);
    }
    let mut out = Vec::new();
    let one = |bi: Option<usize>, ai: Option<usize>| {
        let (eb, ea) = (bi.map(|i| &b[i]), ai.map(|i| &a[i]));
        let (shown, n) = match (ea, eb) {
            (Some(e), _) => (Some(e), &na),
            (None, e) => (e, &nb),
        };
        let stack = shown.map_or(&[][..], |e| &e.site.stack[..]);
        SiteDelta {
            site: shown.map_or_else(String::new, |e| e.label.clone()),
            was: eb
                .filter(|eb| ea.is_some_and(|ea| ea.label != eb.label))
                .map(|e| e.label.clone()),
            before_bytes: eb.map_or(0, |e| e.site.bytes),
            after_bytes: ea.map_or(0, |e| e.site.bytes),
            stack: n.user_stack(stack),
            full_stack: if full { stack.to_vec() } else { Vec::new() },
        }
    };
    for ((file, function), (mut bs, mut as_)) in groups {
        bs.sort_by_key(|&i| b[i].line);
        as_.sort_by_key(|&i| a[i].line);
        // The same number of sites on each side: an edit moved them, in order.
        if bs.len() == as_.len() {
            out.extend(bs.iter().zip(&as_).map(|(&i, &j)| one(Some(i), Some(j))));
            continue;
        }
        // Same line first, then the same call path where that pairs one with one.
        let mut pairs = Vec::new();
        bs.retain(
            |&i| match as_.iter().position(|&j| a[j].line == b[i].line) {
                Some(p) => {
                    pairs.push((i, as_.remove(p)));
                    false
                }
                None => true,
            },
        );
        let paths: Vec<&Vec<String>> = bs.iter().map(|&k| &b[k].callers).collect();
        bs.retain(|&i| {
            let same: Vec<usize> = (0..as_.len())
                .filter(|&p| a[as_[p]].callers == b[i].callers)
                .collect();
            let rivals = paths.iter().filter(|&&p| *p == b[i].callers).count();
            match same[..] {
                [p] if rivals == 1 && !b[i].callers.is_empty() => {
                    pairs.push((i, as_.remove(p)));
                    false
                }
                _ => true,
            }
        });
        if bs.len() == 1 && as_.len() == 1 {
            pairs.push((bs[0], as_[0]));
            bs.clear();
            as_.clear();
        }
        out.extend(pairs.into_iter().map(|(i, j)| one(Some(i), Some(j))));
        if !bs.is_empty() && !as_.is_empty() {
            // Ambiguous: the function's remaining sites as one row.
            let sum = |side: &[Entry<'_>], idx: &[usize]| {
                idx.iter()
                    .fold(0u64, |t, &i| t.saturating_add(side[i].site.bytes))
            };
            let top = as_.iter().copied().max_by_key(|&j| a[j].site.bytes);
            let stack = top.map_or_else(Vec::new, |j| a[j].site.stack.clone());
            out.push(SiteDelta {
                site: format!("{file}:{function}"),
                was: None,
                before_bytes: sum(&b, &bs),
                after_bytes: sum(&a, &as_),
                stack: na.user_stack(&stack),
                full_stack: if full { stack } else { Vec::new() },
            });
            continue;
        }
        out.extend(bs.into_iter().map(|i| one(Some(i), None)));
        out.extend(as_.into_iter().map(|j| one(None, Some(j))));
    }
    out
}

impl SiteChanges {
    /// The changes from `before` to `after` sites, for a figure that went from `before_total`
    /// to `after_total`; at most `shown` rows of each kind.
    pub fn of(
        deltas: Vec<SiteDelta>,
        before_total: u64,
        after_total: u64,
        shown: usize,
    ) -> SiteChanges {
        let mut c = SiteChanges {
            total_change_bytes: i128::from(after_total) - i128::from(before_total),
            ..SiteChanges::default()
        };
        for d in deltas {
            let list = match (d.before_bytes, d.after_bytes) {
                (b, a) if b == a => continue,
                (0, _) => &mut c.appeared,
                (_, 0) => &mut c.disappeared,
                (b, a) if a > b => &mut c.grew,
                _ => &mut c.shrank,
            };
            list.push(d);
        }
        for list in [
            &mut c.grew,
            &mut c.shrank,
            &mut c.appeared,
            &mut c.disappeared,
        ] {
            list.sort_by(|x, y| {
                y.delta()
                    .abs()
                    .cmp(&x.delta().abs())
                    .then_with(|| x.site.cmp(&y.site))
            });
            list.truncate(shown);
        }
        let listed: i128 = c.listed().map(SiteDelta::delta).sum();
        c.everything_else_bytes = c.total_change_bytes - listed;
        c
    }

    /// Every listed delta: grew, shrank, appeared, disappeared.
    pub fn listed(&self) -> impl Iterator<Item = &SiteDelta> + '_ {
        self.grew
            .iter()
            .chain(&self.shrank)
            .chain(&self.appeared)
            .chain(&self.disappeared)
    }

    /// Whether no site changed.
    pub fn is_empty(&self) -> bool {
        self.listed().next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(frame: &str, bytes: u64, stack: &[&str]) -> SiteBytes {
        SiteBytes {
            frame: frame.into(),
            bytes,
            stack: stack.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn paths_are_relative_to_the_run_and_libraries_are_modules() {
        let n = Normalizer::of(["/a/proj/m/model.py:3:f", "/a/proj/train.py:9:main"]);
        assert_eq!(n.label("/a/proj/m/model.py:3:f"), "m/model.py:3:f");
        assert_eq!(
            n.label("/usr/lib/python3.11/site-packages/torch/nn/functional.py:2300:linear"),
            "torch.nn.functional:2300:linear"
        );
        assert_eq!(n.label("at::_ops::bmm::call"), "at::_ops::bmm::call");
    }

    #[test]
    fn moved_lines_and_other_folders_are_the_same_sites() {
        let before = [
            site(
                "/x/p/model.py:62:update",
                100,
                &["/x/p/model.py:62:update", "/x/p/train.py:5:main"],
            ),
            site("/x/p/model.py:70:update", 50, &[]),
            site("/x/p/train.py:9:main", 7, &[]),
        ];
        let after = [
            site(
                "/y/q/p/model.py:77:update",
                100,
                &["/y/q/p/model.py:77:update", "/y/q/p/train.py:5:main"],
            ),
            site("/y/q/p/model.py:85:update", 80, &[]),
            site("/y/q/p/train.py:9:main", 7, &[]),
        ];
        let deltas = compare_sites(&before, &after, false);
        assert_eq!(deltas.len(), 3, "{deltas:?}");
        let c = SiteChanges::of(deltas, 157, 190, 5);
        assert!(c.appeared.is_empty() && c.disappeared.is_empty(), "{c:?}");
        assert_eq!(c.grew.len(), 1);
        assert_eq!(c.grew[0].site, "model.py:85:update");
        assert_eq!(c.grew[0].was.as_deref(), Some("model.py:70:update"));
        assert_eq!(c.everything_else_bytes, 3);
    }

    #[test]
    fn ambiguous_lines_group_by_function() {
        let before = [
            site("/p/m.py:1:f", 10, &[]),
            site("/p/m.py:2:f", 10, &[]),
            site("/p/n.py:1:g", 1, &[]),
        ];
        let after = [site("/p/m.py:5:f", 30, &[]), site("/p/n.py:1:g", 1, &[])];
        let c = SiteChanges::of(compare_sites(&before, &after, false), 21, 31, 5);
        assert_eq!(c.grew.len(), 1, "{c:?}");
        assert_eq!(c.grew[0].site, "m.py:f");
        assert_eq!((c.grew[0].before_bytes, c.grew[0].after_bytes), (20, 30));
        assert_eq!(c.everything_else_bytes, 0);
    }
}
