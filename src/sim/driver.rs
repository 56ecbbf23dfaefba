//! The CUDA driver as the allocator sees it: a capacity that bounds reserved memory, and
//! device addresses for new segments (the address the recording shows when the replay
//! offers one and it is free, else a fresh range above everything handed out).

use std::collections::BTreeMap;

/// Alignment of fresh segment addresses (what `cudaMalloc` gives large requests).
const ALIGN: u64 = 2 << 20;
/// Where fresh addresses start when nothing is known (a typical Linux device address).
const FIRST_ADDRESS: u64 = 0x7f00_0000_0000;

/// Device memory and address space.
#[derive(Clone, Debug)]
pub struct Driver {
    /// What the allocator may reserve in total; `None` = unlimited.
    pub capacity: Option<u64>,
    /// Bytes reserved now (`cudaMalloc`ed segments plus mapped expandable pages).
    pub reserved: u64,
    /// Address ranges in use: segments and expandable reservations, base -> size.
    ranges: BTreeMap<u64, u64>,
    next_address: u64,
    /// An address the replay expects for the next new range, with the size it had.
    hint: Option<(u64, Option<u64>)>,
}

impl Driver {
    pub fn new(capacity: Option<u64>) -> Driver {
        Driver {
            capacity,
            reserved: 0,
            ranges: BTreeMap::new(),
            next_address: FIRST_ADDRESS,
            hint: None,
        }
    }

    /// Offers the address of the next new range; `size` `None` accepts any size.
    pub fn set_hint(&mut self, hint: Option<(u64, Option<u64>)>) {
        self.hint = hint;
    }

    /// The hinted address of the next new address range (an expandable segment's base).
    pub fn hinted_range_base(&self) -> Option<u64> {
        match self.hint {
            Some((address, None)) => Some(address),
            _ => None,
        }
    }

    /// Sets the size of the range at `address` (an expandable segment's reservation that the
    /// recording shows ended sooner than inferred).
    pub fn resize_range(&mut self, address: u64, size: u64) {
        if let Some(s) = self.ranges.get_mut(&address) {
            *s = size;
        }
    }

    /// Whether `bytes` more can be reserved.
    pub fn fits(&self, bytes: u64) -> bool {
        self.capacity
            .is_none_or(|c| self.reserved.checked_add(bytes).is_some_and(|r| r <= c))
    }

    /// `cudaMalloc`: reserves `size` bytes at a new address, or `None` when full.
    pub fn malloc(&mut self, size: u64) -> Option<u64> {
        if !self.fits(size) {
            return None;
        }
        self.reserved = self.reserved.saturating_add(size);
        Some(self.place(size))
    }

    /// `cudaFree` of a segment.
    pub fn free(&mut self, address: u64, size: u64) {
        self.ranges.remove(&address);
        self.reserved = self.reserved.saturating_sub(size);
    }

    /// Reserves an address range without backing memory (`cuMemAddressReserve`), of `size`
    /// bytes or, at a hinted address with less room before the next range, of as many whole
    /// `page`s as fit there. Returns the base and the size.
    pub fn reserve_address_range(&mut self, size: u64, page: u64) -> (u64, u64) {
        if let Some((address, None)) = self.hint {
            let room = self
                .ranges
                .range(address..)
                .next()
                .map_or(u64::MAX - address, |(&b, _)| b - address);
            let fitted = size.min(room / page.max(1) * page.max(1));
            if fitted > 0 && self.is_free(address, fitted) {
                self.hint = None;
                self.insert(address, fitted);
                return (address, fitted);
            }
        }
        (self.place(size), size)
    }

    /// Releases an address range (`cuMemAddressFree`).
    pub fn free_address_range(&mut self, address: u64) {
        self.ranges.remove(&address);
    }

    /// Backs `bytes` of pages (`cuMemCreate`); false when full.
    pub fn map(&mut self, bytes: u64) -> bool {
        if !self.fits(bytes) {
            return false;
        }
        self.reserved = self.reserved.saturating_add(bytes);
        true
    }

    pub fn unmap(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_sub(bytes);
    }

    /// Records a range that already exists (the state rebuilt before a trace); false when it
    /// overlaps one already known.
    pub fn adopt(&mut self, address: u64, size: u64) -> bool {
        if !self.is_free(address, size) {
            return false;
        }
        self.insert(address, size);
        true
    }

    /// The start of the lowest range at or above `address`.
    pub fn start_from(&self, address: u64) -> Option<u64> {
        self.ranges.range(address..).next().map(|(&b, _)| b)
    }

    fn place(&mut self, size: u64) -> u64 {
        if let Some((address, want)) = self.hint.take() {
            if want.is_none_or(|w| w == size) && self.is_free(address, size) {
                self.insert(address, size);
                return address;
            }
        }
        let address = self.next_address;
        self.insert(address, size);
        address
    }

    fn insert(&mut self, address: u64, size: u64) {
        self.ranges.insert(address, size);
        let end = address.saturating_add(size);
        if end >= self.next_address {
            self.next_address = end.div_ceil(ALIGN).saturating_mul(ALIGN);
        }
    }

    fn is_free(&self, address: u64, size: u64) -> bool {
        let Some(end) = address.checked_add(size) else {
            return false;
        };
        let below_ok = self
            .ranges
            .range(..=address)
            .next_back()
            .is_none_or(|(&b, &s)| b.saturating_add(s) <= address);
        let above_ok = self
            .ranges
            .range(address..)
            .next()
            .is_none_or(|(&b, _)| b >= end && (b > address || size == 0));
        below_ok && above_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_bounds_reservations() {
        let mut d = Driver::new(Some(100));
        assert!(d.malloc(60).is_some());
        assert!(d.malloc(50).is_none());
        assert!(d.map(40));
        assert!(!d.map(1));
        d.unmap(40);
        assert_eq!(d.reserved, 60);
    }

    #[test]
    fn adopts_free_hinted_addresses_only() {
        let mut d = Driver::new(None);
        assert!(d.adopt(0x1000_0000, 0x20_0000));
        d.set_hint(Some((0x2000_0000, Some(0x40_0000))));
        assert_eq!(d.malloc(0x40_0000), Some(0x2000_0000));
        // Overlapping hint: a fresh address above everything instead.
        d.set_hint(Some((0x1000_0000, Some(0x20_0000))));
        let fresh = d.malloc(0x20_0000).unwrap_or(0);
        assert!(fresh >= FIRST_ADDRESS);
        // Size mismatch: not adopted.
        d.set_hint(Some((0x3000_0000, Some(1))));
        assert_ne!(d.malloc(0x20_0000), Some(0x3000_0000));
        d.free(0x2000_0000, 0x40_0000);
        d.set_hint(Some((0x2000_0000, None)));
        assert_eq!(
            d.reserve_address_range(0x10_0000, 0x1000),
            (0x2000_0000, 0x10_0000)
        );
        // A hinted range is cut to the pages that fit below the next range.
        d.set_hint(Some((0x0fe0_0000, None)));
        assert_eq!(
            d.reserve_address_range(0x100_0000, 0x10_0000),
            (0x0fe0_0000, 0x20_0000)
        );
    }
}
