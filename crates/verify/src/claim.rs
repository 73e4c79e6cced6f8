//! What a contract claims about its downstream ([`Claim`]), what the probes found about each
//! ([`Verdict`], [`ClaimVerdict`]), and the seed's decision made again from the confirmed
//! claims rather than the declared ones ([`decide`]).

use idemgate_core::contract::ContractFile;
use idemgate_core::lint;
use serde::Serialize;

use crate::report::Finding;

/// A claim a verification can check. The first five are the contract's own declarations; the
/// last two are what idemgate promises on top of them, checked with this downstream in the
/// loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Claim {
    /// `downstream.http.reference`: a committed effect is answered 2xx with its reference
    /// where the pointer says (for a job: the poll's answer at `job.reference`).
    Reference,
    /// `downstream.deduplicates_by_key`: a request repeated under a used key makes no second
    /// effect.
    DeduplicatesByKey,
    /// `downstream.receipt_lookup`: the lookup by key finds a committed effect with its
    /// reference, and finds nothing for a key never used.
    ReceiptLookup,
    /// `downstream.async_jobs`: a `202` names a job whose poll reaches an end and names the
    /// effect's reference.
    AsyncJobs,
    /// `security.authorization_hook`: the hook allows an actor it knows and denies one it
    /// does not.
    AuthorizationHook,
    /// How an answer lost after the commit settles: by the lookup or a resend to the one
    /// effect, or `unknown` where the contract offers neither.
    Recovery,
    /// Any number of deliveries of one operation key make one effect.
    OneEffectPerKey,
}

impl Claim {
    pub const ALL: [Claim; 7] = [
        Claim::Reference,
        Claim::DeduplicatesByKey,
        Claim::ReceiptLookup,
        Claim::AsyncJobs,
        Claim::AuthorizationHook,
        Claim::Recovery,
        Claim::OneEffectPerKey,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Claim::Reference => "reference",
            Claim::DeduplicatesByKey => "deduplicates_by_key",
            Claim::ReceiptLookup => "receipt_lookup",
            Claim::AsyncJobs => "async_jobs",
            Claim::AuthorizationHook => "authorization_hook",
            Claim::Recovery => "recovery",
            Claim::OneEffectPerKey => "one_effect_per_key",
        }
    }

    /// Whether the contract makes this claim.
    pub fn declared(self, cf: &ContractFile) -> bool {
        match self {
            Claim::Reference | Claim::Recovery | Claim::OneEffectPerKey => true,
            Claim::DeduplicatesByKey => cf.downstream.deduplicates_by_key,
            Claim::ReceiptLookup => cf.downstream.receipt_lookup,
            Claim::AsyncJobs => cf.downstream.async_jobs,
            Claim::AuthorizationHook => cf.security.authorization_hook.is_some(),
        }
    }

    /// The claim in words, as this contract makes it (or does not).
    pub fn statement(self, cf: &ContractFile) -> String {
        let http = cf.downstream.http.as_ref();
        let pointer = |path: &[&str]| {
            http.and_then(|h| path.iter().try_fold(h, |at, part| at.get(part)))
                .and_then(|v| v.as_str())
                .unwrap_or("?")
                .to_string()
        };
        let declared = self.declared(cf);
        match self {
            Claim::Reference if cf.downstream.async_jobs => format!(
                "a committed effect answers 2xx with its reference at `{}`, a job's poll at `{}`",
                pointer(&["reference"]),
                pointer(&["job", "reference"])
            ),
            Claim::Reference => format!(
                "a committed effect answers 2xx with its reference at `{}`",
                pointer(&["reference"])
            ),
            Claim::DeduplicatesByKey if declared => {
                "a request repeated under a used key makes no second effect".into()
            }
            Claim::ReceiptLookup if declared => format!(
                "the lookup `{}` finds a committed effect by key, and nothing for a key never used",
                pointer(&["lookup", "url"])
            ),
            Claim::AsyncJobs if declared => {
                "a 202 names a job whose poll reaches its end with the effect's reference".into()
            }
            Claim::AuthorizationHook if declared => {
                "the authorization hook allows a known actor and denies an unknown one".into()
            }
            Claim::DeduplicatesByKey
            | Claim::ReceiptLookup
            | Claim::AsyncJobs
            | Claim::AuthorizationHook => "not claimed".into(),
            Claim::Recovery => match recovery_path(cf) {
                Some(path) => format!(
                    "an answer lost after the commit is settled by {path} to the one effect"
                ),
                None => "an answer lost after the commit ends `unknown` (no lookup, no deduplication): never sent again".into(),
            },
            Claim::OneEffectPerKey => {
                "deliveries of one operation key make one effect; a changed request under it is refused".into()
            }
        }
    }
}

