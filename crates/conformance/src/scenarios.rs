//! The seed's two test tables, and the faults between their rows, as named scenarios.
//!
//! Every scenario takes a fresh, empty store and asserts two things separately: the labels the
//! executor answered, and the number of effects the fake downstream counted on its own side.
//! A scenario that only checked the first could pass while hiding a duplicate.
//!
//! Races are driven with gates (pause a worker after its claim, after the downstream commit)
//! and crashes by aborting a worker mid-flight; real process kills are in the CLI's crash
//! tests, which use the same store and a downstream ledger in a file.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::contract::Contract;
use idemgate_core::effect::Authorization;
use idemgate_core::outcome::{ErrorCode, NextAction, Status};
use idemgate_core::record::{Dispatch, EventKind, RecordState, RecordStatus};
use idemgate_core::store::Store;
use idemgate_engine::{ActionError, Recoverer, Resolution, StatusRead, Tools};
use serde_json::json;

use crate::downstream::{FakeDownstream, Fault};
use crate::faulty::Fault as StoreFault;
use crate::harness::{ENVIRONMENT, Harness, Spec, key, op, ticket};

/// The scenario list, written once. `scenario_tests!` turns it into test functions in a store's
/// test file; inside this module it becomes [`all`], for runners that are not `cargo test`.
#[doc(hidden)]
#[macro_export]
macro_rules! __idemgate_scenarios {
    (@emit $how:tt) => {
        $crate::__idemgate_scenarios!(@each $how
            same_key_twice_one_effect,
            lost_response_replays_by_receipt,
            lost_response_without_lookup_resends_to_deduplicating_downstream,
            lost_response_without_receipt_path_is_unknown,
            crash_after_downstream_commit_recovers_receipt,
            crash_after_downstream_commit_without_receipt_path_is_unknown,
            crash_after_claim_recovers_by_execution,
            crash_after_claim_recovered_by_recoverer,
            crash_after_a_marked_claim_is_never_sent_blindly,
            failed_marked_claim_is_never_sent_blindly,
            concurrent_workers_one_owner,
            simultaneous_deliveries_one_effect,
            changed_fingerprint_rejected_without_effect,
            new_key_same_arguments_is_a_new_operation,
            duplicate_intent_window_flags_new_key,
            revoked_authorization_denies_retry,
            authorization_checked_before_first_effect,
            key_after_retention_follows_reject_policy,
            key_after_retention_follows_tombstone_policy,
            key_after_retention_follows_reconcile_policy,
            delayed_job_is_polled_to_completion,
            failed_job_is_replayed_as_refusal,
            malformed_result_is_never_success,
            timeout_without_commit_reconciled_not_applied,
            refusal_replayed_as_same_refusal,
            not_sent_releases_claim,
            unwritten_release_is_not_safe_to_repeat,
            store_down_before_claim_leaves_nothing,
            store_error_after_completion_commit_replays,
            store_error_before_completion_recovers_receipt,
            late_finisher_is_fenced,
            approval_gates_the_effect,
            denied_approval_is_final,
            older_version_applied_record_replays,
            older_version_pending_record_is_not_driven,
            read_takes_no_claim,
            natural_idempotent_precondition_failure_is_released,
            invalid_input_leaves_no_record,
            replay_never_writes,
            settled_replays_read_no_row_until_near_expiry,
            operator_resolves_unknown_as_applied,
            approval_denied_by_the_recheck_is_not_sent_by_the_recoverer,
            released_claim_is_run_only_by_a_new_delivery,
            not_applied_with_a_revoked_actor_is_never_sent,
            recovery_rechecks_the_recorded_actor,
            expired_approval_is_refused_never_replayed,
            late_delivery_for_an_applied_effect_is_not_safe_to_repeat,
            refused_resend_after_a_lost_answer_is_unknown,
            not_processed_resend_after_a_lost_answer_stays_ambiguous,
            retention_counts_from_settlement,
            keyless_calls_never_share_an_idempotency_key,
            takeover_sends_the_claimed_request,
            resend_sends_and_keeps_the_claimed_request,
            stuck_records_do_not_block_the_recoverer,
            persistent_server_errors_end_unknown_within_bounds,
            forgotten_job_ends_unknown,
            operator_reconciles_any_unsettled_record,
            status_read_rechecks_the_reader,
            concurrent_duplicate_intents_run_once,
            recoverer_and_sweeper_stay_in_their_environment,
        );
    };
    (@each [tests $fresh:tt] $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fixture: Option<$crate::harness::Fixture> = $fresh;
                let Some(fixture) = fixture else { return };
                $crate::scenarios::$name(fixture.store.clone()).await;
                drop(fixture);
            }
        )*
    };
    (@each [list] $($name:ident),* $(,)?) => {
        /// Every scenario by name, for runners that are not `cargo test` (the CLI).
        pub fn all() -> Vec<(&'static str, fn(Arc<dyn Store>) -> idemgate_core::store::BoxFuture<'static, ()>)> {
            vec![$((stringify!($name), |s| Box::pin($name(s)))),*]
        }
    };
}

/// Generates one `#[tokio::test]` per scenario in the calling test file. `$fresh` is an async
/// expression giving `Option<Fixture>`; `None` skips (the store's helper says why, loudly).
#[macro_export]
macro_rules! scenario_tests {
    ($fresh:expr) => {
        $crate::__idemgate_scenarios!(@emit [tests { $fresh }]);
    };
}

__idemgate_scenarios!(@emit [list]);

fn assert_effects(h: &Harness, expected: usize, context: &str) {
    assert_eq!(
        h.downstream.effects(),
        expected,
        "{context}: the downstream counted {} effect(s) on its own side, expected {expected}",
        h.downstream.effects()
    );
}

async fn status_of(h: &Harness, step: &str) -> RecordStatus {
    h.record(step).await.expect("record exists").status()
}

// ---------------------------------------------------------------------------------------------
// Table one: same key, lost responses, crashes, races, mismatches.

pub async fn same_key_twice_one_effect(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::Applied, "{first:?}");
    assert!(!first.safe_to_repeat());
    let second = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(second.status, Status::Replayed, "{second:?}");
    assert_eq!(second.effect_reference, first.effect_reference);
    assert_eq!(second.result, first.result);
    assert_effects(&h, 1, "same key twice");
    assert_eq!(
        h.downstream.calls(),
        1,
        "the replay must not call the downstream"
    );
    // One effect reference, two request traces.
    assert_eq!(h.recorder.count(&key("s1")), 2);
    let kinds = h.event_kinds("s1").await;
    assert!(
        kinds.contains(&EventKind::Claimed) && kinds.contains(&EventKind::Acknowledged),
        "{kinds:?}"
    );
}

pub async fn lost_response_replays_by_receipt(store: Arc<dyn Store>) {
    for spec in [Spec::key_based(), Spec::key_based().dedup(false)] {
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = if spec.deduplicates {
            "dedup"
        } else {
            "lookup-only"
        };
        h.downstream.push_fault(Fault::CommitThenDrop);
        let first = h.deliver(&c, step, &ticket("Refund")).await;
        // The answer was lost after the commit; the receipt lookup by key recovers it in the
        // same delivery instead of guessing.
        assert_eq!(first.status, Status::Applied, "{step}: {first:?}");
        let retry = h.deliver(&c, step, &ticket("Refund")).await;
        assert_eq!(retry.status, Status::Replayed, "{step}: {retry:?}");
        assert_eq!(retry.effect_reference, first.effect_reference);
        assert_eq!(h.downstream.effects_for(&key(step)), 1, "{step}");
        assert_eq!(h.downstream.calls(), 1, "{step}: no second call was needed");
    }
}

pub async fn lost_response_without_lookup_resends_to_deduplicating_downstream(
    store: Arc<dyn Store>,
) {
    let spec = Spec::key_based().lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::CommitThenDrop);
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::Applied, "{first:?}");
    // The resend went out under the same key and the downstream recognised it.
    assert_eq!(h.downstream.calls(), 2);
    assert_effects(&h, 1, "resend under the same key");
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Replayed
    );
}

pub async fn lost_response_without_receipt_path_is_unknown(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false).lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::CommitThenDrop);
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::Unknown, "{first:?}");
    assert_eq!(first.next_action, NextAction::Reconcile);
    assert!(!first.safe_to_repeat());
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Unknown, "{retry:?}");
    assert_eq!(h.downstream.calls(), 1, "no blind second call");
    assert_effects(&h, 1, "unknown outcome");
    assert_eq!(status_of(&h, "s1").await, RecordStatus::Unknown);
}

/// Pauses the first delivery after the downstream committed, then drops it: a crash between
/// the downstream's success and the local completion.
async fn crash_after_commit(h: &Harness, c: &Arc<Contract>, step: &str) {
    h.downstream.after_commit().arm_nth(1);
    let worker = h.spawn_delivery("worker-crashing", c, step);
    h.downstream.after_commit().reached().await;
    worker.abort();
    let _ = worker.await;
    assert_eq!(
        h.downstream.effects_for(&key(step)),
        1,
        "the crashed worker's effect exists"
    );
    assert_eq!(status_of(h, step).await, RecordStatus::Pending);
}

