/*
 * C tests of libretrywise: the decision loop through the C ABI.
 *
 * Built by bindings-ffi/ci.sh with gcc -Wall -Wextra -Werror, linked both
 * dynamically and statically, and run under valgrind --leak-check=full.
 * Exit status 0 when every check passes.
 */
#include "retrywise.h"

#include "check.h"

#include <pthread.h>

/* ---- scenarios ---------------------------------------------------------- */

static void test_success(void) {
  rw_engine *e = rw_engine_new(NULL, 0, NULL); /* default policy */
  CHECK(e != NULL);
  rw_call *c = begin(e, "openai/gpt-4o", 10000);
  rw_attempt a;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 1);
  CHECK(str_eq(a.upstream, "openai/gpt-4o"));
  CHECK(a.request_id.len > 0);
  CHECK(a.total_timeout_ms > 0 && a.total_timeout_ms <= 10000);
  CHECK(a.connect_timeout_ms <= a.total_timeout_ms);
  CHECK(!a.fallback && !a.hedge);
  CHECK(header(&a, "retrywise-attempt").len == 1 && header(&a, "retrywise-attempt").ptr[0] == '1');
  CHECK(header(&a, "retrywise-deadline-ms").len > 0);
  CHECK(header(&a, "retrywise-request-id").len == a.request_id.len);

  rw_decision d;
  CHECK_RC(report_status(c, 200, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED);
  CHECK(d.reason == RW_REASON_SUCCESS);
  CHECK(d.error_class == RW_ERROR_CLASS_NONE);
  CHECK(d.retry_after_ms == -1);
  CHECK(d.attempt == 1);
  CHECK(d.on_failure == RW_ON_FAILURE_NONE);
  CHECK(str_eq(d.upstream, "openai/gpt-4o"));

  /* The call is over: no further attempt. */
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_CALL_FINISHED);
  CHECK(a.number == 0);

  char *json = NULL;
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(json != NULL && strstr(json, "\"policy_version\":\"default\"") != NULL);
  rw_string_free(json);

  rw_call_free(c);
  rw_engine_free(e);
}

/* Attempt strings stay valid until the next rw_call_next_attempt: values that
 * fit the call's inline bytes and a long idempotency key that does not, read
 * after a report; the request id and its header are the same bytes' value. */
static void test_attempt_strings(void) {
  rw_engine *e = engine_with(NULL, 1);
  char key[201];
  memset(key, 'k', 200);
  key[200] = '\0';
  const char *keys[2] = {"order-17", key};
  for (int i = 0; i < 2; i++) {
    rw_call_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.route = str_of("openai/gpt-4o");
    spec.deadline_ms = 5000;
    spec.idempotency = RW_IDEMPOTENCY_KEYED;
    spec.idempotency_key = str_of(keys[i]);
    rw_call *c = NULL;
    CHECK_RC(rw_call_begin(e, &spec, &c), RW_OK);
    rw_attempt a;
    CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
    rw_decision d;
    CHECK_RC(report_status(c, 503, &d), RW_OK);
    CHECK(d.action == RW_ACTION_RETRY);
    CHECK(a.headers_len == 4);
    CHECK(str_eq(header(&a, "retrywise-deadline-ms"), "4950"));
    CHECK(str_eq(header(&a, "retrywise-attempt"), "1"));
    CHECK(str_eq(header(&a, "idempotency-key"), keys[i]));
    rw_str id = header(&a, "retrywise-request-id");
    CHECK(id.len == 23 && a.request_id.len == 23 && memcmp(id.ptr, a.request_id.ptr, 23) == 0);
    char first_id[23];
    memcpy(first_id, a.request_id.ptr, 23);
    CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
    CHECK(a.number == 2);
    CHECK(str_eq(header(&a, "retrywise-attempt"), "2"));
    CHECK(str_eq(header(&a, "idempotency-key"), keys[i]));
    CHECK(a.request_id.len == 23 && memcmp(a.request_id.ptr, first_id, 23) == 0);
    rw_call_free(c);
  }
  rw_engine_free(e);
}

