//! The review of a tool contract as a linter: each red flag with its reason and the field it
//! concerns. Works on the file form, so a contract that would not load is still reviewed.
//! [`decide`] ends a review with a decision — `automate`, `automate with approval`, `keep
//! manual until reconciliation exists`, `fix the contract first` or `not reviewed` — and why.

use serde::Serialize;

use crate::contract::{ApprovalRule, ContractFile, EffectClass};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub level: Level,
    /// A stable identifier of the rule.
    pub rule: &'static str,
    pub field: String,
    pub reason: String,
}

/// Every rule the linter raises, in the order it checks them; `docs/contracts.md` lists each.
pub const RULES: &[&str] = &[
    "no-version",
    "no-purpose",
    "no-do-not-use-when",
    "non-idempotent-exposed",
    "key-without-tenant",
    "key-without-step",
    "key-supplier-unstated",
    "key-not-from-application",
    "no-receipt-path",
    "no-reconciliation-owner",
    "no-material-fields",
    "fingerprint-over-everything",
    "transport-field-in-fingerprint",
    "irreversible-without-approval",
    "no-authorization-recheck",
    "no-version-precondition",
    "no-retention",
    "retention-shorter-than-retry-window",
    "record-shorter-than-retry-window",
    "record-shorter-than-job",
    "no-next-review",
];

/// Argument names that describe the transport or the attempt, not the operation.
const TRANSPORT_FIELDS: &[&str] = &[
    "trace_id",
    "traceparent",
    "span_id",
    "request_id",
    "retry",
    "retries",
    "retry_count",
    "attempt",
    "attempts",
    "timestamp",
    "received_at",
    "sent_at",
    "created_at",
    "idempotency_key",
    "operation_key",
    "tool_call_id",
    "call_id",
    "nonce",
    "model",
];

fn is_transport(field: &str) -> bool {
    let f = field.to_ascii_lowercase();
    TRANSPORT_FIELDS.contains(&f.as_str()) || f.ends_with("_trace_id") || f.ends_with("_at")
}

