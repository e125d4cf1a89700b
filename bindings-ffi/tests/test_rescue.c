/*
 * C tests of libretrywise: rescue through the C ABI — attempt timers and the
 * error an expired one means, a silent upstream left for the next candidate,
 * a broken stream continued elsewhere (prefill, instruction, a refused
 * prefill), the end of a relayed stream judged by the gate and a transcript
 * (a cut, a finish, an error event), a call held for its breaker's probe window (wait_ms), a failure
 * beside a running hedge (RW_ACTION_WAIT), Retry-After's added jitter, and
 * where a request goes (the route for its model, how to reach an upstream).
 *
 * Built and run by bindings-ffi/ci.sh like test_loop.c (dynamic, static,
 * valgrind). Exit status 0 when every check passes.
 */
#include "check.h"

/* An outcome with a status, an error kind and a phase. */
static rw_outcome outcome(uint16_t status, int32_t kind, int32_t phase) {
  rw_outcome o = RW_OUTCOME_INIT;
  o.status = status;
  o.error_kind = kind;
  o.phase = phase;
  return o;
}

static void test_timers(void) {
  /* Default timeouts: first byte and first token get half the time left, idle 15 s. */
  rw_engine *e = engine_with(NULL, 1);
  rw_call *c = begin(e, "openai/gpt-4o", 30000);
  rw_attempt a;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.remaining_ms == 30000 && a.total_timeout_ms == 30000);
  CHECK(a.first_byte_timeout_ms == 15000);
  CHECK(a.first_token_timeout_ms == 15000);
  CHECK(a.idle_timeout_ms == 15000);
  CHECK(a.wait_ms == -1);
  /* Given all the time left, the attempt's own timer is the deadline's. */
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_TOTAL, false) == RW_ERROR_KIND_DEADLINE_EXCEEDED);
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_TOTAL, true) == RW_ERROR_KIND_DEADLINE_EXCEEDED);
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_CONNECT, false) == RW_ERROR_KIND_CONNECT_TIMEOUT);
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_FIRST_BYTE, false) == RW_ERROR_KIND_FIRST_BYTE_TIMEOUT);
  /* A stream silent past its first-token timer showed nothing: a first-byte timeout. */
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_FIRST_TOKEN, true) == RW_ERROR_KIND_FIRST_BYTE_TIMEOUT);
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_IDLE, true) == RW_ERROR_KIND_STREAM_IDLE_TIMEOUT);
  /* NULL and unknown timers are not errors of any kind. */
  CHECK(rw_attempt_timer_error(NULL, RW_TIMER_TOTAL, false) == RW_ERROR_KIND_NONE);
  CHECK(rw_attempt_timer_error(&a, 5, false) == RW_ERROR_KIND_NONE);
  CHECK(rw_attempt_timer_error(&a, -1, false) == RW_ERROR_KIND_NONE);
  rw_call_free(c);
  rw_engine_free(e);

  /* An attempt cap below the time left: its expiry is a hang, before or inside the body. */
  e = engine_with("{\"timeouts\": {\"attempt_ms\": 10000}}", 1);
  c = begin(e, "openai/gpt-4o", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.total_timeout_ms == 10000 && a.remaining_ms == 30000);
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_TOTAL, false) == RW_ERROR_KIND_FIRST_BYTE_TIMEOUT);
  CHECK(rw_attempt_timer_error(&a, RW_TIMER_TOTAL, true) == RW_ERROR_KIND_STREAM_IDLE_TIMEOUT);
  rw_call_free(c);
  rw_engine_free(e);
}

static const char *TWO_UPSTREAMS =
    "{\"upstreams\": {\"a\": {}, \"b\": {}}, \"routes\": {\"r\": {\"candidates\": [\"a\", \"b\"]},"
    " \"patient\": {\"candidates\": [\"a\", \"b\"], \"on_silence\": \"retry\"}}}";

