//! Idempotency keys: derived from tenant + operation + a digest of normalized
//! parameters (seed 000 §6), carried unchanged on every attempt and fallback,
//! and checked so the same key with different parameters is a conflict
//! rather than a silent overwrite.

use crate::types::Idempotency;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};

/// A call's idempotency as the engine treats it: `Keyed` promises that the
/// writer deduplicates by the call's key, so without a key there is nothing to
/// deduplicate on and the call is `Unsafe` (never replayed once it may have
/// been received).
///
/// ```
/// use retrywise::{idempotency::effective, Idempotency};
/// assert_eq!(effective(Idempotency::Keyed, false), Idempotency::Unsafe);
/// assert_eq!(effective(Idempotency::Keyed, true), Idempotency::Keyed);
/// ```
#[inline(always)]
pub fn effective(idem: Idempotency, has_key: bool) -> Idempotency {
    if idem == Idempotency::Keyed && !has_key {
        Idempotency::Unsafe
    } else {
        idem
    }
}

/// SHA-256 (hex) of the canonical JSON form of `params` (object keys sorted,
/// no whitespace), so `{"b":1,"a":2}` and `{"a":2,"b":1}` digest alike.
pub fn params_digest(params: &serde_json::Value) -> String {
    let canonical = canonical_json(params);
    hex(&Sha256::digest(canonical.as_bytes()))
}

/// A stable key for one logical operation: `rw1_` + 32 hex digits of
/// SHA-256(tenant ␀ operation ␀ params digest).
pub fn derive_key(tenant: &str, operation: &str, params_digest: &str) -> String {
    let mut h = Sha256::new();
    h.update(tenant.as_bytes());
    h.update([0]);
    h.update(operation.as_bytes());
    h.update([0]);
    h.update(params_digest.as_bytes());
    let full = hex(&h.finalize());
    format!("rw1_{}", &full[..32])
}

fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

fn canonical_json(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical_json).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// Recently seen keys and their parameter digests.
#[derive(Debug, Default)]
pub struct Ledger {
    inner: Mutex<LedgerInner>,
}

#[derive(Debug, Default)]
struct LedgerInner {
    map: HashMap<String, (String, u64)>,
    order: VecDeque<(String, u64)>,
}

impl Ledger {
    /// Records `key → digest` at `now_ms`; returns the earlier digest when the
    /// same key was seen with different parameters within `ttl_ms`.
    pub fn check(&self, key: &str, digest: &str, now_ms: u64, ttl_ms: u64, max_keys: usize) -> Result<(), String> {
        let mut g = self.inner.lock();
        while let Some((k, at)) = g.order.front().cloned() {
            if now_ms.saturating_sub(at) < ttl_ms && g.map.len() < max_keys {
                break;
            }
            g.order.pop_front();
            if g.map.get(&k).is_some_and(|(_, t)| *t == at) {
                g.map.remove(&k);
            }
        }
        if let Some((d, _)) = g.map.get(key) {
            if d != digest {
                return Err(d.clone());
            }
            return Ok(());
        }
        g.map.insert(key.to_string(), (digest.to_string(), now_ms));
        g.order.push_back((key.to_string(), now_ms));
        Ok(())
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    /// True when no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn digest_is_order_independent_and_key_is_stable() {
        let a = params_digest(&json!({"model":"m","messages":[{"role":"user","content":"hi"}],"t":0.2}));
        let b = params_digest(&json!({"t":0.2,"messages":[{"content":"hi","role":"user"}],"model":"m"}));
        assert_eq!(a, b);
        assert_ne!(a, params_digest(&json!({"model":"m2"})));
        let k = derive_key("acme", "send_email", &a);
        assert_eq!(k, derive_key("acme", "send_email", &b));
        assert!(k.starts_with("rw1_") && k.len() == 36);
        assert_ne!(k, derive_key("other", "send_email", &a));
    }

    #[test]
    fn same_key_different_params_is_a_conflict() {
        let l = Ledger::default();
        assert!(l.check("k", "d1", 0, 1_000, 100).is_ok());
        assert!(l.check("k", "d1", 10, 1_000, 100).is_ok());
        assert_eq!(l.check("k", "d2", 20, 1_000, 100), Err("d1".to_string()));
        // After the TTL the key may be reused.
        assert!(l.check("k", "d2", 1_000, 1_000, 100).is_ok());
        for i in 0..500 {
            l.check(&format!("x{i}"), "d", 2_000, 1_000_000, 100).unwrap();
        }
        assert!(l.len() <= 101);
    }
}
