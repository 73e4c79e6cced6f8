//! The executor: one delivery in, one labelled outcome out, at most one effect per operation.
//!
//! Every function here follows the same shape: read what is stored, ask
//! [`idemgate_core::machine`] what that means, carry out the answer with one compare-and-set,
//! and only then talk to the downstream. The order of those steps is the whole guarantee, so
//! each is commented with the failure it guards against.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::CANONICALIZATION_VERSION;
use idemgate_core::clock::Clock;
use idemgate_core::contract::{Contract, EffectClass};
use idemgate_core::effect::{
    AuthRequest, AuthStage, Authorization, Authorizer, Downstream, EffectOutcome, EffectRequest,
    JobStatus, Lookup,
};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::machine::{self, AfterEffect, Branch, Miss, Recovery};
use idemgate_core::outcome::{ErrorCode, NextAction, Outcome, Status};
use idemgate_core::record::{
    Dispatch, Event, EventKind, Evidence, Lease, Millis, Receipt, Record, RecordState, Refusal,
};
use idemgate_core::store::{self, Cas, Claimed, Expect, RequestUpdate, Store, Transition};
use serde_json::Value;

use crate::settled::Settled;

/// Who is asking. The tenant comes from the caller's credentials, never from the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    /// The authenticated principal, recorded with the operation for later rechecks.
    pub actor: String,
    /// `agent` or `operator`; passed to the authorization hook.
    pub role: String,
}

/// One delivery's identity: the caller, the configured environment, and the workflow step the
/// calling application names. A model's tool-call id is never any of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub caller: Caller,
    pub environment: String,
    pub workflow_id: Option<String>,
    pub step_id: Option<String>,
}

/// Why a delivery's operation key could not be derived.
enum KeyProblem {
    /// One of workflow_id and step_id is absent.
    Missing(&'static str),
    Invalid(idemgate_core::key::Error),
}

impl Operation {
    fn key(&self) -> Result<Option<OperationKey>, KeyProblem> {
        match (&self.workflow_id, &self.step_id) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(KeyProblem::Missing("step_id")),
            (None, Some(_)) => Err(KeyProblem::Missing("workflow_id")),
            (Some(workflow), Some(step)) => {
                OperationKey::new(&self.caller.tenant, &self.environment, workflow, step)
                    .map(Some)
                    .map_err(KeyProblem::Invalid)
            }
        }
    }
}

/// Sees every delivery and its outcome, whether or not anything was written: replays, waits and
/// rejections leave no row in the store, so this is where they are counted and logged.
pub trait Observer: Send + Sync {
    fn delivery(&self, tool: &str, fingerprint: Option<&Fingerprint>, outcome: &Outcome);
}

/// Tunables of the executor. The defaults suit a gateway; tests shorten them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This process's identity as a lease owner. Unique per process.
    pub worker: String,
    /// Resends to a deduplicating downstream within one delivery after an ambiguous answer,
    /// before the record is left to the recoverer.
    pub max_resends: u32,
    /// How many settled (`applied`, `failed_permanent`) records to keep in memory, so that a
    /// replay of one reads no row (see the `settled` module); 0 reads the store every time.
    /// Each costs the size of its record, result included.
    pub settled_records: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            worker: default_worker_id(),
            max_resends: 2,
            settled_records: 10_000,
        }
    }
}

/// A worker id unique enough across processes and restarts: process id and start time.
pub fn default_worker_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("w{}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}

/// How an operator settles an `unknown` record.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The effect happened: its reference and the result to replay.
    Applied { reference: String, result: Value },
    /// The effect did not happen: the key may run again.
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

/// The executor. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Executor {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    authorizer: Arc<dyn Authorizer>,
    observer: Option<Arc<dyn Observer>>,
    settings: Arc<Settings>,
    settled: Arc<Settled>,
}

/// An owned pending claim: the record as this worker wrote it. Finishing consumes it.
struct Claim {
    record: Record,
}

