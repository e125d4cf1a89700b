//! Model-checks the shared-state permits with loom: in every interleaving
//! of threads acquiring, recording and releasing probes, probes in flight
//! never exceed `half_open_probes`, and none is leaked; and threads racing
//! for the last retries of a budget never take more than it allows.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p retrywise --test loom_breaker`
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use retrywise::internals::{Admit, BreakerCell, BreakerParams, Record};
use retrywise::internals::{BudgetCell, BudgetParams};
use retrywise::policy::{Breaker, Budget};

fn half_open(probes: u32) -> (Arc<BreakerCell>, BreakerParams) {
    let p = BreakerParams::new(&Breaker {
        min_calls: 1,
        failure_rate: Some(1.0),
        open_ms: 10,
        open_jitter: 0.0,
        half_open_probes: probes,
        close_after: 2,
        ..Breaker::default()
    });
    let b = BreakerCell::new(p.clone(), 7);
    b.acquire(&p, None, 0);
    b.record(&p, None, 0, false, Record::Failure, false);
    (Arc::new(b), p)
}

fn check(probes: u32, threads: usize, outcomes: &'static [Record]) {
    // A preemption bound keeps the search tractable while still covering
    // every interleaving with up to three forced context switches.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(move || {
        let (b, p) = half_open(probes);
        let live = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (b, p, live) = (b.clone(), p.clone(), live.clone());
                thread::spawn(move || {
                    if let (Admit::Allowed { probe }, _) = b.acquire(&p, None, 20) {
                        let n = live.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(n <= probes as usize, "{n} probes in flight > {probes}");
                        live.fetch_sub(1, Ordering::SeqCst);
                        match outcomes[i % outcomes.len()] {
                            Record::Ignored if i % 2 == 1 => b.release(&p, probe),
                            r => {
                                b.record(&p, None, 20, probe, r, false);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(b.probes_in_flight(), 0, "a probe permit leaked");
    });
}

#[test]
fn one_probe_three_threads() {
    check(1, 3, &[Record::Success, Record::Failure, Record::Ignored]);
}

#[test]
fn two_probes_three_threads() {
    check(2, 3, &[Record::Success, Record::Ignored, Record::Success]);
}

#[test]
fn budget_withdrawals_never_exceed_the_allowance() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        // Ratio 1, one request: exactly one retry may be granted to two racing threads.
        let p = BudgetParams::new(&Budget {
            ratio: 1.0,
            min_per_sec: 0.0,
            ..Budget::default()
        });
        let cell = Arc::new(BudgetCell::new(p));
        cell.deposit(&p, 0);
        let granted = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (cell, granted) = (cell.clone(), granted.clone());
                thread::spawn(move || {
                    if cell.try_withdraw(&p, 0).is_ok() {
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(granted.load(Ordering::SeqCst), 1);
    });
}