pub async fn crash_after_downstream_commit_recovers_receipt(store: Arc<dyn Store>) {
    for spec in [Spec::key_based(), Spec::key_based().dedup(false)] {
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = if spec.deduplicates {
            "dedup"
        } else {
            "lookup-only"
        };
        crash_after_commit(&h, &c, step).await;
        // While the crashed worker's lease is live, a retry waits.
        let early = h.deliver(&c, step, &ticket("Refund")).await;
        assert_eq!(early.status, Status::InFlight, "{step}: {early:?}");
        assert_eq!(early.next_action, NextAction::Poll);
        h.expire_leases(&spec);
        let retry = h.deliver(&c, step, &ticket("Refund")).await;
        assert_eq!(retry.status, Status::Replayed, "{step}: {retry:?}");
        assert_eq!(
            retry.effect_reference.as_deref(),
            Some(
                h.downstream
                    .receipt_for(&key(step))
                    .unwrap()
                    .reference
                    .as_str()
            )
        );
        assert_eq!(
            h.downstream.effects_for(&key(step)),
            1,
            "{step}: no second effect"
        );
        assert!(h.event_kinds(step).await.contains(&EventKind::Recovered));
    }
}

pub async fn crash_after_downstream_commit_without_receipt_path_is_unknown(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false).lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    crash_after_commit(&h, &c, "s1").await;
    h.expire_leases(&spec);
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Unknown, "{retry:?}");
    assert_eq!(
        h.downstream.calls(),
        1,
        "the dispatch marker forbids a blind resend"
    );
    assert_effects(&h, 1, "crash after commit, no receipt path");
}

/// Pauses the first delivery right after its claim, then drops it: a crash after the claim.
async fn crash_after_claim(h: &Harness, c: &Arc<Contract>, step: &str) {
    h.store.after_claim().arm_nth(1);
    let worker = h.spawn_delivery("worker-crashing", c, step);
    h.store.after_claim().reached().await;
    worker.abort();
    let _ = worker.await;
    assert_eq!(status_of(h, step).await, RecordStatus::Pending);
}

/// A claim without the dispatch marker in it, dropped before the send, is taken over and run:
/// a deduplicating downstream's (which takes no marker: a resend under the key is safe), and a
/// claim under a duplicate-intent window (claimed first, the marker written after it). A new
/// claim of any other tool carries its marker: see `crash_after_a_marked_claim_is_never_sent_blindly`.
pub async fn crash_after_claim_recovers_by_execution(store: Arc<dyn Store>) {
    for spec in [
        Spec::key_based(),
        Spec::key_based().lookup(false),
        Spec::key_based().dedup(false).lookup(false).window("10m"),
    ] {
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s-{}-{}", spec.deduplicates, spec.receipt_lookup);
        crash_after_claim(&h, &c, &step).await;
        assert_effects(&h, 0, "crashed before the effect");
        h.expire_leases(&spec);
        let retry = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(retry.status, Status::Applied, "{step}: {retry:?}");
        assert_eq!(h.downstream.effects_for(&key(&step)), 1, "{step}");
        let record = h.record(&step).await.unwrap();
        assert_eq!(
            record.fence, 2,
            "{step}: the takeover grew the fencing token"
        );
    }
}

/// A new claim of a tool whose downstream does not deduplicate takes its dispatch marker with it: a
/// crash right after it leaves a record that says maybe sent, though nothing was. Without a
/// receipt that proves the effect, recovery never sends it again: `unknown`, for an operator.
pub async fn crash_after_a_marked_claim_is_never_sent_blindly(store: Arc<dyn Store>) {
    for spec in [
        Spec::key_based().dedup(false),
        Spec::key_based().dedup(false).lookup(false),
    ] {
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s-{}", spec.receipt_lookup);
        crash_after_claim(&h, &c, &step).await;
        let record = h.record(&step).await.unwrap();
        assert!(
            matches!(
                record.state,
                RecordState::Pending {
                    dispatch: Dispatch::Sent,
                    ..
                }
            ),
            "{step}: the claim carries the marker: {record:?}"
        );
        h.expire_leases(&spec);
        let retry = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(retry.status, Status::Unknown, "{step}: {retry:?}");
        assert!(!retry.safe_to_repeat(), "{step}: {retry:?}");
        assert_eq!(h.downstream.calls(), 0, "{step}: never sent blindly");
        assert_effects(&h, 0, "a crash after a marked claim");
        assert_eq!(status_of(&h, &step).await, RecordStatus::Unknown);
    }
}

/// A marked claim whose write fails: the delivery sent nothing and says so. Where the write did
/// not commit, nothing is left and the next delivery runs it. Where it did commit (an error
/// reported after the commit), the record says maybe sent: it is not released (the delivery
/// cannot tell it from an identical claim of another caller, which may have sent), so recovery
/// ends it `unknown` — never a send it cannot account for.
pub async fn failed_marked_claim_is_never_sent_blindly(store: Arc<dyn Store>) {
    for fault in [StoreFault::Before, StoreFault::AfterCommit] {
        let spec = Spec::key_based().dedup(false).lookup(false);
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s-{fault:?}");
        h.store.fail_write(1, fault);
        let o = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(h.store.faults_fired(), 1, "the claim was the faulted write");
        assert_eq!(o.status, Status::Rejected, "{fault:?}: {o:?}");
        assert_eq!(o.error_code(), Some(ErrorCode::StoreUnavailable), "{o:?}");
        assert!(o.error_code().unwrap().retryable(), "{fault:?}: {o:?}");
        assert_eq!(h.downstream.calls(), 0, "{fault:?}: nothing sent");
        h.expire_leases(&spec);
        let retry = h.deliver(&c, &step, &ticket("Refund")).await;
        match fault {
            StoreFault::Before => {
                assert_eq!(retry.status, Status::Applied, "{retry:?}");
                assert_effects(&h, 1, "the key's one effect");
            }
            StoreFault::AfterCommit => {
                assert_eq!(retry.status, Status::Unknown, "{retry:?}");
                assert_effects(&h, 0, "a committed marked claim is never sent blindly");
            }
        }
    }
}

struct OneTool(Arc<Contract>, Arc<FakeDownstream>);

impl Tools for OneTool {
    fn resolve(
        &self,
        tool: &str,
    ) -> Option<(Arc<Contract>, Arc<dyn idemgate_core::effect::Downstream>)> {
        (tool == self.0.name).then(|| (self.0.clone(), self.1.clone() as Arc<_>))
    }
}

pub async fn crash_after_claim_recovered_by_recoverer(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    for step in ["r1", "r2", "r3"] {
        crash_after_claim(&h, &c, step).await;
    }
    let recoverer = Recoverer::new(
        h.worker("recoverer"),
        Arc::new(OneTool(c.clone(), Arc::new(h.downstream.clone()))),
        ENVIRONMENT,
    );
    let before = recoverer.run_once().await.unwrap();
    assert_eq!(before.examined, 0, "live leases are not recovered");
    h.expire_leases(&spec);
    let report = recoverer.run_once().await.unwrap();
    assert_eq!(report.examined, 3, "{report:?}");
    assert_eq!(report.outcomes.get("applied"), Some(&3), "{report:?}");
    for step in ["r1", "r2", "r3"] {
        assert_eq!(status_of(&h, step).await, RecordStatus::Applied);
        assert_eq!(h.downstream.effects_for(&key(step)), 1);
        assert_eq!(
            h.deliver(&c, step, &ticket("Refund")).await.status,
            Status::Replayed
        );
    }
    assert_effects(&h, 3, "recoverer");
    assert_eq!(
        recoverer.run_once().await.unwrap().examined,
        0,
        "nothing left pending"
    );
}

pub async fn concurrent_workers_one_owner(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    // Worker A claims and is paused right after its claim.
    h.store.after_claim().arm_nth(1);
    let a = h.spawn_delivery("worker-a2", &c, "s1");
    h.store.after_claim().reached().await;
    // Worker B arrives while A owns the claim: it waits, and performs nothing.
    let b = h
        .worker("worker-b")
        .execute(&c, &op("s1"), &ticket("Refund"), &h.downstream)
        .await;
    assert_eq!(b.status, Status::InFlight, "{b:?}");
    assert_eq!(b.next_action, NextAction::Poll);
    assert!(b.retry_after_seconds.is_some());
    assert_effects(&h, 0, "B must not perform while A owns the claim");
    h.store.after_claim().release();
    let a = a.await.unwrap();
    assert_eq!(a.status, Status::Applied, "{a:?}");
    let b = h
        .worker("worker-b")
        .execute(&c, &op("s1"), &ticket("Refund"), &h.downstream)
        .await;
    assert_eq!(b.status, Status::Replayed, "{b:?}");
    assert_effects(&h, 1, "two workers");
}

