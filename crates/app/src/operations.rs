//! The operator's actions by key — [`App::reconcile`], [`App::approve`], [`App::deny`] — for a
//! face that holds no tool of its own for a request (the in-process packages): the record is
//! read through [`App::record`], so another tenant's or environment's key is not found exactly
//! as a missing one ([`App::owns`]), and the action is the executor's, with the record's tool.
//! Who may act (a role, a token) is the face's to decide; `caller.actor` is recorded as the
//! actor.
//!
//! A record whose tool this app does not serve (written by an in-process `idemgate.Local`, or
//! by a gateway with other contracts) can still be resolved by hand — `applied` with the
//! reference the operator found, `not_applied`, or denied — through the executor's by-hand
//! paths ([`idemgate_engine::Executor::resolve_by_hand`]); it is never looked up or approved
//! here, since neither the effect nor its lookup is at hand ([`ActError::NotServed`]).
//!
//! Over those, the operator's answers as every face gives them, plain data without a
//! protocol: [`App::operation_view`] and [`App::operation_list`] (the read models of
//! [`crate::views`], a listing's [`ListQuery`] checked by [`list_filter`] and scoped by a
//! [`Scope`]), and [`App::reconcile_request`], [`App::approve_request`],
//! [`App::deny_request`] (the requests as read, with [`reason_of`]). Each refusal is an
//! [`OperatorError`] whose kind is one error code and whose message is the refusal's, with
//! the status and problem document API v1 answers ([`OperatorError::status`],
//! [`OperatorError::problem`], from [`crate::problems`]): the HTTP face sends them, `idemgate
//! ops --store` prints the same.

use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::record::RecordStatus;
use idemgate_core::store::{self, Filter};
use idemgate_engine::{ActionError, Caller, Resolution, StatusRead};
use serde::Deserialize;
use serde_json::Value;

use crate::assembly::App;
use crate::problems::{self, Problem};
use crate::tools::Tool;
use crate::views::{self, OperationList, OperationView, OutcomeView};

/// Why an operator's action on an operation was not carried out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActError {
    /// No such operation for this caller (or another tenant's, or another environment's).
    #[error("no operation {0}")]
    NotFound(OperationKey),
    /// The operation's tool is not served by this app, so neither its contract nor its
    /// effect is at hand.
    #[error("the tool {tool} of operation {key} is not served here")]
    NotServed { key: OperationKey, tool: String },
    #[error(transparent)]
    Action(#[from] ActionError),
}

impl App {
    /// The tool of the operation under `key`, for an operator's action by `caller`.
    async fn tool_of(&self, caller: &Caller, key: &OperationKey) -> Result<Tool, ActError> {
        match self.served(caller, key).await? {
            Ok(tool) => Ok(tool),
            Err(tool) => Err(ActError::NotServed {
                key: key.clone(),
                tool,
            }),
        }
    }

    /// The operation's tool if this app serves it, else the tool's name.
    async fn served(
        &self,
        caller: &Caller,
        key: &OperationKey,
    ) -> Result<Result<Tool, String>, ActError> {
        let record = self
            .record(&caller.tenant, key)
            .await
            .map_err(ActionError::Store)?
            .ok_or_else(|| ActError::NotFound(key.clone()))?;
        Ok(self.tools().get(&record.tool).ok_or(record.tool))
    }

    /// Reconciles an operation that has not settled (see `Executor::reconcile`): with no
    /// resolution by looking the receipt up now, otherwise as the caller resolves it — by
    /// hand when its tool is not served here.
    pub async fn reconcile(
        &self,
        caller: &Caller,
        key: &OperationKey,
        resolution: Option<Resolution>,
        reason: &str,
    ) -> Result<Outcome, ActError> {
        let tool = match (self.served(caller, key).await?, resolution) {
            (Ok(tool), resolution) => (tool, resolution),
            (Err(_), Some(resolution)) => {
                return Ok(self
                    .executor()
                    .resolve_by_hand(key, resolution, &caller.actor, reason)
                    .await?);
            }
            (Err(tool), None) => {
                return Err(ActError::NotServed {
                    key: key.clone(),
                    tool,
                });
            }
        };
        let (tool, resolution) = tool;
        Ok(self
            .executor()
            .reconcile(
                &tool.contract,
                key,
                resolution,
                &caller.actor,
                reason,
                tool.downstream.as_ref(),
            )
            .await?)
    }