/// How the contract says a lost answer is settled, in words; `None` when nothing settles it.
pub(crate) fn recovery_path(cf: &ContractFile) -> Option<&'static str> {
    match (
        cf.downstream.receipt_lookup,
        cf.downstream.deduplicates_by_key,
    ) {
        (true, true) => Some("the receipt lookup (or a resend under the same key)"),
        (true, false) => Some("the receipt lookup"),
        (false, true) => Some("a resend under the same key"),
        (false, false) => None,
    }
}

/// What a probe, or a claim as a whole, came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The downstream behaved as claimed.
    Confirmed,
    /// It did not; the evidence shows how.
    Refuted,
    /// Nothing could be concluded (not claimed, over the budget, the downstream unavailable,
    /// an earlier probe's failure), and why.
    NotChecked,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Confirmed => "confirmed",
            Verdict::Refuted => "refuted",
            Verdict::NotChecked => "not checked",
        }
    }
}

/// One claim's verdict over every probe that bears on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimVerdict {
    pub claim: Claim,
    pub declared: bool,
    /// The claim in words, as the contract makes it.
    pub statement: String,
    pub verdict: Verdict,
    /// Why: the first refuting probe's observation, the confirming probes, or why nothing was
    /// checked.
    pub reason: String,
    /// The probes that bear on it, by id.
    pub probes: Vec<String>,
}

/// Refuted when any probe refuted it, confirmed when some confirmed it and none refuted it,
/// otherwise not checked.
pub fn judge(claim: Claim, cf: &ContractFile, findings: &[Finding]) -> ClaimVerdict {
    let bearing: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.claims.contains(&claim))
        .collect();
    let probes = bearing.iter().map(|f| f.probe.to_string()).collect();
    let declared = claim.declared(cf);
    let named = |verdict: Verdict| -> Vec<&Finding> {
        bearing
            .iter()
            .copied()
            .filter(|f| f.verdict == verdict)
            .collect()
    };
    let (verdict, reason) = if let Some(first) = named(Verdict::Refuted).first() {
        (
            Verdict::Refuted,
            format!("{}: {}", first.probe, first.observed),
        )
    } else if !named(Verdict::Confirmed).is_empty() {
        let by: Vec<&str> = named(Verdict::Confirmed).iter().map(|f| f.probe).collect();
        (
            Verdict::Confirmed,
            format!("confirmed by {}", by.join(", ")),
        )
    } else if !declared {
        (
            Verdict::NotChecked,
            "the contract does not claim it".to_string(),
        )
    } else if bearing.is_empty() {
        (Verdict::NotChecked, "no probe could check it".to_string())
    } else {
        let why: Vec<String> = bearing
            .iter()
            .map(|f| format!("{}: {}", f.probe, f.observed))
            .collect();
        (Verdict::NotChecked, why.join("; "))
    };
    ClaimVerdict {
        claim,
        declared,
        statement: claim.statement(cf),
        verdict,
        reason,
        probes,
    }
}

/// The seed's decision twice: from the contract as declared (what `contract lint` says), and
/// from what the verification confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decisions {
    pub declared: lint::Verdict,
    pub verified: lint::Verdict,
}

/// Decides with the linter's own rules: once over the contract as written, once over a copy in
/// which deduplication and the receipt lookup are claimed only where a probe confirmed them,
/// with every refuted claim counted as an error (`refuted:<claim>`), since a contract that
/// claims what its downstream does not do makes idemgate act on a falsehood.
pub fn decide(written: &ContractFile, claims: &[ClaimVerdict]) -> Decisions {
    let errors = |cf: &ContractFile| -> Vec<&'static str> {
        lint::lint(cf)
            .into_iter()
            .filter(|f| f.level == lint::Level::Error)
            .map(|f| f.rule)
            .collect()
    };
    let declared = lint::decide(Some(written), &errors(written));
    let confirmed = |claim: Claim| {
        claims
            .iter()
            .any(|c| c.claim == claim && c.verdict == Verdict::Confirmed)
    };
    let mut verified = written.clone();
    verified.downstream.deduplicates_by_key &= confirmed(Claim::DeduplicatesByKey);
    verified.downstream.receipt_lookup &= confirmed(Claim::ReceiptLookup);
    let refuted: Vec<String> = claims
        .iter()
        .filter(|c| c.verdict == Verdict::Refuted)
        .map(|c| format!("refuted:{}", c.claim.as_str()))
        .collect();
    let mut all: Vec<&str> = errors(&verified);
    all.extend(refuted.iter().map(String::as_str));
    Decisions {
        declared,
        verified: lint::decide(Some(&verified), &all),
    }
}
