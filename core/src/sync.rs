//! Lock and atomic shim: `parking_lot` and `std` atomics in normal builds
//! (short, non-poisoning sections); `loom`'s under `--cfg loom`, so the
//! breaker's lock-free fast paths and its half-open permit logic are
//! model-checked over every thread interleaving.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8};
#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;

#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(v: T) -> Self {
        Mutex(loom::sync::Mutex::new(v))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        // loom mutexes poison only if a model thread panicked, which fails the model anyway.
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}
