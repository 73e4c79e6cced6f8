//! Contracts as MCP tool descriptions, and outcomes as MCP results — as plain data.
//!
//! Nothing here knows the MCP SDK: a [`ToolSpec`] is what the adapter turns into the SDK's
//! tool type, a [`Reply`] what it turns into a call result. Keeping the mapping pure keeps it
//! testable as a table and keeps the fast-moving SDK behind one module.
//!
//! The mapping, in one place:
//!
//! - **Name.** [`tool_name`]: the contract name with every `.` replaced by `_`
//!   (`tickets.create` ⇒ `tickets_create`). Contract names are already 1–128 characters of
//!   `A-Z a-z 0-9 . _ -`, which the MCP naming rules allow; the dot is replaced anyway because
//!   several model APIs behind MCP clients accept only `[A-Za-z0-9_-]` in function names. Two
//!   contracts that map to one name, or a contract that maps onto a tool name idemgate itself
//!   uses, are refused when the catalog is built ([`Catalog::new`]).
//! - **Description.** Purpose, use-when and do-not-use-when from the contract, then the retry
//!   semantics of its effect class ([`describe`]).
//! - **Schemas.** `inputSchema` is the contract's input schema unchanged (it never contains the
//!   operation key); `outputSchema` is the outcome shape ([`outcome_schema`]).
//! - **Annotations.** From the effect class ([`Hints::of`]); hints for clients, never trusted
//!   by idemgate.
//! - **Identity.** `_meta["io.idemgate/operation"] = {"workflow_id", "step_id"}` on the call
//!   ([`operation_from_meta`]); never the JSON-RPC id, never a model's tool-call id.
//! - **Result.** `structuredContent` is the outcome, the text is one sentence ([`sentence`]),
//!   `isError` is set for `rejected` and `unknown` ([`Reply::from_outcome`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use idemgate_core::contract::{self, Contract, EffectClass};
pub use idemgate_core::describe::{describe, describe_with};
use idemgate_core::outcome::{ALL_CODES, ErrorCode, NextAction, Outcome, Status};
use serde_json::{Map, Value, json};

/// The `_meta` member under which the agent runtime names the operation of a call.
pub const OPERATION_META: &str = "io.idemgate/operation";

/// The `_meta` member on each listed tool describing the contract behind it.
pub const CONTRACT_META: &str = "io.idemgate/contract";

/// The `_meta` member on a call result naming the identity rule that made its key (under
/// `session_window`): `{"rule": "meta" | "session_window" | "repeat_of", …}`.
pub const IDENTITY_META: &str = "io.idemgate/identity";

/// The tool that polls an operation by key.
pub const STATUS_TOOL: &str = "idemgate_operation_status";

/// Tool names idemgate reserves for itself; a contract may not map onto one.
pub const RESERVED_TOOLS: &[&str] = &[STATUS_TOOL, crate::fake::CONTROL_TOOL];

/// The longest sentence put into a result's text content. Error messages name fields, never
/// values, but a schema error can still be long; the full message stays in the outcome.
const MAX_SENTENCE: usize = 400;

/// The MCP tool name of a contract: `.` becomes `_`, everything else is kept.
pub fn tool_name(contract_name: &str) -> String {
    contract_name.replace('.', "_")
}

/// Why a catalog could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "contracts `{first}` and `{second}` both become the MCP tool `{tool}`; rename one (`.` maps to `_`)"
    )]
    NameCollision {
        tool: String,
        first: String,
        second: String,
    },
    #[error("contract `{contract}` becomes the MCP tool `{tool}`, which idemgate reserves")]
    Reserved { tool: String, contract: String },
    #[error(
        "contract `{contract}` has an input property `{}`, which the session_window identity adds to the tool's schema; rename the property or set `identity: meta` on the contract",
        crate::identity::REPEAT_OF
    )]
    RepeatOfTaken { contract: String },
}

/// Client hints from the effect class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

impl Hints {
    /// `idempotentHint` is true for the key-based classes because idemgate makes a repeated
    /// call of the same operation return the stored result; `destructiveHint` is true where the
    /// effect overwrites or cannot be taken back; every contract has a downstream, so
    /// `openWorldHint` is true.
    pub fn of(class: EffectClass) -> Hints {
        let (read_only, destructive, idempotent) = match class {
            EffectClass::Read => (true, false, true),
            // An absolute update replaces the previous value.
            EffectClass::NaturalIdempotent => (false, true, true),
            // Creates something new; repeats of one operation replay.
            EffectClass::KeyBased => (false, false, true),
            EffectClass::Irreversible => (false, true, true),
            // Refused when a contract is loaded; described honestly should one ever appear.
            EffectClass::NonIdempotent => (false, true, false),
        };
        Hints {
            read_only,
            destructive,
            idempotent,
            open_world: true,
        }
    }
}