    /// Approves an operation awaiting approval, bound to `expected` when given. The effect
    /// runs on a task of its own (the approver's patience is not the effect's lifetime).
    pub async fn approve(
        &self,
        caller: &Caller,
        key: &OperationKey,
        expected: Option<Fingerprint>,
        reason: &str,
    ) -> Result<Outcome, ActError> {
        let tool = self.tool_of(caller, key).await?;
        Ok(self
            .executor()
            .approve_detached(
                tool.contract,
                key.clone(),
                caller.actor.clone(),
                reason.to_string(),
                expected,
                tool.downstream,
            )
            .await?)
    }

    /// Denies an operation awaiting approval: every later delivery replays the refusal (by
    /// hand when its tool is not served here).
    pub async fn deny(
        &self,
        caller: &Caller,
        key: &OperationKey,
        reason: &str,
    ) -> Result<Outcome, ActError> {
        let tool = match self.served(caller, key).await? {
            Ok(tool) => tool,
            Err(_) => {
                return Ok(self
                    .executor()
                    .deny_by_hand(key, &caller.actor, reason)
                    .await?);
            }
        };
        Ok(self
            .executor()
            .deny(&tool.contract, key, &caller.actor, reason)
            .await?)
    }
}

// ---------------------------------------------------------------------------------------------
// The operator's answers: what API v1's `/v1/operations…` and `idemgate ops --store` answer,
// as plain data. A face adds its protocol (the HTTP face its statuses, problem documents and
// headers) and decides who may ask; `caller.actor` is recorded as the actor.

/// The query of a listing (`GET /v1/operations`), as read.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::IntoParams),
    into_params(parameter_in = Query)
)]
pub struct ListQuery {
    /// `pending`, `awaiting_approval`, `applied`, `failed_permanent`, `unknown` (the
    /// reconciliation queue) or `tombstone`.
    #[cfg_attr(
        feature = "openapi",
        param(value_type = Option<crate::openapi::RecordStatusName>)
    )]
    pub status: Option<String>,
    pub tool: Option<String>,
    /// Only keys after this one (keyset pagination).
    pub after: Option<String>,
    /// At most this many (1 to 500, default 100).
    pub limit: Option<usize>,
}

/// Whose operations a listing shows.
#[derive(Debug, Clone)]
pub enum Scope {
    /// One tenant's, in this app's environment ([`App::list`]): what a caller of a face sees.
    Tenant(String),
    /// Any tenant's and environment's unless narrowed: an operator holding the store itself
    /// (`idemgate ops --store`), to whom every record is at hand anyway.
    Store {
        tenant: Option<String>,
        environment: Option<String>,
    },
}

/// An operator's reconciliation of an `unknown` operation, as read. With no body, the receipt
/// is looked up now. The HTTP face's `ReconcileBody` documents the same shape for the OpenAPI
/// document. Every variant takes an optional `reason`, recorded in the audit log
/// ([`DEFAULT_REASON`] when left out).
#[derive(Debug, Deserialize)]
#[serde(tag = "resolution", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReconcileRequest {
    /// The effect happened: its reference and the result to replay.
    Applied {
        effect_reference: String,
        #[serde(default)]
        result: Value,
        #[serde(default)]
        reason: Option<String>,
    },
    /// The effect did not happen: the key may run again.
    NotApplied {
        #[serde(default)]
        reason: Option<String>,
    },
    /// Look the receipt up now, as with no body, with a reason for the audit log.
    Lookup {
        #[serde(default)]
        reason: Option<String>,
    },
}

/// Binds an approval to the exact call: the fingerprint the operator reviewed.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    pub fingerprint: Option<String>,
    /// Why, for the audit log (at most 500 characters); left out, "no reason given".
    pub reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DenyRequest {
    /// Why: every later delivery's refusal and the audit log carry it (at most 500
    /// characters); left out, "no reason given".
    pub reason: Option<String>,
}

/// The reason recorded for an operator action whose request gave none.
pub const DEFAULT_REASON: &str = "no reason given";

/// The longest reason kept, in characters; a longer one is cut, not refused.
pub const MAX_REASON_CHARS: usize = 500;

/// An operator's reason as recorded: the given text cut to [`MAX_REASON_CHARS`], or
/// [`DEFAULT_REASON`] when none (or only whitespace) was given.
pub fn reason_of(given: Option<String>) -> String {
    match given {
        Some(text) if !text.trim().is_empty() => text.chars().take(MAX_REASON_CHARS).collect(),
        Some(_) | None => DEFAULT_REASON.into(),
    }
}

