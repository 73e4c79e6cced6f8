//! The durable operation record, its states, and the append-only event trace.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fingerprint::Fingerprint;
use crate::key::OperationKey;
use crate::outcome::ErrorCode;

/// Milliseconds since the Unix epoch. Every timestamp in a record is one, read from a `Clock`.
pub type Millis = i64;

/// Bounded ownership of a pending record. Its expiry lets recovery start; it never proves that
/// the old owner did not reach the downstream. An owner of `None` means the claim was released
/// after a provable non-delivery: anyone may take it over and execute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub owner: Option<String>,
    pub expires_at: Millis,
}

/// How far a pending record got towards the downstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "dispatch", rename_all = "snake_case")]
pub enum Dispatch {
    /// Nothing was sent yet, as far as the record knows. Authoritative only where the contract
    /// uses the dispatch marker, or after a release.
    NotSent,
    /// The dispatch marker: the first byte may have left. Recovery may look up a receipt or
    /// resend to a deduplicating downstream, never send blindly.
    Sent,
    /// The downstream accepted an asynchronous job; polling finishes it.
    Job { job_id: String },
}

impl Dispatch {
    /// The value of the `dispatch` column.
    pub fn tag(&self) -> &'static str {
        match self {
            Dispatch::NotSent => "not_sent",
            Dispatch::Sent => "sent",
            Dispatch::Job { .. } => "job",
        }
    }
}

/// The downstream's authoritative reference for an effect, and the replay-safe result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub reference: String,
    pub result: Value,
}

/// A deterministic refusal (by the downstream or an approver), replayed as the same refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

/// Why an outcome could not be proved, and what is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub reason: String,
    /// A reference the downstream gave that could not be recorded as applied.
    pub reference: Option<String>,
    pub job_id: Option<String>,
}

/// What a compacted record keeps: what it settled as, so that a late delivery follows the
/// late-arrival policy and never hears `replayed` for an effect that did not happen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "settled_as", rename_all = "snake_case")]
pub enum Digest {
    /// The effect happened: its reference.
    Applied { reference: String },
    /// The operation was refused (by the downstream, an approver, or an approval that expired):
    /// nothing happened.
    Refused { code: ErrorCode },
    /// Nothing was ever sent: a released claim that no delivery took up again.
    NeverRan,
}

impl Digest {
    /// The effect's reference, when there was an effect.
    pub fn reference(&self) -> Option<&str> {
        match self {
            Digest::Applied { reference } => Some(reference),
            Digest::Refused { .. } | Digest::NeverRan => None,
        }
    }
}

/// The `expires_at` and `purge_at` of a record that has not settled: retention counts from
/// settlement, so an unsettled record has no expiry yet and no sweep touches it.
pub const NOT_SETTLED: Millis = Millis::MAX;

/// The state of a record, with the data each state carries.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordState {
    /// Claimed. Says nothing about whether the effect happened.
    Pending {
        lease: Lease,
        dispatch: Dispatch,
    },
    /// Held for an operator until `until`; past it, the approval expires as a refusal
    /// (`approval_expired`) and nothing runs.
    AwaitingApproval {
        until: Millis,
    },
    Applied(Receipt),
    FailedPermanent(Refusal),
    Unknown(Evidence),
    Tombstone(Digest),
}

/// The state's name, as stored and filtered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordStatus {
    Pending,
    AwaitingApproval,
    Applied,
    FailedPermanent,
    Unknown,
    Tombstone,
}

