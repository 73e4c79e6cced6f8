//! The read models of an operation, in the JSON shape API v1 sends them (`GET
//! /v1/operations[/{key}]`) and every other face shows them: [`OutcomeView`], the labelled
//! answer; [`OperationSummary`] of a record; [`OperationView`] with its receipt, outcome and
//! events; [`OperationList`], a page. Plain data with the serde layout of the wire — field
//! order, names and nulls are API v1's, so a change here is a change of the API. With the
//! feature `openapi` each type also describes its schema for the OpenAPI document (the HTTP
//! face's); nothing here knows HTTP.

use idemgate_core::outcome::{NextAction, Outcome, Status};
use idemgate_core::record::{Event, Millis, NOT_SETTLED, Record, RecordState};
use serde::Serialize;
use serde_json::Value;

/// What happened to a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    Applied,
    Replayed,
    InFlight,
    Rejected,
    Unknown,
}

impl OutcomeStatus {
    /// The label as sent: `applied`, `replayed`, `in_flight`, `rejected`, `unknown`.
    pub fn as_str(self) -> &'static str {
        self.status().as_str()
    }

    /// The core's status of the same label.
    pub fn status(self) -> Status {
        match self {
            OutcomeStatus::Applied => Status::Applied,
            OutcomeStatus::Replayed => Status::Replayed,
            OutcomeStatus::InFlight => Status::InFlight,
            OutcomeStatus::Rejected => Status::Rejected,
            OutcomeStatus::Unknown => Status::Unknown,
        }
    }
}

/// What the caller should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NextActionView {
    None,
    Poll,
    Reconcile,
    AskForApproval,
    InspectOperation,
}

/// A stable snake_case error code and a message that never echoes the request. Each code's
/// page is `/problems/<code>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorView {
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ErrorCodeName))]
    pub code: String,
    pub message: String,
}

/// The labelled answer of every face. Every field is always present (null when it does not
/// apply).
///
/// The label is `outcome`, the member every answer has, outcome or problem; `status` repeats
/// it here (the seed's result shape), while in a problem `status` is the HTTP status.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutcomeView {
    /// The label: applied, replayed, in_flight, rejected or unknown.
    pub outcome: OutcomeStatus,
    /// The same label as `outcome`.
    pub status: OutcomeStatus,
    /// `tenant:environment:workflow_id:step_id`.
    #[cfg_attr(feature = "openapi", schema(required))]
    pub operation_key: Option<String>,
    /// The downstream's receipt: ticket id, provider request id, job id.
    #[cfg_attr(feature = "openapi", schema(required))]
    pub effect_reference: Option<String>,
    /// May this business action be attempted again without risking a second effect?
    pub safe_to_repeat: bool,
    pub next_action: NextActionView,
    #[cfg_attr(feature = "openapi", schema(required))]
    pub retry_after_seconds: Option<u64>,
    /// The replay-safe result stored with the receipt: any JSON value, null when none.
    #[cfg_attr(feature = "openapi", schema(value_type = Value, required))]
    pub result: Option<Value>,
    #[cfg_attr(feature = "openapi", schema(required))]
    pub error: Option<ErrorView>,
}

impl From<&Outcome> for OutcomeView {
    fn from(o: &Outcome) -> OutcomeView {
        let label = match o.status {
            Status::Applied => OutcomeStatus::Applied,
            Status::Replayed => OutcomeStatus::Replayed,
            Status::InFlight => OutcomeStatus::InFlight,
            Status::Rejected => OutcomeStatus::Rejected,
            Status::Unknown => OutcomeStatus::Unknown,
        };
        OutcomeView {
            outcome: label,
            status: label,
            operation_key: o.operation_key.as_ref().map(|k| k.to_string()),
            effect_reference: o.effect_reference.clone(),
            safe_to_repeat: o.safe_to_repeat(),
            next_action: match o.next_action {
                NextAction::None => NextActionView::None,
                NextAction::Poll => NextActionView::Poll,
                NextAction::Reconcile => NextActionView::Reconcile,
                NextAction::AskForApproval => NextActionView::AskForApproval,
                NextAction::InspectOperation => NextActionView::InspectOperation,
            },
            retry_after_seconds: o.retry_after_seconds,
            result: o.result.clone(),
            error: o.error.as_ref().map(|e| ErrorView {
                code: e.code.as_str().to_string(),
                message: e.message.clone(),
            }),
        }
    }
}

/// The downstream's authoritative reference for an effect, and the replay-safe result.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReceiptView {
    pub reference: String,
    /// Any JSON value: what the contract's result pointer selects from the downstream's answer.
    #[cfg_attr(feature = "openapi", schema(value_type = Value))]
    pub result: Value,
}

/// One entry of an operation's append-only trace.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventView {
    /// `proposed`, `validated`, `claimed`, `sent`, `committed`, `acknowledged`, `replayed`, …
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::EventKindName))]
    pub kind: String,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    /// The same instant in RFC 3339 (UTC).
    pub at_rfc3339: String,
    pub attempt: u64,
    pub worker: String,
    pub detail: Option<String>,
}

