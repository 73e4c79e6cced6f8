//! `POST /v1/webhooks/{source}` through the router, on the in-memory store, SQLite and
//! PostgreSQL: signed events (the `standardwebhooks` crate signs them, as a sender would)
//! finish accepted jobs once, redeliveries and concurrent deliveries change nothing, an event
//! that overtakes the job id's recording still finishes the job, and what is refused leaves no
//! row. Effects are counted at the fake downstream.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use common::*;
use idemgate_conformance::downstream::{FakeDownstream, Fault};
use idemgate_conformance::harness::EPOCH;
use idemgate_conformance::mem::MemStore;
use idemgate_core::clock::ManualClock;
use idemgate_core::duration::Span;
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Dispatch, EventKind, RecordState, RecordStatus};
use idemgate_core::store::Store;
use idemgate_core::webhook::Disposition;
use idemgate_server::Gateway;
use idemgate_server::webhooks::{SourceConfig, Sources};
use serde_json::{Value, json};
use tokio::task::JoinSet;

const OLD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const STRANGER: &str = "whsec_dGhpcyBpcyBub3QgdGhlIHNlY3JldA==";

struct Env {
    app: Router,
    clock: Arc<ManualClock>,
    fakes: Fakes,
    store: Arc<dyn Store>,
    _guard: Box<dyn std::any::Any + Send>,
}

/// A second job tool beside `reports.generate`, whose downstream numbers its jobs the same
/// way (`job_1`, `job_2`, …): the two hand out the same job ids.
const INVOICES: &str = r#"
name: invoices.generate
version: "1"
purpose: Generate one invoice run as a background job.
effect_class: key_based
input_schema:
  type: object
  properties:
    report_type: {type: string}
    period_start: {type: string}
    period_end: {type: string}
  required: [report_type, period_start, period_end]
  additionalProperties: false
request_fingerprint:
  fields: [report_type, period_start, period_end]
downstream:
  deduplicates_by_key: true
  async_jobs: true
retention:
  record_ttl: 3d
  tombstone_ttl: 30d
  late_arrival: tombstone
  max_retry_window: 1d
lease_seconds: 60
"#;

/// A job tool whose jobs may run three days, although a lost answer is retried for an hour
/// only: its own job deadline, `downstream.http.job.max_running`.
const EXPORTS: &str = r#"
name: exports.generate
version: "1"
purpose: Export one period's data as a long background job.
effect_class: key_based
input_schema:
  type: object
  properties:
    report_type: {type: string}
    period_start: {type: string}
    period_end: {type: string}
  required: [report_type, period_start, period_end]
  additionalProperties: false
request_fingerprint:
  fields: [report_type, period_start, period_end]
downstream:
  deduplicates_by_key: true
  async_jobs: true
  http:
    job:
      max_running: 3d
retention:
  record_ttl: 3d
  tombstone_ttl: 30d
  late_arrival: tombstone
  max_retry_window: 1h
lease_seconds: 60
"#;

fn source(tenant: &str, by_key: bool) -> SourceConfig {
    source_for(tenant, by_key, &["reports.generate"])
}

fn source_for(tenant: &str, by_key: bool, tools: &[&str]) -> SourceConfig {
    SourceConfig {
        tenant: tenant.into(),
        tools: tools.iter().map(|t| t.to_string()).collect(),
        secret_envs: vec!["OLD".into(), "NEW".into()],
        tolerance: Span(300),
        retention: Span(3 * 86_400),
        max_body_bytes: Some(4096),
        job_id_pointer: (!by_key).then(|| "/data/job_id".into()),
        key_pointer: by_key.then(|| "/data/operation_key".into()),
        outcome_pointer: "/type".into(),
        success: vec!["job.succeeded".into()],
        failure: vec!["job.failed".into()],
        reference_pointer: "/data/report_id".into(),
        result_pointer: Some("/data".into()),
        error_message_pointer: Some("/data/error".into()),
    }
}

