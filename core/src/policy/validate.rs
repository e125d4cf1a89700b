//! The policy's rules: every violation, with the field path and the rule
//! it breaks.

use super::{Policy, PolicyError, PolicyErrors, WindowKind};
use crate::types::ErrorClass;

impl Policy {
    /// Checks every rule; returns all violations with their field paths.
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        let mut v = Validator::default();
        v.check(!self.version.trim().is_empty(), "version", "must not be empty", || {
            "\"\"".into()
        });
        v.range_u64("max_attempts", self.max_attempts as u64, 1, 100);
        v.range_u64("deadline_ms", self.deadline_ms, 1, 86_400_000);
        v.check(
            self.min_attempt_ms < self.deadline_ms,
            "min_attempt_ms",
            "must be less than deadline_ms",
            || self.min_attempt_ms.to_string(),
        );
        v.range_u64("timeouts.connect_ms", self.timeouts.connect_ms, 1, 86_400_000);
        if let Some(t) = self.timeouts.first_byte_ms {
            v.range_u64("timeouts.first_byte_ms", t, 1, 86_400_000);
        }
        if let Some(t) = self.timeouts.first_token_ms {
            v.range_u64("timeouts.first_token_ms", t, 1, 86_400_000);
        }
        v.range_u64("timeouts.idle_ms", self.timeouts.idle_ms, 1, 86_400_000);
        if let Some(a) = self.timeouts.attempt_ms {
            v.range_u64("timeouts.attempt_ms", a, 1, 86_400_000);
        }
        if let Some(d) = &self.timeouts.dynamic {
            v.range_u64("timeouts.dynamic.base_ms", d.base_ms, 1, 86_400_000);
            v.range_u64(
                "timeouts.dynamic.per_input_token_us",
                d.per_input_token_us,
                0,
                1_000_000,
            );
            v.range_u64(
                "timeouts.dynamic.per_output_token_us",
                d.per_output_token_us,
                0,
                1_000_000,
            );
        }
        let learn = &self.timeouts.learn;
        v.unit_rate("timeouts.learn.quantile", learn.quantile);
        v.check(
            learn.factor.is_finite() && (1.0..=100.0).contains(&learn.factor),
            "timeouts.learn.factor",
            "must be in [1, 100]",
            || learn.factor.to_string(),
        );
        v.range_u64("timeouts.learn.floor_ms", learn.floor_ms, 1, 86_400_000);
        v.range_u64(
            "timeouts.learn.min_samples",
            learn.min_samples as u64,
            1,
            super::LearnFirstToken::SAMPLES as u64,
        );
        v.range_u64("backoff.base_ms", self.backoff.base_ms, 0, 3_600_000);
        v.range_u64("backoff.cap_ms", self.backoff.cap_ms, 0, 3_600_000);
        v.check(
            self.backoff.cap_ms >= self.backoff.base_ms,
            "backoff.cap_ms",
            "must be at least backoff.base_ms",
            || self.backoff.cap_ms.to_string(),
        );
        v.range_u64("retry_after.max_ms", self.retry_after.max_ms, 0, 86_400_000);
        v.range_u64("retry_after.jitter_ms", self.retry_after.jitter_ms, 0, 60_000);
        for (i, c) in self.retry.classes.iter().enumerate() {
            v.check(
                !matches!(c, ErrorClass::AuthOrPolicy | ErrorClass::InvalidRequest),
                &format!("retry.classes[{i}]"),
                "auth_or_policy and invalid_request are never retryable",
                || c.to_string(),
            );
        }
        let cl = &self.classify;
        for (name, list) in [
            ("classify.invalid_request_statuses", &cl.invalid_request_statuses),
            ("classify.auth_statuses", &cl.auth_statuses),
            ("classify.rate_limit_statuses", &cl.rate_limit_statuses),
            ("classify.overloaded_statuses", &cl.overloaded_statuses),
            ("classify.transient_statuses", &cl.transient_statuses),
            ("classify.unsafe_retryable_statuses", &cl.unsafe_retryable_statuses),
        ] {
            for (i, s) in list.iter().enumerate() {
                v.range_u64(&format!("{name}[{i}]"), *s as u64, 100, 599);
            }
        }
        v.range_u64(
            "propagation.safety_margin_ms",
            self.propagation.safety_margin_ms,
            0,
            60_000,
        );
        let b = &self.budget;
        v.range_u64("budget.window_ms", b.window_ms, 1, 86_400_000);
        v.range_u64("budget.buckets", b.buckets as u64, 1, 3_600);
        v.milli("budget.ratio", b.ratio, 0.0, 1000.0);
        v.milli("budget.min_per_sec", b.min_per_sec, 0.0, 1_000_000.0);
        v.check(
            !b.scopes.is_empty(),
            "budget.scopes",
            "must list at least one scope",
            || "[]".into(),
        );
        for (i, s) in b.scopes.iter().enumerate() {
            v.check(
                !s.is_empty(),
                &format!("budget.scopes[{i}]"),
                "must name at least one dimension",
                || "[]".into(),
            );
        }
        if let Some(m) = b.max_concurrent_retries {
            v.range_u64("budget.max_concurrent_retries", m as u64, 0, 10_000_000);
        }
        let br = &self.breaker;
        v.check(
            !br.scope.is_empty(),
            "breaker.scope",
            "must name at least one dimension",
            || "[]".into(),
        );
        match br.window {
            WindowKind::Count => v.range_u64("breaker.window_size", br.window_size, 1, 100_000),
            WindowKind::Time => v.range_u64("breaker.window_size", br.window_size, 1, 86_400_000),
        }
        v.range_u64("breaker.buckets", br.buckets as u64, 1, 3_600);
        v.range_u64("breaker.min_calls", br.min_calls as u64, 1, 10_000_000);
        // A count window holds at most window_size calls: a larger minimum could never be met.
        if br.window == WindowKind::Count {
            v.check(
                u64::from(br.min_calls) <= br.window_size,
                "breaker.min_calls",
                &format!(
                    "must be at most breaker.window_size ({}): a count window never holds more calls",
                    br.window_size
                ),
                || br.min_calls.to_string(),
            );
        }
        if let Some(r) = br.failure_rate {
            v.unit_rate("breaker.failure_rate", r);
        }
        if let Some(r) = br.slow_call_rate {
            v.unit_rate("breaker.slow_call_rate", r);
            v.check(
                br.slow_call_ms.is_some(),
                "breaker.slow_call_ms",
                "is required when slow_call_rate is set",
                || "null".into(),
            );
        }
        v.range_u64("breaker.consecutive_min_ms", br.consecutive_min_ms, 0, 86_400_000);
        if let Some(c) = br.consecutive_failures {
            v.range_u64("breaker.consecutive_failures", c as u64, 1, 10_000_000);
        }
        for (i, c) in br.count_classes.iter().enumerate() {
            v.check(
                !matches!(c, ErrorClass::AuthOrPolicy | ErrorClass::InvalidRequest),
                &format!("breaker.count_classes[{i}]"),
                "auth_or_policy and invalid_request never count as upstream failures",
                || c.to_string(),
            );
        }
        v.range_u64("breaker.open_ms", br.open_ms, 1, 86_400_000);
        v.check(
            br.open_factor.is_finite() && br.open_factor >= 1.0 && br.open_factor <= 100.0,
            "breaker.open_factor",
            "must be in [1, 100]",
            || br.open_factor.to_string(),
        );
        v.check(
            br.open_max_ms >= br.open_ms,
            "breaker.open_max_ms",
            "must be at least breaker.open_ms",
            || br.open_max_ms.to_string(),
        );
        v.check(
            br.open_jitter.is_finite() && (0.0..1.0).contains(&br.open_jitter),
            "breaker.open_jitter",
            "must be in [0, 1)",
            || br.open_jitter.to_string(),
        );
        v.range_u64("breaker.half_open_probes", br.half_open_probes as u64, 1, 10_000);
        v.range_u64("breaker.close_after", br.close_after as u64, 1, 10_000);
        v.range_u64("breaker.hold_jitter_ms", br.hold_jitter_ms, 0, 600_000);
        v.range_u64("breaker.hold_max_ms", br.hold_max_ms, 0, 86_400_000);
        let t = &self.throttle;
        v.check(
            t.k.is_finite() && t.k >= 1.0 && t.k <= 100.0,
            "throttle.k",
            "must be in [1, 100]",
            || t.k.to_string(),
        );
        v.range_u64("throttle.window_ms", t.window_ms, 1, 86_400_000);
        v.range_u64("throttle.buckets", t.buckets as u64, 1, 3_600);
        v.range_u64("throttle.min_requests", u64::from(t.min_requests), 0, 10_000_000);
        v.check(
            !t.scope.is_empty(),
            "throttle.scope",
            "must name at least one dimension",
            || "[]".into(),
        );
        let rc = &self.rate_limits.concurrency;
        v.range_u64("rate_limits.concurrency.min", u64::from(rc.min), 1, 1_000_000);
        v.range_u64("rate_limits.concurrency.max", u64::from(rc.max), 1, 1_000_000);
        v.check(
            rc.max >= rc.min,
            "rate_limits.concurrency.max",
            "must be at least rate_limits.concurrency.min",
            || rc.max.to_string(),
        );
        if let Some(i) = rc.initial {
            v.check(
                (rc.min..=rc.max).contains(&i),
                "rate_limits.concurrency.initial",
                &format!("must be in [min, max] = [{}, {}]", rc.min, rc.max),
                || i.to_string(),
            );
        }
        if let Some(g) = rc.grow_after {
            v.range_u64("rate_limits.concurrency.grow_after", u64::from(g), 1, 1_000_000);
        }
        v.range_u64("rate_limits.concurrency.hold_max_ms", rc.hold_max_ms, 1, 60_000);
        v.check(
            !self.concurrency.scope.is_empty(),
            "concurrency.scope",
            "must name at least one dimension",
            || "[]".into(),
        );
        v.range_u64("limits.max_keys", self.limits.max_keys as u64, 16, 100_000_000);
        v.range_u64("limits.idle_ms", self.limits.idle_ms, 1, u64::MAX / 4);
        v.range_u64("telemetry.ring_size", self.telemetry.ring_size as u64, 0, 10_000_000);
        v.range_u64("idempotency.ttl_ms", self.idempotency.ttl_ms, 1, u64::MAX / 4);
        v.range_u64(
            "idempotency.max_keys",
            self.idempotency.max_keys as u64,
            16,
            100_000_000,
        );
        for (name, u) in &self.upstreams {
            let p = format!("upstreams.{name}");
            v.check(!name.is_empty(), &p, "upstream name must not be empty", || {
                "\"\"".into()
            });
            v.check(
                u.cost_input_per_mtok.is_finite() && u.cost_input_per_mtok >= 0.0,
                &format!("{p}.cost_input_per_mtok"),
                "must be ≥ 0",
                || u.cost_input_per_mtok.to_string(),
            );
            v.check(
                u.cost_output_per_mtok.is_finite() && u.cost_output_per_mtok >= 0.0,
                &format!("{p}.cost_output_per_mtok"),
                "must be ≥ 0",
                || u.cost_output_per_mtok.to_string(),
            );
            if let Some(url) = &u.base_url {
                v.check(
                    url.starts_with("http://") || url.starts_with("https://"),
                    &format!("{p}.base_url"),
                    "must be an http:// or https:// URL",
                    || format!("{url:?}"),
                );
            }
            if let Some(env) = &u.api_key_env {
                // The NAME of a variable: a key pasted here instead would be a secret in the policy.
                let name_ok = env.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                v.check(
                    name_ok,
                    &format!("{p}.api_key_env"),
                    "must be the name of an environment variable ([A-Za-z_][A-Za-z0-9_]*), never the key itself",
                    || "(not shown)".into(),
                );
            }
            if u.api_version.is_some() {
                v.check(
                    u.api == Some(crate::types::ApiFamily::AzureOpenAi),
                    &format!("{p}.api_version"),
                    "is for api: azure_openai only",
                    || format!("{:?}", u.api_version.as_deref().unwrap_or("")),
                );
            }
            for (i, c) in u.capabilities.iter().flatten().enumerate() {
                v.capability(&format!("{p}.capabilities[{i}]"), c);
            }
            for (task, score) in &u.evals {
                v.check(
                    score.is_finite(),
                    &format!("{p}.evals.{task}"),
                    "must be a finite number",
                    || score.to_string(),
                );
            }
        }
        for (model, target) in &self.models {
            v.check(
                self.routes.contains_key(target) || self.upstreams.contains_key(target),
                &format!("models.{model}"),
                "names no route in `routes` and no upstream in `upstreams`",
                || format!("{target:?}"),
            );
        }
        for (name, r) in &self.routes {
            let p = format!("routes.{name}");
            v.check(
                !r.candidates.is_empty(),
                &format!("{p}.candidates"),
                "must list at least one upstream",
                || "[]".into(),
            );
            for (i, c) in r.candidates.iter().enumerate() {
                v.check(
                    self.upstreams.contains_key(c),
                    &format!("{p}.candidates[{i}]"),
                    "names no upstream in `upstreams`",
                    || format!("{c:?}"),
                );
            }
            for (i, c) in r.require.iter().enumerate() {
                v.capability(&format!("{p}.require[{i}]"), c);
            }
            // Candidates whose declared families cannot take the same body:
            // a fallback between them would send one family's body to the other.
            let mut first: Option<(&str, crate::types::ApiFamily)> = None;
            for (i, c) in r.candidates.iter().enumerate() {
                let Some(api) = self.upstreams.get(c).and_then(|u| u.api) else {
                    continue;
                };
                match first {
                    None => first = Some((c, api)),
                    Some((other, had)) => v.check(
                        had.takes(api),
                        &format!("{p}.candidates[{i}]"),
                        &format!(
                            "mixes wire families: {c:?} speaks {api}, {other:?} speaks {had}; a request built for one \
                             cannot be sent to the other (give each family a route of its own)"
                        ),
                        || format!("{c:?}"),
                    ),
                }
            }
            if let Some(m) = r.max_upstreams {
                v.range_u64(&format!("{p}.max_upstreams"), m as u64, 1, 1_000);
            }
            v.range_u64(
                &format!("{p}.attempts_per_upstream"),
                r.attempts_per_upstream as u64,
                1,
                100,
            );
            if let Some(c) = r.max_cost_per_call {
                v.check(
                    c.is_finite() && c >= 0.0,
                    &format!("{p}.max_cost_per_call"),
                    "must be ≥ 0",
                    || c.to_string(),
                );
            }
            if let Some(m) = r.min_eval {
                v.check(
                    m.is_finite(),
                    &format!("{p}.min_eval"),
                    "must be a finite number",
                    || m.to_string(),
                );
            }
            if let Some(h) = r.hedge_after_ms {
                v.range_u64(&format!("{p}.hedge_after_ms"), h, 1, 86_400_000);
            }
            if let Some(m) = r.max_attempts {
                v.range_u64(&format!("{p}.max_attempts"), m as u64, 1, 100);
            }
        }
        v.finish()
    }
}

