//! `idemgate ops` against a real `idemgate serve`: the reconciliation queue, timelines,
//! operators' resolutions, approvals and denials, and the refusals — each checked through the
//! API itself and, where an effect can happen, counted on the downstream's side.
//!
//! Two kinds of gateway: the in-process sandbox (`sandbox = true`, the README's
//! `sandbox-timeout…` workflow), whose committed effects show in its sequential references; and
//! the HTTP fake ticket service of `idemgate-conformance`, which counts every effect by the
//! `Idempotency-Key` it arrived with.

mod support;

use std::time::Duration;

use idemgate_conformance::http_fake::{FakeServer, HttpFault};
use idemgate_core::key::OperationKey;
use serde_json::{Value, json};
use support::{
    AGENT, Gateway, OPERATOR, OTHER_OPERATOR, config_head, example_contracts, idemgate, invoke,
    key, kinds, operation, ops, tenants,
};

fn sandbox_gateway() -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}",
        config_head(dir.path(), &example_contracts(), true),
        tenants()
    );
    Gateway::start(dir, &config)
}

/// `tickets.create` against the fake: the ticket service does not deduplicate, so a lost
/// answer can only be settled by its receipt lookup (or an operator); legal tickets wait for
/// an approval; an answer is awaited one second at most.
fn fake_contract(fake: &FakeServer) -> String {
    format!(
        r#"name: tickets.create
version: "1"
purpose: Create one support ticket for one workflow step.
use_when:
  - A workflow step records a new issue.
do_not_use_when:
  - The ticket exists already.
effect_class: key_based
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
  reused_for_retry: true
input_schema:
  type: object
  properties:
    queue_id: {{type: string, minLength: 1, maxLength: 64}}
    subject: {{type: string, minLength: 1, maxLength: 200}}
    body: {{type: string, maxLength: 2000}}
  required: [subject, body]
  additionalProperties: false
request_fingerprint:
  fields: [queue_id, subject, body]
  defaults:
    queue_id: support
  mismatch: rejected
downstream:
  deduplicates_by_key: false
  receipt_lookup: true
  receipt: ticket_id
  http:
    method: POST
    url: {tickets}
    idempotency_header: Idempotency-Key
    reference: /ticket_id
    error_message: /error
    lookup:
      url: {lookup}
    timeouts:
      connect: 1s
      total: 1s
security:
  approval: when_matches
  approval_when:
    queue_id: [legal]
retention:
  record_ttl: 1d
  tombstone_ttl: 7d
  late_arrival: reject
  max_retry_window: 1d
owner:
  reconciliation: ops-test
  next_review: "2027-06-01"
"#,
        tickets = fake.url("/tickets"),
        lookup = fake.url("/tickets/by-key/{operation_key}"),
    )
}

async fn fake_gateway() -> (FakeServer, Gateway) {
    let fake = FakeServer::start().await;
    fake.downstream().set_deduplicates(false);
    let dir = tempfile::tempdir().unwrap();
    let contracts = dir.path().join("contracts");
    std::fs::create_dir(&contracts).unwrap();
    std::fs::write(contracts.join("tickets.create.yaml"), fake_contract(&fake)).unwrap();
    let glob = format!("{}/*.yaml", contracts.display());
    let config = format!("{}{}", config_head(dir.path(), &glob, false), tenants());
    (fake, Gateway::start(dir, &config))
}

fn effects(fake: &FakeServer, key: &str) -> usize {
    fake.downstream()
        .effects_for(&OperationKey::parse(key).unwrap())
}

fn ticket(subject: &str) -> Value {
    json!({ "subject": subject, "body": "Order 42 arrived broken." })
}

fn legal_ticket(subject: &str) -> Value {
    json!({ "queue_id": "legal", "subject": subject, "body": "A contract question." })
}

fn set_status() -> Value {
    json!({ "ticket_id": "ticket_1", "status": "solved", "expected_version": 1 })
}

