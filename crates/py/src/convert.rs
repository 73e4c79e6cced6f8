//! Values across the boundary, converted once at the edge: Python objects to JSON values for the
//! engine ([`to_json`], which names the place of a value it refuses, never the value), and JSON
//! values back to Python objects for a tool's function and for the caller ([`to_py`]).

use idemgate_core::json::MAX_SAFE_INTEGER;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// The deepest nesting accepted, as the gateway accepts in a request body.
const MAX_DEPTH: usize = idemgate_core::json::DEFAULT_MAX_DEPTH;

/// A value that is not JSON the engine can fingerprint: where it is (`amount`,
/// `items[2].sku`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJson {
    pub at: String,
    pub problem: String,
}

impl std::fmt::Display for NotJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` {}", self.at, self.problem)
    }
}

/// A Python value as JSON: `None`, `bool`, `int` (within ±2^53, past which two integers would
/// share a fingerprint), finite `float`, `str`, `list` and `tuple`, and `dict` with `str` keys.
/// `at` names the value in errors.
pub fn to_json(value: &Bound<'_, PyAny>, at: &str) -> Result<Value, NotJson> {
    let mut path = at.to_string();
    convert(value, &mut path, 0)
}

fn refuse(path: &str, problem: impl Into<String>) -> NotJson {
    NotJson {
        at: path.to_string(),
        problem: problem.into(),
    }
}

fn convert(value: &Bound<'_, PyAny>, path: &mut String, depth: usize) -> Result<Value, NotJson> {
    if value.is_none() {
        return Ok(Value::Null);
    }
    // `bool` first: it is a subclass of `int`.
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(s) = value.cast::<PyString>() {
        let text = s
            .to_str()
            .map_err(|_| refuse(path, "is a string that is not valid Unicode"))?;
        return Ok(Value::String(text.to_string()));
    }
    if value.cast::<PyInt>().is_ok() {
        let beyond = || {
            refuse(
                path,
                "is an integer beyond ±2^53, where two integers would share one fingerprint; \
                 send it as a string",
            )
        };
        let n: i64 = value.extract().map_err(|_| beyond())?;
        if n.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(beyond());
        }
        return Ok(Value::Number(Number::from(n)));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| refuse(path, "is a float that is not finite (NaN or infinity)"));
    }
    if depth >= MAX_DEPTH {
        return Err(refuse(
            path,
            format!("nests deeper than {MAX_DEPTH} levels of lists and dicts"),
        ));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut members = Map::new();
        for (key, item) in dict.iter() {
            let name = key.cast::<PyString>().ok().and_then(|k| k.to_str().ok());
            let Some(name) = name else {
                return Err(refuse(
                    path,
                    format!(
                        "has a key of type {} (JSON object keys are strings)",
                        type_name(&key)
                    ),
                ));
            };
            let name = name.to_string();
            let mark = path.len();
            path.push('.');
            path.push_str(&name);
            let converted = convert(&item, path, depth + 1)?;
            path.truncate(mark);
            members.insert(name, converted);
        }
        return Ok(Value::Object(members));
    }
    let items: Vec<Bound<'_, PyAny>> = if let Ok(list) = value.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = value.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(refuse(
            path,
            format!(
                "is of type {}, which is not JSON (use None, bool, int, float, str, list, tuple or dict)",
                type_name(value)
            ),
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let mark = path.len();
        path.push_str(&format!("[{i}]"));
        out.push(convert(item, path, depth + 1)?);
        path.truncate(mark);
    }
    Ok(Value::Array(out))
}

/// The name of a value's type, for messages (never the value).
pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// A JSON value as Python objects: `dict`, `list`, `str`, `int`, `float`, `bool`, `None`.
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            (None, None) => PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(members) => {
            let dict = PyDict::new(py);
            for (name, item) in members {
                dict.set_item(name, to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}