pub async fn simultaneous_deliveries_one_effect(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (exec, c, ds) = (
            h.worker(&format!("worker-{i}")),
            c.clone(),
            h.downstream.clone(),
        );
        tasks.push(tokio::spawn(async move {
            exec.execute(&c, &op("s1"), &ticket("Refund"), &ds).await
        }));
    }
    let mut applied = 0;
    for t in tasks {
        let o = t.await.unwrap();
        match o.status {
            Status::Applied => applied += 1,
            Status::InFlight | Status::Replayed => {}
            other => panic!("unexpected {other:?}: {o:?}"),
        }
    }
    assert_eq!(applied, 1, "exactly one delivery performs the effect");
    assert_effects(&h, 1, "16 simultaneous deliveries");
}

pub async fn changed_fingerprint_rejected_without_effect(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let first = h.deliver(&c, "s1", &ticket("Refund for order 42")).await;
    assert_eq!(first.status, Status::Applied);
    let before = h.record("s1").await.unwrap();
    let changed = h.deliver(&c, "s1", &ticket("Refund for order 43")).await;
    assert_eq!(changed.status, Status::Rejected, "{changed:?}");
    assert_eq!(
        changed.error_code(),
        Some(ErrorCode::IdempotencyKeyReusedWithDifferentRequest)
    );
    assert_eq!(changed.next_action, NextAction::InspectOperation);
    assert!(changed.result.is_none(), "a mismatch hands out nothing");
    assert!(
        !changed.error.as_ref().unwrap().message.contains("order 43"),
        "no body echoed"
    );
    assert_eq!(h.record("s1").await.unwrap(), before, "nothing updated");
    assert_effects(&h, 1, "changed fingerprint");
    // Whitespace the contract trims and a non-material field do not change the fingerprint.
    let mut same = ticket("  Refund for order 42 ");
    same["trace_id"] = json!("trace-9");
    assert_eq!(h.deliver(&c, "s1", &same).await.status, Status::Replayed);
}

pub async fn new_key_same_arguments_is_a_new_operation(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let a = h.deliver(&c, "s1", &ticket("Refund")).await;
    let b = h.deliver(&c, "s2", &ticket("Refund")).await;
    assert_eq!((a.status, b.status), (Status::Applied, Status::Applied));
    assert_ne!(a.effect_reference, b.effect_reference);
    assert_effects(&h, 2, "two intended operations");
    assert!(h.record("s1").await.is_some() && h.record("s2").await.is_some());
}

pub async fn duplicate_intent_window_flags_new_key(store: Arc<dyn Store>) {
    let spec = Spec::key_based().window("10m");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Applied
    );
    let again = h.deliver(&c, "s2", &ticket("Refund")).await;
    assert_eq!(again.status, Status::Rejected, "{again:?}");
    assert_eq!(again.error_code(), Some(ErrorCode::PossibleDuplicateIntent));
    assert_eq!(again.next_action, NextAction::AskForApproval);
    assert!(
        !again.safe_to_repeat(),
        "the same request already ran: not safe to repeat"
    );
    // Held for an operator, not dropped: asking for approval leads somewhere.
    assert_eq!(status_of(&h, "s2").await, RecordStatus::AwaitingApproval);
    let repeat = h.deliver(&c, "s2", &ticket("Refund")).await;
    assert_eq!(
        (repeat.status, repeat.next_action),
        (Status::InFlight, NextAction::AskForApproval)
    );
    assert_effects(&h, 1, "duplicate intent held");
    let approved = h
        .executor
        .approve(
            &c,
            &key("s2"),
            "operator-7",
            "approved by a test",
            None,
            &h.downstream,
        )
        .await
        .expect("the held duplicate can be approved");
    assert_eq!(approved.status, Status::Applied, "{approved:?}");
    assert_effects(&h, 2, "a second effect an operator approved");
    h.clock.advance(11 * 60 * 1000);
    assert_eq!(
        h.deliver(&c, "s3", &ticket("Refund")).await.status,
        Status::Applied
    );
    assert_effects(&h, 3, "after the window");
}

pub async fn revoked_authorization_denies_retry(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Applied
    );
    h.auth.set(Authorization::Denied(
        "agent-1 lost access to queue support".into(),
    ));
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Rejected, "{retry:?}");
    assert_eq!(retry.error_code(), Some(ErrorCode::Forbidden));
    assert!(
        retry.result.is_none() && retry.effect_reference.is_none(),
        "no stored result leaks"
    );
    // An unreachable hook is no permission either.
    h.auth
        .set(Authorization::Unavailable("hook timed out".into()));
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(
        retry.error_code(),
        Some(ErrorCode::AuthorizationUnavailable)
    );
    assert_effects(&h, 1, "revoked authorization");
}

pub async fn authorization_checked_before_first_effect(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.auth.set(Authorization::Denied("no access".into()));
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.error_code(), Some(ErrorCode::Forbidden));
    assert!(
        h.record("s1").await.is_none(),
        "a refused delivery leaves no record"
    );
    assert_effects(&h, 0, "unauthorized");
    h.auth.set(Authorization::Allowed);
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Applied
    );
}

async fn after_retention(
    store: Arc<dyn Store>,
    policy: &'static str,
) -> (Harness, Arc<Contract>, String) {
    let spec = Spec::key_based().late_arrival(policy);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::Applied);
    // Past record_ttl but not yet swept: the answer already follows the policy.
    h.clock.advance(3_600_000 + 1);
    let unswept = h.deliver(&c, "s1", &ticket("Refund")).await;
    let report = h.executor.sweep(ENVIRONMENT, 100).await.unwrap();
    assert_eq!(report.compacted, 1, "{report:?}");
    let record = h.record("s1").await.unwrap();
    assert!(
        matches!(record.state, RecordState::Tombstone(_)),
        "{record:?}"
    );
    assert!(
        record.request.is_none(),
        "a tombstone keeps no request body"
    );
    let swept = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(
        unswept.status, swept.status,
        "policy applies before and after the sweep"
    );
    assert_effects(&h, 1, policy);
    assert!(h.event_kinds("s1").await.contains(&EventKind::Expired));
    (h, c, first.effect_reference.unwrap())
}

pub async fn key_after_retention_follows_reject_policy(store: Arc<dyn Store>) {
    let (h, c, _) = after_retention(store, "reject").await;
    let late = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(late.status, Status::Rejected, "{late:?}");
    assert_eq!(late.error_code(), Some(ErrorCode::ExpiredOperation));
    assert_effects(&h, 1, "late arrival under the reject policy");
    // After the tombstone itself is purged the record is gone, as the contract's retention says.
    h.clock.advance(86_400_000 + 1);
    assert_eq!(h.executor.sweep(ENVIRONMENT, 100).await.unwrap().purged, 1);
    assert!(h.record("s1").await.is_none());
}

pub async fn key_after_retention_follows_tombstone_policy(store: Arc<dyn Store>) {
    let (h, c, reference) = after_retention(store, "tombstone").await;
    let late = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(late.status, Status::Replayed, "{late:?}");
    assert_eq!(late.effect_reference.as_deref(), Some(reference.as_str()));
    assert!(late.result.is_none(), "only the reference is kept");
    assert_eq!(late.error_code(), Some(ErrorCode::ExpiredOperation));
    assert_effects(&h, 1, "late arrival under the tombstone policy");
}

pub async fn key_after_retention_follows_reconcile_policy(store: Arc<dyn Store>) {
    let (h, c, _) = after_retention(store, "reconcile").await;
    let late = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(late.status, Status::Unknown, "{late:?}");
    assert_eq!(late.next_action, NextAction::Reconcile);
    assert_eq!(late.error_code(), Some(ErrorCode::ExpiredOperation));
    assert_effects(&h, 1, "late arrival under the reconcile policy");
}

pub async fn delayed_job_is_polled_to_completion(store: Arc<dyn Store>) {
    let spec = Spec::key_based().jobs();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::AcceptJob);
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::InFlight, "{first:?}");
    assert_eq!(first.next_action, NextAction::Poll);
    let job = h.downstream.job_ids().pop().expect("a job was accepted");
    // Polling while it runs: still in flight, and no second job submitted.
    let poll = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(poll.status, Status::InFlight, "{poll:?}");
    assert_eq!(
        h.downstream.job_ids().len(),
        1,
        "no duplicate job submission"
    );
    assert_eq!(h.downstream.calls(), 1);
    let receipt = h.downstream.complete_job(&job);
    // The status poll target advances the job by itself.
    let Some(StatusRead::Found { record, outcome }) = h
        .executor
        .status(Some(&c), &key("s1"), Some(&h.downstream), &op("s1").caller)
        .await
        .unwrap()
    else {
        panic!("the status read finds the operation");
    };
    assert_eq!(record.status(), RecordStatus::Applied);
    assert_eq!(
        outcome.effect_reference.as_deref(),
        Some(receipt.reference.as_str())
    );
    let done = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(done.status, Status::Replayed, "{done:?}");
    assert_effects(&h, 1, "delayed job");
}

