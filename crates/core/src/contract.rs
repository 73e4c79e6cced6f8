//! Tool contracts: versioned YAML files, each the design review of one tool.
//!
//! Loading has two steps. [`ContractFile::parse`] reads the YAML strictly (unknown fields are
//! errors naming file, line and field); the linter works on this form, so it can report a
//! contract that would not load. [`Contract::from_file`] then checks meaning, compiles the
//! input schema, and refuses what the executor cannot run safely (a `non_idempotent` class).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::canonical::{self, Canonical, Material};
use crate::duration::Span;
use crate::fingerprint::Fingerprint;
use crate::json;

/// The classes of effect, each with its own retry design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectClass {
    /// No claim, never recorded as an effect; authorization still applies.
    Read,
    /// Repeating the same target and value is harmless; an optional key; a version
    /// precondition passes through to the downstream.
    NaturalIdempotent,
    /// The full machinery: key, fingerprint, durable claim, replayable receipt.
    KeyBased,
    /// Refused at load: redesign as a keyed command or an absolute update.
    NonIdempotent,
    /// Key-based, with approval required unless the contract says otherwise.
    Irreversible,
}

impl EffectClass {
    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::Read => "read",
            EffectClass::NaturalIdempotent => "natural_idempotent",
            EffectClass::KeyBased => "key_based",
            EffectClass::NonIdempotent => "non_idempotent",
            EffectClass::Irreversible => "irreversible",
        }
    }
}

/// What happens to a delivery that arrives after its record was compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LateArrival {
    /// `rejected` / `expired_operation`: a new operation needs new intent.
    #[default]
    Reject,
    /// Replay the reference only (the body was dropped at compaction).
    Tombstone,
    /// `unknown`: hand it to reconciliation.
    Reconcile,
}

/// Per-field normalisations applied before canonicalisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalization {
    Trim,
    Lowercase,
    Uppercase,
    CollapseWhitespace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRule {
    /// No approval.
    Never,
    /// Every operation waits for an operator.
    Always,
    /// Operations whose arguments match `approval_when` wait for an operator.
    WhenMatches,
    /// Not written: `never`, except `always` for irreversible tools.
    #[default]
    Default,
}

/// How an MCP face names the operation of a call (DESIGN §6). A server-level setting that a
/// contract may override with its `identity` field.
///
/// Written `meta`, `session_window` (the default window) or `session_window:DURATION`
/// (`session_window:90s`, `session_window:10m`), the same in a contract, the gateway's
/// configuration and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Identity {
    /// The agent runtime names each operation in the call's `_meta`; a key-based call without
    /// it is rejected with `missing_operation_key`.
    #[default]
    Meta,
    /// For hosts that cannot send `_meta`: the key is derived from the caller, the MCP session,
    /// the tool and the request fingerprint, and a repeat of the same call within this window
    /// of the operation's first call is the same operation. `_meta`, when sent, still wins.
    SessionWindow(Span),
}

impl Identity {
    /// The window when none is written: long enough to cover a host's retries and a model
    /// that re-proposes a call it lost the answer of, short enough that a deliberate repeat
    /// later in a conversation is a new operation.
    pub const DEFAULT_WINDOW: Span = Span(600);

    /// Reads `meta`, `session_window` or `session_window:DURATION`.
    pub fn parse(text: &str) -> Result<Identity, String> {
        let text = text.trim();
        let (rule, window) = match text.split_once(':') {
            Some((rule, window)) => (rule, Some(window)),
            None => (text, None),
        };
        match (rule, window) {
            ("meta", None) => Ok(Identity::Meta),
            ("meta", Some(_)) => Err(format!(
                "identity `{text}`: `meta` takes no window (the runtime's `_meta` names each operation)"
            )),
            ("session_window", None) => Ok(Identity::SessionWindow(Identity::DEFAULT_WINDOW)),
            ("session_window", Some(window)) => {
                let span = Span::parse(window).map_err(|e| format!("identity `{text}`: {e}"))?;
                if span.seconds() == 0 {
                    return Err(format!(
                        "identity `{text}`: the window must be longer than zero"
                    ));
                }
                Ok(Identity::SessionWindow(span))
            }
            _ => Err(format!(
                "identity `{text}` is not one of `meta`, `session_window`, `session_window:DURATION` (e.g. session_window:10m)"
            )),
        }
    }