static void test_503_then_success(void) {
  rw_engine *e = engine_with(NULL, 1);
  rw_call *c = begin(e, "openai/gpt-4o", 10000);
  rw_attempt a;
  rw_decision d;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 1);
  CHECK_RC(report_status(c, 503, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY);
  CHECK(d.reason == RW_REASON_RETRYABLE_STATUS);
  CHECK(d.error_class == RW_ERROR_CLASS_TRANSIENT);
  CHECK(d.wait_source == RW_WAIT_SOURCE_JITTER);
  CHECK(d.delay_ms <= 250); /* full jitter, base 250 ms, first retry */
  CHECK(str_eq(d.upstream, "openai/gpt-4o"));
  CHECK(strcmp(rw_reason_name(d.reason), "retryable_status") == 0);
  CHECK(strcmp(rw_action_name(d.action), "retry") == 0);
  CHECK(strcmp(rw_class_name(d.error_class), "transient") == 0);
  uint64_t first_delay = d.delay_ms;

  CHECK_RC(rw_engine_advance_clock(e, d.delay_ms), RW_OK);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 2);
  CHECK(str_eq(header(&a, "retrywise-attempt"), "2"));
  CHECK(a.remaining_ms == 10000 - first_delay);
  CHECK_RC(report_status(c, 200, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED);
  CHECK(d.attempt == 2);
  rw_call_free(c);

  /* Same seed, same clock, same inputs: the same delay (replayable decisions). */
  rw_engine *e2 = engine_with(NULL, 1);
  rw_call *c2 = begin(e2, "openai/gpt-4o", 10000);
  CHECK_RC(rw_call_next_attempt(c2, &a), RW_OK);
  CHECK_RC(report_status(c2, 503, &d), RW_OK);
  CHECK(d.delay_ms == first_delay);
  rw_call_free(c2);
  rw_engine_free(e2);

  char *json = NULL;
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(json != NULL && strstr(json, "\"retries\":1") != NULL);
  rw_string_free(json);
  rw_engine_free(e);
}

static void test_401_stops(void) {
  rw_engine *e = engine_with(NULL, 1);
  rw_call *c = begin(e, "anthropic/claude", 10000);
  rw_attempt a;
  rw_decision d;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(report_status(c, 401, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP);
  CHECK(d.reason == RW_REASON_AUTH_ERROR);
  CHECK(d.error_class == RW_ERROR_CLASS_AUTH_OR_POLICY);
  CHECK(d.on_failure == RW_ON_FAILURE_FAIL);
  CHECK(d.delay_ms == 0);
  CHECK(strcmp(rw_reason_name(d.reason), "auth_error") == 0);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_AUTH_ERROR);
  CHECK(a.stop_class == RW_ERROR_CLASS_AUTH_OR_POLICY);
  rw_call_free(c);
  rw_engine_free(e);
}

