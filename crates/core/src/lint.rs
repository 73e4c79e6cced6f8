//! The seed's review worksheet as a linter: each red flag with its reason and the field it
//! concerns. Works on the file form, so a contract that would not load is still reviewed.

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
    let mut flag = |level, rule, field: &str, reason: String| {
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