fn env_on(store: Arc<dyn Store>, guard: Box<dyn std::any::Any + Send>) -> Env {
    let mut fakes = Fakes::new();
    let tools = fakes.tools_with(&[INVOICES, EXPORTS]);
    // Each fake's references name it, so a record shows whose effect it settled with.
    fakes
        .fake("reports.generate")
        .set_reference_prefix("report");
    fakes
        .fake("invoices.generate")
        .set_reference_prefix("invoice");
    let clock = Arc::new(ManualClock::new(EPOCH));
    let config = BTreeMap::from([
        ("reports".to_string(), source("acme", false)),
        ("reports-by-key".to_string(), source("acme", true)),
        ("globex-reports".to_string(), source("globex", false)),
        (
            "invoices".to_string(),
            source_for("acme", false, &["invoices.generate"]),
        ),
        (
            "exports".to_string(),
            source_for("acme", false, &["exports.generate"]),
        ),
        (
            "all-jobs".to_string(),
            source_for("acme", false, &["reports.generate", "invoices.generate"]),
        ),
    ]);
    let sources = Sources::with_env(&config, |name| match name {
        "OLD" => Some(OLD_SECRET.into()),
        "NEW" => Some(NEW_SECRET.into()),
        _ => None,
    })
    .unwrap();
    let state = Gateway::new(store.clone(), tools, tokens())
        .clock(clock.clone())
        .environment(ENV)
        .webhooks(sources)
        .build();
    Env {
        app: idemgate_server::router(state),
        clock,
        fakes,
        store,
        _guard: guard,
    }
}

async fn mem() -> Option<Env> {
    Some(env_on(Arc::new(MemStore::new()), Box::new(())))
}

async fn sqlite() -> Option<Env> {
    let dir = tempfile::tempdir().unwrap();
    let store = idemgate_store_sqlite::SqliteStore::open(
        dir.path().join("webhooks.db"),
        idemgate_store_sqlite::Options::default(),
    )
    .unwrap();
    Some(env_on(Arc::new(store), Box::new(dir)))
}

async fn postgres() -> Option<Env> {
    let db = idemgate_store_postgres::testing::fresh_database().await?;
    let store = db.store().await;
    Some(env_on(Arc::new(store), Box::new(db)))
}

/// Each scenario on each store.
macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod on_mem { $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $scenario() { if let Some(e) = super::mem().await { super::$scenario(e).await } })* }
        mod on_sqlite { $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $scenario() { if let Some(e) = super::sqlite().await { super::$scenario(e).await } })* }
        mod on_postgres { $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $scenario() { if let Some(e) = super::postgres().await { super::$scenario(e).await } })* }
    };
}

on_every_store!(
    a_signed_event_finishes_the_job_once,
    twenty_concurrent_deliveries_make_one_transition,
    an_event_before_the_job_id_is_recorded_still_finishes_the_job,
    a_failure_event_settles_the_job_as_refused,
    an_event_bound_by_key_finishes_the_job,
    another_tenants_event_changes_nothing,
    refused_deliveries_leave_no_row,
    a_waiting_caller_hears_the_webhook,
    two_tools_with_the_same_job_id_are_settled_each_by_its_own_source,
    an_early_event_waits_for_its_own_tool,
    an_event_never_finishes_another_tool_or_a_released_claim,
    a_running_job_stays_in_flight_until_its_own_deadline_then_a_poll_settles_it,
    a_webhook_settles_an_unknown_job_as_evidence,
);

fn signed(source: &str, secret: &str, id: &str, at_seconds: i64, body: &Value) -> Call<'static> {
    let text = body.to_string();
    let signature = standardwebhooks::Webhook::new(secret)
        .unwrap()
        .sign(id, at_seconds, text.as_bytes())
        .unwrap();
    Call::post(format!("/v1/webhooks/{source}"), "", text)
        .anonymous()
        .header("webhook-id", id.to_string())
        .header("webhook-timestamp", at_seconds.to_string())
        .header("webhook-signature", signature)
        .header("content-type", "application/json")
}

fn now_seconds() -> i64 {
    EPOCH / 1000
}

fn report(workflow: &str) -> Value {
    json!({"workflow_id": workflow, "step_id": "s", "arguments": {"report_type": "usage", "period_start": "2026-01-01", "period_end": "2026-01-31"}})
}

fn key(workflow: &str) -> OperationKey {
    OperationKey::new("acme", ENV, workflow, "s").unwrap()
}

fn done(job: &str, reference: &str) -> Value {
    json!({"type": "job.succeeded", "data": {"job_id": job, "report_id": reference, "rows": 42}})
}

/// Starts a report whose downstream accepts a job; the job's id.
async fn accepted_job(e: &Env, workflow: &str) -> String {
    accepted_job_of(e, "reports.generate", workflow).await
}

/// Starts an operation of `tool` whose downstream accepts a job; the job's id.
async fn accepted_job_of(e: &Env, tool: &str, workflow: &str) -> String {
    let fake = e.fakes.fake(tool);
    fake.push_fault(Fault::AcceptJob);
    let r = route(&e.app, invoke(tool, AGENT, report(workflow))).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.outcome(), "in_flight");
    fake.job_ids().last().unwrap().clone()
}