    /// The window, for `session_window`.
    pub fn window(self) -> Option<Span> {
        match self {
            Identity::Meta => None,
            Identity::SessionWindow(span) => Some(span),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Meta => f.write_str("meta"),
            Identity::SessionWindow(span) => write!(f, "session_window:{span}"),
        }
    }
}

impl std::str::FromStr for Identity {
    type Err = String;
    fn from_str(text: &str) -> Result<Identity, String> {
        Identity::parse(text)
    }
}

impl Serialize for Identity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Identity, D::Error> {
        // A visitor rather than a String first, so a contract error keeps its line and field.
        struct IdentityVisitor;
        impl serde::de::Visitor<'_> for IdentityVisitor {
            type Value = Identity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`meta`, `session_window` or `session_window:DURATION`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Identity, E> {
                Identity::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(IdentityVisitor)
    }
}

// ---------------------------------------------------------------------------------------------
// The file form.

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct OperationKeySpec {
    /// Who derives the key; only `application` is safe.
    #[serde(default)]
    pub supplied_by: Option<String>,
    /// The boundaries the key is namespaced by, e.g. `[tenant, environment, workflow_id, step_id]`.
    #[serde(default)]
    pub scope: Vec<String>,
    #[serde(default)]
    pub reused_for_retry: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FingerprintSpec {
    /// Top-level argument names that define "the same operation"; `["*"]` means all of them
    /// (which the linter flags).
    #[serde(default)]
    pub fields: Vec<String>,
    /// Values used for omitted material fields, so that omitting a default and sending it
    /// give one fingerprint.
    #[serde(default)]
    pub defaults: Map<String, Value>,
    #[serde(default)]
    pub normalize: BTreeMap<String, Vec<Normalization>>,
    #[serde(default)]
    pub mismatch: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DownstreamSpec {
    /// The downstream deduplicates on the idempotency key we send: a resend is safe.
    #[serde(default)]
    pub deduplicates_by_key: bool,
    /// An authoritative receipt can be looked up by operation key.
    #[serde(default)]
    pub receipt_lookup: bool,
    /// The downstream may answer 202 with a job id that is polled to completion.
    #[serde(default)]
    pub async_jobs: bool,
    /// For natural-idempotent tools: the argument whose value is sent as a version
    /// precondition (If-Match).
    #[serde(default)]
    pub version_precondition: Option<String>,
    /// What the receipt is (documentation for reviewers).
    #[serde(default)]
    pub receipt: Option<String>,
    /// Transport settings read by the face that performs the effect (the HTTP downstream).
    /// The core does not interpret them.
    #[serde(default)]
    pub http: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SecuritySpec {
    /// Call the authorization hook before every effect and every replay.
    #[serde(default = "yes")]
    pub recheck_authorization: bool,
    #[serde(default)]
    pub approval: ApprovalRule,
    /// For `approval: when_matches`: argument name → values that need approval.
    #[serde(default)]
    pub approval_when: BTreeMap<String, Vec<Value>>,
    /// How long an operation waits for an operator before its approval expires as a refusal
    /// (`approval_expired`, nothing ran). Default: `retention.max_retry_window`.
    #[serde(default)]
    pub approval_window: Option<Span>,
    /// Hook settings read by the face that calls it (the HTTP gateway).
    #[serde(default)]
    pub authorization_hook: Option<Value>,
}

impl Default for SecuritySpec {
    fn default() -> Self {
        SecuritySpec {
            recheck_authorization: true,
            approval: ApprovalRule::Default,
            approval_when: BTreeMap::new(),
            approval_window: None,
            authorization_hook: None,
        }
    }
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSpec {
    pub record_ttl: Span,
    pub tombstone_ttl: Span,
    #[serde(default)]
    pub late_arrival: LateArrival,
    pub max_retry_window: Span,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct OwnerSpec {
    /// Who owns the unknown-outcome queue of this tool: a team or rota, shown to operators.
    #[serde(default)]
    pub reconciliation: Option<String>,
    #[serde(default)]
    pub next_review: Option<String>,
    /// Where an operator reads how to check this tool's effect in its system of record (a
    /// URL, shown as a link on the console's operation page; any other text is shown as is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook: Option<String>,
}

/// A contract as written. Optional where the linter should report absence instead of the
/// parser refusing the file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ContractFile {
    pub name: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub purpose: Option<String>,
    #[serde(default)]
    pub use_when: Vec<String>,
    #[serde(default)]
    pub do_not_use_when: Vec<String>,
    pub effect_class: EffectClass,
    #[serde(default)]
    pub operation_key: OperationKeySpec,
    #[serde(default)]
    pub input_schema: Option<Value>,
    #[serde(default)]
    pub request_fingerprint: FingerprintSpec,
    #[serde(default)]
    pub downstream: DownstreamSpec,
    #[serde(default)]
    pub security: SecuritySpec,
    #[serde(default)]
    pub retention: Option<RetentionSpec>,
    #[serde(default)]
    pub lease_seconds: Option<u64>,
    #[serde(default)]
    pub duplicate_intent_window: Option<Span>,
    /// How the MCP face names an operation of this tool; unset, the server's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
    #[serde(default)]
    pub owner: OwnerSpec,
}

/// A contract that could not be read or accepted. Names the file, the line where known, and
/// the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub file: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for LoadError {}

/// The line where `field` (the last segment of a dotted path) first appears as a YAML key.
/// Reads `downstream.http.job.max_running`, the job deadline. The core leaves the rest of
/// `downstream.http` to the face that performs the effect, but this one value is the
/// executor's: it decides when a running job stops being in flight.
pub fn job_max_running(cf: &ContractFile) -> Result<Option<Span>, String> {
    let Some(value) = cf
        .downstream
        .http
        .as_ref()
        .and_then(|http| http.pointer("/job/max_running"))
    else {
        return Ok(None);
    };
    let span: Span = serde_json::from_value(value.clone())
        .map_err(|e| format!("downstream.http.job.max_running: {e}"))?;
    if span.seconds() == 0 {
        return Err("downstream.http.job.max_running must be longer than zero".into());
    }
    Ok(Some(span))
}

fn line_of(text: &str, field: &str) -> Option<usize> {
    let last = field.rsplit('.').next().unwrap_or(field);
    text.lines()
        .position(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(last) && t[last.len()..].trim_start().starts_with(':')
        })
        .map(|i| i + 1)
}

impl ContractFile {
    /// Parses YAML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ContractFile, LoadError> {
        yaml_serde::from_str::<ContractFile>(text).map_err(|e| {
            let location = e.location();
            let message = e.to_string();
            // Strip the position suffix: it is reported in its own fields.
            let message = match message.rfind(" at line ") {
                Some(cut) => message[..cut].to_string(),
                None => message,
            };
            // Messages read "path.to.field: problem"; keep the path as the field.
            let (field, message) = match message.split_once(": ") {
                Some((path, rest)) if !path.contains(' ') => {
                    (Some(path.to_string()), rest.to_string())
                }
                _ => (None, message),
            };
            let field = field.or_else(|| {
                message
                    .split('`')
                    .nth(1)
                    .filter(|_| message.contains("field `"))
                    .map(str::to_string)
            });
            LoadError {
                file: file.to_string(),
                line: location.as_ref().map(|l| l.line()),
                column: location.as_ref().map(|l| l.column()),
                field,
                message,
            }
        })
    }
}

/// A draft read as far as it goes: the contract the linter reviews, and what had to be left
/// out or assumed to read it.
#[derive(Debug, Clone)]
pub struct Draft {
    pub file: ContractFile,
    /// Each field that could not be read as written: unknown, of the wrong type, or missing
    /// where it is required. Empty when the file parses as it is.
    pub problems: Vec<LoadError>,
}

/// One step of a dotted field path as the YAML reader reports it (`a.b[2].c`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut rest = part;
        if let Some(open) = rest.find('[') {
            out.push(Step::Key(rest[..open].to_string()));
            rest = &rest[open..];
            while let Some(close) = rest.find(']') {
                if let Ok(i) = rest[1..close].parse() {
                    out.push(Step::Index(i));
                }
                rest = &rest[close + 1..];
            }
        } else {
            out.push(Step::Key(rest.to_string()));
        }
    }
    out
}

