//! The report: one [`Finding`] per probe with its [`Evidence`], each claim's verdict, and the
//! decision, for a contract; a [`Report`] for the run. Rendered as the seed's evidence table in
//! markdown ([`Report::markdown`], kept beside the contract), as text for a terminal
//! ([`Report::text`]), and serialised as JSON (`--json`; the schema is in `docs/verify.md`).

use std::fmt::Write as _;

use idemgate_chaos::{Entry, Told};
use serde::Serialize;

use crate::claim::{Claim, ClaimVerdict, Decisions, Verdict};

/// The version of the JSON report's shape; grows when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// What one probe found.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The probe's id (`same-key-resend`, …).
    pub probe: &'static str,
    /// The claims it bears on.
    pub claims: Vec<Claim>,
    /// The seed's scenario, in words.
    pub scenario: String,
    pub expected: String,
    pub observed: String,
    pub verdict: Verdict,
    /// Requests that could have made an effect, counted against the budget.
    pub effects: u32,
    pub evidence: Evidence,
}

/// What to keep: the keys, every exchange with the downstream under them (as the verification's
/// own proxy saw it), idemgate's answers, fingerprints where they matter.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Evidence {
    pub keys: Vec<String>,
    /// Requests to the downstream under these keys, in order: status and reference of each
    /// copy forwarded, the fault the probe injected, what the caller was told.
    pub exchanges: Vec<Entry>,
    pub answers: Vec<Answer>,
    pub fingerprints: Vec<String>,
    pub notes: Vec<String>,
}

/// One answer a probe received: idemgate's outcome for a delivery, or the downstream's
/// classified answer to a request the probe sent itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub key: String,
    /// `idemgate` (a delivery through the executor) or `downstream` (sent by the probe).
    pub via: &'static str,
    /// The label (`applied`, `replayed`, `in_flight`, `rejected`, `unknown`) or the
    /// downstream answer's class (`committed`, `accepted`, `refused`, `ambiguous`, …).
    pub outcome: String,
    pub reference: Option<String>,
    /// The error code or reason, where there is one.
    pub detail: Option<String>,
}

impl Evidence {
    /// One line for the evidence column: keys, exchanges, answers, fingerprints, notes.
    pub fn brief(&self) -> String {
        let mut parts = Vec::new();
        for key in &self.keys {
            parts.push(format!("key `{key}`"));
        }
        for e in &self.exchanges {
            let copies: Vec<String> = e
                .upstream
                .iter()
                .map(|u| match (u.status, &u.reference, &u.error) {
                    (Some(s), Some(r), _) => format!("{s} `{r}`"),
                    (Some(s), None, _) => s.to_string(),
                    (None, _, Some(err)) => format!("no answer ({err})"),
                    (None, _, None) => "no answer".into(),
                })
                .collect();
            let upstream = match copies.is_empty() {
                true => "not forwarded".to_string(),
                false => copies.join(" + "),
            };
            let told = match e.told {
                Told::Dropped => " (answer dropped)".to_string(),
                Told::Reset => " (connection reset before forwarding)".to_string(),
                Told::Malformed => " (told a malformed 200)".to_string(),
                Told::Status(s) if e.fault.starts_with("error") => format!(" (told {s})"),
                Told::Status(_) => String::new(),
            };
            parts.push(format!("{} {} → {upstream}{told}", e.method, e.path));
        }
        for a in &self.answers {
            let mut line = format!("{} `{}`", a.via, a.outcome);
            if let Some(r) = &a.reference {
                let _ = write!(line, " `{r}`");
            }
            if let Some(d) = &a.detail {
                let _ = write!(line, " ({d})");
            }
            parts.push(line);
        }
        for f in &self.fingerprints {
            parts.push(format!("fingerprint `{f}`"));
        }
        parts.extend(self.notes.iter().cloned());
        parts.join("; ")
    }
}

/// One contract's verification.
#[derive(Debug, Clone, Serialize)]
pub struct ContractReport {
    pub file: String,
    pub tool: String,
    pub version: String,
    pub effect_class: String,
    /// Where its effects went: the base URL every URL on the effect's origin was moved to.
    pub base_url: String,
    /// The effect's URL template, on that base.
    pub effect_url: String,
    /// Effects made for this contract.
    pub effects: u32,
    pub claims: Vec<ClaimVerdict>,
    pub probes: Vec<Finding>,
    pub decision: Decisions,
}

