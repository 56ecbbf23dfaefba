//! A long list of u64 values that change little from one to the next (the times and totals
//! of a recording's changes), in 4 bytes a value instead of 8: the values are kept in blocks,
//! each an offset from the block's least value, and a block whose values lie more than 2^32
//! apart keeps them whole. Every value reads back exactly.

/// Entries per block.
const BLOCK: usize = 4096;

/// A block's values: offsets from its least value, or the values themselves.
#[derive(Debug)]
enum Block {
    Narrow { base: u64, offsets: Box<[u32]> },
    Wide(Box<[u64]>),
}

/// The values, in the order they were pushed.
#[derive(Debug, Default)]
pub struct PackedU64s {
    blocks: Vec<Block>,
    /// The values of the block being filled.
    open: Vec<u64>,
    len: usize,
}

impl PackedU64s {
    /// Adds the next value.
    #[inline(always)]
    pub fn push(&mut self, value: u64) {
        if self.open.capacity() == 0 {
            self.open.reserve_exact(BLOCK);
        }
        self.open.push(value);
        self.len += 1;
        if self.open.len() == BLOCK {
            self.close();
        }
    }

    /// Keeps the open block in its final form.
    #[cold]
    #[inline(never)]
    fn close(&mut self) {
        let Some(&first) = self.open.first() else {
            return;
        };
        let (least, most) = (self.open.iter()).fold((first, first), |(least, most), &v| {
            (least.min(v), most.max(v))
        });
        let block = if most - least <= u64::from(u32::MAX) {
            Block::Narrow {
                base: least,
                offsets: self.open.iter().map(|&v| (v - least) as u32).collect(),
            }
        } else {
            Block::Wide(self.open.as_slice().into())
        };
        self.blocks.push(block);
        self.open.clear();
    }

    /// Value `i` (below the number of values pushed).
    pub fn get(&self, i: usize) -> u64 {
        match self.blocks.get(i / BLOCK) {
            Some(Block::Narrow { base, offsets }) => base + u64::from(offsets[i % BLOCK]),
            Some(Block::Wide(values)) => values[i % BLOCK],
            None => self.open[i - self.blocks.len() * BLOCK],
        }
    }

    /// The number of values before the first for which `pred` is false, when it is true of
    /// all values before some point and false of all after (as `slice::partition_point`).
    pub fn partition_point(&self, pred: impl Fn(u64) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len);
        while low < high {
            let mid = low + (high - low) / 2;
            if pred(self.get(mid)) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_reads_back_whatever_its_block_spans() {
        // Blocks that stay within 4 GiB, one that jumps by more, values near the top, and a
        // last block cut short.
        let values: Vec<u64> = (0..3 * BLOCK + 17)
            .map(|i| match i / BLOCK {
                0 => (1 << 40) + (i as u64 * 4099) % (1 << 32),
                1 if i % 7 == 0 => 5 << 32,
                1 => 3,
                2 => u64::MAX - i as u64,
                _ => i as u64,
            })
            .collect();
        let mut packed = PackedU64s::default();
        for &v in &values {
            packed.push(v);
        }
        assert_eq!(packed.len, values.len());
        assert!(matches!(packed.blocks[0], Block::Narrow { .. }));
        assert!(matches!(packed.blocks[1], Block::Wide(_)));
        let read: Vec<u64> = (0..values.len()).map(|i| packed.get(i)).collect();
        assert_eq!(read, values);
    }

    #[test]
    fn partition_point_finds_the_first_value_past_a_bound_in_any_block() {
        let mut packed = PackedU64s::default();
        let values: Vec<u64> = (0..2 * BLOCK as u64 + 5)
            .map(|i| i * 3 + (i / 1000))
            .collect();
        for &v in &values {
            packed.push(v);
        }
        for bound in [
            0,
            1,
            3,
            2999,
            3000,
            12_290,
            values[values.len() - 1],
            u64::MAX,
        ] {
            let want = values.partition_point(|&v| v <= bound);
            assert_eq!(
                packed.partition_point(|v| v <= bound),
                want,
                "bound {bound}"
            );
        }
    }
}
