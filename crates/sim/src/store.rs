//! [`SimStore`]: any real store, made a part of the schedule.
//!
//! Each call stops at a yield point before it runs, and a write stops again after it
//! committed, so a crash can land before a write (it never happened) or after it (it happened
//! and its answer was lost). Faults are drawn from the choice stream: a write refused before it
//! ran (`Unavailable`), or committed and then reported `Ambiguous`; a read refused.
//!
//! The inner call itself runs to completion between the two yield points ([`block_on`]): the
//! SQLite store answers from its writer thread, and waiting for it whole keeps the order of
//! events the schedule's alone.

use idemgate_core::webhook::{JobMatch, Recorded, WebhookEvent};
use std::fmt::Write as _;
use std::sync::Arc;

use idemgate_core::audit::Entry;
use idemgate_core::key::OperationKey;
use idemgate_core::record::{
    Digest, Dispatch, Event, EventKind, Millis, Record, RecordState, RecordStatus,
};
use idemgate_core::store::{
    BoxFuture, Cas, Claimed, Due, Error, Filter, Store, SweepReport, Transition, Waiting,
};

use crate::runtime::{Point, Sim, block_on, yield_point};

/// A store wrapped for the simulation. Clones share the inner store.
pub struct SimStore<S> {
    inner: Arc<S>,
    sim: Arc<Sim>,
    /// Whether a purge on time also makes the downstreams forget the key
    /// ([`Choices::with_lives`](crate::choices::Choices::with_lives)).
    forget: bool,
}

impl<S> Clone for SimStore<S> {
    fn clone(&self) -> Self {
        SimStore {
            inner: self.inner.clone(),
            sim: self.sim.clone(),
            forget: self.forget,
        }
    }
}

/// A short name for a state, for the trace.
pub fn brief(state: &RecordState) -> String {
    match state {
        RecordState::Pending { lease, dispatch } => {
            let mut s = format!("pending({}", lease.owner.as_deref().unwrap_or("released"));
            match dispatch {
                Dispatch::NotSent => {}
                Dispatch::Sent => s.push_str(", sent"),
                Dispatch::Job { job_id } => {
                    let _ = write!(s, ", job {job_id}");
                }
            }
            s.push(')');
            s
        }
        RecordState::AwaitingApproval { .. } => "awaiting_approval".into(),
        RecordState::Applied(r) => format!("applied({})", r.reference),
        RecordState::FailedPermanent(r) => format!("failed_permanent({})", r.code.as_str()),
        RecordState::Unknown(e) => format!("unknown({})", e.reason),
        RecordState::Tombstone(d) => match d {
            Digest::Applied { reference } => format!("tombstone(applied {reference})"),
            Digest::Refused { code } => format!("tombstone(refused {})", code.as_str()),
            Digest::NeverRan => "tombstone(never ran)".into(),
        },
    }
}

impl<S: Store> SimStore<S> {
    pub fn new(inner: Arc<S>, sim: Arc<Sim>) -> SimStore<S> {
        SimStore {
            inner,
            sim,
            forget: false,
        }
    }

    /// Makes a purge on time also clear the downstreams' memory of the key (what deduplication
    /// and receipt lookups answer from), as a downstream that remembers keys no longer than
    /// idemgate's retention would.
    pub fn forgetting(mut self, on: bool) -> SimStore<S> {
        self.forget = on;
        self
    }

    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// Reads a record straight from the inner store, outside the simulation: no yield point,
    /// no fault. For the checker and the oracles.
    pub fn peek(&self, key: &OperationKey) -> Option<Record> {
        block_on(self.inner.get(key)).ok().flatten()
    }

    /// Every record, straight from the inner store.
    pub fn all(&self) -> Vec<Record> {
        block_on(self.inner.list(Filter {
            limit: 1000,
            ..Filter::default()
        }))
        .unwrap_or_default()
    }