/// Why an operator's read or action was answered with a refusal, by kind: each kind is one
/// error code ([`OperatorError::code`]), and the message is what the refusal says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// No such operation for this caller: a missing key, a key that does not parse, and
    /// another tenant's or environment's key read alike.
    #[error("no such operation")]
    NotFound,
    /// The authorization recheck refused the reader: the executor's rejection, answered as
    /// it is (nothing of the record may be shown). Boxed: an outcome is large, and refusals
    /// travel in every answer's `Result`.
    #[error("{}", refusal_message(.0))]
    Denied(Box<Outcome>),
    /// The operation's tool is not served here: it can only be resolved by hand or denied.
    #[error(
        "the tool {tool} of this operation is not loaded here; without it the operation can \
         only be resolved by hand (applied with a reference, or not applied) or denied"
    )]
    NotServed { tool: String },
    /// The action does not apply to the operation as it is (its state, its request), or the
    /// operation changed while it ran (`key` then names it).
    #[error("{message}")]
    Conflict {
        key: Option<OperationKey>,
        message: String,
    },
    /// The request itself is wrong; the message names the parameter.
    #[error("{0}")]
    Invalid(String),
    /// The store did not answer; the detail is the source, never the message.
    #[error("the operation store is unavailable; retry later")]
    StoreUnavailable(#[source] store::Error),
}

fn refusal_message(outcome: &Outcome) -> &str {
    outcome.error.as_ref().map_or("", |e| e.message.as_str())
}

impl OperatorError {
    /// The error code of the refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            OperatorError::NotFound => ErrorCode::NotFound,
            OperatorError::Denied(outcome) => outcome.error_code().unwrap_or(ErrorCode::Forbidden),
            OperatorError::NotServed { .. } | OperatorError::Conflict { .. } => ErrorCode::Conflict,
            OperatorError::Invalid(_) => ErrorCode::InvalidArguments,
            OperatorError::StoreUnavailable(_) => ErrorCode::StoreUnavailable,
        }
    }

    /// The refusal as the labelled outcome every face answers (`rejected`, with its code and
    /// message; the key when the operation raced; for an unavailable store, a retry after a
    /// second).
    pub fn outcome(&self) -> Outcome {
        match self {
            OperatorError::Denied(outcome) => outcome.as_ref().clone(),
            OperatorError::Conflict { key, .. } => {
                Outcome::rejected(key.clone(), self.code(), self.to_string())
            }
            OperatorError::StoreUnavailable(_) => {
                let mut outcome = Outcome::rejected(None, self.code(), self.to_string());
                outcome.retry_after_seconds = Some(1);
                outcome
            }
            other => Outcome::rejected(None, other.code(), other.to_string()),
        }
    }

    /// The status API v1 answers the refusal with ([`problems::status`] of its code).
    pub fn status(&self) -> u16 {
        problems::status(self.code())
    }

    /// The refusal as API v1's problem document, its `type` under `base` (empty for the
    /// relative `/problems/<code>`).
    pub fn problem(&self, base: &str) -> Problem {
        Problem::of(&self.outcome(), self.status(), base)
    }
}

impl From<ActError> for OperatorError {
    fn from(e: ActError) -> OperatorError {
        match e {
            ActError::NotFound(_) | ActError::Action(ActionError::NotFound(_)) => {
                OperatorError::NotFound
            }
            ActError::NotServed { tool, .. } => OperatorError::NotServed { tool },
            ActError::Action(ActionError::Store(e)) => OperatorError::StoreUnavailable(e),
            ActError::Action(ActionError::Raced(key)) => OperatorError::Conflict {
                message: ActionError::Raced(key.clone()).to_string(),
                key: Some(key),
            },
            other => OperatorError::Conflict {
                key: None,
                message: other.to_string(),
            },
        }
    }
}

/// A key as given: one that does not parse names no operation.
fn key_of(key: &str) -> Result<OperationKey, OperatorError> {
    OperationKey::parse(key).map_err(|_| OperatorError::NotFound)
}