/// Reviews one contract file.
pub fn lint(cf: &ContractFile) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut flag = |level, rule: &'static str, field: &str, reason: String| {
        debug_assert!(RULES.contains(&rule), "{rule} is not in RULES");
        out.push(Finding {
            level,
            rule,
            field: field.to_string(),
            reason,
        })
    };
    use Level::{Error, Warning};
    let keyed = matches!(
        cf.effect_class,
        EffectClass::KeyBased | EffectClass::Irreversible
    );

    if cf.version.as_deref().is_none_or(|v| v.trim().is_empty()) {
        flag(
            Error,
            "no-version",
            "version",
            "no contract version: a change of meaning cannot be told from an old fingerprint"
                .into(),
        );
    }
    if cf.purpose.as_deref().is_none_or(|p| p.trim().is_empty()) {
        flag(
            Warning,
            "no-purpose",
            "purpose",
            "no purpose: the model and the reviewer cannot tell what business effect occurs".into(),
        );
    }
    if cf.effect_class != EffectClass::Read && cf.do_not_use_when.is_empty() {
        flag(
            Warning,
            "no-do-not-use-when",
            "do_not_use_when",
            "no do_not_use_when: say when the model must not call this (checking, sending again)"
                .into(),
        );
    }
    if cf.effect_class == EffectClass::NonIdempotent {
        flag(Error, "non-idempotent-exposed", "effect_class",
            "a non_idempotent tool repeats its effect on every delivery; redesign it as a keyed command or an absolute update".into());
    }
    if keyed || cf.effect_class == EffectClass::NonIdempotent {
        let scope = &cf.operation_key.scope;
        if !scope.iter().any(|s| s == "tenant") {
            flag(Error, "key-without-tenant", "operation_key.scope",
                "the key scope does not include the tenant: one tenant's key could find another's operation".into());
        }
        if !scope.iter().any(|s| s == "workflow_id" || s == "step_id") {
            flag(Warning, "key-without-step", "operation_key.scope",
                "the key scope names no workflow or step: a retry of one step cannot be told from a new step".into());
        }
        if cf.operation_key.supplied_by.is_none() {
            flag(
                Error,
                "key-supplier-unstated",
                "operation_key.supplied_by",
                "the contract does not say who supplies the key; write `supplied_by: application` (the workflow step names it, never the model)".into(),
            );
        }
        if let Some(by) = &cf.operation_key.supplied_by
            && by != "application"
        {
            flag(
                Error,
                "key-not-from-application",
                "operation_key.supplied_by",
                format!(
                    "the key is supplied by `{by}`; only the application knows the workflow step (never the model, a tool-call id or a timestamp)"
                ),
            );
        }
        let dl = &cf.downstream;
        if !dl.deduplicates_by_key && !dl.receipt_lookup {
            flag(Error, "no-receipt-path", "downstream",
                "neither downstream deduplication on the key nor a receipt lookup: a lost response after the effect can only end in unknown".into());
        }
        if cf
            .owner
            .reconciliation
            .as_deref()
            .is_none_or(|o| o.trim().is_empty())
        {
            flag(
                Error,
                "no-reconciliation-owner",
                "owner.reconciliation",
                "nobody owns the unknown-outcome queue".into(),
            );
        }
    }
    let fields = &cf.request_fingerprint.fields;
    if cf.effect_class != EffectClass::Read {
        if fields.is_empty() {
            flag(
                Error,
                "no-material-fields",
                "request_fingerprint.fields",
                "no material fields: the fingerprint cannot prove what the operation contained"
                    .into(),
            );
        } else if fields.iter().any(|f| f == "*") {
            flag(Error, "fingerprint-over-everything", "request_fingerprint.fields",
                "the fingerprint covers every field, including any transport field a retry changes; name the material fields".into());
        }
        for f in fields.iter().filter(|f| is_transport(f)) {
            flag(
                Error,
                "transport-field-in-fingerprint",
                "request_fingerprint.fields",
                format!(
                    "`{f}` describes the delivery (trace, retry, time or key), not the operation: every retry would mismatch"
                ),
            );
        }
    }
    if cf.effect_class == EffectClass::Irreversible && cf.security.approval == ApprovalRule::Never {
        flag(
            Error,
            "irreversible-without-approval",
            "security.approval",
            "an irreversible effect is exposed without approval".into(),
        );
    }
    if !cf.security.recheck_authorization && cf.effect_class != EffectClass::Read {
        flag(Warning, "no-authorization-recheck", "security.recheck_authorization",
            "authorization is not rechecked before the effect: a retry could outlive a revoked permission".into());
    }
    if cf.effect_class == EffectClass::NaturalIdempotent
        && cf.downstream.version_precondition.is_none()
    {
        flag(
            Warning,
            "no-version-precondition",
            "downstream.version_precondition",
            "an absolute update without a version precondition can overwrite a newer change".into(),
        );
    }
    match &cf.retention {
        None if keyed => flag(
            Error,
            "no-retention",
            "retention",
            "no retention rule: how long a retry still finds its record is undefined".into(),
        ),
        None => {}
        Some(r) => {
            if r.record_ttl.seconds() + r.tombstone_ttl.seconds() < r.max_retry_window.seconds() {
                flag(
                    Error,
                    "retention-shorter-than-retry-window",
                    "retention",
                    format!(
                        "record {} + tombstone {} is shorter than the retry window {}: a late retry becomes a new effect",
                        r.record_ttl, r.tombstone_ttl, r.max_retry_window
                    ),
                );
            } else if r.record_ttl.seconds() < r.max_retry_window.seconds() {
                flag(
                    Warning,
                    "record-shorter-than-retry-window",
                    "retention.record_ttl",
                    format!(
                        "the full record ({}) is kept shorter than the retry window ({}); late retries see only the tombstone",
                        r.record_ttl, r.max_retry_window
                    ),
                );
            }
        }
    }
    // A caller waits for a job's result on the job's own time scale: the full record, with the
    // result, must outlive the job deadline, or a job that settles early is only a tombstone
    // (a reference, no result) when its caller comes back.
    if let (Ok(Some(max_running)), Some(r)) = (crate::contract::job_max_running(cf), &cf.retention)
        && r.record_ttl.seconds() < max_running.seconds()
    {
        flag(
            Error,
            "record-shorter-than-job",
            "retention.record_ttl",
            format!(
                "the full record ({}) is kept shorter than the job deadline \
                 downstream.http.job.max_running ({}): a caller polling on the job's time scale \
                 finds its result compacted",
                r.record_ttl, max_running
            ),
        );
    }
    if cf.owner.next_review.is_none() {
        flag(
            Warning,
            "no-next-review",
            "owner.next_review",
            "no date for the next review".into(),
        );
    }
    out.sort_by_key(|f| std::cmp::Reverse(f.level));
    out
}

