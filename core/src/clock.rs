//! Injected time. The core never reads a clock it was not given: a
//! [`SystemClock`] in production, a [`ManualClock`] in tests and conformance
//! vectors, so every decision can be replayed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A monotonic clock (for deadlines and windows) plus a wall clock (only for
/// HTTP-date Retry-After values).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Monotonic time since an arbitrary, fixed origin.
    fn now(&self) -> Duration;
    /// Wall-clock time.
    fn wall(&self) -> SystemTime;
}

/// The real clocks: the CPU's invariant time-stamp counter, calibrated
/// against the OS monotonic clock (falling back to that clock where the
/// counter is unreliable), for monotonic time; [`SystemTime`] for wall time.
///
/// Every decision reads the monotonic clock, so its cost is on every call:
/// `Instant::now` costs about 23 ns on a typical cloud VM, the calibrated
/// counter about half that.
#[derive(Debug, Clone)]
pub struct SystemClock {
    clock: quanta::Clock,
    /// The counter's raw reading at the origin.
    origin_raw: u64,
}

/// One calibration per process (it takes a few milliseconds).
fn calibrated() -> quanta::Clock {
    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new).clone()
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
    pub fn new() -> Self {
        let clock = calibrated();
        SystemClock {
            origin_raw: clock.raw(),
            clock,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl SystemClock {
    /// [`Clock::now`] in nanoseconds, without building a `Duration`.
    #[inline(always)]
    fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin_raw, self.clock.raw())
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns())
    }
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The clock an engine reads: the system clock without a virtual call (it is
/// read three times per call), or any injected one.
#[derive(Debug, Clone)]
pub(crate) enum EngineClock {
    System(SystemClock),
    Injected(Arc<dyn Clock>),
}

impl EngineClock {
    #[inline]
    pub(crate) fn now(&self) -> Duration {
        match self {
            EngineClock::System(c) => c.now(),
            EngineClock::Injected(c) => c.now(),
        }
    }

    /// The reading as [`Nanos`], what a call's steps compute with.
    #[inline(always)]
    pub(crate) fn now_ns(&self) -> Nanos {
        match self {
            EngineClock::System(c) => Nanos(c.now_ns()),
            EngineClock::Injected(c) => Nanos::of(c.now()),
        }
    }

    pub(crate) fn wall(&self) -> SystemTime {
        match self {
            EngineClock::System(c) => c.wall(),
            EngineClock::Injected(c) => c.wall(),
        }
    }
}

/// Monotonic engine time (or a span of it) in nanoseconds, saturating at
/// `u64::MAX` (584 years). A call's steps compute deadlines and event times
/// with it: u64 arithmetic, where building a `Duration` costs a division and
/// taking one apart into milliseconds two more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct Nanos(pub(crate) u64);

impl Nanos {
    /// `d` in nanoseconds, saturating.
    #[inline]
    pub(crate) fn of(d: Duration) -> Nanos {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// `ms` milliseconds, saturating.
    #[inline]
    pub(crate) fn from_ms(ms: u64) -> Nanos {
        Nanos(ms.saturating_mul(1_000_000))
    }

    /// Whole milliseconds.
    #[inline]
    pub(crate) fn ms(self) -> u64 {
        self.0 / 1_000_000
    }

    #[inline]
    pub(crate) fn dur(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    #[inline]
    pub(crate) fn saturating_add(self, o: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(o.0))
    }

    #[inline]
    pub(crate) fn saturating_sub(self, o: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(o.0))
    }

    #[inline]
    pub(crate) fn is_zero(self) -> bool {
        self.0 == 0
    }
}

/// A clock that moves only when told. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug)]
struct ManualInner {
    mono_ns: AtomicU64,
    wall_ns: AtomicU64,
}

impl ManualClock {
    /// Monotonic time 0; wall time 2025-01-01T00:00:00Z (1 735 689 600 s after the epoch).
    pub fn new() -> Self {
        Self::at_wall(UNIX_EPOCH + Duration::from_secs(1_735_689_600))
    }

    /// Monotonic time 0 and the given wall time.
    pub fn at_wall(wall: SystemTime) -> Self {
        let wall_ns = wall
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        ManualClock {
            inner: Arc::new(ManualInner {
                mono_ns: AtomicU64::new(0),
                wall_ns: AtomicU64::new(wall_ns),
            }),
        }
    }

    /// Moves both clocks forward.
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.inner.mono_ns.fetch_add(ns, Ordering::SeqCst);
        self.inner.wall_ns.fetch_add(ns, Ordering::SeqCst);
    }

    /// Moves both clocks forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.advance(Duration::from_millis(ms));
    }

    /// Sets the wall clock only (to model skew); monotonic time is unchanged.
    pub fn set_wall(&self, wall: SystemTime) {
        let ns = wall
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        self.inner.wall_ns.store(ns, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.inner.mono_ns.load(Ordering::SeqCst))
    }
    fn wall(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.inner.wall_ns.load(Ordering::SeqCst))
    }
}

/// Whole milliseconds, saturating (u64 arithmetic: cheaper than `as_millis`'s u128).
pub(crate) fn ms(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanos_floor_to_milliseconds_and_saturate() {
        assert_eq!(Nanos::of(Duration::from_nanos(1_999_999)).ms(), 1);
        assert_eq!(Nanos::of(Duration::from_millis(1500)).ms(), 1500);
        assert_eq!(Nanos::of(Duration::MAX), Nanos(u64::MAX));
        assert_eq!(Nanos::from_ms(u64::MAX), Nanos(u64::MAX));
        assert_eq!(Nanos(5).saturating_sub(Nanos(7)), Nanos(0));
        assert_eq!(Nanos(u64::MAX - 1).saturating_add(Nanos(7)), Nanos(u64::MAX));
        assert_eq!(Nanos(1_234_567_891).dur(), Duration::new(1, 234_567_891));
        assert!(Nanos(0).is_zero() && !Nanos(1).is_zero());
    }

    #[test]
    fn system_clock_nanoseconds_agree_with_its_durations() {
        let c = EngineClock::System(SystemClock::new());
        let (a, b, d) = (c.now_ns(), c.now(), c.now_ns());
        assert!(a <= Nanos::of(b) && Nanos::of(b) <= d, "{a:?} {b:?} {d:?}");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        let w0 = c.wall();
        assert_eq!(c.now(), Duration::ZERO);
        c.advance_ms(1500);
        assert_eq!(c.now(), Duration::from_millis(1500));
        assert_eq!(c.wall().duration_since(w0).unwrap(), Duration::from_millis(1500));
        let shared = c.clone();
        shared.advance_ms(1);
        assert_eq!(c.now(), Duration::from_millis(1501));
    }

    #[test]
    fn system_clock_is_monotonic_and_tracks_real_time() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        let t0 = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        let slept = c.now() - b;
        let real = t0.elapsed();
        let diff = slept.abs_diff(real);
        assert!(diff < Duration::from_millis(5), "{slept:?} vs {real:?}");
    }
}