/* A body read whole: an error's vendor code, a JSON success that does not parse. */
static void test_outcome_body(void) {
  rw_engine *e = engine_with(NULL, 1);
  rw_attempt a;
  rw_decision d;
  rw_header json[1] = {{str_of("content-type"), str_of("application/json; charset=utf-8")}};
  rw_call *c = begin(e, "openai/gpt-4o", 10000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome o = RW_OUTCOME_INIT;
  o.status = 200;
  o.headers = json;
  o.headers_len = 1;
  o.body = str_of("{\"id\":\"x\",\"choices\":[");
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY && d.reason == RW_REASON_RETRYABLE_ERROR);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  o.body = str_of("{\"id\":\"x\"}");
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED);
  rw_call_free(c);

  c = begin(e, "openai/gpt-4o", 10000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome q = RW_OUTCOME_INIT;
  q.status = 429;
  q.body = str_of("{\"error\":{\"code\":\"insufficient_quota\"}}");
  CHECK_RC(rw_call_report(c, &q, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_QUOTA_EXHAUSTED);
  rw_call_free(c);

  /* Pacing (on by default): the exhausted quota stops the next call before it is sent. */
  c = begin(e, "openai/gpt-4o", 10000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_QUOTA_EXHAUSTED);
  rw_call_free(c);

  c = begin(e, "openai/gpt-4o-mini", 10000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome bad = RW_OUTCOME_INIT;
  bad.status = 200;
  bad.body.len = 3; /* NULL with a length */
  CHECK_RC(rw_call_report(c, &bad, &d), RW_ERR_NULL);
  rw_call_free(c);
  rw_engine_free(e);
}

static void test_retry_after(void) {
  /* No additive jitter on hinted waits (default 250 ms), so a hint is waited exactly. */
  rw_engine *e = engine_with("{\"retry_after\": {\"jitter_ms\": 0}}", 1);
  rw_attempt a;
  rw_decision d;
  rw_header h[1] = {{str_of("Retry-After"), str_of("30")}};

  /* 429 with Retry-After: 30 s and a 5 s deadline: stop now, do not sleep past the deadline. */
  rw_call *c = begin(e, "openai/gpt-4o", 5000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome o = RW_OUTCOME_INIT;
  o.status = 429;
  o.headers = h;
  o.headers_len = 1;
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP);
  CHECK(d.reason == RW_REASON_RETRY_AFTER_EXCEEDS_DEADLINE);
  CHECK(d.error_class == RW_ERROR_CLASS_RATE_LIMIT);
  CHECK(d.retry_after_ms == 30000);
  CHECK(d.detail.ptr != NULL && d.detail.len > 0);
  rw_call_free(c);

  /* Retry-After: 2 s within a 30 s deadline: wait exactly what the server said. */
  h[0].value = str_of("2");
  c = begin(e, "openai/gpt-4o", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY);
  CHECK(d.reason == RW_REASON_RATE_LIMITED);
  CHECK(d.wait_source == RW_WAIT_SOURCE_RETRY_AFTER);
  CHECK(d.delay_ms == 2000);
  CHECK(d.retry_after_ms == 2000);
  rw_call_free(c);

  /* The manual clock runs the deadline out between attempts. */
  c = begin(e, "openai/gpt-4o", 5000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(report_status(c, 503, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY);
  CHECK_RC(rw_engine_advance_clock(e, 4800), RW_OK);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_DEADLINE_EXCEEDED);
  CHECK(a.detail.len > 0);
  rw_call_free(c);
  rw_engine_free(e);
}

static void test_policies(void) {
  rw_error *err = NULL;
  /* JSON with a rule broken: the message names the field. */
  const char *bad = "{\"breaker\": {\"failure_rate\": 1.5}}";
  rw_engine *e = rw_engine_new(bad, strlen(bad), &err);
  CHECK(e == NULL);
  CHECK(err != NULL);
  CHECK(rw_error_result(err) == RW_ERR_POLICY);
  CHECK(strstr(rw_error_message(err), "breaker.failure_rate") != NULL);
  CHECK(strcmp(rw_error_path(err), "breaker.failure_rate") == 0);
  CHECK(rw_error_message_len(err) == strlen(rw_error_message(err)));
  rw_error_free(err);

  /* YAML, unknown field. */
  const char *unknown = "max_attempts: 2\nbreaker:\n  failure_ratio: 0.5\n";
  err = NULL;
  CHECK(rw_engine_new(unknown, strlen(unknown), &err) == NULL);
  CHECK(rw_error_result(err) == RW_ERR_POLICY);
  CHECK(strstr(rw_error_message(err), "failure_ratio") != NULL);
  rw_error_free(err);

  /* Errors are optional to receive. */
  CHECK(rw_engine_new(bad, strlen(bad), NULL) == NULL);

  /* Not UTF-8. */
  const char bytes[] = {'{', (char)0xff, '}'};
  err = NULL;
  CHECK(rw_engine_new(bytes, sizeof bytes, &err) == NULL);
  CHECK(rw_error_result(err) == RW_ERR_INVALID_ARG);
  rw_error_free(err);

  /* TOML and YAML documents that validate; max_attempts = 2 is enforced. */
  const char *toml = "version = \"toml-1\"\nmax_attempts = 2\n[breaker]\nfailure_rate = 0.4\n";
  e = rw_engine_new(toml, strlen(toml), &err);
  CHECK(e != NULL && err == NULL);
  rw_call *c = begin(e, "u", 10000);
  rw_attempt a;
  rw_decision d;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(report_status(c, 503, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(report_status(c, 503, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP);
  CHECK(d.reason == RW_REASON_MAX_ATTEMPTS);
  rw_call_free(c);

  /* Reload: a bad policy leaves the old one in force; a good one replaces it. */
  err = NULL;
  CHECK_RC(rw_engine_reload(e, bad, strlen(bad), &err), RW_ERR_POLICY);
  CHECK(err != NULL && strcmp(rw_error_path(err), "breaker.failure_rate") == 0);
  rw_error_free(err);
  char *json = NULL;
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(strstr(json, "\"policy_version\":\"toml-1\"") != NULL);
  rw_string_free(json);
  const char *yaml = "version: yaml-2\nmax_attempts: 1\n";
  err = NULL;
  CHECK_RC(rw_engine_reload(e, yaml, strlen(yaml), &err), RW_OK);
  CHECK(err == NULL);
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(strstr(json, "\"policy_version\":\"yaml-2\"") != NULL);
  rw_string_free(json);

  /* Kill switch: retries off -> a retryable failure stops. */
  CHECK_RC(rw_engine_reload(e, NULL, 0, NULL), RW_OK);
  CHECK_RC(rw_engine_set_mode(e, false, false, false), RW_OK);
  c = begin(e, "u", 10000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(report_status(c, 503, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP);
  CHECK(d.reason == RW_REASON_RETRIES_DISABLED);
  rw_call_free(c);
  CHECK_RC(rw_engine_set_mode(e, true, true, true), RW_OK);

  /* No manual clock on this engine. */
  CHECK_RC(rw_engine_advance_clock(e, 1), RW_ERR_INVALID_STATE);
  rw_engine_free(e);
}

static void test_null_and_invalid_args(void) {
  rw_engine *e = engine_with(NULL, 1);
  rw_call *c = NULL;
  rw_attempt a;
  rw_decision d;
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.route = str_of("u");
  char *json = (char *)&spec; /* must be reset to NULL */

  CHECK_RC(rw_call_begin(NULL, &spec, &c), RW_ERR_NULL);
  CHECK(c == NULL);
  CHECK_RC(rw_call_begin(e, NULL, &c), RW_ERR_NULL);
  CHECK_RC(rw_call_begin(e, &spec, NULL), RW_ERR_NULL);
  CHECK_RC(rw_call_next_attempt(NULL, &a), RW_ERR_NULL);
  CHECK(a.stop_reason == RW_REASON_INVALID_STATE);
  CHECK_RC(rw_call_report(NULL, NULL, &d), RW_ERR_NULL);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_INVALID_STATE);
  CHECK_RC(rw_call_report(NULL, NULL, NULL), RW_ERR_NULL);
  CHECK_RC(rw_call_cancel(NULL, NULL), RW_ERR_NULL);
  rw_hedge_plan hp;
  memset(&hp, 0, sizeof hp);
  CHECK_RC(rw_call_next_hedge(NULL, &hp), RW_ERR_NULL);
  CHECK(hp.action == RW_HEDGE_ACTION_NO && hp.reason == RW_REASON_INVALID_STATE && hp.attempt.detail.len > 0);
  CHECK_RC(rw_call_next_hedge(NULL, NULL), RW_ERR_NULL);
  rw_outcome o0 = RW_OUTCOME_INIT;
  CHECK_RC(rw_call_report_attempt(NULL, 1, &o0, &d), RW_ERR_NULL);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_INVALID_STATE);
  CHECK_RC(rw_call_report_attempt(NULL, 1, NULL, NULL), RW_ERR_NULL);
  CHECK(rw_hedge_action_name(-1) == NULL && rw_hedge_action_name(3) == NULL);
  CHECK_RC(rw_engine_stats_json(NULL, &json), RW_ERR_NULL);
  CHECK(json == NULL);
  CHECK_RC(rw_engine_stats_json(e, NULL), RW_ERR_NULL);
  CHECK_RC(rw_engine_reload(NULL, NULL, 0, NULL), RW_ERR_NULL);
  CHECK_RC(rw_engine_set_mode(NULL, true, true, true), RW_ERR_NULL);
  CHECK_RC(rw_engine_advance_clock(NULL, 1), RW_ERR_NULL);
  CHECK(rw_error_result(NULL) == RW_ERR_NULL);
  CHECK(strcmp(rw_error_message(NULL), "") == 0);
  CHECK(rw_error_message_len(NULL) == 0);
  CHECK(strcmp(rw_error_path(NULL), "") == 0);
  rw_error *err = NULL;
  CHECK(rw_engine_new(NULL, 5, &err) == NULL);
  CHECK(rw_error_result(err) == RW_ERR_NULL);
  rw_error_free(err);
  /* Frees accept NULL. */
  rw_call_free(NULL);
  rw_engine_free(NULL);
  rw_error_free(NULL);
  rw_string_free(NULL);
  /* Names of unknown codes are NULL. */
  CHECK(rw_reason_name(-5) == NULL && rw_reason_name(RW_REASON_PREFILL_REJECTED + 1) == NULL);
  CHECK(rw_action_name(99) == NULL);
  CHECK(strcmp(rw_class_name(RW_ERROR_CLASS_NONE), "none") == 0);
  CHECK(strcmp(rw_result_name(RW_ERR_PANIC), "RW_ERR_PANIC") == 0);
  CHECK(strcmp(rw_wait_source_name(RW_WAIT_SOURCE_JITTER), "jitter") == 0);

  /* Strings: NULL with a length, not UTF-8, bad enum values. */
  spec.tenant.ptr = NULL;
  spec.tenant.len = 3;
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_ERR_NULL);
  spec.tenant = str_of("\xc3\x28");
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_ERR_INVALID_ARG);
  spec.tenant = str_of("acme");
  spec.idempotency = 7;
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_ERR_INVALID_ARG);
  spec.idempotency = RW_IDEMPOTENCY_KEYED;
  rw_header bad_inbound[1] = {{str_of("retrywise-deadline-ms"), str_of("soon")}};
  spec.inbound_headers = bad_inbound;
  spec.inbound_headers_len = 1;
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_ERR_INBOUND);
  spec.inbound_headers_len = 0;
  spec.inbound_headers = NULL;
  spec.idempotency_key = str_of("order-17");
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_OK);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(header(&a, "idempotency-key"), "order-17"));

  rw_outcome o = RW_OUTCOME_INIT;
  o.status = 503;
  CHECK_RC(rw_call_report(c, NULL, &d), RW_ERR_NULL);
  CHECK_RC(rw_call_report(c, &o, NULL), RW_ERR_NULL);
  o.error_kind = 12;
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_INVALID_ARG);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_INVALID_STATE && d.detail.len > 0);
  o.error_kind = RW_ERROR_KIND_NONE;
  o.phase = -2;
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_INVALID_ARG);
  o.phase = RW_PHASE_NONE;
  o.effect = 4;
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_INVALID_ARG);
  o.effect = RW_EFFECT_UNSET;
  o.vendor_code.ptr = NULL;
  o.vendor_code.len = 1;
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_NULL);
  o.vendor_code = str_of("\xff");
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_INVALID_ARG);
  o.vendor_code.ptr = NULL;
  o.vendor_code.len = 0;
  o.headers = NULL;
  o.headers_len = 2;
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_NULL);
  o.headers_len = 0;
  CHECK_RC(rw_call_report_attempt(c, 1, NULL, &d), RW_ERR_NULL);
  CHECK_RC(rw_call_report_attempt(c, 1, &o, NULL), RW_ERR_NULL);
  o.effect = 9;
  CHECK_RC(rw_call_report_attempt(c, 1, &o, &d), RW_ERR_INVALID_ARG);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_INVALID_STATE && d.detail.len > 0);
  o.effect = RW_EFFECT_UNSET;
  CHECK_RC(rw_call_next_hedge(c, NULL), RW_ERR_NULL);
  /* The attempt is still in flight after rejected reports: report it properly. */
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY);
  CHECK(d.attempt == 1);

  /* Machine error with an explicit phase: a connect failure is retried. */
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome conn = RW_OUTCOME_INIT;
  conn.error_kind = RW_ERROR_KIND_CONNECT;
  conn.phase = RW_PHASE_BEFORE_SEND;
  CHECK_RC(rw_call_report(c, &conn, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY && d.reason == RW_REASON_RETRYABLE_ERROR);

  /* Cancel ends the call. */
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_call_cancel(c, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_CANCELLED);
  rw_call_free(c);
  rw_engine_free(e);
}

