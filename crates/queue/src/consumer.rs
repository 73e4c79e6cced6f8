//! The library consumer: one message's payload in, one [`Disposition`] out.
//!
//! It knows nothing about a particular queue. An adapter (the [`crate::nats`] one, or an
//! application's own) reads a message, calls [`Consumer::handle`], and acknowledges, returns or
//! refuses the message as the disposition says — and only after `handle` returned, which is
//! after the record settled or was handed on. A consumer killed before that leaves the message
//! unacknowledged; its redelivery finds the record this delivery claimed.

use idemgate_app::App;
use idemgate_core::outcome::Outcome;
use idemgate_engine::Caller;

use crate::disposition::Disposition;
use crate::envelope::{self, Envelope};

/// Where a message came from, as the queue tells it: for logs and metrics only. None of it is
/// part of the operation's identity, because every redelivery changes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    /// The queue's id of the message (a JetStream stream sequence, a broker's message id).
    pub message_id: Option<String>,
    /// How many times the queue has delivered it, this time included.
    pub attempt: Option<u64>,
}

/// The answer to one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Handled {
    pub disposition: Disposition,
    /// The executor's outcome; absent when the message never reached it (a malformed
    /// envelope, a tool that is not loaded).
    pub outcome: Option<Outcome>,
}

/// Hands envelopes to the application under one tenant, in the application's environment.
#[derive(Clone)]
pub struct Consumer {
    app: App,
    tenant: String,
    default_actor: String,
    limits: envelope::Limits,
}

impl Consumer {
    /// A consumer for `tenant`'s operations in `app`'s environment. The actor of an envelope
    /// that names none is `default_actor`.
    pub fn new(app: App, tenant: impl Into<String>, default_actor: impl Into<String>) -> Consumer {
        Consumer {
            app,
            tenant: tenant.into(),
            default_actor: default_actor.into(),
            limits: envelope::Limits::default(),
        }
    }

    pub fn with_limits(mut self, limits: envelope::Limits) -> Consumer {
        self.limits = limits;
        self
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn environment(&self) -> &str {
        self.app.environment()
    }

    /// Handles one message's payload: parse the envelope, claim or load the operation's record
    /// through the application (whose executor performs the effect at most once per key), and
    /// say what the queue should do with the message.
    ///
    /// The execution runs on a task of its own ([`App::invoke`]): an adapter that stops waiting
    /// (a shutdown) does not cut an effect off half-way.
    pub async fn handle(&self, payload: &[u8], delivery: &Delivery) -> Handled {
        let message_id = delivery.message_id.as_deref();
        let attempt = delivery.attempt;
        let envelope = match Envelope::parse(payload, self.limits) {
            Ok(envelope) => envelope,
            Err(e) => {
                tracing::warn!(
                    message_id,
                    attempt,
                    "message refused, no record and no effect: {e}"
                );
                return Handled {
                    disposition: Disposition::Refused {
                        code: None,
                        reason: e.to_string(),
                    },
                    outcome: None,
                };
            }
        };
        if self.app.tools().get(&envelope.tool).is_none() {
            let reason = format!("no tool `{}` is loaded here", envelope.tool);
            tracing::warn!(
                message_id,
                attempt,
                tool = envelope.tool,
                workflow_id = envelope.workflow_id,
                step_id = envelope.step_id,
                "message refused: {reason}; no record, no effect"
            );
            return Handled {
                disposition: Disposition::Refused {
                    code: Some(idemgate_core::ErrorCode::UnknownTool),
                    reason,
                },
                outcome: None,
            };
        }
        let caller = Caller {
            tenant: self.tenant.clone(),
            actor: envelope
                .actor
                .clone()
                .unwrap_or_else(|| self.default_actor.clone()),
            role: "agent".into(),
        };
        let outcome = self
            .app
            .invoke(
                caller,
                &envelope.tool,
                Some(envelope.workflow_id),
                Some(envelope.step_id),
                envelope.arguments,
            )
            .await;
        let disposition = Disposition::of(&outcome);
        let key = outcome.operation_key.as_ref().map(|k| k.as_str());
        match &disposition {
            Disposition::Refused { code, reason } => tracing::warn!(
                message_id,
                attempt,
                operation_key = key,
                code = code.map(|c| c.as_str()),
                "message refused: {reason}"
            ),
            Disposition::Parked => tracing::warn!(
                message_id,
                attempt,
                operation_key = key,
                outcome = outcome.status.as_str(),
                "message parked: the operation waits for an operator"
            ),
            Disposition::Settled | Disposition::Retry { .. } => tracing::debug!(
                message_id,
                attempt,
                operation_key = key,
                outcome = outcome.status.as_str(),
                disposition = disposition.as_str(),
                "message handled"
            ),
        }
        Handled {
            disposition,
            outcome: Some(outcome),
        }
    }
}