static void test_silence_fallback(void) {
  rw_engine *e = engine_with(TWO_UPSTREAMS, 1);
  rw_attempt a;
  rw_decision d;
  /* No first token in time (headers came): the silent upstream is left at once. */
  rw_call *c = begin(e, "r", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "a"));
  rw_outcome o = outcome(200, rw_attempt_timer_error(&a, RW_TIMER_FIRST_TOKEN, true), RW_PHASE_STREAM_OPEN);
  CHECK(o.error_kind == RW_ERROR_KIND_FIRST_BYTE_TIMEOUT);
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_FALLBACK && str_eq(d.upstream, "b"));
  CHECK(d.delay_ms == 0 && d.wait_source == RW_WAIT_SOURCE_NONE);
  CHECK(d.continuation == RW_CONTINUATION_NONE);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 2 && str_eq(a.upstream, "b") && a.fallback);
  rw_call_free(c);

  /* A 503 is not silence: it stays on the upstream. */
  c = begin(e, "r", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(report_status(c, 503, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY && str_eq(d.upstream, "a"));
  rw_call_free(c);

  /* on_silence: retry keeps a silent upstream. */
  c = begin(e, "patient", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  o = outcome(0, RW_ERROR_KIND_FIRST_BYTE_TIMEOUT, RW_PHASE_NONE);
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY && str_eq(d.upstream, "a"));
  rw_call_free(c);
  rw_engine_free(e);
}

static const char *CONTINUE_POLICY =
    "{\"upstreams\": {\"a\": {}, \"b\": {\"capabilities\": [\"assistant_prefill\"]}, \"c\": {}},"
    " \"routes\": {\"r\": {\"candidates\": [\"a\", \"b\"], \"stream_recovery\": \"continue\"},"
    " \"r2\": {\"candidates\": [\"a\", \"c\"], \"stream_recovery\": \"continue\"}}}";

static const char *NO_PREFILL_BODY =
    "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
    "\"message\":\"This model does not support assistant message prefill.\"}}";

static void test_stream_continuation(void) {
  rw_engine *e = engine_with(CONTINUE_POLICY, 1);
  rw_attempt a;
  rw_decision d;
  /* A cut after text only: continued on b, which takes an assistant prefill. */
  rw_call *c = begin(e, "r", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome cut = outcome(200, RW_ERROR_KIND_CONNECTION_RESET, RW_PHASE_STREAM_VISIBLE);
  cut.resumable = true;
  CHECK_RC(rw_call_report(c, &cut, &d), RW_OK);
  CHECK(d.action == RW_ACTION_FALLBACK && str_eq(d.upstream, "b") && d.delay_ms == 0);
  CHECK(d.error_class == RW_ERROR_CLASS_PARTIAL_STREAM && d.reason == RW_REASON_STREAM_VISIBLE_OUTPUT);
  CHECK(d.continuation == RW_CONTINUATION_PREFILL);
  CHECK(strcmp(rw_continuation_name(d.continuation), "prefill") == 0);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 2 && str_eq(a.upstream, "b") && a.fallback);

  /* A continuation code C cannot mean is refused; the attempt stays in flight. */
  rw_outcome bad = RW_OUTCOME_INIT;
  bad.status = 200;
  bad.continuation = 2;
  CHECK_RC(rw_call_report(c, &bad, &d), RW_ERR_INVALID_ARG);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_INVALID_STATE);
  CHECK(d.continuation == RW_CONTINUATION_NONE);

  /* b refuses the prefill: the same upstream again at once, as an instruction. */
  rw_outcome refused = outcome(400, RW_ERROR_KIND_NONE, RW_PHASE_NONE);
  refused.continuation = RW_CONTINUATION_PREFILL;
  refused.body = str_of(NO_PREFILL_BODY);
  CHECK_RC(rw_call_report(c, &refused, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY && str_eq(d.upstream, "b") && d.delay_ms == 0);
  CHECK(d.reason == RW_REASON_PREFILL_REJECTED && strcmp(rw_reason_name(d.reason), "prefill_rejected") == 0);
  CHECK(d.continuation == RW_CONTINUATION_INSTRUCTION);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 3 && str_eq(a.upstream, "b"));
  rw_outcome done = outcome(200, RW_ERROR_KIND_NONE, RW_PHASE_NONE);
  done.continuation = RW_CONTINUATION_INSTRUCTION;
  CHECK_RC(rw_call_report(c, &done, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED && str_eq(d.upstream, "b"));
  CHECK(d.continuation == RW_CONTINUATION_NONE);
  rw_call_free(c);

  /* c does not declare assistant_prefill: an instruction from the start. */
  c = begin(e, "r2", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_call_report(c, &cut, &d), RW_OK);
  CHECK(d.action == RW_ACTION_FALLBACK && str_eq(d.upstream, "c"));
  CHECK(d.continuation == RW_CONTINUATION_INSTRUCTION);
  rw_call_free(c);

  /* A cut after a tool-call delta is not resumable: a clean stop. */
  c = begin(e, "r", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  cut.resumable = false;
  CHECK_RC(rw_call_report(c, &cut, &d), RW_OK);
  CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_STREAM_VISIBLE_OUTPUT);
  CHECK(d.continuation == RW_CONTINUATION_NONE);
  rw_call_free(c);
  rw_engine_free(e);

  CHECK(strcmp(rw_continuation_name(RW_CONTINUATION_INSTRUCTION), "instruction") == 0);
  CHECK(rw_continuation_name(RW_CONTINUATION_NONE) == NULL && rw_continuation_name(2) == NULL);
}

/* Feeds `text` through the gate and the delivered bytes into the transcript. */
static void relay(rw_stream_gate *g, rw_transcript *t, const char *text) {
  const uint8_t *out = NULL;
  size_t out_len = 0;
  CHECK_RC(rw_stream_gate_feed(g, (const uint8_t *)text, strlen(text), &out, &out_len), RW_OK);
  CHECK_RC(rw_transcript_observe(t, out, out_len), RW_OK);
}

static void test_stream_end_outcome(void) {
  const char *role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
  const char *hel = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n";
  const char *stop = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
  rw_engine *e = engine_with(CONTINUE_POLICY, 1);
  rw_attempt a;
  rw_decision d;
  rw_outcome o;

  /* Text shown, then the body ends cleanly with no finish: a cut, resumable, continued on b. */
  rw_stream_gate *g = rw_stream_gate_new(str_of("text/event-stream"));
  rw_transcript *t = rw_transcript_new(RW_API_FAMILY_OPENAI);
  CHECK(g != NULL && t != NULL);
  relay(g, t, role);
  CHECK_RC(rw_stream_gate_end_outcome(g, 200, t, &o), RW_OK);
  CHECK(o.status == 200 && o.error_kind == RW_ERROR_KIND_NONE && o.phase == RW_PHASE_NONE && !o.resumable);
  relay(g, t, hel);
  CHECK(str_eq(rw_transcript_text(t), "Hel") && rw_transcript_resumable(t) && !rw_transcript_finished(t));
  CHECK_RC(rw_stream_gate_end_outcome(g, 200, t, &o), RW_OK);
  CHECK(o.status == 200 && o.error_kind == RW_ERROR_KIND_CONNECTION_RESET);
  CHECK(o.phase == RW_PHASE_STREAM_VISIBLE && o.resumable && o.vendor_code.ptr == NULL);
  CHECK(o.effect == RW_EFFECT_UNSET && o.continuation == RW_CONTINUATION_NONE && o.headers == NULL);
  /* outcome() alone does not read the transcript: the plain status. */
  CHECK_RC(rw_stream_gate_outcome(g, 200, &o), RW_OK);
  CHECK(o.status == 200 && o.error_kind == RW_ERROR_KIND_NONE && !o.resumable);
  rw_call *c = begin(e, "r", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_stream_gate_end_outcome(g, 200, t, &o), RW_OK);
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_FALLBACK && str_eq(d.upstream, "b") && d.continuation == RW_CONTINUATION_PREFILL);
  rw_call_free(c);
  /* With its finish: the plain status, and the call succeeds. */
  relay(g, t, stop);
  CHECK(rw_transcript_finished(t) && !rw_transcript_resumable(t));
  CHECK_RC(rw_stream_gate_end_outcome(g, 200, t, &o), RW_OK);
  CHECK(o.status == 200 && o.error_kind == RW_ERROR_KIND_NONE && o.phase == RW_PHASE_NONE);
  rw_transcript_free(t);
  rw_stream_gate_free(g);

  /* An Anthropic error event before any output: the failure it names, retried as an overload. */
  g = rw_stream_gate_new(str_of("text/event-stream"));
  t = rw_transcript_new(RW_API_FAMILY_ANTHROPIC);
  relay(g, t, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[]}}\n\n");
  relay(g, t, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n");
  CHECK_RC(rw_stream_gate_end_outcome(g, 200, t, &o), RW_OK);
  /* The stream answered 200; an overload event reads as the 529 it means, before any output. */
  CHECK(o.status == 529 && o.error_kind == RW_ERROR_KIND_NONE);
  CHECK(str_eq(o.vendor_code, "overloaded_error") && o.phase == RW_PHASE_STREAM_OPEN);
  c = begin(e, "r", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY && d.error_class == RW_ERROR_CLASS_OVERLOADED && d.reason == RW_REASON_OVERLOADED);
  rw_call_free(c);
  rw_transcript_free(t);
  rw_stream_gate_free(g);

  /* A malformed event after text: skipped by default (the answer ends cut); with the
     policy's streams.malformed_event: error, the engine's gate ends the stream there. */
  const char *bad = "data: {not json\n\n";
  rw_engine *strict = engine_with("{\"streams\": {\"malformed_event\": \"error\"}}", 1);
  for (int i = 0; i < 2; i++) {
    g = i == 0 ? rw_engine_stream_gate(e, str_of("text/event-stream")) : rw_engine_stream_gate(strict, str_of("text/event-stream"));
    t = rw_transcript_new(RW_API_FAMILY_OPENAI);
    CHECK(g != NULL && t != NULL);
    relay(g, t, hel);
    relay(g, t, bad);
    CHECK_RC(rw_stream_gate_end_outcome(g, 200, t, &o), RW_OK);
    if (i == 0) {
      CHECK(o.error_kind == RW_ERROR_KIND_CONNECTION_RESET && o.resumable);
    } else {
      CHECK(o.error_kind == RW_ERROR_KIND_MALFORMED_RESPONSE && str_eq(o.vendor_code, "malformed_event"));
      CHECK(o.phase == RW_PHASE_STREAM_VISIBLE);
    }
    rw_transcript_free(t);
    rw_stream_gate_free(g);
  }
  rw_engine_free(strict);

  /* Bad arguments. */
  CHECK(rw_engine_stream_gate(NULL, str_of("text/event-stream")) == NULL);
  CHECK(rw_transcript_new(RW_API_FAMILY_NONE) == NULL && rw_transcript_new(7) == NULL);
  CHECK_RC(rw_stream_gate_end_outcome(NULL, 200, NULL, &o), RW_ERR_NULL);
  CHECK_RC(rw_stream_gate_outcome(NULL, 200, &o), RW_ERR_NULL);
  CHECK_RC(rw_transcript_observe(NULL, NULL, 0), RW_ERR_NULL);
  CHECK(!rw_transcript_resumable(NULL) && !rw_transcript_finished(NULL) && rw_transcript_text(NULL).ptr == NULL);
  rw_transcript_free(NULL);
  rw_engine_free(e);
}