static void test_panic_boundary(void) {
  const char *policy = "testing:\n  panic_on_vendor_code: boom\n";
  rw_engine *e = engine_with(policy, 1);
  rw_call *c = begin(e, "openai/gpt-4o", 10000);
  rw_attempt a;
  rw_decision d;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome o = RW_OUTCOME_INIT;
  o.status = 500;
  o.vendor_code = str_of("boom");
  fprintf(stderr, "(a panic message from the test hook is expected next)\n");
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_PANIC);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_INVALID_STATE);
  /* The call is poisoned; using it again is a clean error, not UB. */
  CHECK_RC(rw_call_next_attempt(c, &a), RW_ERR_PANIC);
  CHECK_RC(rw_call_report(c, &o, &d), RW_ERR_PANIC);
  rw_call_free(c);

  /* The engine stays usable: new calls run the loop to success. */
  for (int i = 0; i < 3; i++) {
    c = begin(e, "openai/gpt-4o", 10000);
    CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
    CHECK_RC(report_status(c, 503, &d), RW_OK);
    CHECK(d.action == RW_ACTION_RETRY);
    CHECK_RC(rw_engine_advance_clock(e, d.delay_ms), RW_OK);
    CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
    CHECK_RC(report_status(c, 200, &d), RW_OK);
    CHECK(d.action == RW_ACTION_SUCCEEDED);
    rw_call_free(c);
  }
  char *json = NULL;
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(json != NULL);
  rw_string_free(json);
  rw_engine_free(e);
}