impl RecordStatus {
    pub const ALL: [RecordStatus; 6] = [
        RecordStatus::Pending,
        RecordStatus::AwaitingApproval,
        RecordStatus::Applied,
        RecordStatus::FailedPermanent,
        RecordStatus::Unknown,
        RecordStatus::Tombstone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Pending => "pending",
            RecordStatus::AwaitingApproval => "awaiting_approval",
            RecordStatus::Applied => "applied",
            RecordStatus::FailedPermanent => "failed_permanent",
            RecordStatus::Unknown => "unknown",
            RecordStatus::Tombstone => "tombstone",
        }
    }

    pub fn parse(text: &str) -> Option<RecordStatus> {
        RecordStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl RecordState {
    pub fn status(&self) -> RecordStatus {
        match self {
            RecordState::Pending { .. } => RecordStatus::Pending,
            RecordState::AwaitingApproval { .. } => RecordStatus::AwaitingApproval,
            RecordState::Applied(_) => RecordStatus::Applied,
            RecordState::FailedPermanent(_) => RecordStatus::FailedPermanent,
            RecordState::Unknown(_) => RecordStatus::Unknown,
            RecordState::Tombstone(_) => RecordStatus::Tombstone,
        }
    }
}

/// The durable operation row, unique per operation key (whose first part is the tenant).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub key: OperationKey,
    pub tool: String,
    pub tool_version: String,
    pub fingerprint: Fingerprint,
    pub canonicalization: u32,
    pub state: RecordState,
    /// The fencing token: the attempt number, grown on every takeover. Every transition is
    /// conditional on it, so a late finisher cannot overwrite a newer attempt.
    pub fence: u64,
    /// Who asked, for the authorization recheck before a deferred effect (approval, recovery).
    pub actor: String,
    /// The validated arguments, kept only while the effect may still have to be sent.
    pub request: Option<Value>,
    pub approved_by: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// When a settled record is compacted to a tombstone: its settlement plus the contract's
    /// `record_ttl`. [`NOT_SETTLED`] until it settles.
    pub expires_at: Millis,
    /// When the tombstone itself is deleted: `expires_at` plus `tombstone_ttl`, or, for a
    /// record that went straight to a tombstone, its settlement plus `tombstone_ttl`.
    pub purge_at: Millis,
    /// Whether the contract version it was claimed under has a duplicate-intent window. Only
    /// such records are found by `Store::find_fingerprint`, so stores index only these: a
    /// fingerprint names its tool and version, so every record a lookup could match was claimed
    /// under the same contract version, and so with the window.
    pub intent_window: bool,
}

impl Record {
    pub fn status(&self) -> RecordStatus {
        self.state.status()
    }

    /// The downstream's job this record waits on, or the one an `unknown` record was left
    /// with (its evidence).
    pub fn job_id(&self) -> Option<&str> {
        match &self.state {
            RecordState::Pending {
                dispatch: Dispatch::Job { job_id },
                ..
            } => Some(job_id),
            RecordState::Unknown(evidence) => evidence.job_id.as_deref(),
            RecordState::Pending { .. }
            | RecordState::AwaitingApproval { .. }
            | RecordState::Applied(_)
            | RecordState::FailedPermanent(_)
            | RecordState::Tombstone(_) => None,
        }
    }

    pub fn tenant(&self) -> &str {
        self.key.tenant()
    }

    pub fn lease(&self) -> Option<&Lease> {
        match &self.state {
            RecordState::Pending { lease, .. } => Some(lease),
            RecordState::AwaitingApproval { .. }
            | RecordState::Applied(_)
            | RecordState::FailedPermanent(_)
            | RecordState::Unknown(_)
            | RecordState::Tombstone(_) => None,
        }
    }

    /// How far a pending record got towards the downstream; `None` for any other state.
    pub fn pending_dispatch(&self) -> Option<&Dispatch> {
        match &self.state {
            RecordState::Pending { dispatch, .. } => Some(dispatch),
            RecordState::AwaitingApproval { .. }
            | RecordState::Applied(_)
            | RecordState::FailedPermanent(_)
            | RecordState::Unknown(_)
            | RecordState::Tombstone(_) => None,
        }
    }

    /// The reference to show for this record, whatever its state.
    pub fn effect_reference(&self) -> Option<&str> {
        match &self.state {
            RecordState::Applied(r) => Some(&r.reference),
            RecordState::Unknown(e) => e.reference.as_deref(),
            RecordState::Tombstone(d) => d.reference(),
            RecordState::Pending { .. }
            | RecordState::AwaitingApproval { .. }
            | RecordState::FailedPermanent(_) => None,
        }
    }