    /// The whole audit log, straight from the inner store.
    pub fn audit_entries(&self) -> Vec<Entry> {
        let mut entries: Vec<Entry> = Vec::new();
        loop {
            let after = entries.last().map_or(0, |e| e.seq);
            match block_on(self.inner.audit_log(after, 1000)) {
                Ok(page) if !page.is_empty() => entries.extend(page),
                Ok(_) | Err(_) => return entries,
            }
        }
    }

    /// Before a write: a crash point, then perhaps a refusal (nothing written).
    async fn before_write(&self, what: &str) -> Result<(), Error> {
        yield_point(&self.sim, Point::BeforeWrite).await;
        let mut s = self.sim.lock();
        if s.fault(40) == 39 {
            s.note(|| format!("store.{what} refused (unavailable)"));
            return Err(Error::Unavailable("simulated: store down".into()));
        }
        Ok(())
    }

    /// After a write committed: perhaps the answer is lost, then a crash point.
    async fn after_write<T>(&self, what: &str, answer: T) -> Result<T, Error> {
        let lost = {
            let mut s = self.sim.lock();
            let lost = s.fault(40) == 39;
            if lost {
                s.note(|| format!("store.{what} committed, answer lost (ambiguous)"));
            }
            lost
        };
        yield_point(&self.sim, Point::AfterWrite).await;
        if lost {
            Err(Error::Ambiguous(
                "simulated: connection lost at commit".into(),
            ))
        } else {
            Ok(answer)
        }
    }

    async fn before_read(&self, what: &str) -> Result<(), Error> {
        yield_point(&self.sim, Point::BeforeRead).await;
        let mut s = self.sim.lock();
        if s.fault(50) == 49 {
            s.note(|| format!("store.{what} refused (unavailable)"));
            return Err(Error::Unavailable("simulated: store down".into()));
        }
        Ok(())
    }

    fn noted_claim(&self, claimed: &Claimed, key: &OperationKey) {
        let mut s = self.sim.lock();
        if let Claimed::Inserted(r) = claimed {
            s.history.claimed.insert(r.key.clone());
            s.history.writes += 1;
        }
        s.note(|| match claimed {
            Claimed::Inserted(r) => format!(
                "store.claim {key} inserted {} fence {}",
                brief(&r.state),
                r.fence
            ),
            Claimed::Existing(r) => format!(
                "store.claim {key} found {} fence {}",
                brief(&r.state),
                r.fence
            ),
            Claimed::DuplicateIntent(other) => {
                format!("store.claim {key} duplicate intent of {other}")
            }
        });
    }
}

