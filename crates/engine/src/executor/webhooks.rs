//! Webhook events that finish accepted jobs: the second way, beside polling, that a job's end
//! reaches its record.
//!
//! The face verifies the event and says which operation it names (a job id or an operation
//! key) and how it ended; this module binds it to its record and writes the finish and the
//! event's deduplication row in one transaction ([`Transition::webhook`]). An event that
//! finishes nothing is recorded with its [`Disposition`] and changes nothing. A redelivery
//! finds its row and changes nothing either.
//!
//! **The race between the 202 and the callback.** A downstream may call back before the
//! answer that carries the job id has been recorded. An event that names a job nobody has
//! recorded yet is kept as an early arrival, with its finish; the delivery that records the
//! job id, and every poll of the job, look for early arrivals first and apply them. Each side
//! writes before it reads the other's write (the event its row, then the job; the delivery
//! its job id, then the events), so at least one of them sees the other, and the fence and the
//! dedup rule make a double application impossible.
//!
//! **Bound to its tools.** A source names the tools whose operations it may finish. A job id
//! binds by (tenant, environment, tool, job id) — job ids are the downstream's, and two tools'
//! downstreams may hand out the same ones — and a key binds only to an operation of one of
//! those tools. When more than one operation matches, the event is refused as
//! [`Disposition::Ambiguous`] and settles nothing: guessing could finish one tool's operation
//! with another's reference, or refuse a job that may still succeed. An early arrival keeps
//! its environment and its source's tools, and is applied only to a job they cover. A claim
//! released unsent (nothing reached the downstream) is never finished by an event.

use std::sync::Arc;

use idemgate_core::contract::Contract;
use idemgate_core::key::OperationKey;
use idemgate_core::machine;
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Digest, Dispatch, Millis, Record, RecordState};
use idemgate_core::store::{self, Cas, Transition};
use idemgate_core::transitions;
use idemgate_core::webhook::{Disposition, Finish, JobMatch, Recorded, WebhookEvent};

use super::Executor;

/// How an event names its operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// The downstream's job id, as its 202 answer gave it.
    Job(String),
    /// The operation key the downstream received as its idempotency key.
    Key(OperationKey),
}

/// A verified event, as the face read it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    pub source: String,
    pub event_id: String,
    /// The source's tenant: the event binds only to this tenant's operations.
    pub tenant: String,
    /// The gateway's environment: the event binds only to its operations.
    pub environment: String,
    /// The tools whose operations the source may finish: the event binds only to theirs.
    pub tools: Vec<String>,
    /// How the event names its operation; required when it has a finish.
    pub binding: Option<Binding>,
    /// `None` when the event's outcome is neither a mapped success nor a failure.
    pub finish: Option<Finish>,
    /// How long the event's row is kept: at least the sender's retry window.
    pub retention_millis: Millis,
}

/// What an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventAnswer {
    pub disposition: Disposition,
    /// The operation it bound to, when one was found.
    pub key: Option<OperationKey>,
    /// The event had been decided by an earlier delivery: nothing was written now.
    pub redelivery: bool,
}

/// Finds the loaded contract of a tool, by name.
pub type Contracts<'a> = &'a (dyn Fn(&str) -> Option<Arc<Contract>> + Send + Sync);

/// How many times an event is bound again after its record moved under it (another event or
/// a poll settled it, or the job id was recorded meanwhile): each retry reads a newer state.
const REBINDS: usize = 4;

