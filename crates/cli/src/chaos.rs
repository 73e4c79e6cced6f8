//! `idemgate chaos --upstream URL --listen ADDR [faults]`: the fault-injecting proxy
//! (`idemgate_chaos`) for end-to-end tests — an agent → idemgate → the proxy → the system of
//! record. Meant for loopback and staging networks: it forwards whatever reaches it.
//!
//! On start it prints `listening on http://ADDR` (the first line on stdout, for scripts that
//! bind port 0). At SIGINT or SIGTERM it stops accepting, lets every forward in flight finish,
//! prints the ledger's summary and writes the ledger (`--ledger FILE`, JSON).
//!
//! Exit statuses: 0 — no key reached the upstream's commit twice with different references;
//! 1 — at least one did (a duplicate effect; the summary names each key); 2 — the proxy could
//! not run (a bad flag, an address it cannot bind).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use idemgate_chaos::{
    Config, Faults, Proxy, Rates, Rule, parse_duration, parse_script, parse_status,
};
use serde::Serialize;

/// Flags of `idemgate chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Where requests go: `http(s)://host[:port][/prefix]`; each request's path and query
    /// are appended.
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// Where to listen, e.g. `127.0.0.1:7070` (port 0 picks one). Meant for loopback or a
    /// staging network.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The seed of the drawn faults: the same seed gives every key the same faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Rate of requests forwarded whose answer is then dropped (the connection closed).
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    drop: f64,
    /// Rate of connections reset before forwarding (the upstream never sees the request).
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    reset: f64,
    /// Rate of requests held for --delay-for before forwarding.
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    delay: f64,
    /// How long a delayed request is held: `250ms`, `2s`.
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    delay_for: String,
    /// Rate of requests forwarded and then answered with --error-status.
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    error: f64,
    /// The 5xx status an injected error answers.
    #[arg(long, default_value = "502", value_name = "STATUS")]
    error_status: String,
    /// Rate of requests delivered to the upstream twice (the caller hears the first answer).
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    duplicate: f64,
    /// Rate of requests forwarded and then answered 200 with a body that is not JSON.
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    malformed: f64,
    /// A scripted fault, before any rate: `nth=1 drop`, `key=*:charge-* nth=2 error=503`,
    /// `method=POST delay=3s`. Repeatable; the first that matches wins.
    #[arg(long = "rule", value_name = "RULE")]
    rules: Vec<String>,
    /// A file of rules, one per line (`#` comments), after those of --rule.
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
    /// The header that names a request's operation.
    #[arg(long, default_value = "Idempotency-Key", value_name = "NAME")]
    header: String,
    /// JSON pointer to the effect's reference in the upstream's 2xx answers.
    #[arg(long, default_value = "/id", value_name = "POINTER")]
    reference: String,
    /// JSON pointer to the job id in the upstream's 202 answers, if it accepts jobs.
    #[arg(long, value_name = "POINTER")]
    job_id: Option<String>,
    /// Write the ledger (every request, per key, and the summary) here as JSON at exit.
    #[arg(long, value_name = "FILE")]
    ledger: Option<PathBuf>,
    /// How long a forwarded request may take at the upstream.
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    upstream_timeout: String,
}

/// The ledger file.
#[derive(Serialize)]
struct LedgerFile {
    upstream: String,
    seed: u64,
    summary: idemgate_chaos::Summary,
    keys: Vec<idemgate_chaos::KeySummary>,
    entries: Vec<idemgate_chaos::Entry>,
}

fn config(args: &ChaosArgs) -> anyhow::Result<Config> {
    let delay = parse_duration(&args.delay_for).map_err(|e| anyhow::anyhow!("--delay-for: {e}"))?;
    let error_status =
        parse_status(&args.error_status).map_err(|e| anyhow::anyhow!("--error-status: {e}"))?;
    let mut rules = Vec::new();
    for text in &args.rules {
        rules.push(
            Rule::parse(text, delay, error_status)
                .map_err(|e| anyhow::anyhow!("--rule {text:?}: {e}"))?,
        );
    }
    if let Some(path) = &args.script {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--script: cannot read {}", path.display()))?;
        let script = parse_script(&text, delay, error_status)
            .map_err(|e| anyhow::anyhow!("--script {}: {e}", path.display()))?;
        rules.extend(script);
    }
    let mut config = Config::new(args.upstream.clone());
    config.header = args.header.clone();
    config.reference = args.reference.clone();
    config.job_id = args.job_id.clone();
    config.upstream_timeout = parse_duration(&args.upstream_timeout)
        .map_err(|e| anyhow::anyhow!("--upstream-timeout: {e}"))?;
    config.faults = Faults {
        seed: args.seed,
        rates: Rates {
            drop: args.drop,
            reset: args.reset,
            delay: args.delay,
            error: args.error,
            duplicate: args.duplicate,
            malformed: args.malformed,
        },
        rules,
        delay,
        error_status,
    };
    Ok(config)
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let config = config(&args)?;
    let proxy = Proxy::new(config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen: cannot bind {}", args.listen))?;
    let bound = listener.local_addr()?;
    if !bound.ip().is_loopback() {
        eprintln!(
            "idemgate chaos: listening on {bound}, beyond loopback: it forwards whatever reaches it to {} — keep it to a staging network",
            proxy.upstream()
        );
    }
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{bound}")?;
        writeln!(
            out,
            "forwarding to {} (seed {})",
            proxy.upstream(),
            args.seed
        )?;
        out.flush()?;
    }
    proxy
        .serve(listener, crate::signals::shutdown())
        .await
        .context("the proxy stopped")?;
    let ledger = proxy.ledger();
    let summary = ledger.summary();
    if let Some(path) = &args.ledger {
        let file = LedgerFile {
            upstream: proxy.upstream().to_string(),
            seed: args.seed,
            summary: summary.clone(),
            keys: ledger.keys(),
            entries: ledger.entries(),
        };
        let text = serde_json::to_string_pretty(&file)?;
        std::fs::write(path, text)
            .with_context(|| format!("--ledger: cannot write {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    write!(out, "{}", summary.render())?;
    out.flush()?;
    Ok(match summary.has_duplicates() {
        true => ExitCode::from(1),
        false => ExitCode::SUCCESS,
    })
}