static void test_breaker_hold(void) {
  rw_engine *e = engine_with("{\"max_attempts\": 1, \"breaker\": {\"min_calls\": 2, \"window_size\": 2,"
                             " \"failure_rate\": 0.5, \"open_ms\": 5000, \"open_jitter\": 0,"
                             " \"hold_jitter_ms\": 0, \"hold_max_ms\": 5000}}",
                             1);
  rw_attempt a;
  rw_decision d;
  for (int i = 0; i < 2; i++) {
    rw_call *c = begin(e, "up", 30000);
    CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
    CHECK_RC(report_status(c, 503, &d), RW_OK);
    CHECK(d.action == RW_ACTION_STOP && d.reason == RW_REASON_MAX_ATTEMPTS);
    rw_call_free(c);
  }
  /* Open for 4 s more, within the deadline and hold_max_ms: not yet, wait 4000 ms. */
  CHECK_RC(rw_engine_advance_clock(e, 1000), RW_OK);
  rw_call *c = begin(e, "up", 30000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_BREAKER_OPEN && a.number == 0);
  CHECK(a.wait_ms == 4000);
  CHECK(str_eq(a.detail, "breaker up admits probes in 4000 ms"));
  /* After the wait the held call is the probe. */
  CHECK_RC(rw_engine_advance_clock(e, 4000), RW_OK);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 1 && str_eq(a.upstream, "up") && a.wait_ms == -1);
  CHECK_RC(report_status(c, 200, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED);
  /* A finished call's stop is a stop. */
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_CALL_FINISHED && a.wait_ms == -1);
  rw_call_free(c);

  /* An open period that does not fit the deadline: a stop at once. */
  for (int i = 0; i < 2; i++) {
    c = begin(e, "other", 30000);
    CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
    CHECK_RC(report_status(c, 503, &d), RW_OK);
    rw_call_free(c);
  }
  c = begin(e, "other", 3000);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_BREAKER_OPEN && a.wait_ms == -1);
  rw_call_free(c);
  rw_engine_free(e);
}