impl App {
    /// `GET /v1/operations/{key}`: the record, its receipt, the outcome a poll gives, and its
    /// events. Polling advances an accepted job; it never performs a new effect. A key
    /// `caller` may not see is not found, exactly as a missing one.
    pub async fn operation_view(
        &self,
        caller: &Caller,
        key: &str,
    ) -> Result<OperationView, OperatorError> {
        let key = key_of(key)?;
        // A stored result is handed out like a replay: the reader is rechecked first.
        let (record, outcome) = match self.operation(caller, &key).await {
            Ok(Some(StatusRead::Found { record, outcome })) => (record, outcome),
            Ok(Some(StatusRead::Denied(outcome))) => {
                return Err(OperatorError::Denied(Box::new(outcome)));
            }
            Ok(None) => return Err(OperatorError::NotFound),
            Err(e) => return Err(OperatorError::StoreUnavailable(e)),
        };
        let events = self
            .executor()
            .store()
            .events(&key)
            .await
            .map_err(OperatorError::StoreUnavailable)?;
        Ok(OperationView {
            record: views::summary(&record),
            receipt: views::receipt_view(&record),
            outcome: OutcomeView::from(&outcome),
            events: events.into_iter().map(views::event_view).collect(),
        })
    }

    /// `GET /v1/operations`: a page of the operations in `scope`, by key.
    pub async fn operation_list(
        &self,
        scope: Scope,
        query: ListQuery,
    ) -> Result<OperationList, OperatorError> {
        let filter = list_filter(query)?;
        let limit = filter.limit;
        let records = match scope {
            Scope::Tenant(tenant) => self.list(&tenant, filter).await,
            Scope::Store {
                tenant,
                environment,
            } => {
                let filter = Filter {
                    tenant,
                    environment,
                    ..filter
                };
                self.executor().store().list(filter).await
            }
        };
        let records = records.map_err(OperatorError::StoreUnavailable)?;
        Ok(views::list_page(&records, limit))
    }

    /// `POST /v1/operations/{key}/reconcile` by `caller` (an operator): no request looks the
    /// receipt up now; a resolution settles the record as the operator found it.
    pub async fn reconcile_request(
        &self,
        caller: &Caller,
        key: &str,
        request: Option<ReconcileRequest>,
    ) -> Result<Outcome, OperatorError> {
        let (resolution, reason) = match request {
            None => (None, None),
            Some(ReconcileRequest::Lookup { reason }) => (None, reason),
            Some(ReconcileRequest::Applied {
                effect_reference,
                result,
                reason,
            }) => (
                Some(Resolution::Applied {
                    reference: effect_reference,
                    result,
                }),
                reason,
            ),
            Some(ReconcileRequest::NotApplied { reason }) => (Some(Resolution::NotApplied), reason),
        };
        let reason = reason_of(reason);
        if let Some(Resolution::Applied { reference, .. }) = &resolution
            && reference.trim().is_empty()
        {
            return Err(OperatorError::Invalid("effect_reference is empty".into()));
        }
        let key = key_of(key)?;
        Ok(self.reconcile(caller, &key, resolution, &reason).await?)
    }

    /// `POST /v1/operations/{key}/approve` by `caller` (an operator): the effect then runs,
    /// with the original caller's authorization rechecked, on a task of its own (the
    /// approver's connection is not the effect's lifetime).
    pub async fn approve_request(
        &self,
        caller: &Caller,
        key: &str,
        request: ApproveRequest,
    ) -> Result<Outcome, OperatorError> {
        let reason = reason_of(request.reason);
        let expected = match request.fingerprint {
            Some(text) => Some(Fingerprint::parse(&text).map_err(|_| {
                OperatorError::Invalid("fingerprint is `sha256:` and 64 hex digits".into())
            })?),
            None => None,
        };
        let key = key_of(key)?;
        Ok(self.approve(caller, &key, expected, &reason).await?)
    }

    /// `POST /v1/operations/{key}/deny` by `caller` (an operator): every later delivery
    /// replays the refusal.
    pub async fn deny_request(
        &self,
        caller: &Caller,
        key: &str,
        request: DenyRequest,
    ) -> Result<Outcome, OperatorError> {
        let reason = reason_of(request.reason);
        let key = key_of(key)?;
        Ok(self.deny(caller, &key, &reason).await?)
    }
}

/// The store filter of a listing query (status, tool, keyset position, limit), checked; its
/// tenant and environment are left for the scope to set.
pub fn list_filter(query: ListQuery) -> Result<Filter, OperatorError> {
    let status = match query.status.as_deref() {
        None => None,
        Some(text) => Some(RecordStatus::parse(text).ok_or_else(|| {
            OperatorError::Invalid(
                "status is one of pending, awaiting_approval, applied, failed_permanent, \
                 unknown, tombstone"
                    .into(),
            )
        })?),
    };
    let limit = query.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(OperatorError::Invalid("limit is between 1 and 500".into()));
    }
    Ok(Filter {
        status,
        tool: query.tool,
        after: query.after,
        limit,
        ..Filter::default()
    })
}
