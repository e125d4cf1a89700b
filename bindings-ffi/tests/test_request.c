/*
 * C tests of libretrywise: the request a relay forwards (rw_request_read and
 * its accessors), a call begun with it (rw_call_spec.request: a fallback
 * keeps what the request needs), a route the policy does not know
 * (RW_ERR_POLICY, rw_call_begin_err), an outcome's first_token_ms (the
 * learned first-token limit and the stats JSON's "first_token"), and NULL
 * arguments. Built and run by ci.sh, dynamically and statically, and under
 * valgrind.
 */
#include "check.h"

static const char *CHAT_URL = "https://api.openai.com/v1/chat/completions";
static const char *MESSAGES_URL = "https://api.anthropic.com/v1/messages";

/* An OpenAI chat request with a tool and an image, streamed. */
static const char *TOOLS_AND_IMAGE =
    "{\"model\":\"gpt-4o\",\"stream\":true,\"max_tokens\":300,"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What city is this?\"},"
    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,iVBORw0KGgo=\"}}]}]}";

static const char *TOOLS_ONLY =
    "{\"model\":\"gpt-4o\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
    "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

static const char *PLAIN_STREAM = "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

static const char *ANTHROPIC_BODY =
    "{\"model\":\"claude-sonnet\",\"max_tokens\":1024,\"system\":\"You are terse.\","
    "\"tools\":[{\"name\":\"lookup\",\"input_schema\":{\"type\":\"object\"}}],"
    "\"messages\":[{\"role\":\"user\",\"content\":\"Say hi\"}]}";

/* Reads a request; the test fails (and NULL is returned) when it does not read. */
static rw_request *read_request(const char *url, const rw_header *headers, size_t n, const char *body) {
  rw_request *req = NULL;
  CHECK_RC(rw_request_read(str_of(url), headers, n, (const uint8_t *)body, body ? strlen(body) : 0, &req), RW_OK);
  CHECK(req != NULL);
  return req;
}

/* The request's capabilities joined with commas, into buf. */
static const char *caps_of(const rw_request *req, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < rw_request_capability_count(req); i++) {
    rw_str c = rw_request_capability(req, i);
    used += (size_t)snprintf(buf + used, cap - used, "%s%.*s", i ? "," : "", (int)c.len, c.ptr);
    if (used >= cap) break;
  }
  return buf;
}

static void test_read_openai_chat(void) {
  char caps[256];
  rw_request *req = read_request(CHAT_URL, NULL, 0, TOOLS_AND_IMAGE);
  CHECK(rw_request_family(req) == RW_API_FAMILY_OPENAI);
  CHECK(rw_request_endpoint(req) != NULL && strcmp(rw_request_endpoint(req), "chat_completions") == 0);
  CHECK(str_eq(rw_request_model(req), "gpt-4o"));
  CHECK(strcmp(caps_of(req, caps, sizeof caps), "streaming,tool_calling,vision") == 0);
  CHECK(rw_request_capability_count(req) == 3);
  CHECK(str_eq(rw_request_capability(req, 1), "tool_calling"));
  /* Out of range: a NULL view. */
  rw_str none = rw_request_capability(req, 3);
  CHECK(none.ptr == NULL && none.len == 0);
  CHECK(rw_request_max_output_tokens(req) == 300);
  /* Counted low: every string outside the image part, over 4 characters a token. */
  CHECK(rw_request_input_tokens(req) > 0 && rw_request_input_tokens(req) < 40);
  rw_request_free(req);
}

