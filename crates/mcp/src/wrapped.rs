//! `idemgate wrap`: the tools of a child MCP server served as the child lists them, each call
//! through the executor — as plain data, like [`crate::tools`]; the adapter turns it into the
//! SDK's types.
//!
//! - **Listing.** Each tool exactly as the child listed it (name, title, description, input
//!   schema, annotations, icons), with three changes: the description gains one paragraph on
//!   what a repeat does, `outputSchema` becomes the outcome's (the structured content of every
//!   answer is the outcome; the child's own structured content is in `result`), and `_meta`
//!   gains `io.idemgate/contract` naming the class the tool runs under.
//! - **Answers.** The child's content blocks first, as it answered them (on a replay, as it
//!   answered the first time), then one text block with the sentence for the model. `isError`
//!   is set for `rejected`, `unknown`, and a stored answer the child marked `isError`.
//! - **Everything else** — resources, prompts, completion — goes to the child unchanged
//!   through [`Passthrough::forward`].

use std::collections::BTreeSet;

use idemgate_core::contract::{Contract, EffectClass};
use idemgate_core::outcome::{Outcome, Status};
use idemgate_core::store::BoxFuture;
use serde_json::{Map, Value, json};

use crate::tools::{self, CONTRACT_META, Identity, RESERVED_TOOLS, outcome_schema};

/// A request the child answered with an error, or could not be asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Forwarded {
    pub code: i32,
    pub message: String,
    pub data: Option<Value>,
}

/// The child, as the MCP face of `wrap` sees it.
pub trait Passthrough: Send + Sync + 'static {
    /// The child's `capabilities` from its `initialize` answer.
    fn capabilities(&self) -> Value;
    /// The child's `instructions`, if it gave any.
    fn instructions(&self) -> Option<String>;
    /// One request passed to the child unchanged: `resources/list`, `resources/read`,
    /// `resources/templates/list`, `prompts/list`, `prompts/get`, `completion/complete`.
    fn forward<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, Forwarded>>;
}

/// What `idemgate wrap` hands the adapter: the child, and its tools as they are listed here
/// (each already through [`listed`]).
#[derive(Clone)]
pub struct Wrap {
    pub child: std::sync::Arc<dyn Passthrough>,
    pub tools: Vec<Map<String, Value>>,
}

impl std::fmt::Debug for Wrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wrap")
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

/// Why the child's tools cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "tool `{tool}` of the child `{child}` has the name of idemgate's own tool; it cannot be served beside it"
    )]
    Reserved { child: String, tool: String },
    #[error("the child `{child}` lists the tool `{tool}` twice")]
    Duplicate { child: String, tool: String },
    #[error("the child `{child}` lists a tool without a name")]
    Unnamed { child: String },
}

/// Checks the child's tool names: each present, once, and none of idemgate's own.
pub fn check_names(child: &str, tools: &[Map<String, Value>]) -> Result<(), Error> {
    let mut seen = BTreeSet::new();
    for tool in tools {
        let Some(name) = tool.get("name").and_then(Value::as_str) else {
            return Err(Error::Unnamed {
                child: child.into(),
            });
        };
        if RESERVED_TOOLS.contains(&name) {
            return Err(Error::Reserved {
                child: child.into(),
                tool: name.into(),
            });
        }
        if !seen.insert(name.to_string()) {
            return Err(Error::Duplicate {
                child: child.into(),
                tool: name.into(),
            });
        }
    }
    Ok(())
}

fn repeat_paragraph(class: EffectClass) -> &'static str {
    match class {
        EffectClass::Read => {
            "idemgate: a read, passed straight through; calling again is harmless."
        }
        EffectClass::Irreversible => {
            "idemgate: each operation runs once and waits for an operator's approval first \
(`in_flight`, next_action `ask_for_approval`). Calling again for the same operation performs no \
new effect: it answers `replayed` with the stored result. `unknown`: it may have happened — do \
not call again."
        }
        _ => {
            "idemgate: each operation runs once. Calling again for the same operation performs \
no new effect: it answers `replayed` with the stored result. `in_flight`: poll \
`idemgate_operation_status`. `unknown`: it may have happened and cannot be proved — do not call \
again; an operator reconciles it."
        }
    }
}

