/*
 * What the C tests of libretrywise share: CHECK / CHECK_RC (counted, never
 * aborting, so one run lists every failure), rw_str helpers and engines with
 * a fixed seed. Included by one test program each (the counters are static).
 */
#ifndef RETRYWISE_TESTS_CHECK_H
#define RETRYWISE_TESTS_CHECK_H

#include "retrywise.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      failures++;                                                              \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

#define CHECK_RC(expr, want)                                                   \
  do {                                                                         \
    rw_result rc_ = (expr);                                                    \
    checks++;                                                                  \
    if (rc_ != (want)) {                                                       \
      failures++;                                                              \
      fprintf(stderr, "%s:%d: %s returned %s, want %s\n", __FILE__, __LINE__,  \
              #expr, rw_result_name(rc_), rw_result_name(want));               \
    }                                                                          \
  } while (0)

/* rw_str equals a C string. */
static inline int str_eq(rw_str s, const char *want) {
  size_t n = strlen(want);
  return s.ptr != NULL && s.len == n && memcmp(s.ptr, want, n) == 0;
}

/* rw_str from a NUL-terminated string (NULL stays NULL). */
static inline rw_str str_of(const char *s) {
  rw_str r = {s, s ? strlen(s) : 0};
  return r;
}

/* Value of header `name` in the attempt's outbound headers, or an empty rw_str. */
static inline rw_str header(const rw_attempt *a, const char *name) {
  for (size_t i = 0; i < a->headers_len; i++) {
    if (str_eq(a->headers[i].name, name)) return a->headers[i].value;
  }
  rw_str none = {NULL, 0};
  return none;
}

static inline rw_engine *engine_with(const char *policy, int manual_clock) {
  rw_engine_options opts = {.seed = 42, .has_seed = true, .manual_clock = manual_clock != 0};
  rw_error *err = NULL;
  rw_engine *e = rw_engine_new_with(policy, policy ? strlen(policy) : 0, &opts, &err);
  if (e == NULL) {
    fprintf(stderr, "engine: %s\n", rw_error_message(err));
    rw_error_free(err);
    exit(2);
  }
  CHECK(err == NULL);
  return e;
}

static inline rw_call *begin(rw_engine *e, const char *route, uint64_t deadline_ms) {
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.route = str_of(route);
  spec.deadline_ms = deadline_ms;
  rw_call *c = NULL;
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_OK);
  CHECK(c != NULL);
  return c;
}

static inline rw_result report_status(rw_call *c, uint16_t status, rw_decision *d) {
  rw_outcome o = RW_OUTCOME_INIT;
  o.status = status;
  return rw_call_report(c, &o, d);
}

/* Prints the summary and returns the exit status. */
static inline int check_summary(void) {
  if (failures) {
    fprintf(stderr, "FAIL: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("ok: %d checks passed\n", checks);
  return 0;
}

#endif
