#include <retrywise.h>
#include <stdio.h>

int main(void) {
    rw_engine *engine = rw_engine_new(NULL, 0, NULL); /* default policy; or JSON / YAML / TOML text */
    rw_call_spec spec = { .route = RW_LIT("openai/gpt-4o"), .deadline_ms = 10000 };
    rw_call *call = NULL;
    rw_call_begin(engine, &spec, &call);
    int statuses[] = { 503, 200 }, i = 0; /* stand-in for the upstream: a 503, then a 200 */
    rw_attempt a; rw_decision d = { .action = RW_ACTION_STOP };
    while (rw_call_next_attempt(call, &a) == RW_OK) { /* send to a.upstream with a.headers, a.total_timeout_ms */
        rw_outcome out = RW_OUTCOME_INIT;
        out.status = statuses[i++];
        rw_call_report(call, &out, &d); /* Retry / Fallback: sleep d.delay_ms, then loop */
        printf("attempt %u: %s (%s), wait %d ms\n", a.number, rw_action_name(d.action), rw_reason_name(d.reason), (int)d.delay_ms);
    }
    rw_call_free(call);
    rw_engine_free(engine);
    return d.action == RW_ACTION_SUCCEEDED ? 0 : 1;
}
