//! The seed's remaining scenarios through API v1 over real loopback HTTP: the gateway on port
//! 0, its HTTP downstream calling a `FakeServer` that is the system of record, and every effect
//! counted on the fake's own side — never only from the gateway's answers.
//!
//! | scenario | test |
//! |---|---|
//! | crash after the claim | `a_crash_after_the_claim_ends_at_one_effect_after_a_restart` |
//! | new key, same arguments, inside the duplicate-intent window | `the_duplicate_intent_window_refuses_the_same_arguments_under_a_new_key` |
//! | provable non-delivery (429) releases the claim | `a_not_processed_answer_releases_the_claim_and_the_retry_applies` |
//! | provable non-delivery (connection refused) | `a_refused_connection_releases_the_claim_and_the_retry_applies` |
//! | key after retention, `tombstone` policy | `late_arrival_tombstone_replays_the_reference_only` |
//! | key after retention, `reconcile` policy | `late_arrival_reconcile_answers_unknown` |
//! | delayed job | `an_async_job_is_in_flight_until_the_fake_completes_it` |
//!
//! Time is a `ManualClock` injected through `Gateway::clock`, so leases and retention are
//! crossed by moving it, not by sleeping.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use idemgate_app::{HttpEffects, ToolSet};
use idemgate_conformance::downstream::FakeDownstream;
use idemgate_conformance::gate::bounded;
use idemgate_conformance::harness::EPOCH;
use idemgate_conformance::http_fake::{FakeServer, HttpFault, SeenRequest};
use idemgate_core::clock::ManualClock;
use idemgate_core::contract::Contract;
use idemgate_core::store::Store;
use idemgate_server::{AppState, Gateway};
use serde_json::{Value, json};

const HOUR_MS: i64 = 3_600_000;

/// A ticket tool named `name` against the fake at `fake`: the fake deduplicates on the key and
/// answers receipt lookups. `hook` adds the fake's authorization hook; `retention` and `extra`
/// are YAML spliced in (the late-arrival policy, a duplicate-intent window).
fn ticket_tool(
    name: &str,
    fake: SocketAddr,
    hook: bool,
    late_arrival: &str,
    extra: &str,
) -> Contract {
    let security = if hook {
        format!("security:\n  authorization_hook:\n    url: http://{fake}/auth\n")
    } else {
        String::new()
    };
    let text = format!(
        r#"
name: {name}
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    subject: {{type: string, minLength: 1}}
    body: {{type: string}}
  required: [subject, body]
  additionalProperties: false
request_fingerprint:
  fields: [subject, body]
downstream:
  deduplicates_by_key: true
  receipt_lookup: true
  http:
    url: http://{fake}/tickets
    reference: /ticket_id
    lookup:
      url: http://{fake}/tickets/by-key/{{operation_key}}
      reference: /ticket_id
    timeouts:
      connect: 2s
      total: 5s
{security}retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  late_arrival: {late_arrival}
  max_retry_window: 1h
lease_seconds: 3
{extra}
"#
    );
    Contract::load(&text, &format!("{name}.yaml")).unwrap()
}

/// `reports.generate` against the fake's `/reports`, which always answers `202` with a job.
fn reports_tool(fake: SocketAddr) -> Contract {
    let text = format!(
        r#"
name: reports.generate
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    period: {{type: string, minLength: 1}}
  required: [period]
  additionalProperties: false
request_fingerprint:
  fields: [period]
downstream:
  deduplicates_by_key: true
  async_jobs: true
  http:
    url: http://{fake}/reports
    reference: /report_id
    result: /report
    job:
      id: /job_id
      poll_url: http://{fake}/jobs/{{job_id}}
      state: /status
      done: [done]
      failed: [failed]
      reference: /report_id
      result: /report
      error_message: /error
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
lease_seconds: 60
"#
    );
    Contract::load(&text, "reports.generate.yaml").unwrap()
}

fn sqlite(path: &Path) -> Arc<dyn Store> {
    Arc::new(idemgate_store_sqlite::SqliteStore::open(path, Default::default()).unwrap())
}

/// A gateway state over the HTTP downstream, a SQLite file and `clock`.
fn state(store: Arc<dyn Store>, contracts: Vec<Contract>, clock: Arc<ManualClock>) -> AppState {
    let tools = ToolSet::build(contracts, &HttpEffects).unwrap();
    Gateway::new(store, tools, tokens())
        .clock(clock)
        .environment(ENV)
        .build()
}