/// The closing decision of a tool review: whether agents may call the tool unattended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Decision {
    #[serde(rename = "automate")]
    Automate,
    #[serde(rename = "automate with approval")]
    AutomateWithApproval,
    /// The contract is readable, but its effect boundary is not safe: a lost answer could not
    /// be settled, or the key cannot be trusted.
    #[serde(rename = "keep manual until reconciliation exists")]
    KeepManual,
    /// The contract has faults the gateway would refuse, or retries would mishandle, none of
    /// them about the effect boundary: a mistake to fix, not a design to rethink.
    #[serde(rename = "fix the contract first")]
    FixContract,
    /// The file could not be read, or is not a contract at all: nothing was reviewed.
    #[serde(rename = "not reviewed")]
    NotReviewed,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Automate => "automate",
            Decision::AutomateWithApproval => "automate with approval",
            Decision::KeepManual => "keep manual until reconciliation exists",
            Decision::FixContract => "fix the contract first",
            Decision::NotReviewed => "not reviewed",
        }
    }
}

/// A decision and its reason, one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub decision: Decision,
    pub reason: String,
}

/// Errors that concern the effect boundary itself, named first in a reason: without them
/// fixed, a lost answer cannot be settled.
const BOUNDARY: &[&str] = &[
    "non-idempotent-exposed",
    "no-receipt-path",
    "no-reconciliation-owner",
    "key-not-from-application",
    "key-supplier-unstated",
    "key-without-tenant",
];