impl Executor {
    /// Binds a verified event to its operation and applies it (see the module documentation).
    /// A store failure is returned as it is: the sender should deliver again.
    pub async fn accept_event(
        &self,
        contracts: Contracts<'_>,
        event: JobEvent,
    ) -> Result<EventAnswer, store::Error> {
        if let Some(seen) = self.store.webhook(&event.source, &event.event_id).await?
            && seen.disposition != Disposition::Early
        {
            return Ok(redelivered(seen));
        }
        let Some(finish) = event.finish.clone() else {
            return self
                .record_event(&event, None, Disposition::Ignored, None)
                .await;
        };
        let mut record = match self.bind(&event).await? {
            Bound::Record(record) => *record,
            Bound::Nothing(disposition) => {
                return self.record_event(&event, None, disposition, None).await;
            }
            Bound::NotYet(job_id) => {
                // Kept with its finish, then the job looked up again: the delivery recording
                // the job id may have committed between the lookup and this write, and then
                // missed this row.
                let early = self
                    .record_event(&event, None, Disposition::Early, Some(finish.clone()))
                    .await?;
                if early.redelivery {
                    return Ok(early);
                }
                let found = self.store.open_jobs(job_match(&event, &job_id)).await?;
                match <[Record; 1]>::try_from(found) {
                    Ok([record]) => record,
                    Err(found) if found.is_empty() => {
                        tracing::info!(
                            source = %event.source,
                            event_id = %event.event_id,
                            job_id = %job_id,
                            "webhook event kept as an early arrival: no pending job of its tools has its id yet"
                        );
                        return Ok(early);
                    }
                    Err(found) => {
                        ambiguous(&event, &found);
                        return self
                            .record_event(&event, None, Disposition::Ambiguous, None)
                            .await;
                    }
                }
            }
        };
        for _ in 0..REBINDS {
            match self
                .settle_by_event(contracts, &event, &record, &finish)
                .await?
            {
                Applied::Done(answer) => return Ok(answer),
                Applied::Moved(now) => record = *now,
                Applied::Gone => {
                    return self
                        .record_event(&event, None, Disposition::UnknownOperation, None)
                        .await;
                }
            }
        }
        Err(store::Error::Unavailable(format!(
            "webhook event {} of source {}: its operation {} kept changing; deliver it again",
            event.event_id, event.source, record.key
        )))
    }

