//! Figures kept by device number, for the devices a recording's records name: a list indexed
//! by device (devices are below `recording::MAX_DEVICES`, so the list stays short), where a
//! device no record named has nothing.

/// A `T` for each device named so far, by device number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByDevice<T>(Vec<Option<T>>);

impl<T> Default for ByDevice<T> {
    fn default() -> ByDevice<T> {
        ByDevice(Vec::new())
    }
}

impl<T: Default> ByDevice<T> {
    /// The figures of `device`, made when first asked for (`device` below `MAX_DEVICES`).
    #[inline(always)]
    pub fn named(&mut self, device: u32) -> &mut T {
        let device = device as usize;
        if device >= self.0.len() {
            self.0.resize_with(device + 1, || None);
        }
        self.0[device].get_or_insert_with(T::default)
    }
}

impl<T> ByDevice<T> {
    /// The figures of `device`, if it was named.
    pub fn get(&self, device: u32) -> Option<&T> {
        self.0.get(device as usize)?.as_ref()
    }

    /// Each named device and its figures, by device number.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        (self.0.iter().enumerate()).filter_map(|(device, t)| Some((device as u32, t.as_ref()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_named_devices_are_listed_in_order() {
        let mut by = ByDevice::<u64>::default();
        *by.named(3) += 5;
        *by.named(1) += 2;
        *by.named(3) += 1;
        assert_eq!(by.iter().collect::<Vec<_>>(), [(1, &2), (3, &6)]);
        assert_eq!(by.get(3), Some(&6));
        assert_eq!((by.get(0), by.get(9)), (None, None));
    }
}
