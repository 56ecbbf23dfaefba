//! Sites that serve many callers: a user frame that is the innermost for allocations coming
//! from several distinct callers (an `allocate` helper, a shared layer), where the callers tell
//! what to change.

use crate::model::{FrameKind, Live, StackTable};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// A wrapper holds at least this share of the live memory before it is named.
const SHARE: f64 = 0.05;
/// ... and is the innermost user frame for at least this many distinct callers.
const CALLERS: usize = 3;
/// Callers listed per wrapper.
const LISTED: usize = 5;

/// A user frame innermost for allocations from several callers, with what each caller holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Wrapper {
    pub site: String,
    pub bytes: u64,
    /// How many distinct callers (the next user frame outward) its allocations come from.
    pub caller_count: usize,
    /// The largest callers, most bytes first: `{site, bytes}`.
    pub callers: Vec<CallerBytes>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallerBytes {
    pub site: String,
    pub bytes: u64,
}

/// The wrappers among `live`, most bytes first.
pub fn wrappers(stacks: &StackTable, live: &[(u64, Live)]) -> Vec<Wrapper> {
    let total = live.iter().fold(0u64, |a, (_, l)| a.saturating_add(l.size));
    // By innermost user frame: its bytes, and bytes by caller.
    let mut by_site: FxHashMap<String, (u64, FxHashMap<String, u64>)> = FxHashMap::default();
    for (_, l) in live {
        let Some(id) = l.stack else { continue };
        let mut users = stacks
            .classified(id)
            .filter(|(_, k)| *k == FrameKind::User)
            .map(|(f, _)| f);
        let Some(site) = users.next() else { continue };
        let caller = users
            .find(|f| f.name != site.name || f.filename != site.filename)
            .map(|f| f.short_label());
        let Some(caller) = caller else { continue };
        let entry = by_site.entry(site.short_label()).or_default();
        entry.0 = entry.0.saturating_add(l.size);
        *entry.1.entry(caller).or_default() += l.size;
    }
    let mut out: Vec<Wrapper> = by_site
        .into_iter()
        .filter(|(_, (bytes, callers))| {
            callers.len() >= CALLERS && *bytes as f64 >= total as f64 * SHARE
        })
        .map(|(site, (bytes, callers))| {
            let caller_count = callers.len();
            let mut callers: Vec<CallerBytes> = callers
                .into_iter()
                .map(|(site, bytes)| CallerBytes { site, bytes })
                .collect();
            callers.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
            callers.truncate(LISTED);
            Wrapper {
                site,
                bytes,
                caller_count,
                callers,
            }
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    out
}
