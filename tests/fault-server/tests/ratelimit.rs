//! `fb-ratelimit` (README "`fb-ratelimit`'s windows and headers") over real
//! sockets: the limit per exact model name, the three header families, the 429's
//! `retry-after` and body, the request log, and `/control/reset`. Windows are a
//! second or less, so no test waits more than about a second.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn ask(addr: SocketAddr, path: &str, model: &str) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    post(addr, path, &body.to_string())
}

fn statuses(addr: SocketAddr, model: &str) -> Vec<Value> {
    get_json(addr, &format!("/control/requests?model={model}"))
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["status"].clone())
        .collect()
}

fn header_u64(r: &Reply, name: &str) -> u64 {
    r.header(name).unwrap_or_else(|| panic!("no {name}")).parse().unwrap()
}

#[test]
fn openai_limit_per_model_with_retry_after_and_the_rate_limit_body() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=3:window=60000";
    for left in [2, 1, 0] {
        let r = ask(addr, CHAT, m);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("3"));
        assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), left);
        let reset = r.header("x-ratelimit-reset-requests").unwrap();
        assert!(reset.starts_with("59.") || reset == "1m0s", "{reset}");
    }
    let r = ask(addr, CHAT, m);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("60"));
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(
        r.text(),
        "{\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"Rate limit reached for requests: Limit 3, \
         Used 3, Requested 1. Please try again in 60s. (retrywise-fault-server)\",\"param\":null,\"type\":\
         \"requests\"}}"
    );
    // Another model name (even the same parameters with an id) has its own limit.
    assert_eq!(ask(addr, CHAT, "fb-ratelimit:rpm=3:window=60000:id=b").status, 200);
    assert_eq!(statuses(addr, m), [json!(200), json!(200), json!(200), json!(429)]);
    // A reset forgets the windows.
    call(addr, "POST", "/control/reset", &[], "");
    assert_eq!(ask(addr, CHAT, m).status, 200);
}

#[test]
fn fixed_windows_admit_the_limit_again_after_the_reset() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=2:window=600";
    let got: Vec<u16> = (0..3).map(|_| ask(addr, CHAT, m).status).collect();
    assert_eq!(got, [200, 200, 429]);
    let r = ask(addr, CHAT, m);
    assert_eq!((r.status, r.header("retry-after")), (429, Some("1")));
    let wait_ms: u64 = r
        .header("x-ratelimit-reset-requests")
        .unwrap()
        .trim_end_matches("ms")
        .parse()
        .unwrap();
    assert!(wait_ms <= 600);
    std::thread::sleep(Duration::from_millis(wait_ms + 20));
    let got: Vec<u16> = (0..3).map(|_| ask(addr, CHAT, m).status).collect();
    assert_eq!(got, [200, 200, 429], "the next window admits the limit again");
}

#[test]
fn a_sliding_window_frees_one_slot_as_the_oldest_request_leaves() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=2:window=800:mode=sliding";
    assert_eq!(ask(addr, CHAT, m).status, 200);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(ask(addr, CHAT, m).status, 200);
    assert_eq!(ask(addr, CHAT, m).status, 429);
    std::thread::sleep(Duration::from_millis(450));
    // The first left the window; the second is still in it.
    assert_eq!(ask(addr, CHAT, m).status, 200);
    assert_eq!(ask(addr, CHAT, m).status, 429);
}

#[test]
fn anthropic_headers_state_the_reset_as_an_rfc3339_instant() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=1:window=5000:family=anthropic";
    let r = ask(addr, MESSAGES, m);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("anthropic-ratelimit-requests-limit"), Some("1"));
    assert_eq!(r.header("anthropic-ratelimit-requests-remaining"), Some("0"));
    assert!(r.header("x-ratelimit-limit-requests").is_none());
    let reset = r.header("anthropic-ratelimit-requests-reset").unwrap();
    // `YYYY-MM-DDTHH:MM:SS.mmmZ`: within the next five seconds of the wall clock.
    let secs_of_day = |s: &str| -> f64 {
        let t = &s[11..s.len() - 1];
        let p: Vec<f64> = t.split(':').map(|x| x.parse().unwrap()).collect();
        p[0] * 3600.0 + p[1] * 60.0 + p[2]
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() % 86_400.0;
    let ahead = (secs_of_day(reset) - now).rem_euclid(86_400.0);
    assert!(ahead > 3.0 && ahead <= 5.1, "{reset} is {ahead} s ahead");
    let r = ask(addr, MESSAGES, m);
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.header("retry-after"), Some("5"));
}