/// Removes the value at `path`; false when there is none.
fn remove_at(value: &mut Value, path: &[Step]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = value;
    for step in parents {
        let next = match (step, at) {
            (Step::Key(k), Value::Object(m)) => m.get_mut(k),
            (Step::Index(i), Value::Array(a)) => a.get_mut(*i),
            _ => None,
        };
        match next {
            Some(v) => at = v,
            None => return false,
        }
    }
    match (last, at) {
        (Step::Key(k), Value::Object(m)) => m.remove(k).is_some(),
        (Step::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
            true
        }
        _ => false,
    }
}

/// A stand-in for a required top-level field, so the rest of a draft is still reviewed.
fn stand_in(field: &str, file: &str) -> Option<(Value, String)> {
    match field {
        "name" => {
            let stem = std::path::Path::new(file)
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("draft")
                .trim_end_matches(".yaml");
            let name: String = stem
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let name = if name.is_empty() {
                "draft".to_string()
            } else {
                name
            };
            let note = format!("reviewed as `{name}`");
            Some((Value::String(name), note))
        }
        // The strictest class: every key, fingerprint and receipt rule applies.
        "effect_class" => Some((
            Value::String("key_based".into()),
            "reviewed as key_based, the class every rule applies to".into(),
        )),
        _ => None,
    }
}