    /// Applies the early arrivals kept for `record`'s job, if any, right after its job id was
    /// recorded or before it is polled. The outcome of the record once one finished it.
    pub(crate) async fn apply_early_events(
        &self,
        contract: &Contract,
        record: &Record,
    ) -> Option<Outcome> {
        let RecordState::Pending {
            dispatch: Dispatch::Job { job_id },
            ..
        } = &record.state
        else {
            return None;
        };
        let early = match self.store.webhooks_for_job(record.tenant(), job_id).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(operation_key = record.key.as_str(), error = %e, "early webhook events could not be read; the next poll looks again");
                return None;
            }
        };
        for row in early {
            let (Disposition::Early, Some(finish)) = (row.disposition, row.finish.clone()) else {
                continue;
            };
            // Only an event whose source may finish this tool, received in this environment.
            if !row.may_finish(record.key.environment(), &record.tool) {
                continue;
            }
            // And only when the job id names this operation alone among the source's tools:
            // another of them may have recorded the same id meanwhile.
            let m = JobMatch {
                tenant: record.tenant(),
                environment: record.key.environment(),
                tools: &row.tools,
                job_id,
            };
            match self.store.open_jobs(m).await {
                Ok(found) if found.len() > 1 => {
                    tracing::warn!(
                        source = %row.source,
                        event_id = %row.event_id,
                        job_id = %job_id,
                        operation_keys = ?found.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
                        "an early webhook event names a job id that more than one operation of its source's tools holds; refused as ambiguous, nothing settled"
                    );
                    let decided = WebhookEvent {
                        disposition: Disposition::Ambiguous,
                        finish: None,
                        ..row.clone()
                    };
                    if let Err(e) = self.store.record_webhook(decided).await {
                        tracing::warn!(error = %e, "an ambiguous early webhook event could not be recorded");
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(operation_key = record.key.as_str(), error = %e, "early webhook events could not be checked; the next poll looks again");
                    return None;
                }
            }
            let mut t = finish_transition(contract, record, &finish, &row, self.at());
            t.webhook = Some(WebhookEvent {
                key: Some(record.key.clone()),
                disposition: finished_as(&finish),
                finish: None,
                ..row.clone()
            });
            match self.store.transition(t).await {
                Ok(Cas::Done(r)) => {
                    tracing::info!(
                        operation_key = record.key.as_str(),
                        source = %row.source,
                        event_id = %row.event_id,
                        "an early webhook event finished the job once its id was recorded"
                    );
                    // This delivery's operation took effect just now: applied, not replayed.
                    return Some(match r.state {
                        RecordState::Applied(receipt) => {
                            Outcome::applied(r.key, receipt.reference, receipt.result)
                        }
                        RecordState::Pending { .. }
                        | RecordState::AwaitingApproval { .. }
                        | RecordState::FailedPermanent(_)
                        | RecordState::Unknown(_)
                        | RecordState::Tombstone(_) => {
                            machine::status_outcome(Some(contract), &r, self.now())
                        }
                    });
                }
                // Another event, a poll or the event's own handler got there first: the record
                // says what happened.
                Ok(Cas::Lost(Some(r))) => {
                    return (!matches!(r.state, RecordState::Pending { .. }))
                        .then(|| machine::status_outcome(Some(contract), &r, self.now()));
                }
                Ok(Cas::Lost(None)) => return None,
                Err(e) => {
                    tracing::warn!(operation_key = record.key.as_str(), error = %e, "an early webhook event could not be applied; the next poll tries again");
                    return None;
                }
            }
        }
        None
    }

    /// The record an event names, or why there is none.
    async fn bind(&self, event: &JobEvent) -> Result<Bound, store::Error> {
        let Some(binding) = &event.binding else {
            return Err(store::Error::Unavailable(format!(
                "webhook event {} of source {} names no job id or operation key",
                event.event_id, event.source
            )));
        };
        match binding {
            Binding::Key(key) => {
                if key.tenant() != event.tenant {
                    return Ok(Bound::Nothing(Disposition::OtherTenant));
                }
                if key.environment() != event.environment {
                    return Ok(Bound::Nothing(Disposition::UnknownOperation));
                }
                Ok(match self.store.get(key).await? {
                    Some(record) if !event.tools.contains(&record.tool) => {
                        tracing::warn!(
                            source = %event.source,
                            event_id = %event.event_id,
                            operation_key = key.as_str(),
                            tool = %record.tool,
                            "a webhook event names an operation of a tool its source may not finish; nothing settled"
                        );
                        Bound::Nothing(Disposition::OtherTool)
                    }
                    Some(record) => Bound::Record(Box::new(record)),
                    None => Bound::Nothing(Disposition::UnknownOperation),
                })
            }
            Binding::Job(job_id) => {
                let found = self.store.open_jobs(job_match(event, job_id)).await?;
                match <[Record; 1]>::try_from(found) {
                    Ok([record]) => return Ok(Bound::Record(Box::new(record))),
                    Err(found) if found.is_empty() => {}
                    Err(found) => {
                        ambiguous(event, &found);
                        return Ok(Bound::Nothing(Disposition::Ambiguous));
                    }
                }
                // Not pending: an earlier event of this job may have bound (and settled) an
                // operation of the source's tools in this environment.
                let earlier = self.store.webhooks_for_job(&event.tenant, job_id).await?;
                let mut keys: Vec<OperationKey> = earlier
                    .into_iter()
                    .filter_map(|row| row.key)
                    .filter(|key| key.environment() == event.environment)
                    .collect();
                keys.sort_by(|a, b| a.as_str().cmp(b.as_str()));
                keys.dedup();
                let mut bound = Vec::new();
                for key in keys {
                    if let Some(record) = self.store.get(&key).await?
                        && event.tools.contains(&record.tool)
                    {
                        bound.push(record);
                    }
                }
                match <[Record; 1]>::try_from(bound) {
                    Ok([record]) => Ok(Bound::Record(Box::new(record))),
                    Err(bound) if bound.is_empty() => Ok(Bound::NotYet(job_id.clone())),
                    Err(bound) => {
                        ambiguous(event, &bound);
                        Ok(Bound::Nothing(Disposition::Ambiguous))
                    }
                }
            }
        }
    }

    /// One attempt to finish `record` with the event, or to decide the event by the record.
    async fn settle_by_event(
        &self,
        contracts: Contracts<'_>,
        event: &JobEvent,
        record: &Record,
        finish: &Finish,
    ) -> Result<Applied, store::Error> {
        let key = Some(record.key.clone());
        let disposition = match &record.state {
            // A claim released unsent (a refused connection, a 429, a denied authorization, an
            // operator's `not_applied`): nothing reached the downstream under this attempt, so
            // an event that says it finished contradicts the record. Only a new delivery runs
            // it again.
            RecordState::Pending {
                lease,
                dispatch: Dispatch::NotSent,
            } if lease.owner.is_none() => {
                tracing::warn!(
                    operation_key = record.key.as_str(),
                    source = %event.source,
                    event_id = %event.event_id,
                    "a webhook event names a claim released unsent; nothing settled"
                );
                Disposition::NotPending
            }
            // A pending job — or, bound by key, a record whose job id is not recorded yet:
            // the downstream's own callback is its receipt.
            RecordState::Pending { dispatch, .. }
                if matches!(dispatch, Dispatch::Job { .. })
                    || matches!(event.binding, Some(Binding::Key(_))) =>
            {
                let contract = loaded(contracts, event, record)?;
                let row = self.row(event, key.clone(), finished_as(finish), None);
                let mut t = finish_transition(&contract, record, finish, &row, self.at());
                t.webhook = Some(row);
                return self.apply_event(event, record, finish, t).await;
            }
            // Later evidence for an operation that went `unknown` (its job outlived its deadline,
            // say): the event settles it, as an audited action of the actor `evidence`.
            RecordState::Unknown(_) => {
                let contract = loaded(contracts, event, record)?;
                let how = format!(
                    "webhook event {} of source {} reported the job {}",
                    event.event_id,
                    event.source,
                    match finish {
                        Finish::Done(_) => "done",
                        Finish::Failed(_) => "failed",
                    }
                );
                let end = match finish {
                    Finish::Done(receipt) => Ok(receipt.clone()),
                    Finish::Failed(refusal) => Err(refusal.clone()),
                };
                let mut t = self.evidence_transition(&contract, record, end, &how);
                t.webhook = Some(self.row(event, key.clone(), finished_as(finish), None));
                return self.apply_event(event, record, finish, t).await;
            }
            RecordState::Pending { .. } | RecordState::AwaitingApproval { .. } => {
                Disposition::NotPending
            }
            RecordState::Applied(receipt) => agrees(
                finish,
                &Digest::Applied {
                    reference: receipt.reference.clone(),
                },
            ),
            RecordState::FailedPermanent(refusal) => {
                agrees(finish, &Digest::Refused { code: refusal.code })
            }
            RecordState::Tombstone(digest) => agrees(finish, digest),
        };
        self.record_event(event, key, disposition, None)
            .await
            .map(Applied::Done)
    }

    /// Writes `t`, the finish `event` causes on `record` with the event's row.
    async fn apply_event(
        &self,
        event: &JobEvent,
        record: &Record,
        finish: &Finish,
        t: Transition,
    ) -> Result<Applied, store::Error> {
        Ok(match self.store.transition(t).await? {
            Cas::Done(settled) => {
                tracing::info!(
                    operation_key = record.key.as_str(),
                    source = %event.source,
                    event_id = %event.event_id,
                    disposition = finished_as(finish).as_str(),
                    was = record.status().as_str(),
                    "a webhook event finished its job"
                );
                self.settled.offer(&settled, self.now());
                Applied::Done(EventAnswer {
                    disposition: finished_as(finish),
                    key: Some(record.key.clone()),
                    redelivery: false,
                })
            }
            Cas::Lost(now) => {
                // A concurrent delivery of the same event decided it, or the record moved:
                // which one, the event's row says.
                if let Some(seen) = self.store.webhook(&event.source, &event.event_id).await?
                    && seen.disposition != Disposition::Early
                {
                    return Ok(Applied::Done(redelivered(seen)));
                }
                match now {
                    Some(now) => Applied::Moved(Box::new(now)),
                    None => Applied::Gone,
                }
            }
        })
    }

    /// Records an event that causes no transition (or an early arrival), and logs it.
    async fn record_event(
        &self,
        event: &JobEvent,
        key: Option<OperationKey>,
        disposition: Disposition,
        finish: Option<Finish>,
    ) -> Result<EventAnswer, store::Error> {
        let row = self.row(event, key.clone(), disposition, finish);
        match self.store.record_webhook(row).await? {
            Recorded::Exists(seen) => Ok(redelivered(*seen)),
            Recorded::Written => {
                if disposition != Disposition::Early {
                    tracing::warn!(
                        source = %event.source,
                        event_id = %event.event_id,
                        operation_key = key.as_ref().map(OperationKey::as_str),
                        disposition = disposition.as_str(),
                        "a webhook event changed nothing; recorded for operators"
                    );
                }
                Ok(EventAnswer {
                    disposition,
                    key,
                    redelivery: false,
                })
            }
        }
    }

    fn row(
        &self,
        event: &JobEvent,
        key: Option<OperationKey>,
        disposition: Disposition,
        finish: Option<Finish>,
    ) -> WebhookEvent {
        let now = self.now();
        WebhookEvent {
            source: event.source.clone(),
            event_id: event.event_id.clone(),
            tenant: event.tenant.clone(),
            environment: Some(event.environment.clone()),
            tools: event.tools.clone(),
            job_id: match &event.binding {
                Some(Binding::Job(job_id)) => Some(job_id.clone()),
                Some(Binding::Key(_)) | None => None,
            },
            key,
            disposition,
            finish,
            received_at: now,
            purge_at: now.saturating_add(event.retention_millis),
        }
    }
}

