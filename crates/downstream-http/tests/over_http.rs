//! `HttpDownstream` and `HttpAuthorizer` against the fake ticket service over real loopback
//! HTTP. Every case asserts both sides: how the answer was classified, and how many effects the
//! fake counted on its own side.

mod common;

use std::time::Duration;

use common::{bounded, key, load, request, ticket_args, tickets};
use idemgate_conformance::downstream::Fault;
use idemgate_conformance::http_fake::{AuthMode, FakeServer, HttpFault};
use idemgate_core::ErrorCode;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{
    AuthRequest, AuthStage, Authorization, Authorizer, Downstream, EffectOutcome, EffectRequest,
    JobStatus, Lookup,
};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_downstream_http::{HttpAuthorizer, HttpDownstream};
use serde_json::{Value, json};

/// The outcome's kind, with the detail that matters to the table.
fn kind(outcome: &EffectOutcome) -> String {
    match outcome {
        EffectOutcome::Committed(r) => format!("committed {}", r.reference),
        EffectOutcome::Accepted { job_id } => format!("accepted {job_id}"),
        EffectOutcome::Refused(r) => format!("refused {}", r.code.as_str()),
        EffectOutcome::PreconditionFailed(_) => "precondition".into(),
        EffectOutcome::NotSent { retry_after, .. } => format!("not_sent {retry_after:?}"),
        EffectOutcome::Ambiguous { retry_after, .. } => format!("ambiguous {retry_after:?}"),
    }
}