impl ContractFile {
    /// Reads a draft as far as it goes, for the linter: where the strict reading stops at a
    /// field (unknown, of the wrong type, or a required one missing), that field is recorded
    /// as a problem and left out — or, for `name` and `effect_class`, stood in for — and the
    /// reading goes on, so one mistake does not hide the rest of the review. Only text that
    /// is not YAML at all, or not a mapping, is refused whole.
    pub fn parse_draft(text: &str, file: &str) -> Result<Draft, LoadError> {
        let first = match ContractFile::parse(text, file) {
            Ok(file) => {
                return Ok(Draft {
                    file,
                    problems: Vec::new(),
                });
            }
            Err(e) => e,
        };
        let mut value: Value = match yaml_serde::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            _ => return Err(first),
        };
        let mut problems = Vec::new();
        // Each round removes or stands in for one field, so a draft has at most as many rounds
        // as it has fields; the bound only guards against a reader that would not converge.
        for _ in 0..256 {
            let yaml = yaml_serde::to_string(&value).map_err(|_| first.clone())?;
            let error = match yaml_serde::from_str::<ContractFile>(&yaml) {
                Ok(file) => {
                    // In the order they are written, not the order the reader met them.
                    problems.sort_by_key(|p: &LoadError| p.line.unwrap_or(usize::MAX));
                    return Ok(Draft { file, problems });
                }
                Err(e) => e.to_string(),
            };
            let error = match error.rfind(" at line ") {
                Some(cut) => error[..cut].to_string(),
                None => error,
            };
            let (path, message) = match error.split_once(": ") {
                Some((path, rest)) if !path.contains(' ') => (path.to_string(), rest.to_string()),
                _ => (String::new(), error),
            };
            let named = message.split('`').nth(1).unwrap_or("").to_string();
            let join = |parent: &str, child: &str| {
                if parent.is_empty() {
                    child.to_string()
                } else {
                    format!("{parent}.{child}")
                }
            };
            let (field, note) = if message.starts_with("unknown field") {
                let field = join(&path, &named);
                if !remove_at(&mut value, &steps(&field)) {
                    return Err(first);
                }
                (field, "reviewed without it".to_string())
            } else if message.starts_with("missing field") {
                let field = join(&path, &named);
                match (path.is_empty(), stand_in(&named, file)) {
                    (true, Some((stand_in, note))) => {
                        if let Value::Object(m) = &mut value {
                            m.insert(named.clone(), stand_in);
                        }
                        (field, note)
                    }
                    (false, _) if remove_at(&mut value, &steps(&path)) => {
                        let note = format!("reviewed as if `{path}` were not written");
                        (field, note)
                    }
                    _ => return Err(first),
                }
            } else if let Some((stand_in, note)) = stand_in(&path, file) {
                if let Value::Object(m) = &mut value {
                    m.insert(path.clone(), stand_in);
                }
                (path, note)
            } else {
                if path.is_empty() || !remove_at(&mut value, &steps(&path)) {
                    return Err(first);
                }
                (path, "reviewed as if it were not written".to_string())
            };
            // A missing field is not written anywhere: point at the block that lacks it.
            let line = line_of(text, &field).or_else(|| {
                field
                    .rsplit_once('.')
                    .and_then(|(parent, _)| line_of(text, parent))
            });
            problems.push(LoadError {
                file: file.to_string(),
                line,
                column: None,
                field: Some(field),
                message: format!("{message}; {note}"),
            });
        }
        Err(first)
    }
}

