//! What operators do — approve, deny, reconcile — and the status read every face polls.

use idemgate_core::audit::{Action, Draft};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{AuthStage, Downstream, Lookup};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::machine::{self, Prior};
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Dispatch, Millis, Receipt, Record, RecordState, RecordStatus};
use idemgate_core::store::{self, Cas};
use idemgate_core::transitions;
use serde_json::Value;

use super::perform::Claim;
use super::{Caller, Executor};

/// How an operator settles a record that has not settled.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The effect happened: its reference and the result to replay.
    Applied { reference: String, result: Value },
    /// The effect did not happen: the key may run again (by a new delivery).
    NotApplied,
}

/// Why an operator action on a record was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ActionError {
    #[error("no operation {0}")]
    NotFound(OperationKey),
    #[error("operation {key} is {status}, so it cannot be {action}")]
    WrongState {
        key: OperationKey,
        status: &'static str,
        action: &'static str,
    },
    #[error(
        "operation {key} was claimed for a different request than the one approved (fingerprint {found})"
    )]
    FingerprintChanged {
        key: OperationKey,
        found: Fingerprint,
    },
    #[error(
        "the contract of {0} declares no receipt lookup; resolve it with an operator resolution"
    )]
    NoLookup(String),
    #[error("operation {0} changed while this action ran; read it again")]
    Raced(OperationKey),
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// What a status read found.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // made once per read and matched at once
pub enum StatusRead {
    /// The record and the outcome a poll gives.
    Found { record: Record, outcome: Outcome },
    /// The authorization recheck refused the reader: nothing of the record may be shown.
    Denied(Outcome),
}

impl Executor {
    /// The record under `key`, which an operator action expects in one of `allowed`.
    async fn load_for(
        &self,
        key: &OperationKey,
        allowed: &[RecordStatus],
        action: &'static str,
    ) -> Result<Record, ActionError> {
        let record = self
            .store
            .get(key)
            .await?
            .ok_or_else(|| ActionError::NotFound(key.clone()))?;
        if !allowed.contains(&record.status()) {
            return Err(ActionError::WrongState {
                key: key.clone(),
                status: record.status().as_str(),
                action,
            });
        }
        Ok(record)
    }

    /// An operator approves an operation awaiting approval. The approval is bound to the exact
    /// call (`expected`, when given, must be the stored fingerprint), is single-use (the
    /// record leaves `awaiting_approval`), and records who approved. The effect then runs, with
    /// authorization rechecked for the original caller, on a task of its own when run through
    /// [`Executor::approve_detached`]. The approval's transition carries its audit entry
    /// (actor, `reason`), written in the same store transaction.
    pub async fn approve(
        &self,
        contract: &Contract,
        key: &OperationKey,
        approver: &str,
        reason: &str,
        expected: Option<&Fingerprint>,
        effect: &dyn Downstream,
    ) -> Result<Outcome, ActionError> {
        let record = self
            .load_for(key, &[RecordStatus::AwaitingApproval], "approved")
            .await?;
        if expected.is_some_and(|fp| fp != &record.fingerprint) || record.tool != contract.name {
            return Err(ActionError::FingerprintChanged {
                key: key.clone(),
                found: record.fingerprint.clone(),
            });
        }
        if record.tool_version != contract.version {
            return Err(ActionError::WrongState {
                key: key.clone(),
                status: "claimed under an older contract version",
                action: "approved",
            });
        }
        if let RecordState::AwaitingApproval { until } = record.state
            && until <= self.now()
        {
            self.expire_approval(contract, record).await;
            return Err(ActionError::WrongState {
                key: key.clone(),
                status: "past its approval window (it expired; nothing ran)",
                action: "approved",
            });
        }
        let mut t = transitions::approve(&record, contract, approver, self.at());
        with_reason(&mut t, reason);
        t.audit = Some(Draft::of(&record, &t, Action::Approved, approver, reason));
        let claim = match self.store.transition(t).await? {
            Cas::Done(r) => Claim::new(r),
            Cas::Lost(_) => return Err(ActionError::Raced(key.clone())),
        };
        // The recheck is for the caller who asked, now, not for the approver.
        let outcome = match self.authorize_send(contract, claim.record()).await {
            Ok(proof) => {
                self.perform(contract, claim, proof, effect, Prior::Clean)
                    .await
            }
            Err(refused) => {
                // Nothing was sent: the claim is released, and only a new delivery (authorized
                // afresh) may run it again.
                self.release(
                    contract,
                    claim,
                    refused.code(),
                    &refused.reason(),
                    None,
                    None,
                )
                .await
            }
        };
        Ok(self.observe(&contract.name, Some(&record.fingerprint), outcome))
    }