enum Bound {
    Record(Box<Record>),
    Nothing(Disposition),
    /// No pending job has this id yet.
    NotYet(String),
}

enum Applied {
    Done(EventAnswer),
    /// The record moved under the event: bind again to what it is now.
    Moved(Box<Record>),
    Gone,
}

/// The loaded contract of `record`'s tool.
fn loaded(
    contracts: Contracts<'_>,
    event: &JobEvent,
    record: &Record,
) -> Result<Arc<Contract>, store::Error> {
    contracts(&record.tool).ok_or_else(|| {
        store::Error::Unavailable(format!(
            "webhook event {} names operation {}, whose tool {} is not loaded",
            event.event_id, record.key, record.tool
        ))
    })
}

/// Which pending jobs `event` may bind to by `job_id`.
fn job_match<'a>(event: &'a JobEvent, job_id: &'a str) -> JobMatch<'a> {
    JobMatch {
        tenant: &event.tenant,
        environment: &event.environment,
        tools: &event.tools,
        job_id,
    }
}

/// Logs an event that more than one operation matches: it is refused and settles nothing.
fn ambiguous(event: &JobEvent, found: &[Record]) {
    tracing::warn!(
        source = %event.source,
        event_id = %event.event_id,
        operation_keys = ?found.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        "a webhook event matches more than one operation of its source's tools; refused as ambiguous, nothing settled"
    );
}

