//! Type translation between Python objects and the core's types. Nothing here
//! decides anything: it parses names, copies values and reports which
//! argument was wrong.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;
use retrywise::{Headers, Needs};
use serde::Deserialize;
use smol_str::SmolStr;
use std::str::FromStr;

/// Parses a vocabulary name (`"safe"`, `"stream_visible"`, ...) for argument `arg`.
pub fn parse_name<T>(arg: &str, value: &str) -> PyResult<T>
where
    T: FromStr<Err = retrywise::types::UnknownName>,
{
    T::from_str(value).map_err(|e| {
        PyValueError::new_err(format!(
            "argument '{arg}': {arg} must be one of {}; got {value:?}",
            e.expected.join(", ")
        ))
    })
}

/// A Python value as JSON, for policies, params digests and needs.
/// `where_` names the argument (and the path inside it) in errors.
pub fn to_json(obj: &Bound<'_, PyAny>, where_: &str) -> PyResult<serde_json::Value> {
    use serde_json::Value;
    if obj.is_none() {
        return Ok(Value::Null);
    }
    // bool before int: True is an int in Python.
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::from(u));
        }
        return Err(PyValueError::new_err(format!("{where_}: integer out of range")));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        return serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err(format!("{where_}: {v} is not a finite number")));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut m = serde_json::Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = dict_key(&k, where_)?;
            let child = to_json(&v, &format!("{where_}.{key}"))?;
            m.insert(key, child);
        }
        return Ok(Value::Object(m));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut out = Vec::new();
        for (i, item) in obj.try_iter()?.enumerate() {
            out.push(to_json(&item?, &format!("{where_}[{i}]"))?);
        }
        return Ok(Value::Array(out));
    }
    // Other mappings (MappingProxyType, custom Mapping subclasses).
    if obj.hasattr(pyo3::intern!(obj.py(), "items"))? {
        let d = PyDict::new(obj.py());
        for item in obj.call_method0(pyo3::intern!(obj.py(), "items"))?.try_iter()? {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            d.set_item(k, v)?;
        }
        return to_json(d.as_any(), where_);
    }
    Err(PyTypeError::new_err(format!(
        "{where_}: expected dict, list, str, int, float, bool or None, got {}",
        obj.get_type().name()?
    )))
}

/// The Python type name of `obj`, for error messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

fn dict_key(k: &Bound<'_, PyAny>, where_: &str) -> PyResult<String> {
    match k.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.to_owned()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{where_}: keys must be str, got {}",
            type_name(k)
        ))),
    }
}

/// JSON as Python objects (dicts, lists, str, int, float, bool, None).
pub fn from_json<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_bound_py_any(py)?
            } else if let Some(u) = n.as_u64() {
                u.into_bound_py_any(py)?
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)?
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(from_json(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, from_json(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// Any serializable core value as Python objects.
pub fn to_py<'py, T: serde::Serialize>(py: Python<'py>, v: &T) -> PyResult<Bound<'py, PyAny>> {
    let j = serde_json::to_value(v).map_err(|e| PyValueError::new_err(e.to_string()))?;
    from_json(py, &j)
}

fn header_text<'a>(v: &'a Bound<'_, PyAny>, arg: &str) -> PyResult<std::borrow::Cow<'a, str>> {
    use std::borrow::Cow;
    // Borrowed for `str` (the core copies what it keeps).
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Cow::Borrowed(s.to_str()?));
    }
    // Raw header bytes are latin-1 by RFC 9110; decode byte for byte
    // (ASCII, the usual case, is borrowed as it is).
    if let Ok(b) = v.cast::<PyBytes>() {
        let bytes = b.as_bytes();
        return Ok(match std::str::from_utf8(bytes) {
            Ok(ascii) if bytes.is_ascii() => Cow::Borrowed(ascii),
            _ => Cow::Owned(bytes.iter().map(|&c| c as char).collect()),
        });
    }
    if v.is_instance_of::<PyInt>() || v.is_instance_of::<PyFloat>() {
        return Ok(Cow::Owned(v.str()?.to_str()?.to_owned()));
    }
    Err(PyTypeError::new_err(format!(
        "argument '{arg}': header names and values must be str or bytes, got {}",
        type_name(v)
    )))
}