    /// An operator denies an operation awaiting approval: it ends as a refusal that every later
    /// delivery replays. Its transition carries the audit entry.
    pub async fn deny(
        &self,
        contract: &Contract,
        key: &OperationKey,
        approver: &str,
        reason: &str,
    ) -> Result<Outcome, ActionError> {
        let record = self
            .load_for(key, &[RecordStatus::AwaitingApproval], "denied")
            .await?;
        let mut t = transitions::deny(&record, contract, approver, reason, self.at());
        with_reason(&mut t, reason);
        t.audit = Some(Draft::of(&record, &t, Action::Denied, approver, reason));
        match self.store.transition(t).await? {
            Cas::Done(r) => Ok(machine::status_outcome(Some(contract), &r, self.now())),
            Cas::Lost(_) => Err(ActionError::Raced(key.clone())),
        }
    }

    /// Reconciles a record that has not settled — `unknown`, `pending`, or awaiting approval:
    /// with no resolution, by looking the receipt up now; with an operator's resolution, as the
    /// operator says (recorded with the actor). `not_applied` is refused while a worker's lease
    /// is live (it may be sending right now) and for an approval (deny it instead). Every
    /// transition this makes — a lookup that settles, a resolution — carries its audit entry
    /// (actor, `reason`); a lookup that settles nothing, or an action refused or lost to a
    /// race, writes nothing, so appends nothing.
    pub async fn reconcile(
        &self,
        contract: &Contract,
        key: &OperationKey,
        resolution: Option<Resolution>,
        actor: &str,
        reason: &str,
        effect: &dyn Downstream,
    ) -> Result<Outcome, ActionError> {
        const UNSETTLED: [RecordStatus; 3] = [
            RecordStatus::Unknown,
            RecordStatus::Pending,
            RecordStatus::AwaitingApproval,
        ];
        let record = self.load_for(key, &UNSETTLED, "reconciled").await?;
        let at = self.at();
        let action = match &resolution {
            None => Action::SettledByLookup,
            Some(Resolution::Applied { .. }) => Action::ResolvedApplied,
            Some(Resolution::NotApplied) => Action::ResolvedNotApplied,
        };
        let mut t = match resolution {
            None => {
                if !contract.receipt_lookup() {
                    return Err(ActionError::NoLookup(contract.name.clone()));
                }
                if let RecordState::AwaitingApproval { .. } = record.state {
                    return Err(ActionError::WrongState {
                        key: key.clone(),
                        status: "awaiting approval (nothing was sent)",
                        action: "looked up",
                    });
                }
                // A worker holding a live lease may be about to send: a receipt found now may
                // be an earlier life's of the same key, and settling under it would let that
                // send make a second effect. Wait for the lease, as for `applied`.
                if live_claim(&record, at.now) {
                    return Err(ActionError::WrongState {
                        key: key.clone(),
                        status: "in flight (a worker's lease is live; it may be sending now)",
                        action: "looked up",
                    });
                }
                match effect.lookup_receipt(key).await {
                    Lookup::Found(receipt) if !receipt.reference.is_empty() => {
                        transitions::from_outside(
                            transitions::reconciled_by_lookup(
                                &record, contract, receipt, actor, at,
                            ),
                            &record,
                            at,
                        )
                    }
                    Lookup::Found(_) | Lookup::NotFound => {
                        return Ok(machine::status_outcome(Some(contract), &record, at.now));
                    }
                    Lookup::Unavailable(why) => {
                        tracing::warn!(
                            operation_key = key.as_str(),
                            reason = why,
                            "operator's receipt lookup unavailable"
                        );
                        return Ok(machine::status_outcome(Some(contract), &record, at.now));
                    }
                }
            }
            Some(Resolution::Applied { reference, result }) => {
                // A worker holding a live lease may be sending right now: what the operator saw
                // may not be this attempt's effect. Wait for the lease (a job's lease is only
                // its next poll, so a job may be resolved at any time).
                if live_claim(&record, at.now) {
                    return Err(ActionError::WrongState {
                        key: key.clone(),
                        status: "in flight (a worker's lease is live; it may be sending now)",
                        action: "resolved applied",
                    });
                }
                transitions::from_outside(
                    transitions::resolve_applied(
                        &record,
                        contract,
                        Receipt { reference, result },
                        actor,
                        at,
                    ),
                    &record,
                    at,
                )
            }
            Some(Resolution::NotApplied) => match &record.state {
                RecordState::Unknown(_) => {
                    transitions::resolve_not_applied(&record, contract, actor, at)
                }
                RecordState::Pending { lease, dispatch } => match (dispatch, &lease.owner) {
                    // Already released: nothing to change.
                    (Dispatch::NotSent, None) => {
                        return Ok(machine::status_outcome(Some(contract), &record, at.now));
                    }
                    (Dispatch::Job { .. }, _) => {
                        return Err(ActionError::WrongState {
                            key: key.clone(),
                            status: "an accepted job (resolve it applied, or let its poll finish it)",
                            action: "resolved not applied",
                        });
                    }
                    // Maybe sent: a late answer, a receipt or a deduplicated resend may still
                    // settle it, and a worker paused past its lease may still send. Recovery
                    // ends it `unknown` when nothing can; the operator resolves it then.
                    (Dispatch::Sent, _) => {
                        return Err(ActionError::WrongState {
                            key: key.clone(),
                            status: "pending and maybe sent (recovery settles it, or ends it unknown)",
                            action: "resolved not applied",
                        });
                    }
                    // Without the dispatch marker, "not sent" on a worker's claim proves nothing:
                    // it may have sent before it stopped (or be paused, about to).
                    (Dispatch::NotSent, Some(_)) if !contract.uses_dispatch_marker() => {
                        return Err(ActionError::WrongState {
                            key: key.clone(),
                            status: "pending and maybe sent (no dispatch marker; recovery settles it, or ends it unknown)",
                            action: "resolved not applied",
                        });
                    }
                    (Dispatch::NotSent, Some(_)) if lease.expires_at > at.now => {
                        return Err(ActionError::WrongState {
                            key: key.clone(),
                            status: "in flight (a worker's lease is live; it may be sending now)",
                            action: "resolved not applied",
                        });
                    }
                    // Guarded like any step from outside the claim: a worker that renewed its
                    // lease (or wrote its marker) since the record was read wins.
                    (Dispatch::NotSent, _) => transitions::from_outside(
                        transitions::resolve_not_applied(&record, contract, actor, at),
                        &record,
                        at,
                    ),
                },
                RecordState::AwaitingApproval { .. } => {
                    return Err(ActionError::WrongState {
                        key: key.clone(),
                        status: "awaiting approval (deny it instead)",
                        action: "resolved not applied",
                    });
                }
                RecordState::Applied(_)
                | RecordState::FailedPermanent(_)
                | RecordState::Tombstone(_) => {
                    return Err(ActionError::WrongState {
                        key: key.clone(),
                        status: record.status().as_str(),
                        action: "reconciled",
                    });
                }
            },
        };
        with_reason(&mut t, reason);
        t.audit = Some(Draft::of(&record, &t, action, actor, reason));
        match self.store.transition(t).await? {
            Cas::Done(r) => {
                self.settled.offer(&r, self.now());
                Ok(machine::status_outcome(Some(contract), &r, self.now()))
            }
            Cas::Lost(_) => Err(ActionError::Raced(key.clone())),
        }
    }