fn redelivered(seen: WebhookEvent) -> EventAnswer {
    EventAnswer {
        disposition: seen.disposition,
        key: seen.key,
        redelivery: true,
    }
}

fn finished_as(finish: &Finish) -> Disposition {
    match finish {
        Finish::Done(_) => Disposition::Applied,
        Finish::Failed(_) => Disposition::Failed,
    }
}

/// The disposition of an event whose operation had settled already: the same end, or another.
fn agrees(finish: &Finish, settled: &Digest) -> Disposition {
    let same = match (finish, settled) {
        (Finish::Done(receipt), Digest::Applied { reference }) => &receipt.reference == reference,
        (Finish::Failed(_), Digest::Refused { .. }) => true,
        (Finish::Done(_) | Finish::Failed(_), _) => false,
    };
    if same {
        Disposition::AlreadySettled
    } else {
        Disposition::SettledDifferently
    }
}

fn finish_transition(
    contract: &Contract,
    record: &Record,
    finish: &Finish,
    event: &WebhookEvent,
    at: transitions::At<'_>,
) -> Transition {
    let mut t = match finish {
        Finish::Done(receipt) => transitions::job_done(record, contract, receipt.clone(), at),
        Finish::Failed(refusal) => transitions::job_failed(record, contract, refusal.clone(), at),
    };
    // The trace says which event finished the job, so an operator can find its row.
    for e in &mut t.events {
        let said = e.detail.take().unwrap_or_default();
        e.detail = Some(format!(
            "{said} (webhook event {} of source {})",
            event.event_id, event.source
        ));
    }
    t
}
