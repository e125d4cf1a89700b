//! The process clock behind the JS layer's attempt timers (`nowMs`, the
//! `attempt::STAMP` slot). Apart from the per-engine state because there is
//! one for the whole process, shared by every engine.

use crate::convert::ms_exact;
use retrywise::{Clock, SystemClock};
use std::sync::OnceLock;
use std::time::Duration;

/// The monotonic clock behind the JS layer's attempt timers: one per process
/// (timers of every engine share one list), real time even when the engine
/// runs on a manual clock, as `setTimeout` does.
fn rt_clock() -> &'static SystemClock {
    static RT: OnceLock<SystemClock> = OnceLock::new();
    RT.get_or_init(SystemClock::new)
}

#[inline]
pub(crate) fn rt_now_ms() -> f64 {
    ms_exact(rt_clock().now())
}

/// An attempt's stamp on the process clock (`attempt::STAMP`): its start moved by
/// the engine's offset, or a reading now on a manual-clock engine.
#[inline]
pub(crate) fn attempt_stamp(rt_offset_ms: Option<f64>, started_at: Duration) -> f64 {
    match rt_offset_ms {
        Some(o) => ms_exact(started_at) + o,
        None => rt_now_ms(),
    }
}