/// Returns `value * 1000` when it has at most three decimals (the exact
/// fixed-point scale used by the budget), `None` otherwise.
pub fn to_milli(value: f64) -> Option<u64> {
    if !value.is_finite() || !(0.0..=1.0e12).contains(&value) {
        return None;
    }
    let scaled = value * 1000.0;
    let rounded = scaled.round();
    if (scaled - rounded).abs() > 1e-6 {
        return None;
    }
    Some(rounded as u64)
}

#[derive(Default)]
struct Validator {
    errors: Vec<PolicyError>,
}

impl Validator {
    fn check(&mut self, ok: bool, path: &str, rule: &str, got: impl FnOnce() -> String) {
        if !ok {
            self.errors.push(PolicyError {
                path: path.to_string(),
                message: format!("{rule}, got {}", got()),
            });
        }
    }

    fn range_u64(&mut self, path: &str, value: u64, lo: u64, hi: u64) {
        self.check(
            (lo..=hi).contains(&value),
            path,
            &format!("must be in [{lo}, {hi}]"),
            || value.to_string(),
        );
    }

    /// A capability name from the vocabulary, or a custom `x-` one.
    fn capability(&mut self, path: &str, name: &str) {
        self.check(
            super::known_capability(name),
            path,
            &format!(
                "names no capability; known: {} (custom ones start with x-)",
                super::CAPABILITIES
                    .iter()
                    .map(|(c, _)| *c)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            || format!("{name:?}"),
        );
    }

    fn unit_rate(&mut self, path: &str, value: f64) {
        self.check(
            value.is_finite() && value > 0.0 && value <= 1.0,
            path,
            "must be in (0, 1]",
            || value.to_string(),
        );
    }

    fn milli(&mut self, path: &str, value: f64, lo: f64, hi: f64) {
        if !(value.is_finite() && value >= lo && value <= hi) {
            self.check(false, path, &format!("must be in [{lo}, {hi}]"), || value.to_string());
        } else {
            self.check(
                to_milli(value).is_some(),
                path,
                "must have at most 3 decimal places (exact ×1000 arithmetic)",
                || value.to_string(),
            );
        }
    }

    fn finish(self) -> Result<(), PolicyErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(PolicyErrors(self.errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::*;
    use crate::types::ErrorClass;

    #[test]
    fn default_policy_is_valid_and_documented_defaults_hold() {
        let p = Policy::default();
        p.validate().unwrap();
        assert_eq!(p.max_attempts, 3);
        assert_eq!(p.deadline_ms, 30_000);
        assert_eq!(p.min_attempt_ms, 300);
        assert_eq!(p.backoff.kind, BackoffKind::Full);
        assert_eq!((p.backoff.base_ms, p.backoff.cap_ms), (250, 4_000));
        assert_eq!(p.retry_after.max_ms, 60_000);
        assert_eq!(p.retry_after.on_exceed, OnExceed::Stop);
        assert_eq!(
            p.retry.classes,
            vec![ErrorClass::Transient, ErrorClass::RateLimit, ErrorClass::Overloaded]
        );
    }

    #[test]
    fn validation_names_field_and_rule() {
        let err = Policy::from_str_any(r#"{"breaker":{"failure_rate":1.5}}"#).unwrap_err();
        assert_eq!(err.first().path, "breaker.failure_rate");
        assert_eq!(err.to_string(), "breaker.failure_rate: must be in (0, 1], got 1.5");
        let err = Policy::from_str_any("budget:\n  ratio: 0.1234\n").unwrap_err();
        assert_eq!(err.first().path, "budget.ratio");
        let err = Policy::from_str_any(r#"{"max_attempts":0,"deadline_ms":0}"#).unwrap_err();
        assert!(err.0.len() >= 2, "{err}");
    }

    #[test]
    fn routes_must_name_catalog_upstreams() {
        let err = Policy::from_str_any("routes:\n  chat:\n    candidates: [ghost]\n").unwrap_err();
        assert_eq!(err.first().path, "routes.chat.candidates[0]");
    }

    #[test]
    fn milli_is_exact() {
        assert_eq!(to_milli(0.1), Some(100));
        assert_eq!(to_milli(0.3), Some(300));
        assert_eq!(to_milli(1.0), Some(1000));
        assert_eq!(to_milli(0.0005), None);
    }
}