impl<S: Store> SimStore<S> {
    /// Notes what a sweep did, and whether it kept each record as long as its contract says,
    /// counted from settlement: compacted no earlier than `record_ttl` after it settled, purged
    /// no earlier than `record_ttl + tombstone_ttl` after (`tombstone_ttl` for a record that
    /// settled straight into a tombstone), and never a record that had not settled.
    fn audit_sweep(
        &self,
        environment: &str,
        now: Millis,
        before: Vec<(OperationKey, Option<Record>)>,
        report: SweepReport,
    ) {
        let mut gone = Vec::new();
        let mut early = Vec::new();
        for (key, was) in before {
            let Some(was) = was else { continue };
            let after = self.peek(&key);
            let s = self.sim.lock();
            let (ttl, tomb) = s
                .history
                .retention
                .get(&was.tool)
                .copied()
                .unwrap_or((0, 0));
            let settled = s.history.settled_at.get(&key).copied();
            let at = |t: Millis| t - s.start;
            let compacted = after.as_ref().is_some_and(|a| {
                a.status() == RecordStatus::Tombstone && was.status() != RecordStatus::Tombstone
            });
            let early_before = early.len();
            match (&after, settled) {
                (None, Some((settled, direct))) => {
                    let keep = if direct { tomb } else { ttl + tomb };
                    if now < settled + keep {
                        early.push(format!(
                            "{key} purged at +{}ms, {}ms after it settled at +{}ms; it is kept {keep}ms",
                            at(now),
                            now - settled,
                            at(settled)
                        ));
                    }
                }
                (Some(_), Some((settled, _))) if compacted && now < settled + ttl => {
                    early.push(format!(
                        "{key} compacted at +{}ms, {}ms after it settled at +{}ms; it is kept {ttl}ms",
                        at(now),
                        now - settled,
                        at(settled)
                    ));
                }
                (None, None) => early.push(format!(
                    "{key} purged from {}, which never settled",
                    brief(&was.state)
                )),
                (Some(_), None) if compacted => early.push(format!(
                    "{key} compacted from {}, which never settled",
                    brief(&was.state)
                )),
                (Some(_), _) => {}
            }
            if after.is_none() {
                // Only a purge on time starts a new life of the key: after one too early, a
                // later effect under the key is still the same operation's second effect.
                gone.push((key, early.len() == early_before));
            }
        }
        let mut s = self.sim.lock();
        let step = s.step;
        for (k, on_time) in &gone {
            s.history.claimed.remove(k);
            s.history.settled_at.remove(k);
            if *on_time {
                s.history.purges.entry(k.clone()).or_default().push(step);
                // A send still in flight from the life that ended is remembered until it lands: a
                // downstream's window outlasts its slowest request.
                if self.forget && s.history.ledger.in_flight.get(k).copied().unwrap_or(0) == 0 {
                    s.history.ledger.first.remove(k);
                }
            }
        }
        for e in early {
            s.note(|| format!("store.sweep too early: {e}"));
            s.history.early_sweeps.push(e);
        }
        s.note(|| {
            format!(
                "store.sweep {environment}: compacted {}, purged {} {:?}",
                report.compacted,
                report.purged,
                gone.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
            )
        });
    }
}

impl<S: Store> SimStore<S> {
    /// Notes that the running task has just read `key`'s record.
    fn read_by_task(&self, key: &OperationKey) {
        let mut s = self.sim.lock();
        let step = s.step;
        let task = crate::runtime::current().map_or(0, |c| c.task);
        s.history
            .reads
            .entry((task, key.clone()))
            .or_default()
            .push(step);
    }
}