pub async fn failed_job_is_replayed_as_refusal(store: Arc<dyn Store>) {
    let spec = Spec::key_based().jobs();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::AcceptJob);
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::InFlight
    );
    let job = h.downstream.job_ids().pop().unwrap();
    h.downstream.fail_job(&job, "queue closed");
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Rejected, "{o:?}");
    let again = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(again.error_code(), o.error_code());
    assert_eq!(status_of(&h, "s1").await, RecordStatus::FailedPermanent);
    assert_effects(&h, 0, "failed job");
}

pub async fn malformed_result_is_never_success(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false).lookup(false);
    let h = Harness::for_spec(store.clone(), &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::Malformed);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Unknown, "{o:?}");
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Unknown
    );
    assert_eq!(h.downstream.calls(), 1);
    assert_effects(&h, 1, "malformed answer");
    // With a receipt lookup the same fault resolves to the authoritative receipt.
    let spec = Spec::key_based().dedup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::CommitThenFail);
    let o = h.deliver(&c, "s2", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Applied, "{o:?}");
    assert_eq!(
        o.effect_reference.as_deref(),
        Some(
            h.downstream
                .receipt_for(&key("s2"))
                .unwrap()
                .reference
                .as_str()
        )
    );
    assert_effects(&h, 1, "500 after commit");
}

pub async fn timeout_without_commit_reconciled_not_applied(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::Timeout);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    // A timeout proves nothing: the receipt is not there, but the request may still land.
    assert_eq!(o.status, Status::Unknown, "{o:?}");
    assert_effects(&h, 0, "timeout before arrival");
    let queue = h
        .store
        .inner()
        .list(idemgate_core::store::Filter {
            status: Some(RecordStatus::Unknown),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(queue.len(), 1, "the reconciliation queue holds it");
    // Reconcile without a body: the lookup still finds nothing, so it stays unknown.
    let still = h
        .executor
        .reconcile(
            &c,
            &key("s1"),
            None,
            "operator-1",
            "looked up by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(still.status, Status::Unknown);
    // The operator checked the system of record: not applied. The key may run again.
    h.executor
        .reconcile(
            &c,
            &key("s1"),
            Some(Resolution::NotApplied),
            "operator-1",
            "resolved by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Applied, "{retry:?}");
    assert_effects(&h, 1, "not applied, then run");
    let events = h.store.inner().events(&key("s1")).await.unwrap();
    assert!(
        events.iter().any(|e| e.kind == EventKind::Reconciled
            && e.detail
                .as_deref()
                .is_some_and(|d| d.contains("operator-1"))),
        "the resolution is recorded with its actor: {events:?}"
    );
}

pub async fn refusal_replayed_as_same_refusal(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::Refuse {
        code: ErrorCode::DownstreamRejected,
        message: "queue is closed".into(),
    });
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Rejected);
    assert_eq!(o.error_code(), Some(ErrorCode::DownstreamRejected));
    let again = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(again.error, o.error, "the same refusal, replayed");
    assert_eq!(h.downstream.calls(), 1);
    assert_effects(&h, 0, "refusal");
}

pub async fn not_sent_releases_claim(store: Arc<dyn Store>) {
    for spec in [
        Spec::key_based(),
        Spec::key_based().dedup(false).lookup(false),
    ] {
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s-{}", spec.deduplicates);
        h.downstream.push_fault(Fault::NotSent);
        let o = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(o.status, Status::Rejected, "{o:?}");
        assert_eq!(o.error_code(), Some(ErrorCode::DownstreamUnavailable));
        assert!(o.retry_after_seconds.is_some());
        // Released at once: the retry runs without waiting for a lease.
        let retry = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(retry.status, Status::Applied, "{retry:?}");
        assert_eq!(h.downstream.effects_for(&key(&step)), 1);
    }
}

/// A release whose write fails proves nothing for the key: the claim may still be pending under
/// this attempt's lease, and recovery sends it once the lease expires. So the answer may not say
/// `safe_to_repeat` — here the key does get its effect afterwards, from the recoverer.
pub async fn unwritten_release_is_not_safe_to_repeat(store: Arc<dyn Store>) {
    for fault in [StoreFault::Before, StoreFault::AfterCommit] {
        let spec = Spec::key_based();
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s-{fault:?}");
        h.downstream.push_fault(Fault::NotSent);
        // Write 1 is the claim, write 2 the release.
        h.store.fail_write(2, fault);
        let o = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(
            h.store.faults_fired(),
            1,
            "the release was the faulted write"
        );
        assert!(!o.safe_to_repeat(), "{fault:?}: {o:?}");
        assert_eq!(o.status, Status::InFlight, "{fault:?}: {o:?}");
        assert_eq!(o.next_action, NextAction::Poll);
        assert_effects(&h, 0, "nothing sent yet");
        h.expire_leases(&spec);
        recoverer_for(&h, &c).run_once().await.unwrap();
        let again = h.deliver(&c, &step, &ticket("Refund")).await;
        match fault {
            // Unwritten: the claim stayed owned, the recoverer took it over and sent it.
            StoreFault::Before => {
                assert_eq!(again.status, Status::Replayed, "{again:?}");
            }
            // Written: released, left to a new delivery, which runs it.
            StoreFault::AfterCommit => {
                assert_eq!(again.status, Status::Applied, "{again:?}");
            }
        }
        assert_effects(&h, 1, "the key's one effect");
    }
}

pub async fn store_down_before_claim_leaves_nothing(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.store.fail_write(1, StoreFault::Before);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Rejected, "{o:?}");
    assert_eq!(o.error_code(), Some(ErrorCode::StoreUnavailable));
    assert!(o.error_code().unwrap().retryable());
    assert!(h.record("s1").await.is_none());
    assert_effects(&h, 0, "store down");
    // The whole store down: on the claim-first path a delivery reads nothing before its
    // claim, so an outage of reads alone would not stop it (nor should it).
    h.store.fail_all_reads(true);
    h.store.fail_all_writes(true);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.error_code(), Some(ErrorCode::StoreUnavailable));
    assert!(h.record("s1").await.is_none());
    assert_effects(&h, 0, "store down");
    h.store.heal();
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Applied
    );
    assert_effects(&h, 1, "after the outage");
}

/// The write that records the receipt: the claim, then the completion. (Where the downstream
/// deduplicates, the completion carries the `sent` trace entry; where it does not, the claim
/// carries the dispatch marker.)
const COMPLETION_WRITE: u64 = 2;

pub async fn store_error_after_completion_commit_replays(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.store
        .fail_write(COMPLETION_WRITE, StoreFault::AfterCommit);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    // The completion committed, but the executor was told it failed: it must not say applied.
    assert_eq!(o.status, Status::Unknown, "{o:?}");
    assert!(
        o.effect_reference.is_some(),
        "the reference it holds is reported"
    );
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Replayed, "{retry:?}");
    assert_effects(&h, 1, "completion committed then reported failed");
}

pub async fn store_error_before_completion_recovers_receipt(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.store.fail_write(COMPLETION_WRITE, StoreFault::Before);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Unknown, "{o:?}");
    assert_eq!(status_of(&h, "s1").await, RecordStatus::Pending);
    h.expire_leases(&spec);
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Replayed, "{retry:?}");
    assert_eq!(h.downstream.calls(), 1);
    assert_effects(&h, 1, "completion lost, receipt recovered");
}

pub async fn late_finisher_is_fenced(store: Arc<dyn Store>) {
    // A deduplicating downstream without lookup: the takeover resends under the same key.
    let spec = Spec::key_based().lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.after_commit().arm_nth(1);
    let a = h.spawn_delivery("worker-slow", &c, "s1");
    h.downstream.after_commit().reached().await;
    // A's lease expires while it is paused; B takes over (fence 2) and resends.
    h.expire_leases(&spec);
    let b = h
        .worker("worker-b")
        .execute(&c, &op("s1"), &ticket("Refund"), &h.downstream)
        .await;
    assert_eq!(b.status, Status::Applied, "{b:?}");
    let after_b = h.record("s1").await.unwrap();
    assert_eq!(after_b.fence, 2);
    // A finishes late with fence 1: its completion must not overwrite B's record.
    h.downstream.after_commit().release();
    let a = a.await.unwrap();
    assert_eq!(a.status, Status::Replayed, "{a:?}");
    let after_a = h.record("s1").await.unwrap();
    assert_eq!(after_a.fence, 2, "the late finisher did not write");
    assert_eq!(after_a.state, after_b.state);
    assert_effects(&h, 1, "late finisher");
}

