//! `idemgate wrap`: the tools of a child MCP server served as the child lists them, each call
//! through the executor — as plain data, like [`crate::tools`]; the adapter turns it into the
//! SDK's types.
//!
//! - **Listing.** Each tool exactly as the child listed it (name, title, description, input
//!   schema, annotations, icons), with these changes: the description gains one paragraph on
//!   what the tool is treated as and what a repeat does (a tool its server does not mark
//!   read-only is told it is treated as one that changes something, whose repeat replays);
//!   `outputSchema` becomes the outcome's (the structured content of every answer is the
//!   outcome; the child's own structured content is in `result`); `_meta` gains
//!   `io.idemgate/contract` naming the class the tool runs under; and an argument idemgate
//!   fills with the operation key (`operation_key_argument` there) leaves the input schema,
//!   and is dropped from the model's arguments if it sends it anyway ([`Listing::key_argument`]).
//! - **Answers.** The child's content blocks first, as it answered them (on a replay, as it
//!   answered the first time), then one text block with the sentence for the model. `isError`
//!   is set for `rejected`, `unknown`, and a stored answer the child marked `isError`.
//! - **Everything else** — resources, prompts, completion, subscriptions, the log level —
//!   goes to the child unchanged through [`Passthrough::forward`]. What the child sends the
//!   host (log messages, progress, resource updates, list changes, sampling, elicitation and
//!   roots requests) comes back through the [`Host`] the adapter attaches.
//! - **A changing tool list.** The child's tools are read again when it says they changed;
//!   wrap republishes them in a [`Listing`], which the adapter serves from then on: a tool
//!   that left the child's list is refused by name ([`Listing::gone`]).

use std::collections::{BTreeMap, BTreeSet};

use idemgate_core::contract::{Contract, EffectClass};
use idemgate_core::key::OperationKey;
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

/// The host, as `wrap` sees it: the adapter's connection to whoever launched wrap.
pub trait Host: Send + Sync + 'static {
    /// One notification for the host (`notifications/message`, `notifications/progress`,
    /// `notifications/resources/updated`, `notifications/*/list_changed`); sent in the
    /// background, never waited for.
    fn notify(&self, method: &str, params: Value);
    /// One request for the host (`sampling/createMessage`, `elicitation/create`,
    /// `roots/list`): its answer, or a JSON-RPC error when the host did not declare the
    /// capability or could not be asked.
    fn request<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, Forwarded>>;
}

/// Held while the host waits for one wrapped call; dropped when it stops waiting.
pub type Waiting = Box<dyn std::any::Any + Send + Sync>;

/// The child, as the MCP face of `wrap` sees it.
pub trait Passthrough: Send + Sync + 'static {
    /// The host is connected: the child's notifications and requests go to it from now on.
    fn attach(&self, host: std::sync::Arc<dyn Host>);
    /// The host called `tool` with `arguments`, which the executor runs as `operation` (`None`
    /// when it gets a key of its own there: a read), and asked for progress under `token`, if
    /// it gave one: the child's progress for that operation's request reaches the host under it
    /// while the result lives.
    fn expect_progress(
        &self,
        tool: &str,
        arguments: &Value,
        operation: Option<&OperationKey>,
        token: Option<Value>,
    ) -> Waiting;
    /// One notification of the host for the child (`notifications/roots/list_changed`).
    fn notify<'a>(&'a self, method: &'a str) -> BoxFuture<'a, ()>;
    /// The child's `capabilities` from its `initialize` answer.
    fn capabilities(&self) -> Value;
    /// The child's `instructions`, if it gave any.
    fn instructions(&self) -> Option<String>;
    /// One request passed to the child unchanged: `resources/list`, `resources/read`,
    /// `resources/templates/list`, `resources/subscribe`, `resources/unsubscribe`,
    /// `prompts/list`, `prompts/get`, `completion/complete`, `logging/setLevel`.
    fn forward<'a>(
        &'a self,
        method: &'a str,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, Forwarded>>;
}

/// What `idemgate wrap` hands the adapter: the child, and its tools as they are listed here.
#[derive(Clone)]
pub struct Wrap {
    pub child: std::sync::Arc<dyn Passthrough>,
    pub listing: std::sync::Arc<Listing>,
}

impl std::fmt::Debug for Wrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wrap")
            .field("tools", &self.listing.tools().len())
            .finish_non_exhaustive()
    }
}

/// The child's tools as served now, republished whenever the child's list changes. Each tool
/// is already through [`listed`], and each has its contract served by the gateway before it
/// appears here.
#[derive(Debug, Default)]
pub struct Listing {
    inner: std::sync::RwLock<Listed>,
}

#[derive(Debug, Default, Clone)]
struct Listed {
    generation: u64,
    tools: Vec<Map<String, Value>>,
    /// The argument of each tool that idemgate fills with the operation key.
    key_arguments: BTreeMap<String, String>,
    /// Tools not served now, each with the sentence a call of it is refused with.
    gone: BTreeMap<String, String>,
}