static void test_read_anthropic(void) {
  char caps[256];
  rw_request *req = read_request(MESSAGES_URL, NULL, 0, ANTHROPIC_BODY);
  CHECK(rw_request_family(req) == RW_API_FAMILY_ANTHROPIC);
  CHECK(strcmp(rw_api_family_name(rw_request_family(req)), "anthropic") == 0);
  CHECK(strcmp(rw_request_endpoint(req), "messages") == 0);
  CHECK(str_eq(rw_request_model(req), "claude-sonnet"));
  CHECK(strcmp(caps_of(req, caps, sizeof caps), "tool_calling") == 0);
  CHECK(rw_request_max_output_tokens(req) == 1024);
  rw_request_free(req);

  /* A local gateway URL: the anthropic-version header names the family. */
  rw_header h[] = {{RW_LIT("Anthropic-Version"), RW_LIT("2023-06-01")}, {RW_LIT("content-type"), RW_LIT("application/json")}};
  req = read_request("http://127.0.0.1:8080/v1/chat/completions", h, 2, "{\"model\":\"m\",\"messages\":[]}");
  CHECK(rw_request_family(req) == RW_API_FAMILY_ANTHROPIC);
  CHECK(strcmp(rw_request_endpoint(req), "chat_completions") == 0);
  rw_request_free(req);

  /* Azure: the deployment path; the body names no model. */
  req = read_request("https://res.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21", NULL, 0,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"abcdefghijkl\"}]}");
  CHECK(rw_request_family(req) == RW_API_FAMILY_AZURE_OPENAI);
  CHECK(rw_request_model(req).ptr == NULL);
  CHECK(rw_request_input_tokens(req) == 4); /* "user" + 12 characters = 16 */
  CHECK(rw_request_max_output_tokens(req) == -1);
  rw_request_free(req);
}

static void test_read_not_json(void) {
  const char *bodies[] = {"", "not json at all", "[1,2]", "{\"model\": "};
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    rw_request *req = read_request(CHAT_URL, NULL, 0, bodies[i]);
    CHECK(rw_request_family(req) == RW_API_FAMILY_OPENAI);
    CHECK(rw_request_model(req).ptr == NULL);
    CHECK(rw_request_capability_count(req) == 0);
    CHECK(rw_request_input_tokens(req) == -1 && rw_request_max_output_tokens(req) == -1);
    rw_request_free(req);
  }
  /* Bytes that are not UTF-8 are a body like any other; no body at all too. */
  rw_request *req = NULL;
  const uint8_t binary[] = {0x00, 0xff, 0xfe, '{'};
  CHECK_RC(rw_request_read(str_of(CHAT_URL), NULL, 0, binary, sizeof binary, &req), RW_OK);
  CHECK(req != NULL && rw_request_capability_count(req) == 0);
  rw_request_free(req);
  CHECK_RC(rw_request_read(str_of(CHAT_URL), NULL, 0, NULL, 0, &req), RW_OK);
  CHECK(req != NULL && rw_request_model(req).ptr == NULL);
  rw_request_free(req);
  /* A URL that names no endpoint. */
  req = read_request("https://api.openai.com/v1/models", NULL, 0, "{}");
  CHECK(rw_request_endpoint(req) == NULL);
  rw_request_free(req);
}

static void test_read_null_arguments(void) {
  rw_request *req = (rw_request *)&req; /* not NULL: every failure writes NULL */
  const char *body = "{}";
  CHECK_RC(rw_request_read(str_of(CHAT_URL), NULL, 0, (const uint8_t *)body, 2, NULL), RW_ERR_NULL);
  CHECK_RC(rw_request_read(str_of(CHAT_URL), NULL, 1, (const uint8_t *)body, 2, &req), RW_ERR_NULL);
  CHECK(req == NULL);
  req = (rw_request *)&req;
  CHECK_RC(rw_request_read(str_of(CHAT_URL), NULL, 0, NULL, 2, &req), RW_ERR_NULL);
  CHECK(req == NULL);
  rw_str null_url = {NULL, 5};
  CHECK_RC(rw_request_read(null_url, NULL, 0, (const uint8_t *)body, 2, &req), RW_ERR_NULL);
  rw_header null_name[] = {{{NULL, 3}, RW_LIT("x")}};
  CHECK_RC(rw_request_read(str_of(CHAT_URL), null_name, 1, (const uint8_t *)body, 2, &req), RW_ERR_NULL);
  rw_str not_utf8 = {"\xff", 1};
  req = (rw_request *)&req;
  CHECK_RC(rw_request_read(not_utf8, NULL, 0, (const uint8_t *)body, 2, &req), RW_ERR_INVALID_ARG);
  CHECK(req == NULL);
  /* An absent URL: the family from the headers alone. */
  CHECK_RC(rw_request_read((rw_str){NULL, 0}, NULL, 0, (const uint8_t *)body, 2, &req), RW_OK);
  CHECK(req != NULL && rw_request_family(req) == RW_API_FAMILY_OPENAI && rw_request_endpoint(req) == NULL);
  rw_request_free(req);

  CHECK(rw_request_family(NULL) == RW_API_FAMILY_NONE);
  CHECK(rw_request_endpoint(NULL) == NULL);
  CHECK(rw_request_model(NULL).ptr == NULL && rw_request_model(NULL).len == 0);
  CHECK(rw_request_capability_count(NULL) == 0);
  CHECK(rw_request_capability(NULL, 0).ptr == NULL);
  CHECK(rw_request_input_tokens(NULL) == -1);
  CHECK(rw_request_max_output_tokens(NULL) == -1);
  rw_request_free(NULL);
}

