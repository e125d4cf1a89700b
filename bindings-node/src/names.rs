//! Upstream names interned per engine, so that attempts and decisions name
//! their upstream by index in scratch (the JS side caches the strings by
//! index). Used by the call slots, the engine and the finished-call slots.

use smol_str::SmolStr;

/// Upstream names interned per engine (the JS side caches them by index).
const MAX_INTERNED: usize = 256;

/// Upstream names by index (the JS side caches the strings by index). Only
/// the engine's JS thread touches it: no lock.
#[derive(Default)]
pub(crate) struct Names {
    list: Vec<SmolStr>,
    last: usize,
}

impl Names {
    /// Index of `u`, interning it when there is room; -1 when the table is full.
    #[inline]
    pub(crate) fn index(&mut self, u: &SmolStr) -> f64 {
        if let Some(n) = self.list.get(self.last) {
            if n == u {
                return self.last as f64;
            }
        }
        for (i, n) in self.list.iter().enumerate() {
            if n == u {
                self.last = i;
                return i as f64;
            }
        }
        if self.list.len() < MAX_INTERNED {
            self.list.push(u.clone());
            self.last = self.list.len() - 1;
            return self.last as f64;
        }
        -1.0
    }

    /// [`Names::index`] of a name given as text (no `SmolStr` made when it is interned).
    #[inline]
    pub(crate) fn index_str(&mut self, u: &str) -> f64 {
        if let Some(n) = self.list.get(self.last) {
            if n.as_str() == u {
                return self.last as f64;
            }
        }
        self.index(&SmolStr::new(u))
    }

    pub(crate) fn name(&self, i: u32) -> Option<String> {
        self.list.get(i as usize).map(|s| s.to_string())
    }
}
