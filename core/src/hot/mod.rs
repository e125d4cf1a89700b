//! Per-thread state of an engine, so that starting and finishing a call
//! writes no cache line another thread writes (two threads on distinct keys
//! then scale instead of trading lines back and forth on every call), and
//! bumps counters with plain stores instead of locked instructions.
//!
//! For each engine it uses, a thread keeps:
//! - a [`Handle`] on the policy in force, with the thread's own block of that
//!   policy version's counters;
//! - a [`ThreadUp`] for each of the last few upstreams it called: the
//!   upstream's shared state plus the thread's own block of its counters.
//!   A call holds one reference-counted pointer, to its upstream's
//!   `ThreadUp`, whose count only this thread touches;
//! - a block of logical-request sequence numbers, taken from the engine 64 at
//!   a time. A single thread therefore numbers calls 1, 2, 3, … exactly as
//!   one shared counter would, which keeps ids and jitter reproducible;
//! - its own event ring (see [`crate::telemetry::ring`]), which only it writes.
//!
//! A counter block is written only by its thread, and only while the block
//! is current; a call used on another thread, or across a reload, counts into
//! the scope's shared atomic block instead. A thread tracks at most
//! [`MAX_ENGINES`] engines (dropped engines first, then the oldest); when it
//! forgets a block (eviction, reload, thread exit) the block is folded into
//! the shared one, so no count is lost.

use crate::clock::EngineClock;
use crate::guards::budget::DepositShard;
use crate::state::registry::evictions;
use crate::state::upstream::BudgetScope;
use crate::state::upstream::Up;
use crate::state::version::Version;
use crate::stats::{CounterSink, OwnedCounters};
use crate::telemetry::ring::ThreadRing;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Engines one thread keeps state for.
const MAX_ENGINES: usize = 8;
/// Sequence numbers a thread takes from its engine at once.
const SEQ_BLOCK: u64 = 64;
/// Upstreams a thread keeps at hand per engine.
const UPSTREAMS: usize = 4;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
static NEXT_ENGINE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number, 0 until first asked for. Initialized as a
    /// constant (no lazy-init state to check): counter ownership asks for it
    /// at every step of every call.
    static THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

/// This thread's number (never 0).
#[inline]
pub(crate) fn thread_no() -> u64 {
    let n = THREAD.with(|t| t.get());
    if n != 0 {
        n
    } else {
        first_thread_no()
    }
}

#[cold]
fn first_thread_no() -> u64 {
    let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    THREAD.with(|t| t.set(n));
    n
}

/// A counter block one thread owns: written with plain stores by that thread
/// while `current`, folded into the scope's shared block when retired.
#[derive(Debug)]
struct Owned {
    block: Arc<OwnedCounters>,
    owner: u64,
    current: AtomicBool,
}

impl Owned {
    fn new(block: Arc<OwnedCounters>) -> Self {
        Owned {
            block,
            owner: thread_no(),
            current: AtomicBool::new(true),
        }
    }

    #[inline]
    fn writable(&self) -> Option<&OwnedCounters> {
        (self.current.load(Ordering::Relaxed) && self.owner == thread_no()).then_some(&*self.block)
    }
}

/// A thread's pointer to one policy generation, with its counter block and event ring.
pub(crate) struct Handle {
    pub(crate) pol: Arc<Version>,
    counters: Owned,
    ring: Option<Arc<ThreadRing>>,
}

impl Handle {
    fn new(pol: Arc<Version>) -> Arc<Handle> {
        let block = pol.version_stats.set.new_block();
        let ring = pol.shared.bus.new_ring();
        Arc::new(Handle {
            pol,
            counters: Owned::new(block),
            ring,
        })
    }

    /// The ring a call holding this handle records into on the current
    /// thread: the handle's own when this is its thread (else the shared one).
    #[inline]
    pub(crate) fn ring_here(&self) -> Option<&ThreadRing> {
        self.counters.writable()?;
        self.ring.as_deref()
    }

    /// Where the per-version counts of a call holding this handle go, on the current thread.
    #[inline]
    pub(crate) fn sink(&self) -> CounterSink<'_> {
        match self.counters.writable() {
            Some(b) => CounterSink::Owned(b),
            None => CounterSink::Shared(self.pol.version_stats.set.shared()),
        }
    }

    fn retire(&self) {
        self.counters.current.store(false, Ordering::Relaxed);
        self.pol.version_stats.set.retire_block(&self.counters.block);
        if let Some(r) = &self.ring {
            self.pol.shared.bus.retire_ring(r);
        }
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("owner", &self.counters.owner).finish()
    }
}

