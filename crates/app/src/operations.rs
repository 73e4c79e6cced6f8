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

use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Outcome;
use idemgate_engine::{ActionError, Caller, Resolution};

use crate::assembly::App;
use crate::tools::Tool;

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
