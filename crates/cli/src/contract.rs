//! `idemgate contract new`, `idemgate contract lint` and `idemgate contract fingerprint`.
//!
//! `new` drafts a contract for one effect class, every field commented with what it means and
//! what to change, that lints clean. `lint` is the seed's review worksheet run over contract
//! files: every field the reader could not take as written (the rest of the draft is still
//! reviewed), every red flag the core's linter raises, a refusal by the loader and the HTTP
//! downstream (what `serve` would say when it loads the file), and, to end each file, the
//! seed's decision — `automate`, `automate with approval` or `keep manual until reconciliation
//! exists` — with its reason. `fingerprint` shows exactly what the executor would fingerprint
//! for a set of arguments, so that a contract author can check defaults and normalisations
//! before deploying a version.
//!
//! Exit statuses (as for every command): 0 — done, and `lint` found no error (warnings
//! allowed); 1 — `lint` found at least one error; 2 — the command could not do its job (usage,
//! an unreadable `--args`, a contract `fingerprint` cannot load, a file `new` would overwrite).

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use idemgate_core::contract::{Contract, ContractFile, LoadError};
use idemgate_core::lint::{self, Level};
use idemgate_core::{CANONICALIZATION_VERSION, Fingerprint, json};
use serde::Serialize;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Draft a contract for one effect class: every field commented, lint-clean.
    New {
        /// The tool's name (A-Z, a-z, 0-9, `.`, `_`, `-`), e.g. `tickets.create`.
        #[arg(value_name = "NAME")]
        name: String,
        /// The effect class, which decides what the contract must say.
        #[arg(long, value_enum)]
        class: Class,
        /// Where to write it (default `<NAME>.yaml`); an existing file is never overwritten.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Review contract files for unsafe retry designs, each ending with the seed's decision.
    /// Exits 1 if any error is found.
    Lint {
        /// Contract files (YAML).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print the canonical bytes and the fingerprint of a request under a contract.
    Fingerprint {
        /// The contract file (YAML).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The tool arguments: a JSON object, `@PATH` to read them from a file, or `-` for
        /// standard input.
        #[arg(long = "args", value_name = "JSON")]
        arguments: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// The effect classes `new` drafts (`non_idempotent` is refused with the redesign to make).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Class {
    Read,
    NaturalIdempotent,
    KeyBased,
    Irreversible,
    /// Refused: a repeat would repeat the effect.
    NonIdempotent,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::New { name, class, out } => new_contract(&name, class, out),
        Command::Lint { files, format } => lint_files(&files, format),
        Command::Fingerprint {
            file,
            arguments,
            format,
        } => fingerprint(&file, &arguments, format),
    }
}

// ---------------------------------------------------------------------------------------------
// lint

/// One finding about one file, as printed.
#[derive(Debug, Serialize)]
struct Reported {
    file: String,
    /// The line the field is written on, where it is written at all.
    line: Option<usize>,
    level: Level,
    rule: String,
    field: String,
    reason: String,
}

impl Reported {
    fn from_load_error(rule: &str, e: LoadError) -> Reported {
        Reported {
            file: e.file,
            line: e.line,
            level: Level::Error,
            rule: rule.to_string(),
            field: e.field.unwrap_or_default(),
            reason: e.message,
        }
    }
}

/// One file's review: its findings, errors first, and the decision they lead to.
#[derive(Debug, Serialize)]
struct Review {
    file: String,
    findings: Vec<Reported>,
    decision: lint::Decision,
    reason: String,
}

/// Everything wrong with one file. A file that is not YAML at all gets one `parse` finding;
/// otherwise each field the reader could not take as written is a `parse` finding and the rest
/// is reviewed: the linter's findings, then what the loader and the HTTP downstream would
/// refuse (`load`).
fn review(path: &Path) -> Review {
    let file = path.display().to_string();
    let (findings, draft) = findings_of(path, &file);
    let errors: Vec<&str> = findings
        .iter()
        .filter(|f| f.level == Level::Error)
        .map(|f| f.rule.as_str())
        .collect();
    let verdict = lint::decide(draft.as_ref(), &errors);
    Review {
        file,
        findings,
        decision: verdict.decision,
        reason: verdict.reason,
    }
}

fn findings_of(path: &Path, file: &str) -> (Vec<Reported>, Option<ContractFile>) {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            let finding = Reported {
                file: file.to_string(),
                line: None,
                level: Level::Error,
                rule: "read".into(),
                field: String::new(),
                reason: format!("cannot read the file: {e}"),
            };
            return (vec![finding], None);
        }
    };
    let draft = match ContractFile::parse_draft(&text, file) {
        Ok(draft) => draft,
        Err(e) => return (vec![Reported::from_load_error("parse", e)], None),
    };
    let mut out: Vec<Reported> = draft
        .problems
        .into_iter()
        .map(|e| Reported::from_load_error("parse", e))
        .collect();
    let parsed = draft.file;
    out.extend(lint::lint(&parsed).into_iter().map(|f| Reported {
        file: file.to_string(),
        line: line_of(&text, &f.field),
        level: f.level,
        rule: f.rule.to_string(),
        field: f.field,
        reason: f.reason,
    }));
    match Contract::from_file(parsed.clone(), &text, file) {
        Err(e) => out.push(Reported::from_load_error("load", e)),
        Ok(contract) => {
            if let Some(refusal) = http_refusal(&contract) {
                // The refusal reads "<tool>: field `<field>`: <reason>".
                let split = refusal
                    .split_once("field `")
                    .and_then(|(_, rest)| rest.split_once("`: "));
                let (field, reason) = match split {
                    Some((field, reason)) => (field.to_string(), reason.to_string()),
                    None => ("downstream.http".to_string(), refusal.clone()),
                };
                out.push(Reported {
                    file: file.to_string(),
                    line: line_of(&text, &field),
                    level: Level::Error,
                    rule: "load".into(),
                    field,
                    reason,
                });
            }
        }
    }
    // Errors first, as the linter orders its own findings.
    out.sort_by_key(|f| std::cmp::Reverse(f.level));
    (out, Some(parsed))
}