// ---------------------------------------------------------------------------------------------
// The loaded, checked form.

/// Why a delivery's arguments were refused. Names the field; never echoes its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ArgumentError {
    pub message: String,
}

/// A checked contract the executor runs.
pub struct Contract {
    pub file: ContractFile,
    pub name: String,
    pub version: String,
    pub effect_class: EffectClass,
    pub retention: RetentionSpec,
    pub lease: Span,
    pub input_schema: Value,
    validator: jsonschema::Validator,
    approval: ApprovalRule,
    /// `downstream.http.job.max_running`, when the contract sets it.
    max_running: Option<Span>,
}

impl fmt::Debug for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Contract")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("effect_class", &self.effect_class)
            .finish_non_exhaustive()
    }
}

/// The default lease: long enough for a slow downstream call, short enough that recovery of a
/// crashed worker starts within a minute. Renewed at a third of its length while an effect runs.
pub const DEFAULT_LEASE_SECONDS: u64 = 30;

/// Longest tool name accepted: MCP clients refuse longer names.
pub const MAX_TOOL_NAME: usize = 128;

impl Contract {
    /// Reads and checks a contract file.
    pub fn load(text: &str, file: &str) -> Result<Contract, LoadError> {
        Contract::from_file(ContractFile::parse(text, file)?, text, file)
    }

