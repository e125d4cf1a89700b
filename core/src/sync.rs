//! Lock shim: `parking_lot` in normal builds (short, non-poisoning sections);
//! `loom`'s mutex under `--cfg loom`, so the breaker's half-open permit logic
//! is model-checked over every thread interleaving.

#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;

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

/// The guard type of [`Mutex`].
#[cfg(not(loom))]
pub(crate) type MutexGuardAlias<'a, T> = parking_lot::MutexGuard<'a, T>;

/// The guard type of [`Mutex`].
#[cfg(loom)]
pub(crate) type MutexGuardAlias<'a, T> = loom::sync::MutexGuard<'a, T>;
