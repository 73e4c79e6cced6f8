//! Operations by key, for a caller: the read a poll or an operator makes ([`App::operation`]),
//! the listing ([`App::list`]), the operator's actions ([`App::reconcile`], [`App::approve`],
//! [`App::deny`]), and an invocation that waits for an operation in flight
//! ([`App::invoke_waiting`]).
//!
//! Every method here takes the caller and scopes the key to the caller's tenant and this app's
//! environment first: another tenant's or environment's key is answered exactly as a missing
//! one. Who may call the operator's actions (a role, a token) is the face's to decide; these
//! only carry them out, with `caller.actor` recorded as the actor.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Event, Record, RecordStatus};
use idemgate_core::store::{self, Filter};
use idemgate_engine::{ActionError, Caller, Operation, Resolution, StatusRead};
use serde_json::Value;

use crate::assembly::App;
use crate::tools::Tool;

/// What reading one operation found.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // made once per read and matched at once
pub enum Read {
    /// The record, the outcome a delivery would get now, and its trace.
    Found {
        record: Record,
        outcome: Outcome,
        events: Vec<Event>,
    },
    /// The authorization recheck refused the reader: nothing of the record may be shown.
    Denied(Outcome),
}

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
    /// Whether `key` is in the caller's tenant and this app's environment.
    fn owns(&self, caller: &Caller, key: &OperationKey) -> bool {
        key.tenant() == caller.tenant && key.environment() == self.environment()
    }

    /// The record under `key` and its tool, for an operator's action.
    async fn for_action(&self, caller: &Caller, key: &OperationKey) -> Result<Tool, ActError> {
        if !self.owns(caller, key) {
            return Err(ActError::NotFound(key.clone()));
        }
        let record = self
            .executor()
            .store()
            .get(key)
            .await
            .map_err(ActionError::Store)?
            .ok_or_else(|| ActError::NotFound(key.clone()))?;
        self.tools()
            .get(&record.tool)
            .ok_or_else(|| ActError::NotServed {
                key: key.clone(),
                tool: record.tool.clone(),
            })
    }

    /// One operation as its caller may see it: the record, the outcome a poll gives (an
    /// accepted job is polled, so reading finishes it) and the events. `None` when there is no
    /// such operation for this caller. The stored result is handed out like a replay: the
    /// caller is rechecked with the tool's hook first.
    pub async fn operation(
        &self,
        caller: &Caller,
        key: &OperationKey,
    ) -> Result<Option<Read>, store::Error> {
        if !self.owns(caller, key) {
            return Ok(None);
        }
        let Some(record) = self.executor().store().get(key).await? else {
            return Ok(None);
        };
        let tool = self.tools().get(&record.tool);
        let read = self
            .executor()
            .status(
                tool.as_ref().map(|t| t.contract.as_ref()),
                key,
                tool.as_ref().map(|t| t.downstream.as_ref()),
                caller,
            )
            .await?;
        match read {
            None => Ok(None),
            Some(StatusRead::Denied(outcome)) => Ok(Some(Read::Denied(outcome))),
            Some(StatusRead::Found { record, outcome }) => {
                let events = self.executor().store().events(key).await?;
                Ok(Some(Read::Found {
                    record,
                    outcome,
                    events,
                }))
            }
        }
    }

    /// The caller's operations in this environment, ordered by key: at most `limit`, after the
    /// key `after`, of one status and one tool when given (`unknown` is the reconciliation
    /// queue).
    pub async fn list(
        &self,
        caller: &Caller,
        status: Option<RecordStatus>,
        tool: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<Record>, store::Error> {
        let filter = Filter {
            tenant: Some(caller.tenant.clone()),
            environment: Some(self.environment().to_string()),
            status,
            tool,
            after,
            limit,
        };
        self.executor().store().list(filter).await
    }

    /// Reconciles an operation that has not settled (see `Executor::reconcile`): with no
    /// resolution by looking the receipt up now, otherwise as the caller resolves it.
    pub async fn reconcile(
        &self,
        caller: &Caller,
        key: &OperationKey,
        resolution: Option<Resolution>,
        reason: &str,
    ) -> Result<Outcome, ActError> {
        let tool = self.for_action(caller, key).await?;
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
        let tool = self.for_action(caller, key).await?;
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

    /// Denies an operation awaiting approval: every later delivery replays the refusal.
    pub async fn deny(
        &self,
        caller: &Caller,
        key: &OperationKey,
        reason: &str,
    ) -> Result<Outcome, ActError> {
        let tool = self.for_action(caller, key).await?;
        Ok(self
            .executor()
            .deny(&tool.contract, key, &caller.actor, reason)
            .await?)
    }

    /// [`App::invoke`], delivered again while the answer is `in_flight` (not awaiting a
    /// person) for up to `wait` in all: a caller that would rather wait than poll. The
    /// repeated deliveries are ordinary ones; they replay, poll or recover, never send blindly.
    pub async fn invoke_waiting(
        &self,
        caller: Caller,
        tool: &str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
        wait: Duration,
    ) -> Outcome {
        let Some(served) = self.tools().get(tool) else {
            return self
                .invoke(caller, tool, workflow_id, step_id, arguments)
                .await;
        };
        let operation = Operation {
            caller,
            environment: self.environment().to_string(),
            workflow_id,
            step_id,
        };
        self.executor()
            .execute_waiting(
                served.contract,
                operation,
                Arc::new(arguments),
                served.downstream,
                wait,
            )
            .await
    }
}