static void test_wait_for_sibling(void) {
  rw_engine *e = engine_with("{\"budget\": {\"enabled\": false}, \"breaker\": {\"enabled\": false},"
                             " \"backoff\": {\"base_ms\": 0, \"cap_ms\": 0}, \"upstreams\": {\"a\": {}},"
                             " \"routes\": {\"solo\": {\"candidates\": [\"a\"], \"fallback\": \"forbidden\","
                             " \"hedge_after_ms\": 100}}}",
                             1);
  rw_call *c = begin(e, "solo", 30000);
  rw_attempt a;
  rw_hedge_plan h;
  rw_decision d;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK_RC(rw_engine_advance_clock(e, 100), RW_OK);
  CHECK_RC(rw_call_next_hedge(c, &h), RW_OK);
  CHECK(h.action == RW_HEDGE_ACTION_START && h.attempt.number == 2 && str_eq(h.attempt.upstream, "a"));
  /* The primary fails while the hedge runs: start nothing, await the hedge. */
  rw_outcome busy = outcome(503, RW_ERROR_KIND_NONE, RW_PHASE_NONE);
  CHECK_RC(rw_call_report_attempt(c, 1, &busy, &d), RW_OK);
  CHECK(d.action == RW_ACTION_WAIT && strcmp(rw_action_name(d.action), "wait") == 0);
  CHECK(d.reason == RW_REASON_SIBLING_IN_FLIGHT && d.delay_ms == 0 && d.attempt == 1);
  CHECK(d.error_class == RW_ERROR_CLASS_TRANSIENT);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_INVALID_STATE);
  /* The hedge's answer decides. */
  rw_outcome ok = outcome(200, RW_ERROR_KIND_NONE, RW_PHASE_NONE);
  CHECK_RC(rw_call_report_attempt(c, 2, &ok, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED && d.attempt == 2 && d.hedge);
  rw_call_free(c);
  rw_engine_free(e);
}

