//! The effect budget: every request that could make an effect — the executor's sends and
//! resends, and the sends a probe makes itself — is counted against one limit for the whole
//! run, and none is made past it.
//!
//! Probes are admitted by their worst case (a probe that might need more than what is left is
//! skipped, and the report says so), and [`Metered`] enforces the limit where the requests are
//! made: a send past it is answered `NotSent` without reaching the network, the one answer that
//! is true of it. Lookups and job polls are not effects and are not counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::store::BoxFuture;
use serde_json::Value;

/// The run's budget of effects.
#[derive(Debug)]
pub struct Budget {
    limit: u32,
    spent: AtomicU32,
}

impl Budget {
    pub fn new(limit: u32) -> Budget {
        Budget {
            limit,
            spent: AtomicU32::new(0),
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn spent(&self) -> u32 {
        self.spent.load(Ordering::SeqCst)
    }

    pub fn left(&self) -> u32 {
        self.limit.saturating_sub(self.spent())
    }

    /// Takes one effect from the budget; `false` when none is left.
    fn take(&self) -> bool {
        self.spent
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |spent| {
                (spent < self.limit).then_some(spent + 1)
            })
            .is_ok()
    }
}

/// A downstream whose sends are counted against the budget (and per contract).
pub struct Metered {
    inner: Arc<dyn Downstream>,
    budget: Arc<Budget>,
    sent: Arc<AtomicU32>,
}

impl Metered {
    pub fn new(inner: Arc<dyn Downstream>, budget: Arc<Budget>, sent: Arc<AtomicU32>) -> Metered {
        Metered {
            inner,
            budget,
            sent,
        }
    }
}

impl Downstream for Metered {
    fn check(&self, arguments: &Value) -> Result<(), String> {
        self.inner.check(arguments)
    }

    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        if !self.budget.take() {
            return Box::pin(std::future::ready(EffectOutcome::NotSent {
                reason: format!(
                    "the verification's budget of {} effects is spent",
                    self.budget.limit()
                ),
                retry_after: None,
            }));
        }
        self.sent.fetch_add(1, Ordering::SeqCst);
        self.inner.perform(request)
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        self.inner.lookup_receipt(key)
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        self.inner.poll_job(key, job_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_never_exceeded() {
        let budget = Budget::new(2);
        assert!(budget.take());
        assert!(budget.take());
        assert!(!budget.take());
        assert_eq!((budget.spent(), budget.left()), (2, 0));
    }
}
