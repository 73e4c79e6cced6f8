//! Background work that does not wait for a retry: recovering records abandoned while owned,
//! polling accepted jobs, expiring approvals and released claims past their deadlines, and
//! sweeping retention — all within one environment.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate_core::contract::Contract;
use idemgate_core::effect::Downstream;
use idemgate_core::record::{Dispatch, RecordState};
use idemgate_core::store::{self, Cursor, Due, SweepReport, due_at};

use crate::executor::Executor;
use crate::executor::Poller;

/// Finds the contract and the downstream of a tool by name, for records the recoverer meets.
pub trait Tools: Send + Sync {
    fn resolve(&self, tool: &str) -> Option<(Arc<Contract>, Arc<dyn Downstream>)>;
}

/// What one recovery pass did, by the status each record ended in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub examined: usize,
    /// Records of tools no longer loaded: left alone for an operator.
    pub unresolved: usize,
    pub outcomes: BTreeMap<&'static str, usize>,
}

/// Drives due records of one environment to an end without waiting for a delivery.
///
/// It only takes up records **abandoned while owned** (a lease that expired) and jobs due for
/// a poll; a claim that was *released* (provably not sent) runs again only when a new delivery
/// asks for it, authorized afresh — the recoverer merely expires it once its retry window has
/// passed. Every send it makes is preceded by a fresh authorization of the recorded actor.
///
/// The scan is paged by a cursor over (deadline, key) that each pass continues from and that
/// wraps around at the end, so records that make no progress (a tool no longer loaded, a lookup
/// that stays unavailable) never hide the others.
#[derive(Clone)]
pub struct Recoverer {
    executor: Executor,
    tools: Arc<dyn Tools>,
    environment: String,
    batch: usize,
    // A std mutex: held only to read or replace the cursor, never across an await.
    cursor: Arc<Mutex<Option<Cursor>>>,
}

impl Recoverer {
    pub fn new(
        executor: Executor,
        tools: Arc<dyn Tools>,
        environment: impl Into<String>,
    ) -> Recoverer {
        Recoverer {
            executor,
            tools,
            environment: environment.into(),
            batch: 100,
            cursor: Arc::new(Mutex::new(None)),
        }
    }

    pub fn with_batch(mut self, batch: usize) -> Recoverer {
        self.batch = batch.max(1);
        self
    }

    /// The environment whose records this recoverer drives.
    pub fn environment(&self) -> &str {
        &self.environment
    }

    fn cursor(&self) -> std::sync::MutexGuard<'_, Option<Cursor>> {
        self.cursor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One pass over the next page of due records.
    pub async fn run_once(&self) -> Result<RecoveryReport, store::Error> {
        let now = self.executor.clock().now();
        let after = self.cursor().clone();
        let query = Due {
            environment: self.environment.clone(),
            now,
            after,
            limit: self.batch,
        };
        let records = self.executor.store().due(query).await?;
        // The next pass continues after this page; a short page was the end, and the next pass
        // starts over.
        *self.cursor() = match records.last() {
            Some(last) if records.len() == self.batch => due_at(last).map(|due_at| Cursor {
                due_at,
                key: last.key.clone(),
            }),
            Some(_) | None => None,
        };
        let mut report = RecoveryReport::default();
        for record in records {
            report.examined += 1;
            let Some((contract, effect)) = self.tools.resolve(&record.tool) else {
                report.unresolved += 1;
                continue;
            };
            let executor = &self.executor;
            let outcome = match &record.state {
                RecordState::Pending { lease, dispatch } => match (&lease.owner, dispatch) {
                    (Some(_), Dispatch::Job { job_id }) => {
                        let job_id = job_id.clone();
                        executor
                            .poll_job(
                                &contract,
                                record,
                                &job_id,
                                effect.as_ref(),
                                Poller::Recoverer,
                            )
                            .await
                    }
                    (Some(_), Dispatch::NotSent | Dispatch::Sent) => {
                        executor
                            .recover(&contract, record, None, effect.as_ref())
                            .await
                    }
                    // Released and past its retry window with no delivery taking it up.
                    (None, Dispatch::NotSent | Dispatch::Sent | Dispatch::Job { .. }) => {
                        executor.expire_unsent(&contract, record).await
                    }
                },
                RecordState::AwaitingApproval { .. } => {
                    executor.expire_approval(&contract, record).await
                }
                // Not due by the store's rule; named so that a new state is considered here.
                RecordState::Applied(_)
                | RecordState::FailedPermanent(_)
                | RecordState::Unknown(_)
                | RecordState::Tombstone(_) => continue,
            };
            *report.outcomes.entry(outcome.status.as_str()).or_default() += 1;
        }
        Ok(report)
    }

    /// Runs recovery every `every` and a retention sweep every `sweep_every`, until `shutdown`
    /// completes. Errors are logged and retried on the next tick: the work is idempotent.
    pub async fn run(
        self,
        every: Duration,
        sweep_every: Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut recover = tokio::time::interval(every);
        let mut sweep = tokio::time::interval(sweep_every);
        recover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = recover.tick() => {
                    match self.run_once().await {
                        Ok(r) if r.examined > 0 => tracing::info!(examined = r.examined, outcomes = ?r.outcomes, "recovery pass"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "recovery pass failed"),
                    }
                }
                _ = sweep.tick() => {
                    match self.executor.sweep(&self.environment, 1000).await {
                        Ok(r) if r.compacted + r.purged > 0 => tracing::info!(compacted = r.compacted, purged = r.purged, "retention sweep"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
                    }
                    // Webhook events past their retry window (a table of the store, not of
                    // an environment).
                    match self.executor.sweep_webhooks(1000).await {
                        Ok(n) if n > 0 => tracing::info!(deleted = n, "webhook events swept"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "webhook event sweep failed"),
                    }
                }
            }
        }
    }
}

impl Executor {
    /// One retention sweep of `environment` (see `Store::sweep` for the rule).
    pub async fn sweep(
        &self,
        environment: &str,
        limit: usize,
    ) -> Result<SweepReport, store::Error> {
        self.store()
            .sweep(environment, self.clock().now(), limit)
            .await
    }

    /// Deletes up to `limit` webhook events whose retention has passed.
    pub async fn sweep_webhooks(&self, limit: usize) -> Result<u64, store::Error> {
        self.store().sweep_webhooks(self.clock().now(), limit).await
    }
}