/// Headers from a dict, an `httpx.Headers` (every value of a repeated
/// header), any mapping with `.items()`, or an iterable of pairs.
pub fn to_headers(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Headers> {
    let py = obj.py();
    let mut h = Headers::new();
    if let Ok(d) = obj.cast::<PyDict>() {
        for (k, v) in d.iter() {
            h.insert(&header_text(&k, arg)?, &header_text(&v, arg)?);
        }
        return Ok(h);
    }
    let multi = obj.hasattr(pyo3::intern!(py, "multi_items"))?;
    // httpx / httpx2 `Headers`: their raw byte pairs, as received (every
    // value of a repeated header), without decoding each to str first.
    let pairs = if multi && obj.hasattr(pyo3::intern!(py, "raw"))? {
        obj.getattr(pyo3::intern!(py, "raw"))?
    } else if multi {
        obj.call_method0(pyo3::intern!(py, "multi_items"))?
    } else if obj.hasattr(pyo3::intern!(py, "items"))? {
        obj.call_method0(pyo3::intern!(py, "items"))?
    } else if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "argument '{arg}': expected a mapping or pairs, got {}",
            type_name(obj)
        )));
    } else {
        obj.clone()
    };
    let iter = pairs.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "argument '{arg}': expected a mapping or pairs, got {}",
            type_name(obj)
        ))
    })?;
    for item in iter {
        let item = item?;
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("argument '{arg}': expected (name, value) pairs")))?;
        h.insert(&header_text(&k, arg)?, &header_text(&v, arg)?);
    }
    Ok(h)
}

/// Response body for vendor-code extraction: bytes, bytearray, memoryview or str.
pub fn body_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    if let Ok(v) = obj.extract::<Vec<u8>>() {
        return Ok(v);
    }
    Err(PyTypeError::new_err(format!(
        "argument 'body': expected bytes or str, got {}",
        type_name(obj)
    )))
}

/// `needs={"capabilities": [...], "api": "openai", "input_tokens": n,
/// "max_output_tokens": n, "data_boundary": str, "max_cost": float}`, read by
/// the core's own serde (`Needs` denies unknown keys), so every binding
/// accepts the same JSON. `None` values are absent. An unknown key or a bad
/// value is an error naming the key: a wrong type is a `TypeError`, anything
/// else (an unknown key or name, a negative count) a `ValueError`.
pub fn to_needs(obj: &Bound<'_, PyAny>) -> PyResult<Needs> {
    let not_dict = || PyTypeError::new_err(format!("argument 'needs': expected dict, got {}", type_name(obj)));
    if !(obj.is_instance_of::<PyDict>() || obj.hasattr(pyo3::intern!(obj.py(), "items"))?) {
        return Err(not_dict());
    }
    let serde_json::Value::Object(mut m) = to_json(obj, "argument 'needs': needs")? else {
        return Err(not_dict());
    };
    m.retain(|_, v| !v.is_null());
    let value = serde_json::Value::Object(m);
    Needs::deserialize(&value).map_err(|e| needs_error(&value, &e))
}

/// The error of a `needs` dict the core's serde refused, naming the key: serde
/// names an unknown key itself; for a bad value each key is read alone to find it.
#[cold]
fn needs_error(value: &serde_json::Value, e: &serde_json::Error) -> PyErr {
    let culprit = value.as_object().and_then(|m| {
        m.iter().find_map(|(k, v)| {
            let one = serde_json::Value::Object(std::iter::once((k.clone(), v.clone())).collect());
            Needs::deserialize(&one).err().map(|e| (k.clone(), e))
        })
    });
    let (msg, text) = match &culprit {
        Some((k, e)) if !e.to_string().starts_with("unknown field") => {
            (format!("argument 'needs': needs[{k:?}]: {e}"), e.to_string())
        }
        _ => (format!("argument 'needs': {e}"), e.to_string()),
    };
    if text.starts_with("invalid type") {
        PyTypeError::new_err(msg)
    } else {
        PyValueError::new_err(msg)
    }
}

/// Argument extraction with errors that name the argument in `str(exc)`
/// (PyO3 only adds a note, which Python 3.10 does not show): a wrong type
/// is a `TypeError`, an int out of range a `ValueError`.
#[inline(always)]
pub fn int_arg<'py, T>(name: &str, obj: Option<&Bound<'py, PyAny>>) -> PyResult<Option<T>>
where
    T: pyo3::conversion::FromPyObjectOwned<'py>,
{
    // The absent / None check inlines into the caller; the conversion is a call.
    match obj {
        Some(o) if !o.is_none() => int_val(name, o).map(Some),
        _ => Ok(None),
    }
}