/// The record's status and reference.
async fn settled(e: &Env, workflow: &str) -> (RecordStatus, Option<String>) {
    let r = e.store.get(&key(workflow)).await.unwrap().unwrap();
    let reference = match &r.state {
        RecordState::Applied(receipt) => Some(receipt.reference.clone()),
        _ => None,
    };
    (r.status(), reference)
}

/// The references of the effects `tool`'s downstream made for `workflow`'s key.
fn effects_of(e: &Env, tool: &str, workflow: &str) -> Vec<String> {
    e.fakes
        .fake(tool)
        .effect_log()
        .into_iter()
        .filter(|effect| effect.key == key(workflow))
        .map(|effect| effect.reference)
        .collect()
}

/// The downstream finishes the job: its effect commits on its own side; the receipt's
/// reference.
fn finish_at_downstream(reports: &FakeDownstream, job: &str) -> String {
    reports.complete_job(job).reference
}

async fn acknowledged(store: &Arc<dyn Store>, key: &OperationKey) -> usize {
    store
        .events(key)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.kind == EventKind::Acknowledged)
        .count()
}

async fn a_signed_event_finishes_the_job_once(e: Env) {
    let reports = e.fakes.fake("reports.generate");
    let job = accepted_job(&e, "run_w1").await;
    let reference = finish_at_downstream(reports, &job);
    let event = done(&job, &reference);

    let first = route(
        &e.app,
        signed("reports", OLD_SECRET, "msg_1", now_seconds(), &event),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["disposition"], "applied");
    assert_eq!(first.json["redelivery"], false);
    assert_eq!(first.json["operation_key"], key("run_w1").as_str());
    let record = e.store.get(&key("run_w1")).await.unwrap().unwrap();
    assert_eq!(record.status(), RecordStatus::Applied);

    // The sender retries the same event: nothing changes.
    let again = route(
        &e.app,
        signed("reports", OLD_SECRET, "msg_1", now_seconds(), &event),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["redelivery"], true);
    assert_eq!(again.json["disposition"], "applied");
    // Another event id for the same job finds it settled.
    let second = route(
        &e.app,
        signed("reports", NEW_SECRET, "msg_2", now_seconds(), &event),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.text);
    assert_eq!(second.json["disposition"], "already_settled");
    assert_eq!(second.json["operation_key"], key("run_w1").as_str());
    // A third one that contradicts the settlement is recorded and changes nothing.
    let other = route(
        &e.app,
        signed(
            "reports",
            NEW_SECRET,
            "msg_3",
            now_seconds(),
            &done(&job, "another-report"),
        ),
    )
    .await;
    assert_eq!(
        other.json["disposition"], "settled_differently",
        "{}",
        other.text
    );

    assert_eq!(acknowledged(&e.store, &key("run_w1")).await, 1);
    assert_eq!(e.store.get(&key("run_w1")).await.unwrap(), Some(record));
    let replay = route(&e.app, invoke("reports.generate", AGENT, report("run_w1"))).await;
    assert_eq!(replay.outcome(), "replayed", "{}", replay.text);
    assert_eq!(replay.json["effect_reference"], reference.as_str());
    assert_eq!(replay.json["result"]["rows"], 42);
    assert_eq!(reports.effects(), 1);
    assert_eq!(reports.job_ids().len(), 1);
}

async fn twenty_concurrent_deliveries_make_one_transition(e: Env) {
    let reports = e.fakes.fake("reports.generate");
    let job = accepted_job(&e, "run_w2").await;
    let reference = finish_at_downstream(reports, &job);
    let event = done(&job, &reference);
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let (app, barrier, event) = (e.app.clone(), barrier.clone(), event.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            route(
                &app,
                signed("reports", OLD_SECRET, "msg_same", now_seconds(), &event),
            )
            .await
        });
    }
    let (mut first, mut redelivered) = (0, 0);
    while let Some(reply) = tasks.join_next().await {
        let reply = reply.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text);
        assert_eq!(reply.json["disposition"], "applied", "{}", reply.text);
        match reply.json["redelivery"].as_bool() {
            Some(false) => first += 1,
            _ => redelivered += 1,
        }
    }
    assert_eq!((first, redelivered), (1, 19));
    assert_eq!(
        acknowledged(&e.store, &key("run_w2")).await,
        1,
        "one transition"
    );
    let row = e
        .store
        .webhook("reports", "msg_same")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.disposition, Disposition::Applied);
    assert_eq!(reports.effects(), 1);
}