    /// Checks a parsed contract. `text` is only used to find lines for errors.
    pub fn from_file(cf: ContractFile, text: &str, file: &str) -> Result<Contract, LoadError> {
        let err = |field: &str, message: String| LoadError {
            file: file.to_string(),
            line: line_of(text, field),
            column: None,
            field: Some(field.to_string()),
            message,
        };
        if cf.name.is_empty()
            || cf.name.len() > MAX_TOOL_NAME
            || !cf
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(err(
                "name",
                format!(
                    "a tool name is 1 to {MAX_TOOL_NAME} characters of A-Z, a-z, 0-9, `.`, `_`, `-`"
                ),
            ));
        }
        let version = match &cf.version {
            Some(v) if !v.trim().is_empty() => v.clone(),
            _ => {
                return Err(err(
                    "version",
                    "a contract needs a version: it is part of every fingerprint".into(),
                ));
            }
        };
        if cf.effect_class == EffectClass::NonIdempotent {
            return Err(err(
                "effect_class",
                "`non_idempotent` tools are refused: a repeated delivery would repeat the effect. \
                 Redesign it as a keyed command (effect_class: key_based, with the operation key \
                 sent to a downstream that deduplicates on it or offers a receipt lookup) or as an \
                 absolute update (effect_class: natural_idempotent, e.g. `set balance to X at \
                 version V` instead of `add X`)"
                    .into(),
            ));
        }
        let keyed = matches!(
            cf.effect_class,
            EffectClass::KeyBased | EffectClass::Irreversible
        );
        let retention = match (&cf.retention, keyed) {
            (Some(r), _) => r.clone(),
            (None, false) => RetentionSpec {
                record_ttl: Span(86_400),
                tombstone_ttl: Span(7 * 86_400),
                late_arrival: LateArrival::Reject,
                max_retry_window: Span(86_400),
            },
            (None, true) => {
                return Err(err(
                    "retention",
                    "key-based and irreversible tools need a retention rule longer than their retry window".into(),
                ));
            }
        };
        if retention.record_ttl.seconds() == 0 {
            return Err(err(
                "retention.record_ttl",
                "must be longer than zero".into(),
            ));
        }
        if retention.record_ttl.seconds() + retention.tombstone_ttl.seconds()
            < retention.max_retry_window.seconds()
        {
            return Err(err(
                "retention.max_retry_window",
                format!(
                    "records and tombstones are kept {} + {} in all, shorter than the retry window {}: \
                     a late retry would find nothing and become a second effect",
                    retention.record_ttl, retention.tombstone_ttl, retention.max_retry_window
                ),
            ));
        }
        let schema = cf.input_schema.clone().ok_or_else(|| {
            err(
                "input_schema",
                "a contract needs an input schema (JSON Schema)".into(),
            )
        })?;
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| err("input_schema", format!("not a valid JSON Schema: {e}")))?;
        let fp = &cf.request_fingerprint;
        if cf.effect_class != EffectClass::Read && fp.fields.is_empty() {
            return Err(err(
                "request_fingerprint.fields",
                "name the material fields that define the same operation (or `*` for all)".into(),
            ));
        }
        let wildcard = fp.fields.iter().any(|f| f == "*");
        if wildcard && fp.fields.len() > 1 {
            return Err(err(
                "request_fingerprint.fields",
                "`*` stands alone: it already means every field".into(),
            ));
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        if let Some(props) = properties {
            for field in fp.fields.iter().filter(|f| *f != "*") {
                if !props.contains_key(field) {
                    return Err(err(
                        "request_fingerprint.fields",
                        format!("material field `{field}` is not a property of input_schema"),
                    ));
                }
            }
        }
        for (field, value) in &fp.defaults {
            if !wildcard && !fp.fields.contains(field) {
                return Err(err(
                    "request_fingerprint.defaults",
                    format!("default for `{field}`, which is not a material field"),
                ));
            }
            json::check_numbers(value)
                .map_err(|m| err("request_fingerprint.defaults", format!("`{field}`: {m}")))?;
        }
        for field in fp.normalize.keys() {
            if !wildcard && !fp.fields.contains(field) {
                return Err(err(
                    "request_fingerprint.normalize",
                    format!("normalisation for `{field}`, which is not a material field"),
                ));
            }
        }
        let approval = match (cf.security.approval, cf.effect_class) {
            (ApprovalRule::Default, EffectClass::Irreversible) => ApprovalRule::Always,
            (ApprovalRule::Default, _) => ApprovalRule::Never,
            (rule, _) => rule,
        };
        if approval == ApprovalRule::WhenMatches && cf.security.approval_when.is_empty() {
            return Err(err(
                "security.approval_when",
                "`approval: when_matches` needs at least one field and its values".into(),
            ));
        }
        if approval != ApprovalRule::Never && !keyed {
            return Err(err(
                "security.approval",
                "approval holds an operation under its key; only key-based and irreversible tools have one".into(),
            ));
        }
        if let Some(field) = &cf.downstream.version_precondition {
            if cf.effect_class != EffectClass::NaturalIdempotent {
                return Err(err(
                    "downstream.version_precondition",
                    "a version precondition belongs to natural_idempotent tools".into(),
                ));
            }
            if properties.is_some_and(|p| !p.contains_key(field)) {
                return Err(err(
                    "downstream.version_precondition",
                    format!("`{field}` is not a property of input_schema"),
                ));
            }
        }
        let lease = Span(cf.lease_seconds.unwrap_or(DEFAULT_LEASE_SECONDS));
        if lease.seconds() < 3 {
            return Err(err(
                "lease_seconds",
                "a lease under 3 seconds cannot be renewed reliably".into(),
            ));
        }
        let max_running = job_max_running(&cf).map_err(|m| err("max_running", m))?;
        Ok(Contract {
            max_running,
            name: cf.name.clone(),
            version,
            effect_class: cf.effect_class,
            retention,
            lease,
            input_schema: schema,
            validator,
            approval,
            file: cf,
        })
    }

    /// Whether deliveries must carry an operation key.
    pub fn requires_key(&self) -> bool {
        matches!(
            self.effect_class,
            EffectClass::KeyBased | EffectClass::Irreversible
        )
    }

    pub fn deduplicates(&self) -> bool {
        self.file.downstream.deduplicates_by_key
    }

    pub fn receipt_lookup(&self) -> bool {
        self.file.downstream.receipt_lookup
    }

    pub fn async_jobs(&self) -> bool {
        self.file.downstream.async_jobs
    }

    /// How long an accepted job the downstream reports running stays in flight, counted from
    /// its claim: `downstream.http.job.max_running`, else `retention.max_retry_window`. Waiting
    /// is not ambiguity: only a job that outlives this (or that the downstream no longer
    /// knows) ends `unknown`.
    pub fn max_running(&self) -> Span {
        self.max_running.unwrap_or(self.retention.max_retry_window)
    }

    /// Whether a durable "dispatch is starting" mark precedes the first byte to the downstream.
    /// Used whenever the downstream does not deduplicate on the key: a receipt lookup that
    /// finds nothing cannot tell "never sent" from "still travelling", the marker can.
    pub fn uses_dispatch_marker(&self) -> bool {
        !self.deduplicates()
    }

    pub fn late_arrival(&self) -> LateArrival {
        self.retention.late_arrival
    }

    /// The contract's own identity rule, if it writes one (it overrides the server's).
    pub fn identity(&self) -> Option<Identity> {
        self.file.identity
    }

    pub fn duplicate_intent_window(&self) -> Option<Span> {
        self.file.duplicate_intent_window
    }

    /// How long an operation may wait for approval (see `security.approval_window`).
    pub fn approval_window(&self) -> Span {
        self.file
            .security
            .approval_window
            .unwrap_or(self.retention.max_retry_window)
    }

    pub fn recheck_authorization(&self) -> bool {
        self.file.security.recheck_authorization
    }

    /// Validates arguments against the input schema. The message names the location and the
    /// rule broken, never the value.
    pub fn validate(&self, arguments: &Value) -> Result<(), ArgumentError> {
        // The common case, valid arguments, takes the validator's allocation-free path.
        if self.validator.is_valid(arguments) {
            return Ok(());
        }
        let problems: Vec<String> = self
            .validator
            .iter_errors(arguments)
            .take(5)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "/".to_string() } else { at };
                format!("at `{at}`: {}", describe_schema_error(&e))
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ArgumentError {
                message: format!(
                    "arguments do not match the input schema of {} {}: {}",
                    self.name,
                    self.version,
                    problems.join("; ")
                ),
            })
        }
    }

    /// The material fields: selected, defaulted and normalised.
    pub fn material(&self, arguments: &Value) -> Result<Material, ArgumentError> {
        let args = arguments.as_object().ok_or_else(|| ArgumentError {
            message: "arguments must be a JSON object".into(),
        })?;
        let fp = &self.file.request_fingerprint;
        let mut out = Map::new();
        let wildcard = fp.fields.iter().any(|f| f == "*");
        let names: Vec<&String> = if wildcard {
            args.keys().chain(fp.defaults.keys()).collect()
        } else {
            fp.fields.iter().collect()
        };
        for name in names {
            if out.contains_key(name) {
                continue;
            }
            let value = match args.get(name).or_else(|| fp.defaults.get(name)) {
                Some(v) => v.clone(),
                None => continue,
            };
            let value = match fp.normalize.get(name) {
                Some(steps) => normalise(name, value, steps)?,
                None => value,
            };
            out.insert(name.clone(), value);
        }
        Ok(Material(out))
    }

    /// Canonical bytes of the material request under `version` (normally this contract's own;
    /// an older record is compared under the version it was claimed with).
    pub fn canonicalize_as(
        &self,
        version: &str,
        arguments: &Value,
    ) -> Result<Canonical, ArgumentError> {
        let material = self.material(arguments)?;
        canonical::canonicalize(&self.name, version, &material).map_err(|e| ArgumentError {
            message: e.to_string(),
        })
    }

    pub fn canonicalize(&self, arguments: &Value) -> Result<Canonical, ArgumentError> {
        self.canonicalize_as(&self.version, arguments)
    }

    pub fn fingerprint(&self, arguments: &Value) -> Result<Fingerprint, ArgumentError> {
        Ok(Fingerprint::of(&self.canonicalize(arguments)?))
    }

    /// Whether this call needs an operator's approval before its effect.
    pub fn needs_approval(&self, arguments: &Value) -> bool {
        match self.approval {
            ApprovalRule::Never | ApprovalRule::Default => false,
            ApprovalRule::Always => true,
            ApprovalRule::WhenMatches => {
                // Judged on the material value (after defaults and normalisation) where the
                // field is material, so an omitted default or a re-cased value cannot slip
                // past the rule that the fingerprint treats as the same request.
                let material = self.material(arguments).ok();
                self.file
                    .security
                    .approval_when
                    .iter()
                    .any(|(field, values)| {
                        material
                            .as_ref()
                            .and_then(|m| m.fields().get(field))
                            .or_else(|| arguments.get(field))
                            .is_some_and(|v| values.iter().any(|x| x == v))
                    })
            }
        }
    }

    pub fn approval(&self) -> ApprovalRule {
        self.approval
    }

    /// The precondition value to pass through to the downstream, if the contract declares one.
    pub fn precondition<'a>(&self, arguments: &'a Value) -> Option<&'a Value> {
        self.file
            .downstream
            .version_precondition
            .as_ref()
            .and_then(|field| arguments.get(field))
    }
}

