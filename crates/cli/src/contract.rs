//! `idemgate contract new`, `idemgate contract lint` and `idemgate contract fingerprint`.
//!
//! `new` drafts a contract for one effect class, shaped by what the tool's name says it acts on
//! ([`draft`]), every field commented with what it means and what to change, every value to
//! replace marked `CHANGE-ME`. `lint` reviews contract files: every field the reader could not
//! take as written (the rest of the draft is still reviewed), every placeholder left in place,
//! every red flag the core's linter raises, a refusal by the loader and the HTTP downstream
//! (what `serve` would say when it loads the file) unless a red flag already says it, and, to
//! end each file, the decision — `automate`, `automate with approval`, `keep manual until
//! reconciliation exists`, `fix the contract first` or `not reviewed` — with its reason. `fingerprint` shows exactly what the executor would fingerprint
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

mod draft;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Draft a contract for one effect class, shaped by what the name says the tool acts on
    /// (a refund, a message, a ticket…): every field commented, every value to replace marked
    /// CHANGE-ME (lint reports each one left in place).
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
    /// Review contract files for unsafe retry designs and mistakes, each file ending with a
    /// decision: automate, automate with approval, keep manual until reconciliation exists,
    /// fix the contract first, or not reviewed. Exits 1 if any error is found.
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
    /// No effect: a read.
    Read,
    /// An absolute update (`set X to V`) with a version precondition.
    NaturalIdempotent,
    /// A create or command; the downstream deduplicates on the key and offers a receipt lookup.
    KeyBased,
    /// key_based, with a downstream that deduplicates on the key and offers nothing else.
    Deduplicating,
    /// key_based, with a downstream that answers with a job polled until it ends.
    Job,
    /// key_based, cannot be undone: an operator approves every operation.
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
    out.extend(placeholders(&text, file));
    out.extend(lint::lint(&parsed).into_iter().map(|f| Reported {
        file: file.to_string(),
        line: line_of(&text, &f.field),
        level: f.level,
        rule: f.rule.to_string(),
        field: f.field,
        reason: f.reason,
    }));
    match Contract::from_file(parsed.clone(), &text, file) {
        Err(e) => {
            // The loader stops at its first refusal; when a red flag above already says the
            // same thing about the same field, the finding is not reported twice.
            let repeated = REPEATS.iter().any(|(rule, field)| {
                e.field.as_deref() == Some(*field) && out.iter().any(|f| f.rule == *rule)
            });
            if !repeated {
                out.push(Reported::from_load_error("load", e));
            }
        }
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

/// Loader refusals that repeat one of the linter's red flags: the rule, and the field the
/// loader names for the same fault.
const REPEATS: &[(&str, &str)] = &[
    ("no-version", "version"),
    ("non-idempotent-exposed", "effect_class"),
    ("no-retention", "retention"),
    (
        "retention-shorter-than-retry-window",
        "retention.max_retry_window",
    ),
    ("no-material-fields", "request_fingerprint.fields"),
];

/// Every value still marked [`draft::PLACEHOLDER`] (in any case, outside comments): one error
/// per line, naming the field it is written in.
fn placeholders(text: &str, file: &str) -> Vec<Reported> {
    let mark = draft::PLACEHOLDER.to_ascii_lowercase();
    let mut out = Vec::new();
    // The keys of the mappings the current line is inside, with their indentation.
    let mut path: Vec<(usize, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let content = match line.find(" #") {
            Some(at) => &line[..at],
            None => line,
        };
        let t = content.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let indent = content.len() - t.len();
        let item = t.strip_prefix("- ");
        let key = item.unwrap_or(t).split_once(':').and_then(|(k, rest)| {
            let k = k.trim();
            let plain = !k.is_empty() && !k.contains(' ') && !k.starts_with(['"', '\'', '{', '[']);
            (plain && (rest.is_empty() || rest.starts_with(' '))).then_some(k)
        });
        while path.last().is_some_and(|(at, _)| *at >= indent) {
            path.pop();
        }
        let mut field: Vec<&str> = path.iter().map(|(_, k)| k.as_str()).collect();
        if let Some(key) = key {
            field.push(key);
        }
        let field = field.join(".");
        if let Some(key) = key.filter(|_| item.is_none()) {
            path.push((indent, key.to_string()));
        }
        if !t.to_ascii_lowercase().contains(&mark) {
            continue;
        }
        let what = if field.ends_with("url") {
            "the downstream's real address"
        } else if field.ends_with("reconciliation") {
            "the team that works this tool's unknown outcomes"
        } else if field == "purpose" {
            "one sentence on which business effect happens, in which system"
        } else if field.starts_with("input_schema") || field.starts_with("request_fingerprint") {
            "the tool's own arguments"
        } else {
            "the tool's own value"
        };
        out.push(Reported {
            file: file.to_string(),
            line: Some(i + 1),
            level: Level::Error,
            rule: "placeholder".into(),
            field,
            reason: format!(
                "`{}` is a placeholder left from the draft: replace it with {what}",
                draft::PLACEHOLDER
            ),
        });
    }
    out
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

/// The text of a new contract.
fn draft_of(name: &str, class: Class, file: &str, review: &str) -> String {
    use draft::Shape;
    let shape = match class {
        Class::Read => Shape::Read,
        Class::NaturalIdempotent => Shape::NaturalIdempotent,
        Class::KeyBased => Shape::KeyBased,
        Class::Deduplicating => Shape::Deduplicating,
        Class::Job => Shape::Job,
        Class::Irreversible => Shape::Irreversible,
        Class::NonIdempotent => unreachable!("refused before drafting"),
    };
    draft::draft(name, shape, file, review)
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
    let text = draft_of(name, class, &shown, &review_date());
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