async fn an_event_before_the_job_id_is_recorded_still_finishes_the_job(e: Env) {
    let reports = e.fakes.fake("reports.generate");
    // The fake names its jobs job_1, job_2, …: the callback for the job this delivery is
    // about to start arrives before the 202 has been recorded (before it was even answered).
    let event = done("job_1", "report-early");
    let early = route(
        &e.app,
        signed("reports", OLD_SECRET, "msg_e", now_seconds(), &event),
    )
    .await;
    assert_eq!(early.status, 202, "{}", early.text);
    assert_eq!(early.json["disposition"], "early");
    // A redelivery while it waits is still early, and still not applied.
    let again = route(
        &e.app,
        signed("reports", OLD_SECRET, "msg_e", now_seconds(), &event),
    )
    .await;
    assert_eq!(again.json["disposition"], "early", "{}", again.text);

    reports.push_fault(Fault::AcceptJob);
    let r = route(&e.app, invoke("reports.generate", AGENT, report("run_w3"))).await;
    // The job id is recorded, the early event found and applied: the caller hears applied.
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.outcome(), "applied");
    assert_eq!(r.json["effect_reference"], "report-early");
    assert_eq!(reports.job_ids(), vec!["job_1".to_string()]);
    assert_eq!(reports.polls(), 0, "no poll was needed");
    let row = e.store.webhook("reports", "msg_e").await.unwrap().unwrap();
    assert_eq!(row.disposition, Disposition::Applied);
    assert_eq!(row.key, Some(key("run_w3")));
    assert_eq!(row.finish, None, "a decided row keeps no finish");
    // The sender's later retry is a redelivery.
    let late = route(
        &e.app,
        signed("reports", OLD_SECRET, "msg_e", now_seconds(), &event),
    )
    .await;
    assert_eq!(late.json["redelivery"], true, "{}", late.text);
    assert_eq!(acknowledged(&e.store, &key("run_w3")).await, 1);
}

async fn a_failure_event_settles_the_job_as_refused(e: Env) {
    let reports = e.fakes.fake("reports.generate");
    let job = accepted_job(&e, "run_w4").await;
    reports.fail_job(&job, "period not closed");
    let event =
        json!({"type": "job.failed", "data": {"job_id": job, "error": "period not closed"}});
    let r = route(
        &e.app,
        signed("reports", OLD_SECRET, "msg_f", now_seconds(), &event),
    )
    .await;
    assert_eq!(r.json["disposition"], "failed", "{}", r.text);
    let record = e.store.get(&key("run_w4")).await.unwrap().unwrap();
    assert_eq!(record.status(), RecordStatus::FailedPermanent);
    let replay = route(&e.app, invoke("reports.generate", AGENT, report("run_w4"))).await;
    replay.assert_problem_safe(422, "downstream_rejected");
    assert!(replay.text.contains("period not closed"), "{}", replay.text);
    assert_eq!(reports.effects(), 0);
}

async fn an_event_bound_by_key_finishes_the_job(e: Env) {
    let reports = e.fakes.fake("reports.generate");
    let job = accepted_job(&e, "run_w5").await;
    let reference = finish_at_downstream(reports, &job);
    let event = json!({"type": "job.succeeded", "data": {"operation_key": key("run_w5").as_str(), "report_id": reference}});
    let r = route(
        &e.app,
        signed("reports-by-key", OLD_SECRET, "msg_k", now_seconds(), &event),
    )
    .await;
    assert_eq!(r.json["disposition"], "applied", "{}", r.text);
    // A key of an operation that does not exist.
    let event = json!({"type": "job.succeeded", "data": {"operation_key": key("run_nope").as_str(), "report_id": "x"}});
    let r = route(
        &e.app,
        signed(
            "reports-by-key",
            OLD_SECRET,
            "msg_k2",
            now_seconds(),
            &event,
        ),
    )
    .await;
    assert_eq!(r.json["disposition"], "unknown_operation", "{}", r.text);
    assert_eq!(reports.effects(), 1);
}

async fn another_tenants_event_changes_nothing(e: Env) {
    let reports = e.fakes.fake("reports.generate");
    let job = accepted_job(&e, "run_w6").await;
    let before = e.store.get(&key("run_w6")).await.unwrap();
    // globex's source names acme's job id: no globex job has it, so it is only kept early.
    let event = done(&job, "globex-report");
    let r = route(
        &e.app,
        signed("globex-reports", OLD_SECRET, "msg_g", now_seconds(), &event),
    )
    .await;
    assert_eq!(r.json["disposition"], "early", "{}", r.text);
    // acme's by-key source naming a globex key is refused as another tenant's.
    let globex = OperationKey::new("globex", ENV, "run_w6", "s").unwrap();
    let event = json!({"type": "job.succeeded", "data": {"operation_key": globex.as_str(), "report_id": "x"}});
    let r = route(
        &e.app,
        signed(
            "reports-by-key",
            OLD_SECRET,
            "msg_g2",
            now_seconds(),
            &event,
        ),
    )
    .await;
    assert_eq!(r.json["disposition"], "other_tenant", "{}", r.text);
    assert_eq!(e.store.get(&key("run_w6")).await.unwrap(), before);
    // acme's own poll still finishes the job: the other tenant's early event never applies.
    finish_at_downstream(reports, &job);
    let poll = route(
        &e.app,
        Call::get("/v1/operations/acme:test:run_w6:s", AGENT),
    )
    .await;
    assert_eq!(poll.json["record_status"], "applied", "{}", poll.text);
    assert_ne!(poll.json["effect_reference"], "globex-report");
}