fn ticket(workflow: &str, subject: &str) -> Value {
    json!({"workflow_id": workflow, "step_id": "s", "arguments": {"subject": subject, "body": "Order 42 arrived broken."}})
}

/// The requests the fake received on `POST /tickets` (effect attempts, committed or not).
fn ticket_posts(fake: &FakeServer) -> Vec<SeenRequest> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/tickets")
        .collect()
}

fn retry_after(reply: &Reply) -> u64 {
    reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("Retry-After on {}", reply.text))
        .parse()
        .expect("Retry-After in delta-seconds")
}

/// An `applied` answer; its effect reference.
fn assert_applied(reply: &Reply) -> String {
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.outcome(), "applied", "{}", reply.text);
    assert_eq!(reply.json["status"], "applied");
    assert_eq!(reply.json["safe_to_repeat"], false);
    assert_eq!(reply.header("idempotent-replayed"), None);
    reply.json["effect_reference"]
        .as_str()
        .expect("an effect reference")
        .to_string()
}

fn assert_replayed(reply: &Reply, reference: &str) {
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.outcome(), "replayed", "{}", reply.text);
    assert_eq!(reply.header("idempotent-replayed"), Some("true"));
    assert_eq!(reply.json["status"], "replayed");
    assert_eq!(reply.json["effect_reference"], reference, "{}", reply.text);
}

/// Crash after the claim: the first gateway claims, sends, and the fake holds the request
/// before its commit; the first gateway's runtime is torn down whole (lease renewal with it).
/// A restarted gateway on the same SQLite file, with the clock moved past the lease, recovers
/// the claim on the retry: it looks the receipt up (none: nothing committed), takes the claim
/// over and resends under the same key. The held request is then released; should the fake
/// still be processing it (its connection died with the first gateway), it is deduplicated on
/// the key. One effect.
#[test]
fn a_crash_after_the_claim_ends_at_one_effect_after_a_restart() {
    let test = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gate.sqlite");
    let clock = Arc::new(ManualClock::new(EPOCH));
    let fake = test.block_on(FakeServer::start());
    let contract = || ticket_tool("tickets.create", fake.addr(), true, "reject", "");

    // The first gateway lives in its own runtime, dropped mid-request.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let first = doomed.block_on(Gate::start(state(
        sqlite(&file),
        vec![contract()],
        clock.clone(),
    )));
    let gate = fake.downstream().before_commit();
    gate.arm();
    let addr = first.addr;
    let delivery = test.spawn(async move {
        http(addr, invoke("tickets.create", AGENT, ticket("run_1", "a"))).await
    });
    test.block_on(bounded(
        "the request is held before the commit",
        gate.reached(),
    ));
    assert_eq!(fake.downstream().effects(), 0, "nothing committed yet");

    // The claim is durable and owned: a concurrent delivery waits.
    test.block_on(async {
        let view = http(addr, Call::get("/v1/operations/acme:test:run_1:s", AGENT)).await;
        assert_eq!(view.status, 200, "{}", view.text);
        assert_eq!(view.json["record_status"], "pending", "{}", view.text);
        let busy = http(addr, invoke("tickets.create", AGENT, ticket("run_1", "a"))).await;
        assert_eq!(busy.status, 409, "{}", busy.text);
        assert_eq!(busy.outcome(), "in_flight");
        assert_eq!(busy.json["next_action"], "poll");
        assert!(retry_after(&busy) >= 1);
    });

    // The crash.
    doomed.shutdown_timeout(Duration::from_millis(100));
    drop(first);
    let _ = test.block_on(async { tokio::time::timeout(Duration::from_secs(5), delivery).await });
    // Later arrivals pass the gate; the held request stays held for now.
    gate.disarm();
    assert_eq!(fake.downstream().effects(), 0);

    test.block_on(async {
        clock.advance(4_000);
        let second = Gate::start(state(sqlite(&file), vec![contract()], clock.clone())).await;
        let retry = http(
            second.addr,
            invoke("tickets.create", AGENT, ticket("run_1", "a")),
        )
        .await;
        assert_eq!(retry.status, 200, "{}", retry.text);
        assert_eq!(retry.outcome(), "applied", "{}", retry.text);
        assert!(
            fake.downstream().lookups() >= 1,
            "recovery asked for the receipt before resending"
        );
        let reference = retry.json["effect_reference"].as_str().unwrap().to_string();
        assert_eq!(fake.downstream().effects(), 1, "the recovery's resend");

        // The original request, released after the restart, is deduplicated on its key.
        gate.release();
        for _ in 0..50 {
            if gate.blocked() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            fake.downstream().effects(),
            1,
            "one effect across the crash, counted by the fake"
        );
        assert!(
            fake.downstream().deduplicated() <= 1,
            "a late original, if any, was deduplicated"
        );
        let posts = ticket_posts(&fake);
        assert!(
            posts.len() >= 2,
            "the original send and the recovery's resend"
        );
        assert!(
            posts
                .iter()
                .all(|p| p.idempotency_key.as_deref() == Some("acme:test:run_1:s")),
            "every send carried the operation key"
        );

        let again = http(
            second.addr,
            invoke("tickets.create", AGENT, ticket("run_1", "a")),
        )
        .await;
        assert_replayed(&again, &reference);
        let view = http(
            second.addr,
            Call::get("/v1/operations/acme:test:run_1:s", AGENT),
        )
        .await;
        assert_eq!(view.json["record_status"], "applied", "{}", view.text);
        assert!(view.json["attempt"].as_u64().unwrap() >= 2, "taken over");
        assert_eq!(fake.downstream().effects(), 1);
        second.stop().await;
    });
    test.block_on(fake.shutdown());
}