    /// The poll target: the record and its outcome, advancing an accepted job by polling it.
    /// Never performs a new effect. Reading a stored result is handed out like a replay, so the
    /// reader is rechecked with the contract's hook first (when the contract is loaded).
    pub async fn status(
        &self,
        contract: Option<&Contract>,
        key: &OperationKey,
        effect: Option<&dyn Downstream>,
        reader: &Caller,
    ) -> Result<Option<StatusRead>, store::Error> {
        let Some(record) = self.store.get(key).await? else {
            return Ok(None);
        };
        if let Some(contract) = contract
            && let Err(refused) = self
                .authorize_caller(
                    contract,
                    reader,
                    Some(key),
                    &record.fingerprint,
                    AuthStage::BeforeReplay,
                )
                .await
        {
            let proof = machine::repeatable(key, Some(&record));
            return Ok(Some(StatusRead::Denied(
                refused.outcome(Some(key.clone()), proof),
            )));
        }
        if let (
            Some(contract),
            Some(effect),
            RecordState::Pending {
                dispatch: Dispatch::Job { job_id },
                ..
            },
        ) = (contract, effect, &record.state)
        {
            let job_id = job_id.clone();
            let outcome = self
                .poll_job(
                    contract,
                    record,
                    &job_id,
                    effect,
                    super::jobs::Poller::Delivery,
                )
                .await;
            let record = self.store.get(key).await?.ok_or_else(|| {
                store::Error::Corrupt(format!("{key} vanished while its job was polled"))
            })?;
            return Ok(Some(StatusRead::Found { record, outcome }));
        }
        // An unknown record may be settled by later evidence now (its job's end, a receipt).
        if let (Some(contract), Some(effect), RecordState::Unknown(_)) =
            (contract, effect, &record.state)
            && let Some(settled) = self.seek_evidence(contract, &record, effect).await
        {
            let outcome = machine::status_outcome(Some(contract), &settled, self.now());
            return Ok(Some(StatusRead::Found {
                record: settled,
                outcome,
            }));
        }
        let outcome = machine::status_outcome(contract, &record, self.now());
        Ok(Some(StatusRead::Found { record, outcome }))
    }
}