async fn refused_deliveries_leave_no_row(e: Env) {
    let job = accepted_job(&e, "run_w7").await;
    let before = e.store.get(&key("run_w7")).await.unwrap();
    let event = done(&job, "r");
    let cases: Vec<(Call<'static>, u16, &str, &str)> = vec![
        (
            signed("nope", OLD_SECRET, "m_unknown", now_seconds(), &event),
            404,
            "not_found",
            "m_unknown",
        ),
        (
            signed("reports", STRANGER, "m_bad", now_seconds(), &event),
            401,
            "webhook_signature_invalid",
            "m_bad",
        ),
        (
            signed("reports", OLD_SECRET, "m_old", now_seconds() - 301, &event),
            401,
            "webhook_signature_invalid",
            "m_old",
        ),
        (
            signed(
                "reports",
                OLD_SECRET,
                "m_future",
                now_seconds() + 301,
                &event,
            ),
            401,
            "webhook_signature_invalid",
            "m_future",
        ),
        (
            signed(
                "reports",
                OLD_SECRET,
                "m_big",
                now_seconds(),
                &json!({"pad": "x".repeat(5000)}),
            ),
            413,
            "invalid_arguments",
            "m_big",
        ),
        (
            signed(
                "reports",
                OLD_SECRET,
                "m_nojob",
                now_seconds(),
                &json!({"type": "job.succeeded", "data": {}}),
            ),
            400,
            "invalid_arguments",
            "m_nojob",
        ),
    ];
    for (call, status, code, id) in cases {
        let r = route(&e.app, call).await;
        assert_eq!(r.status, status, "{id}: {}", r.text);
        assert_eq!(r.json["error"]["code"], code, "{id}: {}", r.text);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        for source in ["nope", "reports"] {
            assert_eq!(e.store.webhook(source, id).await.unwrap(), None, "{id}");
        }
    }
    // A tampered body under a valid signature of another body.
    let mut tampered = signed("reports", OLD_SECRET, "m_tamper", now_seconds(), &event);
    tampered.body = done(&job, "forged").to_string().into_bytes();
    let r = route(&e.app, tampered).await;
    assert_eq!(r.status, 401, "{}", r.text);
    let detail = r.json["detail"].as_str().unwrap_or("");
    assert!(
        !detail.contains("forged"),
        "the body is never echoed: {detail}"
    );
    // A progress event the source does not map is recorded as ignored.
    let progress = json!({"type": "job.progress", "data": {"job_id": job}});
    let r = route(
        &e.app,
        signed(
            "reports",
            NEW_SECRET,
            "m_progress",
            now_seconds(),
            &progress,
        ),
    )
    .await;
    assert_eq!(r.json["disposition"], "ignored", "{}", r.text);
    assert_eq!(e.store.get(&key("run_w7")).await.unwrap(), before);
    assert_eq!(e.fakes.fake("reports.generate").effects(), 0);
}