    /// Whether the record has settled: its effect happened or provably never will under this
    /// attempt (applied, refused, compacted). Only settled records expire.
    pub fn is_settled(&self) -> bool {
        match self.state {
            RecordState::Applied(_)
            | RecordState::FailedPermanent(_)
            | RecordState::Tombstone(_) => true,
            RecordState::Pending { .. }
            | RecordState::AwaitingApproval { .. }
            | RecordState::Unknown(_) => false,
        }
    }
}

/// Kinds of trace entries. Every transition appends one or more; the trace is never edited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Proposed,
    Validated,
    Claimed,
    AwaitingApproval,
    Sent,
    Committed,
    Acknowledged,
    Replayed,
    Rejected,
    InFlight,
    Unknown,
    Failed,
    Released,
    Recovered,
    Reconciled,
    Approved,
    Denied,
    Expired,
}

impl EventKind {
    pub const ALL: [EventKind; 18] = [
        EventKind::Proposed,
        EventKind::Validated,
        EventKind::Claimed,
        EventKind::AwaitingApproval,
        EventKind::Sent,
        EventKind::Committed,
        EventKind::Acknowledged,
        EventKind::Replayed,
        EventKind::Rejected,
        EventKind::InFlight,
        EventKind::Unknown,
        EventKind::Failed,
        EventKind::Released,
        EventKind::Recovered,
        EventKind::Reconciled,
        EventKind::Approved,
        EventKind::Denied,
        EventKind::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Proposed => "proposed",
            EventKind::Validated => "validated",
            EventKind::Claimed => "claimed",
            EventKind::AwaitingApproval => "awaiting_approval",
            EventKind::Sent => "sent",
            EventKind::Committed => "committed",
            EventKind::Acknowledged => "acknowledged",
            EventKind::Replayed => "replayed",
            EventKind::Rejected => "rejected",
            EventKind::InFlight => "in_flight",
            EventKind::Unknown => "unknown",
            EventKind::Failed => "failed",
            EventKind::Released => "released",
            EventKind::Recovered => "recovered",
            EventKind::Reconciled => "reconciled",
            EventKind::Approved => "approved",
            EventKind::Denied => "denied",
            EventKind::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// One trace entry: what happened, when, in which attempt, by whom. `detail` carries keys,
/// fingerprints, references and reasons — never request bodies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    pub at: Millis,
    pub attempt: u64,
    pub worker: String,
    pub detail: Option<String>,
}

impl Event {
    pub fn new(kind: EventKind, at: Millis, attempt: u64, worker: &str) -> Event {
        Event {
            kind,
            at,
            attempt,
            worker: worker.to_string(),
            detail: None,
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Event {
        self.detail = Some(detail.into());
        self
    }
}

/// The flat form of a record that both SQL stores read and write, one field a column, so the
/// mapping between states and columns is written once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Row {
    pub tenant: String,
    pub key: String,
    pub tool: String,
    pub tool_version: String,
    pub fingerprint: String,
    pub canonicalization: i64,
    pub status: String,
    pub fence: i64,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub dispatch: Option<String>,
    pub job_id: Option<String>,
    pub effect_reference: Option<String>,
    pub result: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub actor: String,
    pub request: Option<String>,
    pub approved_by: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub expires_at: i64,
    pub purge_at: i64,
    pub intent_window: bool,
}

/// A row that does not describe a valid record: a bug or a foreign write, never silently fixed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored record {key} is malformed: {what}")]
pub struct RowError {
    pub key: String,
    pub what: String,
}

/// The stored text of a JSON value. The same bytes as `Value`'s `Display`, written by the
/// serializer straight into the string rather than through the formatter: every claim and
/// settled transition stores one or two.
pub fn json_text(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| value.to_string())
}

impl Row {
    pub fn from_record(r: &Record) -> Row {
        let mut row = Row {
            tenant: r.key.tenant().to_string(),
            key: r.key.as_str().to_string(),
            tool: r.tool.clone(),
            tool_version: r.tool_version.clone(),
            fingerprint: r.fingerprint.as_str().to_string(),
            canonicalization: i64::from(r.canonicalization),
            status: r.status().as_str().to_string(),
            fence: r.fence as i64,
            actor: r.actor.clone(),
            request: r.request.as_ref().map(json_text),
            approved_by: r.approved_by.clone(),
            created_at: r.created_at,
            updated_at: r.updated_at,
            expires_at: r.expires_at,
            purge_at: r.purge_at,
            intent_window: r.intent_window,
            ..Row::default()
        };
        row.set_state(&r.state);
        row
    }

