//! Webhook events as the store keeps them: the delivery's deduplication row, bound to the
//! business operation it finished (or recorded for operators when it finished nothing).
//!
//! Two identities meet here and stay apart. The sender's event id (`webhook-id`) names one
//! delivery and is what redeliveries repeat; the operation key names the business action. One
//! operation may hear several events (the provider retries, or sends two distinct events for
//! one job), and one event is retried many times: the row is keyed by (source, event id), and
//! the operation it bound to is a column of it.

use serde::{Deserialize, Serialize};

use crate::key::OperationKey;
use crate::record::{Millis, Receipt, Refusal};

/// What a verified event did, as stored and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// It finished its pending job as applied, in the same transaction as this row.
    Applied,
    /// It finished its pending job as refused (`failed_permanent`), in the same transaction.
    Failed,
    /// Its operation had already settled as the event says (another event, or a poll, got
    /// there first): nothing changed.
    AlreadySettled,
    /// Its operation had settled otherwise than the event says (another reference, or the
    /// opposite outcome): nothing changed; an operator should look.
    SettledDifferently,
    /// Its operation exists but is not a pending job (awaiting approval, `unknown`): nothing
    /// changed; an operator reconciles with it.
    NotPending,
    /// The event names an operation key of another tenant than its source's: nothing changed.
    OtherTenant,
    /// The event names an operation key that has no record here (or of another environment):
    /// nothing changed.
    UnknownOperation,
    /// Its outcome value is neither a success nor a failure the source maps (a progress
    /// event, say): nothing changed.
    Ignored,
    /// No pending job with its id exists yet — the downstream's callback overtook the answer
    /// that carries the job id. Kept with its finish, its environment and its source's tools,
    /// and applied when one of those tools records the job id in that environment (a later
    /// write of this row replaces it; nothing else does).
    Early,
    /// The event names an operation of a tool its source may not finish: nothing changed.
    OtherTool,
    /// More than one operation of the source's tools matches the event (two tools whose
    /// downstreams handed out the same job id): refused, nothing changed; an operator settles
    /// the operations, or narrows the source's `tools`.
    Ambiguous,
}

impl Disposition {
    pub const ALL: [Disposition; 11] = [
        Disposition::Applied,
        Disposition::Failed,
        Disposition::AlreadySettled,
        Disposition::SettledDifferently,
        Disposition::NotPending,
        Disposition::OtherTenant,
        Disposition::UnknownOperation,
        Disposition::Ignored,
        Disposition::Early,
        Disposition::OtherTool,
        Disposition::Ambiguous,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Disposition::Applied => "applied",
            Disposition::Failed => "failed",
            Disposition::AlreadySettled => "already_settled",
            Disposition::SettledDifferently => "settled_differently",
            Disposition::NotPending => "not_pending",
            Disposition::OtherTenant => "other_tenant",
            Disposition::UnknownOperation => "unknown_operation",
            Disposition::Ignored => "ignored",
            Disposition::Early => "early",
            Disposition::OtherTool => "other_tool",
            Disposition::Ambiguous => "ambiguous",
        }
    }

    pub fn parse(text: &str) -> Option<Disposition> {
        Disposition::ALL
            .iter()
            .copied()
            .find(|d| d.as_str() == text)
    }

    /// Whether the event caused a transition.
    pub fn transitioned(self) -> bool {
        matches!(self, Disposition::Applied | Disposition::Failed)
    }
}

/// What an event says happened to its job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "finish", rename_all = "snake_case")]
pub enum Finish {
    Done(Receipt),
    Failed(Refusal),
}

/// One verified event's deduplication row.
///
/// **Written at most once per (source, event id)**, except that an [`Disposition::Early`] row
/// is replaced by the write that finally decides it. Stores apply the rule in
/// [`Store::record_webhook`](crate::store::Store::record_webhook) and in a transition that
/// carries one ([`Transition::webhook`](crate::store::Transition::webhook)): the row is written
/// when none exists or the one that exists is early; otherwise nothing is written — and a
/// transition carrying it is not applied either.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookEvent {
    /// The configured source (the path's `{source}`).
    pub source: String,
    /// The sender's `webhook-id`.
    pub event_id: String,
    /// The source's tenant.
    pub tenant: String,
    /// The gateway's environment the event arrived in: an early row is applied only to a job
    /// of this environment. `None` on rows written before migration 0009 (SQLite) / 0010
    /// (PostgreSQL), which are never applied as early arrivals.
    pub environment: Option<String>,
    /// The tools the source may finish, as configured when the event arrived: an early row is
    /// applied only to a job of one of them. Empty on rows written before those migrations.
    pub tools: Vec<String>,
    /// The job id the event named, when it binds by job id.
    pub job_id: Option<String>,
    /// The operation it bound to, when one was found (or named).
    pub key: Option<OperationKey>,
    pub disposition: Disposition,
    /// Kept for an early arrival only: what to record when its job id appears.
    pub finish: Option<Finish>,
    pub received_at: Millis,
    /// When the sweep deletes the row: at least the sender's retry window after receipt.
    pub purge_at: Millis,
}

