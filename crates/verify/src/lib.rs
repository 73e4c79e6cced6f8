//! `idemgate verify`: prove a contract's claims against the real downstream before an agent
//! gets the tool.
//!
//! A contract says what its downstream does — deduplicates on the key, finds a receipt by key,
//! answers a job with a 202, rechecks through a hook — and every guarantee idemgate gives rests
//! on those sentences. The linter checks that they are well-formed; this crate checks that they
//! are true, with the fewest effects it can, every one under a key that says it is a
//! verification, never more than a budget.
//!
//! Reading order:
//!
//! - [`Target`] — a contract made ready: loaded as `serve` loads it, its URLs moved to the
//!   base URL the user named (a contract whose downstream is not on loopback is refused
//!   without one), the arguments every probe sends ([`sample`] makes them from the input
//!   schema when the user gives none).
//! - [`verify`] — for each target, a session: the real executor (the contract's
//!   `HttpDownstream` and hook, a throwaway SQLite store) whose every request passes through
//!   the verification's own fault proxy ([`idemgate_chaos::Proxy`]), which records what the
//!   downstream answered and breaks answers where a probe asks it to; then the [`Probe`]s in
//!   order, each bounded in time and admitted only if its worst case fits the [`Budget`] left.
//! - [`Finding`] — what one probe expected and observed, with its [`Evidence`]; [`Claim`] and
//!   [`claim::judge`] turn the findings into a [`Verdict`] per claim — confirmed, refuted (the
//!   evidence shows how) or not checked (and why) — and [`claim::decide`] makes the seed's
//!   decision again from the confirmed claims.
//! - [`Report`] — the run: the seed's evidence table in markdown ([`Report::markdown`], the
//!   contract's release artifact), text for a terminal, JSON for machines.
//!
//! The `testing` feature adds [`testing`]: fake downstreams that count their own effects, one
//! per behaviour a verification must tell apart.

mod budget;
pub mod claim;
mod probes;
mod report;
pub mod sample;
mod session;
mod target;

#[cfg(feature = "testing")]
pub mod testing;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemgate_core::contract::LoadError;
use idemgate_core::key::OperationKey;

pub use budget::Budget;
pub use claim::{Claim, ClaimVerdict, Decisions, Verdict};
pub use probes::Probe;
pub use report::{Answer, ContractReport, Evidence, Finding, Report, SCHEMA_VERSION};
pub use target::Target;

/// How a run is made.
#[derive(Debug, Clone)]
pub struct Options {
    /// Effects the whole run may make (`--budget`).
    pub budget: u32,
    /// How long one probe may follow its operations (`--probe-timeout`).
    pub probe_timeout: Duration,
    /// Deliveries (and requests) sent at once by the concurrent probes (`--concurrency`).
    pub concurrency: usize,
    /// The tenant, environment, actor and role of every delivery: the first two are parts of
    /// every key, the last two what the authorization hook is asked about.
    pub tenant: String,
    pub environment: String,
    pub actor: String,
    pub role: String,
    /// An actor the hook must deny; by default one made up for the run, which no system knows.
    pub denied_actor: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            budget: 10,
            probe_timeout: Duration::from_secs(30),
            concurrency: 2,
            tenant: "idemgate".into(),
            environment: "verify".into(),
            actor: "idemgate-verify".into(),
            role: "agent".into(),
            denied_actor: None,
        }
    }
}

impl Options {
    /// Checks what a key is made of, naming the option that is wrong.
    pub fn check(&self, run: &str) -> Result<(), Error> {
        let key = OperationKey::new(
            &self.tenant,
            &self.environment,
            &format!("verify-{run}-concurrent-deliveries"),
            "1",
        );
        if let Err(e) = key {
            return Err(Error::Option {
                name: "--tenant, --environment or --run",
                message: format!("they make no operation key: {e}"),
            });
        }
        if self.concurrency < 2 || self.concurrency > 16 {
            return Err(Error::Option {
                name: "--concurrency",
                message: "must be from 2 to 16".into(),
            });
        }
        if self.probe_timeout.is_zero() {
            return Err(Error::Option {
                name: "--probe-timeout",
                message: "must be longer than zero".into(),
            });
        }
        Ok(())
    }
}

/// Why a verification could not be made. Each names what is wrong: the file, the option.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{file}: {message}")]
    Read { file: String, message: String },
    #[error(transparent)]
    Contract(LoadError),
    #[error("{file}: {message}")]
    Http { file: String, message: String },
    #[error("{file}: cannot be verified: {reason}")]
    Unsupported { file: String, reason: String },
    #[error(
        "{file}: its downstream is {origin}, not a loopback address; verify makes real effects, so name where they go: --base-url https://staging.example (or --base-url {origin} to verify against it on purpose)"
    )]
    NotLoopback { file: String, origin: String },
    #[error("--base-url: {0}")]
    BaseUrl(String),
    #[error("{tool}: {message}")]
    Arguments { tool: String, message: String },
    #[error("{name}: {message}")]
    Option { name: &'static str, message: String },
    #[error("the verification could not be set up: {0}")]
    Setup(String),
}