/// Whether a call needs the operation identity in `_meta`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// Key-based and irreversible tools: a call without it is rejected.
    Required,
    /// Natural-idempotent tools: with it the call is recorded under its key, without it the
    /// call runs unrecorded (repeating it is harmless by the contract's declaration).
    Optional,
    /// Reads: ignored.
    Ignored,
}

impl Identity {
    pub fn of(class: EffectClass) -> Identity {
        match class {
            EffectClass::KeyBased | EffectClass::Irreversible | EffectClass::NonIdempotent => {
                Identity::Required
            }
            EffectClass::NaturalIdempotent => Identity::Optional,
            EffectClass::Read => Identity::Ignored,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Identity::Required => "required",
            Identity::Optional => "optional",
            Identity::Ignored => "ignored",
        }
    }
}

/// One MCP tool as data.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The contract behind it; `None` for idemgate's own tools.
    pub contract: Option<String>,
    pub title: String,
    pub description: String,
    pub input_schema: Map<String, Value>,
    pub output_schema: Option<Map<String, Value>>,
    pub hints: Hints,
    pub meta: Option<Map<String, Value>>,
    /// How a call without `_meta` is named: `session_window` only for tools that need a key
    /// and are served under that rule; `meta` otherwise.
    pub identity: contract::Identity,
}

impl ToolSpec {
    /// The tool of a contract under the `meta` identity rule.
    pub fn from_contract(contract: &Contract) -> ToolSpec {
        ToolSpec::from_contract_with(contract, contract::Identity::Meta)
    }

    /// The tool of a contract served with `server` as the server's identity rule (the
    /// contract's own `identity`, when written, wins). Under `session_window` the input schema
    /// gains the optional `repeat_of` property, and the description says what a repeat means.
    pub fn from_contract_with(contract: &Contract, server: contract::Identity) -> ToolSpec {
        let mut input_schema = match &contract.input_schema {
            Value::Object(schema) => schema.clone(),
            // A contract's schema is an object schema; anything else would not load. An empty
            // object schema is the honest fallback rather than a panic.
            _ => Map::from_iter([("type".to_string(), json!("object"))]),
        };
        let needs = Identity::of(contract.effect_class);
        let identity = match crate::identity::effective(contract.identity(), server) {
            // Only a tool that needs a key has one derived; the others run as before.
            windowed @ contract::Identity::SessionWindow(_) if needs == Identity::Required => {
                windowed
            }
            _ => contract::Identity::Meta,
        };
        let mut contract_meta = json!({
            "name": contract.name,
            "version": contract.version,
            "effect_class": contract.effect_class.as_str(),
            "operation_identity": needs.as_str(),
            "identity_rule": "meta",
        });
        if let contract::Identity::SessionWindow(window) = identity {
            add_repeat_of(&mut input_schema);
            contract_meta["identity_rule"] = json!("session_window");
            contract_meta["identity_window_seconds"] = json!(window.seconds());
        }
        let meta = json!({ CONTRACT_META: contract_meta });
        ToolSpec {
            name: tool_name(&contract.name),
            contract: Some(contract.name.clone()),
            title: contract.name.clone(),
            description: describe_with(contract, identity),
            input_schema,
            output_schema: Some(outcome_schema()),
            hints: Hints::of(contract.effect_class),
            meta: meta.as_object().cloned(),
            identity,
        }
    }