/// One scripted fault on one request: the classified outcome, the effects the fake counted,
/// and whether a receipt lookup then finds the effect.
async fn check(fault: Option<HttpFault>, expect: &str, effects: usize) {
    let server = FakeServer::start().await;
    if let Some(f) = fault.clone() {
        server.push_fault(f);
    }
    let contract = tickets(&format!("http://{}", server.addr()), true, true, "400ms");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    let outcome = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(kind(&outcome), expect, "{fault:?}: {outcome:?}");
    assert_eq!(server.downstream().effects(), effects, "{fault:?}: effects");
    assert_eq!(server.downstream().effects_for(&k), effects, "{fault:?}");
    let found = bounded(downstream.lookup_receipt(&k)).await;
    assert_eq!(
        matches!(found, Lookup::Found(_)),
        effects == 1,
        "{fault:?}: {found:?}"
    );
    if let (Lookup::Found(receipt), EffectOutcome::Committed(committed)) = (&found, &outcome) {
        assert_eq!(
            receipt, committed,
            "the lookup finds the receipt the effect answered"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
#[rustfmt::skip]
async fn each_fault_is_classified_and_counted_on_the_downstream_side() {
    check(None, "committed ticket_1", 1).await;
    check(Some(HttpFault::CommitThenDrop), "ambiguous None", 1).await;
    check(Some(HttpFault::CommitThenStatus(500)), "ambiguous None", 1).await;
    check(Some(HttpFault::CommitThenStatus(502)), "ambiguous None", 1).await;
    check(Some(HttpFault::CommitThenStatus(503)), "ambiguous None", 1).await;
    check(Some(HttpFault::CommitThenDelay(Duration::from_secs(3))), "ambiguous None", 1).await;
    check(Some(HttpFault::CommitThenInvalidJson), "ambiguous None", 1).await;
    check(Some(HttpFault::CommitThenMissingReference), "ambiguous None", 1).await;
    check(Some(HttpFault::refuse()), "refused downstream_rejected", 0).await;
    check(Some(HttpFault::Status { status: 404, retry_after: None }), "refused downstream_rejected", 0).await;
    check(Some(HttpFault::not_processed(7)), "not_sent Some(7)", 0).await;
    check(Some(HttpFault::Status { status: 408, retry_after: None }), "not_sent None", 0).await;
    check(Some(HttpFault::Status { status: 425, retry_after: Some(2) }), "not_sent Some(2)", 0).await;
    check(Some(HttpFault::Status { status: 409, retry_after: None }), "ambiguous None", 0).await;
    check(Some(HttpFault::Status { status: 412, retry_after: None }), "precondition", 0).await;
    check(Some(HttpFault::Status { status: 500, retry_after: None }), "ambiguous None", 0).await;
    // A 5xx's Retry-After is advice for the resend, carried on the ambiguous outcome.
    check(Some(HttpFault::Status { status: 503, retry_after: Some(30) }), "ambiguous Some(30)", 0).await;
    check(Some(HttpFault::Status { status: 500, retry_after: Some(4) }), "ambiguous Some(4)", 0).await;
    check(Some(HttpFault::Hang(Duration::from_secs(3))), "ambiguous None", 0).await;
    // A 202 where the contract declares no jobs proves nothing.
    check(Some(HttpFault::AcceptJob), "ambiguous None", 0).await;
}

/// The reason an ambiguous answer gives: how far the request got.
async fn ambiguous_reason(fault: HttpFault) -> String {
    let server = FakeServer::start().await;
    server.push_fault(fault.clone());
    let contract = tickets(&format!("http://{}", server.addr()), true, true, "400ms");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    match bounded(downstream.perform(request(&k, &args))).await {
        EffectOutcome::Ambiguous { reason, .. } => reason,
        other => panic!("{fault:?}: expected ambiguous, got {other:?}"),
    }
}

#[tokio::test]
async fn ambiguous_answers_say_how_far_the_request_got() {
    let dropped = ambiguous_reason(HttpFault::CommitThenDrop).await;
    assert!(
        dropped.starts_with("connection lost after the request was sent"),
        "{dropped}"
    );
    let slow = ambiguous_reason(HttpFault::CommitThenDelay(Duration::from_secs(3))).await;
    assert!(slow.starts_with("timed out"), "{slow}");
    let failed = ambiguous_reason(HttpFault::CommitThenStatus(500)).await;
    assert_eq!(failed, "downstream answered 500 Internal Server Error");
    let broken = ambiguous_reason(HttpFault::CommitThenInvalidJson).await;
    assert!(broken.contains("not JSON"), "{broken}");
    let empty = ambiguous_reason(HttpFault::CommitThenMissingReference).await;
    assert!(
        empty.contains("no usable reference at `/ticket_id`"),
        "{empty}"
    );
}

#[tokio::test]
async fn faults_queued_on_the_fake_downstream_travel_as_http() {
    for (fault, expect, effects) in [
        (Fault::CommitThenDrop, "ambiguous None", 1),
        (Fault::CommitThenFail, "ambiguous None", 1),
        (Fault::Malformed, "ambiguous None", 1),
        (Fault::PreconditionFailed, "precondition", 0),
        (Fault::NotSent, "not_sent Some(1)", 0),
        (
            Fault::Refuse {
                code: ErrorCode::DownstreamRejected,
                message: "queue closed".into(),
            },
            "refused downstream_rejected",
            0,
        ),
    ] {
        let server = FakeServer::start().await;
        server.downstream().push_fault(fault.clone());
        let contract = tickets(&format!("http://{}", server.addr()), true, true, "2s");
        let downstream = HttpDownstream::from_contract(&contract).unwrap();
        let (k, args) = (key("s1"), ticket_args());
        let outcome = bounded(downstream.perform(request(&k, &args))).await;
        assert_eq!(kind(&outcome), expect, "{fault:?}: {outcome:?}");
        assert_eq!(server.downstream().effects(), effects, "{fault:?}");
        server.shutdown().await;
    }
}

#[tokio::test]
async fn the_request_carries_the_key_the_arguments_and_the_static_headers() {
    let server = FakeServer::start().await;
    let contract = tickets(&format!("http://{}", server.addr()), true, true, "2s");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    bounded(downstream.perform(request(&k, &args))).await;
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].idempotency_key.as_deref(), Some(k.as_str()));
    assert_eq!(seen[0].body.as_ref(), Some(&args));
    assert_eq!(seen[0].header("content-type"), Some("application/json"));
    assert_eq!(seen[0].header("x-client"), Some("idemgate-tests"));
    assert_eq!(seen[0].if_match, None);
}

#[tokio::test]
async fn a_refusal_carries_the_status_and_a_short_reason_only() {
    let server = FakeServer::start().await;
    server.downstream().push_fault(Fault::Refuse {
        code: ErrorCode::DownstreamRejected,
        message: "queue closed".into(),
    });
    let contract = tickets(&format!("http://{}", server.addr()), true, true, "2s");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    let EffectOutcome::Refused(refusal) = bounded(downstream.perform(request(&k, &args))).await
    else {
        panic!("expected a refusal");
    };
    assert_eq!(
        refusal.message,
        "downstream answered 422 Unprocessable Entity: queue closed"
    );
    assert!(!refusal.message.contains("Printer"));
}

#[tokio::test]
async fn a_resend_under_the_same_key_is_deduplicated_by_the_downstream() {
    let server = FakeServer::start().await;
    server.push_fault(HttpFault::CommitThenDrop);
    let contract = tickets(&format!("http://{}", server.addr()), true, false, "2s");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    let first = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(kind(&first), "ambiguous None");
    let resend = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(kind(&resend), "committed ticket_1");
    assert_eq!(server.downstream().effects(), 1);
    assert_eq!(server.downstream().deduplicated(), 1);
}

#[tokio::test]
async fn connection_refused_is_provably_not_sent() {
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let contract = tickets(&format!("http://127.0.0.1:{port}"), true, true, "2s");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    let outcome = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(kind(&outcome), "not_sent None", "{outcome:?}");
    // The lookup cannot connect either: unavailable, never "not found".
    assert!(matches!(
        bounded(downstream.lookup_receipt(&k)).await,
        Lookup::Unavailable(_)
    ));
}

#[tokio::test]
async fn a_failed_tls_handshake_is_provably_not_sent() {
    // rustls (ring provider) talks TLS to a plain-HTTP port: the handshake fails before any
    // byte of the HTTP request is written, and the fake sees no request at all.
    let server = FakeServer::start().await;
    let contract = tickets(&format!("https://{}", server.addr()), true, true, "2s");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    let outcome = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(kind(&outcome), "not_sent None", "{outcome:?}");
    assert!(server.requests().is_empty());
    assert_eq!(server.downstream().calls(), 0);
}

#[tokio::test]
async fn receipt_lookup_found_not_found_and_unavailable() {
    let server = FakeServer::start().await;
    let contract = tickets(&format!("http://{}", server.addr()), true, true, "2s");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    assert_eq!(
        bounded(downstream.lookup_receipt(&k)).await,
        Lookup::NotFound
    );
    let EffectOutcome::Committed(receipt) = bounded(downstream.perform(request(&k, &args))).await
    else {
        panic!("expected a commit");
    };
    assert_eq!(
        receipt.result,
        json!({"ticket_id": "ticket_1", "key": k.as_str()})
    );
    assert_eq!(
        bounded(downstream.lookup_receipt(&k)).await,
        Lookup::Found(receipt)
    );
    // The key travels percent-encoded in the path and as the header.
    let lookup = server.requests().pop().unwrap();
    assert_eq!(lookup.path, format!("/tickets/by-key/{}", k.as_str()));
    assert_eq!(lookup.idempotency_key.as_deref(), Some(k.as_str()));
    server.downstream().set_receipt_lookup(false);
    assert!(matches!(
        bounded(downstream.lookup_receipt(&k)).await,
        Lookup::Unavailable(_)
    ));
    assert_eq!(server.downstream().lookups(), 3);
}

fn reports(base: &str) -> Contract {
    load(&format!(
        r#"name: reports.generate
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    report_type: {{type: string}}
  required: [report_type]
request_fingerprint:
  fields: [report_type]
downstream:
  deduplicates_by_key: true
  async_jobs: true
  http:
    url: {base}/reports
    reference: /report_id
    result: /report
    job:
      id: /job_id
      poll_url: {base}/jobs/{{job_id}}
      state: /status
      reference: /report_id
      result: /report
      error_message: /error
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#
    ))
}

#[tokio::test]
async fn a_job_is_accepted_polled_and_finished() {
    let server = FakeServer::start().await;
    let downstream =
        HttpDownstream::from_contract(&reports(&format!("http://{}", server.addr()))).unwrap();
    let (k, args) = (key("r1"), json!({"report_type": "usage"}));
    let outcome = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(kind(&outcome), "accepted job_1");
    assert_eq!(server.downstream().effects(), 0, "a job is no effect yet");
    assert_eq!(
        bounded(downstream.poll_job(&k, "job_1")).await,
        JobStatus::Running
    );
    let receipt = server.downstream().complete_job("job_1");
    assert_eq!(
        bounded(downstream.poll_job(&k, "job_1")).await,
        JobStatus::Done(receipt.clone())
    );
    assert_eq!(server.downstream().effects_for(&k), 1);
    // Another operation's key cannot read this job; an unknown job is unavailable.
    // Both answer 404, which ends a job: asking again would never finish it.
    assert!(matches!(
        bounded(downstream.poll_job(&key("r2"), "job_1")).await,
        JobStatus::Gone(_)
    ));
    assert!(matches!(
        bounded(downstream.poll_job(&k, "job_9")).await,
        JobStatus::Gone(_)
    ));
    // A resend of a finished job is answered with its receipt, not a second job.
    let resend = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(resend, EffectOutcome::Committed(receipt));
    assert_eq!(server.downstream().effects(), 1);
    assert_eq!(server.downstream().polls(), 4);
}

#[tokio::test]
async fn a_failed_job_is_a_refusal_without_effect() {
    let server = FakeServer::start().await;
    let downstream =
        HttpDownstream::from_contract(&reports(&format!("http://{}", server.addr()))).unwrap();
    let (k, args) = (key("r1"), json!({"report_type": "usage"}));
    bounded(downstream.perform(request(&k, &args))).await;
    server
        .downstream()
        .fail_job("job_1", "no data for the period");
    let JobStatus::Failed(refusal) = bounded(downstream.poll_job(&k, "job_1")).await else {
        panic!("expected a failed job");
    };
    assert_eq!(refusal.code, ErrorCode::DownstreamRejected);
    assert_eq!(
        refusal.message,
        "downstream job failed: no data for the period"
    );
    assert_eq!(server.downstream().effects(), 0);
}

fn set_status(base: &str) -> Contract {
    load(&format!(
        r#"name: tickets.set_status
version: "1"
effect_class: natural_idempotent
input_schema:
  type: object
  properties:
    ticket_id: {{type: string}}
    status: {{type: string}}
    expected_version: {{type: integer}}
  required: [ticket_id, status, expected_version]
request_fingerprint:
  fields: [ticket_id, status, expected_version]
downstream:
  version_precondition: expected_version
  http:
    method: PUT
    url: {base}/tickets/{{ticket_id}}/status
    reference: /ticket_id
"#
    ))
}

async fn put_status(
    downstream: &HttpDownstream,
    contract: &Contract,
    k: &OperationKey,
    args: &Value,
) -> EffectOutcome {
    bounded(downstream.perform(EffectRequest {
        precondition: contract.precondition(args),
        ..request(k, args)
    }))
    .await
}

#[tokio::test]
async fn a_version_precondition_is_sent_as_if_match_and_412_means_nothing_happened() {
    let server = FakeServer::start().await;
    server.put_ticket("ticket_1", "open", 3);
    let contract = set_status(&format!("http://{}", server.addr()));
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let k = key("st1");
    let args = json!({"ticket_id": "ticket_1", "status": "solved", "expected_version": 3});
    let first = put_status(&downstream, &contract, &k, &args).await;
    assert_eq!(kind(&first), "committed ticket_1");
    assert_eq!(server.ticket("ticket_1").unwrap().version, 4);
    assert_eq!(server.status_updates(), 1);
    let seen = server.requests().pop().unwrap();
    assert_eq!(seen.method, "PUT");
    assert_eq!(seen.path, "/tickets/ticket_1/status");
    assert_eq!(seen.if_match.as_deref(), Some("\"3\""));
    // The same update against a version that moved on: refused before acting.
    let again = put_status(&downstream, &contract, &k, &args).await;
    assert_eq!(kind(&again), "precondition");
    assert_eq!(server.status_updates(), 1);
    assert_eq!(server.ticket("ticket_1").unwrap().status, "solved");
}

#[tokio::test]
async fn a_url_argument_is_percent_encoded_and_cannot_walk_the_path() {
    let server = FakeServer::start().await;
    let contract = set_status(&format!("http://{}", server.addr()));
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let k = key("st1");
    let args = json!({"ticket_id": "../auth", "status": "solved", "expected_version": 1});
    let outcome = put_status(&downstream, &contract, &k, &args).await;
    // The fake sees a ticket called `../auth`, which does not exist: a refusal, no hook call.
    assert_eq!(kind(&outcome), "refused downstream_rejected", "{outcome:?}");
    assert_eq!(server.auth_switch().asked(), 0);
    assert_eq!(server.requests()[0].path, "/tickets/../auth/status");
}

#[tokio::test]
async fn a_url_argument_that_would_move_the_path_is_refused_before_anything_is_sent() {
    let server = FakeServer::start().await;
    let contract = set_status(&format!("http://{}", server.addr()));
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let k = key("st1");
    for ticket_id in ["..", ".", ""] {
        let args = json!({"ticket_id": ticket_id, "status": "solved", "expected_version": 1});
        // Asked first, as the executor does before any record is written…
        let checked = downstream.check(&args).unwrap_err();
        assert!(checked.contains("argument `ticket_id`"), "{checked}");
        // …and refused again by `perform` itself, for a caller that did not ask.
        let EffectOutcome::Refused(refusal) = put_status(&downstream, &contract, &k, &args).await
        else {
            panic!("{ticket_id:?}: expected a refusal");
        };
        assert_eq!(refusal.code, ErrorCode::InvalidArguments);
        assert_eq!(refusal.message, checked);
    }
    assert!(
        server.requests().is_empty(),
        "nothing reached the downstream"
    );
    // The same arguments with a usable value are sent.
    server.put_ticket("ticket_1", "open", 1);
    let args = json!({"ticket_id": "ticket_1", "status": "solved", "expected_version": 1});
    assert_eq!(downstream.check(&args), Ok(()));
    let sent = put_status(&downstream, &contract, &k, &args).await;
    assert_eq!(kind(&sent), "committed ticket_1");
}

#[tokio::test]
async fn a_missing_url_argument_is_refused_before_anything_is_sent() {
    let server = FakeServer::start().await;
    let contract = set_status(&format!("http://{}", server.addr()));
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let k = key("st1");
    let args = json!({"status": "solved"});
    let checked = downstream.check(&args).unwrap_err();
    assert!(checked.contains("`ticket_id`"), "{checked}");
    let EffectOutcome::Refused(refusal) = bounded(downstream.perform(request(&k, &args))).await
    else {
        panic!("expected a refusal");
    };
    assert_eq!(refusal.code, ErrorCode::InvalidArguments);
    assert!(
        refusal.message.contains("`ticket_id`"),
        "{}",
        refusal.message
    );
    assert!(server.requests().is_empty());
}

// ---------------------------------------------------------------------------------------------
// The authorization hook.

fn hooked(url: &str, timeout: &str) -> Contract {
    load(&format!(
        r#"name: tickets.create
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    subject: {{type: string}}
request_fingerprint:
  fields: [subject]
security:
  authorization_hook:
    url: {url}
    timeout: {timeout}
    headers: {{X-Hook-Client: idemgate}}
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#
    ))
}

async fn ask(hook: &HttpAuthorizer, stage: AuthStage) -> Authorization {
    let k = key("a1");
    let fp = Fingerprint::parse(&format!("sha256:{}", "ab".repeat(32))).unwrap();
    bounded(hook.authorize(AuthRequest {
        tenant: "acme",
        actor: "agent-1",
        role: "agent",
        tool: "tickets.create",
        key: Some(&k),
        fingerprint: &fp,
        stage,
    }))
    .await
}

#[tokio::test]
async fn the_hook_allows_denies_and_fails_closed() {
    let server = FakeServer::start().await;
    let contract = hooked(&server.url("/auth"), "300ms");
    let hook = HttpAuthorizer::from_contract(&contract).unwrap().unwrap();
    let switch = server.auth_switch();
    assert_eq!(
        ask(&hook, AuthStage::BeforeEffect).await,
        Authorization::Allowed
    );
    switch.deny("access revoked");
    assert_eq!(
        ask(&hook, AuthStage::BeforeReplay).await,
        Authorization::Denied("access revoked".into())
    );
    switch.set(AuthMode::Forbidden("not your tenant".into()));
    assert_eq!(
        ask(&hook, AuthStage::BeforeEffect).await,
        Authorization::Denied("not your tenant".into())
    );
    switch.unavailable();
    assert!(matches!(
        ask(&hook, AuthStage::BeforeEffect).await,
        Authorization::Unavailable(_)
    ));
    switch.set(AuthMode::Slow(Duration::from_secs(3)));
    assert!(matches!(
        ask(&hook, AuthStage::BeforeEffect).await,
        Authorization::Unavailable(_)
    ));
    assert_eq!(switch.asked(), 5);
    // What the hook was told: who, what, which operation and request — never the arguments.
    let first = &switch.requests()[0];
    assert_eq!(
        first,
        &json!({
            "tenant": "acme",
            "actor": "agent-1",
            "role": "agent",
            "tool": "tickets.create",
            "operation_key": "acme:test:run_827:a1",
            "fingerprint": format!("sha256:{}", "ab".repeat(32)),
            "stage": "before_effect",
        })
    );
    assert_eq!(switch.requests()[1]["stage"], "before_replay");
    server.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_hook_fails_closed() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let contract = hooked(&format!("http://127.0.0.1:{port}/auth"), "1s");
    let hook = HttpAuthorizer::from_contract(&contract).unwrap().unwrap();
    assert!(matches!(
        ask(&hook, AuthStage::BeforeEffect).await,
        Authorization::Unavailable(_)
    ));
}

#[tokio::test]
async fn shutdown_closes_the_port() {
    let server = FakeServer::start().await;
    let addr = server.addr();
    server.shutdown().await;
    let contract = tickets(&format!("http://{addr}"), true, true, "1s");
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    let (k, args) = (key("s1"), ticket_args());
    let outcome = bounded(downstream.perform(request(&k, &args))).await;
    assert_eq!(kind(&outcome), "not_sent None", "{outcome:?}");
}
