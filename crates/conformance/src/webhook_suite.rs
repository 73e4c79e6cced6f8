//! The webhook part of the `Store` contract: the deduplication rule of
//! [`WebhookEvent`], the transition that carries an event, the job lookup and the sweep — as
//! cases every store runs, like [`store_suite`](crate::store_suite).

use std::future::Future;
use std::sync::Arc;

use idemgate_core::record::{Dispatch, Lease, Millis, Receipt, Record, RecordState, RecordStatus};
use idemgate_core::store::{Cas, Claimed, Store};
use idemgate_core::webhook::{Disposition, Finish, JobMatch, Recorded, WebhookEvent};
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::store_suite::{TOOL, applied, key, record, step};

/// Runs every case, each against a fresh store from `fresh`.
pub async fn run<S, F, Fut>(fresh: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    dedup_rule_writes_once_and_replaces_early(fresh().await).await;
    transition_writes_its_event(fresh().await).await;
    decided_event_blocks_its_transition(fresh().await).await;
    lost_transition_writes_no_event(fresh().await).await;
    concurrent_deliveries_of_one_event_transition_once(fresh().await).await;
    open_jobs_are_found_by_tenant_environment_tool_and_id(fresh().await).await;
    two_tools_with_one_job_id_are_both_found(fresh().await).await;
    unknown_jobs_are_found_too(fresh().await).await;
    webhooks_for_job_lists_the_tenants_rows(fresh().await).await;
    sweep_deletes_rows_past_their_window(fresh().await).await;
}

/// How many cases [`run`] runs.
pub const CASES: usize = 10;

/// An event row of source `jobs`.
pub fn event(id: &str, disposition: Disposition, job: Option<&str>) -> WebhookEvent {
    WebhookEvent {
        source: "jobs".into(),
        event_id: id.into(),
        tenant: "acme".into(),
        environment: Some("prod".into()),
        tools: vec![TOOL.into()],
        job_id: job.map(str::to_string),
        key: None,
        disposition,
        finish: None,
        received_at: 1_000,
        purge_at: 1_000 + 259_200_000,
    }
}

/// A pending record waiting on job `job`.
pub fn job_record(key_text: &str, job: &str) -> Record {
    record(
        key_text,
        RecordState::Pending {
            lease: Lease {
                owner: Some("w1".into()),
                expires_at: 30_000,
            },
            dispatch: Dispatch::Job { job_id: job.into() },
        },
    )
}

async fn claimed<S: Store>(store: &S, r: Record) -> Record {
    match store
        .claim(r, Vec::new())
        .await
        .expect("the claim is stored")
    {
        Claimed::Inserted(r) => r,
        other => panic!("expected a new record, got {other:?}"),
    }
}

pub async fn dedup_rule_writes_once_and_replaces_early<S: Store>(store: S) {
    let mut early = event("msg_1", Disposition::Early, Some("j1"));
    early.finish = Some(Finish::Done(Receipt {
        reference: "R-1".into(),
        result: json!({"ok": true}),
    }));
    assert_eq!(
        store.record_webhook(early.clone()).await.unwrap(),
        Recorded::Written
    );
    assert_eq!(
        store.webhook("jobs", "msg_1").await.unwrap(),
        Some(early.clone()),
        "an early row keeps its finish"
    );
    // An early row is replaced by the write that decides it.
    let decided = event("msg_1", Disposition::AlreadySettled, Some("j1"));
    assert_eq!(
        store.record_webhook(decided.clone()).await.unwrap(),
        Recorded::Written
    );
    // A decided row is never replaced.
    let again = event("msg_1", Disposition::Ignored, Some("j1"));
    assert_eq!(
        store.record_webhook(again).await.unwrap(),
        Recorded::Exists(Box::new(decided.clone()))
    );
    assert_eq!(store.webhook("jobs", "msg_1").await.unwrap(), Some(decided));
    // Another source's event of the same id is another event.
    let mut other = event("msg_1", Disposition::Ignored, None);
    other.source = "billing".into();
    assert_eq!(
        store.record_webhook(other).await.unwrap(),
        Recorded::Written
    );
    assert_eq!(store.webhook("jobs", "nope").await.unwrap(), None);
}

pub async fn transition_writes_its_event<S: Store>(store: S) {
    let r = claimed(&store, job_record("acme:prod:wf-w1:s1", "j1")).await;
    let mut t = step(&r, applied("R-1"), 2_000);
    let mut row = event("msg_1", Disposition::Applied, Some("j1"));
    row.key = Some(r.key.clone());
    t.webhook = Some(row.clone());
    let Cas::Done(done) = store.transition(t).await.unwrap() else {
        panic!("the transition applies");
    };
    assert_eq!(done.status(), RecordStatus::Applied);
    assert_eq!(store.webhook("jobs", "msg_1").await.unwrap(), Some(row));
}