pub async fn approval_gates_the_effect(store: Arc<dyn Store>) {
    let spec = Spec::key_based().class("irreversible").approval("default");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::InFlight, "{o:?}");
    assert_eq!(o.next_action, NextAction::AskForApproval);
    assert_effects(&h, 0, "awaiting approval");
    // A changed call never inherits the pending approval.
    let changed = h.deliver(&c, "s1", &ticket("Refund twice")).await;
    assert_eq!(
        changed.error_code(),
        Some(ErrorCode::IdempotencyKeyReusedWithDifferentRequest)
    );
    let fp = h.record("s1").await.unwrap().fingerprint;
    let approved = h
        .executor
        .approve(
            &c,
            &key("s1"),
            "operator-7",
            "approved by a test",
            Some(&fp),
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(approved.status, Status::Applied, "{approved:?}");
    assert_eq!(
        h.record("s1").await.unwrap().approved_by.as_deref(),
        Some("operator-7")
    );
    // Single use: a second approval finds nothing to approve.
    assert!(
        h.executor
            .approve(
                &c,
                &key("s1"),
                "operator-7",
                "approved by a test",
                None,
                &h.downstream
            )
            .await
            .is_err()
    );
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Replayed
    );
    assert_effects(&h, 1, "approved");
    // Authorization is rechecked for the original caller when the approval executes.
    let o = h.deliver(&c, "s2", &ticket("Refund")).await;
    assert_eq!(o.next_action, NextAction::AskForApproval);
    h.auth.set(Authorization::Denied("revoked".into()));
    let denied = h
        .executor
        .approve(
            &c,
            &key("s2"),
            "operator-7",
            "approved by a test",
            None,
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(denied.error_code(), Some(ErrorCode::Forbidden));
    assert_effects(&h, 1, "approval after revoked authorization");
}

pub async fn denied_approval_is_final(store: Arc<dyn Store>) {
    let spec = Spec::key_based().class("irreversible").approval("default");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::InFlight
    );
    let denied = h
        .executor
        .deny(&c, &key("s1"), "operator-7", "not this customer")
        .await
        .unwrap();
    assert_eq!(denied.error_code(), Some(ErrorCode::ApprovalDenied));
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Rejected);
    assert_eq!(retry.error_code(), Some(ErrorCode::ApprovalDenied));
    assert!(
        h.executor
            .approve(
                &c,
                &key("s1"),
                "operator-7",
                "approved by a test",
                None,
                &h.downstream
            )
            .await
            .is_err()
    );
    assert_effects(&h, 0, "denied");
}

pub async fn older_version_applied_record_replays(store: Arc<dyn Store>) {
    let v1 = Spec::key_based().version("v1");
    let h = Harness::for_spec(store, &v1);
    let first = h.deliver(&v1.contract(), "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::Applied);
    let v2 = v1.clone().version("v2").contract();
    let replay = h.deliver(&v2, "s1", &ticket("Refund")).await;
    assert_eq!(replay.status, Status::Replayed, "{replay:?}");
    assert_eq!(replay.effect_reference, first.effect_reference);
    let changed = h.deliver(&v2, "s1", &ticket("Other")).await;
    assert_eq!(
        changed.error_code(),
        Some(ErrorCode::IdempotencyKeyReusedWithDifferentRequest)
    );
    assert_effects(&h, 1, "older version replay");
}

pub async fn older_version_pending_record_is_not_driven(store: Arc<dyn Store>) {
    let v1 = Spec::key_based().version("v1").dedup(false).lookup(false);
    let h = Harness::for_spec(store, &v1);
    crash_after_claim(&h, &v1.contract(), "s1").await;
    h.expire_leases(&v1);
    // Newer code meets a pending record of v1 with nothing sent: it still does not execute it.
    let v2 = v1.clone().version("v2").contract();
    let o = h.deliver(&v2, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Unknown, "{o:?}");
    assert_effects(&h, 0, "older pending record");
}

pub async fn read_takes_no_claim(store: Arc<dyn Store>) {
    let spec = Spec::key_based().class("read");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let o = h.deliver(&c, "s1", &json!({"subject": "status"})).await;
    assert_eq!(o.status, Status::Applied, "{o:?}");
    assert!(o.safe_to_repeat());
    assert!(h.record("s1").await.is_none(), "a read is never recorded");
    h.auth.set(Authorization::Denied("no".into()));
    let o = h.deliver(&c, "s1", &json!({"subject": "status"})).await;
    assert_eq!(o.error_code(), Some(ErrorCode::Forbidden));
    assert_eq!(
        h.downstream.calls(),
        1,
        "authorization still applies to reads"
    );
}

pub async fn natural_idempotent_precondition_failure_is_released(store: Arc<dyn Store>) {
    let spec = Spec::key_based().class("natural_idempotent");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::PreconditionFailed);
    let mut args = ticket("closed");
    args["expected_version"] = json!(7);
    let o = h.deliver(&c, "s1", &args).await;
    assert_eq!(o.error_code(), Some(ErrorCode::PreconditionFailed), "{o:?}");
    assert_effects(&h, 0, "precondition failed");
    // Without a key the same tool still runs, with no record.
    let mut unkeyed = op("x");
    unkeyed.workflow_id = None;
    unkeyed.step_id = None;
    let o = h.executor.execute(&c, &unkeyed, &args, &h.downstream).await;
    assert_eq!(o.status, Status::Applied, "{o:?}");
    assert!(o.safe_to_repeat());
    assert_effects(&h, 1, "unkeyed natural idempotent");
}

pub async fn invalid_input_leaves_no_record(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let writes = h.store.writes();
    let bad = h
        .deliver(&c, "s1", &json!({"subject": "", "secret": "hunter2"}))
        .await;
    assert_eq!(
        bad.error_code(),
        Some(ErrorCode::InvalidArguments),
        "{bad:?}"
    );
    assert!(
        !bad.error.as_ref().unwrap().message.contains("hunter2"),
        "no value echoed"
    );
    let mut no_key = op("s1");
    no_key.step_id = None;
    no_key.workflow_id = None;
    let o = h
        .executor
        .execute(&c, &no_key, &ticket("Refund"), &h.downstream)
        .await;
    assert_eq!(o.error_code(), Some(ErrorCode::MissingOperationKey));
    let mut half_key = op("s1");
    half_key.step_id = None;
    let o = h
        .executor
        .execute(&c, &half_key, &ticket("Refund"), &h.downstream)
        .await;
    assert_eq!(
        o.error_code(),
        Some(ErrorCode::MissingOperationKey),
        "{o:?}"
    );
    assert!(o.error.unwrap().message.contains("step_id"));
    let bad_key = h.deliver(&c, "step:with:colons", &ticket("Refund")).await;
    assert_eq!(bad_key.error_code(), Some(ErrorCode::InvalidOperationKey));
    let big = h
        .deliver(
            &c,
            "s1",
            &json!({"subject": "x", "body": "y", "queue_id": "q", "trace_id": "t"}),
        )
        .await;
    assert_eq!(
        big.status,
        Status::Applied,
        "a valid call after the bad ones"
    );
    assert_eq!(
        h.store.writes() - writes,
        2,
        "only the valid call wrote (claim, completion)"
    );
    assert_effects(&h, 1, "invalid input");
}

pub async fn replay_never_writes(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Applied
    );
    let writes = h.store.writes();
    for _ in 0..5 {
        assert_eq!(
            h.deliver(&c, "s1", &ticket("Refund")).await.status,
            Status::Replayed
        );
    }
    assert_eq!(h.store.writes(), writes, "replays wrote to the store");
    assert_effects(&h, 1, "replays");
}

pub async fn settled_replays_read_no_row_until_near_expiry(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::Applied, "{first:?}");
    // Asked for the record: a read, or on the claim-first path a claim that meets it.
    let consulted = |h: &Harness| h.store.reads() + h.store.counts().claim;
    let reads = consulted(&h);
    for _ in 0..5 {
        let again = h.deliver(&c, "s1", &ticket("Refund")).await;
        assert_eq!(again.status, Status::Replayed, "{again:?}");
        assert_eq!(again.effect_reference, first.effect_reference);
        assert_eq!(again.result, first.result);
    }
    assert_eq!(
        consulted(&h),
        reads,
        "a settled record this executor finished was read again"
    );
    // A changed request under the key is still compared with the kept record and refused.
    let changed = h.deliver(&c, "s1", &ticket("Chargeback")).await;
    assert_eq!(changed.status, Status::Rejected, "{changed:?}");
    assert_eq!(
        changed.error_code(),
        Some(ErrorCode::IdempotencyKeyReusedWithDifferentRequest)
    );
    // Within the margin before expiry the store is read again, so that the retention policy
    // (and another process's sweep) decide the late deliveries.
    h.clock
        .advance(3_600_000 - idemgate_engine::settled::MARGIN);
    let late = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(late.status, Status::Replayed, "{late:?}");
    assert!(consulted(&h) > reads, "the store was not read near expiry");
    assert_effects(&h, 1, "settled replays");
}

pub async fn operator_resolves_unknown_as_applied(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false).lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::CommitThenDrop);
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Unknown
    );
    let err = h
        .executor
        .reconcile(
            &c,
            &key("s1"),
            None,
            "operator-1",
            "looked up by a test",
            &h.downstream,
        )
        .await;
    assert!(
        err.is_err(),
        "no receipt lookup: reconciliation needs a resolution"
    );
    let reference = h.downstream.receipt_for(&key("s1")).unwrap().reference;
    let o = h
        .executor
        .reconcile(
            &c,
            &key("s1"),
            Some(Resolution::Applied {
                reference: reference.clone(),
                result: json!({"ticket_id": reference}),
            }),
            "operator-1",
            "resolved by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(o.status, Status::Replayed, "{o:?}");
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Replayed);
    assert_eq!(retry.effect_reference.as_deref(), Some(reference.as_str()));
    assert_effects(&h, 1, "resolved as applied");
    // A pause long enough to prove nothing runs in the background on its own.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(h.downstream.calls(), 1);
}

