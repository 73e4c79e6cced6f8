//! Polling an accepted asynchronous job: it finishes applied or refused, or — when the
//! downstream no longer knows it, or it outlives the contract's job deadline
//! (`downstream.http.job.max_running`, else `max_retry_window`) — `unknown`. A running job is
//! in flight until then, however long that is: waiting is not ambiguity.

use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, JobStatus};
use idemgate_core::machine::{self, JOB_POLL_SECONDS};
use idemgate_core::outcome::{ErrorCode, NextAction, Outcome};
use idemgate_core::record::Record;
use idemgate_core::store::Cas;
use idemgate_core::transitions;

use super::Executor;

/// Who polls. A delivery's poll writes only a finished job; the recoverer's also schedules the
/// next poll (the record's lease is its time), so a job that never finishes does not keep the
/// recoverer's attention every pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poller {
    Delivery,
    Recoverer,
}

impl Executor {
    pub(crate) async fn poll_job(
        &self,
        contract: &Contract,
        record: Record,
        job_id: &str,
        effect: &dyn Downstream,
        poller: Poller,
    ) -> Outcome {
        // An event that arrived before the job id was recorded finishes the job without a
        // poll (see `webhooks`).
        if let Some(finished) = self.apply_early_events(contract, &record).await {
            return finished;
        }
        let key = record.key.clone();
        let at = self.at();
        let t = match effect.poll_job(&key, job_id).await {
            JobStatus::Done(receipt) => transitions::job_done(&record, contract, receipt, at),
            JobStatus::Failed(refusal) => transitions::job_failed(&record, contract, refusal, at),
            JobStatus::Gone(reason) => {
                let reason = format!("the downstream no longer knows job {job_id}: {reason}");
                return self.mark_record_unknown(&record, &reason, None, None).await;
            }
            JobStatus::Running | JobStatus::Unavailable(_) => {
                let waited_out = at.now >= machine::job_deadline(contract, &record);
                return match (poller, waited_out) {
                    (_, true) => {
                        let reason = format!(
                            "job {job_id} did not finish within its deadline of {} \
                             (downstream.http.job.max_running)",
                            contract.max_running()
                        );
                        self.mark_record_unknown(&record, &reason, None, None).await
                    }
                    (Poller::Delivery, false) => {
                        Outcome::in_flight(key, NextAction::Poll, JOB_POLL_SECONDS)
                    }
                    (Poller::Recoverer, false) => {
                        let next = at.now.saturating_add(contract.lease.millis() / 3);
                        let t = transitions::next_poll(&record, next, at);
                        let _ = self.store.transition(t).await;
                        Outcome::in_flight(key, NextAction::Poll, JOB_POLL_SECONDS)
                    }
                };
            }
        };
        match self.store.transition(t).await {
            Ok(Cas::Done(r)) | Ok(Cas::Lost(Some(r))) => {
                machine::status_outcome(Some(contract), &r, self.now())
            }
            Ok(Cas::Lost(None)) => {
                Outcome::rejected(Some(key), ErrorCode::NotFound, "no such operation")
            }
            // The job's end is known but not recorded: the record is still pending with its job,
            // and the next poll records it.
            Err(e) => {
                tracing::warn!(operation_key = key.as_str(), error = %e, "a finished job could not be recorded");
                Outcome::in_flight(key, NextAction::Poll, JOB_POLL_SECONDS)
            }
        }
    }
}