/// New key, same arguments, inside the contract's duplicate-intent window: refused as a
/// possible duplicate with `ask_for_approval`, and nothing reaches the fake. Different
/// arguments, or the same after the window, are new operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_duplicate_intent_window_refuses_the_same_arguments_under_a_new_key() {
    let fake = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(EPOCH));
    let contract = ticket_tool(
        "tickets.create",
        fake.addr(),
        true,
        "reject",
        "duplicate_intent_window: 10m",
    );
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![contract],
        clock.clone(),
    ))
    .await;

    let first = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_a", "Refund")),
    )
    .await;
    assert_applied(&first);
    assert_eq!(fake.downstream().effects(), 1);

    clock.advance(60_000);
    let again = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_b", "Refund")),
    )
    .await;
    again.assert_problem_after_effect(422, "possible_duplicate_intent");
    assert_eq!(again.json["next_action"], "ask_for_approval");
    assert_eq!(again.json["operation_key"], "acme:test:run_b:s");
    assert_eq!(again.header("idempotent-replayed"), None);
    assert_eq!(
        fake.downstream().effects(),
        1,
        "no effect for the duplicate"
    );
    assert_eq!(ticket_posts(&fake).len(), 1, "the fake never saw it");
    // Held for an operator, not dropped: asking for approval leads somewhere.
    let held = http(
        gate.addr,
        Call::get("/v1/operations/acme:test:run_b:s", AGENT),
    )
    .await;
    assert_eq!(held.status, 200, "{}", held.text);
    assert_eq!(
        held.json["record_status"], "awaiting_approval",
        "{}",
        held.text
    );

    // The window holds the same fingerprint only.
    let other = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_c", "Other")),
    )
    .await;
    assert_applied(&other);
    assert_eq!(fake.downstream().effects(), 2);

    // Past the window, the same arguments under a new key are a new operation.
    clock.advance(11 * 60_000);
    let later = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_d", "Refund")),
    )
    .await;
    assert_applied(&later);
    assert_eq!(fake.downstream().effects(), 3);

    gate.stop().await;
    fake.shutdown().await;
}

/// The fake answers `429 Too Many Requests` with `Retry-After`: provably not processed, so the
/// claim is released and the caller gets a retryable rejection (503 with `Retry-After`); the
/// retry under the same key applies. One effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_processed_answer_releases_the_claim_and_the_retry_applies() {
    let fake = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(EPOCH));
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![ticket_tool(
            "tickets.create",
            fake.addr(),
            true,
            "reject",
            "",
        )],
        clock,
    ))
    .await;

    fake.push_fault(HttpFault::not_processed(7));
    let busy = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    busy.assert_problem_safe(503, "downstream_unavailable");
    assert_eq!(busy.json["operation_key"], "acme:test:run_1:s");
    assert_eq!(retry_after(&busy), 7, "the fake's advice: {}", busy.text);
    assert_eq!(busy.json["retry_after_seconds"], retry_after(&busy));
    assert_eq!(ticket_posts(&fake).len(), 1, "the request reached the fake");
    assert_eq!(fake.downstream().effects(), 0, "and was not processed");

    // Released, not stuck: the retry does not wait out a lease.
    let retry = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    let reference = assert_applied(&retry);
    assert_eq!(fake.downstream().effects(), 1);
    let replay = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    assert_replayed(&replay, &reference);
    assert_eq!(
        fake.downstream().effects(),
        1,
        "one effect, counted by the fake"
    );
    assert_eq!(
        ticket_posts(&fake).len(),
        2,
        "the refused send and the applied one"
    );

    gate.stop().await;
    fake.shutdown().await;
}

