//! Length bucketing: pick bucket edges so that padding each sequence up to its bucket's edge
//! wastes the least (exact dynamic programme over the length histogram, coarsened to at most
//! `GRID` points), then count the batches and padding that gives.

/// Most distinct edge positions the dynamic programme considers.
const GRID: u64 = 2048;

/// Bucketing with recommended edges.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucketing {
    /// Upper edges, ascending; a sequence goes to the first edge at least its length and is
    /// padded to it.
    pub edges: Vec<u64>,
    /// Sequences per bucket.
    pub counts: Vec<u64>,
    pub batches: u64,
    pub padding_fraction: f64,
}

/// Recommends at most `buckets` edges for `lengths` (each at most `max_len`) and evaluates
/// them with `micro_batch` sequences per batch, batches never mixing buckets.
pub fn bucket_edges(lengths: &[u32], max_len: u32, buckets: usize, micro_batch: u64) -> Bucketing {
    let max_len = u64::from(max_len.max(1));
    let step = max_len.div_ceil(GRID);
    // Histogram on the grid: a length counts at the grid point at or above it.
    let points = max_len.div_ceil(step) as usize;
    let mut count = vec![0u64; points + 1];
    let mut tokens = 0u64;
    for &l in lengths {
        let l = u64::from(l);
        tokens += l;
        count[l.div_ceil(step) as usize] += 1;
    }
    let value = |i: usize| (i as u64 * step).min(max_len);
    // Non-empty grid points, the only sensible edges.
    let used: Vec<usize> = (0..=points).filter(|&i| count[i] > 0).collect();
    let m = used.len();
    // Prefix counts and prefix sums of (count x grid value) over the used points.
    let mut pre_n = vec![0u64; m + 1];
    let mut pre_v = vec![0u64; m + 1];
    for (k, &i) in used.iter().enumerate() {
        pre_n[k + 1] = pre_n[k] + count[i];
        pre_v[k + 1] = pre_v[k] + count[i] * value(i);
    }
    // Padding slots of a bucket holding used points a..b (exclusive), edge at point b - 1.
    let cost =
        |a: usize, b: usize| (pre_n[b] - pre_n[a]) * value(used[b - 1]) - (pre_v[b] - pre_v[a]);
    let k_max = buckets.min(m).max(1);
    let inf = u64::MAX;
    // best[j]: least padding covering the first j points with the buckets so far.
    let mut best: Vec<u64> = (0..=m)
        .map(|j| if j == 0 { 0 } else { cost(0, j) })
        .collect();
    let mut choice: Vec<Vec<usize>> = vec![vec![0; m + 1]];
    for _ in 1..k_max {
        let mut next = vec![inf; m + 1];
        let mut from = vec![0usize; m + 1];
        next[0] = 0;
        for j in 1..=m {
            for (i, &prev) in best.iter().enumerate().take(j) {
                if prev == inf {
                    continue;
                }
                let c = prev + cost(i, j);
                if c < next[j] {
                    next[j] = c;
                    from[j] = i;
                }
            }
        }
        best = next;
        choice.push(from);
    }
    // Walk the choices back from the last layer.
    let mut edges_idx = Vec::new();
    let mut j = m;
    for layer in (0..choice.len()).rev() {
        if j == 0 {
            break;
        }
        edges_idx.push(j);
        j = if layer == 0 { 0 } else { choice[layer][j] };
    }
    edges_idx.reverse();
    edges_idx.dedup();
    let mut edges = Vec::new();
    let mut counts = Vec::new();
    let mut slots = 0u64;
    let mut start = 0usize;
    for &end in &edges_idx {
        if end <= start {
            continue;
        }
        let n = pre_n[end] - pre_n[start];
        let edge = value(used[end - 1]);
        edges.push(edge);
        counts.push(n);
        slots += n * edge;
        start = end;
    }
    let batches = counts.iter().map(|n| n.div_ceil(micro_batch.max(1))).sum();
    Bucketing {
        edges,
        counts,
        batches,
        padding_fraction: if slots == 0 {
            0.0
        } else {
            1.0 - tokens as f64 / slots as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_edge_per_distinct_length_wastes_nothing() {
        let b = bucket_edges(&[10, 10, 20, 30, 30, 30], 64, 3, 2);
        assert_eq!(b.edges, vec![10, 20, 30]);
        assert_eq!(b.counts, vec![2, 1, 3]);
        assert_eq!(b.batches, 1 + 1 + 2);
        assert_eq!(b.padding_fraction, 0.0);
    }

    #[test]
    fn chooses_the_cheapest_split() {
        // Two buckets for 1, 2, 100: {1, 2} at 2 and {100} at 100 pads one token.
        let b = bucket_edges(&[1, 2, 100], 128, 2, 1);
        assert_eq!(b.edges, vec![2, 100]);
        assert!((b.padding_fraction - 1.0 / 104.0).abs() < 1e-12);
        // One bucket: everything padded to the longest.
        let one = bucket_edges(&[1, 2, 100], 128, 1, 1);
        assert_eq!(one.edges, vec![100]);
    }

    #[test]
    fn coarse_grid_for_long_contexts() {
        let lengths: Vec<u32> = (1..=100_000).collect();
        let b = bucket_edges(&lengths, 131_072, 8, 4);
        assert_eq!(b.edges.len(), 8);
        assert!(b.edges.iter().all(|e| e % 64 == 0 || *e == 131_072));
        assert_eq!(b.counts.iter().sum::<u64>(), 100_000);
        // Uniform lengths: eight equal buckets pad 1/16 of the range on average, about 11%.
        assert!(b.padding_fraction < 0.12, "{}", b.padding_fraction);
    }
}
