//! `idemgate contract lint` and `idemgate contract fingerprint`.
//!
//! `lint` is the seed's review worksheet run over contract files: every red flag the core's
//! linter raises, plus a refusal by the loader (what `serve` would say when it loads the file).
//! `fingerprint` shows exactly what the executor would fingerprint for a set of arguments, so
//! that a contract author can check defaults and normalisations before deploying a version.

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
    /// Review contract files for unsafe retry designs. Exits 1 if any error is found.
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

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
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

/// Everything wrong with one file. A file that does not parse gets one `parse` finding; one
/// that parses gets the linter's findings and, if the loader refuses it, a `load` finding.
fn review(path: &Path) -> Vec<Reported> {
    let file = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            return vec![Reported {
                file,
                line: None,
                level: Level::Error,
                rule: "read".into(),
                field: String::new(),
                reason: format!("cannot read the file: {e}"),
            }];
        }
    };
    let parsed = match ContractFile::parse(&text, &file) {
        Ok(parsed) => parsed,
        Err(e) => return vec![Reported::from_load_error("parse", e)],
    };
    let mut out: Vec<Reported> = lint::lint(&parsed)
        .into_iter()
        .map(|f| Reported {
            file: file.clone(),
            line: line_of(&text, &f.field),
            level: f.level,
            rule: f.rule.to_string(),
            field: f.field,
            reason: f.reason,
        })
        .collect();
    if let Err(e) = Contract::from_file(parsed, &text, &file) {
        out.push(Reported::from_load_error("load", e));
    }
    // Errors first, as the linter orders its own findings.
    out.sort_by_key(|f| std::cmp::Reverse(f.level));
    out
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
    let mut all = Vec::new();
    let mut out = io::stdout().lock();
    for path in files {
        let findings = review(path);
        if format == Format::Text {
            let file = path.display();
            if findings.is_empty() {
                writeln!(out, "{file}: ok")?;
            }
            for f in &findings {
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
        }
        all.extend(findings);
    }
    let errors = all.iter().filter(|f| f.level == Level::Error).count();
    let warnings = all.len() - errors;
    match format {
        Format::Text => writeln!(
            out,
            "{} checked: {errors} {}, {warnings} {}",
            plural(files.len(), "contract"),
            if errors == 1 { "error" } else { "errors" },
            if warnings == 1 { "warning" } else { "warnings" },
        )?,
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &all)?;
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
    use super::line_of;

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
