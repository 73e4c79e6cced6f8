//! What the queue tests share: a fresh JetStream stream on the local NATS server (deleted at
//! the end), a fake email provider over loopback HTTP that counts its own effects, the
//! contracts and configuration `idemgate consume` runs with, and the consumer as a real child
//! process that a test kills with SIGKILL.
//!
//! Without a reachable NATS server a test prints why and returns, unless
//! `IDEMGATE_REQUIRE_NATS=1`, which makes the skip a failure.

#![allow(dead_code)] // Each test file uses its own part.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use idemgate_conformance::downstream::FakeDownstream;
use idemgate_conformance::http_fake::FakeServer;
use idemgate_core::key::OperationKey;
use idemgate_core::record::Record;
use idemgate_core::store::{Filter, Store};

pub const TENANT: &str = "acme";
pub const ENVIRONMENT: &str = "ci";
pub const DURABLE: &str = "idemgate-test";

/// The key the consumer derives for step `step` of workflow `workflow`.
pub fn key(workflow: &str, step: &str) -> OperationKey {
    OperationKey::new(TENANT, ENVIRONMENT, workflow, step).unwrap()
}

/// A stream of this test's own on the local NATS server; deleted when dropped.
pub struct Nats {
    pub url: String,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub stream: String,
    pub subject: String,
}

impl Nats {
    /// Connects and creates a fresh stream, or returns `None` after saying why the test is
    /// skipped (a failure under `IDEMGATE_REQUIRE_NATS=1`).
    pub async fn fresh(label: &str) -> Option<Nats> {
        let url = std::env::var("IDEMGATE_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string());
        let connected = tokio::time::timeout(
            Duration::from_secs(5),
            async_nats::ConnectOptions::new()
                .retry_on_initial_connect()
                .max_reconnects(Some(2))
                .connect(url.as_str()),
        )
        .await;
        let client = match connected {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return skip(&url, &e.to_string()),
            Err(_) => return skip(&url, "no answer within 5 s"),
        };
        let js = jetstream::new(client.clone());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let stream = format!("IDEMGATE_TEST_{label}_{}_{nanos}", std::process::id());
        let subject = format!("idemgate.test.{label}.{}.{nanos}.jobs", std::process::id());
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            max_age: Duration::from_secs(3600),
            ..Default::default()
        })
        .await
        .expect("JetStream creates the test's stream");
        Some(Nats {
            url,
            client,
            js,
            stream,
            subject,
        })
    }

    /// Publishes each payload and waits until JetStream stored every one.
    pub async fn publish_all(&self, payloads: impl IntoIterator<Item = Vec<u8>>) {
        let mut acks = Vec::new();
        for payload in payloads {
            acks.push(
                self.js
                    .publish(self.subject.clone(), payload.into())
                    .await
                    .expect("publish"),
            );
            // Bounded: at most 256 publications awaiting their acknowledgement.
            if acks.len() >= 256 {
                for ack in acks.drain(..) {
                    ack.await.expect("JetStream stores the message");
                }
            }
        }
        for ack in acks {
            ack.await.expect("JetStream stores the message");
        }
    }

    /// The stream's message count.
    pub async fn messages(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.stream).await.unwrap();
        stream.info().await.unwrap().state.messages
    }

    /// The durable consumer's (pending, unacknowledged, deliveries) counts, once it exists.
    /// Deliveries count every delivery, redeliveries included (the consumer sequence).
    pub async fn consumer_state(&self) -> Option<(u64, usize, u64)> {
        let stream = self.js.get_stream(&self.stream).await.ok()?;
        let info = stream.consumer_info(DURABLE).await.ok()?;
        Some((
            info.num_pending,
            info.num_ack_pending,
            info.delivered.consumer_sequence,
        ))
    }

    /// Waits until the consumer has nothing pending and nothing unacknowledged, twice in a
    /// row a second apart; panics at `deadline`.
    pub async fn wait_drained(&self, deadline: Instant, what: &str) {
        let mut quiet = 0;
        while quiet < 2 {
            assert!(
                Instant::now() < deadline,
                "{what}: the consumer did not drain the stream in time: {:?}",
                self.consumer_state().await
            );
            match self.consumer_state().await {
                Some((0, 0, _)) => quiet += 1,
                _ => quiet = 0,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let js = self.js.clone();
        let stream = self.stream.clone();
        // Drop cannot await; a runtime of its own on another thread deletes the stream.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), js.delete_stream(&stream)).await;
            });
        })
        .join();
    }
}

fn skip(url: &str, why: &str) -> Option<Nats> {
    let message = format!("NATS JetStream at {url} is unreachable ({why})");
    if std::env::var("IDEMGATE_REQUIRE_NATS").as_deref() == Ok("1") {
        panic!("{message}, and IDEMGATE_REQUIRE_NATS=1");
    }
    eprintln!("SKIPPED: {message}; set IDEMGATE_REQUIRE_NATS=1 to make this a failure");
    None
}