    /// Writes the state columns, clearing those the state does not use.
    pub fn set_state(&mut self, state: &RecordState) {
        self.status = state.status().as_str().to_string();
        self.lease_owner = None;
        self.lease_expires_at = None;
        self.dispatch = None;
        self.job_id = None;
        self.effect_reference = None;
        self.result = None;
        self.error_code = None;
        self.error_message = None;
        match state {
            RecordState::Pending { lease, dispatch } => {
                self.lease_owner = lease.owner.clone();
                self.lease_expires_at = Some(lease.expires_at);
                match dispatch {
                    Dispatch::NotSent => self.dispatch = Some("not_sent".into()),
                    Dispatch::Sent => self.dispatch = Some("sent".into()),
                    Dispatch::Job { job_id } => {
                        self.dispatch = Some("job".into());
                        self.job_id = Some(job_id.clone());
                    }
                }
            }
            RecordState::AwaitingApproval { until } => self.lease_expires_at = Some(*until),
            RecordState::Applied(receipt) => {
                self.effect_reference = Some(receipt.reference.clone());
                self.result = Some(json_text(&receipt.result));
            }
            RecordState::FailedPermanent(refusal) => {
                self.error_code = Some(refusal.code.as_str().into());
                self.error_message = Some(refusal.message.clone());
            }
            RecordState::Unknown(evidence) => {
                self.error_message = Some(evidence.reason.clone());
                self.effect_reference = evidence.reference.clone();
                self.job_id = evidence.job_id.clone();
            }
            // Which columns are set says what the tombstone settled as: a reference, a refusal
            // code, or neither (never ran).
            RecordState::Tombstone(digest) => match digest {
                Digest::Applied { reference } => self.effect_reference = Some(reference.clone()),
                Digest::Refused { code } => self.error_code = Some(code.as_str().into()),
                Digest::NeverRan => {}
            },
        }
    }