// ---------------------------------------------------------------------------------------------
// The paths between the tables: each guards a defect found by reading the code between the
// scenarios above, and counts effects on the downstream's own side.

fn recoverer_for(h: &Harness, c: &Arc<Contract>) -> Recoverer {
    Recoverer::new(
        h.worker("recoverer"),
        Arc::new(OneTool(c.clone(), Arc::new(h.downstream.clone()))),
        ENVIRONMENT,
    )
}

fn denied() -> Authorization {
    Authorization::Denied("the actor was revoked".into())
}

/// An approval whose authorization recheck is denied releases the claim; the recoverer never
/// sends it, and only a new, authorized delivery runs it.
pub async fn approval_denied_by_the_recheck_is_not_sent_by_the_recoverer(store: Arc<dyn Store>) {
    let spec = Spec::key_based().approval("always");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let recoverer = recoverer_for(&h, &c);
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.next_action,
        NextAction::AskForApproval
    );
    h.auth.set(denied());
    let approved = h
        .executor
        .approve(
            &c,
            &key("s1"),
            "operator-7",
            "approved by a test",
            None,
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(
        approved.error_code(),
        Some(ErrorCode::Forbidden),
        "{approved:?}"
    );
    assert!(approved.safe_to_repeat(), "nothing was sent");
    for _ in 0..3 {
        h.expire_leases(&spec);
        recoverer.run_once().await.unwrap();
    }
    assert_effects(&h, 0, "denied at approval, then the recoverer's passes");
    // Still denied: a new delivery is refused too.
    let again = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(again.error_code(), Some(ErrorCode::Forbidden), "{again:?}");
    assert_effects(&h, 0, "a new delivery while denied");
    // Allowed again: a new delivery runs it, once.
    h.auth.set(Authorization::Allowed);
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Applied, "{retry:?}");
    assert_effects(&h, 1, "a new authorized delivery");
}

/// A claim released after a refused connection (or 408/425/429) is run again only by a new
/// delivery: the recoverer leaves it alone, whether or not the actor is still allowed.
pub async fn released_claim_is_run_only_by_a_new_delivery(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let recoverer = recoverer_for(&h, &c);
    h.downstream.push_fault(Fault::NotSent);
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.error_code(), Some(ErrorCode::DownstreamUnavailable));
    h.auth.set(denied());
    for _ in 0..3 {
        h.expire_leases(&spec);
        recoverer.run_once().await.unwrap();
    }
    h.auth.set(Authorization::Allowed);
    recoverer.run_once().await.unwrap();
    assert_effects(&h, 0, "a released claim and the recoverer");
    assert_eq!(status_of(&h, "s1").await, RecordStatus::Pending);
    let retry = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(retry.status, Status::Applied, "{retry:?}");
    assert_effects(&h, 1, "the new delivery");
}

/// An operator's `not_applied` lets the key run again — by a new delivery, authorized afresh;
/// never by the recoverer for a revoked actor.
pub async fn not_applied_with_a_revoked_actor_is_never_sent(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false).lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let recoverer = recoverer_for(&h, &c);
    h.downstream.push_fault(Fault::Timeout);
    let first = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(first.status, Status::Unknown, "{first:?}");
    h.auth.set(denied());
    h.executor
        .reconcile(
            &c,
            &key("s1"),
            Some(Resolution::NotApplied),
            "operator-7",
            "resolved by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    for _ in 0..3 {
        h.expire_leases(&spec);
        recoverer.run_once().await.unwrap();
    }
    let again = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(again.error_code(), Some(ErrorCode::Forbidden), "{again:?}");
    assert_effects(&h, 0, "not applied, actor revoked");
}

/// The recoverer rechecks the recorded actor before it sends an abandoned claim.
pub async fn recovery_rechecks_the_recorded_actor(store: Arc<dyn Store>) {
    // Without deduplication and without the marker (a claim under a duplicate-intent window is
    // marked after it): nothing was sent, so a denied recheck releases the claim. With
    // deduplication: it may have been sent, so a denied recheck cannot resend and ends unknown.
    for (spec, ends) in [
        (
            Spec::key_based().dedup(false).lookup(false).window("10m"),
            RecordStatus::Pending,
        ),
        (Spec::key_based().lookup(false), RecordStatus::Unknown),
    ] {
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s-{}", spec.deduplicates);
        crash_after_claim(&h, &c, &step).await;
        h.auth.set(denied());
        h.expire_leases(&spec);
        recoverer_for(&h, &c).run_once().await.unwrap();
        assert_eq!(h.downstream.effects_for(&key(&step)), 0, "{step}");
        assert_eq!(h.downstream.calls(), 0, "{step}: nothing was sent");
        assert_eq!(status_of(&h, &step).await, ends, "{step}");
        if ends == RecordStatus::Pending {
            let lease = h.record(&step).await.unwrap();
            assert_eq!(
                lease.lease().and_then(|l| l.owner.clone()),
                None,
                "released"
            );
        }
    }
}

/// An approval that nobody gives is never compacted into a tombstone: it expires as a refusal
/// (nothing ran), and a late delivery never hears `replayed`, under any late-arrival policy.
pub async fn expired_approval_is_refused_never_replayed(store: Arc<dyn Store>) {
    for policy in ["tombstone", "reject", "reconcile"] {
        let spec = Spec::key_based().approval("always").late_arrival(policy);
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s-{policy}");
        h.deliver(&c, &step, &ticket("Refund")).await;
        // Past the record's retention, before its approval window (1h) ends: still waiting.
        h.clock.advance(30 * 60 * 1000);
        h.executor.sweep(ENVIRONMENT, 100).await.unwrap();
        assert_eq!(
            status_of(&h, &step).await,
            RecordStatus::AwaitingApproval,
            "{policy}"
        );
        // Past the window: the recoverer expires it.
        h.clock.advance(31 * 60 * 1000);
        recoverer_for(&h, &c).run_once().await.unwrap();
        let late = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(late.status, Status::Rejected, "{policy}: {late:?}");
        assert_eq!(
            late.error_code(),
            Some(ErrorCode::ApprovalExpired),
            "{policy}"
        );
        assert!(late.effect_reference.is_none());
        // Compacted and past every retention: still not replayed.
        h.clock.advance(2 * 3_600_000);
        h.executor.sweep(ENVIRONMENT, 100).await.unwrap();
        assert_eq!(
            status_of(&h, &step).await,
            RecordStatus::Tombstone,
            "{policy}"
        );
        let later = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(later.status, Status::Rejected, "{policy}: {later:?}");
        assert_eq!(
            later.error_code(),
            Some(ErrorCode::ApprovalExpired),
            "{policy}"
        );
        assert!(later.effect_reference.is_none(), "{policy}");
        assert_effects(&h, 0, "an approval nobody gave");
    }
}

/// `expired_operation` for an effect that happened is not safe to repeat.
pub async fn late_delivery_for_an_applied_effect_is_not_safe_to_repeat(store: Arc<dyn Store>) {
    let (h, c, reference) = after_retention(store, "reject").await;
    let late = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(late.error_code(), Some(ErrorCode::ExpiredOperation));
    assert!(!late.safe_to_repeat(), "the effect happened: {late:?}");
    assert_eq!(late.effect_reference.as_deref(), Some(reference.as_str()));
    assert_effects(&h, 1, "late arrival");
}