/// What `serve` would refuse in the contract's HTTP sections (the effect's request, the receipt
/// lookup, job polls, the authorization hook), when it has them. A contract without them is
/// for the sandbox or a library downstream, and is not judged here.
fn http_refusal(contract: &Contract) -> Option<String> {
    use idemgate_app::{Effects, HttpEffects};
    let file = &contract.file;
    if file.downstream.http.is_some()
        && let Err(e) = HttpEffects.downstream(contract)
    {
        return Some(e);
    }
    if file.security.authorization_hook.is_some()
        && let Err(e) = HttpEffects.authorizer(contract)
    {
        return Some(e);
    }
    None
}

/// The line where the last segment of a dotted field is first written as a YAML key.
fn line_of(text: &str, field: &str) -> Option<usize> {
    let key = field.rsplit('.').next().filter(|k| !k.is_empty())?;
    text.lines()
        .position(|line| {
            let t = line.trim_start().trim_start_matches("- ");
            t.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warning => "warning",
    }
}

fn lint_files(files: &[PathBuf], format: Format) -> anyhow::Result<ExitCode> {
    let mut reviews = Vec::new();
    let mut out = io::stdout().lock();
    for path in files {
        let review = review(path);
        if format == Format::Text {
            let file = path.display();
            if review.findings.is_empty() {
                writeln!(out, "{file}: ok")?;
            }
            for f in &review.findings {
                let at = f.line.map(|l| format!(":{l}")).unwrap_or_default();
                let field = if f.field.is_empty() {
                    String::new()
                } else {
                    format!(" {}:", f.field)
                };
                writeln!(
                    out,
                    "{file}{at}: {}[{}]{field} {}",
                    level_name(f.level),
                    f.rule,
                    f.reason
                )?;
            }
            writeln!(
                out,
                "{file}: decision: {} — {}",
                review.decision.as_str(),
                review.reason
            )?;
        }
        reviews.push(review);
    }
    let all = reviews.iter().flat_map(|r| &r.findings);
    let errors = all.clone().filter(|f| f.level == Level::Error).count();
    let warnings = all.count() - errors;
    match format {
        Format::Text => writeln!(
            out,
            "{} checked: {errors} {}, {warnings} {}",
            plural(files.len(), "contract"),
            if errors == 1 { "error" } else { "errors" },
            if warnings == 1 { "warning" } else { "warnings" },
        )?,
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &reviews)?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(if errors > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

// ---------------------------------------------------------------------------------------------
// new

/// The header every draft starts with.
const HEADER: &str = "\
# {name}: a {class} tool contract, drafted by `idemgate contract new`.
#
# Every field is a decision for the tool's owner: each comment says what the field means and
# what to change. The example arguments, URLs and owner are placeholders for yours. Review it
# with `idemgate contract lint {file}`, and see what a request's fingerprint would be
# with `idemgate contract fingerprint {file} --args '<the arguments as JSON>'`.

";

/// The fields every class writes first.
const IDENTITY: &str = "\
# What agents call, and what the gateway routes on (`POST /v1/tools/<name>/invoke`):
# A-Z, a-z, 0-9, `.`, `_`, `-`. Keep it once agents use it: a new name is a new tool.
name: {name}
# Part of every fingerprint. Bump it when the same arguments start to mean a different
# effect, so an operation claimed under the old meaning is never replayed as the new one.
version: \"1\"
";

const KEY: &str = "\
operation_key:
  # Who names the operation: the application, from its own durable workflow state (the run
  # and the step). Never the model, a tool-call id, the clock or a random number.
  supplied_by: application
  # What the key is namespaced by; the gateway builds tenant:environment:workflow_id:step_id.
  scope: [tenant, environment, workflow_id, step_id]
  # A retry of the same step reuses its key; a deliberate second action is a new step.
  reused_for_retry: true
";

const SECURITY_NEVER: &str = "\
security:
  # Ask the authorization hook again before every effect and every replay, so a retry cannot
  # outlive a revoked permission. Keep it true.
  recheck_authorization: true
  # Whether an operator approves an operation before its effect: never, always, or
  # when_matches (with `approval_when: {argument: [values]}`).
  approval: never
";

const OWNER: &str = "\
owner:
  # The team or on-call rotation that works this tool's `unknown` outcomes (the
  # reconciliation queue). Change it to yours.
  reconciliation: {name}-oncall
  # When this contract is reviewed next (YYYY-MM-DD).
  next_review: \"{review}\"
";

const KEY_BASED: &str = "\
# One sentence: which business effect happens, in which system. The model reads it.
purpose: Create one record in the system of record for one workflow step.
# When the model should call this tool.
use_when:
  - The workflow has validated what to create and needs it created exactly once.
# When it must not: to check or read, or to do the same thing again on purpose.
do_not_use_when:
  - The agent only wants to know whether the record exists; use a read tool.
  - The user asks for a second record; that is a new workflow step with a new key.
# key_based: one effect per operation key, a durable claim, and a receipt replayed to every
# later delivery of the key.
effect_class: key_based
{key}\
# The JSON Schema of the arguments. Replace the example properties with the tool's own, and
# keep `additionalProperties: false` so an unknown argument is refused, not ignored.
input_schema:
  type: object
  properties:
    subject:
      type: string
      minLength: 1
      maxLength: 200
    body:
      type: string
      maxLength: 20000
  required: [subject, body]
  additionalProperties: false
request_fingerprint:
  # The material fields: every argument that changes the effect, and none that describes the
  # delivery (a trace id, a retry count, a timestamp, the key). A different value under the
  # same key is refused.
  fields: [subject, body]
  # What a changed request under the same key gets: rejected, with no effect.
  mismatch: rejected
downstream:
  # Whether the system of record deduplicates on the Idempotency-Key the gateway sends; then
  # a resend after a lost answer cannot make a second effect.
  deduplicates_by_key: true
  # Whether it can be asked for the effect made under a key; then a lost answer is settled by
  # a lookup. With neither, a lost answer can only end in `unknown`.
  receipt_lookup: true
  # What the receipt is, for reviewers: the reference the system of record gives the effect.
  receipt: record id
  http:
    # The HTTP method of the effect.
    method: POST
    # Where the effect is sent. Point it at the real system of record.
    url: http://127.0.0.1:9000/records
    # The header that carries the operation key on every request.
    idempotency_header: Idempotency-Key
    # A JSON pointer into the answer: the effect's reference.
    reference: /id
    lookup:
      # The receipt lookup by operation key.
      url: http://127.0.0.1:9000/records/by-key/{operation_key}
    # Bounds on one attempt; an answer later than `total` counts as lost.
    timeouts:
      connect: 2s
      total: 10s
{security}\
retention:
  # How long the whole record (the result included) is kept after the operation settles.
  record_ttl: 7d
  # How long a small tombstone is kept after that, so a late retry still finds the key.
  tombstone_ttl: 30d
  # What a delivery after the tombstone gets: reject, tombstone (the reference only), or
  # reconcile (an operator decides).
  late_arrival: reject
  # The longest a retry of one step can arrive after its first delivery (queues, restarts,
  # resumed workflows). record_ttl + tombstone_ttl must cover it.
  max_retry_window: 1d
{owner}";

const IRREVERSIBLE: &str = "\
# One sentence: which business effect happens, in which system. The model reads it.
purpose: Send one message to one recipient on behalf of a workflow step.
# When the model should call this tool.
use_when:
  - The workflow decided the recipient must be told, and the message is final.
# When it must not: to check whether it went out, or to send the same thing again.
do_not_use_when:
  - The agent wants to know whether the message went out; read the operation instead.
  - The user asks to send it again; that is a new step, a new key and a new approval.
# irreversible: key-based, and what happened cannot be undone, so an operator approves each
# operation before its effect.
effect_class: irreversible
{key}\
# The JSON Schema of the arguments. Replace the example properties with the tool's own, and
# keep `additionalProperties: false` so an unknown argument is refused, not ignored.
input_schema:
  type: object
  properties:
    to:
      type: string
      minLength: 3
      maxLength: 254
    text:
      type: string
      minLength: 1
      maxLength: 10000
  required: [to, text]
  additionalProperties: false
request_fingerprint:
  # The material fields: every argument that changes the effect, and none that describes the
  # delivery (a trace id, a retry count, a timestamp, the key).
  fields: [to, text]
  # Normalisations the system of record applies itself, so that equal requests fingerprint
  # alike. Remove any your downstream does not apply.
  normalize:
    # The recipient is compared trimmed and lowercased, as the provider routes it.
    to: [trim, lowercase]
  # What a changed request under the same key gets: rejected, with no effect.
  mismatch: rejected
downstream:
  # This example's provider does not deduplicate on the key...
  deduplicates_by_key: false
  # ...but its log can be searched by the key: a lost answer is settled by that lookup. With
  # neither, a lost answer can only end in `unknown`.
  receipt_lookup: true
  # What the receipt is, for reviewers.
  receipt: provider message id
  http:
    # The HTTP method of the effect.
    method: POST
    # Where the effect is sent. Point it at the real provider.
    url: http://127.0.0.1:9000/messages
    # The header that carries the operation key on every request.
    idempotency_header: Idempotency-Key
    # A JSON pointer into the answer: the effect's reference.
    reference: /message_id
    lookup:
      # The receipt lookup by operation key.
      url: http://127.0.0.1:9000/messages/by-key/{operation_key}
    # Bounds on one attempt; an answer later than `total` counts as lost.
    timeouts:
      connect: 2s
      total: 10s
security:
  # Ask the authorization hook again before every effect and every replay. Keep it true.
  recheck_authorization: true
  # Every operation waits for an operator (`POST /v1/operations/{operation_key}/approve`).
  # Keep it: the linter refuses an irreversible tool without approval.
  approval: always
retention:
  # How long the whole record is kept after the operation settles.
  record_ttl: 14d
  # How long a small tombstone is kept after that, so a late retry still finds the key.
  tombstone_ttl: 90d
  # What a delivery after the record expired gets: tombstone replays the reference only.
  late_arrival: tombstone
  # The longest a retry of one step can arrive after its first delivery; it is also how long
  # an operation waits for approval. record_ttl + tombstone_ttl must cover it.
  max_retry_window: 2d
{owner}";

const NATURAL_IDEMPOTENT: &str = "\
# One sentence: which business effect happens, in which system. The model reads it.
purpose: Set the status of one existing record.
# When the model should call this tool.
use_when:
  - The workflow decided the record's new status, having read its current version.
# When it must not.
do_not_use_when:
  - The record does not exist yet; create it with its own tool.
  - The agent has not read the record's current version.
# natural_idempotent: an absolute update (set X to V); repeating it changes nothing more.
# The key is optional: with one, a repeat is answered from the record.
effect_class: natural_idempotent
{key}\
# The JSON Schema of the arguments. Replace the example properties with the tool's own, and
# keep `additionalProperties: false` so an unknown argument is refused, not ignored.
input_schema:
  type: object
  properties:
    record_id:
      type: string
      minLength: 1
      maxLength: 64
    status:
      type: string
      enum: [open, pending, closed]
    expected_version:
      type: integer
      minimum: 0
  required: [record_id, status, expected_version]
  additionalProperties: false
request_fingerprint:
  # The material fields: what identifies the update and the value it sets.
  fields: [record_id, status, expected_version]
downstream:
  # The argument sent as a version precondition (If-Match): the update applies only to the
  # version the agent read, so a retry cannot overwrite a newer change.
  version_precondition: expected_version
  # What the receipt is, for reviewers.
  receipt: record version after the update
  http:
    # The HTTP method of the update: an absolute write.
    method: PUT
    # Where the update is sent; `{record_id}` is filled from the arguments.
    url: http://127.0.0.1:9000/records/{record_id}/status
    # A JSON pointer into the answer: the effect's reference.
    reference: /id
{security}\
retention:
  # How long the record of an update is kept after it settles.
  record_ttl: 1d
  # How long a small tombstone is kept after that.
  tombstone_ttl: 7d
  # What a delivery after the tombstone gets: reject, tombstone or reconcile.
  late_arrival: reject
  # The longest a retry can arrive after its first delivery.
  max_retry_window: 1d
{owner}";

const READ: &str = "\
# One sentence: what it reads, in which system. The model reads it.
purpose: Read one record, its status and its version. No effect.
# When the model should call this tool.
use_when:
  - The agent needs the current state of a record before deciding what to do.
# When it must not.
do_not_use_when:
  - The agent wants to change the record; use the tool that changes it.
# read: no effect, no claim, no key; authorization still applies.
effect_class: read
# The JSON Schema of the arguments. Replace the example property with the tool's own.
input_schema:
  type: object
  properties:
    record_id:
      type: string
      minLength: 1
      maxLength: 64
  required: [record_id]
  additionalProperties: false
# The system of record the read goes to. A read has no key, no receipt and no retention.
downstream:
  http:
    # The HTTP method of the read.
    method: GET
    # Where the read goes; `{record_id}` is filled from the arguments.
    url: http://127.0.0.1:9000/records/{record_id}
    # A JSON pointer into the answer: the reference of what was read.
    reference: /id
{owner}";

/// The text of a new contract.
fn draft(name: &str, class: Class, file: &str, review: &str) -> String {
    let (class_name, body) = match class {
        Class::Read => ("read", READ),
        Class::NaturalIdempotent => ("natural_idempotent", NATURAL_IDEMPOTENT),
        Class::KeyBased => ("key_based", KEY_BASED),
        Class::Irreversible => ("irreversible", IRREVERSIBLE),
        Class::NonIdempotent => unreachable!("refused before drafting"),
    };
    let text = format!("{HEADER}{IDENTITY}{body}")
        .replace("{key}", KEY)
        .replace("{security}", SECURITY_NEVER)
        .replace("{owner}", OWNER);
    text.replace("{class}", class_name)
        .replace("{file}", file)
        .replace("{review}", review)
        .replace("{name}", name)
}

/// The civil date (YYYY-MM-DD) `days` days after 1970-01-01 (the proleptic Gregorian
/// calendar; the algorithm is the well-known days-to-civil conversion).
fn civil(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Six months from today: a first review date the owner is expected to change.
fn review_date() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    civil((now / 86_400) as i64 + 182)
}

fn new_contract(name: &str, class: Class, out: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    if name.is_empty()
        || name.len() > idemgate_core::contract::MAX_TOOL_NAME
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        bail!(
            "{name:?} is not a tool name: 1 to {} characters of A-Z, a-z, 0-9, `.`, `_`, `-`",
            idemgate_core::contract::MAX_TOOL_NAME
        );
    }
    if class == Class::NonIdempotent {
        bail!(
            "non_idempotent tools are refused: every delivery would repeat the effect. Draft it \
             as key_based (a keyed command sent to a downstream that deduplicates on the key or \
             offers a receipt lookup) or natural_idempotent (an absolute update, e.g. `set the \
             balance to X at version V` instead of `add X`)"
        );
    }
    let path = out.unwrap_or_else(|| PathBuf::from(format!("{name}.yaml")));
    let shown = path.display().to_string();
    let text = draft(name, class, &shown, &review_date());
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            bail!("{shown} exists; refusing to overwrite it (choose another --out, or remove it)")
        }
        Err(e) => return Err(e).with_context(|| format!("cannot create {shown}")),
    };
    file.write_all(text.as_bytes())
        .and_then(|()| file.flush())
        .with_context(|| format!("cannot write {shown}"))?;
    println!(
        "wrote {shown}: a draft contract for {name}; change every placeholder, then run `idemgate contract lint {shown}`"
    );
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// fingerprint

#[derive(Debug, Serialize)]
struct Fingerprinted<'a> {
    tool: &'a str,
    tool_version: &'a str,
    canonicalization_version: u32,
    canonical: &'a str,
    fingerprint: &'a str,
}