/// The downstream's port refuses the connection: nothing left the process, so the claim is
/// released with a retryable 503. Once the ticket service is up on that port, the retry
/// applies. One effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_releases_the_claim_and_the_retry_applies() {
    // A loopback port with nothing listening on it.
    let vacant = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(EPOCH));
    // No authorization hook: with the service down it would refuse first (fail closed).
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![ticket_tool("tickets.create", vacant, false, "reject", "")],
        clock,
    ))
    .await;

    let refused = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    refused.assert_problem_safe(503, "downstream_unavailable");
    assert!(retry_after(&refused) >= 1);

    let downstream = FakeDownstream::new()
        .deduplicating(true)
        .with_receipt_lookup(true);
    let fake = FakeServer::start_with(downstream, vacant)
        .await
        .expect("the vacant port is still free");
    let retry = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    let reference = assert_applied(&retry);
    let replay = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    assert_replayed(&replay, &reference);
    assert_eq!(
        fake.downstream().effects(),
        1,
        "one effect, counted by the fake"
    );
    assert_eq!(ticket_posts(&fake).len(), 1, "one send reached it");

    gate.stop().await;
    fake.shutdown().await;
}

/// Applies `run_1` on `tool`, moves the clock past `record_ttl`, and returns the reference,
/// the running gateway and its state (for the sweeper).
async fn applied_then_expired(
    fake: &FakeServer,
    late_arrival: &str,
    dir: &Path,
) -> (String, Gate, AppState, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(EPOCH));
    let app = state(
        sqlite(&dir.join("gate.sqlite")),
        vec![ticket_tool(
            "tickets.create",
            fake.addr(),
            true,
            late_arrival,
            "",
        )],
        clock.clone(),
    );
    let gate = Gate::start(app.clone()).await;
    let first = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    let reference = assert_applied(&first);
    let replay = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    assert_replayed(&replay, &reference);
    assert!(
        replay.json["result"].is_object(),
        "the full result within retention"
    );
    // Past record_ttl (1 h), within tombstone_ttl (1 d).
    clock.advance(2 * HOUR_MS);
    (reference, gate, app, clock)
}

/// `late_arrival: tombstone`: past `record_ttl` the delivery is replayed with the effect
/// reference only — before and after the sweeper compacts the record — and never becomes a
/// second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_arrival_tombstone_replays_the_reference_only() {
    let fake = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (reference, gate, app, _clock) = applied_then_expired(&fake, "tombstone", dir.path()).await;

    let check = |late: &Reply| {
        assert_replayed(late, &reference);
        assert_eq!(
            late.json["result"],
            Value::Null,
            "the reference only: {}",
            late.text
        );
        assert_eq!(
            late.json["error"]["code"], "expired_operation",
            "{}",
            late.text
        );
        assert_eq!(late.json["safe_to_repeat"], false);
    };
    let late = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    check(&late);

    let swept = app.executor().sweep(ENV, 100).await.unwrap();
    let view = http(
        gate.addr,
        Call::get("/v1/operations/acme:test:run_1:s", AGENT),
    )
    .await;
    assert_eq!(
        view.json["record_status"], "tombstone",
        "{swept:?} {}",
        view.text
    );
    let late = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    check(&late);

    assert_eq!(fake.downstream().effects(), 1, "counted by the fake");
    assert_eq!(ticket_posts(&fake).len(), 1, "the fake saw one send");
    gate.stop().await;
    fake.shutdown().await;
}