/// A run id: the time in milliseconds and a random part, in hex. Unique enough that two runs
/// never share a key; short enough to read in a downstream's logs.
pub fn run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    // `RandomState` is seeded from the OS's randomness once per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(millis);
    format!("{millis:x}{:04x}", hasher.finish() & 0xffff)
}

/// What a run will do, for people, before its first effect: where each contract's effects go
/// and how many effects the run may make.
pub fn plan(targets: &[Target], options: &Options, run: &str) -> String {
    let mut out = format!(
        "idemgate verify run {run}: at most {} effects in all (--budget), each under a key `{}:{}:verify-{run}-<probe>:1`\n",
        options.budget, options.tenant, options.environment
    );
    for t in targets {
        out.push_str(&format!(
            "  {} ({}): effects to {}\n",
            t.tool(),
            t.file,
            t.effect_url
        ));
        if let Some(hook) = &t.hook_url {
            out.push_str(&format!("    authorization hook {hook}\n"));
        }
        for other in &t.elsewhere {
            out.push_str(&format!(
                "    also {other} (another origin, left as written)\n"
            ));
        }
    }
    out
}

/// Verifies each target in turn, within one budget, and reports.
pub async fn verify(targets: &[Target], options: &Options, run: &str) -> Result<Report, Error> {
    options.check(run)?;
    let started_at = utc(SystemTime::now());
    let budget = Arc::new(Budget::new(options.budget));
    let mut contracts = Vec::new();
    for target in targets {
        contracts.push(verify_one(target, options, run, budget.clone()).await?);
    }
    let refuted = contracts.iter().map(ContractReport::refuted).sum();
    Ok(Report {
        schema: SCHEMA_VERSION,
        run: run.to_string(),
        started_at,
        budget: options.budget,
        effects: budget.spent(),
        refuted,
        contracts,
    })
}

async fn verify_one(
    target: &Target,
    options: &Options,
    run: &str,
    budget: Arc<Budget>,
) -> Result<ContractReport, Error> {
    let mut session = session::Session::open(target, options, run, budget.clone()).await?;
    let mut findings = Vec::new();
    for probe in Probe::ALL {
        if let Some(why) = probe.skip(&session) {
            findings.push(probe.not_run(&session, why));
            continue;
        }
        let worst = probe.worst(&session);
        if worst > budget.left() {
            let why = format!(
                "skipped: it may make {worst} effects and {} of the budget are left (raise --budget)",
                budget.left()
            );
            findings.push(probe.not_run(&session, why));
            continue;
        }
        let started = Instant::now();
        let deadline = started + options.probe_timeout;
        // The hard bound: a probe follows its operations until its deadline and then reports;
        // this only stops one stuck on a downstream that holds a request open.
        let hard = options.probe_timeout + Duration::from_secs(15);
        let before = session.sent();
        match tokio::time::timeout(hard, probe.run(&mut session, deadline)).await {
            Ok(finding) => findings.push(finding),
            Err(_) => {
                let mut finding = probe.not_run(
                    &session,
                    format!("did not finish within {}s", hard.as_secs()),
                );
                finding.effects = session.sent() - before;
                findings.push(finding);
            }
        }
    }
    let effects = session.sent();
    session.close().await;
    let claims: Vec<ClaimVerdict> = Claim::ALL
        .iter()
        .map(|c| claim::judge(*c, &target.written, &findings))
        .collect();
    let decision = claim::decide(&target.written, &claims);
    Ok(ContractReport {
        file: target.file.clone(),
        tool: target.tool().to_string(),
        version: target.contract.version.clone(),
        effect_class: target.contract.effect_class.as_str().to_string(),
        base_url: target.base.clone(),
        effect_url: target.effect_url.clone(),
        effects,
        claims,
        probes: findings,
        decision,
    })
}

/// A time as RFC 3339 in UTC, to the second.
fn utc(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match chrono::DateTime::from_timestamp(secs as i64, 0) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        None => "1970-01-01T00:00:00Z".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        let at = |s: u64| utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_796_515_200 + 3_661), "2026-12-06T01:01:01Z");
        assert_eq!(at(1_796_515_199), "2026-12-05T23:59:59Z");
    }

    #[test]
    fn run_ids_are_key_parts() {
        let id = run_id();
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        assert!(OperationKey::new("t", "e", &format!("verify-{id}-x"), "1").is_ok());
    }
}