async fn a_waiting_caller_hears_the_webhook(e: Env) {
    let reports = e.fakes.fake("reports.generate");
    reports.push_fault(Fault::AcceptJob);
    let app = e.app.clone();
    let waiting = tokio::spawn(async move {
        route(
            &app,
            invoke("reports.generate", AGENT, report("run_w8")).header("prefer", "wait=10"),
        )
        .await
    });
    // Until the job is accepted and recorded.
    let started = tokio::time::Instant::now();
    let job = loop {
        if let Some(RecordState::Pending {
            dispatch: Dispatch::Job { job_id },
            ..
        }) = e.store.get(&key("run_w8")).await.unwrap().map(|r| r.state)
        {
            break job_id;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the job was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The job is still running at the downstream as far as its polls go: only the webhook can
    // finish it.
    let r = route(
        &e.app,
        signed(
            "reports",
            OLD_SECRET,
            "msg_w",
            now_seconds(),
            &done(&job, "report-w"),
        ),
    )
    .await;
    assert_eq!(r.json["disposition"], "applied", "{}", r.text);
    let answer = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting caller hears within its wait")
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(answer.json["effect_reference"], "report-w");
}

/// Two job tools whose downstreams both hand out `job_1`: an event from a source that names
/// both is refused as ambiguous and settles nothing; each tool's own source settles only its
/// own operation, with its own reference.
async fn two_tools_with_the_same_job_id_are_settled_each_by_its_own_source(e: Env) {
    let report_job = accepted_job_of(&e, "reports.generate", "run_t1").await;
    let invoice_job = accepted_job_of(&e, "invoices.generate", "run_t2").await;
    assert_eq!(
        report_job, invoice_job,
        "the downstreams handed out the same id"
    );
    let job = report_job;

    // The invoice job finishes at its downstream.
    let invoice = e
        .fakes
        .fake("invoices.generate")
        .complete_job(&job)
        .reference;
    assert!(invoice.starts_with("invoice_"), "{invoice}");

    // A source that may finish both tools cannot tell which job it means.
    let r = route(
        &e.app,
        signed(
            "all-jobs",
            OLD_SECRET,
            "msg_amb",
            now_seconds(),
            &done(&job, &invoice),
        ),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.json["disposition"], "ambiguous", "{}", r.text);
    assert_eq!(r.json["operation_key"], Value::Null);
    assert_eq!(settled(&e, "run_t1").await.0, RecordStatus::Pending);
    assert_eq!(settled(&e, "run_t2").await.0, RecordStatus::Pending);
    // Its retry hears the same refusal and changes nothing either.
    let again = route(
        &e.app,
        signed(
            "all-jobs",
            OLD_SECRET,
            "msg_amb",
            now_seconds(),
            &done(&job, &invoice),
        ),
    )
    .await;
    assert_eq!(again.status, 409, "{}", again.text);
    assert_eq!(again.json["redelivery"], true);

    // The invoice source settles the invoice operation, and only it.
    let r = route(
        &e.app,
        signed(
            "invoices",
            OLD_SECRET,
            "msg_inv",
            now_seconds(),
            &done(&job, &invoice),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["disposition"], "applied", "{}", r.text);
    assert_eq!(r.json["operation_key"], key("run_t2").as_str());
    assert_eq!(
        settled(&e, "run_t2").await,
        (RecordStatus::Applied, Some(invoice.clone()))
    );
    assert_eq!(settled(&e, "run_t1").await, (RecordStatus::Pending, None));

    // A failure event of the invoice source for the same id finds its own operation settled:
    // it never refuses the report job that is still running.
    let failed = json!({"type": "job.failed", "data": {"job_id": job, "error": "late"}});
    let r = route(
        &e.app,
        signed("invoices", OLD_SECRET, "msg_inv_f", now_seconds(), &failed),
    )
    .await;
    assert_eq!(r.json["disposition"], "settled_differently", "{}", r.text);
    assert_eq!(r.json["operation_key"], key("run_t2").as_str());
    assert_eq!(settled(&e, "run_t1").await, (RecordStatus::Pending, None));

    // The report job finishes; the report source settles the report operation.
    let report_ref = e
        .fakes
        .fake("reports.generate")
        .complete_job(&job)
        .reference;
    assert!(report_ref.starts_with("report_"), "{report_ref}");
    let r = route(
        &e.app,
        signed(
            "reports",
            OLD_SECRET,
            "msg_rep",
            now_seconds(),
            &done(&job, &report_ref),
        ),
    )
    .await;
    assert_eq!(r.json["disposition"], "applied", "{}", r.text);
    assert_eq!(r.json["operation_key"], key("run_t1").as_str());
    assert_eq!(
        settled(&e, "run_t1").await,
        (RecordStatus::Applied, Some(report_ref.clone()))
    );
    assert_eq!(
        settled(&e, "run_t2").await,
        (RecordStatus::Applied, Some(invoice.clone()))
    );

    // Counted at the downstreams: one effect each, under its own key, with the reference its
    // record names.
    assert_eq!(
        effects_of(&e, "reports.generate", "run_t1"),
        vec![report_ref]
    );
    assert_eq!(effects_of(&e, "invoices.generate", "run_t2"), vec![invoice]);
    assert_eq!(e.fakes.fake("reports.generate").effects(), 1);
    assert_eq!(e.fakes.fake("invoices.generate").effects(), 1);
    assert_eq!(acknowledged(&e.store, &key("run_t1")).await, 1);
    assert_eq!(acknowledged(&e.store, &key("run_t2")).await, 1);
}

/// An early event of the invoice source for `job_1` is not applied when the report tool
/// records `job_1`; it is when the invoice tool does.
async fn an_early_event_waits_for_its_own_tool(e: Env) {
    let early = route(
        &e.app,
        signed(
            "invoices",
            OLD_SECRET,
            "msg_early_inv",
            now_seconds(),
            &done("job_1", "invoice-early"),
        ),
    )
    .await;
    assert_eq!(early.status, 202, "{}", early.text);
    assert_eq!(early.json["disposition"], "early");
    let row = e
        .store
        .webhook("invoices", "msg_early_inv")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.environment.as_deref(), Some(ENV));
    assert_eq!(row.tools, vec!["invoices.generate".to_string()]);

    // The report tool records job_1: the invoice event is not its.
    let job = accepted_job_of(&e, "reports.generate", "run_t3").await;
    assert_eq!(job, "job_1");
    assert_eq!(settled(&e, "run_t3").await, (RecordStatus::Pending, None));
    let poll = route(&e.app, invoke("reports.generate", AGENT, report("run_t3"))).await;
    assert_eq!(poll.outcome(), "in_flight", "{}", poll.text);
    assert_eq!(
        e.store
            .webhook("invoices", "msg_early_inv")
            .await
            .unwrap()
            .unwrap()
            .disposition,
        Disposition::Early
    );

    // The invoice tool records job_1: the early event finishes it at once.
    let invoices = e.fakes.fake("invoices.generate");
    invoices.push_fault(Fault::AcceptJob);
    let r = route(&e.app, invoke("invoices.generate", AGENT, report("run_t4"))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.outcome(), "applied");
    assert_eq!(r.json["effect_reference"], "invoice-early");
    assert_eq!(invoices.job_ids(), vec!["job_1".to_string()]);
    assert_eq!(settled(&e, "run_t3").await, (RecordStatus::Pending, None));
    let row = e
        .store
        .webhook("invoices", "msg_early_inv")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.disposition, Disposition::Applied);
    assert_eq!(row.key, Some(key("run_t4")));
    assert_eq!(e.fakes.fake("reports.generate").effects(), 0);
}

/// A key-bound event naming an operation of a tool its source does not list changes nothing,
/// and neither does one naming a claim released unsent.
async fn an_event_never_finishes_another_tool_or_a_released_claim(e: Env) {
    let job = accepted_job_of(&e, "invoices.generate", "run_t5").await;
    let reference = e
        .fakes
        .fake("invoices.generate")
        .complete_job(&job)
        .reference;
    let event = json!({"type": "job.succeeded", "data": {"operation_key": key("run_t5").as_str(), "report_id": reference}});
    let r = route(
        &e.app,
        signed(
            "reports-by-key",
            OLD_SECRET,
            "msg_other_tool",
            now_seconds(),
            &event,
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["disposition"], "other_tool", "{}", r.text);
    assert_eq!(settled(&e, "run_t5").await, (RecordStatus::Pending, None));

    // A report claim released unsent (the connection was refused): nothing reached the
    // downstream, and an event that claims otherwise does not settle it.
    let reports = e.fakes.fake("reports.generate");
    reports.push_fault(Fault::NotSent);
    let r = route(&e.app, invoke("reports.generate", AGENT, report("run_t6"))).await;
    assert_eq!(r.outcome(), "rejected", "{}", r.text);
    let before = e.store.get(&key("run_t6")).await.unwrap().unwrap();
    assert!(
        matches!(&before.state, RecordState::Pending { lease, dispatch: Dispatch::NotSent } if lease.owner.is_none()),
        "{before:?}"
    );
    let event = json!({"type": "job.succeeded", "data": {"operation_key": key("run_t6").as_str(), "report_id": "forged"}});
    let r = route(
        &e.app,
        signed(
            "reports-by-key",
            OLD_SECRET,
            "msg_released",
            now_seconds(),
            &event,
        ),
    )
    .await;
    assert_eq!(r.json["disposition"], "not_pending", "{}", r.text);
    assert_eq!(e.store.get(&key("run_t6")).await.unwrap(), Some(before));
    assert_eq!(reports.effects(), 0);
    assert_eq!(e.fakes.fake("invoices.generate").effects(), 1);
}

const HOUR: i64 = 3_600_000;

/// The audit entries of the actor `evidence`.
async fn evidence_entries(store: &Arc<dyn Store>) -> Vec<idemgate_core::audit::Entry> {
    store
        .audit_log(0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.actor == "evidence")
        .collect()
}

/// Runs `exports.generate` for `workflow` until its job passes its three-day deadline and the
/// operation is `unknown`; the job's id.
async fn job_past_its_deadline(e: &Env, workflow: &str) -> String {
    let exports = e.fakes.fake("exports.generate");
    let job = accepted_job_of(e, "exports.generate", workflow).await;
    // Past the retry window (1h) the job is still running: in flight, not unknown.
    e.clock.advance(2 * HOUR);
    let r = route(&e.app, invoke("exports.generate", AGENT, report(workflow))).await;
    assert_eq!(r.outcome(), "in_flight", "{}", r.text);
    e.clock.advance(47 * HOUR);
    let r = route(&e.app, invoke("exports.generate", AGENT, report(workflow))).await;
    assert_eq!(r.outcome(), "in_flight", "{}", r.text);
    assert_eq!(settled(e, workflow).await.0, RecordStatus::Pending);
    // Past its own deadline (3d from the claim) it ends unknown.
    e.clock.advance(23 * HOUR + 1_000);
    let r = route(&e.app, invoke("exports.generate", AGENT, report(workflow))).await;
    assert_eq!(r.outcome(), "unknown", "{}", r.text);
    assert!(r.text.contains("max_running"), "{}", r.text);
    assert_eq!(settled(e, workflow).await.0, RecordStatus::Unknown);
    assert_eq!(exports.effects(), 0);
    job
}

/// Waiting is not ambiguity: a job the downstream reports running is in flight until the
/// contract's job deadline, not its retry window; past it `unknown`, and when the downstream
/// later reports the job done, the next delivery's poll settles the record — as the actor
/// `evidence`, with no new send.
async fn a_running_job_stays_in_flight_until_its_own_deadline_then_a_poll_settles_it(e: Env) {
    let exports = e.fakes.fake("exports.generate");
    let job = job_past_its_deadline(&e, "run_x1").await;
    assert!(evidence_entries(&e.store).await.is_empty());

    let reference = exports.complete_job(&job).reference;
    let r = route(&e.app, invoke("exports.generate", AGENT, report("run_x1"))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.outcome(), "replayed", "{}", r.text);
    assert_eq!(r.json["effect_reference"], reference.as_str());
    assert_eq!(
        settled(&e, "run_x1").await,
        (RecordStatus::Applied, Some(reference.clone()))
    );
    // Audited as the actor `evidence`, and in the record's trace (the console's timeline).
    let entries = evidence_entries(&e.store).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].action, "settled_by_evidence");
    assert_eq!(entries[0].operation_key, key("run_x1").as_str());
    assert_eq!(entries[0].reference.as_deref(), Some(reference.as_str()));
    let trace = e.store.events(&key("run_x1")).await.unwrap();
    assert!(
        trace
            .iter()
            .any(|ev| ev.kind == EventKind::Reconciled && ev.worker == "evidence"),
        "{trace:?}"
    );
    // Counted at the downstream: one send, one effect, under this key.
    assert_eq!(exports.calls(), 1);
    assert_eq!(
        effects_of(&e, "exports.generate", "run_x1"),
        vec![reference]
    );
    // Settled: a later delivery replays without a poll.
    let polls = exports.polls();
    let again = route(&e.app, invoke("exports.generate", AGENT, report("run_x1"))).await;
    assert_eq!(again.outcome(), "replayed", "{}", again.text);
    assert_eq!(exports.polls(), polls);
    assert_eq!(evidence_entries(&e.store).await.len(), 1);
}