/* Hedging: next_hedge says after / start / no, each attempt is reported by
 * number, the first answer decides, and the primary's strings stay valid
 * after a hedge was started. */
static const char *HEDGE_POLICY =
    "{\"budget\": {\"enabled\": false}, \"upstreams\": {\"a\": {}, \"b\": {}},"
    " \"routes\": {\"r\": {\"candidates\": [\"a\", \"b\"], \"hedge_after_ms\": 200}}}";

static void test_hedging(void) {
  rw_engine *e = engine_with(HEDGE_POLICY, 1);
  rw_call *c = begin(e, "r", 10000);
  rw_attempt a;
  rw_hedge_plan h;
  rw_decision d;

  /* Nothing in flight yet: no hedge. */
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_NO && h.reason == RW_REASON_HEDGE_NOT_ALLOWED);
  CHECK(h.attempt.stop_reason == RW_REASON_HEDGE_NOT_ALLOWED && h.attempt.number == 0);
  CHECK(strcmp(rw_hedge_action_name(h.action), "no") == 0);

  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 1 && str_eq(a.upstream, "a") && !a.hedge);
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_AFTER && h.after_ms == 200 && h.reason == RW_REASON_SUCCESS);
  CHECK_RC(rw_engine_advance_clock(e, 150), RW_OK);
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_AFTER && h.after_ms == 50);
  CHECK_RC(rw_engine_advance_clock(e, 50), RW_OK);
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_START && strcmp(rw_hedge_action_name(h.action), "start") == 0);
  CHECK(h.attempt.number == 2 && h.attempt.hedge && h.attempt.fallback);
  CHECK(str_eq(h.attempt.upstream, "b"));
  CHECK(str_eq(header(&h.attempt, "retrywise-attempt"), "2"));
  CHECK(h.attempt.remaining_ms == 9800);
  /* The primary's strings were not overwritten by the hedge. */
  CHECK(str_eq(a.upstream, "a") && str_eq(header(&a, "retrywise-attempt"), "1"));
  CHECK(a.request_id.len == h.attempt.request_id.len &&
        memcmp(a.request_id.ptr, h.attempt.request_id.ptr, a.request_id.len) == 0);

  /* Two in flight: no further hedge, no plain attempt. */
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_NO && h.reason == RW_REASON_HEDGE_NOT_ALLOWED);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_INVALID_STATE);

  rw_outcome ok = RW_OUTCOME_INIT;
  ok.status = 200;
  rw_outcome busy = RW_OUTCOME_INIT;
  busy.status = 503;
  /* An attempt number that is not in flight changes nothing. */
  CHECK_RC(rw_call_report_attempt(c, 9, &ok, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_INVALID_STATE && d.attempt == 9);
  CHECK(str_eq(d.detail, "attempt 9 is not in flight"));
  /* The hedge answers first and wins; the primary's late failure gets that final decision. */
  CHECK_RC(rw_call_report_attempt(c, 2, &ok, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED && d.attempt == 2 && d.hedge && str_eq(d.upstream, "b"));
  CHECK_RC(rw_call_report_attempt(c, 1, &busy, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED && d.attempt == 2 && d.hedge);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_CALL_FINISHED);
  rw_call_free(c);

  /* Cancel with a primary and a hedge in flight: both reported, one cancelled stop. */
  c = begin(e, "r", 10000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_engine_advance_clock(e, 200), RW_OK);
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_START && h.attempt.number == 2);
  CHECK_RC(rw_call_cancel(c, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_CANCELLED && d.error_class == RW_ERROR_CLASS_CANCELLED);
  CHECK(d.attempt == 1 && !d.hedge);
  CHECK_RC(rw_call_report_attempt(c, 2, &ok, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_CANCELLED);
  rw_call_free(c);

  /* A hedge that is never reported: freeing the call gives its budget and gates back. */
  c = begin(e, "r", 10000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_engine_advance_clock(e, 200), RW_OK);
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_START);
  rw_call_free(c);

  /* An unsafe call never hedges. */
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.route = str_of("r");
  spec.idempotency = RW_IDEMPOTENCY_UNSAFE;
  c = NULL;
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_OK);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_engine_advance_clock(e, 500), RW_OK);
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_NO && h.reason == RW_REASON_HEDGE_NOT_ALLOWED);
  rw_call_free(c);

  char *json = NULL;
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(json != NULL && strstr(json, "\"hedges\":3") != NULL);
  rw_string_free(json);
  rw_engine_free(e);
}

