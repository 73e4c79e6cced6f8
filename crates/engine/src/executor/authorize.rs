//! The authorization hook, and the proof every send requires.
//!
//! **No effect without a fresh authorization.** The code that sends (`perform::send`) takes an
//! [`Authorized`] by value, and only this module can make one: by asking the hook, just now,
//! about the operation's recorded actor (or, before the first claim, the caller who is about
//! to become it). A path that forgets the recheck does not compile; a resend needs a new proof,
//! because the last one was consumed by the send before it.

use idemgate_core::contract::Contract;
use idemgate_core::effect::{AuthRequest, AuthStage, Authorization};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome, Repeatable};
use idemgate_core::record::Record;

use tracing::Instrument;

use super::{Caller, Executor};

/// The role a deferred recheck (recovery, approval, resend) presents for the recorded actor:
/// the record keeps who asked, not under which role.
const RECORDED_ROLE: &str = "agent";

/// Proof that the authorization hook allowed one send for one operation just now. Neither
/// `Clone` nor constructible outside this module; consumed by the send it allows.
#[must_use = "a send needs this proof; dropping it means nothing is sent"]
#[derive(Debug)]
pub(crate) struct Authorized {
    /// The operation the decision was about; `None` for a key-less call.
    key: Option<OperationKey>,
}

impl Authorized {
    /// Whether this proof allows a send under `key`.
    pub(crate) fn covers(&self, key: Option<&OperationKey>) -> bool {
        self.key.as_ref() == key
    }
}

/// Why the hook did not allow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    Denied(String),
    /// The hook could not answer: the executor fails closed, and may ask again later.
    Unavailable(String),
}

impl Refused {
    pub(crate) fn reason(&self) -> String {
        match self {
            Refused::Denied(r) => format!("authorization denied: {r}"),
            Refused::Unavailable(r) => format!("authorization could not be checked: {r}"),
        }
    }

    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            Refused::Denied(_) => ErrorCode::Forbidden,
            Refused::Unavailable(_) => ErrorCode::AuthorizationUnavailable,
        }
    }

    /// The answer to a delivery refused by the hook: `safe_to_repeat` only with the machine's
    /// proof that the key had no effect (`machine::repeatable` of what was read), never for a
    /// key that may already have had one (a replay refused).
    pub(crate) fn outcome(&self, key: Option<OperationKey>, proof: Option<Repeatable>) -> Outcome {
        match proof {
            Some(proof) => Outcome::refused(proof, self.code(), self.reason()),
            None => Outcome::rejected(key, self.code(), self.reason()),
        }
    }
}

impl Executor {
    #[allow(clippy::too_many_arguments)] // the hook's request, field by field
    async fn decide(
        &self,
        contract: &Contract,
        tenant: &str,
        actor: &str,
        role: &str,
        key: Option<&OperationKey>,
        fingerprint: &Fingerprint,
        stage: AuthStage,
    ) -> Result<(), Refused> {
        if !contract.recheck_authorization() {
            // The contract declares that its effect needs no recheck: the decision is the
            // contract's, made at load.
            return Ok(());
        }
        let request = AuthRequest {
            tenant,
            actor,
            role,
            tool: &contract.name,
            key,
            fingerprint,
            stage,
        };
        let decision = self
            .authorizer
            .authorize(request)
            .instrument(tracing::debug_span!("authorize", stage = ?stage))
            .await;
        match decision {
            Authorization::Allowed => Ok(()),
            Authorization::Denied(reason) => Err(Refused::Denied(reason)),
            // Fail closed: an unreachable hook is not a permission.
            Authorization::Unavailable(reason) => Err(Refused::Unavailable(reason)),
        }
    }

    /// A delivering caller, for what the delivery itself does (a replay, a poll, a recovery it
    /// triggers). Proves nothing about a send.
    pub(crate) async fn authorize_caller(
        &self,
        contract: &Contract,
        caller: &Caller,
        key: Option<&OperationKey>,
        fingerprint: &Fingerprint,
        stage: AuthStage,
    ) -> Result<(), Refused> {
        self.decide(
            contract,
            &caller.tenant,
            &caller.actor,
            &caller.role,
            key,
            fingerprint,
            stage,
        )
        .await
    }

    /// The caller of a first delivery, who becomes the operation's recorded actor: the proof
    /// for the first send (or the only one, of a key-less call).
    pub(crate) async fn authorize_new(
        &self,
        contract: &Contract,
        caller: &Caller,
        key: Option<&OperationKey>,
        fingerprint: &Fingerprint,
    ) -> Result<Authorized, Refused> {
        self.authorize_caller(contract, caller, key, fingerprint, AuthStage::BeforeEffect)
            .await?;
        Ok(Authorized { key: key.cloned() })
    }

    /// The operation's recorded actor, now: the proof for a send of `record` (after an
    /// approval, a takeover, or before a resend).
    pub(crate) async fn authorize_send(
        &self,
        contract: &Contract,
        record: &Record,
    ) -> Result<Authorized, Refused> {
        self.decide(
            contract,
            record.tenant(),
            &record.actor,
            RECORDED_ROLE,
            Some(&record.key),
            &record.fingerprint,
            AuthStage::BeforeEffect,
        )
        .await?;
        Ok(Authorized {
            key: Some(record.key.clone()),
        })
    }
}