fn int_val<'py, T>(name: &str, o: &Bound<'py, PyAny>) -> PyResult<T>
where
    T: pyo3::conversion::FromPyObjectOwned<'py>,
{
    if !o.is_instance_of::<PyInt>() || o.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "argument '{name}': expected int, got {}",
            type_name(o)
        )));
    }
    o.extract::<T>().map_err(|_| {
        PyValueError::new_err(format!(
            "argument '{name}': {} is out of range",
            o.str().map(|s| s.to_string()).unwrap_or_default()
        ))
    })
}

/// An optional duration argument in seconds (an int or a float, finite and not negative).
#[inline(always)]
pub fn secs_arg(name: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<std::time::Duration>> {
    match obj {
        Some(o) if !o.is_none() => secs_val(name, o).map(Some),
        _ => Ok(None),
    }
}

fn secs_val(name: &str, o: &Bound<'_, PyAny>) -> PyResult<std::time::Duration> {
    if o.is_instance_of::<PyBool>() || !(o.is_instance_of::<PyFloat>() || o.is_instance_of::<PyInt>()) {
        return Err(PyTypeError::new_err(format!(
            "argument '{name}': expected a number of seconds, got {}",
            type_name(o)
        )));
    }
    let s: f64 = o.extract()?;
    std::time::Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!(
            "argument '{name}': {s} is not a duration (a finite number of seconds, not negative)"
        ))
    })
}

/// An optional `str` argument.
#[inline(always)]
pub fn str_arg(name: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match obj {
        Some(o) if !o.is_none() => str_val(name, o).map(|s| Some(s.to_owned())),
        _ => Ok(None),
    }
}

/// A `str` argument, borrowed.
fn str_val<'a>(name: &str, o: &'a Bound<'_, PyAny>) -> PyResult<&'a str> {
    match o.cast::<PyString>() {
        Ok(s) => s.to_str(),
        Err(_) => Err(PyTypeError::new_err(format!(
            "argument '{name}': expected str, got {}",
            type_name(o)
        ))),
    }
}

/// An optional `bool` argument (only `True` / `False`).
#[inline(always)]
pub fn bool_arg(name: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<bool>> {
    match obj {
        Some(o) if !o.is_none() => match o.cast::<PyBool>() {
            Ok(b) => Ok(Some(b.is_true())),
            Err(_) => Err(PyTypeError::new_err(format!(
                "argument '{name}': expected bool, got {}",
                type_name(o)
            ))),
        },
        _ => Ok(None),
    }
}

/// An optional vocabulary name (`idempotency="safe"`), as the core's enum.
#[inline(always)]
pub fn name_arg<T>(name: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<T>>
where
    T: FromStr<Err = retrywise::types::UnknownName>,
{
    match obj {
        Some(o) if !o.is_none() => parse_name(name, str_val(name, o)?).map(Some),
        _ => Ok(None),
    }
}

/// A required `str` argument (`None` is a `TypeError` too).
pub fn req_str(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(name, Some(obj))?.ok_or_else(|| PyTypeError::new_err(format!("argument '{name}': expected str, got None")))
}

/// An optional `str` argument as a `SmolStr`, copied straight from the
/// Python string (inline up to 23 bytes: no allocation for usual names).
#[inline(always)]
pub fn smol_arg(name: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<SmolStr>> {
    match obj {
        Some(o) if !o.is_none() => str_val(name, o).map(|s| Some(SmolStr::new(s))),
        _ => Ok(None),
    }
}

/// A required `str` argument as a `SmolStr` (`None` is a `TypeError` too).
#[inline]
pub fn req_smol(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<SmolStr> {
    smol_arg(name, Some(obj))?.ok_or_else(|| PyTypeError::new_err(format!("argument '{name}': expected str, got None")))
}

/// The body for `report`, borrowed when it is `bytes` or `str` (the common
/// cases), copied otherwise.
pub fn body_view<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<std::borrow::Cow<'a, [u8]>> {
    use std::borrow::Cow;
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Cow::Borrowed(b.as_bytes()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Cow::Borrowed(s.to_str()?.as_bytes()));
    }
    body_bytes(obj).map(Cow::Owned)
}
