//! `idemgate chaos` as a user runs it: the binary between a real `idemgate serve` and a fake
//! ticket service that counts its own effects, under a bounded load of seeded faults — its
//! ledger matches the service's counts, and a duplicate effect put there on purpose makes it
//! exit 1 naming the key.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idemgate_verify::testing::{Behaviour, Claims, FakeService};
use serde_json::{Value, json};
use support::{Gateway, config_head, invoke, tenants};

/// A running `idemgate chaos`, stopped with SIGINT as a person at a terminal would.
struct Chaos {
    child: Child,
    url: String,
    lines: mpsc::Receiver<String>,
}

impl Chaos {
    fn start(args: &[&str]) -> Chaos {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .arg("chaos")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start idemgate chaos");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("idemgate chaos printed where it listens");
        let url = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("{first}"))
            .to_string();
        Chaos { child, url, lines }
    }

    /// SIGINT, then the exit status and the rest of stdout.
    fn interrupt(mut self) -> (i32, String) {
        // SAFETY: sends a signal to the child this test started, by its id.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "idemgate chaos did not stop on SIGINT"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        let _ = self
            .child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr);
        let mut out: Vec<String> = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            out.push(line);
        }
        (
            status.code().unwrap_or(-1),
            format!("{}\n{stderr}", out.join("\n")),
        )
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One ticket POSTed through the proxy over a plain socket (blocking: run it off the test's
/// runtime threads, which the fake needs), answered with its status.
fn post(url: &str, key: &str) -> Option<u16> {
    use std::io::Write;
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let body = r#"{"subject": "chaos"}"#;
    let request = format!(
        "POST /tickets HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_to_a_downstream_that_does_not_deduplicate_exits_1() {
    let fake = FakeService::start(Behaviour::plain()).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.json");
    let chaos = Chaos::start(&[
        "--upstream",
        &fake.url(),
        "--reference",
        "/ticket_id",
        "--rule",
        "key=dup-* nth=1 duplicate",
        "--ledger",
        ledger.to_str().unwrap(),
    ]);
    let url = chaos.url.clone();
    tokio::task::spawn_blocking(move || {
        for key in ["dup-1", "dup-2", "once-1", "once-2"] {
            assert_eq!(post(&url, key), Some(201), "{key}");
        }
    })
    .await
    .unwrap();
    let (code, out) = chaos.interrupt();
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DUPLICATE EFFECTS: 2 keys"), "{out}");
    for key in ["dup-1", "dup-2"] {
        assert_eq!(fake.effects_for(key), 2);
        assert!(out.contains(&format!("  {key}: references")), "{out}");
    }
    assert!(!out.contains("once-1:"), "{out}");
    let ledger: Value = serde_json::from_str(&std::fs::read_to_string(&ledger).unwrap()).unwrap();
    for key in ledger["keys"].as_array().unwrap() {
        let name = key["key"].as_str().unwrap();
        assert_eq!(
            key["references"].as_array().unwrap().len(),
            fake.effects_for(name),
            "{key}"
        );
    }
    assert_eq!(ledger["summary"]["commits"], 6);
}

/// The documented set-up: an agent's deliveries → `idemgate serve` → `idemgate chaos` → a
/// ticket service that deduplicates and offers a receipt lookup. Seeded faults on every
/// request, a bounded load (24 operations, each delivered twice); afterwards the ledger's
/// effects per key are the service's own, and no key has two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_serve_and_a_downstream_the_ledger_matches_the_downstreams_own_counts() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.json");
    let chaos = Chaos::start(&[
        "--upstream",
        &fake.url(),
        "--reference",
        "/ticket_id",
        "--seed",
        "7",
        "--drop",
        "0.2",
        "--error",
        "0.1",
        "--malformed",
        "0.05",
        "--reset",
        "0.05",
        "--duplicate",
        "0.1",
        "--ledger",
        ledger.to_str().unwrap(),
    ]);
    let contract = dir.path().join("tickets.create.yaml");
    let claims = Claims {
        dedup: true,
        lookup: true,
        ..Claims::default()
    };
    std::fs::write(
        &contract,
        idemgate_verify::testing::contract_at(&chaos.url, "tickets.create", claims),
    )
    .unwrap();
    let config = format!(
        "{}{}",
        config_head(dir.path(), contract.to_str().unwrap(), false),
        tenants()
    );
    let gateway = std::sync::Arc::new(Gateway::start(tempfile::tempdir().unwrap(), &config));
    let mut labels = std::collections::BTreeMap::<String, usize>::new();
    // Two rounds: every operation delivered, then delivered again; six at a time.
    for _round in 0..2 {
        for batch in 0..4 {
            let mut calls = tokio::task::JoinSet::new();
            for i in batch * 6..batch * 6 + 6 {
                let gateway = gateway.clone();
                calls.spawn(async move {
                    let arguments = json!({"subject": format!("ticket {i}")});
                    let answer = invoke(
                        &gateway,
                        "tickets.create",
                        &format!("run-{i}"),
                        "open",
                        arguments,
                    )
                    .await;
                    answer.body["outcome"].as_str().unwrap_or("?").to_string()
                });
            }
            while let Some(label) = calls.join_next().await {
                *labels.entry(label.unwrap()).or_default() += 1;
            }
        }
    }
    let (code, out) = chaos.interrupt();
    assert_eq!(code, 0, "{out}\n{labels:?}");
    assert!(out.contains("no duplicate effects"), "{out}");
    let ledger: Value = serde_json::from_str(&std::fs::read_to_string(&ledger).unwrap()).unwrap();
    let keys = ledger["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 24, "{labels:?}");
    let faults = &ledger["summary"]["faults"];
    assert!(faults["drop"].as_u64().unwrap_or(0) > 0, "{faults}");
    for key in keys {
        let name = key["key"].as_str().unwrap();
        let references = key["references"].as_array().unwrap().len();
        assert_eq!(references, fake.effects_for(name), "{key}");
        assert!(fake.effects_for(name) <= 1, "{name}");
    }
    assert_eq!(fake.effects().len(), fake.per_key().len());
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--upstream",
                "http://127.0.0.1:9",
                "--drop",
                "0.8",
                "--reset",
                "0.5",
            ],
            "more than 1",
        ),
        (&["--upstream", "ftp://x"], "upstream"),
        (
            &[
                "--upstream",
                "http://127.0.0.1:9",
                "--rule",
                "nth=1 explode",
            ],
            "--rule",
        ),
        (
            &["--upstream", "http://127.0.0.1:9", "--error-status", "404"],
            "--error-status",
        ),
    ];
    for (args, named) in cases {
        let mut all = vec!["chaos", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let run = support::idemgate(None, None, &all);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(run.stderr.contains(named), "{args:?}: {}", run.stderr);
    }
}