static void test_retry_after_jitter(void) {
  /* By default a hinted wait gets up to 250 ms more, so clients told the same
   * Retry-After do not come back at once. */
  rw_engine *e = engine_with(NULL, 1);
  rw_header h[1] = {{str_of("retry-after"), str_of("2")}};
  rw_call *c = begin(e, "openai/gpt-4o", 30000);
  rw_attempt a;
  rw_decision d;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_outcome o = outcome(429, RW_ERROR_KIND_NONE, RW_PHASE_NONE);
  o.headers = h;
  o.headers_len = 1;
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_RETRY && d.wait_source == RW_WAIT_SOURCE_RETRY_AFTER);
  CHECK(d.retry_after_ms == 2000);
  CHECK(d.delay_ms >= 2000 && d.delay_ms <= 2250);
  rw_call_free(c);
  rw_engine_free(e);
}

static const char *CATALOG =
    "{\"upstreams\": {"
    "\"primary\": {\"provider\": \"openai\", \"model\": \"gpt-4o\", \"base_url\": \"https://api.openai.com/v1\","
    " \"api\": \"openai\", \"api_key_env\": \"OPENAI_API_KEY\"},"
    "\"backup\": {\"provider\": \"anthropic\", \"model\": \"claude\", \"request_model\": \"claude-sonnet-4-5\","
    " \"base_url\": \"https://api.anthropic.com/v1\", \"api\": \"anthropic\", \"api_key_env\": \"ANTHROPIC_API_KEY\","
    " \"capabilities\": [\"assistant_prefill\"]},"
    "\"azure\": {\"model\": \"gpt4o-deploy\", \"api\": \"azure_openai\", \"api_version\": \"2024-10-21\"}},"
    " \"models\": {\"gpt-4o\": \"chat\"}, \"routes\": {\"chat\": {\"candidates\": [\"primary\", \"azure\"]}}}";