pub async fn decided_event_blocks_its_transition<S: Store>(store: S) {
    let r = claimed(&store, job_record("acme:prod:wf-w2:s1", "j2")).await;
    let seen = event("msg_2", Disposition::Ignored, Some("j2"));
    store.record_webhook(seen.clone()).await.unwrap();
    let mut t = step(&r, applied("R-2"), 2_000);
    t.webhook = Some(event("msg_2", Disposition::Applied, Some("j2")));
    match store.transition(t).await.unwrap() {
        Cas::Lost(Some(now)) => assert_eq!(now, r, "the record is unchanged"),
        other => panic!("a decided event applies nothing, got {other:?}"),
    }
    assert_eq!(store.get(&r.key).await.unwrap(), Some(r));
    assert_eq!(store.webhook("jobs", "msg_2").await.unwrap(), Some(seen));
}

/// The row is written with the transition or not at all: a transition that matches no record
/// leaves no row (PostgreSQL writes the row first and must roll it back).
pub async fn lost_transition_writes_no_event<S: Store>(store: S) {
    let r = claimed(&store, job_record("acme:prod:wf-w3:s1", "j3")).await;
    let mut stale = r.clone();
    stale.fence += 7;
    let mut t = step(&stale, applied("R-3"), 2_000);
    t.webhook = Some(event("msg_3", Disposition::Applied, Some("j3")));
    assert!(matches!(
        store.transition(t).await.unwrap(),
        Cas::Lost(Some(_))
    ));
    assert_eq!(store.webhook("jobs", "msg_3").await.unwrap(), None);
    // An early row stays early when its transition loses.
    store
        .record_webhook(event("msg_3", Disposition::Early, Some("j3")))
        .await
        .unwrap();
    let mut t = step(&stale, applied("R-3"), 2_000);
    t.webhook = Some(event("msg_3", Disposition::Applied, Some("j3")));
    assert!(matches!(store.transition(t).await.unwrap(), Cas::Lost(_)));
    assert_eq!(
        store
            .webhook("jobs", "msg_3")
            .await
            .unwrap()
            .unwrap()
            .disposition,
        Disposition::Early
    );
}

/// Twenty deliveries of one event, each with the transition planned from the same read, at
/// once: one transition, one row.
pub async fn concurrent_deliveries_of_one_event_transition_once<S: Store>(store: S) {
    let store = Arc::new(store);
    let r = claimed(&*store, job_record("acme:prod:wf-w4:s1", "j4")).await;
    let barrier = Arc::new(Barrier::new(20));
    let mut tasks = JoinSet::new();
    for i in 0..20 {
        let (store, barrier) = (store.clone(), barrier.clone());
        let mut t = step(&r, applied("R-4"), 2_000 + i);
        t.events = vec![idemgate_core::record::Event::new(
            idemgate_core::record::EventKind::Acknowledged,
            2_000,
            1,
            "w",
        )];
        let mut row = event("msg_4", Disposition::Applied, Some("j4"));
        row.key = Some(r.key.clone());
        t.webhook = Some(row);
        tasks.spawn(async move {
            barrier.wait().await;
            store.transition(t).await
        });
    }
    let mut done = 0;
    while let Some(answer) = tasks.join_next().await {
        if let Cas::Done(_) = answer.unwrap().unwrap() {
            done += 1;
        }
    }
    assert_eq!(done, 1, "exactly one delivery transitions");
    let acknowledged = store
        .events(&r.key)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == idemgate_core::record::EventKind::Acknowledged)
        .count();
    assert_eq!(acknowledged, 1, "one transition in the trace");
    assert_eq!(
        store
            .webhook("jobs", "msg_4")
            .await
            .unwrap()
            .unwrap()
            .disposition,
        Disposition::Applied
    );
}

/// The pending jobs of `tenant` in `environment` among `tools` with `job`.
async fn jobs<S: Store>(
    store: &S,
    tenant: &str,
    environment: &str,
    tools: &[&str],
    job: &str,
) -> Vec<Record> {
    let tools: Vec<String> = tools.iter().map(|t| t.to_string()).collect();
    store
        .open_jobs(JobMatch {
            tenant,
            environment,
            tools: &tools,
            job_id: job,
        })
        .await
        .expect("the lookup reads")
}

pub async fn open_jobs_are_found_by_tenant_environment_tool_and_id<S: Store>(store: S) {
    let r = claimed(&store, job_record("acme:prod:wf-w5:s1", "j5")).await;
    claimed(&store, job_record("other:prod:wf-w5:s1", "j5-other")).await;
    claimed(&store, job_record("acme:staging:wf-w5:s1", "j5")).await;
    let mut invoices = job_record("acme:prod:wf-w5:s2", "j5");
    invoices.tool = "invoices.generate".into();
    let invoices = claimed(&store, invoices).await;
    assert_eq!(
        jobs(&store, "acme", "prod", &[TOOL], "j5").await,
        vec![r.clone()]
    );
    assert_eq!(
        jobs(&store, "acme", "prod", &["invoices.generate"], "j5").await,
        vec![invoices.clone()]
    );
    assert!(
        jobs(&store, "other", "prod", &[TOOL], "j5")
            .await
            .is_empty()
    );
    assert!(
        jobs(&store, "acme", "prod", &[TOOL], "j5-other")
            .await
            .is_empty()
    );
    assert!(
        jobs(&store, "acme", "prod", &["tickets.get"], "j5")
            .await
            .is_empty(),
        "a tool the source does not name is never found"
    );
    assert_eq!(
        jobs(&store, "acme", "staging", &[TOOL], "j5").await.len(),
        1,
        "each environment finds its own"
    );
    let Cas::Done(_) = store
        .transition(step(&r, applied("R-5"), 2_000))
        .await
        .unwrap()
    else {
        panic!("settles");
    };
    assert!(
        jobs(&store, "acme", "prod", &[TOOL], "j5").await.is_empty(),
        "a settled job is no longer pending"
    );
}