fn describe_schema_error(e: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::ValidationErrorKind as K;
    match e.kind() {
        K::Required { property } => format!("required property {property} is missing"),
        K::AdditionalProperties { unexpected } => {
            format!("unexpected properties {}", unexpected.join(", "))
        }
        K::Type { kind } => match kind {
            jsonschema::error::TypeKind::Single(t) => format!("wrong type, expected {t}"),
            jsonschema::error::TypeKind::Multiple(ts) => {
                format!("wrong type, expected one of {ts:?}")
            }
        },
        K::MinLength { limit } => format!("shorter than {limit} characters"),
        K::MaxLength { limit } => format!("longer than {limit} characters"),
        K::Enum { .. } => "not one of the allowed values".to_string(),
        K::Pattern { pattern } => format!("does not match pattern {pattern}"),
        K::Minimum { .. } | K::ExclusiveMinimum { .. } => "below the minimum".to_string(),
        K::Maximum { .. } | K::ExclusiveMaximum { .. } => "above the maximum".to_string(),
        _ => format!("fails the `{}` rule", e.kind().keyword()),
    }
}

fn normalise(name: &str, value: Value, steps: &[Normalization]) -> Result<Value, ArgumentError> {
    let Value::String(mut s) = value else {
        return Err(ArgumentError {
            message: format!("material field `{name}` is normalised as text but is not a string"),
        });
    };
    for step in steps {
        s = match step {
            Normalization::Trim => s.trim().to_string(),
            Normalization::Lowercase => s.to_lowercase(),
            Normalization::Uppercase => s.to_uppercase(),
            Normalization::CollapseWhitespace => s.split_whitespace().collect::<Vec<_>>().join(" "),
        };
    }
    Ok(Value::String(s))
}