    /// The status tool: polls an operation by its key, within the caller's tenant.
    pub fn status() -> ToolSpec {
        let input = json!({
            "type": "object",
            "properties": {
                "operation_key": {
                    "type": "string",
                    "minLength": 7,
                    "maxLength": 255,
                    "description": "The operation_key of an earlier outcome (tenant:environment:workflow_id:step_id)."
                }
            },
            "required": ["operation_key"],
            "additionalProperties": false
        });
        ToolSpec {
            name: STATUS_TOOL.to_string(),
            contract: None,
            title: "operation status".to_string(),
            description: "Reads where an operation stands, by the operation_key of an earlier outcome. \
Use it to poll an operation that answered `in_flight` (a running job, another worker, a pending approval) \
instead of calling its tool again. Answers the same outcome shape as the tools: `replayed` with the stored \
result once it is done, `in_flight` while it runs, `unknown` when it needs reconciliation by an operator. \
An operation of another tenant, or one that does not exist, answers `rejected` with `not_found`. \
Reading a status never performs an effect."
                .to_string(),
            input_schema: input.as_object().cloned().unwrap_or_default(),
            output_schema: Some(outcome_schema()),
            hints: Hints {
                read_only: true,
                destructive: false,
                idempotent: true,
                // It reads idemgate's own records (and may poll a job the record names).
                open_world: false,
            },
            meta: None,
            identity: contract::Identity::Meta,
        }
    }
}

/// The optional `repeat_of` property of a tool under `session_window`. Not material: the
/// adapter takes it out of the arguments before they are validated and fingerprinted.
pub(crate) fn add_repeat_of(schema: &mut Map<String, Value>) {
    let property = json!({
        "type": "string",
        "minLength": 7,
        "maxLength": idemgate_core::key::MAX_KEY_BYTES,
        "description": "Leave this out, also when you retry or re-send a call. Set it only when the user \
    wants the same thing done once more on purpose: then it is the operation_key that the earlier answer \
    of this tool returned, and a new operation runs."
    });
    let properties = schema
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(properties) = properties {
        properties.insert(crate::identity::REPEAT_OF.to_string(), property);
    }
}

fn status_name(status: Status) -> &'static str {
    // Exhaustive on purpose: a new status must be added to the output schema.
    match status {
        Status::Applied => Status::Applied.as_str(),
        Status::Replayed => Status::Replayed.as_str(),
        Status::InFlight => Status::InFlight.as_str(),
        Status::Rejected => Status::Rejected.as_str(),
        Status::Unknown => Status::Unknown.as_str(),
    }
}

const ALL_STATUSES: [Status; 5] = [
    Status::Applied,
    Status::Replayed,
    Status::InFlight,
    Status::Rejected,
    Status::Unknown,
];

const ALL_NEXT: [NextAction; 5] = [
    NextAction::None,
    NextAction::Poll,
    NextAction::Reconcile,
    NextAction::AskForApproval,
    NextAction::InspectOperation,
];

/// The JSON Schema of [`Outcome`]: every member always present, `null` where it does not apply.
pub fn outcome_schema() -> Map<String, Value> {
    let statuses: Vec<&str> = ALL_STATUSES.iter().map(|s| status_name(*s)).collect();
    let next: Vec<&str> = ALL_NEXT.iter().map(|n| n.as_str()).collect();
    let codes: Vec<&str> = ALL_CODES.iter().map(|c| c.as_str()).collect();
    let schema = json!({
        "type": "object",
        "title": "idemgate outcome",
        "properties": {
            "status": {
                "type": "string",
                "enum": statuses,
                "description": "applied: this call performed the effect. replayed: done earlier, stored result, no new effect. in_flight: still running or awaiting approval; poll. rejected: this call did nothing; safe_to_repeat says whether the operation may be tried again. unknown: may have happened, cannot be proved; do not call again."
            },
            "operation_key": {"type": ["string", "null"]},
            "effect_reference": {
                "type": ["string", "null"],
                "description": "The system of record's reference for the effect (ticket id, message id, job id)."
            },
            "safe_to_repeat": {
                "type": "boolean",
                "description": "Whether this business action may be attempted again without risking a second effect."
            },
            "next_action": {"type": "string", "enum": next},
            "retry_after_seconds": {"type": ["integer", "null"], "minimum": 0},
            "result": {"description": "The replay-safe result of the effect, or null."},
            "error": {
                "anyOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "properties": {
                            "code": {"type": "string", "enum": codes},
                            "message": {"type": "string"}
                        },
                        "required": ["code", "message"]
                    }
                ]
            }
        },
        "required": [
            "status", "operation_key", "effect_reference", "safe_to_repeat",
            "next_action", "retry_after_seconds", "result", "error"
        ]
    });
    schema.as_object().cloned().unwrap_or_default()
}

/// What the adapter answers a `tools/call` with.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub structured: Value,
    pub text: String,
    pub is_error: bool,
}