#[test]
fn ietf_headers_state_policy_and_remaining() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=2:window=1500:family=ietf";
    let r = ask(addr, CHAT, m);
    assert_eq!(r.header("ratelimit-policy"), Some("\"default\";q=2;w=2"));
    assert_eq!(r.header("ratelimit"), Some("\"default\";r=1;t=2"));
    ask(addr, CHAT, m);
    let r = ask(addr, CHAT, m);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("ratelimit"), Some("\"default\";r=0;t=2"));
    assert_eq!(r.header("retry-after"), Some("2"));
}

#[test]
fn a_bucket_gives_back_one_request_per_share_of_the_window() {
    let (addr, _server) = server();
    // 3 per 600 ms: one comes back every 200 ms.
    let m = "fb-ratelimit:rpm=3:window=600:mode=bucket";
    let got: Vec<u16> = (0..4).map(|_| ask(addr, CHAT, m).status).collect();
    assert_eq!(got, [200, 200, 200, 429]);
    std::thread::sleep(Duration::from_millis(230));
    let r = ask(addr, CHAT, m);
    assert_eq!(r.status, 200, "one request came back");
    // Until full: nearly the whole window (the bucket is below one request).
    let full: u64 = r
        .header("x-ratelimit-reset-requests")
        .unwrap()
        .trim_end_matches("ms")
        .parse()
        .unwrap();
    assert!((500..=600).contains(&full), "{full}");
    assert_eq!(ask(addr, CHAT, m).status, 429);
}

#[test]
fn azure_states_remaining_only_and_a_refusal_in_milliseconds() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=1:window=700:family=azure";
    let r = ask(addr, CHAT, m);
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    assert!(r.header("x-ratelimit-limit-requests").is_none());
    assert!(r.header("x-ratelimit-reset-requests").is_none());
    let r = ask(addr, CHAT, m);
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_none());
    let ms: u64 = r.header("retry-after-ms").unwrap().parse().unwrap();
    assert!((600..=700).contains(&ms), "{ms}");
}

#[test]
fn gemini_states_nothing_but_the_refusal_body() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=1:window=1500:family=gemini";
    let r = ask(addr, CHAT, m);
    assert_eq!(r.status, 200);
    assert!(
        r.headers.iter().all(|(k, _)| !k.contains("ratelimit")),
        "{:?}",
        r.headers
    );
    let r = ask(addr, CHAT, m);
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_none());
    let e = &r.json()["error"];
    assert_eq!(
        (e["code"].as_u64(), e["status"].as_str()),
        (Some(429), Some("RESOURCE_EXHAUSTED"))
    );
    assert_eq!(e["details"][1]["@type"], "type.googleapis.com/google.rpc.RetryInfo");
    assert_eq!(e["details"][1]["retryDelay"], "2s");
}

#[test]
fn concurrent_requests_never_exceed_the_limit() {
    let (addr, _server) = server();
    let m = "fb-ratelimit:rpm=5:window=60000";
    let handles: Vec<_> = (0..12)
        .map(|_| std::thread::spawn(move || ask(addr, CHAT, m).status))
        .collect();
    let mut got: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, [[200; 5].as_slice(), &[429; 7]].concat());
}

#[test]
fn bad_parameters_are_a_400() {
    let (addr, _server) = server();
    for m in [
        "fb-ratelimit:rpm=0",
        "fb-ratelimit:family=bedrock",
        "fb-ratelimit:window=x",
    ] {
        let r = ask(addr, CHAT, m);
        assert_eq!(
            (r.status, r.json()["error"]["code"].clone()),
            (400, json!("invalid_fault_spec"))
        );
    }
}
