//! The module-level functions of `retrywise._retrywise`: stateless helpers
//! over the core (params digests, idempotency keys, vendor codes, JSON media
//! types, the policy schema) that need no engine.

use crate::convert::{body_bytes, from_json, req_str, to_json};
use crate::errors::guarded;
use pyo3::prelude::*;
use retrywise::Policy;

/// SHA-256 (hex) of the canonical JSON form of `params` (key order does not matter).
#[pyfunction]
pub(crate) fn params_digest(py: Python<'_>, params: &Bound<'_, PyAny>) -> PyResult<String> {
    let v = to_json(params, "params")?;
    guarded(py, move || retrywise::idempotency::params_digest(&v))
}

/// A stable idempotency key (`rw1_...`) for tenant + operation + params digest.
#[pyfunction]
pub(crate) fn derive_idempotency_key(
    py: Python<'_>,
    tenant: &Bound<'_, PyAny>,
    operation: &Bound<'_, PyAny>,
    digest: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let tenant = req_str("tenant", tenant)?;
    let operation = req_str("operation", operation)?;
    let digest = req_str("digest", digest)?;
    guarded(py, move || {
        retrywise::idempotency::derive_key(&tenant, &operation, &digest)
    })
}

/// Vendor error code from an OpenAI- or Anthropic-style error body, if any.
#[pyfunction]
pub(crate) fn vendor_code_from_body(py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let b = body_bytes(body)?;
    guarded(py, move || retrywise::vendor_code_from_body(&b))
}

/// Whether a `content-type` names JSON (`application/json`, `+json`): the
/// success bodies `Call.report(body=...)` checks for being malformed.
#[pyfunction]
pub(crate) fn json_media_type(content_type: &str) -> bool {
    retrywise::json_media_type(content_type)
}

/// The JSON Schema of the policy document.
#[pyfunction]
pub(crate) fn policy_schema(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let v = guarded(py, Policy::json_schema)?;
    from_json(py, &v)
}
