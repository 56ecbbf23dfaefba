//! Size rules of the caching allocator (reference §1.1-1.3): `round_size`, pool choice and
//! the segment size a request gets from the driver.

use super::alloc_conf::{interval_index, AllocatorConfig, ROUNDUP_INTERVALS};
use crate::model::PoolKind;

/// Every block is a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served by the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Small-pool segment size and small expandable page (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests at least this large get a segment of their own size (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Large segments are rounded up to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;

/// `round_size`: 512 at least, then the power-of-two division rule or multiples of 512.
pub fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    round_size_by(size, &config.roundup_power2_divisions)
}

/// `round_size` with the `roundup_power2_divisions` of a configuration (the only setting it
/// reads).
pub fn round_size_by(size: u64, divisions: &[u64; ROUNDUP_INTERVALS]) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = divisions[interval_index(size)];
    if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
        next_division(size, divisions)
    } else {
        round_up(size, MIN_BLOCK_SIZE)
    }
}

/// `roundup_power2_next_division`: the next of `divisions` equal steps between the powers
/// of two around `size`.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor.saturating_mul(2);
    }
    round_up(size, step)
}

/// Rounds up to a multiple of `step`, saturating at the largest multiple.
pub fn round_up(size: u64, step: u64) -> u64 {
    size.div_ceil(step).saturating_mul(step)
}

/// The pool of a rounded request.
pub fn pool_for(size: u64) -> PoolKind {
    if size <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// `get_allocation_size`: the segment a rounded request gets when nothing cached fits.
pub fn allocation_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        round_up(size, ROUND_LARGE)
    }
}

/// The page size of an expandable segment of `pool`.
pub fn page_size(pool: PoolKind, config: &AllocatorConfig) -> u64 {
    match pool {
        PoolKind::Small => SMALL_BUFFER,
        PoolKind::Large => config.large_segment_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn conf(s: &str) -> AllocatorConfig {
        AllocatorConfig::parse(s).expect("valid settings")
    }

    #[test]
    fn rounds_to_512() {
        let c = AllocatorConfig::default();
        assert_eq!(round_size(0, &c), 512);
        assert_eq!(round_size(1, &c), 512);
        assert_eq!(round_size(512, &c), 512);
        assert_eq!(round_size(513, &c), 1024);
        assert_eq!(round_size(5 * MIB + 1, &c), 5 * MIB + 512);
    }

    #[test]
    fn power_of_two_divisions() {
        let c = conf("roundup_power2_divisions:4");
        // 1200 is not above 512 * 4, so it rounds to 512s.
        assert_eq!(round_size(1200, &c), 1536);
        assert_eq!(next_division(1200, 4), 1280);
        assert_eq!(round_size(5 * MIB + 1, &c), 6 * MIB);
        assert_eq!(round_size(4 * MIB, &c), 4 * MIB);
        assert_eq!(round_size(4 * MIB + 1, &c), 5 * MIB);
        // Divisions finer than the interval allows: the step is 0, so the next power of 2.
        assert_eq!(next_division(3, 4), 4);
        // Interval lookup by the unrounded size: only [256 MiB, 512 MiB) divides.
        let c = conf("roundup_power2_divisions:[256:4,512:0]");
        assert_eq!(round_size(300 * MIB, &c), 320 * MIB);
        assert_eq!(round_size(600 * MIB + 1, &c), 600 * MIB + 512);
        assert_eq!(round_size(100 * MIB + 1, &c), 112 * MIB);
    }

    #[test]
    fn pools_and_segment_sizes() {
        let c = AllocatorConfig::default();
        assert_eq!(pool_for(MIB), PoolKind::Small);
        assert_eq!(pool_for(MIB + 512), PoolKind::Large);
        assert_eq!(allocation_size(512, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB + 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB - 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB, &c), 10 * MIB);
        assert_eq!(allocation_size(11 * MIB + 1, &c), 12 * MIB);
        let c = conf("large_segment_size_mb:64");
        assert_eq!(allocation_size(5 * MIB, &c), 64 * MIB);
        assert_eq!(page_size(PoolKind::Large, &c), 64 * MIB);
        assert_eq!(page_size(PoolKind::Small, &c), 2 * MIB);
    }
}
