//! The grid of settings `simulate --sweep` tries: expandable segments on and off, several
//! `max_split_size_mb`, `roundup_power2_divisions`, and the garbage collector (which needs a
//! memory fraction, so only when the capacity is known).

use super::alloc_conf::AllocatorConfig;

/// Settings strings of the grid.
pub fn grid(capacity_known: bool) -> Vec<String> {
    let mut out = Vec::new();
    for expandable in ["", "expandable_segments:True"] {
        for split in ["", "max_split_size_mb:64", "max_split_size_mb:256"] {
            for divisions in ["", "roundup_power2_divisions:4"] {
                let parts: Vec<&str> = [expandable, split, divisions]
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .collect();
                out.push(parts.join(","));
            }
        }
        if capacity_known {
            let gc = "garbage_collection_threshold:0.8,per_process_memory_fraction:1.0";
            out.push(
                [expandable, gc]
                    .join(",")
                    .trim_start_matches(',')
                    .to_string(),
            );
        }
    }
    out
}

/// The grid as parsed settings, without those equal to `skip`.
pub fn configs(capacity_known: bool, skip: &[&AllocatorConfig]) -> Vec<AllocatorConfig> {
    let mut out: Vec<AllocatorConfig> = Vec::new();
    for conf in grid(capacity_known) {
        if let Ok(c) = AllocatorConfig::parse(&conf) {
            if !skip.contains(&&c) && !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grid_setting_parses() {
        for known in [false, true] {
            let grid = grid(known);
            assert_eq!(grid.len(), if known { 14 } else { 12 });
            for conf in grid {
                assert!(AllocatorConfig::parse(&conf).is_ok(), "{conf}");
            }
        }
        let defaults = AllocatorConfig::default();
        assert_eq!(configs(false, &[&defaults]).len(), 11);
    }
}