/// Puts the operator's reason on the timeline: appended to the detail of each event the
/// action writes (the audit entry carries it too).
fn with_reason(t: &mut idemgate_core::store::Transition, reason: &str) {
    for event in &mut t.events {
        event.detail = Some(match event.detail.take() {
            Some(detail) => format!("{detail}; reason: {reason}"),
            None => format!("reason: {reason}"),
        });
    }
}

/// What a record settled by hand is kept for when its tool's contract is not at hand
/// ([`Executor::resolve_by_hand`], [`Executor::deny_by_hand`]): the record 30 days, its
/// tombstone a year after that, and a released claim's retry window a day. Long on purpose:
/// a key is only free to run again once its tombstone is gone, and the contract that would
/// say how long its retries go on is not here.
pub const BY_HAND_RETENTION: (u64, u64, u64) = (30 * 86_400, 365 * 86_400, 86_400);

/// The contract an operator's resolution by hand is carried out under, for a record whose
/// tool is not loaded: the record's own tool and version, [`BY_HAND_RETENTION`], no receipt
/// lookup, and deduplication on the key assumed — so a claim's missing dispatch marker proves
/// nothing, and `not_applied` is refused for a claim that may have sent.
fn stand_in(record: &Record) -> Result<Contract, ActionError> {
    let (record_ttl, tombstone_ttl, max_retry_window) = BY_HAND_RETENTION;
    let file = serde_json::json!({
        "name": "resolved-by-hand",
        "version": "by-hand",
        "effect_class": "key_based",
        "input_schema": {"type": "object"},
        "request_fingerprint": {"fields": ["*"]},
        "downstream": {"deduplicates_by_key": true},
        "retention": {
            "record_ttl": format!("{record_ttl}s"),
            "tombstone_ttl": format!("{tombstone_ttl}s"),
            "max_retry_window": format!("{max_retry_window}s"),
        },
    });
    let file = serde_json::from_value(file)
        .map_err(|e| store::Error::Corrupt(format!("the stand-in contract: {e}")))?;
    let mut contract = Contract::from_file(file, "", "(resolved by hand)")
        .map_err(|e| store::Error::Corrupt(format!("the stand-in contract: {e}")))?;
    contract.name = record.tool.clone();
    contract.version = record.tool_version.clone();
    Ok(contract)
}

