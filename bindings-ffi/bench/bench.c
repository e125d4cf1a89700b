/*
 * C benchmark of the decision cycle through the C ABI:
 *   begin -> next_attempt -> report(200) -> free                       ("success")
 *   begin -> next_attempt -> report(503) -> next_attempt -> report(200) ("retry")
 * Compare with the Rust core doing the same work: bench/bench_core.rs
 * (cargo run --release -p retrywise-ffi --example bench_core).
 * Both use the same policy, seed and outcomes, and both
 * build the outbound headers of every attempt, as a real caller must.
 *
 * Usage: bench [iterations-per-round] [rounds]; prints the best round, in ns per cycle.
 */
#define _POSIX_C_SOURCE 199309L
#include "retrywise.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char POLICY[] = "{\"budget\": {\"enabled\": false}, \"breaker\": {\"enabled\": false}}";

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static volatile uint64_t sink; /* keeps the results observable */

/* One logical request; `fail_first` reports a 503 before the 200. */
static int cycle(rw_engine *e, const rw_call_spec *spec, int fail_first) {
  rw_call *c = NULL;
  if (rw_call_begin(e, spec, &c) != RW_OK) return 0;
  rw_attempt a;
  rw_decision d;
  rw_outcome o = RW_OUTCOME_INIT;
  int ok = 0;
  while (rw_call_next_attempt(c, &a) == RW_OK) {
    sink += a.headers_len + a.total_timeout_ms;
    o.status = (fail_first && a.number == 1) ? 503 : 200;
    if (rw_call_report(c, &o, &d) != RW_OK) break;
    if (d.action == RW_ACTION_SUCCEEDED) {
      ok = 1;
      break;
    }
    if (d.action != RW_ACTION_RETRY) break;
    sink += d.delay_ms; /* a real caller sleeps here; the benchmark does not */
  }
  rw_call_free(c);
  return ok;
}

static double run(rw_engine *e, const rw_call_spec *spec, int fail_first, long iters, int rounds) {
  double best = 1e30;
  for (long i = 0; i < iters / 10; i++) cycle(e, spec, fail_first); /* warm-up */
  for (int r = 0; r < rounds; r++) {
    double t0 = now_ns();
    long ok = 0;
    for (long i = 0; i < iters; i++) ok += cycle(e, spec, fail_first);
    double ns = (now_ns() - t0) / (double)iters;
    if (ok != iters) {
      fprintf(stderr, "bench: only %ld of %ld cycles succeeded\n", ok, iters);
      exit(1);
    }
    if (ns < best) best = ns;
  }
  return best;
}

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 200000;
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  rw_engine_options opts = {.seed = 7, .has_seed = true, .manual_clock = false};
  rw_error *err = NULL;
  rw_engine *e = rw_engine_new_with(POLICY, sizeof POLICY - 1, &opts, &err);
  if (e == NULL) {
    fprintf(stderr, "bench: %s\n", rw_error_message(err));
    rw_error_free(err);
    return 1;
  }
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.route.ptr = "bench/upstream";
  spec.route.len = strlen(spec.route.ptr);
  spec.deadline_ms = 10000;
  printf("c-abi success: %.1f ns/cycle\n", run(e, &spec, 0, iters, rounds));
  printf("c-abi retry:   %.1f ns/cycle\n", run(e, &spec, 1, iters, rounds));
  rw_engine_free(e);
  return 0;
}
