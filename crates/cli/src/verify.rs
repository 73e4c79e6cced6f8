//! `idemgate verify CONTRACT...`: each contract's claims checked against its real downstream
//! (`idemgate_verify`), within a budget of effects; the flags are here, the probes there.
//!
//! Before the first effect it prints, on stderr, where each contract's effects go and how many
//! the run may make. On stdout: the verdicts as text, or the whole report as JSON (`--json`);
//! `--report FILE.md` writes the evidence table to keep beside the contract.
//!
//! Exit statuses (as for every command): 0 — no claim refuted (claims not checked are
//! reported, not failed); 1 — at least one claim refuted; 2 — the verification could not be
//! made (a contract that does not load, a downstream not on loopback without `--base-url`,
//! arguments that do not fit, a bad flag).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use idemgate_core::json;
use idemgate_verify::{Options, Target};
use serde_json::Value;

/// Flags of `idemgate verify`.
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// Contract files (YAML) whose claims to check.
    #[arg(required = true, value_name = "CONTRACT")]
    contracts: Vec<PathBuf>,
    /// Where the effects go: `https://staging.example[/prefix]` takes the place of the scheme,
    /// host and port of every contract URL on the effect URL's origin. Required unless the
    /// contract's downstream is on loopback.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Effects the whole run may make, over every contract; a probe that could go past it is
    /// skipped and reported.
    #[arg(long, default_value_t = 10, value_name = "N")]
    budget: u32,
    /// Write the evidence table (scenario, expected, observed, evidence to keep) as markdown.
    #[arg(long, value_name = "FILE.md")]
    report: Option<PathBuf>,
    /// Print the whole report as JSON on stdout instead of the verdicts as text.
    #[arg(long)]
    json: bool,
    /// The arguments the probes send: a JSON object or `@PATH`, for every contract; or
    /// `TOOL=JSON` / `TOOL=@PATH` for one. Default: made from the input schema.
    #[arg(long = "args", value_name = "JSON")]
    arguments: Vec<String>,
    /// How long one probe may follow its operations (a job to its end, say): `30s`, `2m`.
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    probe_timeout: String,
    /// Deliveries (and requests) sent at once by the concurrent probes, 2 to 16.
    #[arg(long, default_value_t = 2, value_name = "N")]
    concurrency: usize,
    /// The tenant of every operation key.
    #[arg(long, default_value = "idemgate", value_name = "NAME")]
    tenant: String,
    /// The environment of every operation key.
    #[arg(long, default_value = "verify", value_name = "NAME")]
    environment: String,
    /// The actor every delivery is made as; the authorization hook must allow it.
    #[arg(long, default_value = "idemgate-verify", value_name = "NAME")]
    actor: String,
    /// The role the hook is told.
    #[arg(long, default_value = "agent", value_name = "ROLE")]
    role: String,
    /// An actor the hook must deny (default: one made up for the run).
    #[arg(long, value_name = "NAME")]
    denied_actor: Option<String>,
    /// The run id in every key (`verify-<run>-<probe>`); default: the time and a random part.
    #[arg(long, value_name = "ID")]
    run: Option<String>,
    /// Print where the effects would go and stop, making none.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let probe_timeout = idemgate_chaos::parse_duration(&args.probe_timeout)
        .map_err(|e| anyhow::anyhow!("--probe-timeout: {e}"))?;
    let options = Options {
        budget: args.budget,
        probe_timeout,
        concurrency: args.concurrency,
        tenant: args.tenant,
        environment: args.environment,
        actor: args.actor,
        role: args.role,
        denied_actor: args.denied_actor,
    };
    let run = args.run.unwrap_or_else(idemgate_verify::run_id);
    options.check(&run)?;
    let arguments = Arguments::read(&args.arguments)?;
    let mut targets = Vec::new();
    for path in &args.contracts {
        let name = tool_name(path);
        let given = arguments.for_tool(name.as_deref());
        targets.push(Target::load(path, args.base_url.as_deref(), given, &run)?);
    }
    arguments.all_used(&targets)?;
    // Before the first effect: where every effect goes, and how many there may be.
    eprint!("{}", idemgate_verify::plan(&targets, &options, &run));
    if args.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    let report = idemgate_verify::verify(&targets, &options, &run).await?;
    if let Some(path) = &args.report {
        std::fs::write(path, report.markdown())
            .with_context(|| format!("--report: cannot write {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", report.text())?;
    }
    out.flush()?;
    Ok(match report.refuted {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

/// The `name` a contract file declares, read leniently: only to match `--args TOOL=…`.
fn tool_name(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let file = path.display().to_string();
    let draft = idemgate_core::contract::ContractFile::parse_draft(&text, &file).ok()?;
    Some(draft.file.name)
}

/// `--args`, read: one for every contract and some per tool.
struct Arguments {
    every: Option<Value>,
    per_tool: BTreeMap<String, Value>,
}

impl Arguments {
    fn read(values: &[String]) -> anyhow::Result<Arguments> {
        let mut read = Arguments {
            every: None,
            per_tool: BTreeMap::new(),
        };
        for value in values {
            let (tool, text) = match value.trim_start().starts_with(['{', '@']) {
                true => (None, value.as_str()),
                false => match value.split_once('=') {
                    Some((tool, text)) => (Some(tool.to_string()), text),
                    None => bail!("--args: write a JSON object, @PATH, or TOOL=JSON"),
                },
            };
            let bytes = match text.strip_prefix('@') {
                Some(path) => {
                    std::fs::read(path).with_context(|| format!("--args: cannot read {path}"))?
                }
                None => text.as_bytes().to_vec(),
            };
            let parsed = json::parse(&bytes)
                .map_err(|e| anyhow::anyhow!("--args is not strict JSON: {e}"))?;
            if !parsed.is_object() {
                bail!("--args: the arguments are a JSON object");
            }
            match tool {
                None if read.every.is_some() => bail!("--args: given twice for every contract"),
                None => read.every = Some(parsed),
                Some(tool) => {
                    if read.per_tool.insert(tool.clone(), parsed).is_some() {
                        bail!("--args: given twice for {tool}");
                    }
                }
            }
        }
        Ok(read)
    }

    fn for_tool(&self, tool: Option<&str>) -> Option<Value> {
        tool.and_then(|t| self.per_tool.get(t))
            .or(self.every.as_ref())
            .cloned()
    }

    /// Every `TOOL=` names a contract of the run: a typo would otherwise send made-up
    /// arguments where the user meant theirs.
    fn all_used(&self, targets: &[Target]) -> anyhow::Result<()> {
        for tool in self.per_tool.keys() {
            if !targets.iter().any(|t| t.tool() == tool) {
                bail!("--args: no contract of this run is named {tool}");
            }
        }
        Ok(())
    }
}