/// One upstream's shared state as one thread uses it: the policy handle it
/// was resolved under, the state, and the thread's block of its counters
/// (none for a state resolved on a thread that does not cache it).
pub(crate) struct ThreadUp {
    pub(crate) handle: Arc<Handle>,
    pub(crate) up: Up,
    /// The engine's clock, one pointer away from the call.
    pub(crate) clock: EngineClock,
    counters: Option<Owned>,
    /// The process's eviction count when this state was last found fresh.
    checked: AtomicU64,
    /// Calls to this upstream may take the engine's fast lane (see `engine::lane`).
    pub(crate) lane: bool,
    /// The last millisecond [`ThreadUp::touch`] marked the cells used in.
    touched_ms: AtomicU64,
    /// This thread's deposit shard in each of the upstream's budget scopes
    /// that depends on the upstream alone (by the index of `up.budgets`);
    /// empty without `counters`, whose ownership they share.
    deposits: Box<[Option<Arc<DepositShard>>]>,
}

/// Where one step of a call counts and records on the current thread,
/// resolved with one ownership check (see [`ThreadUp::here`]).
pub(crate) struct Here<'a> {
    /// The policy version's counters.
    pub(crate) version: CounterSink<'a>,
    /// The upstream's counters.
    pub(crate) upstream: CounterSink<'a>,
    /// The thread's own event ring, when the call may write it here ([`Handle::ring_here`]).
    pub(crate) ring: Option<&'a ThreadRing>,
    /// The thread's deposit shards (see [`ThreadUp`]), when it may write them here.
    pub(crate) deposits: &'a [Option<Arc<DepositShard>>],
}

impl ThreadUp {
    /// Marks the upstream's cells used at `now_ms` (their registries evict
    /// idle keys): once per millisecond, not on every call.
    #[inline]
    pub(crate) fn touch(&self, now_ms: u64) {
        if self.touched_ms.load(Ordering::Relaxed) != now_ms {
            self.touched_ms.store(now_ms, Ordering::Relaxed);
            self.up.touch(now_ms);
            self.up.value.touch(now_ms);
        }
    }

    /// [`Handle::sink`], [`ThreadUp::sink`] and [`Handle::ring_here`] at once. A state that has counters of its own was made by the thread
    /// that owns its handle, and is retired no later than that handle: so
    /// when the handle is this thread's and current, the state's own block
    /// is writable exactly while it is current.
    #[inline(always)]
    pub(crate) fn here(&self) -> Here<'_> {
        match self.handle.counters.writable() {
            Some(v) => {
                let (upstream, deposits) = match &self.counters {
                    Some(c) if c.current.load(Ordering::Relaxed) => (CounterSink::Owned(&c.block), &self.deposits[..]),
                    _ => (CounterSink::Shared(self.up.value.counters.value.shared()), &[][..]),
                };
                Here {
                    version: CounterSink::Owned(v),
                    upstream,
                    ring: self.handle.ring.as_deref(),
                    deposits,
                }
            }
            None => {
                let upstream = self.sink();
                Here {
                    version: self.handle.sink(),
                    deposits: match upstream {
                        CounterSink::Owned(_) => &self.deposits[..],
                        CounterSink::Shared(_) => &[],
                    },
                    upstream,
                    ring: None,
                }
            }
        }
    }

    /// Where this upstream's counts go, on the current thread.
    #[inline]
    pub(crate) fn sink(&self) -> CounterSink<'_> {
        match self.counters.as_ref().and_then(Owned::writable) {
            Some(b) => CounterSink::Owned(b),
            None => CounterSink::Shared(self.up.value.counters.value.shared()),
        }
    }

    fn retire(&self) {
        if let Some(c) = &self.counters {
            c.current.store(false, Ordering::Relaxed);
            self.up.value.counters.value.retire_block(&c.block);
        }
        for (b, d) in self.up.value.budgets.iter().zip(self.deposits.iter()) {
            if let (BudgetScope::Fixed(cell), Some(d)) = (b, d) {
                cell.value.retire_shard(d);
            }
        }
    }

    /// True while the cached state may still be used (nothing it points to
    /// was evicted); its slots are looked at only after an eviction somewhere.
    #[inline]
    fn fresh(&self) -> bool {
        let seen = evictions();
        if self.checked.load(Ordering::Relaxed) == seen {
            return true;
        }
        let fresh = !self.up.is_evicted() && !self.up.value.is_stale();
        if fresh {
            self.checked.store(seen, Ordering::Relaxed);
        }
        fresh
    }
}

impl std::fmt::Debug for ThreadUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadUp").field("upstream", &self.up.key).finish()
    }
}