impl Reply {
    /// `isError` for `rejected` and `unknown`: the call did not do what was asked, or may have.
    pub fn from_outcome(tool: &str, outcome: &Outcome) -> Reply {
        let is_error = match outcome.status {
            Status::Rejected | Status::Unknown => true,
            Status::Applied | Status::Replayed | Status::InFlight => false,
        };
        Reply {
            structured: serde_json::to_value(outcome).unwrap_or(Value::Null),
            text: sentence(tool, outcome),
            is_error,
        }
    }
}

/// One short sentence that a model reads correctly: the status first, then what to do.
pub fn sentence(tool: &str, outcome: &Outcome) -> String {
    let key = outcome
        .operation_key
        .as_ref()
        .map(|k| k.as_str().to_string())
        .unwrap_or_default();
    let reference = outcome
        .effect_reference
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let text = match outcome.status {
        Status::Applied if outcome.safe_to_repeat() => {
            format!("applied: {tool} answered{reference}; calling it again is harmless.")
        }
        Status::Applied => format!(
            "applied: {tool} took effect for this step{reference}; do not call it again for this step."
        ),
        Status::Replayed => match &outcome.effect_reference {
            Some(r) => format!(
                "replayed: {r} was already done for this step; no new effect, do not call again."
            ),
            None => "replayed: this step was already done; no new effect, do not call again."
                .to_string(),
        },
        Status::InFlight => match outcome.next_action {
            NextAction::AskForApproval => format!(
                "in_flight: operation {key} awaits an operator's approval; do not call again, poll {STATUS_TOOL} later."
            ),
            _ if outcome.safe_to_repeat() => format!(
                "in_flight: {tool} accepted the request{reference}; check again in {} s.",
                outcome.retry_after_seconds.unwrap_or(1)
            ),
            _ => format!(
                "in_flight: operation {key} is still running; do not call again, poll {STATUS_TOOL} with this operation_key in {} s.",
                outcome.retry_after_seconds.unwrap_or(1)
            ),
        },
        Status::Unknown if outcome.safe_to_repeat() => {
            format!("unknown: {tool} gave no clear answer; calling it again is harmless.")
        }
        Status::Unknown => format!(
            "unknown: operation {key} may have taken effect and cannot be proved; do not call again, an operator must reconcile it."
        ),
        Status::Rejected => rejected_sentence(outcome),
    };
    truncate(text)
}

fn rejected_sentence(outcome: &Outcome) -> String {
    let (code, message) = match &outcome.error {
        Some(e) => (e.code, e.message.as_str()),
        None => (ErrorCode::InternalError, ""),
    };
    let code_name = code.as_str();
    // The text follows the structured answer: "nothing happened" only where `safe_to_repeat`
    // proved it; otherwise this call did nothing, but the operation may have had its effect.
    const MAYBE: &str = "this call did nothing, but the operation may already have had its effect";
    if code == ErrorCode::MissingOperationKey {
        let what = if outcome.safe_to_repeat() {
            "nothing happened"
        } else {
            MAYBE
        };
        return format!(
            "rejected ({code_name}): {what}; this tool needs the operation identity from the application running you (_meta \"{OPERATION_META}\" with workflow_id and step_id), which you cannot supply — tell the user."
        );
    }
    if code == ErrorCode::NotFound {
        return format!("rejected ({code_name}): no such operation for this caller.");
    }
    let (what, then) = if outcome.safe_to_repeat() {
        let then = match (outcome.retry_after_seconds, outcome.next_action) {
            (Some(s), _) => format!(" Try again in {s} s."),
            (None, NextAction::InspectOperation) => {
                " Inspect the operation before trying anything else.".to_string()
            }
            (None, NextAction::AskForApproval) => " Ask a person for approval.".to_string(),
            _ => String::new(),
        };
        ("nothing happened", then)
    } else {
        let then = match (outcome.retry_after_seconds, outcome.next_action) {
            (Some(s), _) => format!(
                " Only the same call for the same operation may be tried again, in {s} s; do not start it anew."
            ),
            (None, NextAction::AskForApproval) => " Ask a person for approval.".to_string(),
            _ => " Do not repeat it as a new operation; inspect the operation first.".to_string(),
        };
        (MAYBE, then)
    };
    let message = message.trim_end_matches('.');
    if message.is_empty() {
        format!("rejected ({code_name}): {what}.{then}")
    } else {
        format!("rejected ({code_name}): {what}; {message}.{then}")
    }
}