/// Decides from the effect boundary, never from how reliable the model seems. `errors` are the
/// rules of every error the review found (the linter's, and the parser's or loader's); `cf` is
/// the contract as reviewed, absent when the file could not be read at all.
///
/// A file that cannot be read at all is `not reviewed`. An error about the effect boundary
/// (a lost answer could not be settled, the key cannot be trusted, or a claim about the
/// downstream was refuted: rules `refuted:<claim>`) keeps the tool manual until reconciliation
/// exists; any other error is a mistake to fix first. Otherwise an irreversible tool, or one
/// whose operations wait for an operator, is automated with approval; the rest are automated.
pub fn decide(cf: Option<&ContractFile>, errors: &[&str]) -> Verdict {
    let Some(cf) = cf else {
        return Verdict {
            decision: Decision::NotReviewed,
            reason: "the file cannot be read as a contract: fix the error above, then lint again"
                .into(),
        };
    };
    let boundary = |rule: &str| BOUNDARY.contains(&rule) || rule.starts_with("refuted:");
    if !errors.is_empty() {
        let mut named: Vec<&str> = BOUNDARY
            .iter()
            .copied()
            .filter(|r| errors.contains(r))
            .collect();
        for rule in errors {
            if !named.contains(rule) {
                named.push(rule);
            }
        }
        let shown = if named.len() > 4 {
            format!("{}, and {} more", named[..4].join(", "), named.len() - 4)
        } else {
            named.join(", ")
        };
        let on_boundary = named.iter().any(|r| boundary(r));
        let why = if on_boundary {
            "a lost answer could not be settled, or the key cannot be trusted"
        } else if named.contains(&"placeholder") {
            "placeholders of the draft are still in place"
        } else if named
            .iter()
            .any(|r| matches!(*r, "parse" | "load" | "read"))
        {
            "the gateway would refuse the contract as written"
        } else {
            "retries would not be handled safely as written"
        };
        let n = errors.len();
        return Verdict {
            decision: if on_boundary {
                Decision::KeepManual
            } else {
                Decision::FixContract
            },
            reason: format!(
                "{n} {} to fix first ({shown}): {why}",
                if n == 1 { "error" } else { "errors" }
            ),
        };
    }
    let dl = &cf.downstream;
    let settles = match (dl.deduplicates_by_key, dl.receipt_lookup) {
        (true, true) => "the downstream deduplicates on the key and offers a receipt lookup",
        (true, false) => "the downstream deduplicates on the key",
        (false, true) => "a receipt lookup settles a lost answer",
        (false, false) => "nothing settles a lost answer",
    };
    let owner = cf.owner.reconciliation.as_deref().unwrap_or("nobody");
    match (cf.effect_class, cf.security.approval) {
        (EffectClass::Read, _) => Verdict {
            decision: Decision::Automate,
            reason: "read: there is no effect to repeat".into(),
        },
        (EffectClass::Irreversible, _) | (_, ApprovalRule::Always) => Verdict {
            decision: Decision::AutomateWithApproval,
            reason: format!(
                "{}: an operator approves every operation before its effect; {settles}; unknown outcomes go to {owner}",
                cf.effect_class.as_str()
            ),
        },
        (_, ApprovalRule::WhenMatches) => {
            let fields: Vec<&str> = cf.security.approval_when.keys().map(String::as_str).collect();
            Verdict {
                decision: Decision::AutomateWithApproval,
                reason: format!(
                    "operations matching approval_when ({}) wait for an operator, the rest run unattended; {settles}; unknown outcomes go to {owner}",
                    fields.join(", ")
                ),
            }
        }
        (EffectClass::NaturalIdempotent, _) => Verdict {
            decision: Decision::Automate,
            reason: match &dl.version_precondition {
                Some(field) => format!(
                    "natural_idempotent: a repeat sets the same value, and `{field}` stops it overwriting a newer change"
                ),
                None => "natural_idempotent: a repeat sets the same value (without a version precondition: see the warning)".into(),
            },
        },
        (EffectClass::KeyBased | EffectClass::NonIdempotent, _) => Verdict {
            decision: Decision::Automate,
            reason: format!(
                "key_based: one effect per operation key; {settles}; unknown outcomes go to {owner}"
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> ContractFile {
        ContractFile::parse(text, "t.yaml").unwrap()
    }

    const KEYED: &str = "name: t\nversion: \"1\"\neffect_class: key_based\noperation_key:\n  scope: [tenant, workflow_id]\ndownstream:\n  deduplicates_by_key: true\nrequest_fingerprint:\n  fields: [a]\nretention:\n  record_ttl: 1d\n  tombstone_ttl: 1d\n  max_retry_window: 1d\nowner:\n  reconciliation: ops\n  next_review: \"2027-01-01\"\n";

    #[test]
    fn an_unstated_key_supplier_is_an_error() {
        let rules: Vec<&str> = lint(&file(KEYED)).iter().map(|f| f.rule).collect();
        assert!(rules.contains(&"key-supplier-unstated"), "{rules:?}");
        let stated = KEYED.replace("  scope:", "  supplied_by: application\n  scope:");
        let rules: Vec<&str> = lint(&file(&stated)).iter().map(|f| f.rule).collect();
        assert!(!rules.contains(&"key-supplier-unstated"), "{rules:?}");
    }

    #[test]
    fn decisions() {
        let stated = KEYED.replace("  scope:", "  supplied_by: application\n  scope:");
        let check = |text: &str, errors: &[&str], decision: Decision, fragment: &str| {
            let v = decide(Some(&file(text)), errors);
            assert_eq!(v.decision, decision, "{v:?}");
            assert!(v.reason.contains(fragment), "{v:?}");
            assert!(!v.reason.contains('\n'), "one line: {v:?}");
        };
        check(&stated, &[], Decision::Automate, "deduplicates on the key");
        check(
            &stated,
            &["no-version", "no-receipt-path"],
            Decision::KeepManual,
            "2 errors to fix first (no-receipt-path, no-version)",
        );
        check(
            &stated,
            &["no-version", "load"],
            Decision::FixContract,
            "the gateway would refuse",
        );
        check(
            &stated,
            &["placeholder", "load"],
            Decision::FixContract,
            "placeholders of the draft are still in place",
        );
        check(
            &stated,
            &["refuted:deduplicates_by_key"],
            Decision::KeepManual,
            "a lost answer could not be settled",
        );
        check(
            &stated,
            &["fingerprint-over-everything"],
            Decision::FixContract,
            "1 error to fix first (fingerprint-over-everything): retries would not",
        );
        check(
            &stated.replace("key_based", "irreversible"),
            &[],
            Decision::AutomateWithApproval,
            "an operator approves every operation",
        );
        check(
            &format!("{stated}security:\n  approval: when_matches\n  approval_when:\n    a: [x]\n"),
            &[],
            Decision::AutomateWithApproval,
            "approval_when (a)",
        );
        check(
            "name: r\nversion: \"1\"\neffect_class: read\n",
            &[],
            Decision::Automate,
            "no effect",
        );
        let v = decide(None, &["read"]);
        assert_eq!(v.decision, Decision::NotReviewed);
        let many = ["a", "b", "c", "d", "e", "f"];
        let v = decide(Some(&file(&stated)), &many);
        assert!(
            v.reason
                .contains("6 errors to fix first (a, b, c, d, and 2 more)"),
            "{v:?}"
        );
    }
}