/// `late_arrival: reconcile`: past `record_ttl` the delivery answers 202 `unknown` with the
/// reference kept, for a person to settle — before and after compaction — and no effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_arrival_reconcile_answers_unknown() {
    let fake = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (reference, gate, app, _clock) = applied_then_expired(&fake, "reconcile", dir.path()).await;

    let check = |late: &Reply| {
        assert_eq!(late.status, 202, "{}", late.text);
        assert_eq!(late.outcome(), "unknown");
        assert_eq!(late.json["status"], "unknown");
        assert_eq!(late.json["next_action"], "reconcile");
        assert_eq!(late.json["safe_to_repeat"], false);
        assert_eq!(late.json["effect_reference"], reference.as_str());
        assert_eq!(
            late.json["error"]["code"], "expired_operation",
            "{}",
            late.text
        );
        assert_eq!(late.header("idempotent-replayed"), None);
    };
    let late = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    check(&late);

    app.executor().sweep(ENV, 100).await.unwrap();
    let view = http(
        gate.addr,
        Call::get("/v1/operations/acme:test:run_1:s", AGENT),
    )
    .await;
    assert_eq!(view.json["record_status"], "tombstone", "{}", view.text);
    let late = http(
        gate.addr,
        invoke("tickets.create", AGENT, ticket("run_1", "a")),
    )
    .await;
    check(&late);

    assert_eq!(fake.downstream().effects(), 1, "counted by the fake");
    assert_eq!(ticket_posts(&fake).len(), 1, "the fake saw one send");
    gate.stop().await;
    fake.shutdown().await;
}

/// A delayed job over real HTTP: the fake answers 202 with a job id ⇒ `in_flight` 409 with
/// `Retry-After`; a retry polls the job and does not submit again; `GET /v1/operations/{key}`
/// polls it; once the fake completes the job, the poll records it and the delivery replays the
/// reference. One job submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_job_is_in_flight_until_the_fake_completes_it() {
    let fake = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(EPOCH));
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![reports_tool(fake.addr())],
        clock,
    ))
    .await;
    let body = json!({"workflow_id": "run_1", "step_id": "s", "arguments": {"period": "2026-01"}});
    let submitted = || {
        fake.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/reports")
            .count()
    };

    let accepted = http(gate.addr, invoke("reports.generate", AGENT, body.clone())).await;
    assert_eq!(accepted.status, 409, "{}", accepted.text);
    assert_eq!(accepted.outcome(), "in_flight");
    assert_eq!(accepted.json["next_action"], "poll");
    assert_eq!(accepted.json["safe_to_repeat"], false);
    assert!(retry_after(&accepted) >= 1);
    let jobs = fake.downstream().job_ids();
    assert_eq!(jobs.len(), 1, "one job submitted");
    let job = jobs[0].clone();

    let retry = http(gate.addr, invoke("reports.generate", AGENT, body.clone())).await;
    assert_eq!(retry.status, 409, "{}", retry.text);
    assert_eq!(retry.outcome(), "in_flight");
    assert!(retry_after(&retry) >= 1);

    let running = http(
        gate.addr,
        Call::get("/v1/operations/acme:test:run_1:s", AGENT),
    )
    .await;
    assert_eq!(running.status, 200, "{}", running.text);
    assert_eq!(running.json["record_status"], "pending");
    assert_eq!(running.json["job_id"], job.as_str());
    assert_eq!(
        running.json["outcome"]["status"], "in_flight",
        "{}",
        running.text
    );
    assert_eq!(fake.downstream().effects(), 0, "the job has not finished");

    let receipt = fake.downstream().complete_job(&job);
    let done = http(
        gate.addr,
        Call::get("/v1/operations/acme:test:run_1:s", AGENT),
    )
    .await;
    assert_eq!(done.json["record_status"], "applied", "{}", done.text);
    assert_eq!(done.json["effect_reference"], receipt.reference.as_str());

    let replay = http(gate.addr, invoke("reports.generate", AGENT, body)).await;
    assert_replayed(&replay, &receipt.reference);
    assert_eq!(replay.json["result"], receipt.result, "{}", replay.text);
    assert_eq!(submitted(), 1, "one job submitted, counted by the fake");
    assert_eq!(fake.downstream().job_ids().len(), 1);
    assert_eq!(fake.downstream().effects(), 1);
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.path == format!("/jobs/{job}")),
        "the gateway polled the fake's job"
    );

    gate.stop().await;
    fake.shutdown().await;
}