fn truncate(mut text: String) -> String {
    if text.len() > MAX_SENTENCE {
        let mut cut = MAX_SENTENCE - 1;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// A `_meta` operation identity that is present but malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("_meta \"{OPERATION_META}\" {0}")]
pub struct MetaError(String);

impl MetaError {
    /// The answer to a call carrying it: `rejected` / `invalid_operation_key`, nothing written.
    pub fn outcome(&self) -> Outcome {
        // A malformed identity names no operation: nothing can have run under it.
        Outcome::refused(
            idemgate_core::outcome::Repeatable::unnamed(),
            ErrorCode::InvalidOperationKey,
            self.to_string(),
        )
    }
}

/// The operation identity the agent runtime passed in `_meta`: `(workflow_id, step_id)`.
///
/// Absent ⇒ `(None, None)`; the executor then rejects a key-based call with
/// `missing_operation_key`. Present but malformed ⇒ [`MetaError`], so a runtime bug is not
/// mistaken for a missing identity.
pub fn operation_from_meta(
    meta: Option<&Map<String, Value>>,
) -> Result<(Option<String>, Option<String>), MetaError> {
    let Some(value) = meta.and_then(|m| m.get(OPERATION_META)) else {
        return Ok((None, None));
    };
    let Value::Object(fields) = value else {
        return Err(MetaError(
            "must be an object with string members workflow_id and step_id".into(),
        ));
    };
    let part = |name: &str| match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(MetaError(format!("member {name} must be a string"))),
    };
    Ok((part("workflow_id")?, part("step_id")?))
}

/// The tools one server offers: idemgate's status tool, then one per contract, by MCP name.
#[derive(Debug, Clone)]
pub struct Catalog {
    specs: BTreeMap<String, ToolSpec>,
    order: Vec<String>,
}

impl Catalog {
    /// Maps every contract to its tool under the `meta` identity rule and refuses ambiguous
    /// names.
    pub fn new(contracts: &[Arc<Contract>]) -> Result<Catalog, Error> {
        Catalog::with_identity(contracts, contract::Identity::Meta)
    }

    /// [`Catalog::new`] with `identity` as the server's identity rule.
    pub fn with_identity(
        contracts: &[Arc<Contract>],
        identity: contract::Identity,
    ) -> Result<Catalog, Error> {
        let mut specs = BTreeMap::new();
        let mut order = Vec::new();
        let status = ToolSpec::status();
        order.push(status.name.clone());
        specs.insert(status.name.clone(), status);
        for contract in contracts {
            let spec = ToolSpec::from_contract_with(contract, identity);
            if spec.identity != contract::Identity::Meta
                && contract
                    .input_schema
                    .get("properties")
                    .and_then(|p| p.get(crate::identity::REPEAT_OF))
                    .is_some()
            {
                return Err(Error::RepeatOfTaken {
                    contract: contract.name.clone(),
                });
            }
            if RESERVED_TOOLS.contains(&spec.name.as_str()) {
                return Err(Error::Reserved {
                    tool: spec.name,
                    contract: contract.name.clone(),
                });
            }
            if let Some(existing) = specs.get(&spec.name) {
                return Err(Error::NameCollision {
                    tool: spec.name.clone(),
                    first: existing.contract.clone().unwrap_or_default(),
                    second: contract.name.clone(),
                });
            }
            order.push(spec.name.clone());
            specs.insert(spec.name.clone(), spec);
        }
        Ok(Catalog { specs, order })
    }

    /// Every tool, the status tool first, then contracts in the order given.
    pub fn tools(&self) -> impl Iterator<Item = &ToolSpec> {
        self.order.iter().filter_map(|n| self.specs.get(n))
    }

    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.specs.get(name)
    }
}

// ---------------------------------------------------------------------------------------------
// `idemgate wrap`: a child's tools, listed by the child (see `crate::wrapped`).