impl Executor {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        authorizer: Arc<dyn Authorizer>,
        settings: Settings,
    ) -> Executor {
        Executor {
            store,
            clock,
            authorizer,
            observer: None,
            settled: Arc::new(Settled::new(settings.settled_records)),
            settings: Arc::new(settings),
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Executor {
        self.observer = Some(observer);
        self
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn worker(&self) -> &str {
        &self.settings.worker
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    fn event(&self, kind: EventKind, attempt: u64) -> Event {
        Event::new(kind, self.now(), attempt, &self.settings.worker)
    }

    fn observe(&self, tool: &str, fp: Option<&Fingerprint>, outcome: Outcome) -> Outcome {
        tracing::info!(
            tool,
            operation_key = outcome.operation_key.as_ref().map(|k| k.as_str()),
            fingerprint = fp.map(|f| f.as_str()),
            status = outcome.status.as_str(),
            error = outcome.error_code().map(|c| c.as_str()),
            reference = outcome.effect_reference.as_deref(),
            "delivery"
        );
        if let Some(o) = &self.observer {
            o.delivery(tool, fp, &outcome);
        }
        outcome
    }

    // -----------------------------------------------------------------------------------------
    // A delivery.

    /// Executes one delivery of `arguments` for `operation` under `contract`, performing the
    /// effect through `effect` at most once per operation key.
    pub async fn execute(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        effect: &dyn Downstream,
    ) -> Outcome {
        let tool = contract.name.as_str();
        // Bad input leaves no record: validation, key and fingerprint all come before any write.
        if let Err(e) = contract.validate(arguments) {
            let key = operation.key().ok().flatten();
            return self.observe(
                tool,
                None,
                Outcome::rejected(key, ErrorCode::InvalidArguments, e.message),
            );
        }
        let key = match operation.key() {
            Ok(key) => key,
            Err(KeyProblem::Missing(part)) => {
                return self.observe(
                    tool,
                    None,
                    Outcome::rejected(
                        None,
                        ErrorCode::MissingOperationKey,
                        format!("the operation names no {part}; give both workflow_id and step_id"),
                    ),
                );
            }
            Err(KeyProblem::Invalid(e)) => {
                return self.observe(
                    tool,
                    None,
                    Outcome::rejected(None, ErrorCode::InvalidOperationKey, e.to_string()),
                );
            }
        };
        let fingerprint = match contract.fingerprint(arguments) {
            Ok(fp) => fp,
            Err(e) => {
                return self.observe(
                    tool,
                    None,
                    Outcome::rejected(key, ErrorCode::InvalidArguments, e.message),
                );
            }
        };
        let outcome = match (contract.effect_class, key) {
            (EffectClass::NonIdempotent, key) => Outcome::rejected(
                key,
                ErrorCode::EffectClassRefused,
                "non_idempotent tools are not executed; redesign as a keyed command",
            ),
            (EffectClass::Read, _) | (EffectClass::NaturalIdempotent, None) => {
                self.unkeyed(contract, operation, arguments, &fingerprint, effect)
                    .await
            }
            (EffectClass::KeyBased | EffectClass::Irreversible, None) => Outcome::rejected(
                None,
                ErrorCode::MissingOperationKey,
                format!(
                    "{tool} is {}: the calling application must name the workflow_id and step_id of this operation",
                    contract.effect_class.as_str()
                ),
            ),
            (_, Some(key)) => {
                self.keyed(contract, operation, key, arguments, &fingerprint, effect)
                    .await
            }
        };
        self.observe(tool, Some(&fingerprint), outcome)
    }

    /// Like [`Executor::execute`], but while the answer is `in_flight` (and not awaiting a
    /// person) delivers again after the advised pause, for up to `wait` in all. The repeated
    /// deliveries are ordinary ones: they replay, poll or recover, never send blindly.
    pub async fn execute_waiting(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        effect: &dyn Downstream,
        wait: Duration,
    ) -> Outcome {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let outcome = self.execute(contract, operation, arguments, effect).await;
            if outcome.status != Status::InFlight || outcome.next_action != NextAction::Poll {
                return outcome;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return outcome;
            }
            let pause = Duration::from_millis(250)
                .max(Duration::from_secs(outcome.retry_after_seconds.unwrap_or(1)) / 4);
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    async fn authorize(
        &self,
        contract: &Contract,
        caller: &Caller,
        key: Option<&OperationKey>,
        fingerprint: &Fingerprint,
        stage: AuthStage,
    ) -> Result<(), Outcome> {
        if !contract.recheck_authorization() {
            return Ok(());
        }
        let request = AuthRequest {
            tenant: &caller.tenant,
            actor: &caller.actor,
            role: &caller.role,
            tool: &contract.name,
            key,
            fingerprint,
            stage,
        };
        match self.authorizer.authorize(request).await {
            Authorization::Allowed => Ok(()),
            Authorization::Denied(reason) => Err(Outcome::rejected(
                key.cloned(),
                ErrorCode::Forbidden,
                format!("authorization denied: {reason}"),
            )),
            // Fail closed: an unreachable hook is not a permission.
            Authorization::Unavailable(reason) => Err(Outcome::rejected(
                key.cloned(),
                ErrorCode::AuthorizationUnavailable,
                format!("authorization could not be checked: {reason}"),
            )),
        }
    }

    /// Reads and key-less natural-idempotent updates: no claim and no record; repeating them is
    /// harmless by the contract's own declaration.
    async fn unkeyed(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        fingerprint: &Fingerprint,
        effect: &dyn Downstream,
    ) -> Outcome {
        let caller = &operation.caller;
        if let Err(o) = self
            .authorize(contract, caller, None, fingerprint, AuthStage::BeforeEffect)
            .await
        {
            return o;
        }
        // A key-less call still sends an identity downstream: one derived from the fingerprint,
        // so that identical repeats look identical to the system of record.
        let pseudo = match OperationKey::new(
            &caller.tenant,
            &operation.environment,
            "unkeyed",
            &fingerprint.as_str()["sha256:".len()..],
        ) {
            Ok(key) => key,
            Err(e) => {
                return Outcome::rejected(None, ErrorCode::InvalidOperationKey, e.to_string());
            }
        };
        let request = EffectRequest {
            key: &pseudo,
            tool: &contract.name,
            tool_version: &contract.version,
            arguments,
            attempt: 1,
            precondition: contract.precondition(arguments),
        };
        let repeatable = |mut o: Outcome| {
            o.safe_to_repeat = true;
            o.operation_key = None;
            o
        };
        match machine::after_effect(contract, effect.perform(request).await) {
            AfterEffect::Apply(r) => repeatable(Outcome::applied(pseudo, r.reference, r.result)),
            AfterEffect::Job(job_id) => repeatable(
                Outcome::in_flight(pseudo, NextAction::Poll, machine::JOB_POLL_SECONDS)
                    .with_reference(Some(job_id)),
            ),
            AfterEffect::Refuse(refusal) => Outcome::rejected(None, refusal.code, refusal.message),
            AfterEffect::Release { code, reason, .. } => Outcome::rejected(None, code, reason),
            AfterEffect::Ambiguous(reason) => {
                let mut o = repeatable(Outcome::unknown(pseudo, reason));
                o.next_action = NextAction::None;
                o.retry_after_seconds = Some(1);
                o
            }
        }
    }

    async fn keyed(
        &self,
        contract: &Contract,
        operation: &Operation,
        key: OperationKey,
        arguments: &Value,
        fingerprint: &Fingerprint,
        effect: &dyn Downstream,
    ) -> Outcome {
        // A read first: a replay must never write, and most duplicates are replays. A settled
        // record seen before cannot have changed since, and is not read again.
        let existing = match self.settled.get(&key, self.now()) {
            Some(record) => Some(record),
            None => match self.store.get(&key).await {
                Ok(Some(record)) => {
                    self.settled.offer(&record, self.now());
                    Some(record)
                }
                Ok(None) => None,
                Err(e) => return store_down(Some(key), &e),
            },
        };
        if let Some(record) = existing {
            return self
                .existing(
                    contract,
                    operation,
                    record,
                    arguments,
                    fingerprint,
                    effect,
                    0,
                )
                .await;
        }
        let caller = &operation.caller;
        if let Err(o) = self
            .authorize(
                contract,
                caller,
                Some(&key),
                fingerprint,
                AuthStage::BeforeEffect,
            )
            .await
        {
            return o;
        }
        let now = self.now();
        if let Some(window) = contract.duplicate_intent_window() {
            match self
                .store
                .find_fingerprint(
                    &caller.tenant,
                    &contract.name,
                    fingerprint,
                    now - window.millis(),
                )
                .await
            {
                Ok(Some(other)) if other != key => {
                    return Outcome::rejected(
                        Some(key),
                        ErrorCode::PossibleDuplicateIntent,
                        format!(
                            "the same request ran under operation {other} within the last {window}; \
                             if a second effect is really intended, ask for approval"
                        ),
                    );
                }
                Ok(_) => {}
                Err(e) => return store_down(Some(key), &e),
            }
        }
        let approval = contract.needs_approval(arguments);
        let state = if approval {
            RecordState::AwaitingApproval
        } else {
            RecordState::Pending {
                lease: self.lease(contract, now),
                dispatch: Dispatch::NotSent,
            }
        };
        let retention = &contract.retention;
        let record = Record {
            key: key.clone(),
            tool: contract.name.clone(),
            tool_version: contract.version.clone(),
            fingerprint: fingerprint.clone(),
            canonicalization: CANONICALIZATION_VERSION,
            state,
            fence: 1,
            actor: caller.actor.clone(),
            request: Some(arguments.clone()),
            approved_by: None,
            created_at: now,
            updated_at: now,
            expires_at: now + retention.record_ttl.millis(),
            purge_at: now + retention.record_ttl.millis() + retention.tombstone_ttl.millis(),
            intent_window: contract.duplicate_intent_window().is_some(),
        };
        let mut events = vec![
            self.event(EventKind::Proposed, 1),
            self.event(EventKind::Validated, 1)
                .with_detail(fingerprint.as_str().to_string()),
            self.event(EventKind::Claimed, 1),
        ];
        if approval {
            events.push(self.event(EventKind::AwaitingApproval, 1));
        }
        // The store's unique key decides: inserted, or somebody else's record comes back.
        match self.store.claim(record, events).await {
            Err(e) => store_down(Some(key), &e),
            Ok(Claimed::Existing(record)) => {
                self.existing(
                    contract,
                    operation,
                    record,
                    arguments,
                    fingerprint,
                    effect,
                    0,
                )
                .await
            }
            Ok(Claimed::Inserted(record)) => {
                if approval {
                    Outcome::in_flight(
                        key,
                        NextAction::AskForApproval,
                        machine::APPROVAL_POLL_SECONDS,
                    )
                } else {
                    self.perform(contract, Claim { record }, arguments, effect, true)
                        .await
                }
            }
        }
    }

    fn lease(&self, contract: &Contract, now: Millis) -> Lease {
        Lease {
            owner: Some(self.settings.worker.clone()),
            expires_at: now + contract.lease.millis(),
        }
    }

    /// A delivery found a record under its key.
    #[allow(clippy::too_many_arguments)]
    async fn existing(
        &self,
        contract: &Contract,
        operation: &Operation,
        record: Record,
        arguments: &Value,
        fingerprint: &Fingerprint,
        effect: &dyn Downstream,
        depth: u8,
    ) -> Outcome {
        // An older version's record is compared under the version it was claimed with: the
        // same material request under that version replays; anything else is a mismatch.
        let incoming = if record.tool_version == contract.version {
            fingerprint.clone()
        } else {
            match contract.canonicalize_as(&record.tool_version, arguments) {
                Ok(c) => Fingerprint::of(&c),
                Err(e) => {
                    return Outcome::rejected(
                        Some(record.key),
                        ErrorCode::InvalidArguments,
                        e.message,
                    );
                }
            }
        };
        let caller = &operation.caller;
        match machine::branch(contract, &record, &incoming, self.now()) {
            Branch::Replay(outcome) => {
                // An idempotency hit is no authorization bypass.
                match self
                    .authorize(
                        contract,
                        caller,
                        Some(&record.key),
                        &incoming,
                        AuthStage::BeforeReplay,
                    )
                    .await
                {
                    Ok(()) => outcome,
                    Err(denied) => denied,
                }
            }
            Branch::Refuse(outcome) | Branch::Wait(outcome) | Branch::Unknown(outcome) => outcome,
            Branch::PollJob { job_id } => {
                // A finished job hands out its result: the same recheck as any replay.
                if let Err(denied) = self
                    .authorize(
                        contract,
                        caller,
                        Some(&record.key),
                        &incoming,
                        AuthStage::BeforeReplay,
                    )
                    .await
                {
                    return denied;
                }
                self.poll_job(contract, record, &job_id, effect).await
            }
            Branch::Recover => {
                if let Err(denied) = self
                    .authorize(
                        contract,
                        caller,
                        Some(&record.key),
                        &incoming,
                        AuthStage::BeforeEffect,
                    )
                    .await
                {
                    return denied;
                }
                if depth > 0 {
                    // We already lost one race for this record in this delivery: somebody
                    // else is recovering it. Report it as in flight rather than loop.
                    return Outcome::in_flight(record.key, NextAction::Poll, 1);
                }
                self.recover(contract, record, Some(arguments), effect)
                    .await
            }
        }
    }

    /// Recovery of a pending record whose lease expired or was released: by receipt, by a
    /// resend to a deduplicating downstream, by execution only when nothing was sent — or
    /// `unknown`. `arguments` come from the delivery that found it, or from the record.
    pub async fn recover(
        &self,
        contract: &Contract,
        record: Record,
        arguments: Option<&Value>,
        effect: &dyn Downstream,
    ) -> Outcome {
        let key = record.key.clone();
        match machine::plan_recovery(contract, &record) {
            Recovery::Execute => {
                self.take_over(contract, record, arguments, effect, true)
                    .await
            }
            Recovery::Resend => {
                self.take_over(contract, record, arguments, effect, false)
                    .await
            }
            Recovery::GiveUp(reason) => self.mark_unknown(record, reason, None).await,
            Recovery::Lookup { on_miss } => match effect.lookup_receipt(&key).await {
                Lookup::Found(receipt) => {
                    let fence = record.fence;
                    let t = self.transition(
                        &record,
                        RecordState::Applied(receipt.clone()),
                        fence,
                        RequestUpdate::Clear,
                        vec![
                            self.event(EventKind::Recovered, fence)
                                .with_detail("receipt found by key"),
                            self.event(EventKind::Acknowledged, fence)
                                .with_detail(receipt.reference.clone()),
                        ],
                    );
                    match self.store.transition(t).await {
                        Ok(Cas::Done(_)) => {
                            Outcome::replayed(key, Some(receipt.reference), Some(receipt.result))
                        }
                        Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
                        Err(e) => unrecorded(key, &receipt, &e),
                    }
                }
                Lookup::NotFound => match on_miss {
                    Miss::Resend => {
                        self.take_over(contract, record, arguments, effect, false)
                            .await
                    }
                    Miss::Unknown => {
                        self.mark_unknown(
                            record,
                            "dispatch may have started and the downstream has no receipt for the key yet"
                                .into(),
                            None,
                        )
                        .await
                    }
                },
                Lookup::Unavailable(reason) => {
                    if contract.deduplicates() {
                        self.take_over(contract, record, arguments, effect, false)
                            .await
                    } else {
                        // Nothing is decided by an unreachable lookup; the recoverer asks again.
                        tracing::warn!(operation_key = key.as_str(), reason, "receipt lookup unavailable");
                        Outcome::in_flight(key, NextAction::Poll, contract.lease.seconds())
                    }
                }
            },
        }
    }

    /// Takes over an expired or released claim with compare-and-set (the fence grows), then
    /// performs the effect under the same operation key.
    async fn take_over(
        &self,
        contract: &Contract,
        record: Record,
        arguments: Option<&Value>,
        effect: &dyn Downstream,
        mark_dispatch: bool,
    ) -> Outcome {
        let key = record.key.clone();
        let Some(arguments) = arguments.or(record.request.as_ref()).cloned() else {
            // A released record whose arguments were dropped waits for the next delivery.
            return Outcome::in_flight(key, NextAction::Poll, contract.lease.seconds());
        };
        let now = self.now();
        let fence = record.fence + 1;
        let RecordState::Pending { dispatch, .. } = &record.state else {
            return Outcome::in_flight(key, NextAction::Poll, 1);
        };
        let t = Transition {
            key: key.clone(),
            expect: Expect {
                fence: record.fence,
                status: record.status(),
                // A renewal by a live owner that raced us wins: the lease must still be expired.
                lease_expired_by: Some(now),
            },
            next: RecordState::Pending {
                lease: self.lease(contract, now),
                dispatch: dispatch.clone(),
            },
            fence,
            request: RequestUpdate::Set(arguments.clone()),
            approved_by: None,
            fingerprint: None,
            events: vec![
                self.event(EventKind::Recovered, fence)
                    .with_detail(format!("took over attempt {}", record.fence)),
            ],
            now,
        };
        match self.store.transition(t).await {
            Ok(Cas::Done(record)) => {
                self.perform(
                    contract,
                    Claim { record },
                    &arguments,
                    effect,
                    mark_dispatch,
                )
                .await
            }
            Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
            Err(e) => store_down(Some(key), &e),
        }
    }

    /// A compare-and-set lost: somebody else moved the record. Answer from what it is now,
    /// without another effect.
    fn settled_elsewhere(
        &self,
        contract: &Contract,
        key: OperationKey,
        now: Option<Record>,
    ) -> Outcome {
        match now {
            Some(record) => {
                let o = machine::status_outcome(Some(contract), &record, self.now());
                if o.status == Status::InFlight {
                    Outcome::in_flight(key, o.next_action, o.retry_after_seconds.unwrap_or(1))
                } else {
                    o
                }
            }
            None => Outcome::rejected(
                Some(key),
                ErrorCode::Conflict,
                "the operation record disappeared while this delivery ran",
            ),
        }
    }

    fn transition(
        &self,
        record: &Record,
        next: RecordState,
        fence: u64,
        request: RequestUpdate,
        events: Vec<Event>,
    ) -> Transition {
        Transition {
            key: record.key.clone(),
            expect: Expect {
                fence: record.fence,
                status: record.status(),
                lease_expired_by: None,
            },
            next,
            fence,
            request,
            approved_by: None,
            fingerprint: None,
            events,
            now: self.now(),
        }
    }

    async fn mark_unknown(
        &self,
        record: Record,
        reason: String,
        reference: Option<String>,
    ) -> Outcome {
        let key = record.key.clone();
        let job_id = match &record.state {
            RecordState::Pending {
                dispatch: Dispatch::Job { job_id },
                ..
            } => Some(job_id.clone()),
            _ => None,
        };
        let fence = record.fence;
        let t = self.transition(
            &record,
            RecordState::Unknown(Evidence {
                reason: reason.clone(),
                reference: reference.clone(),
                job_id,
            }),
            fence,
            RequestUpdate::Keep,
            vec![
                self.event(EventKind::Unknown, fence)
                    .with_detail(reason.clone()),
            ],
        );
        match self.store.transition(t).await {
            Ok(Cas::Done(_)) => Outcome::unknown(key, reason).with_reference(reference),
            Ok(Cas::Lost(now)) => match now {
                Some(r) => machine::status_outcome(None, &r, self.now()),
                None => Outcome::unknown(key, reason).with_reference(reference),
            },
            // The record stays pending; its lease expires and recovery reaches the same verdict.
            Err(_) => Outcome::unknown(key, reason).with_reference(reference),
        }
    }

    /// Performs the effect for an owned claim and records what the downstream answered.
    async fn perform(
        &self,
        contract: &Contract,
        claim: Claim,
        arguments: &Value,
        effect: &dyn Downstream,
        mark_dispatch: bool,
    ) -> Outcome {
        let mut record = claim.record;
        let key = record.key.clone();
        let fence = record.fence;
        let not_sent = matches!(
            record.state,
            RecordState::Pending {
                dispatch: Dispatch::NotSent,
                ..
            }
        );
        if mark_dispatch && not_sent && contract.uses_dispatch_marker() {
            // The dispatch marker: durable before the first byte leaves, so that recovery can
            // tell "never sent" (take over and execute) from "maybe sent" (receipt or unknown).
            let lease = record.lease().cloned().unwrap_or(Lease {
                owner: Some(self.settings.worker.clone()),
                expires_at: self.now(),
            });
            let t = self.transition(
                &record,
                RecordState::Pending {
                    lease,
                    dispatch: Dispatch::Sent,
                },
                fence,
                RequestUpdate::Keep,
                vec![self.event(EventKind::Sent, fence)],
            );
            match self.store.transition(t).await {
                Ok(Cas::Done(r)) => record = r,
                Ok(Cas::Lost(now)) => return self.settled_elsewhere(contract, key, now),
                Err(e) => {
                    // Nothing left this process: release the claim so a retry may run at once.
                    self.release(&record, "dispatch marker could not be written")
                        .await;
                    return store_down(Some(key), &e);
                }
            }
        }
        // Without a marker, the `sent` trace entry rides on the transition that records the
        // answer: one durable write fewer per operation, and the trace reads the same.
        let mut sent = (!(mark_dispatch && not_sent && contract.uses_dispatch_marker()))
            .then(|| self.event(EventKind::Sent, fence));

        let mut resends = 0;
        loop {
            let answer = self
                .perform_with_renewal(contract, &record, arguments, effect)
                .await;
            match machine::after_effect(contract, answer) {
                AfterEffect::Apply(receipt) => {
                    return self.complete(contract, &record, receipt, sent.take()).await;
                }
                AfterEffect::Job(job_id) => {
                    let lease = self.lease(contract, self.now());
                    let t = self.transition(
                        &record,
                        RecordState::Pending {
                            lease,
                            dispatch: Dispatch::Job {
                                job_id: job_id.clone(),
                            },
                        },
                        fence,
                        RequestUpdate::Keep,
                        vec![
                            self.event(EventKind::Committed, fence)
                                .with_detail(format!("job {job_id} accepted")),
                        ],
                    );
                    return match self.store.transition(t).await {
                        Ok(Cas::Done(_)) => {
                            Outcome::in_flight(key, NextAction::Poll, machine::JOB_POLL_SECONDS)
                        }
                        Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
                        Err(_) => {
                            let mut o = Outcome::unknown(
                                key,
                                format!("job {job_id} was accepted but could not be recorded"),
                            );
                            o.effect_reference = None;
                            o
                        }
                    };
                }
                AfterEffect::Refuse(refusal) => {
                    let t = self.transition(
                        &record,
                        RecordState::FailedPermanent(refusal.clone()),
                        fence,
                        RequestUpdate::Clear,
                        vec![
                            self.event(EventKind::Failed, fence)
                                .with_detail(refusal.code.as_str()),
                        ],
                    );
                    return match self.store.transition(t).await {
                        Ok(Cas::Done(r)) => {
                            self.settled.offer(&r, self.now());
                            machine::refused(&r, &refusal)
                        }
                        Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
                        // The refusal is certain even if unrecorded: nothing happened downstream.
                        Err(_) => Outcome::rejected(Some(key), refusal.code, refusal.message),
                    };
                }
                AfterEffect::Release {
                    code,
                    reason,
                    retry_after,
                } => {
                    self.release(&record, &reason).await;
                    let mut o = Outcome::rejected(Some(key), code, reason);
                    if let Some(s) = retry_after {
                        o = o.with_retry_after(s);
                    }
                    return o;
                }
                AfterEffect::Ambiguous(reason) => {
                    tracing::warn!(
                        operation_key = key.as_str(),
                        reason,
                        "ambiguous downstream answer"
                    );
                    if contract.receipt_lookup() {
                        match effect.lookup_receipt(&key).await {
                            Lookup::Found(receipt) => {
                                return self
                                    .complete(contract, &record, receipt, sent.take())
                                    .await;
                            }
                            Lookup::NotFound | Lookup::Unavailable(_) => {}
                        }
                    }
                    if contract.deduplicates() && resends < self.settings.max_resends {
                        // Same key, same fence: the downstream recognises the resend.
                        resends += 1;
                        let _ = self
                            .store
                            .append_events(
                                &key,
                                vec![
                                    self.event(EventKind::Sent, fence)
                                        .with_detail(format!("resend {resends} after: {reason}")),
                                ],
                            )
                            .await;
                        continue;
                    }
                    if contract.deduplicates() {
                        // Still ambiguous after bounded resends: leave it pending for the
                        // recoverer, which resends later under the same key.
                        self.release_sent(&record, &reason).await;
                        return Outcome::in_flight(key, NextAction::Poll, contract.lease.seconds());
                    }
                    return self.mark_unknown(record, reason, None).await;
                }
            }
        }
    }

    /// Runs the downstream call while renewing the lease at a third of its length, so a slow
    /// but healthy effect is not taken over.
    async fn perform_with_renewal(
        &self,
        contract: &Contract,
        record: &Record,
        arguments: &Value,
        effect: &dyn Downstream,
    ) -> EffectOutcome {
        let request = EffectRequest {
            key: &record.key,
            tool: &contract.name,
            tool_version: &contract.version,
            arguments,
            attempt: record.fence,
            precondition: contract.precondition(arguments),
        };
        let call = effect.perform(request);
        tokio::pin!(call);
        let every = Duration::from_millis((contract.lease.millis() / 3).max(500) as u64);
        // The record as last renewed; copied only once a renewal happens, which most calls
        // finish before.
        let mut renewed: Option<Record> = None;
        loop {
            tokio::select! {
                answer = &mut call => return answer,
                _ = tokio::time::sleep(every) => {
                    let current = renewed.as_ref().unwrap_or(record);
                    let RecordState::Pending { dispatch, .. } = &current.state else { continue };
                    let t = self.transition(
                        current,
                        RecordState::Pending {
                            lease: self.lease(contract, self.now()),
                            dispatch: dispatch.clone(),
                        },
                        current.fence,
                        RequestUpdate::Keep,
                        Vec::new(),
                    );
                    match self.store.transition(t).await {
                        Ok(Cas::Done(r)) => renewed = Some(r),
                        // Lost: taken over. The call cannot be recalled once sent; let it
                        // finish, and the fenced completion will not overwrite the new owner.
                        Ok(Cas::Lost(_)) | Err(_) => {
                            tracing::warn!(operation_key = record.key.as_str(), "lease renewal failed");
                        }
                    }
                }
            }
        }
    }

    /// Stores the receipt and replay-safe result, then answers applied.
    async fn complete(
        &self,
        contract: &Contract,
        record: &Record,
        receipt: Receipt,
        sent: Option<Event>,
    ) -> Outcome {
        let key = record.key.clone();
        let fence = record.fence;
        // Conditional on the fence, not on the lease: a renewal does not change the fence, and
        // a takeover does, so a late finisher cannot overwrite the newer attempt.
        let t = self.transition(
            record,
            RecordState::Applied(receipt.clone()),
            fence,
            RequestUpdate::Clear,
            sent.into_iter()
                .chain([
                    self.event(EventKind::Committed, fence)
                        .with_detail(receipt.reference.clone()),
                    self.event(EventKind::Acknowledged, fence),
                ])
                .collect(),
        );
        match self.store.transition(t).await {
            Ok(Cas::Done(r)) => {
                self.settled.offer(&r, self.now());
                Outcome::applied(key, receipt.reference, receipt.result)
            }
            Ok(Cas::Lost(now)) => match now {
                Some(r) => match &r.state {
                    RecordState::Applied(stored) => Outcome::replayed(
                        key,
                        Some(stored.reference.clone()),
                        Some(stored.result.clone()),
                    ),
                    _ => self.settled_elsewhere(contract, key, Some(r)),
                },
                None => unrecorded(
                    key,
                    &receipt,
                    &store::Error::Corrupt("record vanished".into()),
                ),
            },
            Err(e) => unrecorded(key, &receipt, &e),
        }
    }

    /// Releases a claim after a provable non-delivery: pending, no owner, nothing sent.
    async fn release(&self, record: &Record, reason: &str) {
        let fence = record.fence;
        let now = self.now();
        let t = self.transition(
            record,
            RecordState::Pending {
                lease: Lease {
                    owner: None,
                    expires_at: now,
                },
                dispatch: Dispatch::NotSent,
            },
            fence,
            RequestUpdate::Keep,
            vec![
                self.event(EventKind::Released, fence)
                    .with_detail(reason.to_string()),
            ],
        );
        if let Err(e) = self.store.transition(t).await {
            // The lease will expire instead; recovery reaches the same state.
            tracing::warn!(operation_key = record.key.as_str(), error = %e, "release failed");
        }
    }

    /// Gives up ownership of a maybe-sent claim so the recoverer resends it later.
    async fn release_sent(&self, record: &Record, reason: &str) {
        let fence = record.fence;
        let now = self.now();
        let RecordState::Pending { dispatch, .. } = &record.state else {
            return;
        };
        let dispatch = match dispatch {
            Dispatch::NotSent => Dispatch::Sent,
            other => other.clone(),
        };
        let t = self.transition(
            record,
            RecordState::Pending {
                lease: Lease {
                    owner: Some(self.settings.worker.clone()),
                    expires_at: now,
                },
                dispatch,
            },
            fence,
            RequestUpdate::Keep,
            vec![
                self.event(EventKind::InFlight, fence)
                    .with_detail(format!("left to recovery: {reason}")),
            ],
        );
        let _ = self.store.transition(t).await;
    }

    // -----------------------------------------------------------------------------------------
    // Jobs, status, approvals, reconciliation.

    pub(crate) async fn poll_job(
        &self,
        contract: &Contract,
        record: Record,
        job_id: &str,
        effect: &dyn Downstream,
    ) -> Outcome {
        let key = record.key.clone();
        let fence = record.fence;
        let (next, events) = match effect.poll_job(&key, job_id).await {
            JobStatus::Running | JobStatus::Unavailable(_) => {
                return Outcome::in_flight(key, NextAction::Poll, machine::JOB_POLL_SECONDS);
            }
            JobStatus::Done(receipt) => (
                RecordState::Applied(receipt.clone()),
                vec![
                    self.event(EventKind::Acknowledged, fence)
                        .with_detail(format!("job {job_id} done: {}", receipt.reference)),
                ],
            ),
            JobStatus::Failed(refusal) => (
                RecordState::FailedPermanent(refusal.clone()),
                vec![
                    self.event(EventKind::Failed, fence)
                        .with_detail(format!("job {job_id} failed: {}", refusal.code.as_str())),
                ],
            ),
        };
        let t = self.transition(&record, next, fence, RequestUpdate::Clear, events);
        match self.store.transition(t).await {
            Ok(Cas::Done(r)) | Ok(Cas::Lost(Some(r))) => {
                machine::status_outcome(Some(contract), &r, self.now())
            }
            Ok(Cas::Lost(None)) => {
                Outcome::rejected(Some(key), ErrorCode::NotFound, "no such operation")
            }
            Err(e) => store_down(Some(key), &e),
        }
    }

    /// The poll target: the record and its outcome, advancing an accepted job by polling it.
    /// Never performs a new effect.
    pub async fn status(
        &self,
        contract: Option<&Contract>,
        key: &OperationKey,
        effect: Option<&dyn Downstream>,
    ) -> Result<Option<(Record, Outcome)>, store::Error> {
        let Some(record) = self.store.get(key).await? else {
            return Ok(None);
        };
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
            let outcome = self.poll_job(contract, record, &job_id, effect).await;
            let record = self.store.get(key).await?.ok_or_else(|| {
                store::Error::Corrupt(format!("{key} vanished while its job was polled"))
            })?;
            return Ok(Some((record, outcome)));
        }
        let outcome = machine::status_outcome(contract, &record, self.now());
        Ok(Some((record, outcome)))
    }

    /// The record under `key`, which an operator action expects in `status`.
    async fn load_in(
        &self,
        key: &OperationKey,
        status: idemgate_core::RecordStatus,
        action: &'static str,
    ) -> Result<Record, ActionError> {
        let record = self
            .store
            .get(key)
            .await?
            .ok_or_else(|| ActionError::NotFound(key.clone()))?;
        if record.status() != status {
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
    /// record leaves `awaiting_approval`), and records who approved. The effect then runs
    /// with authorization rechecked for the original caller.
    pub async fn approve(
        &self,
        contract: &Contract,
        key: &OperationKey,
        approver: &str,
        expected: Option<&Fingerprint>,
        effect: &dyn Downstream,
    ) -> Result<Outcome, ActionError> {
        let record = self
            .load_in(
                key,
                idemgate_core::RecordStatus::AwaitingApproval,
                "approved",
            )
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
        let now = self.now();
        let fence = record.fence + 1;
        let t = Transition {
            key: key.clone(),
            expect: Expect {
                fence: record.fence,
                status: record.status(),
                lease_expired_by: None,
            },
            next: RecordState::Pending {
                lease: self.lease(contract, now),
                dispatch: Dispatch::NotSent,
            },
            fence,
            request: RequestUpdate::Keep,
            approved_by: Some(approver.to_string()),
            fingerprint: None,
            events: vec![
                self.event(EventKind::Approved, fence)
                    .with_detail(format!("by {approver}")),
            ],
            now,
        };
        let record = match self.store.transition(t).await? {
            Cas::Done(r) => r,
            Cas::Lost(_) => return Err(ActionError::Raced(key.clone())),
        };
        let arguments = record.request.clone().unwrap_or(Value::Null);
        // The recheck is for the caller who asked, now, not for the approver.
        let caller = Caller {
            tenant: key.tenant().to_string(),
            actor: record.actor.clone(),
            role: "agent".to_string(),
        };
        if let Err(denied) = self
            .authorize(
                contract,
                &caller,
                Some(key),
                &record.fingerprint,
                AuthStage::BeforeEffect,
            )
            .await
        {
            self.release(&record, "authorization denied after approval")
                .await;
            return Ok(denied);
        }
        Ok(self
            .perform(contract, Claim { record }, &arguments, effect, true)
            .await)
    }

    /// An operator denies an operation awaiting approval: it ends as a refusal that every later
    /// delivery replays.
    pub async fn deny(
        &self,
        key: &OperationKey,
        approver: &str,
        reason: &str,
    ) -> Result<Outcome, ActionError> {
        let record = self
            .load_in(key, idemgate_core::RecordStatus::AwaitingApproval, "denied")
            .await?;
        let refusal = Refusal {
            code: ErrorCode::ApprovalDenied,
            message: format!("denied by an operator: {reason}"),
        };
        let fence = record.fence;
        let t = self.transition(
            &record,
            RecordState::FailedPermanent(refusal.clone()),
            fence,
            RequestUpdate::Clear,
            vec![
                self.event(EventKind::Denied, fence)
                    .with_detail(format!("by {approver}")),
            ],
        );
        match self.store.transition(t).await? {
            Cas::Done(r) => Ok(machine::refused(&r, &refusal)),
            Cas::Lost(_) => Err(ActionError::Raced(key.clone())),
        }
    }

    /// Reconciles an `unknown` record: with no resolution, by looking the receipt up now; with
    /// an operator's resolution, as the operator says (recorded with the actor).
    pub async fn reconcile(
        &self,
        contract: &Contract,
        key: &OperationKey,
        resolution: Option<Resolution>,
        actor: &str,
        effect: &dyn Downstream,
    ) -> Result<Outcome, ActionError> {
        let record = self
            .load_in(key, idemgate_core::RecordStatus::Unknown, "reconciled")
            .await?;
        let fence = record.fence;
        let reconciled =
            |detail: String| self.event(EventKind::Reconciled, fence).with_detail(detail);
        let t = match resolution {
            None => {
                if !contract.receipt_lookup() {
                    return Err(ActionError::NoLookup(contract.name.clone()));
                }
                match effect.lookup_receipt(key).await {
                    Lookup::Found(receipt) => self.transition(
                        &record,
                        RecordState::Applied(receipt.clone()),
                        fence,
                        RequestUpdate::Clear,
                        vec![reconciled(format!(
                            "receipt {} found by {actor}",
                            receipt.reference
                        ))],
                    ),
                    Lookup::NotFound => {
                        return Ok(Outcome::unknown(
                            key.clone(),
                            "the downstream has no receipt for this key yet; an operator must decide",
                        ));
                    }
                    Lookup::Unavailable(reason) => {
                        return Ok(Outcome::unknown(
                            key.clone(),
                            format!("receipt lookup unavailable: {reason}"),
                        ));
                    }
                }
            }
            Some(Resolution::Applied { reference, result }) => self.transition(
                &record,
                RecordState::Applied(Receipt {
                    reference: reference.clone(),
                    result,
                }),
                fence,
                RequestUpdate::Clear,
                vec![reconciled(format!("applied as {reference} by {actor}"))],
            ),
            Some(Resolution::NotApplied) => {
                // The key may run again: pending, released, nothing sent, a new attempt number.
                let now = self.now();
                self.transition(
                    &record,
                    RecordState::Pending {
                        lease: Lease {
                            owner: None,
                            expires_at: now,
                        },
                        dispatch: Dispatch::NotSent,
                    },
                    fence + 1,
                    RequestUpdate::Keep,
                    vec![reconciled(format!("not applied, by {actor}"))],
                )
            }
        };
        match self.store.transition(t).await? {
            Cas::Done(r) => Ok(machine::status_outcome(Some(contract), &r, self.now())),
            Cas::Lost(_) => Err(ActionError::Raced(key.clone())),
        }
    }
}

fn store_down(key: Option<OperationKey>, e: &store::Error) -> Outcome {
    tracing::warn!(error = %e, "store error");
    Outcome::rejected(
        key,
        ErrorCode::StoreUnavailable,
        "the operation store is unavailable; nothing was sent; retry later",
    )
}

/// The effect happened but its record could not be written: say so, with the reference.
fn unrecorded(key: OperationKey, receipt: &Receipt, e: &store::Error) -> Outcome {
    tracing::error!(operation_key = key.as_str(), error = %e, reference = receipt.reference, "effect applied but not recorded");
    Outcome::unknown(
        key,
        "the downstream applied the effect but the record could not be written; a retry recovers the receipt",
    )
    .with_reference(Some(receipt.reference.clone()))
}