/* An engine shared by several threads, each running its own calls. */
#define THREADS 4
#define CALLS_PER_THREAD 200

static void *worker(void *arg) {
  rw_engine *e = (rw_engine *)arg;
  long ok = 0;
  for (int i = 0; i < CALLS_PER_THREAD; i++) {
    rw_call_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.route = str_of("shared/upstream");
    spec.tenant = str_of("t");
    rw_call *c = NULL;
    if (rw_call_begin(e, &spec, &c) != RW_OK) continue;
    rw_attempt a;
    rw_decision d;
    while (rw_call_next_attempt(c, &a) == RW_OK) {
      rw_outcome o = RW_OUTCOME_INIT;
      o.status = (i % 10 == 0 && a.number == 1) ? 503 : 200;
      if (rw_call_report(c, &o, &d) != RW_OK) break;
      if (d.action == RW_ACTION_SUCCEEDED) {
        ok++;
        break;
      }
      if (d.action != RW_ACTION_RETRY) break;
    }
    rw_call_free(c);
  }
  return (void *)ok;
}

static void test_threads(void) {
  rw_engine *e = engine_with(NULL, 1);
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, e) == 0);
  long total = 0;
  for (int i = 0; i < THREADS; i++) {
    void *r = NULL;
    CHECK(pthread_join(t[i], &r) == 0);
    total += (long)r;
  }
  CHECK(total == (long)THREADS * CALLS_PER_THREAD);
  char *json = NULL;
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(json != NULL && strstr(json, "\"logical_requests\":800") != NULL);
  rw_string_free(json);
  rw_engine_free(e);
}