/// What the current thread knows about one engine.
struct Local {
    engine: Weak<()>,
    engine_id: u64,
    handle: Arc<Handle>,
    seq_next: u64,
    seq_end: u64,
    /// Recently used upstreams under `handle`'s policy version.
    ups: [Option<Arc<ThreadUp>>; UPSTREAMS],
    /// A second reference to each of `ups`, lent to the next call that
    /// begins on it and given back when that call ends (see [`Lent`]).
    spare: [Option<Arc<ThreadUp>>; UPSTREAMS],
    ups_next: u8,
}

impl Local {
    fn clear_ups(&mut self) {
        self.spare = Default::default();
        for u in self.ups.iter_mut() {
            if let Some(u) = u.take() {
                u.retire();
            }
        }
    }

    #[inline]
    fn cached(&self, upstream: &str) -> Option<&Arc<ThreadUp>> {
        self.ups.iter().flatten().find(|u| u.up.key == upstream && u.fresh())
    }

    /// A reference to cached state `i` for a beginning call: the spare one
    /// when it is at home, else a new one.
    #[inline]
    fn lend(&mut self, upstream: &str) -> Option<Arc<ThreadUp>> {
        let i = self
            .ups
            .iter()
            .position(|u| u.as_ref().is_some_and(|u| u.up.key == upstream && u.fresh()))?;
        match self.spare[i].take() {
            Some(tu) => Some(tu),
            None => self.ups[i].clone(),
        }
    }

    fn cache(&mut self, tu: &Arc<ThreadUp>) {
        let i = match self
            .ups
            .iter()
            .position(|u| u.as_ref().is_some_and(|u| u.up.key == tu.up.key))
        {
            Some(i) => i,
            None => {
                let i = self.ups_next as usize % UPSTREAMS;
                self.ups_next = self.ups_next.wrapping_add(1);
                i
            }
        };
        self.spare[i] = None;
        if let Some(old) = self.ups[i].replace(tu.clone()) {
            old.retire();
        }
    }
}

/// A call's reference to its upstream's state. One lent from its thread's
/// cache goes back there when the call ends on that thread (unless another
/// is already back): a call then moves the reference in and out instead of
/// counting it up and down, which costs two locked instructions.
pub(crate) struct Lent(Option<Arc<ThreadUp>>);

impl Lent {
    #[inline]
    pub(crate) fn new(tu: Arc<ThreadUp>) -> Lent {
        Lent(Some(tu))
    }
}

impl std::ops::Deref for Lent {
    type Target = Arc<ThreadUp>;

    #[inline]
    fn deref(&self) -> &Arc<ThreadUp> {
        match &self.0 {
            Some(tu) => tu,
            // Only `drop` takes it out.
            None => unreachable!("a call's upstream state is taken only when the call is dropped"),
        }
    }
}

impl Drop for Lent {
    #[inline]
    fn drop(&mut self) {
        if let Some(tu) = self.0.take() {
            give_back(tu);
        }
    }
}

/// Puts `tu` back as its thread's spare reference when this thread caches
/// it and its spare is out; otherwise drops it.
#[inline]
fn give_back(tu: Arc<ThreadUp>) {
    let back = LOCAL.try_with(|cell| {
        let Ok(mut v) = cell.try_borrow_mut() else {
            return Some(tu);
        };
        for l in v.iter_mut() {
            if !Arc::ptr_eq(&l.handle, &tu.handle) {
                continue;
            }
            if let Some(i) = l
                .ups
                .iter()
                .position(|u| u.as_ref().is_some_and(|u| Arc::ptr_eq(u, &tu)))
            {
                if l.spare[i].is_none() {
                    l.spare[i] = Some(tu);
                    return None;
                }
            }
            break;
        }
        Some(tu)
    });
    drop(back);
}

impl Drop for Local {
    fn drop(&mut self) {
        self.clear_ups();
        self.handle.retire();
    }
}

/// How a call begins on this thread (see [`EngineLocal::begin`]).
pub(crate) struct Begin {
    pub(crate) seq: u64,
    pub(crate) start: Start,
}

/// What a beginning call gets from its thread.
pub(crate) enum Start {
    /// The thread's state of the upstream the call names.
    Cached(Arc<ThreadUp>),
    /// The thread's handle on the policy in force (the call's upstream is resolved next).
    Fresh(Arc<Handle>),
}

impl Start {
    #[inline]
    pub(crate) fn handle(&self) -> &Arc<Handle> {
        match self {
            Start::Cached(tu) => &tu.handle,
            Start::Fresh(h) => h,
        }
    }
}

/// The engine side of per-thread state.
pub(crate) struct EngineLocal {
    /// Dropped with the engine: threads then know their state for it is stale.
    alive: Arc<()>,
    pub(crate) id: u64,
    /// Next unreserved sequence number.
    next_seq: AtomicU64,
}