/// A record that went `unknown` while waiting on its job keeps the job id as evidence, and the
/// lookup finds it beside pending ones (a later event or poll may settle it), never a settled
/// one or an unknown record without a job.
pub async fn unknown_jobs_are_found_too<S: Store>(store: S) {
    let r = claimed(&store, job_record("acme:prod:wf-w10:s1", "j10")).await;
    let t = step(
        &r,
        RecordState::Unknown(idemgate_core::record::Evidence {
            reason: "the job ran past its deadline".into(),
            reference: None,
            job_id: Some("j10".into()),
        }),
        2_000,
    );
    let Cas::Done(unknown) = store.transition(t).await.unwrap() else {
        panic!("goes unknown");
    };
    assert_eq!(unknown.status(), RecordStatus::Unknown);
    let other = claimed(
        &store,
        record(
            "acme:prod:wf-w10:s2",
            RecordState::Unknown(idemgate_core::record::Evidence {
                reason: "no job".into(),
                reference: None,
                job_id: None,
            }),
        ),
    )
    .await;
    assert_eq!(other.status(), RecordStatus::Unknown);
    let pending = claimed(&store, job_record("acme:prod:wf-w10:s3", "j10")).await;
    assert_eq!(
        jobs(&store, "acme", "prod", &[TOOL], "j10").await,
        vec![unknown.clone(), pending]
    );
    assert!(
        jobs(&store, "acme", "staging", &[TOOL], "j10")
            .await
            .is_empty()
    );
    assert!(
        jobs(&store, "acme", "prod", &["tickets.get"], "j10")
            .await
            .is_empty()
    );
}

/// Two tools whose downstreams handed out the same job id: a source naming both finds both
/// (at most two, in key order), so the caller can refuse the event as ambiguous.
pub async fn two_tools_with_one_job_id_are_both_found<S: Store>(store: S) {
    let a = claimed(&store, job_record("acme:prod:wf-w9:s1", "7")).await;
    let mut b = job_record("acme:prod:wf-w9:s2", "7");
    b.tool = "invoices.generate".into();
    let b = claimed(&store, b).await;
    let mut c = job_record("acme:prod:wf-w9:s3", "7");
    c.tool = "exports.generate".into();
    claimed(&store, c).await;
    assert_eq!(
        jobs(&store, "acme", "prod", &[TOOL, "invoices.generate"], "7").await,
        vec![a.clone(), b]
    );
    assert_eq!(
        jobs(
            &store,
            "acme",
            "prod",
            &[TOOL, "invoices.generate", "exports.generate"],
            "7"
        )
        .await
        .len(),
        2,
        "two are enough to say ambiguous"
    );
    assert_eq!(jobs(&store, "acme", "prod", &[TOOL], "7").await, vec![a]);
}

pub async fn webhooks_for_job_lists_the_tenants_rows<S: Store>(store: S) {
    let mut first = event("msg_a", Disposition::Early, Some("j6"));
    first.received_at = 10;
    let mut second = event("msg_b", Disposition::AlreadySettled, Some("j6"));
    second.received_at = 20;
    second.key = Some(key("acme:prod:wf-w6:s1"));
    let mut other = event("msg_c", Disposition::Early, Some("j6"));
    other.tenant = "other".into();
    for e in [second.clone(), first.clone(), other] {
        store.record_webhook(e).await.unwrap();
    }
    store
        .record_webhook(event("msg_d", Disposition::Ignored, None))
        .await
        .unwrap();
    assert_eq!(
        store.webhooks_for_job("acme", "j6").await.unwrap(),
        vec![first, second]
    );
    assert!(
        store
            .webhooks_for_job("acme", "j7")
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn sweep_deletes_rows_past_their_window<S: Store>(store: S) {
    for (i, purge_at) in [100, 200, 300, 10_000].into_iter().enumerate() {
        let mut e = event(&format!("msg_{i}"), Disposition::Ignored, None);
        e.purge_at = purge_at as Millis;
        store.record_webhook(e).await.unwrap();
    }
    assert_eq!(store.sweep_webhooks(300, 2).await.unwrap(), 2);
    assert_eq!(store.sweep_webhooks(300, 10).await.unwrap(), 1);
    assert_eq!(store.sweep_webhooks(300, 10).await.unwrap(), 0);
    assert_eq!(store.webhook("jobs", "msg_2").await.unwrap(), None);
    assert!(store.webhook("jobs", "msg_3").await.unwrap().is_some());
}