/// Asserts a run's exit status, with everything it printed when it differs.
#[track_caller]
fn expect_code(run: &support::Run, code: i32) {
    assert_eq!(run.code, code, "{run:#?}");
}

/// The record's state as the API shows it to the acme operator.
/// A `tickets.set_status` call the sandbox leaves `unknown` (a `sandbox-timeout…` workflow):
/// its key, and its record as it stands.
async fn seed_unknown(gateway: &Gateway, workflow: &str) -> (String, Value) {
    let k = key(workflow, "close");
    let first = invoke(
        gateway,
        "tickets.set_status",
        workflow,
        "close",
        set_status(),
    )
    .await;
    assert_eq!(
        (first.status, first.body["outcome"].as_str()),
        (202, Some("unknown")),
        "{first:?}"
    );
    let before = record(gateway, &k).await;
    (k, before)
}

async fn record(gateway: &Gateway, key: &str) -> Value {
    let answer = operation(gateway, OPERATOR, key).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

/// The positions of `words` in `text`, which must appear in this order.
#[track_caller]
fn in_order(text: &str, words: &[&str]) {
    let mut from = 0;
    for word in words {
        match text[from..].find(word) {
            Some(at) => from += at + word.len(),
            None => panic!("{word:?} missing (or out of order) after byte {from} in:\n{text}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unknown_queue_is_listed_shown_resolved_and_then_replays() {
    let gateway = sandbox_gateway();
    let workflow = "sandbox-timeout-1";
    let (k, _) = seed_unknown(&gateway, workflow).await;

    // The queue, for people and for scripts.
    let list = ops(&gateway, OPERATOR, &["list"]).await;
    expect_code(&list, 0);
    in_order(&list.stdout, &[&k, "tickets.set_status", "unknown", "1"]);
    assert!(
        list.stdout.contains("just now") || list.stdout.contains(" s ago"),
        "an age for people: {list:?}"
    );
    let listed = ops(&gateway, OPERATOR, &["list", "--json"]).await.json();
    let keys: Vec<&str> = listed["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, [k.as_str()]);

    // The timeline, in order, with attempts and workers.
    let show = ops(&gateway, OPERATOR, &["show", &k]).await;
    expect_code(&show, 0);
    in_order(
        &show.stdout,
        &[
            &k,
            "unknown",
            "receipt: none",
            "a caller gets now: unknown",
            "reconcile",
            "timeline (5 events",
            "proposed",
            "validated",
            "claimed",
            "sent",
            "unknown",
            "timed out waiting for the sandbox",
        ],
    );
    let shown = ops(&gateway, OPERATOR, &["show", &k, "--json"])
        .await
        .json();
    assert_eq!(
        kinds(&shown),
        ["proposed", "validated", "claimed", "sent", "unknown"]
    );
    assert_eq!(shown["outcome"]["outcome"], "unknown");

    // tickets.set_status offers no receipt lookup: the gateway refuses, nothing changes.
    let before = record(&gateway, &k).await;
    let lookup = ops(&gateway, OPERATOR, &["reconcile", &k]).await;
    expect_code(&lookup, 2);
    assert!(
        lookup.stderr.contains("declares no receipt lookup") && lookup.stderr.contains("422"),
        "{lookup:?}"
    );
    assert_eq!(
        record(&gateway, &k).await,
        before,
        "a refusal changes nothing"
    );

    // The operator resolves it from what the system of record shows.
    let resolve = ops(
        &gateway,
        OPERATOR,
        &[
            "reconcile",
            &k,
            "--applied",
            "--reference",
            "ticket_1@v2",
            "--result",
            r#"{"status": "solved"}"#,
        ],
    )
    .await;
    expect_code(&resolve, 0);
    in_order(
        &resolve.stdout,
        &[
            &k,
            "unknown -> applied",
            "ticket_1@v2",
            "reconciled",
            "by alice",
        ],
    );

    // It left the queue.
    let list = ops(&gateway, OPERATOR, &["list"]).await;
    expect_code(&list, 0);
    assert!(!list.stdout.contains(&k), "{list:?}");
    assert!(
        list.stdout.contains("reconciliation queue is empty"),
        "{list:?}"
    );

    // The record keeps the operator's receipt, and the next delivery replays it.
    let settled = record(&gateway, &k).await;
    assert_eq!(settled["record_status"], "applied");
    assert_eq!(
        settled["receipt"],
        json!({ "reference": "ticket_1@v2", "result": { "status": "solved" } })
    );
    assert_eq!(
        kinds(&settled).last().map(String::as_str),
        Some("reconciled")
    );
    let again = invoke(
        &gateway,
        "tickets.set_status",
        workflow,
        "close",
        set_status(),
    )
    .await;
    assert_eq!(again.status, 200, "{again:?}");
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.body["outcome"], "replayed");
    assert_eq!(again.body["effect_reference"], "ticket_1@v2");
    assert_eq!(again.body["result"], json!({ "status": "solved" }));

    // The sandbox numbers its effects: a new update gets its first reference, so neither the
    // timed-out call nor the replay committed one.
    let fresh = invoke(
        &gateway,
        "tickets.set_status",
        "run-2",
        "close",
        set_status(),
    )
    .await;
    assert_eq!(fresh.body["outcome"], "applied", "{fresh:?}");
    assert_eq!(fresh.body["effect_reference"], "ticket_1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_lookup_settles_a_lost_answer_with_one_effect() {
    let (fake, gateway) = fake_gateway().await;
    let k = key("run-7", "open");
    // The ticket is created and the answer lost; the lookup cannot answer yet.
    fake.downstream().set_receipt_lookup(false);
    fake.push_fault(HttpFault::CommitThenDrop);
    let first = invoke(
        &gateway,
        "tickets.create",
        "run-7",
        "open",
        ticket("Broken"),
    )
    .await;
    assert_eq!(first.body["outcome"], "unknown", "{first:?}");
    assert_eq!(effects(&fake, &k), 1);

    // Looking now finds nothing to settle it: exit 1, nothing changed.
    let before = record(&gateway, &k).await;
    let early = ops(&gateway, OPERATOR, &["reconcile", &k]).await;
    expect_code(&early, 1);
    assert!(early.stdout.contains("nothing changed"), "{early:?}");
    assert_eq!(record(&gateway, &k).await["record_status"], "unknown");
    assert_eq!(
        record(&gateway, &k).await["updated_at"],
        before["updated_at"]
    );

    // Once the service answers lookups, the operator's lookup settles it with its receipt.
    fake.downstream().set_receipt_lookup(true);
    let receipt = fake
        .downstream()
        .receipt_for(&OperationKey::parse(&k).unwrap())
        .expect("the fake kept the ticket");
    let lookup = ops(&gateway, OPERATOR, &["reconcile", &k]).await;
    expect_code(&lookup, 0);
    in_order(
        &lookup.stdout,
        &[&k, "unknown -> applied", &receipt.reference],
    );
    let settled = record(&gateway, &k).await;
    assert_eq!(settled["receipt"]["reference"], receipt.reference.as_str());

    // The next delivery replays the same ticket; the service saw one effect.
    let again = invoke(
        &gateway,
        "tickets.create",
        "run-7",
        "open",
        ticket("Broken"),
    )
    .await;
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.body["effect_reference"], receipt.reference.as_str());
    assert_eq!(effects(&fake, &k), 1);
    assert_eq!(fake.downstream().effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_applied_is_confirmed_and_lets_the_key_run_once() {
    let (fake, gateway) = fake_gateway().await;
    let k = key("run-8", "open");
    // The request is held past the gateway's timeout and nothing is created.
    fake.downstream().set_receipt_lookup(false);
    fake.push_fault(HttpFault::Hang(Duration::from_secs(3)));
    let first = invoke(&gateway, "tickets.create", "run-8", "open", ticket("Late")).await;
    assert_eq!(first.body["outcome"], "unknown", "{first:?}");
    assert_eq!(effects(&fake, &k), 0, "the service created nothing");

    // Without a terminal to ask on and without --yes, nothing is sent.
    let unconfirmed = ops(&gateway, OPERATOR, &["reconcile", &k, "--not-applied"]).await;
    expect_code(&unconfirmed, 2);
    assert!(unconfirmed.stderr.contains("--yes"), "{unconfirmed:?}");
    assert_eq!(record(&gateway, &k).await["record_status"], "unknown");

    let resolve = ops(
        &gateway,
        OPERATOR,
        &["reconcile", &k, "--not-applied", "--yes"],
    )
    .await;
    expect_code(&resolve, 0);
    in_order(&resolve.stdout, &[&k, "unknown ->", "reconciled"]);
    assert_ne!(record(&gateway, &k).await["record_status"], "unknown");
    let queue = ops(&gateway, OPERATOR, &["list", "--json"]).await.json();
    assert_eq!(queue["operations"], json!([]));

    // The key runs again, once: one ticket at the service.
    let again = invoke(&gateway, "tickets.create", "run-8", "open", ticket("Late")).await;
    assert_eq!(again.body["outcome"], "applied", "{again:?}");
    assert_eq!(effects(&fake, &k), 1);
    let third = invoke(&gateway, "tickets.create", "run-8", "open", ticket("Late")).await;
    assert!(third.replayed, "{third:?}");
    assert_eq!(effects(&fake, &k), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_runs_the_effect_once_and_a_denial_never() {
    let (fake, gateway) = fake_gateway().await;
    let k = key("run-9", "legal");
    let waiting = invoke(
        &gateway,
        "tickets.create",
        "run-9",
        "legal",
        legal_ticket("NDA"),
    )
    .await;
    assert_eq!(
        (waiting.status, waiting.body["next_action"].as_str()),
        (202, Some("ask_for_approval")),
        "{waiting:?}"
    );
    let list = ops(
        &gateway,
        OPERATOR,
        &["list", "--status", "awaiting_approval"],
    )
    .await;
    expect_code(&list, 0);
    in_order(&list.stdout, &[&k, "tickets.create", "awaiting_approval"]);

    // An agent token may not approve, and is told why.
    let agent = ops(&gateway, AGENT, &["approve", &k]).await;
    expect_code(&agent, 2);
    assert!(agent.stderr.contains("agent token"), "{agent:?}");
    // An approval bound to another request is refused.
    let other = format!("sha256:{}", "0".repeat(64));
    let stale = ops(
        &gateway,
        OPERATOR,
        &["approve", &k, "--fingerprint", &other],
    )
    .await;
    expect_code(&stale, 2);
    assert!(stale.stderr.contains("fingerprint"), "{stale:?}");
    assert_eq!(
        record(&gateway, &k).await["record_status"],
        "awaiting_approval"
    );
    assert_eq!(effects(&fake, &k), 0);

    let fingerprint = record(&gateway, &k).await["fingerprint"]
        .as_str()
        .unwrap()
        .to_string();
    let approve = ops(
        &gateway,
        OPERATOR,
        &["approve", &k, "--fingerprint", &fingerprint],
    )
    .await;
    expect_code(&approve, 0);
    in_order(
        &approve.stdout,
        &[
            &k,
            "awaiting_approval -> applied",
            "approved by alice",
            "approved",
        ],
    );
    assert_eq!(effects(&fake, &k), 1);
    let applied = record(&gateway, &k).await;
    assert_eq!(applied["approved_by"], "alice");

    // Approving twice does not apply twice.
    let twice = ops(&gateway, OPERATOR, &["approve", &k]).await;
    expect_code(&twice, 2);
    assert!(twice.stderr.contains("applied"), "{twice:?}");
    let again = invoke(
        &gateway,
        "tickets.create",
        "run-9",
        "legal",
        legal_ticket("NDA"),
    )
    .await;
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.body["effect_reference"], applied["effect_reference"]);
    assert_eq!(effects(&fake, &k), 1);

    // A denial: recorded with its reason, replayed to every later delivery, and no effect.
    let d = key("run-9", "legal-2");
    let waiting = invoke(
        &gateway,
        "tickets.create",
        "run-9",
        "legal-2",
        legal_ticket("MSA"),
    )
    .await;
    assert_eq!(waiting.status, 202, "{waiting:?}");
    let no_reason = ops(&gateway, OPERATOR, &["deny", &d]).await;
    expect_code(&no_reason, 2);
    let deny = ops(
        &gateway,
        OPERATOR,
        &["deny", &d, "--reason", "not for legal"],
    )
    .await;
    expect_code(&deny, 0);
    in_order(
        &deny.stdout,
        &[
            &d,
            "awaiting_approval -> failed_permanent",
            "denied",
            "approval_denied",
        ],
    );
    let later = invoke(
        &gateway,
        "tickets.create",
        "run-9",
        "legal-2",
        legal_ticket("MSA"),
    )
    .await;
    assert_eq!(later.status, 403, "{later:?}");
    assert_eq!(later.body["error"]["code"], "approval_denied");
    assert!(
        later.body["detail"]
            .as_str()
            .unwrap()
            .contains("not for legal"),
        "{later:?}"
    );
    assert_eq!(effects(&fake, &d), 0);
    assert_eq!(fake.downstream().effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_what_is_wrong_and_change_nothing() {
    let mut gateway = sandbox_gateway();
    let (k, before) = seed_unknown(&gateway, "sandbox-timeout-9").await;

    // Another tenant's operator: the key answers as if it did not exist.
    for args in [
        vec!["show", k.as_str()],
        vec!["approve", k.as_str()],
        vec!["reconcile", k.as_str(), "--applied", "--reference", "x"],
    ] {
        let run = ops(&gateway, OTHER_OPERATOR, &args).await;
        expect_code(&run, 2);
        assert!(
            run.stderr.contains(&format!("no operation {k}")) && run.stderr.contains("404"),
            "{args:?}: {run:?}"
        );
    }
    let missing = ops(&gateway, OPERATOR, &["show", "acme:ci:nothing:here"]).await;
    expect_code(&missing, 2);
    assert!(
        missing.stderr.contains("no operation acme:ci:nothing:here"),
        "{missing:?}"
    );

    let malformed = ops(&gateway, OPERATOR, &["show", "run-1:close"]).await;
    expect_code(&malformed, 2);
    assert!(
        malformed
            .stderr
            .contains("tenant:environment:workflow_id:step_id"),
        "{malformed:?}"
    );

    // An agent token reads its tenant's operations, but listing and resolving are for operators.
    let read = ops(&gateway, AGENT, &["show", &k]).await;
    expect_code(&read, 0);
    assert!(read.stdout.contains("timeline"), "{read:?}");
    for args in [
        vec!["list"],
        vec!["reconcile", k.as_str(), "--applied", "--reference", "x"],
    ] {
        let run = ops(&gateway, AGENT, &args).await;
        expect_code(&run, 2);
        assert!(
            run.stderr.contains("is an agent token"),
            "{args:?}: {run:?}"
        );
    }
    // A token the gateway does not know.
    let stranger = ops(&gateway, "idg_not_a_token", &["list"]).await;
    expect_code(&stranger, 2);
    assert!(
        stranger.stderr.contains("refused the token") && stranger.stderr.contains("401"),
        "{stranger:?}"
    );
    // An action that does not apply to the state: the gateway's detail and code.
    let wrong = ops(&gateway, OPERATOR, &["deny", &k, "--reason", "r"]).await;
    expect_code(&wrong, 2);
    assert!(
        wrong.stderr.contains("is unknown, so it cannot be denied")
            && wrong.stderr.contains("422 conflict"),
        "{wrong:?}"
    );
    let json = ops(&gateway, OPERATOR, &["approve", &k, "--json"]).await;
    expect_code(&json, 2);
    assert_eq!(
        json.json()["error"]["code"],
        "conflict",
        "the gateway's problem, as JSON"
    );
    assert_eq!(
        record(&gateway, &k).await,
        before,
        "no refusal changed anything"
    );

    // The token only ever comes from the environment.
    let url = gateway.url.clone();
    let no_token = idemgate(Some(&url), None, &["ops", "list"]);
    expect_code(&no_token, 2);
    assert!(no_token.stderr.contains("IDEMGATE_TOKEN"), "{no_token:?}");
    let argument = idemgate(Some(&url), None, &["ops", "list", "--token", OPERATOR]);
    expect_code(&argument, 2);
    assert!(argument.stderr.contains("--token"), "{argument:?}");
    // Without --gateway, the local gateway `serve` listens on by default (whatever answers
    // there on this machine, this token is not its operator's).
    let no_gateway = idemgate(None, Some(OPERATOR), &["ops", "list"]);
    expect_code(&no_gateway, 2);
    assert!(
        no_gateway.stderr.contains("127.0.0.1:8080") || no_gateway.stderr.contains("refused"),
        "{no_gateway:?}"
    );
    let flag = idemgate(None, Some(OPERATOR), &["ops", "--gateway", &url, "list"]);
    expect_code(&flag, 0);
    assert!(flag.stdout.contains(&k), "{flag:?}");

    // A gateway that is down.
    gateway.stop();
    let down = idemgate(Some(&url), Some(OPERATOR), &["ops", "list"]);
    expect_code(&down, 2);
    assert!(
        down.stderr.contains("cannot reach the gateway") && down.stderr.contains(&url),
        "{down:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_pages_with_a_cursor() {
    let gateway = sandbox_gateway();
    for n in 1..=3 {
        let workflow = format!("sandbox-timeout-{n}");
        let a = invoke(
            &gateway,
            "tickets.set_status",
            &workflow,
            "close",
            set_status(),
        )
        .await;
        assert_eq!(a.body["outcome"], "unknown", "{a:?}");
    }
    let first = ops(&gateway, OPERATOR, &["list", "--limit", "2", "--json"])
        .await
        .json();
    let page: Vec<&str> = first["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_key"].as_str().unwrap())
        .collect();
    let k1 = key("sandbox-timeout-1", "close");
    let k2 = key("sandbox-timeout-2", "close");
    let k3 = key("sandbox-timeout-3", "close");
    assert_eq!(page, [k1.as_str(), k2.as_str()]);
    assert_eq!(first["next_after"], k2.as_str());

    let table = ops(&gateway, OPERATOR, &["list", "--limit", "2"]).await;
    expect_code(&table, 0);
    in_order(
        &table.stdout,
        &[
            &k1,
            &k2,
            "2 operations",
            "idemgate ops list --status unknown --limit 2 --after",
            &k2,
        ],
    );
    assert!(!table.stdout.contains(&k3), "{table:?}");

    let rest = ops(
        &gateway,
        OPERATOR,
        &["list", "--limit", "2", "--after", &k2],
    )
    .await;
    expect_code(&rest, 0);
    assert!(
        rest.stdout.contains(&k3) && !rest.stdout.contains(&k1),
        "{rest:?}"
    );
    assert!(
        rest.stdout.contains("1 operation with status unknown"),
        "{rest:?}"
    );
    assert!(
        !rest.stdout.contains("--after"),
        "the last page has no cursor: {rest:?}"
    );

    let tool = ops(&gateway, OPERATOR, &["list", "--tool", "tickets.create"]).await;
    expect_code(&tool, 0);
    assert!(tool.stdout.contains("no operations"), "{tool:?}");
    let bad = ops(&gateway, OPERATOR, &["list", "--status", "done"]).await;
    expect_code(&bad, 2);
    let too_many = ops(&gateway, OPERATOR, &["list", "--limit", "501"]).await;
    expect_code(&too_many, 2);
}

/// Runs `idemgate ops ARGS` on a pseudo-terminal (util-linux `script`), typing `typed`.
fn ops_on_a_terminal(gateway: &Gateway, args: &[&str], typed: &str) -> support::Run {
    use std::io::Write;
    let mut command = shell_quote(env!("CARGO_BIN_EXE_idemgate"));
    for arg in ["ops"].iter().chain(args) {
        command.push(' ');
        command.push_str(&shell_quote(arg));
    }
    let mut child = std::process::Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env("IDEMGATE_GATEWAY", &gateway.url)
        .env("IDEMGATE_TOKEN", OPERATOR)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("util-linux `script` runs the command on a pseudo-terminal");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(typed.as_bytes())
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{args:?} on a terminal still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    support::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_applied_on_a_terminal_asks_first() {
    let gateway = sandbox_gateway();
    let (k, before) = seed_unknown(&gateway, "sandbox-timeout-5").await;

    let args = ["reconcile", k.as_str(), "--not-applied"];
    let declined = tokio::task::block_in_place(|| ops_on_a_terminal(&gateway, &args, "no\n"));
    expect_code(&declined, 2);
    // On a terminal everything arrives on one stream: the question, then the refusal.
    in_order(
        &declined.stdout,
        &["Type yes", "not confirmed; nothing changed"],
    );
    assert_eq!(
        record(&gateway, &k).await,
        before,
        "declined: nothing changed"
    );

    let confirmed = tokio::task::block_in_place(|| ops_on_a_terminal(&gateway, &args, "yes\n"));
    expect_code(&confirmed, 0);
    in_order(
        &confirmed.stdout,
        &["Type yes", &k, "unknown ->", "reconciled"],
    );
    assert_ne!(record(&gateway, &k).await["record_status"], "unknown");
}

/// `ops --store` on the gateway's own store once it is down: without the contracts an approval
/// cannot run (the effect is not at hand); with `--contracts` the approval runs the effect once,
/// over HTTP as the gateway would, counted at the fake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_on_the_store_with_the_contracts_approves_as_the_gateway_would() {
    let (fake, mut gateway) = fake_gateway().await;
    let k = key("run-11", "legal");
    let waiting = invoke(
        &gateway,
        "tickets.create",
        "run-11",
        "legal",
        legal_ticket("NDA"),
    )
    .await;
    assert_eq!(
        waiting.body["next_action"], "ask_for_approval",
        "{waiting:?}"
    );
    gateway.stop();
    let url = format!("sqlite://{}", gateway.dir.join("gate.sqlite").display());
    let contracts = format!("{}/contracts/*.yaml", gateway.dir.display());
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            support::idemgate_with(None, None, &[("IDEMGATE_ACTOR", "alice")], &args)
        })
    };
    let words = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let bare = run(words(&[
        "ops",
        "--store",
        &url,
        "approve",
        &k,
        "--reason",
        "legal asked",
    ]))
    .await
    .unwrap();
    expect_code(&bare, 2);
    assert!(bare.stderr.contains("not loaded"), "{bare:?}");
    assert_eq!(effects(&fake, &k), 0);

    let approved = run(words(&[
        "ops",
        "--store",
        &url,
        "--contracts",
        &contracts,
        "approve",
        &k,
        "--reason",
        "legal asked",
    ]))
    .await
    .unwrap();
    expect_code(&approved, 0);
    assert!(
        approved.stdout.contains("awaiting_approval -> applied")
            && approved.stdout.contains("approved by alice")
            && approved.stdout.contains("reason: legal asked"),
        "{approved:?}"
    );
    assert_eq!(effects(&fake, &k), 1);
}
