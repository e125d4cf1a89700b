//! The control API under `/control/`: the request log, counts, reset, health.

use hyper::header::{HeaderValue, ALLOW};
use hyper::{Method, Response};
use serde_json::json;

use crate::body::{json_response, ResBody};
use crate::request::query_params;
use crate::state::{Filter, State};

pub fn control(state: &State, method: &Method, endpoint: &str, query: Option<&str>) -> Response<ResBody> {
    let expected = match endpoint {
        "reset" => Method::POST,
        "health" | "requests" | "counts" | "closed-port" => Method::GET,
        _ => {
            return json_response(
                404,
                &json!({"error": format!("unknown control endpoint /control/{endpoint}")}),
            )
        }
    };
    if method != expected {
        let mut res = json_response(405, &json!({"error": format!("/control/{endpoint} takes {expected}")}));
        if let Ok(allow) = HeaderValue::from_str(expected.as_str()) {
            res.headers_mut().insert(ALLOW, allow);
        }
        return res;
    }
    match endpoint {
        "reset" => {
            state.reset();
            json_response(200, &json!({"reset": true}))
        }
        "health" => {
            let counts = state.counts();
            json_response(
                200,
                &json!({
                    "status": "ok",
                    "uptime_ms": state.now_ms(),
                    "open_connections": state.open_connections(),
                    "in_flight": state.in_flight(),
                    "recorded": counts.total,
                    "dropped": counts.dropped,
                }),
            )
        }
        "requests" => {
            let params = query_params(query);
            let get = |key: &str| params.get(key).map(String::as_str);
            let filter = Filter {
                spec: get("spec"),
                logical_id: get("logical_id"),
                model: get("model"),
                fault: get("fault"),
            };
            json_response(200, &state.find(&filter))
        }
        "counts" => json_response(200, &state.counts()),
        _ => closed_port(),
    }
}

/// Binds an ephemeral port and releases it, so "connection refused" can be tested
/// without guessing a free port. Another process could grab it in between; on a
/// test machine that window is negligible.
fn closed_port() -> Response<ResBody> {
    match std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()) {
        Ok(addr) => json_response(200, &json!({"port": addr.port()})),
        Err(e) => json_response(500, &json!({"error": format!("bind failed: {e}")})),
    }
}