/// A webhook event that reports the job of an `unknown` operation done settles it, as the
/// actor `evidence`; its redelivery changes nothing.
async fn a_webhook_settles_an_unknown_job_as_evidence(e: Env) {
    let exports = e.fakes.fake("exports.generate");
    let job = job_past_its_deadline(&e, "run_x2").await;
    let reference = exports.complete_job(&job).reference;
    let event = done(&job, &reference);
    let r = route(
        &e.app,
        signed(
            "exports",
            OLD_SECRET,
            "msg_x2",
            idemgate_core::clock::Clock::now(&*e.clock) / 1000,
            &event,
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["disposition"], "applied", "{}", r.text);
    assert_eq!(r.json["operation_key"], key("run_x2").as_str());
    assert_eq!(
        settled(&e, "run_x2").await,
        (RecordStatus::Applied, Some(reference.clone()))
    );
    let entries = evidence_entries(&e.store).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0].reason.contains("msg_x2"), "{:?}", entries[0]);
    let again = route(
        &e.app,
        signed(
            "exports",
            OLD_SECRET,
            "msg_x2",
            idemgate_core::clock::Clock::now(&*e.clock) / 1000,
            &event,
        ),
    )
    .await;
    assert_eq!(again.json["redelivery"], true, "{}", again.text);
    assert_eq!(evidence_entries(&e.store).await.len(), 1);
    assert_eq!(exports.calls(), 1);
    assert_eq!(
        effects_of(&e, "exports.generate", "run_x2"),
        vec![reference]
    );
}