/// The argument text: inline, `@PATH`, or `-` for standard input.
fn argument_bytes(arguments: &str) -> anyhow::Result<Vec<u8>> {
    if arguments == "-" {
        let mut bytes = Vec::new();
        io::stdin()
            .read_to_end(&mut bytes)
            .context("cannot read --args from standard input")?;
        Ok(bytes)
    } else if let Some(path) = arguments.strip_prefix('@') {
        std::fs::read(path).with_context(|| format!("cannot read --args from {path}"))
    } else {
        Ok(arguments.as_bytes().to_vec())
    }
}

fn fingerprint(path: &Path, arguments: &str, format: Format) -> anyhow::Result<ExitCode> {
    let file = path.display().to_string();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read contract {file}"))?;
    let contract =
        Contract::load(&text, &file).map_err(|e| anyhow::anyhow!("contract refused: {e}"))?;
    let bytes = argument_bytes(arguments)?;
    // The same strict reading and the same checks as a delivery, in the same order: nothing is
    // fingerprinted that the executor would refuse.
    let value = match json::parse(&bytes) {
        Ok(value) => value,
        Err(e) => bail!("--args is not strict JSON: {e}"),
    };
    if let Err(e) = contract.validate(&value) {
        bail!("--args: {e}");
    }
    let canonical = match contract.canonicalize(&value) {
        Ok(canonical) => canonical,
        Err(e) => bail!("--args: {e}"),
    };
    let fingerprint = Fingerprint::of(&canonical);
    let shown = Fingerprinted {
        tool: &contract.name,
        tool_version: &contract.version,
        canonicalization_version: CANONICALIZATION_VERSION,
        canonical: canonical.as_str(),
        fingerprint: fingerprint.as_str(),
    };
    let mut out = io::stdout().lock();
    match format {
        Format::Text => {
            writeln!(out, "tool              {}", shown.tool)?;
            writeln!(out, "tool_version      {}", shown.tool_version)?;
            writeln!(out, "canonicalization  {}", shown.canonicalization_version)?;
            writeln!(out, "canonical         {}", shown.canonical)?;
            writeln!(out, "fingerprint       {}", shown.fingerprint)?;
        }
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &shown)?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::{civil, line_of};

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), "1970-01-01");
        assert_eq!(civil(59), "1970-03-01");
        assert_eq!(civil(11_016), "2000-02-29");
        assert_eq!(civil(20_454), "2026-01-01");
        assert_eq!(civil(-1), "1969-12-31");
    }

    #[test]
    fn lines_of_fields() {
        let text = "name: x\nretention:\n  record_ttl: 1h\nowner:\n  reconciliation: ops\n";
        let check =
            |field: &str, line: Option<usize>| assert_eq!(line_of(text, field), line, "{field}");
        check("name", Some(1));
        check("retention", Some(2));
        check("retention.record_ttl", Some(3));
        check("owner.reconciliation", Some(5));
        check("owner.next_review", None);
        check("", None);
        check("record", None);
    }
}
