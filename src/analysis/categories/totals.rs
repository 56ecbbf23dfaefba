//! The live total after each trace entry, as the categories' replay noted it, in 4 bytes an
//! entry instead of 8: the totals are kept in blocks, each an offset from the block's least
//! value, and a block whose values lie more than 4 GiB apart keeps them whole. Every value
//! reads back exactly.

/// Entries per block.
const BLOCK: usize = 4096;

/// A block's values: offsets from its least value, or the values themselves.
enum Block {
    Narrow { base: u64, offsets: Box<[u32]> },
    Wide(Box<[u64]>),
}

/// The live totals, in entry order.
pub struct LiveTotals {
    blocks: Vec<Block>,
    /// The values of the block being filled.
    open: Vec<u64>,
    len: usize,
}

impl LiveTotals {
    pub fn new() -> LiveTotals {
        LiveTotals {
            blocks: Vec::new(),
            open: Vec::with_capacity(BLOCK),
            len: 0,
        }
    }

    /// Adds the total after the next entry.
    #[inline]
    pub fn push(&mut self, total: u64) {
        self.open.push(total);
        self.len += 1;
        if self.open.len() == BLOCK {
            self.close();
        }
    }

    /// Keeps the open block in its final form.
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

    /// Done adding: the last block is closed.
    pub fn finish(mut self) -> LiveTotals {
        self.close();
        self.open = Vec::new();
        self
    }

    /// How many totals there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The total after entry `i` (`i < len()`).
    pub fn get(&self, i: usize) -> u64 {
        match self.blocks.get(i / BLOCK) {
            Some(Block::Narrow { base, offsets }) => base + u64::from(offsets[i % BLOCK]),
            Some(Block::Wide(values)) => values[i % BLOCK],
            None => self.open[i - self.blocks.len() * BLOCK],
        }
    }

    /// Every total, in entry order.
    pub fn to_vec(&self) -> Vec<u64> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_total_reads_back_whatever_its_block_spans() {
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
        let mut totals = LiveTotals::new();
        for &v in &values {
            totals.push(v);
        }
        let totals = totals.finish();
        assert_eq!(totals.len(), values.len());
        assert!(matches!(totals.blocks[0], Block::Narrow { .. }));
        assert!(matches!(totals.blocks[1], Block::Wide(_)));
        assert_eq!(totals.to_vec(), values);
        assert!(LiveTotals::new().finish().to_vec().is_empty());
    }
}
