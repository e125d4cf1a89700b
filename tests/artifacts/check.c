/* Built by tests/artifacts/run.sh against the unpacked C tarball, through
 * pkg-config only (shared and static): a 503 carrying retry-after-ms, then a
 * 200. The driver compares stdout with the exact expected text. */
#include <retrywise.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first `"key":N` in the stats JSON: the overall counters come first. */
static unsigned long long counter(const char *json, const char *key) {
    char needle[64];
    snprintf(needle, sizeof needle, "\"%s\":", key);
    const char *at = strstr(json, needle);
    return at ? strtoull(at + strlen(needle), NULL, 10) : ~0ULL;
}

int main(void) {
    rw_engine_options opts = { .seed = 7, .has_seed = true, .manual_clock = true };
    rw_error *err = NULL;
    static const char policy[] = "{\"max_attempts\": 3, \"retry_after\": {\"jitter_ms\": 0}}";
    rw_engine *engine = rw_engine_new_with(policy, sizeof(policy) - 1, &opts, &err);
    if (engine == NULL) {
        fprintf(stderr, "rw_engine_new_with: %s\n", rw_error_message(err));
        return 2;
    }
    printf("libretrywise %s\n", rw_version());

    rw_call_spec spec = { .route = RW_LIT("openai/gpt-4o"), .deadline_ms = 10000 };
    rw_call *call = NULL;
    if (rw_call_begin(engine, &spec, &call) != RW_OK) return 3;

    /* The upstream's answers: a 503 that asks for 5 ms, then a 200. */
    rw_header wait_5ms[] = { { RW_LIT("retry-after-ms"), RW_LIT("5") } };
    uint16_t statuses[] = { 503, 200 };
    rw_attempt a;
    rw_decision d = { .action = RW_ACTION_STOP };
    unsigned i = 0;
    while (i < 2 && rw_call_next_attempt(call, &a) == RW_OK) {
        rw_outcome out = RW_OUTCOME_INIT;
        out.status = statuses[i];
        if (i == 0) {
            out.headers = wait_5ms;
            out.headers_len = 1;
        }
        if (rw_call_report(call, &out, &d) != RW_OK) return 4;
        printf("attempt %u: %s %s class=%s wait=%s %llu ms\n", a.number, rw_action_name(d.action),
               rw_reason_name(d.reason), rw_class_name(d.error_class), rw_wait_source_name(d.wait_source),
               (unsigned long long)d.delay_ms);
        i++;
    }
    /* The call is finished: no third attempt. */
    if (rw_call_next_attempt(call, &a) != RW_STOPPED) return 5;
    printf("after success: %s\n", rw_reason_name(a.stop_reason));

    char *stats = NULL;
    if (rw_engine_stats_json(engine, &stats) != RW_OK) return 6;
    printf("overall: %llu request, %llu attempts, %llu retry\n", counter(stats, "logical_requests"),
           counter(stats, "attempts"), counter(stats, "retries"));
    rw_string_free(stats);
    rw_call_free(call);
    rw_engine_free(engine);
    return d.action == RW_ACTION_SUCCEEDED ? 0 : 1;
}
