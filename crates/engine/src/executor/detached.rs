//! Deliveries on a task of their own: **the caller's patience is not the effect's lifetime.**
//!
//! A face (HTTP, MCP) runs each claimed execution with these, so a client that disconnects,
//! times out or cancels only stops waiting: the spawned task carries the execution to a settled
//! state within the contract's timeouts, and the next delivery or poll reads what it recorded.
//! Needs a tokio runtime.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::contract::Contract;
use idemgate_core::effect::Downstream;
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::machine;
use idemgate_core::outcome::{ErrorCode, NextAction, Outcome, Status};
use serde_json::Value;
use tracing::Instrument;

use super::{ActionError, Executor, Operation};

impl Executor {
    /// What a caller hears when the task running its delivery or approval died (a panic): the
    /// machine's answer for the key, read now. A key whose record may have had its effect — a
    /// claim the task held may have been sent — is `unknown` (the recoverer takes the claim up
    /// once its lease ends; an operator reconciles what stays unknown), never `rejected`; a key
    /// the read proves untouched is a refusal that is safe to repeat.
    async fn lost(&self, key: Option<OperationKey>) -> Outcome {
        const FAILED: &str = "the execution failed inside idemgate";
        let Some(key) = key else {
            let mut o = Outcome::rejected(
                None,
                ErrorCode::InternalError,
                format!("{FAILED}; inspect the effect before repeating it"),
            );
            o.next_action = NextAction::InspectOperation;
            return o;
        };
        let maybe = format!(
            "{FAILED} after the operation was claimed; its effect may have happened and cannot \
             be proved yet"
        );
        match self.store.get(&key).await {
            Ok(read) => match machine::repeatable(&key, read.as_ref()) {
                Some(proof) => Outcome::refused(
                    proof,
                    ErrorCode::InternalError,
                    format!("{FAILED}; nothing was sent under this operation"),
                ),
                None => Outcome::unknown(key, maybe),
            },
            Err(_) => Outcome::unknown(key, maybe),
        }
    }

    /// [`Executor::execute`] on a task of its own.
    pub async fn execute_detached(
        &self,
        contract: Arc<Contract>,
        operation: Operation,
        arguments: Arc<Value>,
        effect: Arc<dyn Downstream>,
    ) -> Outcome {
        let executor = self.clone();
        let key = operation.key().ok().flatten();
        // The caller's span (the gateway's request) goes with the task, so its log lines
        // name the request. Boxed: the delivery's state machine is kilobytes, and a task holds
        // its future inline, so spawning it unboxed copied all of it several times per call
        // (into the task, and the task's stage again on completion).
        let task = tokio::spawn(
            Box::pin(async move {
                executor
                    .execute(&contract, &operation, &arguments, effect.as_ref())
                    .await
            })
            .in_current_span(),
        );
        match task.await {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::error!(error = %e, "a delivery's task failed");
                self.lost(key).await
            }
        }
    }

    /// [`Executor::execute`] on the caller's own task, for a caller that awaits it to its end
    /// whatever happens (a thread blocked on it, a task nothing aborts): the same answer as
    /// [`Executor::execute_detached`] without handing the delivery to another task and its
    /// answer back. A panic is answered as there.
    pub async fn execute_here(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        effect: &dyn Downstream,
    ) -> Outcome {
        // Boxed for the reason `execute_detached` boxes it: the delivery's state machine is
        // kilobytes, and the caller's future (a task's, a `block_on`'s) is moved whole.
        let delivery = Box::pin(self.execute(contract, operation, arguments, effect));
        match caught(delivery).await {
            Some(outcome) => outcome,
            None => {
                tracing::error!("a delivery panicked");
                self.lost(operation.key().ok().flatten()).await
            }
        }
    }

    /// Like [`Executor::execute_detached`] (or [`Executor::execute_here`], by `here`), but
    /// while the answer is `in_flight` (and not awaiting a person) delivers again after the
    /// advised pause, for up to `wait` in all. The repeated deliveries are ordinary ones: they
    /// replay, poll or recover, never send blindly.
    pub async fn execute_waiting(
        &self,
        contract: Arc<Contract>,
        operation: Operation,
        arguments: Arc<Value>,
        effect: Arc<dyn Downstream>,
        wait: Duration,
        here: bool,
    ) -> Outcome {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let outcome = if here {
                self.execute_here(&contract, &operation, &arguments, effect.as_ref())
                    .await
            } else {
                self.execute_detached(
                    contract.clone(),
                    operation.clone(),
                    arguments.clone(),
                    effect.clone(),
                )
                .await
            };
            if outcome.status != Status::InFlight || outcome.next_action != NextAction::Poll {
                return outcome;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return outcome;
            }
            // A quarter of the advised pause, between 250 ms and 1 s: a waiting caller hears
            // of a settled operation within a second, and a long lease or job interval does not
            // turn into a long sleep past the settlement.
            let pause = (Duration::from_secs(outcome.retry_after_seconds.unwrap_or(1)) / 4)
                .clamp(Duration::from_millis(250), Duration::from_secs(1));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    /// [`Executor::approve`] on a task of its own: an operator's closed page does not stop the
    /// approved effect.
    pub async fn approve_detached(
        &self,
        contract: Arc<Contract>,
        key: OperationKey,
        approver: String,
        reason: String,
        expected: Option<Fingerprint>,
        effect: Arc<dyn Downstream>,
    ) -> Result<Outcome, ActionError> {
        let executor = self.clone();
        let shown = key.clone();
        let task = tokio::spawn(
            Box::pin(async move {
                executor
                    .approve(
                        &contract,
                        &key,
                        &approver,
                        &reason,
                        expected.as_ref(),
                        effect.as_ref(),
                    )
                    .await
            })
            .in_current_span(),
        );
        match task.await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(error = %e, "an approval's task failed");
                Ok(self.lost(Some(shown)).await)
            }
        }
    }
}

/// Awaits `future`, `None` when polling it panicked.
async fn caught<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Some(output)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(_) => std::task::Poll::Ready(None),
        }
    })
    .await
}