static void test_route_and_reach(void) {
  rw_engine *e = engine_with(CATALOG, 1);
  char *route = NULL;
  rw_error *err = NULL;
  /* The models map, then an upstream whose request_model it is. */
  CHECK_RC(rw_engine_route_for_model(e, str_of("gpt-4o"), &route, &err), RW_OK);
  CHECK(route != NULL && strcmp(route, "chat") == 0 && err == NULL);
  rw_string_free(route);
  CHECK_RC(rw_engine_route_for_model(e, str_of("claude-sonnet-4-5"), &route, &err), RW_OK);
  CHECK(route != NULL && strcmp(route, "backup") == 0);
  rw_string_free(route);
  /* A model nothing serves is an error naming it, never a shared key. */
  CHECK_RC(rw_engine_route_for_model(e, str_of("o3"), &route, &err), RW_ERR_POLICY);
  CHECK(route == NULL && err != NULL);
  CHECK(rw_error_result(err) == RW_ERR_POLICY);
  CHECK(strcmp(rw_error_path(err), "models.o3") == 0);
  CHECK(strstr(rw_error_message(err), "\"o3\"") != NULL);
  rw_error_free(err);
  CHECK_RC(rw_engine_route_for_model(e, str_of("gpt-4o"), NULL, NULL), RW_ERR_NULL);
  CHECK_RC(rw_engine_route_for_model(NULL, str_of("gpt-4o"), &route, NULL), RW_ERR_NULL);
  CHECK(route == NULL);
  rw_str not_utf8 = {"\xff", 1};
  CHECK_RC(rw_engine_route_for_model(e, not_utf8, &route, NULL), RW_ERR_INVALID_ARG);

  /* The upstream an attempt names (here the fallback after a silent
   * primary; Azure OpenAI takes an OpenAI body, so one route may hold both):
   * where it is, which family, which model, which key variable. */
  rw_call *c = begin(e, "chat", 30000);
  rw_attempt a;
  rw_decision d;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "primary"));
  rw_outcome silent = outcome(0, RW_ERROR_KIND_FIRST_BYTE_TIMEOUT, RW_PHASE_SENT);
  CHECK_RC(rw_call_report(c, &silent, &d), RW_OK);
  CHECK(d.action == RW_ACTION_FALLBACK && str_eq(d.upstream, "azure"));
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  rw_reach r;
  CHECK_RC(rw_engine_reach(e, a.upstream, &r), RW_OK);
  rw_call_free(c);
  CHECK(strcmp(r.upstream, "azure") == 0);
  CHECK(r.api == RW_API_FAMILY_AZURE_OPENAI && strcmp(rw_api_family_name(r.api), "azure_openai") == 0);
  CHECK(strcmp(r.api_version, "2024-10-21") == 0);
  CHECK(r.base_url == NULL && r.api_key_env == NULL && strcmp(r.model, "gpt4o-deploy") == 0 && !r.prefill);
  rw_reach_free(&r);
  CHECK(r.upstream == NULL && r.base_url == NULL && r.model == NULL && r.api_version == NULL);
  rw_reach_free(&r); /* freed strings are NULL: a second free is a no-op */

  CHECK_RC(rw_engine_reach(e, str_of("primary"), &r), RW_OK);
  CHECK(r.api == RW_API_FAMILY_OPENAI && strcmp(r.model, "gpt-4o") == 0 && !r.prefill);
  CHECK(strcmp(r.api_key_env, "OPENAI_API_KEY") == 0);
  rw_reach_free(&r);
  CHECK_RC(rw_engine_reach(e, str_of("backup"), &r), RW_OK);
  CHECK(strcmp(r.base_url, "https://api.anthropic.com/v1") == 0);
  CHECK(r.api == RW_API_FAMILY_ANTHROPIC && strcmp(rw_api_family_name(r.api), "anthropic") == 0);
  CHECK(strcmp(r.model, "claude-sonnet-4-5") == 0);
  CHECK(strcmp(r.api_key_env, "ANTHROPIC_API_KEY") == 0);
  CHECK(r.api_version == NULL && r.prefill);
  rw_reach_free(&r);
  /* An upstream the catalog does not list goes as the request was built. */
  CHECK_RC(rw_engine_reach(e, str_of("adhoc/model"), &r), RW_OK);
  CHECK(strcmp(r.upstream, "adhoc/model") == 0 && r.base_url == NULL && r.api == RW_API_FAMILY_NONE);
  CHECK(r.model == NULL && r.api_key_env == NULL && r.api_version == NULL && !r.prefill);
  rw_reach_free(&r);
  CHECK_RC(rw_engine_reach(e, str_of("primary"), NULL), RW_ERR_NULL);
  CHECK_RC(rw_engine_reach(NULL, str_of("primary"), &r), RW_ERR_NULL);
  CHECK(r.upstream == NULL && r.api == RW_API_FAMILY_NONE);
  rw_reach_free(NULL);
  CHECK(rw_api_family_name(RW_API_FAMILY_NONE) == NULL);
  CHECK(strcmp(rw_api_family_name(RW_API_FAMILY_AZURE_OPENAI), "azure_openai") == 0);
  rw_engine_free(e);
}

int main(void) {
  printf("libretrywise %s (rescue)\n", rw_version());
  test_timers();
  test_silence_fallback();
  test_stream_continuation();
  test_stream_end_outcome();
  test_breaker_hold();
  test_wait_for_sibling();
  test_retry_after_jitter();
  test_route_and_reach();
  return check_summary();
}