impl EngineLocal {
    pub(crate) fn new() -> Self {
        EngineLocal {
            alive: Arc::new(()),
            id: NEXT_ENGINE.fetch_add(1, Ordering::Relaxed),
            next_seq: AtomicU64::new(0),
        }
    }

    /// For a call beginning on this thread: its sequence number and either the thread's state for upstream `direct` (when the
    /// call names an upstream this thread used recently) or the thread's
    /// handle on the policy in force. `current` is asked for the policy only
    /// when it changed since the thread last looked.
    #[inline]
    pub(crate) fn begin(&self, generation: u64, current: impl FnOnce() -> Arc<Version>, direct: Option<&str>) -> Begin {
        LOCAL.with(|cell| {
            let mut v = cell.borrow_mut();
            let i = match v.iter().position(|l| l.engine_id == self.id) {
                Some(i) => {
                    if v[i].handle.pol.generation != generation {
                        let l = &mut v[i];
                        l.clear_ups();
                        std::mem::replace(&mut l.handle, Handle::new(current())).retire();
                    }
                    i
                }
                None => self.add(&mut v, current()),
            };
            let l = &mut v[i];
            if l.seq_next == l.seq_end {
                l.seq_next = self.next_seq.fetch_add(SEQ_BLOCK, Ordering::Relaxed);
                l.seq_end = l.seq_next + SEQ_BLOCK;
            }
            l.seq_next += 1;
            // A name the policy routes, or (with routes) one it does not know,
            // takes the general path: the route's matcher, or the refusal.
            let policy = &l.handle.pol.policy;
            let routes = &policy.routes;
            let start = match direct
                .filter(|d| routes.is_empty() || (!routes.contains_key(*d) && policy.upstreams.contains_key(*d)))
            {
                Some(d) => match l.lend(d) {
                    Some(tu) => Start::Cached(tu),
                    None => Start::Fresh(l.handle.clone()),
                },
                None => Start::Fresh(l.handle.clone()),
            };
            Begin { seq: l.seq_next, start }
        })
    }

    #[cold]
    fn add(&self, v: &mut Vec<Local>, pol: Arc<Version>) -> usize {
        v.retain(|l| l.engine.strong_count() > 0);
        if v.len() >= MAX_ENGINES {
            v.remove(0);
        }
        v.push(Local {
            engine: Arc::downgrade(&self.alive),
            engine_id: self.id,
            handle: Handle::new(pol),
            seq_next: 0,
            seq_end: 0,
            ups: Default::default(),
            spare: Default::default(),
            ups_next: 0,
        });
        v.len() - 1
    }
}

/// The thread's state of `upstream` under `handle`'s policy: cached when the
/// thread's current handle for engine `engine_id` is `handle`, otherwise
/// resolved without an owned counter block.
pub(crate) fn thread_up(engine_id: u64, handle: &Arc<Handle>, upstream: &str, now_ms: u64) -> Arc<ThreadUp> {
    let cached = LOCAL.try_with(|cell| {
        let mut v = cell.borrow_mut();
        let l = v
            .iter_mut()
            .find(|l| l.engine_id == engine_id && Arc::ptr_eq(&l.handle, handle))?;
        if let Some(tu) = l.cached(upstream) {
            let tu = tu.clone();
            tu.touch(now_ms);
            return Some(tu);
        }
        let up = handle.pol.upstream(upstream, now_ms);
        let block = up.value.counters.value.new_block();
        let deposits = up
            .value
            .budgets
            .iter()
            .map(|b| match b {
                BudgetScope::Fixed(cell) => Some(cell.value.new_shard(&handle.pol.budget)),
                BudgetScope::PerCall(_) => None,
            })
            .collect();
        let tu = Arc::new(ThreadUp {
            handle: handle.clone(),
            lane: handle.pol.lane_for(&up.value),
            up,
            clock: handle.pol.shared.clock.clone(),
            counters: Some(Owned::new(block)),
            checked: AtomicU64::new(u64::MAX),
            touched_ms: AtomicU64::new(u64::MAX),
            deposits,
        });
        l.cache(&tu);
        Some(tu)
    });
    match cached {
        Ok(Some(tu)) => tu,
        _ => {
            let up = handle.pol.upstream(upstream, now_ms);
            Arc::new(ThreadUp {
                handle: handle.clone(),
                lane: handle.pol.lane_for(&up.value),
                up,
                clock: handle.pol.shared.clock.clone(),
                counters: None,
                checked: AtomicU64::new(u64::MAX),
                touched_ms: AtomicU64::new(u64::MAX),
                deposits: Box::new([]),
            })
        }
    }
}
