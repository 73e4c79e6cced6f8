//! Later evidence settles `unknown`: a poll that finds the job done or failed, or a receipt
//! lookup that finds the effect, made when a delivery or a status read meets an `unknown`
//! record (a webhook event settles one in `webhooks`).
//!
//! `unknown` means the outcome could not be proved *then*; it does not mean it never will be.
//! Evidence is read, never made: no path here sends anything. A settlement is an audited
//! action of the actor [`EVIDENCE`] (its trace entry is `reconciled` by worker `evidence`,
//! its audit entry `settled_by_evidence`), so an operator sees who ended the record and why.

use idemgate_core::audit::{Action, Draft};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, JobStatus, Lookup};
use idemgate_core::record::{Receipt, Record, RecordState, Refusal};
use idemgate_core::store::{Cas, Transition};
use idemgate_core::transitions::{self, At, EVIDENCE};

use super::Executor;

impl Executor {
    /// Looks for evidence of an `unknown` record's outcome — its job polled, else its receipt
    /// looked up — and settles the record with it. The record as it is afterwards when it is
    /// settled (by this evidence or meanwhile by another), `None` when nothing was found.
    pub(crate) async fn seek_evidence(
        &self,
        contract: &Contract,
        record: &Record,
        effect: &dyn Downstream,
    ) -> Option<Record> {
        let RecordState::Unknown(evidence) = &record.state else {
            return None;
        };
        let (end, how) = match &evidence.job_id {
            Some(job_id) if contract.async_jobs() => {
                match effect.poll_job(&record.key, job_id).await {
                    JobStatus::Done(receipt) => {
                        (Ok(receipt), format!("a poll found job {job_id} done"))
                    }
                    JobStatus::Failed(refusal) => {
                        (Err(refusal), format!("a poll found job {job_id} failed"))
                    }
                    JobStatus::Running | JobStatus::Gone(_) | JobStatus::Unavailable(_) => {
                        return None;
                    }
                }
            }
            Some(_) | None if contract.receipt_lookup() => {
                match effect.lookup_receipt(&record.key).await {
                    Lookup::Found(receipt) if !receipt.reference.is_empty() => {
                        (Ok(receipt), "a receipt lookup found the effect".to_string())
                    }
                    Lookup::Found(_) | Lookup::NotFound | Lookup::Unavailable(_) => return None,
                }
            }
            Some(_) | None => return None,
        };
        let t = self.evidence_transition(contract, record, end, &how);
        match self.store.transition(t).await {
            Ok(Cas::Done(settled)) => {
                tracing::info!(
                    operation_key = record.key.as_str(),
                    evidence = %how,
                    status = settled.status().as_str(),
                    "later evidence settled an unknown operation"
                );
                self.settled.offer(&settled, self.now());
                Some(settled)
            }
            // Another delivery, an event or an operator settled it meanwhile.
            Ok(Cas::Lost(Some(now))) if !matches!(now.state, RecordState::Unknown(_)) => Some(now),
            Ok(Cas::Lost(_)) => None,
            Err(e) => {
                tracing::warn!(operation_key = record.key.as_str(), error = %e, "evidence for an unknown operation could not be recorded; it stays unknown");
                None
            }
        }
    }

    /// The transition by which `end` settles the `unknown` `record`, with its audit entry.
    pub(crate) fn evidence_transition(
        &self,
        contract: &Contract,
        record: &Record,
        end: Result<Receipt, Refusal>,
        how: &str,
    ) -> Transition {
        let at = At {
            now: self.now(),
            worker: EVIDENCE,
        };
        let mut t = transitions::settled_by_evidence(record, contract, end, how, at);
        t.audit = Some(Draft::of(
            record,
            &t,
            Action::SettledByEvidence,
            EVIDENCE,
            how,
        ));
        t
    }
}