/// The downstream of a tool that is not loaded: an action by hand never reaches it.
struct Absent;

impl Downstream for Absent {
    fn perform<'a>(
        &'a self,
        _request: idemgate_core::effect::EffectRequest<'a>,
    ) -> store::BoxFuture<'a, idemgate_core::effect::EffectOutcome> {
        Box::pin(async {
            idemgate_core::effect::EffectOutcome::NotSent {
                reason: "the tool is not loaded here".into(),
                retry_after: None,
            }
        })
    }

    fn lookup_receipt<'a>(&'a self, _key: &'a OperationKey) -> store::BoxFuture<'a, Lookup> {
        Box::pin(async { Lookup::Unavailable("the tool is not loaded here".into()) })
    }

    fn poll_job<'a>(
        &'a self,
        _key: &'a OperationKey,
        _job_id: &'a str,
    ) -> store::BoxFuture<'a, idemgate_core::effect::JobStatus> {
        Box::pin(async {
            idemgate_core::effect::JobStatus::Unavailable("the tool is not loaded here".into())
        })
    }
}

impl Executor {
    /// An operator's resolution of a record whose tool's contract is not at hand (a tool of
    /// an in-process package, or one this gateway does not load): `applied` with the
    /// reference they found, or `not_applied`, under the same rules as
    /// [`Executor::reconcile`] — refused while a claim's lease is live, and `not_applied`
    /// refused for a claim that may have sent — with [`BY_HAND_RETENTION`]. Never looked up:
    /// there is nothing to look it up with. Audited with the actor and `reason`.
    pub async fn resolve_by_hand(
        &self,
        key: &OperationKey,
        resolution: Resolution,
        actor: &str,
        reason: &str,
    ) -> Result<Outcome, ActionError> {
        let record = self
            .store
            .get(key)
            .await?
            .ok_or_else(|| ActionError::NotFound(key.clone()))?;
        let contract = stand_in(&record)?;
        self.reconcile(&contract, key, Some(resolution), actor, reason, &Absent)
            .await?;
        self.outcome_now(key).await
    }

    /// An operator's denial of an approval whose tool's contract is not at hand: as
    /// [`Executor::deny`], with [`BY_HAND_RETENTION`].
    pub async fn deny_by_hand(
        &self,
        key: &OperationKey,
        actor: &str,
        reason: &str,
    ) -> Result<Outcome, ActionError> {
        let record = self
            .store
            .get(key)
            .await?
            .ok_or_else(|| ActionError::NotFound(key.clone()))?;
        let contract = stand_in(&record)?;
        self.deny(&contract, key, actor, reason).await?;
        self.outcome_now(key).await
    }

    /// What a caller gets now for `key`, read without a contract.
    async fn outcome_now(&self, key: &OperationKey) -> Result<Outcome, ActionError> {
        let record = self
            .store
            .get(key)
            .await?
            .ok_or_else(|| ActionError::NotFound(key.clone()))?;
        Ok(machine::status_outcome(None, &record, self.now()))
    }
}

/// A worker's claim whose lease has not run out: it may be sending right now. (A job's lease is
/// only its next poll, so a job is never held this way.)
fn live_claim(record: &Record, now: Millis) -> bool {
    matches!(
        &record.state,
        RecordState::Pending {
            lease,
            dispatch: Dispatch::NotSent | Dispatch::Sent,
        } if lease.owner.is_some() && lease.expires_at > now
    )
}