/* An event stream's preamble is held until its first meaningful event; the
   phase to report follows what was released; other bodies pass through. */
static void test_stream_gate(void) {
  const char *role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
  const char *text = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
  const uint8_t *out = NULL;
  size_t out_len = 99;
  rw_stream_gate *g = rw_stream_gate_new(str_of("text/event-stream; charset=utf-8"));
  CHECK(g != NULL);
  CHECK(rw_stream_gate_phase(g) == RW_PHASE_STREAM_OPEN);
  CHECK_RC(rw_stream_gate_feed(g, (const uint8_t *)role, strlen(role), &out, &out_len), RW_OK);
  CHECK(out == NULL && out_len == 0);
  CHECK(rw_stream_gate_phase(g) == RW_PHASE_STREAM_OPEN);
  /* Split mid-event: nothing until the event's blank line arrives. */
  CHECK_RC(rw_stream_gate_feed(g, (const uint8_t *)text, 10, &out, &out_len), RW_OK);
  CHECK(out_len == 0);
  CHECK_RC(rw_stream_gate_feed(g, (const uint8_t *)text + 10, strlen(text) - 10, &out, &out_len), RW_OK);
  CHECK(out_len == strlen(role) + strlen(text));
  CHECK(out != NULL && memcmp(out, role, strlen(role)) == 0 && memcmp(out + strlen(role), text, strlen(text)) == 0);
  CHECK(rw_stream_gate_phase(g) == RW_PHASE_STREAM_VISIBLE);
  /* Once visible, the caller's own bytes come back. */
  const char *done = "data: [DONE]\n\n";
  CHECK_RC(rw_stream_gate_feed(g, (const uint8_t *)done, strlen(done), &out, &out_len), RW_OK);
  CHECK(out == (const uint8_t *)done && out_len == strlen(done));
  CHECK_RC(rw_stream_gate_finish(g, &out, &out_len), RW_OK);
  CHECK(out == NULL && out_len == 0);
  rw_stream_gate_free(g);

  /* A body that ends holding delivers what it held. */
  g = rw_stream_gate_new(str_of("text/event-stream"));
  CHECK_RC(rw_stream_gate_feed(g, (const uint8_t *)role, strlen(role), &out, &out_len), RW_OK);
  CHECK_RC(rw_stream_gate_finish(g, &out, &out_len), RW_OK);
  CHECK(out_len == strlen(role) && memcmp(out, role, out_len) == 0);
  /* NULL arguments. */
  CHECK_RC(rw_stream_gate_feed(g, NULL, 3, &out, &out_len), RW_ERR_NULL);
  CHECK_RC(rw_stream_gate_feed(g, NULL, 0, NULL, &out_len), RW_ERR_NULL);
  CHECK_RC(rw_stream_gate_feed(NULL, NULL, 0, &out, &out_len), RW_ERR_NULL);
  CHECK_RC(rw_stream_gate_finish(NULL, &out, &out_len), RW_ERR_NULL);
  CHECK(rw_stream_gate_phase(NULL) == RW_PHASE_NONE);
  rw_stream_gate_free(g);
  rw_stream_gate_free(NULL);

  /* Not an event stream (or no content type): passes through. */
  rw_str none = {NULL, 0};
  g = rw_stream_gate_new(none);
  CHECK(rw_stream_gate_phase(g) == RW_PHASE_STREAM_OPEN); /* nothing delivered yet */
  CHECK_RC(rw_stream_gate_feed(g, (const uint8_t *)role, strlen(role), &out, &out_len), RW_OK);
  CHECK(out == (const uint8_t *)role && out_len == strlen(role));
  CHECK(rw_stream_gate_phase(g) == RW_PHASE_STREAM_VISIBLE);
  rw_stream_gate_free(g);
  rw_str bad = {NULL, 4};
  CHECK(rw_stream_gate_new(bad) == NULL);
  rw_str not_utf8 = {"\xff\xfe", 2};
  CHECK(rw_stream_gate_new(not_utf8) == NULL);
}

int main(void) {
  printf("libretrywise %s\n", rw_version());
  test_success();
  test_attempt_strings();
  test_503_then_success();
  test_401_stops();
  test_retry_after();
  test_outcome_body();
  test_policies();
  test_null_and_invalid_args();
  test_panic_boundary();
  test_hedging();
  test_threads();
  test_stream_gate();
  return check_summary();
}