/// The fake email provider: it neither deduplicates on the key nor ignores a resend, so a
/// second delivery that reached it would be a second effect, counted on its side; it offers a
/// receipt lookup by key.
pub async fn provider() -> FakeServer {
    let downstream = FakeDownstream::new()
        .deduplicating(false)
        .with_receipt_lookup(true);
    FakeServer::start_with(downstream, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// `jobs.email` (receipt lookup: a killed attempt is settled by the provider's log) and
/// `jobs.notify` (no lookup: an ambiguous attempt can only end `unknown`), both on the fake
/// provider's `/emails`, with a 3-second lease so a killed consumer's claims are recovered
/// within the test.
pub fn contracts(dir: &Path, provider: &FakeServer) -> String {
    for (name, lookup) in [("jobs.email", true), ("jobs.notify", false)] {
        let lookup_lines = if lookup {
            format!(
                "    lookup:\n      url: {}\n",
                provider.url("/emails/by-key/{operation_key}")
            )
        } else {
            String::new()
        };
        let text = format!(
            r#"name: {name}
version: "1"
purpose: Send one message for one workflow step, from a queue.
use_when:
  - A job on the queue names the step.
do_not_use_when:
  - Never from a model directly.
effect_class: key_based
lease_seconds: 3
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
  reused_for_retry: true
input_schema:
  type: object
  properties:
    to: {{type: string, minLength: 3}}
    body: {{type: string}}
  required: [to, body]
  additionalProperties: false
request_fingerprint:
  fields: [to, body]
  mismatch: rejected
downstream:
  deduplicates_by_key: false
  receipt_lookup: {lookup}
  receipt: provider message id
  http:
    url: {url}
    reference: /message_id
    error_message: /error
{lookup_lines}    timeouts:
      connect: 2s
      total: 5s
security:
  recheck_authorization: true
  approval: never
retention:
  record_ttl: 7d
  tombstone_ttl: 30d
  late_arrival: reject
  max_retry_window: 1d
owner:
  reconciliation: queue-oncall
  next_review: "2027-06-01"
"#,
            url = provider.url("/emails"),
        );
        std::fs::write(dir.join(format!("{name}.yaml")), text).unwrap();
    }
    format!("{}/*.yaml", dir.display())
}

/// The configuration `idemgate consume --config` reads: the store in `dir`, the contracts, a
/// recoverer that runs every second.
pub fn config(dir: &Path, contracts: &str) -> PathBuf {
    let path = dir.join("gate.toml");
    let text = format!(
        r#"environment = "{ENVIRONMENT}"
store = "sqlite://{}"
contracts = [{contracts:?}]

[recovery]
interval_seconds = 1
sweep_interval_seconds = 3600
"#,
        dir.join("gate.sqlite").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A job envelope's bytes.
pub fn envelope(tool: &str, workflow: &str, step: &str, to: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "workflow_id": workflow,
        "step_id": step,
        "tool": tool,
        "arguments": {"to": to, "body": format!("about {step}")},
    }))
    .unwrap()
}

/// `idemgate consume` as a child process, restartable, its output in files.
pub struct ConsumeProcess {
    dir: PathBuf,
    config: PathBuf,
    nats: (String, String, String),
    env: Vec<(String, String)>,
    child: Option<Child>,
    pub runs: usize,
    pub kills: usize,
}

impl ConsumeProcess {
    pub fn new(dir: &Path, config: &Path, nats: &Nats, env: &[(&str, &str)]) -> ConsumeProcess {
        ConsumeProcess {
            dir: dir.to_path_buf(),
            config: config.to_path_buf(),
            nats: (nats.url.clone(), nats.stream.clone(), nats.subject.clone()),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            runs: 0,
            kills: 0,
        }
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "the consumer is already running");
        let out = self.dir.join(format!("consume-{}.out", self.runs));
        let err = self.dir.join(format!("consume-{}.err", self.runs));
        let (url, stream, subject) = &self.nats;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
        cmd.args([
            "consume",
            "--nats",
            url,
            "--stream",
            stream,
            "--subject",
            subject,
        ])
        .args(["--durable", DURABLE, "--tenant", TENANT])
        .args(["--max-in-flight", "32", "--ack-wait", "2"])
        .arg("--config")
        .arg(&self.config)
        .env_remove("RUST_LOG")
        .env_remove(idemgate_queue_drop_var())
        .stdin(Stdio::null())
        .stdout(File::create(out).unwrap())
        .stderr(File::create(err).unwrap());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("the idemgate binary starts"));
        self.runs += 1;
    }

    /// SIGKILL: no drain, no acknowledgement, claims left as they were.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
            self.kills += 1;
        }
    }

    /// SIGTERM, then waits for the drain; returns what the last run printed on stdout.
    pub fn stop(&mut self) -> String {
        if let Some(mut child) = self.child.take() {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "consume did not stop on SIGTERM");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.output(self.runs - 1).0
    }

    /// Whether the running consumer is still alive (it exits on its own only on an error).
    pub fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(child) => child.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// (stdout, stderr) of run `n`.
    pub fn output(&self, n: usize) -> (String, String) {
        let read = |ext: &str| {
            std::fs::read_to_string(self.dir.join(format!("consume-{n}.{ext}"))).unwrap_or_default()
        };
        (read("out"), read("err"))
    }

    /// Every run's stderr, for a failing test's message.
    pub fn all_stderr(&self) -> String {
        (0..self.runs)
            .map(|n| self.output(n).1)
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

fn idemgate_queue_drop_var() -> &'static str {
    "IDEMGATE_FAULT_DROP_ACKS"
}

impl Drop for ConsumeProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Every record of the tenant, read from the store file once no consumer runs.
pub async fn records(dir: &Path) -> Vec<Record> {
    let store =
        idemgate_store_sqlite::SqliteStore::open(dir.join("gate.sqlite"), Default::default())
            .expect("the consumer's store opens");
    // Paged by key: a listing answers a bounded page.
    let mut all: Vec<Record> = Vec::new();
    loop {
        let page = store
            .list(Filter {
                tenant: Some(TENANT.into()),
                after: all.last().map(|r| r.key.as_str().to_string()),
                limit: 500,
                ..Default::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}