/* mini streams only; gpt has tools and images; compat declares no capabilities
 * (unknown: never held against a request); claude speaks Anthropic. */
static const char *CATALOG =
    "max_attempts: 3\n"
    "backoff: {base_ms: 0, cap_ms: 0}\n"
    "upstreams:\n"
    "  mini: {api: openai, capabilities: [streaming], context_tokens: 1000}\n"
    "  gpt: {api: openai, capabilities: [streaming, tool_calling, json_schema, vision], context_tokens: 128000}\n"
    "  compat: {api: openai}\n"
    "  claude: {api: anthropic, capabilities: [streaming, tool_calling, vision]}\n"
    "routes:\n"
    "  chat: {candidates: [mini, gpt, compat], attempts_per_upstream: 1}\n"
    "  claude: {candidates: [claude]}\n";

/* Begins a call on `route` carrying `req` (and `caps` on top); NULL on failure. */
static rw_call *begin_with(rw_engine *e, const char *route, const rw_request *req, const rw_str *caps, size_t ncaps) {
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.route = str_of(route);
  spec.deadline_ms = 30000;
  spec.request = req;
  spec.capabilities = caps;
  spec.capabilities_len = ncaps;
  rw_call *c = NULL;
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_OK);
  CHECK(c != NULL);
  return c;
}

/* The value `excluded` gives for `upstream`, or an empty rw_str. */
static rw_str excluded(const rw_decision *d, const char *upstream) {
  for (size_t i = 0; i < d->excluded_len; i++)
    if (str_eq(d->excluded[i].name, upstream)) return d->excluded[i].value;
  return (rw_str){NULL, 0};
}

