//! Freed `rw_call` boxes kept for reuse by the thread that freed them.
//!
//! A C caller begins and frees a call per request; `malloc` + `free` of the
//! ~1 KiB box cost more than the rest of the ABI's begin. `rw_call_free`
//! drops the call in place and keeps its memory here (up to [`KEEP`] boxes
//! per thread, so at most `KEEP` × `size_of::<rw_call>()` bytes per thread
//! stay allocated); `rw_call_begin` takes one back before allocating. A box
//! freed on another thread than it began on simply joins that thread's
//! spares. At thread exit, the spares are deallocated; a free during or
//! after that teardown deallocates at once.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::ptr;

/// Spare boxes kept per thread.
const KEEP: usize = 4;

/// The thread's spare boxes of `T` (uninitialised memory, owned).
pub(crate) struct Spares<T> {
    boxes: [Cell<*mut MaybeUninit<T>>; KEEP],
    n: Cell<usize>,
}

impl<T> Spares<T> {
    pub(crate) const fn new() -> Self {
        Spares {
            boxes: [const { Cell::new(ptr::null_mut()) }; KEEP],
            n: Cell::new(0),
        }
    }

    /// A spare box, if one is kept.
    #[inline]
    pub(crate) fn take(&self) -> Option<Box<MaybeUninit<T>>> {
        let n = self.n.get().checked_sub(1)?;
        self.n.set(n);
        let p = self.boxes[n].replace(ptr::null_mut());
        // SAFETY: slots below `n` hold boxes from `Box::into_raw` (see `give`),
        // each owned by this list alone; slot `n` was just removed from it.
        Some(unsafe { Box::from_raw(p) })
    }

    /// Keeps `b` for reuse, or deallocates it when `KEEP` are kept.
    #[inline]
    pub(crate) fn give(&self, b: Box<MaybeUninit<T>>) {
        let n = self.n.get();
        if n < KEEP {
            self.boxes[n].set(Box::into_raw(b));
            self.n.set(n + 1);
        }
    }
}

impl<T> Drop for Spares<T> {
    fn drop(&mut self) {
        while self.take().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_keep_and_hands_back_the_same_memory() {
        let s = Spares::<[u64; 8]>::new();
        assert!(s.take().is_none());
        let boxes: Vec<_> = (0..KEEP + 2).map(|_| Box::<[u64; 8]>::new_uninit()).collect();
        let addrs: Vec<*const u8> = boxes.iter().map(|b| b.as_ptr().cast()).collect();
        for b in boxes {
            s.give(b);
        }
        assert_eq!(s.n.get(), KEEP);
        // Last in, first out: the most recently freed box is the warmest.
        for i in (0..KEEP).rev() {
            let b = s.take().expect("a spare");
            assert_eq!(b.as_ptr().cast::<u8>(), addrs[i]);
        }
        assert!(s.take().is_none());
    }
}
