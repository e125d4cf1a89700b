//! A list that is almost always empty or one long (attempts in flight,
//! budget grants held, events of one step): the first element inline, the
//! rest on the heap. Unlike a general small-vector, creating and dropping an
//! empty one costs a couple of instructions, which matters on every call.

use std::mem::ManuallyDrop;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Few<T> {
    first: Option<T>,
    /// Dropped by hand ([`Few`]'s `Drop`): an empty one, the usual case,
    /// then costs one inline check instead of a call to the vector's drop.
    rest: ManuallyDrop<Vec<T>>,
}

impl<T> Drop for Few<T> {
    #[inline]
    fn drop(&mut self) {
        if self.rest.capacity() != 0 {
            drop_rest(&mut self.rest);
        }
    }
}

#[cold]
#[inline(never)]
fn drop_rest<T>(rest: &mut Vec<T>) {
    drop(std::mem::take(rest));
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Few::new()
    }
}

impl<T> Few<T> {
    #[inline]
    pub(crate) const fn new() -> Self {
        Few {
            first: None,
            rest: ManuallyDrop::new(Vec::new()),
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.first.is_some() as usize + self.rest.len()
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, v: T) {
        self.push_mut(v);
    }

    /// Pushes `v` and returns it in place, for filling.
    #[inline(always)]
    pub(crate) fn push_mut(&mut self, v: T) -> &mut T {
        self.push_with(|| v)
    }

    /// Pushes the value `make` builds, built in place when it is the first
    /// (large values are not copied from the stack).
    #[inline(always)]
    pub(crate) fn push_with(&mut self, make: impl FnOnce() -> T) -> &mut T {
        if self.first.is_none() {
            // Written out: the std helpers are left out of line in some binaries.
            self.first = Some(make());
            match &mut self.first {
                Some(v) => v,
                None => unreachable!("just filled"),
            }
        } else {
            self.rest.push(make());
            let n = self.rest.len() - 1;
            &mut self.rest[n]
        }
    }

    #[inline]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.into_iter()
    }

    /// The first element pushed (and still held).
    #[inline]
    pub(crate) fn first(&self) -> Option<&T> {
        self.first.as_ref()
    }

    /// The most recently pushed element.
    #[inline]
    pub(crate) fn last(&self) -> Option<&T> {
        self.rest.last().or(self.first.as_ref())
    }

    #[inline]
    pub(crate) fn last_mut(&mut self) -> Option<&mut T> {
        match self.rest.last_mut() {
            Some(v) => Some(v),
            None => self.first.as_mut(),
        }
    }

    /// True when exactly one element is held.
    #[inline]
    pub(crate) fn is_one(&self) -> bool {
        self.first.is_some() && self.rest.is_empty()
    }

    /// Removes and returns the only element (the list must hold one: see [`Few::is_one`]).
    #[inline]
    pub(crate) fn take_one(&mut self) -> Option<T> {
        debug_assert!(self.rest.is_empty());
        self.first.take()
    }

    /// Removes and returns the first element matching `f`, keeping the others in order.
    #[inline]
    pub(crate) fn take(&mut self, f: impl Fn(&T) -> bool) -> Option<T> {
        if self.first.as_ref().is_some_and(&f) {
            let v = self.first.take();
            if !self.rest.is_empty() {
                self.first = Some(self.rest.remove(0));
            }
            return v;
        }
        let i = self.rest.iter().position(f)?;
        Some(self.rest.remove(i))
    }

    #[inline]
    pub(crate) fn contains(&self, v: &T) -> bool
    where
        T: PartialEq,
    {
        self.iter().any(|x| x == v)
    }
}

impl<'a, T> IntoIterator for &'a Few<T> {
    type Item = &'a T;
    type IntoIter = std::iter::Chain<std::option::Iter<'a, T>, std::slice::Iter<'a, T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.iter().chain(self.rest.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_through_push_take_and_drain() {
        let mut f: Few<u32> = Few::new();
        assert!(f.is_empty() && f.last().is_none());
        for i in 1..=4 {
            f.push(i);
        }
        assert_eq!((f.len(), f.last()), (4, Some(&4)));
        assert_eq!(f.take(|x| *x == 1), Some(1));
        assert_eq!(f.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(f.take(|x| *x == 3), Some(3));
        assert_eq!(f.take(|x| *x == 9), None);
        *f.last_mut().unwrap() = 40;
        assert!(f.contains(&40) && !f.contains(&4));
    }
}