    pub fn into_record(self) -> Result<Record, RowError> {
        let bad = |what: String| RowError {
            key: self.key.clone(),
            what,
        };
        let key = OperationKey::parse(&self.key).map_err(|e| bad(e.to_string()))?;
        let fingerprint = Fingerprint::parse(&self.fingerprint).map_err(|e| bad(e.to_string()))?;
        let code = |text: &Option<String>| -> Result<Option<ErrorCode>, RowError> {
            match text {
                None => Ok(None),
                Some(t) => ErrorCode::parse(t)
                    .map(Some)
                    .ok_or_else(|| bad(format!("unknown error code `{t}`"))),
            }
        };
        let status = RecordStatus::parse(&self.status)
            .ok_or_else(|| bad(format!("unknown status `{}`", self.status)))?;
        let state = match status {
            RecordStatus::Pending => {
                let lease = Lease {
                    owner: self.lease_owner.clone(),
                    expires_at: self
                        .lease_expires_at
                        .ok_or_else(|| bad("pending without a lease expiry".into()))?,
                };
                let dispatch = match (self.dispatch.as_deref(), &self.job_id) {
                    (Some("not_sent"), _) => Dispatch::NotSent,
                    (Some("sent"), _) => Dispatch::Sent,
                    (Some("job"), Some(job_id)) => Dispatch::Job {
                        job_id: job_id.clone(),
                    },
                    (other, _) => return Err(bad(format!("pending with dispatch {other:?}"))),
                };
                RecordState::Pending { lease, dispatch }
            }
            RecordStatus::AwaitingApproval => RecordState::AwaitingApproval {
                until: self
                    .lease_expires_at
                    .ok_or_else(|| bad("awaiting_approval without a deadline".into()))?,
            },
            RecordStatus::Applied => {
                let result = match &self.result {
                    Some(text) => serde_json::from_str(text)
                        .map_err(|e| bad(format!("stored result is not JSON: {e}")))?,
                    None => Value::Null,
                };
                RecordState::Applied(Receipt {
                    reference: self
                        .effect_reference
                        .clone()
                        .ok_or_else(|| bad("applied without an effect reference".into()))?,
                    result,
                })
            }
            RecordStatus::FailedPermanent => RecordState::FailedPermanent(Refusal {
                code: code(&self.error_code)?
                    .ok_or_else(|| bad("failed_permanent without an error code".into()))?,
                message: self.error_message.clone().unwrap_or_default(),
            }),
            RecordStatus::Unknown => RecordState::Unknown(Evidence {
                reason: self.error_message.clone().unwrap_or_default(),
                reference: self.effect_reference.clone(),
                job_id: self.job_id.clone(),
            }),
            RecordStatus::Tombstone => {
                RecordState::Tombstone(match (&self.effect_reference, code(&self.error_code)?) {
                    (Some(reference), None) => Digest::Applied {
                        reference: reference.clone(),
                    },
                    (None, Some(code)) => Digest::Refused { code },
                    (None, None) => Digest::NeverRan,
                    (Some(_), Some(_)) => {
                        return Err(bad("tombstone with both a reference and a refusal".into()));
                    }
                })
            }
        };
        let request = match &self.request {
            Some(text) => Some(
                serde_json::from_str(text)
                    .map_err(|e| bad(format!("stored request is not JSON: {e}")))?,
            ),
            None => None,
        };
        Ok(Record {
            key,
            tool: self.tool,
            tool_version: self.tool_version,
            fingerprint,
            canonicalization: u32::try_from(self.canonicalization).unwrap_or(0),
            state,
            fence: self.fence.max(0) as u64,
            actor: self.actor,
            request,
            approved_by: self.approved_by,
            created_at: self.created_at,
            updated_at: self.updated_at,
            expires_at: self.expires_at,
            purge_at: self.purge_at,
            intent_window: self.intent_window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::{Material, canonicalize};

    fn record(state: RecordState) -> Record {
        let fp = Fingerprint::of(&canonicalize("t", "1", &Material(Default::default())).unwrap());
        Record {
            key: OperationKey::parse("acme:prod:wf:s1").unwrap(),
            tool: "t".into(),
            tool_version: "1".into(),
            fingerprint: fp,
            canonicalization: 1,
            state,
            fence: 3,
            actor: "agent-1".into(),
            request: Some(serde_json::json!({"a": 1})),
            approved_by: None,
            created_at: 1,
            updated_at: 2,
            expires_at: 3,
            purge_at: 4,
            intent_window: true,
        }
    }

    #[test]
    fn every_state_survives_the_row() {
        let states = [
            RecordState::Pending {
                lease: Lease {
                    owner: Some("w1".into()),
                    expires_at: 10,
                },
                dispatch: Dispatch::NotSent,
            },
            RecordState::Pending {
                lease: Lease {
                    owner: None,
                    expires_at: 10,
                },
                dispatch: Dispatch::Sent,
            },
            RecordState::Pending {
                lease: Lease {
                    owner: Some("w1".into()),
                    expires_at: 10,
                },
                dispatch: Dispatch::Job {
                    job_id: "job-7".into(),
                },
            },
            RecordState::AwaitingApproval { until: 99 },
            RecordState::Applied(Receipt {
                reference: "ticket_1".into(),
                result: serde_json::json!({"id": 1}),
            }),
            RecordState::FailedPermanent(Refusal {
                code: ErrorCode::DownstreamRejected,
                message: "no".into(),
            }),
            RecordState::Unknown(Evidence {
                reason: "timeout".into(),
                reference: None,
                job_id: Some("j".into()),
            }),
            RecordState::Tombstone(Digest::Applied {
                reference: "ticket_1".into(),
            }),
            RecordState::Tombstone(Digest::Refused {
                code: ErrorCode::ApprovalExpired,
            }),
            RecordState::Tombstone(Digest::NeverRan),
        ];
        for state in states {
            let r = record(state);
            let back = Row::from_record(&r).into_record().unwrap();
            assert_eq!(back, r);
        }
    }

    #[test]
    fn names_round_trip() {
        for s in RecordStatus::ALL {
            assert_eq!(RecordStatus::parse(s.as_str()), Some(s));
        }
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                serde_json::Value::String(k.as_str().into())
            );
        }
    }
}
