//! The `session_window` identity rule end to end over stdio JSON-RPC, for hosts that send no
//! `_meta`: a repeat inside the window is one effect, `repeat_of` makes a second, the window is
//! anchored at the first call, `_meta` still wins, another principal's key is refused, and a
//! cancelled call's effect completes and is replayed. Effects are counted by the fake
//! downstreams on their own side; time is a manual clock, so nothing here sleeps for a window.
//! (The official Python SDK drives the same rule against the binary in
//! `tests/python/test_identity.py`.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idemgate_app::{App, Assembly, ToolSet};
use idemgate_conformance::downstream::FakeDownstream;
use idemgate_core::clock::ManualClock;
use idemgate_core::contract::Contract;
use idemgate_core::contract::Identity;
use idemgate_core::duration::Span;
use idemgate_engine::Caller;
use idemgate_mcp::{Gateway, Options};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const LIMIT: Duration = Duration::from_secs(20);
const TEN_MINUTES: Identity = Identity::SessionWindow(Span(600));
/// 2026-12-01T10:00:00Z, the start of a ten-minute interval.
const T0: i64 = 1_796_119_200_000;

struct World {
    gateway: Arc<App>,
    fakes: BTreeMap<String, FakeDownstream>,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts/*.yaml");
    let contracts =
        idemgate_app::contracts::load(&[root.to_string()], std::path::Path::new("")).unwrap();
    let store =
        idemgate_store_sqlite::SqliteStore::open(dir.path().join("s.sqlite"), Default::default())
            .unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    // The conformance fakes, for their gates: a test pauses a worker with its request arrived.
    let fakes: BTreeMap<String, FakeDownstream> = contracts
        .iter()
        .map(|c| {
            let fake = FakeDownstream::new()
                .deduplicating(c.deduplicates())
                .with_receipt_lookup(c.receipt_lookup());
            (c.name.clone(), fake)
        })
        .collect();
    let effects = |c: &Contract| {
        fakes
            .get(&c.name)
            .map(|f| Arc::new(f.clone()) as Arc<dyn idemgate_core::effect::Downstream>)
            .ok_or_else(|| "no fake".to_string())
    };
    let tools = ToolSet::build(contracts, &effects).unwrap();
    let app = Assembly::new(Arc::new(store), tools, "test")
        .clock(clock.clone())
        .build();
    World {
        gateway: Arc::new(app),
        fakes,
        clock,
        _dir: dir,
    }
}

impl World {
    fn tickets(&self) -> &FakeDownstream {
        self.fakes.get("tickets.create").unwrap()
    }

    /// One stdio connection (one MCP session) as `actor` of tenant `acme`.
    async fn connect(&self, actor: &str, identity: Identity) -> Session {
        self.connect_with(actor, identity, json!({})).await
    }

    /// [`World::connect`] declaring these client capabilities at `initialize`.
    async fn connect_with(&self, actor: &str, identity: Identity, capabilities: Value) -> Session {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(idemgate_mcp::serve_io(
            self.gateway.clone() as Arc<dyn Gateway>,
            Caller {
                tenant: "acme".into(),
                actor: actor.into(),
                role: "agent".into(),
            },
            Options {
                fakes: None,
                identity,
                ..Options::default()
            },
            server_read,
            server_write,
            async move {
                let _ = stopped.await;
            },
        ));
        let (read, write) = tokio::io::split(client);
        let mut session = Session {
            write,
            read: BufReader::new(read),
            next: 1,
            stop: Some(stop),
            serving: Some(serving),
        };
        let init = session
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": capabilities,
                       "clientInfo": {"name": "identity-test", "version": "0"}}),
            )
            .await;
        assert_eq!(init["result"]["serverInfo"]["name"], "idemgate", "{init}");
        session
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        session
    }
}

struct Session {
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    read: BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    next: u64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    serving: Option<tokio::task::JoinHandle<Result<(), idemgate_mcp::adapter::Error>>>,
}

impl Session {
    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.write.write_all(line.as_bytes()).await.unwrap();
    }

    async fn answer(&mut self, id: u64) -> Value {
        tokio::time::timeout(LIMIT, async {
            loop {
                let mut line = String::new();
                assert!(self.read.read_line(&mut line).await.unwrap() > 0, "EOF");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["id"] == json!(id) {
                    return v;
                }
            }
        })
        .await
        .expect("an answer in time")
    }

    /// Sends a request under a fresh JSON-RPC id (as a host re-sending a lost request does).
    fn start(&mut self, method: &str, params: Value) -> (u64, Value) {
        let id = self.next;
        self.next += 1;
        (
            id,
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let (id, message) = self.start(method, params);
        self.send(message).await;
        self.answer(id).await
    }

    /// A `tools/call`; answers its `result`.
    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        assert!(answer["result"].is_object(), "{answer}");
        answer["result"].clone()
    }

    async fn close(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(serving) = self.serving.take() {
            tokio::time::timeout(LIMIT, serving)
                .await
                .expect("the server stops")
                .unwrap()
                .unwrap();
        }
    }
}

fn ticket(subject: &str) -> Value {
    json!({"subject": subject, "body": "The printer on floor 3 is out of toner."})
}

fn status(result: &Value) -> &str {
    result["structuredContent"]["status"].as_str().unwrap()
}

fn key(result: &Value) -> String {
    result["structuredContent"]["operation_key"]
        .as_str()
        .unwrap_or_else(|| panic!("no operation key in {result}"))
        .to_string()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_inside_the_window_is_one_effect_and_repeat_of_makes_a_second() {
    let w = world();
    let mut s = w.connect("alice", TEN_MINUTES).await;

    let first = s.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&first), "applied", "{first}");
    let k1 = key(&first);
    assert!(k1.starts_with("acme:test:mcp-"), "{k1}");
    assert!(
        text(&first).contains("Key rule: session_window"),
        "{}",
        text(&first)
    );
    assert!(
        text(&first).contains(&format!("repeat_of \"{k1}\"")),
        "{}",
        text(&first)
    );
    assert_eq!(
        first["_meta"]["io.idemgate/identity"],
        json!({"rule": "session_window", "window_seconds": 600})
    );

    // The same call again, five minutes later: the same operation, no new effect.
    w.clock.advance(5 * 60_000);
    let again = s.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&again), "replayed", "{again}");
    assert_eq!(key(&again), k1);
    assert_eq!(w.tickets().effects(), 1);

    // Other arguments are another operation.
    let other = s.call("tickets_create", ticket("Paper")).await;
    assert_eq!(status(&other), "applied", "{other}");
    assert_ne!(key(&other), k1);
    assert_eq!(w.tickets().effects(), 2);

    // A deliberate repeat: a new operation and a second effect for the same arguments.
    let mut args = ticket("Toner");
    args["repeat_of"] = json!(k1);
    let repeat = s.call("tickets_create", args.clone()).await;
    assert_eq!(status(&repeat), "applied", "{repeat}");
    let k2 = key(&repeat);
    assert_ne!(k2, k1);
    assert_eq!(w.tickets().effects(), 3);
    assert_eq!(w.tickets().effects_for(&k2.parse_key()), 1);
    assert!(
        text(&repeat).contains(&format!(
            "Key rule: repeat_of — a deliberate repeat of {k1}"
        )),
        "{}",
        text(&repeat)
    );
    assert_eq!(first_rule(&repeat), "repeat_of");

    // The repeat re-sent (its answer was lost): replayed, not a third effect.
    let resent = s.call("tickets_create", args).await;
    assert_eq!(status(&resent), "replayed", "{resent}");
    assert_eq!(key(&resent), k2);
    assert_eq!(w.tickets().effects(), 3);
    s.close().await;
}

/// Over stdio the key has no per-connection part: a host that restarts the server (a new
/// connection, as `idemgate wrap` or `idemgate mcp` started again) and re-sends the same call
/// reaches the same operation — the failure the window exists for — and another actor of the
/// same tenant does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_stdio_server_replays_the_same_call() {
    let w = world();
    let mut s = w.connect("alice", TEN_MINUTES).await;
    let first = s.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&first), "applied", "{first}");
    s.close().await;
    w.clock.advance(60_000);
    let mut restarted = w.connect("alice", TEN_MINUTES).await;
    let again = restarted.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&again), "replayed", "{again}");
    assert_eq!(key(&again), key(&first));
    assert_eq!(w.tickets().effects(), 1, "one effect across the restart");
    restarted.close().await;
    let mut bob = w.connect("bob", TEN_MINUTES).await;
    let other = bob.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&other), "applied", "{other}");
    assert_eq!(
        w.tickets().effects(),
        2,
        "another principal is another operation"
    );
    bob.close().await;
}

fn first_rule(result: &Value) -> &str {
    result["_meta"]["io.idemgate/identity"]["rule"]
        .as_str()
        .unwrap()
}

trait ParseKey {
    fn parse_key(&self) -> idemgate_core::key::OperationKey;
}

impl ParseKey for String {
    fn parse_key(&self) -> idemgate_core::key::OperationKey {
        idemgate_core::key::OperationKey::parse(self).unwrap()
    }
}

/// The window runs from the operation's first call: a repeat two seconds later across a
/// ten-minute boundary is the same operation; the same call one window after the first is a
/// new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_is_anchored_at_the_first_call() {
    let w = world();
    let mut s = w.connect("alice", TEN_MINUTES).await;
    // One second before a ten-minute boundary.
    w.clock.set(T0 + 600_000 - 1_000);
    let first = s.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&first), "applied", "{first}");

    w.clock.advance(2_000);
    let across = s.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&across), "replayed", "{across}");
    assert_eq!(key(&across), key(&first));

    // Just inside the window of the first call.
    w.clock.set(T0 + 600_000 - 1_000 + 599_999);
    let late = s.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&late), "replayed", "{late}");
    assert_eq!(w.tickets().effects(), 1);

    // One window after the first call: a new operation.
    w.clock.advance(1);
    let after = s.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&after), "applied", "{after}");
    assert_ne!(key(&after), key(&first));
    assert_eq!(w.tickets().effects(), 2);
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_wins_when_the_host_sends_it() {
    let w = world();
    let mut s = w.connect("alice", TEN_MINUTES).await;
    let with_meta = |subject: &str| {
        json!({"name": "tickets_create", "arguments": ticket(subject),
               "_meta": {"io.idemgate/operation": {"workflow_id": "run_827", "step_id": "s1"}}})
    };
    let a = s.request("tools/call", with_meta("Toner")).await;
    assert_eq!(status(&a["result"]), "applied", "{a}");
    assert_eq!(key(&a["result"]), "acme:test:run_827:s1");
    assert_eq!(first_rule(&a["result"]), "meta");
    assert!(text(&a["result"]).contains("Key rule: meta"), "{a}");
    // `repeat_of` beside `_meta` is ignored (and never part of the fingerprint): the runtime's
    // key decides, and it replays.
    let mut repeat = with_meta("Toner");
    repeat["arguments"]["repeat_of"] = json!("acme:test:run_827:s1");
    let b = s.request("tools/call", repeat).await;
    assert_eq!(status(&b["result"]), "replayed", "{b}");
    assert_eq!(w.tickets().effects(), 1);
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_of_must_name_an_operation_of_the_same_principal_and_tool() {
    let w = world();
    let mut alice = w.connect("alice", TEN_MINUTES).await;
    let mut bob = w.connect("bob", TEN_MINUTES).await;
    let first = alice.call("tickets_create", ticket("Toner")).await;
    let k1 = key(&first);
    // The same call by another actor is another operation.
    let bobs = bob.call("tickets_create", ticket("Toner")).await;
    assert_eq!(status(&bobs), "applied", "{bobs}");
    assert_ne!(key(&bobs), k1);
    assert_eq!(w.tickets().effects(), 2);

    let email = json!({"to": "a@example.com", "subject": "s", "body": "b"});
    let emailed = alice.call("email_send", email).await;
    let email_key = key(&emailed);
    for (by_bob, of, what) in [
        (true, k1.clone(), "another actor's operation"),
        (false, email_key.clone(), "another tool's operation"),
        (false, k1.replacen("acme:", "globex:", 1), "another tenant"),
        (
            false,
            "acme:test:mcp-0000000000000000:nothing".into(),
            "no such operation",
        ),
    ] {
        let mut args = ticket("Toner");
        args["repeat_of"] = json!(of);
        let who = if by_bob { &mut bob } else { &mut alice };
        let refused = who.call("tickets_create", args).await;
        assert_eq!(status(&refused), "rejected", "{what}: {refused}");
        assert_eq!(
            refused["structuredContent"]["error"]["code"], "invalid_operation_key",
            "{what}"
        );
        assert!(
            text(&refused)
                .contains("repeat_of names no operation of this caller made with tickets_create"),
            "{what}: {}",
            text(&refused)
        );
    }
    let mut args = ticket("Toner");
    args["repeat_of"] = json!(42);
    let bad = alice.call("tickets_create", args).await;
    assert_eq!(
        bad["structuredContent"]["error"]["code"],
        "invalid_operation_key"
    );
    assert_eq!(w.tickets().effects(), 2, "no refusal sent anything");
    alice.close().await;
    bob.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_list_says_which_rule_names_operations() {
    let w = world();
    let mut windowed = w.connect("alice", TEN_MINUTES).await;
    let mut meta = w.connect("alice", Identity::Meta).await;
    let find = |list: &Value, name: &str| -> Value {
        list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap()
    };
    let listed = windowed.request("tools/list", json!({})).await;
    let create = find(&listed, "tickets_create");
    assert_eq!(
        create["inputSchema"]["properties"]["repeat_of"]["type"],
        "string"
    );
    let description = create["description"].as_str().unwrap();
    for phrase in [
        "less than 10m earlier in this session is the same operation",
        "re-sending or retrying a call is always safe",
        "call with `repeat_of` set to the operation_key of the earlier answer",
        "Never use `repeat_of` to retry",
    ] {
        assert!(description.contains(phrase), "{phrase}: {description}");
    }
    assert_eq!(
        create["_meta"]["io.idemgate/contract"]["identity_rule"],
        "session_window"
    );
    assert_eq!(
        create["_meta"]["io.idemgate/contract"]["identity_window_seconds"],
        600
    );
    // A read has no key to derive and no repeat_of.
    let get = find(&listed, "tickets_get");
    assert!(get["inputSchema"]["properties"].get("repeat_of").is_none());

    let listed = meta.request("tools/list", json!({})).await;
    let create = find(&listed, "tickets_create");
    assert!(
        create["inputSchema"]["properties"]
            .get("repeat_of")
            .is_none()
    );
    assert!(
        create["description"]
            .as_str()
            .unwrap()
            .contains("named by the application running you")
    );
    // Under `meta` a call without `_meta` is still refused, and `repeat_of` is no argument.
    let missing = meta.call("tickets_create", ticket("Toner")).await;
    assert_eq!(
        missing["structuredContent"]["error"]["code"],
        "missing_operation_key"
    );
    assert_eq!(w.tickets().effects(), 0);
    windowed.close().await;
    meta.close().await;
}

/// The caller's patience is not the effect's lifetime (DESIGN §3): a call cancelled while its
/// effect is at the downstream stops the wait; the effect completes, and the same call re-sent
/// under a new JSON-RPC id replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_completes_its_effect_and_a_later_call_replays_it() {
    let w = world();
    let mut s = w.connect("alice", TEN_MINUTES).await;
    let gate = w.tickets().before_commit().clone();
    gate.arm_nth(1);
    let (id, call) = s.start(
        "tools/call",
        json!({"name": "tickets_create", "arguments": ticket("Toner")}),
    );
    s.send(call).await;
    gate.reached().await;
    s.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": id, "reason": "the user pressed stop"}}),
    )
    .await;
    // Let the cancellation land before the effect goes on.
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.release();
    tokio::time::timeout(LIMIT, async {
        while w.tickets().effects() < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the cancelled call's effect completes");
    // Wait until the record has settled, then re-send under a new id.
    let mut replay = Value::Null;
    for _ in 0..100 {
        replay = s.call("tickets_create", ticket("Toner")).await;
        if status(&replay) != "in_flight" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status(&replay), "replayed", "{replay}");
    assert_eq!(w.tickets().effects(), 1);
    assert_eq!(w.tickets().calls(), 1, "no resend reached the downstream");

    // Closing the connection mid-call is the same: a new connection (a new session, so the
    // runtime's `_meta` names the operation here) finds the effect done.
    gate.arm_nth(1);
    let meta = json!({"name": "tickets_create", "arguments": ticket("Paper"),
                      "_meta": {"io.idemgate/operation": {"workflow_id": "run_9", "step_id": "s1"}}});
    let (_, call) = s.start("tools/call", meta.clone());
    s.send(call).await;
    gate.reached().await;
    s.close().await;
    gate.release();
    tokio::time::timeout(LIMIT, async {
        while w.tickets().effects() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the abandoned call's effect completes");
    let mut s = w.connect("alice", TEN_MINUTES).await;
    let mut again = Value::Null;
    for _ in 0..100 {
        again = s.request("tools/call", meta.clone()).await["result"].clone();
        if status(&again) != "in_flight" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status(&again), "replayed", "{again}");
    assert_eq!(w.tickets().effects(), 2);
    s.close().await;
}

/// An accepted asynchronous job is answered as a task of the tasks extension to a client that
/// declares it: the task id is the operation key, `tasks/get` reads the durable record (and
/// polls the job), `tasks/cancel` is acknowledged and cancels nothing. A client without the
/// extension gets the plain `in_flight` answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_job_is_a_task_backed_by_the_record() {
    use idemgate_conformance::downstream::Fault;
    let w = world();
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut s = w.connect_with("alice", TEN_MINUTES, tasks).await;
    let reports = w.fakes.get("reports.generate").unwrap();
    reports.push_fault(Fault::AcceptJob);
    let report =
        json!({"report_type": "usage", "period_start": "2026-10-01", "period_end": "2026-10-31"});
    let answer = s
        .request(
            "tools/call",
            json!({"name": "reports_generate", "arguments": report,
            "_meta": {"io.idemgate/operation": {"workflow_id": "run_1", "step_id": "report"}}}),
        )
        .await;
    let result = &answer["result"];
    assert_eq!(result["resultType"], "task", "{answer}");
    let task_id = result["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_string();
    assert_eq!(task_id, "acme:test:run_1:report");
    assert_eq!(result["status"], "working");
    assert_eq!(result["pollIntervalMs"], 2000);

    let working = s.request("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(working["result"]["status"], "working", "{working}");
    assert!(
        working["result"]["createdAt"]
            .as_str()
            .unwrap()
            .starts_with("2026-12-01T10:00:00")
    );
    // Cancelling is acknowledged; the job is not cancelled.
    let cancelled = s.request("tasks/cancel", json!({"taskId": task_id})).await;
    assert!(cancelled["result"].is_object(), "{cancelled}");
    assert_eq!(reports.job_ids().len(), 1);

    let job = reports.job_ids()[0].clone();
    reports.complete_job(&job);
    let done = s.request("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["structuredContent"]["status"], "replayed",
        "{done}"
    );
    assert_eq!(reports.effects(), 1);

    // Another tenant's task is not found, exactly as a missing one.
    let missing = s
        .request("tasks/get", json!({"taskId": "globex:test:run_1:report"}))
        .await;
    assert!(missing["error"].is_object(), "{missing}");
    s.close().await;

    // Without the extension: the plain in-flight answer.
    let mut plain = w.connect("alice", TEN_MINUTES).await;
    reports.push_fault(Fault::AcceptJob);
    let report =
        json!({"report_type": "billing", "period_start": "2026-10-01", "period_end": "2026-10-31"});
    let answer = plain
        .request(
            "tools/call",
            json!({"name": "reports_generate", "arguments": report,
            "_meta": {"io.idemgate/operation": {"workflow_id": "run_2", "step_id": "report"}}}),
        )
        .await;
    assert_eq!(status(&answer["result"]), "in_flight", "{answer}");
    assert_ne!(answer["result"]["resultType"], "task");
    plain.close().await;
}