impl WebhookEvent {
    /// The `finish` column's JSON, when there is one.
    pub fn finish_json(&self) -> Option<String> {
        self.finish
            .as_ref()
            .and_then(|f| serde_json::to_string(f).ok())
    }

    /// Reads the `finish` column.
    pub fn parse_finish(text: Option<&str>) -> Result<Option<Finish>, String> {
        text.map(|t| serde_json::from_str(t).map_err(|e| format!("unreadable finish: {e}")))
            .transpose()
    }
}

/// Which pending jobs an event may bind to: its source's tenant, the gateway's environment,
/// one of the source's tools, and the job id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobMatch<'a> {
    pub tenant: &'a str,
    pub environment: &'a str,
    pub tools: &'a [String],
    pub job_id: &'a str,
}

impl WebhookEvent {
    /// Whether this (early) row may finish a job of `tool` in `environment`: it was received in
    /// that environment, and its source names the tool.
    pub fn may_finish(&self, environment: &str, tool: &str) -> bool {
        self.environment.as_deref() == Some(environment) && self.tools.iter().any(|t| t == tool)
    }

    /// The `tools` column's JSON (an array of names).
    pub fn tools_json(&self) -> String {
        serde_json::to_string(&self.tools).unwrap_or_else(|_| "[]".into())
    }

    /// Reads the `tools` column; `NULL` (a row older than the column) is no tool.
    pub fn parse_tools(text: Option<&str>) -> Result<Vec<String>, String> {
        text.map_or(Ok(Vec::new()), |t| {
            serde_json::from_str(t).map_err(|e| format!("unreadable tools: {e}"))
        })
    }
}

/// Whether a dedup write was written, or what already stood in its place.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    Written,
    /// A decided row for the same (source, event id) exists: this delivery is a redelivery.
    Exists(Box<WebhookEvent>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispositions_round_trip() {
        for d in Disposition::ALL {
            assert_eq!(Disposition::parse(d.as_str()), Some(d));
        }
        assert_eq!(Disposition::parse("nope"), None);
    }

    #[test]
    fn finish_round_trips_as_json() {
        let event = WebhookEvent {
            source: "jobs".into(),
            event_id: "msg_1".into(),
            tenant: "acme".into(),
            environment: Some("prod".into()),
            tools: vec!["reports.generate".into()],
            job_id: Some("j1".into()),
            key: None,
            disposition: Disposition::Early,
            finish: Some(Finish::Done(Receipt {
                reference: "r1".into(),
                result: serde_json::json!({"ok": true}),
            })),
            received_at: 1,
            purge_at: 2,
        };
        let text = event.finish_json();
        assert_eq!(
            WebhookEvent::parse_finish(text.as_deref()).unwrap(),
            event.finish
        );
        assert_eq!(
            WebhookEvent::parse_tools(Some(&event.tools_json())).unwrap(),
            event.tools
        );
        assert_eq!(
            WebhookEvent::parse_tools(None).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_early_row_finishes_only_its_tools_in_its_environment() {
        let row = |environment: Option<&str>| WebhookEvent {
            source: "jobs".into(),
            event_id: "m".into(),
            tenant: "acme".into(),
            environment: environment.map(Into::into),
            tools: vec!["reports.generate".into(), "invoices.generate".into()],
            job_id: Some("j1".into()),
            key: None,
            disposition: Disposition::Early,
            finish: None,
            received_at: 1,
            purge_at: 2,
        };
        assert!(row(Some("prod")).may_finish("prod", "invoices.generate"));
        assert!(!row(Some("prod")).may_finish("staging", "invoices.generate"));
        assert!(!row(Some("prod")).may_finish("prod", "tickets.create"));
        assert!(!row(None).may_finish("prod", "reports.generate"));
    }
}
