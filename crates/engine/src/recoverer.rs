//! Background work that does not wait for a retry: recovering abandoned pending records,
//! polling accepted jobs, and sweeping retention.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::contract::Contract;
use idemgate_core::effect::Downstream;
use idemgate_core::record::{Dispatch, RecordState};
use idemgate_core::store::{self, SweepReport};

use crate::executor::Executor;

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

/// Drives abandoned pending records to an end without waiting for a delivery.
#[derive(Clone)]
pub struct Recoverer {
    executor: Executor,
    tools: Arc<dyn Tools>,
    batch: usize,
}

impl Recoverer {
    pub fn new(executor: Executor, tools: Arc<dyn Tools>) -> Recoverer {
        Recoverer {
            executor,
            tools,
            batch: 100,
        }
    }

    pub fn with_batch(mut self, batch: usize) -> Recoverer {
        self.batch = batch.max(1);
        self
    }

    /// One pass over the records whose lease has expired (or whose job may have finished).
    pub async fn run_once(&self) -> Result<RecoveryReport, store::Error> {
        let now = self.executor.clock().now();
        let records = self.executor.store().recoverable(now, self.batch).await?;
        let mut report = RecoveryReport::default();
        for record in records {
            report.examined += 1;
            let Some((contract, effect)) = self.tools.resolve(&record.tool) else {
                report.unresolved += 1;
                continue;
            };
            let outcome = match &record.state {
                RecordState::Pending {
                    dispatch: Dispatch::Job { job_id },
                    ..
                } => {
                    let job_id = job_id.clone();
                    self.executor
                        .poll_job(&contract, record, &job_id, effect.as_ref())
                        .await
                }
                _ => {
                    self.executor
                        .recover(&contract, record, None, effect.as_ref())
                        .await
                }
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
                    match self.executor.sweep(1000).await {
                        Ok(r) if r.compacted + r.purged > 0 => tracing::info!(compacted = r.compacted, purged = r.purged, "retention sweep"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
                    }
                }
            }
        }
    }
}

impl Executor {
    /// One retention sweep (see `Store::sweep` for the rule).
    pub async fn sweep(&self, limit: usize) -> Result<SweepReport, store::Error> {
        self.store().sweep(self.clock().now(), limit).await
    }
}