static void test_routed_call_keeps_the_request_needs(void) {
  rw_engine *e = engine_with(CATALOG, 1);
  rw_attempt a;
  rw_decision d;

  /* Tools: mini (no tool_calling) is skipped, gpt takes the request; its 503
   * falls back to compat, never to mini. The request is freed at once: the
   * call copied its needs. */
  rw_request *req = read_request(CHAT_URL, NULL, 0, TOOLS_ONLY);
  rw_call *c = begin_with(e, "chat", req, NULL, 0);
  rw_request_free(req);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 1 && str_eq(a.upstream, "gpt") && !a.fallback);
  CHECK_RC(report_status(c, 503, &d), RW_OK);
  CHECK(d.action == RW_ACTION_FALLBACK && str_eq(d.upstream, "compat"));
  CHECK(str_eq(excluded(&d, "mini"), "missing_capability:tool_calling"));
  CHECK(str_eq(excluded(&d, "gpt"), "already_tried"));
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(a.number == 2 && str_eq(a.upstream, "compat") && a.fallback);
  CHECK_RC(report_status(c, 200, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED);
  rw_call_free(c);

  /* A plain stream starts on mini. */
  req = read_request(CHAT_URL, NULL, 0, PLAIN_STREAM);
  c = begin_with(e, "chat", req, NULL, 0);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "mini"));
  rw_call_free(c);

  /* The caller's vision need is added to the request's (streaming). */
  rw_str vision[] = {RW_LIT("vision")};
  c = begin_with(e, "chat", req, vision, 1);
  rw_request_free(req);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "gpt"));
  rw_call_free(c);

  /* The same request with an image, the upstreams' window too small for the
   * spec's own input_tokens: compat (unknown) alone remains. */
  req = read_request(CHAT_URL, NULL, 0, TOOLS_AND_IMAGE);
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.route = str_of("chat");
  spec.request = req;
  spec.input_tokens = 500000; /* the spec's own count wins over the estimate */
  c = NULL;
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_OK);
  rw_request_free(req);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "compat"));
  rw_call_free(c);

  /* An Anthropic request has no candidate on the OpenAI route; on its own it starts. */
  req = read_request(MESSAGES_URL, NULL, 0, ANTHROPIC_BODY);
  c = begin_with(e, "chat", req, NULL, 0);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_STOPPED);
  CHECK(a.stop_reason == RW_REASON_NO_ELIGIBLE_UPSTREAM);
  CHECK(a.detail.ptr != NULL && a.detail.len > 0);
  rw_call_free(c);
  c = begin_with(e, "claude", req, NULL, 0);
  rw_request_free(req);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "claude"));
  /* A streamed success reports the time to its first token. */
  rw_outcome o = RW_OUTCOME_INIT;
  CHECK(o.first_token_ms == 0);
  o.status = 200;
  o.first_token_ms = 420;
  CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
  CHECK(d.action == RW_ACTION_SUCCEEDED);
  rw_call_free(c);
  rw_engine_free(e);
}

static void test_unknown_route(void) {
  rw_engine *e = engine_with(CATALOG, 1);
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.route = str_of("caht");
  rw_call *c = (rw_call *)&c; /* not NULL: the failure writes NULL */
  CHECK_RC(rw_call_begin(e, &spec, &c), RW_ERR_POLICY);
  CHECK(c == NULL);

  rw_error *err = NULL;
  c = (rw_call *)&c;
  CHECK_RC(rw_call_begin_err(e, &spec, &c, &err), RW_ERR_POLICY);
  CHECK(c == NULL && err != NULL);
  CHECK(rw_error_result(err) == RW_ERR_POLICY);
  CHECK(strcmp(rw_error_path(err), "routes.caht") == 0);
  CHECK(strstr(rw_error_message(err), "no route \"caht\"") != NULL);
  CHECK(strstr(rw_error_message(err), "known routes: chat, claude") != NULL);
  CHECK(rw_error_message_len(err) == strlen(rw_error_message(err)));
  rw_error_free(err);

  /* A spec that is not the simple kind takes the same check. */
  rw_request *req = read_request(CHAT_URL, NULL, 0, PLAIN_STREAM);
  spec.request = req;
  spec.tenant = str_of("acme");
  spec.task = str_of("summarize");
  CHECK_RC(rw_call_begin_err(e, &spec, &c, &err), RW_ERR_POLICY);
  CHECK(c == NULL && err != NULL && strstr(rw_error_message(err), "known routes: chat, claude") != NULL);
  rw_error_free(err);

  /* A catalog upstream named alone is a call on it (no route, no matcher):
   * mini takes even a tools request. On RW_OK *err is NULL. */
  rw_request_free(req);
  req = read_request(CHAT_URL, NULL, 0, TOOLS_ONLY);
  spec.route = str_of("mini");
  spec.request = req;
  err = (rw_error *)&err;
  CHECK_RC(rw_call_begin_err(e, &spec, &c, &err), RW_OK);
  CHECK(c != NULL && err == NULL);
  rw_request_free(req);
  rw_attempt a;
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "mini"));
  rw_call_free(c);

  /* Other failures explain themselves too. */
  CHECK_RC(rw_call_begin_err(e, NULL, &c, &err), RW_ERR_NULL);
  CHECK(c == NULL && err != NULL && rw_error_result(err) == RW_ERR_NULL);
  CHECK(strlen(rw_error_message(err)) > 0);
  rw_error_free(err);
  CHECK_RC(rw_call_begin_err(e, &spec, NULL, &err), RW_ERR_NULL);
  rw_error_free(err);
  CHECK_RC(rw_call_begin_err(e, &spec, NULL, NULL), RW_ERR_NULL);
  memset(&spec, 0, sizeof spec);
  spec.route = str_of("chat");
  spec.idempotency = 99;
  CHECK_RC(rw_call_begin_err(e, &spec, &c, &err), RW_ERR_INVALID_ARG);
  CHECK(err != NULL && rw_error_result(err) == RW_ERR_INVALID_ARG);
  rw_error_free(err);
  spec.idempotency = RW_IDEMPOTENCY_SAFE;
  rw_header inbound[] = {{RW_LIT("retrywise-deadline-ms"), RW_LIT("soon")}};
  spec.inbound_headers = inbound;
  spec.inbound_headers_len = 1;
  CHECK_RC(rw_call_begin_err(e, &spec, &c, &err), RW_ERR_INBOUND);
  CHECK(c == NULL && err != NULL && rw_error_result(err) == RW_ERR_INBOUND);
  CHECK(strcmp(rw_error_path(err), "inbound_headers.retrywise-deadline-ms") == 0);
  CHECK(strstr(rw_error_message(err), "\"soon\"") != NULL);
  rw_error_free(err);
  rw_engine_free(e);

  /* The default policy declares no routes: every name is its own upstream. */
  e = engine_with(NULL, 0);
  c = begin(e, "openai/gpt-4o", 10000);
  rw_call_free(c);
  rw_engine_free(e);
}