/// A downstream commits, the answer is lost, and the resend under the same key is refused: the
/// refusal is no proof the first attempt did not commit. Without a receipt: `unknown`.
pub async fn refused_resend_after_a_lost_answer_is_unknown(store: Arc<dyn Store>) {
    let refusals = [
        Fault::Refuse {
            code: ErrorCode::DownstreamRejected,
            message: "downstream answered 422 Unprocessable Entity".into(),
        },
        Fault::PreconditionFailed,
    ];
    for (i, refusal) in refusals.into_iter().enumerate() {
        let spec = Spec::key_based().lookup(false);
        let h = Harness::for_spec(store.clone(), &spec);
        let c = spec.contract();
        let step = format!("s{i}");
        h.downstream.push_faults([Fault::CommitThenDrop, refusal]);
        let o = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(o.status, Status::Unknown, "{o:?}");
        assert!(!o.safe_to_repeat());
        assert_eq!(status_of(&h, &step).await, RecordStatus::Unknown);
        assert_eq!(h.downstream.effects_for(&key(&step)), 1);
        // The next delivery hears unknown too, never a refusal that invites a new attempt.
        let again = h.deliver(&c, &step, &ticket("Refund")).await;
        assert_eq!(again.status, Status::Unknown, "{again:?}");
    }
    // With a receipt lookup, the first attempt's effect is found and recorded.
    let spec = Spec::key_based();
    let h = Harness::for_spec(store.clone(), &spec);
    let c = spec.contract();
    h.downstream.push_faults([
        Fault::CommitThenDrop,
        Fault::Refuse {
            code: ErrorCode::DownstreamRejected,
            message: "downstream answered 422 Unprocessable Entity".into(),
        },
    ]);
    // The lookup right after the lost answer is unavailable, so the resend goes out first.
    h.downstream.set_receipt_lookup(false);
    let o = h.deliver(&c, "s-lookup", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Unknown, "{o:?}");
    h.downstream.set_receipt_lookup(true);
    let settled = h
        .executor
        .reconcile(
            &c,
            &key("s-lookup"),
            None,
            "operator-7",
            "looked up by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(settled.status, Status::Replayed, "{settled:?}");
    assert_effects(&h, 1, "one effect, found by receipt");
}

/// A resend answered "not processed" (429) after a lost answer is still ambiguous: the claim is
/// not released with "nothing sent", and recovery later settles it with the same key.
pub async fn not_processed_resend_after_a_lost_answer_stays_ambiguous(store: Arc<dyn Store>) {
    let spec = Spec::key_based().lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream
        .push_faults([Fault::CommitThenDrop, Fault::NotSent, Fault::NotSent]);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::InFlight, "{o:?}");
    assert!(!o.safe_to_repeat());
    let record = h.record("s1").await.unwrap();
    let RecordState::Pending { lease, dispatch } = &record.state else {
        panic!("still pending: {record:?}");
    };
    assert_eq!(
        dispatch,
        &idemgate_core::record::Dispatch::Sent,
        "maybe sent"
    );
    assert!(lease.owner.is_some(), "not released");
    // Recovery resends under the same key; the deduplicating downstream answers the receipt.
    h.clock.advance(2 * 60 * 1000);
    recoverer_for(&h, &c).run_once().await.unwrap();
    assert_eq!(status_of(&h, "s1").await, RecordStatus::Applied);
    assert_eq!(
        h.deliver(&c, "s1", &ticket("Refund")).await.status,
        Status::Replayed
    );
    assert_effects(&h, 1, "one effect");
}

/// Retention counts from settlement: an operation approved (or reconciled) long after its
/// claim keeps its record for the whole `record_ttl` from then, and is replayed, not run again.
pub async fn retention_counts_from_settlement(store: Arc<dyn Store>) {
    let spec = Spec::key_based().approval("always");
    let h = Harness::for_spec(store.clone(), &spec);
    let c = spec.contract();
    h.deliver(&c, "s1", &ticket("Refund")).await;
    h.clock.advance(50 * 60 * 1000);
    let approved = h
        .executor
        .approve(
            &c,
            &key("s1"),
            "operator-7",
            "approved by a test",
            None,
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(approved.status, Status::Applied);
    // Past the claim's hour, within the settlement's: nothing is compacted.
    h.clock.advance(30 * 60 * 1000);
    assert_eq!(
        h.executor.sweep(ENVIRONMENT, 100).await.unwrap().compacted,
        0
    );
    let again = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(again.status, Status::Replayed, "{again:?}");
    // An unknown reconciled as applied after its claim's retention: kept from the resolution.
    let spec = Spec::key_based().dedup(false).lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::CommitThenDrop);
    assert_eq!(
        h.deliver(&c, "s2", &ticket("Refund")).await.status,
        Status::Unknown
    );
    h.clock.advance(2 * 3_600_000);
    h.executor.sweep(ENVIRONMENT, 100).await.unwrap();
    assert_eq!(
        status_of(&h, "s2").await,
        RecordStatus::Unknown,
        "unknown is never swept"
    );
    let reference = h.downstream.receipt_for(&key("s2")).unwrap().reference;
    h.executor
        .reconcile(
            &c,
            &key("s2"),
            Some(Resolution::Applied {
                reference: reference.clone(),
                result: json!({"ticket_id": reference}),
            }),
            "operator-7",
            "resolved by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    for _ in 0..3 {
        h.clock.advance(10 * 60 * 1000);
        h.executor.sweep(ENVIRONMENT, 100).await.unwrap();
        let replay = h.deliver(&c, "s2", &ticket("Refund")).await;
        assert_eq!(replay.status, Status::Replayed, "{replay:?}");
    }
    assert_effects(&h, 1, "reconciled, then retried");
}

/// Key-less natural-idempotent calls are not retries of each other: "set 5, set 6, set 5" sent
/// to a downstream that deduplicates on keys makes three effects, each under its own key.
pub async fn keyless_calls_never_share_an_idempotency_key(store: Arc<dyn Store>) {
    let spec = Spec::key_based().class("natural_idempotent");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let mut operation = op("unused");
    operation.workflow_id = None;
    operation.step_id = None;
    for version in [5, 6, 5] {
        let args = json!({"subject": "Status", "body": "set", "expected_version": version});
        let o = h
            .executor
            .execute(&c, &operation, &args, &h.downstream)
            .await;
        assert_eq!(o.status, Status::Applied, "{o:?}");
        assert!(o.operation_key.is_none());
    }
    assert_effects(&h, 3, "three key-less updates");
    let keys: std::collections::BTreeSet<_> = h
        .downstream
        .effect_log()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys.len(), 3, "each call its own idempotency key: {keys:?}");
    assert_eq!(h.downstream.deduplicated(), 0);
}

/// A takeover resends the request that was claimed, never the new delivery's bytes, and keeps
/// the stored request.
pub async fn takeover_sends_the_claimed_request(store: Arc<dyn Store>) {
    let spec = Spec::key_based().lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let mut first = ticket("Refund");
    first["trace_id"] = json!("trace-first");
    // The first delivery claims, then its process dies before anything is answered.
    h.store.after_claim().arm_nth(1);
    let (exec, contract, downstream) =
        (h.worker("worker-crashing"), c.clone(), h.downstream.clone());
    let crashing = tokio::spawn(async move {
        exec.execute(&contract, &op("s1"), &first, &downstream)
            .await
    });
    h.store.after_claim().reached().await;
    crashing.abort();
    let _ = crashing.await;
    h.expire_leases(&spec);
    // Same material request (trace_id is not material), different bytes.
    let mut second = ticket("Refund");
    second["trace_id"] = json!("trace-second");
    let retry = h.deliver(&c, "s1", &second).await;
    assert!(
        matches!(retry.status, Status::Applied | Status::Replayed),
        "{retry:?}"
    );
    let sent: Vec<_> = h
        .downstream
        .effect_log()
        .into_iter()
        .map(|e| e.arguments["trace_id"].clone())
        .collect();
    assert_eq!(sent, [json!("trace-first")], "what was claimed was sent");
    assert!(
        h.downstream
            .sent_arguments()
            .iter()
            .all(|a| a["trace_id"] == json!("trace-first")),
        "no call carried the new delivery's bytes"
    );
    assert_effects(&h, 1, "one effect");
}

/// A resend after an ambiguous attempt, triggered by a later delivery with other bytes of the
/// same request, sends the stored request and leaves it stored as it was.
pub async fn resend_sends_and_keeps_the_claimed_request(store: Arc<dyn Store>) {
    let spec = Spec::key_based().lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let mut first = ticket("Refund");
    first["trace_id"] = json!("trace-first");
    // The first attempt commits and its answer is lost; its own resends are not processed.
    h.downstream
        .push_faults([Fault::CommitThenDrop, Fault::NotSent, Fault::NotSent]);
    let o = h.deliver(&c, "s1", &first).await;
    assert_eq!(o.status, Status::InFlight, "{o:?}");
    let attempt = h.record("s1").await.unwrap().fence;
    // Past the backoff, a delivery with other (non-material) bytes takes over and resends
    // (up to three sends in one delivery); none is processed, so the record stays pending.
    h.clock.advance(2 * 60 * 1000);
    h.downstream.clear_faults();
    h.downstream
        .push_faults([Fault::NotSent, Fault::NotSent, Fault::NotSent]);
    let mut second = ticket("Refund");
    second["trace_id"] = json!("trace-second");
    let o = h.deliver(&c, "s1", &second).await;
    assert_eq!(o.status, Status::InFlight, "{o:?}");
    let record = h.record("s1").await.unwrap();
    assert!(
        record.fence > attempt,
        "the second delivery took over: {record:?}"
    );
    assert_eq!(
        record.request.as_ref().map(|r| r["trace_id"].clone()),
        Some(json!("trace-first")),
        "the stored request is the claimed one"
    );
    // The recoverer settles it by a resend the downstream deduplicates.
    h.downstream.clear_faults();
    h.clock.advance(10 * 60 * 1000);
    recoverer_for(&h, &c).run_once().await.unwrap();
    assert_eq!(status_of(&h, "s1").await, RecordStatus::Applied);
    let sent: Vec<_> = h
        .downstream
        .sent_arguments()
        .into_iter()
        .map(|a| a["trace_id"].clone())
        .collect();
    assert!(sent.len() >= 3, "first attempt and resends: {sent:?}");
    assert!(
        sent.iter().all(|t| t == &json!("trace-first")),
        "every send carried the claimed request: {sent:?}"
    );
    assert!(h.downstream.deduplicated() >= 1);
    assert_effects(&h, 1, "one effect under resends");
}