impl<S: Store> Store for SimStore<S> {
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            self.before_read("get").await?;
            let found = block_on(self.inner.get(key))?;
            self.read_by_task(key);
            self.sim.lock().note(|| match &found {
                Some(r) => format!("store.get {key}: {} fence {}", brief(&r.state), r.fence),
                None => format!("store.get {key}: none"),
            });
            Ok(found)
        })
    }

    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            self.before_write("claim").await?;
            let key = record.key.clone();
            let claimed = block_on(self.inner.claim(record, events))?;
            self.read_by_task(&key);
            self.noted_claim(&claimed, &key);
            self.after_write("claim", claimed).await
        })
    }

    fn claim_replaces_read(&self) -> bool {
        self.inner.claim_replaces_read()
    }

    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            self.before_write("claim").await?;
            let key = record.key.clone();
            let claimed = block_on(self.inner.claim_unless_duplicate(record, events, since))?;
            self.read_by_task(&key);
            self.noted_claim(&claimed, &key);
            self.after_write("claim", claimed).await
        })
    }

    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, Error>> {
        Box::pin(async move {
            self.before_write("transition").await?;
            let key = transition.key.clone();
            let from = transition.expect.status;
            let expected = transition.expect.fence;
            let stamped = transition.now;
            // Operators are truthful at the moment they confirm, not only when they start: a
            // `not_applied` the ledger contradicts by now (an effect committed or on its way
            // since the operator looked) is withdrawn, as a person re-reading the downstream
            // before confirming would. Nothing is written.
            let withdrawn = transition.events.iter().any(|e| {
                e.kind == idemgate_core::record::EventKind::Reconciled
                    && e.detail
                        .as_deref()
                        .is_some_and(|d| d.starts_with("not applied"))
            }) && {
                let s = self.sim.lock();
                s.history.ledger.committed(&key).is_some() || s.history.ledger.in_flight(&key)
            };
            if withdrawn {
                self.sim.lock().note(|| {
                    format!("operator withdrew not_applied for {key}: the ledger has an effect")
                });
                return Err(Error::Unavailable(
                    "simulated: the operator withdrew a resolution the downstream contradicts"
                        .into(),
                ));
            }
            let operator = transition.events.iter().any(|e| {
                matches!(
                    e.kind,
                    EventKind::Approved | EventKind::Denied | EventKind::Reconciled
                )
            });
            let cas = block_on(self.inner.transition(transition))?;
            self.read_by_task(&key);
            {
                let mut s = self.sim.lock();
                if let Cas::Done(r) = &cas {
                    s.history.writes += 1;
                    if operator {
                        s.history.operator_transitions.push(key.clone());
                    }
                    let was_settled = matches!(
                        from,
                        RecordStatus::Applied
                            | RecordStatus::FailedPermanent
                            | RecordStatus::Tombstone
                    );
                    if r.is_settled() && !was_settled {
                        // The executor's instant of settlement, which the expiry counts from
                        // (the write itself may land later, as a slow store's would).
                        let now = stamped;
                        let direct = r.status() == RecordStatus::Tombstone;
                        s.history.settled_at.insert(key.clone(), (now, direct));
                    }
                }
                s.note(|| match &cas {
                    Cas::Done(r) => format!(
                        "store.transition {key} {}→{} fence {}",
                        from.as_str(),
                        brief(&r.state),
                        r.fence
                    ),
                    Cas::Lost(now) => format!(
                        "store.transition {key} lost (expected {} fence {expected}; now {})",
                        from.as_str(),
                        now.as_ref().map_or("gone".to_string(), |r| format!(
                            "{} fence {}",
                            brief(&r.state),
                            r.fence
                        ))
                    ),
                });
            }
            self.after_write("transition", cas).await
        })
    }

    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.before_write("append_events").await?;
            block_on(self.inner.append_events(key, events))?;
            self.after_write("append_events", ()).await
        })
    }

    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>> {
        Box::pin(async move {
            self.before_read("audit_log").await?;
            block_on(self.inner.audit_log(after, limit))
        })
    }

    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(async move {
            self.before_read("events").await?;
            block_on(self.inner.events(key))
        })
    }

    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            self.before_read("list").await?;
            block_on(self.inner.list(filter))
        })
    }

    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            self.before_read("count").await?;
            block_on(self.inner.count(environment, status))
        })
    }

    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            self.before_read("due").await?;
            block_on(self.inner.due(query))
        })
    }

    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            self.before_read("waiting").await?;
            block_on(self.inner.waiting(query))
        })
    }

    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>> {
        Box::pin(async move {
            self.before_write("sweep").await?;
            // What each known record was before the sweep, read outside the simulation, to
            // tell which ones it compacted and purged.
            let known: Vec<OperationKey> =
                self.sim.lock().history.claimed.iter().cloned().collect();
            let before: Vec<(OperationKey, Option<Record>)> = known
                .into_iter()
                .map(|k| {
                    let r = self.peek(&k);
                    (k, r)
                })
                .collect();
            let report = block_on(self.inner.sweep(environment, now, limit))?;
            if report.compacted + report.purged > 0 {
                self.audit_sweep(environment, now, before, report);
            }
            self.after_write("sweep", report).await
        })
    }
    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, Error>> {
        Box::pin(async move { block_on(self.inner.webhook(source, event_id)) })
    }

    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, Error>> {
        Box::pin(async move { block_on(self.inner.record_webhook(event)) })
    }

    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, Error>> {
        Box::pin(async move { block_on(self.inner.webhooks_for_job(tenant, job_id)) })
    }

    fn open_jobs<'a>(&'a self, m: JobMatch<'a>) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        Box::pin(async move { block_on(self.inner.open_jobs(m)) })
    }

    fn sweep_webhooks(&self, now: Millis, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move { block_on(self.inner.sweep_webhooks(now, limit)) })
    }
}