impl ContractReport {
    pub fn refuted(&self) -> usize {
        self.claims
            .iter()
            .filter(|c| c.verdict == Verdict::Refuted)
            .count()
    }
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// The run's id: every key this run used starts its workflow id with `verify-<run>-`.
    pub run: String,
    /// When the run started, UTC, RFC 3339.
    pub started_at: String,
    pub budget: u32,
    /// Effects made in all.
    pub effects: u32,
    /// Claims refuted in all; the command exits 1 when this is not 0.
    pub refuted: usize,
    pub contracts: Vec<ContractReport>,
}

/// A markdown table cell: no pipe breaks the table, no newline breaks the row.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

impl Report {
    /// The evidence table, per contract, to keep beside it as its release artifact.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# idemgate verify — run `{}`\n", self.run);
        let _ = writeln!(
            out,
            "Started {}. {} effects made of a budget of {}; {} claims refuted.\n",
            self.started_at, self.effects, self.budget, self.refuted
        );
        let _ = writeln!(
            out,
            "Every effect was made under an operation key whose workflow id is `verify-{}-<probe>`, which the downstream received as its idempotency key.\n",
            self.run
        );
        for c in &self.contracts {
            let _ = writeln!(out, "## `{}` version `{}`\n", c.tool, c.version);
            let _ = writeln!(out, "- contract: `{}` ({})", c.file, c.effect_class);
            let _ = writeln!(
                out,
                "- downstream: `{}` (effect `{}`)",
                c.base_url, c.effect_url
            );
            let _ = writeln!(out, "- effects made: {}\n", c.effects);
            let _ = writeln!(out, "### Claims\n");
            let _ = writeln!(out, "| claim | the contract says | verdict | why |");
            let _ = writeln!(out, "|---|---|---|---|");
            for claim in &c.claims {
                let verdict = match claim.verdict {
                    Verdict::Refuted => "**refuted**".to_string(),
                    v => v.as_str().to_string(),
                };
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {} |",
                    claim.claim.as_str(),
                    cell(&claim.statement),
                    verdict,
                    cell(&claim.reason)
                );
            }
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "**Decision.** As declared: *{}* — {}. From the confirmed claims: **{}** — {}.\n",
                c.decision.declared.decision.as_str(),
                cell(&c.decision.declared.reason),
                c.decision.verified.decision.as_str(),
                cell(&c.decision.verified.reason)
            );
            let _ = writeln!(out, "### Evidence\n");
            let _ = writeln!(
                out,
                "| scenario | expected | observed | evidence to keep | verdict |"
            );
            let _ = writeln!(out, "|---|---|---|---|---|");
            for f in &c.probes {
                let _ = writeln!(
                    out,
                    "| {} (`{}`) | {} | {} | {} | {} |",
                    cell(&f.scenario),
                    f.probe,
                    cell(&f.expected),
                    cell(&f.observed),
                    cell(&f.evidence.brief()),
                    f.verdict.as_str()
                );
            }
            let _ = writeln!(out);
        }
        out
    }

    /// The verdicts for a terminal: each contract's claims, decision and refutations.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.contracts {
            let _ = writeln!(
                out,
                "{} ({}) against {}: {} effects",
                c.tool, c.file, c.base_url, c.effects
            );
            for claim in &c.claims {
                let _ = writeln!(
                    out,
                    "  {:<12} {:<20} {}",
                    claim.verdict.as_str(),
                    claim.claim.as_str(),
                    claim.reason
                );
            }
            let _ = writeln!(
                out,
                "  decision: {} (as declared: {})",
                c.decision.verified.decision.as_str(),
                c.decision.declared.decision.as_str()
            );
            let _ = writeln!(out, "    {}", c.decision.verified.reason);
        }
        let _ = writeln!(
            out,
            "run {}: {} effects of a budget of {}; {}",
            self.run,
            self.effects,
            self.budget,
            match self.refuted {
                0 => "no claim refuted".to_string(),
                1 => "1 claim refuted".to_string(),
                n => format!("{n} claims refuted"),
            }
        );
        out
    }
}