/// The listing of one child tool, as served by wrap (see the module's doc).
pub fn listed(tool: &Map<String, Value>, contract: &Contract) -> Map<String, Value> {
    let mut out = tool.clone();
    let description = match tool.get("description").and_then(Value::as_str) {
        Some(d) if !d.trim().is_empty() => format!(
            "{}\n\n{}",
            d.trim_end(),
            repeat_paragraph(contract.effect_class)
        ),
        _ => repeat_paragraph(contract.effect_class).to_string(),
    };
    out.insert("description".into(), json!(description));
    out.insert("outputSchema".into(), Value::Object(outcome_schema()));
    let mut meta = match tool.get("_meta") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    meta.insert(
        CONTRACT_META.into(),
        json!({
            "name": contract.name,
            "version": contract.version,
            "effect_class": contract.effect_class.as_str(),
            "operation_identity": Identity::of(contract.effect_class).as_str(),
        }),
    );
    out.insert("_meta".into(), Value::Object(meta));
    out
}

/// What the adapter answers a wrapped `tools/call` with.
#[derive(Debug, Clone, PartialEq)]
pub struct WrappedReply {
    /// The outcome.
    pub structured: Value,
    /// Content blocks as JSON: the child's, then the sentence.
    pub content: Vec<Value>,
    pub is_error: bool,
}

/// The reply to a wrapped call that ended as `outcome`.
pub fn reply(tool: &str, outcome: &Outcome) -> WrappedReply {
    let child = outcome.result.as_ref().and_then(Value::as_object);
    let child_error = child
        .and_then(|r| r.get("isError"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut content: Vec<Value> = child
        .and_then(|r| r.get("content"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let settled = matches!(outcome.status, Status::Applied | Status::Replayed);
    let text = if settled && child_error {
        format!(
            "{}: {tool} answered with an error (above). The answer is recorded for this operation: \
calling again for it replays this answer and sends nothing; trying again needs a new operation.",
            outcome.status.as_str()
        )
    } else {
        tools::sentence(tool, outcome)
    };
    content.push(json!({"type": "text", "text": text}));
    let is_error = match outcome.status {
        Status::Rejected | Status::Unknown => true,
        Status::Applied | Status::Replayed => child_error,
        Status::InFlight => false,
    };
    WrappedReply {
        structured: serde_json::to_value(outcome).unwrap_or(Value::Null),
        content,
        is_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::key::OperationKey;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn names_that_collide_are_refused_with_the_child_and_the_tool() {
        let ok = [map(json!({"name": "a"})), map(json!({"name": "b"}))];
        assert_eq!(check_names("srv", &ok), Ok(()));
        let reserved = [map(json!({"name": tools::STATUS_TOOL}))];
        let err = check_names("python srv.py", &reserved).unwrap_err();
        assert!(
            err.to_string().contains("python srv.py")
                && err.to_string().contains(tools::STATUS_TOOL),
            "{err}"
        );
        let twice = [map(json!({"name": "a"})), map(json!({"name": "a"}))];
        assert!(matches!(
            check_names("s", &twice),
            Err(Error::Duplicate { .. })
        ));
    }

    #[test]
    fn a_stored_child_error_is_replayed_as_an_error_with_its_content() {
        let key = OperationKey::parse("t:e:w:s").unwrap();
        let result =
            json!({"content": [{"type": "text", "text": "no such city"}], "isError": true});
        let outcome = Outcome::replayed(key, Some("weather#1".into()), Some(result));
        let r = reply("weather", &outcome);
        assert!(r.is_error);
        assert_eq!(r.content[0]["text"], json!("no such city"));
        assert!(
            r.content[1]["text"]
                .as_str()
                .unwrap()
                .contains("replays this answer")
        );
    }
}