/// The stored state of an operation.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperationSummary {
    pub operation_key: String,
    pub tool: String,
    pub tool_version: String,
    /// `pending`, `awaiting_approval`, `applied`, `failed_permanent`, `unknown`, `tombstone`.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::RecordStatusName))]
    pub record_status: String,
    pub fingerprint: String,
    /// The fencing token: grows on every takeover.
    pub attempt: u64,
    pub effect_reference: Option<String>,
    pub job_id: Option<String>,
    pub approved_by: Option<String>,
    /// Milliseconds since the Unix epoch, and the same instant in RFC 3339 (UTC).
    pub created_at: i64,
    pub created_at_rfc3339: String,
    pub updated_at: i64,
    pub updated_at_rfc3339: String,
    /// When the full record is compacted: set once the operation settles (its retention counts
    /// from then), null while it may still have an effect (pending, awaiting approval,
    /// unknown).
    pub expires_at: Option<i64>,
    pub expires_at_rfc3339: Option<String>,
}

/// An operation: the record, its receipt, the outcome a poll gives, and its events.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperationView {
    #[serde(flatten)]
    pub record: OperationSummary,
    pub receipt: Option<ReceiptView>,
    pub outcome: OutcomeView,
    pub events: Vec<EventView>,
}

/// A page of operations, ordered by key.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperationList {
    pub operations: Vec<OperationSummary>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<String>,
}

/// A record as API v1 shows it.
pub fn summary(record: &Record) -> OperationSummary {
    let job_id = record.job_id().map(str::to_owned);
    // Not a sentinel number: an unsettled record has no expiry yet.
    let expires = (record.expires_at != NOT_SETTLED).then_some(record.expires_at);
    OperationSummary {
        operation_key: record.key.to_string(),
        tool: record.tool.clone(),
        tool_version: record.tool_version.clone(),
        record_status: record.status().as_str().to_string(),
        fingerprint: record.fingerprint.as_str().to_string(),
        attempt: record.fence,
        effect_reference: record.effect_reference().map(str::to_string),
        job_id,
        approved_by: record.approved_by.clone(),
        created_at: record.created_at,
        created_at_rfc3339: rfc3339(record.created_at),
        updated_at: record.updated_at,
        updated_at_rfc3339: rfc3339(record.updated_at),
        expires_at: expires,
        expires_at_rfc3339: expires.map(rfc3339),
    }
}

/// A record's summary as the in-process packages hand it to their language (`crates/py`,
/// `crates/node`): [`summary`]'s members and values without the RFC 3339 spellings of its
/// times, which are API v1's addition (a language's own date type reads the milliseconds).
pub fn in_process_summary(record: &Record) -> Value {
    let s = summary(record);
    serde_json::json!({
        "operation_key": s.operation_key,
        "tool": s.tool,
        "tool_version": s.tool_version,
        "record_status": s.record_status,
        "fingerprint": s.fingerprint,
        "attempt": s.attempt,
        "effect_reference": s.effect_reference,
        "job_id": s.job_id,
        "approved_by": s.approved_by,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "expires_at": s.expires_at,
    })
}

/// An event as API v1 shows it.
pub fn event_view(e: Event) -> EventView {
    EventView {
        kind: e.kind.as_str().to_string(),
        at: e.at,
        at_rfc3339: rfc3339(e.at),
        attempt: e.attempt,
        worker: e.worker,
        detail: e.detail,
    }
}

/// The receipt of an applied record; none in any other state.
pub fn receipt_view(record: &Record) -> Option<ReceiptView> {
    match &record.state {
        RecordState::Applied(r) => Some(ReceiptView {
            reference: r.reference.clone(),
            result: r.result.clone(),
        }),
        RecordState::Pending { .. }
        | RecordState::AwaitingApproval { .. }
        | RecordState::FailedPermanent(_)
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => None,
    }
}

/// A page of operations as API v1 lists them: the next page starts after the last key when
/// this one is full.
pub fn list_page(records: &[Record], limit: usize) -> OperationList {
    let next_after = (records.len() == limit)
        .then(|| records.last().map(|r| r.key.to_string()))
        .flatten();
    OperationList {
        operations: records.iter().map(summary).collect(),
        next_after,
    }
}

/// `2026-12-01T16:11:31.042Z`: RFC 3339 in UTC with milliseconds, as API v1 shows times beside
/// their epoch milliseconds (milliseconds since the epoch, proleptic Gregorian calendar).
pub fn rfc3339(at: Millis) -> String {
    let seconds = at.div_euclid(1000);
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        at.rem_euclid(1000)
    )
}

/// The calendar date of a day count since 1970-01-01, by eras of 400 years (146 097 days).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months counted from March, so that a leap day ends the year.
    let m = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * m + 2) / 5 + 1;
    let month = if m < 10 { m + 3 } else { m - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_827_723_042), "2026-11-28T01:02:03.042Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn labels_are_sent_as_the_core_names_them() {
        for label in [
            OutcomeStatus::Applied,
            OutcomeStatus::Replayed,
            OutcomeStatus::InFlight,
            OutcomeStatus::Rejected,
            OutcomeStatus::Unknown,
        ] {
            assert_eq!(serde_json::json!(label), label.as_str());
        }
    }
}