/* first_token_ms reaches the engine: streamed successes on p teach it p's
 * first-token limit (timeouts.learn, min_samples 3 here), which the stats
 * JSON shows under "first_token" and a streamed attempt there gets; 0 is
 * "not measured" and teaches nothing. */
static void test_first_token_learned(void) {
  rw_engine *e = engine_with("deadline_ms: 30000\n"
                             "timeouts: {learn: {min_samples: 3}}\n"
                             "upstreams: {p: {}, b: {}}\n"
                             "routes: {chat: {candidates: [p, b]}}\n",
                             1);
  char *json = NULL;
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(json != NULL && strstr(json, "\"first_token\":{}") != NULL);
  rw_string_free(json);

  rw_request *req = read_request(CHAT_URL, NULL, 0, PLAIN_STREAM);
  const uint64_t took[] = {80, 0, 120, 100};
  rw_attempt a;
  rw_decision d;
  for (size_t i = 0; i < sizeof took / sizeof took[0]; i++) {
    rw_call *c = begin_with(e, "chat", req, NULL, 0);
    CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
    CHECK(str_eq(a.upstream, "p"));
    CHECK(a.first_token_timeout_ms == 15000); /* cold: half of the time left */
    rw_outcome o = RW_OUTCOME_INIT;
    o.status = 200;
    o.first_token_ms = took[i];
    CHECK_RC(rw_call_report(c, &o, &d), RW_OK);
    CHECK(d.action == RW_ACTION_SUCCEEDED);
    rw_call_free(c);
  }

  /* The 0.99 quantile of 80, 120, 100 is 120 ms; times 3 is under the
   * 1 000 ms floor. */
  CHECK_RC(rw_engine_stats_json(e, &json), RW_OK);
  CHECK(json != NULL &&
        strstr(json, "\"first_token\":{\"p\":{\"samples\":3,\"quantile_ms\":120,\"limit_ms\":1000}}") != NULL);
  rw_string_free(json);

  rw_call *c = begin_with(e, "chat", req, NULL, 0);
  rw_request_free(req);
  CHECK_RC(rw_call_next_attempt(c, &a), RW_OK);
  CHECK(str_eq(a.upstream, "p"));
  CHECK(a.first_byte_timeout_ms == 1000 && a.first_token_timeout_ms == 1000);
  rw_call_free(c);
  rw_engine_free(e);
}

int main(void) {
  test_read_openai_chat();
  test_read_anthropic();
  test_read_not_json();
  test_read_null_arguments();
  test_routed_call_keeps_the_request_needs();
  test_unknown_route();
  test_first_token_learned();
  return check_summary();
}