/// The tool → argument map of the tools whose listing names an `operation_key_argument`.
fn key_arguments(tools: &[Map<String, Value>]) -> BTreeMap<String, String> {
    tools
        .iter()
        .filter_map(|t| {
            let name = t.get("name")?.as_str()?;
            let argument = t
                .get("_meta")?
                .get(CONTRACT_META)?
                .get(KEY_ARGUMENT)?
                .as_str()?;
            Some((name.to_string(), argument.to_string()))
        })
        .collect()
}

impl Listing {
    pub fn new(tools: Vec<Map<String, Value>>) -> Listing {
        Listing {
            inner: std::sync::RwLock::new(Listed {
                generation: 0,
                key_arguments: key_arguments(&tools),
                tools,
                gone: BTreeMap::new(),
            }),
        }
    }

    /// The argument of `tool` that idemgate fills with the operation key, if any: the model's
    /// own value for it is dropped before the call is named or checked.
    pub fn key_argument(&self, tool: &str) -> Option<String> {
        self.read().key_arguments.get(tool).cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Listed> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Grows with every [`Listing::replace`].
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    pub fn tools(&self) -> Vec<Map<String, Value>> {
        self.read().tools.clone()
    }

    /// Why `tool` is not served, when it was once or was refused.
    pub fn gone(&self, tool: &str) -> Option<String> {
        self.read().gone.get(tool).cloned()
    }

    /// Serves `tools` from now on; `refused` names the tools left out, and why. A tool served
    /// before and in neither list left the child's list: it is refused under `removed(tool)`.
    pub fn replace(
        &self,
        tools: Vec<Map<String, Value>>,
        refused: BTreeMap<String, String>,
        removed: impl Fn(&str) -> String,
    ) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let name = |t: &Map<String, Value>| t.get("name").and_then(Value::as_str).map(String::from);
        let now: BTreeSet<String> = tools.iter().filter_map(name).collect();
        let mut gone = std::mem::take(&mut inner.gone);
        for before in inner.tools.iter().filter_map(name) {
            if !now.contains(&before) {
                gone.insert(before.clone(), removed(&before));
            }
        }
        gone.retain(|tool, _| !now.contains(tool));
        gone.extend(refused);
        inner.generation += 1;
        inner.key_arguments = key_arguments(&tools);
        inner.tools = tools;
        inner.gone = gone;
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
    match refused_names(child, tools).into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Every reason [`check_names`] would refuse the list for, in listing order: a list read
/// again after a change keeps the tools that pass and leaves out those named here.
pub fn refused_names(child: &str, tools: &[Map<String, Value>]) -> Vec<Error> {
    let mut refused = Vec::new();
    let mut seen = BTreeSet::new();
    for tool in tools {
        let Some(name) = tool.get("name").and_then(Value::as_str) else {
            refused.push(Error::Unnamed {
                child: child.into(),
            });
            continue;
        };
        if RESERVED_TOOLS.contains(&name) {
            refused.push(Error::Reserved {
                child: child.into(),
                tool: name.into(),
            });
        } else if !seen.insert(name.to_string()) {
            refused.push(Error::Duplicate {
                child: child.into(),
                tool: name.into(),
            });
        }
    }
    refused
}

impl Error {
    /// The tool the error names, if it names one.
    pub fn tool(&self) -> Option<&str> {
        match self {
            Error::Reserved { tool, .. } | Error::Duplicate { tool, .. } => Some(tool),
            Error::Unnamed { .. } => None,
        }
    }
}

/// The member of `io.idemgate/contract` naming the argument idemgate fills with the key.
pub const KEY_ARGUMENT: &str = "operation_key_argument";

/// What the tool is treated as, for the model, before what a repeat does: said outright when
/// the class comes from the absence of a hint (a tool that only reads, unmarked, would
/// otherwise answer a repeat with a stale result without the model knowing why).
fn treated_as(tool: &Map<String, Value>, class: EffectClass, key_argument: Option<&str>) -> String {
    let read_only = tool
        .get("annotations")
        .and_then(|a| a.get("readOnlyHint"))
        .and_then(Value::as_bool);
    let mut out = String::new();
    if class == EffectClass::KeyBased && read_only.is_none() {
        out.push_str(
            "idemgate treats this tool as one that changes something (key-based), since its \
server does not mark it read-only: a repeat of the same operation replays the stored answer, \
even if the tool only reads. ",
        );
    }
    if let Some(argument) = key_argument {
        out.push_str(&format!(
            "idemgate fills `{argument}` with the operation's key itself, the same on every \
retry, so the server recognises a repeat; do not send it. "
        ));
    }
    out
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

/// The listing of one child tool, as served by wrap (see the module's doc). `key_argument`:
/// the argument idemgate fills with the operation key, hidden from the input schema.
pub fn listed(
    tool: &Map<String, Value>,
    contract: &Contract,
    key_argument: Option<&str>,
) -> Map<String, Value> {
    let mut out = tool.clone();
    let ours = format!(
        "{}{}",
        treated_as(tool, contract.effect_class, key_argument),
        repeat_paragraph(contract.effect_class)
    );
    let description = match tool.get("description").and_then(Value::as_str) {
        Some(d) if !d.trim().is_empty() => format!("{}\n\n{ours}", d.trim_end()),
        _ => ours,
    };
    out.insert("description".into(), json!(description));
    if let Some(argument) = key_argument {
        let schema = out.get_mut("inputSchema").and_then(Value::as_object_mut);
        if let Some(schema) = schema {
            if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                properties.remove(argument);
            }
            if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
                required.retain(|r| r.as_str() != Some(argument));
            }
        }
    }
    out.insert("outputSchema".into(), Value::Object(outcome_schema()));
    let mut meta = match tool.get("_meta") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let mut about = json!({
        "name": contract.name,
        "version": contract.version,
        "effect_class": contract.effect_class.as_str(),
        "operation_identity": Identity::of(contract.effect_class).as_str(),
    });
    if let Some(argument) = key_argument {
        about[KEY_ARGUMENT] = json!(argument);
        about["deduplicates_by_key"] = json!(contract.deduplicates());
    }
    meta.insert(CONTRACT_META.into(), about);
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
    fn a_tool_that_leaves_the_list_is_refused_by_name_until_it_comes_back() {
        let listing = Listing::new(vec![map(json!({"name": "a"})), map(json!({"name": "b"}))]);
        assert_eq!(listing.gone("b"), None);
        let removed = |t: &str| format!("`{t}` left");
        let mut refused = BTreeMap::new();
        refused.insert("c".to_string(), "`c` collides".to_string());
        listing.replace(vec![map(json!({"name": "a"}))], refused, removed);
        assert_eq!(listing.generation(), 1);
        assert_eq!(listing.gone("b").as_deref(), Some("`b` left"));
        assert_eq!(listing.gone("c").as_deref(), Some("`c` collides"));
        assert_eq!(listing.gone("a"), None);
        // Back in the list: served again, no longer refused; what left before stays refused.
        listing.replace(
            vec![map(json!({"name": "a"})), map(json!({"name": "c"}))],
            BTreeMap::new(),
            removed,
        );
        assert_eq!(listing.gone("c"), None);
        assert_eq!(listing.gone("b").as_deref(), Some("`b` left"));
        assert_eq!(listing.tools().len(), 2);
    }

    #[test]
    fn every_colliding_name_is_reported_with_its_tool() {
        let tools = [
            map(json!({"name": "a"})),
            map(json!({"name": tools::STATUS_TOOL})),
            map(json!({"name": "a"})),
            map(json!({"name": "b"})),
        ];
        let refused = refused_names("srv", &tools);
        let named: Vec<_> = refused.iter().map(|e| e.tool()).collect();
        assert_eq!(named, [Some(tools::STATUS_TOOL), Some("a")]);
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

    fn contract(class: &str, deduplicates: bool) -> Contract {
        let text = format!(
            "name: pay\nversion: \"1\"\neffect_class: {class}\noperation_key:\n  supplied_by: application\n  scope: [tenant, workflow_id]\ninput_schema:\n  type: object\nrequest_fingerprint:\n  fields: [\"*\"]\ndownstream:\n  deduplicates_by_key: {deduplicates}\nretention:\n  record_ttl: 1d\n  tombstone_ttl: 1d\n  max_retry_window: 1d\n"
        );
        Contract::load(&text, "pay.yaml").unwrap()
    }

    #[test]
    fn a_filled_key_argument_leaves_the_schema_and_is_named_for_the_model() {
        let tool = map(json!({
            "name": "pay",
            "description": "Pays. Make a new idempotency_key for every request.",
            "inputSchema": {"type": "object",
                "properties": {"amount": {"type": "integer"}, "idempotency_key": {"type": "string"}},
                "required": ["amount", "idempotency_key"]},
        }));
        let out = listed(&tool, &contract("key_based", true), Some("idempotency_key"));
        assert_eq!(
            out["inputSchema"],
            json!({"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]})
        );
        let description = out["description"].as_str().unwrap();
        assert!(description.starts_with("Pays."), "{description}");
        assert!(
            description.contains("idemgate fills `idempotency_key` with the operation's key"),
            "{description}"
        );
        assert!(description.contains("treats this tool as one that changes something"));
        assert_eq!(
            out["_meta"][CONTRACT_META][KEY_ARGUMENT],
            json!("idempotency_key")
        );
        let listing = Listing::new(vec![out]);
        assert_eq!(
            listing.key_argument("pay").as_deref(),
            Some("idempotency_key")
        );
        assert_eq!(listing.key_argument("other"), None);
        // Without a filled argument, the schema is the child's and nothing is said about it.
        let plain = listed(&tool, &contract("key_based", false), None);
        assert_eq!(plain["inputSchema"], tool["inputSchema"]);
        assert!(
            !plain["description"]
                .as_str()
                .unwrap()
                .contains("idemgate fills")
        );
        // A tool its server marks (read-only: false) is not told it lacks the hint.
        let mut marked = tool.clone();
        marked.insert("annotations".into(), json!({"readOnlyHint": false}));
        let marked = listed(&marked, &contract("key_based", false), None);
        assert!(
            !marked["description"]
                .as_str()
                .unwrap()
                .contains("treats this tool")
        );
    }
}