/// Records that make no progress (their tool is no longer loaded) never keep the recoverer
/// from the others.
pub async fn stuck_records_do_not_block_the_recoverer(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let other = Spec::key_based().version("2026-01-01");
    let gone = Arc::new(
        Contract::load(
            &other
                .yaml()
                .replace("name: tickets.create", "name: tickets.retired"),
            "retired.yaml",
        )
        .unwrap(),
    );
    for i in 0..12 {
        crash_after_claim(&h, &gone, &format!("old-{i:02}")).await;
    }
    crash_after_claim(&h, &c, "zz-live").await;
    h.expire_leases(&spec);
    let recoverer = recoverer_for(&h, &c).with_batch(5);
    for _ in 0..4 {
        recoverer.run_once().await.unwrap();
    }
    assert_eq!(status_of(&h, "zz-live").await, RecordStatus::Applied);
    assert_eq!(h.downstream.effects_for(&key("zz-live")), 1);
}

/// A deduplicating downstream that keeps answering 5xx is resent a bounded number of times,
/// honouring `Retry-After`, and then the record ends `unknown`: nothing stays stuck.
pub async fn persistent_server_errors_end_unknown_within_bounds(store: Arc<dyn Store>) {
    let spec = Spec::key_based().lookup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let recoverer = recoverer_for(&h, &c);
    h.downstream.push_faults(std::iter::repeat_n(
        Fault::Unavailable {
            retry_after: 60,
            commit: false,
        },
        100,
    ));
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::InFlight, "{o:?}");
    assert!(
        o.retry_after_seconds.unwrap_or(0) >= 60,
        "Retry-After honoured: {o:?}"
    );
    assert_eq!(h.downstream.calls(), 1, "no resend before Retry-After");
    // Before Retry-After has passed, the recoverer does not resend.
    h.clock.advance(59 * 1000);
    recoverer.run_once().await.unwrap();
    assert_eq!(h.downstream.calls(), 1, "no resend before Retry-After");
    // Over the retry window, every pass that finds it due resends once, then gives up.
    for _ in 0..200 {
        h.clock.advance(60 * 1000);
        recoverer.run_once().await.unwrap();
    }
    let record = h.record("s1").await.unwrap();
    assert_eq!(record.status(), RecordStatus::Unknown, "{record:?}");
    assert!(record.fence <= 8, "bounded attempts: {}", record.fence);
    assert!(
        h.downstream.calls() <= 8,
        "bounded sends: {}",
        h.downstream.calls()
    );
    assert_effects(&h, 0, "the downstream never committed");
}

/// A job the downstream no longer knows (its poll answers 404) ends `unknown`.
pub async fn forgotten_job_ends_unknown(store: Arc<dyn Store>) {
    let spec = Spec::key_based().jobs();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.downstream.push_fault(Fault::AcceptJob);
    h.deliver(&c, "s1", &ticket("Refund")).await;
    let job = h.downstream.job_ids().pop().unwrap();
    h.downstream.forget_job(&job);
    let o = h.deliver(&c, "s1", &ticket("Refund")).await;
    assert_eq!(o.status, Status::Unknown, "{o:?}");
    assert_eq!(status_of(&h, "s1").await, RecordStatus::Unknown);
    assert_effects(&h, 0, "a forgotten job");
}

/// An operator can reconcile every record that has not settled, not only `unknown` ones; a
/// `not_applied` is refused while a worker may be sending.
pub async fn operator_reconciles_any_unsettled_record(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store.clone(), &spec);
    let c = spec.contract();
    crash_after_claim(&h, &c, "pending").await;
    // A live lease: the owner may be sending right now.
    let live = h
        .executor
        .reconcile(
            &c,
            &key("pending"),
            Some(Resolution::NotApplied),
            "operator-7",
            "resolved by a test",
            &h.downstream,
        )
        .await;
    assert!(
        matches!(live, Err(ActionError::WrongState { .. })),
        "{live:?}"
    );
    // Nor is the receipt looked up under it: a receipt found now may be an earlier life's of the
    // key, and settling under it would let the owner's send make a second effect.
    let looked = h
        .executor
        .reconcile(
            &c,
            &key("pending"),
            None,
            "operator-7",
            "looked up by a test",
            &h.downstream,
        )
        .await;
    assert!(
        matches!(looked, Err(ActionError::WrongState { .. })),
        "{looked:?}"
    );
    h.expire_leases(&spec);
    let settled = h
        .executor
        .reconcile(
            &c,
            &key("pending"),
            Some(Resolution::Applied {
                reference: "ticket_ext".into(),
                result: json!({"ticket_id": "ticket_ext"}),
            }),
            "operator-7",
            "resolved by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(settled.status, Status::Replayed, "{settled:?}");
    assert_eq!(
        h.deliver(&c, "pending", &ticket("Refund"))
            .await
            .effect_reference
            .as_deref(),
        Some("ticket_ext")
    );
    // Awaiting approval: resolved applied (done out of band), or denied; never `not_applied`.
    let spec = Spec::key_based().approval("always");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.deliver(&c, "held", &ticket("Refund")).await;
    let refused = h
        .executor
        .reconcile(
            &c,
            &key("held"),
            Some(Resolution::NotApplied),
            "operator-7",
            "resolved by a test",
            &h.downstream,
        )
        .await;
    assert!(
        matches!(refused, Err(ActionError::WrongState { .. })),
        "{refused:?}"
    );
    let done = h
        .executor
        .reconcile(
            &c,
            &key("held"),
            Some(Resolution::Applied {
                reference: "ticket_manual".into(),
                result: json!({}),
            }),
            "operator-7",
            "resolved by a test",
            &h.downstream,
        )
        .await
        .unwrap();
    assert_eq!(done.status, Status::Replayed, "{done:?}");
    assert_effects(&h, 0, "resolved by operators");
}

/// A status read hands out a stored result like a replay: a revoked reader is refused.
pub async fn status_read_rechecks_the_reader(store: Arc<dyn Store>) {
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    h.deliver(&c, "s1", &ticket("Refund")).await;
    h.auth.set(denied());
    let read = h
        .executor
        .status(Some(&c), &key("s1"), Some(&h.downstream), &op("s1").caller)
        .await
        .unwrap();
    let Some(StatusRead::Denied(outcome)) = read else {
        panic!("a revoked reader gets no result: {read:?}");
    };
    assert_eq!(outcome.error_code(), Some(ErrorCode::Forbidden));
    assert!(outcome.result.is_none() && outcome.effect_reference.is_none());
}

/// The same request under many keys at once, with a duplicate-intent window: one effect, the
/// others held for approval — the check and the claim are one atomic step.
pub async fn concurrent_duplicate_intents_run_once(store: Arc<dyn Store>) {
    let spec = Spec::key_based().window("10m");
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (exec, c, d) = (h.worker(&format!("w{i}")), c.clone(), h.downstream.clone());
        tasks.spawn(async move {
            exec.execute(&c, &op(&format!("k{i}")), &ticket("Refund"), &d)
                .await
        });
    }
    let mut applied = 0;
    let mut held = 0;
    while let Some(o) = tasks.join_next().await {
        let o = o.unwrap();
        match o.error_code() {
            None if o.status == Status::Applied => applied += 1,
            Some(ErrorCode::PossibleDuplicateIntent) => held += 1,
            _ => panic!("{o:?}"),
        }
    }
    assert_eq!((applied, held), (1, 7));
    assert_effects(&h, 1, "one intent, eight keys");
}

/// Recovery and sweeping stay within their environment.
pub async fn recoverer_and_sweeper_stay_in_their_environment(store: Arc<dyn Store>) {
    let spec = Spec::key_based().dedup(false);
    let h = Harness::for_spec(store, &spec);
    let c = spec.contract();
    crash_after_claim(&h, &c, "s1").await;
    h.expire_leases(&spec);
    let elsewhere = Recoverer::new(
        h.worker("recoverer"),
        Arc::new(OneTool(c.clone(), Arc::new(h.downstream.clone()))),
        "staging",
    );
    assert_eq!(elsewhere.run_once().await.unwrap().examined, 0);
    assert_effects(&h, 0, "another environment's recoverer");
    h.deliver(&c, "s2", &ticket("Refund")).await;
    h.clock.advance(2 * 3_600_000);
    assert_eq!(h.executor.sweep("staging", 100).await.unwrap().compacted, 0);
    assert_eq!(status_of(&h, "s2").await, RecordStatus::Applied);
    assert_eq!(
        h.executor.sweep(ENVIRONMENT, 100).await.unwrap().compacted,
        1
    );
}