impl Catalog {
    /// The status tool, then one entry per child tool, each routed to the contract of the
    /// same name. The listing itself is the child's; these entries only route calls.
    pub fn wrapped(
        names: &[String],
        contracts: &BTreeMap<String, Arc<Contract>>,
        server: contract::Identity,
    ) -> Result<Catalog, Error> {
        let mut specs = BTreeMap::new();
        let status = ToolSpec::status();
        let mut order = vec![status.name.clone()];
        specs.insert(status.name.clone(), status);
        for name in names {
            if RESERVED_TOOLS.contains(&name.as_str()) {
                return Err(Error::Reserved {
                    tool: name.clone(),
                    contract: name.clone(),
                });
            }
            if specs.contains_key(name) {
                return Err(Error::NameCollision {
                    tool: name.clone(),
                    first: name.clone(),
                    second: name.clone(),
                });
            }
            let spec = ToolSpec {
                name: name.clone(),
                contract: Some(name.clone()),
                title: name.clone(),
                description: String::new(),
                input_schema: Map::new(),
                output_schema: None,
                hints: Hints::of(EffectClass::KeyBased),
                meta: None,
                // As for a contract's tool: only a tool that needs a key has one derived.
                identity: match contracts.get(name) {
                    Some(c) if Identity::of(c.effect_class) == Identity::Required => {
                        crate::identity::effective(c.identity(), server)
                    }
                    _ => contract::Identity::Meta,
                },
            };
            order.push(name.clone());
            specs.insert(name.clone(), spec);
        }
        Ok(Catalog { specs, order })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::key::OperationKey;
    use idemgate_core::outcome::Repeatable;

    fn contract(yaml: &str) -> Arc<Contract> {
        Arc::new(Contract::load(yaml, "test.yaml").expect("contract loads"))
    }

    fn contract_named(name: &str, class: &str) -> Arc<Contract> {
        let keyed = matches!(class, "key_based" | "irreversible");
        let fp = if class == "read" {
            ""
        } else {
            "request_fingerprint:\n  fields: [a]\n"
        };
        let key = if keyed || class == "natural_idempotent" {
            "operation_key:\n  supplied_by: application\n  scope: [tenant, environment, workflow_id, step_id]\n"
        } else {
            ""
        };
        contract(&format!(
            "name: {name}\nversion: \"1\"\npurpose: Do one thing.\nuse_when: [\"it is needed\"]\n\
do_not_use_when: [\"it is not\"]\neffect_class: {class}\n{key}input_schema:\n  type: object\n  \
properties:\n    a: {{type: string}}\n  additionalProperties: false\n{fp}\
retention:\n  record_ttl: 1d\n  tombstone_ttl: 2d\n  max_retry_window: 1d\n"
        ))
    }

    #[test]
    fn names_map_dots_to_underscores_and_nothing_else() {
        for (contract, tool) in [
            ("tickets.create", "tickets_create"),
            ("tickets.set_status", "tickets_set_status"),
            ("a-b_c.D.e", "a-b_c_D_e"),
            ("plain", "plain"),
        ] {
            assert_eq!(tool_name(contract), tool, "{contract}");
        }
    }

    #[test]
    fn colliding_and_reserved_names_are_refused() {
        let a = contract_named("x.y", "key_based");
        let b = contract_named("x_y", "key_based");
        let err = Catalog::new(&[a, b]).unwrap_err();
        assert_eq!(
            err,
            Error::NameCollision {
                tool: "x_y".into(),
                first: "x.y".into(),
                second: "x_y".into()
            }
        );
        let reserved = contract_named("idemgate.operation_status", "read");
        assert!(matches!(
            Catalog::new(&[reserved]).unwrap_err(),
            Error::Reserved { .. }
        ));
    }

    #[test]
    fn hints_follow_the_effect_class() {
        let check = |class, read_only, destructive, idempotent| {
            let h = Hints::of(class);
            assert_eq!(
                (h.read_only, h.destructive, h.idempotent, h.open_world),
                (read_only, destructive, idempotent, true),
                "{class:?}"
            );
        };
        check(EffectClass::Read, true, false, true);
        check(EffectClass::NaturalIdempotent, false, true, true);
        check(EffectClass::KeyBased, false, false, true);
        check(EffectClass::Irreversible, false, true, true);
        check(EffectClass::NonIdempotent, false, true, false);
    }

    #[test]
    fn description_has_purpose_lists_and_retry_semantics() {
        let c = contract_named("tickets.create", "key_based");
        let d = describe(&c);
        assert!(d.starts_with("Do one thing."), "{d}");
        assert!(d.contains("Use when:\n- it is needed"), "{d}");
        assert!(d.contains("Do not use when:\n- it is not"), "{d}");
        assert!(d.contains("`replayed`"), "{d}");
        assert!(d.contains("idemgate_operation_status"), "{d}");
        assert!(d.contains("`unknown`: it may have happened"), "{d}");
    }

    #[test]
    fn the_input_schema_is_the_contracts_and_has_no_key() {
        let c = contract_named("tickets.create", "key_based");
        let spec = ToolSpec::from_contract(&c);
        assert_eq!(Value::Object(spec.input_schema.clone()), c.input_schema);
        let text = Value::Object(spec.input_schema).to_string();
        for forbidden in ["workflow_id", "step_id", "operation_key", "idempotency"] {
            assert!(!text.contains(forbidden), "{forbidden} in {text}");
        }
        let meta = Value::Object(spec.meta.unwrap());
        assert_eq!(
            meta[CONTRACT_META]["operation_identity"],
            json!("required"),
            "{meta}"
        );
    }

    /// The contract's own `identity` wins over the server's; only tools that need a key get a
    /// derived one and the `repeat_of` property; a contract whose schema has `repeat_of` is
    /// refused under `session_window`.
    #[test]
    fn the_identity_rule_is_the_contracts_else_the_servers() {
        use idemgate_core::contract::Identity as Rule;
        use idemgate_core::duration::Span;
        let with = |class: &str, identity: Option<&str>| {
            let base = contract_named("t.x", class);
            let mut text = serde_json::to_value(&base.file).unwrap();
            if let Some(identity) = identity {
                text["identity"] = json!(identity);
            }
            let yaml = serde_json::to_string(&text).unwrap();
            Arc::new(Contract::load(&yaml, "t.yaml").expect("loads"))
        };
        let window = Rule::SessionWindow(Span(600));
        for (class, own, server, expect) in [
            ("key_based", None, Rule::Meta, Rule::Meta),
            ("key_based", None, window, window),
            (
                "key_based",
                Some("session_window:90s"),
                Rule::Meta,
                Rule::SessionWindow(Span(90)),
            ),
            ("key_based", Some("meta"), window, Rule::Meta),
            ("irreversible", None, window, window),
            ("read", None, window, Rule::Meta),
            ("natural_idempotent", None, window, Rule::Meta),
        ] {
            let spec = ToolSpec::from_contract_with(&with(class, own), server);
            assert_eq!(spec.identity, expect, "{class} {own:?} under {server}");
            let offered = spec.input_schema["properties"]
                .get(crate::identity::REPEAT_OF)
                .is_some();
            assert_eq!(
                offered,
                expect != Rule::Meta,
                "{class} {own:?} under {server}"
            );
        }
        let taken = contract(
            "name: t.y\nversion: \"1\"\neffect_class: key_based\ninput_schema:\n  type: object\n  \
properties:\n    repeat_of: {type: string}\nrequest_fingerprint:\n  fields: [repeat_of]\n\
retention:\n  record_ttl: 1d\n  tombstone_ttl: 2d\n  max_retry_window: 1d\n",
        );
        assert!(Catalog::with_identity(std::slice::from_ref(&taken), Rule::Meta).is_ok());
        assert_eq!(
            Catalog::with_identity(&[taken], window).unwrap_err(),
            Error::RepeatOfTaken {
                contract: "t.y".into()
            }
        );
    }

    fn key() -> OperationKey {
        OperationKey::parse("acme:prod:run_827:step_03").unwrap()
    }

    /// Every outcome the executor can produce validates against the advertised output schema.
    #[test]
    fn outcomes_validate_against_the_output_schema() {
        let schema = Value::Object(outcome_schema());
        let validator = jsonschema::validator_for(&schema).unwrap();
        let mut outcomes = vec![
            Outcome::applied(key(), "ticket_1".into(), json!({"ticket_id": "ticket_1"})),
            Outcome::replayed(key(), Some("ticket_1".into()), None),
            Outcome::in_flight(key(), NextAction::Poll, 2),
            Outcome::in_flight(key(), NextAction::AskForApproval, 30),
            Outcome::unknown(key(), "connection reset"),
        ];
        for code in ALL_CODES {
            outcomes.push(Outcome::rejected(Some(key()), *code, "m"));
            outcomes.push(Outcome::rejected(None, *code, "m"));
        }
        for o in outcomes {
            let v = serde_json::to_value(&o).unwrap();
            assert!(validator.is_valid(&v), "{v}");
        }
        assert!(!validator.is_valid(&json!({"status": "applied"})));
    }

    fn check(outcome: Outcome, expect: &str, is_error: bool) {
        let reply = Reply::from_outcome("tickets_create", &outcome);
        assert_eq!(reply.text, expect);
        assert_eq!(reply.is_error, is_error, "{expect}");
        assert_eq!(reply.structured, serde_json::to_value(&outcome).unwrap());
    }

    #[test]
    fn sentences_say_what_happened_and_what_to_do() {
        check(
            Outcome::applied(key(), "ticket_1042".into(), json!({})),
            "applied: tickets_create took effect for this step (ticket_1042); do not call it again for this step.",
            false,
        );
        check(
            Outcome::replayed(key(), Some("ticket_1042".into()), None),
            "replayed: ticket_1042 was already done for this step; no new effect, do not call again.",
            false,
        );
        check(
            Outcome::in_flight(key(), NextAction::Poll, 2),
            "in_flight: operation acme:prod:run_827:step_03 is still running; do not call again, poll idemgate_operation_status with this operation_key in 2 s.",
            false,
        );
        check(
            Outcome::in_flight(key(), NextAction::AskForApproval, 30),
            "in_flight: operation acme:prod:run_827:step_03 awaits an operator's approval; do not call again, poll idemgate_operation_status later.",
            false,
        );
        check(
            Outcome::unknown(key(), "reset"),
            "unknown: operation acme:prod:run_827:step_03 may have taken effect and cannot be proved; do not call again, an operator must reconcile it.",
            true,
        );
        // A rejection's text follows `safe_to_repeat`: "nothing happened" only where proved.
        check(
            Outcome::rejected(
                Some(key()),
                ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
                "this operation was claimed for a different request.",
            ),
            "rejected (idempotency_key_reused_with_different_request): this call did nothing, but the operation may already have had its effect; this operation was claimed for a different request. Do not repeat it as a new operation; inspect the operation first.",
            true,
        );
        check(
            Outcome::rejected(None, ErrorCode::StoreUnavailable, "the store is down"),
            "rejected (store_unavailable): this call did nothing, but the operation may already have had its effect; the store is down. Only the same call for the same operation may be tried again, in 1 s; do not start it anew.",
            true,
        );
        check(
            Outcome::refused(
                Repeatable::unnamed(),
                ErrorCode::StoreUnavailable,
                "the store is down",
            ),
            "rejected (store_unavailable): nothing happened; the store is down. Try again in 1 s.",
            true,
        );
        check(
            Outcome::refused(
                Repeatable::unnamed(),
                ErrorCode::InvalidArguments,
                "subject is required",
            ),
            "rejected (invalid_arguments): nothing happened; subject is required.",
            true,
        );
        check(
            Outcome::refused(Repeatable::unnamed(), ErrorCode::MissingOperationKey, "x"),
            "rejected (missing_operation_key): nothing happened; this tool needs the operation identity from the application running you (_meta \"io.idemgate/operation\" with workflow_id and step_id), which you cannot supply — tell the user.",
            true,
        );
    }

    #[test]
    fn long_messages_are_cut_in_the_sentence_only() {
        let long = "x".repeat(2000);
        let o = Outcome::rejected(None, ErrorCode::InvalidArguments, long.clone());
        let reply = Reply::from_outcome("t", &o);
        assert!(reply.text.chars().count() <= MAX_SENTENCE, "{}", reply.text);
        assert_eq!(reply.structured["error"]["message"], json!(long));
    }

    #[test]
    fn operation_identity_comes_from_meta_only() {
        let meta = |v: Value| v.as_object().cloned().unwrap();
        assert_eq!(operation_from_meta(None), Ok((None, None)));
        assert_eq!(
            operation_from_meta(Some(&meta(json!({"progressToken": 1})))),
            Ok((None, None))
        );
        assert_eq!(
            operation_from_meta(Some(&meta(json!({
                OPERATION_META: {"workflow_id": "run_1", "step_id": "s1"}
            })))),
            Ok((Some("run_1".into()), Some("s1".into())))
        );
        for bad in [
            json!({OPERATION_META: "run_1:s1"}),
            json!({OPERATION_META: {"workflow_id": 7, "step_id": "s1"}}),
        ] {
            let err = operation_from_meta(Some(&meta(bad.clone()))).unwrap_err();
            assert_eq!(
                err.outcome().error_code(),
                Some(ErrorCode::InvalidOperationKey),
                "{bad}"
            );
        }
    }
}
